//! The thin driver: moves Ethernet frames between two interfaces of one network namespace through
//! two [`Direction`] engines, one thread per direction.
//!
//! Each thread enters the link's namespace with `setns` (only that thread moves), reads its ingress
//! interface with an `AF_PACKET` raw socket (`ETH_P_ALL`, `PACKET_IGNORE_OUTGOING` so frames sent by
//! the other direction are not read back), and writes to its egress interface with a second raw
//! socket bound to protocol 0 (which receives nothing). The loop is: send every due frame, wait
//! with `ppoll` (nanosecond timeout) until the next departure or an arrival, read every waiting
//! frame, give each to the engine with its arrival time, repeat. The stop flag is checked at least
//! every [`STOP_CHECK_INTERVAL`]. Times are `CLOCK_MONOTONIC` ([`Instant`]) nanoseconds from the
//! thread's start.
//!
//! Timing choices, measured on the 2-core lab machine while other builds kept it at load 3-8:
//! - Arrival time = the kernel's receive timestamp (`SO_TIMESTAMPNS`, mapped from
//!   `CLOCK_REALTIME`), so a late wake-up of the thread does not shift the frame's schedule; the
//!   gap is reported as `receive_lateness_*` (mean 15-40 us).
//! - Timer slack is set to 1 ns (the default 50 us would be added to every departure).
//! - Threads run under `SCHED_FIFO` by default ([`DriverOptions`]): mean send lateness 35-60 us
//!   versus 100-200 us under the normal scheduler, with 8 links (4 bulk at 20 Mbit/s) at once.
//! - No busy-polling by default: 100 us of spinning cut the mean lateness of sparse traffic to
//!   ~25 us, but at 100 Mbit/s (a departure every 120 us) it would spin most of the time, which
//!   many links side by side on 2 cores cannot afford. [`DriverOptions::busy_poll`] turns it on.
//!
//! The sender's lateness is measured and reported per direction (`send_lateness_*`,
//! `late_sends`), so a self-check can tell an accurate run from a disturbed one.
//!
//! Offloads (GSO/TSO/GRO, checksum) must be off on both interfaces so that every frame is at most
//! one MTU and carries its checksum; the caller (midway-labnet) does that with ethtool. The driver
//! counts what it sees of offloads left on: frames longer than the egress MTU (dropped, in
//! `oversized_frames`) and frames whose checksum is still to be computed (forwarded, in
//! `partial_checksum_frames`; the receiving host will drop them).

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::classify::{frame_class, FrameKind};
use crate::engine::{Direction, DirectionStats, DropReason, Verdict, LATE_SEND_THRESHOLD_NS};
use crate::{ConfigError, DirectionConfig};

/// Longest time a direction thread sleeps before looking at the stop flag.
pub(crate) const STOP_CHECK_INTERVAL: Duration = Duration::from_millis(50);
/// Bound on the frame bytes one direction holds (queue + delay line); beyond it frames are dropped
/// and counted in `dropped_memory_frames`. 64 MiB is 5 s of 100 Mbit/s.
pub(crate) const MAX_HELD_BYTES: usize = 64 << 20;
/// Receive buffer asked for with `SO_RCVBUFFORCE`, so that bursts wait in the kernel instead of
/// being dropped before the engine sees them.
pub(crate) const RECEIVE_BUFFER_BYTES: libc::c_int = 32 << 20;
/// Largest frame read; bigger ones (offloads left on) are counted as I/O errors.
const MAX_FRAME_BYTES: usize = 65_536 + 64;
const ETHERNET_HEADER_LEN: usize = 14;
/// A kernel timestamp older than this (1 s) is taken for a wall-clock step and ignored.
const MAX_RECEIVE_LATENESS_NS: u64 = 1_000_000_000;
const VLAN_TAG_LEN: usize = 4;
/// Frames read in one go before due departures are sent again.
const RECEIVE_BATCH: usize = 64;
/// How often the shared statistics (and the kernel's drop counter) are refreshed.
const STATS_INTERVAL: Duration = Duration::from_millis(20);
/// Added to the link seed for the b-to-a direction so the two directions draw different numbers.
const REVERSE_SEED_OFFSET: u64 = 0x9e37_79b9_7f4a_7c15;
/// Default `SCHED_FIFO` priority of the direction threads (see [`DriverOptions`]).
pub(crate) const DEFAULT_REALTIME_PRIORITY: Option<u8> = Some(10);
/// Default [`DriverOptions::busy_poll`].
pub(crate) const DEFAULT_BUSY_POLL: Duration = Duration::ZERO;

/// Why a link could not be started.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The configuration of one direction failed [`DirectionConfig::validate`].
    #[error("invalid {direction} configuration")]
    InvalidConfig {
        /// Which direction: `a_to_b` or `b_to_a`.
        direction: &'static str,
        /// What is wrong with it.
        #[source]
        source: ConfigError,
    },
    /// The link's network namespace file could not be opened.
    #[error("cannot open network namespace {path}")]
    OpenNetns {
        /// The namespace path given to [`spawn_link`], e.g. `/run/netns/NAME`.
        path: PathBuf,
        /// The error from opening it.
        #[source]
        source: io::Error,
    },
    /// A direction thread could not enter the link's network namespace (`setns`).
    #[error("cannot enter network namespace {path} (root needed)")]
    EnterNetns {
        /// The namespace path given to [`spawn_link`].
        path: PathBuf,
        /// The error from `setns`.
        #[source]
        source: std::io::Error,
    },
    /// One of the two interfaces does not exist in the link's namespace.
    #[error("no interface {name:?} in the link's namespace")]
    NoSuchInterface {
        /// The interface name that was looked up.
        name: String,
        /// The error from resolving its index.
        #[source]
        source: nix::Error,
    },
    /// A raw socket of one interface could not be set up.
    #[error("cannot {action} for interface {interface}")]
    Socket {
        /// The step that failed, e.g. "bind the packet socket".
        action: &'static str,
        /// The interface the socket is for.
        interface: String,
        /// The error from the system call.
        #[source]
        source: io::Error,
    },
    /// The operating system refused to start a direction thread.
    #[error("cannot start a link thread")]
    SpawnThread(#[source] io::Error),
    /// A direction thread ended without saying whether its setup succeeded.
    #[error("a link thread stopped before reporting whether it started")]
    ThreadVanished,
}

/// How the direction threads run; [`spawn_link`] uses [`DriverOptions::default`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverOptions {
    /// Run the direction threads under `SCHED_FIFO` with this priority (1..=99), so that busy
    /// hosts (TCP endpoints, the proxy, compilers) cannot delay the emulated network. `None`, or
    /// a refusal by the kernel (logged as a warning), leaves them under the normal scheduler. The
    /// kernel's RT throttling (`sched_rt_runtime_us`) still bounds their CPU share.
    pub realtime_priority: Option<u8>,
    /// The thread stops sleeping this long before the next departure and polls the socket
    /// without blocking until it is due, trading CPU for timing accuracy (timer wake-ups are
    /// often tens of microseconds late). Zero = always sleep until the departure time.
    pub busy_poll: Duration,
}

impl Default for DriverOptions {
    /// Real-time priority 10 and no busy polling.
    fn default() -> Self {
        DriverOptions {
            realtime_priority: DEFAULT_REALTIME_PRIORITY,
            busy_poll: DEFAULT_BUSY_POLL,
        }
    }
}

/// The seeds of the two directions of a link started with `seed` (a-to-b, b-to-a).
pub(crate) fn direction_seeds(seed: u64) -> (u64, u64) {
    (seed, seed.wrapping_add(REVERSE_SEED_OFFSET))
}

/// A running emulated link. Dropping it stops the threads and closes the sockets.
pub struct LinkHandle {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    a_to_b: Arc<Mutex<DirectionStats>>,
    b_to_a: Arc<Mutex<DirectionStats>>,
    seed: u64,
}

impl std::fmt::Debug for LinkHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkHandle")
            .field("seed", &self.seed)
            .field("running_threads", &self.threads.len())
            .finish()
    }
}

/// Emulates a link between two interfaces that live in one network namespace (the link's own,
/// made by the caller; `netns` is a path like `/run/netns/NAME`). Frames arriving on `iface_a` go
/// through `a_to_b` and leave on `iface_b`, and vice versa. Returns once both directions are
/// reading their interfaces, so traffic sent afterwards is emulated.
pub fn spawn_link(
    netns: &Path,
    iface_a: &str,
    iface_b: &str,
    a_to_b: DirectionConfig,
    b_to_a: DirectionConfig,
    seed: u64,
) -> Result<LinkHandle, DriverError> {
    spawn_link_with_options(
        netns,
        iface_a,
        iface_b,
        a_to_b,
        b_to_a,
        seed,
        DriverOptions::default(),
    )
}

/// [`spawn_link`] with explicit [`DriverOptions`].
pub fn spawn_link_with_options(
    netns: &Path,
    iface_a: &str,
    iface_b: &str,
    a_to_b: DirectionConfig,
    b_to_a: DirectionConfig,
    seed: u64,
    options: DriverOptions,
) -> Result<LinkHandle, DriverError> {
    a_to_b
        .validate()
        .map_err(|source| DriverError::InvalidConfig {
            direction: "a_to_b",
            source,
        })?;
    b_to_a
        .validate()
        .map_err(|source| DriverError::InvalidConfig {
            direction: "b_to_a",
            source,
        })?;
    let (seed_a_to_b, seed_b_to_a) = direction_seeds(seed);
    // One time origin for both directions, so outage schedules line up.
    let origin = Instant::now();
    let mut handle = LinkHandle {
        stop: Arc::new(AtomicBool::new(false)),
        threads: Vec::new(),
        a_to_b: Arc::default(),
        b_to_a: Arc::default(),
        seed,
    };
    let plans = [
        (iface_a, iface_b, a_to_b, seed_a_to_b, handle.a_to_b.clone()),
        (iface_b, iface_a, b_to_a, seed_b_to_a, handle.b_to_a.clone()),
    ];
    for (ingress, egress, config, direction_seed, stats) in plans {
        let plan = DirectionPlan {
            netns: netns.to_owned(),
            ingress: ingress.to_owned(),
            egress: egress.to_owned(),
            config,
            seed: direction_seed,
            stop: handle.stop.clone(),
            stats,
            options,
            origin,
        };
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("linkemu-{ingress}"))
            .spawn(move || run_direction(plan, ready_tx))
            .map_err(DriverError::SpawnThread)?;
        handle.threads.push(thread);
        // On error, `handle` is dropped here, which stops and joins the threads already running.
        ready_rx.recv().map_err(|_| DriverError::ThreadVanished)??;
    }
    Ok(handle)
}

impl LinkHandle {
    /// Current statistics (a-to-b, b-to-a), refreshed by the threads every few milliseconds.
    pub fn stats(&self) -> (DirectionStats, DirectionStats) {
        (read_stats(&self.a_to_b), read_stats(&self.b_to_a))
    }

    /// The seed the link was started with; the a-to-b direction draws from this seed, the b-to-a
    /// direction from a fixed offset of it.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Stops the threads and returns the final statistics.
    pub fn stop(mut self) -> (DirectionStats, DirectionStats) {
        self.shutdown();
        self.stats()
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            // A panicking thread has already printed its message; its last stats remain readable.
            let _ = thread.join();
        }
    }
}

impl Drop for LinkHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn read_stats(stats: &Mutex<DirectionStats>) -> DirectionStats {
    *stats
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

struct DirectionPlan {
    netns: PathBuf,
    ingress: String,
    egress: String,
    config: DirectionConfig,
    seed: u64,
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<DirectionStats>>,
    options: DriverOptions,
    /// Time zero of the engine (shared by the link's two directions).
    origin: Instant,
}

struct Sockets {
    receive: OwnedFd,
    send: OwnedFd,
    /// Longest frame the egress interface can send: MTU + Ethernet header + one VLAN tag.
    max_frame_len: usize,
}

fn run_direction(plan: DirectionPlan, ready: mpsc::Sender<Result<(), DriverError>>) {
    let sockets = match open_sockets(&plan) {
        Ok(sockets) => sockets,
        Err(error) => {
            let _ = ready.send(Err(error));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    drop(ready);
    forward(&plan, &sockets);
}

fn open_sockets(plan: &DirectionPlan) -> Result<Sockets, DriverError> {
    let namespace = File::open(&plan.netns).map_err(|source| DriverError::OpenNetns {
        path: plan.netns.clone(),
        source,
    })?;
    midway_sys::netns::enter(&namespace).map_err(|source| DriverError::EnterNetns {
        path: plan.netns.clone(),
        source,
    })?;
    // Wake up on time: the default 50 us timer slack would be added to every departure.
    // SAFETY: prctl with PR_SET_TIMERSLACK takes an integer argument and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    if let Some(priority) = plan.options.realtime_priority {
        let parameters = libc::sched_param {
            sched_priority: libc::c_int::from(priority.clamp(1, 99)),
        };
        // SAFETY: pid 0 = the calling thread; parameters is a valid sched_param.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &parameters) } != 0 {
            tracing::warn!(
                error = %io::Error::last_os_error(),
                interface = %plan.ingress,
                "cannot use SCHED_FIFO for the link thread; link timing may suffer under load"
            );
        }
    }
    let ingress_index = interface_index(&plan.ingress)?;
    let egress_index = interface_index(&plan.egress)?;
    let receive = open_receive_socket(&plan.ingress, ingress_index)?;
    let send = open_send_socket(&plan.egress, egress_index)?;
    let mtu = interface_mtu(send.as_raw_fd(), &plan.egress)?;
    Ok(Sockets {
        receive,
        send,
        max_frame_len: mtu + ETHERNET_HEADER_LEN + VLAN_TAG_LEN,
    })
}

fn interface_index(name: &str) -> Result<libc::c_int, DriverError> {
    let index =
        nix::net::if_::if_nametoindex(name).map_err(|source| DriverError::NoSuchInterface {
            name: name.to_owned(),
            source,
        })?;
    // Interface indexes are positive ints in the kernel.
    Ok(index as libc::c_int)
}

fn interface_mtu(fd: RawFd, name: &str) -> Result<usize, DriverError> {
    // SAFETY: ifreq is plain data; all-zero is a valid starting value.
    let mut request: libc::ifreq = unsafe { mem::zeroed() };
    // if_nametoindex succeeded, so the name fits IFNAMSIZ - 1 bytes and has no NUL.
    for (slot, byte) in request.ifr_name.iter_mut().zip(name.bytes()) {
        *slot = byte as libc::c_char;
    }
    // SAFETY: request is a valid ifreq for SIOCGIFMTU, which writes ifru_mtu.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut request) } < 0 {
        return Err(socket_error("read the MTU", name));
    }
    // SAFETY: SIOCGIFMTU filled the mtu member of the union.
    let mtu = unsafe { request.ifr_ifru.ifru_mtu };
    Ok(usize::try_from(mtu).unwrap_or(0))
}

fn socket_error(action: &'static str, interface: &str) -> DriverError {
    DriverError::Socket {
        action,
        interface: interface.to_owned(),
        source: io::Error::last_os_error(),
    }
}

/// Creates an AF_PACKET raw socket that receives nothing until bound.
fn packet_socket(interface: &str) -> Result<OwnedFd, DriverError> {
    // SAFETY: plain socket(2) call; the returned descriptor is owned by OwnedFd at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(socket_error("open a raw packet socket", interface));
    }
    // SAFETY: fd is a fresh, valid descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn set_option<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> Result<(), io::Error> {
    // SAFETY: value points to a live T of the given size for the duration of the call.
    let result = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn bind_to_interface(fd: RawFd, protocol: u16, index: libc::c_int) -> Result<(), io::Error> {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid starting value.
    let mut address: libc::sockaddr_ll = unsafe { mem::zeroed() };
    address.sll_family = libc::AF_PACKET as libc::c_ushort;
    address.sll_protocol = protocol.to_be();
    address.sll_ifindex = index;
    // SAFETY: address is a valid sockaddr_ll and the length matches it.
    let result = unsafe {
        libc::bind(
            fd,
            (&address as *const libc::sockaddr_ll).cast(),
            mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn open_receive_socket(interface: &str, index: libc::c_int) -> Result<OwnedFd, DriverError> {
    let socket = packet_socket(interface)?;
    let fd = socket.as_raw_fd();
    let fail = |action, source| DriverError::Socket {
        action,
        interface: interface.to_owned(),
        source,
    };
    let one: libc::c_int = 1;
    set_option(fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one)
        .map_err(|source| fail("set PACKET_IGNORE_OUTGOING", source))?;
    if set_option(
        fd,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        &RECEIVE_BUFFER_BYTES,
    )
    .is_err()
    {
        // Without CAP_NET_ADMIN the forced size is refused; the capped one is better than none.
        set_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &RECEIVE_BUFFER_BYTES)
            .map_err(|source| fail("set the receive buffer", source))?;
    }
    // Kernel receive timestamps: a frame's arrival time is when the kernel got it, not when this
    // thread woke up to read it.
    set_option(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, &one)
        .map_err(|source| fail("enable receive timestamps", source))?;
    // Per-frame status, to notice frames whose checksum was left to an offload.
    set_option(fd, libc::SOL_PACKET, libc::PACKET_AUXDATA, &one)
        .map_err(|source| fail("enable PACKET_AUXDATA", source))?;
    bind_to_interface(fd, libc::ETH_P_ALL as u16, index)
        .map_err(|source| fail("bind the receive socket", source))?;
    // Frames addressed to other MACs are what a link carries; veth passes them to packet sockets
    // anyway, but promiscuous mode makes that explicit for other interface types too.
    let membership = libc::packet_mreq {
        mr_ifindex: index,
        mr_type: libc::PACKET_MR_PROMISC as libc::c_ushort,
        mr_alen: 0,
        mr_address: [0; 8],
    };
    set_option(
        fd,
        libc::SOL_PACKET,
        libc::PACKET_ADD_MEMBERSHIP,
        &membership,
    )
    .map_err(|source| fail("enable promiscuous mode", source))?;
    // Reading the statistics resets them, so later reads count only our own drops.
    kernel_drops(fd);
    Ok(socket)
}

fn open_send_socket(interface: &str, index: libc::c_int) -> Result<OwnedFd, DriverError> {
    let socket = packet_socket(interface)?;
    // Protocol 0: the socket only sends; the kernel takes each frame's protocol from its header.
    bind_to_interface(socket.as_raw_fd(), 0, index).map_err(|source| DriverError::Socket {
        action: "bind the send socket",
        interface: interface.to_owned(),
        source,
    })?;
    Ok(socket)
}

/// Frames the kernel dropped on this socket since the last call.
fn kernel_drops(fd: RawFd) -> u64 {
    // SAFETY: tpacket_stats is plain data.
    let mut statistics: libc::tpacket_stats = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::tpacket_stats>() as libc::socklen_t;
    // SAFETY: statistics and len are valid for writes of the sizes given.
    let result = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_PACKET,
            libc::PACKET_STATISTICS,
            (&mut statistics as *mut libc::tpacket_stats).cast(),
            &mut len,
        )
    };
    if result < 0 {
        0
    } else {
        u64::from(statistics.tp_drops)
    }
}

/// Driver-side counters, merged into the engine's statistics when published.
#[derive(Default)]
struct DriverCounters {
    kernel_drops: u64,
    dropped_queue_ack_frames: u64,
    dropped_queue_handshake_frames: u64,
    dropped_memory_frames: u64,
    io_errors: u64,
    oversized_frames: u64,
    partial_checksum_frames: u64,
    send_lateness_total_ns: u64,
    send_lateness_max_ns: u64,
    late_sends: u64,
    receive_lateness_total_ns: u64,
    receive_lateness_max_ns: u64,
}

impl DriverCounters {
    fn count_queue_drop(&mut self, kind: FrameKind) {
        match kind {
            FrameKind::PureAck => self.dropped_queue_ack_frames += 1,
            FrameKind::Handshake => self.dropped_queue_handshake_frames += 1,
            FrameKind::Other => {}
        }
    }

    fn record_send(&mut self, lateness_ns: u64) {
        self.send_lateness_total_ns += lateness_ns;
        self.send_lateness_max_ns = self.send_lateness_max_ns.max(lateness_ns);
        if lateness_ns > LATE_SEND_THRESHOLD_NS {
            self.late_sends += 1;
        }
    }

    fn record_receive(&mut self, lateness_ns: u64) {
        self.receive_lateness_total_ns += lateness_ns;
        self.receive_lateness_max_ns = self.receive_lateness_max_ns.max(lateness_ns);
    }
}

fn forward(plan: &DirectionPlan, sockets: &Sockets) {
    let clock = ClockMap {
        origin: plan.origin,
    };
    let now_ns = || clock.now_ns();
    let mut engine = Direction::new(plan.config.clone(), plan.seed);
    let mut held: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
    let mut held_bytes = 0usize;
    let mut counters = DriverCounters::default();
    let mut buffer = vec![0u8; MAX_FRAME_BYTES];
    let mut last_publish = Instant::now();
    let receive_fd = sockets.receive.as_raw_fd();
    let send_fd = sockets.send.as_raw_fd();

    while !plan.stop.load(Ordering::Relaxed) {
        // Send everything due.
        let now = now_ns();
        while let Some(departure_ns) = engine.next_departure_ns().filter(|&due| due <= now) {
            let Some(id) = engine.pop_due(now) else {
                break;
            };
            let Some((held_id, frame)) = held.pop_front() else {
                break;
            };
            debug_assert_eq!(held_id, id, "engine and frame FIFO out of step");
            held_bytes -= frame.len();
            // Lateness is measured when the send starts: the syscall itself also runs the
            // receiving host's stack (veth delivers in the sender's context).
            let send_start_ns = now_ns();
            if send_frame(send_fd, &frame) {
                counters.record_send(send_start_ns.saturating_sub(departure_ns));
            } else {
                counters.io_errors += 1;
            }
        }

        // Wait for an arrival or the next departure.
        let wait = match engine.next_departure_ns() {
            Some(departure) => Duration::from_nanos(departure.saturating_sub(now_ns()))
                .saturating_sub(plan.options.busy_poll),
            None => STOP_CHECK_INTERVAL,
        }
        .min(STOP_CHECK_INTERVAL);
        let readable = wait_readable(receive_fd, wait);

        if readable {
            for _ in 0..RECEIVE_BATCH {
                match receive_frame(receive_fd, &mut buffer) {
                    Received::Frame(ReceivedFrame {
                        len,
                        timestamp,
                        partial_checksum,
                    }) => {
                        if partial_checksum {
                            counters.partial_checksum_frames += 1;
                        }
                        if len > sockets.max_frame_len {
                            counters.oversized_frames += 1;
                            continue;
                        }
                        if held_bytes + len > MAX_HELD_BYTES {
                            counters.dropped_memory_frames += 1;
                            continue;
                        }
                        // The kernel's receive time, unless missing or implausible (in the future,
                        // before the link started, or far in the past after a clock step), else
                        // the time of reading.
                        let (read_ns, realtime_offset) = clock.offset();
                        let arrival_ns = timestamp
                            .map(|timestamp| timespec_ns(&timestamp) - realtime_offset)
                            .and_then(|arrival| u64::try_from(arrival).ok())
                            .filter(|&arrival| {
                                arrival <= read_ns && read_ns - arrival <= MAX_RECEIVE_LATENESS_NS
                            })
                            .unwrap_or(read_ns);
                        counters.record_receive(read_ns - arrival_ns);
                        let frame = &buffer[..len];
                        let class = frame_class(frame);
                        let kind = class.kind;
                        match engine.arrive_frame(arrival_ns, len, class) {
                            Verdict::Accepted { id, .. } => {
                                held.push_back((id, frame.to_vec()));
                                held_bytes += len;
                            }
                            Verdict::Dropped(DropReason::QueueFull) => {
                                counters.count_queue_drop(kind)
                            }
                            Verdict::Dropped(_) => {}
                        }
                    }
                    Received::Oversized => counters.oversized_frames += 1,
                    Received::Nothing => break,
                    Received::Failed => {
                        counters.io_errors += 1;
                        // An interface going away makes every read fail; do not spin on it.
                        std::thread::sleep(Duration::from_millis(1));
                        break;
                    }
                }
            }
        }

        if last_publish.elapsed() >= STATS_INTERVAL {
            counters.kernel_drops += kernel_drops(receive_fd);
            publish(&plan.stats, &engine, &counters);
            last_publish = Instant::now();
        }
    }
    counters.kernel_drops += kernel_drops(receive_fd);
    publish(&plan.stats, &engine, &counters);
}

fn publish(shared: &Mutex<DirectionStats>, engine: &Direction, counters: &DriverCounters) {
    let mut stats = engine.stats();
    stats.kernel_drops = counters.kernel_drops;
    stats.dropped_queue_ack_frames = counters.dropped_queue_ack_frames;
    stats.dropped_queue_handshake_frames = counters.dropped_queue_handshake_frames;
    stats.dropped_memory_frames = counters.dropped_memory_frames;
    stats.io_errors = counters.io_errors;
    stats.oversized_frames = counters.oversized_frames;
    stats.partial_checksum_frames = counters.partial_checksum_frames;
    stats.send_lateness_total_ns = counters.send_lateness_total_ns;
    stats.send_lateness_max_ns = counters.send_lateness_max_ns;
    stats.late_sends = counters.late_sends;
    stats.receive_lateness_total_ns = counters.receive_lateness_total_ns;
    stats.receive_lateness_max_ns = counters.receive_lateness_max_ns;
    *shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner()) = stats;
}

/// Waits up to `timeout` for the socket to become readable (or report an error).
fn wait_readable(fd: RawFd, timeout: Duration) -> bool {
    let mut poll_fd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: poll_fd and timeout are valid for the call; no signal mask is changed.
    let result = unsafe { libc::ppoll(&mut poll_fd, 1, &timeout, std::ptr::null()) };
    result > 0
}

struct ReceivedFrame {
    len: usize,
    /// The kernel's receive time (CLOCK_REALTIME), if given.
    timestamp: Option<libc::timespec>,
    partial_checksum: bool,
}

enum Received {
    Frame(ReceivedFrame),
    Oversized,
    Nothing,
    Failed,
}

fn receive_frame(fd: RawFd, buffer: &mut [u8]) -> Received {
    let mut iov = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    // Room for the SCM_TIMESTAMPNS and PACKET_AUXDATA control messages (with slack), aligned.
    let mut control = [0u64; 32];
    // SAFETY: msghdr is plain data; all-zero is a valid starting value.
    let mut message: libc::msghdr = unsafe { mem::zeroed() };
    message.msg_iov = &mut iov;
    message.msg_iovlen = 1;
    message.msg_control = control.as_mut_ptr().cast();
    message.msg_controllen = mem::size_of_val(&control);
    // SAFETY: message points to a valid iovec and control buffer that outlive the call. MSG_TRUNC
    // makes the kernel return the frame's real length so oversized frames are detected.
    let result = unsafe { libc::recvmsg(fd, &mut message, libc::MSG_DONTWAIT | libc::MSG_TRUNC) };
    if result < 0 {
        let error = io::Error::last_os_error();
        return match error.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Received::Nothing,
            _ => Received::Failed,
        };
    }
    let len = result as usize;
    if len > buffer.len() {
        return Received::Oversized;
    }
    let mut timestamp = None;
    let mut partial_checksum = false;
    // SAFETY: the CMSG macros walk the control buffer the kernel filled, within msg_controllen.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET
                && (*header).cmsg_type == libc::SCM_TIMESTAMPNS
            {
                timestamp = Some(std::ptr::read_unaligned(
                    libc::CMSG_DATA(header).cast::<libc::timespec>(),
                ));
            } else if (*header).cmsg_level == libc::SOL_PACKET
                && (*header).cmsg_type == libc::PACKET_AUXDATA
            {
                let auxdata = std::ptr::read_unaligned(
                    libc::CMSG_DATA(header).cast::<libc::tpacket_auxdata>(),
                );
                partial_checksum = auxdata.tp_status & libc::TP_STATUS_CSUMNOTREADY != 0;
            }
            header = libc::CMSG_NXTHDR(&message, header);
        }
    }
    Received::Frame(ReceivedFrame {
        len,
        timestamp,
        partial_checksum,
    })
}

/// Maps CLOCK_REALTIME kernel timestamps onto the driver's monotonic nanoseconds.
struct ClockMap {
    origin: Instant,
}

impl ClockMap {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// `(monotonic now, realtime now - monotonic now)` in ns, read back to back.
    fn offset(&self) -> (u64, i128) {
        let monotonic = self.now_ns();
        let realtime = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_nanos() as i128)
            .unwrap_or(0);
        (monotonic, realtime - i128::from(monotonic))
    }
}

fn timespec_ns(timestamp: &libc::timespec) -> i128 {
    i128::from(timestamp.tv_sec) * 1_000_000_000 + i128::from(timestamp.tv_nsec)
}

/// Sends one frame; a full socket buffer is waited out briefly rather than turned into loss.
fn send_frame(fd: RawFd, frame: &[u8]) -> bool {
    for _ in 0..100 {
        // SAFETY: frame is valid for reads of its length.
        let result = unsafe { libc::send(fd, frame.as_ptr().cast(), frame.len(), 0) };
        if result >= 0 {
            return true;
        }
        let error = io::Error::last_os_error();
        match error.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => {
                // The send socket is non-blocking; wait for room, bounded.
                let mut poll_fd = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: poll_fd is valid for the call.
                unsafe { libc::poll(&mut poll_fd, 1, 1) };
            }
            _ => return false,
        }
    }
    false
}
