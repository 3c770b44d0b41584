//! One measurement of one case at one point of a sweep, as appended to `results.jsonl`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The file name, inside a run's output folder, that holds one [`RunRecord`] per line.
pub const RESULTS_FILE: &str = "results.jsonl";

/// One measurement. Field names are the JSON keys; keep them stable, reports read old files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRecord {
    /// Scenario name (from the scenario file's `name`).
    pub scenario: String,
    /// Path of the scenario file as given on the command line.
    pub scenario_file: String,
    /// `git describe --always --dirty` of the midway tree that ran, or "unknown".
    pub commit: String,
    /// Experiment inside the scenario (a figure of a paper, or "main").
    pub experiment: String,
    /// Case name: "direct", "midway", "midway-spool", "haproxy", "haproxy-tuned", ...
    pub case: String,
    /// Name of the parameter this experiment sweeps (x axis of its plot), if any.
    pub sweep_param: Option<String>,
    /// Every parameter of this point: the swept one and the fixed ones (loss, delay, size, ...).
    pub params: BTreeMap<String, serde_json::Value>,
    /// Repetition index, 0-based.
    pub repetition: u32,
    /// Seed of the link emulator (and any other randomness) for this run; rerun with it to repeat.
    pub seed: u64,
    /// Bytes the workload moved (application payload).
    pub bytes: u64,
    /// Seconds from the client's connect to the last byte received.
    #[serde(deserialize_with = "null_as_nan::number")]
    pub seconds: f64,
    /// bytes * 8 / seconds.
    #[serde(deserialize_with = "null_as_nan::number")]
    pub throughput_bps: f64,
    /// Retransmitted segments seen by each endpoint socket (tcp_info total_retrans), by name:
    /// "client", "server", "proxy-local", "proxy-remote".
    pub retransmits: BTreeMap<String, u64>,
    /// Further named measurements (for example "remote_segment_seconds").
    #[serde(deserialize_with = "null_as_nan::map")]
    pub extra: BTreeMap<String, f64>,
    /// False when the run failed; `error` then says why and the numbers are not to be used.
    pub ok: bool,
    /// Why the run failed, when `ok` is false; `None` for a successful run.
    pub error: Option<String>,
    /// Wall-clock start of the run, RFC 3339 UTC.
    pub started_at: String,
    /// The source tree `commit` names: [`TREE_CLEAN`], or [`TREE_DIRTY_PREFIX`] followed by a
    /// hash of the uncommitted changes (so records from the same dirty tree can be told from
    /// records of another). Absent in records written before the lab recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<String>,
    /// Whether the run was the short form (`--quick`: fewer sweep values and repetitions,
    /// shorter transfers); absent in records written before the lab recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quick: Option<bool>,
    /// How loaded the machine was: the run's load policy and the load average at its start;
    /// absent in records written before the lab recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<RunLoad>,
}

/// The load a run was measured under. One report holds one load policy ([`RunLoad::jobs`]): runs
/// measured several at a time share the CPUs and must not be mixed with runs measured alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunLoad {
    /// Topologies the lab measured at once (`--jobs`): the load policy.
    pub jobs: u32,
    /// Online CPUs of the machine.
    pub cpus: u32,
    /// The 1-minute load average when the run started (`/proc/loadavg`), if it could be read.
    pub loadavg_1m: Option<f64>,
    /// The experiment's own limit (`max_jobs` in the scenario): at most this many topologies
    /// were measured at once while this run went on. Part of the load policy, per experiment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs: Option<u32>,
}

impl RunLoad {
    /// Topologies measured at once while this run went on, at most: `--jobs`, or the
    /// experiment's own limit when that is lower. The load a concurrency check compares.
    pub fn effective_jobs(&self) -> u32 {
        self.max_jobs
            .map_or(self.jobs, |limit| limit.min(self.jobs))
    }
}

/// Name of the `extra` measurement of a run with a warm-up transfer: 1 when the local segment's
/// sender had cached the client (tcp_metrics) before the measured connection, 0 when not.
pub const WARMUP_CACHED_METRIC: &str = "warmup_metrics_cached";

/// Why a record counts in no statistic of a report.
#[derive(Debug, Clone, PartialEq)]
pub enum LeftOut {
    /// The run failed; the lab's error.
    Failed(String),
    /// The run's warm-ups left no tcp_metrics entry for the client, so its measured connection
    /// started as a first connection, not as the returning client's the experiment measures
    /// (knobs such as the duplicate-ACK threshold reach only a returning client).
    NoWarmupEntry,
}

impl LeftOut {
    /// The reason as a report prints it.
    pub fn text(&self) -> String {
        match self {
            Self::Failed(error) => error.clone(),
            Self::NoWarmupEntry => "the warm-ups left no tcp_metrics entry for the client: the \
                                    measured connection started as a first connection"
                .to_string(),
        }
    }
}

/// [`RunRecord::tree`] of a run from a tree without uncommitted changes.
pub const TREE_CLEAN: &str = "clean";
/// Prefix of [`RunRecord::tree`] of a run from a tree with uncommitted changes.
pub const TREE_DIRTY_PREFIX: &str = "dirty:";

/// serde_json writes a non-finite `f64` (the throughput of a run that moved nothing in zero
/// seconds, an infinite time) as `null`; read it back as NaN, which every statistic skips, instead
/// of rejecting a record the lab itself wrote.
mod null_as_nan {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer};

    pub(super) fn number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
    }

    pub(super) fn map<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<String, f64>, D::Error> {
        let raw = BTreeMap::<String, Option<f64>>::deserialize(deserializer)?;
        Ok(raw
            .into_iter()
            .map(|(name, value)| (name, value.unwrap_or(f64::NAN)))
            .collect())
    }
}

impl RunRecord {
    /// Why this record is left out of every statistic, or `None` when it counts.
    pub fn left_out(&self) -> Option<LeftOut> {
        if !self.ok {
            let error = self.error.as_deref().unwrap_or("(no error recorded)");
            return Some(LeftOut::Failed(error.to_string()));
        }
        (self.extra.get(WARMUP_CACHED_METRIC) == Some(&0.0)).then_some(LeftOut::NoWarmupEntry)
    }

    /// Whether this record counts in a report's statistics (see [`RunRecord::left_out`]).
    pub fn counts(&self) -> bool {
        self.left_out().is_none()
    }

    /// Key that identifies one point of one sweep, used to resume an interrupted run.
    pub fn resume_key(&self) -> String {
        let params = serde_json::to_string(&self.params).unwrap_or_default();
        format!(
            "{}|{}|{}|{}",
            self.experiment, self.case, params, self.repetition
        )
    }
}
