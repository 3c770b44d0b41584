//! Plots of one experiment with plotters: throughput (Mbit/s) against the swept parameter, one
//! line per case (and per variant), the median as a marker and the quartiles as an error bar.
//! A numeric sweep spanning more than two decades gets a logarithmic x axis; text sweep values
//! are placed at equal spacing; an experiment with a single point becomes a bar chart.
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

use crate::analysis::{CaseRow, Experiment};
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

/// Draws the experiment as a PNG.
pub fn draw_png(exp: &Experiment, path: &Path) -> Result<(), ReportError> {
    ensure_font()?;
    let root = BitMapBackend::new(path, PLOT_SIZE).into_drawing_area();
    draw(root, exp).map_err(|source| ReportError::PlotPng {
        path: path.to_path_buf(),
        source,
    })
}

/// Draws the experiment as an SVG.
pub fn draw_svg(exp: &Experiment, path: &Path) -> Result<(), ReportError> {
    ensure_font()?;
    let root = SVGBackend::new(path, PLOT_SIZE).into_drawing_area();
    draw(root, exp).map_err(|source| ReportError::PlotSvg {
        path: path.to_path_buf(),
        source,
    })
}

/// One line of the plot: a case (and variant) with its points.
struct Series<'a> {
    label: String,
    color: RGBColor,
    /// (x, throughput spread) in sweep order.
    points: Vec<(f64, Spread)>,
    _rows: Vec<&'a CaseRow>,
}

/// How the x axis is laid out.
enum XAxis {
    Linear(Range<f64>),
    Log(Range<f64>),
    /// Text values at 0, 1, 2, ... with their labels.
    Categories(Vec<String>),
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    exp: &Experiment,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let title = match &exp.sweep_param {
        Some(param) if exp.sweep_points > 1 => format!("{}: throughput vs {param}", exp.name),
        _ => format!("{}: throughput by case", exp.name),
    };
    let (series, axis) = layout(exp);
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|(_, p)| p.q3))
        .fold(0.0_f64, f64::max);
    // Headroom above the highest quartile for the legend box.
    let y_range = 0.0..if y_max > 0.0 { y_max * 1.25 } else { 1.0 };

    match axis {
        XAxis::Linear(range) => draw_chart(
            &root,
            exp,
            &title,
            range,
            y_range,
            &series,
            (&|v| tick(*v), DEFAULT_X_LABELS),
        )?,
        XAxis::Log(range) => draw_chart(
            &root,
            exp,
            &title,
            range.log_scale(),
            y_range,
            &series,
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
            draw_chart(
                &root,
                exp,
                &title,
                range,
                y_range,
                &series,
                (&formatter, labels.len()),
            )?
        }
    }
    root.present()
}

/// Splits the rows into series and picks the x axis.
fn layout(exp: &Experiment) -> (Vec<Series<'_>>, XAxis) {
    let mut keys: Vec<(String, String)> = Vec::new();
    for row in &exp.rows {
        let key = (row.variant.clone(), row.case.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let label_of = |variant: &str, case: &str| {
        if variant.is_empty() {
            case.to_string()
        } else {
            format!("{case} ({variant})")
        }
    };

    let single_point = exp.sweep_points <= 1;
    if single_point {
        // Bar chart: one category per series.
        let labels: Vec<String> = keys.iter().map(|(v, c)| label_of(v, c)).collect();
        let series = keys
            .iter()
            .enumerate()
            .map(|(index, (variant, case))| {
                let rows: Vec<&CaseRow> = exp
                    .rows
                    .iter()
                    .filter(|r| &r.variant == variant && &r.case == case)
                    .collect();
                Series {
                    label: labels[index].clone(),
                    color: SERIES_COLORS[index % SERIES_COLORS.len()],
                    points: rows
                        .iter()
                        .filter_map(|r| r.throughput_mbps.map(|s| (index as f64, s)))
                        .collect(),
                    _rows: rows,
                }
            })
            .collect();
        return (series, XAxis::Categories(labels));
    }

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
    let series: Vec<Series<'_>> = keys
        .iter()
        .enumerate()
        .map(|(index, (variant, case))| {
            let rows: Vec<&CaseRow> = exp
                .rows
                .iter()
                .filter(|r| &r.variant == variant && &r.case == case)
                .collect();
            let mut points: Vec<(f64, Spread)> = rows
                .iter()
                .filter_map(|r| r.throughput_mbps.map(|s| (x_of(r), s)))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                label: label_of(variant, case),
                color: SERIES_COLORS[index % SERIES_COLORS.len()],
                points,
                _rows: rows,
            }
        })
        .collect();

    if !exp.numeric_sweep {
        return (series, XAxis::Categories(sweep_labels));
    }
    let xs: Vec<f64> = exp.rows.iter().filter_map(|r| r.sweep_number).collect();
    let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let axis = if min > 0.0 && max / min > LOG_AXIS_MIN_RATIO {
        // A little room on both sides so the end markers are not cut by the frame.
        XAxis::Log(min / 1.25..max * 1.25)
    } else {
        let pad = if max > min {
            (max - min) * 0.05
        } else {
            min.abs().max(1.0) * 0.5
        };
        XAxis::Linear(min - pad..max + pad)
    };
    (series, axis)
}

/// Draws frame, mesh, series and legend on any x coordinate (linear, log, categories).
fn draw_chart<DB, X>(
    root: &DrawingArea<DB, Shift>,
    exp: &Experiment,
    title: &str,
    x_range: X,
    y_range: Range<f64>,
    series: &[Series<'_>],
    (x_formatter, x_labels): (&dyn Fn(&f64) -> String, usize),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: DrawingBackend,
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let bars = exp.sweep_points <= 1;
    let legend_position = legend_side(series);
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 26))
        .margin(16)
        .x_label_area_size(54)
        .y_label_area_size(72)
        .build_cartesian_2d(x_range, y_range)?;

    let x_desc = match (&exp.sweep_param, bars) {
        (_, true) => "case".to_string(),
        (Some(param), false) => param.clone(),
        (None, false) => "point".to_string(),
    };
    let mut mesh = chart.configure_mesh();
    if bars {
        // Grid lines through the middle of the bars only add noise.
        mesh.disable_x_mesh();
    }
    mesh.x_desc(x_desc)
        .y_desc("throughput (Mbit/s), median and quartiles")
        .x_labels(x_labels)
        .x_label_formatter(x_formatter)
        .y_label_formatter(&|v| tick(*v))
        .axis_desc_style(("sans-serif", 18))
        .label_style(("sans-serif", 15))
        .light_line_style(RGBColor(246, 246, 246))
        .draw()?;

    for s in series {
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
            chart.draw_series(LineSeries::new(
                s.points.iter().map(|(x, p)| (*x, p.median)),
                line_style,
            ))?;
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
        chart
            .draw_series(
                s.points
                    .iter()
                    .map(|(x, p)| Circle::new((*x, p.median), 4, color.filled())),
            )?
            .label(s.label.as_str())
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (20, 0)], color.stroke_width(2))
                    + Circle::new((10, 0), 4, color.filled())
            });
    }

    if !bars {
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

/// The upper corner where the curves are lower: compares the highest quartile over the first and
/// over the last third of the distinct x values (by rank, so a log axis is split like a linear one).
fn legend_side(series: &[Series<'_>]) -> SeriesLabelPosition {
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
