//! Subscribers' access links at run time: the connections of each subscriber, a thread that
//! keeps their pacing ceilings at their shares of the link, and the subscriber's shared window
//! when the link's queue is known (see `crate::access_link` for why and what).
//!
//! Every [`SAMPLE_INTERVAL`] the thread reads each registered socket's unacknowledged bytes
//! (`SIOCOUTQ`: busy when any), splits the subscriber's payload rate among the busy ones and
//! sets `SO_MAX_PACING_RATE` where a share changed. A connection joins with the share of a
//! newcomer, before its first byte, so its initial window is paced too. With a shared window,
//! the same pass sums what the subscriber's connections hold, starts the count of bytes granted
//! since, and wakes the relays that wait for room. Only sockets of clients under an
//! `[[access_links]]` entry are registered, so the cost (one ioctl per socket per interval, and
//! a lock per write toward a windowed subscriber) is paid only where a narrow link asks for it.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use midway_relay::ClientWindow;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::socket_id::SocketId;
use crate::access_link::{
    counts_against_window, link_payload_capacity, pacing_shares, payload_bytes_per_second,
    shared_window, subscriber_of, window_grant, AccessLink, Subscriber,
};

/// How often shares follow which connections are busy. A full-size segment takes 30 ms at
/// 384 kbit/s: a connection that turns idle hands its share on within about one segment.
pub(super) const SAMPLE_INTERVAL: Duration = Duration::from_millis(25);

/// How late after an acknowledgement a relay waiting for its subscriber's window looks again
/// (the sockets are read again when the last look is this old): a full-size segment takes 3 ms
/// at 4 Mbit/s, where waiting for the next pass (up to 25 ms) would leave room unused for a
/// quarter of the 100 ms round trip of `tests/access_link_netns.rs`.
pub(super) const WINDOW_RECHECK: Duration = Duration::from_millis(5);

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
    window: Option<Window>,
}

/// A subscriber's shared window (`queue_bytes` given).
struct Window {
    /// The link's payload capacity, bytes per second (its rate less the headers).
    capacity: u64,
    queue_bytes: u64,
    /// The smallest round trip any of the subscriber's sockets has measured.
    min_rtt: Duration,
    /// What the connections held at the last sample (stalled ones left out).
    held: u64,
    /// Bytes granted since the last sample: written or about to be, not yet in `held`.
    granted: u64,
    sampled_at: Instant,
    /// Wakes the relays that found the window full.
    opened: Arc<Notify>,
}

impl Window {
    fn limit(&self) -> u64 {
        shared_window(self.capacity, self.min_rtt, self.queue_bytes)
    }

    fn has_room(&self) -> bool {
        self.held + self.granted < self.limit()
    }
}

impl Members {
    /// A joining connection's pacing ceiling: its share among the busy ones and the other
    /// newcomers since the last pass, or the whole budget under a window.
    fn share_of_newcomer(&self) -> u64 {
        match self.window {
            Some(_) => self.budget,
            None => (self.budget / self.busy.max(1) as u64).max(1),
        }
    }

    /// Reads every socket of the subscriber; under a shared window, sums what counts against
    /// it and starts the count of grants again. Whether each socket is busy, in order.
    fn sample(&mut self, now: Instant) -> Vec<bool> {
        let windowed = self.window.is_some();
        let busy = self
            .sockets
            .iter_mut()
            .map(|member| member.sample(now, windowed))
            .collect();
        if let Some(window) = self.window.as_mut() {
            window.held = self
                .sockets
                .iter()
                .filter(|m| counts_against_window(m.outstanding, now - m.progress_at))
                .map(|m| m.outstanding)
                .sum();
            window.granted = 0;
            window.sampled_at = now;
            if window.has_room() {
                window.opened.notify_waiters();
            }
        }
        busy
    }
}

struct Member {
    id: u64,
    socket: SocketId,
    /// The pacing ceiling the socket's profile set, bytes per second: the share never exceeds it.
    ceiling: Option<u64>,
    applied: u64,
    /// Unacknowledged bytes at the last pass; the client's acknowledged bytes, and when they
    /// last grew (or nothing was outstanding).
    outstanding: u64,
    acked: u64,
    progress_at: Instant,
}

/// One connection's place among its subscriber's: leaves when dropped. With a shared window it
/// is also the relay's [`ClientWindow`].
pub(super) struct SharedLink {
    links: Arc<AccessLinks>,
    subscriber: Subscriber,
    id: u64,
    /// The subscriber's wake-up when the shared window is on.
    opened: Option<Arc<Notify>>,
}

impl SharedLink {
    /// This connection's share of its subscriber's window, for the relay; `None` when the
    /// link's queue is not given.
    pub(super) fn window(self: &Arc<Self>) -> Option<Arc<dyn ClientWindow>> {
        self.opened
            .is_some()
            .then(|| self.clone() as Arc<dyn ClientWindow>)
    }

    fn with_window<T>(&self, f: impl FnOnce(&mut Window) -> T) -> Option<T> {
        let mut subscribers = self.links.lock();
        subscribers
            .get_mut(&self.subscriber)?
            .window
            .as_mut()
            .map(f)
    }
}

impl ClientWindow for SharedLink {
    fn grant(&self, want: usize) -> usize {
        let mut subscribers = self.links.lock();
        let Some(members) = subscribers.get_mut(&self.subscriber) else {
            return want;
        };
        let Some(window) = members.window.as_ref() else {
            return want;
        };
        let now = Instant::now();
        // Short of room on a sample older than a recheck: the client may have acknowledged
        // since; read the sockets again rather than wait for the next pass.
        if window_grant(window.limit(), window.held + window.granted, want) < want
            && now - window.sampled_at >= WINDOW_RECHECK
        {
            members.sample(now);
        }
        let Some(window) = members.window.as_mut() else {
            return want;
        };
        let granted = window_grant(window.limit(), window.held + window.granted, want);
        window.granted += granted as u64;
        granted
    }

    fn give_back(&self, bytes: usize) {
        self.with_window(|window| window.granted = window.granted.saturating_sub(bytes as u64));
    }

    fn opened(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        let Some(opened) = &self.opened else {
            return Box::pin(std::future::ready(()));
        };
        // Woken by a sample that found room, or after a recheck's time to look again.
        Box::pin(async move {
            tokio::select! {
                () = opened.notified() => {}
                () = tokio::time::sleep(WINDOW_RECHECK) => {}
            }
        })
    }
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
    pub(super) fn join(
        self: &Arc<Self>,
        client: IpAddr,
        stream: &TcpStream,
    ) -> Option<Arc<SharedLink>> {
        let subscriber = subscriber_of(&self.links, client)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let link = &self.links[subscriber.link];
        let budget = payload_bytes_per_second(link.rate_bps);
        let mut member = Member {
            id,
            socket: SocketId::new(stream),
            ceiling: midway_sys::sockopt::get_max_pacing_rate(stream.as_fd())
                .ok()
                .filter(|&rate| u128::from(rate) < u128::from(libc::c_ulong::MAX)),
            applied: 0,
            outstanding: 0,
            acked: 0,
            progress_at: Instant::now(),
        };
        // The handshake's round trip (an accepted socket has one sample from it).
        let rtt = link.queue_bytes.and_then(|_| handshake_rtt(stream));
        let mut subscribers = self.lock();
        let members = subscribers.entry(subscriber).or_insert_with(|| Members {
            budget,
            busy: 0,
            sockets: Vec::new(),
            window: link.queue_bytes.map(|queue_bytes| Window {
                capacity: link_payload_capacity(link.rate_bps),
                queue_bytes,
                min_rtt: Duration::MAX,
                held: 0,
                granted: 0,
                sampled_at: Instant::now(),
                opened: Arc::default(),
            }),
        });
        if let (Some(window), Some(rtt)) = (members.window.as_mut(), rtt) {
            window.min_rtt = window.min_rtt.min(rtt);
        }
        let opened = members.window.as_ref().map(|w| w.opened.clone());
        // A newcomer counts as busy until the next pass looks: a browser opens its connections
        // within a millisecond, and each must start at its share of all of them.
        members.busy += 1;
        let share = members.share_of_newcomer();
        member.apply(share);
        members.sockets.push(member);
        drop(subscribers);
        Some(Arc::new(SharedLink {
            links: self.clone(),
            subscriber,
            id,
            opened,
        }))
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
        let now = Instant::now();
        let mut subscribers = self.lock();
        for members in subscribers.values_mut() {
            let busy = members.sample(now);
            members.busy = busy.iter().filter(|b| **b).count();
            let shares = match members.window {
                // The window bounds the sum; each connection is only kept from bursting past
                // the link (a split rate would idle the share of a connection whose bytes wait
                // for the window, and the link with it).
                Some(_) => vec![members.budget; busy.len()],
                None => pacing_shares(members.budget, &busy),
            };
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
    /// Reads the socket's bytes written and not yet acknowledged (none for a socket that is
    /// gone) and, under a shared window, when the client last acknowledged any; whether there
    /// are any (the socket is busy).
    fn sample(&mut self, now: Instant, windowed: bool) -> bool {
        let Some(fd) = self.socket.borrow() else {
            self.outstanding = 0;
            return false;
        };
        let outstanding = midway_sys::sockopt::queued_bytes(fd).map_or(0, |q| q.unacked_out);
        if windowed {
            let acked = midway_sys::tcp_info::tcp_stats(fd).map_or(0, |stats| stats.bytes_acked);
            if acked > self.acked || outstanding == 0 {
                self.progress_at = now;
            }
            self.acked = acked;
        }
        self.outstanding = outstanding;
        outstanding > 0
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

/// The round trip an accepted socket measured in its handshake (its smallest so far); `None`
/// before any sample.
fn handshake_rtt(stream: &TcpStream) -> Option<Duration> {
    let stats = midway_sys::tcp_info::tcp_stats(stream.as_fd()).ok()?;
    let micros = if stats.min_rtt_us > 0 && stats.min_rtt_us != u32::MAX {
        stats.min_rtt_us
    } else {
        stats.rtt_us
    };
    (micros > 0).then(|| Duration::from_micros(micros.into()))
}
