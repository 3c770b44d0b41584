//! The thin driver: moves Ethernet frames between two interfaces of one network namespace through
//! two [`Direction`] engines, one thread per direction.
//!
//! Each thread enters the link's namespace with `setns` (only that thread moves), reads its ingress
//! interface with an `AF_PACKET` raw socket (`ETH_P_ALL`, `PACKET_IGNORE_OUTGOING` so frames sent by
//! the other direction are not read back), and writes to its egress interface with a second raw
//! socket bound to protocol 0 (which receives nothing). The loop is: send every due frame, wait
//! with `ppoll` (nanosecond timeout) until the next departure or an arrival, read every waiting
//! frame, give each to the engine with the current `CLOCK_MONOTONIC` time, repeat. The stop flag is
//! checked at least every [`STOP_CHECK_INTERVAL`].
//!
//! Timer accuracy: the thread sets its timer slack to 1 ns (the default 50 us would add up to
//! 50 us to every departure) and does not busy-poll; see the crate's report for measured RTT error.
//!
//! Offloads (GSO/TSO/GRO, checksum) must be off on both interfaces so that every frame is at most
//! one MTU; the caller (midway-labnet) does that with ethtool. Frames larger than the receive
//! buffer are counted in `io_errors` and dropped.

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

use nix::sched::CloneFlags;

use crate::classify::is_pure_tcp_ack;
use crate::engine::{Direction, DirectionStats, Verdict};
use crate::{ConfigError, DirectionConfig};

/// Longest time a direction thread sleeps before looking at the stop flag.
pub const STOP_CHECK_INTERVAL: Duration = Duration::from_millis(50);
/// Bound on the frame bytes one direction holds (queue + delay line); beyond it frames are dropped
/// and counted in `dropped_memory_frames`. 64 MiB is 5 s of 100 Mbit/s.
pub const MAX_HELD_BYTES: usize = 64 << 20;
/// Receive buffer asked for with `SO_RCVBUFFORCE`, so that bursts wait in the kernel instead of
/// being dropped before the engine sees them.
pub const RECEIVE_BUFFER_BYTES: libc::c_int = 32 << 20;
/// Largest frame read; bigger ones (offloads left on) are counted as I/O errors.
const MAX_FRAME_BYTES: usize = 65_536 + 64;
/// Frames read in one go before due departures are sent again.
const RECEIVE_BATCH: usize = 64;
/// How often the shared statistics (and the kernel's drop counter) are refreshed.
const STATS_INTERVAL: Duration = Duration::from_millis(20);
/// Added to the link seed for the b-to-a direction so the two directions draw different numbers.
const REVERSE_SEED_OFFSET: u64 = 0x9e37_79b9_7f4a_7c15;

/// Why a link could not be started.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("invalid {direction} configuration")]
    InvalidConfig {
        direction: &'static str,
        #[source]
        source: ConfigError,
    },
    #[error("cannot open network namespace {path}")]
    OpenNetns {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot enter network namespace {path} (root needed)")]
    EnterNetns {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("no interface {name:?} in the link's namespace")]
    NoSuchInterface {
        name: String,
        #[source]
        source: nix::Error,
    },
    #[error("cannot {action} for interface {interface}")]
    Socket {
        action: &'static str,
        interface: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot start a link thread")]
    SpawnThread(#[source] io::Error),
    #[error("a link thread stopped before reporting whether it started")]
    ThreadVanished,
}

/// The seeds of the two directions of a link started with `seed` (a-to-b, b-to-a).
pub fn direction_seeds(seed: u64) -> (u64, u64) {
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

    /// The seed the link was started with; see [`direction_seeds`].
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
}

struct Sockets {
    receive: OwnedFd,
    send: OwnedFd,
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
    nix::sched::setns(&namespace, CloneFlags::CLONE_NEWNET).map_err(|source| {
        DriverError::EnterNetns {
            path: plan.netns.clone(),
            source,
        }
    })?;
    // Wake up on time: the default 50 us timer slack would be added to every departure.
    // SAFETY: prctl with PR_SET_TIMERSLACK takes an integer argument and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    let ingress_index = interface_index(&plan.ingress)?;
    let egress_index = interface_index(&plan.egress)?;
    let receive = open_receive_socket(&plan.ingress, ingress_index)?;
    let send = open_send_socket(&plan.egress, egress_index)?;
    Ok(Sockets { receive, send })
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
    dropped_memory_frames: u64,
    io_errors: u64,
}

fn forward(plan: &DirectionPlan, sockets: &Sockets) {
    let origin = Instant::now();
    let now_ns = || u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
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
        while let Some(id) = engine.pop_due(now) {
            let Some((held_id, frame)) = held.pop_front() else {
                break;
            };
            debug_assert_eq!(held_id, id, "engine and frame FIFO out of step");
            held_bytes -= frame.len();
            if !send_frame(send_fd, &frame) {
                counters.io_errors += 1;
            }
        }

        // Wait for an arrival or the next departure.
        let wait = match engine.next_departure_ns() {
            Some(departure) => Duration::from_nanos(departure.saturating_sub(now_ns())),
            None => STOP_CHECK_INTERVAL,
        }
        .min(STOP_CHECK_INTERVAL);
        let readable = wait_readable(receive_fd, wait);

        if readable {
            for _ in 0..RECEIVE_BATCH {
                match receive_frame(receive_fd, &mut buffer) {
                    Received::Frame(len) => {
                        if held_bytes + len > MAX_HELD_BYTES {
                            counters.dropped_memory_frames += 1;
                            continue;
                        }
                        let frame = &buffer[..len];
                        let pure_ack = is_pure_tcp_ack(frame);
                        if let Verdict::Accepted { id, .. } = engine.arrive(now_ns(), len, pure_ack)
                        {
                            held.push_back((id, frame.to_vec()));
                            held_bytes += len;
                        }
                    }
                    Received::Oversized => counters.io_errors += 1,
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
    stats.dropped_memory_frames = counters.dropped_memory_frames;
    stats.io_errors = counters.io_errors;
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

enum Received {
    Frame(usize),
    Oversized,
    Nothing,
    Failed,
}

fn receive_frame(fd: RawFd, buffer: &mut [u8]) -> Received {
    // SAFETY: buffer is valid for writes of its length. MSG_TRUNC makes the kernel return the
    // frame's real length so oversized frames are detected.
    let result = unsafe {
        libc::recv(
            fd,
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            libc::MSG_DONTWAIT | libc::MSG_TRUNC,
        )
    };
    if result < 0 {
        let error = io::Error::last_os_error();
        return match error.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Received::Nothing,
            _ => Received::Failed,
        };
    }
    let len = result as usize;
    if len > buffer.len() {
        Received::Oversized
    } else {
        Received::Frame(len)
    }
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
