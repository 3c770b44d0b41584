//! The QUIC tunnels' metrics: per peer on an edge (is the tunnel up, its RTT, window, losses,
//! streams, handshakes and their failures, connections sent over the TLS fallback), per
//! listener on a gateway (tunnels open).

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{ListenerLabels, PeerLabels, PeerReasonLabels};

/// Every QUIC tunnel metric.
#[derive(Clone, Default)]
pub(crate) struct TunnelMetrics {
    /// Edge: the tunnel's QUIC connections that are up (1 for a connected single-connection
    /// tunnel).
    pub up: Family<PeerLabels, Gauge>,
    /// Edge: the tunnel's smoothed RTT, seconds (mean over its connections up).
    pub rtt: Family<PeerLabels, Gauge<f64, AtomicU64>>,
    /// Edge: the tunnel's congestion window, bytes (summed over its connections up).
    pub cwnd: Family<PeerLabels, Gauge>,
    /// Edge: packets the tunnel sent, and declared lost.
    pub sent_packets: Family<PeerLabels, Counter>,
    /// Edge: packets the tunnel declared lost.
    pub lost_packets: Family<PeerLabels, Counter>,
    /// Edge: streams (proxied connections) open on the tunnel.
    pub streams_open: Family<PeerLabels, Gauge>,
    /// Edge: tunnel connections set up.
    pub handshakes: Family<PeerLabels, Counter>,
    /// Edge: tunnel handshakes that failed, by reason.
    pub failures: Family<PeerReasonLabels, Counter>,
    /// Edge: connections sent over TLS because the tunnel could not be set up.
    pub fallbacks: Family<PeerLabels, Counter>,
    /// Gateway: tunnels open on a QUIC peer listener.
    pub accepted_open: Family<ListenerLabels, Gauge>,
}

impl TunnelMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "midway_peer_tunnel_up",
            "QUIC connections of the tunnel to a peer that are up (0: down)",
            self.up.clone(),
        );
        registry.register(
            "midway_peer_tunnel_rtt_seconds",
            "Smoothed round-trip time of the QUIC tunnel to a peer",
            self.rtt.clone(),
        );
        registry.register(
            "midway_peer_tunnel_cwnd_bytes",
            "Congestion window of the QUIC tunnel to a peer",
            self.cwnd.clone(),
        );
        registry.register(
            "midway_peer_tunnel_sent_packets",
            "Packets the QUIC tunnels to a peer sent",
            self.sent_packets.clone(),
        );
        registry.register(
            "midway_peer_tunnel_lost_packets",
            "Packets the QUIC tunnels to a peer declared lost",
            self.lost_packets.clone(),
        );
        registry.register(
            "midway_peer_tunnel_streams_open",
            "Proxied connections open as streams on the QUIC tunnel to a peer",
            self.streams_open.clone(),
        );
        registry.register(
            "midway_peer_tunnel_handshakes",
            "QUIC tunnels to a peer set up (more than one: the tunnel was set up again)",
            self.handshakes.clone(),
        );
        registry.register(
            "midway_peer_tunnel_failures",
            "QUIC tunnel handshakes with a peer that failed, by reason (timeout, unreachable, unknown_peer, rejected_by_peer, ...)",
            self.failures.clone(),
        );
        registry.register(
            "midway_peer_fallbacks",
            "Connections sent to a peer over TLS because its QUIC tunnel could not be set up",
            self.fallbacks.clone(),
        );
        registry.register(
            "midway_peer_listener_tunnels",
            "QUIC tunnels open on a peer listener",
            self.accepted_open.clone(),
        );
    }

    /// Creates an edge peer's series at zero.
    pub(crate) fn init_peer(&self, labels: &PeerLabels) {
        drop(self.up.get_or_create(labels));
        drop(self.streams_open.get_or_create(labels));
        drop(self.handshakes.get_or_create(labels));
        drop(self.fallbacks.get_or_create(labels));
        drop(self.sent_packets.get_or_create(labels));
        drop(self.lost_packets.get_or_create(labels));
    }

    /// Counts a failed tunnel handshake.
    pub(crate) fn failure(&self, peer: &str, reason: &'static str) {
        self.failures
            .get_or_create(&PeerReasonLabels {
                peer: peer.to_string(),
                reason,
            })
            .inc();
    }
}
