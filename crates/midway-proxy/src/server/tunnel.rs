//! A QUIC peer's tunnel as an edge uses it (`transport = "quic"`): one upkeep task per peer
//! sets the tunnel up at start and again whenever it closes, and keeps its metrics; proxied
//! connections only open streams on it.
//!
//! The tunnel's state decides where a new connection goes:
//! - `Up`: a stream on the tunnel.
//! - `Connecting` (at start, and after the tunnel closed): wait for the handshake, at most its
//!   timeout, racing a TLS connection started after a head start (`pool.rs`); the first one
//!   ready carries the connection.
//! - `Down` (a handshake failed: UDP dropped or throttled, nothing listening, a timeout): over
//!   TLS to the same address at once (`fallback = "tls"`, the default; refused with
//!   `fallback = "none"`). Encryption is never given up. The upkeep task keeps trying QUIC with
//!   a doubling pause and new connections use the tunnel again as soon as it is up.
//!
//! A refused key is not a fallback case (TLS would be refused the same way): the state goes
//! `Down` all the same, and the fallback's TLS handshake fails and is counted too.
//!
//! With `connections = N` the tunnel is N QUIC connections ("lanes"), each kept up by its own
//! upkeep loop; a new stream goes to the lane with the fewest open streams among those up, and
//! the tunnel's state is the best of its lanes' (`Up` if one is up). quinn processes each
//! connection's packets on one task, so one connection tops out at about one core; more lanes
//! spread that over cores at the price of N congestion controllers on the shared path (N
//! flows' share of a bottleneck). One is the default; more is the operator's choice where the
//! tunnel's CPU, not the path, is the limit (docs/results/bench/tunnel.md).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use midway_quic::{QuicError, QuicPeer, Tunnel, TunnelStats};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backoff::{pause_unless_shutdown, Backoff};
use super::error::ErrorChain;
use crate::config::{PeerConfig, PeerTransport};
use crate::metrics::{Metrics, PeerLabels};

/// First pause after a failed tunnel handshake; doubles per failure up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// A tunnel that closes this soon after it came up is retried after a pause, not at once.
const CLOSED_WITHIN: Duration = Duration::from_secs(2);
/// The tunnel's metrics are updated this often while it is up.
const METRICS_INTERVAL: Duration = Duration::from_secs(1);

/// Where a tunnel stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Connecting,
    Up,
    Down,
}

/// What a connection gets instead of a stream.
pub(super) enum NoStream {
    /// Go over TLS to the same address.
    Fallback,
    /// Neither: the tunnel is down and the peer has `fallback = "none"`, or the stream could
    /// not be opened.
    Failed(QuicError),
}

/// One QUIC peer's tunnel and its state.
pub(super) struct PeerTunnel {
    /// One QUIC connection each (at least one).
    lanes: Vec<Tunnel>,
    /// Each lane's state, by index.
    lane_states: Mutex<Vec<State>>,
    fallback: bool,
    handshake_timeout: Duration,
    /// The best of the lanes' states.
    state: watch::Sender<State>,
    metrics: Metrics,
    labels: PeerLabels,
}

impl PeerTunnel {
    /// The tunnel of a `transport = "quic"` peer; `None` for other peers.
    pub(super) fn new(config: &PeerConfig, metrics: Metrics) -> Option<PeerTunnel> {
        let PeerTransport::Quic {
            tunnel,
            settings,
            fallback,
            connections,
            ..
        } = &config.transport
        else {
            return None;
        };
        let labels = PeerLabels {
            peer: config.name.clone(),
        };
        metrics.tunnel.init_peer(&labels);
        let lanes: Vec<Tunnel> = (0..(*connections).max(1))
            .map(|_| {
                Tunnel::new(
                    config.address.to_string(),
                    (**tunnel).clone(),
                    settings.handshake_timeout,
                )
            })
            .collect();
        Some(PeerTunnel {
            lane_states: Mutex::new(vec![State::Connecting; lanes.len()]),
            lanes,
            fallback: *fallback,
            handshake_timeout: settings.handshake_timeout,
            state: watch::Sender::new(State::Connecting),
            metrics,
            labels,
        })
    }

    /// A stream for one proxied connection, or what to do instead.
    pub(super) async fn open(&self) -> Result<QuicPeer, NoStream> {
        let mut state = self.state.subscribe();
        // Wait out a handshake in progress, at most its timeout.
        let settled = tokio::time::timeout(
            self.handshake_timeout,
            state.wait_for(|s| *s != State::Connecting),
        )
        .await;
        let now = settled.ok().and_then(Result::ok).map(|s| *s);
        if now == Some(State::Up) {
            match self.least_busy_lane().open_live().await {
                Ok(stream) => return Ok(stream),
                // Closed just now: the upkeep task sets it up again; this connection does
                // not wait for that.
                Err(err) if !self.fallback => return Err(NoStream::Failed(err)),
                Err(_) => {}
            }
        }
        if self.fallback {
            Err(NoStream::Fallback)
        } else {
            Err(NoStream::Failed(QuicError::Down))
        }
    }

    /// The lane a new stream goes to: the one up with the fewest open streams (the first lane
    /// when none is up; opening on it then fails as it would have).
    fn least_busy_lane(&self) -> &Tunnel {
        let states = self.lane_states.lock().unwrap_or_else(|p| p.into_inner());
        self.lanes
            .iter()
            .zip(states.iter())
            .filter(|(_, state)| **state == State::Up)
            .map(|(lane, _)| lane)
            .min_by_key(|lane| lane.streams_open())
            .unwrap_or(&self.lanes[0])
    }

    /// Sets one lane's state and the tunnel's (the best of its lanes').
    fn set_state(&self, lane: usize, state: State) {
        let mut states = self.lane_states.lock().unwrap_or_else(|p| p.into_inner());
        states[lane] = state;
        let best = if states.contains(&State::Up) {
            State::Up
        } else if states.contains(&State::Connecting) {
            State::Connecting
        } else {
            State::Down
        };
        self.state
            .send_if_modified(|now| std::mem::replace(now, best) != best);
    }

    /// While the tunnel is being set up, how long a new connection gives QUIC before it also
    /// starts its TLS fallback, the two racing (RFC 8305's happy eyeballs, for transports): a
    /// quarter of the handshake timeout, at most a second. QUIC's handshake takes about one
    /// round trip and TLS over TCP at least two, so where UDP passes the tunnel usually wins;
    /// where it does not, the first connections are through within this head start plus a TLS
    /// connection, not after the whole handshake timeout. `None`: no race (the tunnel is up,
    /// or down, or the peer has `fallback = "none"`).
    pub(super) fn fallback_head_start(&self) -> Option<Duration> {
        (self.fallback && *self.state.borrow() == State::Connecting)
            .then(|| (self.handshake_timeout / 4).min(Duration::from_secs(1)))
    }

    /// Counts a connection sent over TLS because the tunnel was not (yet) usable.
    pub(super) fn count_fallback(&self) {
        self.metrics
            .tunnel
            .fallbacks
            .get_or_create(&self.labels)
            .inc();
    }

    /// Keeps every lane of the tunnel up until `shutdown`.
    pub(super) async fn maintain(self: Arc<Self>, shutdown: CancellationToken) {
        let lanes = (0..self.lanes.len()).map(|lane| self.maintain_lane(lane, shutdown.clone()));
        futures::future::join_all(lanes).await;
        self.metrics.tunnel.up.get_or_create(&self.labels).set(0);
        // Streams still relaying keep their connection until they end (quinn closes a
        // connection when its last handle goes); the grace period bounds that.
    }

    /// Keeps one lane up until `shutdown`: sets it up, waits for it to close, sets it up
    /// again; after a failed handshake retries with a doubling pause, logging once when the
    /// lane goes down and once when it comes back.
    async fn maintain_lane(&self, lane: usize, shutdown: CancellationToken) {
        let peer = &self.labels.peer;
        let tunnel = &self.lanes[lane];
        let mut retry = Backoff::new(RETRY_MIN, RETRY_MAX);
        let mut reported = TunnelStats::default();
        loop {
            let connected = tokio::select! {
                _ = shutdown.cancelled() => break,
                connected = tunnel.connection() => connected,
            };
            let pause = match connected {
                Ok(connection) => {
                    if retry.succeeded() {
                        tracing::info!(peer = %peer, lane, "QUIC tunnel to peer up again");
                    } else {
                        tracing::info!(peer = %peer, lane, remote = %connection.remote_address(), "QUIC tunnel to peer up");
                    }
                    self.set_state(lane, State::Up);
                    let up_since = Instant::now();
                    let mut tick = tokio::time::interval(METRICS_INTERVAL);
                    let closed = loop {
                        tokio::select! {
                            _ = shutdown.cancelled() => break None,
                            reason = connection.closed() => break Some(reason),
                            _ = tick.tick() => self.report(tunnel, &mut reported),
                        }
                    };
                    self.report(tunnel, &mut reported);
                    // Streams still open keep the connection; a new one is counted afresh.
                    reported.sent_packets = 0;
                    reported.lost_packets = 0;
                    let Some(reason) = closed else { break };
                    tracing::info!(peer = %peer, lane, reason = %reason, "QUIC tunnel to peer closed; setting it up again");
                    self.set_state(lane, State::Connecting);
                    self.report_gauges();
                    (up_since.elapsed() < CLOSED_WITHIN).then_some(RETRY_MIN)
                }
                Err(err) => {
                    self.metrics.tunnel.failure(peer, err.reason());
                    let (pause, first) = retry.failed();
                    if first {
                        tracing::warn!(
                            peer = %peer,
                            lane,
                            error = %ErrorChain(&err),
                            reason = err.reason(),
                            fallback = if self.fallback { "tls" } else { "none" },
                            "QUIC tunnel to peer cannot be set up; retrying with backoff"
                        );
                    }
                    self.set_state(lane, State::Down);
                    Some(pause)
                }
            };
            if let Some(pause) = pause {
                if !pause_unless_shutdown(&shutdown, pause).await {
                    break;
                }
            }
        }
        self.set_state(lane, State::Down);
    }

    /// The tunnel's gauges, over all its lanes: connections up, streams open, the mean RTT
    /// and the summed congestion window of the lanes up.
    fn report_gauges(&self) {
        let stats: Vec<TunnelStats> = self.lanes.iter().map(Tunnel::stats).collect();
        let up: Vec<&TunnelStats> = stats.iter().filter(|s| s.up).collect();
        let m = &self.metrics.tunnel;
        let labels = &self.labels;
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        m.up.get_or_create(labels).set(gauge(up.len() as u64));
        m.streams_open
            .get_or_create(labels)
            .set(gauge(stats.iter().map(|s| s.streams_open).sum()));
        if !up.is_empty() {
            let rtt = up.iter().map(|s| s.rtt).sum::<Duration>() / up.len() as u32;
            m.rtt.get_or_create(labels).set(rtt.as_secs_f64());
            m.cwnd
                .get_or_create(labels)
                .set(gauge(up.iter().map(|s| s.cwnd).sum()));
        }
    }

    /// Updates the tunnel's metrics: the gauges over all lanes, and the counters by what is
    /// new on this lane since `reported`.
    fn report(&self, lane: &Tunnel, reported: &mut TunnelStats) {
        self.report_gauges();
        let now = lane.stats();
        let m = &self.metrics.tunnel;
        let labels = &self.labels;
        if now.up {
            m.sent_packets
                .get_or_create(labels)
                .inc_by(now.sent_packets.saturating_sub(reported.sent_packets));
            m.lost_packets
                .get_or_create(labels)
                .inc_by(now.lost_packets.saturating_sub(reported.lost_packets));
            reported.sent_packets = reported.sent_packets.max(now.sent_packets);
            reported.lost_packets = reported.lost_packets.max(now.lost_packets);
        }
        m.handshakes
            .get_or_create(labels)
            .inc_by(now.connections.saturating_sub(reported.connections));
        reported.connections = now.connections;
    }
}
