//! A window shared by several relays' client sockets: how many bytes each may write toward its
//! client now. midway-proxy keeps one per subscriber of a narrow access link, so that all of
//! that subscriber's connections together never hold more unacknowledged bytes than its link's
//! bandwidth-delay product and part of its queue (see midway-proxy's `access_link`). The relay
//! only asks and waits; what the window is and when it opens is the owner's business.

use std::future::Future;
use std::io;
use std::pin::Pin;

use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Bytes the relay may write toward the client socket, shared with other connections.
pub trait ClientWindow: Send + Sync {
    /// How many of `want` bytes may be written now (at most `want`); 0: wait for
    /// [`ClientWindow::opened`]. What is granted counts as sent until handed back.
    fn grant(&self, want: usize) -> usize;
    /// Hands back granted bytes that were not written (the socket took fewer).
    fn give_back(&self, bytes: usize);
    /// Completes when the window may have opened; may complete spuriously, and must complete
    /// within a bounded time while the window has room.
    fn opened(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// The window of one relay's server-to-client direction, or none (every byte granted).
#[derive(Clone, Copy)]
pub(crate) struct Gate<'a>(pub(crate) Option<&'a dyn ClientWindow>);

impl Gate<'_> {
    pub(crate) fn grant(&self, want: usize) -> usize {
        self.0.map_or(want, |window| window.grant(want).min(want))
    }

    /// Gives back what was granted and not written.
    pub(crate) fn settle(&self, granted: usize, written: usize) {
        if let Some(window) = self.0 {
            if granted > written {
                window.give_back(granted - written);
            }
        }
    }

    /// Waits for the window to open; never completes without one (nothing to wait for).
    pub(crate) async fn opened(&self) {
        match self.0 {
            Some(window) => window.opened().await,
            None => std::future::pending().await,
        }
    }
}

/// Writes all of `bytes` to `stream`, as far as `window` grants at a time (at once without
/// one): the same window for writers outside the relay, such as the HTTP proxy's responses.
pub async fn write_all_within<W: AsyncWrite + Unpin + ?Sized>(
    stream: &mut W,
    mut bytes: &[u8],
    window: Option<&dyn ClientWindow>,
) -> io::Result<()> {
    let gate = Gate(window);
    while !bytes.is_empty() {
        let granted = gate.grant(bytes.len());
        if granted == 0 {
            gate.opened().await;
            continue;
        }
        let written = stream.write(&bytes[..granted]).await;
        gate.settle(granted, *written.as_ref().unwrap_or(&0));
        match written? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => bytes = &bytes[n..],
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::AsyncReadExt;

    use super::*;

    /// Grants `per_call` bytes at a time and counts what was handed back.
    struct Steps {
        per_call: usize,
        given_back: AtomicUsize,
    }

    impl ClientWindow for Steps {
        fn grant(&self, want: usize) -> usize {
            want.min(self.per_call)
        }
        fn give_back(&self, bytes: usize) {
            self.given_back.fetch_add(bytes, Ordering::Relaxed);
        }
        fn opened(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
            Box::pin(std::future::ready(()))
        }
    }

    #[tokio::test]
    async fn writes_everything_in_grants_and_gives_back_what_was_not_written() {
        let window = Steps {
            per_call: 1000,
            given_back: AtomicUsize::new(0),
        };
        // A pipe of 700 bytes: every write of a 1000-byte grant is short.
        let (mut writer, mut reader) = tokio::io::duplex(700);
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).await.map(|_| got)
        });
        write_all_within(&mut writer, &bytes, Some(&window))
            .await
            .unwrap();
        drop(writer);
        assert_eq!(reading.await.unwrap().unwrap(), bytes);
        assert!(window.given_back.load(Ordering::Relaxed) > 0);
    }
}
