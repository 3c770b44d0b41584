//! The client-to-proxy side of a connection: reads and parses (possibly pipelined) request
//! heads under the idle and head timeouts and the rate limit, queues one slot per request in
//! response order, spawns its fetch task and forwards the request body to it. Requests the
//! proxy refuses itself are answered and drained here.

use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::BytesMut;
use http::{Method, StatusCode};
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, Instrument};

use super::wire::simple_response;
use super::{BodyPiece, ClientConn, ClientSink, Part, Slot};
use crate::error::HttpError;
use crate::framing::{BodyDecoder, BodyKind};
use crate::head::{parse_request, HeadError, Parsed};
use crate::ratelimit::TokenBucket;

/// Which timeout applies while waiting for client bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadWait {
    /// No request started: the idle timeout, paused while responses are in flight.
    BetweenRequests,
    /// A head has started: it must be complete within the head timeout (slow-loris guard).
    HeadStartedAt(Instant),
    /// Inside a request body: each read must come within the idle timeout.
    BodyProgress,
}

fn head_error_status(error: &HeadError) -> StatusCode {
    match error {
        HeadError::TooLarge { .. } | HeadError::TooManyHeaders => {
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        }
        HeadError::UnsupportedScheme => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::BAD_REQUEST,
    }
}

/// The client-to-proxy side: parses requests, queues their slots, forwards request bodies.
pub(super) struct RequestReader<'c> {
    pub(super) conn: &'c ClientConn,
    pub(super) read_half: OwnedReadHalf,
    /// Client bytes read but not yet consumed.
    pub(super) buf: BytesMut,
    pub(super) slot_tx: mpsc::Sender<Slot>,
}

impl RequestReader<'_> {
    /// Reads more client bytes; `Ok(0)` on EOF. `None` when the connection should end
    /// (stop requested or the applicable timeout passed).
    async fn read_more(&mut self, wait: ReadWait) -> Option<std::io::Result<usize>> {
        let conn = self.conn;
        let limits = &conn.proxy.config.client;
        self.buf.reserve(conn.proxy.config.chunk_bytes);
        // Bounded: each round either reads or waits out one full timeout period.
        for _ in 0..u32::MAX {
            let deadline = match wait {
                ReadWait::HeadStartedAt(started) => started + limits.head_read_timeout,
                ReadWait::BetweenRequests | ReadWait::BodyProgress => {
                    Instant::now() + limits.idle_timeout
                }
            };
            tokio::select! {
                _ = conn.stop.cancelled() => return None,
                result = self.read_half.read_buf(&mut self.buf) => {
                    if let Ok(read) = result {
                        conn.counters.bytes.client_to_server.fetch_add(read as u64, Ordering::Relaxed);
                    }
                    return Some(result);
                }
                _ = tokio::time::sleep_until(deadline.into()) => {
                    let waiting_for_us = conn.outstanding.load(Ordering::Acquire) > 0;
                    if wait != ReadWait::BetweenRequests || !waiting_for_us {
                        return None;
                    }
                    // Responses are still in flight: the client is waiting, not idle.
                }
            }
        }
        None
    }

    pub(super) async fn run(mut self) -> Result<(), HttpError> {
        let conn = self.conn;
        let proxy = &conn.proxy;
        let limits = &proxy.config.client;
        let mut bucket = TokenBucket::new(
            limits.requests_per_second,
            limits.request_burst,
            Instant::now(),
        );
        let mut last_done: Option<oneshot::Receiver<()>> = None;
        loop {
            // Read one request head.
            let mut wait = if self.buf.is_empty() {
                ReadWait::BetweenRequests
            } else {
                ReadWait::HeadStartedAt(Instant::now())
            };
            let head = loop {
                match parse_request(&self.buf, limits.max_header_bytes) {
                    Ok(Parsed::Complete(head, len)) => {
                        let _ = self.buf.split_to(len);
                        break head;
                    }
                    Ok(Parsed::Partial) => match self.read_more(wait).await {
                        None => return Ok(()),
                        Some(Ok(0)) => return Ok(()),
                        Some(Ok(_)) => {
                            if wait == ReadWait::BetweenRequests {
                                wait = ReadWait::HeadStartedAt(Instant::now());
                            }
                        }
                        Some(Err(e)) => return Err(HttpError::ClientIo(e)),
                    },
                    Err(error) => {
                        debug!(%error, "rejecting request head");
                        conn.counters.requests.fetch_add(1, Ordering::Relaxed);
                        return self.reject(head_error_status(&error)).await;
                    }
                }
            };
            conn.counters.requests.fetch_add(1, Ordering::Relaxed);
            proxy.metrics.requests.inc();
            if !bucket.try_take(Instant::now()) {
                return self.reject(StatusCode::TOO_MANY_REQUESTS).await;
            }
            if head.method == Method::CONNECT {
                conn.outstanding.fetch_add(1, Ordering::AcqRel);
                let slot = Slot::Tunnel {
                    head: Box::new(head),
                    read_half: self.read_half,
                    leftover: self.buf,
                };
                // The writer takes over both directions once earlier responses are out.
                let _ = self.slot_tx.send(slot).await;
                return Ok(());
            }

            let Some((parts_tx, done_rx)) = self
                .queue_response(proxy.config.response_buffer_chunks)
                .await
            else {
                return Ok(());
            };
            let wait_for = if head.is_idempotent() {
                None
            } else {
                last_done.take()
            };
            last_done = Some(done_rx);
            let keep_alive = head.keep_alive;
            let body_kind = head.body;
            let (body_tx, body_rx) = if body_kind == BodyKind::Empty {
                (None, None)
            } else {
                let (tx, rx) = mpsc::channel(2);
                (Some(tx), Some(rx))
            };
            let fetch_proxy = proxy.clone();
            let sink = ClientSink {
                tx: parts_tx,
                head_sent: false,
            };
            let connect_for_fetch = conn.connect.clone();
            let fetch_stop = conn.stop.clone();
            conn.fetches.spawn(
                async move {
                    tokio::select! {
                        _ = fetch_stop.cancelled() => {}
                        _ = fetch_proxy.fetch(head, body_rx, sink, wait_for, connect_for_fetch) => {}
                    }
                }
                .in_current_span(),
            );
            if let Some(body_tx) = body_tx {
                if let Err(error) = self.forward_request_body(body_kind, &body_tx).await {
                    debug!(%error, "request body failed; closing after the queued responses");
                    return Ok(());
                }
            }
            if !keep_alive {
                return Ok(());
            }
        }
    }

    /// Takes the next place in the response order: a slot whose response arrives in pieces
    /// (at most `pieces` buffered) and that signals when it has been written. `None` when the
    /// writer is gone. The one way a request (answered or refused) joins the order.
    async fn queue_response(
        &self,
        pieces: usize,
    ) -> Option<(mpsc::Sender<Part>, oneshot::Receiver<()>)> {
        let (parts_tx, parts_rx) = mpsc::channel(pieces);
        let (done_tx, done_rx) = oneshot::channel();
        self.conn.outstanding.fetch_add(1, Ordering::AcqRel);
        self.slot_tx
            .send(Slot::Response {
                parts: parts_rx,
                done: done_tx,
            })
            .await
            .ok()?;
        Some((parts_tx, done_rx))
    }

    /// Queues a proxy-made error response, then drains (bounded) what the client still sends
    /// so the close is clean (no reset that could destroy the response in flight).
    async fn reject(mut self, status: StatusCode) -> Result<(), HttpError> {
        let conn = self.conn;
        conn.counters.rejected.fetch_add(1, Ordering::Relaxed);
        conn.proxy.metrics.bad_requests.inc();
        let Some((parts_tx, _done_rx)) = self.queue_response(2).await else {
            return Ok(());
        };
        let _ = parts_tx
            .send(Part::Data(simple_response(
                status,
                &conn.proxy.config.via_name,
                true,
            )))
            .await;
        let _ = parts_tx.send(Part::End { close: true }).await;
        let mut sink = vec![0u8; 4096];
        // At most 256 KiB or one second: enough for what a client sent before seeing the error,
        // and independent of the writer, which has already shut its side down.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
        for _ in 0..64 {
            tokio::select! {
                result = self.read_half.read(&mut sink) => match result {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        Ok(())
    }

    /// Decodes the request body from the client and hands it to the fetch task.
    async fn forward_request_body(
        &mut self,
        kind: BodyKind,
        body_tx: &mpsc::Sender<BodyPiece>,
    ) -> Result<(), HttpError> {
        let mut decoder = BodyDecoder::new(kind);
        let mut receiver_alive = true;
        // Each round consumes input or reads more; bounded by the body size over chunk size.
        while !decoder.is_done() {
            let step = decoder.step(&self.buf).map_err(HttpError::ClientBody)?;
            if step.consumed == 0 {
                match self.read_more(ReadWait::BodyProgress).await {
                    None => return Err(HttpError::ClientGone),
                    Some(Ok(0)) => {
                        decoder.finish_on_eof().map_err(HttpError::ClientBody)?;
                        break;
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(HttpError::ClientIo(e)),
                }
            }
            let consumed = self.buf.split_to(step.consumed).freeze();
            let payload = consumed.slice(step.payload);
            if receiver_alive
                && !payload.is_empty()
                && body_tx.send(BodyPiece::Data(payload)).await.is_err()
            {
                // The fetch gave up (it answers with an error); keep the framing in sync.
                receiver_alive = false;
            }
        }
        if receiver_alive {
            let _ = body_tx.send(BodyPiece::End).await;
        }
        Ok(())
    }
}
