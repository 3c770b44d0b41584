//! midway-lab: experiments on emulated networks, one command each.
//!
//! `midway lab run SCENARIO.toml` reads a scenario file ([`LoadedScenario`]: hosts, emulated
//! links, workload, cases, experiments with sweeps), expands it into points ([`build_plan`]:
//! experiments x sweep values x cases x repetitions), and runs each point ([`run`]) on a fresh
//! network-namespace topology from `midway-labnet`: the case's proxy (the real midway binary,
//! HAProxy or Squid) on the proxy host, a workload between client and server hosts (bulk
//! transfers, commands, or web page loads). Every point appends one
//! `midway_report::RunRecord` line to `results.jsonl`; at the end `midway_report` writes the
//! markdown report and plots.
//!
//! Layers (private modules): `units` and `scenario` (parsing and validation, no I/O but reading
//! the file), `plan` and `cases` (pure), `workload` (sockets, testable on loopback), `web`
//! (midway-web's origin, loader and Chromium in the hosts), `runner` (namespaces, processes),
//! `cli` (the `midway lab` subcommands, [`LabCommand`] and [`execute`]), `artifact` (`midway lab
//! artifact`: a subset of every reproduction rerun, its verdicts set beside the committed ones).
#![forbid(unsafe_code)]

mod artifact;
mod cases;
mod cli;
mod concurrency;
mod ecmp;
mod netlog;
mod netstat;
mod plan;
mod provenance;
mod runner;
mod scenario;
mod slurm;
mod time;
mod units;
mod web;
mod workload;

pub use artifact::ArtifactArgs;
pub use cli::{check_summary, execute, run, LabCommand, RunOptions, RunSummary};
pub use ecmp::{run_ecmp, EcmpOptions};
pub use plan::{build_plan, PlanOptions, Point};
pub use scenario::{ArtifactForm, BulkAmount, LoadedScenario, Scenario, ScenarioError, Workload};
