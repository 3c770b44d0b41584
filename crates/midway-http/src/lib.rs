//! midway's HTTP proxy mode: an explicit HTTP/1.x forward proxy (also usable behind the
//! transparent intercept for port 80) built for long-delay links.
//!
//! What it adds over a TCP split, following the satellite and UMTS web studies:
//! - **pipelining**: requests of one client connection are read ahead and, when idempotent,
//!   fetched upstream in parallel, while responses go back strictly in request order;
//!   non-idempotent requests wait until every earlier response is out;
//! - **warm upstreams**: a per-origin pool of idle connections reused across clients, kept
//!   open for a long time with TCP keepalive probes, so a request after a pause does not pay
//!   a handshake;
//! - **a shared cache** with RFC 9111 semantics from `http-cache-semantics`: memory plus disk
//!   tiers with caps and LRU eviction, revalidation with ETag / Last-Modified, one upstream
//!   fetch for concurrent misses of a URL, bodies streamed to the client while stored.
//!
//! Why not hyper's server: it answers pipelined requests one at a time and does not let the
//! caller read ahead and dispatch them concurrently, which is the point here. So the client
//! side is a hand-written front over `httparse` ([`head`]) with a small body framing state
//! machine ([`framing`]), both pure and fuzzed.
//!
//! Memory per client is bounded: at most `max_pipelined` responses in flight, each buffering at
//! most `response_buffer_chunks` pieces of `chunk_bytes`; a slow reader stalls its upstream
//! reads (TCP backpressure) instead of growing buffers. Cache fills hold at most
//! `max_object_bytes` per object.
//!
//! Entry point: [`HttpProxy::new`] once, then [`HttpProxy::serve_client`] per accepted
//! connection.

#![forbid(unsafe_code)]

mod cache;
mod client;
pub mod config;
mod error;
pub mod framing;
pub mod head;
mod metrics;
mod pool;
mod ratelimit;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::net::TcpStream;

pub use client::ClientReport;
pub use config::{
    CacheConfig, ClientLimits, DiskCacheConfig, HttpProxyConfig, KeepaliveProbes,
    UpstreamPoolConfig,
};
pub use error::HttpError;
pub use metrics::HttpMetrics;

/// Makes the remote-segment socket to an origin address (midway applies its TCP profile there).
/// An error of kind `PermissionDenied` means the address is refused by policy: the client gets
/// 403 Forbidden and the request is not retried.
pub type ConnectUpstream =
    Arc<dyn Fn(SocketAddr) -> BoxFuture<'static, io::Result<TcpStream>> + Send + Sync>;

/// Shared state of the HTTP proxy mode: upstream pools, cache, metrics.
pub struct HttpProxy {
    config: HttpProxyConfig,
    pool: pool::UpstreamPool,
    cache: cache::Cache,
    metrics: HttpMetrics,
    /// What CONNECT tunnels relay with: midway's relay, so a tunnel ends by the same close rule
    /// as every split connection (the embedding proxy's pipes and limits).
    relay: Arc<midway_relay::RelayResources>,
}

impl HttpProxy {
    /// Validates the config, prepares the cache and registers metrics under `http_`. CONNECT
    /// tunnels relay with `relay` (buffer-and-forward, no spool).
    pub fn new(
        config: HttpProxyConfig,
        relay: Arc<midway_relay::RelayResources>,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Result<Arc<Self>, HttpError> {
        config.validate()?;
        let metrics = HttpMetrics::default();
        metrics.register(registry);
        let cache = cache::Cache::new(config.cache.clone(), metrics.clone())?;
        let pool = pool::UpstreamPool::new(config.upstream.clone(), metrics.clone());
        Ok(Arc::new(Self {
            config,
            pool,
            cache,
            metrics,
            relay,
        }))
    }

    /// Metric handles (for reports and tests).
    pub fn metrics(&self) -> &HttpMetrics {
        &self.metrics
    }

    /// Idle pooled connections to `authority` (`host:port`).
    pub fn idle_upstream_connections(&self, authority: &str) -> usize {
        self.pool.idle_count(authority)
    }

    /// Cached body bytes (memory, disk).
    pub fn cache_stored_bytes(&self) -> (u64, u64) {
        self.cache.stored_bytes()
    }

    /// Closes expired idle upstream connections periodically until `cancel` fires.
    /// Spawn once next to the listener.
    pub async fn run_pool_maintenance(
        self: Arc<Self>,
        cancel: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(self.pool.maintenance_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => self.pool.expire_idle(),
            }
        }
    }

    /// A [`ConnectUpstream`] that makes a plain TCP connection (tests and defaults).
    pub fn plain_connector() -> ConnectUpstream {
        Arc::new(|addr| Box::pin(TcpStream::connect(addr)))
    }
}
