//! The in-flight storage of one direction and the two moves on it: a pipe leased from the pool
//! and filled and drained with splice(2), or a user-space copy buffer filled with read and
//! drained with write. One [`Carrier`] type, so the forward loop is written once for both.
//!
//! Readiness: tokio's `try_io` clears a socket's readiness when the closure returns
//! `WouldBlock`. splice(2) from a socket into a pipe also says EAGAIN when the *pipe* is full,
//! so the socket-to-pipe splice only goes through `try_io` while the pipe is empty; otherwise a
//! full pipe could clear the socket's readiness while data waits in it, and the edge-triggered
//! wake-up would never come.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::resources::{PipeLease, RelayResources};

/// A user-space copy buffer, allocated only while data flows, counted in the resources.
pub(super) struct CopyBuffer<'a> {
    pub(super) data: Box<[u8]>,
    start: usize,
    end: usize,
    resources: &'a RelayResources,
}

impl<'a> CopyBuffer<'a> {
    pub(super) fn new(capacity: usize, resources: &'a RelayResources) -> Self {
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
pub(super) enum Carrier<'a> {
    Pipe(PipeLease),
    Copy(CopyBuffer<'a>),
}

impl Carrier<'_> {
    /// What this carrier may hold: the configured cap, or less if the kernel kept the pipe
    /// smaller than asked.
    pub(super) fn capacity(&self, configured: usize) -> usize {
        match self {
            Carrier::Pipe(lease) => lease.pipe().capacity().min(configured),
            Carrier::Copy(_) => configured,
        }
    }

    pub(super) fn held(&self) -> usize {
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

pub(super) enum Fill {
    Read(usize),
    Eof,
    Blocked,
}

/// Moves bytes from `src` into the carrier without exceeding its capacity.
pub(super) fn try_fill(
    src: &TcpStream,
    carrier: &mut Carrier<'_>,
    capacity: usize,
) -> io::Result<Fill> {
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

/// Moves at most `limit` bytes from the carrier to `dst`; Ok(None) when `dst` cannot take more
/// now.
pub(super) fn try_drain(
    dst: &TcpStream,
    carrier: &mut Carrier<'_>,
    limit: usize,
) -> io::Result<Option<usize>> {
    let result = match carrier {
        Carrier::Pipe(lease) => {
            let from = lease.pipe().read_fd();
            let to = dst.as_raw_fd();
            let len = lease.in_pipe.min(limit);
            dst.try_io(Interest::WRITABLE, || splice(from, to, len))
                .inspect(|&n| {
                    lease.in_pipe -= n;
                })
        }
        Carrier::Copy(buffer) => {
            let end = buffer.end.min(buffer.start + limit);
            dst.try_write(&buffer.data[buffer.start..end])
                .inspect(|&n| {
                    buffer.start += n;
                })
        }
    };
    match result {
        Ok(n) => Ok(Some(n)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Some(0)),
        Err(e) => Err(e),
    }
}
