//! The origin: an HTTP/1.x server for one [`SiteSpec`], answering for several host names.
//!
//! Why a small server on `httparse` rather than hyper's HTTP/1 server: the experiments hinge on
//! exactly how the origin treats persistent connections (the umts paper's Apache defaults), and
//! hyper does not expose a per-connection request limit (`MaxKeepAliveRequests`), a keep-alive
//! idle timeout distinct from the header read timeout, the `Keep-Alive: timeout=, max=`
//! header, or Apache's lingering close. Here every one of those is a line of code:
//! - keep-alive idle timeout: a persistent connection with nothing buffered is closed after
//!   `keepalive_timeout` of silence (a request being received gets [`REQUEST_READ_TIMEOUT`]);
//! - at most `max_keepalive_requests` responses per connection, the last one says
//!   `Connection: close`; requests pipelined beyond it are left unanswered, as Apache does, and
//!   the client must retry them on a new connection;
//! - HTTP/1.0 requests close after the response unless they ask for `Connection: keep-alive`;
//!   HTTP/1.1 requests keep the connection unless they say `Connection: close`;
//! - pipelined requests are answered in order, as they are parsed from the buffer;
//! - bodies always carry `Content-Length`; `Cache-Control: max-age=N` or `no-cache`, a strong
//!   `ETag` (the checksum) and a fixed `Last-Modified`, with `304 Not Modified` for matching
//!   `If-None-Match` / `If-Modified-Since`; the checksum also goes in `x-midway-sum`;
//! - routing by `Host` (or the absolute-form request target), 404 for anything the site does
//!   not serve (browsers ask for `/favicon.ico`), 405 for methods other than GET and HEAD;
//! - closing is lingering like Apache's: shut down the sending side, then read and discard
//!   what the client still sends for a moment, so unread pipelined requests do not turn the
//!   close into a reset that would destroy responses still in flight.
//!
//! The origin runs a current-thread tokio runtime on a thread of its own; the listening socket
//! is created by the caller's thread, so it lives in the caller's network namespace.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::{timeout, Instant};

use crate::error::WebError;
use crate::site::{split_authority, Site, SiteSpec, SUM_HEADER};

/// Time allowed to receive a request head once a connection is new or a request has started
/// (Apache's `Timeout` is longer; nothing here needs more).
pub(crate) const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest request head accepted; larger ones get 431 and a close.
pub(crate) const MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;
/// How long a closing connection keeps reading (and discarding) before it is dropped.
const LINGER: Duration = Duration::from_secs(2);
/// Backlog of the listening socket: an HTTP/1.0 page opens one connection per object at once.
const LISTEN_BACKLOG: i32 = 1024;
/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Last-Modified of every body: fixed (bodies never change), so revalidation works across
/// origin restarts. 2024-01-01T00:00:00Z.
fn last_modified() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_704_067_200)
}

/// Counters of a running origin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OriginStats {
    /// TCP connections accepted.
    pub connections_accepted: u64,
    /// Responses sent (any status).
    pub requests_served: u64,
    /// 304 responses among them.
    pub not_modified: u64,
    /// 404 responses among them.
    pub not_found: u64,
    /// Connections closed because they stayed idle for `keepalive_timeout`.
    pub closed_idle: u64,
    /// Connections closed because they reached `max_keepalive_requests`.
    pub closed_max_requests: u64,
    /// Most responses sent on one connection.
    pub max_requests_per_connection: u64,
    /// Most complete requests found in the buffer after one read (> 1 means pipelining).
    pub max_requests_in_one_read: u64,
    /// Body bytes sent (200 responses to GET).
    pub body_bytes_sent: u64,
}

#[derive(Debug, Default)]
struct Counters {
    connections_accepted: AtomicU64,
    requests_served: AtomicU64,
    not_modified: AtomicU64,
    not_found: AtomicU64,
    closed_idle: AtomicU64,
    closed_max_requests: AtomicU64,
    max_requests_per_connection: AtomicU64,
    max_requests_in_one_read: AtomicU64,
    body_bytes_sent: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A running origin; dropping it stops the server and joins its thread.
#[derive(Debug)]
pub struct Origin {
    local_addr: SocketAddr,
    counters: Arc<Counters>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Origin {
    /// Binds `listen` (in the caller's network namespace) and serves `site` on a thread of its
    /// own.
    pub fn start(listen: SocketAddr, site: SiteSpec) -> Result<Origin, WebError> {
        let site = Arc::new(Site::new(site)?);
        let listener = bind(listen).map_err(|source| WebError::Bind {
            addr: listen,
            source,
        })?;
        let local_addr = listener.local_addr().map_err(|source| WebError::Bind {
            addr: listen,
            source,
        })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(WebError::Runtime)?;
        let counters = Arc::new(Counters::default());
        let (shutdown, stop) = oneshot::channel();
        let thread_counters = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name("midway-origin".into())
            .spawn(move || runtime.block_on(accept_loop(listener, site, thread_counters, stop)))
            .map_err(WebError::Runtime)?;
        Ok(Origin {
            local_addr,
            counters,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The address the origin listens on (with the port chosen when `listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A snapshot of the origin's counters.
    pub fn stats(&self) -> OriginStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        OriginStats {
            connections_accepted: get(&c.connections_accepted),
            requests_served: get(&c.requests_served),
            not_modified: get(&c.not_modified),
            not_found: get(&c.not_found),
            closed_idle: get(&c.closed_idle),
            closed_max_requests: get(&c.closed_max_requests),
            max_requests_per_connection: get(&c.max_requests_per_connection),
            max_requests_in_one_read: get(&c.max_requests_in_one_read),
            body_bytes_sent: get(&c.body_bytes_sent),
        }
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            // The receiver is gone only if the thread already ended; nothing left to stop.
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("origin thread panicked");
            }
        }
    }
}

fn bind(listen: SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(
        Domain::for_address(listen),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.bind(&listen.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

async fn accept_loop(
    listener: std::net::TcpListener,
    site: Arc<Site>,
    counters: Arc<Counters>,
    mut stop: oneshot::Receiver<()>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => {
            tracing::error!(error = %err, "origin cannot register its listener");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    bump(&counters.connections_accepted);
                    // Responses are written whole; Nagle would only delay the last segment.
                    if let Err(err) = stream.set_nodelay(true) {
                        tracing::debug!(%peer, error = %err, "cannot set TCP_NODELAY");
                    }
                    tokio::spawn(serve_connection(stream, Arc::clone(&site), Arc::clone(&counters)));
                }
                Err(err) => {
                    tracing::warn!(error = %err, "origin accept failed; backing off");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
}

/// A parsed request head, reduced to what the origin looks at.
#[derive(Debug, Default)]
struct Request {
    method: String,
    target: String,
    minor_version: u8,
    host: Option<String>,
    connection_close: bool,
    connection_keep_alive: bool,
    if_none_match: Option<String>,
    if_modified_since: Option<String>,
    has_body: bool,
}

enum Parsed {
    Complete(Request, usize),
    Partial,
    Invalid,
}

fn parse_request(buf: &[u8]) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut raw = httparse::Request::new(&mut headers);
    let consumed = match raw.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Invalid,
    };
    let mut request = Request {
        method: raw.method.unwrap_or_default().to_string(),
        target: raw.path.unwrap_or_default().to_string(),
        minor_version: raw.version.unwrap_or(0),
        ..Request::default()
    };
    for header in raw.headers.iter() {
        let value = String::from_utf8_lossy(header.value).trim().to_string();
        let name = header.name;
        if name.eq_ignore_ascii_case("host") {
            request.host = Some(value);
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                request.connection_close |= token.eq_ignore_ascii_case("close");
                request.connection_keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if name.eq_ignore_ascii_case("if-none-match") {
            request.if_none_match = Some(value);
        } else if name.eq_ignore_ascii_case("if-modified-since") {
            request.if_modified_since = Some(value);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            request.has_body = true;
        } else if name.eq_ignore_ascii_case("content-length") {
            request.has_body |= value != "0";
        }
    }
    Parsed::Complete(request, consumed)
}

/// Complete request heads at the start of `buf`.
fn complete_requests(buf: &[u8]) -> u64 {
    let mut count = 0;
    let mut at = 0;
    while let Parsed::Complete(_, len) = parse_request(&buf[at..]) {
        count += 1;
        at += len;
    }
    count
}

/// Why a connection ends.
enum Close {
    /// The client closed or reset it.
    Peer,
    /// Idle longer than the keep-alive timeout.
    Idle,
    /// The last response said `Connection: close`.
    AfterResponse,
    /// The request head was bad, too large or too slow.
    BadRequest,
}

async fn serve_connection(mut stream: TcpStream, site: Arc<Site>, counters: Arc<Counters>) {
    let local_port = stream.local_addr().map(|a| a.port()).unwrap_or(80);
    let spec = &site.spec;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut served: u32 = 0;
    let close = loop {
        match parse_request(&buf) {
            Parsed::Complete(request, consumed) => {
                buf.drain(..consumed);
                served += 1;
                let last_allowed = served >= spec.max_keepalive_requests;
                let response = respond(&site, &request, local_port, served, &counters);
                // Counted before the write, so a client that has read the response sees it
                // in the stats.
                bump(&counters.requests_served);
                counters
                    .max_requests_per_connection
                    .fetch_max(u64::from(served), Ordering::Relaxed);
                if !response.keep_alive && last_allowed {
                    bump(&counters.closed_max_requests);
                }
                if stream.write_all(&response.bytes).await.is_err() {
                    break Close::Peer;
                }
                if !response.keep_alive {
                    break Close::AfterResponse;
                }
                continue;
            }
            // The connection closes right after these answers; if the client is already gone
            // there is nobody to tell, so a failed write changes nothing.
            Parsed::Invalid => {
                let _ = stream.write_all(&error_response(400, "Bad Request")).await;
                break Close::BadRequest;
            }
            Parsed::Partial if buf.len() > MAX_REQUEST_HEAD_BYTES => {
                let _ = stream
                    .write_all(&error_response(431, "Request Header Fields Too Large"))
                    .await;
                break Close::BadRequest;
            }
            Parsed::Partial => {}
        }
        let waiting_between_requests = served > 0 && buf.is_empty();
        let limit = if waiting_between_requests {
            spec.keepalive_timeout
        } else {
            REQUEST_READ_TIMEOUT
        };
        match timeout(limit, stream.read_buf(&mut buf)).await {
            Err(_elapsed) if waiting_between_requests => break Close::Idle,
            Err(_elapsed) => break Close::BadRequest,
            Ok(Ok(0)) | Ok(Err(_)) => break Close::Peer,
            Ok(Ok(_)) => {
                counters
                    .max_requests_in_one_read
                    .fetch_max(complete_requests(&buf), Ordering::Relaxed);
            }
        }
    };
    if matches!(close, Close::Idle) {
        bump(&counters.closed_idle);
    }
    if !matches!(close, Close::Peer) {
        linger_close(stream).await;
    }
}

/// Shut down the sending side, then drain what the client still sends for a while, so the
/// client reads every response before it sees the end of the connection.
async fn linger_close(mut stream: TcpStream) {
    // A failed shutdown means the peer is gone already; dropping the socket is all that's left.
    if stream.shutdown().await.is_err() {
        return;
    }
    let deadline = Instant::now() + LINGER;
    let mut sink = [0u8; 4096];
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, stream.read(&mut sink)).await {
        if n == 0 {
            break;
        }
    }
}

struct Response {
    bytes: Vec<u8>,
    keep_alive: bool,
}

fn respond(
    site: &Site,
    request: &Request,
    local_port: u16,
    served: u32,
    counters: &Counters,
) -> Response {
    let spec = &site.spec;
    if request.has_body {
        return Response {
            bytes: error_response(400, "Bad Request"),
            keep_alive: false,
        };
    }
    let is_head = request.method == "HEAD";
    if request.method != "GET" && !is_head {
        return Response {
            bytes: error_response(405, "Method Not Allowed"),
            keep_alive: false,
        };
    }
    let wants_keep_alive = if request.minor_version == 0 {
        request.connection_keep_alive
    } else {
        !request.connection_close
    };
    let keep_alive = wants_keep_alive && served < spec.max_keepalive_requests;

    // Absolute form names the authority itself; origin form takes it from Host. An HTTP/1.0
    // request without Host gets the first site, like Apache's default virtual host.
    let (authority, path) = match request.target.strip_prefix("http://") {
        Some(rest) => match rest.find('/') {
            Some(slash) => (Some(rest[..slash].to_string()), rest[slash..].to_string()),
            None => (Some(rest.to_string()), "/".to_string()),
        },
        None => (request.host.clone(), request.target.clone()),
    };
    let (host, port) = match authority.as_deref() {
        Some(authority) => match split_authority(authority) {
            Some(host_port) => host_port,
            None => {
                return Response {
                    bytes: error_response(400, "Bad Request"),
                    keep_alive: false,
                }
            }
        },
        None if request.minor_version == 0 => (spec.hosts[0].clone(), local_port),
        None => {
            return Response {
                bytes: error_response(400, "Bad Request"),
                keep_alive: false,
            }
        }
    };

    let mut head = String::with_capacity(400);
    let resource = if site.has_host(&host) {
        site.resource(&host, &path)
    } else {
        None
    };
    let Some(resource) = resource else {
        bump(&counters.not_found);
        let body = b"not found\n";
        head.push_str("HTTP/1.1 404 Not Found\r\n");
        common_headers(&mut head, spec, keep_alive, served);
        head.push_str("Content-Type: text/plain\r\nCache-Control: no-cache\r\n");
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let mut bytes = head.into_bytes();
        if !is_head {
            bytes.extend_from_slice(body);
        }
        return Response { bytes, keep_alive };
    };

    let document = site.document(resource, port);
    let etag = format!("\"{:016x}\"", document.sum);
    let not_modified = is_not_modified(request, &etag);
    if not_modified {
        bump(&counters.not_modified);
        head.push_str("HTTP/1.1 304 Not Modified\r\n");
    } else {
        head.push_str("HTTP/1.1 200 OK\r\n");
    }
    common_headers(&mut head, spec, keep_alive, served);
    match spec.cache_max_age {
        Some(seconds) => head.push_str(&format!("Cache-Control: max-age={seconds}\r\n")),
        None => head.push_str("Cache-Control: no-cache\r\n"),
    }
    head.push_str(&format!(
        "ETag: {etag}\r\nLast-Modified: {}\r\n{SUM_HEADER}: {:016x}\r\n",
        httpdate::fmt_http_date(last_modified()),
        document.sum
    ));
    if not_modified {
        head.push_str("\r\n");
        return Response {
            bytes: head.into_bytes(),
            keep_alive,
        };
    }
    head.push_str(&format!(
        "Content-Type: {}\r\nContent-Length: {}\r\n\r\n",
        document.content_type,
        document.body.len()
    ));
    let mut bytes = head.into_bytes();
    if !is_head {
        counters
            .body_bytes_sent
            .fetch_add(document.body.len() as u64, Ordering::Relaxed);
        bytes.extend_from_slice(&document.body);
    }
    Response { bytes, keep_alive }
}

fn common_headers(head: &mut String, spec: &SiteSpec, keep_alive: bool, served: u32) {
    head.push_str(&format!(
        "Date: {}\r\nServer: midway-web-origin\r\n",
        httpdate::fmt_http_date(SystemTime::now())
    ));
    if keep_alive {
        head.push_str(&format!(
            "Connection: keep-alive\r\nKeep-Alive: timeout={}, max={}\r\n",
            spec.keepalive_timeout.as_secs(),
            spec.max_keepalive_requests - served
        ));
    } else {
        head.push_str("Connection: close\r\n");
    }
}

/// RFC 9110 section 13.2.2 order: If-None-Match decides when present (weak comparison for GET),
/// else If-Modified-Since.
fn is_not_modified(request: &Request, etag: &str) -> bool {
    if let Some(tags) = &request.if_none_match {
        return tags
            .split(',')
            .map(str::trim)
            .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == etag);
    }
    match request
        .if_modified_since
        .as_deref()
        .and_then(|date| httpdate::parse_http_date(date).ok())
    {
        Some(since) => last_modified() <= since,
        None => false,
    }
}

fn error_response(status: u16, reason: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {reason}\r\nServer: midway-web-origin\r\nConnection: close\r\n\
         Content-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(if_none_match: Option<&str>, if_modified_since: Option<&str>) -> Request {
        Request {
            method: "GET".into(),
            if_none_match: if_none_match.map(str::to_string),
            if_modified_since: if_modified_since.map(str::to_string),
            ..Request::default()
        }
    }

    #[test]
    fn conditional_requests_follow_rfc_9110_precedence() {
        let etag = "\"00000000000000ab\"";
        assert!(is_not_modified(&request(Some(etag), None), etag));
        assert!(is_not_modified(
            &request(Some("W/\"00000000000000ab\""), None),
            etag
        ));
        assert!(is_not_modified(
            &request(Some("\"x\", \"00000000000000ab\""), None),
            etag
        ));
        assert!(is_not_modified(&request(Some("*"), None), etag));
        // If-None-Match decides even when If-Modified-Since alone would say "not modified".
        let later = "Sat, 01 Jan 2050 00:00:00 GMT";
        assert!(!is_not_modified(&request(Some("\"x\""), Some(later)), etag));
        assert!(is_not_modified(&request(None, Some(later)), etag));
        let earlier = "Sat, 01 Jan 2000 00:00:00 GMT";
        assert!(!is_not_modified(&request(None, Some(earlier)), etag));
        assert!(!is_not_modified(&request(None, Some("yesterday")), etag));
        assert!(!is_not_modified(&request(None, None), etag));
    }

    #[test]
    fn pipelined_heads_are_counted() {
        let one = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut buf = one.repeat(3);
        buf.extend_from_slice(b"GET /b HTTP/1.1\r\nHo");
        assert_eq!(complete_requests(&buf), 3);
        assert_eq!(complete_requests(b""), 0);
    }
}
