//! The page loader: a browser-like HTTP/1.x client that loads a site's pages and times them.
//!
//! Why our own client: the experiments compare HTTP/1.0 (one connection per object), HTTP/1.1
//! keep-alive and HTTP/1.1 pipelining, directly and through proxies. No maintained Rust HTTP
//! client pipelines requests (hyper's client sends one request per connection at a time) or
//! lets the caller force one connection per object with HTTP/1.0, and none counts the TCP
//! connections it opens. So this is a small client on tokio and `httparse`.
//!
//! How a page loads, like a browser with an empty cache:
//! 1. the base document is fetched from `hosts[0]` (reusing an idle connection if there is one);
//! 2. its `src="..."` links are parsed; every link must be an object of the site;
//! 3. the objects are fetched over at most `max_connections_per_host` connections per host
//!    (per proxy when proxied, since then every request goes to the proxy), by the mode's rules:
//!    - HTTP/1.0: one request per new connection, closed after the response;
//!    - HTTP/1.1 keep-alive: a connection carries one outstanding request at a time and is kept
//!      for the next request, the next page, and idle periods in between;
//!    - pipelining: a connection gets a batch of up to [`PIPELINE_DEPTH`] requests written at
//!      once, the answers are read in order; the host's objects are shared evenly over its
//!      connections.
//!
//! A connection that closes before answering everything written to it (an origin's keep-alive
//! limit, an idle timeout that raced with reuse) has its unanswered requests put back at the
//! front of the queue and retried on a new connection, as browsers do; a request that several
//! connections in a row closed without a single answer is an error.
//!
//! Every body is checked against the site description: exact length and checksum (and the
//! `x-midway-sum` header when present). A short or corrupt body is an error, never a timing.
//!
//! Timing of a page: from just before its first network action (the connect of its base
//! document, or the request write when an idle connection is reused) to the last body byte of
//! its last object, the satellite paper's "first SYN to last byte".
//!
//! [`load_pages`] runs a current-thread tokio runtime on the calling thread, so every socket is
//! created in the calling thread's network namespace.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use futures::future::try_join_all;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::error::WebError;
use crate::site::{extract_links, fnv1a, parse_http_url, Resource, Site, SiteSpec, SUM_HEADER};

/// Most requests written at once on one pipelined connection.
pub const PIPELINE_DEPTH: usize = 8;
/// Connections in a row that may close without answering a request before the load fails.
pub const MAX_ATTEMPTS: u32 = 4;
/// Largest response head accepted.
const MAX_RESPONSE_HEAD_BYTES: usize = 64 * 1024;
/// Read granularity.
const READ_CHUNK: usize = 16 * 1024;

/// How the loader uses HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HttpMode {
    /// HTTP/1.0: one connection per object. Scenario string `"1.0"`.
    Http10,
    /// HTTP/1.1 persistent connections, one outstanding request each. Scenario string `"1.1"`.
    KeepAlive,
    /// HTTP/1.1 persistent connections with pipelined requests. Scenario string `"pipelining"`.
    Pipelining,
}

impl HttpMode {
    /// The scenario string of this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMode::Http10 => "1.0",
            HttpMode::KeepAlive => "1.1",
            HttpMode::Pipelining => "pipelining",
        }
    }
}

impl fmt::Display for HttpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HttpMode {
    type Err = WebError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "1.0" => Ok(HttpMode::Http10),
            "1.1" => Ok(HttpMode::KeepAlive),
            "pipelining" => Ok(HttpMode::Pipelining),
            other => Err(WebError::InvalidLoad {
                field: "http",
                problem: format!("is {other:?}; use \"1.0\", \"1.1\" or \"pipelining\""),
            }),
        }
    }
}

/// What the loader does about caches on the way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheMode {
    /// Plain requests. Scenario string `"plain"`.
    Plain,
    /// Requests carry `Pragma: no-cache` and `Cache-Control: no-cache`. Scenario string `"miss"`.
    ForceMiss,
    /// Every page is loaded once unmeasured first (fills a proxy cache), then measured.
    /// Scenario string `"hit"`.
    WarmHit,
}

impl CacheMode {
    /// The scenario string of this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheMode::Plain => "plain",
            CacheMode::ForceMiss => "miss",
            CacheMode::WarmHit => "hit",
        }
    }
}

impl fmt::Display for CacheMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CacheMode {
    type Err = WebError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "plain" => Ok(CacheMode::Plain),
            "miss" => Ok(CacheMode::ForceMiss),
            "hit" => Ok(CacheMode::WarmHit),
            other => Err(WebError::InvalidLoad {
                field: "cache",
                problem: format!("is {other:?}; use \"plain\", \"miss\" or \"hit\""),
            }),
        }
    }
}

/// What to load and how.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// The same description the origin got.
    pub site: SiteSpec,
    /// Host name -> address (used when `proxy` is `None`).
    pub resolve: BTreeMap<String, IpAddr>,
    /// Origin port (80 in the lab).
    pub port: u16,
    /// Explicit HTTP proxy: requests go to it in absolute form.
    pub proxy: Option<SocketAddr>,
    pub mode: HttpMode,
    /// Parallel connections per host name (per proxy when proxied); browsers use 6.
    pub max_connections_per_host: u32,
    pub cache: CacheMode,
    /// Pause between consecutive pages (idle time for upstream pools).
    pub think_time: Duration,
    /// The whole load must finish within this time.
    pub timeout: Duration,
}

/// Timing of one measured page.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PageTiming {
    pub page: u32,
    /// First network action of the page to the last byte of its last object.
    pub seconds: f64,
    /// Body bytes of the page (base document + objects).
    pub bytes: u64,
    /// Objects fetched for the page.
    pub objects: u32,
}

/// Outcome of a load.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadResult {
    /// One per measured page, in order.
    pub pages: Vec<PageTiming>,
    /// TCP connections the client opened while measuring (all pages; warm-up excluded).
    pub connections_opened: u32,
    /// Body bytes received for the measured pages.
    pub bytes: u64,
}

/// Loads pages `0..site.pages` in order like a browser; see the module docs.
///
/// Must be called from a plain thread (not inside a tokio runtime): it runs its own
/// current-thread runtime so its sockets belong to the calling thread's network namespace.
pub fn load_pages(spec: &LoadSpec) -> Result<LoadResult, WebError> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(WebError::InsideRuntime);
    }
    let site = Site::new(spec.site.clone())?;
    if spec.max_connections_per_host == 0 {
        return Err(WebError::InvalidLoad {
            field: "max_connections_per_host",
            problem: "is 0; browsers use 6".into(),
        });
    }
    if spec.proxy.is_none() {
        // Every host the pages use must resolve; unused ones may be missing.
        let used = 1 + site.spec.object_hosts as usize;
        for host in &site.spec.hosts[..used] {
            lookup(&spec.resolve, host)?;
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(WebError::Runtime)?;
    let loader = Loader {
        spec,
        site: &site,
        pool: RefCell::new(HashMap::new()),
        connections_opened: Cell::new(0),
    };
    runtime.block_on(async {
        match tokio::time::timeout(spec.timeout, loader.run()).await {
            Ok(result) => result,
            Err(_elapsed) => Err(WebError::Timeout {
                timeout: spec.timeout,
            }),
        }
    })
}

fn lookup(resolve: &BTreeMap<String, IpAddr>, host: &str) -> Result<IpAddr, WebError> {
    resolve
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(host))
        .map(|(_, addr)| *addr)
        .ok_or_else(|| WebError::Unresolved {
            host: host.to_string(),
        })
}

/// Connections are shared per origin host and port, or all go to the one proxy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ConnKey {
    Origin { host: String, port: u16 },
    Proxy,
}

struct Conn {
    stream: TcpStream,
    /// Bytes read but not yet consumed.
    buf: Vec<u8>,
}

/// One request to make.
#[derive(Debug, Clone)]
struct Fetch {
    host: String,
    port: u16,
    path: String,
    /// What the path names on the site (checked before the request is made).
    resource: Resource,
    /// Connections that closed without answering anything while this request was on them.
    failed_attempts: u32,
}

impl Fetch {
    fn authority(&self) -> String {
        if self.port == 80 {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    fn url(&self) -> String {
        format!("http://{}{}", self.authority(), self.path)
    }
}

/// A verified response.
struct Fetched {
    body: Vec<u8>,
    /// When its last byte arrived.
    finished: Instant,
}

struct Loader<'a> {
    spec: &'a LoadSpec,
    site: &'a Site,
    /// Idle persistent connections, kept across pages.
    pool: RefCell<HashMap<ConnKey, Vec<Conn>>>,
    connections_opened: Cell<u32>,
}

/// What one batch on one connection achieved.
struct Exchange {
    /// Requests of the batch answered (a prefix).
    answered: usize,
    /// Whether the connection may carry more requests.
    keep_alive: bool,
}

impl Loader<'_> {
    async fn run(&self) -> Result<LoadResult, WebError> {
        let phases: &[bool] = if self.spec.cache == CacheMode::WarmHit {
            &[true, false]
        } else {
            &[false]
        };
        let mut result = LoadResult {
            pages: Vec::new(),
            connections_opened: 0,
            bytes: 0,
        };
        for &warm_up in phases {
            for page in 0..self.site.spec.pages {
                if page > 0 && !self.spec.think_time.is_zero() {
                    tokio::time::sleep(self.spec.think_time).await;
                }
                let timing = self.load_page(page).await?;
                if !warm_up {
                    result.bytes += timing.bytes;
                    result.pages.push(timing);
                }
            }
            if warm_up {
                // The measured load starts like a new browser session: the warm-up only
                // served to fill caches on the way.
                self.pool.borrow_mut().clear();
                self.connections_opened.set(0);
            }
        }
        result.connections_opened = self.connections_opened.get();
        Ok(result)
    }

    async fn load_page(&self, page: u32) -> Result<PageTiming, WebError> {
        let spec = &self.site.spec;
        let start = Instant::now();
        let base = Fetch {
            host: spec.hosts[0].to_ascii_lowercase(),
            port: self.spec.port,
            path: SiteSpec::page_path(page),
            resource: Resource::Base { page },
            failed_attempts: 0,
        };
        let base_url = base.url();
        let mut fetched = self.fetch_all(self.key_for(&base), vec![base]).await?;
        let Some(base_doc) = fetched.pop() else {
            return Err(WebError::ConnectionClosed {
                url: base_url,
                attempts: 0,
            });
        };
        let mut end = base_doc.finished;
        let mut bytes = base_doc.body.len() as u64;

        let links = extract_links(&base_doc.body);
        if links.len() != spec.objects as usize {
            return Err(WebError::ObjectCount {
                page,
                found: links.len() as u32,
                expected: spec.objects,
            });
        }
        let mut groups: Vec<(ConnKey, Vec<Fetch>)> = Vec::new();
        for link in links {
            let (host, port, path) = match parse_http_url(&link) {
                Some(parts) => parts,
                None => return Err(WebError::UnexpectedLink { page, url: link }),
            };
            let Some(resource) = self.site.resource(&host, &path) else {
                return Err(WebError::UnexpectedLink { page, url: link });
            };
            let fetch = Fetch {
                host,
                port,
                path,
                resource,
                failed_attempts: 0,
            };
            let key = self.key_for(&fetch);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, fetches)) => fetches.push(fetch),
                None => groups.push((key, vec![fetch])),
            }
        }
        let objects = spec.objects;
        let per_host = try_join_all(
            groups
                .into_iter()
                .map(|(key, fetches)| self.fetch_all(key, fetches)),
        )
        .await?;
        for done in per_host.iter().flatten() {
            end = end.max(done.finished);
            bytes += done.body.len() as u64;
        }
        Ok(PageTiming {
            page,
            seconds: end.saturating_duration_since(start).as_secs_f64(),
            bytes,
            objects,
        })
    }

    fn key_for(&self, fetch: &Fetch) -> ConnKey {
        match self.spec.proxy {
            Some(_) => ConnKey::Proxy,
            None => ConnKey::Origin {
                host: fetch.host.clone(),
                port: fetch.port,
            },
        }
    }

    /// Fetches `fetches` over up to `max_connections_per_host` connections of `key`.
    async fn fetch_all(&self, key: ConnKey, fetches: Vec<Fetch>) -> Result<Vec<Fetched>, WebError> {
        let total = fetches.len();
        if total == 0 {
            return Ok(Vec::new());
        }
        let workers = total.min(self.spec.max_connections_per_host as usize);
        let batch = match self.spec.mode {
            HttpMode::Pipelining => total.div_ceil(workers).min(PIPELINE_DEPTH),
            HttpMode::Http10 | HttpMode::KeepAlive => 1,
        };
        let queue = RefCell::new(VecDeque::from(fetches));
        let done = RefCell::new(Vec::with_capacity(total));
        try_join_all((0..workers).map(|_| self.worker(&key, &queue, batch, &done))).await?;
        Ok(done.into_inner())
    }

    /// One connection's worth of work: takes batches from the queue until it is empty.
    async fn worker(
        &self,
        key: &ConnKey,
        queue: &RefCell<VecDeque<Fetch>>,
        batch_size: usize,
        done: &RefCell<Vec<Fetched>>,
    ) -> Result<(), WebError> {
        let mut kept: Option<Conn> = None;
        loop {
            let batch: Vec<Fetch> = {
                let mut queue = queue.borrow_mut();
                let n = batch_size.min(queue.len());
                queue.drain(..n).collect()
            };
            let Some(first) = batch.first() else {
                break;
            };
            let mut conn = match kept.take() {
                Some(conn) => conn,
                None => self.checkout(key, first).await?,
            };
            let exchange = self.exchange(&mut conn, &batch, done).await?;
            if exchange.answered < batch.len() {
                let unanswered = &batch[exchange.answered..];
                requeue(queue, unanswered, exchange.answered == 0)?;
            } else if exchange.keep_alive && self.spec.mode != HttpMode::Http10 {
                kept = Some(conn);
            }
        }
        if let Some(conn) = kept {
            self.pool
                .borrow_mut()
                .entry(key.clone())
                .or_default()
                .push(conn);
        }
        Ok(())
    }

    /// An idle connection of `key` that still looks open, or a new one.
    async fn checkout(&self, key: &ConnKey, first: &Fetch) -> Result<Conn, WebError> {
        if self.spec.mode != HttpMode::Http10 {
            loop {
                let idle = self.pool.borrow_mut().get_mut(key).and_then(Vec::pop);
                let Some(conn) = idle else { break };
                if looks_open(&conn) {
                    return Ok(conn);
                }
            }
        }
        let addr = match self.spec.proxy {
            Some(proxy) => proxy,
            None => SocketAddr::new(lookup(&self.spec.resolve, &first.host)?, first.port),
        };
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| WebError::Connect { addr, source })?;
        self.connections_opened
            .set(self.connections_opened.get() + 1);
        // Browsers disable Nagle: a request must not wait for the previous one's ACK.
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(%addr, error = %err, "cannot set TCP_NODELAY");
        }
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(READ_CHUNK),
        })
    }

    fn request_bytes(&self, fetch: &Fetch) -> Vec<u8> {
        let authority = fetch.authority();
        let target = match self.spec.proxy {
            Some(_) => fetch.url(),
            None => fetch.path.clone(),
        };
        let version = match self.spec.mode {
            HttpMode::Http10 => "HTTP/1.0",
            HttpMode::KeepAlive | HttpMode::Pipelining => "HTTP/1.1",
        };
        let mut request = format!(
            "GET {target} {version}\r\nHost: {authority}\r\nUser-Agent: midway-web\r\nAccept: */*\r\n"
        );
        if self.spec.cache == CacheMode::ForceMiss {
            request.push_str("Pragma: no-cache\r\nCache-Control: no-cache\r\n");
        }
        request.push_str("\r\n");
        request.into_bytes()
    }

    /// Writes every request of `batch` at once, then reads the answers in order.
    async fn exchange(
        &self,
        conn: &mut Conn,
        batch: &[Fetch],
        done: &RefCell<Vec<Fetched>>,
    ) -> Result<Exchange, WebError> {
        let requests: Vec<u8> = batch.iter().flat_map(|f| self.request_bytes(f)).collect();
        if conn.stream.write_all(&requests).await.is_err() {
            // The connection died before taking the requests (an idle one the server closed):
            // nothing was answered, so the requests go to another connection.
            return Ok(Exchange {
                answered: 0,
                keep_alive: false,
            });
        }
        for (index, fetch) in batch.iter().enumerate() {
            let Some(response) = read_response(conn, fetch, self.expected_len(fetch)).await? else {
                return Ok(Exchange {
                    answered: index,
                    keep_alive: false,
                });
            };
            let keep_alive = response.keep_alive;
            done.borrow_mut().push(self.verify(fetch, response)?);
            if !keep_alive {
                return Ok(Exchange {
                    answered: index + 1,
                    keep_alive: false,
                });
            }
        }
        Ok(Exchange {
            answered: batch.len(),
            keep_alive: true,
        })
    }

    fn expected_len(&self, fetch: &Fetch) -> u64 {
        let layout = self.site.layout;
        match fetch.resource {
            Resource::Base { .. } => layout.base_bytes,
            Resource::Object { .. } => layout.object_bytes,
        }
    }

    fn verify(&self, fetch: &Fetch, response: Response) -> Result<Fetched, WebError> {
        if response.status != 200 {
            return Err(WebError::Status {
                url: fetch.url(),
                status: response.status,
            });
        }
        let expected = self.site.document(fetch.resource, fetch.port);
        let got_len = response.body.len() as u64;
        if got_len != expected.body.len() as u64 {
            return Err(WebError::BodyLength {
                url: fetch.url(),
                expected: expected.body.len() as u64,
                got: got_len,
            });
        }
        let got_sum = fnv1a(&response.body);
        let header_sum = response
            .sum_header
            .as_deref()
            .map(|text| u64::from_str_radix(text, 16).unwrap_or(!expected.sum));
        for got in [Some(got_sum), header_sum].into_iter().flatten() {
            if got != expected.sum {
                return Err(WebError::BodyChecksum {
                    url: fetch.url(),
                    expected: expected.sum,
                    got,
                });
            }
        }
        Ok(Fetched {
            body: response.body,
            finished: response.finished,
        })
    }
}

/// Puts unanswered requests back at the front of the queue, in order. `no_progress` says the
/// connection answered nothing at all, which counts against the requests' attempts.
fn requeue(
    queue: &RefCell<VecDeque<Fetch>>,
    unanswered: &[Fetch],
    no_progress: bool,
) -> Result<(), WebError> {
    let mut queue = queue.borrow_mut();
    for fetch in unanswered.iter().rev() {
        let mut fetch = fetch.clone();
        if no_progress {
            fetch.failed_attempts += 1;
            if fetch.failed_attempts >= MAX_ATTEMPTS {
                return Err(WebError::ConnectionClosed {
                    url: fetch.url(),
                    attempts: fetch.failed_attempts,
                });
            }
        }
        queue.push_front(fetch);
    }
    Ok(())
}

/// Whether an idle connection still looks usable: nothing to read (no EOF, no stray bytes).
/// A close that arrives after this check is caught by the retry in `worker`.
fn looks_open(conn: &Conn) -> bool {
    if !conn.buf.is_empty() {
        return false;
    }
    let mut probe = [0u8; 1];
    matches!(conn.stream.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
}

/// A response as received, before verification.
struct Response {
    status: u16,
    body: Vec<u8>,
    sum_header: Option<String>,
    keep_alive: bool,
    finished: Instant,
}

/// The parts of a response head the loader uses.
#[derive(Debug, PartialEq, Eq)]
struct ResponseHead {
    status: u16,
    minor_version: u8,
    head_len: usize,
    content_length: Option<u64>,
    chunked: bool,
    connection_close: bool,
    connection_keep_alive: bool,
    sum_header: Option<String>,
}

enum HeadParse {
    Complete(ResponseHead),
    Partial,
    Invalid(&'static str),
}

fn parse_response_head(buf: &[u8]) -> HeadParse {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut raw = httparse::Response::new(&mut headers);
    let head_len = match raw.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return HeadParse::Partial,
        Err(_) => return HeadParse::Invalid("unparseable status line or header"),
    };
    let mut head = ResponseHead {
        status: raw.code.unwrap_or(0),
        minor_version: raw.version.unwrap_or(0),
        head_len,
        content_length: None,
        chunked: false,
        connection_close: false,
        connection_keep_alive: false,
        sum_header: None,
    };
    for header in raw.headers.iter() {
        let value = String::from_utf8_lossy(header.value);
        let value = value.trim();
        let name = header.name;
        if name.eq_ignore_ascii_case("content-length") {
            match value.parse::<u64>() {
                Ok(n) if head.content_length.is_none_or(|m| m == n) => {
                    head.content_length = Some(n)
                }
                _ => return HeadParse::Invalid("bad or conflicting Content-Length"),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked |= value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        } else if name.eq_ignore_ascii_case("connection")
            || name.eq_ignore_ascii_case("proxy-connection")
        {
            for token in value.split(',').map(str::trim) {
                head.connection_close |= token.eq_ignore_ascii_case("close");
                head.connection_keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if name.eq_ignore_ascii_case(SUM_HEADER) {
            head.sum_header = Some(value.to_string());
        }
    }
    HeadParse::Complete(head)
}

/// Reads more bytes into the connection's buffer; `Ok(0)` at end of stream.
async fn fill(conn: &mut Conn) -> io::Result<usize> {
    conn.buf.reserve(READ_CHUNK);
    conn.stream.read_buf(&mut conn.buf).await
}

/// Reads one response. `None` when the connection ended (or was reset) before a single byte
/// of it arrived: the request was not answered and may go to another connection. `limit` is
/// the expected body length; a body longer than that is not read further.
async fn read_response(
    conn: &mut Conn,
    fetch: &Fetch,
    limit: u64,
) -> Result<Option<Response>, WebError> {
    let io_err = |source| WebError::Io {
        url: fetch.url(),
        source,
    };
    let bad = |problem| WebError::BadResponse {
        url: fetch.url(),
        problem,
    };
    loop {
        let head = loop {
            match parse_response_head(&conn.buf) {
                HeadParse::Complete(head) => break head,
                HeadParse::Invalid(problem) => return Err(bad(problem)),
                HeadParse::Partial if conn.buf.len() > MAX_RESPONSE_HEAD_BYTES => {
                    return Err(bad("response head too large"))
                }
                HeadParse::Partial => {}
            }
            match fill(conn).await {
                Ok(0) | Err(_) if conn.buf.is_empty() => return Ok(None),
                Ok(0) => return Err(bad("connection closed inside the response head")),
                Ok(_) => {}
                Err(source) => return Err(io_err(source)),
            }
        };
        conn.buf.drain(..head.head_len);
        if (100..200).contains(&head.status) {
            continue; // interim response (100 Continue); the real one follows
        }
        let delimited = head.chunked || head.content_length.is_some();
        let body = if head.status == 204 || head.status == 304 {
            Vec::new()
        } else if head.chunked {
            read_chunked(conn, limit).await.map_err(|e| match e {
                BodyError::Io(source) => io_err(source),
                BodyError::Bad(problem) => bad(problem),
            })?
        } else if let Some(length) = head.content_length {
            if length != limit && head.status == 200 {
                return Err(WebError::BodyLength {
                    url: fetch.url(),
                    expected: limit,
                    got: length,
                });
            }
            read_exact_body(conn, length, fetch).await?
        } else {
            read_to_end(conn, limit).await.map_err(io_err)?
        };
        let keep_alive = delimited
            && if head.minor_version == 0 {
                head.connection_keep_alive && !head.connection_close
            } else {
                !head.connection_close
            };
        return Ok(Some(Response {
            status: head.status,
            body,
            sum_header: head.sum_header,
            keep_alive,
            finished: Instant::now(),
        }));
    }
}

async fn read_exact_body(conn: &mut Conn, length: u64, fetch: &Fetch) -> Result<Vec<u8>, WebError> {
    let length = length as usize;
    while conn.buf.len() < length {
        match fill(conn).await {
            Ok(0) => {
                return Err(WebError::BodyLength {
                    url: fetch.url(),
                    expected: length as u64,
                    got: conn.buf.len() as u64,
                })
            }
            Ok(_) => {}
            Err(source) => {
                return Err(WebError::Io {
                    url: fetch.url(),
                    source,
                })
            }
        }
    }
    Ok(conn.buf.drain(..length).collect())
}

/// A body delimited by the end of the connection; reading stops one byte past `limit` (which
/// is then reported as a length error).
async fn read_to_end(conn: &mut Conn, limit: u64) -> io::Result<Vec<u8>> {
    while (conn.buf.len() as u64) <= limit {
        if fill(conn).await? == 0 {
            break;
        }
    }
    Ok(std::mem::take(&mut conn.buf))
}

enum BodyError {
    Io(io::Error),
    Bad(&'static str),
}

/// A chunked body; stops with an error once it exceeds `limit` by more than a chunk.
async fn read_chunked(conn: &mut Conn, limit: u64) -> Result<Vec<u8>, BodyError> {
    let mut body = Vec::new();
    loop {
        let line = read_line(conn).await?;
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size =
            usize::from_str_radix(size_text, 16).map_err(|_| BodyError::Bad("bad chunk size"))?;
        if size == 0 {
            // Trailer section: header lines until an empty one.
            while !read_line(conn).await?.is_empty() {}
            return Ok(body);
        }
        if (body.len() + size) as u64 > limit.saturating_add(READ_CHUNK as u64) {
            return Err(BodyError::Bad("chunked body far longer than expected"));
        }
        while conn.buf.len() < size + 2 {
            if fill(conn).await.map_err(BodyError::Io)? == 0 {
                return Err(BodyError::Bad("connection closed inside a chunk"));
            }
        }
        if &conn.buf[size..size + 2] != b"\r\n" {
            return Err(BodyError::Bad("chunk not followed by CRLF"));
        }
        body.extend(conn.buf.drain(..size));
        conn.buf.drain(..2);
    }
}

/// One CRLF-terminated line (without the CRLF).
async fn read_line(conn: &mut Conn) -> Result<String, BodyError> {
    loop {
        if let Some(end) = conn.buf.windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&conn.buf[..end]).into_owned();
            conn.buf.drain(..end + 2);
            return Ok(line);
        }
        if conn.buf.len() > MAX_RESPONSE_HEAD_BYTES {
            return Err(BodyError::Bad("chunk line too long"));
        }
        if fill(conn).await.map_err(BodyError::Io)? == 0 {
            return Err(BodyError::Bad("connection closed inside chunk framing"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_strings_round_trip() {
        for mode in [HttpMode::Http10, HttpMode::KeepAlive, HttpMode::Pipelining] {
            assert_eq!(mode.as_str().parse::<HttpMode>().unwrap(), mode);
        }
        for cache in [CacheMode::Plain, CacheMode::ForceMiss, CacheMode::WarmHit] {
            assert_eq!(cache.as_str().parse::<CacheMode>().unwrap(), cache);
        }
        assert!("2".parse::<HttpMode>().is_err());
        assert!("cold".parse::<CacheMode>().is_err());
    }

    #[test]
    fn response_heads_give_framing_and_persistence() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nx-midway-sum: 00ff\r\n\r\nbody";
        let HeadParse::Complete(parsed) = parse_response_head(head) else {
            panic!("complete head expected");
        };
        assert_eq!(parsed.status, 200);
        assert_eq!(parsed.content_length, Some(12));
        assert_eq!(parsed.head_len, head.len() - 4);
        assert_eq!(parsed.sum_header.as_deref(), Some("00ff"));
        assert!(!parsed.connection_close);

        let head = b"HTTP/1.0 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nConnection: Keep-Alive\r\n\r\n";
        let HeadParse::Complete(parsed) = parse_response_head(head) else {
            panic!("complete head expected");
        };
        assert!(parsed.chunked && parsed.connection_keep_alive);
        assert_eq!(parsed.minor_version, 0);

        let conflicting = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert!(matches!(
            parse_response_head(conflicting),
            HeadParse::Invalid(_)
        ));
        assert!(matches!(
            parse_response_head(b"HTTP/1.1 200 OK\r\nA"),
            HeadParse::Partial
        ));
        assert!(matches!(
            parse_response_head(b"HTTX 200\r\n\r\n"),
            HeadParse::Invalid(_)
        ));
    }

    #[test]
    fn requeue_keeps_order_and_bounds_attempts() {
        let fetch = |path: &str| Fetch {
            host: "www.lab".into(),
            port: 80,
            path: path.into(),
            resource: Resource::Base { page: 0 },
            failed_attempts: 0,
        };
        let queue = RefCell::new(VecDeque::from([fetch("/c")]));
        requeue(&queue, &[fetch("/a"), fetch("/b")], false).unwrap();
        let order: Vec<String> = queue.borrow().iter().map(|f| f.path.clone()).collect();
        assert_eq!(order, ["/a", "/b", "/c"]);
        assert_eq!(queue.borrow()[0].failed_attempts, 0);

        let queue = RefCell::new(VecDeque::new());
        let mut current = vec![fetch("/a")];
        for attempt in 1..MAX_ATTEMPTS {
            requeue(&queue, &current, true).unwrap();
            current = queue.borrow_mut().drain(..).collect();
            assert_eq!(current[0].failed_attempts, attempt);
        }
        assert!(matches!(
            requeue(&queue, &current, true),
            Err(WebError::ConnectionClosed { .. })
        ));
    }
}
