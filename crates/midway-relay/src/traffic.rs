//! What both relays (the socket-to-socket pump and the stream relay) keep per connection while
//! bytes move: bytes delivered per direction, the live counters, the activity clock the idle
//! timeout watches, and the pending-socket-error check that carries a reset across.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::RelayCounters;

/// Which way bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    ClientToServer,
    ServerToClient,
}

/// Per-connection traffic. Atomics (not Cells) because the relay futures must be `Send`.
pub(crate) struct Traffic<'a> {
    pub(crate) start: Instant,
    last_activity_ms: AtomicU64,
    pub(crate) client_to_server: AtomicU64,
    pub(crate) server_to_client: AtomicU64,
    pub(crate) counters: &'a RelayCounters,
}

impl<'a> Traffic<'a> {
    pub(crate) fn new(counters: &'a RelayCounters) -> Traffic<'a> {
        Traffic {
            start: Instant::now(),
            last_activity_ms: AtomicU64::new(0),
            client_to_server: AtomicU64::new(0),
            server_to_client: AtomicU64::new(0),
            counters,
        }
    }

    /// Something moved: the idle timeout starts again.
    pub(crate) fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_activity_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long no byte has moved.
    pub(crate) fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_activity_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }

    /// `bytes` reached the far end in `direction`.
    pub(crate) fn delivered(&self, direction: Direction, bytes: usize) {
        let (own, live) = match direction {
            Direction::ClientToServer => (&self.client_to_server, &self.counters.client_to_server),
            Direction::ServerToClient => (&self.server_to_client, &self.counters.server_to_client),
        };
        own.fetch_add(bytes as u64, Ordering::Relaxed);
        live.fetch_add(bytes as u64, Ordering::Relaxed);
        self.touch();
    }

    /// `bytes` are read from one side and not yet delivered in `direction`.
    pub(crate) fn held(&self, direction: Direction, bytes: usize) {
        let gauge = match direction {
            Direction::ClientToServer => &self.counters.held_client_to_server,
            Direction::ServerToClient => &self.counters.held_server_to_client,
        };
        gauge.store(bytes as u64, Ordering::Relaxed);
        self.counters
            .peak_held
            .fetch_max(bytes as u64, Ordering::Relaxed);
    }

    /// Returns when no byte moved for `idle`; never without an idle timeout.
    pub(crate) async fn idle_expired(&self, idle: Option<Duration>) {
        let Some(idle) = idle else {
            return std::future::pending().await;
        };
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

/// The socket's pending error (SO_ERROR, e.g. ECONNRESET after a RST) as `Err`; without one,
/// clears the ERROR readiness so the caller does not wake again for nothing.
pub(crate) fn take_socket_error(stream: &TcpStream) -> io::Result<()> {
    match stream.take_error() {
        Ok(Some(e)) | Err(e) => Err(e),
        Ok(None) => {
            let _ = stream.try_io(Interest::ERROR, || {
                Err::<(), _>(io::Error::from(io::ErrorKind::WouldBlock))
            });
            Ok(())
        }
    }
}
