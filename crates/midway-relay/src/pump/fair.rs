//! Turn-taking between busy directions: how many bytes one direction moves before it yields so
//! every other ready socket is served. Shared by the forward loop and both halves of the spool,
//! so all busy loops pause by the same rule.

use crate::resources::RelayResources;

/// Bytes all busy directions together may move between two looks at epoll: at the 10 Gbit/s
/// a 2-core gateway relays, about 13 ms, well inside the 200 ms a sender waits before it
/// probes a closed window again.
const ROUND_BYTES: usize = 16 * 1024 * 1024;
/// Smallest turn, about one read of a socket whose buffer the memory guard capped: with a
/// thousand busy directions each yields after every read and write, as an event loop would
/// (a 64 KiB floor still left 1-10 % of the sockets waiting over 300 ms at 1000 streams).
const MIN_TURN_BYTES: usize = 16 * 1024;

/// Bytes one busy direction moves before it lets the others have their turn: the round shared
/// by the directions that are busy right now, so that one lone transfer is never interrupted
/// for nothing and a thousand busy ones all get served every round.
fn turn_bytes(busy_directions: usize) -> usize {
    (ROUND_BYTES / busy_directions.max(1)).clamp(MIN_TURN_BYTES, ROUND_BYTES)
}

/// Turn-taking between busy connections.
///
/// Why: on a fast path (veth, loopback, a LAN) a busy source never runs dry. Each read opens
/// the sender's window, the sender pushes more in the same softirq, and the next read finds
/// data again, so a direction never sees EAGAIN and never returns `Pending` by itself. tokio's
/// `consume_budget` then lets it run 128 iterations per poll (up to 32 MiB with 256 KiB pipes),
/// and the scheduler polls epoll only when its run queues are empty or every 61 task polls.
/// With 1000 busy connections that starved the rest: measured mid-run, 70 % of the proxy's
/// client-facing sockets held unread data and had received nothing for over 300 ms, their full
/// receive buffers dropping packets and their senders backing off on zero-window probes.
///
/// What: after its turn (see [`turn_bytes`]) the direction calls `yield_now`, which in tokio
/// defers the task until the worker has polled the I/O driver, so every socket that became
/// ready in the meantime is served before the busy one continues (like an event loop that
/// handles each ready descriptor once per `epoll_wait`). A yield is not free (measured at one
/// stream, yielding every 1 MiB cost about a fifth of the throughput), hence turns that
/// shrink only as more directions are busy. In between, `consume_budget` still keeps a
/// direction that moves few bytes per call from running forever.
#[derive(Debug, Default)]
pub(super) struct FairTurn {
    moved: usize,
}

impl FairTurn {
    /// Counts bytes moved in this turn.
    pub(super) fn moved(&mut self, bytes: usize) {
        self.moved = self.moved.saturating_add(bytes);
    }

    /// True when the turn is used up (and starts the next one).
    fn is_over(&mut self, busy_directions: usize) -> bool {
        if self.moved >= turn_bytes(busy_directions) {
            self.moved = 0;
            true
        } else {
            false
        }
    }

    /// Called between two iterations of a busy loop.
    pub(super) async fn pause(&mut self, resources: &RelayResources) {
        if self.is_over(resources.busy_directions()) {
            tokio::task::yield_now().await;
        } else {
            tokio::task::consume_budget().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{turn_bytes, FairTurn, MIN_TURN_BYTES, ROUND_BYTES};

    #[test]
    fn a_lone_transfer_gets_the_whole_round_and_many_share_it() {
        assert_eq!(turn_bytes(0), ROUND_BYTES);
        assert_eq!(turn_bytes(1), ROUND_BYTES);
        assert_eq!(turn_bytes(4), ROUND_BYTES / 4);
        assert_eq!(turn_bytes(2000), MIN_TURN_BYTES);
        assert!(turn_bytes(100) < turn_bytes(10));
    }

    #[test]
    fn a_turn_ends_after_its_bytes_and_the_next_starts_empty() {
        let busy = 8;
        let mut turn = FairTurn::default();
        turn.moved(turn_bytes(busy) - 1);
        assert!(!turn.is_over(busy));
        turn.moved(1);
        assert!(turn.is_over(busy));
        // The next turn starts from zero, whatever the last chunk overshot.
        assert!(!turn.is_over(busy));
    }

    #[test]
    fn more_busy_directions_end_a_turn_sooner() {
        let mut turn = FairTurn::default();
        turn.moved(MIN_TURN_BYTES);
        assert!(!turn.is_over(1));
        assert!(turn.is_over(10_000));
    }

    #[test]
    fn counting_never_overflows() {
        let mut turn = FairTurn::default();
        turn.moved(usize::MAX);
        turn.moved(usize::MAX);
        assert!(turn.is_over(1));
    }
}
