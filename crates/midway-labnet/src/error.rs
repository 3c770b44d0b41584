//! Errors of the lab network layer.

use std::path::PathBuf;

/// Everything that can go wrong while building, using or removing a lab topology.
///
/// Validation variants (`UnknownHost`, `DuplicateHost`, ...) are returned before anything is
/// created, so a bad spec never leaves state behind.
#[derive(Debug, thiserror::Error)]
pub enum LabNetError {
    /// The process is not root, which creating network namespaces needs.
    #[error("the lab needs root (it creates network namespaces); run it with sudo or as root")]
    NotRoot,
    /// The topology spec lists no hosts.
    #[error("the topology has no hosts")]
    NoHosts,
    /// A host name breaks the naming rule.
    #[error("host name {name:?} is invalid: use 1 to {max} characters from a-z, 0-9, '_' and '-', starting with a letter")]
    InvalidHostName {
        /// The rejected name.
        name: String,
        /// The longest accepted name, in characters.
        max: usize,
    },
    /// Two hosts have this name.
    #[error("host {0:?} is defined twice")]
    DuplicateHost(String),
    /// A link names a host that the spec does not define.
    #[error("link #{index} names host {host:?}, which is not defined (hosts: {known})")]
    UnknownHost {
        /// The link's position in the spec, from 0.
        index: usize,
        /// The unknown host name.
        host: String,
        /// The defined host names, comma-separated.
        known: String,
    },
    /// A link has the same host at both ends.
    #[error("link #{index} joins host {host:?} to itself")]
    SelfLink {
        /// The link's position in the spec, from 0.
        index: usize,
        /// The host at both ends.
        host: String,
    },
    /// Two links join the same pair of hosts.
    #[error(
        "hosts {a:?} and {b:?} are joined by more than one link; one link per pair is supported"
    )]
    DuplicateLink {
        /// One host of the pair.
        a: String,
        /// The other host of the pair.
        b: String,
    },
    /// The spec has more links than there are link subnets.
    #[error("the topology has {count} links; at most {max} are supported (one /24 per link)")]
    TooManyLinks {
        /// How many links the spec has.
        count: usize,
        /// How many links are supported.
        max: usize,
    },
    /// A topology tag breaks the tag rule.
    #[error("tag {tag:?} is invalid: use 1 to {max} characters from a-z and 0-9")]
    InvalidTag {
        /// The rejected tag.
        tag: String,
        /// The longest accepted tag, in characters.
        max: usize,
    },
    /// A namespace this topology needs already exists; holds the namespace name.
    #[error("network namespace {0:?} already exists (another run with the same tag, or a leftover: run `midway lab clean`)")]
    NameTaken(String),
    /// Another live process owns the tag (its pid file names it).
    #[error("tag {tag:?} is in use by the live process {pid}")]
    TagInUse {
        /// The tag.
        tag: String,
        /// The process id of its live owner.
        pid: i32,
    },
    /// The topology has no host of this name.
    #[error("no host {0:?} in this topology")]
    NoSuchHost(String),
    /// Two hosts were taken for neighbours but no link joins them.
    #[error("hosts {a:?} and {b:?} are not joined by a direct link")]
    NotNeighbours {
        /// One host.
        a: String,
        /// The other host.
        b: String,
    },
    /// A program (`ethtool`) could not be run or failed; the error names the command line and
    /// quotes its stderr.
    #[error(transparent)]
    Program(midway_sys::command::CommandError),
    /// A netlink request (a link, an address, a route) in a namespace failed.
    #[error("netlink request in network namespace {netns:?} failed")]
    Netlink {
        /// The namespace's name.
        netns: String,
        /// The request and the kernel's answer.
        #[source]
        source: midway_sys::netlink::NetlinkError,
    },
    /// A sysctl could not be read or written (the error names its file).
    #[error(transparent)]
    Sysctl(std::io::Error),
    /// A file-system operation failed.
    #[error("{what} {path:?}")]
    Io {
        /// What was being done, e.g. "cannot write".
        what: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The error from the operation.
        #[source]
        source: std::io::Error,
    },
    /// A thread could not enter a host's network namespace.
    #[error("could not enter network namespace {path:?}")]
    EnterNamespace {
        /// The namespace's path under `/run/netns`.
        path: PathBuf,
        /// The error from opening it or from `setns`.
        #[source]
        source: std::io::Error,
    },
    /// A link's direction configuration is invalid.
    #[error("link #{index} ({a} -> {b}) is configured wrongly")]
    InvalidLinkConfig {
        /// The link's position in the spec, from 0.
        index: usize,
        /// The host at the sending end of the bad direction.
        a: String,
        /// The host at the receiving end of the bad direction.
        b: String,
        /// What is wrong with the configuration.
        #[source]
        source: midway_linkemu::ConfigError,
    },
    /// The emulator of a link could not be started.
    #[error("the link emulator between {a:?} and {b:?} failed to start")]
    LinkEmulator {
        /// The host at end a of the link.
        a: String,
        /// The host at end b of the link.
        b: String,
        /// Why the emulator did not start.
        #[source]
        source: midway_linkemu::DriverError,
    },
    /// The signal handlers or their thread could not be installed.
    #[error("could not install the signal handlers")]
    Signals(#[source] std::io::Error),
    /// A signal started the lab's shutdown, so no new topology is built.
    #[error("the lab is shutting down after a signal; no new topology is built")]
    ShuttingDown,
    /// Tearing a topology down failed; holds a description of what was left behind.
    #[error("teardown left things behind: {0}")]
    Teardown(String),
    /// A selftest measurement could not be made; holds the reason.
    #[error("selftest: {0}")]
    Selftest(String),
    /// A selftest option is out of range.
    #[error("selftest option {name} is invalid: {why}")]
    SelftestOption {
        /// The option's field name in `SelftestOptions`.
        name: &'static str,
        /// What the value must be.
        why: String,
    },
    /// A socket operation of a measurement inside a host failed.
    #[error("selftest measurement in host {host:?} failed")]
    Measure {
        /// The host the socket lives in.
        host: String,
        /// The error from the socket operation.
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
