//! Upstream connection pool: idle connections per origin (`host:port`), shared by all clients.
//!
//! Connections stay open across idle periods (TCP keepalive probes keep middleboxes' state
//! alive) so a request after a pause reuses an established connection instead of paying a
//! handshake. Whether the kernel also keeps the congestion window after idle depends on the
//! upstream TCP profile's congestion control: with `net.ipv4.tcp_slow_start_after_idle = 1` (the
//! default, a per-namespace sysctl with no per-socket switch) Linux shrinks the window of a
//! connection idle for longer than its RTO back toward the initial window, except under a
//! congestion control that runs its own window logic (`cong_control`, i.e. BBR; see
//! `tcp_slow_start_after_idle_check` in include/net/tcp.h). The `wan` preset uses BBR for
//! this reason; with CUBIC or Reno upstream, a pooled connection resumes in slow start unless
//! the operator sets the sysctl to 0.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use midway_sys::sockopt::idle_and_open;
use tokio::net::TcpStream;

use crate::config::{KeepaliveProbes, UpstreamPoolConfig};
use crate::metrics::HttpMetrics;

struct IdleConnection {
    stream: TcpStream,
    since: Instant,
}

/// Idle upstream connections, keyed by origin authority.
pub(crate) struct UpstreamPool {
    config: UpstreamPoolConfig,
    idle: Mutex<HashMap<String, Vec<IdleConnection>>>,
    metrics: HttpMetrics,
}

impl UpstreamPool {
    pub(crate) fn new(config: UpstreamPoolConfig, metrics: HttpMetrics) -> Self {
        Self {
            config,
            idle: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<IdleConnection>>> {
        // A panic while holding the lock cannot leave the map inconsistent; keep going.
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn expire(&self, map: &mut HashMap<String, Vec<IdleConnection>>, now: Instant) {
        let keep = self.config.idle_keep;
        map.retain(|_, conns| {
            conns.retain(|c| now.saturating_duration_since(c.since) < keep);
            !conns.is_empty()
        });
        let total: usize = map.values().map(Vec::len).sum();
        self.metrics.upstream_idle_connections.set(total as i64);
    }

    /// Takes the most recently used live idle connection to `origin`.
    pub(crate) fn checkout(&self, origin: &str) -> Option<TcpStream> {
        let mut map = self.lock();
        self.expire(&mut map, Instant::now());
        let mut found = None;
        if let Some(conns) = map.get_mut(origin) {
            while let Some(conn) = conns.pop() {
                // No EOF and no unexpected bytes pending.
                if idle_and_open(conn.stream.as_fd()) {
                    found = Some(conn.stream);
                    break;
                }
            }
        }
        self.expire(&mut map, Instant::now());
        if found.is_some() {
            self.metrics.upstream_reuses.inc();
        }
        found
    }

    /// Returns a connection whose last exchange ended cleanly.
    pub(crate) fn checkin(&self, origin: &str, stream: TcpStream) {
        if self.config.max_idle_per_origin == 0 {
            return;
        }
        let mut map = self.lock();
        let conns = map.entry(origin.to_string()).or_default();
        if conns.len() >= self.config.max_idle_per_origin {
            // Drop the oldest: the newest has the freshest congestion state.
            conns.remove(0);
        }
        conns.push(IdleConnection {
            stream,
            since: Instant::now(),
        });
        self.expire(&mut map, Instant::now());
    }

    /// Closes idle connections older than the keep time (also done on every checkout and
    /// checkin; call this periodically so a quiet pool does not hold sockets forever).
    pub(crate) fn expire_idle(&self) {
        let mut map = self.lock();
        self.expire(&mut map, Instant::now());
    }

    /// How often [`UpstreamPool::expire_idle`] is worth calling.
    pub(crate) fn maintenance_interval(&self) -> Duration {
        (self.config.idle_keep / 4).max(Duration::from_millis(100))
    }

    /// Idle connections currently held for `origin`.
    pub(crate) fn idle_count(&self, origin: &str) -> usize {
        self.lock().get(origin).map_or(0, Vec::len)
    }

    /// Applies keepalive probes to a fresh upstream socket. TCP_NODELAY is the connector's
    /// decision (midway's turns Nagle off unless the upstream profile sets `nodelay`).
    pub(crate) fn prepare_new(&self, stream: &TcpStream) -> std::io::Result<()> {
        self.metrics.upstream_connects.inc();
        if let Some(probes) = self.config.keepalive {
            apply_keepalive(stream, probes)?;
        }
        Ok(())
    }

    pub(crate) fn response_timeout(&self) -> Duration {
        self.config.response_timeout
    }
}

fn apply_keepalive(stream: &TcpStream, probes: KeepaliveProbes) -> std::io::Result<()> {
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(probes.idle)
        .with_interval(probes.interval)
        .with_retries(probes.retries);
    socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)
}
