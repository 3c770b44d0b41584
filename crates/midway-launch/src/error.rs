//! What can go wrong while starting, waiting for or signalling a launched process.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// A launch that failed; every variant names the program, and the waits quote its log's end.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The log file could not be created.
    #[error("cannot create the log {path}")]
    Log {
        /// The log file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The process could not be started here.
    #[error("cannot start {program}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The process could not be started in a named network namespace.
    #[error("cannot start {program} in network namespace {netns}")]
    SpawnInNetns {
        /// The program.
        program: String,
        /// The namespace's name.
        netns: String,
        /// Why.
        #[source]
        source: midway_sys::command::CommandError,
    },
    /// The process could not be started in a lab host.
    #[error("cannot start {program} in host {host}")]
    SpawnInHost {
        /// The program.
        program: String,
        /// The host.
        host: String,
        /// Why (boxed: the lab's error is large, and every `Result` here carries this type).
        #[source]
        source: Box<midway_labnet::LabNetError>,
    },
    /// The process ended while it was being waited for.
    #[error("{program} exited during start-up ({status}); its log ends with:\n{log_tail}")]
    Exited {
        /// The program.
        program: String,
        /// How it ended.
        status: ExitStatus,
        /// The end of its log.
        log_tail: String,
    },
    /// What was waited for did not happen in time.
    #[error("{program}: no {what} within {limit:?}; its log ends with:\n{log_tail}")]
    NotReady {
        /// The program.
        program: String,
        /// What was waited for.
        what: String,
        /// How long.
        limit: Duration,
        /// The end of its log.
        log_tail: String,
    },
    /// The caller's readiness probe failed (not "not yet": it could not look).
    #[error("cannot check whether {program} is ready")]
    Probe {
        /// The program.
        program: String,
        /// The probe's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A signal could not be sent.
    #[error("cannot send {signal} to {program}")]
    Signal {
        /// The program.
        program: String,
        /// The signal.
        signal: nix::sys::signal::Signal,
        /// Why.
        #[source]
        source: nix::errno::Errno,
    },
    /// Its state could not be read (`waitpid` failed).
    #[error("cannot wait for {program}")]
    Wait {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
