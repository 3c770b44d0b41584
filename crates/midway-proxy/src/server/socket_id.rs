//! A socket that someone else owns (the relay, the HTTP engine), known by its fd number and
//! the inode it had when registered. Telemetry samples it and the memory guard caps it; the
//! inode check makes sure neither ever touches another socket that reused the fd number after
//! the owner closed this one.

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use tokio::net::TcpStream;

/// Copied freely: each holder checks the inode on its own before touching the fd.
#[derive(Clone, Copy)]
pub(super) struct SocketId {
    fd: RawFd,
    /// `None` once the socket is known to be gone (or could not be identified).
    pub(super) inode: Option<u64>,
}

impl SocketId {
    pub(super) fn new(stream: &TcpStream) -> SocketId {
        let fd = stream.as_raw_fd();
        SocketId {
            fd,
            inode: inode_of(fd),
        }
    }

    /// `stream`'s id, or one that is never there (a segment without a socket of its own: a
    /// QUIC stream).
    pub(super) fn of(stream: Option<&TcpStream>) -> SocketId {
        stream.map_or(
            SocketId {
                fd: -1,
                inode: None,
            },
            SocketId::new,
        )
    }

    /// The fd number it was registered with.
    pub(super) fn fd(&self) -> RawFd {
        self.fd
    }

    /// The socket, if the fd number still refers to the registered one. On the first mismatch
    /// it is forgotten: a closed socket never comes back, so later calls skip the `fstat`.
    pub(super) fn borrow(&mut self) -> Option<BorrowedFd<'_>> {
        if self.inode.is_none() || inode_of(self.fd) != self.inode {
            self.inode = None;
            return None;
        }
        // SAFETY: the fd refers to the registered socket (inode checked just above) and is only
        // borrowed while `self` is, for the caller's getsockopt / setsockopt calls; its owner
        // keeps it open meanwhile (the connection's task awaits that owner).
        Some(unsafe { BorrowedFd::borrow_raw(self.fd) })
    }
}

pub(super) fn inode_of(fd: RawFd) -> Option<u64> {
    // SAFETY: fstat writes into the zeroed struct we pass; an invalid fd only returns an error.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::fstat(fd, &mut st) };
    (rc == 0).then_some(st.st_ino)
}
