//! Designed shutdown, once the run loop ends (a shutdown signal, or a handover): stop taking
//! new work (warm peer connections waiting for a header end, accept loops stop, the warm pools
//! close), drain the open connections — after a handover until they end or a shutdown signal,
//! then — for `shutdown_grace` before the rest are reset, stop the helpers, and remove what
//! this process installed (route knobs, then the nftables tables and policy routing with their
//! record) unless a new process took it over.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::serving::Serving;
use super::shared::Shared;
use super::Proxy;

/// After the grace period, cancelled relays get this long to close their sockets, and
/// [`CANCEL_WAIT_PER_CONNECTION`] more for each one still open: resetting a connection takes its
/// task a turn and the kernel two resets (midway-bench stops midway with 2,000 to 8,000 open in
/// 0.1-0.4 s past the grace, on two cores shared with the bench's ends), so 100,000 need
/// seconds. Whatever is still open when the wait ends is reset by the kernel as the process
/// exits: a relay arms `SO_LINGER` 0 on both sockets when it starts.
const CANCEL_WAIT: Duration = Duration::from_secs(5);
const CANCEL_WAIT_PER_CONNECTION: Duration = Duration::from_micros(50);

/// How long `open` cancelled connections get to close (see [`CANCEL_WAIT`]).
fn cancel_wait(open: usize) -> Duration {
    let open = u32::try_from(open).unwrap_or(u32::MAX);
    CANCEL_WAIT.saturating_add(CANCEL_WAIT_PER_CONNECTION.saturating_mul(open))
}

/// What happened during shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownSummary {
    /// Connections accepted and allowed over the proxy's life.
    pub connections_served: u64,
    /// Connections still open when shutdown began.
    pub open_at_shutdown: usize,
    /// Of those, how many were cancelled because the grace period ran out.
    pub cancelled_after_grace: usize,
    /// How long the drain took.
    pub drain_time: Duration,
    /// Whether a new midway process took over (a binary upgrade) before this one stopped.
    pub handed_over: bool,
}

/// Stops `serving` and `proxy` in order (see the module's comment). `shutdown` is the signal
/// the run loop waited for; after a handover it cuts the drain to the grace period.
pub(super) async fn shut_down(
    mut proxy: Proxy,
    mut serving: Serving,
    handed_over: bool,
    shutdown: &CancellationToken,
) -> ShutdownSummary {
    serving.draining.cancel();
    // Accept loops return and drop (close) their listeners.
    serving.listeners.stop_all().await;
    while serving.pools.join_next().await.is_some() {}
    let tracker = &serving.tracker;
    if handed_over {
        tracing::info!(
            open = tracker.len(),
            "handed over to the new midway: draining open connections until they end (SIGTERM cuts the drain to the grace period)"
        );
        tracker.close();
        tokio::select! {
            _ = tracker.wait() => {}
            _ = shutdown.cancelled() => {}
        }
    }
    let drained = drain(
        tracker,
        &serving.connections_cancel,
        proxy.generation.config.shutdown_grace,
        &proxy.shared,
    )
    .await;

    serving.helpers_cancel.cancel();
    while serving.helpers.join_next().await.is_some() {}
    for thread in std::mem::take(&mut serving.sampler_threads) {
        // Each sees the cancellation within one sample interval.
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    // After a handover the new process owns the interception (`hand_over` let go of it), and
    // there are no route knobs (a midway holding them refuses to hand over).
    if !handed_over {
        // Knobs first: the record that lists them goes last, with the interception.
        if let Some(knobs) = proxy.route_knobs.take() {
            if let Err(err) = knobs.remove() {
                tracing::error!(error = %err, "could not remove route-metric knobs");
            }
        }
        proxy.intercept.remove();
    }
    let summary = ShutdownSummary {
        connections_served: proxy.shared.served.load(Ordering::Relaxed),
        open_at_shutdown: drained.open_at_shutdown,
        cancelled_after_grace: drained.cancelled_after_grace,
        drain_time: drained.time,
        handed_over,
    };
    tracing::info!(?summary, "proxy stopped");
    summary
}

/// How the drain went.
struct Drained {
    open_at_shutdown: usize,
    cancelled_after_grace: usize,
    time: Duration,
}

/// Lets open connections finish for `grace`, then cancels the rest and waits for them a little.
async fn drain(
    tracker: &TaskTracker,
    connections_cancel: &CancellationToken,
    grace: Duration,
    shared: &Shared,
) -> Drained {
    tracker.close();
    let open_at_shutdown = tracker.len();
    let drain_started = Instant::now();
    tracing::info!(
        open = open_at_shutdown,
        grace_s = grace.as_secs_f64(),
        "shutdown: stopped accepting, draining connections"
    );
    let mut cancelled_after_grace = 0;
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        cancelled_after_grace = tracker.len();
        shared
            .metrics
            .shutdown_resets
            .inc_by(cancelled_after_grace as u64);
        // A connection that had not finished may hold bytes one end has not received: the
        // relay closes it with a reset on both sides, never a FIN on a cut stream.
        tracing::warn!(
            reset = cancelled_after_grace,
            "grace period over; resetting the connections still open"
        );
        connections_cancel.cancel();
        if tokio::time::timeout(cancel_wait(cancelled_after_grace), tracker.wait())
            .await
            .is_err()
        {
            tracing::error!(
                left = tracker.len(),
                "connections did not end after cancellation"
            );
        }
    }
    Drained {
        open_at_shutdown,
        cancelled_after_grace,
        time: drain_started.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_for_cancelled_connections_grows_with_their_number() {
        assert_eq!(cancel_wait(0), Duration::from_secs(5));
        assert_eq!(cancel_wait(100_000), Duration::from_secs(10));
        // The unit's TimeoutStopSec (30 s) covers the shipped grace (10 s) and this wait at
        // 100,000 connections, so systemd does not kill midway in the middle of its resets.
        assert!(Duration::from_secs(10) + cancel_wait(100_000) < Duration::from_secs(30));
        assert!(cancel_wait(usize::MAX) > cancel_wait(1_000_000));
    }
}
