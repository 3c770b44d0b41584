//! The plan of a run: experiments x sweep values x cases x repetitions, expanded into points in a
//! fixed order, with `--quick`, the `[artifact]` subset, `--experiment`, `--repetitions`,
//! `--shard` and `--resume` applied.
//! Pure: no I/O, no clock; the seed of a point depends only on the base seed and its coordinates.

use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use serde_json::Value;

use crate::scenario::{derived_axis_value, ArtifactForm, LoadedScenario, Scenario, ScenarioError};

/// Options that shape a plan (the run's command-line flags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanOptions {
    /// `--quick`: first, middle and last sweep value, one repetition, the file's `[quick]`
    /// overrides.
    pub quick: bool,
    /// Only the cells of the file's `[artifact]` section (of this form), at its repetitions:
    /// what `midway lab artifact` reruns. A file without the section plans nothing.
    pub artifact: Option<ArtifactForm>,
    /// Run only these experiments (all when empty).
    pub experiments: Vec<String>,
    /// Run only these cases of each experiment (all when empty).
    pub cases: Vec<String>,
    /// Repetitions of every point, overriding the file's.
    pub repetitions: Option<u32>,
    /// Overrides the file's base seed.
    pub seed: Option<u64>,
    /// Run only one shard of the points (`--shard i/n`); `None` = all points.
    pub shard: Option<Shard>,
}

/// `i/n`: the points whose index modulo n is i.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// i: the remainder of the indices this shard runs, `0..count`.
    pub index: usize,
    /// n: how many shards the points are split into, at least 1.
    pub count: usize,
}

/// Why a plan cannot be made from a scenario and the options.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A point's overrides do not give a valid scenario (loading checks this, so rare).
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// `--shard` is not `I/N` with `0 <= I < N`; holds the text given.
    #[error("--shard wants I/N with 0 <= I < N, e.g. 0/4; got `{0}`")]
    BadShard(String),
    /// `--experiment` names an experiment the scenario does not have.
    #[error("unknown experiment `{name}`; this scenario has: {known}")]
    UnknownExperiment {
        /// The name given.
        name: String,
        /// The scenario's experiment names, comma-separated.
        known: String,
    },
    /// `--case` names a case the scenario does not have.
    #[error("unknown case `{name}`; this scenario has: {known}")]
    UnknownCase {
        /// The name given.
        name: String,
        /// The scenario's case names, comma-separated.
        known: String,
    },
    /// `--repetitions 0`.
    #[error("--repetitions must be at least 1")]
    ZeroRepetitions,
    /// `--quick` and the artifact subset together: each shapes the points its own way.
    #[error("--quick and the artifact subset cannot be combined")]
    QuickArtifact,
}

impl std::str::FromStr for Shard {
    type Err = PlanError;
    fn from_str(text: &str) -> Result<Self, PlanError> {
        let bad = || PlanError::BadShard(text.to_string());
        let (index, count) = text.split_once('/').ok_or_else(bad)?;
        let index: usize = index.trim().parse().map_err(|_| bad())?;
        let count: usize = count.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

/// One measurement to make.
#[derive(Debug, Clone)]
pub struct Point {
    /// Position in the full plan (before shard and resume), stable across runs of one file.
    pub index: usize,
    /// Name of the experiment the point belongs to.
    pub experiment: String,
    /// Axis label of the sweep, the key of the x value in `params`.
    pub sweep_param: Option<String>,
    /// Position of the point's value in the sweep's list (`None` without a sweep).
    pub sweep_index: Option<usize>,
    /// Name of the case measured.
    pub case: String,
    /// Repetition number, from 0.
    pub repetition: u32,
    /// Seed of the point's link emulators, the same for every case at one sweep value and
    /// repetition.
    pub seed: u64,
    /// The scenario with this point's overrides applied.
    pub scenario: Arc<Scenario>,
    /// Parameters recorded with the result: the sweep's x value under its label, and every
    /// effective parameter that is the same for all points of the experiment.
    pub params: BTreeMap<String, Value>,
    /// The experiment's own limit on topologies measured at once (`max_jobs`), if it has one.
    pub max_jobs: Option<usize>,
}

/// The seed of a point: the same for every case at one sweep value and repetition, so cases are
/// compared under the same loss pattern (common random numbers). Each coordinate (the
/// experiment's name byte by byte, the sweep index, the repetition) is added to the state, which
/// one splitmix64 step then mixes (rand_xoshiro's, the generator the fault campaign and the web
/// origin use too); stable across Rust versions, unlike `DefaultHasher`. The seeds recorded in
/// published results come from this derivation: changing it changes which packets a rerun loses.
pub(crate) fn point_seed(base: u64, experiment: &str, sweep_index: usize, repetition: u32) -> u64 {
    let coordinates = experiment
        .bytes()
        .map(u64::from)
        .chain([sweep_index as u64, u64::from(repetition)]);
    coordinates.fold(base, |state, value| {
        SplitMix64::seed_from_u64(state.wrapping_add(value)).next_u64()
    })
}

/// Indices of the sweep values kept by `--quick`: first, middle and last.
pub(crate) fn quick_indices(len: usize) -> Vec<usize> {
    let set: BTreeSet<usize> = [0, len / 2, len.saturating_sub(1)]
        .into_iter()
        .filter(|&i| i < len)
        .collect();
    set.into_iter().collect()
}

/// Expands the scenario into points, in order experiment, sweep value, repetition, case (so that a
/// partial run has every case of the first values), then applies the shard.
pub fn build_plan(loaded: &LoadedScenario, options: &PlanOptions) -> Result<Vec<Point>, PlanError> {
    let known: Vec<String> = loaded
        .file
        .experiments
        .iter()
        .map(|e| e.name.get_ref().clone())
        .collect();
    for name in &options.experiments {
        if !known.contains(name) {
            return Err(PlanError::UnknownExperiment {
                name: name.clone(),
                known: known.join(", "),
            });
        }
    }
    for name in &options.cases {
        if !loaded.base.cases.contains_key(name) {
            return Err(PlanError::UnknownCase {
                name: name.clone(),
                known: loaded
                    .base
                    .cases
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    if options.repetitions == Some(0) {
        return Err(PlanError::ZeroRepetitions);
    }
    if options.quick && options.artifact.is_some() {
        return Err(PlanError::QuickArtifact);
    }
    let base_seed = options.seed.unwrap_or(loaded.base.seed);
    let mut points = Vec::new();
    for experiment in &loaded.file.experiments {
        let name = experiment.name.get_ref();
        if !options.experiments.is_empty() && !options.experiments.contains(name) {
            continue;
        }
        // The artifact's (sweep index, case) cells of this experiment; `None`: every cell.
        let artifact_cells = match options.artifact {
            None => None,
            Some(form) => {
                let section = loaded.file.artifact.as_ref();
                match section.and_then(|a| a.cells(experiment, form)) {
                    Some(cells) => Some(cells),
                    None => continue,
                }
            }
        };
        let file_repetitions = match (options.artifact, &loaded.file.artifact) {
            (Some(_), Some(artifact)) => *artifact.repetitions.get_ref(),
            _ => *experiment.repetitions.get_ref(),
        };
        let repetitions = if options.quick {
            1
        } else {
            options.repetitions.unwrap_or(file_repetitions)
        };
        let fixed = loaded.fixed_overrides(experiment, options.quick);
        // (sweep index, x value, scenario) per value kept.
        let mut values: Vec<(Option<usize>, Option<Value>, Arc<Scenario>)> = Vec::new();
        match &experiment.sweep {
            None => {
                let scenario = loaded.point_scenario(&fixed)?;
                values.push((None, None, Arc::new(scenario)));
            }
            Some(sweep) => {
                let count = sweep.values.get_ref().len();
                let indices: Vec<usize> = if options.quick {
                    quick_indices(count)
                } else {
                    (0..count)
                        .filter(|i| {
                            artifact_cells
                                .as_ref()
                                .is_none_or(|cells| cells.iter().any(|(index, _)| index == i))
                        })
                        .collect()
                };
                for index in indices {
                    let mut all = fixed.clone();
                    all.extend(loaded.sweep_overrides(sweep, index));
                    let scenario = loaded.point_scenario(&all)?;
                    let raw = sweep.values.get_ref()[index].get_ref();
                    let x = match &sweep.axis {
                        Some(axis) => Some(serde_json::json!(axis.get_ref()[index])),
                        None => match derived_axis_value(raw) {
                            Some(number) => Some(serde_json::json!(number)),
                            None => Some(Value::String(raw.to_string())),
                        },
                    };
                    values.push((Some(index), x, Arc::new(scenario)));
                }
            }
        }
        // Parameters equal at every value of this experiment; the varying ones are the sweep's
        // (the report would otherwise split the experiment into variants by them).
        // The artifact subset judges its values over the whole sweep, so its records carry the
        // parameters the full run's do and the claims find the same cells in both.
        let mut flats: Vec<BTreeMap<String, Value>> =
            values.iter().map(|(_, _, s)| s.flat_params()).collect();
        if let (Some(_), Some(sweep)) = (options.artifact, &experiment.sweep) {
            let kept: Vec<Option<usize>> = values.iter().map(|(i, _, _)| *i).collect();
            for index in 0..sweep.values.get_ref().len() {
                if !kept.contains(&Some(index)) {
                    let mut all = fixed.clone();
                    all.extend(loaded.sweep_overrides(sweep, index));
                    flats.push(loaded.point_scenario(&all)?.flat_params());
                }
            }
        }
        let constant: BTreeMap<String, Value> = flats
            .first()
            .map(|first| {
                first
                    .iter()
                    .filter(|(k, v)| flats.iter().all(|f| f.get(*k) == Some(*v)))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let label = experiment.sweep.as_ref().map(|s| s.label.clone());
        let max_jobs = experiment.max_jobs.as_ref().map(|m| *m.get_ref() as usize);
        for (sweep_index, x, scenario) in &values {
            let mut params = constant.clone();
            if let (Some(label), Some(x)) = (&label, x) {
                params.insert(label.clone(), x.clone());
            }
            for repetition in 0..repetitions {
                let seed = point_seed(base_seed, name, sweep_index.unwrap_or(0), repetition);
                let chosen = experiment.cases.iter().filter(|case| {
                    (options.cases.is_empty() || options.cases.contains(case.get_ref()))
                        && artifact_cells.as_ref().is_none_or(|cells| {
                            cells.contains(&(sweep_index.unwrap_or(0), case.get_ref().clone()))
                        })
                });
                for case in chosen {
                    points.push(Point {
                        index: points.len(),
                        experiment: name.clone(),
                        sweep_param: label.clone(),
                        sweep_index: *sweep_index,
                        case: case.get_ref().clone(),
                        repetition,
                        seed,
                        scenario: Arc::clone(scenario),
                        params: params.clone(),
                        max_jobs,
                    });
                }
            }
        }
    }
    if let Some(shard) = options.shard {
        points.retain(|p| p.index % shard.count == shard.index);
    }
    Ok(points)
}

/// The resume key of a point, exactly as [`midway_report::RunRecord::resume_key`] computes it.
pub(crate) fn resume_key(point: &Point) -> String {
    skeleton_record(point, "", "", "").resume_key()
}

/// A record for `point` with the measurement fields empty and `ok = false`.
pub(crate) fn skeleton_record(
    point: &Point,
    scenario_file: &str,
    commit: &str,
    started_at: &str,
) -> midway_report::RunRecord {
    midway_report::RunRecord {
        scenario: point.scenario.name.clone(),
        scenario_file: scenario_file.to_string(),
        commit: commit.to_string(),
        experiment: point.experiment.clone(),
        case: point.case.clone(),
        sweep_param: point.sweep_param.clone(),
        params: point.params.clone(),
        repetition: point.repetition,
        seed: point.seed,
        bytes: 0,
        seconds: 0.0,
        throughput_bps: 0.0,
        retransmits: BTreeMap::new(),
        extra: BTreeMap::new(),
        ok: false,
        error: None,
        started_at: started_at.to_string(),
        tree: None,
        quick: None,
        load: None,
    }
}

/// Drops the points already measured successfully (by resume key).
pub(crate) fn skip_done(points: Vec<Point>, done: &HashSet<String>) -> Vec<Point> {
    points
        .into_iter()
        .filter(|p| !done.contains(&resume_key(p)))
        .collect()
}

/// Resume keys of the successful records in a results file's records.
pub(crate) fn done_keys(records: &[midway_report::RunRecord]) -> HashSet<String> {
    records
        .iter()
        .filter(|r| r.ok)
        .map(|r| r.resume_key())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_parse_and_reject_nonsense() {
        assert_eq!(
            "1/4".parse::<Shard>().unwrap(),
            Shard { index: 1, count: 4 }
        );
        assert!("4/4".parse::<Shard>().is_err());
        assert!("0/0".parse::<Shard>().is_err());
        assert!("x".parse::<Shard>().is_err());
    }

    #[test]
    fn quick_keeps_first_middle_last() {
        assert_eq!(quick_indices(5), vec![0, 2, 4]);
        assert_eq!(quick_indices(2), vec![0, 1]);
        assert_eq!(quick_indices(1), vec![0]);
        assert!(quick_indices(0).is_empty());
    }

    #[test]
    fn seeds_are_those_of_the_published_runs() {
        // Values of the derivation the recorded runs used (before the generator was shared).
        assert_eq!(point_seed(1, "fig8", 0, 0), 13290823950360257251);
        assert_eq!(point_seed(5, "fig10-long", 3, 2), 14229791876552299254);
        assert_eq!(point_seed(0, "", 0, 0), 12035550249420947055);
    }

    #[test]
    fn seeds_depend_on_coordinates_but_not_on_case() {
        let a = point_seed(1, "fig8", 0, 0);
        assert_eq!(a, point_seed(1, "fig8", 0, 0));
        assert_ne!(a, point_seed(1, "fig8", 1, 0));
        assert_ne!(a, point_seed(1, "fig8", 0, 1));
        assert_ne!(a, point_seed(2, "fig8", 0, 0));
        assert_ne!(a, point_seed(1, "fig9", 0, 0));
    }

    const SCENARIO: &str = r#"
name = "plan-test"
description = "d"
source = "s"
seed = 5
[hosts.c]
[hosts.p]
[hosts.s]
[roles]
client = "c"
proxy = "p"
server = "s"
[links.l1]
a = "c"
b = "p"
[links.l1.b_to_a]
delay = "10ms"
[links.l2]
a = "p"
b = "s"
[workload]
kind = "bulk"
bytes = "1MB"
[cases.direct]
kind = "direct"
[cases.midway]
kind = "midway"
[quick]
set = { "workload.bytes" = "100KB" }
[[experiments]]
name = "delay"
cases = ["direct", "midway"]
repetitions = 2
[experiments.sweep]
param = "links.l1.b_to_a.delay"
also = ["links.l1.a_to_b.delay"]
label = "one-way delay (ms)"
values = ["10ms", "20ms", "30ms", "40ms"]
[[experiments]]
name = "single"
cases = ["midway"]
set = { "workload.bytes" = "2MB" }
"#;

    fn loaded() -> LoadedScenario {
        LoadedScenario::from_text(std::path::Path::new("t.toml"), SCENARIO.to_string()).unwrap()
    }

    #[test]
    fn sweeps_expand_into_values_x_repetitions_x_cases_with_overrides_applied() {
        let points = build_plan(&loaded(), &PlanOptions::default()).unwrap();
        assert_eq!(points.len(), 4 * 2 * 2 + 1);
        let second = &points[4];
        assert_eq!(second.sweep_index, Some(1));
        let link = &second.scenario.links[0];
        assert_eq!(link.b_to_a.delay.to_string(), "20ms");
        assert_eq!(
            link.a_to_b.delay.to_string(),
            "20ms",
            "`also` paths get the value"
        );
        assert_eq!(second.params["one-way delay (ms)"], serde_json::json!(20.0));
        // The swept parameters vary, so only the axis value represents them.
        assert!(!second.params.contains_key("l1.b_to_a.delay_ms"));
        assert_eq!(second.params["bytes"], serde_json::json!(1_000_000));
        // Same seed for both cases of one value and repetition, different across repetitions.
        assert_eq!(points[0].seed, points[1].seed);
        assert_ne!(points[0].seed, points[2].seed);
        let single = points.last().unwrap();
        assert_eq!(single.params["bytes"], serde_json::json!(2_000_000));
        assert_eq!(single.sweep_param, None);
    }

    #[test]
    fn quick_cuts_values_and_repetitions_and_applies_its_overrides() {
        let options = PlanOptions {
            quick: true,
            ..PlanOptions::default()
        };
        let points = build_plan(&loaded(), &options).unwrap();
        // values 0, 2, 3 of four; one repetition; two cases; plus the single point.
        assert_eq!(points.len(), 3 * 2 + 1);
        assert_eq!(points[0].params["bytes"], serde_json::json!(100_000));
        let indices: Vec<_> = points.iter().filter_map(|p| p.sweep_index).collect();
        assert_eq!(indices, [0, 0, 2, 2, 3, 3]);
    }

    fn with_artifact(section: &str) -> Result<LoadedScenario, ScenarioError> {
        LoadedScenario::from_text(
            std::path::Path::new("t.toml"),
            format!("{SCENARIO}\n[artifact]\n{section}"),
        )
    }

    #[test]
    fn the_artifact_subset_keeps_its_cells_with_the_full_runs_parameters_and_seeds() {
        let loaded = with_artifact(
            "repetitions = 3\n\
             [[artifact.experiments]]\nname = \"delay\"\ncases = [\"midway\"]\nvalues = [\"20ms\"]\n\
             [[artifact.experiments]]\nname = \"delay\"\ncases = [\"direct\"]\nvalues = [\"40ms\"]\nsmoke = true\n",
        )
        .unwrap();
        let subset = |form| PlanOptions {
            artifact: Some(form),
            ..PlanOptions::default()
        };
        let points = build_plan(&loaded, &subset(ArtifactForm::Full)).unwrap();
        let cells: Vec<(Option<usize>, &str, u32)> = points
            .iter()
            .map(|p| (p.sweep_index, p.case.as_str(), p.repetition))
            .collect();
        assert_eq!(
            cells,
            [
                (Some(1), "midway", 0),
                (Some(1), "midway", 1),
                (Some(1), "midway", 2),
                (Some(3), "direct", 0),
                (Some(3), "direct", 1),
                (Some(3), "direct", 2),
            ],
            "the entries' cells, at the section's repetitions; `single` is in no entry"
        );
        // The records of a cell name it as the full run's do: same parameters (the swept one
        // is not taken for a constant although one value is kept per case), same seeds.
        let full = build_plan(&loaded, &PlanOptions::default()).unwrap();
        for point in points.iter().filter(|p| p.repetition < 2) {
            assert!(
                full.iter().any(|f| f.experiment == point.experiment
                    && f.case == point.case
                    && f.params == point.params
                    && f.seed == point.seed),
                "{:?}",
                point.params
            );
        }
        let smoke = build_plan(&loaded, &subset(ArtifactForm::Smoke)).unwrap();
        assert_eq!(smoke.len(), 3);
        assert!(build_plan(&self::loaded(), &subset(ArtifactForm::Full))
            .unwrap()
            .is_empty());
        let quick_too = PlanOptions {
            quick: true,
            ..subset(ArtifactForm::Full)
        };
        assert!(build_plan(&loaded, &quick_too).is_err());
    }

    #[test]
    fn an_artifact_section_naming_what_the_file_lacks_is_refused() {
        for (section, message) in [
            ("repetitions = 5\n[[artifact.experiments]]\nname = \"nope\"\n", "not an experiment"),
            ("repetitions = 5\n[[artifact.experiments]]\nname = \"single\"\ncases = [\"direct\"]\n", "no case `direct`"),
            ("repetitions = 5\n[[artifact.experiments]]\nname = \"delay\"\nvalues = [\"15ms\"]\n", "sweeps no value"),
            ("repetitions = 0\n[[artifact.experiments]]\nname = \"delay\"\n", "at least 1"),
        ] {
            let error = with_artifact(section).unwrap_err().to_string();
            assert!(error.contains(message), "{error}");
        }
    }

    #[test]
    fn experiment_filter_repetitions_and_unknown_names() {
        let options = PlanOptions {
            experiments: vec!["single".into()],
            repetitions: Some(3),
            ..PlanOptions::default()
        };
        assert_eq!(build_plan(&loaded(), &options).unwrap().len(), 3);
        let options = PlanOptions {
            experiments: vec!["nope".into()],
            ..PlanOptions::default()
        };
        let error = build_plan(&loaded(), &options).unwrap_err().to_string();
        assert!(error.contains("unknown experiment `nope`"), "{error}");
        assert!(error.contains("delay, single"), "{error}");
    }

    #[test]
    fn shards_partition_the_plan() {
        let full = build_plan(&loaded(), &PlanOptions::default()).unwrap();
        let mut seen: Vec<usize> = Vec::new();
        for index in 0..3 {
            let options = PlanOptions {
                shard: Some(Shard { index, count: 3 }),
                ..PlanOptions::default()
            };
            seen.extend(
                build_plan(&loaded(), &options)
                    .unwrap()
                    .iter()
                    .map(|p| p.index),
            );
        }
        seen.sort();
        assert_eq!(seen, (0..full.len()).collect::<Vec<_>>());
    }

    #[test]
    fn resume_keys_are_unique_and_skip_only_successful_points() {
        let points = build_plan(&loaded(), &PlanOptions::default()).unwrap();
        let keys: HashSet<String> = points.iter().map(resume_key).collect();
        assert_eq!(keys.len(), points.len());
        let mut done = skeleton_record(&points[0], "f", "c", "t");
        done.ok = true;
        let failed = skeleton_record(&points[1], "f", "c", "t");
        let remaining = skip_done(points.clone(), &done_keys(&[done, failed]));
        assert_eq!(remaining.len(), points.len() - 1);
        assert_eq!(remaining[0].index, 1, "the failed point is measured again");
    }
}
