//! Prometheus metrics and the `/metrics` HTTP endpoint.
//!
//! Metrics are registered into the registry the caller passes in (never global statics). Labels
//! are per listener and per segment, never per connection, so cardinality stays bounded by the
//! config. Names are what the lab scrapes; keep them stable.

mod control;
mod tunnel;

use std::convert::Infallible;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ListenerLabels {
    pub listener: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RefusedLabels {
    pub listener: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DirectionLabels {
    pub listener: String,
    pub direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SegmentLabels {
    pub listener: String,
    pub segment: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PeerLabels {
    pub peer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PeerOriginLabels {
    pub peer: String,
    /// `warm` (taken from the pool) or `fresh` (connected for the connection).
    pub origin: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PeerReasonLabels {
    pub peer: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CongestionLabels {
    pub listener: String,
    pub segment: &'static str,
    pub congestion_control: String,
}

fn srtt_histogram() -> Histogram {
    // 100 us .. ~3.3 s, doubling: LAN to GEO satellite with queueing.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

fn cwnd_histogram() -> Histogram {
    // 1 .. 32768 segments, doubling.
    Histogram::new(exponential_buckets(1.0, 2.0, 16))
}

type HistogramFamily = Family<SegmentLabels, Histogram, fn() -> Histogram>;

/// Every metric midway-proxy exports. Cloning shares the underlying values.
#[derive(Clone)]
pub(crate) struct Metrics {
    pub accepted: Family<ListenerLabels, Counter>,
    pub refused: Family<RefusedLabels, Counter>,
    pub active: Family<ListenerLabels, Gauge>,
    pub bytes: Family<DirectionLabels, Counter>,
    pub relay_errors: Family<ListenerLabels, Counter>,
    pub accept_backoffs: Family<ListenerLabels, Counter>,
    pub spool_bytes: Gauge,
    pub pipes_in_use: Gauge,
    /// Connections still open when the shutdown grace period ended, reset on both sides.
    pub shutdown_resets: Counter,
    /// 1 while new intercepted connections bypass midway because it is at its limit.
    pub bypass_active: Gauge,
    pub bypass_switches: Counter,
    /// Connections a transparent listener served over `max_connections`: the kernel had queued
    /// them before the overload bypass took effect.
    pub overdraft: Family<ListenerLabels, Counter>,
    /// Socket memory guard: the receive-buffer cap in force (0 = none), and cap changes.
    pub socket_buffer_cap: Gauge,
    pub socket_buffer_cap_changes: Counter,
    pub retransmits: Family<SegmentLabels, Counter>,
    pub srtt: HistogramFamily,
    pub cwnd: HistogramFamily,
    /// Segments relayed, by the congestion control in force on them.
    pub segment_congestion_control: Family<CongestionLabels, Counter>,
    /// Edge: connections through each peer: warm (from the pool), fresh, tunnel (a QUIC
    /// stream) or fallback (TLS while the tunnel is down).
    pub peer_connections: Family<PeerOriginLabels, Counter>,
    /// Edge: idle warm connections per peer.
    pub peer_warm_idle: Family<PeerLabels, Gauge>,
    /// Edge: connects to a peer that failed (pool refills and fresh ones).
    pub peer_connect_failures: Family<PeerLabels, Counter>,
    /// Edge: TLS handshakes with a peer that failed, by reason.
    pub peer_tls_failures: Family<PeerReasonLabels, Counter>,
    /// The QUIC tunnels'.
    pub tunnel: tunnel::TunnelMetrics,
    /// The control socket's requests.
    pub control: control::ControlMetrics,
    /// Gateway: headers that failed authentication, by reason.
    pub peer_auth_failures: Family<RefusedLabels, Counter>,
    /// Gateway: headers refused because their chain is already relayed here.
    pub peer_loops_refused: Family<ListenerLabels, Counter>,
    /// Gateway: headers refused because their hop count reached max_hops.
    pub peer_hop_limit_refused: Family<ListenerLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            accepted: Family::default(),
            refused: Family::default(),
            active: Family::default(),
            bytes: Family::default(),
            relay_errors: Family::default(),
            accept_backoffs: Family::default(),
            spool_bytes: Gauge::default(),
            pipes_in_use: Gauge::default(),
            shutdown_resets: Counter::default(),
            bypass_active: Gauge::default(),
            bypass_switches: Counter::default(),
            overdraft: Family::default(),
            socket_buffer_cap: Gauge::default(),
            socket_buffer_cap_changes: Counter::default(),
            retransmits: Family::default(),
            srtt: Family::new_with_constructor(srtt_histogram as fn() -> Histogram),
            cwnd: Family::new_with_constructor(cwnd_histogram as fn() -> Histogram),
            segment_congestion_control: Family::default(),
            peer_connections: Family::default(),
            peer_warm_idle: Family::default(),
            peer_connect_failures: Family::default(),
            peer_tls_failures: Family::default(),
            tunnel: tunnel::TunnelMetrics::default(),
            control: control::ControlMetrics::default(),
            peer_auth_failures: Family::default(),
            peer_loops_refused: Family::default(),
            peer_hop_limit_refused: Family::default(),
        }
    }
}

impl Metrics {
    /// Registers every metric (names without the `_total` suffix prometheus-client adds).
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "midway_connections_accepted",
            "Client connections accepted and allowed",
            self.accepted.clone(),
        );
        registry.register(
            "midway_connections_refused",
            "Client connections closed before relaying, by reason",
            self.refused.clone(),
        );
        registry.register(
            "midway_connections_active",
            "Split connections being served",
            self.active.clone(),
        );
        registry.register(
            "midway_bytes",
            "Bytes relayed per direction",
            self.bytes.clone(),
        );
        registry.register(
            "midway_relay_errors",
            "Relays that ended with an error",
            self.relay_errors.clone(),
        );
        registry.register(
            "midway_accept_backoffs",
            "Times accept hit a resource limit (EMFILE, ENFILE, ENOBUFS, ENOMEM) and backed off",
            self.accept_backoffs.clone(),
        );
        registry.register(
            "midway_spool_bytes",
            "Bytes held in spool files on disk by spool-mode relays",
            self.spool_bytes.clone(),
        );
        registry.register(
            "midway_splice_pipes_in_use",
            "Splice pipe pairs leased by relays",
            self.pipes_in_use.clone(),
        );
        registry.register(
            "midway_shutdown_resets",
            "Connections still open when the shutdown grace period ended, closed with a reset on both sides",
            self.shutdown_resets.clone(),
        );
        registry.register(
            "midway_overload_bypass_active",
            "1 while new intercepted connections bypass midway (routed unsplit) because it serves nearly max_connections",
            self.bypass_active.clone(),
        );
        registry.register(
            "midway_overload_bypass_switches",
            "Times the overload bypass was switched on or off",
            self.bypass_switches.clone(),
        );
        registry.register(
            "midway_overload_overdraft",
            "Connections a transparent listener served over max_connections because the kernel had queued them before the overload bypass took effect",
            self.overdraft.clone(),
        );
        registry.register(
            "midway_socket_buffer_cap_bytes",
            "Receive-buffer cap the socket memory guard puts on relayed sockets now (0 = none)",
            self.socket_buffer_cap.clone(),
        );
        registry.register(
            "midway_socket_buffer_cap_changes",
            "Times the socket memory guard changed or lifted the caps",
            self.socket_buffer_cap_changes.clone(),
        );
        registry.register(
            "midway_segment_retransmits",
            "TCP retransmissions per segment (tcp_info total_retrans)",
            self.retransmits.clone(),
        );
        registry.register(
            "midway_segment_srtt_seconds",
            "Smoothed RTT per segment from tcp_info: every 2 s of a busy connection and at its end",
            self.srtt.clone(),
        );
        registry.register(
            "midway_segment_cwnd_segments",
            "Congestion window per segment in MSS from tcp_info: every 2 s of a busy connection and at its end",
            self.cwnd.clone(),
        );
        registry.register(
            "midway_segment_congestion_control",
            "Segments relayed, by the congestion control in force on them (segment local, remote or peer)",
            self.segment_congestion_control.clone(),
        );
        registry.register(
            "midway_peer_connections",
            "Connections sent through a peer, by origin: warm (taken from the pool), fresh, tunnel (a QUIC stream) or fallback (TLS while the tunnel is down)",
            self.peer_connections.clone(),
        );
        registry.register(
            "midway_peer_warm_idle",
            "Idle warm connections to a peer",
            self.peer_warm_idle.clone(),
        );
        registry.register(
            "midway_peer_connect_failures",
            "Connects to a peer that failed (pool refills and fresh connections)",
            self.peer_connect_failures.clone(),
        );
        registry.register(
            "midway_peer_tls_failures",
            "TLS handshakes with a peer that failed, by reason (unknown_peer, expired, not_tls, timeout, other)",
            self.peer_tls_failures.clone(),
        );
        self.tunnel.register(registry);
        self.control.register(registry);
        registry.register(
            "midway_peer_auth_failures",
            "Connecting midways refused by a peer listener for failing authentication (the header, or the TLS key: reasons tls_*), by reason",
            self.peer_auth_failures.clone(),
        );
        registry.register(
            "midway_peer_loops_refused",
            "Peer headers refused because their chain id is already relayed here (a loop)",
            self.peer_loops_refused.clone(),
        );
        registry.register(
            "midway_peer_hop_limit_refused",
            "Peer headers refused because their hop count reached max_hops",
            self.peer_hop_limit_refused.clone(),
        );
    }

    /// Creates a peer's series at zero (edge side).
    pub(crate) fn init_peer(&self, name: &str) {
        let labels = PeerLabels {
            peer: name.to_string(),
        };
        drop(self.peer_warm_idle.get_or_create(&labels));
        drop(self.peer_connect_failures.get_or_create(&labels));
        for origin in ["warm", "fresh", "tunnel", "fallback"] {
            drop(self.peer_connections.get_or_create(&PeerOriginLabels {
                peer: name.to_string(),
                origin,
            }));
        }
    }

    /// Creates a peer listener's series at zero (gateway side).
    pub(crate) fn init_peer_listener(&self, name: &str) {
        let labels = Metrics::listener(name);
        drop(self.peer_loops_refused.get_or_create(&labels));
        drop(self.peer_hop_limit_refused.get_or_create(&labels));
    }

    /// A listener with a peer segment (`via`, or a peer listener) shows its retransmits at 0
    /// from the start, like the local and remote segments.
    pub(crate) fn init_peer_segment(&self, name: &str) {
        drop(self.retransmits.get_or_create(&SegmentLabels {
            listener: name.to_string(),
            segment: "peer",
        }));
    }

    /// Counts a connection through `peer` (`origin` warm or fresh).
    pub(crate) fn peer_connection(&self, peer: &str, origin: &'static str) {
        self.peer_connections
            .get_or_create(&PeerOriginLabels {
                peer: peer.to_string(),
                origin,
            })
            .inc();
    }

    /// Counts a failed TLS handshake with a peer (the edge's side).
    pub(crate) fn peer_tls_failure(&self, peer: &str, reason: &'static str) {
        self.peer_tls_failures
            .get_or_create(&PeerReasonLabels {
                peer: peer.to_string(),
                reason,
            })
            .inc();
    }

    /// Counts a peer header that failed authentication.
    pub(crate) fn peer_auth_failure(&self, listener: &str, reason: &str) {
        self.peer_auth_failures
            .get_or_create(&RefusedLabels {
                listener: listener.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Creates a listener's series at zero, so a scrape before its first connection already
    /// shows them (refused reasons and segments appear when first used).
    pub(crate) fn init_listener(&self, name: &str) {
        let labels = Metrics::listener(name);
        drop(self.accepted.get_or_create(&labels));
        drop(self.active.get_or_create(&labels));
        drop(self.relay_errors.get_or_create(&labels));
        drop(self.accept_backoffs.get_or_create(&labels));
        for direction in ["client_to_server", "server_to_client"] {
            drop(self.bytes.get_or_create(&DirectionLabels {
                listener: name.to_string(),
                direction,
            }));
        }
        for segment in ["local", "remote"] {
            drop(self.retransmits.get_or_create(&SegmentLabels {
                listener: name.to_string(),
                segment,
            }));
        }
    }

    pub(crate) fn listener(name: &str) -> ListenerLabels {
        ListenerLabels {
            listener: name.to_string(),
        }
    }

    /// Counts a connection closed before relaying.
    pub(crate) fn refuse(&self, listener: &str, reason: &str) {
        self.refused
            .get_or_create(&RefusedLabels {
                listener: listener.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }
}

/// Encodes a registry in the Prometheus text format.
pub(crate) fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

/// Serves `GET /metrics` until `shutdown`. `before_scrape` refreshes sampled gauges.
pub(crate) async fn serve(
    listener: Arc<TcpListener>,
    registry: Arc<RwLock<Registry>>,
    before_scrape: Arc<dyn Fn() + Send + Sync>,
    shutdown: CancellationToken,
) {
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    tracing::warn!(error = %err, "metrics accept failed");
                    // Resource errors clear by themselves; do not spin.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let registry = registry.clone();
        let before_scrape = before_scrape.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let registry = registry.clone();
                let before_scrape = before_scrape.clone();
                async move {
                    // A reload may add an HTTP listener's metrics; encoding is quick.
                    let registry = registry.read().unwrap_or_else(|p| p.into_inner());
                    Ok::<_, Infallible>(respond(&req, &registry, &*before_scrape))
                }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
            tokio::select! {
                result = conn => if let Err(err) = result {
                    tracing::debug!(error = %err, %peer, "metrics connection ended with an error");
                },
                _ = shutdown.cancelled() => {}
            }
        });
    }
}

fn respond(
    req: &Request<hyper::body::Incoming>,
    registry: &Registry,
    before_scrape: &(dyn Fn() + Send + Sync),
) -> Response<Full<Bytes>> {
    let (status, content_type, body) = if req.method() != hyper::Method::GET {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use GET\n".to_string(),
        )
    } else if req.uri().path() != "/metrics" {
        (
            StatusCode::NOT_FOUND,
            "text/plain",
            "metrics are at /metrics\n".to_string(),
        )
    } else {
        before_scrape();
        (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            encode(registry),
        )
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_what_the_lab_scrapes() {
        let metrics = Metrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics
            .accepted
            .get_or_create(&Metrics::listener("fwd"))
            .inc();
        metrics.refuse("fwd", "not_allowed");
        metrics
            .bytes
            .get_or_create(&DirectionLabels {
                listener: "fwd".into(),
                direction: "client_to_server",
            })
            .inc_by(5);
        metrics
            .srtt
            .get_or_create(&SegmentLabels {
                listener: "fwd".into(),
                segment: "local",
            })
            .observe(0.01);
        let text = encode(&registry);
        for needle in [
            "midway_connections_accepted_total{listener=\"fwd\"} 1",
            "midway_connections_refused_total{listener=\"fwd\",reason=\"not_allowed\"} 1",
            "midway_bytes_total{listener=\"fwd\",direction=\"client_to_server\"} 5",
            "midway_segment_srtt_seconds_count{listener=\"fwd\",segment=\"local\"} 1",
            "midway_spool_bytes 0",
            "midway_splice_pipes_in_use 0",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
