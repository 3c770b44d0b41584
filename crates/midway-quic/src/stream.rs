//! One proxied connection's stream on a tunnel, as the relay takes it.
//!
//! The close rule over QUIC: a clean end of one direction is the stream's FIN (quinn's
//! `finish`), read as `Ok(0)` on the other end; an abort is RESET_STREAM on the send side and
//! STOP_SENDING on the receive side, read as `ConnectionReset` on the other end. A tunnel that
//! dies under a stream fails its reads and writes with `ConnectionReset` too: the relay then
//! resets the TCP side, so no end takes a truncated stream for a whole one.
//!
//! quinn finishes a send stream that is dropped, which would pass a truncated stream off as a
//! whole one; a `QuicPeer` dropped before its write side was shut down resets instead.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use quinn::{RecvStream, SendStream, VarInt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The application error code of RESET_STREAM and STOP_SENDING when a relay aborts a stream
/// (the connection it carries ended without a clean close on one side).
pub const ABORTED: VarInt = VarInt::from_u32(1);

/// A bidirectional stream carrying one proxied connection.
pub struct QuicPeer {
    send: SendStream,
    recv: RecvStream,
    /// The write side was shut down cleanly (FIN sent): dropping must not reset it.
    finished: bool,
    /// The tunnel's count of open streams, decremented on drop.
    counter: Option<Arc<AtomicU64>>,
}

impl QuicPeer {
    /// The stream whose two halves these are.
    pub fn new(send: SendStream, recv: RecvStream) -> QuicPeer {
        QuicPeer {
            send,
            recv,
            finished: false,
            counter: None,
        }
    }

    /// Counts the stream in `counter` while it lives.
    pub fn counted_in(mut self, counter: Arc<AtomicU64>) -> QuicPeer {
        counter.fetch_add(1, Ordering::Relaxed);
        self.counter = Some(counter);
        self
    }

    /// The stream's id (for logs).
    pub fn id(&self) -> u64 {
        self.send.id().index()
    }

    /// Resets both directions (RESET_STREAM and STOP_SENDING) without consuming the stream.
    pub fn reset(&mut self) {
        // Errors mean the direction is already closed (finished, reset or stopped): nothing
        // is left to abort there.
        let _ = self.send.reset(ABORTED);
        let _ = self.recv.stop(ABORTED);
    }
}

/// A lost tunnel ends every stream on it like a reset: the other end cannot have received
/// whatever was still in flight.
fn as_reset(err: io::Error) -> io::Error {
    if err.kind() == io::ErrorKind::NotConnected {
        io::Error::new(io::ErrorKind::ConnectionReset, err)
    } else {
        err
    }
}

impl midway_relay::PeerStream for QuicPeer {
    fn abort(mut self) {
        self.reset();
    }
}

impl AsyncRead for QuicPeer {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        AsyncRead::poll_read(Pin::new(&mut self.recv), cx, buf).map_err(as_reset)
    }
}

impl AsyncWrite for QuicPeer {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        AsyncWrite::poll_write(Pin::new(&mut self.send), cx, buf).map_err(as_reset)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.send).poll_flush(cx).map_err(as_reset)
    }

    /// Sends the stream's FIN. Returns once quinn has taken it; the bytes before it keep being
    /// delivered (and retransmitted) by the tunnel after the stream is dropped.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = ready!(Pin::new(&mut self.send).poll_shutdown(cx)).map_err(as_reset);
        self.finished |= result.is_ok();
        Poll::Ready(result)
    }
}

impl Drop for QuicPeer {
    fn drop(&mut self) {
        if !self.finished {
            self.reset();
        }
        if let Some(counter) = &self.counter {
            counter.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
