//! What runs while the proxy serves, started by [`super::Proxy::run`]: one accept loop per
//! listener (`listeners.rs`), the peers' warm pools, the helpers beside the connections (the
//! metrics endpoint, the gauge refresher and overload bypass, the HTTP engines' pool
//! maintenance, the memory guard's sampler thread, the control socket), the tracker of the connections, and the
//! tokens that stop each of them in the order shutdown needs (`shutdown.rs`).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use midway_http::HttpProxy;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::control::{self, ControlState};
use super::generation::Generation;
use super::listeners::{AcceptContext, RunningListeners};
use super::overload::OverloadBypass;
use super::Proxy;
use crate::sockmem::BufferCaps;

/// Shared gauges (spool bytes, pipes) are refreshed this often besides every scrape.
const GAUGE_REFRESH_INTERVAL: Duration = Duration::from_secs(1);
/// A splice pipe idle in the pool this long is closed: long enough that steady traffic keeps
/// reusing the same pipes, short enough that a burst's surplus fds do not linger.
const IDLE_PIPE_KEEP: Duration = Duration::from_secs(30);

/// The tasks of a running proxy and what stops them.
pub(super) struct Serving {
    pub(super) listeners: RunningListeners,
    /// The newest generation; accept loops read it at each accept.
    pub(super) generations: watch::Sender<Arc<Generation>>,
    /// Every connection's task.
    pub(super) tracker: TaskTracker,
    /// Fired when this process stops taking new work (shutdown or a handover): warm peer
    /// connections waiting for a header then end, and so do the warm pools.
    pub(super) draining: CancellationToken,
    /// Cancels connections; fired only after the grace period.
    pub(super) connections_cancel: CancellationToken,
    /// The warm pools of every generation still in use.
    pub(super) pools: JoinSet<()>,
    /// Stops the helpers at the very end.
    pub(super) helpers_cancel: CancellationToken,
    pub(super) helpers: JoinSet<()>,
    /// The sampler threads (memory guard, access links), joined apart.
    pub(super) sampler_threads: Vec<JoinHandle<()>>,
}

impl Serving {
    /// Starts the helpers, the accept loop of every listener `proxy` bound, and the warm pools.
    pub(super) fn start(proxy: &mut Proxy) -> Serving {
        let helpers_cancel = CancellationToken::new();
        let (generations, _) = watch::channel(proxy.generation.clone());
        let tracker = TaskTracker::new();
        let draining = CancellationToken::new();
        let connections_cancel = CancellationToken::new();
        let mut serving = Serving {
            listeners: RunningListeners::new(AcceptContext {
                shared: proxy.shared.clone(),
                generations: generations.clone(),
                tracker: tracker.clone(),
                draining: draining.clone(),
                connections_cancel: connections_cancel.clone(),
            }),
            generations,
            tracker,
            draining,
            connections_cancel,
            pools: JoinSet::new(),
            helpers: JoinSet::new(),
            sampler_threads: Vec::new(),
            helpers_cancel,
        };
        serving.spawn_helpers(proxy);
        if let Some(socket) = proxy.control_socket.take() {
            let state = ControlState {
                shared: proxy.shared.clone(),
                generations: serving.generations.subscribe(),
            };
            serving.helpers.spawn(control::serve(
                socket,
                state,
                serving.helpers_cancel.clone(),
            ));
        }
        for bound in std::mem::take(&mut proxy.listeners) {
            serving.listeners.start(bound);
        }
        serving.start_pools(&proxy.generation);
        serving
    }

    /// Starts what runs beside the connections until `helpers_cancel`: the metrics endpoint,
    /// the gauge refresher (which also drives the overload bypass), the memory guard's sampler
    /// thread, and the HTTP engines' pool maintenance.
    fn spawn_helpers(&mut self, proxy: &Proxy) {
        let shared = proxy.shared.clone();
        let refresh = move || {
            shared
                .metrics
                .spool_bytes
                .set(shared.resources.spool_bytes_in_use() as i64);
            shared
                .metrics
                .pipes_in_use
                .set(shared.resources.pipes_in_use() as i64);
        };
        if let Some((listener, _)) = &proxy.metrics_listener {
            self.helpers.spawn(crate::metrics::serve(
                listener.clone(),
                proxy.served_registry.clone(),
                Arc::new(refresh.clone()),
                self.helpers_cancel.clone(),
            ));
        }
        let cancel = self.helpers_cancel.clone();
        let shared = proxy.shared.clone();
        let mut overload = OverloadBypass::new(shared.metrics.clone());
        self.helpers.spawn(async move {
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
                    // An accept loop found every slot taken.
                    _ = shared.overload_check.notified() => {
                        overload.observe(shared.intercept_tables(), shared.load()).await;
                    }
                }
            }
        });
        self.sampler_threads
            .extend(spawn_memory_sampler(proxy, &self.helpers_cancel));
        self.sampler_threads
            .extend(spawn_access_link_sampler(proxy, &self.helpers_cancel));
        for engine in proxy.generation.http_engines() {
            self.maintain_http_pool(engine);
        }
    }

    /// Closes `engine`'s expired idle upstream connections until the helpers stop, after the
    /// last client connection is gone.
    pub(super) fn maintain_http_pool(&mut self, engine: &Arc<HttpProxy>) {
        self.helpers.spawn(
            engine
                .clone()
                .run_pool_maintenance(self.helpers_cancel.clone()),
        );
    }

    /// Starts the warm pools of `generation`; they stop when it is retired or when draining
    /// begins.
    pub(super) fn start_pools(&mut self, generation: &Generation) {
        for pool in generation.peering.pools() {
            if pool.config().warm_connections > 0 {
                let stop = CancellationToken::new();
                let (retired, draining, stop_now) = (
                    generation.retired.clone(),
                    self.draining.clone(),
                    stop.clone(),
                );
                tokio::spawn(async move {
                    tokio::select! {
                        _ = retired.cancelled() => {}
                        _ = draining.cancelled() => {}
                    }
                    stop_now.cancel();
                });
                self.pools.spawn(pool.clone().maintain(stop));
            }
        }
    }
}

/// The access links' thread, which keeps each subscriber's connections at their shares; `None`
/// without access links (or if the thread cannot start).
fn spawn_access_link_sampler(proxy: &Proxy, cancel: &CancellationToken) -> Option<JoinHandle<()>> {
    let links = proxy.shared.access_links.clone()?;
    match links.spawn_sampler(cancel.clone()) {
        Ok(thread) => Some(thread),
        Err(err) => {
            tracing::error!(error = %err, "access links: cannot start their thread; connections keep the shares they joined with");
            None
        }
    }
}

/// The socket memory guard's sampler thread, which reports cap changes to the metrics and the
/// log; `None` without a guard (or if the thread cannot start).
fn spawn_memory_sampler(proxy: &Proxy, cancel: &CancellationToken) -> Option<JoinHandle<()>> {
    let guard = proxy.shared.socket_memory.clone()?;
    let metrics = proxy.shared.metrics.clone();
    let registry = proxy.shared.registry.clone();
    let on_change = move |caps: Option<BufferCaps>, machine: u64, live: usize| {
        // The new caps are published already; each relayed connection applies them to its
        // own sockets when woken (only its task may touch them: it owns and closes them).
        registry.wake_all();
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
