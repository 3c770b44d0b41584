//! The resolved plot: everything one plot shows (series, axis, reference lines, y range) as
//! plain data. The builders in [`super::kinds`] produce it and [`super::render`] draws it; the
//! type sits between them so what a plot holds can be tested without reading pixels.

use std::ops::Range;

use plotters::style::RGBColor;

use crate::stats::Spread;

/// Everything one plot shows, resolved from the analysis (no drawing yet), so what a plot holds
/// can be tested without reading pixels.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Figure {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub axis: XAxis,
    /// One sweep point: a bar per series instead of lines.
    pub bars: bool,
    pub series: Vec<Series>,
    pub lines: Vec<PlacedLine>,
    /// The paper's numbers, drawn as crosses on the same axes.
    pub paper_points: Vec<PlacedPoint>,
    pub y_range: Range<f64>,
}

/// A paper's number placed on a plot.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlacedPoint {
    /// The x coordinate (a category's or a bar's index on a categorical axis).
    pub x: f64,
    pub y: f64,
    pub label: String,
}

/// One line of a plot: a case (and variant, and metric) with its points.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
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
pub(crate) enum Marker {
    FilledCircle,
    HollowCircle,
    Triangle,
}

/// A reference line placed on a plot.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PlacedLine {
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
pub(crate) enum XAxis {
    Linear(Range<f64>),
    Log(Range<f64>),
    /// Text values at 0, 1, 2, ... with their labels.
    Categories(Vec<String>),
}
