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
//!
//! How a binary runs it (`midway proxy --config FILE`):
//!
//! ```no_run
//! # async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//! let config = midway_proxy::load_config(std::path::Path::new("midway.toml"))?;
//! let mut registry = prometheus_client::registry::Registry::default();
//! let proxy = midway_proxy::Proxy::bind(config, &mut registry).await?;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let on_signal = shutdown.clone();
//! tokio::spawn(async move {
//!     let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
//!     tokio::select! { _ = term.recv() => {}, _ = tokio::signal::ctrl_c() => {} }
//!     on_signal.cancel();
//! });
//! let summary = proxy.run(shutdown).await?;
//! println!("{summary:?}");
//! # Ok(()) }
//! ```

pub mod access;
pub mod config;
pub mod metrics;
pub mod nft;
pub mod server;
pub mod socks5;

pub use config::{load_config, parse_config};
pub use nft::nft_ruleset;
pub use server::{check_kernel_support, Proxy, ProxyError, ShutdownSummary};
