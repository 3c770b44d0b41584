//! One client connection: a reader that parses (possibly pipelined) requests and dispatches a
//! fetch task per request, and a writer that sends the responses back in request order.
//!
//! ```text
//! client --> reader --(slot per request, bounded)--> writer --> client
//!               \--spawn--> fetch task --(bounded body pieces)--/
//! ```
//! Each slot carries a bounded channel of response pieces, so at most `max_pipelined`
//! responses are buffered, each with at most `response_buffer_chunks` pieces.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info_span, Instrument};

use crate::cache::{FillTicket, Lookup};
use crate::error::HttpError;
use crate::framing::{encode_chunk, BodyDecoder, BodyKind, LAST_CHUNK};
use crate::head::{
    add_via, parse_request, parse_response, strip_hop_by_hop, write_headers, HeadError,
    HttpVersion, Parsed, RequestHead, ResponseHead,
};
use crate::ratelimit::TokenBucket;
use crate::{ConnectUpstream, HttpProxy};

/// What happened on one client connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientReport {
    /// Request heads parsed.
    pub requests: u64,
    /// Requests refused by the proxy itself (400/429/431).
    pub rejected: u64,
    /// CONNECT tunnels established.
    pub tunnels: u64,
    /// Bytes written to the client (heads and bodies, tunnel bytes included).
    pub bytes_to_client: u64,
    /// Bytes read from the client (request heads and bodies, tunnel bytes included; the
    /// discarded rest of a rejected request is not counted).
    pub bytes_from_client: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    rejected: AtomicU64,
    tunnels: AtomicU64,
    bytes_to_client: AtomicU64,
    bytes_from_client: AtomicU64,
}

/// A piece of one response on its way to the writer.
enum Part {
    Data(Bytes),
    /// The response is complete; close the connection after it if `close`.
    End {
        close: bool,
    },
}

/// A piece of a request body on its way to the fetch task.
enum BodyPiece {
    Data(Bytes),
    End,
}

/// One request's place in the response order.
enum Slot {
    Response {
        parts: mpsc::Receiver<Part>,
        done: oneshot::Sender<()>,
    },
    Tunnel {
        head: Box<RequestHead>,
        read_half: OwnedReadHalf,
        leftover: BytesMut,
    },
}

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

/// How the body goes to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientFraming {
    None,
    Length,
    Chunked,
    Close,
}

/// Sends response pieces to the writer; remembers whether the head went out.
struct ClientSink {
    tx: mpsc::Sender<Part>,
    head_sent: bool,
}

impl ClientSink {
    async fn send(&mut self, data: Bytes) -> Result<(), HttpError> {
        self.tx
            .send(Part::Data(data))
            .await
            .map_err(|_| HttpError::ClientGone)
    }

    async fn send_head(&mut self, data: Bytes) -> Result<(), HttpError> {
        self.head_sent = true;
        self.send(data).await
    }

    async fn end(&mut self, close: bool) -> Result<(), HttpError> {
        self.tx
            .send(Part::End { close })
            .await
            .map_err(|_| HttpError::ClientGone)
    }
}

fn reason(status: StatusCode) -> &'static str {
    status.canonical_reason().unwrap_or("")
}

/// A complete short response produced by the proxy itself.
fn simple_response(status: StatusCode, via_name: &str, close: bool) -> Bytes {
    let body = format!("{} {}\n", status.as_str(), reason(status));
    let connection = if close { "close" } else { "keep-alive" };
    format!(
        "HTTP/1.1 {} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nVia: 1.1 {via_name}\r\nConnection: {connection}\r\n\r\n{body}",
        status.as_str(),
        reason(status),
        body.len()
    )
    .into()
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

fn host_header(head: &RequestHead) -> String {
    let host = if head.origin.host.contains(':') {
        format!("[{}]", head.origin.host)
    } else {
        head.origin.host.clone()
    };
    if head.origin.port == 80 {
        host
    } else {
        format!("{host}:{}", head.origin.port)
    }
}

/// Serializes the request as sent upstream (origin-form, HTTP/1.1, our framing fields).
fn upstream_request_bytes(method: &Method, head: &RequestHead, headers: &HeaderMap) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(
        format!(
            "{} {} HTTP/1.1\r\nHost: {}\r\n",
            method,
            head.path_and_query,
            host_header(head)
        )
        .as_bytes(),
    );
    let mut headers = headers.clone();
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    write_headers(&mut out, &headers);
    match head.body {
        BodyKind::Length(n) => out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes()),
        BodyKind::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        BodyKind::Empty | BodyKind::CloseDelimited => {}
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Builds the response head for the client and decides framing and closing.
fn client_response_head(
    status: StatusCode,
    mut headers: HeaderMap,
    upstream_body: BodyKind,
    client: &RequestHead,
    via_name: &str,
) -> (Bytes, ClientFraming, bool) {
    strip_hop_by_hop(&mut headers);
    add_via(&mut headers, via_name);
    let framing = match upstream_body {
        BodyKind::Empty => {
            // HEAD and 304 keep Content-Length as metadata; 1xx/204 must not carry it.
            if status == StatusCode::NO_CONTENT || status.is_informational() {
                headers.remove(header::CONTENT_LENGTH);
            }
            ClientFraming::None
        }
        BodyKind::Length(n) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            ClientFraming::Length
        }
        BodyKind::Chunked | BodyKind::CloseDelimited => {
            headers.remove(header::CONTENT_LENGTH);
            if client.version == HttpVersion::Http11 {
                headers.insert(
                    header::TRANSFER_ENCODING,
                    HeaderValue::from_static("chunked"),
                );
                ClientFraming::Chunked
            } else {
                ClientFraming::Close
            }
        }
    };
    let close = !client.keep_alive || framing == ClientFraming::Close;
    if close {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    } else if client.version == HttpVersion::Http10 {
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
    }
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(
        format!("HTTP/1.1 {} {}\r\n", status.as_str(), reason(status)).as_bytes(),
    );
    write_headers(&mut out, &headers);
    out.extend_from_slice(b"\r\n");
    (out.into(), framing, close)
}

/// An upstream response whose head has been read.
struct UpstreamResponse {
    conn: TcpStream,
    head: ResponseHead,
    body: BodyKind,
    /// Bytes read past the head.
    buf: BytesMut,
}

/// Where a relayed body should also be stored.
struct StorePlan {
    key: String,
    policy: http_cache_semantics::CachePolicy,
}

impl HttpProxy {
    /// Serves one accepted client connection until it closes (keep-alive, pipelining, CONNECT).
    pub async fn serve_client(
        self: &Arc<Self>,
        client: TcpStream,
        peer: SocketAddr,
        connect_upstream: ConnectUpstream,
        cancel: CancellationToken,
    ) -> Result<ClientReport, HttpError> {
        let span = info_span!("http_client", %peer);
        async move {
            let (read_half, write_half) = client.into_split();
            let (slot_tx, slot_rx) = mpsc::channel(self.config.client.max_pipelined);
            let conn = ClientConn {
                proxy: self.clone(),
                connect: connect_upstream,
                counters: Counters::default(),
                outstanding: AtomicUsize::new(0),
                stop: cancel.child_token(),
                fetches: TaskTracker::new(),
            };
            let reader = RequestReader {
                conn: &conn,
                read_half,
                buf: BytesMut::with_capacity(self.config.chunk_bytes),
                slot_tx,
            };
            let writer = ResponseWriter {
                conn: &conn,
                write_half,
                slot_rx,
            };
            let (read_result, write_result) = tokio::join!(reader.run(), async {
                let result = writer.run().await;
                // The writer is done (close requested, client gone or error): stop reading too.
                conn.stop.cancel();
                result
            });
            // Fetch tasks end with their response or when `stop` fires; none outlives the client.
            conn.fetches.close();
            conn.fetches.wait().await;
            read_result?;
            write_result?;
            Ok(conn.counters.report())
        }
        .instrument(span)
        .await
    }
}

impl Counters {
    fn report(&self) -> ClientReport {
        ClientReport {
            requests: self.requests.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            tunnels: self.tunnels.load(Ordering::Relaxed),
            bytes_to_client: self.bytes_to_client.load(Ordering::Relaxed),
            bytes_from_client: self.bytes_from_client.load(Ordering::Relaxed),
        }
    }
}

/// What one client connection carries through its life, shared by its two sides (the
/// [`RequestReader`] and the [`ResponseWriter`], which run concurrently in the connection's
/// task and its span) and handed, by clone, to the fetch tasks.
struct ClientConn {
    /// Config, upstream pool, cache and metrics.
    proxy: Arc<HttpProxy>,
    connect: ConnectUpstream,
    counters: Counters,
    /// Responses queued but not fully written (the idle timeout pauses while any are).
    outstanding: AtomicUsize,
    /// Fires when the connection ends (writer done or the server stopping).
    stop: CancellationToken,
    fetches: TaskTracker,
}

/// The client-to-proxy side: parses requests, queues their slots, forwards request bodies.
struct RequestReader<'c> {
    conn: &'c ClientConn,
    read_half: OwnedReadHalf,
    /// Client bytes read but not yet consumed.
    buf: BytesMut,
    slot_tx: mpsc::Sender<Slot>,
}

/// The proxy-to-client side: writes responses in request order, then maybe a tunnel.
struct ResponseWriter<'c> {
    conn: &'c ClientConn,
    write_half: OwnedWriteHalf,
    slot_rx: mpsc::Receiver<Slot>,
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
                        conn.counters.bytes_from_client.fetch_add(read as u64, Ordering::Relaxed);
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

    async fn run(mut self) -> Result<(), HttpError> {
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

            let (parts_tx, parts_rx) = mpsc::channel(proxy.config.response_buffer_chunks);
            let (done_tx, done_rx) = oneshot::channel();
            conn.outstanding.fetch_add(1, Ordering::AcqRel);
            if self
                .slot_tx
                .send(Slot::Response {
                    parts: parts_rx,
                    done: done_tx,
                })
                .await
                .is_err()
            {
                return Ok(());
            }
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

    /// Queues a proxy-made error response, then drains (bounded) what the client still sends
    /// so the close is clean (no reset that could destroy the response in flight).
    async fn reject(mut self, status: StatusCode) -> Result<(), HttpError> {
        let conn = self.conn;
        conn.counters.rejected.fetch_add(1, Ordering::Relaxed);
        conn.proxy.metrics.bad_requests.inc();
        let (parts_tx, parts_rx) = mpsc::channel(2);
        let (done_tx, _done_rx) = oneshot::channel();
        conn.outstanding.fetch_add(1, Ordering::AcqRel);
        if self
            .slot_tx
            .send(Slot::Response {
                parts: parts_rx,
                done: done_tx,
            })
            .await
            .is_err()
        {
            return Ok(());
        }
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

impl ResponseWriter<'_> {
    async fn run(mut self) -> Result<(), HttpError> {
        let conn = self.conn;
        loop {
            let slot = tokio::select! {
                _ = conn.stop.cancelled() => return Ok(()),
                slot = self.slot_rx.recv() => match slot { Some(slot) => slot, None => return Ok(()) },
            };
            match slot {
                Slot::Response { mut parts, done } => loop {
                    let part = tokio::select! {
                        _ = conn.stop.cancelled() => return Ok(()),
                        part = parts.recv() => part,
                    };
                    match part {
                        Some(Part::Data(bytes)) => {
                            self.write_half
                                .write_all(&bytes)
                                .await
                                .map_err(HttpError::ClientIo)?;
                            conn.counters
                                .bytes_to_client
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
                        // so the only honest signal left is closing the connection.
                        None => {
                            let _ = self.write_half.shutdown().await;
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

    async fn tunnel(
        self,
        head: RequestHead,
        read_half: OwnedReadHalf,
        leftover: BytesMut,
    ) -> Result<(), HttpError> {
        let conn = self.conn;
        let proxy = &conn.proxy;
        let mut write_half = self.write_half;
        let mut upstream = match proxy.connect_origin(&head, &conn.connect).await {
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
        let mut client = read_half
            .reunite(write_half)
            .expect("halves of the same stream");
        upstream
            .write_all(&leftover)
            .await
            .map_err(HttpError::UpstreamIo)?;
        tokio::select! {
            _ = conn.stop.cancelled() => Ok(()),
            result = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
                // Peers resetting a tunnel is their business, not a proxy error.
                if let Ok((from_client, to_client)) = result {
                    conn.counters.bytes_to_client.fetch_add(to_client, Ordering::Relaxed);
                    conn.counters.bytes_from_client.fetch_add(from_client, Ordering::Relaxed);
                }
                Ok(())
            }
        }
    }
}

impl HttpProxy {
    /// Resolves the origin and makes a fresh upstream connection through `connect`.
    async fn connect_origin(
        &self,
        head: &RequestHead,
        connect: &ConnectUpstream,
    ) -> Result<TcpStream, HttpError> {
        let mut addrs = tokio::net::lookup_host((head.origin.host.as_str(), head.origin.port))
            .await
            .map_err(HttpError::UpstreamIo)?;
        let addr = addrs.next().ok_or_else(|| {
            HttpError::UpstreamIo(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "origin name has no address",
            ))
        })?;
        let stream = connect(addr).await.map_err(HttpError::UpstreamIo)?;
        self.pool
            .prepare_new(&stream)
            .map_err(HttpError::UpstreamIo)?;
        Ok(stream)
    }

    /// Runs one request to completion and maps failures to error responses.
    async fn fetch(
        self: Arc<Self>,
        head: RequestHead,
        body: Option<mpsc::Receiver<BodyPiece>>,
        mut sink: ClientSink,
        wait_for: Option<oneshot::Receiver<()>>,
        connect: ConnectUpstream,
    ) {
        if let Some(previous) = wait_for {
            // Non-idempotent: only start once every earlier response is out.
            if previous.await.is_err() {
                return;
            }
        }
        let has_body = body.is_some();
        let keep_alive = head.keep_alive;
        if let Err(error) = self.handle(&head, body, &mut sink, &connect).await {
            debug!(%error, uri = %head.uri, "request failed");
            if sink.head_sent || matches!(error, HttpError::ClientGone) {
                return; // dropping the sink makes the writer close the connection
            }
            let status = match error {
                HttpError::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
                _ if error.is_denied_destination() => StatusCode::FORBIDDEN,
                _ => StatusCode::BAD_GATEWAY,
            };
            // With an unread request body the connection cannot be reused safely.
            let close = !keep_alive || has_body;
            if sink
                .send_head(simple_response(status, &self.config.via_name, close))
                .await
                .is_ok()
            {
                let _ = sink.end(close).await;
            }
        }
    }

    async fn handle(
        &self,
        head: &RequestHead,
        body: Option<mpsc::Receiver<BodyPiece>>,
        sink: &mut ClientSink,
        connect: &ConnectUpstream,
    ) -> Result<(), HttpError> {
        let mut headers = head.headers.clone();
        let expects_continue = headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        headers.remove(header::EXPECT);
        strip_hop_by_hop(&mut headers);
        add_via(&mut headers, &self.config.via_name);
        if expects_continue && head.version == HttpVersion::Http11 {
            // We stream the body upstream anyway; tell the client to go ahead at once.
            sink.send(Bytes::from_static(b"HTTP/1.1 100 Continue\r\n\r\n"))
                .await?;
        }
        let key = head.uri.to_string();
        let safe = matches!(
            head.method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        );
        if !safe {
            self.cache.remove(&key);
        }
        let cacheable = self.cache.enabled()
            && head.method == Method::GET
            && body.is_none()
            && !headers.contains_key(header::RANGE);
        if !cacheable {
            let request = upstream_request_bytes(&head.method, head, &headers);
            let response = self.exchange(head, &request, body, connect).await?;
            return self.relay_response(head, response, sink, None).await;
        }

        let mut request_parts = http::Request::builder()
            .method(Method::GET)
            .uri(head.uri.clone())
            .body(())
            .expect("method and uri are already valid")
            .into_parts()
            .0;
        request_parts.headers = headers;
        let mut waited = false;
        // Two rounds at most: one wait behind another fetch of the same key, then go.
        for _ in 0..2 {
            let lookup = self.cache.lookup(&key, &request_parts, SystemTime::now());
            if let Lookup::Fresh { response, body } = lookup {
                self.metrics.cache_hits.inc();
                return self.serve_cached(head, response, body, sink).await;
            }
            let _guard = if waited {
                None
            } else {
                match self.cache.begin_fill(&key) {
                    FillTicket::Leader(guard) => Some(guard),
                    FillTicket::Follower(mut wait) => {
                        waited = true;
                        let _ = tokio::time::timeout(self.pool.response_timeout(), wait.changed())
                            .await;
                        continue;
                    }
                }
            };
            return match lookup {
                Lookup::Fresh { .. } => unreachable!("handled above"),
                Lookup::Stale {
                    request,
                    policy,
                    body: stored_body,
                } => {
                    self.metrics.cache_revalidations.inc();
                    let bytes = upstream_request_bytes(&Method::GET, head, &request.headers);
                    let response = self.exchange(head, &bytes, None, connect).await?;
                    let response_parts = response_parts(&response.head);
                    match self.cache.after_revalidation(
                        &policy,
                        &request_parts,
                        &response_parts,
                        SystemTime::now(),
                    ) {
                        http_cache_semantics::AfterResponse::NotModified(new_policy, merged)
                            if response.head.status == StatusCode::NOT_MODIFIED =>
                        {
                            self.finish_upstream(head, response);
                            self.cache.refresh(&key, new_policy);
                            self.metrics.cache_hits.inc();
                            self.serve_cached(head, merged, stored_body, sink).await
                        }
                        http_cache_semantics::AfterResponse::NotModified(new_policy, _)
                        | http_cache_semantics::AfterResponse::Modified(new_policy, _) => {
                            self.metrics.cache_misses.inc();
                            let plan = new_policy.is_storable().then(|| StorePlan {
                                key: key.clone(),
                                policy: new_policy,
                            });
                            if plan.is_none() {
                                self.cache.remove(&key);
                            }
                            self.relay_response(head, response, sink, plan).await
                        }
                    }
                }
                Lookup::Miss => {
                    self.metrics.cache_misses.inc();
                    let bytes = upstream_request_bytes(&Method::GET, head, &request_parts.headers);
                    let response = self.exchange(head, &bytes, None, connect).await?;
                    let policy = self.cache.policy_for(
                        &request_parts,
                        &response_parts(&response.head),
                        SystemTime::now(),
                    );
                    let plan = policy.is_storable().then(|| StorePlan {
                        key: key.clone(),
                        policy,
                    });
                    self.relay_response(head, response, sink, plan).await
                }
            };
        }
        unreachable!("the second round never waits")
    }

    /// Sends a stored response to the client.
    async fn serve_cached(
        &self,
        head: &RequestHead,
        response: http::response::Parts,
        body: Bytes,
        sink: &mut ClientSink,
    ) -> Result<(), HttpError> {
        let (head_bytes, framing, close) = client_response_head(
            response.status,
            response.headers,
            BodyKind::Length(body.len() as u64),
            head,
            &self.config.via_name,
        );
        debug_assert_eq!(framing, ClientFraming::Length);
        sink.send_head(head_bytes).await?;
        let mut offset = 0;
        while offset < body.len() {
            let end = (offset + self.config.chunk_bytes).min(body.len());
            sink.send(body.slice(offset..end)).await?;
            self.metrics
                .cache_bytes_served
                .inc_by((end - offset) as u64);
            offset = end;
        }
        sink.end(close).await
    }

    /// Sends the request on a pooled or new connection and reads the response head.
    /// A pooled connection that turns out closed is retried once on a fresh one when the
    /// request has no body (nothing was consumed from the client).
    async fn exchange(
        &self,
        head: &RequestHead,
        request: &[u8],
        mut body: Option<mpsc::Receiver<BodyPiece>>,
        connect: &ConnectUpstream,
    ) -> Result<UpstreamResponse, HttpError> {
        let authority = head.origin.authority();
        for attempt in 0..2 {
            let pooled = if attempt == 0 {
                self.pool.checkout(&authority)
            } else {
                None
            };
            let reused = pooled.is_some();
            let mut conn = match pooled {
                Some(conn) => conn,
                None => self.connect_origin(head, connect).await?,
            };
            let result = self
                .send_and_read_head(&mut conn, head, request, body.as_mut())
                .await;
            match result {
                Ok((response_head, body_kind, buf)) => {
                    return Ok(UpstreamResponse {
                        conn,
                        head: response_head,
                        body: body_kind,
                        buf,
                    });
                }
                Err(error) if reused && head.is_idempotent() && error.is_retryable_upstream() => {
                    debug!(%error, "pooled upstream connection failed; retrying on a fresh one");
                }
                Err(error) => return Err(error),
            }
        }
        Err(HttpError::UpstreamIo(std::io::Error::other(
            "upstream retry failed",
        )))
    }

    async fn send_and_read_head(
        &self,
        conn: &mut TcpStream,
        head: &RequestHead,
        request: &[u8],
        body: Option<&mut mpsc::Receiver<BodyPiece>>,
    ) -> Result<(ResponseHead, BodyKind, BytesMut), HttpError> {
        conn.write_all(request)
            .await
            .map_err(HttpError::UpstreamIo)?;
        if let Some(body) = body {
            let chunked = head.body == BodyKind::Chunked;
            loop {
                match body.recv().await {
                    Some(BodyPiece::Data(data)) => {
                        let framed = if chunked { encode_chunk(&data) } else { data };
                        conn.write_all(&framed)
                            .await
                            .map_err(HttpError::UpstreamIo)?;
                    }
                    Some(BodyPiece::End) => break,
                    // The client side failed mid-body: do not send a truncated request on.
                    None => return Err(HttpError::ClientGone),
                }
            }
            if chunked {
                conn.write_all(LAST_CHUNK)
                    .await
                    .map_err(HttpError::UpstreamIo)?;
            }
        }
        let mut buf = BytesMut::with_capacity(self.config.chunk_bytes);
        let timeout = self.pool.response_timeout();
        // Bounded: each round reads at least one byte or fails; heads are size-capped.
        loop {
            match parse_response(&buf, self.config.client.max_header_bytes)
                .map_err(HttpError::UpstreamHead)?
            {
                Parsed::Complete(response, len) => {
                    let _ = buf.split_to(len);
                    if response.status.is_informational() {
                        if response.status == StatusCode::SWITCHING_PROTOCOLS {
                            return Err(HttpError::UpstreamHead(HeadError::Status));
                        }
                        continue; // 100 Continue and friends: wait for the final response
                    }
                    let kind = response
                        .body_kind(&head.method)
                        .map_err(HttpError::UpstreamHead)?;
                    return Ok((response, kind, buf));
                }
                Parsed::Partial => {
                    buf.reserve(self.config.chunk_bytes);
                    let read = tokio::time::timeout(timeout, conn.read_buf(&mut buf))
                        .await
                        .map_err(|_| HttpError::UpstreamTimeout)?
                        .map_err(HttpError::UpstreamIo)?;
                    if read == 0 {
                        return Err(HttpError::UpstreamIo(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "upstream closed before a response head",
                        )));
                    }
                }
            }
        }
    }

    /// Returns a connection with no body left to read to the pool when the origin allows it.
    fn finish_upstream(&self, head: &RequestHead, response: UpstreamResponse) {
        if response.head.keep_alive() && response.body == BodyKind::Empty && response.buf.is_empty()
        {
            self.pool.checkin(&head.origin.authority(), response.conn);
        }
    }

    /// Streams the upstream body to the client, storing it on the way if planned.
    async fn relay_response(
        &self,
        head: &RequestHead,
        response: UpstreamResponse,
        sink: &mut ClientSink,
        mut plan: Option<StorePlan>,
    ) -> Result<(), HttpError> {
        let UpstreamResponse {
            mut conn,
            head: response_head,
            body: body_kind,
            mut buf,
        } = response;
        let (head_bytes, framing, close) = client_response_head(
            response_head.status,
            response_head.headers.clone(),
            body_kind,
            head,
            &self.config.via_name,
        );
        sink.send_head(head_bytes).await?;
        let max_object = self.cache.max_object_bytes();
        if let BodyKind::Length(n) = body_kind {
            if n > max_object {
                plan = None;
            }
        }
        let mut stored = BytesMut::new();
        let mut decoder = BodyDecoder::new(body_kind);
        let timeout = self.pool.response_timeout();
        while !decoder.is_done() {
            let step = decoder.step(&buf).map_err(HttpError::UpstreamBody)?;
            if step.consumed == 0 {
                buf.reserve(self.config.chunk_bytes);
                let read = tokio::time::timeout(timeout, conn.read_buf(&mut buf))
                    .await
                    .map_err(|_| HttpError::UpstreamTimeout)?
                    .map_err(HttpError::UpstreamIo)?;
                if read == 0 {
                    decoder.finish_on_eof().map_err(HttpError::UpstreamBody)?;
                }
                continue;
            }
            let consumed = buf.split_to(step.consumed).freeze();
            let payload = consumed.slice(step.payload);
            if payload.is_empty() {
                continue;
            }
            if plan.is_some() {
                if (stored.len() + payload.len()) as u64 > max_object {
                    plan = None;
                    stored = BytesMut::new();
                } else {
                    stored.extend_from_slice(&payload);
                }
            }
            let framed = if framing == ClientFraming::Chunked {
                encode_chunk(&payload)
            } else {
                payload
            };
            sink.send(framed).await?;
        }
        if framing == ClientFraming::Chunked {
            sink.send(Bytes::from_static(LAST_CHUNK)).await?;
        }
        // Pool and cache first, so the next request (maybe already waiting) finds them.
        if response_head.keep_alive() && body_kind != BodyKind::CloseDelimited && buf.is_empty() {
            self.pool.checkin(&head.origin.authority(), conn);
        }
        if let Some(plan) = plan {
            self.cache.store(&plan.key, plan.policy, stored.freeze());
        }
        sink.end(close).await
    }
}

fn response_parts(head: &ResponseHead) -> http::response::Parts {
    let mut parts = http::Response::builder()
        .status(head.status)
        .body(())
        .expect("status is already valid")
        .into_parts()
        .0;
    parts.headers = head.headers.clone();
    parts
}
