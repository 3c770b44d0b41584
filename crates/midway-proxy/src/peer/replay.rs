//! The replay guard of peer headers. Pure: the caller passes the time.
//!
//! A header is fresh when its timestamp is within ±window of this midway's clock and its nonce
//! was not seen inside the window. A nonce is remembered until no header carrying it could be
//! fresh any more: its timestamp plus the window has passed. Only verified headers are
//! remembered (the caller checks the MAC first), so only a holder of a key can fill the memory,
//! and the memory is bounded anyway: at [`ReplayGuard::capacity`] the guard refuses new headers
//! until old nonces expire (failing closed, never forgetting a nonce early).

use std::collections::{HashSet, VecDeque};

/// Why a verified header is not fresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The timestamp is further from this midway's clock than the window.
    #[error("timestamp {skew_ms} ms away from this midway's clock (window ±{window_ms} ms)")]
    OutsideWindow {
        /// The header's timestamp minus now, milliseconds.
        skew_ms: i64,
        /// The window, milliseconds.
        window_ms: u64,
    },
    /// The nonce was seen inside the window: a replay.
    #[error("nonce already seen inside the window (a replay)")]
    Replayed,
    /// The guard remembers as many nonces as it may; new headers wait for old ones to expire.
    #[error("replay guard full ({0} nonces inside the window)")]
    Full(usize),
}

/// Remembers the nonces of the last window.
#[derive(Debug)]
pub struct ReplayGuard {
    window_ms: u64,
    capacity: usize,
    seen: HashSet<[u8; 16]>,
    /// (forget at, nonce), in the order remembered; `forget at` never decreases along it.
    expiry: VecDeque<(u64, [u8; 16])>,
}

impl ReplayGuard {
    /// A guard with a window of ±`window_ms` that remembers at most `capacity` nonces.
    pub fn new(window_ms: u64, capacity: usize) -> ReplayGuard {
        ReplayGuard {
            window_ms,
            capacity,
            seen: HashSet::new(),
            expiry: VecDeque::new(),
        }
    }

    /// The most nonces remembered at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Nonces remembered now.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether no nonce is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Accepts a header stamped `timestamp_ms` with `nonce` at time `now_ms` (and remembers the
    /// nonce), or says why not.
    pub fn check(
        &mut self,
        nonce: [u8; 16],
        timestamp_ms: u64,
        now_ms: u64,
    ) -> Result<(), ReplayError> {
        self.expire(now_ms);
        if timestamp_ms.abs_diff(now_ms) > self.window_ms {
            let skew_ms =
                i64::try_from(i128::from(timestamp_ms) - i128::from(now_ms)).unwrap_or(i64::MAX);
            return Err(ReplayError::OutsideWindow {
                skew_ms,
                window_ms: self.window_ms,
            });
        }
        if self.seen.contains(&nonce) {
            return Err(ReplayError::Replayed);
        }
        if self.seen.len() >= self.capacity {
            return Err(ReplayError::Full(self.capacity));
        }
        // The header stays fresh until timestamp + window; remembering until now + 2 * window
        // covers that (timestamp <= now + window) and keeps the queue in time order, even when
        // the clock steps back (the last entry's time is the floor).
        let floor = self.expiry.back().map_or(0, |(at, _)| *at);
        let forget_at = now_ms
            .saturating_add(self.window_ms.saturating_mul(2))
            .max(floor);
        self.seen.insert(nonce);
        self.expiry.push_back((forget_at, nonce));
        Ok(())
    }

    fn expire(&mut self, now_ms: u64) {
        while let Some(&(at, nonce)) = self.expiry.front() {
            if at > now_ms {
                break;
            }
            self.expiry.pop_front();
            self.seen.remove(&nonce);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn fresh_headers_pass_once() {
        let mut guard = ReplayGuard::new(30_000, 100);
        assert_eq!(guard.check([1; 16], NOW, NOW), Ok(()));
        assert_eq!(
            guard.check([1; 16], NOW, NOW + 10),
            Err(ReplayError::Replayed)
        );
        assert_eq!(guard.check([2; 16], NOW - 30_000, NOW), Ok(()));
        assert_eq!(guard.check([3; 16], NOW + 30_000, NOW), Ok(()));
        assert_eq!(guard.len(), 3);
    }

    #[test]
    fn stale_and_future_timestamps_are_refused() {
        let mut guard = ReplayGuard::new(30_000, 100);
        assert!(matches!(
            guard.check([1; 16], NOW - 30_001, NOW),
            Err(ReplayError::OutsideWindow {
                skew_ms: -30_001,
                ..
            })
        ));
        assert!(matches!(
            guard.check([1; 16], NOW + 30_001, NOW),
            Err(ReplayError::OutsideWindow {
                skew_ms: 30_001,
                ..
            })
        ));
        assert!(guard.is_empty(), "refused headers are not remembered");
    }

    #[test]
    fn a_replay_stays_refused_while_its_timestamp_is_fresh_then_nonces_expire() {
        let mut guard = ReplayGuard::new(1_000, 100);
        // Stamped at the far end of the window: fresh until NOW + 2000.
        guard.check([5; 16], NOW + 1_000, NOW).unwrap();
        assert_eq!(
            guard.check([5; 16], NOW + 1_000, NOW + 1_999),
            Err(ReplayError::Replayed)
        );
        // Past every moment the header could be fresh: forgotten, and stale anyway.
        assert!(matches!(
            guard.check([5; 16], NOW + 1_000, NOW + 2_001),
            Err(ReplayError::OutsideWindow { .. })
        ));
        assert!(guard.is_empty());
    }

    #[test]
    fn memory_is_bounded() {
        let mut guard = ReplayGuard::new(1_000, 2);
        guard.check([1; 16], NOW, NOW).unwrap();
        guard.check([2; 16], NOW, NOW).unwrap();
        assert_eq!(guard.check([3; 16], NOW, NOW), Err(ReplayError::Full(2)));
        // Once the first two expire there is room again.
        assert_eq!(guard.check([3; 16], NOW + 2_000, NOW + 2_000), Ok(()));
        assert_eq!(guard.len(), 1);
    }
}
