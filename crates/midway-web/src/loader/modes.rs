//! The loading modes: how the loader uses HTTP (1.0, 1.1 keep-alive, pipelining) and what it
//! does about caches on the way, with their scenario strings.

use std::fmt;
use std::str::FromStr;

use crate::error::WebError;

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

    /// Whether a connection may carry another request after its answer (HTTP/1.0 opens one
    /// per object). Both the pool and a worker keeping its connection ask this one rule.
    pub(super) fn reuses_connections(self) -> bool {
        self != HttpMode::Http10
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

/// What `max_connections_per_host` counts when the client goes through a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectionLimit {
    /// Connections to each server the client talks to: each origin host when direct, the one
    /// proxy when proxied (RFC 2616's rule, the browsers of the papers' time).
    PerServer,
    /// Connections per origin host name, through a proxy too: Chromium keys its socket pools
    /// by destination (6 per host) and caps a proxy at 32, so a page with objects on two hosts
    /// opens up to 12 connections to an explicit proxy at once.
    PerOrigin,
}

/// The header lines of the loader's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestHeaders {
    /// `Host`, a short `User-Agent` and `Accept: */*`: about 70 bytes a request.
    Minimal,
    /// The lines Chromium sends for an image (its `User-Agent`, `Accept`, `Referer`,
    /// `Accept-Encoding`, `Accept-Language`): about 380 bytes a request, which on an uplink of
    /// tens of kbit/s is time a minimal request does not take.
    Chromium,
}

impl RequestHeaders {
    /// The scenario string of this choice.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestHeaders::Minimal => "minimal",
            RequestHeaders::Chromium => "chromium",
        }
    }
}

/// Most connections Chromium keeps to one proxy, whatever the destinations.
pub const MAX_CONNECTIONS_PER_PROXY: u32 = 32;

impl ConnectionLimit {
    /// The scenario string of this limit.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionLimit::PerServer => "per-server",
            ConnectionLimit::PerOrigin => "per-origin",
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
}
