//! The proxy-to-client side of a connection: writes the responses in request order as their
//! pieces arrive, closes when a response asks for it, and turns the connection into a CONNECT
//! tunnel once every earlier response is out.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use http::StatusCode;
use midway_relay::{write_all_within, BufferConfig, RelayCounters, RelayModel, RelayOptions};
use socket2::SockRef;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tracing::debug;

use super::wire::simple_response;
use super::{ClientConn, Part, Slot};
use crate::error::HttpError;
use crate::head::RequestHead;

/// The proxy-to-client side: writes responses in request order, then maybe a tunnel.
pub(super) struct ResponseWriter<'c> {
    pub(super) conn: &'c ClientConn,
    pub(super) write_half: OwnedWriteHalf,
    pub(super) slot_rx: mpsc::Receiver<Slot>,
}

impl ResponseWriter<'_> {
    pub(super) async fn run(mut self) -> Result<(), HttpError> {
        let conn = self.conn;
        loop {
            let slot = tokio::select! {
                _ = conn.stop.cancelled() => {
                    self.end();
                    return Ok(());
                }
                slot = self.slot_rx.recv() => match slot {
                    Some(slot) => slot,
                    // The reader ended: the client closed, or the connection was cut (the
                    // reader saw it first).
                    None => {
                        self.end();
                        return Ok(());
                    }
                },
            };
            match slot {
                Slot::Response { mut parts, done } => loop {
                    let part = tokio::select! {
                        _ = conn.stop.cancelled() => {
                            self.end();
                            return Ok(());
                        }
                        part = parts.recv() => part,
                    };
                    match part {
                        Some(Part::Data(bytes)) => {
                            write_all_within(&mut self.write_half, &bytes, conn.window.as_deref())
                                .await
                                .map_err(HttpError::ClientIo)?;
                            conn.counters
                                .bytes
                                .server_to_client
                                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                        }
                        Some(Part::End { close }) => {
                            conn.outstanding.fetch_sub(1, Ordering::AcqRel);
                            let _ = done.send(());
                            if close {
                                self.write_half
                                    .shutdown()
                                    .await
                                    .map_err(HttpError::ClientIo)?;
                                return Ok(());
                            }
                            break;
                        }
                        // The fetch failed after the head went out: the framing is broken,
                        // so the only honest signal left is closing the connection (a reset
                        // if it was cut).
                        None => {
                            if !conn.cut.is_cancelled() {
                                let _ = self.write_half.shutdown().await;
                            }
                            self.end();
                            return Ok(());
                        }
                    }
                },
                Slot::Tunnel {
                    head,
                    read_half,
                    leftover,
                } => {
                    return self.tunnel(*head, read_half, leftover).await;
                }
            }
        }
    }

    /// Lets go of the client's write half. When the connection is cut, not ended (see
    /// `ClientConn::cut`), the client socket closes with a reset once the read half is dropped
    /// too: SO_LINGER 0, and the write half forgotten rather than dropped (dropping it would
    /// send a FIN first).
    fn end(self) {
        if self.conn.cut.is_cancelled() {
            let _ = SockRef::from(self.write_half.as_ref()).set_linger(Some(Duration::ZERO));
            self.write_half.forget();
        }
    }

    async fn tunnel(
        self,
        head: RequestHead,
        read_half: OwnedReadHalf,
        leftover: BytesMut,
    ) -> Result<(), HttpError> {
        let conn = self.conn;
        let proxy = &conn.proxy;
        let mut write_half = self.write_half;
        let upstream = match proxy.connect_origin(&head, &conn.connect).await {
            Ok(stream) => stream,
            Err(error) => {
                debug!(%error, origin = %head.origin.authority(), "CONNECT target unreachable");
                let status = if error.is_denied_destination() {
                    StatusCode::FORBIDDEN
                } else {
                    StatusCode::BAD_GATEWAY
                };
                let response = simple_response(status, &proxy.config.via_name, true);
                write_half
                    .write_all(&response)
                    .await
                    .map_err(HttpError::ClientIo)?;
                let _ = write_half.shutdown().await;
                return Ok(());
            }
        };
        let established = format!(
            "HTTP/1.1 200 Connection Established\r\nVia: 1.1 {}\r\n\r\n",
            proxy.config.via_name
        );
        write_half
            .write_all(established.as_bytes())
            .await
            .map_err(HttpError::ClientIo)?;
        proxy.metrics.tunnels.inc();
        conn.counters.tunnels.fetch_add(1, Ordering::Relaxed);
        // Both halves come from the one client stream; a mismatch would be a bug, reported on
        // this connection rather than panicking the proxy.
        let client = read_half
            .reunite(write_half)
            .map_err(|error| HttpError::ClientIo(std::io::Error::other(error)))?;
        // midway's relay carries the tunnel, and with it the close rule of every relay in
        // midway: until both directions have ended cleanly, a close (an error, a cancellation,
        // a crash of the process) is a reset toward both ends, never a FIN that passes a
        // truncated stream off as complete. The bytes the client sent after its CONNECT head
        // go first. A tunnel holds at most what one response may.
        let counters = Arc::new(RelayCounters::default());
        let options = RelayOptions {
            counters: counters.clone(),
            client_prefix: leftover.to_vec(),
            client_window: conn.window.clone(),
            ..RelayOptions::default()
        };
        let model = RelayModel::Buffer(BufferConfig {
            buffer_bytes: proxy.config.chunk_bytes * proxy.config.response_buffer_chunks,
            splice: true,
        });
        let result = midway_relay::relay(
            client,
            upstream,
            &model,
            &proxy.relay,
            options,
            conn.stop.clone(),
        )
        .await;
        conn.counters.bytes.server_to_client.fetch_add(
            counters.server_to_client.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        conn.counters.bytes.client_to_server.fetch_add(
            counters.client_to_server.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        // Peers resetting a tunnel is their business, not a proxy error; the relay has already
        // closed both ends as the rule says.
        if let Err(error) = result {
            debug!(%error, "CONNECT tunnel ended with an error");
        }
        Ok(())
    }
}
