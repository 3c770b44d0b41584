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
//!
//! The files, one job each: `plan.rs` decides which plots a report has and their file names;
//! `kinds.rs` builds the two kinds of plot (an experiment's main plot and an extra plot of
//! chosen metrics); `layout.rs` is what both kinds share (series, x axis, reference lines, y
//! range); `figure.rs` is the resolved plot they produce; `style.rs` holds colours, dashes,
//! markers and tick text; `render.rs` draws a figure to PNG or SVG. The split keeps everything
//! up to a [`Figure`] pure and testable apart from plotters' drawing.

mod figure;
mod kinds;
mod layout;
mod plan;
mod render;
mod style;

use plotters::prelude::*;

pub(crate) use figure::Figure;
pub(crate) use plan::plan;
pub(crate) use render::{draw_figure_png, draw_figure_svg};

/// Font used for all plot text (Debian package fonts-dejavu-core).
pub(crate) const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// Environment variable that overrides [`FONT_PATH`].
pub(crate) const FONT_ENV: &str = "MIDWAY_REPORT_FONT";
/// Size of every plot, in pixels (PNG) or user units (SVG).
pub(crate) const PLOT_SIZE: (u32, u32) = (1000, 640);

/// Error of the PNG backend while drawing.
pub type PngError = DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>;
/// Error of the SVG backend while drawing.
pub type SvgError = DrawingAreaErrorKind<std::io::Error>;
