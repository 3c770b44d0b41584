//! A QUIC peer listener's accept loops: tunnels from edges (the handshake checks the edge's key
//! against `peer_fingerprints`), and on each tunnel its streams, each one proxied connection
//! admitted like an accepted TCP connection of a peer listener (a slot of the total limit, the
//! access list for the connecting midway's address; the per-client limit is taken for the
//! client the header names) and served by [`Connection::serve_stream`].

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use midway_quic::{accept_handshake, Connection as Tunnel, Endpoint, Incoming, QuicPeer};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::connection::Connection;
use super::error::ErrorChain;
use super::generation::Generation;
use super::peer_link::PeerLink;
use super::shared::Shared;
use crate::metrics::Metrics;

/// The application error code a gateway closes its tunnels with when it stops serving them
/// (shutdown, a reload that removed the listener, a binary upgrade).
const GOING_AWAY: midway_quic::VarInt = midway_quic::VarInt::from_u32(2);

/// One QUIC peer listener's accept loop and what it needs.
pub(super) struct QuicAcceptLoop {
    pub(super) shared: Arc<Shared>,
    pub(super) name: String,
    pub(super) endpoint: Endpoint,
    /// The address it really bound.
    pub(super) addr: SocketAddr,
    pub(super) generations: watch::Receiver<Arc<Generation>>,
    pub(super) tracker: TaskTracker,
    /// Stops accepting tunnels and streams, and closes the tunnels (their open streams end
    /// with a reset on both sides).
    pub(super) stop: CancellationToken,
    /// Fires when the process stops taking new work (given to connections).
    pub(super) draining: CancellationToken,
    pub(super) connections_cancel: CancellationToken,
}

/// Accepts tunnels until `stop`; each tunnel's streams are accepted by a task of its own.
pub(super) async fn quic_accept_loop(cx: QuicAcceptLoop) {
    let cx = Arc::new(cx);
    let tunnels = TaskTracker::new();
    loop {
        let incoming = tokio::select! {
            _ = cx.stop.cancelled() => break,
            incoming = cx.endpoint.accept() => incoming,
        };
        let Some(incoming) = incoming else { break };
        let generation = cx.generations.borrow().clone();
        if !generation.access.allows(incoming.remote_address().ip()) {
            cx.shared.metrics.refuse(&cx.name, "not_allowed");
            tracing::debug!(listener = %cx.name, client = %incoming.remote_address(), "midway not in allowed_clients; tunnel refused");
            incoming.refuse();
            continue;
        }
        tunnels.spawn(serve_tunnel(cx.clone(), incoming, generation));
    }
    cx.endpoint.close(GOING_AWAY, b"going away");
    tunnels.close();
    tunnels.wait().await;
}

/// One tunnel: its handshake, then its streams until it closes or the listener stops.
async fn serve_tunnel(cx: Arc<QuicAcceptLoop>, incoming: Incoming, generation: Arc<Generation>) {
    let from = incoming.remote_address();
    let timeout = generation.config.handshake_timeout;
    let tunnel = match accept_handshake(incoming, timeout).await {
        Ok(tunnel) => tunnel,
        Err(err) => {
            let reason = err.reason();
            cx.shared.metrics.refuse(&cx.name, "peer_quic");
            cx.shared
                .metrics
                .peer_auth_failure(&cx.name, &format!("quic_{reason}"));
            tracing::info!(listener = %cx.name, client = %from, error = %ErrorChain(&err), reason, "QUIC tunnel refused");
            return;
        }
    };
    let open = cx
        .shared
        .metrics
        .tunnel
        .accepted_open
        .get_or_create(&Metrics::listener(&cx.name))
        .clone();
    open.inc();
    tracing::info!(listener = %cx.name, client = %from, "QUIC tunnel accepted");
    let reason = accept_streams(&cx, &tunnel, from).await;
    open.dec();
    match reason {
        Some(reason) => {
            tracing::info!(listener = %cx.name, client = %from, reason = %reason, "QUIC tunnel closed")
        }
        None => tunnel.close(GOING_AWAY, b"going away"),
    }
}

/// Accepts `tunnel`'s streams until it closes (returns why) or the listener stops (`None`).
async fn accept_streams(
    cx: &QuicAcceptLoop,
    tunnel: &Tunnel,
    from: SocketAddr,
) -> Option<midway_quic::ConnectionError> {
    let labels = Metrics::listener(&cx.name);
    let drained = cx.shared.registry.drain_flag(&cx.name);
    loop {
        // A slot of the total limit before the stream is taken: while none is free, the edge's
        // streams wait in the tunnel's flow control (quinn's stream limit), not here.
        let permit = tokio::select! {
            _ = cx.stop.cancelled() => return None,
            permit = cx.shared.total_limit.clone().acquire_owned() => permit.ok()?,
        };
        let accepted = tokio::select! {
            _ = cx.stop.cancelled() => return None,
            accepted = tunnel.accept_bi() => accepted,
        };
        let (send, recv) = match accepted {
            Ok(pair) => pair,
            Err(reason) => return Some(reason),
        };
        if drained.load(Ordering::Relaxed) {
            // Drained by the control socket: the stream is dropped without a clean end, which
            // resets it (RESET_STREAM); the tunnel and its open streams go on.
            cx.shared.metrics.refuse(&cx.name, "drained");
            drop(QuicPeer::new(send, recv));
            continue;
        }
        let generation = cx.generations.borrow().clone();
        let Some(state) = generation.listeners.get(&cx.name).cloned() else {
            // Removed by a reload that is stopping this loop right now.
            drop(QuicPeer::new(send, recv));
            return None;
        };
        cx.shared.metrics.accepted.get_or_create(&labels).inc();
        cx.shared.served.fetch_add(1, Ordering::Relaxed);
        let conn = Connection {
            shared: cx.shared.clone(),
            listener: state.config,
            profiles: state.profiles,
            http: None,
            generation,
            listener_addr: cx.addr,
            peer: from,
            proxied: None,
            cancel: cx.connections_cancel.child_token(),
            shutdown: cx.draining.clone(),
            _permits: (permit, None),
        };
        let stream = PeerLink::Quic(QuicPeer::new(send, recv));
        cx.tracker.spawn(conn.serve_stream(stream));
    }
}
