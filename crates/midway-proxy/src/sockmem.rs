//! Socket memory guard: keeps proxied connections from pushing the machine's TCP memory past the
//! kernel's pressure threshold.
//!
//! Why: Linux autotunes every socket's buffers up to `tcp_rmem[2]` / `tcp_wmem[2]` (32 and 4 MiB
//! here). A proxy that cannot forward as fast as its clients send (CPU-bound, or a slow access
//! link behind it) lets those buffers fill: with 1000 busy split connections the proxy's 2000
//! sockets can ask for several GiB. Once the machine's TCP memory (`/proc/net/sockstat`, "mem")
//! passes `tcp_mem[1]`, the kernel enters memory pressure for *every* TCP socket — it shrinks
//! windows, prunes receive queues and drops — and throughput of the whole machine collapses
//! (docs/results/bench: every proxy at 0.2-0.3 of direct at 1000 streams). HAProxy avoids this
//! only when the operator fixes small socket buffers for all connections, which costs the few
//! fast connections their throughput when the gateway is not busy.
//!
//! What: while the machine's TCP memory is low, nothing is touched and the kernel autotunes as
//! usual. When it reaches the guard's budget, every proxied socket whose profile leaves its
//! buffers to the kernel gets `SO_RCVBUF` / `SO_SNDBUF` capped at an equal share of the budget
//! (budget / 4 per connection: two sockets, receive and send), in power-of-two steps so that the
//! cap changes rarely. The share follows the number of live connections; if memory still nears
//! the pressure threshold the cap is halved step by step (down to [`MIN_CAP_BYTES`]). When memory
//! falls below half the budget the caps are lifted again (sockets that were capped go back to the
//! autotuning maxima; a socket whose buffer was set cannot return to autotuning, Linux has no way
//! to undo `SOCK_*BUF_LOCK`).
//!
//! A profile that sets `send_buffer` / `recv_buffer` itself is the operator's decision and is
//! never overridden. An HTTP listener's connection is counted like a relayed one and its client
//! socket is capped. The HTTP engine's pooled upstream sockets (shared by clients, owned by
//! `midway-http`) get the caps in force when they are opened and keep them until they close;
//! later cap changes do not reach them.
//!
//! [`Guard`] is the decision logic (pure: memory and connection count in, caps out);
//! [`SocketMemory`] samples `/proc/net/sockstat` on a thread of its own and publishes the caps,
//! which each connection applies to its sockets.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{setsockopt, sockopt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Smallest cap the guard sets on a buffer (kernel-visible bytes, as `getsockopt` reports them).
/// Below this a connection cannot keep even a LAN's bandwidth-delay product in flight; the
/// connection limits are the tool for a gateway that needs less per connection.
pub(crate) const MIN_CAP_BYTES: u32 = 64 * 1024;

/// How the guard is configured (`[proxy] socket_memory`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketMemorySetting {
    /// Budget = half the kernel's pressure threshold (`tcp_mem[1]`).
    Auto,
    /// Never cap (the kernel autotunes every socket as it likes).
    Off,
    /// Machine TCP memory at which caps go on, in bytes; the proxied connections share it.
    Budget(u64),
}

pub(crate) use midway_sys::procfs::{machine_tcp_memory_bytes, KernelMemoryLimits};

/// Caps on one socket's buffers, in kernel-visible bytes (what `getsockopt(SO_RCVBUF)` reports;
/// `setsockopt` is given half, the kernel doubles it for bookkeeping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BufferCaps {
    pub recv: u32,
    pub send: u32,
}

/// The guard's thresholds, in bytes of machine-wide TCP memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GuardSettings {
    /// Caps go on at this much machine TCP memory, and the proxied connections share it.
    pub budget_bytes: u64,
    /// Near this (90 %) the cap is halved at every sample until memory falls.
    pub pressure_bytes: u64,
    pub autotune_max_recv: u32,
    pub autotune_max_send: u32,
}

impl GuardSettings {
    /// The guard for `setting` on a kernel with `limits`; `None` for [`SocketMemorySetting::Off`].
    pub(crate) fn new(
        setting: SocketMemorySetting,
        limits: KernelMemoryLimits,
    ) -> Option<GuardSettings> {
        let budget_bytes = match setting {
            SocketMemorySetting::Off => return None,
            SocketMemorySetting::Auto => limits.pressure_bytes / 2,
            SocketMemorySetting::Budget(bytes) => bytes,
        };
        Some(GuardSettings {
            budget_bytes,
            pressure_bytes: limits.pressure_bytes,
            autotune_max_recv: limits.autotune_max_recv,
            autotune_max_send: limits.autotune_max_send,
        })
    }
}

/// Decides the buffer caps from samples of machine TCP memory and live proxied connections.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    settings: GuardSettings,
    /// Per-buffer cap in force (before clamping to the autotuning maxima); `None` = not engaged.
    tier: Option<u32>,
}

impl Guard {
    pub(crate) fn new(settings: GuardSettings) -> Guard {
        Guard {
            settings,
            tier: None,
        }
    }

    /// The caps in force.
    pub(crate) fn caps(&self) -> Option<BufferCaps> {
        self.tier.map(|tier| self.caps_of(tier))
    }

    fn caps_of(&self, tier: u32) -> BufferCaps {
        BufferCaps {
            recv: tier.min(self.settings.autotune_max_recv),
            send: tier.min(self.settings.autotune_max_send),
        }
    }

    /// The equal share of the budget for one buffer of `live` connections, as a power of two.
    fn share_tier(&self, live: usize) -> u32 {
        let buffers = (live.max(1) as u64).saturating_mul(4);
        let share = (self.settings.budget_bytes / buffers).min(u64::from(u32::MAX));
        let tier = if share == 0 {
            0
        } else {
            1u32 << (63 - share.leading_zeros())
        };
        tier.max(MIN_CAP_BYTES)
    }

    /// Takes one sample; returns the new caps when they change (`Some(None)`: caps lifted).
    pub(crate) fn observe(
        &mut self,
        machine_tcp_bytes: u64,
        live: usize,
    ) -> Option<Option<BufferCaps>> {
        let s = self.settings;
        let before = self.caps();
        let next = match self.tier {
            None if machine_tcp_bytes < s.budget_bytes => None,
            None => Some(self.share_tier(live)),
            Some(_) if machine_tcp_bytes < s.budget_bytes / 2 => None,
            Some(tier) => {
                let share = self.share_tier(live);
                if machine_tcp_bytes >= s.pressure_bytes / 10 * 9 {
                    // The shares were not enough (other sockets on the machine, or queues
                    // filled before the caps): tighten until memory stops rising.
                    Some((tier / 2).max(MIN_CAP_BYTES).min(share))
                } else if share < tier {
                    Some(share)
                } else if share > tier
                    && self.share_tier(live + live / 2) > tier
                    && machine_tcp_bytes < s.budget_bytes
                {
                    // Raise only with headroom in the count and in memory, so that a count
                    // moving around a step boundary does not flip every socket back and forth.
                    Some(share)
                } else {
                    Some(tier)
                }
            }
        };
        self.tier = next;
        let after = self.caps();
        (after != before).then_some(after)
    }
}

/// How often the guard samples the machine's TCP memory while connections are relayed. Memory
/// can grow by a GiB within a second at 10 Gbit/s, so the guard must act within a fraction of it;
/// one small /proc read per 100 ms costs nothing measurable.
pub(crate) const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// The guard at run time: the count of live proxied connections and the caps in force, shared
/// by the sampling thread ([`SocketMemory::spawn_sampler`]) and the connections.
#[derive(Debug)]
pub(crate) struct SocketMemory {
    settings: GuardSettings,
    live: AtomicUsize,
    caps: watch::Sender<Option<BufferCaps>>,
}

/// Counts one proxied connection (relayed, or an HTTP listener's client) while it lives.
#[derive(Debug)]
pub(crate) struct LiveConnection(Arc<SocketMemory>);

impl Drop for LiveConnection {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SocketMemory {
    pub(crate) fn new(settings: GuardSettings) -> Arc<SocketMemory> {
        Arc::new(SocketMemory {
            settings,
            live: AtomicUsize::new(0),
            caps: watch::Sender::new(None),
        })
    }

    /// Counts a connection until the returned value is dropped.
    pub(crate) fn register(self: &Arc<Self>) -> LiveConnection {
        self.live.fetch_add(1, Ordering::Relaxed);
        LiveConnection(self.clone())
    }

    /// The caps in force now.
    pub(crate) fn caps(&self) -> Option<BufferCaps> {
        *self.caps.borrow()
    }

    /// The caps in force now and every later change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<BufferCaps>> {
        self.caps.subscribe()
    }

    /// The buffers a capped socket goes back to when the caps are lifted.
    pub(crate) fn autotune_max(&self) -> BufferCaps {
        BufferCaps {
            recv: self.settings.autotune_max_recv,
            send: self.settings.autotune_max_send,
        }
    }

    /// Starts the sampling thread: machine TCP memory every [`SAMPLE_INTERVAL`] until
    /// `cancel`, cap changes published to the connections and to `on_change` (metrics, log).
    ///
    /// A thread of its own, not a task: the guard matters exactly when the proxy is saturated,
    /// and then a task waits behind a thousand busy relays (measured: a task sampler first
    /// acted at 1741 MiB, past the pressure threshold, where the thread acts at the budget).
    pub(crate) fn spawn_sampler(
        self: Arc<Self>,
        on_change: impl Fn(Option<BufferCaps>, u64, usize) + Send + 'static,
        cancel: CancellationToken,
    ) -> io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("midway-memguard".into())
            .spawn(move || self.sample_until(on_change, cancel))
    }

    fn sample_until(
        &self,
        on_change: impl Fn(Option<BufferCaps>, u64, usize),
        cancel: CancellationToken,
    ) {
        let mut guard = Guard::new(self.settings);
        let mut warned = false;
        while !cancel.is_cancelled() {
            std::thread::sleep(SAMPLE_INTERVAL);
            let live = self.live.load(Ordering::Relaxed);
            if live == 0 && guard.caps().is_none() {
                continue;
            }
            let machine = match machine_tcp_memory_bytes() {
                Ok(bytes) => bytes,
                Err(err) => {
                    if !warned {
                        tracing::warn!(error = %err, "socket memory guard cannot read TCP memory use; caps unchanged");
                        warned = true;
                    }
                    continue;
                }
            };
            if let Some(caps) = guard.observe(machine, live) {
                self.caps.send_replace(caps);
                on_change(caps, machine, live);
            }
        }
    }
}

/// Which buffers of one socket the guard may touch: those its profile leaves to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Adjustable {
    pub recv: bool,
    pub send: bool,
}

/// Per-connection side of the guard: applies cap changes to one socket and remembers whether it
/// ever capped it (then lifting the caps means setting the autotuning maxima).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SocketCapper {
    adjustable: Adjustable,
    capped: bool,
    autotune_max: BufferCaps,
}

impl SocketCapper {
    pub(crate) fn new(adjustable: Adjustable, autotune_max: BufferCaps) -> SocketCapper {
        SocketCapper {
            adjustable,
            capped: false,
            autotune_max,
        }
    }

    /// Applies `caps` (or lifts them) on `fd`. Errors leave the socket as it was; the caller logs.
    pub(crate) fn apply(&mut self, fd: BorrowedFd<'_>, caps: Option<BufferCaps>) -> io::Result<()> {
        let target = match caps {
            Some(caps) => caps,
            None if self.capped => self.autotune_max,
            None => return Ok(()),
        };
        if self.adjustable.recv {
            set_buffer(fd, target.recv, Buffer::Recv)?;
        }
        if self.adjustable.send {
            set_buffer(fd, target.send, Buffer::Send)?;
        }
        self.capped |= self.adjustable.recv || self.adjustable.send;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Buffer {
    Recv,
    Send,
}

/// Sets a buffer to `kernel_bytes` as the kernel reports it. The `*FORCE` options pass above
/// `net.core.[rw]mem_max` (midway runs with CAP_NET_ADMIN for transparent mode and route knobs);
/// without the capability the plain option is used and the kernel clamps to `[rw]mem_max`,
/// which only makes the cap tighter.
fn set_buffer(fd: BorrowedFd<'_>, kernel_bytes: u32, buffer: Buffer) -> io::Result<()> {
    let request = usize::try_from(kernel_bytes / 2).unwrap_or(usize::MAX);
    let forced = match buffer {
        Buffer::Recv => setsockopt(&fd, sockopt::RcvBufForce, &request),
        Buffer::Send => setsockopt(&fd, sockopt::SndBufForce, &request),
    };
    match forced {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => match buffer {
            Buffer::Recv => setsockopt(&fd, sockopt::RcvBuf, &request),
            Buffer::Send => setsockopt(&fd, sockopt::SndBuf, &request),
        }
        .map_err(io::Error::from),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn settings() -> GuardSettings {
        // This machine's values: tcp_mem[1] = 383867 pages, tcp_rmem[2] 32 MiB, tcp_wmem[2] 4 MiB.
        GuardSettings::new(
            SocketMemorySetting::Auto,
            KernelMemoryLimits {
                pressure_bytes: 383_867 * 4096,
                autotune_max_recv: 32 << 20,
                autotune_max_send: 4 << 20,
            },
        )
        .unwrap()
    }

    #[test]
    fn auto_budget_is_half_the_pressure_threshold_and_off_is_none() {
        let s = settings();
        assert_eq!(s.budget_bytes, 383_867 * 4096 / 2);
        let limits = KernelMemoryLimits {
            pressure_bytes: 1 << 30,
            autotune_max_recv: 1,
            autotune_max_send: 1,
        };
        assert_eq!(GuardSettings::new(SocketMemorySetting::Off, limits), None);
        let explicit = GuardSettings::new(SocketMemorySetting::Budget(123 * MIB), limits).unwrap();
        assert_eq!(explicit.budget_bytes, 123 * MIB);
    }

    #[test]
    fn nothing_is_capped_while_memory_is_below_the_budget() {
        let mut guard = Guard::new(settings());
        for live in [1, 100, 1000, 8000] {
            assert_eq!(guard.observe(100 * MIB, live), None, "live {live}");
        }
        assert_eq!(guard.caps(), None);
    }

    #[test]
    fn caps_share_the_budget_among_live_connections_in_power_of_two_steps() {
        let mut guard = Guard::new(settings());
        // 1000 connections at 800 MiB (budget 749.7 MiB): 749.7 MiB / 4000 = 192 KiB -> 128 KiB.
        let caps = guard.observe(800 * MIB, 1000).unwrap().unwrap();
        assert_eq!(
            caps,
            BufferCaps {
                recv: 128 << 10,
                send: 128 << 10
            }
        );
        // Few connections: the share is large and clamped to each buffer's autotuning maximum.
        let mut guard = Guard::new(settings());
        let caps = guard.observe(800 * MIB, 10).unwrap().unwrap();
        assert_eq!(caps.send, 4 << 20);
        assert_eq!(caps.recv, 16 << 20);
        // Many idle ones: never below the floor.
        let mut guard = Guard::new(settings());
        let caps = guard.observe(800 * MIB, 100_000).unwrap().unwrap();
        assert_eq!(caps.recv, MIN_CAP_BYTES);
    }

    #[test]
    fn more_connections_lower_the_cap_at_once_fewer_raise_it_only_with_headroom() {
        let mut guard = Guard::new(settings());
        guard.observe(800 * MIB, 1000).unwrap();
        assert_eq!(guard.caps().unwrap().recv, 128 << 10);
        // 1100 live: share 174 KiB, still the 128 KiB step; no change published.
        assert_eq!(guard.observe(700 * MIB, 1100), None);
        // 2000 live: 96 KiB -> 64 KiB, lowered at once.
        assert_eq!(
            guard.observe(700 * MIB, 2000).unwrap().unwrap().recv,
            64 << 10
        );
        // 1400 live: share 137 KiB would be the 128 KiB step, but 1.5x the count (2100) would
        // not, so the cap stays (no flapping around a step).
        assert_eq!(guard.observe(700 * MIB, 1400), None);
        // 900 live: 1.5x = 1350 -> 142 KiB -> 128 KiB: raised.
        assert_eq!(
            guard.observe(700 * MIB, 900).unwrap().unwrap().recv,
            128 << 10
        );
        // Memory above the budget: never raised, even with few connections.
        assert_eq!(guard.observe(760 * MIB, 10), None);
    }

    #[test]
    fn near_the_pressure_threshold_the_cap_halves_every_sample_down_to_the_floor() {
        let mut guard = Guard::new(settings());
        guard.observe(800 * MIB, 10).unwrap();
        let mut seen = vec![guard.caps().unwrap().recv];
        for _ in 0..20 {
            if let Some(caps) = guard.observe(1400 * MIB, 10) {
                seen.push(caps.unwrap().recv);
            }
        }
        assert_eq!(seen.first(), Some(&(16 << 20)));
        assert_eq!(seen.last(), Some(&MIN_CAP_BYTES));
        assert!(seen.windows(2).all(|w| w[1] == w[0] / 2), "{seen:?}");
    }

    #[test]
    fn caps_are_lifted_below_half_the_budget_not_before() {
        let mut guard = Guard::new(settings());
        guard.observe(800 * MIB, 1000).unwrap();
        assert_eq!(guard.observe(400 * MIB, 1000), None, "hysteresis");
        assert_eq!(guard.observe(300 * MIB, 1000), Some(None));
        assert_eq!(guard.caps(), None);
    }

    #[test]
    fn the_running_kernel_reports_its_limits_and_usage() {
        let limits = KernelMemoryLimits::read().unwrap();
        assert!(limits.pressure_bytes > 0);
        assert!(limits.autotune_max_recv >= 4096 && limits.autotune_max_send >= 4096);
        machine_tcp_memory_bytes().unwrap();
    }

    #[test]
    fn a_capper_sets_the_buffers_reads_back_and_lifts_to_the_autotuning_maxima() {
        use std::os::fd::AsFd;
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let max = BufferCaps {
            recv: 1 << 20,
            send: 512 << 10,
        };
        let fd = socket.as_fd();
        let recv = || nix::sys::socket::getsockopt(&fd, sockopt::RcvBuf).unwrap();
        let send = || nix::sys::socket::getsockopt(&fd, sockopt::SndBuf).unwrap();
        let before_send = send();

        let mut capper = SocketCapper::new(
            Adjustable {
                recv: true,
                send: false,
            },
            max,
        );
        // Nothing capped yet: lifting does nothing.
        capper.apply(fd, None).unwrap();
        assert_eq!(send(), before_send);
        let caps = BufferCaps {
            recv: 128 << 10,
            send: 64 << 10,
        };
        capper.apply(fd, Some(caps)).unwrap();
        assert_eq!(recv(), 128 << 10);
        assert_eq!(send(), before_send, "send left to the profile");
        capper.apply(fd, None).unwrap();
        assert_eq!(recv(), 1 << 20);
    }
}
