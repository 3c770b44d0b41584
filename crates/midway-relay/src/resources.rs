//! Resources shared by every connection of a process: the global spool-disk budget, the spool
//! directory, and the bounded pool of splice pipes.
//!
//! Pipes are not held per connection: a direction takes one when data is readable and gives it
//! back as soon as it has drained, so 8,000 idle connections hold no pipe (and no extra fd).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::RelayError;

/// Prefix of every file name midway itself puts in a spool directory. Spool files are normally
/// anonymous (O_TMPFILE), so only a fallback path ever creates named files.
pub const SPOOL_FILE_PREFIX: &str = "midway-spool-";

/// Shared by all connections of a process: global disk cap, spool dir, pipe pool, bytes in use.
#[derive(Debug)]
pub struct RelayResources {
    spool_dir: PathBuf,
    max_total_spool_bytes: u64,
    spool_bytes_in_use: AtomicU64,
    spool_files_open: AtomicU64,
    user_buffer_bytes: AtomicU64,
    copy_buffers_in_use: AtomicUsize,
    splice_fallbacks: AtomicU64,
    pipes: PipePool,
}

impl RelayResources {
    /// Creates the spool directory if needed. `max_pipes` bounds the splice pipe pool (each pipe
    /// costs two fds); 0 disables splice everywhere.
    pub fn new(
        spool_dir: PathBuf,
        max_total_spool_bytes: u64,
        max_pipes: usize,
    ) -> Result<Arc<Self>, RelayError> {
        std::fs::create_dir_all(&spool_dir).map_err(|source| RelayError::SpoolDir {
            path: spool_dir.clone(),
            source,
        })?;
        Ok(Arc::new(RelayResources {
            spool_dir,
            max_total_spool_bytes,
            spool_bytes_in_use: AtomicU64::new(0),
            spool_files_open: AtomicU64::new(0),
            user_buffer_bytes: AtomicU64::new(0),
            copy_buffers_in_use: AtomicUsize::new(0),
            splice_fallbacks: AtomicU64::new(0),
            pipes: PipePool::new(max_pipes),
        }))
    }

    /// Where spool files are created.
    pub fn spool_dir(&self) -> &Path {
        &self.spool_dir
    }

    /// Bytes all connections currently hold in spool files on disk.
    pub fn spool_bytes_in_use(&self) -> u64 {
        self.spool_bytes_in_use.load(Ordering::Relaxed)
    }

    /// Spool files currently open (each is one fd).
    pub fn spool_files_open(&self) -> u64 {
        self.spool_files_open.load(Ordering::Relaxed)
    }

    /// Pipes currently lent to connections (not counting idle pipes kept in the pool).
    pub fn pipes_in_use(&self) -> usize {
        self.pipes.in_use.load(Ordering::Relaxed)
    }

    /// Directions of all connections that are moving bytes right now: each holds a pipe or a
    /// copy buffer exactly while it is busy (idle directions give theirs back).
    pub fn busy_directions(&self) -> usize {
        self.pipes_in_use() + self.copy_buffers_in_use.load(Ordering::Relaxed)
    }

    /// Pipes that exist right now, lent or idle in the pool (two fds each).
    pub fn pipes_open(&self) -> usize {
        self.pipes.state.lock().map(|s| s.created).unwrap_or(0)
    }

    /// User-space relay memory allocated right now by all connections (copy buffers and the
    /// spool's memory queue). Idle connections allocate none.
    pub fn user_buffer_bytes(&self) -> u64 {
        self.user_buffer_bytes.load(Ordering::Relaxed)
    }

    /// How often a direction wanted a pipe, found the pool empty, and copied instead.
    pub fn splice_fallbacks(&self) -> u64 {
        self.splice_fallbacks.load(Ordering::Relaxed)
    }

    pub(crate) fn max_total_spool_bytes(&self) -> u64 {
        self.max_total_spool_bytes
    }

    /// Reserves `bytes` of the global disk budget; false (and nothing reserved) if it would
    /// exceed the cap.
    pub(crate) fn try_reserve_spool(&self, bytes: u64) -> bool {
        let cap = self.max_total_spool_bytes;
        self.spool_bytes_in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= cap)
            })
            .is_ok()
    }

    pub(crate) fn release_spool(&self, bytes: u64) {
        self.spool_bytes_in_use.fetch_sub(bytes, Ordering::AcqRel);
    }

    pub(crate) fn spool_file_opened(&self) {
        self.spool_files_open.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn spool_file_closed(&self) {
        self.spool_files_open.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn buffer_allocated(&self, bytes: usize) {
        self.user_buffer_bytes
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn buffer_freed(&self, bytes: usize) {
        self.user_buffer_bytes
            .fetch_sub(bytes as u64, Ordering::Relaxed);
    }

    /// A direction took a copy buffer (it is busy until [`Self::copy_buffer_returned`]).
    pub(crate) fn copy_buffer_taken(&self) {
        self.copy_buffers_in_use.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn copy_buffer_returned(&self) {
        self.copy_buffers_in_use.fetch_sub(1, Ordering::Relaxed);
    }

    /// Closes the pipes that have sat idle in the pool for `max_idle` or longer at `now`;
    /// returns how many. A burst leaves up to `max_pipes` pipes (two fds each) behind, which
    /// would otherwise stay open for the life of the process. The pool hands out the most
    /// recently returned pipe first, so under steady load the same few stay warm and only the
    /// burst's surplus ages out. The caller supplies the clock (the proxy calls this
    /// periodically).
    pub fn close_idle_pipes(&self, now: Instant, max_idle: Duration) -> usize {
        self.pipes.close_idle(now, max_idle)
    }

    /// Lends an empty pipe sized (when the kernel allows) to `capacity` bytes, or None when the
    /// pool is exhausted or pipes cannot be created; the caller then copies through user space.
    pub(crate) fn take_pipe(self: &Arc<Self>, capacity: usize) -> Option<PipeLease> {
        let Some(mut pipe) = self.pipes.take() else {
            self.splice_fallbacks.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        pipe.resize(capacity);
        self.pipes.in_use.fetch_add(1, Ordering::Relaxed);
        Some(PipeLease {
            pipe: Some(pipe),
            in_pipe: 0,
            resources: Arc::clone(self),
        })
    }
}

/// Remove spool files a crashed midway left in `dir` (only files named with
/// [`SPOOL_FILE_PREFIX`]); returns how many were removed. A missing directory counts as clean.
pub fn clean_spool_dir(dir: &Path) -> std::io::Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let is_ours = name
            .to_str()
            .is_some_and(|n| n.starts_with(SPOOL_FILE_PREFIX));
        if is_ours && entry.file_type()?.is_file() {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                // Another process cleaned it first: fine.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}

/// One kernel pipe used as the in-kernel buffer between two splice(2) calls.
#[derive(Debug)]
pub(crate) struct Pipe {
    read_end: OwnedFd,
    write_end: OwnedFd,
    capacity: usize,
}

impl Pipe {
    fn create() -> std::io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut pipe = Pipe {
            read_end,
            write_end,
            capacity: 0,
        };
        pipe.capacity = pipe.query_capacity();
        Ok(pipe)
    }

    fn query_capacity(&self) -> usize {
        // SAFETY: plain fcntl on a pipe fd we own.
        let size = unsafe { libc::fcntl(self.write_end.as_raw_fd(), libc::F_GETPIPE_SZ) };
        usize::try_from(size).unwrap_or(0)
    }

    /// Asks for `capacity` bytes; the kernel rounds up to pages and may refuse sizes above
    /// /proc/sys/fs/pipe-max-size for unprivileged users, in which case the old size stays.
    fn resize(&mut self, capacity: usize) {
        if capacity == self.capacity {
            return;
        }
        let wanted = libc::c_int::try_from(capacity).unwrap_or(libc::c_int::MAX);
        // SAFETY: plain fcntl on a pipe fd we own; the pipe is empty here.
        unsafe { libc::fcntl(self.write_end.as_raw_fd(), libc::F_SETPIPE_SZ, wanted) };
        self.capacity = self.query_capacity();
    }

    pub(crate) fn read_fd(&self) -> RawFd {
        self.read_end.as_raw_fd()
    }

    pub(crate) fn write_fd(&self) -> RawFd {
        self.write_end.as_raw_fd()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

#[derive(Debug)]
struct PipePool {
    max_pipes: usize,
    in_use: AtomicUsize,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    /// Idle pipes with the time each was given back, oldest first.
    idle: Vec<(Pipe, Instant)>,
    created: usize,
}

impl PipePool {
    fn new(max_pipes: usize) -> Self {
        PipePool {
            max_pipes,
            in_use: AtomicUsize::new(0),
            state: Mutex::new(PoolState::default()),
        }
    }

    fn take(&self) -> Option<Pipe> {
        let mut state = self.state.lock().ok()?;
        if let Some((pipe, _)) = state.idle.pop() {
            return Some(pipe);
        }
        if state.created >= self.max_pipes {
            return None;
        }
        // Out of fds (EMFILE) or pipe memory: fall back to copying rather than failing.
        let pipe = Pipe::create().ok()?;
        state.created += 1;
        Some(pipe)
    }

    fn give_back(&self, pipe: Pipe) {
        if let Ok(mut state) = self.state.lock() {
            state.idle.push((pipe, Instant::now()));
        }
    }

    fn close_idle(&self, now: Instant, max_idle: Duration) -> usize {
        let Ok(mut state) = self.state.lock() else {
            return 0;
        };
        // Oldest first: the pipes to close are a prefix.
        let stale = state
            .idle
            .iter()
            .take_while(|(_, since)| now.saturating_duration_since(*since) >= max_idle)
            .count();
        state.idle.drain(..stale);
        state.created -= stale;
        stale
    }

    fn discard(&self, pipe: Pipe) {
        drop(pipe);
        if let Ok(mut state) = self.state.lock() {
            state.created -= 1;
        }
    }
}

/// A pipe lent to one direction. It returns to the pool on drop only if empty; a pipe still
/// holding bytes (connection aborted mid-flight) is closed instead, so no stale bytes can ever
/// reach another connection.
#[derive(Debug)]
pub(crate) struct PipeLease {
    pipe: Option<Pipe>,
    /// Bytes spliced into the pipe and not yet spliced out.
    pub(crate) in_pipe: usize,
    resources: Arc<RelayResources>,
}

impl PipeLease {
    #[allow(
        clippy::expect_used,
        reason = "`pipe` is Some from lease on; only `drop` takes it"
    )]
    pub(crate) fn pipe(&self) -> &Pipe {
        self.pipe.as_ref().expect("pipe present until drop")
    }
}

impl Drop for PipeLease {
    fn drop(&mut self) {
        if let Some(pipe) = self.pipe.take() {
            self.resources.pipes.in_use.fetch_sub(1, Ordering::Relaxed);
            if self.in_pipe == 0 {
                self.resources.pipes.give_back(pipe);
            } else {
                self.resources.pipes.discard(pipe);
            }
        }
    }
}
