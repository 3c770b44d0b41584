//! Checking claims against the analysed results: finding the cells a check names, measuring the
//! metric there (throughput, an `extra` measurement or the gain of splitting), comparing with the
//! target and writing what was measured. Pure; the table layout is [`super::render`]'s job.

use std::fmt::Write as _;

use crate::analysis::{Analysis, CaseRow, Experiment, THROUGHPUT_METRIC};
use crate::concurrency::CellKey;
use crate::markdown::number;

use super::judge::{self, CloseCall, Measured, PointOutcome, Summary};
use super::model::{AxisValue, Check, Claim, Criterion, Operand, SanityCheck, Stat};
use super::trend::{self, PointRuns};
use super::{GOS_METRIC, GOS_POSITIVE_SHARE_METRIC};

/// Result of checking one claim.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// The measured number and its whole confidence interval satisfy the check (at every point).
    Agrees,
    /// Neither: the interval straddles the accepted range somewhere, or there are too few runs
    /// for an interval.
    Inconclusive,
    /// The whole interval lies outside the accepted range (at one point or more).
    Disagrees,
    /// The claims file says why the lab does not test this claim (or it has no check).
    NotTested(String),
    /// The check needs data the results do not have (experiment, case or sweep value missing).
    NoData(String),
    /// The check itself is malformed (see [`super::ClaimsFile::problems`]).
    Invalid(String),
}

impl Verdict {
    /// The verdict's name in the tables and the counts.
    pub(crate) fn category(&self) -> &'static str {
        match self {
            Verdict::Agrees => "agrees",
            Verdict::Inconclusive => "inconclusive",
            Verdict::Disagrees => "disagrees",
            Verdict::NotTested(_) => "not tested",
            Verdict::NoData(_) => "no data",
            Verdict::Invalid(_) => "invalid check",
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClaimRow {
    pub figure: String,
    pub experiment: String,
    pub says: String,
    pub measured: String,
    pub verdict: Verdict,
    pub why_not: Option<String>,
    /// Cells of a judged claim whose number is nearer the threshold than its interval is wide.
    pub close_calls: Vec<CloseCall>,
    /// The cells (experiment, case, sweep value) whose runs the check read, a gain of
    /// splitting's baseline runs included.
    pub cells: Vec<CellKey>,
}

/// What a check found: the text of "we measured", the verdict, the close calls and the cells
/// read.
struct Checked {
    measured: String,
    verdict: Verdict,
    close_calls: Vec<CloseCall>,
    cells: Vec<CellKey>,
}

impl Checked {
    fn without_runs(measured: String, verdict: Verdict) -> Self {
        Checked {
            measured,
            verdict,
            close_calls: Vec::new(),
            cells: Vec::new(),
        }
    }
}

/// Checks every claim (or target) against the analysed results.
pub(crate) fn evaluate(claims: &[Claim], analysis: &Analysis) -> Vec<ClaimRow> {
    claims
        .iter()
        .map(|claim| {
            let mut says = claim.says.clone();
            if let Some(value) = &claim.paper_value {
                let _ = write!(says, " (paper: {value})");
            }
            if let Some(target) = &claim.target {
                let _ = write!(says, " (target: {target})");
            }
            let experiment = analysis
                .experiments
                .iter()
                .find(|e| e.name == claim.experiment);
            let checked = match (experiment, &claim.check) {
                (None, _) => Checked::without_runs(
                    "-".to_string(),
                    Verdict::NoData(format!(
                        "experiment `{}` not in the results",
                        claim.experiment
                    )),
                ),
                (Some(experiment), None) => Checked::without_runs(
                    overview(experiment),
                    Verdict::NotTested("no machine check".to_string()),
                ),
                (Some(experiment), Some(check)) => match check.criterion() {
                    Ok(criterion) => run_check(analysis, experiment, check, criterion),
                    Err(why) => Checked::without_runs(String::new(), Verdict::Invalid(why)),
                },
            };
            let Checked {
                measured,
                verdict,
                close_calls,
                cells,
            } = checked;
            // A claim the lab does not test is "not tested" whatever its check measured.
            let verdict = match (&claim.not_tested, verdict) {
                (Some(why), Verdict::Agrees | Verdict::Inconclusive | Verdict::Disagrees)
                | (Some(why), Verdict::NotTested(_)) => Verdict::NotTested(why.clone()),
                (_, verdict) => verdict,
            };
            let why_not = match verdict {
                Verdict::Disagrees | Verdict::Inconclusive | Verdict::NoData(_) => {
                    claim.why_not.clone()
                }
                _ => None,
            };
            let why_not = match (why_not, &claim.note) {
                (Some(why), Some(note)) => Some(format!("{why}. Note: {note}")),
                (None, Some(note)) => Some(format!("Note: {note}")),
                (why, None) => why,
            };
            // Only a judged claim's close calls ask for more runs.
            let close_calls = match verdict {
                Verdict::Agrees | Verdict::Inconclusive | Verdict::Disagrees => close_calls,
                _ => Vec::new(),
            };
            ClaimRow {
                figure: claim.figure.clone(),
                experiment: claim.experiment.clone(),
                says,
                measured,
                verdict,
                why_not,
                close_calls,
                cells,
            }
        })
        .collect()
}

/// One sanity check, checked: its outcome is a [`Verdict`] of the same rules, which the table
/// words as "as expected" / "unexpected" / "unsure".
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SanityRow {
    pub figure: String,
    pub experiment: String,
    pub says: String,
    pub settled_by: String,
    pub measured: String,
    pub verdict: Verdict,
    pub note: Option<String>,
}

/// Checks every sanity check against the analysed results.
pub(crate) fn evaluate_sanity(checks: &[SanityCheck], analysis: &Analysis) -> Vec<SanityRow> {
    checks
        .iter()
        .map(|sanity| {
            let experiment = analysis
                .experiments
                .iter()
                .find(|e| e.name == sanity.experiment);
            let (measured, verdict) = match (experiment, sanity.check.criterion()) {
                (None, _) => (
                    "-".to_string(),
                    Verdict::NoData(format!(
                        "experiment `{}` not in the results",
                        sanity.experiment
                    )),
                ),
                (Some(_), Err(why)) => (String::new(), Verdict::Invalid(why)),
                (Some(experiment), Ok(criterion)) => {
                    let checked = run_check(analysis, experiment, &sanity.check, criterion);
                    (checked.measured, checked.verdict)
                }
            };
            SanityRow {
                figure: sanity.figure.clone(),
                experiment: sanity.experiment.clone(),
                says: sanity.says.clone(),
                settled_by: sanity.settled_by.clone(),
                measured,
                verdict,
                note: sanity.note.clone(),
            }
        })
        .collect()
}

/// Medians of every case at every sweep value, for claims without a check: page load time for a
/// web experiment, else throughput.
fn overview(experiment: &Experiment) -> String {
    let mut parts = Vec::new();
    for row in &experiment.rows {
        let spread = if experiment.web {
            row.page_load_seconds
        } else {
            row.throughput_mbps
        };
        if let Some(spread) = spread {
            parts.push(format!(
                "{} @ {}: {:.2}",
                row.case, row.sweep_label, spread.median
            ));
        }
    }
    if parts.is_empty() {
        "no successful runs".to_string()
    } else if experiment.web {
        format!("median page load s: {}", parts.join("; "))
    } else {
        format!("median Mbit/s: {}", parts.join("; "))
    }
}

/// The operand's metric at one row, or why there is none.
fn metric_of(
    experiment: &Experiment,
    row: &CaseRow,
    metric: &str,
    stat: Stat,
) -> Result<Measured, String> {
    let pairing_needed = |row: &CaseRow| -> Result<(), String> {
        if row.is_baseline {
            Err(format!(
                "`{}` is the baseline case: no gain against itself",
                row.case
            ))
        } else if !experiment.baseline_present {
            Err(format!(
                "no `{}` case in this experiment to pair with",
                experiment.baseline_case
            ))
        } else {
            Ok(())
        }
    };
    let measured = match metric {
        GOS_POSITIVE_SHARE_METRIC => {
            pairing_needed(row)?;
            let share = row.gos_positive;
            share.fraction().map(|value| Measured {
                value,
                detail: Some(format!(
                    "{}/{} runs with GoS > 0",
                    share.positive, share.total
                )),
                samples: row
                    .paired_gains
                    .iter()
                    .filter(|g| g.is_finite())
                    .map(|g| (None, if *g > 0.0 { 1.0 } else { 0.0 }))
                    .collect(),
                summary: Summary::Share,
            })
        }
        GOS_METRIC => {
            pairing_needed(row)?;
            stat.of(&row.paired_gains).map(|value| Measured {
                value,
                detail: Some(format!("{} pairs", row.paired_gains.len())),
                samples: row.paired_gains.iter().map(|g| (None, *g)).collect(),
                summary: Summary::Stat(stat),
            })
        }
        other => {
            if other != THROUGHPUT_METRIC && !experiment.extra_names.iter().any(|n| n == other) {
                return Err(format!(
                    "metric `{other}` is not measured in this experiment (it has: {})",
                    known_metrics(experiment)
                ));
            }
            let samples: Vec<(Option<u64>, f64)> = row
                .metric_samples(other)
                .into_iter()
                .map(|(seed, value)| (Some(seed), value))
                .collect();
            let values: Vec<f64> = samples.iter().map(|(_, v)| *v).collect();
            stat.of(&values).map(|value| Measured {
                value,
                detail: None,
                samples,
                summary: Summary::Stat(stat),
            })
        }
    };
    measured
        .filter(|m| m.value.is_finite())
        .ok_or_else(|| format!("no {metric} of `{}` @ {}", row.case, row.sweep_label))
}

/// The metrics a check or plot can name in this experiment, for error messages.
pub(crate) fn known_metrics(experiment: &Experiment) -> String {
    let mut names = vec![THROUGHPUT_METRIC.to_string()];
    if experiment.baseline_present {
        names.push(GOS_METRIC.to_string());
        names.push(GOS_POSITIVE_SHARE_METRIC.to_string());
    }
    names.extend(experiment.extra_names.iter().cloned());
    names.join(", ")
}

fn unit(metric: &str) -> &'static str {
    match metric {
        THROUGHPUT_METRIC => " Mbit/s",
        m if m.ends_with("seconds") => " s",
        _ => "",
    }
}

/// The row of `case` at sweep value `x`; without `x`, the case's only row (an experiment
/// without a sweep).
fn find_row<'a>(
    experiment: &'a Experiment,
    case: &str,
    x: Option<&AxisValue>,
) -> Option<&'a CaseRow> {
    experiment.rows.iter().find(|row| {
        row.case == case && x.is_none_or(|x| x.matches(&row.sweep_label, row.sweep_number))
    })
}

/// Sweep values at which the check is made: the given ones, else every sweep value of case A
/// (all must agree: numeric ones ascending, text ones in the table's order), else the single
/// point of an experiment without a sweep.
fn check_points(
    experiment: &Experiment,
    check: &Check,
) -> Vec<(Option<AxisValue>, Option<AxisValue>)> {
    match (&check.a.x, check.b.as_ref().and_then(|b| b.x.as_ref())) {
        (Some(xa), Some(xb)) => vec![(Some(xa.clone()), Some(xb.clone()))],
        (Some(x), None) | (None, Some(x)) => vec![(Some(x.clone()), Some(x.clone()))],
        (None, None) => {
            let rows_of_a = experiment.rows.iter().filter(|r| r.case == check.a.case);
            let mut xs: Vec<AxisValue> = Vec::new();
            if experiment.sweep_param.is_none() {
                // No sweep: the case's only point.
            } else if experiment.numeric_sweep {
                let mut numbers: Vec<f64> = rows_of_a.filter_map(|r| r.sweep_number).collect();
                numbers.sort_by(f64::total_cmp);
                numbers.dedup();
                xs.extend(numbers.into_iter().map(AxisValue::Number));
            } else {
                for row in rows_of_a {
                    let value = AxisValue::Text(row.sweep_label.clone());
                    if !xs.contains(&value) {
                        xs.push(value);
                    }
                }
            }
            if xs.is_empty() {
                vec![(None, None)]
            } else {
                xs.into_iter().map(|x| (Some(x.clone()), Some(x))).collect()
            }
        }
    }
}

fn at(x: Option<&AxisValue>) -> String {
    x.map(|x| format!(" @ {x}")).unwrap_or_default()
}

/// "case stat metric @ x" (no stat for a share, which summarises the runs itself); the case is
/// "experiment/case" when the operand names its own experiment.
fn operand_label(operand: &Operand, metric: &str, stat: Stat, x: Option<&AxisValue>) -> String {
    let case = match &operand.experiment {
        Some(experiment) => format!("{experiment}/{}", operand.case),
        None => operand.case.clone(),
    };
    if metric == GOS_POSITIVE_SHARE_METRIC {
        format!("{case} {metric}{}", at(x))
    } else {
        format!("{case} {} {metric}{}", stat.name(), at(x))
    }
}

/// The experiment an operand is measured in: its own `experiment`, else the claim's.
fn operand_experiment<'a>(
    analysis: &'a Analysis,
    claim_experiment: &'a Experiment,
    operand: &Operand,
) -> Result<&'a Experiment, String> {
    match &operand.experiment {
        None => Ok(claim_experiment),
        Some(name) => analysis
            .experiments
            .iter()
            .find(|e| e.name == *name)
            .ok_or_else(|| format!("experiment `{name}` not in the results")),
    }
}

/// "0.960 Mbit/s" or "0.800 (4/5 runs with GoS > 0)".
fn value_text(measured: &Measured, metric: &str) -> String {
    let mut text = format!("{:.3}{}", measured.value, unit(metric));
    if let Some(detail) = &measured.detail {
        let _ = write!(text, " ({detail})");
    }
    text
}

/// "needs >= 0.9: met by 0.060" — how far the compared number is from the accepted range.
fn target_text(compared: f64, criterion: Criterion) -> String {
    let verdict = if criterion.accepts(compared) {
        "met by"
    } else {
        "missed by"
    };
    format!(
        "needs {}: {verdict} {}",
        criterion.text(),
        number(judge::distance(criterion, compared))
    )
}

/// One point of a check, measured: A, and B when the check has one.
struct PointMeasure {
    x: Option<AxisValue>,
    a: Measured,
    label_a: String,
    metric_a: String,
    b: Option<(Measured, String, String)>,
    /// The cells whose runs A and B read.
    cells: Vec<CellKey>,
}

impl PointMeasure {
    fn compared(&self) -> f64 {
        match &self.b {
            Some((b, _, _)) => self.a.value / b.value,
            None => self.a.value,
        }
    }
}

/// A and B of `check` at sweep values `xa` and `xb`, or why they cannot be measured.
fn measure_point(
    check: &Check,
    (experiment_a, experiment_b): (&Experiment, &Experiment),
    xa: Option<&AxisValue>,
    xb: Option<&AxisValue>,
) -> Result<PointMeasure, String> {
    let mut cells = Vec::new();
    let metric_a = check.a.metric.as_deref().unwrap_or(&check.metric);
    let a = find_row(experiment_a, &check.a.case, xa)
        .ok_or_else(|| format!("no `{}` run{}", check.a.case, at(xa)))
        .and_then(|row| {
            cells.extend(cells_read(experiment_a, row, metric_a));
            metric_of(experiment_a, row, metric_a, check.stat)
        })?;
    let b = match &check.b {
        Some(b_operand) => {
            let metric_b = b_operand.metric.as_deref().unwrap_or(&check.metric);
            let b = find_row(experiment_b, &b_operand.case, xb)
                .ok_or_else(|| format!("no `{}` run{}", b_operand.case, at(xb)))
                .and_then(|row| {
                    cells.extend(cells_read(experiment_b, row, metric_b));
                    metric_of(experiment_b, row, metric_b, check.stat)
                })?;
            let label_b = operand_label(b_operand, metric_b, check.stat, xb);
            Some((b, label_b, metric_b.to_string()))
        }
        None => None,
    };
    Ok(PointMeasure {
        x: xa.cloned(),
        label_a: operand_label(&check.a, metric_a, check.stat, xa),
        metric_a: metric_a.to_string(),
        a,
        b,
        cells,
    })
}

/// The cells whose runs a metric of `row` reads: the row's, and for a gain of splitting the
/// baseline case's at the same sweep value.
fn cells_read(experiment: &Experiment, row: &CaseRow, metric: &str) -> Vec<CellKey> {
    let cell = |case: &str| {
        (
            experiment.name.clone(),
            case.to_string(),
            row.sweep_label.clone(),
        )
    };
    let mut cells = vec![cell(&row.case)];
    if matches!(metric, GOS_METRIC | GOS_POSITIVE_SHARE_METRIC) {
        cells.push(cell(&experiment.baseline_case));
    }
    cells
}

fn run_check(
    analysis: &Analysis,
    experiment: &Experiment,
    check: &Check,
    criterion: Criterion,
) -> Checked {
    let experiment_a = match operand_experiment(analysis, experiment, &check.a) {
        Ok(found) => found,
        Err(why) => return Checked::without_runs(String::new(), Verdict::NoData(why)),
    };
    let experiment_b = match check
        .b
        .as_ref()
        .map(|b| operand_experiment(analysis, experiment, b))
        .transpose()
    {
        Ok(found) => found.unwrap_or(experiment),
        Err(why) => return Checked::without_runs(String::new(), Verdict::NoData(why)),
    };
    let points = check_points(experiment_a, check);
    let mut parts = Vec::new();
    let mut outcomes = Vec::new();
    let mut close_calls = Vec::new();
    let mut measured = Vec::new();
    for (xa, xb) in points {
        let point = match measure_point(
            check,
            (experiment_a, experiment_b),
            xa.as_ref(),
            xb.as_ref(),
        ) {
            Ok(point) => point,
            Err(why) => return Checked::without_runs(parts.join("; "), Verdict::NoData(why)),
        };
        if check.trend.is_none() {
            let b = point.b.as_ref().map(|(b, _, _)| b);
            let compared = judge::compare(&point.a, b);
            let (label, shown) = match &point.b {
                Some((b, label_b, metric_b)) => {
                    // A paired median is judged on the median of the per-pair ratios, which is
                    // not the ratio of the two medians shown before it.
                    let ratio = if compared.paired && point.a.summary == Summary::Stat(Stat::Median)
                    {
                        format!(", median of the paired ratios {}", number(compared.value))
                    } else {
                        format!(" = {}", number(compared.value))
                    };
                    (
                        format!("{} / {label_b}", point.label_a),
                        format!(
                            " = {} / {}{ratio}",
                            value_text(&point.a, &point.metric_a),
                            value_text(b, metric_b),
                        ),
                    )
                }
                None => (
                    point.label_a.clone(),
                    format!(" = {}", value_text(&point.a, &point.metric_a)),
                ),
            };
            let outcome = judge::judge(criterion, &compared);
            outcomes.push(outcome);
            close_calls.extend(judge::close_call(criterion, &compared, outcome, &label));
            parts.push(format!(
                "{label}{shown}, {}, {}",
                judge::interval_text(&compared, &point.a, b),
                target_text(compared.value, criterion)
            ));
        }
        measured.push(point);
    }
    if check.trend.is_some() {
        let covered = |p: &PointMeasure| match (check.from_x, &p.x) {
            (Some(from), Some(AxisValue::Number(x))) => *x >= from,
            _ => true,
        };
        measured.retain(covered);
        let (text, verdict) = trend_check(&measured, criterion);
        return Checked {
            measured: text,
            verdict,
            close_calls: Vec::new(),
            cells: all_cells(&measured),
        };
    }
    let verdict = if outcomes.contains(&PointOutcome::Fails) {
        Verdict::Disagrees
    } else if !outcomes.is_empty() && outcomes.iter().all(|o| *o == PointOutcome::Holds) {
        Verdict::Agrees
    } else {
        Verdict::Inconclusive
    };
    Checked {
        measured: parts.join("; "),
        verdict,
        close_calls,
        cells: all_cells(&measured),
    }
}

/// The cells the points read, each once, in the order first read.
fn all_cells(points: &[PointMeasure]) -> Vec<CellKey> {
    let mut cells: Vec<CellKey> = Vec::new();
    for cell in points.iter().flat_map(|p| &p.cells) {
        if !cells.contains(cell) {
            cells.push(cell.clone());
        }
    }
    cells
}

/// Fewest sweep points a trend is judged on: with two, any difference is a "trend".
const MIN_TREND_POINTS: usize = 3;

/// The rank correlation of the compared number with the sweep and its interval, judged by
/// `criterion` (above or below zero).
fn trend_check(points: &[PointMeasure], criterion: Criterion) -> (String, Verdict) {
    let values: Vec<String> = points
        .iter()
        .map(|p| {
            let x = p.x.as_ref().map(ToString::to_string).unwrap_or_default();
            format!("{x}: {}", number(p.compared()))
        })
        .collect();
    let label = match points.first() {
        Some(p) => match &p.b {
            Some((_, label_b, _)) => format!("{} / {label_b}", p.label_a),
            None => p.label_a.clone(),
        },
        None => String::new(),
    };
    // The labels name the first point's sweep value; the trend runs over all of them.
    let label = points
        .first()
        .and_then(|p| p.x.as_ref())
        .map_or(label.clone(), |x| label.replace(&format!(" @ {x}"), ""));
    if points.len() < MIN_TREND_POINTS {
        return (
            format!("{label} by sweep value: {}", values.join(", ")),
            Verdict::NoData(format!(
                "a trend needs at least {MIN_TREND_POINTS} sweep points, the results have {}",
                points.len()
            )),
        );
    }
    let compared: Vec<f64> = points.iter().map(PointMeasure::compared).collect();
    let runs: Vec<PointRuns> = points.iter().map(point_runs).collect();
    let (text, verdict) = trend::judge(&compared, &runs, criterion);
    (
        format!("{label} by sweep value: {}; {text}", values.join(", ")),
        verdict,
    )
}

/// The runs behind a point's compared number, paired by seed where both sides share them.
fn point_runs(point: &PointMeasure) -> PointRuns {
    let values = |m: &Measured| m.samples.iter().map(|(_, v)| *v).collect::<Vec<_>>();
    match &point.b {
        None => PointRuns::One(values(&point.a)),
        Some((b, _, _)) => match judge::pairs_by_seed(&point.a, b) {
            Some(pairs) => PointRuns::Paired(pairs),
            None => PointRuns::Independent(values(&point.a), values(b)),
        },
    }
}
