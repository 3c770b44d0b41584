//! Overload fails open: when midway serves nearly as many connections as it may, or cannot
//! accept as fast as connections arrive (a transparent listener's accept queue nearly full),
//! new connections of transparent listeners bypass it (routed unsplit by the kernel) instead of
//! waiting in the accept queue or being refused. The switch has hysteresis so that a load near
//! the limit does not flip it on every connection; the nftables side (a set the rules read, and
//! the bypassed flows remembered so they stay unsplit to their end) is in `nft.rs`.

use std::sync::Arc;

use crate::metrics::Metrics;
use crate::nft;

/// Bypass once this share of `max_connections` (in percent) is in use...
const BYPASS_AT_PERCENT: usize = 99;
/// ...and split again once use falls below this share.
const RESUME_BELOW_PERCENT: usize = 95;

/// How full one resource is: the open connections against `max_connections`, or a listener's
/// accept queue against its backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Load {
    pub(super) used: usize,
    pub(super) limit: usize,
    /// What it is, for the log.
    pub(super) what: &'static str,
}

impl Load {
    /// The fuller of the two (by share of its limit).
    pub(super) fn fuller(self, other: Load) -> Load {
        // used / limit > other.used / other.limit, without division.
        if other.used.saturating_mul(self.limit) > self.used.saturating_mul(other.limit) {
            other
        } else {
            self
        }
    }
}

/// The bypass decision, without I/O: fed the connections in use, it says when to switch.
#[derive(Debug, Default)]
pub(super) struct OverloadSwitch {
    bypassing: bool,
}

impl OverloadSwitch {
    /// `Some(true)`: start bypassing; `Some(false)`: stop; `None`: no change.
    pub(super) fn update(&mut self, in_use: usize, limit: usize) -> Option<bool> {
        let percent_scaled = in_use.saturating_mul(100);
        let next = if self.bypassing {
            percent_scaled >= limit.saturating_mul(RESUME_BELOW_PERCENT)
        } else {
            percent_scaled >= limit.saturating_mul(BYPASS_AT_PERCENT)
        };
        (next != self.bypassing).then(|| {
            self.bypassing = next;
            next
        })
    }
}

/// Follows the connections in use and flips the bypass of midway's managed nftables tables
/// when the switch says so; logs and counts each flip.
pub(super) struct OverloadBypass {
    switch: OverloadSwitch,
    /// The tables the switch was last set for: a reload that rewrites them starts them split.
    tables: Arc<[String]>,
    metrics: Metrics,
}

impl OverloadBypass {
    pub(super) fn new(metrics: Metrics) -> OverloadBypass {
        OverloadBypass {
            switch: OverloadSwitch::default(),
            tables: Arc::from(Vec::new()),
            metrics,
        }
    }

    /// Called periodically with the managed tables installed now and the fullest resource.
    pub(super) async fn observe(&mut self, tables: Arc<[String]>, load: Load) {
        let Load {
            used: in_use,
            limit,
            what,
        } = load;
        if !Arc::ptr_eq(&tables, &self.tables) {
            // Rewritten (a reload): its overload set starts empty, that is, not bypassing.
            self.tables = tables;
            if self.switch.bypassing {
                self.switch = OverloadSwitch::default();
                self.metrics.bypass_active.set(0);
            }
        }
        if self.tables.is_empty() {
            return;
        }
        let Some(bypass) = self.switch.update(in_use, limit) else {
            return;
        };
        let tables = self.tables.clone();
        let result =
            tokio::task::spawn_blocking(move || nft::set_overload_bypass(&tables, bypass)).await;
        match result {
            Ok(Ok(())) => {
                self.metrics.bypass_active.set(i64::from(bypass));
                self.metrics.bypass_switches.inc();
                if bypass {
                    tracing::warn!(
                        in_use,
                        limit,
                        full = what,
                        "overloaded: new intercepted connections now bypass midway (routed unsplit)"
                    );
                } else {
                    tracing::info!(
                        in_use,
                        limit,
                        full = what,
                        "load back below the limit: new intercepted connections are split again"
                    );
                }
            }
            Ok(Err(err)) => {
                // Try again on the next observation.
                self.switch = OverloadSwitch { bypassing: !bypass };
                tracing::warn!(error = %err, bypass, "could not switch the overload bypass");
            }
            Err(err) => tracing::warn!(error = %err, "overload bypass task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fuller_resource_decides() {
        let connections = Load {
            used: 10,
            limit: 1000,
            what: "connections",
        };
        let queue = Load {
            used: 4000,
            limit: 4096,
            what: "accept queue",
        };
        assert_eq!(connections.fuller(queue), queue);
        assert_eq!(queue.fuller(connections), queue);
        let idle_queue = Load { used: 0, ..queue };
        assert_eq!(connections.fuller(idle_queue), connections);
        // An accept queue at 98 % of its backlog bypasses like connections at 98 % would not,
        // and one at 99 % does.
        let mut switch = OverloadSwitch::default();
        assert_eq!(switch.update(4014, 4096), None);
        assert_eq!(switch.update(4056, 4096), Some(true));
    }

    #[test]
    fn bypasses_at_the_limit_and_resumes_below_95_percent() {
        let mut switch = OverloadSwitch::default();
        assert_eq!(switch.update(9, 10), None);
        assert_eq!(switch.update(10, 10), Some(true));
        assert_eq!(switch.update(10, 10), None);
        // 9 of 10 is 90 %: below 95 %.
        assert_eq!(switch.update(9, 10), Some(false));
        let mut switch = OverloadSwitch::default();
        assert_eq!(switch.update(989, 1000), None);
        assert_eq!(switch.update(990, 1000), Some(true));
        // Hysteresis: between 95 % and 99 % nothing changes.
        assert_eq!(switch.update(960, 1000), None);
        assert_eq!(switch.update(950, 1000), None);
        assert_eq!(switch.update(949, 1000), Some(false));
        assert_eq!(switch.update(980, 1000), None);
    }
}
