//! The claims file model: what `claims.toml` may say (claims, their checks, plot annotations),
//! deserialised strictly (unknown keys are errors), plus the small vocabulary a check is made of
//! (statistic, comparison, sweep value). No evaluation here, so the format is read in one place.

use serde::Deserialize;

use crate::analysis::THROUGHPUT_METRIC;
use crate::stats;

use super::predict::Prediction;
use super::reading::{self, Reading};

/// Relative tolerance when matching a sweep value (axis values are written as decimals).
const X_TOLERANCE: f64 = 1e-9;

/// A claims file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimsFile {
    /// Short name of the paper the claims come from (e.g. "hfc-proxy").
    pub paper: String,
    /// The paper's own findings, in the order the first table shows them.
    #[serde(default)]
    pub claims: Vec<Claim>,
    /// midway's own targets (set by issues, not by the paper), checked on the same runs and shown
    /// in a table of their own so they are never counted as the paper's findings.
    #[serde(default)]
    pub targets: Vec<Claim>,
    /// Checks whose outcome arithmetic or physics settles before any run (a 64 KB window over
    /// 18 ms cannot carry 56 Mbit/s): shown apart as sanity checks of the lab, never counted as
    /// claims or targets.
    #[serde(default)]
    pub sanity: Vec<SanityCheck>,
    /// Each case's share of a path predicted from its congestion control's response function,
    /// shown beside the measured share.
    #[serde(default)]
    pub predictions: Vec<Prediction>,
    /// Annotations of the report's plots.
    #[serde(default)]
    pub plots: Vec<PlotSpec>,
}

/// A check whose outcome is settled before any run: a failure would mean the lab does not build
/// the path it says, not that a paper is wrong.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SanityCheck {
    /// The paper's figure (or the issue) the check comes from.
    pub figure: String,
    /// Name of the experiment of the results the check is made on.
    pub experiment: String,
    /// What is expected (our words).
    pub says: String,
    /// The arithmetic or physics that settles it before any run.
    pub settled_by: String,
    /// A caveat shown whatever the outcome.
    #[serde(default)]
    pub note: Option<String>,
    /// The machine check.
    pub check: Check,
}

/// One claim of the paper about one experiment.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// The paper's figure or table the claim is about (e.g. "Fig. 8").
    pub figure: String,
    /// Name of the experiment of the results the claim is checked against.
    pub experiment: String,
    /// What the paper reported (our words, not the paper's sentence).
    pub says: String,
    /// The target, when stricter or looser than the paper (shown with the claim).
    #[serde(default)]
    pub target: Option<String>,
    /// The paper's number(s) the check uses and where each comes from ("Table I: 0.16 %",
    /// "read off Fig. 6 (our reading): about 0.2 Mbit/s").
    #[serde(default)]
    pub paper_value: Option<String>,
    /// Why the lab's runs do not test this claim (e.g. the mechanism is shown not to be in
    /// effect): the verdict is "not tested" whatever the check measures.
    #[serde(default)]
    pub not_tested: Option<String>,
    /// What explains a disagreement; shown only when the check does not agree.
    #[serde(default)]
    pub why_not: Option<String>,
    /// A caveat shown whatever the verdict (e.g. an agreement that has another cause).
    #[serde(default)]
    pub note: Option<String>,
    /// How the check reads the paper's words ("almost four-fold", "over 50 %", "significantly",
    /// "grows as T increases"): the convention and the words quoted.
    #[serde(default)]
    pub reading: Option<Reading>,
    /// The machine check; none: the measured numbers are shown for a reader to judge.
    #[serde(default)]
    pub check: Option<Check>,
}

/// A machine-checkable comparison of two summarised measurements (or of one with a value).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// Metric compared: "throughput" (default), an `extra` measurement, "gos" or "gos_positive_share".
    #[serde(default = "default_metric")]
    pub metric: String,
    /// How the repetitions of one case at one sweep value are summarised.
    #[serde(default)]
    pub stat: Stat,
    /// The measured side A of the comparison.
    pub a: Operand,
    /// Optional side B: then A / B is compared with `value`, otherwise A itself.
    #[serde(default)]
    pub b: Option<Operand>,
    /// How the measured value (A or A / B) must relate to `value`; absent in a trend check.
    #[serde(default)]
    pub op: Option<Comparison>,
    /// The target, in the metric's unit (or a plain ratio when `b` is given); with `within`,
    /// the paper's effect. Absent in a trend check.
    #[serde(default)]
    pub value: Option<f64>,
    /// With `within`: the largest accepted distance from `value`, in the same unit.
    #[serde(default)]
    pub tolerance: Option<f64>,
    /// With a one-sided comparison: why the other side is open (the paper gives only an
    /// ordering or a bound).
    #[serde(default)]
    pub open_side: Option<String>,
    /// A trend over the whole sweep instead of a comparison at points: the compared number (A,
    /// or A / B) at every sweep value of A must rise (or fall) with the sweep value, judged by
    /// Spearman's rank correlation and its interval (`criterion` is then on the correlation).
    #[serde(default)]
    pub trend: Option<Trend>,
    /// With `trend`: the smallest sweep value the trend covers, where the paper's words start
    /// it ("as loss increases above 3 %": 3); absent, the whole sweep.
    #[serde(default)]
    pub from_x: Option<f64>,
}

/// The direction of a trend check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trend {
    /// The compared number rises with the sweep value.
    Increasing,
    /// The compared number falls as the sweep value rises.
    Decreasing,
}

impl Check {
    /// The accepted range of the compared number (of the rank correlation, for a trend), or why
    /// the check is malformed.
    pub fn criterion(&self) -> Result<Criterion, String> {
        if let Some(trend) = self.trend {
            return self.trend_criterion(trend);
        }
        if self.from_x.is_some() {
            return Err("`from_x` belongs to a `trend` check".into());
        }
        let (Some(op), Some(value)) = (self.op, self.value) else {
            return Err("a check needs `op` and `value` (or `trend`)".into());
        };
        if !value.is_finite() {
            return Err(format!("value {value} is not a number"));
        }
        match (op, self.tolerance, &self.open_side) {
            (Comparison::Within, Some(tolerance), None)
                if tolerance.is_finite() && tolerance >= 0.0 =>
            {
                Ok(Criterion::Within {
                    low: value - tolerance,
                    high: value + tolerance,
                })
            }
            (Comparison::Within, Some(tolerance), None) => {
                Err(format!("tolerance {tolerance} is not a number >= 0"))
            }
            (Comparison::Within, None, _) => Err(
                "`within` needs a `tolerance` (the largest accepted distance from `value`)".into(),
            ),
            (Comparison::Within, Some(_), Some(_)) => {
                Err("a two-sided (`within`) check has no open side: drop `open_side`".into())
            }
            (op, None, Some(why)) if !why.trim().is_empty() => Ok(match op {
                Comparison::AtLeast => Criterion::Above {
                    bound: value,
                    strict: false,
                },
                Comparison::Above => Criterion::Above {
                    bound: value,
                    strict: true,
                },
                Comparison::AtMost => Criterion::Below {
                    bound: value,
                    strict: false,
                },
                Comparison::Below | Comparison::Within => Criterion::Below {
                    bound: value,
                    strict: true,
                },
            }),
            (op, Some(_), _) => Err(format!(
                "`tolerance` belongs to `within`, not to the one-sided `{}`",
                op.symbol()
            )),
            (op, None, _) => Err(format!(
                "the one-sided `{}` needs `open_side`: why the other side is open (or make it \
                 `within` the paper's effect with a tolerance)",
                op.symbol()
            )),
        }
    }

    /// A trend holds when the rank correlation is above zero (below, for a falling one); it
    /// compares no value, and runs over every sweep value, so it names none.
    fn trend_criterion(&self, trend: Trend) -> Result<Criterion, String> {
        if self.op.is_some() || self.value.is_some() || self.tolerance.is_some() {
            return Err(
                "a `trend` check has no `op`, `value` or `tolerance`: it is judged by \
                        the rank correlation over the sweep"
                    .into(),
            );
        }
        if self.open_side.is_some() {
            return Err("a `trend` check has no open side: drop `open_side`".into());
        }
        if self.a.x.is_some() || self.b.as_ref().is_some_and(|b| b.x.is_some()) {
            return Err("a `trend` check runs over the whole sweep: drop the operands' `x`".into());
        }
        Ok(match trend {
            Trend::Increasing => Criterion::Above {
                bound: 0.0,
                strict: true,
            },
            Trend::Decreasing => Criterion::Below {
                bound: 0.0,
                strict: true,
            },
        })
    }
}

/// The range a check accepts for the compared number.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Criterion {
    /// At least (`strict`: above) `bound`.
    Above {
        /// The lowest accepted value (excluded when `strict`).
        bound: f64,
        /// Whether `bound` itself is rejected.
        strict: bool,
    },
    /// At most (`strict`: below) `bound`.
    Below {
        /// The highest accepted value (excluded when `strict`).
        bound: f64,
        /// Whether `bound` itself is rejected.
        strict: bool,
    },
    /// Between `low` and `high`, both included.
    Within {
        /// The lowest accepted value.
        low: f64,
        /// The highest accepted value.
        high: f64,
    },
}

impl Criterion {
    /// Whether `x` lies in the accepted range.
    pub fn accepts(self, x: f64) -> bool {
        match self {
            Criterion::Above { bound, strict } => x > bound || (!strict && x == bound),
            Criterion::Below { bound, strict } => x < bound || (!strict && x == bound),
            Criterion::Within { low, high } => (low..=high).contains(&x),
        }
    }

    /// Whether every number from `low` to `high` lies in the accepted range.
    pub fn accepts_all(self, low: f64, high: f64) -> bool {
        self.accepts(low) && self.accepts(high)
    }

    /// Whether no number from `low` to `high` lies in the accepted range.
    pub fn rejects_all(self, low: f64, high: f64) -> bool {
        match self {
            Criterion::Above { .. } => !self.accepts(high),
            Criterion::Below { .. } => !self.accepts(low),
            Criterion::Within { low: l, high: h } => high < l || low > h,
        }
    }

    /// "> 1", ">= 0.9" or "within 0.85..0.95".
    pub fn text(self) -> String {
        match self {
            Criterion::Above { bound, strict } => {
                format!("{} {bound}", if strict { ">" } else { ">=" })
            }
            Criterion::Below { bound, strict } => {
                format!("{} {bound}", if strict { "<" } else { "<=" })
            }
            Criterion::Within { low, high } => {
                format!(
                    "within {}..{}",
                    crate::markdown::number(low),
                    crate::markdown::number(high)
                )
            }
        }
    }
}

fn default_metric() -> String {
    THROUGHPUT_METRIC.to_string()
}

/// Summary of the repetitions of one case at one point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stat {
    /// The median of the repetitions (default).
    #[default]
    Median,
    /// The arithmetic mean of the repetitions.
    Mean,
}

impl Stat {
    pub(super) fn name(self) -> &'static str {
        match self {
            Stat::Median => "median",
            Stat::Mean => "mean",
        }
    }

    pub(super) fn of(self, values: &[f64]) -> Option<f64> {
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
    /// Name of the case (e.g. "store-and-forward").
    pub case: String,
    /// The sweep value: a number (`x = 1`) or, for a text sweep, its text (`x = "pipelining"`).
    #[serde(default)]
    pub x: Option<AxisValue>,
    /// Overrides the check's metric for this operand (e.g. remote vs local segment time).
    #[serde(default)]
    pub metric: Option<String>,
    /// Takes this operand from another experiment than the claim's (e.g. the same case on
    /// another path layout, which an experiment's `set` fixes).
    #[serde(default)]
    pub experiment: Option<String>,
}

/// How a check's measured value must relate to its target (`op` in the file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Comparison {
    /// `>=`: the measured value is at least the target.
    #[serde(rename = ">=")]
    AtLeast,
    /// `<=`: the measured value is at most the target.
    #[serde(rename = "<=")]
    AtMost,
    /// `>`: the measured value is strictly above the target.
    #[serde(rename = ">")]
    Above,
    /// `<`: the measured value is strictly below the target.
    #[serde(rename = "<")]
    Below,
    /// `within`: the measured value is at most `tolerance` away from the target (two-sided).
    #[serde(rename = "within")]
    Within,
}

impl Comparison {
    pub(super) fn symbol(self) -> &'static str {
        match self {
            Comparison::AtLeast => ">=",
            Comparison::AtMost => "<=",
            Comparison::Above => ">",
            Comparison::Below => "<",
            Comparison::Within => "within",
        }
    }
}

/// One `[[plots]]` entry: annotations of one experiment's figures.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlotSpec {
    /// Name of the experiment whose figures are annotated.
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
    /// The paper's own numbers drawn on the experiment's main plot, on the same axes as the
    /// lab's, each with where it comes from.
    #[serde(default)]
    pub points: Vec<PaperPoint>,
}

/// One of the paper's numbers placed on a plot: at sweep value `x` (or, on a plot of one point,
/// at the bar of `case`), height `y` in the main plot's unit (Mbit/s, or seconds of page load
/// time for a web experiment).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaperPoint {
    /// Legend text ("paper, direct"); points sharing a label share one legend entry.
    pub label: String,
    /// Sweep value of the point (a number, or a category's text).
    #[serde(default)]
    pub x: Option<AxisValue>,
    /// On a plot of a single sweep point (bars): the case whose bar the point stands on.
    #[serde(default)]
    pub case: Option<String>,
    /// The paper's value, in the main plot's y unit.
    pub y: f64,
    /// Where the number comes from: "Table II", "text, sec. 3.5", or "read off Fig. 6 (our
    /// reading)".
    pub source: String,
}

/// A labelled reference line: vertical at a sweep value `x` or horizontal at `y` (in the unit of
/// the main plot's y axis: Mbit/s, or seconds of page load time for a web experiment).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceLine {
    /// Legend text of the line.
    pub label: String,
    /// Sweep value of a vertical line.
    #[serde(default)]
    pub x: Option<AxisValue>,
    /// Y-axis value of a horizontal line (Mbit/s, or seconds for a web experiment).
    #[serde(default)]
    pub y: Option<f64>,
}

/// A sweep value: a number on a numeric axis, or the text of a category.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum AxisValue {
    /// A numeric sweep value, in the sweep's unit (e.g. 1 for 1 % loss, bytes for a size).
    Number(f64),
    /// The text of a category on a text sweep (e.g. "pipelining").
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

impl ClaimsFile {
    /// What a reviewer would reject in this file, one line each (empty: none): a claim or target
    /// with neither a check nor a reason it is not tested, a one-sided check without the reason
    /// its other side is open, a two-sided one without a tolerance, a check that does not follow
    /// its declared reading of the paper's words, words that call for a reading none declares, a
    /// sanity check without what settles it, a prediction without cases. The report shows these
    /// as warnings; the repository's claims files are tested to have none.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let all = self
            .claims
            .iter()
            .map(|c| ("claim", c))
            .chain(self.targets.iter().map(|c| ("target", c)));
        for (kind, claim) in all {
            let name = format!("{kind} \"{}\" ({})", claim.figure, claim.experiment);
            match (&claim.check, &claim.not_tested) {
                (None, None) => {
                    problems.push(format!("{name}: no check and no `not_tested` reason"))
                }
                (_, Some(why)) if why.trim().is_empty() => {
                    problems.push(format!("{name}: `not_tested` is empty"))
                }
                (Some(check), _) => {
                    if let Err(why) = check.criterion() {
                        problems.push(format!("{name}: {why}"));
                    }
                }
                (None, Some(_)) => {}
            }
            match (&claim.reading, &claim.check) {
                (Some(reading), Some(check)) => {
                    if let Some(why) = reading.problem(check) {
                        problems.push(format!("{name}: {why}"));
                    }
                }
                (Some(_), None) => problems.push(format!("{name}: a reading without a check")),
                (None, _) => {}
            }
            if let Some(why) = reading::undeclared(claim) {
                problems.push(format!("{name}: {why}"));
            }
        }
        for sanity in &self.sanity {
            let name = format!("sanity check \"{}\" ({})", sanity.figure, sanity.experiment);
            if sanity.settled_by.trim().is_empty() {
                problems.push(format!("{name}: `settled_by` is empty"));
            }
            if let Err(why) = sanity.check.criterion() {
                problems.push(format!("{name}: {why}"));
            }
        }
        for prediction in &self.predictions {
            if let Some(why) = prediction.problem() {
                problems.push(format!("prediction ({}): {why}", prediction.experiment));
            }
        }
        problems
    }
}

/// Parses the text of a claims file.
pub fn parse(text: &str) -> Result<ClaimsFile, toml::de::Error> {
    toml::from_str(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_errors() {
        assert!(parse("paper = \"p\"\nbogus = 1\n").is_err());
        assert!(parse("paper = \"p\"\n[[claims]]\nfigure=\"f\"\nexperiment=\"e\"\nsays=\"s\"\n[claims.check]\na={case=\"c\"}\nop=\"=>\"\nvalue=1.0\n").is_err());
    }
}
