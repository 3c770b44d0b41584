//! Subscribers' access links at run time: the connections of each subscriber, and a thread
//! that keeps their pacing ceilings at their shares of the link (see `crate::access_link` for
//! why and what).
//!
//! Every [`SAMPLE_INTERVAL`] the thread reads each registered socket's unacknowledged bytes
//! (`SIOCOUTQ`: busy when any), splits the subscriber's payload rate among the busy ones and
//! sets `SO_MAX_PACING_RATE` where a share changed. A connection joins with the share of a
//! newcomer, before its first byte, so its initial window is paced too. Only sockets of clients
//! under an `[[access_links]]` entry are registered, so the cost (one ioctl per socket per
//! interval) is paid only where a narrow link asks for it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::socket_id::SocketId;
use crate::access_link::{
    pacing_shares, payload_bytes_per_second, subscriber_of, AccessLink, Subscriber,
};

/// How often shares follow which connections are busy. A full-size segment takes 30 ms at
/// 384 kbit/s: a connection that turns idle hands its share on within about one segment.
pub(super) const SAMPLE_INTERVAL: Duration = Duration::from_millis(25);

/// The subscribers and their live connections.
pub(crate) struct AccessLinks {
    links: Vec<AccessLink>,
    subscribers: Mutex<HashMap<Subscriber, Members>>,
    next_id: AtomicU64,
}

struct Members {
    budget: u64,
    busy: usize,
    sockets: Vec<Member>,
}

struct Member {
    id: u64,
    socket: SocketId,
    /// The pacing ceiling the socket's profile set, bytes per second: the share never exceeds it.
    ceiling: Option<u64>,
    applied: u64,
}

/// One connection's place among its subscriber's: leaves when dropped.
pub(super) struct SharedLink {
    links: Arc<AccessLinks>,
    subscriber: Subscriber,
    id: u64,
}

impl Drop for SharedLink {
    fn drop(&mut self) {
        let mut subscribers = self.links.lock();
        if let Some(members) = subscribers.get_mut(&self.subscriber) {
            members.sockets.retain(|m| m.id != self.id);
            if members.sockets.is_empty() {
                subscribers.remove(&self.subscriber);
            }
        }
    }
}

impl AccessLinks {
    /// `None` without access links.
    pub(crate) fn new(links: &[AccessLink]) -> Option<Arc<AccessLinks>> {
        (!links.is_empty()).then(|| {
            Arc::new(AccessLinks {
                links: links.to_vec(),
                subscribers: Mutex::default(),
                next_id: AtomicU64::new(0),
            })
        })
    }

    /// Registers `stream`, the local socket of a connection from `client`, if an access link
    /// covers the client, and paces it at once at its share among the busy connections and the
    /// other newcomers since the last pass. A pacing ceiling its profile set already
    /// (`max_pacing_rate_bps`) stays the most it gets.
    pub(super) fn join(self: &Arc<Self>, client: IpAddr, stream: &TcpStream) -> Option<SharedLink> {
        let subscriber = subscriber_of(&self.links, client)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let budget = payload_bytes_per_second(self.links[subscriber.link].rate_bps);
        let mut member = Member {
            id,
            socket: SocketId::new(stream),
            ceiling: midway_sys::sockopt::get_max_pacing_rate(stream.as_fd())
                .ok()
                .filter(|&rate| u128::from(rate) < u128::from(libc::c_ulong::MAX)),
            applied: 0,
        };
        let mut subscribers = self.lock();
        let members = subscribers.entry(subscriber).or_insert_with(|| Members {
            budget,
            busy: 0,
            sockets: Vec::new(),
        });
        // A newcomer counts as busy until the next pass looks: a browser opens its connections
        // within a millisecond, and each must start at its share of all of them.
        members.busy += 1;
        let share = (members.budget / members.busy as u64).max(1);
        member.apply(share);
        members.sockets.push(member);
        drop(subscribers);
        Some(SharedLink {
            links: self.clone(),
            subscriber,
            id,
        })
    }

    /// Starts the thread that keeps shares current until `cancel`.
    pub(crate) fn spawn_sampler(
        self: Arc<Self>,
        cancel: CancellationToken,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("midway-access".into())
            .spawn(move || {
                while !cancel.is_cancelled() {
                    std::thread::sleep(SAMPLE_INTERVAL);
                    self.update_shares();
                }
            })
    }

    /// One pass: every subscriber's busy connections and their shares. The lock is held for
    /// the whole pass (two ioctls and at most one setsockopt per socket), which is what makes
    /// the mechanism one for narrow links: a few thousand shaped sockets, not a gateway's
    /// every connection.
    fn update_shares(&self) {
        let mut subscribers = self.lock();
        for members in subscribers.values_mut() {
            let busy: Vec<bool> = members.sockets.iter_mut().map(Member::busy).collect();
            members.busy = busy.iter().filter(|b| **b).count();
            let shares = pacing_shares(members.budget, &busy);
            for (member, share) in members.sockets.iter_mut().zip(shares) {
                member.apply(share);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Subscriber, Members>> {
        // A panic under this lock cannot leave a member half-changed; go on.
        self.subscribers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Member {
    /// Whether the socket has bytes written and not yet acknowledged; a socket that is gone is
    /// idle.
    fn busy(&mut self) -> bool {
        self.socket
            .borrow()
            .and_then(|fd| midway_sys::sockopt::queued_bytes(fd).ok())
            .is_some_and(|queued| queued.unacked_out > 0)
    }

    /// Sets the socket's pacing ceiling to `share` (bounded by its profile's) if it changed.
    fn apply(&mut self, share: u64) {
        let rate = self.ceiling.map_or(share, |ceiling| share.min(ceiling));
        if rate == self.applied {
            return;
        }
        let Some(fd) = self.socket.borrow() else {
            return;
        };
        match midway_sys::sockopt::set_max_pacing_rate(fd, rate) {
            Ok(()) => self.applied = rate,
            Err(err) => {
                tracing::debug!(error = %err, "could not set the access link's pacing share")
            }
        }
    }
}
