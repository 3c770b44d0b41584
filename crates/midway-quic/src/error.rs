//! What can go wrong with a tunnel, and the short labels metrics and logs give it.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use quinn::{ConnectionError, TransportErrorCode};

/// A tunnel that could not be set up, or a stream that could not be opened on it.
#[derive(Debug, thiserror::Error)]
pub enum QuicError {
    /// midway-tls's rustls config cannot drive QUIC (it always can: TLS 1.3 with AES-128-GCM).
    #[error("the TLS config cannot be used for QUIC: {0}")]
    Config(String),
    /// The UDP socket could not be made.
    #[error("UDP socket {addr}: {source}")]
    Socket {
        /// The address it was to be bound to.
        addr: SocketAddr,
        /// Why not.
        source: io::Error,
    },
    /// The peer's name did not resolve.
    #[error("resolving {name}: {source}")]
    Resolve {
        /// The peer's address as configured.
        name: String,
        /// Why not.
        source: io::Error,
    },
    /// quinn refused to start the handshake (an address it cannot send to).
    #[error("connecting to {peer}: {source}")]
    Connect {
        /// The peer's address.
        peer: SocketAddr,
        /// Why not.
        source: quinn::ConnectError,
    },
    /// The handshake failed: the peer's key refused here, ours refused there, or the peer
    /// answered nothing QUIC.
    #[error("QUIC handshake with {peer} failed: {source}")]
    Handshake {
        /// The peer's address.
        peer: SocketAddr,
        /// Why.
        source: ConnectionError,
    },
    /// The handshake did not complete in time (UDP dropped or throttled on the path?).
    #[error("QUIC handshake with {peer} timed out after {after:?}")]
    HandshakeTimeout {
        /// The peer's address.
        peer: SocketAddr,
        /// The timeout.
        after: Duration,
    },
    /// The tunnel is down (its handshakes fail) and no stream is opened until it is up again.
    #[error("the QUIC tunnel is down")]
    Down,
    /// The tunnel closed before a stream could be opened on it.
    #[error("opening a stream on the tunnel: {0}")]
    Open(ConnectionError),
}

impl QuicError {
    /// A short label for metrics and logs: one of midway-tls's
    /// [`midway_tls::REFUSAL_REASONS`] for a failed handshake (`unknown_peer`, `expired`,
    /// `rejected_by_peer`, `timeout`, ...), `unreachable` or `closed` otherwise.
    pub fn reason(&self) -> &'static str {
        match self {
            QuicError::Config(_) => "other",
            QuicError::Socket { .. } | QuicError::Resolve { .. } | QuicError::Connect { .. } => {
                "unreachable"
            }
            QuicError::Handshake { source, .. } => handshake_failure_reason(source),
            QuicError::HandshakeTimeout { .. } => "timeout",
            QuicError::Down => "unreachable",
            QuicError::Open(_) => "closed",
        }
    }

    /// Whether the tunnel could not be set up at all (UDP blocked, nothing listening, a
    /// timeout): the case where a peer falls back to TLS over TCP. A refused key is not one:
    /// TLS would be refused the same way.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self.reason(),
            "unreachable" | "timeout" | "closed" | "incompatible"
        )
    }
}

/// The TLS alerts QUIC carries as CRYPTO_ERROR codes (RFC 9001, section 4.8).
const ALERT_BAD_CERTIFICATE: u8 = 42;
const ALERT_CERTIFICATE_EXPIRED: u8 = 45;
const ALERT_CERTIFICATE_UNKNOWN: u8 = 46;
const ALERT_UNKNOWN_CA: u8 = 48;
const ALERT_CERTIFICATE_REQUIRED: u8 = 116;
const ALERT_NO_APPLICATION_PROTOCOL: u8 = 120;

/// Why a QUIC handshake failed, with the labels of midway-tls's `refusal_reason` for the same
/// causes over TLS. A refusal decided here arrives as a local transport error carrying the TLS
/// alert this side sent; one decided by the peer arrives as its CONNECTION_CLOSE.
pub fn handshake_failure_reason(err: &ConnectionError) -> &'static str {
    let alert = |code: TransportErrorCode| {
        (0..=u8::MAX).find(|alert| TransportErrorCode::crypto(*alert) == code)
    };
    match err {
        ConnectionError::TimedOut => "timeout",
        ConnectionError::VersionMismatch => "incompatible",
        ConnectionError::TransportError(local) => match alert(local.code) {
            Some(ALERT_CERTIFICATE_EXPIRED) => "expired",
            Some(ALERT_CERTIFICATE_REQUIRED) => "no_certificate",
            Some(ALERT_NO_APPLICATION_PROTOCOL) => "alpn_mismatch",
            Some(ALERT_BAD_CERTIFICATE | ALERT_CERTIFICATE_UNKNOWN | ALERT_UNKNOWN_CA)
                if local.reason.contains("not among the accepted peers") =>
            {
                "unknown_peer"
            }
            Some(ALERT_UNKNOWN_CA) => "unknown_peer",
            Some(_) => "bad_certificate",
            None => "other",
        },
        ConnectionError::ConnectionClosed(close) => match alert(close.error_code) {
            Some(ALERT_CERTIFICATE_EXPIRED) => "expired_at_peer",
            Some(ALERT_NO_APPLICATION_PROTOCOL) => "alpn_mismatch",
            Some(_) => "rejected_by_peer",
            None => "closed",
        },
        ConnectionError::ApplicationClosed(_)
        | ConnectionError::Reset
        | ConnectionError::LocallyClosed => "closed",
        ConnectionError::CidsExhausted => "other",
    }
}
