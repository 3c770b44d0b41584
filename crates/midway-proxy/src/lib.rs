//! midway-proxy: the split-connection TCP proxy.
//!
//! - [`config`]: TOML in stages -> [`config::RuntimeConfig`] ([`load_config`], [`parse_config`]).
//! - [`access`]: access control by client prefix, per-client limits.
//! - [`socks5`]: SOCKS5 parser (pure) and handshake.
//! - [`nft`]: nftables TPROXY rules and policy routing for transparent listeners.
//! - [`metrics`]: Prometheus metrics and the `/metrics` endpoint.
//! - [`server`]: [`Proxy::bind`] / [`Proxy::run`]: listeners, accept loops, connections, shutdown.
//!
//! Each split connection: accept (local segment, local profile) -> access list and limits ->
//! intercept (forward target / SOCKS5 request / original destination) -> connect (remote
//! segment, remote profile, optionally from the client's address) -> relay (midway-relay)
//! -> log and metrics.

pub mod access;
pub mod config;
pub mod metrics;
pub mod nft;
pub mod server;
pub mod socks5;

pub use config::{load_config, parse_config};
pub use nft::nft_ruleset;
pub use server::{check_profiles, Proxy, ProxyError, ShutdownSummary};
