//! A parked connection: both directions quiet, nothing held, the relay's state freed. What is
//! left waits for the first of: either socket readable (bytes, EOF, a reset or an error: the
//! relay that starts again handles each as it always does), cancellation, or the end of the
//! idle timeout.

use std::io;
use std::mem::MaybeUninit;
use std::task::{Context, Poll};
use std::time::Duration;

use socket2::SockRef;
use tokio::io::Interest;

use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

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
/// The sockets are polled for readiness in place rather than through a `readable()` future
/// each: this future lives in every idle connection's relay, and two such futures were more
/// than half of it (632 bytes in all, now about a third of that).
pub(crate) async fn wait(
    client: &TcpStream,
    server: &TcpStream,
    cancel: &CancellationToken,
    idle_left: Option<Duration>,
) -> Woke {
    let idle = async {
        match idle_left {
            Some(left) => tokio::time::sleep(left).await,
            None => std::future::pending().await,
        }
    };
    let input = std::future::poll_fn(|cx| {
        for (side, stream) in [(Side::Client, client), (Side::Server, server)] {
            if let Poll::Ready(error) = poll_input(stream, cx) {
                return Poll::Ready(match error {
                    Some(error) => Woke::Failed(side, error),
                    None => Woke::Activity,
                });
            }
        }
        Poll::Pending
    });
    tokio::select! {
        woke = input => woke,
        () = cancel.cancelled() => Woke::Cancelled,
        () = idle => Woke::IdleDeadline,
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
