//! A concurrency check's comparison: does measuring N topologies at once change the results?
//!
//! `midway lab run --check-concurrency` runs the same points (same seeds) twice, once with the baseline's jobs and once with N. Each
//! cell (experiment, case, sweep value) is compared by the median of the per-repetition ratios of
//! throughput (a repetition has the same seed in both runs, so each pair shares its emulated
//! conditions), with the exact order-statistic interval of that median
//! ([`midway_report::interval`]: 93.8 % with 5 pairs, 95 % or more from 6). A cell "differs" when
//! the interval excludes 1; otherwise no difference was found at this number of repetitions,
//! which is not proof of none: the interval's width says how large a difference could still hide.
//! Pure: records in, rows out. The lab prints these rows after a check; a report reads them from
//! the check's committed records to mark the verdicts that rest on a cell the load moved
//! ([`crate::load_checks`]).

use std::collections::BTreeMap;

use crate::analysis::value_text;
use crate::interval::{self, Interval};
use crate::stats;
use crate::RunRecord;

/// (experiment, case, sweep value as the report's tables write it, "-" without a sweep) of a
/// cell.
pub type CellKey = (String, String, String);

/// One cell of the comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct ConcurrencyRow {
    /// The cell.
    pub key: CellKey,
    /// Repetitions measured successfully in both runs.
    pub pairs: usize,
    /// Median throughput (Mbit/s) with the baseline's jobs.
    pub baseline_median: f64,
    /// Median throughput (Mbit/s) with N jobs.
    pub parallel_median: f64,
    /// Median of the per-repetition ratios `parallel / baseline`.
    pub ratio: f64,
    /// Order-statistic interval of that median; `None` with fewer than two pairs.
    pub interval: Option<Interval>,
}

/// Whether a cell's throughput moved between the two loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConcurrencyVerdict {
    /// Too few paired repetitions for an interval of at least
    /// [`interval::MIN_VERDICT_LEVEL`].
    TooFewRuns,
    /// The interval of the ratio excludes 1.
    Differs,
    /// The interval holds 1 (a difference as large as its width could still hide).
    NoDifferenceFound,
}

impl ConcurrencyVerdict {
    /// The words printed in the table.
    pub fn text(self) -> &'static str {
        match self {
            Self::TooFewRuns => "too few runs",
            Self::Differs => "differs",
            Self::NoDifferenceFound => "no difference found",
        }
    }
}

impl ConcurrencyRow {
    /// [`ConcurrencyVerdict`] of the row's interval.
    pub fn verdict(&self) -> ConcurrencyVerdict {
        match self.interval {
            None => ConcurrencyVerdict::TooFewRuns,
            Some(i) if i.level < interval::MIN_VERDICT_LEVEL => ConcurrencyVerdict::TooFewRuns,
            Some(i) if i.low > 1.0 || i.high < 1.0 => ConcurrencyVerdict::Differs,
            Some(_) => ConcurrencyVerdict::NoDifferenceFound,
        }
    }
}

/// The cell a record belongs to.
pub fn cell_key(record: &RunRecord) -> CellKey {
    let x = record
        .sweep_param
        .as_ref()
        .and_then(|p| record.params.get(p))
        .map(value_text)
        .unwrap_or_else(|| "-".into());
    (record.experiment.clone(), record.case.clone(), x)
}

/// Successful throughputs (Mbit/s) by cell and repetition.
fn by_cell(records: &[RunRecord]) -> BTreeMap<CellKey, BTreeMap<u32, f64>> {
    let mut cells: BTreeMap<CellKey, BTreeMap<u32, f64>> = BTreeMap::new();
    for record in records
        .iter()
        .filter(|r| r.counts() && r.throughput_bps.is_finite())
    {
        cells
            .entry(cell_key(record))
            .or_default()
            .insert(record.repetition, record.throughput_bps / 1e6);
    }
    cells
}

/// Compares the two runs cell by cell, in the order experiment, case, sweep value (numerically
/// where the values are numbers); cells missing from either run, or without a repetition that
/// succeeded in both, are left out.
pub fn compare(baseline: &[RunRecord], parallel: &[RunRecord]) -> Vec<ConcurrencyRow> {
    let parallel = by_cell(parallel);
    let mut rows: Vec<ConcurrencyRow> = by_cell(baseline)
        .into_iter()
        .filter_map(|(key, serial_runs)| {
            let parallel_runs = parallel.get(&key)?;
            let pairs: Vec<(f64, f64)> = serial_runs
                .iter()
                .filter_map(|(rep, serial)| parallel_runs.get(rep).map(|p| (*p, *serial)))
                .collect();
            let parallel_values: Vec<f64> = pairs.iter().map(|(p, _)| *p).collect();
            let baseline_values: Vec<f64> = pairs.iter().map(|(_, s)| *s).collect();
            let ratios = interval::paired_ratios(&pairs);
            Some(ConcurrencyRow {
                pairs: pairs.len(),
                baseline_median: stats::median(&baseline_values)?,
                parallel_median: stats::median(&parallel_values)?,
                ratio: stats::median(&ratios)?,
                interval: interval::median_interval(&ratios).ok(),
                key,
            })
        })
        .collect();
    let number = |x: &str| x.parse::<f64>().unwrap_or(f64::NAN);
    rows.sort_by(|a, b| {
        (&a.key.0, &a.key.1)
            .cmp(&(&b.key.0, &b.key.1))
            .then_with(|| number(&a.key.2).total_cmp(&number(&b.key.2)))
            .then_with(|| a.key.2.cmp(&b.key.2))
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(case: &str, repetition: u32, mbit: f64, ok: bool) -> RunRecord {
        let line = serde_json::json!({
            "scenario": "s", "scenario_file": "s.toml", "commit": "c", "experiment": "e",
            "case": case, "sweep_param": null, "params": {}, "repetition": repetition, "seed": 1,
            "bytes": 1, "seconds": 1.0, "throughput_bps": mbit * 1e6, "retransmits": {},
            "extra": {}, "ok": ok, "error": null, "started_at": "2026-01-01T00:00:00Z"
        });
        serde_json::from_value(line).expect("a valid record")
    }

    #[test]
    fn a_clear_slowdown_differs_and_a_tie_does_not() {
        let baseline: Vec<RunRecord> = (0..5)
            .flat_map(|r| {
                [
                    record("slow", r, 10.0 + r as f64 * 0.1, true),
                    record("same", r, 5.0 + r as f64 * 0.1, true),
                ]
            })
            .collect();
        let parallel: Vec<RunRecord> = (0..5)
            .flat_map(|r| {
                [
                    record("slow", r, 8.0 + r as f64 * 0.1, true),
                    record("same", r, 5.0 + [0.05, -0.05][r as usize % 2], true),
                ]
            })
            .collect();
        let rows = compare(&baseline, &parallel);
        let row = |case: &str| rows.iter().find(|r| r.key.1 == case).expect("row");
        assert_eq!(row("slow").verdict(), ConcurrencyVerdict::Differs);
        assert!((row("slow").ratio - 8.2 / 10.2).abs() < 1e-9);
        assert_eq!(row("same").verdict(), ConcurrencyVerdict::NoDifferenceFound);
        assert_eq!(row("same").pairs, 5);
    }

    #[test]
    fn sweep_values_sort_as_numbers() {
        let at = |x: f64| {
            let mut r = record("a", 0, 1.0, true);
            r.sweep_param = Some("loss".into());
            r.params.insert("loss".into(), serde_json::json!(x));
            r
        };
        let records = vec![at(10.0), at(3.0), at(0.0)];
        let xs: Vec<String> = compare(&records, &records)
            .into_iter()
            .map(|r| r.key.2)
            .collect();
        assert_eq!(xs, ["0.0", "3.0", "10.0"]);
    }

    #[test]
    fn failed_runs_and_unpaired_repetitions_are_left_out() {
        let baseline = vec![
            record("a", 0, 1.0, true),
            record("a", 1, 1.0, false),
            record("a", 2, 1.0, true),
            record("only-baseline", 0, 1.0, true),
        ];
        let parallel = vec![
            record("a", 0, 2.0, true),
            record("a", 1, 2.0, true),
            record("a", 3, 2.0, true),
        ];
        let rows = compare(&baseline, &parallel);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].pairs, 1);
        assert_eq!(rows[0].verdict(), ConcurrencyVerdict::TooFewRuns);
    }
}
