//! Typed errors: why the proxy could not start ([`ProxyError`]), why one connection ended
//! before relaying ([`SetupError`], with its metric reason and SOCKS5 reply), and how both
//! are logged ([`ErrorChain`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use midway_http::HttpError;
use midway_tcp::{KnobError, RouteKnobsError};

use crate::nft::NftError;
use crate::peer::header::{HeaderError, PeerStatus};
use crate::peer::replay::ReplayError;
use crate::socks5::{self, ReplyCode};

/// Why the proxy could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A listener names a profile that does not exist (validation normally catches this).
    #[error("listener {listener:?} uses profile {profile:?}, which is not defined")]
    UnknownProfile {
        /// The listener's name.
        listener: String,
        /// The missing profile's name.
        profile: String,
    },
    /// A profile a listener uses asks for a knob this kernel lacks.
    #[error("profile {profile:?} cannot be used on this kernel")]
    ProfileUnsupported {
        /// The profile's name.
        profile: String,
        /// What the kernel cannot do.
        #[source]
        source: Box<KnobError>,
    },
    /// Route-metric knobs (policy routing tables, marks) could not be installed.
    #[error("cannot install route-metric knobs (routing tables from {table_base}, marks from {mark_base:#x})")]
    RouteKnobs {
        /// First routing table tried.
        table_base: u32,
        /// First fwmark tried.
        mark_base: u32,
        /// Why installing the tables and rules failed.
        #[source]
        source: RouteKnobsError,
    },
    /// A listening socket could not be set up.
    #[error("listener {listener:?}: cannot listen on {addr}")]
    Bind {
        /// The listener's name.
        listener: String,
        /// The configured address.
        addr: SocketAddr,
        /// Why binding or listening failed.
        #[source]
        source: io::Error,
    },
    /// The listener's local profile could not be applied to its listening socket.
    #[error("listener {listener:?}: cannot put profile {profile:?} on the listening socket")]
    ListenerProfile {
        /// The listener's name.
        listener: String,
        /// The profile's name.
        profile: String,
        /// Why applying the profile failed.
        #[source]
        source: Box<KnobError>,
    },
    /// `carry_dscp`: the listening socket would not keep the received traffic class.
    #[error("listener {listener:?}: cannot make the listening socket keep its clients' DSCP (carry_dscp)")]
    KeepClientClass {
        /// The listener's name.
        listener: String,
        /// Why the socket option failed.
        #[source]
        source: io::Error,
    },
    /// `socket_memory` is a budget, but the kernel's TCP memory limits cannot be read.
    #[error("proxy.socket_memory: cannot read the kernel's TCP memory limits (net.ipv4.tcp_mem, tcp_rmem, tcp_wmem); set socket_memory = \"off\" to run without the guard")]
    SocketMemoryLimits(#[source] io::Error),
    /// The `/metrics` endpoint could not be bound.
    #[error("metrics endpoint: cannot listen on {addr}")]
    MetricsBind {
        /// The configured address.
        addr: SocketAddr,
        /// Why binding failed.
        #[source]
        source: io::Error,
    },
    /// Spool files of an earlier run could not be removed.
    #[error("spool directory {dir}: cannot remove leftover spool files")]
    SpoolClean {
        /// The spool directory.
        dir: PathBuf,
        /// Why removing the files failed.
        #[source]
        source: io::Error,
    },
    /// The open-file limit could not be read or raised.
    #[error("cannot read or raise the open-file limit (RLIMIT_NOFILE)")]
    OpenFileLimit(#[source] io::Error),
    /// `max_connections` needs more descriptors than the open-file limit allows.
    #[error(
        "max_connections = {max_connections} needs {needed} open files, but the open-file limit \
         is {limit} (hard limit {hard}), room for {allowed} connections: lower max_connections \
         (or max_pipes), or raise the limit (LimitNOFILE= in the unit, `ulimit -n`; as root \
         midway raises it itself up to fs.nr_open)"
    )]
    TooFewOpenFiles {
        /// The configured total.
        max_connections: usize,
        /// Open files that total needs.
        needed: u64,
        /// The soft limit, after raising it.
        limit: u64,
        /// The hard limit.
        hard: u64,
        /// Connections the limit has room for.
        allowed: u64,
    },
    /// The relay's spool or pipes could not be set up.
    #[error("cannot set up relay resources")]
    Relay(#[source] midway_relay::RelayError),
    /// The nftables table or policy routing could not be installed.
    #[error("cannot install transparent interception (nftables / policy routing)")]
    Intercept(#[source] NftError),
    /// An HTTP listener's engine could not be set up.
    #[error("listener {listener:?}: cannot set up the HTTP engine")]
    Http {
        /// The listener's name.
        listener: String,
        /// Why the engine could not be set up.
        #[source]
        source: HttpError,
    },
    /// A reload was refused; the running configuration stays.
    #[error("reload refused: {reason}")]
    ReloadRefused {
        /// What the new configuration changes that a reload cannot apply, or what failed.
        reason: String,
    },
    /// The proxy has stopped; it takes no more reloads.
    #[error("the proxy has stopped")]
    Stopped,
    /// A binary upgrade could not take over from the running midway.
    #[error("cannot take over from the running midway")]
    TakeOver(#[source] super::handover::HandoverError),
    /// The control socket `[control] socket` names could not be opened.
    #[error("control socket {path}: {problem}")]
    ControlSocket {
        /// The configured path.
        path: std::path::PathBuf,
        /// What went wrong.
        problem: &'static str,
        /// The system's error, if any.
        #[source]
        source: Option<io::Error>,
    },
}

/// Why a connection ended before relaying.
#[derive(Debug, thiserror::Error)]
pub(super) enum SetupError {
    #[error("SOCKS5 handshake timed out")]
    HandshakeTimeout,
    #[error(transparent)]
    Handshake(#[from] socks5::HandshakeError),
    #[error("original destination is this listener itself (a loop)")]
    Loop,
    #[error("cannot read the original destination")]
    OriginalDestination(#[source] io::Error),
    #[error("cannot resolve {target}")]
    Resolve {
        target: String,
        #[source]
        source: io::Error,
    },
    #[error("{target} resolved to no address")]
    NoAddress { target: String },
    #[error("connect to {target} timed out")]
    ConnectTimeout { target: String },
    #[error("connect to {target} failed")]
    Connect {
        target: String,
        #[source]
        source: io::Error,
    },
    #[error("spoofing: client {client} and target {target} are of different address families")]
    SpoofFamily { client: IpAddr, target: SocketAddr },
    #[error("TCP profile")]
    Profile(#[from] KnobError),
    #[error("an HTTP listener's connection reached the byte relay")]
    NotARelayListener,
    #[error("{target} is in proxy.denied_destinations")]
    DestinationDenied { target: String },
    #[error("cannot set TCP_NODELAY")]
    Nodelay(#[source] io::Error),
    /// A peer listener refused what a connecting midway sent: reset, counted, never relayed.
    #[error("peer header from midway {from} refused")]
    PeerRefused {
        from: SocketAddr,
        #[source]
        refusal: PeerRefusal,
    },
    /// A warm connection from another midway ended (or shutdown began) before its header:
    /// normal, not a refusal.
    #[error("warm connection closed before a header came")]
    PeerIdleClosed,
    /// The next midway answered a header with a failure status.
    #[error("peer {peer:?} could not connect onward: {status:?}")]
    PeerStatus { peer: String, status: PeerStatus },
    /// The next midway closed or reset the connection instead of answering the header (it
    /// refused the header, or it is going away).
    #[error("peer {peer:?} did not answer the header")]
    PeerHandshake {
        peer: String,
        #[source]
        source: io::Error,
    },
    /// The TLS handshake with another midway failed: an unknown or expired key (either side
    /// refused), not TLS at all, or no answer in time. Counted per reason.
    #[error("TLS handshake with midway {peer} failed ({reason})")]
    PeerTls {
        peer: String,
        reason: &'static str,
        #[source]
        source: io::Error,
    },
    /// No stream on a QUIC peer's tunnel: it is down and the peer has `fallback = "none"`,
    /// or the stream could not be opened.
    #[error("QUIC tunnel to midway {peer} unusable ({reason})")]
    PeerQuic {
        peer: String,
        reason: &'static str,
        #[source]
        source: Box<midway_quic::QuicError>,
    },
    /// The client's first bytes, sent on while the next midway answered the header, could not
    /// be read (the client reset its connection).
    #[error("cannot read the client's first bytes")]
    ClientEarlyData(#[source] io::Error),
    /// The header exchange with the next midway took longer than connect_timeout.
    #[error("peer {peer:?} did not answer the header in time")]
    PeerTimeout { peer: String },
    /// A header could not be made (a key shorter than validation allows: never).
    #[error("cannot make a peer header")]
    PeerHeader(#[source] HeaderError),
    /// A listed load balancer's PROXY header was refused, or the client it names: reset,
    /// counted, never relayed.
    #[error("PROXY header from {from} refused")]
    ProxyHeader {
        from: SocketAddr,
        #[source]
        refusal: super::proxied::ProxyHeaderRefusal,
    },
    /// The PROXY header could not be written on the remote segment (the server went away).
    #[error("cannot send the PROXY header to {target}")]
    ProxyHeaderSend {
        target: String,
        #[source]
        source: io::Error,
    },
}

/// Why a peer listener refused a connecting midway's header.
#[derive(Debug, thiserror::Error)]
pub(super) enum PeerRefusal {
    #[error("header not complete within handshake_timeout")]
    HeaderTimeout,
    #[error("cannot read the header")]
    Read(#[source] io::Error),
    #[error("malformed header")]
    Malformed(#[source] HeaderError),
    #[error("key {0:?} is not one of this listener's keys")]
    UnknownKey(String),
    #[error("key {key:?}: authentication failed")]
    BadMac {
        key: String,
        #[source]
        source: HeaderError,
    },
    #[error("key {key:?}: not fresh")]
    NotFresh {
        key: String,
        #[source]
        source: ReplayError,
    },
    #[error("hop count {hops} reaches max_hops {max}")]
    HopLimit { hops: u8, max: u8 },
    #[error("loop: chain {chain} is already relayed by this midway")]
    Loop { chain: String },
    #[error("client {0} (from the header) is not in allowed_clients")]
    ClientNotAllowed(IpAddr),
    #[error("destination {0} (from the header) is in denied_destinations")]
    DestinationDenied(SocketAddr),
    #[error("client {0} (from the header) holds max_connections_per_client connections")]
    ClientLimit(IpAddr),
}

impl PeerRefusal {
    /// The `reason` label of the refusal metrics.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            PeerRefusal::HeaderTimeout => "peer_header_timeout",
            PeerRefusal::Read(_) | PeerRefusal::Malformed(_) => "peer_bad_header",
            PeerRefusal::UnknownKey(_) => "peer_unknown_key",
            PeerRefusal::BadMac { .. } => "peer_bad_mac",
            PeerRefusal::NotFresh {
                source: ReplayError::Replayed,
                ..
            } => "peer_replay",
            PeerRefusal::NotFresh {
                source: ReplayError::OutsideWindow { .. },
                ..
            } => "peer_stale",
            PeerRefusal::NotFresh {
                source: ReplayError::Full(_),
                ..
            } => "peer_replay_guard_full",
            PeerRefusal::HopLimit { .. } => "peer_hop_limit",
            PeerRefusal::Loop { .. } => "peer_loop",
            PeerRefusal::ClientNotAllowed(_) => "peer_client_not_allowed",
            PeerRefusal::DestinationDenied(_) => "peer_denied_destination",
            PeerRefusal::ClientLimit(_) => "client_limit",
        }
    }

    /// Whether the header failed authentication (as opposed to a policy refusal).
    pub(super) fn is_auth_failure(&self) -> bool {
        matches!(
            self,
            PeerRefusal::HeaderTimeout
                | PeerRefusal::Read(_)
                | PeerRefusal::Malformed(_)
                | PeerRefusal::UnknownKey(_)
                | PeerRefusal::BadMac { .. }
                | PeerRefusal::NotFresh { .. }
        )
    }
}

impl SetupError {
    /// Whether the process ran out of descriptors or memory: the connection failed for a
    /// reason that floods (every connection fails alike until resources free up).
    pub(super) fn is_resource_exhaustion(&self) -> bool {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(err) = source {
            if let Some(io_err) = err.downcast_ref::<io::Error>() {
                if super::log_limit::is_resource_exhaustion(io_err) {
                    return true;
                }
            }
            source = err.source();
        }
        false
    }

    /// The `reason` label of the refused-connections metric.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            SetupError::HandshakeTimeout => "socks5_timeout",
            SetupError::Handshake(e) => e.reason(),
            SetupError::Loop => "loop",
            SetupError::OriginalDestination(_) => "original_destination",
            SetupError::Resolve { .. } | SetupError::NoAddress { .. } => "resolve",
            SetupError::ConnectTimeout { .. } => "connect_timeout",
            SetupError::Connect { source, .. }
                if source.raw_os_error() == Some(libc::ECONNREFUSED) =>
            {
                "connect_refused"
            }
            SetupError::Connect { .. } | SetupError::SpoofFamily { .. } => "connect_error",
            SetupError::Profile(_) => "profile_error",
            SetupError::NotARelayListener => "internal",
            SetupError::DestinationDenied { .. } => "denied_destination",
            SetupError::Nodelay(_) => "socket_option",
            SetupError::PeerRefused { refusal, .. } => refusal.reason(),
            SetupError::PeerIdleClosed => "peer_idle_closed",
            SetupError::PeerStatus { status, .. } => match status {
                PeerStatus::Refused => "connect_refused",
                PeerStatus::TimedOut => "connect_timeout",
                _ => "connect_error",
            },
            SetupError::PeerHandshake { .. } => "peer_handshake",
            SetupError::PeerTls { .. } => "peer_tls",
            SetupError::PeerQuic { .. } => "peer_quic",
            SetupError::PeerTimeout { .. } => "connect_timeout",
            SetupError::PeerHeader(_) => "internal",
            SetupError::ClientEarlyData(_) => "client_reset",
            SetupError::ProxyHeader { refusal, .. } => refusal.reason(),
            SetupError::ProxyHeaderSend { .. } => "proxy_header_send",
        }
    }

    /// The status a peer listener answers a header with when this error ends its onward
    /// connection (a refused header gets a reset instead).
    pub(super) fn peer_status(&self) -> PeerStatus {
        match self {
            SetupError::Connect { source, .. } => match source.raw_os_error() {
                Some(libc::ECONNREFUSED) => PeerStatus::Refused,
                Some(libc::ENETUNREACH | libc::EHOSTUNREACH) => PeerStatus::Unreachable,
                _ => PeerStatus::Failed,
            },
            SetupError::Resolve { .. } | SetupError::NoAddress { .. } => PeerStatus::Unreachable,
            SetupError::ConnectTimeout { .. } | SetupError::PeerTimeout { .. } => {
                PeerStatus::TimedOut
            }
            // A later midway's answer travels back unchanged.
            SetupError::PeerStatus { status, .. } => *status,
            _ => PeerStatus::Failed,
        }
    }

    /// The SOCKS5 reply that tells a client this failure, if the protocol has one for it.
    pub(super) fn socks_reply(&self) -> Option<ReplyCode> {
        match self {
            SetupError::Resolve { .. } | SetupError::NoAddress { .. } => {
                Some(ReplyCode::HostUnreachable)
            }
            SetupError::ConnectTimeout { .. } => Some(ReplyCode::TtlExpired),
            SetupError::Connect { source, .. } => Some(ReplyCode::for_connect_error(source)),
            SetupError::SpoofFamily { .. } => Some(ReplyCode::AddressTypeNotSupported),
            SetupError::Profile(_) => Some(ReplyCode::GeneralFailure),
            SetupError::DestinationDenied { .. } => Some(ReplyCode::NotAllowed),
            SetupError::PeerStatus { status, .. } => Some(match status {
                PeerStatus::Refused => ReplyCode::ConnectionRefused,
                PeerStatus::Unreachable => ReplyCode::HostUnreachable,
                PeerStatus::TimedOut => ReplyCode::TtlExpired,
                PeerStatus::Connected | PeerStatus::Failed => ReplyCode::GeneralFailure,
            }),
            SetupError::PeerTimeout { .. } => Some(ReplyCode::TtlExpired),
            SetupError::PeerHandshake { .. }
            | SetupError::PeerTls { .. }
            | SetupError::PeerQuic { .. }
            | SetupError::PeerHeader(_)
            | SetupError::ProxyHeaderSend { .. } => Some(ReplyCode::GeneralFailure),
            _ => None,
        }
    }

    /// The same failure as an `io::Error` for the HTTP engine, whose kind it acts on.
    pub(super) fn into_io(self) -> io::Error {
        let kind = match &self {
            // The HTTP engine answers 403 for this kind.
            SetupError::DestinationDenied { .. } => io::ErrorKind::PermissionDenied,
            SetupError::ConnectTimeout { .. } => io::ErrorKind::TimedOut,
            SetupError::Connect { source, .. } => source.kind(),
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, self)
    }
}

/// Displays an error and its sources, `a: b: c`, for logs.
pub(super) struct ErrorChain<'a>(pub(super) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(err) = source {
            write!(f, ": {err}")?;
            source = err.source();
        }
        Ok(())
    }
}
