//! Lab results: the record every lab run appends (one JSON line per measurement) and the report
//! built from a folder of such records (markdown tables, PNG and SVG plots).
//!
//! Experiments write data; plotting is a separate step, so a report can be rebuilt from the
//! JSON lines alone (`midway lab report DIR`).
//!
//! Bulk experiments report throughput; web experiments (records with `extra.page_load_seconds`)
//! report page load time. An optional `claims.toml` beside the results adds the "paper vs lab"
//! table and annotations of the plots (format in [`claims`]).
//!
//! Layers: `record` (the line format, [`RunRecord`]), [`stats`] (pure numbers), [`interval`]
//! (confidence intervals of those numbers), `analysis`
//! (records grouped into experiments, points and cases, no I/O), [`claims`] (the claims file, its
//! checks and plot annotations, no I/O but [`claims::load`]), `markdown` (text of the report, no
//! I/O), `plot` (plotters figures) and [`write_report`], which reads and writes the files. Only
//! `stats`, `interval` and `claims` are public modules; the rest is reached through the items
//! re-exported here.

#![forbid(unsafe_code)]

mod analysis;
pub mod claims;
pub mod concurrency;
pub mod interval;
pub mod load_checks;
mod markdown;
mod plot;
mod record;
pub mod stats;
pub mod summary;
pub mod trend;

use std::fs;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

pub use plot::{PngError, SvgError};
pub use record::{
    LeftOut, RunLoad, RunRecord, RESULTS_FILE, TREE_CLEAN, TREE_DIRTY_PREFIX, WARMUP_CACHED_METRIC,
};

/// File name of the markdown report inside a run's output folder.
pub const REPORT_FILE: &str = "report.md";
/// Folder, inside a run's output folder, that receives the plots.
pub const PLOTS_DIR: &str = "plots";
/// Case that gains of splitting are computed against unless told otherwise.
pub const DEFAULT_BASELINE_CASE: &str = "direct";

/// How to write a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportOptions {
    /// Title of the report; default `Lab report: <scenario>`.
    pub title: Option<String>,
    /// Case the gain of splitting is computed against (default "direct").
    pub baseline_case: String,
}

impl Default for ReportOptions {
    fn default() -> Self {
        Self {
            title: None,
            baseline_case: DEFAULT_BASELINE_CASE.to_string(),
        }
    }
}

/// What [`write_report`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportSummary {
    /// Path of the markdown report written (`DIR/report.md`).
    pub report_path: PathBuf,
    /// Every plot file written (PNG and SVG of each experiment that has successful runs, then of
    /// its extra plots).
    pub plots: Vec<PathBuf>,
    /// Records read, failed ones included.
    pub records: usize,
    /// Records with `ok = false`.
    pub failed_records: usize,
    /// What the claims file's `[[plots]]` asked for and the results lack (also in the report).
    pub warnings: Vec<String>,
}

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The results file does not exist.
    #[error(
        "no results file at {path} (a lab run writes it; was the run started in this folder?)"
    )]
    NoResultsFile {
        /// Where the results file was looked for.
        path: PathBuf,
    },
    /// The results file exists but could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The results file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A line of the results file is not a [`RunRecord`].
    #[error("{path}:{line}: not a valid run record")]
    BadLine {
        /// The results file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Why the line does not parse as a record.
        #[source]
        source: serde_json::Error,
    },
    /// The results file holds no record (only blank lines, or nothing).
    #[error("{path} holds no run records")]
    NoRecords {
        /// The results file.
        path: PathBuf,
    },
    /// The records were measured under different load policies (different `--jobs`): their
    /// numbers are not comparable, so no report mixes them.
    #[error(
        "{path} mixes runs measured under different load policies ({policies}); report each \
         policy from its own folder"
    )]
    MixedLoad {
        /// The results file.
        path: PathBuf,
        /// The policies found, e.g. "--jobs 1 (40 records), --jobs 2 (100 records)".
        policies: String,
    },
    /// The report or the plots folder could not be written.
    #[error("cannot write {path}")]
    Write {
        /// The report file or plots folder being written.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The font for plot text could not be read.
    #[error(
        "cannot read the plot font {path}: install the Debian package fonts-dejavu-core \
         or point {font_env} at a TTF file",
        font_env = plot::FONT_ENV
    )]
    FontMissing {
        /// The font file that was tried.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The claims file beside the results could not be read or parsed.
    #[error(transparent)]
    Claims(#[from] claims::ClaimsError),
    /// The load checks file beside the results, or a check's records, could not be read, or
    /// the records contradict the file.
    #[error(transparent)]
    LoadChecks(#[from] Box<load_checks::LoadChecksError>),
    /// The font file was read but plotters cannot use it.
    #[error("{path} is not a TrueType/OpenType font plotters can use")]
    FontInvalid {
        /// The font file.
        path: PathBuf,
    },
    /// Drawing a PNG plot failed.
    #[error("cannot draw the PNG plot {path}")]
    PlotPng {
        /// The PNG file being drawn.
        path: PathBuf,
        /// The error of the PNG backend.
        #[source]
        source: PngError,
    },
    /// Drawing an SVG plot failed.
    #[error("cannot draw the SVG plot {path}")]
    PlotSvg {
        /// The SVG file being drawn.
        path: PathBuf,
        /// The error of the SVG backend.
        #[source]
        source: SvgError,
    },
}

/// Reads every record of a `results.jsonl` file. Blank lines are skipped; any other line that is
/// not a [`RunRecord`] is an error naming its (1-based) line number.
pub fn read_records(path: &Path) -> Result<Vec<RunRecord>, ReportError> {
    let file = fs::File::open(path).map_err(|source| {
        if source.kind() == io::ErrorKind::NotFound {
            ReportError::NoResultsFile {
                path: path.to_path_buf(),
            }
        } else {
            ReportError::Read {
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    let mut records = Vec::new();
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|source| ReportError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(&line).map_err(|source| ReportError::BadLine {
            path: path.to_path_buf(),
            line: index + 1,
            source,
        })?;
        records.push(record);
    }
    Ok(records)
}

/// The load policies of `records` when there is more than one ("--jobs 1 (40 records), --jobs 2
/// (100 records)"), or when one experiment's runs had different limits of their own
/// (`max_jobs`); records that do not say are not counted. A report refuses to mix them
/// ([`ReportError::MixedLoad`]), and the lab refuses to resume a run under another policy.
pub fn mixed_load_policies(records: &[RunRecord]) -> Option<String> {
    use std::collections::BTreeMap;
    let mut jobs: BTreeMap<u32, usize> = BTreeMap::new();
    let mut limits: BTreeMap<&str, BTreeMap<Option<u32>, usize>> = BTreeMap::new();
    for record in records {
        let Some(load) = record.load.as_ref() else {
            continue;
        };
        *jobs.entry(load.jobs).or_default() += 1;
        *limits
            .entry(record.experiment.as_str())
            .or_default()
            .entry(load.max_jobs)
            .or_default() += 1;
    }
    let mut mixed: Vec<String> = Vec::new();
    if jobs.len() > 1 {
        mixed.extend(
            jobs.iter()
                .map(|(jobs, n)| format!("--jobs {jobs} ({n} records)")),
        );
    }
    for (experiment, by_limit) in limits.iter().filter(|(_, l)| l.len() > 1) {
        mixed.extend(by_limit.iter().map(|(limit, n)| match limit {
            Some(limit) => format!("`{experiment}` at most {limit} at once ({n} records)"),
            None => format!("`{experiment}` without a limit of its own ({n} records)"),
        }));
    }
    (!mixed.is_empty()).then(|| mixed.join(", "))
}

/// Read `DIR/results.jsonl`, write `DIR/report.md` and `DIR/plots/<experiment>.{png,svg}`.
///
/// When DIR holds a claims file ([`claims::CLAIMS_FILE`]), its `[[plots]]` entries add reference
/// lines to the main plots and extra plots `DIR/plots/<experiment>-<n>.{png,svg}`, and its claims
/// become the "paper vs lab" table at the end; what an entry names that the results lack is a
/// warning line in the report (and in [`ReportSummary::warnings`]).
///
/// Plots are drawn for every experiment with at least one successful run; the report is written
/// last, so an existing report is only replaced once every plot it links to exists.
pub fn write_report(dir: &Path, opts: &ReportOptions) -> Result<ReportSummary, ReportError> {
    let results_path = dir.join(RESULTS_FILE);
    let records = read_records(&results_path)?;
    if records.is_empty() {
        return Err(ReportError::NoRecords { path: results_path });
    }
    if let Some(policies) = mixed_load_policies(&records) {
        return Err(ReportError::MixedLoad {
            path: results_path,
            policies,
        });
    }
    let analysis = analysis::analyse(&records, &opts.baseline_case);
    let claims = claims::load(dir)?;
    let specs = claims.as_ref().map(|c| c.plots.as_slice()).unwrap_or(&[]);
    let plan = plot::plan(&analysis.experiments, specs);

    let plots_dir = dir.join(PLOTS_DIR);
    let mut plot_links = Vec::with_capacity(analysis.experiments.len());
    let mut plots = Vec::new();
    let mut draw =
        |stem: &str, figure: &plot::Figure| -> Result<markdown::PlotLinks, ReportError> {
            fs::create_dir_all(&plots_dir).map_err(|source| ReportError::Write {
                path: plots_dir.clone(),
                source,
            })?;
            let png = plots_dir.join(format!("{stem}.png"));
            let svg = plots_dir.join(format!("{stem}.svg"));
            plot::draw_figure_png(figure, &png)?;
            plot::draw_figure_svg(figure, &svg)?;
            plots.push(png);
            plots.push(svg);
            Ok(markdown::PlotLinks {
                png: format!("{PLOTS_DIR}/{stem}.png"),
                svg: format!("{PLOTS_DIR}/{stem}.svg"),
            })
        };
    for planned in &plan.experiments {
        let main = match &planned.main {
            Some((stem, figure)) => Some(draw(stem, figure)?),
            None => None,
        };
        let mut extra = Vec::with_capacity(planned.extra.len());
        for (stem, figure) in &planned.extra {
            extra.push(markdown::ExtraPlot {
                title: figure.title.clone(),
                links: draw(stem, figure)?,
            });
        }
        plot_links.push(markdown::ExperimentPlots { main, extra });
    }

    let load = load_checks::load(dir)
        .map_err(Box::new)?
        .map(|checks| load_checks::sensitivity(checks, &records));
    let mut text = markdown::render_with(&analysis, opts, &plot_links, &plan.warnings);
    text = claims::append_table(claims.as_ref(), &analysis, load.as_ref(), text);
    let report_path = dir.join(REPORT_FILE);
    fs::write(&report_path, text).map_err(|source| ReportError::Write {
        path: report_path.clone(),
        source,
    })?;
    Ok(ReportSummary {
        report_path,
        plots,
        records: analysis.records,
        failed_records: analysis.failed.len(),
        warnings: plan.warnings,
    })
}
