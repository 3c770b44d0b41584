//! The proxy server: listeners, accept loops with limits, one task per split connection,
//! metrics sampling, reload, binary upgrade and designed shutdown.
//!
//! The life of the proxy: [`Proxy::bind`] (`start.rs`) or [`Proxy::take_over`] (`upgrade.rs`,
//! then `start.rs`) makes a bound, ready proxy; [`Proxy::run`] starts what serves
//! (`serving.rs`) and waits for a shutdown signal, a reload (`reload.rs`) or a new midway asking
//! to take over (`upgrade.rs`); then it shuts down (`shutdown.rs`).
//!
//! Life of a connection: a permit of the total limit is taken *before* `accept` (so at the limit
//! new clients wait in the kernel backlog instead of costing midway memory); the accepted client
//! is checked against the access list and the per-client limit right away (refused ones are
//! closed at once and counted); everything slow — SOCKS5 handshake, name resolution, connect —
//! runs in the connection's own task, never in the accept loop. Each connection reads the
//! configuration of the generation it was accepted under (`generation.rs`), so a reload never
//! changes an established connection. Its files, in the order it meets them, each importing
//! only those after it: `accept.rs` -> `connection.rs` -> `intercept.rs` (the target, per
//! mode; `peering.rs` for a peer's header) -> `connect.rs` (or `peering.rs` and `pool.rs`
//! through the next midway) -> `relay.rs`.
//!
//! One file per step:
//!
//! - this file: the [`Proxy`] and its public surface, and the run loop;
//! - `start.rs`: start (profiles, route knobs, spool, listeners, metrics, nftables);
//! - `descriptors.rs`: the open-file limit, raised, and the room it leaves for connections;
//! - `reload.rs`: what a reload may change, and its steps;
//! - `upgrade.rs`: binary upgrade, the steps of both sides; `handover.rs`: its protocol;
//! - `serving.rs`: what runs while the proxy serves (accept loops, warm pools, helpers);
//! - `shutdown.rs`: designed shutdown (stop accepting, drain, cleanup);
//! - `listeners.rs`: the listening sockets, from bind to stop;
//! - `shared.rs`: what the proxy's connections share across generations (metrics, limits);
//! - `generation.rs`: what a connection reads from the configuration, rebuilt per reload;
//! - `accept.rs`: the accept loop and its admission (total and per-client limits, access list);
//! - `connection.rs`: one admitted connection, start to end (split or HTTP);
//! - `intercept.rs`: find the target, per intercept mode (every difference between the modes);
//! - `connect.rs`: the remote segment's socket and the profile steps of every proxy socket;
//! - `peering.rs`: two-ended operation: a peer listener's header check (gateway) and a
//!   connection through the next midway (edge);
//! - `pool.rs`: the warm connections kept open to each peer;
//! - `registry.rs`: the open connections and drained listeners the control socket reads;
//! - `control.rs`: the control socket (`midway status`, drain, undrain, close);
//! - `relay.rs`: relay supervision, tcp_info sampling, metrics and the end-of-connection log;
//! - `profiles.rs`: which profiles are used, route knobs, the kernel check;
//! - `congestion.rs`: midway's BPF congestion controls;
//! - `memory.rs`: the socket memory guard's caps on a connection's sockets;
//! - `overload.rs`: the overload bypass;
//! - `own_addresses.rs`: this host's addresses, for `denied_destinations = ["self"]`;
//! - `log_limit.rs`: rate-limited logging of floods;
//! - `socket_id.rs`: a socket owned elsewhere, known by fd and inode;
//! - `error.rs`: typed errors.

mod accept;
mod access_links;
mod backoff;
mod congestion;
mod connect;
mod connection;
mod control;
mod descriptors;
mod dscp;
mod error;
mod fast_open;
mod generation;
mod handover;
mod intercept;
mod listeners;
mod log_limit;
mod memory;
mod overload;
mod own_addresses;
mod peer_link;
mod peering;
mod pool;
mod profiles;
mod proxied;
mod quic_accept;
mod registry;
mod relay;
mod reload;
mod serving;
mod shared;
mod shutdown;
mod socket_id;
mod start;
mod tunnel;
mod upgrade;

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use midway_bpf::Registration;
use midway_tcp::RouteKnobs;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::config::RuntimeConfig;
use crate::nft;

pub use error::ProxyError;
pub use handover::HandoverError;
pub use profiles::check_kernel_support;
pub use reload::ReloadSummary;
pub use shutdown::ShutdownSummary;

use control::ControlSocket;
use generation::Generation;
use handover::UpgradeSocket;
use listeners::BoundListener;
use serving::Serving;
use shared::Shared;

/// A request to the running proxy.
enum Control {
    Reload {
        config: Box<RuntimeConfig>,
        reply: oneshot::Sender<Result<ReloadSummary, ProxyError>>,
    },
}

/// Sends reloads to a running [`Proxy`] (see [`Proxy::handle`]).
#[derive(Clone)]
pub struct ProxyHandle {
    control: mpsc::Sender<Control>,
}

impl ProxyHandle {
    /// Applies `config` to the running proxy (what SIGHUP does after reading the file). On an
    /// error the running configuration stays, entirely.
    pub async fn reload(&self, config: RuntimeConfig) -> Result<ReloadSummary, ProxyError> {
        let (reply, answer) = oneshot::channel();
        self.control
            .send(Control::Reload {
                config: Box::new(config),
                reply,
            })
            .await
            .map_err(|_| ProxyError::Stopped)?;
        answer.await.map_err(|_| ProxyError::Stopped)?
    }
}

/// A bound, ready proxy. [`Proxy::run`] serves it.
pub struct Proxy {
    shared: Arc<Shared>,
    generation: Arc<Generation>,
    /// Bound by the start, started by `run`.
    listeners: Vec<BoundListener>,
    metrics_listener: Option<(Arc<TcpListener>, SocketAddr)>,
    served_registry: Arc<RwLock<Registry>>,
    intercept: nft::Installed,
    route_knobs: Option<RouteKnobs>,
    /// midway's BPF congestion controls the profiles use, registered (or adopted from the
    /// midway this one took over from) while the proxy lives.
    congestion_controls: Vec<Registration>,
    control: mpsc::Sender<Control>,
    control_requests: mpsc::Receiver<Control>,
    /// Where a new midway process asks to take over; `None` when another midway answers there.
    upgrade_socket: Option<UpgradeSocket>,
    /// Where `midway status` asks (`control.rs`); taken by `Serving::start`.
    control_socket: Option<ControlSocket>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("listeners", &self.local_addrs())
            .field("metrics", &self.metrics_addr())
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// Checks every referenced profile against the kernel, installs route-metric knobs, cleans
    /// the spool directory, binds every listener and the metrics endpoint, and finally installs
    /// the owned nftables table and policy routing. Errors name what failed; whatever was
    /// installed before an error is removed again.
    pub async fn bind(config: RuntimeConfig, registry: &mut Registry) -> Result<Proxy, ProxyError> {
        start::start(config, registry, None).await
    }

    /// A binary upgrade: starts like [`Proxy::bind`], but with the listening sockets, metrics
    /// socket, BPF links and nftables state of the midway running with the same spool directory
    /// (see `handover.rs`), then tells it to stop accepting and drain. If this fails, the
    /// running midway goes on as before. `before_commit` runs once this process is ready to
    /// serve and the old one (its pid given) has not yet stopped: a service manager learns the
    /// new main process then, while the old one cannot have exited.
    pub async fn take_over(
        config: RuntimeConfig,
        registry: &mut Registry,
        before_commit: impl FnOnce(u32),
    ) -> Result<Proxy, ProxyError> {
        upgrade::take_over(config, registry, before_commit).await
    }

    /// Every listener's name and the address it really bound (port 0 resolved).
    pub fn local_addrs(&self) -> Vec<(String, SocketAddr)> {
        self.listeners
            .iter()
            .map(|l| (l.name.clone(), l.addr))
            .collect()
    }

    /// Address of the `/metrics` endpoint, if configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener.as_ref().map(|(_, a)| *a)
    }

    /// A handle to reload the proxy while it runs.
    pub fn handle(&self) -> ProxyHandle {
        ProxyHandle {
            control: self.control.clone(),
        }
    }

    /// Serves until `shutdown` fires (or a new midway process takes over); then stops
    /// accepting, lets open connections finish for `shutdown_grace` (after a take-over: until
    /// they end, or `shutdown` fires), cancels the rest, removes the owned nftables table,
    /// policy routing and route knobs (unless handed over), and returns a summary.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<ShutdownSummary, ProxyError> {
        let mut serving = Serving::start(&mut self);
        let mut handed_over = false;
        loop {
            let upgrade = async {
                match &self.upgrade_socket {
                    Some(socket) => socket.accept().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(request) = self.control_requests.recv() => match request {
                    Control::Reload { config, reply } => {
                        let result = reload::reload(&mut self, &mut serving, *config);
                        let _ = reply.send(result);
                    }
                },
                accepted = upgrade => match accepted {
                    Ok(stream) => {
                        if upgrade::hand_over(&mut self, &mut serving, stream).await {
                            handed_over = true;
                            break;
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "upgrade socket accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        Ok(shutdown::shut_down(self, serving, handed_over, &shutdown).await)
    }
}
