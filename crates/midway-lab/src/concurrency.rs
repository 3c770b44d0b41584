//! `--check-concurrency`: does measuring N topologies at once change the results? The same
//! points (same seeds) run with the baseline's jobs and with N, and each cell's median paired
//! ratio and its interval are compared; the comparison itself is midway-report's
//! ([`midway_report::concurrency`]), which a report also reads from a check's committed records
//! to mark the verdicts resting on a cell the load moved.

pub(crate) use midway_report::concurrency::{compare, ConcurrencyVerdict};
