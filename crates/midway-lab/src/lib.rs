//! midway-lab: experiments on emulated networks, one command each.
//!
//! `midway lab run SCENARIO.toml` reads a [scenario file](scenario) (hosts, emulated links,
//! workload, cases, experiments with sweeps), expands it into [points](plan) (experiments x sweep
//! values x cases x repetitions), and [runs](runner) each point on a fresh network-namespace
//! topology from `midway-labnet`: the case's proxy (the real midway binary, HAProxy or Squid) on
//! the proxy host, a [workload] between client and server hosts (bulk transfers, commands, or
//! [web] page loads). Every point appends one
//! `midway_report::RunRecord` line to `results.jsonl`; at the end `midway_report` writes the
//! markdown report and plots.
//!
//! Layers: [`units`] and [`scenario`] (parsing and validation, no I/O but reading the file),
//! [`plan`] and [`cases`] (pure), [`workload`] (sockets, testable on loopback), [`web`]
//! (midway-web's origin, loader and Chromium in the hosts), [`runner`]
//! (namespaces, processes), [`cli`] (the `midway lab` subcommands).

pub mod cases;
pub mod cli;
pub mod netstat;
pub mod plan;
pub mod runner;
pub mod scenario;
pub mod time;
pub mod units;
pub mod web;
pub mod workload;

pub use cli::{execute, LabCommand};
pub use scenario::{LoadedScenario, Scenario, ScenarioError};
