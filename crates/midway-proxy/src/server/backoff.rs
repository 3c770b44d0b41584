//! Doubling pauses while an operation keeps failing: the accept loop out of descriptors, a warm
//! pool whose peer is unreachable, a QUIC tunnel that cannot be set up. Each logs once when the
//! failures start and once when they end, so the state is kept here and the log lines stay
//! with the caller.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The pause after each failure of a run of them: `min` after the first, doubling up to `max`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Backoff {
    min: Duration,
    max: Duration,
    /// The last pause of the current run of failures; `None` after a success.
    last: Option<Duration>,
}

impl Backoff {
    pub(super) const fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            last: None,
        }
    }

    /// One more failure: the pause to take, and whether it starts a run of failures (the one
    /// the caller logs).
    pub(super) fn failed(&mut self) -> (Duration, bool) {
        let pause = self.last.map_or(self.min, |last| (last * 2).min(self.max));
        let first = self.last.is_none();
        self.last = Some(pause);
        (pause, first)
    }

    /// A success: the next failure starts again at `min`. Whether it ends a run of failures.
    pub(super) fn succeeded(&mut self) -> bool {
        self.last.take().is_some()
    }
}

/// Sleeps for `pause` unless `shutdown` comes first; `false` when it did.
pub(super) async fn pause_unless_shutdown(shutdown: &CancellationToken, pause: Duration) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => false,
        _ = tokio::time::sleep(pause) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_ceiling_and_start_over_after_a_success() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(100), ms(350));
        assert!(!backoff.succeeded());
        assert_eq!(backoff.failed(), (ms(100), true));
        assert_eq!(backoff.failed(), (ms(200), false));
        assert_eq!(backoff.failed(), (ms(350), false));
        assert_eq!(backoff.failed(), (ms(350), false));
        assert!(backoff.succeeded());
        assert!(!backoff.succeeded());
        assert_eq!(backoff.failed(), (ms(100), true));
    }
}
