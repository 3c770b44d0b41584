//! Plots of one experiment with plotters: throughput (Mbit/s) against the swept parameter — page
//! load time (s, lower is better) for a web experiment — one line per case (and per variant),
//! the median as a marker and the quartiles as an error bar. A numeric sweep spanning more than
//! two decades gets a logarithmic x axis; text sweep values are placed at equal spacing; an
//! experiment with a single point becomes a bar chart.
//!
//! A claims file's `[[plots]]` entries add labelled reference lines to the main plot and extra
//! plots of chosen `extra` measurements, in the same style (one dash pattern per metric).
//! [`plan`] resolves every plot into a [`Figure`] without drawing (pure, testable); the
//! `draw_figure_*` functions render one.
//!
//! Text needs a font: plotters is built with `ab_glyph`, which measures and rasterises glyphs from
//! a font registered at run time ([`FONT_PATH`], overridable with [`FONT_ENV`]). The SVG keeps
//! text as text, but plotters still measures it with that font for the layout.

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::analysis::{CaseRow, Experiment, THROUGHPUT_METRIC};
use crate::claims::{known_metrics, AxisValue, PlotSpec, ReferenceLine, CLAIMS_FILE};
use crate::stats::Spread;
use crate::ReportError;

/// Font used for all plot text (Debian package fonts-dejavu-core).
pub const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// Environment variable that overrides [`FONT_PATH`].
pub const FONT_ENV: &str = "MIDWAY_REPORT_FONT";
/// Size of every plot, in pixels (PNG) or user units (SVG).
pub const PLOT_SIZE: (u32, u32) = (1000, 640);

/// Error of the PNG backend while drawing.
pub type PngError = DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>;
/// Error of the SVG backend while drawing.
pub type SvgError = DrawingAreaErrorKind<std::io::Error>;

/// Colour-blind friendly, well separated colours (Tableau 10), picked in case order.
const SERIES_COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Number of x tick labels on a numeric axis (plotters picks round values up to this many).
const DEFAULT_X_LABELS: usize = 10;

/// Ratio max/min of a positive numeric sweep above which the x axis is logarithmic.
const LOG_AXIS_MIN_RATIO: f64 = 100.0;

/// The font is registered once per process; plotters keeps it in a global table and needs the
/// bytes for the rest of the process, hence the leak (one font file, once).
static FONT_REGISTERED: Mutex<bool> = Mutex::new(false);

/// Registers the plot font with plotters unless already done.
pub fn ensure_font() -> Result<(), ReportError> {
    let mut registered = FONT_REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    if *registered {
        return Ok(());
    }
    let path = std::env::var_os(FONT_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(FONT_PATH));
    let bytes = std::fs::read(&path).map_err(|source| ReportError::FontMissing {
        path: path.clone(),
        source,
    })?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| ReportError::FontInvalid { path })?;
    *registered = true;
    Ok(())
}

/// File names (without extension) for the experiments' plots: the name with anything but
/// letters, digits, `-`, `_` and `.` replaced, made unique by a numeric suffix.
pub fn file_stems(experiments: &[Experiment]) -> Vec<String> {
    let mut used = BTreeSet::new();
    experiments
        .iter()
        .map(|exp| {
            let mut base: String = exp
                .name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            if base.is_empty() || base.starts_with('.') {
                base.insert_str(0, "experiment");
            }
            let mut stem = base.clone();
            let mut counter = 2;
            while !used.insert(stem.to_lowercase()) {
                stem = format!("{base}-{counter}");
                counter += 1;
            }
            stem
        })
        .collect()
}

/// Every plot of a report, resolved but not drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct PlotPlan {
    /// One entry per experiment, in the analysis' order.
    pub experiments: Vec<PlannedPlots>,
    /// What the `[[plots]]` entries asked for and could not get, one line each.
    pub warnings: Vec<String>,
}

/// The plots of one experiment, each with its file stem (name without extension).
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedPlots {
    /// `None` when no run succeeded.
    pub main: Option<(String, Figure)>,
    /// The extra plots of its `[[plots]]` entries with `metrics`, in file order.
    pub extra: Vec<(String, Figure)>,
}

/// Resolves the plots of every experiment: the main plot (with the reference lines and title of
/// the `[[plots]]` entries naming the experiment) and one extra plot per entry with `metrics`,
/// stem `<experiment stem>-<n>`. Whatever an entry names that the results lack becomes a
/// warning, never an error.
pub fn plan(experiments: &[Experiment], specs: &[PlotSpec]) -> PlotPlan {
    let stems = file_stems(experiments);
    let mut used: BTreeSet<String> = stems.iter().map(|s| s.to_lowercase()).collect();
    // (entry index, text): sorted by entry at the end so the report lists them in file order.
    let mut warnings: Vec<(usize, String)> = Vec::new();
    for (index, spec) in specs.iter().enumerate() {
        if !experiments.iter().any(|e| e.name == spec.experiment) {
            warnings.push((
                index,
                format!(
                "{CLAIMS_FILE} [[plots]] #{}: experiment `{}` is not in the results; nothing drawn \
                 for it",
                index + 1,
                spec.experiment
            ),
            ));
        }
    }
    let mut planned = Vec::with_capacity(experiments.len());
    for (exp, stem) in experiments.iter().zip(&stems) {
        let mine: Vec<(usize, &PlotSpec)> = specs
            .iter()
            .enumerate()
            .filter(|(_, spec)| spec.experiment == exp.name)
            .collect();
        let context = |index: usize| {
            format!(
                "{CLAIMS_FILE} [[plots]] #{} (experiment `{}`)",
                index + 1,
                exp.name
            )
        };
        let has_runs = exp.rows.iter().any(|row| {
            if exp.web {
                row.page_load_seconds.is_some()
            } else {
                row.throughput_mbps.is_some()
            }
        });
        let title = mine
            .iter()
            .find(|(_, spec)| spec.metrics.is_empty())
            .and_then(|(_, spec)| spec.title.as_deref());
        let lines: Vec<ReferenceLine> = mine
            .iter()
            .flat_map(|(_, spec)| spec.lines.iter().cloned())
            .collect();
        let main = if has_runs {
            let (figure, line_warnings) = main_figure(exp, title, &lines);
            // A line's warning names its own label; attribute it to the entry holding it.
            for warning in line_warnings {
                let owner = mine
                    .iter()
                    .find(|(_, spec)| {
                        spec.lines
                            .iter()
                            .any(|l| warning.starts_with(&format!("line `{}`", l.label)))
                    })
                    .map(|(index, _)| *index)
                    .unwrap_or(mine.first().map(|(i, _)| *i).unwrap_or(0));
                warnings.push((owner, format!("{}: {warning}", context(owner))));
            }
            Some((stem.clone(), figure))
        } else {
            if let Some((index, _)) = mine.iter().find(|(_, spec)| !spec.lines.is_empty()) {
                warnings.push((
                    *index,
                    format!(
                        "{}: no successful run, so no main plot for the lines",
                        context(*index)
                    ),
                ));
            }
            None
        };
        let mut extra = Vec::new();
        let mut number = 0;
        for (index, spec) in mine.iter().filter(|(_, spec)| !spec.metrics.is_empty()) {
            number += 1;
            let (figure, figure_warnings) =
                metrics_figure(exp, &spec.metrics, &spec.cases, spec.title.as_deref());
            warnings.extend(
                figure_warnings
                    .into_iter()
                    .map(|w| (*index, format!("{}: {w}", context(*index)))),
            );
            if let Some(figure) = figure {
                let mut extra_stem = format!("{stem}-{number}");
                let mut counter = 2;
                while !used.insert(extra_stem.to_lowercase()) {
                    extra_stem = format!("{stem}-{number}-{counter}");
                    counter += 1;
                }
                extra.push((extra_stem, figure));
            }
        }
        planned.push(PlannedPlots { main, extra });
    }
    warnings.sort_by_key(|(index, _)| *index);
    PlotPlan {
        experiments: planned,
        warnings: warnings.into_iter().map(|(_, text)| text).collect(),
    }
}

/// Draws the experiment's main plot, without annotations, as a PNG.
pub fn draw_png(exp: &Experiment, path: &Path) -> Result<(), ReportError> {
    draw_figure_png(&main_figure(exp, None, &[]).0, path)
}

/// Draws the experiment's main plot, without annotations, as an SVG.
pub fn draw_svg(exp: &Experiment, path: &Path) -> Result<(), ReportError> {
    draw_figure_svg(&main_figure(exp, None, &[]).0, path)
}

/// Draws a figure as a PNG.
pub fn draw_figure_png(figure: &Figure, path: &Path) -> Result<(), ReportError> {
    ensure_font()?;
    let root = BitMapBackend::new(path, PLOT_SIZE).into_drawing_area();
    draw(root, figure).map_err(|source| ReportError::PlotPng {
        path: path.to_path_buf(),
        source,
    })
}

/// Draws a figure as an SVG.
pub fn draw_figure_svg(figure: &Figure, path: &Path) -> Result<(), ReportError> {
    ensure_font()?;
    let root = SVGBackend::new(path, PLOT_SIZE).into_drawing_area();
    draw(root, figure).map_err(|source| ReportError::PlotSvg {
        path: path.to_path_buf(),
        source,
    })
}

/// Everything one plot shows, resolved from the analysis (no drawing yet), so what a plot holds
/// can be tested without reading pixels.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub axis: XAxis,
    /// One sweep point: a bar per series instead of lines.
    pub bars: bool,
    pub series: Vec<Series>,
    pub lines: Vec<PlacedLine>,
    pub y_range: Range<f64>,
}

/// One line of a plot: a case (and variant, and metric) with its points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    pub color: RGBColor,
    /// Dash pattern `(dash, gap)` in pixels; `None` for a solid line. Tells metrics apart when a
    /// plot holds several.
    pub dash: Option<(u32, u32)>,
    pub marker: Marker,
    /// (x, spread) in x order.
    pub points: Vec<(f64, Spread)>,
}

/// The marker of a series' medians.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    FilledCircle,
    HollowCircle,
    Triangle,
}

/// A reference line placed on a plot.
#[derive(Debug, Clone, PartialEq)]
pub enum PlacedLine {
    /// At this x coordinate (a category's index on a categorical axis).
    Vertical {
        x: f64,
        label: String,
    },
    Horizontal {
        y: f64,
        label: String,
    },
}

/// How the x axis is laid out.
#[derive(Debug, Clone, PartialEq)]
pub enum XAxis {
    Linear(Range<f64>),
    Log(Range<f64>),
    /// Text values at 0, 1, 2, ... with their labels.
    Categories(Vec<String>),
}

/// Dash patterns and markers of the 1st, 2nd, ... metric of a plot.
const METRIC_STYLES: [(Option<(u32, u32)>, Marker); 3] = [
    (None, Marker::FilledCircle),
    (Some((10, 6)), Marker::HollowCircle),
    (Some((3, 4)), Marker::Triangle),
];

/// Colours of reference lines, in the order the lines are given.
const REFERENCE_COLORS: [RGBColor; 3] = [
    RGBColor(0, 0, 0),
    RGBColor(110, 110, 110),
    RGBColor(150, 60, 0),
];

/// Y axis text of a web experiment's main plot.
pub const PAGE_LOAD_AXIS: &str = "page load time (s), median and quartiles; lower is better";
/// Y axis text of a bulk experiment's main plot.
pub const THROUGHPUT_AXIS: &str = "throughput (Mbit/s), median and quartiles";

/// The main plot of an experiment: page load time for a web experiment, else throughput, with
/// the reference lines of its `[[plots]]` entries. Also returns why a line was left out.
pub fn main_figure(
    exp: &Experiment,
    title: Option<&str>,
    lines: &[ReferenceLine],
) -> (Figure, Vec<String>) {
    let (what, y_desc) = if exp.web {
        ("page load time", PAGE_LOAD_AXIS)
    } else {
        ("throughput", THROUGHPUT_AXIS)
    };
    let title = title
        .map(str::to_string)
        .unwrap_or_else(|| match &exp.sweep_param {
            Some(param) if exp.sweep_points > 1 => format!("{}: {what} vs {param}", exp.name),
            _ => format!("{}: {what} by case", exp.name),
        });
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
        lines,
    )
}

/// An extra plot of `extra` measurements (or "throughput"): median and quartiles per case and
/// sweep value, every metric in its own dash pattern. `cases` limits the cases (empty: all).
/// `None` when no named metric is measured; the warnings name what was left out.
pub fn metrics_figure(
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
    let title = title
        .map(str::to_string)
        .unwrap_or_else(|| match &exp.sweep_param {
            Some(param) if exp.sweep_points > 1 => format!("{}: {names} vs {param}", exp.name),
            _ => format!("{}: {names} by case", exp.name),
        });
    let unit = if known.iter().all(|m| m.ends_with("seconds")) {
        " (s)"
    } else if known.iter().all(|m| *m == THROUGHPUT_METRIC) {
        " (Mbit/s)"
    } else {
        ""
    };
    let y_desc = format!("{names}{unit}, median and quartiles");
    let spread_of = |row: &CaseRow, metric: &str| row.metric_spread(metric);
    let (figure, line_warnings) = build_figure(exp, title, y_desc, &known, cases, &spread_of, &[]);
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

/// Splits the rows into series (one per variant, case and metric), picks the x axis and places
/// the reference lines. `metrics` are passed to `spread_of`; with more than one the series
/// labels name them. `cases` filters the series (empty: all).
fn build_figure(
    exp: &Experiment,
    title: String,
    y_desc: String,
    metrics: &[&str],
    cases: &[String],
    spread_of: &dyn Fn(&CaseRow, &str) -> Option<Spread>,
    lines: &[ReferenceLine],
) -> (Figure, Vec<String>) {
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
            let (dash, marker) = METRIC_STYLES[metric_index % METRIC_STYLES.len()];
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

    let horizontal_ys = placed.iter().filter_map(|line| match line {
        PlacedLine::Horizontal { y, .. } => Some(*y),
        PlacedLine::Vertical { .. } => None,
    });
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

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    figure: &Figure,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    match &figure.axis {
        XAxis::Linear(range) => draw_chart(
            &root,
            figure,
            range.clone(),
            (&|v| tick(*v), DEFAULT_X_LABELS),
        )?,
        XAxis::Log(range) => draw_chart(
            &root,
            figure,
            range.clone().log_scale(),
            (&|v| tick(*v), DEFAULT_X_LABELS),
        )?,
        XAxis::Categories(labels) => {
            // On -0.5..n-0.5 with at most n labels, plotters' key points are exactly 0..n-1.
            let range = -0.5..labels.len() as f64 - 0.5;
            let formatter = |v: &f64| {
                let index = v.round();
                if (v - index).abs() < 1e-6 && index >= 0.0 {
                    labels.get(index as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            };
            draw_chart(&root, figure, range, (&formatter, labels.len()))?
        }
    }
    root.present()
}

/// Draws frame, mesh, series, reference lines and legend on any x coordinate (linear, log,
/// categories).
fn draw_chart<DB, X>(
    root: &DrawingArea<DB, Shift>,
    figure: &Figure,
    x_range: X,
    (x_formatter, x_labels): (&dyn Fn(&f64) -> String, usize),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: DrawingBackend,
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let bars = figure.bars;
    let legend_position = legend_side(&figure.series);
    let mut chart = ChartBuilder::on(root)
        .caption(&figure.title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(54)
        .y_label_area_size(72)
        .build_cartesian_2d(x_range, figure.y_range.clone())?;

    let mut mesh = chart.configure_mesh();
    if bars {
        // Grid lines through the middle of the bars only add noise.
        mesh.disable_x_mesh();
    }
    mesh.x_desc(figure.x_desc.as_str())
        .y_desc(figure.y_desc.as_str())
        .x_labels(x_labels)
        .x_label_formatter(x_formatter)
        .y_label_formatter(&|v| tick(*v))
        .axis_desc_style(("sans-serif", 18))
        .label_style(("sans-serif", 15))
        .light_line_style(RGBColor(246, 246, 246))
        .draw()?;

    for s in &figure.series {
        let color = s.color;
        let line_style = color.stroke_width(2);
        // On a bar the quartiles are drawn in black, a bar-coloured bar would vanish.
        let bar_color = if bars { BLACK } else { color };
        if bars {
            for (x, spread) in &s.points {
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(x - 0.3, 0.0), (x + 0.3, spread.median)],
                    color.mix(0.75).filled(),
                )))?;
            }
        } else {
            let medians = s.points.iter().map(|(x, p)| (*x, p.median));
            match s.dash {
                None => {
                    chart.draw_series(LineSeries::new(medians, line_style))?;
                }
                Some((dash, gap)) => {
                    chart.draw_series(DashedLineSeries::new(
                        medians,
                        dash as i32,
                        gap as i32,
                        line_style,
                    ))?;
                }
            }
        }
        // Quartile error bars: a vertical line with short caps (drawn in pixels, so they keep
        // their size on a log axis).
        chart.draw_series(s.points.iter().map(|(x, p)| {
            PathElement::new(vec![(*x, p.q1), (*x, p.q3)], bar_color.stroke_width(1))
        }))?;
        chart.draw_series(s.points.iter().flat_map(|(x, p)| {
            [p.q1, p.q3].map(|y| {
                EmptyElement::at((*x, y))
                    + PathElement::new(vec![(-5, 0), (5, 0)], bar_color.stroke_width(1))
            })
        }))?;
        let (dash, marker) = (s.dash, s.marker);
        let marker_style = match marker {
            Marker::HollowCircle => color.stroke_width(2),
            Marker::FilledCircle | Marker::Triangle => color.filled(),
        };
        let annotation = match marker {
            Marker::FilledCircle | Marker::HollowCircle => chart.draw_series(
                s.points
                    .iter()
                    .map(|(x, p)| Circle::new((*x, p.median), 4, marker_style)),
            )?,
            Marker::Triangle => chart.draw_series(
                s.points
                    .iter()
                    .map(|(x, p)| TriangleMarker::new((*x, p.median), 5, marker_style)),
            )?,
        };
        let annotation = annotation.label(s.label.as_str());
        // The legend sample: the series' line (solid, or two dashes) and its marker.
        match (dash.is_some(), marker) {
            (false, Marker::FilledCircle | Marker::HollowCircle) => {
                annotation.legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (20, 0)], color.stroke_width(2))
                        + Circle::new((10, 0), 4, marker_style)
                });
            }
            (true, Marker::FilledCircle | Marker::HollowCircle) => {
                annotation.legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (6, 0)], color.stroke_width(2))
                        + PathElement::new(vec![(14, 0), (20, 0)], color.stroke_width(2))
                        + Circle::new((10, 0), 4, marker_style)
                });
            }
            (false, Marker::Triangle) => {
                annotation.legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (20, 0)], color.stroke_width(2))
                        + TriangleMarker::new((10, 0), 5, marker_style)
                });
            }
            (true, Marker::Triangle) => {
                annotation.legend(move |(x, y)| {
                    EmptyElement::at((x, y))
                        + PathElement::new(vec![(0, 0), (6, 0)], color.stroke_width(2))
                        + PathElement::new(vec![(14, 0), (20, 0)], color.stroke_width(2))
                        + TriangleMarker::new((10, 0), 5, marker_style)
                });
            }
        }
    }

    let (y_low, y_high) = (figure.y_range.start, figure.y_range.end);
    for (index, line) in figure.lines.iter().enumerate() {
        let color = REFERENCE_COLORS[index % REFERENCE_COLORS.len()];
        let (points, label) = match line {
            PlacedLine::Vertical { x, label } => (vec![(*x, y_low), (*x, y_high)], label),
            PlacedLine::Horizontal { y, label } => {
                let (x_low, x_high) = x_extent(&figure.axis);
                (vec![(x_low, *y), (x_high, *y)], label)
            }
        };
        chart
            .draw_series(DashedLineSeries::new(points, 8, 5, color.stroke_width(2)))?
            .label(label.as_str())
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (7, 0)], color.stroke_width(2))
                    + PathElement::new(vec![(13, 0), (20, 0)], color.stroke_width(2))
            });
    }

    if !bars || !figure.lines.is_empty() {
        chart
            .configure_series_labels()
            .position(legend_position)
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()?;
    }
    Ok(())
}

/// The x range of an axis, to draw a horizontal line from edge to edge.
fn x_extent(axis: &XAxis) -> (f64, f64) {
    match axis {
        XAxis::Linear(range) | XAxis::Log(range) => (range.start, range.end),
        XAxis::Categories(labels) => (-0.5, labels.len() as f64 - 0.5),
    }
}

/// The upper corner where the curves are lower: compares the highest quartile over the first and
/// over the last third of the distinct x values (by rank, so a log axis is split like a linear one).
fn legend_side(series: &[Series]) -> SeriesLabelPosition {
    let mut xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|(x, _)| *x))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    if xs.is_empty() {
        return SeriesLabelPosition::UpperRight;
    }
    let third = xs.len().div_ceil(3);
    let (left_end, right_start) = (xs[third - 1], xs[xs.len() - third]);
    let highest_where = |inside: &dyn Fn(f64) -> bool| {
        series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|(x, _)| inside(*x))
            .map(|(_, p)| p.q3)
            .fold(0.0_f64, f64::max)
    };
    let left = highest_where(&|x| x <= left_end);
    let right = highest_where(&|x| x >= right_start);
    if right > left {
        SeriesLabelPosition::UpperLeft
    } else {
        SeriesLabelPosition::UpperRight
    }
}

/// Axis tick text: SI suffixes for large values (3M for 3 000 000 bytes), otherwise the value
/// with at most four decimals and no trailing zeros.
fn tick(value: f64) -> String {
    let magnitude = value.abs();
    let (scaled, suffix) = if magnitude >= 1e9 {
        (value / 1e9, "G")
    } else if magnitude >= 1e6 {
        (value / 1e6, "M")
    } else if magnitude >= 1e4 {
        (value / 1e3, "k")
    } else {
        (value, "")
    };
    let mut text = format!("{scaled:.4}");
    if text.contains('.') {
        text = text.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    if text == "-0" {
        text = "0".to_string();
    }
    format!("{text}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::analyse;
    use crate::claims::parse;
    use crate::record::RunRecord;
    use std::collections::BTreeMap;

    fn record(experiment: &str, case: &str, x: serde_json::Value, rep: u32) -> RunRecord {
        RunRecord {
            scenario: "s".into(),
            scenario_file: "s.toml".into(),
            commit: "c".into(),
            experiment: experiment.into(),
            case: case.into(),
            sweep_param: Some("x".into()),
            params: BTreeMap::from([("x".to_string(), x)]),
            repetition: rep,
            seed: 1,
            bytes: 1000,
            seconds: 1.0,
            throughput_bps: 8e6 + 1e6 * f64::from(rep),
            retransmits: BTreeMap::new(),
            extra: BTreeMap::from([
                ("a_seconds".to_string(), 1.0 + f64::from(rep)),
                ("b_seconds".to_string(), 2.0),
            ]),
            ok: true,
            error: None,
            started_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    /// Experiments: "lin" (x 10..40), "log" (x 1..10000), "cat" (text x), "one" (one point).
    fn experiments() -> Vec<Experiment> {
        let mut records = Vec::new();
        for rep in 0..3 {
            for case in ["direct", "proxy"] {
                for x in [10, 20, 40] {
                    records.push(record("lin", case, serde_json::json!(x), rep));
                }
                for x in [1, 100, 10000] {
                    records.push(record("log", case, serde_json::json!(x), rep));
                }
                for x in ["1.0", "1.1", "pipelining"] {
                    records.push(record("cat", case, serde_json::json!(x), rep));
                }
                records.push(record("one", case, serde_json::json!(5), rep));
            }
        }
        analyse(&records, "direct").experiments
    }

    fn plan_of(plots: &str) -> PlotPlan {
        let file = parse(&format!("paper = \"p\"\n{plots}")).expect("valid plots");
        plan(&experiments(), &file.plots)
    }

    #[test]
    fn without_annotations_every_main_plot_is_plain() {
        let plan = plan_of("");
        assert!(plan.warnings.is_empty());
        let stems: Vec<&str> = plan
            .experiments
            .iter()
            .map(|p| p.main.as_ref().expect("runs").0.as_str())
            .collect();
        assert_eq!(stems, ["lin", "log", "cat", "one"]);
        let lin = &plan.experiments[0].main.as_ref().expect("lin").1;
        assert_eq!(lin.y_desc, THROUGHPUT_AXIS);
        assert!(lin.lines.is_empty() && !lin.bars);
        // Throughput 8, 9, 10 Mbit/s: Q3 9.5, with 25 % headroom.
        assert_eq!(lin.y_range, 0.0..9.5 * 1.25);
        assert_eq!(lin.axis, XAxis::Linear(8.5..41.5));
        assert!(plan.experiments.iter().all(|p| p.extra.is_empty()));
    }

    #[test]
    fn lines_are_placed_on_every_kind_of_axis() {
        let plan = plan_of(
            r#"
[[plots]]
experiment = "lin"
title = "annotated"
[[plots.lines]]
label = "rule"
x = 100
[[plots.lines]]
label = "paper"
y = 20.0
[[plots]]
experiment = "log"
[[plots.lines]]
label = "zero"
x = 0
[[plots]]
experiment = "cat"
[[plots.lines]]
label = "keep-alive"
x = "1.1"
[[plots.lines]]
label = "as number"
x = 1.0
[[plots.lines]]
label = "missing"
x = "spdy"
[[plots]]
experiment = "one"
[[plots.lines]]
label = "vertical"
x = 5
[[plots.lines]]
label = "both"
x = 5
y = 1.0
[[plots.lines]]
label = "floor"
y = 1.0
"#,
        );
        let main = |i: usize| &plan.experiments[i].main.as_ref().expect("main").1;
        let lin = main(0);
        assert_eq!(lin.title, "annotated");
        assert_eq!(
            lin.lines,
            vec![
                PlacedLine::Vertical {
                    x: 100.0,
                    label: "rule".into()
                },
                PlacedLine::Horizontal {
                    y: 20.0,
                    label: "paper".into()
                },
            ]
        );
        // The axis and the y range grow to show the lines.
        assert_eq!(lin.axis, XAxis::Linear(5.5..104.5));
        assert_eq!(lin.y_range, 0.0..25.0);
        // A log axis cannot show x = 0: the axis stays logarithmic, the line is left out.
        assert_eq!(main(1).axis, XAxis::Log(1.0 / 1.25..10000.0 * 1.25));
        assert!(main(1).lines.is_empty());
        let cat = main(2);
        assert_eq!(
            cat.lines,
            vec![
                PlacedLine::Vertical {
                    x: 1.0,
                    label: "keep-alive".into()
                },
                PlacedLine::Vertical {
                    x: 0.0,
                    label: "as number".into()
                },
            ]
        );
        let one = main(3);
        assert!(one.bars);
        assert_eq!(
            one.lines,
            vec![PlacedLine::Horizontal {
                y: 1.0,
                label: "floor".into()
            }]
        );
        assert_eq!(plan.warnings.len(), 4, "{:#?}", plan.warnings);
        assert!(plan.warnings[0].ends_with(
            "#2 (experiment `log`): line `zero`: x = 0 cannot be drawn on the logarithmic x axis"
        ));
        let plan_warnings = &plan.warnings[1..];
        assert!(plan_warnings[0].starts_with(
            "claims.toml [[plots]] #3 (experiment `cat`): line `missing`: x = spdy is none of the \
             sweep values"
        ));
        assert!(plan_warnings[1].contains(
            "#4 (experiment `one`): line `vertical`: experiment `one` has a single sweep point"
        ));
        assert!(plan_warnings[2].contains("line `both` needs exactly one of `x`"));
    }

    #[test]
    fn a_positive_line_keeps_a_log_axis() {
        let plan =
            plan_of("[[plots]]\nexperiment = \"log\"\n[[plots.lines]]\nlabel = \"l\"\nx = 50000\n");
        let log = &plan.experiments[1].main.as_ref().expect("log").1;
        assert_eq!(log.axis, XAxis::Log(1.0 / 1.25..50000.0 * 1.25));
        assert!(plan.warnings.is_empty());
    }

    #[test]
    fn extra_plots_of_metrics_with_warnings() {
        let plan = plan_of(
            r#"
[[plots]]
experiment = "lin"
metrics = ["a_seconds", "b_seconds", "nope"]
cases = ["proxy", "ghost"]
[[plots]]
experiment = "lin"
metrics = ["nope"]
[[plots]]
experiment = "lin"
metrics = ["throughput"]
[[plots]]
experiment = "elsewhere"
"#,
        );
        let extra = &plan.experiments[0].extra;
        assert_eq!(extra.len(), 2, "the all-unknown entry draws nothing");
        assert_eq!(extra[0].0, "lin-1");
        assert_eq!(extra[1].0, "lin-3", "n counts the entries with metrics");
        let figure = &extra[0].1;
        assert_eq!(figure.title, "lin: a_seconds, b_seconds vs x");
        assert_eq!(
            figure.y_desc,
            "a_seconds, b_seconds (s), median and quartiles"
        );
        let labels: Vec<&str> = figure.series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["proxy: a_seconds", "proxy: b_seconds"]);
        assert_eq!(figure.series[0].dash, None);
        assert!(figure.series[1].dash.is_some());
        // The proxy keeps its colour of the main plot (second case).
        assert_eq!(figure.series[0].color, SERIES_COLORS[1]);
        // a_seconds = 1 + rep over three repetitions: median 2, quartiles 1.5 and 2.5.
        let (x, spread) = figure.series[0].points[0];
        assert_eq!(
            (x, spread.q1, spread.median, spread.q3),
            (10.0, 1.5, 2.0, 2.5)
        );
        assert_eq!(
            extra[1].1.y_desc,
            "throughput (Mbit/s), median and quartiles"
        );
        let w = &plan.warnings;
        assert_eq!(w.len(), 5, "{w:#?}");
        assert!(w[0].contains("metric `nope` is not measured in experiment `lin`"));
        assert!(w[1].contains("case `ghost` is not in experiment `lin`"));
        assert!(w[2].starts_with("claims.toml [[plots]] #2 (experiment `lin`): metric `nope`"));
        assert!(w[3].contains("#2 (experiment `lin`): no measured metric left to plot"));
        assert!(w[4].contains("#4: experiment `elsewhere` is not in the results"));
    }

    #[test]
    fn extra_plot_stems_do_not_clash_with_experiments() {
        let mut exps = experiments();
        exps[1].name = "lin-1".into();
        let file =
            parse("paper = \"p\"\n[[plots]]\nexperiment = \"lin\"\nmetrics = [\"a_seconds\"]\n")
                .expect("valid");
        let plan = plan(&exps, &file.plots);
        assert_eq!(plan.experiments[1].main.as_ref().expect("main").0, "lin-1");
        assert_eq!(plan.experiments[0].extra[0].0, "lin-1-2");
    }

    #[test]
    fn tick_text() {
        assert_eq!(tick(3_000_000.0), "3M");
        assert_eq!(tick(30_000.0), "30k");
        assert_eq!(tick(1500.0), "1500");
        assert_eq!(tick(0.01), "0.01");
        assert_eq!(tick(2.5), "2.5");
        assert_eq!(tick(0.0), "0");
    }
}
