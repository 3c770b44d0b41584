//! Helpers shared by midway's integration tests, each written once: the workspace and program
//! checks ([`host`]), network namespaces ([`netns`]), bounded waits ([`wait`]), loopback peers
//! such as echo servers ([`net`]), Prometheus scrapes ([`metrics`]) and checksummed data
//! ([`data`]). Behind features, the harness of one crate's tests: `http`, `proxy`, `relay`,
//! `web` and `report` (the lab reproductions).
//!
//! A dev-dependency only (`publish = false`): no shipped crate may depend on it. Every loop in
//! it is bounded in count or time, so a hang fails a test instead of blocking CI.

// Test-only crate: an unwrap or expect that fails fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![forbid(unsafe_code)]

pub mod data;
pub mod host;
pub mod metrics;
pub mod net;
pub mod netns;
pub mod wait;

#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "proxy")]
pub mod proxy;
#[cfg(feature = "relay")]
pub mod relay;
#[cfg(feature = "report")]
pub mod repro;
#[cfg(feature = "web")]
pub mod web;

/// An error with all its sources, `outer: inner: innermost`.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}
