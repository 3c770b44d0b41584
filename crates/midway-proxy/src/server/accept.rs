//! The accept loop of one listener and its admission: a slot of the total limit before
//! `accept`, then the access list and the per-client limit; admitted clients get their own
//! task and span, everything slow happens there.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{field, Instrument};

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
    let mut backoff: Option<Duration> = None;
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            permit = shared.total_limit.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return, // semaphore closed: never happens, but do not spin
            },
        };
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => {
                if backoff.take().is_some() {
                    if let Some(left_out) = admit_out_of_resources() {
                        tracing::info!(listener = %name, left_out, "accept recovered");
                    }
                }
                pair
            }
            Err(err) if is_resource_exhaustion(&err) => {
                drop(permit);
                shared.metrics.accept_backoffs.get_or_create(&labels).inc();
                let pause = match backoff {
                    None => {
                        // Once per burst, and bursts are rate-limited: under churn accept
                        // fails and recovers many times a second.
                        if let Some(left_out) = admit_out_of_resources() {
                            tracing::warn!(listener = %name, error = %err, left_out, "accept out of resources; backing off");
                        }
                        ACCEPT_BACKOFF_MIN
                    }
                    Some(previous) => (previous * 2).min(ACCEPT_BACKOFF_MAX),
                };
                backoff = Some(pause);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(pause) => continue,
                }
            }
            Err(err) => {
                // ECONNABORTED and friends concern one client only.
                tracing::debug!(listener = %name, error = %err, "accept failed for one connection");
                continue;
            }
        };

        let generation = generations.borrow().clone();
        let Some(state) = generation.listeners.get(&name).cloned() else {
            // Removed by a reload that is stopping this loop right now.
            close_now(stream);
            continue;
        };
        if !generation.access.allows(peer.ip()) {
            shared.metrics.refuse(&name, "not_allowed");
            tracing::debug!(listener = %name, client = %peer, "client not in allowed_clients; closed");
            close_now(stream);
            continue;
        }
        let client_permit = if state.config.intercept.limits_connecting_client() {
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

        let (local_profile, remote_profile) = state.profiles.for_client(peer.ip());
        let span = tracing::info_span!(
            "conn",
            listener = %name,
            client = %peer,
            dst = field::Empty,
            local_profile = %local_profile.name,
            remote_profile = %remote_profile.name,
        );
        let conn = Connection {
            shared: shared.clone(),
            listener: state.config,
            profiles: state.profiles,
            http: state.http,
            generation,
            listener_addr: addr,
            peer,
            cancel: connections_cancel.clone(),
            shutdown: draining.clone(),
            _permits: (permit, client_permit),
        };
        tracker.spawn(conn.serve(stream).instrument(span));
    }
}
