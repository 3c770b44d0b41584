//! Socket options as the kernel takes them: `int` options, `SO_MAX_PACING_RATE` (an
//! `unsigned long`) and `TCP_CONGESTION` (a name), plus the numbers of the TCP options newer than
//! the libc crate. midway-tcp decides which to set from a profile; this is only the calls.
//! Besides them, the two questions asked of a socket's kernel queues: how many bytes they hold
//! ([`queued_bytes`]) and whether an idle pooled connection is still fit to reuse
//! ([`idle_and_open`]).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `TCP_RTO_MIN_US` (kernel 6.11+): the socket's floor of the retransmission timeout, in
/// microseconds; it can only lower the kernel's.
pub const TCP_RTO_MIN_US: libc::c_int = 45;
/// `TCP_DELACK_MAX_US` (kernel 6.11+): the socket's ceiling of the delayed-ACK timer, in
/// microseconds.
pub const TCP_DELACK_MAX_US: libc::c_int = 46;

/// Sets an `int` socket option.
pub fn set_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    opt: libc::c_int,
    val: libc::c_int,
) -> io::Result<()> {
    // SAFETY: valid fd, pointer to a live c_int of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads an `int` socket option (so tests and metrics can read knobs back).
pub fn get_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    opt: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut val: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid fd, pointer to a live c_int and its length.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(val)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets `SO_MAX_PACING_RATE` in bytes per second. On 64-bit kernels the option takes an
/// `unsigned long` (a value of 4 GB/s or more needs it); `c_ulong` is that type on every target
/// the libc crate knows, and the kernel also accepts a 32-bit value.
pub fn set_max_pacing_rate(fd: BorrowedFd<'_>, bytes_per_second: u64) -> io::Result<()> {
    let val = libc::c_ulong::try_from(bytes_per_second)
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: valid fd, pointer to a live c_ulong of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&val as *const libc::c_ulong).cast(),
            std::mem::size_of::<libc::c_ulong>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads `SO_MAX_PACING_RATE` in bytes per second (`u64::MAX` on a 64-bit kernel = no cap).
pub fn get_max_pacing_rate(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut val: libc::c_ulong = 0;
    let mut len = std::mem::size_of::<libc::c_ulong>() as libc::socklen_t;
    // SAFETY: valid fd, pointer to a live c_ulong and its length.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&mut val as *mut libc::c_ulong).cast(),
            &mut len,
        )
    };
    // The kernel answers with an `unsigned long` when the buffer holds one (its 32-bit form
    // exists only where `unsigned long` is 32 bits wide).
    if rc == 0 {
        Ok(val as u64)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets `TCP_CONGESTION`: the socket's congestion control by name (any registered one, as
/// root; otherwise one in `tcp_allowed_congestion_control`).
pub fn set_congestion_control(fd: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    // SAFETY: valid fd, pointer to the name bytes and their length.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bytes a TCP socket's kernel queues hold for the two ends of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueuedBytes {
    /// Written by this process and not yet acknowledged by the peer (`SIOCOUTQ`): the peer has
    /// not received them.
    pub unacked_out: u64,
    /// Received from the peer and not yet read by this process (`SIOCINQ`): the peer believes
    /// they are delivered.
    pub unread_in: u64,
}

impl QueuedBytes {
    /// Whether either queue holds a byte.
    pub fn any(&self) -> bool {
        self.unacked_out > 0 || self.unread_in > 0
    }
}

/// Reads a TCP socket's send and receive queue lengths (`SIOCOUTQ`, `SIOCINQ`).
pub fn queued_bytes(fd: BorrowedFd<'_>) -> io::Result<QueuedBytes> {
    let ioctl_int = |request: libc::Ioctl| -> io::Result<u64> {
        let mut value: libc::c_int = 0;
        // SAFETY: valid fd; both requests write one `int` through the pointer.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, &mut value) };
        if rc == 0 {
            Ok(value.max(0) as u64)
        } else {
            Err(io::Error::last_os_error())
        }
    };
    // SIOCOUTQ and SIOCINQ are TIOCOUTQ and FIONREAD on Linux.
    Ok(QueuedBytes {
        unacked_out: ioctl_int(libc::TIOCOUTQ)?,
        unread_in: ioctl_int(libc::FIONREAD)?,
    })
}

/// Whether an idle connected socket (a pooled connection, waiting for its next use) is still fit
/// to reuse: the peer has neither closed it (no EOF, no reset) nor sent anything unasked (no
/// byte waiting). Peeks without blocking and without taking a byte off the queue.
pub fn idle_and_open(fd: BorrowedFd<'_>) -> bool {
    let mut byte = 0u8;
    // SAFETY: valid fd, pointer to one live byte and that length; MSG_DONTWAIT never blocks.
    let rc = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    // 0 is EOF, 1 a byte nobody asked for; only "nothing to read yet" is an idle, open socket.
    rc < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
}

/// Copies what the socket has received and not yet read into `buf` without taking it off the
/// queue, without blocking: 0 when nothing is there yet.
pub fn peek_now(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    recv_now(fd, buf, libc::MSG_PEEK)
}

/// Reads what the socket has received into `buf`, without blocking: 0 when nothing is there
/// yet (or at EOF).
pub fn read_now(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    recv_now(fd, buf, 0)
}

fn recv_now(fd: BorrowedFd<'_>, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: valid fd, pointer to a live buffer and its length; MSG_DONTWAIT never blocks.
    let rc = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            flags | libc::MSG_DONTWAIT,
        )
    };
    if rc >= 0 {
        return Ok(rc as usize);
    }
    let err = io::Error::last_os_error();
    if err.kind() == io::ErrorKind::WouldBlock {
        Ok(0)
    } else {
        Err(err)
    }
}

/// One `send` that never blocks and never raises SIGPIPE. The errors are the kernel's as they
/// are: a Fast Open socket answers `EINPROGRESS` when its SYN left without data.
pub fn send_now(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: valid fd, pointer to a live buffer and its length.
    let rc = unsafe {
        libc::send(
            fd.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if rc >= 0 {
        Ok(rc as usize)
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    use super::*;

    /// Waits (up to 5 s) until `check` holds: loopback delivers at once, but not synchronously.
    fn eventually(check: impl Fn() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if check() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        check()
    }

    #[test]
    fn an_idle_socket_is_open_until_the_peer_sends_or_closes() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let talking = TcpStream::connect(addr).unwrap();
        let (mut sender, _) = listener.accept().unwrap();
        let closing = TcpStream::connect(addr).unwrap();
        let (closer, _) = listener.accept().unwrap();

        assert!(idle_and_open(talking.as_fd()), "nothing sent yet");
        sender.write_all(b"x").unwrap();
        assert!(
            eventually(|| !idle_and_open(talking.as_fd())),
            "a byte waits"
        );
        assert!(
            !idle_and_open(talking.as_fd()),
            "peeking leaves the byte queued"
        );

        assert!(idle_and_open(closing.as_fd()));
        drop(closer);
        assert!(eventually(|| !idle_and_open(closing.as_fd())), "EOF");
    }
}
