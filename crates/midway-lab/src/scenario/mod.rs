//! Scenario files: the lab's user interface.
//!
//! Stages, as for every config in midway: TOML text -> [`ScenarioFile`] (serde, unknown keys
//! rejected, unit-carrying values checked while parsing so `toml` names their line) -> checks that
//! need the whole file (host names a link refers to, cases an experiment lists, sweep paths), which
//! keep the spans of the fields they check -> [`Scenario`], the validated, typed form a point runs.
//!
//! A sweep addresses any parameter by a dotted path into the document ("links.access.b_to_a.delay").
//! The overrides of a point are applied to the parsed TOML tree, and the result goes through the
//! same stages again, so a swept value is exactly as well checked as a value written in the file.
//!
//! The module's files follow those stages: `file` (what a scenario TOML contains; a link
//! direction's `outages` and `udp` keys are in `impairments`), `validate` and
//! `validate_workload` (the checks), `model` (the validated form and its conversion to the
//! emulator's), `overrides` (sweep and `set` paths applied to the TOML tree), `artifact` (the
//! `[artifact]` subset of a reproduction).

use std::ops::Range;
use std::path::{Path, PathBuf};

mod artifact;
mod file;
mod impairments;
mod model;
mod overrides;
mod validate;
mod validate_workload;

pub use artifact::ArtifactForm;
pub(crate) use file::*;
pub use model::*;
pub(crate) use overrides::*;
pub(crate) use validate::case_workload_conflict;
use validate::{validate, validate_experiments};

/// Default TCP port of the bulk server and of commands' `{port}`.
pub(crate) const DEFAULT_SERVER_PORT: u16 = 5001;
/// Congestion control of a competing flow that names none: the overlay paper's competing flow
/// is TCP Reno.
pub(crate) const DEFAULT_COMPETING_CONGESTION_CONTROL: &str = "reno";
/// Most parallel connections of one bulk run (`workload.connections`).
pub(crate) const MAX_BULK_CONNECTIONS: u32 = 64;
/// Default port of the web workload's origin.
pub(crate) const DEFAULT_WEB_PORT: u16 = 80;
/// Web workload defaults (see `scenarios/README.md`).
pub(crate) const DEFAULT_WEB_HOST: &str = "www.lab";
/// Parallel connections per host name of the loader (and Chromium's own number).
pub(crate) const DEFAULT_CONNECTIONS_PER_HOST: u32 = 6;
/// Origin's `Cache-Control: max-age` (1 h).
pub(crate) const DEFAULT_CACHE_MAX_AGE_SECS: u64 = 3600;
/// Origin's idle keep-alive limit: Apache's default.
pub(crate) const DEFAULT_KEEPALIVE_TIMEOUT_SECS: u64 = 15;
/// Bounds that keep a web workload's description sane (a typo, not an experiment, beyond them):
/// host names,
pub(crate) const MAX_WEB_HOSTS: usize = 64;
/// pages per run,
pub(crate) const MAX_WEB_PAGES: u32 = 10_000;
/// objects per page,
pub(crate) const MAX_WEB_OBJECTS: u32 = 10_000;
/// connections per host name.
pub(crate) const MAX_CONNECTIONS_PER_HOST: u32 = 256;
/// Default limit on one workload run; a point that takes longer fails with a timeout.
pub(crate) const DEFAULT_WORKLOAD_TIMEOUT_SECS: u64 = 300;
/// Default base seed when the file gives none.
pub(crate) const DEFAULT_SEED: u64 = 1;

/// Why a scenario file cannot be used. `location` is "FILE:LINE:COLUMN".
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read scenario file {path}")]
    Read {
        /// The scenario file.
        path: PathBuf,
        /// The error from reading it.
        #[source]
        source: std::io::Error,
    },
    /// Syntax, unknown keys, missing keys and bad values: toml's message names line and column.
    #[error("{path}: {message}")]
    Parse {
        /// The scenario file.
        path: PathBuf,
        /// toml's message, with line and column.
        message: String,
    },
    /// The file parses but breaks a rule that needs the whole file (an unknown host, case or
    /// sweep path, a case that cannot run the workload, ...).
    #[error("{location}: {message}")]
    Invalid {
        /// Where the offending value starts, "FILE:LINE:COLUMN" (1-based).
        location: String,
        /// What is wrong.
        message: String,
    },
}

/// Where in the text a span starts, as "FILE:LINE:COLUMN" (1-based).
fn location(path: &Path, text: &str, span: &Range<usize>) -> String {
    let start = span.start.min(text.len());
    let before = &text[..start];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("{}:{line}:{column}", path.display())
}

/// A scenario file read from disk: its text, its TOML tree (for overrides) and its base form.
#[derive(Debug, Clone)]
pub struct LoadedScenario {
    /// Where the scenario was read from (names it in error messages).
    pub path: PathBuf,
    /// The file's text, as read.
    pub text: String,
    /// The file's TOML tree, to which each point's overrides are applied.
    pub document: toml::Table,
    /// The file as parsed, before the checks that need the whole file.
    pub file: ScenarioFile,
    /// The validated scenario without any point's overrides.
    pub base: Scenario,
}

impl LoadedScenario {
    /// Reads and checks the scenario file at `path`.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_text(path, text)
    }

    /// Checks a scenario's `text`; `path` names it in error messages.
    pub fn from_text(path: &Path, text: String) -> Result<Self, ScenarioError> {
        let parse_error = |e: toml::de::Error| ScenarioError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        };
        let document: toml::Table = toml::from_str(&text).map_err(parse_error)?;
        let file: ScenarioFile = toml::from_str(&text).map_err(parse_error)?;
        let here = |span: &Range<usize>, message: String| ScenarioError::Invalid {
            location: location(path, &text, span),
            message,
        };
        let base = validate(&file).map_err(|(span, message)| here(&span, message))?;
        validate_experiments(&file, &base).map_err(|(span, message)| here(&span, message))?;
        artifact::validate_artifact(&file).map_err(|(span, message)| here(&span, message))?;
        let loaded = LoadedScenario {
            path: path.to_path_buf(),
            text,
            document,
            file,
            base,
        };
        loaded.check_every_point()?;
        Ok(loaded)
    }

    /// Every override of every point (with and without `--quick`) must give a valid scenario,
    /// in which every case of the experiment can run: fail now, not mid-run.
    fn check_every_point(&self) -> Result<(), ScenarioError> {
        for experiment in &self.file.experiments {
            let check_cases = |scenario: &Scenario| -> Result<(), ScenarioError> {
                for case in &experiment.cases {
                    if let Some(message) =
                        case_workload_conflict(scenario, &scenario.cases[case.get_ref()])
                    {
                        return Err(self.error_at(
                            &case.span(),
                            format!("experiment `{}`: {message}", experiment.name.get_ref()),
                        ));
                    }
                }
                Ok(())
            };
            for quick in [false, true] {
                let fixed = self.fixed_overrides(experiment, quick);
                match &experiment.sweep {
                    None => {
                        check_cases(&self.point_scenario(&fixed)?)?;
                    }
                    Some(sweep) => {
                        for index in 0..sweep.values.get_ref().len() {
                            let mut all = fixed.clone();
                            all.extend(self.sweep_overrides(sweep, index));
                            check_cases(&self.point_scenario(&all)?)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// An [`ScenarioError::Invalid`] blaming `span` of this file's text.
    pub(super) fn error_at(&self, span: &Range<usize>, message: String) -> ScenarioError {
        ScenarioError::Invalid {
            location: location(&self.path, &self.text, span),
            message,
        }
    }
}

#[cfg(test)]
mod tests;
