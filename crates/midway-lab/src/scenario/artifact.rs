//! The `[artifact]` section: the subset of a reproduction that `midway lab artifact` reruns to
//! set its verdicts beside the committed full report's. Declared in the scenario, next to the
//! experiments it cuts, so the subset is read, validated and planned like the rest of the file:
//!
//! ```toml
//! [artifact]
//! repetitions = 5                  # of every point kept (a verdict needs an interval)
//! [[artifact.experiments]]
//! name = "fig13-legacy"            # an experiment of this file
//! cases = ["store-and-forward"]    # optional: only these of its cases (default: all)
//! values = [8192, 32768]           # optional: only these sweep values, as the sweep writes them
//! smoke = true                     # optional: also in the shortest form (`--smoke`, CI's)
//! ```
//!
//! An entry keeps the cells `cases x values` of its experiment; entries naming one experiment
//! add up (a claim reading two cases at different values needs no rectangle around them).

use std::collections::BTreeSet;

use serde::Deserialize;
use toml::Spanned;

use super::validate::Blame;
use super::{ExperimentFile, ScenarioFile};

/// Which subset of the `[artifact]` section a plan keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactForm {
    /// Every `[[artifact.experiments]]` entry.
    Full,
    /// Only the entries marked `smoke = true`: the form CI runs.
    Smoke,
}

/// The `[artifact]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactFile {
    /// Repetitions of every point the subset keeps.
    pub repetitions: Spanned<u32>,
    /// The cells kept, experiment by experiment.
    pub experiments: Vec<ArtifactEntryFile>,
}

/// One `[[artifact.experiments]]` entry: some cases at some sweep values of one experiment.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactEntryFile {
    /// The experiment's name.
    pub name: Spanned<String>,
    /// Its cases kept (empty: all of them).
    #[serde(default)]
    pub cases: Vec<Spanned<String>>,
    /// Its sweep values kept, as the sweep's `values` write them (empty: all of them).
    #[serde(default)]
    pub values: Vec<Spanned<toml::Value>>,
    /// Also in the shortest form.
    #[serde(default)]
    pub smoke: bool,
}

impl ArtifactFile {
    /// The cells of `experiment` that `form` keeps, as (sweep index, case) pairs (sweep index 0
    /// for an experiment without a sweep); `None` when no entry of the form names it.
    pub(crate) fn cells(
        &self,
        experiment: &ExperimentFile,
        form: ArtifactForm,
    ) -> Option<BTreeSet<(usize, String)>> {
        let name = experiment.name.get_ref();
        let entries: Vec<&ArtifactEntryFile> = self
            .experiments
            .iter()
            .filter(|e| e.name.get_ref() == name && (form == ArtifactForm::Full || e.smoke))
            .collect();
        if entries.is_empty() {
            return None;
        }
        let sweep_values: Vec<&toml::Value> = experiment
            .sweep
            .as_ref()
            .map(|s| s.values.get_ref().iter().map(|v| v.get_ref()).collect())
            .unwrap_or_default();
        let mut cells = BTreeSet::new();
        for entry in entries {
            let indices: Vec<usize> = if entry.values.is_empty() {
                (0..sweep_values.len().max(1)).collect()
            } else {
                entry
                    .values
                    .iter()
                    .filter_map(|v| sweep_values.iter().position(|s| *s == v.get_ref()))
                    .collect()
            };
            for case in &experiment.cases {
                let kept = entry.cases.is_empty() || entry.cases.iter().any(|c| c == case);
                if kept {
                    cells.extend(indices.iter().map(|&i| (i, case.get_ref().clone())));
                }
            }
        }
        Some(cells)
    }
}

/// Checks of the `[artifact]` section against the experiments: at least one repetition and one
/// entry, and every entry names an experiment of the file, cases of that experiment and values
/// of its sweep.
pub(super) fn validate_artifact(file: &ScenarioFile) -> Result<(), Blame> {
    let Some(artifact) = &file.artifact else {
        return Ok(());
    };
    if *artifact.repetitions.get_ref() == 0 {
        return Err((
            artifact.repetitions.span(),
            "artifact repetitions must be at least 1".into(),
        ));
    }
    if artifact.experiments.is_empty() {
        return Err((
            artifact.repetitions.span(),
            "[artifact] keeps no experiment: add [[artifact.experiments]] entries".into(),
        ));
    }
    for entry in &artifact.experiments {
        let name = entry.name.get_ref();
        let Some(experiment) = file.experiments.iter().find(|e| e.name.get_ref() == name) else {
            return Err((
                entry.name.span(),
                format!("[[artifact.experiments]] names `{name}`, which is not an experiment of this file"),
            ));
        };
        for case in &entry.cases {
            if !experiment
                .cases
                .iter()
                .any(|c| c.get_ref() == case.get_ref())
            {
                return Err((
                    case.span(),
                    format!(
                        "experiment `{name}` has no case `{}` (it has: {})",
                        case.get_ref(),
                        join(experiment.cases.iter().map(|c| c.get_ref().to_string()))
                    ),
                ));
            }
        }
        let sweep_values = experiment.sweep.as_ref().map(|s| s.values.get_ref());
        for value in &entry.values {
            let known = sweep_values
                .is_some_and(|values| values.iter().any(|v| v.get_ref() == value.get_ref()));
            if !known {
                let listed = sweep_values
                    .map(|values| join(values.iter().map(|v| v.get_ref().to_string())))
                    .unwrap_or_else(|| "no sweep".into());
                return Err((
                    value.span(),
                    format!(
                        "experiment `{name}` sweeps no value {} (its values: {listed})",
                        value.get_ref()
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(", ")
}
