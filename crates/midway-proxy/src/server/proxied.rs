//! The PROXY protocol on a connection's sockets (the headers themselves are
//! `crate::proxy_protocol`'s, without I/O).
//!
//! Accepting: a connection from a source in the listener's `accept_proxy_protocol` (a load
//! balancer) is admitted at accept without the access list or the per-client limit; its task
//! reads the header first, within `handshake_timeout`, and the header's client then takes
//! both, as if it had connected itself. A connection from any other source is an ordinary
//! client: its bytes are never read as a header, so no header can make a client allowed that
//! the real source's listing does not vouch for. Anything but a complete, well-formed header
//! from a listed source (garbage, a truncated header, a timeout, a Unix or UDP one) is reset
//! and counted in `midway_connections_refused` with a `proxy_header_*` reason. A LOCAL header
//! (a health check) keeps the real addresses, which then pass the same checks.
//!
//! Sending: the header is the first bytes on the remote segment, written as part of connect
//! (`connection.rs`), so a failure is a connect error like the connect's own.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::error::SetupError;
use crate::config::ListenerConfig;
use crate::metrics::{Metrics, RefusedLabels};
use crate::proxy_protocol::{scan, v2_header, HeaderError, Proxied, Scan};

/// Reads one header takes at most: a v2 header in three, a v1 header in one per byte of
/// its line past the shortest (about 100).
const MAX_READS: usize = 128;

/// Where a connection accepted through a load balancer came from.
#[derive(Debug, Clone, Copy)]
pub(super) struct ProxiedBy {
    /// The load balancer that sent the header.
    pub(super) balancer: SocketAddr,
    /// The address the client connected to at the load balancer, when the header named one.
    pub(super) destination: Option<SocketAddr>,
}

/// Why a PROXY header from a listed source was refused.
#[derive(Debug, thiserror::Error)]
pub(super) enum ProxyHeaderRefusal {
    #[error("header not complete within handshake_timeout")]
    Timeout,
    #[error("connection ended inside the header")]
    Truncated(#[source] io::Error),
    #[error("bad header")]
    Malformed(#[source] HeaderError),
    #[error("client {0} (from the header) is not in allowed_clients")]
    ClientNotAllowed(IpAddr),
    #[error("client {0} (from the header) holds max_connections_per_client connections")]
    ClientLimit(IpAddr),
}

/// The `midway_connections_refused_total` reasons of a bad header from a listed source, which a
/// listener accepting the header shows at zero from the start.
const HEADER_REFUSAL_REASONS: [&str; 4] = [
    "proxy_header_timeout",
    "proxy_header_truncated",
    "proxy_header_malformed",
    "proxy_header_unsupported",
];

/// Creates the header refusals' series at zero for a listener that accepts the header.
pub(super) fn init_metrics(metrics: &Metrics, listener: &ListenerConfig) {
    if listener.proxy_protocol.accept_from.is_empty() {
        return;
    }
    for reason in HEADER_REFUSAL_REASONS {
        drop(metrics.refused.get_or_create(&RefusedLabels {
            listener: listener.name.clone(),
            reason: reason.to_string(),
        }));
    }
}

impl ProxyHeaderRefusal {
    /// The `reason` label of `midway_connections_refused`. A client the header names is
    /// refused under the same reasons as one that connects itself.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            ProxyHeaderRefusal::Timeout => "proxy_header_timeout",
            ProxyHeaderRefusal::Truncated(_) => "proxy_header_truncated",
            ProxyHeaderRefusal::Malformed(HeaderError::Unsupported(_)) => {
                "proxy_header_unsupported"
            }
            ProxyHeaderRefusal::Malformed(_) => "proxy_header_malformed",
            ProxyHeaderRefusal::ClientNotAllowed(_) => "not_allowed",
            ProxyHeaderRefusal::ClientLimit(_) => "client_limit",
        }
    }
}

/// Reads the header a load balancer starts `stream` with, no byte past it, within `timeout`.
pub(super) async fn read_header(
    stream: &mut TcpStream,
    timeout: Duration,
) -> Result<Proxied, ProxyHeaderRefusal> {
    let read = async {
        let mut bytes = Vec::with_capacity(64);
        for _ in 0..MAX_READS {
            match scan(&bytes).map_err(ProxyHeaderRefusal::Malformed)? {
                Scan::Complete(proxied) => return Ok(proxied),
                Scan::Need(total) => {
                    let have = bytes.len();
                    bytes.resize(total, 0);
                    stream
                        .read_exact(&mut bytes[have..])
                        .await
                        .map_err(ProxyHeaderRefusal::Truncated)?;
                }
            }
        }
        // Not reached: `scan` completes or refuses within MAX_READS steps.
        Err(ProxyHeaderRefusal::Malformed(HeaderError::V1TooLong))
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| ProxyHeaderRefusal::Timeout)?
}

/// Starts the remote segment with the v2 header naming `client` and `destination`, within
/// `timeout` (a few dozen bytes into a new socket's empty buffer: at once, unless the peer
/// is gone).
pub(super) async fn send_header(
    stream: &mut TcpStream,
    client: SocketAddr,
    destination: SocketAddr,
    timeout: Duration,
) -> Result<(), SetupError> {
    let target = stream.peer_addr().map_or_else(
        |_| "the remote segment".to_string(),
        |addr| addr.to_string(),
    );
    let failed = |source| SetupError::ProxyHeaderSend {
        target: target.clone(),
        source,
    };
    let header = v2_header(client, destination).map_err(failed)?;
    match tokio::time::timeout(timeout, stream.write_all(&header)).await {
        Ok(written) => written.map_err(failed),
        Err(_) => Err(failed(io::Error::from(io::ErrorKind::TimedOut))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_header_refusal_reason_is_shown_from_the_start() {
        let header_refusals = [
            ProxyHeaderRefusal::Timeout,
            ProxyHeaderRefusal::Truncated(io::ErrorKind::UnexpectedEof.into()),
            ProxyHeaderRefusal::Malformed(HeaderError::NotAHeader),
            ProxyHeaderRefusal::Malformed(HeaderError::Unsupported("Unix socket addresses")),
        ];
        let reasons: Vec<&str> = header_refusals.iter().map(|r| r.reason()).collect();
        assert_eq!(reasons, HEADER_REFUSAL_REASONS);
        // A client the header names is refused under the accept loop's reasons.
        let client = "10.0.0.1".parse().unwrap();
        assert_eq!(
            ProxyHeaderRefusal::ClientNotAllowed(client).reason(),
            "not_allowed"
        );
        assert_eq!(
            ProxyHeaderRefusal::ClientLimit(client).reason(),
            "client_limit"
        );
    }
}
