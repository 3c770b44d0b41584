//! How long a plan takes, from what the same points took in the committed records.

use std::collections::BTreeMap;

use midway_report::RunRecord;

use crate::plan::{skeleton_record, Point};

/// Seconds a point takes beyond its transfer (namespaces, emulators, the proxy's start,
/// warm-up transfers, teardown). From the committed records measured at `--jobs 2`: their start
/// times, gaps of more than ten minutes (pauses) left out, give each point 2.3 s more than its
/// transfer in satellite, 4.7 s in umts and 0.7 s in hfc-tuning.
const SETUP_SECONDS: f64 = 3.0;

/// A plan's estimated duration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Estimate {
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Points no committed record measured, each counted at the mean of the others.
    pub unknown: usize,
}

/// The experiment, case and parameters of a record or a point: the same for every repetition.
fn cell_key(record: &RunRecord) -> (String, String, String) {
    (
        record.experiment.clone(),
        record.case.clone(),
        serde_json::to_string(&record.params).unwrap_or_default(),
    )
}

/// The wall-clock time of `points` run `jobs` at once (or fewer, where an experiment's
/// `max_jobs` says so): each point takes the median transfer time of the committed records of
/// its cell plus [`SETUP_SECONDS`].
pub(crate) fn estimate(points: &[Point], committed: &[RunRecord], jobs: usize) -> Estimate {
    let mut seconds_by_cell: BTreeMap<(String, String, String), Vec<f64>> = BTreeMap::new();
    for record in committed.iter().filter(|r| r.ok && r.seconds.is_finite()) {
        seconds_by_cell
            .entry(cell_key(record))
            .or_default()
            .push(record.seconds);
    }
    let costs: Vec<(Option<f64>, usize)> = points
        .iter()
        .map(|point| {
            let key = cell_key(&skeleton_record(point, "", "", ""));
            let transfer = seconds_by_cell
                .get(&key)
                .and_then(|s| midway_report::stats::median(s));
            let parallel = point.max_jobs.map_or(jobs, |m| m.min(jobs)).max(1);
            (transfer.map(|t| t + SETUP_SECONDS), parallel)
        })
        .collect();
    let known: Vec<f64> = costs.iter().filter_map(|(c, _)| *c).collect();
    let fallback = midway_report::stats::mean(&known).unwrap_or(SETUP_SECONDS);
    Estimate {
        seconds: costs
            .iter()
            .map(|(cost, parallel)| cost.unwrap_or(fallback) / *parallel as f64)
            .sum(),
        unknown: costs.iter().filter(|(c, _)| c.is_none()).count(),
    }
}

/// "47 min" or "95 s".
pub(crate) fn duration_text(seconds: f64) -> String {
    if seconds < 120.0 {
        format!("{seconds:.0} s")
    } else {
        format!("{:.0} min", seconds / 60.0)
    }
}
