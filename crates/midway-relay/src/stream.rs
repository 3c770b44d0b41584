//! The relay between a TCP socket and a peer stream: an encrypted byte stream to another midway
//! (a TLS session over TCP, a QUIC stream), which is no socket the relay can splice or query.
//!
//! Same close rule as the socket-to-socket relay: a clean end of one side's stream is carried
//! across as a half-close, anything else (a reset, a truncated stream, an I/O error, cancellation,
//! an idle timeout) resets both ends, so neither end ever takes a truncated stream for a whole one.
//! Copy-based, one buffer per direction, both directions polled in the caller's task.

use std::future::poll_fn;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{ready, Context, Poll};

use socket2::SockRef;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::traffic::{take_socket_error, Direction, Traffic};
use crate::{DirectionEnd, RelayError, RelayOptions, RelayReport, Side};

/// Smallest accepted buffer, as for [`crate::relay`]: below a page, calls per byte explode.
const MIN_BUFFER_BYTES: usize = 4096;

/// A byte stream to another midway that is not a plain TCP socket (a TLS session over TCP, a
/// QUIC stream).
///
/// Reading `Ok(0)` must mean the peer ended its stream cleanly (TLS close_notify, QUIC FIN); a
/// stream that ends any other way must fail the read (`UnexpectedEof` for a TLS session whose TCP
/// connection ended without close_notify, `ConnectionReset` for a reset). `shutdown` must end the
/// write direction cleanly (TLS close_notify then FIN, QUIC FIN).
pub trait PeerStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Ends the stream abruptly toward the peer so that the far end sees a reset, not a clean end
    /// (TLS over TCP: `SO_LINGER {on, 0}` on the TCP socket, then drop; QUIC: RESET_STREAM and
    /// STOP_SENDING).
    fn abort(self);

    /// The TCP socket the stream runs over, when it has one of its own (TLS over TCP; not a
    /// QUIC stream, which shares its connection's UDP socket). The relay hands it to
    /// [`RelayOptions::on_close`] as that segment's socket; `None` (the default) skips the call.
    fn socket(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

/// Which end of the relayed connection the peer stream is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerSide {
    /// The peer stream carries the server's side (edge midway: client TCP socket <-> peer stream).
    Server,
    /// The peer stream carries the client's side (gateway midway: peer stream <-> server TCP
    /// socket).
    Client,
}

/// Relays between `tcp` and `peer` until both directions end; `side` says which end `peer` is.
///
/// - A clean end read on one side (TCP FIN, the peer stream's `Ok(0)`) is carried across as a
///   half-close (`shutdown(SHUT_WR)`, or [`AsyncWriteExt::shutdown`] on the peer stream); the
///   other direction keeps flowing. Both ended cleanly: `Ok`, both ends [`DirectionEnd::Fin`].
/// - Any other end resets both: the TCP socket closes with `SO_LINGER {on, 0}` (RST) and the
///   peer stream is [`PeerStream::abort`]ed. A reset, a broken pipe or a truncated peer stream
///   (`UnexpectedEof`) is the peer's doing: `Ok`, [`DirectionEnd::ResetByPeer`]. Other I/O errors
///   return [`RelayError::Io`]. Cancellation gives [`DirectionEnd::Cancelled`].
/// - An idle timeout always resets ([`DirectionEnd::IdleTimeout`]): bytes may sit in the TLS or
///   QUIC library's buffers, which the relay cannot see, so a FIN could pass a truncated stream
///   off as complete.
/// - A direction that already ended cleanly keeps [`DirectionEnd::Fin`] in the report.
///
/// `buffer_bytes` (at least 4096) is the buffer of each direction, allocated when the
/// direction's source first has data (a TCP source; a peer stream gives no readiness signal, so
/// its direction allocates at once). `options.counters` are updated live (`spooled_now` and
/// `remote_finished` stay untouched), `options.client_prefix` is written to the server side
/// first, `options.idle_timeout` is honoured. `options.on_close` is called with the (client,
/// server) sockets right before they close when the peer stream has a socket of its own
/// ([`PeerStream::socket`]), and not at all otherwise.
///
/// A too-small `buffer_bytes` returns [`RelayError::InvalidConfig`] after resetting both ends:
/// nothing was relayed, and a FIN would tell each end the other had nothing to send.
pub async fn relay_peer_stream<S: PeerStream>(
    tcp: TcpStream,
    peer: S,
    side: PeerSide,
    buffer_bytes: usize,
    options: RelayOptions,
    cancel: CancellationToken,
) -> Result<RelayReport, RelayError> {
    use Direction::{ClientToServer as C2S, ServerToClient as S2C};
    // Until the relay decides how the connection ends, a crash of this process must not close
    // the TCP socket with a FIN: with SO_LINGER {on, 0} the kernel's close sends a RST.
    crate::reset_if_crashed(&tcp);
    if buffer_bytes < MIN_BUFFER_BYTES {
        drop(tcp);
        peer.abort();
        return Err(RelayError::InvalidConfig(
            "relay buffer_bytes must be at least 4096",
        ));
    }
    let ctx = Ctx {
        buffer_bytes,
        traffic: Traffic::new(&options.counters),
    };
    let (tcp_side, peer_side, tcp_to_peer, peer_to_tcp) = match side {
        PeerSide::Server => (Side::Client, Side::Server, C2S, S2C),
        PeerSide::Client => (Side::Server, Side::Client, S2C, C2S),
    };
    let (mut peer_read, mut peer_write) = tokio::io::split(peer);
    let mut c2s_end: Option<DirectionEnd> = None;
    let mut s2c_end: Option<DirectionEnd> = None;

    let stop = {
        // Both directions and the error watch below share the socket through `&TcpStream`.
        let (mut tcp_read, mut tcp_write) = (TcpRef(&tcp), TcpRef(&tcp));
        let tcp_source = Route {
            direction: tcp_to_peer,
            src: (&mut tcp_read, tcp_side),
            dst: (&mut peer_write, peer_side),
        };
        let peer_source = Route {
            direction: peer_to_tcp,
            src: (&mut peer_read, peer_side),
            dst: (&mut tcp_write, tcp_side),
        };
        let (c2s, s2c) = match side {
            PeerSide::Server => (tcp_source, peer_source),
            PeerSide::Client => (peer_source, tcp_source),
        };
        let c2s = copy(c2s, &options.client_prefix, &ctx);
        let s2c = copy(s2c, &[], &ctx);
        let idle = ctx.idle_expired(options.idle_timeout);
        tokio::pin!(c2s, s2c, idle);
        loop {
            tokio::select! {
                result = &mut c2s, if c2s_end.is_none() => match result {
                    Ok(()) => c2s_end = Some(DirectionEnd::Fin),
                    Err(e) => break Stop::Failed(e),
                },
                result = &mut s2c, if s2c_end.is_none() => match result {
                    Ok(()) => s2c_end = Some(DirectionEnd::Fin),
                    Err(e) => break Stop::Failed(e),
                },
                // The directions see a TCP reset only when they next read or write the socket:
                // after the TCP side's FIN nothing reads it, and while the other direction waits
                // on the peer nothing writes it. (A peer stream offers no such signal: its reset
                // shows on its direction's next read.)
                result = tcp.ready(Interest::ERROR) => {
                    if let Err(e) = take_tcp_error(result, &tcp, tcp_side) {
                        break Stop::Failed(e);
                    }
                }
                () = cancel.cancelled() => break Stop::Cancelled,
                () = &mut idle => break Stop::Idle,
            }
            if c2s_end.is_some() && s2c_end.is_some() {
                break Stop::BothDone;
            }
        }
    };
    // The direction futures are gone, and their buffers with them.
    ctx.held(C2S, 0);
    ctx.held(S2C, 0);
    let unfinished = stop.unfinished_end();
    let report = RelayReport {
        client_to_server_bytes: ctx.client_to_server.load(Ordering::Relaxed),
        server_to_client_bytes: ctx.server_to_client.load(Ordering::Relaxed),
        client_to_server_end: c2s_end.unwrap_or(unfinished),
        server_to_client_end: s2c_end.unwrap_or(unfinished),
        peak_spool_bytes: 0,
        remote_finished_at: None,
    };
    let peer = peer_read.unsplit(peer_write);
    if let (Some(on_close), Some(peer_socket)) = (&options.on_close, peer.socket()) {
        match side {
            PeerSide::Server => on_close.closing(tcp.as_fd(), peer_socket),
            PeerSide::Client => on_close.closing(peer_socket, tcp.as_fd()),
        }
    }
    if matches!(stop, Stop::BothDone) {
        // Both FINs were sent by `copy`: a plain close, after the bytes still queued.
        let _ = SockRef::from(&tcp).set_linger(None);
        drop(peer);
    } else {
        peer.abort();
    }
    drop(tcp); // with SO_LINGER {on, 0} still armed unless both ends finished: a RST
    stop.into_result(report)
}

/// Relays between two peer streams (the middle midway of a chain whose segments on both sides
/// are encrypted: TLS or QUIC), with [`relay_peer_stream`]'s close rule: a clean end read on one
/// side is carried across as the other's clean end (FIN, close_notify); anything else aborts
/// both ([`PeerStream::abort`]); an idle timeout and cancellation abort both. Both directions
/// allocate their buffers at once (a peer stream gives no readiness signal).
/// `options.on_close` is called with both sockets when both streams have one.
pub async fn relay_peer_streams<C: PeerStream, S: PeerStream>(
    client: C,
    server: S,
    buffer_bytes: usize,
    options: RelayOptions,
    cancel: CancellationToken,
) -> Result<RelayReport, RelayError> {
    use Direction::{ClientToServer as C2S, ServerToClient as S2C};
    if buffer_bytes < MIN_BUFFER_BYTES {
        client.abort();
        server.abort();
        return Err(RelayError::InvalidConfig(
            "relay buffer_bytes must be at least 4096",
        ));
    }
    let ctx = Ctx {
        buffer_bytes,
        traffic: Traffic::new(&options.counters),
    };
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut server_read, mut server_write) = tokio::io::split(server);
    let mut c2s_end: Option<DirectionEnd> = None;
    let mut s2c_end: Option<DirectionEnd> = None;
    let stop = {
        let c2s = copy(
            Route {
                direction: C2S,
                src: (&mut client_read, Side::Client),
                dst: (&mut server_write, Side::Server),
            },
            &options.client_prefix,
            &ctx,
        );
        let s2c = copy(
            Route {
                direction: S2C,
                src: (&mut server_read, Side::Server),
                dst: (&mut client_write, Side::Client),
            },
            &[],
            &ctx,
        );
        let idle = ctx.idle_expired(options.idle_timeout);
        tokio::pin!(c2s, s2c, idle);
        loop {
            tokio::select! {
                result = &mut c2s, if c2s_end.is_none() => match result {
                    Ok(()) => c2s_end = Some(DirectionEnd::Fin),
                    Err(e) => break Stop::Failed(e),
                },
                result = &mut s2c, if s2c_end.is_none() => match result {
                    Ok(()) => s2c_end = Some(DirectionEnd::Fin),
                    Err(e) => break Stop::Failed(e),
                },
                () = cancel.cancelled() => break Stop::Cancelled,
                () = &mut idle => break Stop::Idle,
            }
            if c2s_end.is_some() && s2c_end.is_some() {
                break Stop::BothDone;
            }
        }
    };
    ctx.held(C2S, 0);
    ctx.held(S2C, 0);
    let unfinished = stop.unfinished_end();
    let report = RelayReport {
        client_to_server_bytes: ctx.client_to_server.load(Ordering::Relaxed),
        server_to_client_bytes: ctx.server_to_client.load(Ordering::Relaxed),
        client_to_server_end: c2s_end.unwrap_or(unfinished),
        server_to_client_end: s2c_end.unwrap_or(unfinished),
        peak_spool_bytes: 0,
        remote_finished_at: None,
    };
    let client = client_read.unsplit(client_write);
    let server = server_read.unsplit(server_write);
    if let (Some(on_close), Some(a), Some(b)) =
        (&options.on_close, client.socket(), server.socket())
    {
        on_close.closing(a, b);
    }
    if matches!(stop, Stop::BothDone) {
        drop((client, server));
    } else {
        client.abort();
        server.abort();
    }
    stop.into_result(report)
}

/// How the select loop stopped.
enum Stop {
    BothDone,
    Cancelled,
    Idle,
    /// Always a [`RelayError::Io`].
    Failed(RelayError),
}

impl Stop {
    /// How a direction that had not ended when the relay stopped ended.
    fn unfinished_end(&self) -> DirectionEnd {
        match self {
            Stop::BothDone => DirectionEnd::Fin,
            Stop::Cancelled => DirectionEnd::Cancelled,
            Stop::Idle => DirectionEnd::IdleTimeout,
            Stop::Failed(e) if is_reset(e) => DirectionEnd::ResetByPeer,
            Stop::Failed(_) => DirectionEnd::Error,
        }
    }

    /// The relay's result: the report, or the I/O error that was not the far end's doing.
    fn into_result(self, report: RelayReport) -> Result<RelayReport, RelayError> {
        match self {
            Stop::Failed(e) if !is_reset(&e) => {
                tracing::debug!(?report, "peer stream relay aborted by an I/O error");
                Err(e)
            }
            _ => Ok(report),
        }
    }
}

/// The far end broke the connection: a reset, the broken pipe that follows one, or a peer
/// stream that ended without its clean end (a TLS session whose TCP connection got a FIN before
/// close_notify). A normal way for a connection to end, carried across as a reset.
fn is_reset(error: &RelayError) -> bool {
    matches!(error, RelayError::Io { source, .. } if matches!(
        source.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::NotConnected
            | io::ErrorKind::UnexpectedEof
    ))
}

/// A failed operation on `side`; `data_lost`: bytes read from one side were not (or not surely)
/// delivered to the other.
fn io_error(side: Side, operation: &'static str, data_lost: bool, source: io::Error) -> RelayError {
    RelayError::Io {
        side,
        operation,
        data_lost,
        source,
    }
}

/// State shared by both directions.
struct Ctx<'a> {
    buffer_bytes: usize,
    /// Bytes, live counters and the activity clock (shared with the socket-to-socket relay).
    traffic: Traffic<'a>,
}

impl<'a> std::ops::Deref for Ctx<'a> {
    type Target = Traffic<'a>;

    fn deref(&self) -> &Traffic<'a> {
        &self.traffic
    }
}

/// A direction's source, which can say when it has something to read, so that the direction
/// allocates its buffer only then.
trait Source: AsyncRead + Unpin {
    fn poll_has_data(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

/// One direction: its source and destination, each with the side it is on.
struct Route<'r> {
    direction: Direction,
    src: (&'r mut (dyn Source + Send), Side),
    dst: (&'r mut (dyn AsyncWrite + Unpin + Send), Side),
}

/// One direction: delivers `prefix`, then copies through one buffer until the source's clean
/// end, which it carries across as a half-close.
async fn copy(route: Route<'_>, prefix: &[u8], ctx: &Ctx<'_>) -> Result<(), RelayError> {
    let Route {
        direction,
        src: (src, src_side),
        dst: (dst, dst_side),
    } = route;
    // A read only happens with the buffer empty: a failed one loses nothing.
    let read_error = |operation, e| io_error(src_side, operation, false, e);
    let write_error = |operation, data_lost, e| io_error(dst_side, operation, data_lost, e);
    deliver(dst, prefix, direction, ctx)
        .await
        .map_err(|e| write_error("writing", true, e))?;
    poll_fn(|cx| src.poll_has_data(cx))
        .await
        .map_err(|e| read_error("waiting to read", e))?;
    let mut buffer = vec![0u8; ctx.buffer_bytes];
    loop {
        let n = src
            .read(&mut buffer)
            .await
            .map_err(|e| read_error("reading", e))?;
        if n == 0 {
            break;
        }
        ctx.touch();
        deliver(dst, &buffer[..n], direction, ctx)
            .await
            .map_err(|e| write_error("writing", true, e))?;
    }
    drop(buffer);
    dst.shutdown()
        .await
        .map_err(|e| write_error("sending the end of stream", false, e))
}

/// Writes all of `chunk` and flushes it (a TLS writer holds records until flushed), counting the
/// bytes delivered and those still held.
async fn deliver(
    dst: &mut (dyn AsyncWrite + Unpin + Send),
    chunk: &[u8],
    direction: Direction,
    ctx: &Ctx<'_>,
) -> io::Result<()> {
    if chunk.is_empty() {
        return Ok(());
    }
    let mut sent = 0;
    while sent < chunk.len() {
        ctx.held(direction, chunk.len() - sent);
        let n = dst.write(&chunk[sent..]).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        sent += n;
        ctx.delivered(direction, n);
    }
    dst.flush().await?;
    ctx.held(direction, 0);
    Ok(())
}

/// The TCP socket as `AsyncRead + AsyncWrite` through a shared reference: tokio's split halves
/// borrow the socket mutably, which would leave nothing for the error watch.
struct TcpRef<'a>(&'a TcpStream);

impl Source for TcpRef<'_> {
    fn poll_has_data(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.poll_read_ready(cx)
    }
}

/// A peer stream gives no readiness signal short of reading: its direction allocates at once.
impl<S: AsyncRead> Source for tokio::io::ReadHalf<S> {
    fn poll_has_data(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for TcpRef<'_> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            // A WouldBlock clears the readiness, so the next poll waits for the socket.
            match self.0.try_read(buf.initialize_unfilled()) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for TcpRef<'_> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                result => return Poll::Ready(result),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(())) // a socket write is in the kernel already
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(SockRef::from(self.0).shutdown(Shutdown::Write))
    }
}

/// One wake-up of the TCP error watch: the pending socket error (SO_ERROR, e.g. ECONNRESET after
/// a RST) as a direction error; without one, clears the ERROR readiness so the watch does not
/// wake again for nothing.
fn take_tcp_error(
    readiness: io::Result<tokio::io::Ready>,
    tcp: &TcpStream,
    side: Side,
) -> Result<(), RelayError> {
    let error = |source| io_error(side, "waiting for an error", true, source);
    readiness.map_err(error)?;
    take_socket_error(tcp).map_err(error)
}
