//! Bounded waits for async tests: every one gives up after the `limit` its caller passes.

use std::future::Future;
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
