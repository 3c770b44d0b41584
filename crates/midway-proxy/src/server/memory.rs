//! Glue between connections and the socket memory guard ([`crate::sockmem`]): the guard as
//! configured, each connection's registration, and the caps on its sockets while it lives.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use midway_tcp::TcpProfile;
use tokio::net::TcpStream;

use super::error::ProxyError;
use super::socket_id::SocketId;
use crate::sockmem::{
    self, Adjustable, BufferCaps, SocketCapper, SocketMemory, SocketMemorySetting,
};

/// The socket memory guard as configured on this kernel, or `None` when it is off.
pub(super) fn socket_memory_guard(
    setting: SocketMemorySetting,
) -> Result<Option<Arc<SocketMemory>>, ProxyError> {
    if setting == SocketMemorySetting::Off {
        return Ok(None);
    }
    let limits = match sockmem::KernelMemoryLimits::read() {
        Ok(limits) => limits,
        Err(err) if setting == SocketMemorySetting::Auto => {
            tracing::warn!(error = %err, "socket memory guard off: cannot read the kernel's TCP memory limits");
            return Ok(None);
        }
        Err(err) => return Err(ProxyError::SocketMemoryLimits(err)),
    };
    let Some(settings) = sockmem::GuardSettings::new(setting, limits) else {
        return Ok(None);
    };
    if settings.budget_bytes >= settings.pressure_bytes {
        tracing::warn!(
            budget = settings.budget_bytes,
            pressure = settings.pressure_bytes,
            "socket_memory is at or above net.ipv4.tcp_mem's pressure value: the kernel will be under memory pressure before the guard acts"
        );
    }
    tracing::info!(
        budget_mib = settings.budget_bytes >> 20,
        pressure_mib = settings.pressure_bytes >> 20,
        "socket memory guard on"
    );
    Ok(Some(SocketMemory::new(settings)))
}

/// Whether a profile leaves a socket's buffers to the kernel (then the memory guard may cap them).
pub(super) fn leaves_buffers(profile: &TcpProfile) -> Adjustable {
    Adjustable {
        recv: profile.recv_buffer.is_none(),
        send: profile.send_buffer.is_none(),
    }
}

/// Runs `work` (which owns the connection's sockets) to its end while applying every cap
/// change of the guard to the sockets `memory` registered.
pub(super) async fn following_caps<F: Future>(
    mut memory: Option<&mut MemoryCaps>,
    mut work: Pin<&mut F>,
) -> F::Output {
    loop {
        tokio::select! {
            output = work.as_mut() => return output,
            caps = MemoryCaps::changed(memory.as_deref_mut()) => {
                // The owner of a socket may have closed it already (the HTTP engine's halves
                // live in tasks of their own): CappedSocket checks the inode, so a reused fd
                // number is never capped.
                if let Some(memory) = memory.as_deref_mut() {
                    memory.apply(caps);
                }
            }
        }
    }
}

/// Gives a socket made now the caps in force now, once. For pooled upstream sockets: they are
/// shared between clients, so they belong to no connection that could follow later changes.
pub(super) fn cap_once(guard: &SocketMemory, stream: &TcpStream, adjustable: Adjustable) {
    let caps = guard.caps();
    if caps.is_some() {
        CappedSocket::new(
            "upstream",
            SocketId::new(stream),
            adjustable,
            guard.autotune_max(),
        )
        .apply(caps);
    }
}

/// One proxied connection's part in the socket memory guard: counted while it lives, and its
/// sockets (both of a relayed connection, the client's of an HTTP listener's) follow the
/// guard's caps.
pub(super) struct MemoryCaps {
    _live: sockmem::LiveConnection,
    caps: tokio::sync::watch::Receiver<Option<BufferCaps>>,
    sockets: Vec<CappedSocket>,
}

impl MemoryCaps {
    /// Registers the connection with `guard` (none when the guard is off) and applies the caps
    /// in force now to `sockets`, each named by its segment ("local", "remote") and limited to
    /// the buffers its profile leaves alone.
    pub(super) fn register(
        guard: Option<&Arc<SocketMemory>>,
        sockets: &[(&'static str, SocketId, Adjustable)],
    ) -> Option<MemoryCaps> {
        let guard = guard?;
        let max = guard.autotune_max();
        let mut caps = MemoryCaps {
            _live: guard.register(),
            caps: guard.subscribe(),
            sockets: sockets
                .iter()
                .map(|&(side, socket, adjustable)| CappedSocket::new(side, socket, adjustable, max))
                .collect(),
        };
        let now = *caps.caps.borrow_and_update();
        if now.is_some() {
            caps.apply(now);
        }
        Some(caps)
    }

    /// The next cap change; never resolves without a guard (or after the guard stopped).
    async fn changed(memory: Option<&mut MemoryCaps>) -> Option<BufferCaps> {
        let Some(memory) = memory else {
            return std::future::pending().await;
        };
        if memory.caps.changed().await.is_err() {
            return std::future::pending().await;
        }
        *memory.caps.borrow_and_update()
    }

    /// Applies the guard's caps if they changed since they were last applied. A relayed
    /// connection calls this whenever its task wakes: the guard wakes every registered
    /// connection when the caps change ([`super::registry::Registry::wake_all`]), so no
    /// connection keeps a future of its own waiting for the change (about 200 bytes each).
    pub(super) fn follow(&mut self) {
        if self.caps.has_changed().unwrap_or(false) {
            let caps = *self.caps.borrow_and_update();
            self.apply(caps);
        }
    }

    /// Applies `caps` to every socket that is still the one registered.
    fn apply(&mut self, caps: Option<BufferCaps>) {
        for socket in &mut self.sockets {
            socket.apply(caps);
        }
    }
}

/// A socket the guard caps, known only by [`SocketId`] (the relay or the HTTP engine owns it).
struct CappedSocket {
    side: &'static str,
    socket: SocketId,
    capper: SocketCapper,
}

impl CappedSocket {
    fn new(
        side: &'static str,
        socket: SocketId,
        adjustable: Adjustable,
        autotune_max: BufferCaps,
    ) -> CappedSocket {
        CappedSocket {
            side,
            socket,
            capper: SocketCapper::new(adjustable, autotune_max),
        }
    }

    /// Applies `caps` if the fd still refers to the registered socket; silently skips (and
    /// forgets the socket) otherwise.
    fn apply(&mut self, caps: Option<BufferCaps>) {
        let Some(fd) = self.socket.borrow() else {
            return;
        };
        if let Err(err) = self.capper.apply(fd, caps) {
            tracing::debug!(segment = self.side, error = %err, "could not apply socket buffer caps");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

    use tokio::net::TcpListener;

    use super::*;

    #[tokio::test]
    async fn a_capped_socket_is_skipped_once_its_fd_number_names_another_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let registered = TcpStream::connect(addr).await.unwrap();
        let other = TcpStream::connect(addr).await.unwrap();
        let recv = |fd: RawFd| {
            // SAFETY: both fds stay open until the end of the test.
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::RcvBuf).unwrap()
        };
        let both = Adjustable {
            recv: true,
            send: true,
        };
        let max = BufferCaps {
            recv: 1 << 20,
            send: 1 << 20,
        };
        let caps = |kib: u32| {
            Some(BufferCaps {
                recv: kib << 10,
                send: kib << 10,
            })
        };
        let mut capped = CappedSocket::new("local", SocketId::new(&registered), both, max);
        capped.apply(caps(128));
        assert_eq!(
            recv(registered.as_raw_fd()),
            128 << 10,
            "the registered socket"
        );

        // The fd number now names `other` (as after a close and a reuse, but atomically, so no
        // other test's file can land on the number in between).
        let before = recv(other.as_raw_fd());
        // SAFETY: dup2 onto an fd this test owns; `registered` closes the duplicate on drop.
        let rc = unsafe { libc::dup2(other.as_raw_fd(), registered.as_raw_fd()) };
        assert_eq!(rc, registered.as_raw_fd());
        capped.apply(caps(64));
        capped.apply(None);
        assert_eq!(
            recv(other.as_raw_fd()),
            before,
            "another socket is never capped"
        );
        assert_eq!(
            capped.socket.inode, None,
            "forgotten after the first mismatch"
        );
    }
}
