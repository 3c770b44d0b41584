//! Bounded waits, async and blocking: every one gives up after the `limit` its caller passes.

use std::future::Future;
use std::process::{Child, ExitStatus};
use std::time::Duration;

use tokio::time::Instant;

/// How often the polling waits look again.
const POLL: Duration = Duration::from_millis(10);

/// Awaits `future`, panicking if it takes longer than `limit`.
pub async fn within<T>(limit: Duration, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("test step exceeded its limit of {limit:?}"))
}

/// Polls `check` until it is true or `limit` passes; returns its last answer.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(POLL).await;
    }
    check()
}

/// [`eventually`] for an async check.
pub async fn eventually_async<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(POLL).await;
    }
    check().await
}

/// Polls until `cond` holds; panics naming `what` once `limit` passes.
pub async fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `probe` until it stops changing for `stable_rounds` consecutive 20 ms samples
/// (panics once `limit` passes) and returns its value. Used to let kernel buffers fill before
/// asserting on a stall; the assertions that follow hold however long this waits.
pub async fn wait_until_stable(
    limit: Duration,
    mut probe: impl FnMut() -> u64,
    stable_rounds: u32,
) -> u64 {
    let deadline = Instant::now() + limit;
    let mut last = probe();
    let mut stable = 0;
    while stable < stable_rounds {
        assert!(Instant::now() < deadline, "never became stable");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = probe();
        if now == last {
            stable += 1;
        } else {
            stable = 0;
            last = now;
        }
    }
    last
}

/// Blocking: polls `cond` until it holds or `limit` passes; returns its last answer.
pub fn poll_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(POLL);
    }
    cond()
}

/// Blocking: polls until `cond` holds; panics with `message` once `limit` passes.
pub fn wait_until(limit: Duration, cond: impl FnMut() -> bool, message: &str) {
    assert!(poll_until(limit, cond), "{message}");
}

/// Blocking: waits for `child` to exit and returns its status; panics with `message` once
/// `limit` passes (the child is left running: a guard of the caller ends it).
pub fn wait_exit(child: &mut Child, limit: Duration, message: &str) -> ExitStatus {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(std::time::Instant::now() < deadline, "{message}");
        std::thread::sleep(POLL);
    }
}
