//! The harness of midway-http's tests (feature `http`): a hand-written HTTP/1.1 origin on loopback, a proxy listener and a raw client.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use midway_http::framing::{BodyDecoder, BodyKind};
use midway_http::head::{parse_request, parse_response, Parsed, ResponseHead};
use midway_http::{HttpProxy, HttpProxyConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Fixed validators for revalidation tests: the `ETag` of `/etag` responses.
pub const ETAG: &str = "\"v1\"";
/// The `Last-Modified` date of `/last-modified` responses, fixed for revalidation tests.
pub const LAST_MODIFIED: &str = "Mon, 02 Jan 2023 03:04:05 GMT";

/// What the origin saw.
#[derive(Default)]
pub struct OriginState {
    /// Requests per path.
    pub hits: Mutex<HashMap<String, u64>>,
    /// Conditional requests answered with 304.
    pub not_modified: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicUsize,
    /// Body bytes written by `/big/` responses.
    pub big_bytes_written: AtomicU64,
    /// Request heads seen by `/echo-headers`.
    pub last_headers: Mutex<Vec<(String, String)>>,
    /// Wakes `/wait-for-peer` once `/peer` arrived.
    pub peer_arrived: Notify,
    /// Released by tests to let `/gated` answer.
    pub gate: Notify,
}

impl OriginState {
    /// Requests the origin received for `path` so far.
    pub fn hits(&self, path: &str) -> u64 {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

/// The running origin of [`start_origin`]; stops on drop.
pub struct Origin {
    /// Address the origin listens on (127.0.0.1, a free port).
    pub addr: SocketAddr,
    /// What the origin saw, shared with its tasks.
    pub state: Arc<OriginState>,
    cancel: CancellationToken,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Starts the origin on 127.0.0.1:0. `small_send_buffer` shrinks SO_SNDBUF so byte counts
/// reflect what the reader really took.
pub async fn start_origin(small_send_buffer: bool) -> Origin {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = Arc::new(OriginState::default());
    let cancel = CancellationToken::new();
    let (st, token) = (state.clone(), cancel.clone());
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = token.cancelled() => return,
                accepted = listener.accept() => accepted.unwrap(),
            };
            if small_send_buffer {
                socket2::SockRef::from(&stream)
                    .set_send_buffer_size(32 * 1024)
                    .unwrap();
            }
            let id = st.connections.fetch_add(1, Ordering::SeqCst) + 1;
            let (st, token) = (st.clone(), token.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = token.cancelled() => {}
                    _ = serve_origin_connection(stream, id, st) => {}
                }
            });
        }
    });
    Origin {
        addr,
        state,
        cancel,
    }
}

async fn serve_origin_connection(
    mut stream: TcpStream,
    connection_id: usize,
    state: Arc<OriginState>,
) {
    let mut buf = BytesMut::with_capacity(8192);
    for _ in 0..10_000 {
        let head = loop {
            match parse_request(&buf, 64 * 1024) {
                Ok(Parsed::Complete(head, len)) => {
                    let _ = buf.split_to(len);
                    break head;
                }
                Ok(Parsed::Partial) => {
                    if stream.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                        return;
                    }
                }
                Err(_) => return,
            }
        };
        // Read the request body.
        let mut decoder = BodyDecoder::new(head.body);
        let mut body = Vec::new();
        while !decoder.is_done() {
            let step = decoder.step(&buf).unwrap();
            if step.consumed == 0 {
                if stream.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                    return;
                }
                continue;
            }
            body.extend_from_slice(&buf[step.payload.clone()]);
            let _ = buf.split_to(step.consumed);
        }
        let path = head.path_and_query.clone();
        *state.hits.lock().unwrap().entry(path.clone()).or_default() += 1;
        let header = |name: &str| {
            head.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let count = state.hits(&path);
        let mut extra = String::new();
        let mut status = "200 OK";
        let mut close = false;
        let content: Vec<u8>;
        let mut chunked = false;
        match path.as_str() {
            p if p.starts_with("/len/") => {
                let n: usize = p[5..].parse().unwrap();
                content = (0..n).map(|i| (i % 251) as u8).collect();
                extra.push_str("Cache-Control: no-store\r\n");
            }
            "/chunked" => {
                content = b"chunked body in three parts".to_vec();
                chunked = true;
                extra.push_str("Cache-Control: no-store\r\n");
            }
            "/close-delimited" => {
                let body = b"until the end";
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
                    .await;
                let _ = stream.write_all(body).await;
                return;
            }
            "/echo-headers" => {
                let lines: Vec<(String, String)> = head
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                    .collect();
                content = lines
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}\n"))
                    .collect::<String>()
                    .into_bytes();
                *state.last_headers.lock().unwrap() = lines;
                extra.push_str("Cache-Control: no-store\r\nConnection: X-Hop, keep-alive\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\nX-End: kept\r\n");
            }
            "/echo-body" => {
                content = format!(
                    "{} bytes, sum {}",
                    body.len(),
                    body.iter().map(|&b| b as u64).sum::<u64>()
                )
                .into_bytes();
            }
            "/conn-id" => {
                content = format!("{connection_id}").into_bytes();
                extra.push_str("Cache-Control: no-store\r\n");
            }
            "/wait-for-peer" => {
                // Answered only once /peer arrived on another connection: a proxy that
                // fetches pipelined requests one after the other never gets here.
                tokio::time::timeout(Duration::from_secs(10), state.peer_arrived.notified())
                    .await
                    .unwrap();
                content = b"first".to_vec();
                extra.push_str("Cache-Control: no-store\r\n");
            }
            "/peer" => {
                state.peer_arrived.notify_one();
                content = b"second".to_vec();
                extra.push_str("Cache-Control: no-store\r\n");
            }
            "/gated" => {
                tokio::time::timeout(Duration::from_secs(10), state.gate.notified())
                    .await
                    .unwrap();
                content = format!("gated {count}").into_bytes();
                extra.push_str("Cache-Control: max-age=300\r\n");
            }
            p if p.starts_with("/max-age/") => {
                content = format!("max-age body {count}").into_bytes();
                extra.push_str(&format!("Cache-Control: max-age={}\r\n", &p[9..]));
            }
            "/no-store" => {
                content = format!("no-store body {count}").into_bytes();
                extra.push_str("Cache-Control: no-store\r\n");
            }
            "/pragma" => {
                content = format!("pragma body {count}").into_bytes();
                extra.push_str("Pragma: no-cache\r\n");
            }
            "/etag" => {
                extra.push_str(&format!(
                    "Cache-Control: max-age=0, must-revalidate\r\nETag: {ETAG}\r\n"
                ));
                if header("if-none-match").as_deref() == Some(ETAG) {
                    status = "304 Not Modified";
                    state.not_modified.fetch_add(1, Ordering::SeqCst);
                    content = Vec::new();
                } else {
                    content = b"etag body".to_vec();
                }
            }
            // Like Python's http.server: a validator in the 200, none in the 304.
            "/bare-304" => {
                if header("if-modified-since").as_deref() == Some(LAST_MODIFIED) {
                    status = "304 Not Modified";
                    state.not_modified.fetch_add(1, Ordering::SeqCst);
                    content = Vec::new();
                } else {
                    extra.push_str(&format!(
                        "Cache-Control: no-cache\r\nLast-Modified: {LAST_MODIFIED}\r\n"
                    ));
                    content = b"bare-304 body".to_vec();
                }
            }
            "/last-modified" => {
                extra.push_str(&format!(
                    "Cache-Control: no-cache\r\nLast-Modified: {LAST_MODIFIED}\r\n"
                ));
                if header("if-modified-since").as_deref() == Some(LAST_MODIFIED) {
                    status = "304 Not Modified";
                    state.not_modified.fetch_add(1, Ordering::SeqCst);
                    content = Vec::new();
                } else {
                    content = b"last-modified body".to_vec();
                }
            }
            p if p.starts_with("/big/") => {
                let n: u64 = p[5..].parse().unwrap();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nCache-Control: no-store\r\n\r\n"
                );
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let piece = vec![b'x'; 16 * 1024];
                let mut left = n;
                while left > 0 {
                    let take = left.min(piece.len() as u64) as usize;
                    if stream.write_all(&piece[..take]).await.is_err() {
                        return;
                    }
                    state
                        .big_bytes_written
                        .fetch_add(take as u64, Ordering::SeqCst);
                    left -= take as u64;
                }
                continue;
            }
            _ => {
                status = "404 Not Found";
                content = b"no such path".to_vec();
                close = true;
            }
        }
        let method_is_head = head.method == http::Method::HEAD;
        let mut out = format!("HTTP/1.1 {status}\r\n{extra}").into_bytes();
        if status.starts_with("304") {
            out.extend_from_slice(b"\r\n");
        } else if chunked {
            out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            if !method_is_head {
                for part in content.chunks(9) {
                    out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
                    out.extend_from_slice(part);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
            }
        } else {
            out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", content.len()).as_bytes());
            if !method_is_head {
                out.extend_from_slice(&content);
            }
        }
        if stream.write_all(&out).await.is_err() || close {
            return;
        }
    }
}

/// A running proxy on 127.0.0.1:0.
pub struct ProxyHarness {
    /// Address the proxy listens on (127.0.0.1, a free port).
    pub addr: SocketAddr,
    /// The engine, for tests that look inside it.
    pub proxy: Arc<HttpProxy>,
    /// The registry holding the engine's metrics.
    pub registry: prometheus_client::registry::Registry,
    cancel: CancellationToken,
}

impl Drop for ProxyHarness {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl ProxyHarness {
    /// Value of one metric from the text exposition (0 if absent).
    pub fn metric(&self, name: &str) -> f64 {
        crate::metrics::metric(&crate::metrics::encode(&self.registry), name).unwrap_or(0.0)
    }
}

/// Starts the proxy with the plain upstream connector.
pub async fn start_proxy(config: HttpProxyConfig) -> ProxyHarness {
    start_proxy_with(config, HttpProxy::plain_connector()).await
}

/// Starts the proxy on 127.0.0.1:0 with `connect` as its upstream connector.
pub async fn start_proxy_with(
    config: HttpProxyConfig,
    connect: midway_http::ConnectUpstream,
) -> ProxyHarness {
    let mut registry = prometheus_client::registry::Registry::default();
    // Tunnels relay buffer-and-forward only, so the spool folder (the system's temp folder,
    // which exists) is never written.
    let relay = midway_relay::RelayResources::new(std::env::temp_dir(), 0, 16).unwrap();
    let proxy = HttpProxy::new(config, relay, &mut registry).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let (p, token) = (proxy.clone(), cancel.clone());
    tokio::spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                _ = token.cancelled() => return,
                accepted = listener.accept() => accepted.unwrap(),
            };
            let (p, connect, token) = (p.clone(), connect.clone(), token.child_token());
            tokio::spawn(async move {
                let _ = p
                    .serve_client(stream, peer, connect, token, Default::default(), None)
                    .await;
            });
        }
    });
    ProxyHarness {
        addr,
        proxy,
        registry,
        cancel,
    }
}

/// A raw client connection with its read buffer.
pub struct Client {
    /// The connection to the proxy or origin.
    pub stream: TcpStream,
    buf: BytesMut,
}

/// A response read by [`Client::read_response`].
pub struct Response {
    /// Status line and headers.
    pub head: ResponseHead,
    /// The body, decoded from its framing (length or chunked).
    pub body: Vec<u8>,
}

impl Response {
    /// Value of header `name`, if present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.headers.get(name).and_then(|v| v.to_str().ok())
    }
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Client {
    /// Connects to `addr`.
    pub async fn connect(addr: SocketAddr) -> Self {
        Self {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
        }
    }

    /// Writes `raw` as is (the test writes the request's bytes itself).
    pub async fn send(&mut self, raw: &str) {
        self.stream.write_all(raw.as_bytes()).await.unwrap();
    }

    /// Reads one response (bounded by a 10 s timeout).
    pub async fn read_response(&mut self, method: &http::Method) -> Response {
        tokio::time::timeout(Duration::from_secs(10), self.read_response_inner(method))
            .await
            .expect("response within 10 s")
    }

    async fn read_response_inner(&mut self, method: &http::Method) -> Response {
        let head = loop {
            match parse_response(&self.buf, 64 * 1024).unwrap() {
                Parsed::Complete(head, len) => {
                    let _ = self.buf.split_to(len);
                    if head.status.is_informational() {
                        continue;
                    }
                    break head;
                }
                Parsed::Partial => {
                    assert_ne!(
                        self.stream.read_buf(&mut self.buf).await.unwrap(),
                        0,
                        "EOF before response head"
                    );
                }
            }
        };
        let kind = if method == http::Method::CONNECT && head.status.is_success() {
            BodyKind::Empty // the tunnel starts right after the head
        } else {
            head.body_kind(method).unwrap()
        };
        let mut decoder = BodyDecoder::new(kind);
        let mut body = Vec::new();
        while !decoder.is_done() {
            let step = decoder.step(&self.buf).unwrap();
            if step.consumed == 0 {
                if self.stream.read_buf(&mut self.buf).await.unwrap() == 0 {
                    decoder.finish_on_eof().unwrap();
                }
                continue;
            }
            body.extend_from_slice(&self.buf[step.payload.clone()]);
            let _ = self.buf.split_to(step.consumed);
        }
        Response { head, body }
    }

    /// Bytes read past the last response.
    pub fn take_buffered(&mut self) -> Vec<u8> {
        self.buf.split().to_vec()
    }

    /// True if the peer closed cleanly (EOF, not reset) within 10 s and sent nothing more.
    pub async fn closed_cleanly(&mut self) -> bool {
        let mut rest = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(10), self.stream.read_to_end(&mut rest)).await;
        matches!(read, Ok(Ok(0))) && self.buf.is_empty()
    }
}

/// A proxy request for `path` on `origin` (absolute form, keep-alive).
pub fn get(origin: SocketAddr, path: &str) -> String {
    format!("GET http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\n\r\n")
}

/// Issues one GET through the proxy on a fresh connection.
pub async fn fetch(
    proxy: SocketAddr,
    origin: SocketAddr,
    path: &str,
    extra_headers: &str,
) -> Response {
    let mut client = Client::connect(proxy).await;
    client
        .send(&format!(
            "GET http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\n{extra_headers}\r\n"
        ))
        .await;
    client.read_response(&http::Method::GET).await
}

/// `items`, asserting the fixture list is not empty.
pub fn non_empty<T>(items: &[T]) -> &[T] {
    assert!(!items.is_empty(), "fixture list must not be empty");
    items
}
