//! Rate-limited logging for events that come in floods: running out of file descriptors or
//! memory makes every accept and every connect fail, one log line each, thousands a minute,
//! which buries the one line an operator needs and costs the disk and CPU midway is short of.
//! Such events are logged at most once per interval, each line saying how many like it were
//! left out since the last; their metrics still count every one.

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one line per this interval for one flood-prone topic.
pub(super) const FLOOD_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Decides which events of one topic get a log line. No clock: the caller passes `now`.
#[derive(Debug)]
pub(super) struct RateLimiter {
    interval: Duration,
    last_logged: Option<Instant>,
    suppressed: u64,
}

impl RateLimiter {
    pub(super) const fn new(interval: Duration) -> RateLimiter {
        RateLimiter {
            interval,
            last_logged: None,
            suppressed: 0,
        }
    }

    /// `Some(n)`: log this event, and say that `n` events since the last line were left out.
    /// `None`: leave it out (it is counted for the next line).
    pub(super) fn admit(&mut self, now: Instant) -> Option<u64> {
        let due = self
            .last_logged
            .is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if due {
            self.last_logged = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

/// The process's one topic for "out of resources" (accept and connect failing for lack of
/// file descriptors or memory): every listener and connection shares the flood.
static OUT_OF_RESOURCES: Mutex<RateLimiter> = Mutex::new(RateLimiter::new(FLOOD_LOG_INTERVAL));

/// Whether an "out of resources" event gets its log line now; `Some(n)` as in
/// [`RateLimiter::admit`].
pub(super) fn admit_out_of_resources() -> Option<u64> {
    OUT_OF_RESOURCES
        .lock()
        .map_or(Some(0), |mut limiter| limiter.admit(Instant::now()))
}

/// The process ran out of a resource that frees up by itself (another connection closing):
/// file descriptors (EMFILE, ENFILE) or kernel memory (ENOBUFS, ENOMEM).
pub(super) fn is_resource_exhaustion(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_left_out() {
        let start = Instant::now();
        let mut limiter = RateLimiter::new(Duration::from_secs(10));
        assert_eq!(limiter.admit(start), Some(0));
        for ms in 1..=500 {
            assert_eq!(limiter.admit(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(limiter.admit(start + Duration::from_secs(10)), Some(500));
        assert_eq!(limiter.admit(start + Duration::from_secs(11)), None);
        assert_eq!(limiter.admit(start + Duration::from_secs(25)), Some(1));
    }
}
