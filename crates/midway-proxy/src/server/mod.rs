//! The proxy server: listeners, accept loops with limits, one task per split connection,
//! metrics sampling and designed shutdown.
//!
//! Life of a connection: a permit of the total limit is taken *before* `accept` (so at the limit
//! new clients wait in the kernel backlog instead of costing midway memory); the accepted client
//! is checked against the access list and the per-client limit right away (refused ones are
//! closed at once and counted); everything slow — SOCKS5 handshake, name resolution, connect —
//! runs in the connection's own task, never in the accept loop.
//!
//! One file per step of a connection:
//!
//! - this file: bind (profiles, route knobs, spool, listeners, metrics, nftables), run and
//!   shutdown (helpers, drain, cleanup);
//! - `accept.rs`: the accept loop and its admission (total and per-client limits, access list);
//! - `connection.rs`: one admitted connection, start to end (split or HTTP);
//! - `intercept.rs`: find the target, per intercept mode;
//! - `profiles.rs`: which profiles are used, route knobs, the kernel check;
//! - `connect.rs`: the remote segment's socket and the profile steps of every proxy socket;
//! - `peering.rs`: two-ended operation: a peer listener's header check (gateway) and a
//!   connection through the next midway (edge);
//! - `pool.rs`: the warm connections kept open to each peer;
//! - `relay.rs`: relay supervision, tcp_info sampling, metrics and the end-of-connection log;
//! - `memory.rs`: the socket memory guard's caps on a connection's sockets;
//! - `socket_id.rs`: a socket owned elsewhere, known by fd and inode;
//! - `error.rs`: typed errors.

mod accept;
mod congestion;
mod connect;
mod connection;
mod error;
mod intercept;
mod log_limit;
mod memory;
mod overload;
mod own_addresses;
mod peering;
mod pool;
mod profiles;
mod relay;
mod socket_id;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use midway_http::{ConnectUpstream, HttpProxy};
use midway_relay::RelayResources;
use midway_tcp::{RouteKnobs, TcpProfile};
use prometheus_client::registry::Registry;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access::{AccessList, ClientLimits};
use crate::config::{ListenerConfig, RuntimeConfig};
use crate::metrics::Metrics;
use crate::nft;
use crate::sockmem::{BufferCaps, SocketMemory};

pub use error::ProxyError;
pub use profiles::check_kernel_support;
use profiles::ListenerProfiles;

/// Backlog of every listener. Large, so bursts and the total-limit wait queue in the kernel.
const LISTEN_BACKLOG: i32 = 4096;
/// Shared gauges (spool bytes, pipes) are refreshed this often besides every scrape.
const GAUGE_REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// A splice pipe idle in the pool this long is closed: long enough that steady traffic keeps
/// reusing the same pipes, short enough that a burst's surplus fds do not linger.
const IDLE_PIPE_KEEP: Duration = Duration::from_secs(30);
/// After the grace period, cancelled relays get this long to close their sockets.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// What happened during shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownSummary {
    /// Connections accepted and allowed over the proxy's life.
    pub connections_served: u64,
    /// Connections still open when shutdown began.
    pub open_at_shutdown: usize,
    /// Of those, how many were cancelled because the grace period ran out.
    pub cancelled_after_grace: usize,
    /// How long the drain took.
    pub drain_time: Duration,
}

struct BoundListener {
    config: Arc<ListenerConfig>,
    /// Its profiles, resolved at start.
    profiles: Arc<ListenerProfiles>,
    listener: TcpListener,
    addr: SocketAddr,
    /// Listeners that speak HTTP: the engine and the upstream connector it uses.
    http: Option<HttpListener>,
}

/// The HTTP engine of one listener.
#[derive(Clone)]
struct HttpListener {
    engine: Arc<HttpProxy>,
    /// Opens upstream sockets exactly like the remote segment of a split connection.
    connect_upstream: ConnectUpstream,
}

/// State shared by accept loops and connection tasks.
struct Shared {
    config: Arc<RuntimeConfig>,
    metrics: Metrics,
    resources: Arc<RelayResources>,
    access: AccessList,
    client_limits: Arc<ClientLimits>,
    total_limit: Arc<Semaphore>,
    served: AtomicU64,
    /// Connections being served now, all listeners together (the overload bypass reads it).
    connections_open: AtomicUsize,
    /// The socket memory guard, unless `socket_memory = "off"`.
    socket_memory: Option<Arc<SocketMemory>>,
    /// Peers, keys, warm pools and the peer header's state.
    peering: peering::Peering,
}

/// A bound, ready proxy. [`Proxy::run`] serves it.
pub struct Proxy {
    shared: Arc<Shared>,
    listeners: Vec<BoundListener>,
    metrics_listener: Option<(TcpListener, SocketAddr)>,
    served_registry: Arc<Registry>,
    intercept: nft::Installed,
    route_knobs: Option<RouteKnobs>,
    /// HTTP engines, for their pool maintenance tasks.
    http_engines: Vec<Arc<HttpProxy>>,
    /// midway's BPF congestion controls the profiles use, registered while the proxy lives.
    _congestion_controls: Option<midway_bpf::Registration>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("listeners", &self.local_addrs())
            .field("metrics", &self.metrics_addr())
            .finish_non_exhaustive()
    }
}

fn bind_listener(
    listener: &ListenerConfig,
    profile: &TcpProfile,
) -> Result<(TcpListener, SocketAddr), ProxyError> {
    let addr = listener.listen;
    let bind_err = |source| ProxyError::Bind {
        listener: listener.name.clone(),
        addr,
        source,
    };
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(bind_err)?;
    sock.set_reuse_address(true).map_err(bind_err)?;
    if addr.is_ipv6() {
        // The address family says which clients this listener takes: [::] is IPv6 only, so an
        // IPv4 listener on the same port can coexist.
        sock.set_only_v6(true).map_err(bind_err)?;
    }
    if listener.intercept.needs_transparent_listener() {
        connect::set_transparent(&sock, addr.is_ipv6()).map_err(bind_err)?;
    }
    profile
        .apply_to_listener(&sock)
        .map_err(|source| ProxyError::ListenerProfile {
            listener: listener.name.clone(),
            profile: profile.name.clone(),
            source: Box::new(source),
        })?;
    sock.set_nonblocking(true).map_err(bind_err)?;
    sock.bind(&SockAddr::from(addr)).map_err(bind_err)?;
    sock.listen(LISTEN_BACKLOG).map_err(bind_err)?;
    let std_listener: std::net::TcpListener = sock.into();
    let local = std_listener.local_addr().map_err(bind_err)?;
    let tokio_listener = TcpListener::from_std(std_listener).map_err(bind_err)?;
    Ok((tokio_listener, local))
}

/// Removes spool files an earlier run left behind and sets up the relay's spool and pipes.
fn relay_resources(config: &RuntimeConfig) -> Result<Arc<RelayResources>, ProxyError> {
    let removed = midway_relay::clean_spool_dir(&config.spool_dir).map_err(|source| {
        ProxyError::SpoolClean {
            dir: config.spool_dir.clone(),
            source,
        }
    })?;
    if removed > 0 {
        tracing::info!(removed, dir = %config.spool_dir.display(), "removed spool files left by an earlier run");
    }
    RelayResources::new(
        config.spool_dir.clone(),
        config.spool_max_total_bytes,
        config.max_pipes,
    )
    .map_err(ProxyError::Relay)
}

/// The HTTP engine of `listener`, if it speaks HTTP. Its metrics are registered into both
/// registries, like the proxy's own (see [`Proxy::bind`]).
fn http_listener(
    listener: &ListenerConfig,
    config: &RuntimeConfig,
    profiles: &ListenerProfiles,
    socket_memory: &Option<Arc<SocketMemory>>,
    registry: &mut Registry,
    served: &mut Registry,
) -> Result<Option<HttpListener>, ProxyError> {
    let Some(http_config) = &listener.http else {
        return Ok(None);
    };
    let labels = || {
        (
            std::borrow::Cow::Borrowed("listener"),
            std::borrow::Cow::Owned(listener.name.clone()),
        )
    };
    let engine = HttpProxy::new(
        http_config.clone(),
        registry
            .sub_registry_with_prefix("midway")
            .sub_registry_with_label(labels()),
    )
    .map_err(|source| ProxyError::Http {
        listener: listener.name.clone(),
        source,
    })?;
    engine.metrics().register(
        served
            .sub_registry_with_prefix("midway")
            .sub_registry_with_label(labels()),
    );
    Ok(Some(HttpListener {
        engine,
        connect_upstream: connect::upstream_connector(
            profiles.remote().clone(),
            config.connect_timeout,
            Arc::new(config.denied_destinations.clone()),
            socket_memory.clone(),
        ),
    }))
}

/// Binds the `/metrics` endpoint, if configured.
async fn bind_metrics(
    config: &RuntimeConfig,
) -> Result<Option<(TcpListener, SocketAddr)>, ProxyError> {
    let Some(addr) = config.metrics_listen else {
        return Ok(None);
    };
    let l = TcpListener::bind(addr)
        .await
        .map_err(|source| ProxyError::MetricsBind { addr, source })?;
    let local = l
        .local_addr()
        .map_err(|source| ProxyError::MetricsBind { addr, source })?;
    tracing::info!(addr = %local, "metrics at http://{local}/metrics");
    Ok(Some((l, local)))
}

impl Proxy {
    /// Checks every referenced profile against the kernel, installs route-metric knobs, cleans
    /// the spool directory, binds every listener and the metrics endpoint, and finally installs
    /// the owned nftables table and policy routing. Errors name what failed; whatever was
    /// installed before an error is removed again.
    pub async fn bind(config: RuntimeConfig, registry: &mut Registry) -> Result<Proxy, ProxyError> {
        let socket_memory = memory::socket_memory_guard(config.socket_memory)?;
        let mut profiles = config.profiles.clone();
        let used = profiles::referenced_profiles(&config);
        let congestion_controls = congestion::register_congestion_controls(&used, &profiles)?;
        let route_knobs = profiles::install_route_knobs(&config, &used, &mut profiles)?;
        profiles::check_profiles_supported(&used, &profiles)?;
        // From here on the profiles (marks filled in) are shared, never changed.
        let profiles: BTreeMap<String, Arc<TcpProfile>> = profiles
            .into_iter()
            .map(|(name, profile)| (name, Arc::new(profile)))
            .collect();
        let resources = relay_resources(&config)?;

        // Metrics are registered twice: into the caller's registry (for its own use) and into
        // one this proxy serves; both hold clones of the same values.
        let mut served = Registry::default();
        let mut listeners = Vec::with_capacity(config.listeners.len());
        let mut http_engines = Vec::new();
        for listener in &config.listeners {
            let listener_profiles = Arc::new(ListenerProfiles::resolve(listener, &profiles)?);
            let (bound, addr) = bind_listener(listener, listener_profiles.local())?;
            let http = http_listener(
                listener,
                &config,
                &listener_profiles,
                &socket_memory,
                registry,
                &mut served,
            )?;
            if let Some(http) = &http {
                http_engines.push(http.engine.clone());
            }
            tracing::info!(
                listener = %listener.name,
                mode = listener.intercept.mode_name(),
                http = http.is_some(),
                %addr,
                "listening"
            );
            listeners.push(BoundListener {
                config: Arc::new(listener.clone()),
                profiles: listener_profiles,
                listener: bound,
                addr,
                http,
            });
        }

        let metrics_listener = bind_metrics(&config).await?;

        let metrics = Metrics::default();
        for listener in &config.listeners {
            metrics.init_listener(&listener.name);
            if matches!(listener.intercept, crate::config::Intercept::Peer { .. }) {
                metrics.init_peer_listener(&listener.name);
            }
        }
        let mut pools = Vec::with_capacity(config.peers.len());
        for peer in &config.peers {
            metrics.init_peer(&peer.name);
            let profile =
                profiles
                    .get(&peer.profile)
                    .cloned()
                    .ok_or_else(|| ProxyError::UnknownProfile {
                        listener: format!("peer {}", peer.name),
                        profile: peer.profile.clone(),
                    })?;
            pools.push(Arc::new(pool::WarmPool::new(
                peer.clone(),
                profile,
                config.connect_timeout,
                metrics.clone(),
            )));
        }
        let peering = peering::Peering::new(&config, pools);
        metrics.register(registry);
        metrics.register(&mut served);

        let plan = nft::plan(&config);
        for (name, script, manage) in &plan.tables {
            if !manage {
                tracing::info!(table = %name, "nftables.manage = false; install these rules yourself:\n{script}");
            }
        }
        let intercept =
            nft::Installed::install(&plan, &config.spool_dir).map_err(ProxyError::Intercept)?;
        // Until here a transparent listener may be bound without its rules: connections are
        // not diverted yet. Tests and operators wait for this line.
        tracing::info!(
            listeners = listeners.len(),
            intercepting = !intercept.is_empty(),
            "ready: listeners bound, interception installed"
        );

        let shared = Arc::new(Shared {
            access: AccessList::new(config.allowed_clients.clone()),
            client_limits: ClientLimits::new(config.max_connections_per_client),
            total_limit: Arc::new(Semaphore::new(config.max_connections)),
            config: Arc::new(config),
            metrics,
            resources,
            served: Default::default(),
            connections_open: Default::default(),
            socket_memory,
            peering,
        });
        Ok(Proxy {
            shared,
            listeners,
            metrics_listener,
            served_registry: Arc::new(served),
            intercept,
            route_knobs,
            http_engines,
            _congestion_controls: congestion_controls,
        })
    }

    /// Every listener's name and the address it really bound (port 0 resolved).
    pub fn local_addrs(&self) -> Vec<(String, SocketAddr)> {
        self.listeners
            .iter()
            .map(|l| (l.config.name.clone(), l.addr))
            .collect()
    }

    /// Address of the `/metrics` endpoint, if configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener.as_ref().map(|(_, a)| *a)
    }

    /// Serves until `shutdown` fires; then stops accepting, lets open connections finish for
    /// `shutdown_grace`, cancels the rest, removes the owned nftables table, policy routing and
    /// route knobs, and returns a summary.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<ShutdownSummary, ProxyError> {
        let tracker = TaskTracker::new();
        // Cancels connections; fired only after the grace period.
        let connections_cancel = CancellationToken::new();
        // Stops helpers (metrics server, gauge refresher) at the very end.
        let helpers_cancel = CancellationToken::new();
        let (mut helpers, memory_sampler) = self.spawn_helpers(&helpers_cancel);

        let mut accept_loops = JoinSet::new();
        for bound in self.listeners.drain(..) {
            accept_loops.spawn(accept::accept_loop(
                self.shared.clone(),
                bound,
                tracker.clone(),
                shutdown.clone(),
                connections_cancel.clone(),
            ));
        }
        // Warm pools fill from the start and close their idle connections as soon as shutdown
        // begins (the peers' listeners then stop waiting for their headers).
        let mut pools = JoinSet::new();
        for pool in self.shared.peering.pools() {
            if pool.config().warm_connections > 0 {
                pools.spawn(pool.clone().maintain(shutdown.clone()));
            }
        }

        shutdown.cancelled().await;
        // Accept loops return on shutdown and drop (close) their listeners.
        while accept_loops.join_next().await.is_some() {}
        while pools.join_next().await.is_some() {}
        let (open_at_shutdown, cancelled_after_grace, drain_time) =
            self.drain(&tracker, &connections_cancel).await;

        helpers_cancel.cancel();
        while helpers.join_next().await.is_some() {}
        if let Some(thread) = memory_sampler {
            // It sees the cancellation within one sample interval.
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        self.intercept.remove();
        if let Some(knobs) = self.route_knobs.take() {
            if let Err(err) = knobs.remove() {
                tracing::error!(error = %err, "could not remove route-metric knobs");
            }
        }
        let summary = ShutdownSummary {
            connections_served: self.shared.served.load(Ordering::Relaxed),
            open_at_shutdown,
            cancelled_after_grace,
            drain_time,
        };
        tracing::info!(?summary, "proxy stopped");
        Ok(summary)
    }

    /// Starts what runs beside the connections until `cancel`: the metrics endpoint, the
    /// gauge refresher, the HTTP engines' pool maintenance, and the memory guard's sampler
    /// thread (returned apart, to be joined).
    fn spawn_helpers(
        &mut self,
        cancel: &CancellationToken,
    ) -> (JoinSet<()>, Option<JoinHandle<()>>) {
        let refresh = {
            let shared = self.shared.clone();
            move || {
                shared
                    .metrics
                    .spool_bytes
                    .set(shared.resources.spool_bytes_in_use() as i64);
                shared
                    .metrics
                    .pipes_in_use
                    .set(shared.resources.pipes_in_use() as i64);
            }
        };
        let mut helpers = JoinSet::new();
        if let Some((listener, _)) = self.metrics_listener.take() {
            helpers.spawn(crate::metrics::serve(
                listener,
                self.served_registry.clone(),
                Arc::new(refresh.clone()),
                cancel.clone(),
            ));
        }
        {
            let cancel = cancel.clone();
            let shared = self.shared.clone();
            let mut overload = overload::OverloadBypass::new(
                self.intercept.tables().to_vec(),
                self.shared.metrics.clone(),
            );
            helpers.spawn(async move {
                let mut tick = tokio::time::interval(GAUGE_REFRESH_INTERVAL);
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tick.tick() => {
                            // Pipes a burst left in the pool go once idle (two fds each).
                            shared.resources.close_idle_pipes(Instant::now(), IDLE_PIPE_KEEP);
                            if let Some(overload) = &mut overload {
                                let in_use = shared.connections_open.load(Ordering::Relaxed);
                                overload.observe(in_use, shared.config.max_connections).await;
                            }
                            refresh();
                        }
                    }
                }
            });
        }
        let memory_sampler = self.spawn_memory_sampler(cancel);
        for engine in &self.http_engines {
            // Closes expired idle upstream connections; stops with the other helpers, after
            // the last client connection is gone.
            helpers.spawn(engine.clone().run_pool_maintenance(cancel.clone()));
        }
        (helpers, memory_sampler)
    }

    /// The socket memory guard's sampler thread, which reports cap changes to the metrics and
    /// the log; `None` without a guard (or if the thread cannot start).
    fn spawn_memory_sampler(&self, cancel: &CancellationToken) -> Option<JoinHandle<()>> {
        let guard = self.shared.socket_memory.clone()?;
        let metrics = self.shared.metrics.clone();
        let on_change = move |caps: Option<BufferCaps>, machine: u64, live: usize| {
            metrics
                .socket_buffer_cap
                .set(caps.map_or(0, |c| i64::from(c.recv)));
            metrics.socket_buffer_cap_changes.inc();
            let machine_mib = machine >> 20;
            match caps {
                Some(caps) => tracing::info!(
                    recv_cap = caps.recv,
                    send_cap = caps.send,
                    machine_tcp_mib = machine_mib,
                    live,
                    "socket memory guard: relayed sockets' buffers capped"
                ),
                None => tracing::info!(
                    machine_tcp_mib = machine_mib,
                    live,
                    "socket memory guard: caps lifted"
                ),
            }
        };
        match guard.spawn_sampler(on_change, cancel.clone()) {
            Ok(thread) => Some(thread),
            Err(err) => {
                tracing::error!(error = %err, "socket memory guard: cannot start its thread; running without it");
                None
            }
        }
    }

    /// Lets open connections finish for `shutdown_grace`, then cancels the rest and waits for
    /// them a little. Returns (open at shutdown, cancelled after grace, drain time).
    async fn drain(
        &self,
        tracker: &TaskTracker,
        connections_cancel: &CancellationToken,
    ) -> (usize, usize, Duration) {
        tracker.close();
        let open_at_shutdown = tracker.len();
        let drain_started = Instant::now();
        tracing::info!(
            open = open_at_shutdown,
            grace_s = self.shared.config.shutdown_grace.as_secs_f64(),
            "shutdown: stopped accepting, draining connections"
        );
        let mut cancelled_after_grace = 0;
        if tokio::time::timeout(self.shared.config.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            cancelled_after_grace = tracker.len();
            self.shared
                .metrics
                .shutdown_resets
                .inc_by(cancelled_after_grace as u64);
            // A connection that had not finished may hold bytes one end has not received:
            // the relay closes it with a reset on both sides, never a FIN on a cut stream.
            tracing::warn!(
                reset = cancelled_after_grace,
                "grace period over; resetting the connections still open"
            );
            connections_cancel.cancel();
            if tokio::time::timeout(CANCEL_WAIT, tracker.wait())
                .await
                .is_err()
            {
                tracing::error!(
                    left = tracker.len(),
                    "connections did not end after cancellation"
                );
            }
        }
        (
            open_at_shutdown,
            cancelled_after_grace,
            drain_started.elapsed(),
        )
    }
}
