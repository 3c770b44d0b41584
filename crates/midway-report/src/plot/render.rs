//! Drawing a resolved [`Figure`] with plotters, as PNG or SVG: the font registration, the frame,
//! mesh, series, error bars, reference lines and legend. The only file of the plot module that
//! touches plotters' drawing, so the rest stays pure.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::figure::{Figure, Marker, PlacedLine, Series, XAxis};
use super::style::{tick, DEFAULT_X_LABELS, REFERENCE_COLORS};
use super::{FONT_ENV, FONT_PATH, PLOT_SIZE};
use crate::ReportError;

/// The font is registered once per process; plotters keeps it in a global table and needs the
/// bytes for the rest of the process, hence the leak (one font file, once).
static FONT_REGISTERED: Mutex<bool> = Mutex::new(false);

/// Registers the plot font with plotters unless already done.
pub(crate) fn ensure_font() -> Result<(), ReportError> {
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

/// Draws a figure as a PNG.
pub(crate) fn draw_figure_png(figure: &Figure, path: &Path) -> Result<(), ReportError> {
    ensure_font()?;
    let root = BitMapBackend::new(path, PLOT_SIZE).into_drawing_area();
    draw(root, figure).map_err(|source| ReportError::PlotPng {
        path: path.to_path_buf(),
        source,
    })
}

/// Draws a figure as an SVG.
pub(crate) fn draw_figure_svg(figure: &Figure, path: &Path) -> Result<(), ReportError> {
    ensure_font()?;
    let root = SVGBackend::new(path, PLOT_SIZE).into_drawing_area();
    draw(root, figure).map_err(|source| ReportError::PlotSvg {
        path: path.to_path_buf(),
        source,
    })
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

/// Space around the chart, in pixels.
const CHART_MARGIN: u32 = 16;
/// The caption's font size and the smallest it may shrink to.
const CAPTION_SIZE: u32 = 26;
const CAPTION_MIN_SIZE: u32 = 12;

/// The largest caption size at which the title fits the plot's width. A title names the
/// experiment, the swept parameter and the run's kind, and plotters centres it and cuts what
/// does not fit at both ends, which hid the experiment's name on long ones.
fn caption_font_size<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
) -> Result<u32, DrawingAreaErrorKind<DB::ErrorType>> {
    let available = root.dim_in_pixel().0.saturating_sub(2 * CHART_MARGIN);
    for size in (CAPTION_MIN_SIZE..=CAPTION_SIZE).rev() {
        let (width, _) =
            root.estimate_text_size(title, &("sans-serif", size).into_text_style(root))?;
        if width <= available {
            return Ok(size);
        }
    }
    Ok(CAPTION_MIN_SIZE)
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
    let caption_size = caption_font_size(root, &figure.title)?;
    let mut chart = ChartBuilder::on(root)
        .caption(&figure.title, ("sans-serif", caption_size))
        .margin(CHART_MARGIN)
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

    // The paper's numbers: crosses in the reference colours, one legend entry per label.
    let mut point_labels: Vec<&str> = Vec::new();
    for point in &figure.paper_points {
        if !point_labels.contains(&point.label.as_str()) {
            point_labels.push(&point.label);
        }
    }
    for (index, label) in point_labels.iter().enumerate() {
        let color = REFERENCE_COLORS[index % REFERENCE_COLORS.len()];
        let style = color.stroke_width(3);
        chart
            .draw_series(
                figure
                    .paper_points
                    .iter()
                    .filter(|p| p.label == *label)
                    .map(|p| Cross::new((p.x, p.y), 7, style)),
            )?
            .label(*label)
            .legend(move |(x, y)| Cross::new((x + 10, y), 6, style));
    }

    if !bars || !figure.lines.is_empty() || !figure.paper_points.is_empty() {
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
