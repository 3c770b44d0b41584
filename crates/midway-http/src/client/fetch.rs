//! The upstream fetch: the task that answers one request. It consults the cache (fresh hit,
//! revalidation, miss, one fetch per key at a time), exchanges the request with the origin on a
//! pooled or new connection, relays the response body to the client's writer and stores it when
//! the cache policy allows. Failures before the head went out become error responses.

use std::sync::Arc;
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use http::header;
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tracing::debug;

use super::wire::{client_response_head, simple_response, upstream_request_bytes, ClientFraming};
use super::{BodyPiece, ClientSink};
use crate::cache::{FillTicket, Lookup};
use crate::error::HttpError;
use crate::framing::{encode_chunk, BodyDecoder, BodyKind, LAST_CHUNK};
use crate::head::{
    add_via, parse_response, strip_hop_by_hop, HeadError, HttpVersion, Parsed, RequestHead,
    ResponseHead,
};
use crate::{ConnectUpstream, HttpProxy};

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
    /// Resolves the origin and makes a fresh upstream connection through `connect`.
    pub(super) async fn connect_origin(
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
    pub(super) async fn fetch(
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

        let (mut request_parts, ()) = http::Request::new(()).into_parts();
        request_parts.method = Method::GET;
        request_parts.uri = head.uri.clone();
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
                        // A 304 that selects no stored response (no validator in it, or one that
                        // does not match; RFC 9111 §4.3.4) cannot refresh the entry, and a 304
                        // must not reach a client that did not ask conditionally: drop the entry
                        // and ask the origin again without conditions.
                        http_cache_semantics::AfterResponse::Modified(..)
                            if response.head.status == StatusCode::NOT_MODIFIED =>
                        {
                            self.finish_upstream(head, response);
                            self.cache.remove(&key);
                            self.fetch_and_store(head, &request_parts, key, sink, connect)
                                .await
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
                    self.fetch_and_store(head, &request_parts, key, sink, connect)
                        .await
                }
            };
        }
        unreachable!("the second round never waits")
    }

    /// A cache miss: the client's GET goes to the origin as it is, and the response is relayed
    /// and stored if its policy allows.
    async fn fetch_and_store(
        &self,
        head: &RequestHead,
        request_parts: &http::request::Parts,
        key: String,
        sink: &mut ClientSink,
        connect: &ConnectUpstream,
    ) -> Result<(), HttpError> {
        self.metrics.cache_misses.inc();
        let bytes = upstream_request_bytes(&Method::GET, head, &request_parts.headers);
        let response = self.exchange(head, &bytes, None, connect).await?;
        let policy = self.cache.policy_for(
            request_parts,
            &response_parts(&response.head),
            SystemTime::now(),
        );
        let plan = policy.is_storable().then_some(StorePlan { key, policy });
        self.relay_response(head, response, sink, plan).await
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
                    let read = self.read_upstream(conn, &mut buf).await?;
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

    /// Reads more of an upstream response into `buf`, at most one response timeout long; the
    /// one read of the upstream side, shared by the head and the body.
    async fn read_upstream(
        &self,
        conn: &mut TcpStream,
        buf: &mut BytesMut,
    ) -> Result<usize, HttpError> {
        buf.reserve(self.config.chunk_bytes);
        tokio::time::timeout(self.pool.response_timeout(), conn.read_buf(buf))
            .await
            .map_err(|_| HttpError::UpstreamTimeout)?
            .map_err(HttpError::UpstreamIo)
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
        while !decoder.is_done() {
            let step = decoder.step(&buf).map_err(HttpError::UpstreamBody)?;
            if step.consumed == 0 {
                let read = self.read_upstream(&mut conn, &mut buf).await?;
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
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = head.status;
    parts.headers = head.headers.clone();
    parts
}
