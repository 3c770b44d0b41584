//! A paper's claims next to what the lab measured — the tables "paper says / we measured /
//! verdict / why" — and annotations of the report's plots.
//!
//! A claims file (`claims.toml` in a results folder, copied there from
//! `scenarios/repro/PAPER.claims.toml`) lists the paper's own findings (`[[claims]]`) and
//! midway's own targets (`[[targets]]`, set by issues; same fields, their own table, never
//! counted as the paper's). Where a machine can check one, it has one comparison; the file may
//! also add reference lines and plots of `extra` measurements to the report's figures:
//!
//! ```toml
//! paper = "hfc-proxy"
//! [[claims]]
//! figure = "Fig. 8"
//! experiment = "fig8-9-legacy"
//! says = "At 1 % local loss store-and-forward loses < 5 % of its lossless throughput"
//! paper_value = "text, section 4: < 5 %"   # optional: the paper's number and where it is
//! why_not = "what may explain a difference (shown when the check does not agree)"
//! note = "a caveat shown whatever the verdict (optional)"
//! not_tested = "why the lab does not test it (optional; the verdict is then 'not tested')"
//! [claims.check]                 # required unless `not_tested` says why there is none
//! metric = "throughput"          # see the metrics below (default "throughput")
//! stat = "median"                # "median" (default) or "mean" over the repetitions
//! a = { case = "store-and-forward", x = 1 }
//! b = { case = "store-and-forward", x = 0 }   # optional: without b, A is compared to `value`;
//!                                #   an operand may name another `experiment` than the claim's
//! op = "within"                  # two-sided: |A / B - value| <= tolerance ...
//! value = 0.975
//! tolerance = 0.025              #   (the paper's precision, never what the lab measured)
//! # op = ">="                    # ... or one-sided (">=", "<=", ">", "<"), which must say why
//! # open_side = "the paper gives only the ordering"   #   its other side is open
//! # trend = "decreasing"         # ... or, without op / value / x: a trend over the whole sweep
//! # from_x = 3                   #   (optional: from this sweep value up)
//! # [claims.reading]             # how the check reads the paper's words (scenarios/README.md,
//! # convention = "almost"        #   "Reading the papers' words"): almost, over, qualitative,
//! # words = "an almost four-fold increase"   # no-effect or trend, the words quoted, and for
//! # fold = 4                     #   almost / over the paper's number (fold, percent_less or
//! #                              #   percent_more); this one needs `within` 3.7 +- 0.3
//!
//! [[sanity]]                     # a check arithmetic or physics settles before any run: shown
//! figure = "Fig. 8"              #   apart ("as expected" / "unexpected"), never counted as a claim
//! experiment = "fig8-9-legacy"
//! says = "direct with 8 KB over 100 ms stays under 0.7 Mbit/s"
//! settled_by = "arithmetic: 8 KB per 100 ms round trip is at most 0.66 Mbit/s"
//! [sanity.check]                 # as [claims.check]
//! a = { case = "direct", x = 0 }
//! op = "<"
//! value = 0.7
//! open_side = "a bound arithmetic settles"
//!
//! [[predictions]]                # each case's share of a path from its response function
//! experiment = "long-fat"        #   (the path from the records), beside the measured share
//! link = "wan"
//! direction = "b_to_a"
//! cases = { chain-reno = "reno", chain-highspeed = "highspeed" }
//!
//! [[plots]]
//! experiment = "fig8-9-modern"   # an experiment of the results
//! title = "..."                  # optional: caption of this entry's extra plot; for an entry
//!                                #   without `metrics`, the caption of the main plot
//! metrics = ["remote_segment_seconds", "local_segment_seconds"]  # optional: one extra plot
//! cases = ["store-and-forward"]  # optional: only these cases in the extra plot
//! [[plots.lines]]                # optional: reference lines on the experiment's main plot
//! label = "buffer rule C >= n(B-1)(1-r_out/r_in), n = 3"   # legend text
//! x = 24000                      # a vertical line at this sweep value (a text sweep value
//!                                #   such as "pipelining" on a categorical axis) ...
//! # y = 15.0                     # ... or a horizontal one at this value of the y axis
//! [[plots.points]]               # optional: the paper's numbers on the same axes (crosses)
//! label = "paper, direct"        # legend text, shared by the points of one curve
//! x = 1                          # the sweep value (or `case = "..."` on a one-point bar plot)
//! y = 0.24                       # in the main plot's unit (Mbit/s, or s of page load time)
//! source = "Table II"            # where the number comes from ("read off Fig. 6" says so)
//! ```
//!
//! Metrics of a check (`metric`, or per operand `a = { ..., metric = "..." }`):
//! - `"throughput"`: Mbit/s of the runs;
//! - the name of any `extra` measurement of the records, e.g. `"remote_segment_seconds"` or, for
//!   web experiments, `"page_load_seconds"` (the mean page load time of a run);
//! - `"gos_positive_share"`: the share (0..1) of repetitions whose throughput beat the
//!   experiment's baseline case (`direct` unless the report was told otherwise) run with the same
//!   parameters and repetition index — the satellite paper's "guarantee of improvement";
//! - `"gos"`: the gain of splitting of those paired repetitions.
//!
//! `stat` says how the repetitions of a case at one sweep value are summarised (it does not apply
//! to `gos_positive_share`, a share already). `x` is the sweep value as the records hold it (the
//! axis value: 1 for 1 % loss, bytes for a size). Without `x` in both A and B the check runs at
//! every sweep value case A has ("in every cell").
//!
//! Verdicts. The compared number (A, or A / B) gets a confidence interval over the repetitions
//! from [`crate::interval`], labelled with the level it has at its number of runs: exact order
//! statistics for a median and for runs of two cases paired by seed (the compared number is then
//! the median of the per-pair ratios), two order-statistic intervals combined for unpaired
//! medians, Student's t or Fieller's interval for means, Clopper-Pearson for a share. A cell
//! holds when the number and its whole interval are in the accepted range, fails when the whole
//! interval is outside it, and is unsure otherwise (also with fewer than two runs a side, or an
//! interval below [`crate::interval::MIN_VERDICT_LEVEL`] from runs that are not deterministic).
//! Runs that agree to within [`crate::interval::DETERMINISTIC_SPREAD`] are named deterministic
//! in the cell, and unsure cells nearer their threshold than their interval is wide are listed
//! under each table with the runs that would settle them ([`crate::interval::runs_needed`]). A claim **agrees** when every cell holds,
//! **disagrees** when one fails, and is **inconclusive** otherwise; it is **not tested** when
//! the file says why (or it has no check), **no data** when runs are missing, and an **invalid
//! check** when the check is malformed ([`ClaimsFile::problems`] lists those, and the report
//! shows them above the table). The table shows, for every cell, A, B, their ratio, the
//! interval and by how much the number meets or misses the range.
//!
//! A `[[plots]]` entry naming an experiment, metric or case the results do not have, or a line
//! that cannot be placed, becomes a warning line in the report, never an error: the rest of the
//! report is still written. Extra plots are written as `plots/<experiment>-<n>.png` and `.svg`
//! (n = 1, 2, ... over the experiment's entries with `metrics`) and linked in the experiment's
//! section. Parsing and evaluation are pure; only [`load`] reads a file.
//!
//! A trend check runs over every sweep value of A (from `from_x` up) and is judged by the
//! permutation test of the rank correlation of the runs with the sweep ([`crate::trend`];
//! `trend.rs`): it agrees when the one-sided p-value of the claimed direction is at most 2.5 %
//! and the compared numbers fall (or rise) with the sweep, disagrees when the other direction's
//! p-value is, and is inconclusive otherwise; without a trend each happens at most 2.5 % of the
//! time, whatever the runs' distribution.
//!
//! The files, one job each: `model.rs` is the claims file as it is written (its types, its
//! [`ClaimsFile::problems`] and [`parse`]); `reading.rs` the conventions of the papers' words;
//! `evaluate.rs` checks every claim and sanity check against the analysed results (`evaluate`),
//! `judge.rs` one cell of a check (its interval and outcome),
//! `trend.rs` the trends; `predict.rs` the predicted shares; `render.rs` turns the checked rows
//! into the markdown tables (`render`); `verdicts.rs` gives the verdicts as data ([`verdicts`])
//! to a program comparing two sets of records. This file holds the only I/O ([`load`]). The
//! split follows the path of a claim:
//! read, judged, shown.

#[cfg(test)]
mod conventions_tests;
mod evaluate;
mod judge;
mod model;
mod predict;
mod reading;
mod render;
#[cfg(test)]
mod tests;
mod trend;
mod verdicts;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub(crate) use evaluate::known_metrics;
pub use model::{
    parse, AxisValue, Check, Claim, ClaimsFile, Comparison, Criterion, Operand, PaperPoint,
    PlotSpec, ReferenceLine, SanityCheck, Stat, Trend,
};
pub use predict::{Prediction, ResponseFunction, SegmentPath, FRAME_BYTES, SEGMENT_BYTES};
pub use reading::{Convention, Reading, ALMOST_SHARE, NO_EFFECT_BAND, SMALLEST_QUALITATIVE_RATIO};
pub(crate) use render::append_table;
pub use render::{SANITY_HEADING, VERDICTS_LINE};
pub use verdicts::{verdicts, JudgedClaim, Verdicts};

/// File name of the claims inside a results folder.
pub const CLAIMS_FILE: &str = "claims.toml";

/// Metric of a check: share of paired repetitions with GoS > 0 against the baseline case.
pub const GOS_POSITIVE_SHARE_METRIC: &str = "gos_positive_share";
/// Metric of a check: gain of splitting of the paired repetitions against the baseline case.
pub const GOS_METRIC: &str = "gos";

/// Why the claims file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ClaimsError {
    /// The claims file exists but could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The claims file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The claims file is not valid TOML of the expected shape (unknown keys included).
    #[error("{path}: not a valid claims file")]
    Parse {
        /// The claims file.
        path: PathBuf,
        /// Where and why parsing failed.
        #[source]
        source: toml::de::Error,
    },
}

/// Reads and parses `dir/claims.toml`; `None` when the folder has none (the file is optional).
pub fn load(dir: &Path) -> Result<Option<ClaimsFile>, ClaimsError> {
    let path = dir.join(CLAIMS_FILE);
    let source = match fs::read_to_string(&path) {
        Ok(source) => source,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ClaimsError::Read { path, source }),
    };
    parse(&source)
        .map(Some)
        .map_err(|source| ClaimsError::Parse { path, source })
}
