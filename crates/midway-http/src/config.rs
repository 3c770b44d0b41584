//! Runtime configuration of the HTTP proxy mode, with defaults from named constants.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::HttpError;

/// Default cap on one request or response head (request line + headers).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 32 * 1024;
/// Default number of pipelined requests of one client that may be in flight at once.
pub const DEFAULT_MAX_PIPELINED: usize = 16;
/// Default sustained request rate per client connection.
pub const DEFAULT_REQUESTS_PER_SECOND: f64 = 200.0;
/// Default burst of requests per client connection above the sustained rate.
pub const DEFAULT_REQUEST_BURST: u32 = 100;
/// Default idle time after which a client connection without requests in flight is closed.
pub const DEFAULT_CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Default time a client may take to send one complete request head once it started.
pub const DEFAULT_HEAD_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time to wait for an origin's response head.
pub const DEFAULT_UPSTREAM_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default number of idle connections kept per origin.
pub const DEFAULT_MAX_IDLE_PER_ORIGIN: usize = 16;
/// Default time an idle upstream connection is kept open (long: warm connections are the point).
pub const DEFAULT_UPSTREAM_IDLE_KEEP: Duration = Duration::from_secs(600);
/// Default idle time before the first TCP keepalive probe on upstream connections.
pub const DEFAULT_KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// Default interval between TCP keepalive probes.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Default number of unanswered probes before the kernel drops the connection.
pub const DEFAULT_KEEPALIVE_RETRIES: u32 = 5;
/// Default memory cache capacity (sum of stored bodies).
pub const DEFAULT_CACHE_MEMORY_BYTES: u64 = 64 * 1024 * 1024;
/// Default largest single object that is stored.
pub const DEFAULT_CACHE_MAX_OBJECT_BYTES: u64 = 8 * 1024 * 1024;
/// Default disk cache capacity.
pub const DEFAULT_CACHE_DISK_BYTES: u64 = 1024 * 1024 * 1024;
/// Default size of one body piece moved between tasks; bounds per-response buffering.
pub const DEFAULT_CHUNK_BYTES: usize = 16 * 1024;
/// Default number of body pieces buffered per response between fetch and client writer.
pub const DEFAULT_RESPONSE_BUFFER_CHUNKS: usize = 4;

/// Client-side limits.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientLimits {
    /// Largest accepted request head; bigger heads get 431 and a close.
    pub max_header_bytes: usize,
    /// Requests of one connection in flight (read but not yet answered) at once.
    pub max_pipelined: usize,
    /// Sustained requests per second per connection (token bucket rate).
    pub requests_per_second: f64,
    /// Token bucket depth.
    pub request_burst: u32,
    /// Close the connection after this long without a request while nothing is in flight.
    pub idle_timeout: Duration,
    /// A started request head must be complete within this time (slow-loris guard).
    pub head_read_timeout: Duration,
}

/// Upstream connection pool settings.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamPoolConfig {
    /// Idle connections kept per origin (host:port).
    pub max_idle_per_origin: usize,
    /// How long an idle connection is kept before it is closed.
    pub idle_keep: Duration,
    /// TCP keepalive probes on upstream connections (None = off).
    pub keepalive: Option<KeepaliveProbes>,
    /// How long to wait for a response head from the origin.
    pub response_timeout: Duration,
}

/// TCP keepalive probe timing applied to each upstream socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepaliveProbes {
    /// Idle time before the first keepalive probe is sent (`TCP_KEEPIDLE`).
    pub idle: Duration,
    /// Time between unanswered probes (`TCP_KEEPINTVL`).
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped (`TCP_KEEPCNT`).
    pub retries: u32,
}

/// Cache settings.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheConfig {
    /// Master switch; when off every request goes upstream.
    pub enabled: bool,
    /// Memory store capacity in body bytes.
    pub memory_bytes: u64,
    /// Largest object that is stored at all.
    pub max_object_bytes: u64,
    /// Disk store (objects evicted from memory spill there); None = memory only.
    pub disk: Option<DiskCacheConfig>,
}

/// Disk store location and capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskCacheConfig {
    /// Directory holding the cached bodies (created if missing).
    pub dir: PathBuf,
    /// Disk store capacity in body bytes; least recently used objects are evicted beyond it.
    pub max_bytes: u64,
}

/// Everything the HTTP proxy mode needs.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpProxyConfig {
    /// Limits applied to each client connection.
    pub client: ClientLimits,
    /// Pool of idle connections to origins.
    pub upstream: UpstreamPoolConfig,
    /// The shared response cache.
    pub cache: CacheConfig,
    /// Pseudonym put in `Via` headers (`Via: 1.1 <via_name>`).
    pub via_name: String,
    /// Body piece size moved between tasks.
    pub chunk_bytes: usize,
    /// Body pieces buffered per in-flight response.
    pub response_buffer_chunks: usize,
}

impl Default for HttpProxyConfig {
    fn default() -> Self {
        Self {
            client: ClientLimits {
                max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
                max_pipelined: DEFAULT_MAX_PIPELINED,
                requests_per_second: DEFAULT_REQUESTS_PER_SECOND,
                request_burst: DEFAULT_REQUEST_BURST,
                idle_timeout: DEFAULT_CLIENT_IDLE_TIMEOUT,
                head_read_timeout: DEFAULT_HEAD_READ_TIMEOUT,
            },
            upstream: UpstreamPoolConfig {
                max_idle_per_origin: DEFAULT_MAX_IDLE_PER_ORIGIN,
                idle_keep: DEFAULT_UPSTREAM_IDLE_KEEP,
                keepalive: Some(KeepaliveProbes {
                    idle: DEFAULT_KEEPALIVE_IDLE,
                    interval: DEFAULT_KEEPALIVE_INTERVAL,
                    retries: DEFAULT_KEEPALIVE_RETRIES,
                }),
                response_timeout: DEFAULT_UPSTREAM_RESPONSE_TIMEOUT,
            },
            cache: CacheConfig {
                enabled: true,
                memory_bytes: DEFAULT_CACHE_MEMORY_BYTES,
                max_object_bytes: DEFAULT_CACHE_MAX_OBJECT_BYTES,
                disk: None,
            },
            via_name: "midway".to_string(),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            response_buffer_chunks: DEFAULT_RESPONSE_BUFFER_CHUNKS,
        }
    }
}

impl HttpProxyConfig {
    /// Checks ranges; errors name the field and what a valid value looks like.
    pub fn validate(&self) -> Result<(), HttpError> {
        let bad = |field, problem| Err(HttpError::Config { field, problem });
        if self.client.max_header_bytes < 256 {
            return bad("client.max_header_bytes", "must be at least 256");
        }
        if self.client.max_pipelined == 0 {
            return bad("client.max_pipelined", "must be at least 1");
        }
        if !(self.client.requests_per_second.is_finite() && self.client.requests_per_second > 0.0) {
            return bad("client.requests_per_second", "must be a positive number");
        }
        if self.client.request_burst == 0 {
            return bad("client.request_burst", "must be at least 1");
        }
        if self.client.idle_timeout.is_zero() || self.client.head_read_timeout.is_zero() {
            return bad(
                "client.idle_timeout/head_read_timeout",
                "must be above zero",
            );
        }
        if self.upstream.response_timeout.is_zero() {
            return bad("upstream.response_timeout", "must be above zero");
        }
        if self.cache.max_object_bytes > self.cache.memory_bytes {
            return bad(
                "cache.max_object_bytes",
                "must not exceed cache.memory_bytes",
            );
        }
        if let Some(disk) = &self.cache.disk {
            if disk.max_bytes < self.cache.max_object_bytes {
                return bad(
                    "cache.disk.max_bytes",
                    "must be at least cache.max_object_bytes",
                );
            }
        }
        if self.via_name.is_empty() || !self.via_name.bytes().all(|b| b.is_ascii_graphic()) {
            return bad("via_name", "must be a non-empty token without spaces");
        }
        if self.chunk_bytes < 512 || self.chunk_bytes > 1024 * 1024 {
            return bad("chunk_bytes", "must be between 512 and 1048576");
        }
        if self.response_buffer_chunks == 0 {
            return bad("response_buffer_chunks", "must be at least 1");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_bad_values_are_named() {
        HttpProxyConfig::default().validate().unwrap();
        let mut config = HttpProxyConfig::default();
        config.client.max_pipelined = 0;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("client.max_pipelined"), "{err}");
        let config = HttpProxyConfig {
            via_name: "has space".into(),
            ..HttpProxyConfig::default()
        };
        assert!(config.validate().is_err());
    }
}
