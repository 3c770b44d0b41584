//! The two kinds of plot: an experiment's main plot (throughput, or page load time for a web
//! experiment) and an extra plot of chosen `extra` measurements. Each picks its title, y axis
//! text and the value it plots, then hands over to [`super::layout`].

use super::layout::{build_figure, Annotations};
use super::style::METRIC_STYLES;
use super::Figure;
use crate::analysis::{CaseRow, Experiment, THROUGHPUT_METRIC};
use crate::claims::{known_metrics, PaperPoint, ReferenceLine};

/// Y axis text of a web experiment's main plot.
pub(crate) const PAGE_LOAD_AXIS: &str = "page load time (s), median and quartiles; lower is better";
/// Y axis text of a bulk experiment's main plot.
pub(crate) const THROUGHPUT_AXIS: &str = "throughput (Mbit/s), median and quartiles";

/// The given title, else "EXPERIMENT: WHAT vs PARAM" (or "by case" without a sweep), followed by
/// the kind of run ("full run, 5 runs per point, 1 MB transfers"), so a plot copied out of its
/// report still says what it shows.
fn title_of(exp: &Experiment, title: Option<&str>, what: &str) -> String {
    let title = title
        .map(str::to_string)
        .unwrap_or_else(|| match &exp.sweep_param {
            Some(param) if exp.sweep_points > 1 => format!("{}: {what} vs {param}", exp.name),
            _ => format!("{}: {what} by case", exp.name),
        });
    if exp.kind.is_empty() {
        title
    } else {
        format!("{title} ({})", exp.kind)
    }
}

/// The main plot of an experiment: page load time for a web experiment, else throughput, with
/// the reference lines of its `[[plots]]` entries. Also returns why a line was left out.
pub(crate) fn main_figure(
    exp: &Experiment,
    title: Option<&str>,
    lines: &[ReferenceLine],
    points: &[PaperPoint],
) -> (Figure, Vec<String>) {
    let (what, y_desc) = if exp.web {
        ("page load time", PAGE_LOAD_AXIS)
    } else {
        ("throughput", THROUGHPUT_AXIS)
    };
    let title = title_of(exp, title, what);
    let spread_of = |row: &CaseRow, _: &str| {
        if exp.web {
            row.page_load_seconds
        } else {
            row.throughput_mbps
        }
    };
    build_figure(
        exp,
        title,
        y_desc.to_string(),
        &[""],
        &[],
        &spread_of,
        Annotations { lines, points },
    )
}

/// An extra plot of `extra` measurements (or "throughput"): median and quartiles per case and
/// sweep value, every metric in its own dash pattern. `cases` limits the cases (empty: all).
/// `None` when no named metric is measured; the warnings name what was left out.
pub(crate) fn metrics_figure(
    exp: &Experiment,
    metrics: &[String],
    cases: &[String],
    title: Option<&str>,
) -> (Option<Figure>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut known: Vec<&str> = Vec::new();
    for metric in metrics {
        if metric == THROUGHPUT_METRIC || exp.extra_names.contains(metric) {
            if !known.contains(&metric.as_str()) {
                known.push(metric);
            }
        } else {
            warnings.push(format!(
                "metric `{metric}` is not measured in experiment `{}` (it has: {})",
                exp.name,
                known_metrics(exp)
            ));
        }
    }
    for case in cases {
        if !exp.cases.contains(case) {
            warnings.push(format!(
                "case `{case}` is not in experiment `{}` (it has: {})",
                exp.name,
                exp.cases.join(", ")
            ));
        }
    }
    if known.is_empty() {
        warnings.push(format!(
            "no measured metric left to plot for experiment `{}`",
            exp.name
        ));
        return (None, warnings);
    }
    if known.len() > METRIC_STYLES.len() {
        warnings.push(format!(
            "more than {} metrics in one plot: the styles repeat",
            METRIC_STYLES.len()
        ));
    }
    let names = known.join(", ");
    let title = title_of(exp, title, &names);
    let unit = if known.iter().all(|m| m.ends_with("seconds")) {
        " (s)"
    } else if known.iter().all(|m| *m == THROUGHPUT_METRIC) {
        " (Mbit/s)"
    } else {
        ""
    };
    let y_desc = format!("{names}{unit}, median and quartiles");
    let spread_of = |row: &CaseRow, metric: &str| row.metric_spread(metric);
    let (figure, line_warnings) = build_figure(
        exp,
        title,
        y_desc,
        &known,
        cases,
        &spread_of,
        Annotations::default(),
    );
    warnings.extend(line_warnings);
    if figure.series.iter().all(|s| s.points.is_empty()) {
        warnings.push(format!(
            "no successful run of the chosen cases measured {names} in experiment `{}`",
            exp.name
        ));
        return (None, warnings);
    }
    (Some(figure), warnings)
}
