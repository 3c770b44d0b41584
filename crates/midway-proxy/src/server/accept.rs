//! The accept loop of one listener and its admission: a slot of the total limit before
//! `accept`, then the access list and the per-client limit; admitted clients get their own
//! task and span, everything slow happens there.
//!
//! At the total limit an explicit listener (forward, SOCKS5, HTTP, peer) waits for a slot, and
//! its clients wait in the kernel's accept queue: backpressure, as HAProxy's `maxconn`. A
//! transparent listener whose nftables rules midway manages fails open instead
//! (`overload.rs`): new connections are routed unsplit. But the bypass takes effect only for
//! connections whose SYN arrives after it is switched on; one that completed its handshake
//! just before already sits in the listener's accept queue, where no slot may free for as long
//! as the others are held. So such a listener, with no slot free, wakes the bypass's check at
//! once and serves what the kernel has queued as an overdraft: a slot of its own, at most as
//! many as its accept queue holds (the kernel's bound on what can be queued), counted in
//! `midway_overload_overdraft`. Deciding per SYN in the kernel (nftables `ct count`) was the
//! other way; conntrack keeps a closed connection counted for minutes (TIME_WAIT), and a
//! transparent gateway's diverted flows are deliberately not tracked at all.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::backoff::{pause_unless_shutdown, Backoff};
use super::connect::close_now;
use super::connection::Connection;
use super::generation::Generation;
use super::log_limit::{admit_out_of_resources, is_resource_exhaustion};
use super::shared::Shared;
use crate::metrics::Metrics;

/// First pause after accept ran out of a resource (file descriptors, memory); doubles per
/// failure in a row up to [`ACCEPT_BACKOFF_MAX`].
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// One listener's accept loop and what it needs.
pub(super) struct AcceptLoop {
    pub(super) shared: Arc<Shared>,
    pub(super) name: String,
    pub(super) listener: Arc<TcpListener>,
    /// The address it really bound.
    pub(super) addr: SocketAddr,
    /// The newest generation; read at each accept.
    pub(super) generations: watch::Receiver<Arc<Generation>>,
    pub(super) tracker: TaskTracker,
    /// Stops this loop (a reload that removes the listener, a handover, shutdown).
    pub(super) stop: CancellationToken,
    /// Fires when the process stops taking new work (given to connections).
    pub(super) draining: CancellationToken,
    pub(super) connections_cancel: CancellationToken,
}

/// Accepts until `stop`, spawning each admitted connection on the tracker under the newest
/// generation.
pub(super) async fn accept_loop(cx: AcceptLoop) {
    let AcceptLoop {
        shared,
        name,
        listener,
        addr,
        generations,
        tracker,
        stop: shutdown,
        draining,
        connections_cancel,
    } = cx;
    let labels = Metrics::listener(&name);
    let drained = shared.registry.drain_flag(&name);
    let mut backoff = Backoff::new(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX);
    let overdraft = Arc::new(Semaphore::new(
        midway_sys::tcp_info::accept_queue(listener.as_fd())
            .map(|queue| queue.limit.max(1) as usize)
            .unwrap_or(DEFAULT_OVERDRAFT),
    ));
    loop {
        let slot = take_slot(&shared, &overdraft, || {
            fails_open(&generations.borrow(), &name)
        });
        let (permit, overdrawn) = tokio::select! {
            _ = shutdown.cancelled() => return,
            slot = slot => match slot {
                Some(slot) => slot,
                None => return, // semaphore closed: never happens, but do not spin
            },
        };
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => {
                if backoff.succeeded() {
                    if let Some(left_out) = admit_out_of_resources() {
                        tracing::info!(listener = %name, left_out, "accept recovered");
                    }
                }
                pair
            }
            Err(err) if is_resource_exhaustion(&err) => {
                drop(permit);
                shared.metrics.accept_backoffs.get_or_create(&labels).inc();
                let (pause, first) = backoff.failed();
                // Once per burst, and bursts are rate-limited: under churn accept fails and
                // recovers many times a second.
                if first {
                    if let Some(left_out) = admit_out_of_resources() {
                        tracing::warn!(listener = %name, error = %err, left_out, "accept out of resources; backing off");
                    }
                }
                if !pause_unless_shutdown(&shutdown, pause).await {
                    return;
                }
                continue;
            }
            Err(err) => {
                // ECONNABORTED and friends concern one client only.
                tracing::debug!(listener = %name, error = %err, "accept failed for one connection");
                continue;
            }
        };

        if drained.load(Ordering::Relaxed) {
            // Drained by the control socket: new connections are closed at once (a reset),
            // open ones go on.
            shared.metrics.refuse(&name, "drained");
            tracing::debug!(listener = %name, client = %peer, "listener drained; closed");
            close_now(stream);
            continue;
        }
        let generation = generations.borrow().clone();
        let Some(state) = generation.listeners.get(&name).cloned() else {
            // Removed by a reload that is stopping this loop right now.
            close_now(stream);
            continue;
        };
        // A listed load balancer is no client: the header it sends names the client, which
        // its connection's task admits like this (`proxied.rs`).
        let behind_balancer = state.config.proxy_protocol.expects_header_from(peer.ip());
        if !behind_balancer && !generation.access.allows(peer.ip()) {
            shared.metrics.refuse(&name, "not_allowed");
            tracing::debug!(listener = %name, client = %peer, "client not in allowed_clients; closed");
            close_now(stream);
            continue;
        }
        let client_permit = if state.config.intercept.limits_connecting_client() && !behind_balancer
        {
            let Some(permit) = shared.client_limits.try_acquire(peer.ip()) else {
                shared.metrics.refuse(&name, "client_limit");
                tracing::debug!(listener = %name, client = %peer, "per-client connection limit reached; closed");
                close_now(stream);
                continue;
            };
            Some(permit)
        } else {
            None
        };
        shared.metrics.accepted.get_or_create(&labels).inc();
        shared.served.fetch_add(1, Ordering::Relaxed);
        if overdrawn {
            shared.metrics.overdraft.get_or_create(&labels).inc();
            tracing::debug!(listener = %name, client = %peer, "served over max_connections: queued before the overload bypass");
        }

        // The connection's span is made in its task (`Connection::span`).
        let conn = Connection {
            shared: shared.clone(),
            listener: state.config,
            profiles: state.profiles,
            http: state.http,
            generation,
            listener_addr: addr,
            peer,
            proxied: None,
            // Its own token, so the control socket can close this one connection; shutdown
            // still cancels it through the parent.
            cancel: connections_cancel.child_token(),
            shutdown: draining.clone(),
            _permits: (permit, client_permit),
        };
        tracker.spawn(conn.serve(stream));
    }
}

/// Overdraft slots of a transparent listener whose accept queue length cannot be read.
const DEFAULT_OVERDRAFT: usize = 128;

/// A slot for the next connection: one of the total limit (`false`), or, when none is free and
/// the listener `fails_open` (asked only then, off the common path), one of its `overdraft`
/// (`true`; see the module documentation). `None` if a semaphore was closed.
async fn take_slot(
    shared: &Shared,
    overdraft: &Arc<Semaphore>,
    fails_open: impl FnOnce() -> bool,
) -> Option<(OwnedSemaphorePermit, bool)> {
    if let Ok(permit) = shared.total_limit.clone().try_acquire_owned() {
        return Some((permit, false));
    }
    let fails_open = fails_open();
    // At the limit: the bypass's check now, not at its next periodic look.
    shared.overload_check.notify_one();
    tokio::select! {
        biased;
        permit = shared.total_limit.clone().acquire_owned() => Some((permit.ok()?, false)),
        permit = overdraft.clone().acquire_owned(), if fails_open => Some((permit.ok()?, true)),
    }
}

/// Whether listener `name` fails open at the limit: transparent, with nftables rules midway
/// manages (and so switches to bypass).
fn fails_open(generation: &Generation, name: &str) -> bool {
    generation.listeners.get(name).is_some_and(|state| {
        matches!(
            &state.config.intercept,
            crate::config::Intercept::Transparent { nftables, .. } if nftables.manage
        )
    })
}
