//! What lives as long as the proxy and every generation's accept loops and connections share:
//! the metrics, the relay's spool and pipes, the limits' counters, the socket memory guard, and
//! the load the overload bypass reads. What a connection reads from the configuration is its
//! generation's instead (`generation.rs`).

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use midway_relay::RelayResources;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};

use super::access_links::AccessLinks;
use super::overload::Load;
use super::registry::Registry;
use crate::access::ClientLimits;
use crate::config::RuntimeConfig;
use crate::metrics::Metrics;
use crate::sockmem::SocketMemory;

/// State shared by the accept loops and connection tasks of every generation.
pub(super) struct Shared {
    pub(super) metrics: Metrics,
    pub(super) resources: Arc<RelayResources>,
    pub(super) client_limits: Arc<ClientLimits>,
    /// The total limit: a permit is taken before each `accept`.
    pub(super) total_limit: Arc<Semaphore>,
    /// `max_connections` of the newest generation (the size `total_limit` is brought to).
    max_connections: AtomicUsize,
    /// Connections accepted and allowed over the proxy's life.
    pub(super) served: AtomicU64,
    /// Connections being served now, all listeners together (the overload bypass reads it).
    pub(super) connections_open: AtomicUsize,
    /// The socket memory guard, unless `socket_memory = "off"`.
    pub(super) socket_memory: Option<Arc<SocketMemory>>,
    /// Subscribers' access links, when the config has any.
    pub(super) access_links: Option<Arc<AccessLinks>>,
    /// The managed nftables tables installed now (the overload bypass switches their set).
    intercept_tables: Mutex<Arc<[String]>>,
    /// The transparent listeners accepting now: their accept queues count as load.
    transparent_listeners: Mutex<Vec<Arc<TcpListener>>>,
    /// Wakes the overload bypass's check at once (an accept loop found the total limit used
    /// up) rather than at its next periodic look.
    pub(super) overload_check: Notify,
    /// The open split connections and the drained listeners, for the control socket.
    pub(super) registry: Arc<Registry>,
}

impl Shared {
    /// The shared state of a proxy starting with `config`.
    pub(super) fn new(
        config: &RuntimeConfig,
        resources: Arc<RelayResources>,
        socket_memory: Option<Arc<SocketMemory>>,
    ) -> Shared {
        Shared {
            metrics: Metrics::default(),
            resources,
            client_limits: ClientLimits::new(config.max_connections_per_client),
            total_limit: Arc::new(Semaphore::new(config.max_connections)),
            max_connections: AtomicUsize::new(config.max_connections),
            served: AtomicU64::default(),
            connections_open: AtomicUsize::default(),
            socket_memory,
            access_links: AccessLinks::new(&config.access_links),
            intercept_tables: Mutex::new(Arc::from(Vec::new())),
            transparent_listeners: Mutex::default(),
            overload_check: Notify::new(),
            registry: Arc::default(),
        }
    }

    /// Brings the limits to a new generation's: the total limit to `max_connections` slots
    /// (more slots are free at once; fewer are taken out as connections end, so a lowered
    /// limit never cuts an open connection) and the per-client limit to `per_client`.
    pub(super) fn set_limits(&self, max_connections: usize, per_client: usize) {
        let old_max = self
            .max_connections
            .swap(max_connections, Ordering::Relaxed);
        if max_connections > old_max {
            self.total_limit.add_permits(max_connections - old_max);
        } else if max_connections < old_max {
            let surplus = old_max - max_connections;
            let forgotten = self.total_limit.forget_permits(surplus);
            let rest = surplus - forgotten;
            if rest > 0 {
                let limit = self.total_limit.clone();
                tokio::spawn(async move {
                    if let Ok(permits) = limit.acquire_many_owned(rest as u32).await {
                        permits.forget();
                    }
                });
            }
        }
        self.client_limits.set_limit(per_client);
    }

    /// Records the managed nftables tables installed now.
    pub(super) fn set_intercept_tables(&self, tables: &[String]) {
        *lock(&self.intercept_tables) = Arc::from(tables.to_vec());
    }

    /// The managed nftables tables installed now.
    pub(super) fn intercept_tables(&self) -> Arc<[String]> {
        lock(&self.intercept_tables).clone()
    }

    /// The transparent listeners accepting now (listeners add and remove themselves).
    pub(super) fn transparent_listeners(&self) -> MutexGuard<'_, Vec<Arc<TcpListener>>> {
        lock(&self.transparent_listeners)
    }

    /// The fullest of `max_connections` and the transparent listeners' accept queues.
    pub(super) fn load(&self) -> Load {
        let connections = Load {
            used: self.connections_open.load(Ordering::Relaxed),
            limit: self.max_connections.load(Ordering::Relaxed),
            what: "connections",
        };
        self.transparent_listeners()
            .iter()
            .filter_map(|l| midway_sys::tcp_info::accept_queue(l.as_fd()).ok())
            .map(|q| Load {
                used: q.queued as usize,
                limit: q.limit.max(1) as usize,
                what: "accept queue",
            })
            .fold(connections, Load::fuller)
    }
}

/// A panic while one of these locks is held cannot leave its value half-changed; go on.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
