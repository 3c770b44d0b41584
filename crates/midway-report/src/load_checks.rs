//! Load sensitivity: which of a report's cells a concurrency check found moved by the load, and
//! which verdicts rest on them.
//!
//! A results folder may name the concurrency checks that compared its cells at two loads, in
//! [`LOAD_CHECKS_FILE`] beside its records:
//!
//! ```toml
//! [[checks]]
//! records = "concurrency-check"   # what `midway lab run --check-concurrency --out` wrote:
//!                                 #   jobs-2/ and jobs-16/ with their results.jsonl
//! baseline_jobs = 2               # --baseline-jobs: the load the check found clean
//! jobs = 16                       # --jobs: the load it compared with it
//! ```
//!
//! Each check's records are compared cell by cell (experiment, case, sweep value) as the lab
//! compares them after a check ([`crate::concurrency`]: the median of the per-seed throughput
//! ratios with its exact order-statistic interval); a cell **differs** when that interval
//! excludes 1. The records must say they ran at the loads the file names (`load.jobs`, or an
//! experiment's lower `max_jobs`), or the report is refused.
//!
//! The report then lists every differing cell in a section "Load sensitivity", with the
//! check's numbers and the claims and targets that read it, and marks the verdict of each
//! judged claim or target reading such a cell as load-sensitive, beside the verdict (which
//! stays as computed), when this report's runs of the cell were measured at more topologies at
//! once than the check's clean load (or at a load the records do not state). Cells the check
//! found unmoved mark nothing, and neither do cells measured here at the clean load or below.
//! The file and the records are the only I/O ([`load`]); the rest is pure.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::concurrency::{self, CellKey, ConcurrencyRow, ConcurrencyVerdict};
use crate::markdown::{cell, number};
use crate::{read_records, RunRecord};

/// File name, inside a results folder, of the concurrency checks of its cells.
pub const LOAD_CHECKS_FILE: &str = "load-checks.toml";

/// The file as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadChecksFile {
    /// The checks, each a folder of records at two loads.
    #[serde(default)]
    pub checks: Vec<CheckSpec>,
}

/// One concurrency check as the file names it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSpec {
    /// The check's folder, relative to the results folder: it holds `jobs-<baseline_jobs>/` and
    /// `jobs-<jobs>/`, each with a `results.jsonl`.
    pub records: String,
    /// The load the check compares against, found clean (`--baseline-jobs`).
    pub baseline_jobs: u32,
    /// The other load (`--jobs`).
    pub jobs: u32,
}

/// A check with its cells compared.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadCheck {
    /// The check as the file names it.
    pub spec: CheckSpec,
    /// Every cell measured at both loads ([`concurrency::compare`]).
    pub rows: Vec<ConcurrencyRow>,
}

/// Why the load checks could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadChecksError {
    /// The file exists but could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// The file is not valid TOML of the expected shape.
    #[error("{path}: not a valid load checks file")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why parsing failed.
        #[source]
        source: toml::de::Error,
    },
    /// A check's records could not be read.
    #[error("{path}: the records of a load check")]
    Records {
        /// The check's results file.
        path: PathBuf,
        /// Why they could not be read.
        #[source]
        source: Box<crate::ReportError>,
    },
    /// A check's records were not measured at the load the file names.
    #[error("{path}: {why}")]
    WrongLoad {
        /// The check's results file.
        path: PathBuf,
        /// Which records ran at which load.
        why: String,
    },
}

/// Checks that every record ran at `jobs` topologies at once; the reason when one did not.
pub fn check_loads(records: &[RunRecord], jobs: u32) -> Result<(), String> {
    let wrong: Vec<String> = records
        .iter()
        .filter_map(|r| match &r.load {
            Some(load) if load.effective_jobs() == jobs => None,
            Some(load) => Some(format!(
                "`{}` {} repetition {} ran at {} jobs",
                r.experiment,
                r.case,
                r.repetition,
                load.effective_jobs()
            )),
            None => Some(format!(
                "`{}` {} repetition {} does not record its load",
                r.experiment, r.case, r.repetition
            )),
        })
        .collect();
    match wrong.first() {
        None => Ok(()),
        Some(first) => Err(format!(
            "the file names {jobs} jobs, but {first} ({} such records)",
            wrong.len()
        )),
    }
}

/// Reads `dir/load-checks.toml` and compares each check's records; `None` when the folder has
/// no such file.
pub fn load(dir: &Path) -> Result<Option<Vec<LoadCheck>>, LoadChecksError> {
    let path = dir.join(LOAD_CHECKS_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(LoadChecksError::Read { path, source }),
    };
    let file: LoadChecksFile =
        toml::from_str(&text).map_err(|source| LoadChecksError::Parse { path, source })?;
    let mut checks = Vec::with_capacity(file.checks.len());
    for spec in file.checks {
        let mut sides = Vec::with_capacity(2);
        for jobs in [spec.baseline_jobs, spec.jobs] {
            let results = dir
                .join(&spec.records)
                .join(format!("jobs-{jobs}"))
                .join(crate::RESULTS_FILE);
            let records = read_records(&results).map_err(|source| LoadChecksError::Records {
                path: results.clone(),
                source: Box::new(source),
            })?;
            check_loads(&records, jobs)
                .map_err(|why| LoadChecksError::WrongLoad { path: results, why })?;
            sides.push(records);
        }
        let rows = concurrency::compare(&sides[0], &sides[1]);
        checks.push(LoadCheck { spec, rows });
    }
    Ok(Some(checks))
}

/// At what load this report's runs of a cell were measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MeasuredAt {
    /// The report has no run of the cell.
    NotInReport,
    /// Its records do not state their load.
    Unstated,
    /// At most this many topologies at once ([`crate::RunLoad::effective_jobs`]).
    Jobs(u32),
}

/// The load of every cell of the report's records (the highest, were a cell's records to
/// differ; a report refuses mixed loads, so they do not).
fn report_loads(records: &[RunRecord]) -> BTreeMap<CellKey, MeasuredAt> {
    let mut loads: BTreeMap<CellKey, MeasuredAt> = BTreeMap::new();
    for record in records {
        let at = record.load.as_ref().map_or(MeasuredAt::Unstated, |l| {
            MeasuredAt::Jobs(l.effective_jobs())
        });
        let entry = loads
            .entry(concurrency::cell_key(record))
            .or_insert(MeasuredAt::NotInReport);
        *entry = match (*entry, at) {
            (MeasuredAt::Unstated, _) | (_, MeasuredAt::Unstated) => MeasuredAt::Unstated,
            (MeasuredAt::Jobs(a), MeasuredAt::Jobs(b)) => MeasuredAt::Jobs(a.max(b)),
            (_, at) => at,
        };
    }
    loads
}

/// A cell a check found moved, and whether the verdicts reading it here are marked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sensitive {
    /// The check's folder and loads.
    pub spec: CheckSpec,
    /// The check's numbers of the cell.
    pub row: ConcurrencyRow,
    /// At what load this report measured the cell.
    pub measured_at: MeasuredAt,
}

impl Sensitive {
    /// Whether the verdicts reading this cell are marked: the report measured it at more
    /// topologies at once than the check's clean load, or does not say at how many.
    pub(crate) fn marks(&self) -> bool {
        match self.measured_at {
            MeasuredAt::NotInReport => false,
            MeasuredAt::Unstated => true,
            MeasuredAt::Jobs(jobs) => jobs > self.spec.baseline_jobs,
        }
    }

    /// "`e` case @ x".
    pub(crate) fn cell_text(&self) -> String {
        let (experiment, case, x) = &self.row.key;
        if x == "-" {
            format!("`{experiment}` {case}")
        } else {
            format!("`{experiment}` {case} @ {x}")
        }
    }

    fn interval_text(&self) -> String {
        self.row.interval.map_or("no interval".into(), |i| {
            format!("{} {}..{}", i.label(), number(i.low), number(i.high))
        })
    }

    fn measured_text(&self) -> String {
        match self.measured_at {
            MeasuredAt::NotInReport => "not in this report".into(),
            MeasuredAt::Unstated => "load not recorded".into(),
            MeasuredAt::Jobs(jobs) => format!("{jobs} jobs"),
        }
    }

    /// The mark beside a verdict: the cell and the check's numbers.
    pub(crate) fn mark_text(&self) -> String {
        format!(
            "{}: median {} Mbit/s at {} jobs against {} at {}, median paired ratio {} ({}, {} \
             pairs); measured here at {}",
            self.cell_text(),
            number(self.row.parallel_median),
            self.spec.jobs,
            number(self.row.baseline_median),
            self.spec.baseline_jobs,
            number(self.row.ratio),
            self.interval_text(),
            self.row.pairs,
            self.measured_text()
        )
    }
}

/// What the checks say about a report's cells.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sensitivity {
    /// The checks, with every cell they compared.
    pub checks: Vec<LoadCheck>,
    /// Every cell a check found moved, with the load this report measured it at.
    pub cells: Vec<Sensitive>,
    /// Experiments with cells no check compared that this report measured above the lowest
    /// clean load of the checks (or at a load not recorded), each with those loads: "`e` (16
    /// jobs)".
    pub unchecked: Vec<String>,
}

/// The checks' findings on the cells of `records` (the report's).
pub(crate) fn sensitivity(checks: Vec<LoadCheck>, records: &[RunRecord]) -> Sensitivity {
    let loads = report_loads(records);
    let cells = sensitive(&checks, &loads);
    let clean = checks.iter().map(|c| c.spec.baseline_jobs).min();
    let mut unchecked: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (key, at) in &loads {
        let compared = checks.iter().any(|c| c.rows.iter().any(|r| r.key == *key));
        let above = match at {
            MeasuredAt::Jobs(jobs) => clean.is_some_and(|clean| *jobs > clean),
            MeasuredAt::Unstated => true,
            MeasuredAt::NotInReport => false,
        };
        if !compared && above {
            let text = match at {
                MeasuredAt::Jobs(jobs) => format!("{jobs} jobs"),
                _ => "load not recorded".to_string(),
            };
            let entry = unchecked.entry(key.0.as_str()).or_default();
            if !entry.contains(&text) {
                entry.push(text);
            }
        }
    }
    let unchecked = unchecked
        .into_iter()
        .map(|(experiment, loads)| format!("`{experiment}` ({})", loads.join(", ")))
        .collect();
    Sensitivity {
        checks,
        cells,
        unchecked,
    }
}

/// Every cell a check found moved, with the load this report measured it at.
fn sensitive(checks: &[LoadCheck], loads: &BTreeMap<CellKey, MeasuredAt>) -> Vec<Sensitive> {
    checks
        .iter()
        .flat_map(|check| {
            check
                .rows
                .iter()
                .filter(|row| row.verdict() == ConcurrencyVerdict::Differs)
                .map(|row| Sensitive {
                    spec: check.spec.clone(),
                    row: row.clone(),
                    measured_at: loads
                        .get(&row.key)
                        .copied()
                        .unwrap_or(MeasuredAt::NotInReport),
                })
        })
        .collect()
}

/// The word beside a marked verdict.
pub(crate) const MARK: &str = "load-sensitive";

/// Heading of the section.
pub const LOAD_SENSITIVITY_HEADING: &str = "## Load sensitivity";

/// The section: each check, then every cell it found moved with its numbers, this report's load
/// of it and who reads it (`readers` gives "Fig. 5 (claim, agrees)" lines for a cell), then the
/// experiments no check compared.
pub(crate) fn render(
    sensitivity: &Sensitivity,
    readers: &dyn Fn(&CellKey) -> Vec<String>,
) -> String {
    let (checks, sensitive) = (&sensitivity.checks, &sensitivity.cells);
    let mut text = format!("\n{LOAD_SENSITIVITY_HEADING}\n\n");
    let _ = writeln!(
        text,
        "Concurrency checks measured cells of this report at two loads (topologies measured at \
         once), the same seeds at both. A cell **differs** when the exact order-statistic \
         interval of its median paired throughput ratio excludes 1. Where this report measured \
         such a cell at more topologies at once than the check's clean load, every judged \
         verdict reading it is marked \"{MARK}\" with the check's numbers (the verdict itself \
         is computed as without the check). Cells a check found unmoved mark nothing, and \
         neither do cells measured here at the clean load: an interval holding 1 can still \
         hide a difference as large as it is wide.\n"
    );
    for check in checks {
        let differing = check
            .rows
            .iter()
            .filter(|r| r.verdict() == ConcurrencyVerdict::Differs)
            .count();
        let _ = writeln!(
            text,
            "- `{}`: {} jobs against {} jobs, {differing} of {} cells differ.",
            check.spec.records,
            check.spec.jobs,
            check.spec.baseline_jobs,
            check.rows.len()
        );
    }
    if !sensitivity.unchecked.is_empty() {
        let _ = writeln!(
            text,
            "- Compared by no check, and measured here at more topologies at once than a \
             check's clean load: cells of {}. Nothing measured them at another load, so their \
             verdicts carry no mark either way.",
            sensitivity.unchecked.join(", ")
        );
    }
    if sensitive.is_empty() {
        text.push_str("\nNo cell differs.\n");
        return text;
    }
    let _ = writeln!(
        text,
        "\n| check | cell | pairs | median at the clean load, Mbit/s | median at the other, \
         Mbit/s | median paired ratio | interval | measured here at | verdicts marked | read by |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|---|---|---|---|");
    for s in sensitive {
        let readers = readers(&s.row.key);
        let read_by = if readers.is_empty() {
            "no claim reads it".to_string()
        } else {
            readers.join("; ")
        };
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} ({} jobs) | {} ({} jobs) | {} | {} | {} | {} | {} |",
            cell(&s.spec.records),
            cell(&s.cell_text()),
            s.row.pairs,
            number(s.row.baseline_median),
            s.spec.baseline_jobs,
            number(s.row.parallel_median),
            s.spec.jobs,
            number(s.row.ratio),
            s.interval_text(),
            s.measured_text(),
            if s.marks() { "yes" } else { "no" },
            cell(&read_by)
        );
    }
    text
}
