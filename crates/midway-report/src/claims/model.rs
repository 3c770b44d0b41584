//! The claims file model: what `claims.toml` may say (claims, their checks, plot annotations),
//! deserialised strictly (unknown keys are errors), plus the small vocabulary a check is made of
//! (statistic, comparison, sweep value). No evaluation here, so the format is read in one place.

use serde::Deserialize;

use crate::analysis::THROUGHPUT_METRIC;
use crate::stats;

/// Relative tolerance when matching a sweep value (axis values are written as decimals).
const X_TOLERANCE: f64 = 1e-9;

/// A claims file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimsFile {
    /// Short name of the paper the claims come from (e.g. "hfc-proxy").
    pub paper: String,
    /// The paper's claims, in the order the table shows them.
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
    /// The paper's figure or table the claim is about (e.g. "Fig. 8").
    pub figure: String,
    /// Name of the experiment of the results the claim is checked against.
    pub experiment: String,
    /// What the paper reported (our words, not the paper's sentence).
    pub says: String,
    /// The target, when stricter or looser than the paper (shown with the claim).
    #[serde(default)]
    pub target: Option<String>,
    /// What explains a disagreement; shown only when the check does not agree.
    #[serde(default)]
    pub why_not: Option<String>,
    /// A caveat shown whatever the verdict (e.g. an agreement that has another cause).
    #[serde(default)]
    pub note: Option<String>,
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
    /// How the measured value (A or A / B) must relate to `value`.
    pub op: Comparison,
    /// The target, in the metric's unit (or a plain ratio when `b` is given).
    pub value: f64,
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
}

impl Comparison {
    pub(super) fn holds(self, left: f64, right: f64) -> bool {
        match self {
            Comparison::AtLeast => left >= right,
            Comparison::AtMost => left <= right,
            Comparison::Above => left > right,
            Comparison::Below => left < right,
        }
    }

    pub(super) fn symbol(self) -> &'static str {
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
