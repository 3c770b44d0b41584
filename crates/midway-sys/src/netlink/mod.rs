//! rtnetlink: routes (with their TCP metrics), policy rules, links, veth pairs and addresses,
//! as `ip route`, `ip rule`, `ip link` and `ip addr` would set them, without iproute2.
//!
//! A [`Netlink`] is a synchronous request/acknowledge socket. It belongs to the network
//! namespace it was opened in for its whole life, whichever thread uses it later:
//! [`Netlink::open`] takes the calling thread's, [`Netlink::open_in`] opens the socket on a
//! short-lived thread that has joined the given namespace. Every request waits for the kernel's
//! acknowledgement (at most [`REPLY_TIMEOUT`]), so an error comes back from the call that caused
//! it, with the errno and the request in `ip`'s words.
//!
//! Built on netlink-sys and netlink-packet-route (the message types rtnetlink uses too), not on
//! rtnetlink's asynchronous handle: midway's callers are synchronous (start-up, `Drop`, the
//! lab's set-up threads inside namespaces), and a socket created where it is needed follows the
//! namespace without a runtime and a connection task per namespace.

mod address;
mod channel;
mod link;
mod metrics;
mod neighbour;
mod route;
mod rule;
mod tcp_metrics;

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::protocols::NETLINK_ROUTE;

use channel::Channel;

pub use address::AddressSpec;
pub use link::{LinkInfo, VethEnd};
pub use metrics::{Metric, MetricParseError, MetricValue, RouteMetric, RouteMetrics};
pub use neighbour::PermanentNeighbour;
pub use route::{Family, Route, RouteKind, RouteProtocol, RouteScope, TABLE_LOCAL, TABLE_MAIN};
pub use rule::FwmarkRule;
pub use tcp_metrics::{TcpMetricsCache, TcpMetricsEntry};

/// How long a request waits for the kernel's answer before it fails with `TimedOut`.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A netlink request that failed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// No netlink socket could be opened (or configured).
    #[error("cannot open a netlink socket: {0}")]
    Open(#[source] io::Error),
    /// The network namespace to open the socket in could not be entered.
    #[error("cannot open a netlink socket in network namespace {}: {source}", path.display())]
    Namespace {
        /// The namespace's handle.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The kernel refused the request.
    #[error("`{request}` failed: {source}")]
    Kernel {
        /// The request, in `ip`'s words (`route append 10.0.0.0/24 dev 3 table 100`).
        request: String,
        /// The errno the kernel answered with.
        #[source]
        source: io::Error,
    },
    /// Sending or receiving failed, or no answer came within [`REPLY_TIMEOUT`].
    #[error("netlink I/O for `{request}` failed: {source}")]
    Io {
        /// The request.
        request: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The kernel's answer could not be decoded.
    #[error("cannot decode the kernel's answer to `{request}`: {message}")]
    Decode {
        /// The request.
        request: String,
        /// What did not parse.
        message: String,
    },
    /// No interface has that name in the socket's namespace.
    #[error("no network interface named {0:?}")]
    NoSuchLink(String),
}

impl NetlinkError {
    /// The errno of a request the kernel refused.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Whether the kernel said the object does not exist (a rule or route to delete that is
    /// gone already: `ENOENT`, `ESRCH`; a device: `ENODEV`).
    pub fn is_not_found(&self) -> bool {
        matches!(self, NetlinkError::NoSuchLink(_))
            || matches!(
                self.errno(),
                Some(libc::ENOENT) | Some(libc::ESRCH) | Some(libc::ENODEV)
            )
    }

    /// Whether the kernel said the object exists already (`EEXIST`).
    pub fn is_exists(&self) -> bool {
        self.errno() == Some(libc::EEXIST)
    }
}

/// A synchronous rtnetlink socket in one network namespace; see the module documentation.
#[derive(Debug)]
pub struct Netlink {
    channel: Channel,
}

impl Netlink {
    /// A socket in the calling thread's network namespace.
    pub fn open() -> Result<Netlink, NetlinkError> {
        Ok(Netlink {
            channel: Channel::open(NETLINK_ROUTE)?,
        })
    }

    /// A socket in the network namespace whose handle is `path` (`/run/netns/NAME`,
    /// `/proc/PID/ns/net`), opened on a thread that joins it; the calling thread stays where
    /// it is.
    pub fn open_in(path: &Path) -> Result<Netlink, NetlinkError> {
        crate::netns::run_in(path, Netlink::open).map_err(|source| NetlinkError::Namespace {
            path: path.to_owned(),
            source,
        })?
    }

    /// A socket in the network namespace named `name` (in `/run/netns`).
    pub fn open_in_named(name: &str) -> Result<Netlink, NetlinkError> {
        Netlink::open_in(&crate::netns::netns_path(name))
    }

    /// Sends `message` with `flags` (besides `NLM_F_REQUEST | NLM_F_ACK`) and waits for the
    /// acknowledgement.
    fn request(
        &mut self,
        message: RouteNetlinkMessage,
        flags: u16,
        request: &str,
    ) -> Result<(), NetlinkError> {
        self.channel
            .exchange(message, NLM_F_ACK | flags, request)
            .map(drop)
    }

    /// Sends a dump request and collects every message of the answer.
    fn dump(
        &mut self,
        message: RouteNetlinkMessage,
        request: &str,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        self.channel.exchange(message, NLM_F_DUMP, request)
    }
}
