//! midway-quic: the QUIC peer transport (`transport = "quic"` between two midways).
//!
//! One long-lived QUIC connection per peer (a tunnel) carries every proxied connection as one
//! bidirectional stream, so a new connection on a warm tunnel starts at the tunnel's
//! congestion window instead of an initial window, and pays no handshake. Both ends
//! authenticate with the same pinned keys as `transport = "tls"` (midway-tls's rustls configs,
//! which quinn runs as QUIC's TLS 1.3 handshake). The peer header and its checks travel at the
//! start of each stream exactly as over TCP.
//!
//! * [`settings`]: a tunnel's settings (windows from the path's bandwidth-delay product, stream
//!   limit, idle timeout, keep-alive, ACK frequency) and quinn's transport config from them.
//! * [`cc`]: the congestion control, chosen per peer: quinn's NewReno, CUBIC and BBR, and
//!   midway's HighSpeed and gentle HighSpeed TCP driven by midway-cc's window arithmetic (the
//!   model the BPF versions are checked against).
//! * [`Tunnel`]: the edge's side: one connection per peer, set up on first use and again
//!   after it closes.
//! * [`QuicPeer`]: one stream as midway-relay's stream relay takes it; FIN for a clean end,
//!   RESET_STREAM and STOP_SENDING for an abort, a lost tunnel read as a reset.
//! * [`accept_handshake`] and the endpoint builders: a QUIC peer listener's side.

pub mod cc;
mod endpoint;
mod error;
pub mod settings;
mod stream;
mod tunnel;

use std::time::Duration;

pub use endpoint::{bind_udp, client_config, client_endpoint, server_config, server_endpoint};
pub use error::{handshake_failure_reason, QuicError};
pub use quinn::{
    ClientConfig, Connection, ConnectionError, Endpoint, Incoming, ServerConfig, VarInt,
};
pub use settings::TunnelSettings;
pub use stream::{QuicPeer, ABORTED};
pub use tunnel::{Tunnel, TunnelStats, CLOSED_BY_MIDWAY};

/// What a QUIC peer listener sends on a unidirectional stream once it has checked the
/// connecting midway's key.
///
/// In TLS 1.3 the client's handshake completes before the server has seen the client's
/// certificate, so a client whose key the server refuses learns it only from the close that
/// follows. The edge waits for this message before it uses a new tunnel: a refused key is a
/// failed handshake (counted, with its reason, and not a fallback case), never a stream that
/// dies after its header went out.
pub const READY: &[u8] = b"midway-quic/1 ready";

/// A QUIC peer listener's side of a handshake: the connecting midway's key checked against
/// the listener's pins (midway-tls's verifier) and [`READY`] sent, within `timeout`.
pub async fn accept_handshake(
    incoming: Incoming,
    timeout: Duration,
) -> Result<Connection, QuicError> {
    let peer = incoming.remote_address();
    let connecting = incoming
        .accept()
        .map_err(|source| QuicError::Handshake { peer, source })?;
    let handshake = async {
        let connection = connecting.await?;
        let mut ready = connection.open_uni().await?;
        // Only a closed connection fails these; its close reason is the error to report.
        if ready.write_all(READY).await.is_err() || ready.finish().is_err() {
            return Err(connection
                .close_reason()
                .unwrap_or(quinn::ConnectionError::LocallyClosed));
        }
        Ok(connection)
    };
    tokio::time::timeout(timeout, handshake)
        .await
        .map_err(|_| QuicError::HandshakeTimeout {
            peer,
            after: timeout,
        })?
        .map_err(|source| QuicError::Handshake { peer, source })
}

/// The edge's side of [`READY`]: the listener's message, read within what is left of the
/// handshake timeout.
pub(crate) async fn await_ready(connection: &Connection) -> Result<(), quinn::ConnectionError> {
    let mut ready = connection.accept_uni().await?;
    let mut message = [0; READY.len()];
    let read = ready.read_exact(&mut message).await;
    match read {
        Ok(()) if message == READY => Ok(()),
        _ => {
            let reason = connection.close_reason();
            // A listener that sends anything else speaks another protocol.
            connection.close(tunnel::CLOSED_BY_MIDWAY, b"unexpected ready message");
            Err(reason.unwrap_or(quinn::ConnectionError::VersionMismatch))
        }
    }
}
