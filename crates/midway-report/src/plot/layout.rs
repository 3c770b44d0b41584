//! What every kind of plot shares: splitting an experiment's rows into series, choosing the x
//! axis (linear, logarithmic, categories or bars), placing reference lines and sizing the y
//! range. One place, so the main and the extra plots lay out alike.

use super::figure::{Figure, PlacedLine, PlacedPoint, Series, XAxis};
use super::style::{LOG_AXIS_MIN_RATIO, METRIC_STYLES, SERIES_COLORS};
use crate::analysis::{CaseRow, Experiment};
use crate::claims::{AxisValue, PaperPoint, ReferenceLine};
use crate::stats::Spread;

/// What a claims file adds to a plot: reference lines and the paper's own numbers.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Annotations<'a> {
    pub lines: &'a [ReferenceLine],
    pub points: &'a [PaperPoint],
}

/// Splits the rows into series (one per variant, case and metric), picks the x axis and places
/// the reference lines. `metrics` are passed to `spread_of`; with more than one the series
/// labels name them. `cases` filters the series (empty: all).
pub(super) fn build_figure(
    exp: &Experiment,
    title: String,
    y_desc: String,
    metrics: &[&str],
    cases: &[String],
    spread_of: &dyn Fn(&CaseRow, &str) -> Option<Spread>,
    annotations: Annotations<'_>,
) -> (Figure, Vec<String>) {
    let Annotations { lines, points } = annotations;
    let mut warnings = Vec::new();
    // Colours follow the (variant, case) order of the whole experiment, so a case keeps its
    // colour in every plot of the experiment whatever the filter.
    let mut keys: Vec<(String, String)> = Vec::new();
    for row in &exp.rows {
        let key = (row.variant.clone(), row.case.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let label_of = |variant: &str, case: &str, metric: &str| {
        let mut label = if variant.is_empty() {
            case.to_string()
        } else {
            format!("{case} ({variant})")
        };
        if metrics.len() > 1 {
            label = format!("{label}: {metric}");
        }
        label
    };

    let bars = exp.sweep_points <= 1;
    let mut sweep_labels: Vec<String> = Vec::new();
    for row in &exp.rows {
        if !sweep_labels.contains(&row.sweep_label) {
            sweep_labels.push(row.sweep_label.clone());
        }
    }
    let x_of = |row: &CaseRow| -> f64 {
        if exp.numeric_sweep {
            row.sweep_number.unwrap_or(0.0)
        } else {
            sweep_labels
                .iter()
                .position(|l| *l == row.sweep_label)
                .unwrap_or(0) as f64
        }
    };

    let mut series = Vec::new();
    for (index, (variant, case)) in keys.iter().enumerate() {
        if !cases.is_empty() && !cases.contains(case) {
            continue;
        }
        let rows: Vec<&CaseRow> = exp
            .rows
            .iter()
            .filter(|r| &r.variant == variant && &r.case == case)
            .collect();
        for (metric_index, metric) in metrics.iter().enumerate() {
            // Several metrics: the style tells the metrics apart (the colour the cases). One
            // metric: each case gets its own dash and marker besides its colour, so curves that
            // overlap stay distinguishable (and in print without colour).
            let style = if metrics.len() > 1 {
                metric_index
            } else {
                index
            };
            let (dash, marker) = METRIC_STYLES[style % METRIC_STYLES.len()];
            let mut points: Vec<(f64, Spread)> = rows
                .iter()
                .filter_map(|r| spread_of(r, metric).map(|s| (x_of(r), s)))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            series.push(Series {
                label: label_of(variant, case, metric),
                color: SERIES_COLORS[index % SERIES_COLORS.len()],
                dash,
                marker,
                points,
            });
        }
    }

    let mut placed = Vec::new();
    let mut vertical_xs = Vec::new();
    for line in lines {
        match (&line.x, line.y) {
            (Some(_), Some(_)) | (None, None) => warnings.push(format!(
                "line `{}` needs exactly one of `x` (vertical) and `y` (horizontal)",
                line.label
            )),
            (None, Some(y)) if y.is_finite() => placed.push(PlacedLine::Horizontal {
                y,
                label: line.label.clone(),
            }),
            (None, Some(_)) => warnings.push(format!("line `{}`: y is not finite", line.label)),
            (Some(x), None) => match place_vertical(exp, bars, &sweep_labels, x) {
                Ok(at) => {
                    vertical_xs.push(at);
                    placed.push(PlacedLine::Vertical {
                        x: at,
                        label: line.label.clone(),
                    });
                }
                Err(why) => warnings.push(format!("line `{}`: {why}", line.label)),
            },
        }
    }

    let mut paper_points = Vec::new();
    for point in points {
        let placed_x = match (&point.x, &point.case, bars) {
            (None, Some(case), true) => series
                .iter()
                .position(|s| s.label == *case)
                .map(|index| index as f64)
                .ok_or_else(|| format!("no bar of case `{case}`")),
            (Some(x), None, false) => place_vertical(exp, bars, &sweep_labels, x),
            (_, _, true) => Err(format!(
                "experiment `{}` has a single sweep point (a bar per case): give `case`, not `x`",
                exp.name
            )),
            (_, _, false) => Err("give the sweep value `x` (and no `case`)".to_string()),
        };
        match placed_x {
            Ok(x) if point.y.is_finite() => paper_points.push(PlacedPoint {
                x,
                y: point.y,
                label: point.label.clone(),
            }),
            Ok(_) => warnings.push(format!("paper point `{}`: y is not finite", point.label)),
            Err(why) => warnings.push(format!("paper point `{}`: {why}", point.label)),
        }
    }
    if !bars {
        vertical_xs.extend(paper_points.iter().map(|p| p.x));
    }

    let axis = if bars {
        // Bar chart: one category per series.
        for (index, s) in series.iter_mut().enumerate() {
            for point in &mut s.points {
                point.0 = index as f64;
            }
        }
        XAxis::Categories(series.iter().map(|s| s.label.clone()).collect())
    } else if !exp.numeric_sweep {
        XAxis::Categories(sweep_labels)
    } else {
        let data_xs: Vec<f64> = exp.rows.iter().filter_map(|r| r.sweep_number).collect();
        let data_min = data_xs.iter().copied().fold(f64::INFINITY, f64::min);
        let data_max = data_xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        // The data decide between a linear and a log axis; lines only widen it.
        let log = data_min > 0.0 && data_max / data_min > LOG_AXIS_MIN_RATIO;
        if log {
            paper_points.retain(|point| {
                let keep = point.x > 0.0;
                if !keep {
                    warnings.push(format!(
                        "paper point `{}`: x = {} cannot be drawn on the logarithmic x axis",
                        point.label, point.x
                    ));
                }
                keep
            });
            placed.retain(|line| match line {
                PlacedLine::Vertical { x, label } if *x <= 0.0 => {
                    warnings.push(format!(
                        "line `{label}`: x = {x} cannot be drawn on the logarithmic x axis"
                    ));
                    false
                }
                _ => true,
            });
        }
        let drawn_xs = vertical_xs.iter().copied().filter(|x| !log || *x > 0.0);
        let (min, max) = drawn_xs.fold((data_min, data_max), |(lo, hi), x| (lo.min(x), hi.max(x)));
        if log {
            // A little room on both sides so the end markers are not cut by the frame.
            XAxis::Log(min / 1.25..max * 1.25)
        } else {
            let pad = if max > min {
                (max - min) * 0.05
            } else {
                min.abs().max(1.0) * 0.5
            };
            XAxis::Linear(min - pad..max + pad)
        }
    };

    let horizontal_ys = placed
        .iter()
        .filter_map(|line| match line {
            PlacedLine::Horizontal { y, .. } => Some(*y),
            PlacedLine::Vertical { .. } => None,
        })
        .chain(paper_points.iter().map(|p| p.y));
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|(_, p)| p.q3))
        .chain(horizontal_ys.clone())
        .fold(0.0_f64, f64::max);
    let y_min = series
        .iter()
        .flat_map(|s| s.points.iter().map(|(_, p)| p.q1))
        .chain(horizontal_ys)
        .fold(0.0_f64, f64::min);
    // Headroom above the highest quartile for the legend box.
    let y_range = y_min * 1.1..if y_max > 0.0 { y_max * 1.25 } else { 1.0 };

    let x_desc = match (&exp.sweep_param, bars) {
        (_, true) => "case".to_string(),
        (Some(param), false) => param.clone(),
        (None, false) => "point".to_string(),
    };
    (
        Figure {
            title,
            x_desc,
            y_desc,
            axis,
            bars,
            series,
            lines: placed,
            paper_points,
            y_range,
        },
        warnings,
    )
}

/// The x coordinate of a vertical line at sweep value `x`, or why it has none.
fn place_vertical(
    exp: &Experiment,
    bars: bool,
    sweep_labels: &[String],
    x: &AxisValue,
) -> Result<f64, String> {
    if bars {
        return Err(format!(
            "experiment `{}` has a single sweep point: a vertical line has no axis to stand on",
            exp.name
        ));
    }
    match x {
        AxisValue::Number(value) if exp.numeric_sweep => {
            if value.is_finite() {
                Ok(*value)
            } else {
                Err("x is not finite".to_string())
            }
        }
        _ => sweep_labels
            .iter()
            .position(|label| x.matches(label, None))
            .map(|index| index as f64)
            .ok_or_else(|| {
                format!(
                    "x = {x} is none of the sweep values of experiment `{}` ({})",
                    exp.name,
                    sweep_labels.join(", ")
                )
            }),
    }
}
