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
mod link;
mod metrics;
mod neighbour;
mod route;
mod rule;
mod tcp_metrics;

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

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
    socket: Socket,
    sequence: u32,
}

impl Netlink {
    /// A socket in the calling thread's network namespace.
    pub fn open() -> Result<Netlink, NetlinkError> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Open)?;
        socket.bind_auto().map_err(NetlinkError::Open)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(NetlinkError::Open)?;
        // Errors carry the offending attribute's message (extended ACK), and a dump that does
        // not fit the default buffer is not cut short.
        let _ = socket.set_ext_ack(true);
        nix::sys::socket::setsockopt(
            &socket,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as i64, 0),
        )
        .map_err(|e| NetlinkError::Open(e.into()))?;
        Ok(Netlink {
            socket,
            sequence: 0,
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
        let sequence = self.send(message, NLM_F_REQUEST | NLM_F_ACK | flags, request)?;
        loop {
            for reply in self.receive(sequence, request)? {
                match reply {
                    NetlinkPayload::Error(e) => return kernel_result(e, request),
                    NetlinkPayload::Done(_) => return Ok(()),
                    _ => {}
                }
            }
        }
    }

    /// Sends a dump request and collects every message of the answer.
    fn dump(
        &mut self,
        message: RouteNetlinkMessage,
        request: &str,
    ) -> Result<Vec<RouteNetlinkMessage>, NetlinkError> {
        let sequence = self.send(message, NLM_F_REQUEST | NLM_F_DUMP, request)?;
        let mut messages = Vec::new();
        loop {
            for reply in self.receive(sequence, request)? {
                match reply {
                    NetlinkPayload::InnerMessage(inner) => messages.push(inner),
                    NetlinkPayload::Done(_) => return Ok(messages),
                    NetlinkPayload::Error(e) => {
                        kernel_result(e, request)?;
                        return Ok(messages);
                    }
                    _ => {}
                }
            }
        }
    }

    fn send(
        &mut self,
        message: RouteNetlinkMessage,
        flags: u16,
        request: &str,
    ) -> Result<u32, NetlinkError> {
        self.sequence = self.sequence.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.sequence;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
        packet.finalize();
        let mut buffer = vec![0; packet.buffer_len()];
        packet.serialize(&mut buffer);
        self.socket
            .send(&buffer, 0)
            .map_err(|source| io_error(request, source))?;
        Ok(self.sequence)
    }

    /// The payloads of one datagram that answer request `sequence` (answers to earlier,
    /// abandoned requests are skipped).
    fn receive(
        &mut self,
        sequence: u32,
        request: &str,
    ) -> Result<Vec<NetlinkPayload<RouteNetlinkMessage>>, NetlinkError> {
        let (datagram, _) = self
            .socket
            .recv_from_full()
            .map_err(|source| io_error(request, source))?;
        let mut payloads = Vec::new();
        let mut offset = 0;
        while offset < datagram.len() {
            let bytes = &datagram[offset..];
            let message =
                NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes).map_err(|e| {
                    NetlinkError::Decode {
                        request: request.to_owned(),
                        message: e.to_string(),
                    }
                })?;
            let length = message.header.length as usize;
            if length == 0 {
                break;
            }
            offset += (length + 3) & !3;
            if message.header.sequence_number == sequence {
                payloads.push(message.payload);
            }
        }
        Ok(payloads)
    }
}

fn kernel_result(
    error: netlink_packet_core::ErrorMessage,
    request: &str,
) -> Result<(), NetlinkError> {
    match error.code {
        None => Ok(()),
        Some(_) => Err(NetlinkError::Kernel {
            request: request.to_owned(),
            source: error.to_io(),
        }),
    }
}

fn io_error(request: &str, source: io::Error) -> NetlinkError {
    NetlinkError::Io {
        request: request.to_owned(),
        source,
    }
}
