//! The proxy server: listeners, accept loops with limits, one task per split connection,
//! metrics sampling, reload, binary upgrade and designed shutdown.
//!
//! Life of a connection: a permit of the total limit is taken *before* `accept` (so at the limit
//! new clients wait in the kernel backlog instead of costing midway memory); the accepted client
//! is checked against the access list and the per-client limit right away (refused ones are
//! closed at once and counted); everything slow — SOCKS5 handshake, name resolution, connect —
//! runs in the connection's own task, never in the accept loop. Each connection reads the
//! configuration of the generation it was accepted under (`generation.rs`), so a reload never
//! changes an established connection.
//!
//! One file per step:
//!
//! - this file: start (profiles, route knobs, spool, listeners, metrics, nftables), the run loop
//!   (accept loops, reloads, a handover) and shutdown (helpers, drain, cleanup);
//! - `generation.rs`: what a connection reads from the configuration, rebuilt per reload;
//! - `reload.rs`: what a reload may change;
//! - `handover.rs`: binary upgrade, the sockets passed to a new process;
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
//! - `overload.rs`: the overload bypass;
//! - `socket_id.rs`: a socket owned elsewhere, known by fd and inode;
//! - `error.rs`: typed errors.

mod accept;
mod congestion;
mod connect;
mod connection;
mod error;
mod generation;
mod handover;
mod intercept;
mod log_limit;
mod memory;
mod overload;
mod own_addresses;
mod peering;
mod pool;
mod profiles;
mod relay;
mod reload;
mod socket_id;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use midway_bpf::Registration;
use midway_http::{ConnectUpstream, HttpProxy};
use midway_relay::RelayResources;
use midway_tcp::{RouteKnobs, TcpProfile};
use prometheus_client::registry::Registry;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access::ClientLimits;
use crate::config::{ListenerConfig, RuntimeConfig};
use crate::metrics::Metrics;
use crate::nft;
use crate::sockmem::{BufferCaps, SocketMemory};

pub use error::ProxyError;
pub use handover::HandoverError;
pub use profiles::check_kernel_support;
pub use reload::ReloadSummary;

use generation::Generation;
use handover::{Inherited, ListenerKey, UpgradeSocket};

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
    /// Whether a new midway process took over (a binary upgrade) before this one stopped.
    pub handed_over: bool,
}

/// A listening socket, bound (or taken over) at start or by a reload.
struct BoundListener {
    name: String,
    key: ListenerKey,
    listener: Arc<TcpListener>,
    addr: SocketAddr,
}

/// The HTTP engine of one listener.
#[derive(Clone)]
struct HttpListener {
    engine: Arc<HttpProxy>,
    /// Opens upstream sockets exactly like the remote segment of a split connection.
    connect_upstream: ConnectUpstream,
}

/// State that lives as long as the proxy, shared by accept loops and connection tasks of every
/// generation.
struct Shared {
    metrics: Metrics,
    resources: Arc<RelayResources>,
    client_limits: Arc<ClientLimits>,
    total_limit: Arc<Semaphore>,
    /// `max_connections` of the newest generation (the size `total_limit` is brought to).
    max_connections: AtomicUsize,
    served: AtomicU64,
    /// Connections being served now, all listeners together (the overload bypass reads it).
    connections_open: AtomicUsize,
    /// The socket memory guard, unless `socket_memory = "off"`.
    socket_memory: Option<Arc<SocketMemory>>,
    /// The managed nftables tables installed now (the overload bypass switches their set).
    intercept_tables: Mutex<Arc<[String]>>,
    /// The transparent listeners accepting now: their accept queues count as load.
    transparent_listeners: Mutex<Vec<Arc<TcpListener>>>,
}

impl Shared {
    fn set_intercept_tables(&self, tables: &[String]) {
        *self
            .intercept_tables
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Arc::from(tables.to_vec());
    }

    /// The fullest of `max_connections` and the transparent listeners' accept queues.
    fn load(&self) -> overload::Load {
        let connections = overload::Load {
            used: self.connections_open.load(Ordering::Relaxed),
            limit: self.max_connections.load(Ordering::Relaxed),
            what: "connections",
        };
        let listeners = self
            .transparent_listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        listeners
            .iter()
            .filter_map(|l| midway_sys::tcp_info::accept_queue(l.as_fd()).ok())
            .map(|q| overload::Load {
                used: q.queued as usize,
                limit: q.limit.max(1) as usize,
                what: "accept queue",
            })
            .fold(connections, overload::Load::fuller)
    }

    fn intercept_tables(&self) -> Arc<[String]> {
        self.intercept_tables
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A request to the running proxy.
enum Control {
    Reload {
        config: Box<RuntimeConfig>,
        reply: oneshot::Sender<Result<ReloadSummary, ProxyError>>,
    },
}

/// Sends reloads to a running [`Proxy`] (see [`Proxy::handle`]).
#[derive(Clone)]
pub struct ProxyHandle {
    control: mpsc::Sender<Control>,
}

impl ProxyHandle {
    /// Applies `config` to the running proxy (what SIGHUP does after reading the file). On an
    /// error the running configuration stays, entirely.
    pub async fn reload(&self, config: RuntimeConfig) -> Result<ReloadSummary, ProxyError> {
        let (reply, answer) = oneshot::channel();
        self.control
            .send(Control::Reload {
                config: Box::new(config),
                reply,
            })
            .await
            .map_err(|_| ProxyError::Stopped)?;
        answer.await.map_err(|_| ProxyError::Stopped)?
    }
}

/// A bound, ready proxy. [`Proxy::run`] serves it.
pub struct Proxy {
    shared: Arc<Shared>,
    generation: Arc<Generation>,
    /// Bound by the start, started by `run`.
    listeners: Vec<BoundListener>,
    metrics_listener: Option<(Arc<TcpListener>, SocketAddr)>,
    served_registry: Arc<RwLock<Registry>>,
    intercept: nft::Installed,
    route_knobs: Option<RouteKnobs>,
    /// midway's BPF congestion controls the profiles use, registered (or adopted from the
    /// midway this one took over from) while the proxy lives.
    congestion_controls: Vec<Registration>,
    control: mpsc::Sender<Control>,
    control_requests: mpsc::Receiver<Control>,
    /// Where a new midway process asks to take over; `None` when another midway answers there.
    upgrade_socket: Option<UpgradeSocket>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("listeners", &self.local_addrs())
            .field("metrics", &self.metrics_addr())
            .finish_non_exhaustive()
    }
}

fn listener_key(listener: &ListenerConfig) -> ListenerKey {
    ListenerKey {
        listen: listener.listen,
        transparent: listener.intercept.needs_transparent_listener(),
    }
}

/// Binds `listener` (or takes the socket `inherited` offers for it) and puts `profile` on it.
fn bind_listener(
    listener: &ListenerConfig,
    profile: &TcpProfile,
    inherited: Option<&mut Inherited>,
) -> Result<BoundListener, ProxyError> {
    let addr = listener.listen;
    let bind_err = |source| ProxyError::Bind {
        listener: listener.name.clone(),
        addr,
        source,
    };
    let key = listener_key(listener);
    let taken = inherited.and_then(|inherited| inherited.take_listener(key));
    let took_over = taken.is_some();
    let sock = match taken {
        Some(fd) => Socket::from(fd),
        None => {
            let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
                .map_err(bind_err)?;
            sock.set_reuse_address(true).map_err(bind_err)?;
            if addr.is_ipv6() {
                // The address family says which clients this listener takes: [::] is IPv6
                // only, so an IPv4 listener on the same port can coexist.
                sock.set_only_v6(true).map_err(bind_err)?;
            }
            if key.transparent {
                connect::set_transparent(&sock, addr.is_ipv6()).map_err(bind_err)?;
            }
            sock
        }
    };
    profile
        .apply_to_listener(&sock)
        .map_err(|source| ProxyError::ListenerProfile {
            listener: listener.name.clone(),
            profile: profile.name.clone(),
            source: Box::new(source),
        })?;
    sock.set_nonblocking(true).map_err(bind_err)?;
    if !took_over {
        sock.bind(&SockAddr::from(addr)).map_err(bind_err)?;
        sock.listen(LISTEN_BACKLOG).map_err(bind_err)?;
    }
    let std_listener: std::net::TcpListener = sock.into();
    let local = std_listener.local_addr().map_err(bind_err)?;
    let tokio_listener = TcpListener::from_std(std_listener).map_err(bind_err)?;
    tracing::info!(
        listener = %listener.name,
        mode = listener.intercept.mode_name(),
        http = listener.http.is_some(),
        addr = %local,
        taken_over = took_over,
        "listening"
    );
    Ok(BoundListener {
        name: listener.name.clone(),
        key,
        listener: Arc::new(tokio_listener),
        addr: local,
    })
}

/// Sets up the relay's spool and pipes. A fresh start first removes spool files an earlier run
/// left behind; a take-over must not (the old process still spools there).
fn relay_resources(config: &RuntimeConfig, clean: bool) -> Result<Arc<RelayResources>, ProxyError> {
    if clean {
        let removed = midway_relay::clean_spool_dir(&config.spool_dir).map_err(|source| {
            ProxyError::SpoolClean {
                dir: config.spool_dir.clone(),
                source,
            }
        })?;
        if removed > 0 {
            tracing::info!(removed, dir = %config.spool_dir.display(), "removed spool files left by an earlier run");
        }
    }
    RelayResources::new(
        config.spool_dir.clone(),
        config.spool_max_total_bytes,
        config.max_pipes,
    )
    .map_err(ProxyError::Relay)
}

/// Binds the `/metrics` endpoint, if configured (or takes the socket `inherited` offers).
async fn bind_metrics(
    config: &RuntimeConfig,
    inherited: Option<&mut Inherited>,
) -> Result<Option<(Arc<TcpListener>, SocketAddr)>, ProxyError> {
    let Some(addr) = config.metrics_listen else {
        return Ok(None);
    };
    let err = |source| ProxyError::MetricsBind { addr, source };
    let listener = match inherited.and_then(|inherited| inherited.take_metrics(addr)) {
        Some(fd) => {
            let std_listener = std::net::TcpListener::from(fd);
            std_listener.set_nonblocking(true).map_err(err)?;
            TcpListener::from_std(std_listener).map_err(err)?
        }
        None => TcpListener::bind(addr).await.map_err(err)?,
    };
    let local = listener.local_addr().map_err(err)?;
    tracing::info!(addr = %local, "metrics at http://{local}/metrics");
    Ok(Some((Arc::new(listener), local)))
}

/// The upgrade socket in `dir`, unless another midway (not the one being taken over) already
/// answers there. A binary upgrade is optional: a socket that cannot be bound (e.g. a spool
/// path longer than the 107 bytes a Unix socket's path may have) costs only the upgrade, with a
/// warning, never the start, and never a take-over that has already happened.
fn upgrade_socket(dir: &Path, taking_over: bool) -> Option<UpgradeSocket> {
    if !taking_over && UpgradeSocket::in_use(dir) {
        tracing::warn!(dir = %dir.display(), "another midway answers on this spool directory's upgrade socket; this one offers no binary upgrade (give each midway its own spool directory)");
        return None;
    }
    match UpgradeSocket::bind(dir) {
        Ok(socket) => Some(socket),
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot open the upgrade socket in the spool directory; this midway offers no binary upgrade");
            None
        }
    }
}

impl Proxy {
    /// Checks every referenced profile against the kernel, installs route-metric knobs, cleans
    /// the spool directory, binds every listener and the metrics endpoint, and finally installs
    /// the owned nftables table and policy routing. Errors name what failed; whatever was
    /// installed before an error is removed again.
    pub async fn bind(config: RuntimeConfig, registry: &mut Registry) -> Result<Proxy, ProxyError> {
        Proxy::start(config, registry, None).await
    }

    /// A binary upgrade: starts like [`Proxy::bind`], but with the listening sockets, metrics
    /// socket, BPF links and nftables state of the midway running with the same spool directory
    /// (see `handover.rs`), then tells it to stop accepting and drain. If this fails, the
    /// running midway goes on as before.
    pub async fn take_over(
        config: RuntimeConfig,
        registry: &mut Registry,
    ) -> Result<Proxy, ProxyError> {
        let path = config.spool_dir.join(handover::UPGRADE_SOCKET);
        let mut inherited = tokio::task::spawn_blocking(move || handover::request(&path))
            .await
            .map_err(|e| ProxyError::TakeOver(HandoverError::Protocol(e.to_string())))?
            .map_err(ProxyError::TakeOver)?;
        tracing::info!(
            from_pid = inherited.from_pid,
            "taking over from the running midway"
        );
        let mut proxy = Proxy::start(config, registry, Some(&mut inherited)).await?;
        tokio::task::spawn_blocking(move || inherited.commit())
            .await
            .map_err(|e| ProxyError::TakeOver(HandoverError::Protocol(e.to_string())))?
            .map_err(ProxyError::TakeOver)?;
        // Only now: the old process keeps its upgrade socket until it has let go.
        proxy.upgrade_socket = upgrade_socket(&proxy.generation.config.spool_dir, true);
        tracing::info!("took over: the previous midway stopped accepting and drains");
        Ok(proxy)
    }

    async fn start(
        config: RuntimeConfig,
        registry: &mut Registry,
        mut inherited: Option<&mut Inherited>,
    ) -> Result<Proxy, ProxyError> {
        let socket_memory = memory::socket_memory_guard(config.socket_memory)?;
        let used = profiles::referenced_profiles(&config);
        let mut congestion_controls = Vec::new();
        if let Some(inherited) = inherited.as_deref_mut() {
            let links = std::mem::take(&mut inherited.congestion_controls);
            congestion_controls.push(Registration::adopt(links));
        }
        // Names adopted above are already registered: `register` shares them.
        congestion_controls.extend(congestion::register_congestion_controls(
            &used,
            &config.profiles,
        )?);
        // What a crashed midway left is removed before anything is installed; a take-over
        // adopts the running midway's record instead, at the very end (until then, an error
        // must leave that midway's interception alone).
        let taking_over_from = inherited
            .as_ref()
            .map(|i| (i.from_pid, i.record_dir.clone()));
        let mut intercept = match &taking_over_from {
            None => Some(
                nft::Installed::begin(&config.spool_dir, None).map_err(ProxyError::Intercept)?,
            ),
            Some(_) => None,
        };
        let mut profiles = config.profiles.clone();
        let route_knobs = profiles::install_route_knobs(&config, &used, &mut profiles)?;
        let knob_record = route_knobs.as_ref().map(RouteKnobs::installed);
        if let (Some(intercept), Some(knobs)) = (intercept.as_mut(), &knob_record) {
            intercept
                .record_route_knobs(knobs.clone())
                .map_err(ProxyError::Intercept)?;
        }
        profiles::check_profiles_supported(&used, &profiles)?;
        let resources = relay_resources(&config, inherited.is_none())?;

        let shared = Arc::new(Shared {
            metrics: Metrics::default(),
            resources,
            client_limits: ClientLimits::new(config.max_connections_per_client),
            total_limit: Arc::new(Semaphore::new(config.max_connections)),
            max_connections: AtomicUsize::new(config.max_connections),
            served: Default::default(),
            connections_open: Default::default(),
            socket_memory,
            intercept_tables: Mutex::new(Arc::from(Vec::new())),
            transparent_listeners: Mutex::default(),
        });

        // Metrics are registered twice: into the caller's registry (for its own use) and into
        // one this proxy serves; both hold clones of the same values.
        let mut served = Registry::default();
        let profiles = reload::shared_profiles(&config, route_knobs.as_ref());
        let mut listeners = Vec::with_capacity(config.listeners.len());
        for listener in &config.listeners {
            let local = profiles.get(&listener.local_profile).ok_or_else(|| {
                ProxyError::UnknownProfile {
                    listener: listener.name.clone(),
                    profile: listener.local_profile.clone(),
                }
            })?;
            listeners.push(bind_listener(listener, local, inherited.as_deref_mut())?);
        }
        let metrics_listener = bind_metrics(&config, inherited).await?;
        let upgrade_socket = match &taking_over_from {
            Some(_) => None,
            None => upgrade_socket(&config.spool_dir, false),
        };
        let generation = Generation::build(1, config, &profiles, &shared, None, Some(registry))?;
        shared.metrics.register(registry);
        shared.metrics.register(&mut served);
        // A start that fails from here on ends the process; the served registry is its own.
        generation.register_new_http_metrics(None, &mut served);
        let config = &generation.config;

        let plan = nft::plan(config);
        for (name, script, manage) in &plan.tables {
            if !manage {
                tracing::info!(table = %name, "nftables.manage = false; install these rules yourself:\n{script}");
            }
        }
        let mut intercept = match (intercept, &taking_over_from) {
            (Some(intercept), _) => intercept,
            // The record is where the old process kept it; this process keeps it there.
            (None, Some((pid, record_dir))) => {
                let mut adopted =
                    nft::Installed::begin(record_dir, Some(*pid)).map_err(ProxyError::Intercept)?;
                if let Some(knobs) = knob_record {
                    if let Err(err) = adopted.record_route_knobs(knobs) {
                        adopted.disown();
                        return Err(ProxyError::Intercept(err));
                    }
                }
                adopted
            }
            (None, None) => unreachable!("begun above unless taking over"),
        };
        if let Err(err) = intercept.update(&plan) {
            if taking_over_from.is_some() {
                // The running midway still owns it.
                intercept.disown();
            }
            return Err(ProxyError::Intercept(err));
        }
        shared.set_intercept_tables(intercept.tables());
        // Until here a transparent listener may be bound without its rules: connections are
        // not diverted yet. Tests and operators wait for this line.
        tracing::info!(
            listeners = listeners.len(),
            intercepting = !intercept.is_empty(),
            "ready: listeners bound, interception installed"
        );

        let (control, control_requests) = mpsc::channel(4);
        Ok(Proxy {
            shared,
            generation: Arc::new(generation),
            listeners,
            metrics_listener,
            served_registry: Arc::new(RwLock::new(served)),
            intercept,
            route_knobs,
            congestion_controls,
            control,
            control_requests,
            upgrade_socket,
        })
    }

    /// Every listener's name and the address it really bound (port 0 resolved).
    pub fn local_addrs(&self) -> Vec<(String, SocketAddr)> {
        self.listeners
            .iter()
            .map(|l| (l.name.clone(), l.addr))
            .collect()
    }

    /// Address of the `/metrics` endpoint, if configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener.as_ref().map(|(_, a)| *a)
    }

    /// A handle to reload the proxy while it runs.
    pub fn handle(&self) -> ProxyHandle {
        ProxyHandle {
            control: self.control.clone(),
        }
    }

    /// Serves until `shutdown` fires (or a new midway process takes over); then stops
    /// accepting, lets open connections finish for `shutdown_grace` (after a take-over: until
    /// they end, or `shutdown` fires), cancels the rest, removes the owned nftables table,
    /// policy routing and route knobs (unless handed over), and returns a summary.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<ShutdownSummary, ProxyError> {
        let tracker = TaskTracker::new();
        // Cancels connections; fired only after the grace period.
        let connections_cancel = CancellationToken::new();
        // Fired when this process stops taking new work (shutdown or a handover): warm peer
        // connections waiting for a header then end.
        let draining = CancellationToken::new();
        // Stops helpers (metrics server, gauge refresher) at the very end.
        let helpers_cancel = CancellationToken::new();
        let (mut helpers, memory_sampler) = self.spawn_helpers(&helpers_cancel);
        let (generations, _) = watch::channel(self.generation.clone());

        let mut running = RunningListeners {
            listeners: BTreeMap::new(),
            accept_loops: JoinSet::new(),
            context: AcceptContext {
                shared: self.shared.clone(),
                generations: generations.clone(),
                tracker: tracker.clone(),
                draining: draining.clone(),
                connections_cancel: connections_cancel.clone(),
            },
        };
        for bound in std::mem::take(&mut self.listeners) {
            running.start(bound);
        }
        let mut pools = JoinSet::new();
        start_pools(&self.generation, &mut pools, &draining);

        let mut handed_over = false;
        loop {
            let upgrade = async {
                match &self.upgrade_socket {
                    Some(socket) => socket.accept().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(request) = self.control_requests.recv() => match request {
                    Control::Reload { config, reply } => {
                        let result = self
                            .reload(*config, &mut running, &generations, &mut pools, &draining, &mut helpers, &helpers_cancel)
                            .await;
                        match &result {
                            Ok(summary) => tracing::info!(
                                generation = summary.generation,
                                added = ?summary.added,
                                removed = ?summary.removed,
                                kept = summary.kept.len(),
                                "reloaded: new connections use the new configuration, open ones keep theirs"
                            ),
                            Err(err) => tracing::error!(error = %error::ErrorChain(err), "reload refused; the running configuration stays"),
                        }
                        let _ = reply.send(result);
                    }
                },
                accepted = upgrade => match accepted {
                    Ok(stream) => {
                        if self.hand_over(stream, &mut running).await {
                            handed_over = true;
                            break;
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "upgrade socket accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        draining.cancel();
        // Accept loops return and drop (close) their listeners.
        running.stop_all().await;
        while pools.join_next().await.is_some() {}
        if handed_over {
            tracing::info!(
                open = tracker.len(),
                "handed over to the new midway: draining open connections until they end (SIGTERM cuts the drain to the grace period)"
            );
            tracker.close();
            tokio::select! {
                _ = tracker.wait() => {}
                _ = shutdown.cancelled() => {}
            }
        }
        let (open_at_shutdown, cancelled_after_grace, drain_time) =
            self.drain(&tracker, &connections_cancel).await;

        helpers_cancel.cancel();
        while helpers.join_next().await.is_some() {}
        if let Some(thread) = memory_sampler {
            // It sees the cancellation within one sample interval.
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        // After a handover the new process owns the interception (`hand_over` let go of it),
        // and there are no route knobs (a midway holding them refuses to hand over).
        if !handed_over {
            // Knobs first: the record that lists them goes last, with the interception.
            if let Some(knobs) = self.route_knobs.take() {
                if let Err(err) = knobs.remove() {
                    tracing::error!(error = %err, "could not remove route-metric knobs");
                }
            }
            self.intercept.remove();
        }
        let summary = ShutdownSummary {
            connections_served: self.shared.served.load(Ordering::Relaxed),
            open_at_shutdown,
            cancelled_after_grace,
            drain_time,
            handed_over,
        };
        tracing::info!(?summary, "proxy stopped");
        Ok(summary)
    }

    /// Applies `config` as the next generation (see `reload.rs`). Nothing changes unless all of
    /// it can be applied: new listeners are bound first, then the nftables rules are brought to
    /// the new plan, then the generation is switched and removed listeners stop.
    #[allow(clippy::too_many_arguments)]
    async fn reload(
        &mut self,
        config: RuntimeConfig,
        running: &mut RunningListeners,
        generations: &watch::Sender<Arc<Generation>>,
        pools: &mut JoinSet<()>,
        draining: &CancellationToken,
        helpers: &mut JoinSet<()>,
        helpers_cancel: &CancellationToken,
    ) -> Result<ReloadSummary, ProxyError> {
        let old = self.generation.clone();
        let refuse = |reason: String| ProxyError::ReloadRefused { reason };
        let changed = reload::restart_only_changes(&old.config, &config);
        if !changed.is_empty() {
            return Err(refuse(format!(
                "{} changed; only a restart or a binary upgrade (`midway proxy --take-over`) applies {}",
                changed.join(", "),
                if changed.len() == 1 { "it" } else { "them" }
            )));
        }
        if !reload::route_knobs_unchanged(self.route_knobs.as_ref(), &config, &config.profiles) {
            return Err(refuse(
                "the profiles with route-metric knobs (initial_cwnd, delayed_ack, rto_min_ms above 200, dupack_threshold) changed; a restart applies them".into(),
            ));
        }
        let used = profiles::referenced_profiles(&config);
        if let Some(registration) =
            congestion::register_congestion_controls(&used, &config.profiles)?
        {
            self.congestion_controls.push(registration);
        }
        let profiles = reload::shared_profiles(&config, self.route_knobs.as_ref());
        {
            let plain: BTreeMap<String, TcpProfile> = profiles
                .iter()
                .map(|(name, profile)| (name.clone(), (**profile).clone()))
                .collect();
            profiles::check_profiles_supported(&used, &plain)?;
        }

        // Listeners: kept (same name, same socket identity), added, removed.
        let mut added = Vec::new();
        let mut kept = Vec::new();
        for listener in &config.listeners {
            let key = listener_key(listener);
            let local = profiles.get(&listener.local_profile).ok_or_else(|| {
                ProxyError::UnknownProfile {
                    listener: listener.name.clone(),
                    profile: listener.local_profile.clone(),
                }
            })?;
            match running.listeners.get(&listener.name) {
                Some(current) if current.key == key => {
                    // Accepted sockets inherit the listener's options: the new profile's.
                    let sock = socket2::SockRef::from(current.listener.as_ref());
                    local.apply_to_listener(&sock).map_err(|source| {
                        ProxyError::ListenerProfile {
                            listener: listener.name.clone(),
                            profile: local.name.clone(),
                            source: Box::new(source),
                        }
                    })?;
                    kept.push(listener.name.clone());
                }
                // New, or moved to another address: bound now; on a later error, dropping
                // `added` closes it again.
                _ => added.push(bind_listener(listener, local, None)?),
            }
        }
        let generation = Generation::build(
            old.number + 1,
            config,
            &profiles,
            &self.shared,
            Some(&old),
            None,
        )?;

        let plan = nft::plan(&generation.config);
        // `nft` and `ip` run for a few milliseconds, like at a start.
        self.intercept
            .update(&plan)
            .map_err(ProxyError::Intercept)?;
        self.shared.set_intercept_tables(self.intercept.tables());

        // From here on nothing fails: switch. The new HTTP engines' metrics are served from
        // now on (a reload refused above registered nothing, so a retry cannot double them).
        generation.register_new_http_metrics(
            Some(&old),
            &mut self
                .served_registry
                .write()
                .unwrap_or_else(|p| p.into_inner()),
        );
        let new_max = generation.config.max_connections;
        let old_max = self.shared.max_connections.swap(new_max, Ordering::Relaxed);
        resize_limit(&self.shared.total_limit, old_max, new_max);
        self.shared
            .client_limits
            .set_limit(generation.config.max_connections_per_client);
        let generation = Arc::new(generation);
        for engine in generation.http_engines() {
            if !old.http_engines().any(|e| Arc::ptr_eq(e, engine)) {
                helpers.spawn(engine.clone().run_pool_maintenance(helpers_cancel.clone()));
            }
        }
        let removed: Vec<String> = running
            .listeners
            .keys()
            .filter(|name| !kept.contains(name))
            .cloned()
            .collect();
        for name in &removed {
            running.stop(name);
        }
        let added_names: Vec<String> = added.iter().map(|b| b.name.clone()).collect();
        self.generation = generation.clone();
        generations.send_replace(generation.clone());
        for bound in added {
            running.start(bound);
        }
        old.retired.cancel();
        start_pools(&generation, pools, draining);
        Ok(ReloadSummary {
            generation: generation.number,
            added: added_names,
            removed,
            kept,
        })
    }

    /// Offers this process's sockets to a new midway on the upgrade socket. Returns true once
    /// the new process committed: this one has then stopped accepting and let go of the
    /// interception, the route knobs and the BPF links.
    async fn hand_over(
        &mut self,
        stream: std::os::unix::net::UnixStream,
        running: &mut RunningListeners,
    ) -> bool {
        let refusal = self.route_knobs.as_ref().map(|_| {
            "it holds route-metric knobs, which a take-over cannot carry yet; restart midway instead"
                .to_string()
        });
        let dup = |fd: std::os::fd::BorrowedFd<'_>| fd.try_clone_to_owned();
        let offered = (|| -> std::io::Result<_> {
            let listeners: Vec<(String, ListenerKey, OwnedFd)> = running
                .listeners
                .iter()
                .map(|(name, l)| Ok((name.clone(), l.key, dup(l.listener.as_fd())?)))
                .collect::<std::io::Result<_>>()?;
            let metrics = match &self.metrics_listener {
                Some((listener, addr)) => Some((*addr, dup(listener.as_fd())?)),
                None => None,
            };
            let links: Vec<(midway_bpf::Algorithm, OwnedFd)> = self
                .congestion_controls
                .iter()
                .flat_map(|r| r.owned_links())
                .map(|(algorithm, fd)| Ok((algorithm, dup(fd)?)))
                .collect::<std::io::Result<_>>()?;
            Ok((listeners, metrics, links))
        })();
        let (listeners, metrics, links) = match offered {
            Ok(offered) => offered,
            Err(err) => {
                tracing::error!(error = %err, "cannot hand over: duplicating the sockets failed");
                return false;
            }
        };
        let record_dir = self.generation.config.spool_dir.clone();
        let keys: Vec<(String, ListenerKey)> = running
            .listeners
            .iter()
            .map(|(name, l)| (name.clone(), l.key))
            .collect();
        tracing::info!(listeners = ?keys.iter().map(|(n, _)| n).collect::<Vec<_>>(), "a new midway asks to take over; offering the listening sockets");
        let committed = tokio::task::spawn_blocking(move || {
            let offering = handover::Offering {
                listeners: listeners
                    .iter()
                    .map(|(name, key, fd)| (name.clone(), *key, fd.as_fd()))
                    .collect(),
                metrics: metrics.as_ref().map(|(addr, fd)| (*addr, fd.as_fd())),
                congestion_controls: links.iter().map(|(a, fd)| (*a, fd.as_fd())).collect(),
                record_dir,
                refusal,
            };
            handover::offer(stream, offering)
        })
        .await;
        let stream = match committed {
            Ok(Ok(stream)) => stream,
            Ok(Err(err)) => {
                tracing::warn!(error = %error::ErrorChain(&err), "take-over abandoned; going on");
                return false;
            }
            Err(err) => {
                tracing::error!(error = %err, "take-over task failed; going on");
                return false;
            }
        };
        // Stop accepting before answering: from here on only the new process accepts.
        running.stop_all().await;
        self.intercept.disown();
        // The upgrade socket's path is the new process's now.
        self.upgrade_socket = None;
        if let Err(err) = tokio::task::spawn_blocking(move || handover::released(stream))
            .await
            .unwrap_or_else(|e| Err(HandoverError::Protocol(e.to_string())))
        {
            tracing::warn!(error = %err, "could not tell the new midway it may go on; it will time out");
        }
        true
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
        if let Some((listener, _)) = &self.metrics_listener {
            helpers.spawn(crate::metrics::serve(
                listener.clone(),
                self.served_registry.clone(),
                Arc::new(refresh.clone()),
                cancel.clone(),
            ));
        }
        {
            let cancel = cancel.clone();
            let shared = self.shared.clone();
            let mut overload = overload::OverloadBypass::new(self.shared.metrics.clone());
            helpers.spawn(async move {
                let mut tick = tokio::time::interval(GAUGE_REFRESH_INTERVAL);
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tick.tick() => {
                            // Pipes a burst left in the pool go once idle (two fds each).
                            shared.resources.close_idle_pipes(Instant::now(), IDLE_PIPE_KEEP);
                            overload.observe(shared.intercept_tables(), shared.load()).await;
                            refresh();
                        }
                    }
                }
            });
        }
        let memory_sampler = self.spawn_memory_sampler(cancel);
        for engine in self.generation.http_engines() {
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
        let grace = self.generation.config.shutdown_grace;
        tracing::info!(
            open = open_at_shutdown,
            grace_s = grace.as_secs_f64(),
            "shutdown: stopped accepting, draining connections"
        );
        let mut cancelled_after_grace = 0;
        if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
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

/// Brings the total limit from `old_max` to `new_max` slots: more slots are free at once; fewer
/// are taken out as connections end (a lowered limit never cuts an open connection).
fn resize_limit(limit: &Arc<Semaphore>, old_max: usize, new_max: usize) {
    if new_max > old_max {
        limit.add_permits(new_max - old_max);
    } else if new_max < old_max {
        let surplus = old_max - new_max;
        let forgotten = limit.forget_permits(surplus);
        let rest = surplus - forgotten;
        if rest > 0 {
            let limit = limit.clone();
            tokio::spawn(async move {
                if let Ok(permits) = limit.acquire_many_owned(rest as u32).await {
                    permits.forget();
                }
            });
        }
    }
}

/// Starts the warm pools of `generation`; they stop when it is retired or when draining begins.
fn start_pools(generation: &Generation, pools: &mut JoinSet<()>, draining: &CancellationToken) {
    for pool in generation.peering.pools() {
        if pool.config().warm_connections > 0 {
            let stop = CancellationToken::new();
            let (retired, draining, stop_now) =
                (generation.retired.clone(), draining.clone(), stop.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = retired.cancelled() => {}
                    _ = draining.cancelled() => {}
                }
                stop_now.cancel();
            });
            pools.spawn(pool.clone().maintain(stop));
        }
    }
}

/// What every accept loop shares.
#[derive(Clone)]
struct AcceptContext {
    shared: Arc<Shared>,
    generations: watch::Sender<Arc<Generation>>,
    tracker: TaskTracker,
    draining: CancellationToken,
    connections_cancel: CancellationToken,
}

/// One accept loop per listener, each stoppable on its own (a reload that removes it).
struct RunningListeners {
    listeners: BTreeMap<String, RunningListener>,
    accept_loops: JoinSet<()>,
    context: AcceptContext,
}

struct RunningListener {
    key: ListenerKey,
    listener: Arc<TcpListener>,
    stop: CancellationToken,
}

impl RunningListeners {
    fn start(&mut self, bound: BoundListener) {
        let stop = CancellationToken::new();
        let cx = self.context.clone();
        self.accept_loops
            .spawn(accept::accept_loop(accept::AcceptLoop {
                shared: cx.shared,
                name: bound.name.clone(),
                listener: bound.listener.clone(),
                addr: bound.addr,
                generations: cx.generations.subscribe(),
                tracker: cx.tracker,
                stop: stop.clone(),
                draining: cx.draining,
                connections_cancel: cx.connections_cancel,
            }));
        if bound.key.transparent {
            self.transparent_listeners().push(bound.listener.clone());
        }
        if let Some(replaced) = self.listeners.insert(
            bound.name,
            RunningListener {
                key: bound.key,
                listener: bound.listener,
                stop,
            },
        ) {
            replaced.stop.cancel();
        }
    }

    /// Stops one listener's accept loop; its socket closes when the loop returns.
    fn stop(&mut self, name: &str) {
        if let Some(listener) = self.listeners.remove(name) {
            listener.stop.cancel();
            self.transparent_listeners()
                .retain(|l| !Arc::ptr_eq(l, &listener.listener));
        }
    }

    fn transparent_listeners(&self) -> std::sync::MutexGuard<'_, Vec<Arc<TcpListener>>> {
        self.context
            .shared
            .transparent_listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Stops every accept loop and waits until none accepts any more.
    async fn stop_all(&mut self) {
        for (_, listener) in std::mem::take(&mut self.listeners) {
            listener.stop.cancel();
        }
        self.transparent_listeners().clear();
        while self.accept_loops.join_next().await.is_some() {}
    }
}
