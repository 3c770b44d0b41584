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
//!    (through a proxy: per proxy, as RFC 2616-era browsers counted, or still per origin host
//!    as Chromium does, by [`ConnectionLimit`]), by the mode's rules:
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
//!
//! The files follow a load from the outside in: this one is the public surface (what to load,
//! what comes back, [`load_pages`]); `modes.rs` names the HTTP and cache modes; `page.rs`
//! loads one page (base document, its links, the objects) and verifies every body;
//! `connections.rs` spreads a page's requests over connections (reuse, batches, retries);
//! `response.rs` reads one response off a connection. A reader after one of these questions
//! opens one file.

mod connections;
mod modes;
mod page;
mod response;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::error::WebError;
use crate::site::{Site, SiteSpec};
use page::Loader;

pub use modes::{CacheMode, ConnectionLimit, HttpMode, RequestHeaders, MAX_CONNECTIONS_PER_PROXY};

/// Most requests written at once on one pipelined connection.
pub(crate) const PIPELINE_DEPTH: usize = 8;
/// Connections in a row that may close without answering a request before the load fails.
pub(crate) const MAX_ATTEMPTS: u32 = 4;

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
    /// How requests use connections: HTTP/1.0, keep-alive or pipelining.
    pub mode: HttpMode,
    /// Parallel connections per host name (per proxy when proxied and `connection_limit` is
    /// per server); browsers use 6.
    pub max_connections_per_host: u32,
    /// Whether, through a proxy, the limit counts connections to the proxy or per origin host.
    pub connection_limit: ConnectionLimit,
    /// The header lines of every request: minimal, or the size Chromium sends.
    pub request_headers: RequestHeaders,
    /// Cache behaviour: plain requests, forced misses, or a warm-up pass before measuring.
    pub cache: CacheMode,
    /// Pause between consecutive pages (idle time for upstream pools).
    pub think_time: Duration,
    /// The whole load must finish within this time.
    pub timeout: Duration,
}

/// Timing of one measured page.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PageTiming {
    /// Index of the page (0-based, `/page/{i}.html`).
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
    if spec.proxy.is_some() && spec.connection_limit == ConnectionLimit::PerOrigin {
        let hosts = 1 + site.spec.object_hosts;
        if hosts.saturating_mul(spec.max_connections_per_host) > MAX_CONNECTIONS_PER_PROXY {
            return Err(WebError::InvalidLoad {
                field: "max_connections_per_host",
                problem: format!(
                    "{hosts} hosts x {} connections exceed the {MAX_CONNECTIONS_PER_PROXY} a \
                     browser keeps to one proxy (the loader does not model that cap)",
                    spec.max_connections_per_host
                ),
            });
        }
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
