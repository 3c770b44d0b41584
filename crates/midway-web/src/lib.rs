//! The lab's web workload (issue 5): what the satellite and UMTS web studies measured, with
//! parts we control exactly.
//!
//! - [`Origin`]: an HTTP/1.x server for a [`SiteSpec`] — pages of a base document plus
//!   embedded objects (the satellite paper's Table VII files), several host names, Apache's
//!   persistent-connection behaviour (15 s idle timeout, 100 requests per connection), cache
//!   validators and deterministic, checksummed bodies (`src/origin.rs` explains why it is not
//!   hyper).
//! - [`load_pages`]: a browser-like client (HTTP/1.0, keep-alive, pipelining; direct or through
//!   an explicit proxy) that verifies every body, counts TCP connections and times each page
//!   from first connect to last byte (`src/loader/mod.rs` explains why it is our own).
//! - [`chromium_command`] / [`parse_chromium_output`]: a real browser loading the same pages,
//!   with the page load time read back from the page itself.
//!
//! Nothing here enters network namespaces: the lab calls these on threads already switched
//! into a host's namespace, and every blocking entry point runs a current-thread tokio runtime
//! on the calling thread (or, for the origin, on a thread it spawns after binding), so sockets
//! are created in the right namespace.
//!
//! `examples/geo_sanity.rs` loads pages over an emulated GEO link in every HTTP mode (root).

#![forbid(unsafe_code)]

mod chromium;
mod error;
mod loader;
mod origin;
mod site;

pub use chromium::{chromium_command, parse_chromium_output, BrowserSpec, CHROMIUM_PATH};
pub use error::WebError;
pub use loader::{
    load_pages, CacheMode, ConnectionLimit, HttpMode, LoadResult, LoadSpec, PageTiming,
    RequestHeaders, MAX_CONNECTIONS_PER_PROXY,
};
pub use origin::{Origin, OriginStats};
pub use site::{
    fnv1a, PageLayout, SiteSpec, APACHE_KEEPALIVE_TIMEOUT, APACHE_MAX_KEEPALIVE_REQUESTS,
};
