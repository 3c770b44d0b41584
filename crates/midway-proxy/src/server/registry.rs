//! The open split connections, for the control socket: each registers a small entry when its
//! relay starts and removes it when the relay ends (a guard, however it ends). An entry holds
//! what the connection has anyway (its listener's config, the relay's byte counters, its
//! sockets known by [`SocketId`], the peer's pool) and a token to close it; `tcp_info` is read
//! only when a status is asked for, never stored, and nothing is done per packet.
//!
//! Also the listeners' drained flags: the accept loop reads its listener's flag (one atomic
//! load per accept); the flags are kept by listener name for the process's life, so a reload
//! never undrains a listener, and a binary upgrade hands the drained names to the new process.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use midway_relay::{RelayCounters, RelayModel};
use tokio_util::sync::CancellationToken;

use super::peer_link::Transport;
use super::pool::WarmPool;
use super::socket_id::SocketId;
use crate::config::ListenerConfig;
use crate::control::{ConnectionStatus, SegmentStatus, TcpInfoStatus};

/// One open connection. Kept small: a gateway holds one per idle connection.
pub(super) struct Entry {
    pub(super) listener: Arc<ListenerConfig>,
    pub(super) client: SocketAddr,
    pub(super) target: Option<SocketAddr>,
    pub(super) started: Instant,
    pub(super) counters: Arc<RelayCounters>,
    /// The accepted segment's socket, then the onward one's (none for a QUIC stream).
    pub(super) sockets: [SocketId; 2],
    /// Each segment's role (local, remote or peer) and transport (tcp, tls or quic).
    pub(super) segments: [(&'static str, Transport); 2],
    /// The peer the connection goes through (its name is in the pool's config).
    pub(super) peer: Option<Arc<WarmPool>>,
    /// Cancelling it resets both ends (the relay's close rule for a cancelled connection).
    pub(super) cancel: CancellationToken,
}

/// What a status reads from an entry while the registry's lock is held: clones of shared
/// handles, so the `tcp_info` reads happen after the lock is released.
struct Snapshot {
    id: u64,
    listener: Arc<ListenerConfig>,
    client: SocketAddr,
    target: Option<SocketAddr>,
    started: Instant,
    counters: Arc<RelayCounters>,
    sockets: [(i32, Option<u64>); 2],
    segments: [(&'static str, Transport); 2],
    peer: Option<Arc<WarmPool>>,
}

/// The open connections and the drained listeners.
#[derive(Default)]
pub(super) struct Registry {
    next_id: AtomicU64,
    /// Boxed: a map keeps free slots as large as its values (about as many as it holds), and
    /// an entry is some hundred bytes.
    entries: Mutex<HashMap<u64, Box<Entry>>>,
    drained: Mutex<HashMap<String, Arc<AtomicBool>>>,
}

/// Removes its connection's entry when dropped.
pub(super) struct Registered {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock(&self.registry.entries).remove(&self.id);
    }
}

impl Registry {
    /// Adds `entry` under a new id (unique for the process's life) until the guard drops.
    pub(super) fn register(self: &Arc<Self>, entry: Entry) -> Registered {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.entries).insert(id, Box::new(entry));
        Registered {
            registry: self.clone(),
            id,
        }
    }

    /// Wakes every open connection's supervising task (through its counters' `resumed`), which
    /// then looks again at what may have changed: the memory guard's caps.
    pub(super) fn wake_all(&self) {
        for entry in lock(&self.entries).values() {
            entry.counters.resumed.notify_one();
        }
    }

    /// Ends connection `id` with a reset toward both ends; `false` if it is not open.
    pub(super) fn close(&self, id: u64) -> bool {
        match lock(&self.entries).get(&id) {
            Some(entry) => {
                entry.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Open connections per listener name.
    pub(super) fn open_per_listener(&self) -> HashMap<String, usize> {
        let mut open = HashMap::new();
        for entry in lock(&self.entries).values() {
            *open.entry(entry.listener.name.clone()).or_default() += 1;
        }
        open
    }

    /// Every open connection as the control protocol shows it, by id; each segment's
    /// `tcp_info` and congestion control read now.
    pub(super) fn connections(&self) -> Vec<ConnectionStatus> {
        let snapshots: Vec<Snapshot> = lock(&self.entries)
            .iter()
            .map(|(&id, e)| Snapshot {
                id,
                listener: e.listener.clone(),
                client: e.client,
                target: e.target,
                started: e.started,
                counters: e.counters.clone(),
                sockets: [
                    (e.sockets[0].fd(), e.sockets[0].inode),
                    (e.sockets[1].fd(), e.sockets[1].inode),
                ],
                segments: e.segments,
                peer: e.peer.clone(),
            })
            .collect();
        let mut connections: Vec<ConnectionStatus> = snapshots.into_iter().map(status).collect();
        connections.sort_by_key(|c| c.id);
        connections
    }

    /// The drained flag of listener `name` (created undrained on first use).
    pub(super) fn drain_flag(&self, name: &str) -> Arc<AtomicBool> {
        lock(&self.drained)
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// The listeners drained now (a binary upgrade hands them over).
    pub(super) fn drained_names(&self) -> Vec<String> {
        lock(&self.drained)
            .iter()
            .filter(|(_, flag)| flag.load(Ordering::Relaxed))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Whether listener `name` is drained now.
    pub(super) fn is_drained(&self, name: &str) -> bool {
        lock(&self.drained)
            .get(name)
            .is_some_and(|flag| flag.load(Ordering::Relaxed))
    }
}

fn status(s: Snapshot) -> ConnectionStatus {
    let c = &s.counters;
    let segments = s
        .sockets
        .iter()
        .zip(s.segments)
        .map(|(&(fd, inode), (role, transport))| SegmentStatus {
            role: role.into(),
            transport: transport.as_str().into(),
            tcp: read_tcp_info(fd, inode),
        })
        .collect();
    ConnectionStatus {
        id: s.id,
        listener: s.listener.name.clone(),
        client: s.client,
        target: s.target,
        age_ms: u64::try_from(s.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        bytes_up: c.client_to_server.load(Ordering::Relaxed),
        bytes_down: c.server_to_client.load(Ordering::Relaxed),
        relay: match (&s.listener.http, &s.listener.relay) {
            (Some(_), _) => "http",
            (None, RelayModel::Buffer(_)) => "buffer",
            (None, RelayModel::Spool(_)) => "spool",
        }
        .into(),
        spool_bytes: c.spooled_now.load(Ordering::Relaxed),
        peer: s.peer.map(|pool| pool.config().name.clone()),
        segments,
    }
}

/// `tcp_info` of a socket the relay owns, read from another task: the fd is checked to still
/// be the registered socket before and after the read, so a socket that closed (and whose fd
/// number was reused) in between is never reported. Reads only; it changes nothing.
fn read_tcp_info(fd: i32, inode: Option<u64>) -> Option<TcpInfoStatus> {
    let same = || inode.is_some() && super::socket_id::inode_of(fd) == inode;
    if !same() {
        return None;
    }
    // SAFETY: the fd referred to the registered socket just now; a borrow for two getsockopt
    // calls cannot close it, and if it closes meanwhile the calls fail or read another socket,
    // which the second check below throws away.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let stats = midway_tcp::tcp_stats(borrowed).ok()?;
    let congestion_control = midway_sys::tcp_info::congestion_control_of(borrowed).ok();
    if !same() {
        return None;
    }
    Some(TcpInfoStatus {
        srtt_us: stats.rtt_us,
        rttvar_us: stats.rttvar_us,
        cwnd: stats.snd_cwnd,
        mss: stats.snd_mss,
        retransmits: stats.total_retrans,
        delivery_rate_bps: stats.delivery_rate_bps,
        congestion_control,
        unacked: stats.unacked,
    })
}

/// A panic while this lock is held cannot leave the map half-changed; go on.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gateway holds one entry per idle connection (and the HashMap's slot for it): it must
    /// stay a few cache lines, with no allocation of its own (names are the listener's and the
    /// peer's, shared).
    #[test]
    fn an_entry_stays_small() {
        let size = std::mem::size_of::<Entry>();
        eprintln!("an Entry is {size} bytes");
        assert!(size <= 256, "an Entry is {size} bytes");
    }

    #[test]
    fn drain_flags_are_kept_by_name() {
        let registry = Registry::default();
        assert!(!registry.is_drained("fwd"));
        let flag = registry.drain_flag("fwd");
        flag.store(true, Ordering::Relaxed);
        // The accept loop's flag and a later lookup (after a reload) are the same one.
        assert!(registry.is_drained("fwd"));
        assert!(registry.drain_flag("fwd").load(Ordering::Relaxed));
        assert!(!registry.is_drained("other"));
        assert!(!registry.close(1), "no connection 1 is open");
    }
}
