//! Metrics of the HTTP proxy mode, registered into a registry the caller passes in.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Handles to all HTTP-mode metrics (cheap to clone; clones share values).
#[derive(Debug, Clone, Default)]
pub struct HttpMetrics {
    /// Requests received from clients (`http_requests`).
    pub requests: Counter,
    /// Requests answered from the cache without contacting the origin (`http_cache_hits`).
    pub cache_hits: Counter,
    /// Cacheable-method requests that went to the origin (`http_cache_misses`).
    pub cache_misses: Counter,
    /// Conditional requests sent to revalidate a stored response (`http_cache_revalidations`).
    pub cache_revalidations: Counter,
    /// Body bytes delivered from the cache, in bytes (`http_cache_served_bytes`).
    pub cache_bytes_served: Counter,
    /// Body bytes stored now, memory plus disk, in bytes (`http_cache_stored_bytes`).
    pub cache_stored_bytes: Gauge,
    /// New upstream connections opened (`http_upstream_connects`).
    pub upstream_connects: Counter,
    /// Requests sent on a pooled upstream connection (`http_upstream_reuses`).
    pub upstream_reuses: Counter,
    /// Idle upstream connections in the pool now (`http_upstream_idle_connections`).
    pub upstream_idle_connections: Gauge,
    /// Requests the proxy itself rejected with a 4xx (`http_bad_requests`).
    pub bad_requests: Counter,
    /// CONNECT tunnels established (`http_tunnels`).
    pub tunnels: Counter,
}

impl HttpMetrics {
    /// Registers every metric under the `http` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let sub = registry.sub_registry_with_prefix("http");
        sub.register(
            "requests",
            "Requests received from clients",
            self.requests.clone(),
        );
        sub.register(
            "cache_hits",
            "Requests answered from the cache without contacting the origin",
            self.cache_hits.clone(),
        );
        sub.register(
            "cache_misses",
            "Cacheable-method requests that went to the origin",
            self.cache_misses.clone(),
        );
        sub.register(
            "cache_revalidations",
            "Conditional requests sent to revalidate a stored response",
            self.cache_revalidations.clone(),
        );
        sub.register(
            "cache_served_bytes",
            "Body bytes delivered from the cache",
            self.cache_bytes_served.clone(),
        );
        sub.register(
            "cache_stored_bytes",
            "Body bytes currently stored (memory plus disk)",
            self.cache_stored_bytes.clone(),
        );
        sub.register(
            "upstream_connects",
            "New upstream connections opened",
            self.upstream_connects.clone(),
        );
        sub.register(
            "upstream_reuses",
            "Requests sent on a pooled upstream connection",
            self.upstream_reuses.clone(),
        );
        sub.register(
            "upstream_idle_connections",
            "Idle upstream connections in the pool",
            self.upstream_idle_connections.clone(),
        );
        sub.register(
            "bad_requests",
            "Requests rejected with a 4xx by the proxy itself",
            self.bad_requests.clone(),
        );
        sub.register(
            "tunnels",
            "CONNECT tunnels established",
            self.tunnels.clone(),
        );
    }
}
