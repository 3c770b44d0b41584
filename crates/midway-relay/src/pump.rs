//! The async side of the relay: one future per direction, polled in the caller's task, plus
//! the idle watchdog and cancellation around them.
//!
//! Readiness: tokio's `try_io` clears a socket's readiness when the closure returns
//! `WouldBlock`. splice(2) from a socket into a pipe also says EAGAIN when the *pipe* is full,
//! so the socket-to-pipe splice only goes through `try_io` while the pipe is empty; otherwise a
//! full pipe could clear the socket's readiness while data waits in it, and the edge-triggered
//! wake-up would never come.

use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::{RelayError, Side};
use crate::resources::{PipeLease, RelayResources};
use crate::spool::{SpoolFront, SpoolPlan, SpoolQueue};
use crate::{DirectionEnd, RelayCounters, RelayModel, RelayOptions, RelayReport};

/// Size of one read from the server in spool mode, and of one read back from the spool file.
const SPOOL_CHUNK: usize = 64 * 1024;
/// Smallest accepted buffer: below a page, syscalls per byte explode for no benefit.
const MIN_BUFFER_BYTES: usize = 4096;
const NOT_YET: u64 = u64::MAX;

/// Which way bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ClientToServer,
    ServerToClient,
}

/// Why a direction stopped early.
#[derive(Debug)]
struct PumpError {
    side: Side,
    operation: &'static str,
    /// Bytes had been read from one side and were not delivered.
    data_lost: bool,
    source: io::Error,
}

impl PumpError {
    fn new(side: Side, operation: &'static str, data_lost: bool, source: io::Error) -> Self {
        PumpError {
            side,
            operation,
            data_lost,
            source,
        }
    }

    /// A reset (or the broken pipe that follows one) is a normal way for a connection to end
    /// and is carried across rather than reported as an error.
    fn is_reset(&self) -> bool {
        self.side != Side::SpoolDisk
            && matches!(
                self.source.raw_os_error(),
                Some(libc::ECONNRESET | libc::EPIPE | libc::ECONNABORTED | libc::ENOTCONN)
            )
    }
}

/// State shared by the directions of one connection. Atomics (not Cells) because the relay
/// future must be `Send`.
struct Ctx<'a> {
    start: Instant,
    last_activity_ms: AtomicU64,
    remote_finished_ns: AtomicU64,
    client_to_server: AtomicU64,
    server_to_client: AtomicU64,
    /// Directions that have read their source's EOF and are done.
    directions_finished: AtomicU8,
    /// The last direction to finish left its FIN to the client socket's close.
    last_fin_to_client: AtomicBool,
    counters: &'a RelayCounters,
    resources: &'a Arc<RelayResources>,
}

impl Ctx<'_> {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_activity_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn delivered(&self, direction: Direction, bytes: usize) {
        let bytes = bytes as u64;
        match direction {
            Direction::ClientToServer => {
                self.client_to_server.fetch_add(bytes, Ordering::Relaxed);
                self.counters
                    .client_to_server
                    .fetch_add(bytes, Ordering::Relaxed);
            }
            Direction::ServerToClient => {
                self.server_to_client.fetch_add(bytes, Ordering::Relaxed);
                self.counters
                    .server_to_client
                    .fetch_add(bytes, Ordering::Relaxed);
            }
        }
        self.touch();
    }

    fn held(&self, direction: Direction, bytes: usize) {
        let bytes = bytes as u64;
        let gauge = match direction {
            Direction::ClientToServer => &self.counters.held_client_to_server,
            Direction::ServerToClient => &self.counters.held_server_to_client,
        };
        gauge.store(bytes, Ordering::Relaxed);
        self.counters.peak_held.fetch_max(bytes, Ordering::Relaxed);
    }

    /// Returns when no byte moved for `idle`.
    async fn idle_expired(&self, idle: Duration) {
        loop {
            let last = Duration::from_millis(self.last_activity_ms.load(Ordering::Relaxed));
            let deadline = self.start + last + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline.into()).await;
        }
    }
}

fn validate(model: &RelayModel) -> Result<(), RelayError> {
    let buffer = match model {
        RelayModel::Buffer(config) => config.buffer_bytes,
        RelayModel::Spool(config) => {
            if config.memory_bytes < MIN_BUFFER_BYTES {
                return Err(RelayError::InvalidConfig(
                    "spool memory_bytes must be at least 4096",
                ));
            }
            config.buffer_bytes
        }
    };
    if buffer < MIN_BUFFER_BYTES {
        return Err(RelayError::InvalidConfig(
            "relay buffer_bytes must be at least 4096",
        ));
    }
    Ok(())
}

/// How the select loop in [`run`] stopped.
enum Stop {
    BothDone,
    Cancelled,
    Idle,
    Failed(Direction, PumpError),
}

pub(crate) async fn run(
    client: TcpStream,
    server: TcpStream,
    model: &RelayModel,
    resources: &Arc<RelayResources>,
    options: RelayOptions,
    cancel: CancellationToken,
) -> Result<RelayReport, RelayError> {
    validate(model)?;
    let ctx = Ctx {
        start: Instant::now(),
        last_activity_ms: AtomicU64::new(0),
        remote_finished_ns: AtomicU64::new(NOT_YET),
        client_to_server: AtomicU64::new(0),
        server_to_client: AtomicU64::new(0),
        directions_finished: AtomicU8::new(0),
        last_fin_to_client: AtomicBool::new(false),
        counters: &options.counters,
        resources,
    };
    let spool = match model {
        RelayModel::Spool(config) => Some(SpoolShared::new(
            config.memory_bytes,
            config.max_spool_bytes,
            resources,
        )),
        RelayModel::Buffer(_) => None,
    };
    let mut c2s_end: Option<DirectionEnd> = None;
    let mut s2c_end: Option<DirectionEnd> = None;

    let stop = {
        let (buffer_bytes, use_splice) = match model {
            RelayModel::Buffer(config) => (config.buffer_bytes, config.splice),
            RelayModel::Spool(config) => (config.buffer_bytes, true),
        };
        let c2s = forward(
            &client,
            &server,
            Direction::ClientToServer,
            buffer_bytes,
            use_splice,
            &ctx,
        );
        let s2c = async {
            match &spool {
                Some(spool) => spool_server_to_client(&server, &client, spool, &ctx).await,
                None => {
                    forward(
                        &server,
                        &client,
                        Direction::ServerToClient,
                        buffer_bytes,
                        use_splice,
                        &ctx,
                    )
                    .await
                }
            }
        };
        let idle = async {
            match options.idle_timeout {
                Some(idle) => ctx.idle_expired(idle).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(c2s, s2c, idle);
        loop {
            tokio::select! {
                result = &mut c2s, if c2s_end.is_none() => match result {
                    Ok(()) => c2s_end = Some(DirectionEnd::Fin),
                    Err(e) => break Stop::Failed(Direction::ClientToServer, e),
                },
                result = &mut s2c, if s2c_end.is_none() => match result {
                    Ok(()) => s2c_end = Some(DirectionEnd::Fin),
                    Err(e) => break Stop::Failed(Direction::ServerToClient, e),
                },
                () = cancel.cancelled() => break Stop::Cancelled,
                () = &mut idle => break Stop::Idle,
            }
            if c2s_end.is_some() && s2c_end.is_some() {
                break Stop::BothDone;
            }
        }
    };
    // The direction futures are gone: leased pipes still holding bytes were closed, buffers freed.
    options
        .counters
        .held_client_to_server
        .store(0, Ordering::Relaxed);
    options
        .counters
        .held_server_to_client
        .store(0, Ordering::Relaxed);
    options.counters.spooled_now.store(0, Ordering::Relaxed);

    let unfinished = match &stop {
        Stop::BothDone => DirectionEnd::Fin,
        Stop::Cancelled => DirectionEnd::Cancelled,
        Stop::Idle => DirectionEnd::IdleTimeout,
        Stop::Failed(_, e) if e.is_reset() => DirectionEnd::ResetByPeer,
        Stop::Failed(..) => DirectionEnd::Error,
    };
    if let Stop::Failed(direction, e) = &stop {
        // Carry the abort across: closing with SO_LINGER {on, 0} sends a RST instead of a FIN,
        // so the peer learns the connection broke rather than ended.
        for stream in [&client, &server] {
            let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
        }
        let failed_end = if e.is_reset() {
            DirectionEnd::ResetByPeer
        } else {
            DirectionEnd::Error
        };
        match direction {
            Direction::ClientToServer => c2s_end = Some(failed_end),
            Direction::ServerToClient => s2c_end = Some(failed_end),
        }
    }
    if let Some(on_close) = &options.on_close {
        on_close(client.as_fd(), server.as_fd());
    }
    // After a clean end one of these closes also sends the last direction's FIN
    // (`finish_direction`). Close the other socket first, so that by the time the peer sees
    // that FIN both descriptors are gone.
    if ctx.last_fin_to_client.load(Ordering::Acquire) {
        drop(server);
        drop(client);
    } else {
        drop(client);
        drop(server);
    }

    let remote_ns = ctx.remote_finished_ns.load(Ordering::Relaxed);
    let report = RelayReport {
        client_to_server_bytes: ctx.client_to_server.load(Ordering::Relaxed),
        server_to_client_bytes: ctx.server_to_client.load(Ordering::Relaxed),
        client_to_server_end: c2s_end.unwrap_or(unfinished),
        server_to_client_end: s2c_end.unwrap_or(unfinished),
        peak_spool_bytes: spool.as_ref().map_or(0, SpoolShared::peak),
        remote_finished_at: (remote_ns != NOT_YET).then(|| Duration::from_nanos(remote_ns)),
    };
    match stop {
        Stop::Failed(_, e) if !e.is_reset() => {
            tracing::debug!(?report, "relay aborted by an I/O error");
            Err(RelayError::Io {
                side: e.side,
                operation: e.operation,
                data_lost: e.data_lost,
                source: e.source,
            })
        }
        _ => Ok(report),
    }
}

/// Bytes all busy directions together may move between two looks at epoll: at the 10 Gbit/s
/// a 2-core gateway relays, about 13 ms, well inside the 200 ms a sender waits before it
/// probes a closed window again.
const ROUND_BYTES: usize = 16 * 1024 * 1024;
/// Smallest turn, about one read of a socket whose buffer the memory guard capped: with a
/// thousand busy directions each yields after every read and write, as an event loop would
/// (a 64 KiB floor still left 1-10 % of the sockets waiting over 300 ms at 1000 streams).
const MIN_TURN_BYTES: usize = 16 * 1024;

/// Bytes one busy direction moves before it lets the others have their turn: the round shared
/// by the directions that are busy right now, so that one lone transfer is never interrupted
/// for nothing and a thousand busy ones all get served every round.
fn turn_bytes(busy_directions: usize) -> usize {
    (ROUND_BYTES / busy_directions.max(1)).clamp(MIN_TURN_BYTES, ROUND_BYTES)
}

/// Turn-taking between busy connections.
///
/// Why: on a fast path (veth, loopback, a LAN) a busy source never runs dry. Each read opens
/// the sender's window, the sender pushes more in the same softirq, and the next read finds
/// data again, so a direction never sees EAGAIN and never returns `Pending` by itself. tokio's
/// `consume_budget` then lets it run 128 iterations per poll (up to 32 MiB with 256 KiB pipes),
/// and the scheduler polls epoll only when its run queues are empty or every 61 task polls.
/// With 1000 busy connections that starved the rest: measured mid-run, 70 % of the proxy's
/// client-facing sockets held unread data and had received nothing for over 300 ms, their full
/// receive buffers dropping packets and their senders backing off on zero-window probes.
///
/// What: after its turn (see [`turn_bytes`]) the direction calls `yield_now`, which in tokio
/// defers the task until the worker has polled the I/O driver, so every socket that became
/// ready in the meantime is served before the busy one continues (like an event loop that
/// handles each ready descriptor once per `epoll_wait`). A yield is not free (measured at one
/// stream, yielding every 1 MiB cost about a fifth of the throughput), hence turns that
/// shrink only as more directions are busy. In between, `consume_budget` still keeps a
/// direction that moves few bytes per call from running forever.
#[derive(Debug, Default)]
struct FairTurn {
    moved: usize,
}

impl FairTurn {
    /// Counts bytes moved in this turn.
    fn moved(&mut self, bytes: usize) {
        self.moved = self.moved.saturating_add(bytes);
    }

    /// True when the turn is used up (and starts the next one).
    fn is_over(&mut self, busy_directions: usize) -> bool {
        if self.moved >= turn_bytes(busy_directions) {
            self.moved = 0;
            true
        } else {
            false
        }
    }

    /// Called between two iterations of a busy loop.
    async fn pause(&mut self, resources: &RelayResources) {
        if self.is_over(resources.busy_directions()) {
            tokio::task::yield_now().await;
        } else {
            tokio::task::consume_budget().await;
        }
    }
}

fn side_of(direction: Direction) -> (Side, Side) {
    match direction {
        Direction::ClientToServer => (Side::Client, Side::Server),
        Direction::ServerToClient => (Side::Server, Side::Client),
    }
}

/// Carries the FIN across once a direction has delivered everything up to its source's EOF.
///
/// The first direction to finish sends it with `shutdown(SHUT_WR)` (half-close: the other
/// direction keeps flowing). The last one leaves it to the `close` that follows at once in
/// [`run`]: both sockets have then read their peer's FIN and hold nothing unread, so `close`
/// sends exactly that FIN, and the peer sees the end only after the relay has let go of both
/// sockets (it can count on the descriptors being free, and one syscall is saved).
fn finish_direction(dst: &TcpStream, dst_side: Side, ctx: &Ctx<'_>) -> Result<(), PumpError> {
    let finished_before = ctx.directions_finished.fetch_add(1, Ordering::AcqRel);
    if finished_before >= 1 {
        ctx.last_fin_to_client
            .store(dst_side == Side::Client, Ordering::Release);
        return Ok(());
    }
    SockRef::from(dst)
        .shutdown(Shutdown::Write)
        .map_err(|e| PumpError::new(dst_side, "sending FIN", false, e))
}

/// A user-space copy buffer, allocated only while data flows, counted in the resources.
struct CopyBuffer<'a> {
    data: Box<[u8]>,
    start: usize,
    end: usize,
    resources: &'a RelayResources,
}

impl<'a> CopyBuffer<'a> {
    fn new(capacity: usize, resources: &'a RelayResources) -> Self {
        resources.buffer_allocated(capacity);
        resources.copy_buffer_taken();
        CopyBuffer {
            data: vec![0; capacity].into_boxed_slice(),
            start: 0,
            end: 0,
            resources,
        }
    }

    fn len(&self) -> usize {
        self.end - self.start
    }

    fn room(&mut self) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.data.len() && self.start > 0 {
            self.data.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.data[self.end..]
    }
}

impl Drop for CopyBuffer<'_> {
    fn drop(&mut self) {
        self.resources.buffer_freed(self.data.len());
        self.resources.copy_buffer_returned();
    }
}

/// The in-flight storage of one direction: a leased pipe or a copy buffer.
enum Carrier<'a> {
    Pipe(PipeLease),
    Copy(CopyBuffer<'a>),
}

impl Carrier<'_> {
    /// What this carrier may hold: the configured cap, or less if the kernel kept the pipe
    /// smaller than asked.
    fn capacity(&self, configured: usize) -> usize {
        match self {
            Carrier::Pipe(lease) => lease.pipe().capacity().min(configured),
            Carrier::Copy(_) => configured,
        }
    }

    fn held(&self) -> usize {
        match self {
            Carrier::Pipe(lease) => lease.in_pipe,
            Carrier::Copy(buffer) => buffer.len(),
        }
    }
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: both fds are open for the duration of the call (borrowed from live owners);
    // null offsets mean "current position", which is what sockets and pipes require.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MOVE,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

enum Fill {
    Read(usize),
    Eof,
    Blocked,
}

/// Moves bytes from `src` into the carrier without exceeding its capacity.
fn try_fill(src: &TcpStream, carrier: &mut Carrier<'_>, capacity: usize) -> io::Result<Fill> {
    let result = match carrier {
        Carrier::Pipe(lease) => {
            let room = lease.pipe().capacity().min(capacity) - lease.in_pipe;
            let to = lease.pipe().write_fd();
            let from = src.as_raw_fd();
            if lease.in_pipe == 0 {
                src.try_io(Interest::READABLE, || splice(from, to, room))
            } else {
                // See the module docs: EAGAIN here may mean "pipe full", so leave readiness alone.
                splice(from, to, room)
            }
            .inspect(|&n| {
                lease.in_pipe += n;
            })
        }
        Carrier::Copy(buffer) => {
            let room = buffer.room();
            let room_len = room.len().min(capacity);
            src.try_read(&mut room[..room_len]).inspect(|&n| {
                buffer.end += n;
            })
        }
    };
    match result {
        Ok(0) => Ok(Fill::Eof),
        Ok(n) => Ok(Fill::Read(n)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Fill::Blocked),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Fill::Read(0)),
        Err(e) => Err(e),
    }
}

/// Moves bytes from the carrier to `dst`; Ok(None) when `dst` cannot take more now.
fn try_drain(dst: &TcpStream, carrier: &mut Carrier<'_>) -> io::Result<Option<usize>> {
    let result = match carrier {
        Carrier::Pipe(lease) => {
            let from = lease.pipe().read_fd();
            let to = dst.as_raw_fd();
            let len = lease.in_pipe;
            dst.try_io(Interest::WRITABLE, || splice(from, to, len))
                .inspect(|&n| {
                    lease.in_pipe -= n;
                })
        }
        Carrier::Copy(buffer) => dst
            .try_write(&buffer.data[buffer.start..buffer.end])
            .inspect(|&n| {
                buffer.start += n;
            }),
    };
    match result {
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Some(0)),
        Err(e) => Err(e),
    }
}

/// Returns the pending socket error (SO_ERROR, e.g. ECONNRESET after a RST) as a pump error;
/// without one, clears the ERROR readiness so the caller does not wake again for nothing.
fn check_socket_error(stream: &TcpStream, side: Side) -> Result<(), PumpError> {
    match stream.take_error() {
        Ok(Some(e)) | Err(e) => Err(PumpError::new(side, "reading", true, e)),
        Ok(None) => {
            let _ = stream.try_io(Interest::ERROR, || {
                Err::<(), _>(io::Error::from(io::ErrorKind::WouldBlock))
            });
            Ok(())
        }
    }
}

/// Buffer-and-forward for one direction: holds at most `capacity` bytes, carries EOF as a FIN.
async fn forward(
    src: &TcpStream,
    dst: &TcpStream,
    direction: Direction,
    capacity: usize,
    use_splice: bool,
    ctx: &Ctx<'_>,
) -> Result<(), PumpError> {
    let (src_side, dst_side) = side_of(direction);
    let mut carrier: Option<Carrier<'_>> = None;
    let mut eof = false;
    // The last read found the source empty (EAGAIN). Until then a drained carrier is kept and
    // the next read tried at once: a busy direction keeps its pipe (or buffer) instead of
    // handing it back and taking it again for every chunk, and waits for readiness only when
    // the kernel said there is nothing to read.
    let mut source_empty = true;
    let mut turn = FairTurn::default();
    loop {
        let held = carrier.as_ref().map_or(0, Carrier::held);
        ctx.held(direction, held);
        if held == 0 && eof {
            drop(carrier.take());
            return finish_direction(dst, dst_side, ctx);
        }
        if held == 0 && (source_empty || carrier.is_none()) {
            // Drained and nothing to read: give the pipe back / free the buffer before
            // waiting, so an idle direction holds nothing.
            drop(carrier.take());
            src.readable()
                .await
                .map_err(|e| PumpError::new(src_side, "waiting to read", false, e))?;
            let lease = if use_splice {
                ctx.resources.take_pipe(capacity)
            } else {
                None
            };
            carrier = Some(match lease {
                Some(lease) => Carrier::Pipe(lease),
                None => Carrier::Copy(CopyBuffer::new(capacity, ctx.resources)),
            });
        }
        let Some(active) = carrier.as_mut() else {
            continue;
        };
        // Fill.
        let carrier_capacity = active.capacity(capacity);
        let mut read_blocked = eof || active.held() >= carrier_capacity;
        if !read_blocked {
            match try_fill(src, active, capacity) {
                Ok(Fill::Read(n)) => {
                    source_empty = false;
                    if n > 0 {
                        ctx.touch();
                    }
                }
                Ok(Fill::Eof) => eof = true,
                Ok(Fill::Blocked) => {
                    source_empty = true;
                    read_blocked = true;
                }
                Err(e) => return Err(PumpError::new(src_side, "reading", active.held() > 0, e)),
            }
        }
        // Drain.
        let mut write_blocked = true;
        if active.held() > 0 {
            match try_drain(dst, active) {
                Ok(Some(n)) => {
                    write_blocked = false;
                    turn.moved(n);
                    ctx.delivered(direction, n);
                }
                Ok(None) => {}
                Err(e) => return Err(PumpError::new(dst_side, "writing", true, e)),
            }
        }
        let held = active.held();
        ctx.held(direction, held);
        if held > 0 && read_blocked && write_blocked {
            // Only a pipe that is empty reports "socket empty" reliably; with bytes in the pipe
            // wait for the destination alone (its progress lets us retry the read).
            let wait_for_read = !eof && held < capacity && matches!(active, Carrier::Copy(_));
            tokio::select! {
                result = src.readable(), if wait_for_read => result
                    .map_err(|e| PumpError::new(src_side, "waiting to read", true, e))?,
                result = dst.writable() => result
                    .map_err(|e| PumpError::new(dst_side, "waiting to write", true, e))?,
                // A reset from the source while we cannot read it (destination stalled) must
                // still reach the destination, not wait until the destination drains.
                result = src.ready(Interest::ERROR), if !eof => {
                    result.map_err(|e| PumpError::new(src_side, "waiting to read", true, e))?;
                    check_socket_error(src, src_side)?;
                }
            }
        } else {
            turn.pause(ctx.resources).await;
        }
    }
}

/// The spool file of one connection: anonymous (O_TMPFILE), so nothing survives a crash, and
/// its disk bytes are released from the global budget when it closes.
struct SpoolFile {
    file: std::fs::File,
    reserved: AtomicU64,
    resources: Arc<RelayResources>,
}

impl SpoolFile {
    fn create(resources: &Arc<RelayResources>) -> io::Result<SpoolFile> {
        let file = create_anonymous_file(resources.spool_dir())?;
        resources.spool_file_opened();
        Ok(SpoolFile {
            file,
            reserved: AtomicU64::new(0),
            resources: Arc::clone(resources),
        })
    }

    fn reserve(&self, bytes: u64) -> bool {
        let ok = self.resources.try_reserve_spool(bytes);
        if ok {
            self.reserved.fetch_add(bytes, Ordering::Relaxed);
        }
        ok
    }

    fn release(&self, bytes: u64) {
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
        self.resources.release_spool(bytes);
    }

    /// Frees the disk blocks of a region already read back (best effort: on file systems
    /// without hole punching the blocks are freed when the file next drains and is truncated).
    fn punch(&self, offset: u64, len: u64) {
        // SAFETY: fallocate on a regular file we own, with in-range arguments.
        unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            );
        }
    }
}

/// O_TMPFILE: the file has no name, so a crash cannot leave it behind. File systems without
/// O_TMPFILE get a `midway-spool-` file that is unlinked at once; only a crash in between can
/// leave it, and [`crate::clean_spool_dir`] removes it at the next start.
fn create_anonymous_file(dir: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let anonymous = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir);
    match anonymous {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            let named = tempfile::Builder::new()
                .prefix(crate::SPOOL_FILE_PREFIX)
                .tempfile_in(dir)?;
            // into_file() unlinks the path and keeps the open file.
            Ok(named.into_file())
        }
        other => other,
    }
}

impl Drop for SpoolFile {
    fn drop(&mut self) {
        self.resources
            .release_spool(self.reserved.load(Ordering::Relaxed));
        self.resources.spool_file_closed();
    }
}

/// State shared by the spool's reader (server side) and writer (client side).
struct SpoolShared {
    resources: Arc<RelayResources>,
    state: Mutex<SpoolState>,
    /// Wakes the writer: data queued or the server finished.
    data_ready: Notify,
    /// Wakes the reader: the writer freed room.
    room_freed: Notify,
}

struct SpoolState {
    queue: SpoolQueue,
    file: Option<Arc<SpoolFile>>,
    server_done: bool,
    disk_error_logged: bool,
    /// Queue memory last reported to `RelayResources::user_buffer_bytes`.
    memory_reported: usize,
}

impl SpoolState {
    /// Brings the process-wide memory gauge and the connection's spool gauge up to date.
    fn publish(&mut self, resources: &RelayResources, counters: &RelayCounters) {
        let now = self.queue.memory_used();
        if now > self.memory_reported {
            resources.buffer_allocated(now - self.memory_reported);
        } else {
            resources.buffer_freed(self.memory_reported - now);
        }
        self.memory_reported = now;
        counters
            .spooled_now
            .store(self.queue.held(), Ordering::Relaxed);
    }
}

impl SpoolShared {
    fn new(memory_bytes: usize, max_spool_bytes: u64, resources: &Arc<RelayResources>) -> Self {
        SpoolShared {
            resources: Arc::clone(resources),
            state: Mutex::new(SpoolState {
                queue: SpoolQueue::new(memory_bytes, max_spool_bytes),
                file: None,
                server_done: false,
                disk_error_logged: false,
                memory_reported: 0,
            }),
            data_ready: Notify::new(),
            room_freed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SpoolState> {
        // A poisoned lock means a panic elsewhere in this connection; the data is still
        // consistent enough to finish or abort, so keep going.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn peak(&self) -> u64 {
        self.lock().queue.peak_held()
    }
}

impl Drop for SpoolShared {
    fn drop(&mut self) {
        let reported = self.lock().memory_reported;
        self.resources.buffer_freed(reported);
    }
}

fn global_disk_room(resources: &RelayResources) -> u64 {
    resources
        .max_total_spool_bytes()
        .saturating_sub(resources.spool_bytes_in_use())
}

async fn spool_server_to_client(
    server: &TcpStream,
    client: &TcpStream,
    spool: &SpoolShared,
    ctx: &Ctx<'_>,
) -> Result<(), PumpError> {
    let reader = spool_reader(server, client, spool, ctx);
    let writer = spool_writer(client, spool, ctx);
    tokio::try_join!(reader, writer).map(|_| ())
}

/// Drains the server as fast as it sends, whatever the client does, until a cap is reached.
async fn spool_reader(
    server: &TcpStream,
    client: &TcpStream,
    spool: &SpoolShared,
    ctx: &Ctx<'_>,
) -> Result<(), PumpError> {
    let resources = ctx.resources;
    let mut read_buffer: Option<CopyBuffer<'_>> = None;
    let mut turn = FairTurn::default();
    loop {
        let allowance = spool
            .lock()
            .queue
            .read_allowance(global_disk_room(resources), SPOOL_CHUNK);
        if allowance == 0 {
            read_buffer = None;
            // Caps reached: stop reading, but still notice a reset from the server.
            tokio::select! {
                () = spool.room_freed.notified() => {}
                result = server.ready(Interest::ERROR) => {
                    result.map_err(|e| PumpError::new(Side::Server, "waiting to read", false, e))?;
                    check_socket_error(server, Side::Server)?;
                }
            }
            continue;
        }
        if read_buffer.is_none() {
            server
                .readable()
                .await
                .map_err(|e| PumpError::new(Side::Server, "waiting to read", false, e))?;
            read_buffer = Some(CopyBuffer::new(SPOOL_CHUNK, resources));
        }
        let Some(buffer) = read_buffer.as_mut() else {
            continue;
        };
        let chunk = &mut buffer.data[..allowance];
        let n = match server.try_read(chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Nothing to read: free the buffer while waiting (idle connections hold none).
                read_buffer = None;
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(PumpError::new(Side::Server, "reading", false, e)),
        };
        ctx.touch();
        let mut data = &buffer.data[..n];
        // Cut-through: when nothing is queued or in flight, a client that keeps up gets the
        // bytes at once (order is safe: all earlier bytes are delivered), and only what it
        // cannot take now is spooled. Saves a copy and the disk round trip in the common case.
        if spool.lock().queue.held() == 0 {
            match client.try_write(data) {
                Ok(written) => {
                    ctx.delivered(Direction::ServerToClient, written);
                    data = &data[written..];
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(PumpError::new(Side::Client, "writing", true, e)),
            }
        }
        if !data.is_empty() {
            store_chunk(data, spool, ctx);
            spool.data_ready.notify_one();
        }
        turn.moved(n);
        turn.pause(ctx.resources).await;
    }
    drop(read_buffer);
    let finished = ctx.start.elapsed().as_nanos() as u64;
    ctx.remote_finished_ns.store(finished, Ordering::Relaxed);
    ctx.counters.remote_finished.store(true, Ordering::Relaxed);
    // The server sent FIN and everything it sent is ours: its read side is done.
    let _ = SockRef::from(server).shutdown(Shutdown::Read);
    spool.lock().server_done = true;
    spool.data_ready.notify_one();
    Ok(())
}

/// Puts one chunk in memory or the spool file. A disk that fails (ENOSPC, EIO) is never used
/// again for this connection; the chunk stays in memory, so nothing is lost.
fn store_chunk(chunk: &[u8], spool: &SpoolShared, ctx: &Ctx<'_>) {
    let resources = ctx.resources;
    let mut state = spool.lock();
    let plan = state.queue.plan(chunk.len(), global_disk_room(resources));
    let stored_on_disk = match plan {
        SpoolPlan::Memory => false,
        SpoolPlan::File { offset } => match write_to_spool_file(&mut state, chunk, offset, ctx) {
            Ok(true) => true,
            Ok(false) => false,
            Err(e) => {
                state.queue.disable_disk();
                if !state.disk_error_logged {
                    state.disk_error_logged = true;
                    tracing::warn!(error = %e, "spool disk failed; this connection continues with memory only");
                }
                false
            }
        },
    };
    if stored_on_disk {
        state.queue.push_file(chunk.len() as u64);
    } else {
        state.queue.push_memory(Bytes::copy_from_slice(chunk));
    }
    state.publish(resources, ctx.counters);
}

/// Ok(false): the global budget was taken by another connection meanwhile (keep in memory).
fn write_to_spool_file(
    state: &mut SpoolState,
    chunk: &[u8],
    offset: u64,
    ctx: &Ctx<'_>,
) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let file = match &state.file {
        Some(file) => Arc::clone(file),
        None => {
            let file = Arc::new(SpoolFile::create(ctx.resources)?);
            state.file = Some(Arc::clone(&file));
            file
        }
    };
    let len = chunk.len() as u64;
    if !file.reserve(len) {
        return Ok(false);
    }
    // Page-cache writes are short; doing them inline avoids a thread hop per chunk.
    if let Err(e) = file.file.write_all_at(chunk, offset) {
        file.release(len);
        return Err(e);
    }
    Ok(true)
}

/// Sends the spooled bytes to the client in order, at the client's pace.
async fn spool_writer(
    client: &TcpStream,
    spool: &SpoolShared,
    ctx: &Ctx<'_>,
) -> Result<(), PumpError> {
    let mut turn = FairTurn::default();
    loop {
        enum Next {
            Send(SpoolFront, Option<Arc<SpoolFile>>),
            Finished,
            Wait,
        }
        let next = {
            let mut state = spool.lock();
            match state.queue.front() {
                Some(front) => Next::Send(front, state.file.clone()),
                None if state.server_done => Next::Finished,
                None => Next::Wait,
            }
        };
        let (front, file) = match next {
            Next::Send(front, file) => (front, file),
            Next::Finished => return finish_direction(client, Side::Client, ctx),
            Next::Wait => {
                spool.data_ready.notified().await;
                continue;
            }
        };
        let mut chunk = match front {
            SpoolFront::Memory(chunk) => chunk,
            SpoolFront::File { offset, len } => read_back(spool, file, offset, len, ctx.counters)?,
        };
        while !chunk.is_empty() {
            let written = match client.try_write(&chunk) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    client
                        .writable()
                        .await
                        .map_err(|e| PumpError::new(Side::Client, "waiting to write", true, e))?;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(PumpError::new(Side::Client, "writing", true, e)),
            };
            let _ = chunk.split_to(written);
            {
                let mut state = spool.lock();
                state.queue.delivered(written);
                state.publish(ctx.resources, ctx.counters);
            }
            ctx.delivered(Direction::ServerToClient, written);
            spool.room_freed.notify_one();
            turn.moved(written);
            turn.pause(ctx.resources).await;
        }
    }
}

/// Reads the next region of the spool file back into memory.
fn read_back(
    spool: &SpoolShared,
    file: Option<Arc<SpoolFile>>,
    offset: u64,
    len: u64,
    counters: &RelayCounters,
) -> Result<Bytes, PumpError> {
    use std::os::unix::fs::FileExt;
    let lost = |e| PumpError::new(Side::SpoolDisk, "reading the spool file", true, e);
    let file = file.ok_or_else(|| lost(io::Error::other("spool file missing")))?;
    let take = len.min(SPOOL_CHUNK as u64);
    let mut buffer = vec![0; take as usize];
    file.file.read_exact_at(&mut buffer, offset).map_err(lost)?;
    let drained = {
        let mut state = spool.lock();
        let drained = state.queue.file_read_back(take);
        state.publish(&spool.resources, counters);
        drained
    };
    file.release(take);
    if drained {
        // Nothing live is left: free every block and restart at offset 0.
        file.file.set_len(0).map_err(lost)?;
    } else {
        file.punch(offset, take);
    }
    Ok(Bytes::from(buffer))
}

#[cfg(test)]
mod tests {
    use super::{turn_bytes, FairTurn, MIN_TURN_BYTES, ROUND_BYTES};

    #[test]
    fn a_lone_transfer_gets_the_whole_round_and_many_share_it() {
        assert_eq!(turn_bytes(0), ROUND_BYTES);
        assert_eq!(turn_bytes(1), ROUND_BYTES);
        assert_eq!(turn_bytes(4), ROUND_BYTES / 4);
        assert_eq!(turn_bytes(2000), MIN_TURN_BYTES);
        assert!(turn_bytes(100) < turn_bytes(10));
    }

    #[test]
    fn a_turn_ends_after_its_bytes_and_the_next_starts_empty() {
        let busy = 8;
        let mut turn = FairTurn::default();
        turn.moved(turn_bytes(busy) - 1);
        assert!(!turn.is_over(busy));
        turn.moved(1);
        assert!(turn.is_over(busy));
        // The next turn starts from zero, whatever the last chunk overshot.
        assert!(!turn.is_over(busy));
    }

    #[test]
    fn more_busy_directions_end_a_turn_sooner() {
        let mut turn = FairTurn::default();
        turn.moved(MIN_TURN_BYTES);
        assert!(!turn.is_over(1));
        assert!(turn.is_over(10_000));
    }

    #[test]
    fn counting_never_overflows() {
        let mut turn = FairTurn::default();
        turn.moved(usize::MAX);
        turn.moved(usize::MAX);
        assert!(turn.is_over(1));
    }
}
