//! A paper's claims next to what the lab measured: the table "paper says / we measured /
//! agrees? / why not".
//!
//! A claims file (`claims.toml` in a results folder, copied there from
//! `scenarios/repro/PAPER.claims.toml`) lists, per experiment, what the paper reported and,
//! where the claim can be checked by a machine, one comparison of medians:
//!
//! ```toml
//! paper = "hfc-proxy"
//! [[claims]]
//! figure = "Fig. 8"
//! experiment = "fig8-9-legacy"
//! says = "At 1 % local loss store-and-forward loses < 5 % of its lossless throughput"
//! why_not = "what may explain a difference (shown only when the check fails)"
//! note = "a caveat shown whatever the verdict (optional)"
//! [claims.check]
//! metric = "throughput"          # median Mbit/s, or an `extra` name such as "remote_segment_seconds"
//! a = { case = "store-and-forward", x = 1 }
//! b = { case = "store-and-forward", x = 0 }   # optional: without b, A is compared to `value`
//! op = ">="                      # ">=", "<=", ">" or "<"
//! value = 0.9                    # A / B op value (or A op value without b)
//! ```
//!
//! `x` is the sweep value as the records hold it (the axis value: 1 for 1 % loss, bytes for a
//! size). Without `x` in both A and B the check runs at every sweep value both cases have and
//! agrees only if every one does ("in every cell"). Parsing and evaluation are pure; only
//! [`append_to_report`] reads a file.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::analysis::{Analysis, CaseRow, Experiment};

/// File name of the claims inside a results folder.
pub const CLAIMS_FILE: &str = "claims.toml";

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

/// A machine-checkable comparison of medians.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    #[serde(default = "default_metric")]
    pub metric: String,
    pub a: Operand,
    #[serde(default)]
    pub b: Option<Operand>,
    pub op: Comparison,
    pub value: f64,
}

fn default_metric() -> String {
    "throughput".to_string()
}

/// A case at a sweep value (every sweep value when `x` is absent).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Operand {
    pub case: String,
    #[serde(default)]
    pub x: Option<f64>,
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

/// Medians of every case at every sweep value, for claims without a check.
fn overview(experiment: &Experiment) -> String {
    let mut parts = Vec::new();
    for row in &experiment.rows {
        if let Some(spread) = &row.throughput_mbps {
            parts.push(format!(
                "{} @ {}: {:.2}",
                row.case, row.sweep_label, spread.median
            ));
        }
    }
    if parts.is_empty() {
        "no successful runs".to_string()
    } else {
        format!("median Mbit/s: {}", parts.join("; "))
    }
}

fn metric_of(row: &CaseRow, metric: &str) -> Option<f64> {
    match metric {
        "throughput" => row.throughput_mbps.as_ref().map(|s| s.median),
        extra => row.extra_median.get(extra).copied(),
    }
    .filter(|v| v.is_finite())
}

fn unit(metric: &str) -> &'static str {
    match metric {
        "throughput" => " Mbit/s",
        m if m.ends_with("seconds") => " s",
        _ => "",
    }
}

/// The row of `case` at sweep value `x`; without `x`, the case's only row (an experiment
/// without a sweep).
fn find_row<'a>(experiment: &'a Experiment, case: &str, x: Option<f64>) -> Option<&'a CaseRow> {
    experiment.rows.iter().find(|row| {
        row.case == case
            && match x {
                Some(x) => row
                    .sweep_number
                    .is_some_and(|n| (n - x).abs() <= X_TOLERANCE * x.abs().max(1.0)),
                None => true,
            }
    })
}

/// Sweep values at which the check is made: the given ones, else every numeric sweep value of
/// case A (all must agree), else the single point of an experiment without a sweep.
fn check_points(experiment: &Experiment, check: &Check) -> Vec<(Option<f64>, Option<f64>)> {
    match (check.a.x, check.b.as_ref().and_then(|b| b.x)) {
        (Some(xa), Some(xb)) => vec![(Some(xa), Some(xb))],
        (Some(x), None) | (None, Some(x)) => vec![(Some(x), Some(x))],
        (None, None) => {
            let mut xs: Vec<f64> = experiment
                .rows
                .iter()
                .filter(|r| r.case == check.a.case)
                .filter_map(|r| r.sweep_number)
                .collect();
            xs.sort_by(f64::total_cmp);
            xs.dedup();
            if xs.is_empty() {
                vec![(None, None)]
            } else {
                xs.into_iter().map(|x| (Some(x), Some(x))).collect()
            }
        }
    }
}

fn at(x: Option<f64>) -> String {
    x.map(|x| format!(" @ {x}")).unwrap_or_default()
}

fn run_check(experiment: &Experiment, check: &Check) -> (String, Verdict) {
    let points = check_points(experiment, check);
    let mut parts = Vec::new();
    let mut all_hold = true;
    for (xa, xb) in points {
        let metric_a = check.a.metric.as_deref().unwrap_or(&check.metric);
        let a = find_row(experiment, &check.a.case, xa).and_then(|r| metric_of(r, metric_a));
        let unit_a = unit(metric_a);
        let Some(a) = a else {
            return (
                parts.join("; "),
                Verdict::NoData(format!("no {metric_a} of `{}`{}", check.a.case, at(xa))),
            );
        };
        match &check.b {
            Some(b_operand) => {
                let metric_b = b_operand.metric.as_deref().unwrap_or(&check.metric);
                let b =
                    find_row(experiment, &b_operand.case, xb).and_then(|r| metric_of(r, metric_b));
                let unit_b = unit(metric_b);
                let Some(b) = b else {
                    return (
                        parts.join("; "),
                        Verdict::NoData(format!("no {metric_b} of `{}`{}", b_operand.case, at(xb))),
                    );
                };
                let ratio = a / b;
                let holds = ratio.is_finite() && check.op.holds(ratio, check.value);
                all_hold &= holds;
                parts.push(format!(
                    "{} {metric_a}{} / {} {metric_b}{} = {a:.3}{unit_a} / {b:.3}{unit_b} = {ratio:.2} ({} {})",
                    check.a.case,
                    at(xa),
                    b_operand.case,
                    at(xb),
                    check.op.symbol(),
                    check.value
                ));
            }
            None => {
                let holds = check.op.holds(a, check.value);
                all_hold &= holds;
                parts.push(format!(
                    "{} {metric_a}{} = {a:.3}{unit_a} ({} {})",
                    check.a.case,
                    at(xa),
                    check.op.symbol(),
                    check.value
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
        "{agree} of {checked} checked claims agree (medians of the runs above; a ratio is case A's \
         median over case B's).\n"
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

/// When `dir` holds a [`CLAIMS_FILE`], appends its table to the report `text`; otherwise returns
/// `text` unchanged.
pub fn append_to_report(
    dir: &Path,
    analysis: &Analysis,
    mut text: String,
) -> Result<String, ClaimsError> {
    let path = dir.join(CLAIMS_FILE);
    let source = match fs::read_to_string(&path) {
        Ok(source) => source,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(text),
        Err(source) => return Err(ClaimsError::Read { path, source }),
    };
    let file = parse(&source).map_err(|source| ClaimsError::Parse {
        path: path.clone(),
        source,
    })?;
    let rows = evaluate(&file, analysis);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push('\n');
    text.push_str(&render(&file, &rows));
    Ok(text)
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

    #[test]
    fn unknown_keys_are_errors() {
        assert!(parse("paper = \"p\"\nbogus = 1\n").is_err());
        assert!(parse("paper = \"p\"\n[[claims]]\nfigure=\"f\"\nexperiment=\"e\"\nsays=\"s\"\n[claims.check]\na={case=\"c\"}\nop=\"=>\"\nvalue=1.0\n").is_err());
    }
}
