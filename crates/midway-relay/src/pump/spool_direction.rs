//! The server-to-client direction in spool mode: a reader drains the server as fast as it
//! sends (cut-through to the client when it keeps up, else into memory or the spool file up to
//! the caps), and a writer sends the queued bytes to the client at its pace. Both run in the
//! direction's future and share the queue under a lock.

use std::io;
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use super::carrier::CopyBuffer;
use super::fair::FairTurn;
use super::spool_file::SpoolFile;
use super::{check_socket_error, finish_direction, Ctx, Direction, PumpError};
use crate::error::Side;
use crate::resources::RelayResources;
use crate::spool::{SpoolFront, SpoolPlan, SpoolQueue};
use crate::RelayCounters;

/// Size of one read from the server in spool mode, and of one read back from the spool file.
const SPOOL_CHUNK: usize = 64 * 1024;

/// State shared by the spool's reader (server side) and writer (client side).
pub(super) struct SpoolShared {
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
    pub(super) fn new(
        memory_bytes: usize,
        max_spool_bytes: u64,
        resources: &Arc<RelayResources>,
    ) -> Self {
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

    pub(super) fn peak(&self) -> u64 {
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

pub(super) async fn spool_server_to_client(
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
        let granted = if spool.lock().queue.held() == 0 {
            ctx.to_client.grant(data.len())
        } else {
            0
        };
        if granted > 0 {
            let written = client.try_write(&data[..granted]);
            ctx.to_client
                .settle(granted, *written.as_ref().unwrap_or(&0));
            match written {
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
            // Toward the client only as far as a shared window grants.
            let granted = ctx.to_client.grant(chunk.len());
            if granted == 0 {
                ctx.to_client.opened().await;
                continue;
            }
            let written = client.try_write(&chunk[..granted]);
            ctx.to_client
                .settle(granted, *written.as_ref().unwrap_or(&0));
            let written = match written {
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
