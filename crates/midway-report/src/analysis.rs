//! From records to the numbers of a report, without I/O: records are grouped by experiment, then
//! by point (the full parameter set), then by case; each group gets its throughput quartiles, its
//! gain of splitting against the baseline case and the medians of its other measurements.
//!
//! An experiment whose records carry `extra.page_load_seconds` ([`PAGE_LOAD_METRIC`]) is a web
//! experiment: its primary measurement is the page load time (lower is better), summarised per
//! row in [`CaseRow::page_load_seconds`] and [`CaseRow::page_load_mean`]. The gain of splitting
//! stays computed on throughput, which for a web run is the pages' bytes over their summed load
//! time, so `GoS = T_base / T_case - 1` in load time.
//!
//! The model keeps the raw samples of every group so later reports (percentiles over many runs,
//! "paper says / we measured" tables, segment completion times from `extra`) can be computed from
//! the same grouping instead of re-reading the records.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use crate::record::{LeftOut, RunRecord};
use crate::stats::{self, PositiveShare, Spread};

/// Name of the `extra` measurement that marks a web experiment: the mean page load time of a
/// run, in seconds.
pub(crate) const PAGE_LOAD_METRIC: &str = "page_load_seconds";
/// Name of the throughput as a metric (claims and plots), in Mbit/s.
pub(crate) const THROUGHPUT_METRIC: &str = "throughput";

/// Everything a report states, computed from one results file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Analysis {
    /// Distinct scenario names, in order of first appearance.
    pub scenarios: Vec<String>,
    /// Distinct scenario files, in order of first appearance.
    pub scenario_files: Vec<String>,
    /// Distinct commits, in order of first appearance (more than one means the results mix trees).
    pub commits: Vec<String>,
    /// The source trees the records come from, in order of first appearance.
    pub trees: Vec<SourceTree>,
    /// The load the records were measured under: `--jobs` values and CPU counts seen, and the
    /// 1-minute load averages at the runs' starts (empty for records older than the field).
    pub load_jobs: BTreeSet<u32>,
    pub load_cpus: BTreeSet<u32>,
    /// Experiments measured with a limit of their own (`max_jobs`), and that limit.
    pub load_limits: BTreeMap<String, u32>,
    pub load_averages: Vec<f64>,
    /// Earliest and latest `started_at` (RFC 3339 UTC strings compare in time order).
    pub first_start: Option<String>,
    pub last_start: Option<String>,
    /// Number of records, failed ones included.
    pub records: usize,
    /// Records with `ok = false`, in file order; they are left out of every statistic.
    pub failed: Vec<FailedRun>,
    /// Successful records whose warm-ups left no tcp_metrics entry for the client
    /// ([`LeftOut::NoWarmupEntry`]), in file order; also left out of every statistic.
    pub no_warmup_entry: Vec<FailedRun>,
    /// Experiments in order of first appearance.
    pub experiments: Vec<Experiment>,
}

/// Records from one source tree: a commit and the tree's state as recorded.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SourceTree {
    pub commit: String,
    /// "clean", "dirty:<hash>", or `None` for records older than the tree state.
    pub state: Option<String>,
    pub records: usize,
}

impl SourceTree {
    /// Whether the records are known to come from a tree without uncommitted changes.
    pub(crate) fn is_clean(&self) -> bool {
        self.state.as_deref() == Some(crate::record::TREE_CLEAN)
    }

    /// Whether the records are known to come from a tree with uncommitted changes (the old
    /// `git describe --dirty` suffix counts too).
    pub(crate) fn is_dirty(&self) -> bool {
        self.commit.ends_with("-dirty")
            || self
                .state
                .as_deref()
                .is_some_and(|s| s.starts_with(crate::record::TREE_DIRTY_PREFIX))
    }
}

fn source_trees(records: &[RunRecord]) -> Vec<SourceTree> {
    let mut trees: Vec<SourceTree> = Vec::new();
    for record in records {
        match trees
            .iter_mut()
            .find(|t| t.commit == record.commit && t.state == record.tree)
        {
            Some(tree) => tree.records += 1,
            None => trees.push(SourceTree {
                commit: record.commit.clone(),
                state: record.tree.clone(),
                records: 1,
            }),
        }
    }
    trees
}

/// A run left out of the statistics (it failed, or measured a first connection where the
/// experiment measures a returning client), as listed below the report header.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FailedRun {
    pub experiment: String,
    pub case: String,
    /// The run's parameters except those its experiment's section lists as fixed (`-` when no
    /// other is left): a row names what sets the run apart, not the whole configuration.
    pub params: String,
    pub repetition: u32,
    pub seed: u64,
    /// Why it is left out ([`LeftOut::text`]).
    pub error: String,
}

/// The records left out for a reason `wanted` accepts, in file order.
fn left_out_runs(
    records: &[RunRecord],
    experiments: &[Experiment],
    wanted: fn(&LeftOut) -> bool,
) -> Vec<FailedRun> {
    records
        .iter()
        .filter_map(|r| {
            let reason = r.left_out().filter(wanted)?;
            let fixed = experiments
                .iter()
                .find(|e| e.name == r.experiment)
                .map_or(&[][..], |e| e.fixed_params.as_slice());
            let own: BTreeMap<String, Value> = r
                .params
                .iter()
                .filter(|(key, value)| !fixed.contains(&((*key).clone(), value_text(value))))
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect();
            let params = match params_text(&own) {
                text if text.is_empty() => "-".to_string(),
                text => text,
            };
            Some(FailedRun {
                experiment: r.experiment.clone(),
                case: r.case.clone(),
                params,
                repetition: r.repetition,
                seed: r.seed,
                error: reason.text(),
            })
        })
        .collect()
}

/// One experiment: one plot and one table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Experiment {
    pub name: String,
    /// The swept parameter (x axis), from the first record that names one.
    pub sweep_param: Option<String>,
    /// True when every sweep value is a number (the x axis is then numeric, else categorical).
    pub numeric_sweep: bool,
    /// Parameters with one value in every record of the experiment, as `(name, value)`.
    pub fixed_params: Vec<(String, String)>,
    /// Number of distinct sweep values; 0 or 1 means a single point (no line plot).
    pub sweep_points: usize,
    /// The baseline case name and whether any record of this experiment has it.
    pub baseline_case: String,
    pub baseline_present: bool,
    /// Cases: the baseline first, then in order of first appearance.
    pub cases: Vec<String>,
    /// Endpoint names of the retransmit counters seen (client, server, proxy-local, ...).
    pub endpoints: Vec<String>,
    /// Names of the `extra` measurements seen.
    pub extra_names: Vec<String>,
    /// True when a successful record carries [`PAGE_LOAD_METRIC`]: the table and plot then show
    /// page load time instead of throughput.
    pub web: bool,
    /// Scenario files and commits of this experiment's records (for the "reproduce" line).
    pub scenario_files: Vec<String>,
    pub commits: Vec<String>,
    /// What kind of run the records come from ("full run, 5 runs per point, 1 MB transfers"),
    /// empty when the records do not say.
    pub kind: String,
    /// One row per (variant, sweep value, case), ordered by variant, then sweep value (numeric
    /// ascending when numeric, else first appearance), then case.
    pub rows: Vec<CaseRow>,
}

/// One measurement of one repetition, kept for percentiles and pairing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    pub repetition: u32,
    pub seed: u64,
    pub throughput_mbps: f64,
}

/// All runs of one case at one point that count ([`RunRecord::counts`]: successful, and a
/// returning client's where the experiment warms up).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CaseRow {
    /// The parameters besides the swept one that vary inside the experiment, as `k=v, k=v`
    /// (empty when only the swept parameter varies). Each variant is its own line in the plot.
    pub variant: String,
    /// The swept parameter's value as written in the records ("-" when there is none).
    pub sweep_label: String,
    /// The same value as a number, when it is one.
    pub sweep_number: Option<f64>,
    pub case: String,
    pub is_baseline: bool,
    /// Runs that count, in file order.
    pub samples: Vec<Sample>,
    /// Throughput quartiles in Mbit/s; `None` when no run succeeded.
    pub throughput_mbps: Option<Spread>,
    /// GoS of this case against the baseline, one per repetition measured by both (empty for the
    /// baseline itself).
    pub paired_gains: Vec<f64>,
    /// Median of `paired_gains`.
    pub gos_median_paired: Option<f64>,
    /// GoS of the median throughputs (needs no pairing).
    pub gos_of_medians: Option<f64>,
    /// How many paired gains are > 0.
    pub gos_positive: PositiveShare,
    /// Median retransmitted segments by endpoint name.
    pub retransmits_median: BTreeMap<String, f64>,
    /// Median of each `extra` measurement.
    pub extra_median: BTreeMap<String, f64>,
    /// Finite values of each `extra` measurement over the successful runs, in file order, each
    /// with its run's seed (for pairing with another case at the same point).
    pub extra_samples: BTreeMap<String, Vec<(u64, f64)>>,
    /// Quartiles of [`PAGE_LOAD_METRIC`] in seconds; `None` when no run has it.
    pub page_load_seconds: Option<Spread>,
    /// Mean of [`PAGE_LOAD_METRIC`] over the runs, in seconds.
    pub page_load_mean: Option<f64>,
}

impl CaseRow {
    /// The values of a metric over this row's successful runs: [`THROUGHPUT_METRIC`] (Mbit/s) or
    /// the name of an `extra` measurement (empty when no run has it).
    pub(crate) fn metric_values(&self, metric: &str) -> Vec<f64> {
        self.metric_samples(metric)
            .into_iter()
            .map(|(_, value)| value)
            .collect()
    }

    /// [`CaseRow::metric_values`] with each run's seed.
    pub(crate) fn metric_samples(&self, metric: &str) -> Vec<(u64, f64)> {
        if metric == THROUGHPUT_METRIC {
            self.samples
                .iter()
                .map(|s| (s.seed, s.throughput_mbps))
                .collect()
        } else {
            self.extra_samples.get(metric).cloned().unwrap_or_default()
        }
    }

    /// Quartiles of [`CaseRow::metric_values`].
    pub(crate) fn metric_spread(&self, metric: &str) -> Option<Spread> {
        stats::spread(&self.metric_values(metric))
    }
}

/// Mbit/s from bit/s.
const BITS_PER_MEGABIT: f64 = 1e6;

/// Groups and summarises `records`; GoS is computed against `baseline_case`.
pub(crate) fn analyse(records: &[RunRecord], baseline_case: &str) -> Analysis {
    let mut experiment_order: Vec<&str> = Vec::new();
    let mut by_experiment: HashMap<&str, Vec<&RunRecord>> = HashMap::new();
    for record in records {
        let entry = by_experiment
            .entry(record.experiment.as_str())
            .or_insert_with(|| {
                experiment_order.push(record.experiment.as_str());
                Vec::new()
            });
        entry.push(record);
    }

    let experiments: Vec<Experiment> = experiment_order
        .iter()
        .map(|name| analyse_experiment(name, &by_experiment[name], baseline_case))
        .collect();
    let failed = left_out_runs(records, &experiments, |why| {
        matches!(why, LeftOut::Failed(_))
    });
    let no_warmup_entry =
        left_out_runs(records, &experiments, |why| *why == LeftOut::NoWarmupEntry);

    Analysis {
        scenarios: distinct(records.iter().map(|r| r.scenario.as_str())),
        scenario_files: distinct(records.iter().map(|r| r.scenario_file.as_str())),
        commits: distinct(records.iter().map(|r| r.commit.as_str())),
        trees: source_trees(records),
        load_jobs: records
            .iter()
            .filter_map(|r| r.load.as_ref())
            .map(|l| l.jobs)
            .collect(),
        load_cpus: records
            .iter()
            .filter_map(|r| r.load.as_ref())
            .map(|l| l.cpus)
            .collect(),
        load_limits: records
            .iter()
            .filter_map(|r| Some((r.experiment.clone(), r.load.as_ref()?.max_jobs?)))
            .collect(),
        load_averages: records
            .iter()
            .filter_map(|r| r.load.as_ref()?.loadavg_1m)
            .collect(),
        first_start: records.iter().map(|r| &r.started_at).min().cloned(),
        last_start: records.iter().map(|r| &r.started_at).max().cloned(),
        records: records.len(),
        failed,
        no_warmup_entry,
        experiments,
    }
}

/// A point of an experiment: all records with the same parameters.
struct PointKey {
    variant: String,
    sweep_label: String,
    sweep_number: Option<f64>,
}

fn analyse_experiment(name: &str, records: &[&RunRecord], baseline_case: &str) -> Experiment {
    let sweep_param = records.iter().find_map(|r| r.sweep_param.clone());

    let mut cases = distinct(records.iter().map(|r| r.case.as_str()));
    let baseline_present = cases.iter().any(|c| c == baseline_case);
    if baseline_present {
        cases.retain(|c| c != baseline_case);
        cases.insert(0, baseline_case.to_string());
    }

    // Parameters other than the swept one whose value differs between records: they split the
    // experiment into variants (e.g. a size sweep at three remote RTTs).
    let mut values_by_key: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let all_keys: BTreeSet<&str> = records
        .iter()
        .flat_map(|r| r.params.keys().map(String::as_str))
        .collect();
    for record in records {
        for key in &all_keys {
            let text = record
                .params
                .get(*key)
                .map(value_text)
                .unwrap_or_else(|| "-".to_string());
            values_by_key.entry(key).or_default().insert(text);
        }
    }
    let varying: Vec<&str> = values_by_key
        .iter()
        .filter(|(key, values)| Some(**key) != sweep_param.as_deref() && values.len() > 1)
        .map(|(key, _)| *key)
        .collect();

    let fixed_params: Vec<(String, String)> = values_by_key
        .iter()
        .filter(|(key, values)| Some(**key) != sweep_param.as_deref() && values.len() == 1)
        .filter_map(|(key, values)| Some((key.to_string(), values.first()?.clone())))
        .collect();

    let point_of = |record: &RunRecord| -> PointKey {
        let variant = varying
            .iter()
            .map(|key| {
                let text = record
                    .params
                    .get(*key)
                    .map(value_text)
                    .unwrap_or_else(|| "-".to_string());
                format!("{key}={text}")
            })
            .collect::<Vec<_>>()
            .join(", ");
        let sweep_value = sweep_param.as_ref().and_then(|p| record.params.get(p));
        PointKey {
            variant,
            sweep_label: sweep_value.map(value_text).unwrap_or_else(|| "-".into()),
            sweep_number: sweep_value.and_then(Value::as_f64),
        }
    };

    // Group by (variant, sweep value, case), keeping first-appearance order of each level.
    let mut variant_order: Vec<String> = Vec::new();
    let mut sweep_order: Vec<(String, Option<f64>)> = Vec::new();
    let mut groups: HashMap<(String, String, String), Vec<&RunRecord>> = HashMap::new();
    for record in records {
        let point = point_of(record);
        if !variant_order.contains(&point.variant) {
            variant_order.push(point.variant.clone());
        }
        if !sweep_order.iter().any(|(l, _)| *l == point.sweep_label) {
            sweep_order.push((point.sweep_label.clone(), point.sweep_number));
        }
        groups
            .entry((point.variant, point.sweep_label, record.case.clone()))
            .or_default()
            .push(record);
    }
    let numeric_sweep = sweep_param.is_some() && sweep_order.iter().all(|(_, n)| n.is_some());
    if numeric_sweep {
        sweep_order.sort_by(|a, b| a.1.unwrap_or(0.0).total_cmp(&b.1.unwrap_or(0.0)));
    }

    let mut rows = Vec::new();
    for variant in &variant_order {
        for (sweep_label, sweep_number) in &sweep_order {
            let baseline_by_rep = groups
                .get(&(
                    variant.clone(),
                    sweep_label.clone(),
                    baseline_case.to_string(),
                ))
                .map(|group| throughput_by_repetition(group));
            for case in &cases {
                let Some(group) = groups.get(&(variant.clone(), sweep_label.clone(), case.clone()))
                else {
                    continue;
                };
                rows.push(case_row(
                    variant,
                    sweep_label,
                    *sweep_number,
                    case,
                    case == baseline_case,
                    group,
                    baseline_by_rep.as_ref(),
                ));
            }
        }
    }

    let mut endpoints = BTreeSet::new();
    let mut extra_names = BTreeSet::new();
    for record in records.iter().filter(|r| r.counts()) {
        endpoints.extend(record.retransmits.keys().cloned());
        extra_names.extend(record.extra.keys().cloned());
    }

    let web = extra_names.contains(PAGE_LOAD_METRIC);
    let kind = run_kind(records, &rows, &fixed_params);
    Experiment {
        name: name.to_string(),
        sweep_param,
        numeric_sweep,
        fixed_params,
        sweep_points: sweep_order.len(),
        baseline_case: baseline_case.to_string(),
        baseline_present,
        cases,
        endpoints: endpoints.into_iter().collect(),
        extra_names: extra_names.into_iter().collect(),
        web,
        scenario_files: distinct(records.iter().map(|r| r.scenario_file.as_str())),
        commits: distinct(records.iter().map(|r| r.commit.as_str())),
        kind,
        rows,
    }
}

/// "full run, 5 runs per point, 1 MB transfers": what kind of run an experiment's records come
/// from, for plot titles (a quick form's numbers must never pass for the full run's).
fn run_kind(records: &[&RunRecord], rows: &[CaseRow], fixed: &[(String, String)]) -> String {
    let mut parts = Vec::new();
    let quick: BTreeSet<Option<bool>> = records.iter().map(|r| r.quick).collect();
    match quick.into_iter().collect::<Vec<_>>().as_slice() {
        [Some(true)] => parts.push("quick form".to_string()),
        [Some(false)] => parts.push("full run".to_string()),
        [None] => {}
        _ => parts.push("quick and full runs mixed".to_string()),
    }
    let runs: BTreeSet<usize> = rows.iter().map(|r| r.samples.len()).collect();
    match (runs.first(), runs.last()) {
        (Some(1), Some(1)) => parts.push("1 run per point".to_string()),
        (Some(low), Some(high)) if low == high => parts.push(format!("{low} runs per point")),
        (Some(low), Some(high)) => parts.push(format!("{low}-{high} runs per point")),
        _ => {}
    }
    for (name, value) in fixed {
        let Ok(number) = value.parse::<f64>() else {
            continue;
        };
        match name.as_str() {
            "bytes" => parts.push(format!("{} transfers", bytes_text(number))),
            "duration_s" => parts.push(format!("{number} s transfers")),
            _ => {}
        }
    }
    parts.join(", ")
}

/// "1 MB", "3 MB", "300 kB", "512 B" (decimal units, as the papers size their transfers).
fn bytes_text(bytes: f64) -> String {
    if bytes >= 1e6 {
        format!("{} MB", bytes / 1e6)
    } else if bytes >= 1e3 {
        format!("{} kB", bytes / 1e3)
    } else {
        format!("{bytes} B")
    }
}

/// Throughput (Mbit/s) of each successful repetition. A repetition recorded twice (a resumed run
/// that redid it) counts with its last record.
fn throughput_by_repetition(group: &[&RunRecord]) -> BTreeMap<u32, f64> {
    group
        .iter()
        .filter(|r| r.counts())
        .map(|r| (r.repetition, r.throughput_bps / BITS_PER_MEGABIT))
        .collect()
}

fn case_row(
    variant: &str,
    sweep_label: &str,
    sweep_number: Option<f64>,
    case: &str,
    is_baseline: bool,
    group: &[&RunRecord],
    baseline_by_rep: Option<&BTreeMap<u32, f64>>,
) -> CaseRow {
    let ok: Vec<&RunRecord> = group.iter().copied().filter(|r| r.counts()).collect();
    let samples: Vec<Sample> = ok
        .iter()
        .map(|r| Sample {
            repetition: r.repetition,
            seed: r.seed,
            throughput_mbps: r.throughput_bps / BITS_PER_MEGABIT,
        })
        .collect();
    let throughputs: Vec<f64> = samples.iter().map(|s| s.throughput_mbps).collect();
    let mut extra_samples: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    for record in &ok {
        for (name, value) in record.extra.iter().filter(|(_, v)| v.is_finite()) {
            extra_samples
                .entry(name.clone())
                .or_default()
                .push((record.seed, *value));
        }
    }
    let page_loads: Option<Vec<f64>> = extra_samples
        .get(PAGE_LOAD_METRIC)
        .map(|samples| samples.iter().map(|(_, v)| *v).collect());

    let (paired_gains, gos_of_medians) = match baseline_by_rep {
        Some(baseline) if !is_baseline => {
            let mine = throughput_by_repetition(group);
            let gains = stats::paired_gains(
                mine.iter()
                    .filter_map(|(rep, t)| baseline.get(rep).map(|b| (*t, *b))),
            );
            let baseline_values: Vec<f64> = baseline.values().copied().collect();
            (
                gains,
                stats::gain_of_medians(&throughputs, &baseline_values),
            )
        }
        _ => (Vec::new(), None),
    };

    CaseRow {
        variant: variant.to_string(),
        sweep_label: sweep_label.to_string(),
        sweep_number,
        case: case.to_string(),
        is_baseline,
        throughput_mbps: stats::spread(&throughputs),
        gos_median_paired: stats::median(&paired_gains),
        gos_of_medians,
        gos_positive: stats::share_positive(&paired_gains),
        paired_gains,
        retransmits_median: medians_by_name(ok.iter().map(|r| {
            r.retransmits
                .iter()
                .map(|(k, v)| (k.as_str(), *v as f64))
                .collect::<Vec<_>>()
        })),
        extra_median: medians_by_name(ok.iter().map(|r| {
            r.extra
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect::<Vec<_>>()
        })),
        page_load_seconds: page_loads.as_deref().and_then(stats::spread),
        page_load_mean: page_loads.as_deref().and_then(stats::mean),
        extra_samples,
        samples,
    }
}

/// Median per name over runs; a name missing from a run is not counted as zero for it.
fn medians_by_name<'a>(runs: impl Iterator<Item = Vec<(&'a str, f64)>>) -> BTreeMap<String, f64> {
    let mut values: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for run in runs {
        for (name, value) in run {
            values.entry(name).or_default().push(value);
        }
    }
    values
        .into_iter()
        .filter_map(|(name, v)| stats::median(&v).map(|m| (name.to_string(), m)))
        .collect()
}

/// A JSON parameter value as a person writes it: strings without quotes, numbers as recorded.
pub(crate) fn value_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// All parameters as `k=v, k=v`.
pub(crate) fn params_text(params: &BTreeMap<String, Value>) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{k}={}", value_text(v)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn distinct<'a>(items: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for item in items {
        if !out.iter().any(|o| o == item) {
            out.push(item.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(case: &str, loss: f64, rtt: u64, rep: u32, mbps: f64) -> RunRecord {
        RunRecord {
            scenario: "s".into(),
            scenario_file: "s.toml".into(),
            commit: "abc".into(),
            experiment: "fig".into(),
            case: case.into(),
            sweep_param: Some("loss".into()),
            params: BTreeMap::from([
                ("loss".to_string(), json!(loss)),
                ("rtt_ms".to_string(), json!(rtt)),
                ("size".to_string(), json!(1000)),
            ]),
            repetition: rep,
            seed: 7,
            bytes: 1000,
            seconds: 1.0,
            throughput_bps: mbps * 1e6,
            retransmits: BTreeMap::from([("client".to_string(), rep as u64)]),
            extra: BTreeMap::new(),
            ok: true,
            error: None,
            started_at: format!("2026-01-01T00:00:0{rep}Z"),
            tree: None,
            quick: None,
            load: None,
        }
    }

    #[test]
    fn a_run_whose_warm_up_left_no_cache_entry_counts_nowhere() {
        let warmed = |case: &str, rep: u32, mbps: f64, cached: f64| {
            let mut r = record(case, 0.05, 20, rep, mbps);
            r.extra
                .insert(crate::record::WARMUP_CACHED_METRIC.into(), cached);
            r
        };
        let records = vec![
            warmed("direct", 0, 10.0, 1.0),
            warmed("midway", 0, 12.0, 1.0),
            warmed("direct", 1, 10.0, 1.0),
            // Its warm-ups left no entry: a first connection, slower, and not what is measured.
            warmed("midway", 1, 2.0, 0.0),
            warmed("direct", 2, 10.0, 1.0),
            warmed("midway", 2, 14.0, 1.0),
        ];
        let analysis = analyse(&records, "direct");
        assert!(analysis.failed.is_empty());
        assert_eq!(analysis.no_warmup_entry.len(), 1);
        assert_eq!(analysis.no_warmup_entry[0].repetition, 1);
        assert!(analysis.no_warmup_entry[0]
            .error
            .contains("first connection"));
        let midway = &analysis.experiments[0].rows[1];
        assert_eq!(midway.case, "midway");
        assert_eq!(midway.samples.len(), 2);
        assert_eq!(midway.throughput_mbps.map(|s| s.median), Some(13.0));
        assert_eq!(midway.paired_gains.len(), 2);
    }

    #[test]
    fn groups_variants_sorts_sweep_and_pairs_by_repetition() {
        let mut records = vec![
            record("midway", 0.05, 20, 0, 12.0),
            record("direct", 0.05, 20, 0, 10.0),
            record("midway", 0.05, 20, 1, 8.0),
            record("direct", 0.05, 20, 1, 10.0),
            record("direct", 0.01, 20, 0, 20.0),
            record("midway", 0.01, 20, 0, 30.0),
            record("direct", 0.01, 200, 0, 2.0),
            record("midway", 0.01, 200, 0, 4.0),
        ];
        let mut failed = record("midway", 0.05, 20, 2, 0.0);
        failed.ok = false;
        failed.error = Some("timeout".into());
        records.push(failed);

        let analysis = analyse(&records, "direct");
        assert_eq!(analysis.records, 9);
        assert_eq!(analysis.failed.len(), 1);
        assert_eq!(analysis.failed[0].error, "timeout");
        let exp = &analysis.experiments[0];
        assert_eq!(exp.cases, vec!["direct", "midway"]);
        assert!(exp.numeric_sweep);
        assert_eq!(exp.sweep_points, 2);
        let keys: Vec<(&str, &str, &str)> = exp
            .rows
            .iter()
            .map(|r| (r.variant.as_str(), r.sweep_label.as_str(), r.case.as_str()))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("rtt_ms=20", "0.01", "direct"),
                ("rtt_ms=20", "0.01", "midway"),
                ("rtt_ms=20", "0.05", "direct"),
                ("rtt_ms=20", "0.05", "midway"),
                ("rtt_ms=200", "0.01", "direct"),
                ("rtt_ms=200", "0.01", "midway"),
            ]
        );
        let midway_005 = &exp.rows[3];
        assert_eq!(midway_005.samples.len(), 2, "the failed run is left out");
        assert_eq!(midway_005.paired_gains, vec![0.2, -0.2]);
        assert_eq!(midway_005.gos_median_paired, Some(0.0));
        assert_eq!(midway_005.gos_of_medians, Some(0.0));
        assert_eq!(midway_005.gos_positive.positive, 1);
        assert_eq!(midway_005.throughput_mbps.map(|s| s.median), Some(10.0));
        assert_eq!(midway_005.retransmits_median["client"], 0.5);
        assert_eq!(exp.rows[5].gos_median_paired, Some(1.0));
        assert!(exp.rows[0].paired_gains.is_empty());
    }

    #[test]
    fn page_load_time_marks_a_web_experiment() {
        let mut records = Vec::new();
        for (rep, (direct, proxy)) in [(4.0, 1.0), (6.0, 2.0), (8.0, 9.0)].into_iter().enumerate() {
            for (case, seconds) in [("direct", direct), ("proxy", proxy)] {
                let mut r = record(case, 0.0, 20, rep as u32, 8.0 / seconds);
                r.extra.insert(PAGE_LOAD_METRIC.into(), seconds);
                r.extra.insert("connections_opened".into(), 20.0);
                records.push(r);
            }
        }
        let mut without = record("proxy", 0.0, 20, 3, 1.0);
        without.extra.insert("connections_opened".into(), f64::NAN);
        records.push(without);
        let analysis = analyse(&records, "direct");
        let exp = &analysis.experiments[0];
        assert!(exp.web);
        let proxy = &exp.rows[1];
        let spread = proxy.page_load_seconds.expect("page loads");
        // Three runs carry a page load time (the fourth does not): 1, 2, 9.
        assert_eq!(
            (spread.n, spread.q1, spread.median, spread.q3),
            (3, 1.5, 2.0, 5.5)
        );
        assert_eq!(proxy.page_load_mean, Some(4.0));
        assert_eq!(
            proxy.metric_values("connections_opened"),
            vec![20.0; 3],
            "NaN left out"
        );
        assert_eq!(proxy.metric_values("throughput").len(), 4);
        // GoS on throughput = direct time / proxy time - 1: 3, 2, -1/9 paired by repetition.
        assert_eq!(proxy.gos_positive.positive, 2);
        let gos = proxy.gos_median_paired.expect("paired");
        assert!((gos - 2.0).abs() < 1e-12, "{gos}");
        // A bulk experiment is not web.
        assert!(!analyse(&[record("direct", 0.0, 20, 0, 1.0)], "direct").experiments[0].web);
    }

    #[test]
    fn text_sweep_values_keep_file_order() {
        let mut a = record("direct", 0.0, 20, 0, 1.0);
        a.params.insert("loss".into(), json!("32KB"));
        let mut b = record("direct", 0.0, 20, 0, 1.0);
        b.params.insert("loss".into(), json!("8KB"));
        let analysis = analyse(&[a, b], "direct");
        let exp = &analysis.experiments[0];
        assert!(!exp.numeric_sweep);
        assert_eq!(exp.rows[0].sweep_label, "32KB");
        assert_eq!(exp.rows[1].sweep_label, "8KB");
    }
}
