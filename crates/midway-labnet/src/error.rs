//! Errors of the lab network layer.

use std::path::PathBuf;

/// Everything that can go wrong while building, using or removing a lab topology.
///
/// Validation variants (`UnknownHost`, `DuplicateHost`, ...) are returned before anything is
/// created, so a bad spec never leaves state behind.
#[derive(Debug, thiserror::Error)]
pub enum LabNetError {
    #[error("the lab needs root (it creates network namespaces); run it with sudo or as root")]
    NotRoot,
    #[error("the topology has no hosts")]
    NoHosts,
    #[error("host name {name:?} is invalid: use 1 to {max} characters from a-z, 0-9, '_' and '-', starting with a letter")]
    InvalidHostName { name: String, max: usize },
    #[error("host {0:?} is defined twice")]
    DuplicateHost(String),
    #[error("link #{index} names host {host:?}, which is not defined (hosts: {known})")]
    UnknownHost {
        index: usize,
        host: String,
        known: String,
    },
    #[error("link #{index} joins host {host:?} to itself")]
    SelfLink { index: usize, host: String },
    #[error(
        "hosts {a:?} and {b:?} are joined by more than one link; one link per pair is supported"
    )]
    DuplicateLink { a: String, b: String },
    #[error("the topology has {count} links; at most {max} are supported (one /24 per link)")]
    TooManyLinks { count: usize, max: usize },
    #[error("tag {tag:?} is invalid: use 1 to {max} characters from a-z and 0-9")]
    InvalidTag { tag: String, max: usize },
    #[error("network namespace {0:?} already exists (another run with the same tag, or a leftover: run `midway lab clean`)")]
    NameTaken(String),
    #[error("tag {tag:?} is in use by the live process {pid}")]
    TagInUse { tag: String, pid: i32 },
    #[error("no host {0:?} in this topology")]
    NoSuchHost(String),
    #[error("hosts {a:?} and {b:?} are not joined by a direct link")]
    NotNeighbours { a: String, b: String },
    #[error("could not run {program:?}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("{what} {path:?}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not enter network namespace {path:?}")]
    EnterNamespace {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("link #{index} ({a} -> {b}) is configured wrongly")]
    InvalidLinkConfig {
        index: usize,
        a: String,
        b: String,
        #[source]
        source: midway_linkemu::ConfigError,
    },
    #[error("the link emulator between {a:?} and {b:?} failed to start")]
    LinkEmulator {
        a: String,
        b: String,
        #[source]
        source: midway_linkemu::DriverError,
    },
    #[error("could not install the signal handlers")]
    Signals(#[source] std::io::Error),
    #[error("the lab is shutting down after a signal; no new topology is built")]
    ShuttingDown,
    #[error("teardown left things behind: {0}")]
    Teardown(String),
    #[error("selftest: {0}")]
    Selftest(String),
    #[error("selftest option {name} is invalid: {why}")]
    SelftestOption { name: &'static str, why: String },
    #[error("selftest measurement in host {host:?} failed")]
    Measure {
        host: String,
        #[source]
        source: std::io::Error,
    },
}

impl LabNetError {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LabNetError::Io {
            what,
            path: path.into(),
            source,
        }
    }
}
