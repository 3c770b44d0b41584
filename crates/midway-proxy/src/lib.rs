//! midway-proxy: the split-connection TCP proxy.
//!
//! - [`config`]: TOML in stages -> [`config::RuntimeConfig`] ([`load_config`], [`parse_config`]).
//!   Public as a module: the binary and the lab name its types by that path.
//! - `access` (private): access control by client prefix, per-client limits.
//! - [`access_link`]: subscribers' access links: which subscriber a client is, and the pacing
//!   share of each of its connections (pure; applied by the server).
//! - `socks5` (private): SOCKS5 parser (pure) and handshake.
//! - `nft` (private): nftables TPROXY rules and policy routing for transparent listeners
//!   ([`nft_ruleset`] prints them).
//! - `metrics` (private): Prometheus metrics and the `/metrics` endpoint.
//! - `sockmem` (private): the socket memory guard ([`SocketMemorySetting`]).
//! - [`peer`]: the peer header between midways (pure, fuzzed) and its replay guard.
//! - `server` (private): [`Proxy::bind`] / [`Proxy::run`]: listeners, accept loops, connections,
//!   shutdown.
//!
//! Each split connection: accept (local segment, local profile) -> access list and limits ->
//! intercept (forward target / SOCKS5 request / original destination) -> connect (remote
//! segment, remote profile, optionally from the client's address) -> relay (midway-relay)
//! -> log and metrics. The end-of-connection log and histograms use each socket's final
//! `tcp_info`, read by the relay's close callback ([`midway_relay::OnClose`]).
//!
//! Listeners that speak HTTP — `mode = "http"` (explicit proxy, CONNECT included) or a
//! transparent listener with `application = "http"` (intercepted port 80) — hand the accepted
//! connection, after the same access list, limits and local profile, to midway-http's engine
//! (one per listener: cache, upstream pool, `midway_http_*{listener=...}` metrics). Its upstream
//! sockets are opened by the same connect path as a remote segment, with the listener's
//! `remote_profile`. See `examples/http.toml`.
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

mod access;
pub mod access_link;
pub mod config;
pub mod control;
mod metrics;
mod nft;
pub mod peer;
mod proxy_protocol;
mod server;
mod sockmem;
mod socks5;

pub use config::{load_config, parse_config};
pub use nft::nft_ruleset;
pub use server::{
    check_kernel_support, HandoverError, Proxy, ProxyError, ProxyHandle, ReloadSummary,
    ShutdownSummary,
};
pub use sockmem::SocketMemorySetting;
