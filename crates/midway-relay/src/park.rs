//! A parked connection: both directions quiet, nothing held, the relay's state freed. What is
//! left waits for the first of: either socket readable (bytes, EOF, a reset or an error: the
//! relay that starts again handles each as it always does), cancellation, or the end of the
//! idle timeout.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use socket2::SockRef;
use tokio::io::Interest;

use tokio::net::TcpStream;
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::error::Side;

/// What ended the wait.
#[derive(Debug)]
pub(crate) enum Woke {
    /// A socket has bytes or an EOF.
    Activity,
    /// A socket's pending error (a reset), which the check took: the relay must not start
    /// again, it would read an EOF where the reset was.
    Failed(Side, io::Error),
    /// The cancellation token fired.
    Cancelled,
    /// The idle timeout's time ran out.
    IdleDeadline,
}

/// Waits on a parked connection's sockets. `idle_left`: the idle timeout's remaining time
/// (none: no idle timeout).
///
/// A future of its own rather than an async fn with a `select!`: it lives in every idle
/// connection's relay, and an async fn keeps its arguments twice and a `readable()` future per
/// socket (632 bytes in all; this is the two references, the cancellation's future and the
/// timer). The sockets are polled for readiness in place.
pub(crate) fn wait<'a>(
    client: &'a TcpStream,
    server: &'a TcpStream,
    cancel: &'a CancellationToken,
    idle_left: Option<Duration>,
) -> Wait<'a> {
    Wait {
        sockets: [client, server],
        cancelled: cancel.cancelled(),
        idle: idle_left.map(tokio::time::sleep),
    }
}

pin_project_lite::pin_project! {
    /// See [`wait`].
    pub(crate) struct Wait<'a> {
        sockets: [&'a TcpStream; 2],
        #[pin]
        cancelled: WaitForCancellationFuture<'a>,
        #[pin]
        idle: Option<Sleep>,
    }
}

impl Future for Wait<'_> {
    type Output = Woke;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Woke> {
        let this = self.project();
        for (side, stream) in [Side::Client, Side::Server].into_iter().zip(*this.sockets) {
            if let Poll::Ready(error) = poll_input(stream, cx) {
                return Poll::Ready(match error {
                    Some(error) => Woke::Failed(side, error),
                    None => Woke::Activity,
                });
            }
        }
        if this.cancelled.poll(cx).is_ready() {
            return Poll::Ready(Woke::Cancelled);
        }
        if let Some(idle) = this.idle.as_pin_mut() {
            if idle.poll(cx).is_ready() {
                return Poll::Ready(Woke::IdleDeadline);
            }
        }
        Poll::Pending
    }
}

/// Ready when `stream` has bytes or an EOF for the relay that starts next, or with the
/// socket's error. Readiness alone can be a false positive (a fresh socket reports readable
/// with nothing to read), which would start the relay for nothing: a peek checks, and a peek
/// that would block clears the readiness, so the next poll registers for the next event. A
/// peek that fails has taken the socket's error (Linux clears it once reported), so the error
/// is returned. Nothing else reads the sockets while the relay is parked, so the one reader
/// waker `poll_read_ready` keeps per socket is this wait's.
fn poll_input(stream: &TcpStream, cx: &mut Context<'_>) -> Poll<Option<io::Error>> {
    // Bounded: each pass either returns or cleared a readiness the kernel reported, and a
    // socket that keeps reporting readiness with nothing to peek is not spun on forever.
    for _ in 0..4 {
        match stream.poll_read_ready(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(error)) => return Poll::Ready(Some(error)),
            Poll::Ready(Ok(())) => {}
        }
        let mut byte = [MaybeUninit::uninit()];
        match stream.try_io(Interest::READABLE, || SockRef::from(stream).peek(&mut byte)) {
            Ok(_) => return Poll::Ready(None),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Poll::Ready(Some(error)),
        }
    }
    // Readiness reported again and again with nothing to read: look again on the next turn.
    cx.waker().wake_by_ref();
    Poll::Pending
}
