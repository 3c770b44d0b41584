//! midway-relay: moves bytes between the two segments of a split TCP connection.
//!
//! Two models from the hfc-proxy paper, chosen per listener:
//! - [`RelayModel::Buffer`] (buffer-and-forward): at most `buffer_bytes` held per direction,
//!   splice(2) through a pooled pipe when one is free (plain copy otherwise), so a slow reader
//!   pushes back on the sender.
//! - [`RelayModel::Spool`] (store-and-forward): the server-to-client direction reads the remote
//!   socket as fast as the server sends, into memory and then an anonymous spool file, so the
//!   remote segment never waits for the local one. Per-connection and global disk caps turn into
//!   backpressure; bytes are never dropped or reordered.
//!
//! Both models carry half-close per direction (EOF one way -> flush -> `shutdown(SHUT_WR)`),
//! carry resets across (a reset on one side closes the other with `SO_LINGER {on, 0}`, also
//! after that side's FIN, while the other side is silent), honour an idle timeout and a
//! cancellation token, and count bytes per direction while running.
//!
//! The close rule: a connection the relay ends before both of its directions have carried
//! their source's FIN (a cancellation: the proxy's shutdown after its grace period; an idle
//! timeout) ends with a reset toward both ends, never a FIN after a stream that may be
//! truncated: an end may have sent bytes that never reached midway.
//! Idle connections allocate no buffer and hold no pipe, and with
//! [`RelayOptions::park_after`] not even the relay's own state: after that long without a byte
//! (and nothing held, no direction ended) the relay lets go of everything but the two sockets
//! and a small wait for either to become readable, and starts again when one does.

mod error;
mod park;
mod pump;
mod resources;
mod spool;
mod stream;
mod traffic;
mod window;

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use error::{RelayError, Side};
use pump::validate;
pub use resources::{clean_spool_dir, RelayResources, SPOOL_FILE_PREFIX};
pub use stream::{relay_peer_stream, relay_peer_streams, PeerSide, PeerStream};
pub use window::{write_all_within, ClientWindow};

/// Which relay model a listener uses.
#[derive(Debug, Clone)]
pub enum RelayModel {
    /// Buffer-and-forward: a bounded buffer (or pipe) per direction, so a slow reader pushes
    /// back on the sender.
    Buffer(BufferConfig),
    /// Store-and-forward: the server-to-client direction is read as fast as the server sends,
    /// into memory and then a spool file.
    Spool(SpoolConfig),
}

/// Buffer-and-forward settings.
#[derive(Debug, Clone)]
pub struct BufferConfig {
    /// Cap on bytes held per direction (user-space buffer, or pipe size when splicing).
    pub buffer_bytes: usize,
    /// Use splice(2) through pooled pipes when one is free.
    pub splice: bool,
}

/// Store-and-forward settings.
#[derive(Debug, Clone)]
pub struct SpoolConfig {
    /// Server-to-client bytes kept in memory before going to the spool file.
    pub memory_bytes: usize,
    /// Per-connection cap on bytes in the spool file.
    pub max_spool_bytes: u64,
    /// Cap for the client-to-server direction, which is buffer-and-forward (splicing when the
    /// pipe pool has a pipe free).
    pub buffer_bytes: usize,
}

/// Live counters the caller can read while the relay runs (metrics, logs).
#[derive(Debug, Default)]
pub struct RelayCounters {
    /// Bytes delivered to the server.
    pub client_to_server: AtomicU64,
    /// Bytes delivered to the client.
    pub server_to_client: AtomicU64,
    /// Bytes the spool holds right now (memory + disk), server-to-client direction.
    pub spooled_now: AtomicU64,
    /// Bytes read from the client and not yet delivered (user buffer or pipe).
    pub held_client_to_server: AtomicU64,
    /// Bytes read from the server and not yet delivered, outside the spool (buffer or pipe).
    pub held_server_to_client: AtomicU64,
    /// Highest value `held_client_to_server` or `held_server_to_client` ever reached.
    pub peak_held: AtomicU64,
    /// Spool model: the server's FIN was read, everything it sent is in the spool (the live
    /// form of `RelayReport::remote_finished_at`).
    pub remote_finished: AtomicBool,
    /// Times the connection parked (see [`RelayOptions::park_after`]).
    pub parks: AtomicU64,
    /// The relay is parked now: nothing moves until `resumed` is notified.
    pub parked: AtomicBool,
    /// Notified (`notify_one`, so a waiter that comes late still wakes) each time a parked
    /// relay wakes up, for whatever reason: a watcher that samples the connection can sleep
    /// while it is parked instead of waking on a timer (thousands of idle connections). The
    /// relay never waits on it, so whoever supervises the connection may notify it too, to
    /// have that watcher look again.
    pub resumed: tokio::sync::Notify,
}

impl RelayCounters {
    /// Bytes read from one side and not yet delivered, in buffers or pipes (the spool apart).
    pub fn held_now(&self) -> u64 {
        self.held_client_to_server.load(Ordering::Relaxed)
            + self.held_server_to_client.load(Ordering::Relaxed)
    }
}

/// Called once with (client, server) sockets right before the relay closes them.
///
/// The relay owns both sockets and closes them when it ends, so this is the caller's last
/// chance to read per-socket state such as `tcp_info` (final RTT, cwnd, retransmissions) — a
/// sample taken earlier by the caller may be seconds old. It runs on the relay's task: keep it
/// to a few syscalls.
///
/// A trait, not a closure type, so that the value that keeps what the hook reads can be the
/// hook itself (one allocation per connection, not two); every such closure is one.
pub trait CloseHook: Send + Sync {
    /// The relay is about to close `client` and `server`.
    fn closing(&self, client: BorrowedFd<'_>, server: BorrowedFd<'_>);
}

impl<F: Fn(BorrowedFd<'_>, BorrowedFd<'_>) + Send + Sync> CloseHook for F {
    fn closing(&self, client: BorrowedFd<'_>, server: BorrowedFd<'_>) {
        self(client, server)
    }
}

/// See [`CloseHook`].
pub type OnClose = Arc<dyn CloseHook>;

/// Per-connection options.
#[derive(Clone, Default)]
pub struct RelayOptions {
    /// Close both sides when no byte moved in either direction for this long.
    pub idle_timeout: Option<Duration>,
    /// Counters the relay updates while it runs; keep a clone of the `Arc` to read them live.
    pub counters: Arc<RelayCounters>,
    /// See [`OnClose`]; called however the relay ends (done, reset, idle, cancelled, error),
    /// but not when the model config is rejected before relaying starts.
    pub on_close: Option<OnClose>,
    /// Bytes the caller already read from the client (an HTTP CONNECT request's tail): the
    /// relay delivers them to the server first, under the same close rule as the rest.
    pub client_prefix: Vec<u8>,
    /// Buffer model only: after this long without a byte in either direction, with nothing
    /// held and both directions open, free the relay's state (a few kilobytes per connection)
    /// and wait for either socket with a future of a few hundred bytes. The idle timeout,
    /// cancellation, resets and the close rule are unchanged. None: never.
    pub park_after: Option<Duration>,
    /// A window the bytes toward the client share with other connections (a subscriber's
    /// access link): written only as far as it grants. None: the socket's own buffer decides.
    /// [`relay`] honours it in both models; the peer-stream relays do not take one.
    pub client_window: Option<Arc<dyn ClientWindow>>,
}

impl std::fmt::Debug for RelayOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayOptions")
            .field("idle_timeout", &self.idle_timeout)
            .field("counters", &self.counters)
            .field("on_close", &self.on_close.as_ref().map(|_| "<callback>"))
            .field("client_prefix_bytes", &self.client_prefix.len())
            .field("park_after", &self.park_after)
            .field("client_window", &self.client_window.is_some())
            .finish()
    }
}

/// How one direction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectionEnd {
    /// EOF read and carried across as a FIN.
    Fin,
    /// A reset (ECONNRESET/EPIPE) on either side ended it.
    ResetByPeer,
    /// No byte moved in either direction for `RelayOptions::idle_timeout`.
    IdleTimeout,
    /// The cancellation token given to [`relay`] fired.
    Cancelled,
    /// An I/O error other than a reset ended it (then `relay` returns `Err`, and the
    /// caller sees the byte counts in its `RelayCounters`).
    Error,
}

/// Outcome of one relayed connection.
#[derive(Debug)]
pub struct RelayReport {
    /// Bytes delivered to the server (client-to-server direction), in bytes.
    pub client_to_server_bytes: u64,
    /// Bytes delivered to the client (server-to-client direction), in bytes.
    pub server_to_client_bytes: u64,
    /// How the client-to-server direction ended.
    pub client_to_server_end: DirectionEnd,
    /// How the server-to-client direction ended.
    pub server_to_client_end: DirectionEnd,
    /// Spool model: the most bytes the spool ever held (memory + disk). 0 for buffer.
    pub peak_spool_bytes: u64,
    /// Spool model: when the server side was fully read, measured from the relay's start.
    pub remote_finished_at: Option<Duration>,
}

/// Makes the kernel close `stream` with a reset should this process die (kill -9, an abort):
/// SO_LINGER {on, 0}. Until a relay decides how a connection ends, a dead process's close must
/// not pass a truncated stream off as complete. Both relays arm it when they start; whoever
/// takes a client's bytes off its socket before that (midway-proxy's Fast Open SYN data and
/// the early bytes it sends to a peer) arms it first.
pub fn reset_if_crashed(stream: &tokio::net::TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// Relay until both directions end. `client` = local segment, `server` = remote segment.
///
/// An `async move` block, not an `async fn`: an async fn stores each argument twice in its
/// future (the argument and the local it becomes), and this future lives as long as the
/// connection.
pub fn relay<'a>(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    model: &'a RelayModel,
    resources: &'a Arc<RelayResources>,
    options: RelayOptions,
    cancel: tokio_util::sync::CancellationToken,
) -> impl std::future::Future<Output = Result<RelayReport, RelayError>> + 'a {
    let (mut client, mut server, mut options) = (client, server, options);
    async move {
        if matches!(model, RelayModel::Spool(_)) {
            // A spool can hold bytes on disk while both sockets are quiet: never parked.
            options.park_after = None;
        }
        validate(model)?;
        // Until the relay decides how the connection ends, a crash of this process (kill -9, an
        // abort) must not pass a truncated stream off as complete: the kernel closes a dead
        // process's sockets, and one with SO_LINGER {on, 0} closes with a RST, not a FIN.
        for stream in [&client, &server] {
            reset_if_crashed(stream);
        }
        let idle_timeout = options.idle_timeout;
        let mut idle_left = idle_timeout;
        let mut moved = (0, 0);
        // A parking relay starts parked: a connection that never carries a byte never allocates
        // the running relay (and a freed one would leave a hole in the heap, not return memory).
        let mut parked = options.park_after.is_some() && options.client_prefix.is_empty();
        loop {
            if parked {
                options.counters.parked.store(true, Ordering::Release);
                let woke = park::wait(&client, &server, &cancel, idle_left).await;
                options.counters.parked.store(false, Ordering::Release);
                options.counters.resumed.notify_one();
                // Woken by the idle deadline: the next run ends the connection at once, under the
                // close rule (a reset toward both ends).
                options.idle_timeout = match woke {
                    park::Woke::IdleDeadline => Some(Duration::ZERO),
                    park::Woke::Activity | park::Woke::Cancelled => idle_timeout,
                    park::Woke::Failed(side, error) => {
                        return pump::failed_while_parked(
                            client, server, &options, moved, side, error,
                        );
                    }
                };
            }
            // Boxed: the running relay's state is allocated while it runs and freed when it parks.
            let run = Box::pin(pump::run(
                client,
                server,
                model,
                resources,
                options.clone(),
                cancel.clone(),
            ))
            .await?;
            match run {
                pump::Run::Ended(mut report) => {
                    report.client_to_server_bytes += moved.0;
                    report.server_to_client_bytes += moved.1;
                    return Ok(report);
                }
                pump::Run::Parked(run) => {
                    options.counters.parks.fetch_add(1, Ordering::Relaxed);
                    moved.0 += run.client_to_server_bytes;
                    moved.1 += run.server_to_client_bytes;
                    options.client_prefix = Vec::new();
                    idle_left = idle_timeout.map(|idle| idle.saturating_sub(run.idle_for));
                    parked = true;
                    (client, server) = (run.client, run.server);
                }
            }
        }
    }
}
