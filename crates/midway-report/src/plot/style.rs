//! The look shared by every plot: series and reference-line colours, the dash pattern and marker
//! of each metric, when the x axis turns logarithmic, and axis tick text. Kept apart so the
//! figure builders and the renderer agree on one palette.

use plotters::style::RGBColor;

use super::figure::Marker;

/// Colour-blind friendly, well separated colours (Tableau 10), picked in case order.
pub(super) const SERIES_COLORS: [RGBColor; 10] = [
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
pub(super) const DEFAULT_X_LABELS: usize = 10;

/// Ratio max/min of a positive numeric sweep above which the x axis is logarithmic.
pub(super) const LOG_AXIS_MIN_RATIO: f64 = 100.0;

/// Dash patterns and markers of the 1st, 2nd, ... metric of a plot (of the 1st, 2nd, ... case
/// when the plot shows one metric).
pub(super) const METRIC_STYLES: [(Option<(u32, u32)>, Marker); 3] = [
    (None, Marker::FilledCircle),
    (Some((10, 6)), Marker::HollowCircle),
    (Some((3, 4)), Marker::Triangle),
];

/// Colours of reference lines, in the order the lines are given.
pub(super) const REFERENCE_COLORS: [RGBColor; 3] = [
    RGBColor(0, 0, 0),
    RGBColor(110, 110, 110),
    RGBColor(150, 60, 0),
];

/// Axis tick text: SI suffixes for large values (3M for 3 000 000 bytes), otherwise the value
/// with at most four decimals and no trailing zeros.
pub(super) fn tick(value: f64) -> String {
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
