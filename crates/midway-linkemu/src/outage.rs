//! Scheduled blackouts: a direction drops every frame while an outage is on.
//!
//! An [`OutageSchedule`] combines a periodic outage (e.g. 200 ms every 15 s, starting at an
//! offset) with a list of one-off outages (e.g. 5 s from t = 20 s). Times are the engine's `now`:
//! nanoseconds since the link started (the driver starts both directions' clocks at the same
//! instant, so the same schedule on both directions blacks out the whole link at once). Each
//! outage is the half-open interval `[start, start + duration)`: a frame arriving exactly at the
//! start is dropped, one arriving exactly at the end passes.
//!
//! Dropped frames take no queue space and draw no randomness, so they do not shift the loss
//! pattern of the frames that pass; frames accepted before an outage still leave on schedule
//! (the outage cuts the link's entrance, as an unplugged cable in front of the modem would).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// When a direction is down. The default is no outage at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutageSchedule {
    /// A recurring outage; `None` = none.
    #[serde(default)]
    pub periodic: Option<PeriodicOutage>,
    /// One-off outages, in any order; they may overlap each other and the periodic ones.
    #[serde(default)]
    pub once: Vec<Outage>,
}

/// An outage of `duration` every `period`, the first starting at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeriodicOutage {
    /// Time from the start of one outage to the start of the next; more than `duration`.
    pub period: Duration,
    /// How long each outage lasts; more than zero and less than `period`.
    pub duration: Duration,
    /// When the first outage starts (default 0: at the link's start); none before it.
    #[serde(default)]
    pub offset: Duration,
}

/// One outage: the direction is down from `start` for `duration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outage {
    /// When the outage starts, from the link's start.
    pub start: Duration,
    /// How long it lasts; more than zero.
    pub duration: Duration,
}

/// Why an [`OutageSchedule`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutageError {
    /// `periodic.period` is zero.
    #[error("outages.periodic.period is 0; give the time between outage starts, e.g. \"15s\"")]
    ZeroPeriod,
    /// An outage's duration is zero, which is no outage at all.
    #[error("{field} is 0, which is no outage; remove the outage or give it a duration")]
    ZeroDuration {
        /// The offending field, `outages.periodic.duration` or `outages.once[N].duration`.
        field: String,
    },
    /// The periodic outage lasts as long as its period or longer: the link would never be up.
    #[error(
        "outages.periodic.duration = {duration:?} is not shorter than its period {period:?}; \
         the link would never come back up"
    )]
    LongerThanPeriod {
        /// The outage's duration.
        duration: Duration,
        /// The period it was given.
        period: Duration,
    },
}

impl OutageSchedule {
    /// True if no outage is configured.
    pub fn is_empty(&self) -> bool {
        self.periodic.is_none() && self.once.is_empty()
    }

    /// Checks every value; the engine assumes a validated schedule.
    pub fn validate(&self) -> Result<(), OutageError> {
        if let Some(periodic) = &self.periodic {
            if periodic.period.is_zero() {
                return Err(OutageError::ZeroPeriod);
            }
            if periodic.duration.is_zero() {
                return Err(OutageError::ZeroDuration {
                    field: "outages.periodic.duration".to_owned(),
                });
            }
            if periodic.duration >= periodic.period {
                return Err(OutageError::LongerThanPeriod {
                    duration: periodic.duration,
                    period: periodic.period,
                });
            }
        }
        for (index, outage) in self.once.iter().enumerate() {
            if outage.duration.is_zero() {
                return Err(OutageError::ZeroDuration {
                    field: format!("outages.once[{index}].duration"),
                });
            }
        }
        Ok(())
    }

    /// Whether the direction is down at `now_ns` (nanoseconds since the link started).
    pub(crate) fn is_down(&self, now_ns: u64) -> bool {
        let in_periodic = self.periodic.as_ref().is_some_and(|periodic| {
            let offset = duration_ns(periodic.offset);
            let period = duration_ns(periodic.period);
            // A zero period only reaches here unvalidated; treat it as no periodic outage.
            now_ns >= offset
                && period > 0
                && (now_ns - offset) % period < duration_ns(periodic.duration)
        });
        in_periodic
            || self.once.iter().any(|outage| {
                let start = duration_ns(outage.start);
                now_ns >= start && now_ns - start < duration_ns(outage.duration)
            })
    }
}

fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Direction, DropReason, Verdict};
    use crate::DirectionConfig;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    /// 200 ms every 15 s from t = 5 s, and one 5 s outage from t = 20 s.
    fn schedule() -> OutageSchedule {
        OutageSchedule {
            periodic: Some(PeriodicOutage {
                period: Duration::from_secs(15),
                duration: Duration::from_millis(200),
                offset: Duration::from_secs(5),
            }),
            once: vec![Outage {
                start: Duration::from_secs(20),
                duration: Duration::from_secs(5),
            }],
        }
    }

    #[test]
    fn periodic_outages_are_half_open_intervals_after_the_offset() {
        let only_periodic = OutageSchedule {
            once: Vec::new(),
            ..schedule()
        };
        assert_eq!(only_periodic.validate(), Ok(()));
        let down = |now| only_periodic.is_down(now);
        // Before the offset: up, even where a period boundary (0, 15 s - 10 s...) would fall.
        assert!(!down(0));
        assert!(!down(100 * MS));
        assert!(!down(5 * S - 1));
        // First outage: [5 s, 5.2 s).
        assert!(down(5 * S));
        assert!(down(5 * S + 200 * MS - 1));
        assert!(!down(5 * S + 200 * MS));
        assert!(!down(20 * S - 1));
        // Second and the hundredth: [20 s, 20.2 s), [5 s + 99 * 15 s, ...).
        assert!(down(20 * S));
        assert!(!down(20 * S + 200 * MS));
        assert!(down(5 * S + 99 * 15 * S + 199 * MS));
        assert!(!down(5 * S + 99 * 15 * S + 200 * MS));
        // Far in the future: no overflow.
        assert!(!down(u64::MAX));
    }

    #[test]
    fn one_off_outages_add_to_the_periodic_ones() {
        let schedule = schedule();
        assert!(!schedule.is_down(19 * S));
        assert!(schedule.is_down(20 * S));
        // 20.2 s ends the periodic outage, but the one-off one lasts until 25 s.
        assert!(schedule.is_down(20 * S + 200 * MS));
        assert!(schedule.is_down(25 * S - 1));
        assert!(!schedule.is_down(25 * S));
        assert!(schedule.is_down(35 * S + 100 * MS));
        let empty = OutageSchedule::default();
        assert!(empty.is_empty() && !schedule.is_empty());
        assert!((0..100).all(|k| !empty.is_down(k * 123 * MS)));
    }

    #[test]
    fn nonsense_schedules_are_rejected_with_the_field_named() {
        let periodic = |period_ms, duration_ms| OutageSchedule {
            periodic: Some(PeriodicOutage {
                period: Duration::from_millis(period_ms),
                duration: Duration::from_millis(duration_ms),
                offset: Duration::ZERO,
            }),
            once: Vec::new(),
        };
        assert_eq!(periodic(0, 0).validate(), Err(OutageError::ZeroPeriod));
        assert_eq!(
            periodic(1000, 0).validate(),
            Err(OutageError::ZeroDuration {
                field: "outages.periodic.duration".into()
            })
        );
        let error = periodic(1000, 1000).validate().unwrap_err();
        assert!(matches!(error, OutageError::LongerThanPeriod { .. }));
        assert!(error.to_string().contains("not shorter than its period"));
        assert!(periodic(1000, 2000).validate().is_err());
        assert_eq!(periodic(1000, 999).validate(), Ok(()));
        let zero_once = OutageSchedule {
            once: vec![
                Outage {
                    start: Duration::ZERO,
                    duration: Duration::from_secs(1),
                },
                Outage {
                    start: Duration::from_secs(9),
                    duration: Duration::ZERO,
                },
            ],
            ..Default::default()
        };
        let error = zero_once.validate().unwrap_err();
        assert!(
            error.to_string().contains("outages.once[1].duration"),
            "{error}"
        );
    }

    #[test]
    fn the_engine_drops_every_frame_during_an_outage_and_counts_it_apart() {
        let config = DirectionConfig {
            delay: Duration::from_millis(10),
            outages: OutageSchedule {
                periodic: Some(PeriodicOutage {
                    period: Duration::from_millis(100),
                    duration: Duration::from_millis(20),
                    offset: Duration::from_millis(50),
                }),
                once: Vec::new(),
            },
            ..Default::default()
        };
        let mut direction = Direction::new(config, 1);
        // Accepted just before the outage: still leaves 10 ms later, inside the outage.
        assert_eq!(
            direction.arrive(50 * MS - 1, 100, false),
            Verdict::Accepted {
                id: 0,
                departure_ns: 60 * MS - 1
            }
        );
        for now in [50 * MS, 60 * MS, 70 * MS - 1, 150 * MS] {
            for pure_ack in [false, true] {
                assert_eq!(
                    direction.arrive(now, 1514, pure_ack),
                    Verdict::Dropped(DropReason::Outage),
                    "at {now} ns"
                );
            }
        }
        assert_eq!(direction.pop_due(60 * MS - 1), Some(0));
        assert_eq!(
            direction.arrive(70 * MS, 100, false),
            Verdict::Accepted {
                id: 1,
                departure_ns: 80 * MS
            }
        );
        let stats = direction.stats();
        assert_eq!((stats.outage_drops, stats.outage_drop_bytes), (8, 8 * 1514));
        assert_eq!(stats.arrived_frames, 10);
        assert_eq!(stats.dropped_loss_frames + stats.dropped_queue_frames, 0);
    }
}
