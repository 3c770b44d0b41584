//! The warm pool of one peer: connections to it opened ahead of time, so a proxied connection
//! pays no TCP handshake over the long segment (the umts paper's lesson about cold upstream
//! connections). A fresh warm connection still starts with the initial window: a profile's
//! `initcwnd` is how to skip slow start on it.
//!
//! One task per peer keeps `warm_connections` idle, connected sockets: it refills after every
//! take (the missing ones connecting at once), replaces a socket idle for `warm_max_idle` (before the peer's `idle_timeout` closes
//! it), drops sockets the peer closed, and closes all of them at shutdown. While the peer is
//! down it retries with a doubling pause, logging once when the peer goes down and once when
//! it comes back, never per attempt.
//!
//! A QUIC peer has no warm connections: its tunnel (`tunnel.rs`) is what is kept warm, and a
//! connection through it is a new stream (origin `tunnel`), or a TLS connection while the
//! tunnel is down (origin `fallback`).

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use midway_sys::sockopt::idle_and_open;
use midway_tcp::{CarriedOptions, Role, TcpProfile};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backoff::{pause_unless_shutdown, Backoff};
use super::connect::{apply_established, connect, Outgoing};
use super::error::{ErrorChain, SetupError};
use super::peer_link::{connect_tls, PeerLink};
use super::tunnel::{NoStream, PeerTunnel};
use crate::config::{PeerConfig, PeerTransport};
use crate::metrics::{Metrics, PeerLabels};

/// First pause after a failed connect to a peer; doubles per failure up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(10);
/// Idle sockets are checked for a close by the peer at least this often.
const CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// A warm connection the peer closes this soon after the connect was refused, not aged out: the
/// refill backs off as after a failed connect instead of reconnecting at once.
const REFUSED_WITHIN: Duration = Duration::from_secs(2);

/// Where a connection to a peer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PoolOrigin {
    /// Taken from the warm pool.
    Warm,
    /// Connected for this connection.
    Fresh,
    /// A stream of the peer's QUIC tunnel.
    Tunnel,
}

/// The warm connections of one peer.
pub(super) struct WarmPool {
    config: PeerConfig,
    profile: Arc<TcpProfile>,
    connect_timeout: Duration,
    idle: Mutex<VecDeque<(PeerLink, Instant)>>,
    /// Wakes the refill task after a take.
    taken: Notify,
    metrics: Metrics,
    labels: PeerLabels,
    /// A QUIC peer's tunnel.
    tunnel: Option<Arc<PeerTunnel>>,
}

impl WarmPool {
    pub(super) fn new(
        config: PeerConfig,
        profile: Arc<TcpProfile>,
        connect_timeout: Duration,
        metrics: Metrics,
    ) -> WarmPool {
        let labels = PeerLabels {
            peer: config.name.clone(),
        };
        let tunnel = PeerTunnel::new(&config, metrics.clone()).map(Arc::new);
        WarmPool {
            tunnel,
            config,
            profile,
            connect_timeout,
            idle: Mutex::default(),
            taken: Notify::new(),
            metrics,
            labels,
        }
    }

    /// The peer this pool connects to.
    pub(super) fn config(&self) -> &PeerConfig {
        &self.config
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, VecDeque<(PeerLink, Instant)>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update_gauge(&self, len: usize) {
        self.metrics
            .peer_warm_idle
            .get_or_create(&self.labels)
            .set(i64::try_from(len).unwrap_or(i64::MAX));
    }

    /// A connection to the peer: the oldest live warm one, or (pool empty, or `fresh_only`) a
    /// new one; for a QUIC peer, a stream of its tunnel (or a TLS connection while the tunnel
    /// is down).
    pub(super) async fn take(
        &self,
        fresh_only: bool,
    ) -> Result<(PeerLink, PoolOrigin), SetupError> {
        if let Some(tunnel) = &self.tunnel {
            return self.take_from_tunnel(tunnel).await;
        }
        if !fresh_only {
            let taken = {
                let mut idle = self.idle();
                let mut found = None;
                while let Some((stream, _)) = idle.pop_front() {
                    // EOF (the peer closed it), a reset, or bytes (a peer never sends before
                    // the header; over TLS, the alert of a peer that refused our key) all
                    // mean it cannot carry a connection.
                    if stream.tcp().is_some_and(|tcp| idle_and_open(tcp.as_fd())) {
                        found = Some(stream);
                        break;
                    }
                }
                self.update_gauge(idle.len());
                found
            };
            self.taken.notify_one();
            if let Some(stream) = taken {
                self.metrics.peer_connection(&self.config.name, "warm");
                return Ok((stream, PoolOrigin::Warm));
            }
        }
        let stream = self.connect().await?;
        self.metrics.peer_connection(&self.config.name, "fresh");
        Ok((stream, PoolOrigin::Fresh))
    }

    /// A QUIC peer's connection: a stream of its tunnel, or TLS to the same address while the
    /// tunnel is down, or whichever is ready first while it is being set up (see
    /// [`PeerTunnel::fallback_head_start`]).
    async fn take_from_tunnel(
        &self,
        tunnel: &PeerTunnel,
    ) -> Result<(PeerLink, PoolOrigin), SetupError> {
        let name = &self.config.name;
        let quic = tunnel.open();
        let outcome = match tunnel.fallback_head_start() {
            None => quic.await.map(PeerLink::Quic),
            Some(head_start) => {
                let tls = async {
                    tokio::time::sleep(head_start).await;
                    self.connect().await
                };
                tokio::pin!(quic, tls);
                let mut tls_failed = None;
                loop {
                    tokio::select! {
                        // QUIC first when both are ready.
                        biased;
                        result = &mut quic => break match result {
                            Err(NoStream::Fallback) => match tls_failed.take() {
                                Some(err) => return Err(err),
                                None => {
                                    let link = (&mut tls).await?;
                                    tunnel.count_fallback();
                                    self.metrics.peer_connection(name, "fallback");
                                    return Ok((link, PoolOrigin::Fresh));
                                }
                            },
                            other => other.map(PeerLink::Quic),
                        },
                        result = &mut tls, if tls_failed.is_none() => match result {
                            Ok(link) => {
                                tunnel.count_fallback();
                                self.metrics.peer_connection(name, "fallback");
                                return Ok((link, PoolOrigin::Fresh));
                            }
                            // QUIC may still come up.
                            Err(err) => tls_failed = Some(err),
                        },
                    }
                }
            }
        };
        match outcome {
            Ok(stream) => {
                self.metrics.peer_connection(name, "tunnel");
                Ok((stream, PoolOrigin::Tunnel))
            }
            Err(NoStream::Fallback) => {
                let link = self.connect().await?;
                tunnel.count_fallback();
                self.metrics.peer_connection(name, "fallback");
                Ok((link, PoolOrigin::Fresh))
            }
            Err(NoStream::Failed(source)) => Err(SetupError::PeerQuic {
                peer: name.clone(),
                reason: source.reason(),
                source: Box::new(source),
            }),
        }
    }

    /// A new connection with the peer's profile, before connect and once established, as
    /// every remote segment gets it; over TLS (a TLS peer, and a QUIC peer's fallback), with
    /// the handshake done (within the same `connect_timeout`), so a warm TLS connection costs
    /// a new client no round trip either.
    async fn connect(&self) -> Result<PeerLink, SetupError> {
        let result = async {
            let (stream, _) = connect(
                &self.config.address,
                &self.profile,
                Outgoing::default(),
                None,
                self.connect_timeout,
            )
            .await?;
            apply_established(&stream, &self.profile, Role::Outgoing, CarriedOptions::All)?;
            match &self.config.transport {
                PeerTransport::Tcp => Ok(PeerLink::Tcp(stream)),
                PeerTransport::Tls { client, .. } | PeerTransport::Quic { client, .. } => {
                    connect_tls(stream, client, self.connect_timeout)
                        .await
                        .map_err(|source| {
                            let reason = midway_tls::refusal_reason(&source);
                            self.metrics.peer_tls_failure(&self.config.name, reason);
                            SetupError::PeerTls {
                                peer: self.config.name.clone(),
                                reason,
                                source,
                            }
                        })
                }
            }
        }
        .await;
        if result.is_err() {
            self.metrics
                .peer_connect_failures
                .get_or_create(&self.labels)
                .inc();
        }
        result
    }

    /// Drops idle sockets the peer closed and those idle for `warm_max_idle`; returns how many
    /// are left, when the oldest will be too old, and whether the peer closed one within
    /// [`REFUSED_WITHIN`] of its connect (over TLS 1.3 the client's handshake completes before
    /// the peer has checked its key, so a peer that refuses the key shows up here, as a close
    /// right after the connect, and not as a failed connect).
    fn prune(&self) -> (usize, Option<Instant>, bool) {
        let mut idle = self.idle();
        let max_idle = self.config.warm_max_idle;
        let mut refused = false;
        idle.retain(|(stream, since)| {
            let open = stream.tcp().is_some_and(|tcp| idle_and_open(tcp.as_fd()));
            refused |= !open && since.elapsed() < REFUSED_WITHIN;
            since.elapsed() < max_idle && open
        });
        self.update_gauge(idle.len());
        (
            idle.len(),
            idle.front().map(|(_, since)| *since + max_idle),
            refused,
        )
    }

    /// Keeps the pool full until `shutdown`, then closes every idle socket; a QUIC peer's
    /// task keeps its tunnel up instead.
    pub(super) async fn maintain(self: Arc<Self>, shutdown: CancellationToken) {
        if let Some(tunnel) = &self.tunnel {
            return tunnel.clone().maintain(shutdown).await;
        }
        let name = &self.config.name;
        let wanted = self.config.warm_connections;
        let mut retry = Backoff::new(RETRY_MIN, RETRY_MAX);
        'upkeep: loop {
            let (len, oldest_expires, refused) = self.prune();
            if len < wanted {
                // The missing connections are opened at once, not one after another: on a
                // long path each takes one round trip (two with TLS), and a browser's burst
                // of six connections emptied a pool that a serial refill took seconds to fill
                // again over a GEO hop (docs/results/peer-transports, geo-web).
                let mut failure = refused.then(|| SetupError::PeerHandshake {
                    peer: name.clone(),
                    source: std::io::Error::other(
                        "the peer closed a new connection before it was used (a refused key?)",
                    ),
                });
                let mut added = 0;
                if failure.is_none() {
                    let mut connecting: FuturesUnordered<_> =
                        (len..wanted).map(|_| self.connect()).collect();
                    loop {
                        let next = tokio::select! {
                            _ = shutdown.cancelled() => break 'upkeep,
                            next = connecting.next() => next,
                        };
                        match next {
                            None => break,
                            Some(Ok(stream)) => {
                                added += 1;
                                let mut idle = self.idle();
                                idle.push_back((stream, Instant::now()));
                                self.update_gauge(idle.len());
                            }
                            Some(Err(err)) => {
                                failure.get_or_insert(err);
                            }
                        }
                    }
                }
                if added > 0 && retry.succeeded() {
                    tracing::info!(peer = %name, "peer reachable again; refilling its warm pool");
                }
                // Some connected (or all): the next round opens what is still missing.
                let Some(err) = failure.filter(|_| added == 0) else {
                    continue;
                };
                let (pause, first) = retry.failed();
                if first {
                    tracing::warn!(peer = %name, error = %ErrorChain(&err), "peer unreachable: no warm connections; retrying with backoff");
                }
                if !pause_unless_shutdown(&shutdown, pause).await {
                    break;
                }
                continue;
            }
            let wake_at = oldest_expires.map_or(Instant::now() + CHECK_INTERVAL, |at| {
                at.min(Instant::now() + CHECK_INTERVAL)
            });
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.taken.notified() => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
        }
        let mut idle = self.idle();
        idle.clear();
        self.update_gauge(0);
    }
}
