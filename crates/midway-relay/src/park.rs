//! A parked connection: both directions quiet, nothing held, the relay's state freed. What is
//! left waits for the first of: either socket readable (bytes, EOF, a reset or an error: the
//! relay that starts again handles each as it always does), cancellation, or the end of the
//! idle timeout.

use std::io;
use std::mem::MaybeUninit;
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
    let woke = |side| {
        move |error: Option<io::Error>| match error {
            Some(error) => Woke::Failed(side, error),
            None => Woke::Activity,
        }
    };
    tokio::select! {
        error = has_input(client) => woke(Side::Client)(error),
        error = has_input(server) => woke(Side::Server)(error),
        () = cancel.cancelled() => Woke::Cancelled,
        () = idle => Woke::IdleDeadline,
    }
}

/// Returns when `stream` has bytes or an EOF for the relay that starts next, or with the
/// socket's error. Readiness alone can be a false positive (a fresh socket reports readable
/// with nothing to read), which would start the relay for nothing: a peek checks, and a peek
/// that would block clears the readiness before waiting again. A peek that fails has taken
/// the socket's error (Linux clears it once reported), so the error is returned.
async fn has_input(stream: &TcpStream) -> Option<io::Error> {
    loop {
        if let Err(error) = stream.readable().await {
            return Some(error);
        }
        let mut byte = [MaybeUninit::uninit()];
        match stream.try_io(Interest::READABLE, || SockRef::from(stream).peek(&mut byte)) {
            Ok(_) => return None,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(error) => return Some(error),
        }
    }
}
