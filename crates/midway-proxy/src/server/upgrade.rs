//! Binary upgrade, both sides' steps (the protocol between them is `handover.rs`).
//!
//! Taking over (the new process, [`take_over`]): ask the running midway for its sockets, start
//! with them (`start.rs`), commit, then open this process's own upgrade socket.
//!
//! Handing over (the running process, [`hand_over`], when a new one connects to the upgrade
//! socket): offer copies of the listening sockets, the metrics socket and the BPF links, wait
//! for the commit, stop accepting, let go of the interception and the upgrade socket, and answer
//! `released`; the run loop then drains (`shutdown.rs`).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use prometheus_client::registry::Registry;

use super::control::ControlSocket;
use super::error::{ErrorChain, ProxyError};
use super::handover::{self, HandoverError, ListenerKey, Offering, UpgradeSocket};
use super::serving::Serving;
use super::start::start;
use super::Proxy;
use crate::config::RuntimeConfig;

/// Starts like a fresh start, but with the listening sockets, metrics socket, BPF links and
/// nftables state of the midway running with the same spool directory, then tells it to stop
/// accepting and drain. If this fails, the running midway goes on as before. `before_commit`
/// (given the old process's pid) runs once this process serves and the old one still does: the
/// moment a service manager must learn the new main process, before the old one can exit.
pub(super) async fn take_over(
    config: RuntimeConfig,
    registry: &mut Registry,
    before_commit: impl FnOnce(u32),
) -> Result<Proxy, ProxyError> {
    let dir = config.spool_dir.clone();
    let mut inherited = tokio::task::spawn_blocking(move || handover::request(&dir))
        .await
        .map_err(|e| ProxyError::TakeOver(HandoverError::Protocol(e.to_string())))?
        .map_err(ProxyError::TakeOver)?;
    tracing::info!(
        from_pid = inherited.from_pid,
        "taking over from the running midway"
    );
    let from_pid = inherited.from_pid;
    let mut proxy = start(config, registry, Some(&mut inherited)).await?;
    before_commit(inherited.from_pid);
    tokio::task::spawn_blocking(move || inherited.commit())
        .await
        .map_err(|e| ProxyError::TakeOver(HandoverError::Protocol(e.to_string())))?
        .map_err(ProxyError::TakeOver)?;
    // Only now: the old process keeps its upgrade socket until it has let go.
    proxy.upgrade_socket = UpgradeSocket::open(&proxy.generation.config.spool_dir, true);
    // `midway status` talks to this process from now on; the old one's socket is replaced.
    if let Some(control) = &proxy.generation.config.control {
        proxy.control_socket = ControlSocket::open(control, Some(from_pid)).unwrap_or_else(|err| {
            tracing::warn!(error = %ErrorChain(&err), "took over without a control socket");
            None
        });
    }
    tracing::info!("took over: the previous midway stopped accepting and drains");
    Ok(proxy)
}

/// Copies of what a handover offers, owned while the offer is made.
struct Offered {
    listeners: Vec<(String, ListenerKey, OwnedFd)>,
    metrics: Option<(std::net::SocketAddr, OwnedFd)>,
    links: Vec<(midway_bpf::Algorithm, OwnedFd)>,
}

impl Offered {
    /// Duplicates the listening sockets `serving` accepts on, `proxy`'s metrics socket and
    /// its BPF links.
    fn copy(proxy: &Proxy, serving: &Serving) -> std::io::Result<Offered> {
        let dup = |fd: BorrowedFd<'_>| fd.try_clone_to_owned();
        let listeners = serving
            .listeners
            .sockets()
            .map(|(name, key, listener)| Ok((name.clone(), key, dup(listener.as_fd())?)))
            .collect::<std::io::Result<_>>()?;
        let metrics = match &proxy.metrics_listener {
            Some((listener, addr)) => Some((*addr, dup(listener.as_fd())?)),
            None => None,
        };
        let links = proxy
            .congestion_controls
            .iter()
            .flat_map(|r| r.owned_links())
            .map(|(algorithm, fd)| Ok((algorithm, dup(fd)?)))
            .collect::<std::io::Result<_>>()?;
        Ok(Offered {
            listeners,
            metrics,
            links,
        })
    }
}

/// Offers this process's sockets to a new midway that connected to the upgrade socket on
/// `stream`. Returns true once the new process committed: this one has then stopped accepting
/// and let go of the interception, the route knobs and the BPF links.
pub(super) async fn hand_over(
    proxy: &mut Proxy,
    serving: &mut Serving,
    stream: UnixStream,
) -> bool {
    let refusal = proxy.route_knobs.as_ref().map(|_| {
        "it holds route-metric knobs, which a take-over cannot carry yet; restart midway instead"
            .to_string()
    });
    let offered = match Offered::copy(proxy, serving) {
        Ok(offered) => offered,
        Err(err) => {
            tracing::error!(error = %err, "cannot hand over: duplicating the sockets failed");
            return false;
        }
    };
    let record_dir = proxy.generation.config.spool_dir.clone();
    let drained = proxy.shared.registry.drained_names();
    tracing::info!(listeners = ?serving.listeners.names().collect::<Vec<_>>(), "a new midway asks to take over; offering the listening sockets");
    let committed = tokio::task::spawn_blocking(move || {
        let offering = Offering {
            listeners: offered
                .listeners
                .iter()
                .map(|(name, key, fd)| (name.clone(), *key, fd.as_fd()))
                .collect(),
            metrics: offered
                .metrics
                .as_ref()
                .map(|(addr, fd)| (*addr, fd.as_fd())),
            congestion_controls: offered
                .links
                .iter()
                .map(|(a, fd)| (*a, fd.as_fd()))
                .collect(),
            record_dir,
            refusal,
            drained,
        };
        handover::offer(stream, offering)
    })
    .await;
    let stream = match committed {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => {
            tracing::warn!(error = %ErrorChain(&err), "take-over abandoned; going on");
            return false;
        }
        Err(err) => {
            tracing::error!(error = %err, "take-over task failed; going on");
            return false;
        }
    };
    // Stop accepting before answering: from here on only the new process accepts.
    serving.listeners.stop_all().await;
    proxy.intercept.disown();
    // The upgrade socket's path is the new process's now.
    proxy.upgrade_socket = None;
    if let Err(err) = tokio::task::spawn_blocking(move || handover::released(stream))
        .await
        .unwrap_or_else(|e| Err(HandoverError::Protocol(e.to_string())))
    {
        tracing::warn!(error = %err, "could not tell the new midway it may go on; it will time out");
    }
    true
}
