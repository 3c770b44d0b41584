//! A paper's claims next to what the lab measured — the table "paper says / we measured /
//! agrees? / why not" — and annotations of the report's plots.
//!
//! A claims file (`claims.toml` in a results folder, copied there from
//! `scenarios/repro/PAPER.claims.toml`) lists, per experiment, what the paper reported and,
//! where the claim can be checked by a machine, one comparison; it may also add reference lines
//! and plots of `extra` measurements to the report's figures:
//!
//! ```toml
//! paper = "hfc-proxy"
//! [[claims]]
//! figure = "Fig. 8"
//! experiment = "fig8-9-legacy"
//! says = "At 1 % local loss store-and-forward loses < 5 % of its lossless throughput"
//! target = "the issue's target, when it differs from the paper (optional)"
//! why_not = "what may explain a difference (shown only when the check fails)"
//! note = "a caveat shown whatever the verdict (optional)"
//! [claims.check]
//! metric = "throughput"          # see the metrics below (default "throughput")
//! stat = "median"                # "median" (default) or "mean" over the repetitions
//! a = { case = "store-and-forward", x = 1 }
//! b = { case = "store-and-forward", x = 0 }   # optional: without b, A is compared to `value`
//! op = ">="                      # ">=", "<=", ">" or "<"
//! value = 0.9                    # A / B op value (or A op value without b)
//!
//! [[plots]]
//! experiment = "fig8-9-modern"   # an experiment of the results
//! title = "..."                  # optional: caption of this entry's extra plot; for an entry
//!                                #   without `metrics`, the caption of the main plot
//! metrics = ["remote_segment_seconds", "local_segment_seconds"]  # optional: one extra plot
//! cases = ["store-and-forward"]  # optional: only these cases in the extra plot
//! [[plots.lines]]                # optional: reference lines on the experiment's main plot
//! label = "buffer rule C >= n(B-1)(1-r_out/r_in), n = 3"   # legend text
//! x = 24000                      # a vertical line at this sweep value (a text sweep value
//!                                #   such as "pipelining" on a categorical axis) ...
//! # y = 15.0                     # ... or a horizontal one at this value of the y axis
//! ```
//!
//! Metrics of a check (`metric`, or per operand `a = { ..., metric = "..." }`):
//! - `"throughput"`: Mbit/s of the runs;
//! - the name of any `extra` measurement of the records, e.g. `"remote_segment_seconds"` or, for
//!   web experiments, `"page_load_seconds"` (the mean page load time of a run);
//! - `"gos_positive_share"`: the share (0..1) of repetitions whose throughput beat the
//!   experiment's baseline case (`direct` unless the report was told otherwise) run with the same
//!   parameters and repetition index — the satellite paper's "guarantee of improvement";
//! - `"gos"`: the gain of splitting of those paired repetitions.
//!
//! `stat` says how the repetitions of a case at one sweep value are summarised (it does not apply
//! to `gos_positive_share`, a share already). `x` is the sweep value as the records hold it (the
//! axis value: 1 for 1 % loss, bytes for a size). Without `x` in both A and B the check runs at
//! every sweep value case A has and agrees only if every one does ("in every cell"). The table
//! shows, for every cell, A, B, their ratio and by how much the target is met or missed.
//!
//! A `[[plots]]` entry naming an experiment, metric or case the results do not have, or a line
//! that cannot be placed, becomes a warning line in the report, never an error: the rest of the
//! report is still written. Extra plots are written as `plots/<experiment>-<n>.png` and `.svg`
//! (n = 1, 2, ... over the experiment's entries with `metrics`) and linked in the experiment's
//! section. Parsing and evaluation are pure; only [`load`] and [`append_to_report`] read a file.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::analysis::{Analysis, CaseRow, Experiment, THROUGHPUT_METRIC};
use crate::markdown::number;
use crate::stats;

/// File name of the claims inside a results folder.
pub const CLAIMS_FILE: &str = "claims.toml";

/// Metric of a check: share of paired repetitions with GoS > 0 against the baseline case.
pub const GOS_POSITIVE_SHARE_METRIC: &str = "gos_positive_share";
/// Metric of a check: gain of splitting of the paired repetitions against the baseline case.
pub const GOS_METRIC: &str = "gos";

/// Relative tolerance when matching a sweep value (axis values are written as decimals).
const X_TOLERANCE: f64 = 1e-9;

#[derive(Debug, thiserror::Error)]
pub enum ClaimsError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a valid claims file")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
}

/// A claims file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimsFile {
    pub paper: String,
    #[serde(default)]
    pub claims: Vec<Claim>,
    /// Annotations of the report's plots.
    #[serde(default)]
    pub plots: Vec<PlotSpec>,
}

/// One claim of the paper about one experiment.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    pub figure: String,
    pub experiment: String,
    /// What the paper reported (our words, not the paper's sentence).
    pub says: String,
    /// The issue's target, when stricter or looser than the paper (shown with the claim).
    #[serde(default)]
    pub target: Option<String>,
    /// What explains a disagreement; shown only when the check does not agree.
    #[serde(default)]
    pub why_not: Option<String>,
    /// A caveat shown whatever the verdict (e.g. an agreement that has another cause).
    #[serde(default)]
    pub note: Option<String>,
    #[serde(default)]
    pub check: Option<Check>,
}

/// A machine-checkable comparison of two summarised measurements (or of one with a value).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    #[serde(default = "default_metric")]
    pub metric: String,
    /// How the repetitions of one case at one sweep value are summarised.
    #[serde(default)]
    pub stat: Stat,
    pub a: Operand,
    #[serde(default)]
    pub b: Option<Operand>,
    pub op: Comparison,
    pub value: f64,
}

fn default_metric() -> String {
    THROUGHPUT_METRIC.to_string()
}

/// Summary of the repetitions of one case at one point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stat {
    #[default]
    Median,
    Mean,
}

impl Stat {
    fn name(self) -> &'static str {
        match self {
            Stat::Median => "median",
            Stat::Mean => "mean",
        }
    }

    fn of(self, values: &[f64]) -> Option<f64> {
        match self {
            Stat::Median => stats::median(values),
            Stat::Mean => stats::mean(values),
        }
    }
}

/// A case at a sweep value (every sweep value when `x` is absent).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Operand {
    pub case: String,
    /// The sweep value: a number (`x = 1`) or, for a text sweep, its text (`x = "pipelining"`).
    #[serde(default)]
    pub x: Option<AxisValue>,
    /// Overrides the check's metric for this operand (e.g. remote vs local segment time).
    #[serde(default)]
    pub metric: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Comparison {
    #[serde(rename = ">=")]
    AtLeast,
    #[serde(rename = "<=")]
    AtMost,
    #[serde(rename = ">")]
    Above,
    #[serde(rename = "<")]
    Below,
}

impl Comparison {
    fn holds(self, left: f64, right: f64) -> bool {
        match self {
            Comparison::AtLeast => left >= right,
            Comparison::AtMost => left <= right,
            Comparison::Above => left > right,
            Comparison::Below => left < right,
        }
    }

    fn symbol(self) -> &'static str {
        match self {
            Comparison::AtLeast => ">=",
            Comparison::AtMost => "<=",
            Comparison::Above => ">",
            Comparison::Below => "<",
        }
    }
}

/// One `[[plots]]` entry: annotations of one experiment's figures.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlotSpec {
    pub experiment: String,
    /// Caption of this entry's extra plot; for an entry without `metrics`, of the main plot.
    #[serde(default)]
    pub title: Option<String>,
    /// `extra` measurements (or "throughput") drawn together in one extra plot, median and
    /// quartiles per case and sweep value. Empty: no extra plot.
    #[serde(default)]
    pub metrics: Vec<String>,
    /// Cases of the extra plot (empty: every case).
    #[serde(default)]
    pub cases: Vec<String>,
    /// Reference lines drawn on the experiment's main plot.
    #[serde(default)]
    pub lines: Vec<ReferenceLine>,
}

/// A labelled reference line: vertical at a sweep value `x` or horizontal at `y` (in the unit of
/// the main plot's y axis: Mbit/s, or seconds of page load time for a web experiment).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceLine {
    pub label: String,
    #[serde(default)]
    pub x: Option<AxisValue>,
    #[serde(default)]
    pub y: Option<f64>,
}

/// A sweep value: a number on a numeric axis, or the text of a category.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum AxisValue {
    Number(f64),
    Text(String),
}

impl AxisValue {
    /// Whether this value names the sweep value written `label` (numeric value `number`): a
    /// number matches a numeric value (or a label that reads as that number), a text its label.
    pub fn matches(&self, label: &str, number: Option<f64>) -> bool {
        match self {
            AxisValue::Number(x) => number
                .or_else(|| label.trim().parse::<f64>().ok())
                .is_some_and(|n| (n - x).abs() <= X_TOLERANCE * x.abs().max(1.0)),
            AxisValue::Text(text) => text == label,
        }
    }
}

impl std::fmt::Display for AxisValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AxisValue::Number(x) => write!(f, "{x}"),
            AxisValue::Text(text) => f.write_str(text),
        }
    }
}

/// Result of checking one claim.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Agrees,
    Disagrees,
    /// No check in the file: the measured numbers are shown for a reader to judge.
    NotChecked,
    /// The check needs data the results do not have (experiment, case or sweep value missing).
    NoData(String),
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimRow {
    pub figure: String,
    pub experiment: String,
    pub says: String,
    pub measured: String,
    pub verdict: Verdict,
    pub why_not: Option<String>,
}

/// Parses the text of a claims file.
pub fn parse(text: &str) -> Result<ClaimsFile, toml::de::Error> {
    toml::from_str(text)
}

/// Reads and parses `dir/claims.toml`; `None` when the folder has none (the file is optional).
pub fn load(dir: &Path) -> Result<Option<ClaimsFile>, ClaimsError> {
    let path = dir.join(CLAIMS_FILE);
    let source = match fs::read_to_string(&path) {
        Ok(source) => source,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ClaimsError::Read { path, source }),
    };
    parse(&source)
        .map(Some)
        .map_err(|source| ClaimsError::Parse { path, source })
}

/// Checks every claim against the analysed results.
pub fn evaluate(file: &ClaimsFile, analysis: &Analysis) -> Vec<ClaimRow> {
    file.claims
        .iter()
        .map(|claim| {
            let says = match &claim.target {
                Some(target) => format!("{} (target: {target})", claim.says),
                None => claim.says.clone(),
            };
            let experiment = analysis
                .experiments
                .iter()
                .find(|e| e.name == claim.experiment);
            let (measured, verdict) = match (experiment, &claim.check) {
                (None, _) => (
                    "-".to_string(),
                    Verdict::NoData(format!(
                        "experiment `{}` not in the results",
                        claim.experiment
                    )),
                ),
                (Some(experiment), None) => (overview(experiment), Verdict::NotChecked),
                (Some(experiment), Some(check)) => run_check(experiment, check),
            };
            let why_not = match verdict {
                Verdict::Disagrees | Verdict::NoData(_) => claim.why_not.clone(),
                _ => None,
            };
            let why_not = match (why_not, &claim.note) {
                (Some(why), Some(note)) => Some(format!("{why}. Note: {note}")),
                (None, Some(note)) => Some(format!("Note: {note}")),
                (why, None) => why,
            };
            ClaimRow {
                figure: claim.figure.clone(),
                experiment: claim.experiment.clone(),
                says,
                measured,
                verdict,
                why_not,
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

/// A summarised measurement of one operand, with how it was counted when that helps a reader.
struct Measured {
    value: f64,
    /// E.g. "4/5 runs" for a share.
    detail: Option<String>,
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
            })
        }
        GOS_METRIC => {
            pairing_needed(row)?;
            stat.of(&row.paired_gains).map(|value| Measured {
                value,
                detail: Some(format!("{} pairs", row.paired_gains.len())),
            })
        }
        other => {
            if other != THROUGHPUT_METRIC && !experiment.extra_names.iter().any(|n| n == other) {
                return Err(format!(
                    "metric `{other}` is not measured in this experiment (it has: {})",
                    known_metrics(experiment)
                ));
            }
            stat.of(&row.metric_values(other)).map(|value| Measured {
                value,
                detail: None,
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

/// "case stat metric @ x" (no stat for a share, which summarises the runs itself).
fn operand_label(operand: &Operand, metric: &str, stat: Stat, x: Option<&AxisValue>) -> String {
    if metric == GOS_POSITIVE_SHARE_METRIC {
        format!("{} {metric}{}", operand.case, at(x))
    } else {
        format!("{} {} {metric}{}", operand.case, stat.name(), at(x))
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

/// "needs >= 0.9: met by 0.060" — how far the compared number is from the target.
fn target_text(compared: f64, op: Comparison, target: f64, holds: bool) -> String {
    let distance = (compared - target).abs();
    let verdict = if holds { "met by" } else { "missed by" };
    format!(
        "needs {} {target}: {verdict} {}",
        op.symbol(),
        number(distance)
    )
}

fn run_check(experiment: &Experiment, check: &Check) -> (String, Verdict) {
    let points = check_points(experiment, check);
    let mut parts = Vec::new();
    let mut all_hold = true;
    for (xa, xb) in points {
        let metric_a = check.a.metric.as_deref().unwrap_or(&check.metric);
        let (xa, xb) = (xa.as_ref(), xb.as_ref());
        let a = match find_row(experiment, &check.a.case, xa)
            .ok_or_else(|| format!("no `{}` run{}", check.a.case, at(xa)))
            .and_then(|row| metric_of(experiment, row, metric_a, check.stat))
        {
            Ok(a) => a,
            Err(why) => return (parts.join("; "), Verdict::NoData(why)),
        };
        let label_a = operand_label(&check.a, metric_a, check.stat, xa);
        match &check.b {
            Some(b_operand) => {
                let metric_b = b_operand.metric.as_deref().unwrap_or(&check.metric);
                let b = match find_row(experiment, &b_operand.case, xb)
                    .ok_or_else(|| format!("no `{}` run{}", b_operand.case, at(xb)))
                    .and_then(|row| metric_of(experiment, row, metric_b, check.stat))
                {
                    Ok(b) => b,
                    Err(why) => return (parts.join("; "), Verdict::NoData(why)),
                };
                let label_b = operand_label(b_operand, metric_b, check.stat, xb);
                let ratio = a.value / b.value;
                let holds = ratio.is_finite() && check.op.holds(ratio, check.value);
                all_hold &= holds;
                parts.push(format!(
                    "{label_a} / {label_b} = {} / {} = {}, {}",
                    value_text(&a, metric_a),
                    value_text(&b, metric_b),
                    number(ratio),
                    target_text(ratio, check.op, check.value, holds)
                ));
            }
            None => {
                let holds = check.op.holds(a.value, check.value);
                all_hold &= holds;
                parts.push(format!(
                    "{label_a} = {}, {}",
                    value_text(&a, metric_a),
                    target_text(a.value, check.op, check.value, holds)
                ));
            }
        }
    }
    let verdict = if all_hold {
        Verdict::Agrees
    } else {
        Verdict::Disagrees
    };
    (parts.join("; "), verdict)
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// The markdown section with the table.
pub fn render(file: &ClaimsFile, rows: &[ClaimRow]) -> String {
    let mut text = String::new();
    let agree = rows.iter().filter(|r| r.verdict == Verdict::Agrees).count();
    let checked = rows
        .iter()
        .filter(|r| matches!(r.verdict, Verdict::Agrees | Verdict::Disagrees))
        .count();
    let _ = writeln!(text, "## Paper vs lab: {}\n", file.paper);
    let _ = writeln!(
        text,
        "{agree} of {checked} checked claims agree (medians of the runs above unless a row says \
         mean; a ratio is case A's number over case B's; \"met by\" / \"missed by\" is the \
         distance of the compared number from the target).\n"
    );
    let _ = writeln!(
        text,
        "| figure | experiment | paper says | we measured | agrees? | why not |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|");
    for row in rows {
        let verdict = match &row.verdict {
            Verdict::Agrees => "yes".to_string(),
            Verdict::Disagrees => "**no**".to_string(),
            Verdict::NotChecked => "(not checked)".to_string(),
            Verdict::NoData(why) => format!("no data: {why}"),
        };
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} |",
            cell(&row.figure),
            cell(&row.experiment),
            cell(&row.says),
            cell(&row.measured),
            cell(&verdict),
            cell(row.why_not.as_deref().unwrap_or(""))
        );
    }
    text
}

/// Appends the claims table of `file` to the report `text`, when the file has claims (a file
/// with only `[[plots]]` adds no table).
pub fn append_table(file: &ClaimsFile, analysis: &Analysis, mut text: String) -> String {
    if file.claims.is_empty() {
        return text;
    }
    let rows = evaluate(file, analysis);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push('\n');
    text.push_str(&render(file, &rows));
    text
}

/// When `dir` holds a [`CLAIMS_FILE`], appends its table to the report `text`; otherwise returns
/// `text` unchanged.
pub fn append_to_report(
    dir: &Path,
    analysis: &Analysis,
    text: String,
) -> Result<String, ClaimsError> {
    Ok(match load(dir)? {
        Some(file) => append_table(&file, analysis, text),
        None => text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::analyse;
    use crate::record::RunRecord;
    use std::collections::BTreeMap;

    fn record(case: &str, loss: f64, repetition: u32, mbps: f64) -> RunRecord {
        let mut params = BTreeMap::new();
        params.insert("loss (%)".to_string(), serde_json::json!(loss));
        let mut extra = BTreeMap::new();
        extra.insert("remote_segment_seconds".to_string(), 1.5);
        RunRecord {
            scenario: "s".into(),
            scenario_file: "s.toml".into(),
            commit: "c".into(),
            experiment: "fig8".into(),
            case: case.into(),
            sweep_param: Some("loss (%)".into()),
            params,
            repetition,
            seed: u64::from(repetition),
            bytes: 1_000_000,
            seconds: 8.0 / mbps,
            throughput_bps: mbps * 1e6,
            retransmits: BTreeMap::new(),
            extra,
            ok: true,
            error: None,
            started_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    fn analysis() -> Analysis {
        let mut records = Vec::new();
        for rep in 0..3 {
            records.push(record("direct", 0.0, rep, 4.0));
            records.push(record("direct", 1.0, rep, 1.0));
            records.push(record("proxy", 0.0, rep, 5.0));
            records.push(record("proxy", 1.0, rep, 4.8));
        }
        analyse(&records, "direct")
    }

    const CLAIMS: &str = r#"
paper = "p"
[[claims]]
figure = "Fig. 8"
experiment = "fig8"
says = "proxy keeps 90 %"
[claims.check]
a = { case = "proxy", x = 1 }
b = { case = "proxy", x = 0 }
op = ">="
value = 0.9

[[claims]]
figure = "Fig. 8"
experiment = "fig8"
says = "direct keeps 90 %"
why_not = "loss"
[claims.check]
a = { case = "direct", x = 1 }
b = { case = "direct", x = 0 }
op = ">="
value = 0.9

[[claims]]
figure = "Fig. 8"
experiment = "fig8"
says = "proxy beats direct everywhere"
[claims.check]
a = { case = "proxy" }
b = { case = "direct" }
op = ">"
value = 1.0

[[claims]]
figure = "Fig. 11"
experiment = "fig8"
says = "remote segment finishes early"
[claims.check]
metric = "remote_segment_seconds"
a = { case = "proxy", x = 1 }
op = "<"
value = 2.0

[[claims]]
figure = "Fig. 5"
experiment = "fig5"
says = "not run"
why_not = "skipped"
"#;

    #[test]
    fn checks_ratios_all_cells_extras_and_missing_experiments() {
        let file = parse(CLAIMS).unwrap();
        let rows = evaluate(&file, &analysis());
        assert_eq!(rows[0].verdict, Verdict::Agrees, "{}", rows[0].measured);
        assert!(rows[0].measured.contains("0.96"), "{}", rows[0].measured);
        assert_eq!(rows[0].why_not, None);
        assert_eq!(rows[1].verdict, Verdict::Disagrees);
        assert_eq!(rows[1].why_not.as_deref(), Some("loss"));
        assert_eq!(rows[2].verdict, Verdict::Agrees, "{}", rows[2].measured);
        assert_eq!(rows[3].verdict, Verdict::Agrees, "{}", rows[3].measured);
        assert!(matches!(rows[4].verdict, Verdict::NoData(_)));
        let table = render(&file, &rows);
        assert!(table.contains("3 of 4 checked claims agree"), "{table}");
        assert!(table.contains("| **no** |"), "{table}");
    }

    #[test]
    fn a_missing_case_is_no_data_not_agreement() {
        let file = parse(
            r#"paper = "p"
[[claims]]
figure = "F"
experiment = "fig8"
says = "x"
[claims.check]
a = { case = "nope", x = 1 }
op = ">"
value = 0.0
"#,
        )
        .unwrap();
        let rows = evaluate(&file, &analysis());
        assert!(matches!(rows[0].verdict, Verdict::NoData(_)));
    }

    #[test]
    fn an_experiment_without_sweep_is_one_point() {
        let mut records = Vec::new();
        for (case, mbps) in [("tuned", 3.0), ("untuned", 1.0)] {
            let mut r = record(case, 0.0, 0, mbps);
            r.experiment = "warm".into();
            r.sweep_param = None;
            r.params.clear();
            records.push(r);
        }
        let file = parse(
            r#"paper = "p"
[[claims]]
figure = "F"
experiment = "warm"
says = "tuned is 2x"
[claims.check]
a = { case = "tuned" }
b = { case = "untuned" }
op = ">="
value = 2.0
"#,
        )
        .unwrap();
        let rows = evaluate(&file, &analyse(&records, "untuned"));
        assert_eq!(rows[0].verdict, Verdict::Agrees, "{}", rows[0].measured);
        assert!(rows[0].measured.contains("= 3.00"), "{}", rows[0].measured);
    }

    /// A web experiment swept over the HTTP mode: one page per run, page load times per
    /// repetition; the throughput is the page's bytes over its load time, as the lab records it.
    fn web_analysis() -> Analysis {
        let page_loads: [(&str, &str, [f64; 5]); 4] = [
            ("direct", "1.0", [10.0, 10.0, 10.0, 10.0, 10.0]),
            ("midway-http", "1.0", [2.0, 2.0, 2.0, 2.0, 30.0]),
            ("direct", "1.1", [6.0, 6.0, 6.0, 6.0, 6.0]),
            ("midway-http", "1.1", [3.0, 3.0, 3.0, 3.0, 3.0]),
        ];
        let mut records = Vec::new();
        for (case, http, loads) in page_loads {
            for (rep, seconds) in loads.into_iter().enumerate() {
                let mut r = record(case, 0.0, rep as u32, 1.0);
                r.experiment = "web".into();
                r.sweep_param = Some("http".into());
                r.params = BTreeMap::from([("http".to_string(), serde_json::json!(http))]);
                r.bytes = 65_000;
                r.seconds = seconds;
                r.throughput_bps = 65_000.0 * 8.0 / seconds;
                r.extra = BTreeMap::from([
                    ("page_load_seconds".to_string(), seconds),
                    ("connections_opened".to_string(), 20.0),
                ]);
                records.push(r);
            }
        }
        analyse(&records, "direct")
    }

    fn check_claim(check: &str) -> String {
        format!(
            "paper = \"sat\"\n[[claims]]\nfigure = \"F\"\nexperiment = \"web\"\nsays = \"s\"\n\
             [claims.check]\n{check}\n"
        )
    }

    fn check_one(analysis: &Analysis, check: &str) -> ClaimRow {
        let file = parse(&check_claim(check)).expect("valid claims");
        evaluate(&file, analysis).remove(0)
    }

    #[test]
    fn page_load_checks_show_a_b_ratio_and_margin() {
        let analysis = web_analysis();
        let row = check_one(
            &analysis,
            r#"metric = "page_load_seconds"
a = { case = "midway-http", x = "1.0" }
b = { case = "direct", x = "1.0" }
op = "<="
value = 0.5"#,
        );
        assert_eq!(row.verdict, Verdict::Agrees, "{}", row.measured);
        assert_eq!(
            row.measured,
            "midway-http median page_load_seconds @ 1.0 / direct median page_load_seconds @ 1.0 \
             = 2.000 s / 10.000 s = 0.200, needs <= 0.5: met by 0.300"
        );
        // A number names the text sweep value that reads as it; without x every cell counts.
        let row = check_one(
            &analysis,
            r#"metric = "page_load_seconds"
a = { case = "midway-http" }
b = { case = "direct" }
op = "<="
value = 0.4"#,
        );
        assert_eq!(row.verdict, Verdict::Disagrees, "{}", row.measured);
        assert!(
            row.measured
                .contains("@ 1.1 = 3.000 s / 6.000 s = 0.500, needs <= 0.4: missed by 0.100"),
            "{}",
            row.measured
        );
        assert!(row.measured.contains("@ 1.0 / "), "{}", row.measured);
        let row = check_one(
            &analysis,
            r#"metric = "page_load_seconds"
a = { case = "midway-http", x = 1.1 }
op = "<"
value = 3.5"#,
        );
        assert_eq!(row.verdict, Verdict::Agrees, "{}", row.measured);
        assert_eq!(
            row.measured,
            "midway-http median page_load_seconds @ 1.1 = 3.000 s, needs < 3.5: met by 0.500"
        );
    }

    #[test]
    fn mean_and_median_can_disagree() {
        let analysis = web_analysis();
        let check = |stat: &str| {
            check_one(
                &analysis,
                &format!(
                    r#"metric = "page_load_seconds"
stat = "{stat}"
a = {{ case = "midway-http", x = "1.0" }}
b = {{ case = "direct", x = "1.0" }}
op = "<="
value = 0.5"#
                ),
            )
        };
        // Loads 2, 2, 2, 2, 30: median 2, mean 7.6 against 10.
        let median = check("median");
        assert_eq!(median.verdict, Verdict::Agrees, "{}", median.measured);
        let mean = check("mean");
        assert_eq!(mean.verdict, Verdict::Disagrees, "{}", mean.measured);
        assert!(
            mean.measured.contains(
                "midway-http mean page_load_seconds @ 1.0 / direct mean page_load_seconds @ 1.0 \
                 = 7.600 s / 10.000 s = 0.760, needs <= 0.5: missed by 0.260"
            ),
            "{}",
            mean.measured
        );
        // Throughput under the mean: 65 kB over 2 s is 0.26 Mbit/s, over 30 s 0.0173.
        let row = check_one(
            &analysis,
            r#"stat = "mean"
a = { case = "midway-http", x = "1.0" }
op = ">"
value = 0.2"#,
        );
        assert_eq!(row.verdict, Verdict::Agrees, "{}", row.measured);
        assert!(row.measured.contains("= 0.211 Mbit/s"), "{}", row.measured);
        assert!(parse(&check_claim(
            "stat = \"mode\"\na = { case = \"d\" }\nop = \">\"\nvalue = 1.0"
        ))
        .is_err());
    }

    #[test]
    fn gos_positive_share_is_the_guarantee_of_improvement() {
        let analysis = web_analysis();
        let share = |value: f64| {
            check_one(
                &analysis,
                &format!(
                    r#"metric = "gos_positive_share"
a = {{ case = "midway-http", x = "1.0" }}
op = ">="
value = {value}"#
                ),
            )
        };
        // Four of five repetitions loaded faster than direct's 10 s.
        let met = share(0.8);
        assert_eq!(met.verdict, Verdict::Agrees, "{}", met.measured);
        assert_eq!(
            met.measured,
            "midway-http gos_positive_share @ 1.0 = 0.800 (4/5 runs with GoS > 0), needs >= 0.8: met by 0.000"
        );
        let missed = share(0.9);
        assert_eq!(missed.verdict, Verdict::Disagrees, "{}", missed.measured);
        assert!(
            missed.measured.ends_with("missed by 0.100"),
            "{}",
            missed.measured
        );
        // The median paired gain: 10 / 2 - 1 = 4 in four repetitions.
        let gos = check_one(
            &analysis,
            r#"metric = "gos"
a = { case = "midway-http", x = "1.0" }
op = ">"
value = 3.0"#,
        );
        assert_eq!(gos.verdict, Verdict::Agrees, "{}", gos.measured);
        assert!(
            gos.measured.contains("= 4.000 (5 pairs)"),
            "{}",
            gos.measured
        );
        // The baseline has no gain against itself.
        let baseline = check_one(
            &analysis,
            r#"metric = "gos_positive_share"
a = { case = "direct", x = "1.0" }
op = ">="
value = 0.5"#,
        );
        assert!(
            matches!(&baseline.verdict, Verdict::NoData(why) if why.contains("baseline")),
            "{:?}",
            baseline.verdict
        );
    }

    #[test]
    fn an_unchecked_web_claim_shows_page_load_medians() {
        let file = parse(
            "paper = \"p\"\n[[claims]]\nfigure = \"F\"\nexperiment = \"web\"\nsays = \"s\"\n",
        )
        .expect("valid");
        let row = evaluate(&file, &web_analysis()).remove(0);
        assert_eq!(row.verdict, Verdict::NotChecked);
        assert!(
            row.measured
                .starts_with("median page load s: direct @ 1.0: 10.00; midway-http @ 1.0: 2.00;"),
            "{}",
            row.measured
        );
    }

    #[test]
    fn unknown_metric_and_sweep_value_are_no_data() {
        let analysis = web_analysis();
        let row = check_one(
            &analysis,
            r#"metric = "cache_hits"
a = { case = "midway-http", x = "1.0" }
op = ">"
value = 0.0"#,
        );
        match &row.verdict {
            Verdict::NoData(why) => assert!(
                why.contains("`cache_hits` is not measured") && why.contains("page_load_seconds"),
                "{why}"
            ),
            other => panic!("expected no data, got {other:?}"),
        }
        let row = check_one(
            &analysis,
            r#"a = { case = "midway-http", x = "pipelining" }
op = ">"
value = 0.0"#,
        );
        assert_eq!(
            row.verdict,
            Verdict::NoData("no `midway-http` run @ pipelining".into())
        );
    }

    #[test]
    fn plots_section_parses() {
        let file = parse(
            r#"paper = "p"
[[plots]]
experiment = "fig8-10-modern"
title = "segments"
metrics = ["remote_segment_seconds", "local_segment_seconds"]
cases = ["store-and-forward"]
[[plots.lines]]
label = "buffer rule"
x = 24000
[[plots.lines]]
label = "paper: 1.2 s"
y = 1.2
[[plots.lines]]
label = "text"
x = "pipelining"

[[plots]]
experiment = "other"
"#,
        )
        .expect("valid plots");
        assert!(file.claims.is_empty());
        assert_eq!(file.plots.len(), 2);
        let spec = &file.plots[0];
        assert_eq!(spec.title.as_deref(), Some("segments"));
        assert_eq!(spec.metrics.len(), 2);
        assert_eq!(spec.lines[0].x, Some(AxisValue::Number(24000.0)));
        assert_eq!(spec.lines[1].y, Some(1.2));
        assert_eq!(spec.lines[2].x, Some(AxisValue::Text("pipelining".into())));
        assert!(file.plots[1].lines.is_empty() && file.plots[1].metrics.is_empty());
        // A file without claims adds no table.
        let text = append_table(&file, &analysis(), "# r\n".to_string());
        assert_eq!(text, "# r\n");
        assert!(parse("paper = \"p\"\n[[plots]]\nexperiment = \"e\"\ncolour = 1\n").is_err());
    }

    #[test]
    fn unknown_keys_are_errors() {
        assert!(parse("paper = \"p\"\nbogus = 1\n").is_err());
        assert!(parse("paper = \"p\"\n[[claims]]\nfigure=\"f\"\nexperiment=\"e\"\nsays=\"s\"\n[claims.check]\na={case=\"c\"}\nop=\"=>\"\nvalue=1.0\n").is_err());
    }
}
