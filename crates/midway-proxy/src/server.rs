//! The proxy server: listeners, accept loops with limits, one task per split connection,
//! metrics sampling and designed shutdown.
//!
//! Life of a connection: a permit of the total limit is taken *before* `accept` (so at the limit
//! new clients wait in the kernel backlog instead of costing midway memory); the accepted client
//! is checked against the access list and the per-client limit right away (refused ones are
//! closed at once and counted); everything slow — SOCKS5 handshake, name resolution, connect —
//! runs in the connection's own task, never in the accept loop.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use midway_http::{ConnectUpstream, HttpError, HttpProxy};
use midway_relay::{OnClose, RelayCounters, RelayOptions, RelayReport, RelayResources};
use midway_tcp::{KnobError, Role, RouteKnobs, RouteKnobsError, TcpProfile, TcpStats};
use prometheus_client::registry::Registry;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{field, Instrument};

use crate::access::{canonical, AccessList, ClientLimits, ClientPermit};
use crate::config::{self, Intercept, ListenerConfig, RuntimeConfig, TargetAddr};
use crate::metrics::{DirectionLabels, ListenerLabels, Metrics, SegmentLabels};
use crate::nft::{self, NftError};
use crate::sockmem::{
    self, Adjustable, BufferCaps, SocketCapper, SocketMemory, SocketMemorySetting,
};
use crate::socks5::{self, ReplyCode};

/// Backlog of every listener. Large, so bursts and the total-limit wait queue in the kernel.
const LISTEN_BACKLOG: i32 = 4096;
/// First pause after accept ran out of a resource (file descriptors, memory); doubles per
/// failure in a row up to [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// tcp_info of live connections is sampled this often (metrics, and the values logged at end).
const TCP_INFO_SAMPLE_INTERVAL: Duration = Duration::from_secs(2);
/// Shared gauges (spool bytes, pipes) are refreshed this often besides every scrape.
const GAUGE_REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// After the grace period, cancelled relays get this long to close their sockets.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// Why the proxy could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("profile {profile:?} cannot be used on this kernel")]
    ProfileUnsupported {
        profile: String,
        #[source]
        source: Box<KnobError>,
    },
    #[error("cannot install route-metric knobs (routing tables from {table_base}, marks from {mark_base:#x})")]
    RouteKnobs {
        table_base: u32,
        mark_base: u32,
        #[source]
        source: RouteKnobsError,
    },
    #[error("listener {listener:?}: cannot listen on {addr}")]
    Bind {
        listener: String,
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("listener {listener:?}: cannot put profile {profile:?} on the listening socket")]
    ListenerProfile {
        listener: String,
        profile: String,
        #[source]
        source: Box<KnobError>,
    },
    #[error("proxy.socket_memory: cannot read the kernel's TCP memory limits (net.ipv4.tcp_mem, tcp_rmem, tcp_wmem); set socket_memory = \"off\" to run without the guard")]
    SocketMemoryLimits(#[source] io::Error),
    #[error("metrics endpoint: cannot listen on {addr}")]
    MetricsBind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("spool directory {dir}: cannot remove leftover spool files")]
    SpoolClean {
        dir: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot set up relay resources")]
    Relay(#[source] midway_relay::RelayError),
    #[error("cannot install transparent interception (nftables / policy routing)")]
    Intercept(#[source] NftError),
    #[error("listener {listener:?}: cannot set up the HTTP engine")]
    Http {
        listener: String,
        #[source]
        source: HttpError,
    },
}

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
    /// Profiles with route marks filled in.
    profiles: BTreeMap<String, TcpProfile>,
    metrics: Metrics,
    resources: Arc<RelayResources>,
    access: AccessList,
    client_limits: Arc<ClientLimits>,
    total_limit: Arc<Semaphore>,
    served: std::sync::atomic::AtomicU64,
    /// The socket memory guard, unless `socket_memory = "off"`.
    socket_memory: Option<Arc<SocketMemory>>,
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
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("listeners", &self.local_addrs())
            .field("metrics", &self.metrics_addr())
            .finish_non_exhaustive()
    }
}

fn referenced_profiles(config: &RuntimeConfig) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for l in &config.listeners {
        names.insert(l.local_profile.clone());
        names.insert(l.remote_profile.clone());
        for o in &l.client_profiles {
            names.extend(o.local_profile.iter().cloned());
            names.extend(o.remote_profile.iter().cloned());
        }
    }
    names
}

fn set_transparent(sock: &Socket, v6: bool) -> io::Result<()> {
    if v6 {
        let one: libc::c_int = 1;
        // SAFETY: valid fd, pointer to a c_int and its size, as IPV6_TRANSPARENT expects.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_IPV6,
                libc::IPV6_TRANSPARENT,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    } else {
        sock.set_ip_transparent(true)
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
    if matches!(listener.intercept, Intercept::Transparent { .. }) {
        set_transparent(&sock, addr.is_ipv6()).map_err(bind_err)?;
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

/// Checks that the running kernel can honour every profile a listener uses (for
/// `midway check-config`; [`Proxy::bind`] does the same after installing route knobs).
pub fn check_kernel_support(config: &RuntimeConfig) -> Result<(), ProxyError> {
    for name in referenced_profiles(config) {
        if let Some(profile) = config.profiles.get(&name) {
            profile
                .check_supported()
                .map_err(|source| ProxyError::ProfileUnsupported {
                    profile: name.clone(),
                    source: Box::new(source),
                })?;
        }
    }
    Ok(())
}

impl Proxy {
    /// Checks every referenced profile against the kernel, installs route-metric knobs, cleans
    /// the spool directory, binds every listener and the metrics endpoint, and finally installs
    /// the owned nftables table and policy routing. Errors name what failed; whatever was
    /// installed before an error is removed again.
    pub async fn bind(config: RuntimeConfig, registry: &mut Registry) -> Result<Proxy, ProxyError> {
        let socket_memory = socket_memory_guard(config.socket_memory)?;
        let mut profiles = config.profiles.clone();
        let used = referenced_profiles(&config);

        let needing_knobs = route_knob_candidates(&used, &profiles);
        let route_knobs = if needing_knobs.is_empty() {
            None
        } else {
            let knobs = RouteKnobs::install(
                &needing_knobs,
                config.route_knobs_table_base,
                config.route_knobs_mark_base,
            )
            .map_err(|source| ProxyError::RouteKnobs {
                table_base: config.route_knobs_table_base,
                mark_base: config.route_knobs_mark_base,
                source,
            })?;
            knobs.set_marks(profiles.values_mut());
            Some(knobs)
        };
        for name in &used {
            if let Some(profile) = profiles.get(name) {
                profile
                    .check_supported()
                    .map_err(|source| ProxyError::ProfileUnsupported {
                        profile: name.clone(),
                        source: Box::new(source),
                    })?;
            }
        }

        let removed = midway_relay::clean_spool_dir(&config.spool_dir).map_err(|source| {
            ProxyError::SpoolClean {
                dir: config.spool_dir.clone(),
                source,
            }
        })?;
        if removed > 0 {
            tracing::info!(removed, dir = %config.spool_dir.display(), "removed spool files left by an earlier run");
        }
        let resources = RelayResources::new(
            config.spool_dir.clone(),
            config.spool_max_total_bytes,
            config.max_pipes,
        )
        .map_err(ProxyError::Relay)?;

        // Metrics are registered twice: into the caller's registry (for its own use) and into
        // one this proxy serves; both hold clones of the same values.
        let mut served = Registry::default();
        let mut listeners = Vec::with_capacity(config.listeners.len());
        let mut http_engines = Vec::new();
        for listener in &config.listeners {
            let profile = &profiles[&listener.local_profile];
            let (bound, addr) = bind_listener(listener, profile)?;
            let http = match &listener.http {
                Some(http_config) => {
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
                    http_engines.push(engine.clone());
                    Some(HttpListener {
                        engine,
                        connect_upstream: upstream_connector(
                            profiles[&listener.remote_profile].clone(),
                            config.connect_timeout,
                            config.denied_destinations.clone().into(),
                            socket_memory.clone(),
                        ),
                    })
                }
                None => None,
            };
            tracing::info!(
                listener = %listener.name,
                mode = listener.intercept.mode_name(),
                http = http.is_some(),
                %addr,
                "listening"
            );
            listeners.push(BoundListener {
                config: Arc::new(listener.clone()),
                listener: bound,
                addr,
                http,
            });
        }

        let metrics_listener = match config.metrics_listen {
            Some(addr) => {
                let l = TcpListener::bind(addr)
                    .await
                    .map_err(|source| ProxyError::MetricsBind { addr, source })?;
                let local = l
                    .local_addr()
                    .map_err(|source| ProxyError::MetricsBind { addr, source })?;
                tracing::info!(addr = %local, "metrics at http://{local}/metrics");
                Some((l, local))
            }
            None => None,
        };

        let metrics = Metrics::default();
        for listener in &config.listeners {
            metrics.init_listener(&listener.name);
        }
        metrics.register(registry);
        metrics.register(&mut served);

        let plan = nft::plan(&config);
        for (name, script, manage) in &plan.tables {
            if !manage {
                tracing::info!(table = %name, "nftables.manage = false; install these rules yourself:\n{script}");
            }
        }
        let intercept = nft::Installed::install(&plan).map_err(ProxyError::Intercept)?;

        let shared = Arc::new(Shared {
            access: AccessList::new(config.allowed_clients.clone()),
            client_limits: ClientLimits::new(config.max_connections_per_client),
            total_limit: Arc::new(Semaphore::new(config.max_connections)),
            config: Arc::new(config),
            profiles,
            metrics,
            resources,
            served: Default::default(),
            socket_memory,
        });
        Ok(Proxy {
            shared,
            listeners,
            metrics_listener,
            served_registry: Arc::new(served),
            intercept,
            route_knobs,
            http_engines,
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
        let mut helpers = tokio::task::JoinSet::new();
        let mut memory_sampler = None;
        if let Some((listener, _)) = self.metrics_listener.take() {
            helpers.spawn(crate::metrics::serve(
                listener,
                self.served_registry.clone(),
                Arc::new(refresh.clone()),
                helpers_cancel.clone(),
            ));
        }
        {
            let cancel = helpers_cancel.clone();
            helpers.spawn(async move {
                let mut tick = tokio::time::interval(GAUGE_REFRESH_INTERVAL);
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tick.tick() => refresh(),
                    }
                }
            });
        }

        if let Some(guard) = self.shared.socket_memory.clone() {
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
            match guard.spawn_sampler(on_change, helpers_cancel.clone()) {
                Ok(thread) => memory_sampler = Some(thread),
                Err(err) => {
                    tracing::error!(error = %err, "socket memory guard: cannot start its thread; running without it")
                }
            }
        }
        for engine in &self.http_engines {
            // Closes expired idle upstream connections; stops with the other helpers, after
            // the last client connection is gone.
            helpers.spawn(engine.clone().run_pool_maintenance(helpers_cancel.clone()));
        }

        let mut accept_loops = tokio::task::JoinSet::new();
        for bound in self.listeners.drain(..) {
            accept_loops.spawn(accept_loop(
                self.shared.clone(),
                bound,
                tracker.clone(),
                shutdown.clone(),
                connections_cancel.clone(),
            ));
        }

        shutdown.cancelled().await;
        // Accept loops return on shutdown and drop (close) their listeners.
        while accept_loops.join_next().await.is_some() {}
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
            tracing::warn!(
                cancelled = cancelled_after_grace,
                "grace period over; cancelling open connections"
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
        let drain_time = drain_started.elapsed();

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
}

/// Accept ran out of a resource that frees up by itself (another connection closing).
fn is_resource_exhaustion(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

async fn accept_loop(
    shared: Arc<Shared>,
    bound: BoundListener,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    connections_cancel: CancellationToken,
) {
    let name = bound.config.name.clone();
    let labels = Metrics::listener(&name);
    let mut backoff: Option<Duration> = None;
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            permit = shared.total_limit.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return, // semaphore closed: never happens, but do not spin
            },
        };
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = bound.listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => {
                if backoff.take().is_some() {
                    tracing::info!(listener = %name, "accept recovered");
                }
                pair
            }
            Err(err) if is_resource_exhaustion(&err) => {
                drop(permit);
                shared.metrics.accept_backoffs.get_or_create(&labels).inc();
                let pause = match backoff {
                    None => {
                        // Once per burst: the next log line is "accept recovered".
                        tracing::warn!(listener = %name, error = %err, "accept out of resources; backing off");
                        ACCEPT_BACKOFF_MIN
                    }
                    Some(previous) => (previous * 2).min(ACCEPT_BACKOFF_MAX),
                };
                backoff = Some(pause);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => continue,
                }
            }
            Err(err) => {
                // ECONNABORTED and friends concern one client only.
                tracing::debug!(listener = %name, error = %err, "accept failed for one connection");
                continue;
            }
        };

        if !shared.access.allows(peer.ip()) {
            shared.metrics.refuse(&name, "not_allowed");
            tracing::debug!(listener = %name, client = %peer, "client not in allowed_clients; closed");
            close_now(stream);
            continue;
        }
        let Some(client_permit) = shared.client_limits.try_acquire(peer.ip()) else {
            shared.metrics.refuse(&name, "client_limit");
            tracing::debug!(listener = %name, client = %peer, "per-client connection limit reached; closed");
            close_now(stream);
            continue;
        };
        shared.metrics.accepted.get_or_create(&labels).inc();
        shared.served.fetch_add(1, Ordering::Relaxed);

        let client_ip = canonical(peer.ip());
        let (local_profile, remote_profile) = bound.config.profiles_for(client_ip);
        let span = tracing::info_span!(
            "conn",
            listener = %name,
            client = %peer,
            dst = field::Empty,
            local_profile = %local_profile,
            remote_profile = %remote_profile,
        );
        let conn = Connection {
            shared: shared.clone(),
            listener: bound.config.clone(),
            http: bound.http.clone(),
            listener_addr: bound.addr,
            peer,
            cancel: connections_cancel.clone(),
            _permits: (permit, client_permit),
        };
        tracker.spawn(conn.serve(stream).instrument(span));
    }
}

/// Closes with a reset, so a refused client learns at once and no TIME_WAIT stays behind.
fn close_now(stream: TcpStream) {
    // Linger 0 does not block: the kernel sends RST and frees the socket at once.
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// Why a connection ended before relaying.
#[derive(Debug, thiserror::Error)]
enum SetupError {
    #[error("SOCKS5 handshake timed out")]
    HandshakeTimeout,
    #[error(transparent)]
    Handshake(#[from] socks5::HandshakeError),
    #[error("original destination is this listener itself (a loop)")]
    Loop,
    #[error("cannot read the original destination")]
    OriginalDestination(#[source] io::Error),
    #[error("cannot resolve {target}")]
    Resolve {
        target: String,
        #[source]
        source: io::Error,
    },
    #[error("{target} resolved to no address")]
    NoAddress { target: String },
    #[error("connect to {target} timed out")]
    ConnectTimeout { target: String },
    #[error("connect to {target} failed")]
    Connect {
        target: String,
        #[source]
        source: io::Error,
    },
    #[error("spoofing: client {client} and target {target} are of different address families")]
    SpoofFamily { client: IpAddr, target: SocketAddr },
    #[error("TCP profile")]
    Profile(#[from] KnobError),
    #[error("an HTTP listener's connection reached the byte relay")]
    NotARelayListener,
    #[error("{target} is in proxy.denied_destinations")]
    DestinationDenied { target: String },
    #[error("cannot set TCP_NODELAY")]
    Nodelay(#[source] io::Error),
}

impl SetupError {
    fn reason(&self) -> &'static str {
        match self {
            SetupError::HandshakeTimeout => "socks5_timeout",
            SetupError::Handshake(e) => e.reason(),
            SetupError::Loop => "loop",
            SetupError::OriginalDestination(_) => "original_destination",
            SetupError::Resolve { .. } | SetupError::NoAddress { .. } => "resolve",
            SetupError::ConnectTimeout { .. } => "connect_timeout",
            SetupError::Connect { source, .. }
                if source.raw_os_error() == Some(libc::ECONNREFUSED) =>
            {
                "connect_refused"
            }
            SetupError::Connect { .. } | SetupError::SpoofFamily { .. } => "connect_error",
            SetupError::Profile(_) => "profile_error",
            SetupError::NotARelayListener => "internal",
            SetupError::DestinationDenied { .. } => "denied_destination",
            SetupError::Nodelay(_) => "socket_option",
        }
    }

    /// The target could not be reached (as opposed to a problem with the client).
    fn is_target_failure(&self) -> bool {
        matches!(
            self,
            SetupError::Resolve { .. }
                | SetupError::NoAddress { .. }
                | SetupError::ConnectTimeout { .. }
                | SetupError::Connect { .. }
        )
    }

    fn socks_reply(&self) -> Option<ReplyCode> {
        match self {
            SetupError::Resolve { .. } | SetupError::NoAddress { .. } => {
                Some(ReplyCode::HostUnreachable)
            }
            SetupError::ConnectTimeout { .. } => Some(ReplyCode::TtlExpired),
            SetupError::Connect { source, .. } => Some(ReplyCode::for_connect_error(source)),
            SetupError::SpoofFamily { .. } => Some(ReplyCode::AddressTypeNotSupported),
            SetupError::Profile(_) => Some(ReplyCode::GeneralFailure),
            SetupError::DestinationDenied { .. } => Some(ReplyCode::NotAllowed),
            _ => None,
        }
    }
}

struct Connection {
    shared: Arc<Shared>,
    listener: Arc<ListenerConfig>,
    http: Option<HttpListener>,
    listener_addr: SocketAddr,
    peer: SocketAddr,
    cancel: CancellationToken,
    /// Returned when the connection ends: a slot of the total limit and of the client's.
    _permits: (tokio::sync::OwnedSemaphorePermit, ClientPermit),
}

/// Decrements the active gauge however the task ends.
struct ActiveGuard(Metrics, ListenerLabels);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.get_or_create(&self.1).dec();
    }
}

impl Connection {
    async fn serve(self, mut client: TcpStream) {
        let labels = Metrics::listener(&self.listener.name);
        self.shared.metrics.active.get_or_create(&labels).inc();
        let _active = ActiveGuard(self.shared.metrics.clone(), labels);
        let started = Instant::now();
        if let Some(http) = self.http.clone() {
            self.serve_http(client, http, started).await;
            return;
        }
        let client_ip = canonical(self.peer.ip());
        let (local_name, remote_name) = self.listener.profiles_for(client_ip);
        let local = &self.shared.profiles[local_name];
        let remote = &self.shared.profiles[remote_name];

        let setup = tokio::select! {
            _ = self.cancel.cancelled() => {
                tracing::debug!("cancelled during setup");
                return;
            }
            setup = self.setup(&mut client, local, remote) => setup,
        };
        let server = match setup {
            Ok(server) => server,
            Err(err) => {
                self.shared
                    .metrics
                    .refuse(&self.listener.name, err.reason());
                tracing::info!(error = %ErrorChain(&err), reason = err.reason(), "connection not relayed");
                if let Intercept::Socks5 { .. } = &self.listener.intercept {
                    if let Some(code) = err.socks_reply() {
                        let _ = socks5::send_reply(&mut client, code, None).await;
                    }
                } else if err.is_target_failure() {
                    // The client believes it talks to the server (transparent) or to a fixed
                    // service (forward): a reset is the closest thing to the server's refusal.
                    close_now(client);
                }
                return;
            }
        };
        let adjustable = (leaves_buffers(local), leaves_buffers(remote));
        self.relay(client, server, started, adjustable).await;
    }

    /// Applies the local profile, finds the target, connects. Returns the remote segment.
    async fn setup(
        &self,
        client: &mut TcpStream,
        local: &TcpProfile,
        remote: &TcpProfile,
    ) -> Result<TcpStream, SetupError> {
        default_nodelay(client, local)?;
        local.apply_established(client.as_fd(), Role::Accepted)?;
        let config = &self.shared.config;
        // Only a client-chosen target (SOCKS5) is checked against denied_destinations.
        let mut denied: &[IpNet] = &[];
        let (target, spoof_from) = match &self.listener.intercept {
            Intercept::Forward { target } => (target.clone(), None),
            Intercept::Socks5 { auth } => {
                let target =
                    tokio::time::timeout(config.handshake_timeout, socks5::handshake(client, auth))
                        .await
                        .map_err(|_| SetupError::HandshakeTimeout)??;
                denied = &config.denied_destinations;
                (target, None)
            }
            Intercept::Transparent {
                spoof_client_address,
                ..
            } => {
                let original = self.original_destination(client)?;
                let spoof = spoof_client_address.then_some(canonical(self.peer.ip()));
                (TargetAddr::Ip(original), spoof)
            }
            // Served by `serve_http`; never reaches the byte relay.
            Intercept::Http => return Err(SetupError::NotARelayListener),
        };
        tracing::Span::current().record("dst", field::display(&target));
        let server = connect(&target, remote, spoof_from, denied, config.connect_timeout).await?;
        default_nodelay(&server, remote)?;
        remote.apply_established(server.as_fd(), Role::Outgoing)?;
        if let Intercept::Socks5 { .. } = &self.listener.intercept {
            let bound = server.local_addr().ok();
            socks5::send_reply(client, ReplyCode::Succeeded, bound)
                .await
                .map_err(|e| SetupError::Handshake(e.into()))?;
        }
        Ok(server)
    }

    /// TPROXY delivers the connection with its original destination as local address; a
    /// connection to the listener itself would loop.
    fn original_destination(&self, client: &TcpStream) -> Result<SocketAddr, SetupError> {
        let original = client
            .local_addr()
            .map_err(SetupError::OriginalDestination)?;
        let original = SocketAddr::new(canonical(original.ip()), original.port());
        let listen = self.listener_addr;
        if original.port() == listen.port()
            && (listen.ip().is_unspecified() || listen.ip() == original.ip())
        {
            return Err(SetupError::Loop);
        }
        Ok(original)
    }

    /// An HTTP listener's connection: the engine reads requests and answers them (from the
    /// cache or through pooled upstream connections opened by [`upstream_connector`]).
    /// Access control, limits and the active gauge were handled like for any connection; the
    /// socket memory guard counts it and caps its client socket like a relayed one's.
    async fn serve_http(self, client: TcpStream, http: HttpListener, started: Instant) {
        let name = &self.listener.name;
        let metrics = &self.shared.metrics;
        let (local_name, _) = self.listener.profiles_for(canonical(self.peer.ip()));
        let local = &self.shared.profiles[local_name];
        // The engine writes a response's head and its body pieces as they come; with Nagle on,
        // a short piece waits for the client's (often delayed) ACK of the previous one, which
        // cost the lab's web pages more than a second each.
        let prepared = default_nodelay(&client, local)
            .and_then(|()| {
                local
                    .apply_established(client.as_fd(), Role::Accepted)
                    .map_err(SetupError::from)
            })
            .and_then(|()| match &self.listener.intercept {
                // The origin comes from the Host header; the original destination is only
                // checked for a loop back into this listener.
                Intercept::Transparent { .. } => self.original_destination(&client).map(drop),
                _ => Ok(()),
            });
        if let Err(err) = prepared {
            metrics.refuse(name, err.reason());
            tracing::info!(error = %ErrorChain(&err), reason = err.reason(), "connection not served");
            return;
        }
        // Counted by the memory guard while served; the caps reach the client socket here and
        // new upstream sockets in `upstream_connector` (pooled ones are shared by clients).
        let mut memory = self
            .shared
            .socket_memory
            .as_ref()
            .map(|guard| MemoryCaps::new(guard, &[("local", &client, leaves_buffers(local))]));
        let serve = http.engine.serve_client(
            client,
            self.peer,
            http.connect_upstream.clone(),
            self.cancel.clone(),
        );
        tokio::pin!(serve);
        let result = loop {
            tokio::select! {
                result = &mut serve => break result,
                caps = MemoryCaps::changed(memory.as_mut()) => {
                    // The engine owns the client socket and may have closed it already (its
                    // halves live in tasks of their own): MemoryCaps checks the inode, so a
                    // reused fd number is never capped.
                    if let Some(memory) = memory.as_mut() {
                        memory.apply(caps);
                    }
                }
            }
        };
        let duration_ms = started.elapsed().as_millis() as u64;
        match result {
            Ok(report) => {
                ByteReporter::new(name).report(
                    metrics,
                    report.bytes_from_client,
                    report.bytes_to_client,
                );
                tracing::info!(
                    requests = report.requests,
                    rejected = report.rejected,
                    tunnels = report.tunnels,
                    bytes_from_client = report.bytes_from_client,
                    bytes_to_client = report.bytes_to_client,
                    duration_ms,
                    "http connection closed"
                );
            }
            Err(err) => {
                metrics
                    .relay_errors
                    .get_or_create(&Metrics::listener(name))
                    .inc();
                tracing::info!(error = %ErrorChain(&err), duration_ms, "http connection failed");
            }
        }
    }

    async fn relay(
        self,
        client: TcpStream,
        server: TcpStream,
        started: Instant,
        adjustable: (Adjustable, Adjustable),
    ) {
        let name = &self.listener.name;
        let metrics = &self.shared.metrics;
        let mut memory = self.shared.socket_memory.as_ref().map(|guard| {
            MemoryCaps::new(
                guard,
                &[
                    ("local", &client, adjustable.0),
                    ("remote", &server, adjustable.1),
                ],
            )
        });
        let counters = Arc::new(RelayCounters::default());
        // The relay owns and closes both sockets; it hands them to this callback just before,
        // so the end-of-connection log and histograms get final values, not a stale sample.
        let final_stats: Arc<OnceLock<FinalStats>> = Arc::default();
        let on_close: OnClose = {
            let slot = final_stats.clone();
            Arc::new(move |client: BorrowedFd<'_>, server: BorrowedFd<'_>| {
                let _ = slot.set((
                    midway_tcp::tcp_stats(client).ok(),
                    midway_tcp::tcp_stats(server).ok(),
                ));
            })
        };
        let options = RelayOptions {
            idle_timeout: Some(self.shared.config.idle_timeout),
            counters: counters.clone(),
            on_close: Some(on_close),
        };
        let mut sampler = SegmentSampler::new(name, &client, &server);
        sampler.sample(metrics);
        let mut bytes = ByteReporter::new(name);

        let relay = midway_relay::relay(
            client,
            server,
            &self.listener.relay,
            &self.shared.resources,
            options,
            self.cancel.clone(),
        );
        tokio::pin!(relay);
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + TCP_INFO_SAMPLE_INTERVAL,
            TCP_INFO_SAMPLE_INTERVAL,
        );
        let result = loop {
            tokio::select! {
                result = &mut relay => break result,
                caps = MemoryCaps::changed(memory.as_mut()) => {
                    // The relay future owns both sockets and is alive here, so their fds are
                    // open (and MemoryCaps checks the inodes anyway).
                    if let Some(memory) = memory.as_mut() {
                        memory.apply(caps);
                    }
                }
                _ = tick.tick() => {
                    let moved = (
                        counters.client_to_server.load(Ordering::Relaxed),
                        counters.server_to_client.load(Ordering::Relaxed),
                    );
                    // An idle connection's tcp_info does not change: skip the syscalls, which
                    // matters with thousands of idle connections.
                    if moved != bytes.reported {
                        // The relay future owns both sockets and is alive here, so their fds
                        // are open (and Segment checks the inode anyway).
                        sampler.sample_live(metrics);
                        bytes.report(metrics, moved.0, moved.1);
                    }
                }
            }
        };
        let duration = started.elapsed();
        if let Some((local, remote)) = final_stats.get() {
            sampler.record_final(metrics, local.clone(), remote.clone());
        }
        sampler.finish(metrics);
        let (local, remote) = (&sampler.local.last, &sampler.remote.last);
        match result {
            Ok(report) => {
                bytes.report(
                    metrics,
                    report.client_to_server_bytes,
                    report.server_to_client_bytes,
                );
                log_end(
                    &report,
                    duration,
                    local.as_ref(),
                    remote.as_ref(),
                    sampler.last_sample_age(),
                );
            }
            Err(err) => {
                bytes.report(
                    metrics,
                    counters.client_to_server.load(Ordering::Relaxed),
                    counters.server_to_client.load(Ordering::Relaxed),
                );
                metrics
                    .relay_errors
                    .get_or_create(&Metrics::listener(name))
                    .inc();
                tracing::warn!(
                    error = %ErrorChain(&err),
                    bytes_client_to_server = counters.client_to_server.load(Ordering::Relaxed),
                    bytes_server_to_client = counters.server_to_client.load(Ordering::Relaxed),
                    duration_ms = duration.as_millis() as u64,
                    "relay failed"
                );
            }
        }
    }
}

fn log_end(
    report: &RelayReport,
    duration: Duration,
    local: Option<&TcpStats>,
    remote: Option<&TcpStats>,
    sample_age: Duration,
) {
    let get = |s: Option<&TcpStats>, f: fn(&TcpStats) -> u64| s.map(f);
    tracing::info!(
        bytes_client_to_server = report.client_to_server_bytes,
        bytes_server_to_client = report.server_to_client_bytes,
        client_to_server_end = ?report.client_to_server_end,
        server_to_client_end = ?report.server_to_client_end,
        duration_ms = duration.as_millis() as u64,
        peak_spool_bytes = report.peak_spool_bytes,
        // TCP state when the relay closed the socket (1 = established, 7 = closed, 8 =
        // close-wait, 9 = last-ack, ...): shows the values below are final, not a sample.
        local_state = get(local, |s| s.state.into()),
        remote_state = get(remote, |s| s.state.into()),
        local_bytes_received = get(local, |s| s.bytes_received),
        remote_bytes_received = get(remote, |s| s.bytes_received),
        local_srtt_us = get(local, |s| s.rtt_us.into()),
        local_cwnd = get(local, |s| s.snd_cwnd.into()),
        local_total_retrans = get(local, |s| s.total_retrans.into()),
        local_reordering = get(local, |s| s.reordering.into()),
        remote_srtt_us = get(remote, |s| s.rtt_us.into()),
        remote_cwnd = get(remote, |s| s.snd_cwnd.into()),
        remote_total_retrans = get(remote, |s| s.total_retrans.into()),
        remote_reordering = get(remote, |s| s.reordering.into()),
        tcp_info_age_ms = sample_age.as_millis() as u64,
        "connection closed"
    );
}

/// Final tcp_info of the (local, remote) segment, read by the relay's close callback.
type FinalStats = (Option<TcpStats>, Option<TcpStats>);

/// Adds only what is new since the last report to the byte counters.
struct ByteReporter {
    c2s: DirectionLabels,
    s2c: DirectionLabels,
    reported: (u64, u64),
}

impl ByteReporter {
    fn new(listener: &str) -> ByteReporter {
        ByteReporter {
            c2s: DirectionLabels {
                listener: listener.to_string(),
                direction: "client_to_server",
            },
            s2c: DirectionLabels {
                listener: listener.to_string(),
                direction: "server_to_client",
            },
            reported: (0, 0),
        }
    }

    fn report(&mut self, metrics: &Metrics, c2s: u64, s2c: u64) {
        if c2s > self.reported.0 {
            metrics
                .bytes
                .get_or_create(&self.c2s)
                .inc_by(c2s - self.reported.0);
            self.reported.0 = c2s;
        }
        if s2c > self.reported.1 {
            metrics
                .bytes
                .get_or_create(&self.s2c)
                .inc_by(s2c - self.reported.1);
            self.reported.1 = s2c;
        }
    }
}

/// tcp_info of one segment's socket, identified by fd and inode so a reused fd number is
/// never mistaken for it.
struct Segment {
    fd: RawFd,
    inode: Option<u64>,
    labels: SegmentLabels,
    last: Option<TcpStats>,
    retrans_reported: u32,
}

fn inode_of(fd: RawFd) -> Option<u64> {
    // SAFETY: fstat writes into the zeroed struct we pass; an invalid fd only returns an error.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstat(fd, &mut st) };
    (rc == 0).then_some(st.st_ino)
}

impl Segment {
    fn new(listener: &str, segment: &'static str, stream: &TcpStream) -> Segment {
        let fd = stream.as_raw_fd();
        Segment {
            fd,
            inode: inode_of(fd),
            labels: SegmentLabels {
                listener: listener.to_string(),
                segment,
            },
            last: None,
            retrans_reported: 0,
        }
    }

    fn sample(&mut self, metrics: &Metrics) -> bool {
        if self.inode.is_none() || inode_of(self.fd) != self.inode {
            return false;
        }
        // SAFETY: the fd refers to the same socket as when this Segment was made (inode checked
        // just above) and is only borrowed for one getsockopt; the relay owns and keeps it open.
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd) };
        match midway_tcp::tcp_stats(fd) {
            Ok(stats) => {
                self.record(metrics, stats);
                true
            }
            Err(_) => false,
        }
    }

    /// Takes `stats` as the latest values; the retransmit counter gets what is new.
    fn record(&mut self, metrics: &Metrics, stats: TcpStats) {
        if stats.total_retrans > self.retrans_reported {
            metrics
                .retransmits
                .get_or_create(&self.labels)
                .inc_by(u64::from(stats.total_retrans - self.retrans_reported));
            self.retrans_reported = stats.total_retrans;
        }
        self.last = Some(stats);
    }

    fn observe(&self, metrics: &Metrics) {
        if let Some(stats) = &self.last {
            if stats.rtt_us > 0 {
                metrics
                    .srtt
                    .get_or_create(&self.labels)
                    .observe(f64::from(stats.rtt_us) / 1e6);
            }
            metrics
                .cwnd
                .get_or_create(&self.labels)
                .observe(f64::from(stats.snd_cwnd));
        }
    }
}

/// Samples both segments right after connect and every few seconds while bytes move.
struct SegmentSampler {
    local: Segment,
    remote: Segment,
    last_sample: Instant,
    /// The current `last` values are already in the histograms.
    last_observed: bool,
}

impl SegmentSampler {
    fn new(listener: &str, client: &TcpStream, server: &TcpStream) -> SegmentSampler {
        SegmentSampler {
            local: Segment::new(listener, "local", client),
            remote: Segment::new(listener, "remote", server),
            last_sample: Instant::now(),
            last_observed: false,
        }
    }

    /// Reads both sockets' tcp_info (retransmit counter updated at once).
    fn sample(&mut self, metrics: &Metrics) {
        let a = self.local.sample(metrics);
        let b = self.remote.sample(metrics);
        if a || b {
            self.last_sample = Instant::now();
            self.last_observed = false;
        }
    }

    /// A periodic sample of a live connection: also goes into the srtt / cwnd histograms.
    fn sample_live(&mut self, metrics: &Metrics) {
        self.sample(metrics);
        if !self.last_observed {
            self.local.observe(metrics);
            self.remote.observe(metrics);
            self.last_observed = true;
        }
    }

    /// The values the relay's close callback read just before closing the sockets.
    fn record_final(
        &mut self,
        metrics: &Metrics,
        local: Option<TcpStats>,
        remote: Option<TcpStats>,
    ) {
        let mut any = false;
        for (segment, stats) in [(&mut self.local, local), (&mut self.remote, remote)] {
            if let Some(stats) = stats {
                segment.record(metrics, stats);
                any = true;
            }
        }
        if any {
            self.last_sample = Instant::now();
            self.last_observed = false;
        }
    }

    /// The last sample stands for the end — normally the final one from the relay's close
    /// callback (then `tcp_info_age_ms` is about 0); it is observed unless a live sample already
    /// put these very values into the histograms.
    fn finish(&mut self, metrics: &Metrics) {
        if !self.last_observed {
            self.local.observe(metrics);
            self.remote.observe(metrics);
            self.last_observed = true;
        }
    }

    fn last_sample_age(&self) -> Duration {
        self.last_sample.elapsed()
    }
}

/// The HTTP engine's way to open an upstream connection: the same `connect` and profile steps
/// as a split connection's remote segment (profile before connect, route mark, established
/// knobs, TCP_NODELAY unless the profile decides), bounded by `connect_timeout`.
///
/// While the socket memory guard's caps are in force, a new upstream socket gets them at once
/// (for the buffers its profile leaves to the kernel). The engine pools upstream sockets and
/// shares them between clients, so they belong to no connection that could follow later cap
/// changes: a socket made under caps keeps them until it closes, one made before keeps its
/// autotuned buffers. The pool's keep time bounds both.
fn upstream_connector(
    profile: TcpProfile,
    timeout: Duration,
    denied: Arc<[IpNet]>,
    socket_memory: Option<Arc<SocketMemory>>,
) -> ConnectUpstream {
    let profile = Arc::new(profile);
    Arc::new(move |addr: SocketAddr| {
        let profile = profile.clone();
        let denied = denied.clone();
        let socket_memory = socket_memory.clone();
        Box::pin(async move {
            let to_io = |err: SetupError| {
                let kind = match &err {
                    // The HTTP engine answers 403 for this kind.
                    SetupError::DestinationDenied { .. } => io::ErrorKind::PermissionDenied,
                    SetupError::ConnectTimeout { .. } => io::ErrorKind::TimedOut,
                    SetupError::Connect { source, .. } => source.kind(),
                    _ => io::ErrorKind::Other,
                };
                io::Error::new(kind, err)
            };
            let stream = connect(&TargetAddr::Ip(addr), &profile, None, &denied, timeout)
                .await
                .map_err(to_io)?;
            default_nodelay(&stream, &profile).map_err(to_io)?;
            profile
                .apply_established(stream.as_fd(), Role::Outgoing)
                .map_err(|e| to_io(SetupError::Profile(e)))?;
            if let Some(guard) = &socket_memory {
                let caps = guard.caps();
                if caps.is_some() {
                    let mut capper =
                        SocketCapper::new(leaves_buffers(&profile), guard.autotune_max());
                    if let Err(err) = capper.apply(stream.as_fd(), caps) {
                        tracing::debug!(segment = "upstream", error = %err, "could not apply socket buffer caps");
                    }
                }
            }
            Ok(stream)
        })
    })
}

/// Turns Nagle's algorithm off on a proxy socket unless `profile` sets `nodelay` itself.
///
/// A proxy forwards what it has when it has it; the end hosts already decided how to batch
/// their writes. With Nagle on, the short tail of every relayed chunk (or every small HTTP
/// response piece) waits for the ACK of the data before it, which on a delayed-ACK receiver
/// costs up to its delayed-ACK time per chunk, and under load keeps megabytes queued in the
/// socket (see docs/results/bench/README.md, "Session 2 profile"). HAProxy and Squid also set
/// TCP_NODELAY on both sides. A profile can still ask for Nagle with `nodelay = false`.
fn default_nodelay(stream: &TcpStream, profile: &TcpProfile) -> Result<(), SetupError> {
    if profile.nodelay.is_none() {
        stream.set_nodelay(true).map_err(SetupError::Nodelay)?;
    }
    Ok(())
}

/// The used profiles `RouteKnobs::install` must see: those with route-only knobs, and those with
/// an RTO floor even when the floor is a socket option — `install` gives them a table too when
/// the host's routes lock `rto_min` (a locked route floor overrides the socket's, so the option
/// alone would silently do nothing there), and leaves them out otherwise.
fn route_knob_candidates<'a>(
    used: &BTreeSet<String>,
    profiles: &'a BTreeMap<String, TcpProfile>,
) -> Vec<&'a TcpProfile> {
    used.iter()
        .filter_map(|n| profiles.get(n))
        .filter(|p| p.needs_route_knobs() || p.rto_min_ms.is_some())
        .collect()
}

/// Whether a profile leaves a socket's buffers to the kernel (then the memory guard may cap them).
fn leaves_buffers(profile: &TcpProfile) -> Adjustable {
    Adjustable {
        recv: profile.recv_buffer.is_none(),
        send: profile.send_buffer.is_none(),
    }
}

/// The socket memory guard as configured on this kernel, or `None` when it is off.
fn socket_memory_guard(
    setting: SocketMemorySetting,
) -> Result<Option<Arc<SocketMemory>>, ProxyError> {
    if setting == SocketMemorySetting::Off {
        return Ok(None);
    }
    let limits = match sockmem::KernelMemoryLimits::read() {
        Ok(limits) => limits,
        Err(err) if setting == SocketMemorySetting::Auto => {
            tracing::warn!(error = %err, "socket memory guard off: cannot read the kernel's TCP memory limits");
            return Ok(None);
        }
        Err(err) => return Err(ProxyError::SocketMemoryLimits(err)),
    };
    let Some(settings) = sockmem::GuardSettings::new(setting, limits) else {
        return Ok(None);
    };
    if settings.budget_bytes >= settings.pressure_bytes {
        tracing::warn!(
            budget = settings.budget_bytes,
            pressure = settings.pressure_bytes,
            "socket_memory is at or above net.ipv4.tcp_mem's pressure value: the kernel will be under memory pressure before the guard acts"
        );
    }
    tracing::info!(
        budget_mib = settings.budget_bytes >> 20,
        pressure_mib = settings.pressure_bytes >> 20,
        "socket memory guard on"
    );
    Ok(Some(SocketMemory::new(settings)))
}

/// One proxied connection's part in the socket memory guard: counted while it lives, and its
/// sockets (both of a relayed connection, the client's of an HTTP listener's) follow the
/// guard's caps.
struct MemoryCaps {
    _live: sockmem::LiveConnection,
    caps: tokio::sync::watch::Receiver<Option<BufferCaps>>,
    sockets: Vec<CappedSocket>,
}

impl MemoryCaps {
    /// Registers the connection and applies the caps in force now to `sockets`, each named by
    /// its segment ("local", "remote") and limited to the buffers its profile leaves alone.
    fn new(
        guard: &Arc<SocketMemory>,
        sockets: &[(&'static str, &TcpStream, Adjustable)],
    ) -> MemoryCaps {
        let max = guard.autotune_max();
        let mut caps = MemoryCaps {
            _live: guard.register(),
            caps: guard.subscribe(),
            sockets: sockets
                .iter()
                .map(|&(side, stream, adjustable)| CappedSocket::new(side, stream, adjustable, max))
                .collect(),
        };
        let now = *caps.caps.borrow_and_update();
        if now.is_some() {
            caps.apply(now);
        }
        caps
    }

    /// The next cap change; never resolves without a guard (or after the guard stopped).
    async fn changed(memory: Option<&mut MemoryCaps>) -> Option<BufferCaps> {
        let Some(memory) = memory else {
            return std::future::pending().await;
        };
        if memory.caps.changed().await.is_err() {
            return std::future::pending().await;
        }
        *memory.caps.borrow_and_update()
    }

    /// Applies `caps` to every socket that is still the one registered.
    fn apply(&mut self, caps: Option<BufferCaps>) {
        for socket in &mut self.sockets {
            socket.apply(caps);
        }
    }
}

/// A socket the guard caps, known only by fd (the relay or the HTTP engine owns it) and by the
/// inode it had at registration, so that a cap never lands on another socket that reuses the fd
/// number after the owner closed this one.
struct CappedSocket {
    side: &'static str,
    fd: RawFd,
    /// `None` once the socket is known to be gone (or could not be identified): skipped then.
    inode: Option<u64>,
    capper: SocketCapper,
}

impl CappedSocket {
    fn new(
        side: &'static str,
        stream: &TcpStream,
        adjustable: Adjustable,
        autotune_max: BufferCaps,
    ) -> CappedSocket {
        let fd = stream.as_raw_fd();
        CappedSocket {
            side,
            fd,
            inode: inode_of(fd),
            capper: SocketCapper::new(adjustable, autotune_max),
        }
    }

    /// Applies `caps` if the fd still refers to the registered socket; silently skips (and
    /// forgets the socket) otherwise.
    fn apply(&mut self, caps: Option<BufferCaps>) {
        if self.inode.is_none() || inode_of(self.fd) != self.inode {
            self.inode = None;
            return;
        }
        // SAFETY: the fd refers to the registered socket (inode checked just above) and is only
        // borrowed for this statement's setsockopt calls.
        let fd = unsafe { BorrowedFd::borrow_raw(self.fd) };
        if let Err(err) = self.capper.apply(fd, caps) {
            tracing::debug!(segment = self.side, error = %err, "could not apply socket buffer caps");
        }
    }
}

/// Resolves `target` and connects the remote segment with `profile`, from `spoof_from` if set,
/// to the first of its addresses that is not in `denied` and accepts.
async fn connect(
    target: &TargetAddr,
    profile: &TcpProfile,
    spoof_from: Option<IpAddr>,
    denied: &[IpNet],
    timeout: Duration,
) -> Result<TcpStream, SetupError> {
    let target_text = target.to_string();
    let attempt = async {
        let addrs: Vec<SocketAddr> = match target {
            TargetAddr::Ip(addr) => vec![*addr],
            TargetAddr::Domain(host, port) => tokio::net::lookup_host((host.as_str(), *port))
                .await
                .map_err(|source| SetupError::Resolve {
                    target: target_text.clone(),
                    source,
                })?
                .collect(),
        };
        let resolved_any = !addrs.is_empty();
        let addrs: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|addr| !config::denied(denied, addr.ip()))
            .collect();
        if resolved_any && addrs.is_empty() {
            return Err(SetupError::DestinationDenied {
                target: target_text.clone(),
            });
        }
        let mut last_err = None;
        for addr in addrs {
            match connect_one(addr, profile, spoof_from).await {
                Ok(stream) => return Ok(stream),
                Err(err) => last_err = Some(err),
            }
        }
        Err(last_err.unwrap_or(SetupError::NoAddress {
            target: target_text.clone(),
        }))
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(SetupError::ConnectTimeout {
            target: target_text,
        }),
    }
}

async fn connect_one(
    addr: SocketAddr,
    profile: &TcpProfile,
    spoof_from: Option<IpAddr>,
) -> Result<TcpStream, SetupError> {
    let target = addr.to_string();
    let io_err = |source| SetupError::Connect {
        target: target.clone(),
        source,
    };
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
        .map_err(io_err)?;
    sock.set_nonblocking(true).map_err(io_err)?;
    profile.apply_before_connect(&sock)?;
    if let Some(client) = spoof_from {
        if client.is_ipv4() != addr.is_ipv4() {
            return Err(SetupError::SpoofFamily {
                client,
                target: addr,
            });
        }
        // IP_TRANSPARENT lets the socket bind to an address that is not local: the client's.
        set_transparent(&sock, addr.is_ipv6()).map_err(io_err)?;
        sock.bind(&SockAddr::from(SocketAddr::new(client, 0)))
            .map_err(io_err)?;
    }
    let std_stream: std::net::TcpStream = sock.into();
    let socket = TcpSocket::from_std_stream(std_stream);
    socket.connect(addr).await.map_err(io_err)
}

/// Displays an error and its sources, `a: b: c`, for logs.
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(err) = source {
            write!(f, ": {err}")?;
            source = err.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_with_only_an_rto_floor_reach_route_knobs() {
        let mut timer_only = TcpProfile::kernel_default("timer-200ms");
        timer_only.rto_min_ms = Some(200);
        assert!(!timer_only.needs_route_knobs(), "a socket-option floor");
        let mut dupack = TcpProfile::kernel_default("dupack-1");
        dupack.dupack_threshold = Some(1);
        let plain = TcpProfile::kernel_default("plain");
        let unused = {
            let mut p = TcpProfile::kernel_default("unused");
            p.rto_min_ms = Some(40);
            p
        };
        let profiles: BTreeMap<String, TcpProfile> = [timer_only, dupack, plain, unused]
            .into_iter()
            .map(|p| (p.name.clone(), p))
            .collect();
        let used: BTreeSet<String> = ["timer-200ms", "dupack-1", "plain"]
            .into_iter()
            .map(String::from)
            .collect();
        let names: Vec<&str> = route_knob_candidates(&used, &profiles)
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["dupack-1", "timer-200ms"]);
    }

    #[tokio::test]
    async fn a_capped_socket_is_skipped_once_its_fd_number_names_another_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let registered = TcpStream::connect(addr).await.unwrap();
        let other = TcpStream::connect(addr).await.unwrap();
        let recv = |fd: RawFd| {
            // SAFETY: both fds stay open until the end of the test.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::RcvBuf).unwrap()
        };
        let both = Adjustable {
            recv: true,
            send: true,
        };
        let max = BufferCaps {
            recv: 1 << 20,
            send: 1 << 20,
        };
        let caps = |kib: u32| {
            Some(BufferCaps {
                recv: kib << 10,
                send: kib << 10,
            })
        };
        let mut capped = CappedSocket::new("local", &registered, both, max);
        capped.apply(caps(128));
        assert_eq!(
            recv(registered.as_raw_fd()),
            128 << 10,
            "the registered socket"
        );

        // The fd number now names `other` (as after a close and a reuse, but atomically, so no
        // other test's file can land on the number in between).
        let before = recv(other.as_raw_fd());
        // SAFETY: dup2 onto an fd this test owns; `registered` closes the duplicate on drop.
        let rc = unsafe { libc::dup2(other.as_raw_fd(), registered.as_raw_fd()) };
        assert_eq!(rc, registered.as_raw_fd());
        capped.apply(caps(64));
        capped.apply(None);
        assert_eq!(
            recv(other.as_raw_fd()),
            before,
            "another socket is never capped"
        );
        assert_eq!(capped.inode, None, "forgotten after the first mismatch");
    }
}
