//! Sweep and `set` overrides: dotted paths into the scenario's TOML tree, applied to a copy of
//! the tree, which is then parsed and validated like the file itself.

use std::ops::Range;

use toml::Spanned;

use super::validate::validate;
use super::{ExperimentFile, LoadedScenario, Scenario, ScenarioError, ScenarioFile, SweepFile};
use crate::units::{ByteSize, HumanDuration, LossSpec, Rate};

/// One override of a point: dotted path and value, with the span of the text that asked for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// Dotted path into the scenario document, e.g. "links.access.b_to_a.delay".
    pub path: String,
    /// The value put at that path.
    pub value: toml::Value,
    /// Where the path is written (blamed when the path is wrong).
    pub path_span: Range<usize>,
    /// Where the value is written (blamed when the value is wrong).
    pub value_span: Range<usize>,
}

impl LoadedScenario {
    /// Fixed overrides of an experiment: its `set`, then (with `quick`) its own `quick.set` if
    /// it has one, else the file's `[quick] set`.
    pub fn fixed_overrides(&self, experiment: &ExperimentFile, quick: bool) -> Vec<Override> {
        let mut out: Vec<Override> = experiment.set.iter().map(to_override).collect();
        if quick {
            let quick_set = experiment.quick.as_ref().unwrap_or(&self.file.quick);
            out.extend(quick_set.set.iter().map(to_override));
        }
        out
    }

    /// The overrides a sweep value sets (its `param` and every `also` path).
    pub fn sweep_overrides(&self, sweep: &SweepFile, index: usize) -> Vec<Override> {
        let value = &sweep.values.get_ref()[index];
        std::iter::once(&sweep.param)
            .chain(sweep.also.iter())
            .map(|path| Override {
                path: path.get_ref().clone(),
                value: value.get_ref().clone(),
                path_span: path.span(),
                value_span: value.span(),
            })
            .collect()
    }

    /// The scenario with `overrides` applied (later ones win), fully validated.
    pub fn point_scenario(&self, overrides: &[Override]) -> Result<Scenario, ScenarioError> {
        if overrides.is_empty() {
            return Ok(self.base.clone());
        }
        let mut document = self.document.clone();
        for item in overrides {
            set_path(&mut document, &item.path, item.value.clone())
                .map_err(|message| self.error_at(&item.path_span, message))?;
        }
        let blame = |message: String| {
            let paths: Vec<_> = overrides.iter().map(|o| o.path.as_str()).collect();
            let span = overrides
                .last()
                .map(|o| o.value_span.clone())
                .unwrap_or(0..0);
            self.error_at(
                &span,
                format!(
                    "with the overrides of this point ({}): {message}",
                    paths.join(", ")
                ),
            )
        };
        let text = toml::to_string(&document).map_err(|e| blame(e.to_string()))?;
        let file: ScenarioFile =
            toml::from_str(&text).map_err(|e| blame(e.message().to_string()))?;
        validate(&file).map_err(|(_, message)| blame(message))
    }
}

fn to_override((path, value): (&Spanned<String>, &Spanned<toml::Value>)) -> Override {
    Override {
        path: path.get_ref().clone(),
        value: value.get_ref().clone(),
        path_span: path.span(),
        value_span: value.span(),
    }
}

/// Top-level tables whose keys are names the user chose.
const USER_NAMED_MAPS: [&str; 3] = ["hosts", "links", "cases"];

/// Sets `path` (dotted) in a TOML tree. Top-level tables and the named entries of `hosts`,
/// `links` and `cases` must exist (so a typo in a link or case name is an error); deeper tables
/// and the last key may be new (a misspelt field is then rejected as an unknown key).
pub(crate) fn set_path(
    root: &mut toml::Table,
    path: &str,
    value: toml::Value,
) -> Result<(), String> {
    let keys: Vec<&str> = path.split('.').collect();
    let Some((last, parents)) = keys
        .split_last()
        .filter(|_| keys.iter().all(|k| !k.is_empty()))
    else {
        return Err(format!(
            "`{path}` is not a dotted path such as \"links.access.b_to_a.delay\""
        ));
    };
    let mut table = root;
    let mut walked = Vec::new();
    for key in parents {
        walked.push(*key);
        // Entries of the maps named by the user (a link, a host, a case) must exist, so a typo
        // in their name is reported as such; optional tables below them (a link direction left
        // at its defaults) are created.
        let user_named = walked.len() == 2 && USER_NAMED_MAPS.contains(&walked[0]);
        if !table.contains_key(*key) && !user_named && walked.len() > 1 {
            table.insert(key.to_string(), toml::Value::Table(toml::Table::new()));
        }
        if !table.contains_key(*key) {
            let known: Vec<_> = table.keys().cloned().collect();
            return Err(format!(
                "path `{path}`: `{}` does not exist in the scenario (there: {})",
                walked.join("."),
                known.join(", ")
            ));
        }
        table = match table.get_mut(*key) {
            Some(toml::Value::Table(inner)) => inner,
            _ => {
                return Err(format!(
                    "`{}` in path `{path}` is a value, not a table",
                    walked.join(".")
                ))
            }
        };
    }
    table.insert(last.to_string(), value);
    Ok(())
}

/// The x coordinate of a sweep value: a number as is, a loss model's mean rate, a duration in
/// ms, a size in bytes, a rate in bit/s. None when it has no natural number.
pub(crate) fn derived_axis_value(value: &toml::Value) -> Option<f64> {
    match value {
        toml::Value::Integer(i) => Some(*i as f64),
        toml::Value::Float(f) => Some(*f),
        toml::Value::String(text) => HumanDuration::parse(text)
            .map(|d| d.as_millis_f64())
            .or_else(|_| ByteSize::parse(text).map(|b| b.0 as f64))
            .or_else(|_| Rate::parse(text).map(|r| r.0 as f64))
            .ok(),
        toml::Value::Table(_) => value
            .clone()
            .try_into::<LossSpec>()
            .ok()
            .map(|l| l.mean_rate()),
        _ => None,
    }
}
