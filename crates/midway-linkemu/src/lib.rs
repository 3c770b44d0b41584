//! midway-linkemu: midway's own link emulator.
//!
//! The lab needs links with a one-way delay, a serialisation rate, a drop-tail queue (a cable
//! modem's 10 KB buffer), loss (Bernoulli or Gilbert-Elliott bursts, chosen separately for data and
//! for pure TCP ACKs), jitter that never reorders, mahimahi capacity traces, scheduled blackouts
//! ([`OutageSchedule`]) and an ISP that blocks or throttles UDP but not TCP ([`UdpImpairment`]).
//!
//! Why our own and not an existing tool or crate: the lab kernel has no `netem` qdisc (see
//! `LINUX-TCP-KNOBS.md`), so delay cannot come from the kernel; mahimahi is a C++ program built on
//! TUN devices and its own shells, not a library we can drive per link; and no Rust crate emulates a
//! link between two existing interfaces. The emulator is therefore split in two:
//!
//! - `engine`: pure logic. Given `now` (nanoseconds) and a seeded ChaCha RNG it decides, for each
//!   arriving frame, whether it is lost or tail-dropped and when it leaves. No I/O, no clock, no
//!   global RNG, so unit tests are exact and a run is repeatable from its seed.
//! - `driver`: a thin layer with one thread per direction that moves Ethernet frames between two
//!   veth ends of the link's own network namespace with `AF_PACKET` raw sockets.
//!
//! `classify` tells pure TCP ACKs and UDP from everything else, `trace` parses mahimahi traces
//! ([`CapacityTrace`]), `outage` decides when a direction is down and `udp` polices UDP.
//!
//! Accuracy measured through the driver (veth pairs, offloads off, 2 cores shared with other
//! builds at load 3-8): goodput of a bulk TCP transfer within 0.1 % of the configured rate at 20
//! and 100 Mbit/s (also with 8 links side by side); ping RTT on a 2 x 10 ms link 0.03-0.3 ms above
//! the configured value on average (part of it is the hosts' own stack); Bernoulli loss counts
//! within statistical bounds and every datagram accounted for. Rare stalls of the whole machine
//! (tens of ms) show up as outliers in `send_lateness_max_ns`.
//!
//! Reproducibility: every random draw comes from ChaCha8 streams seeded by the link's seed (see
//! `driver::direction_seeds`); with the same seed and the same arrival sequence the engine makes
//! the same decisions. Real runs differ only in arrival timing.
//!
//! Frame size convention: the length that counts for rate, queue limits and traces is the whole
//! Ethernet frame as the raw socket sees it (14-byte header + IP packet), without preamble,
//! inter-frame gap or FCS. A "20 Mbit/s" link thus carries 20 Mbit/s of Ethernet frames, and a bulk
//! TCP transfer with 1448-byte segments (1514-byte frames) gets 20 x 1448 / 1514 Mbit/s of goodput.

use std::time::Duration;

use serde::{Deserialize, Serialize};

mod classify;
mod driver;
mod engine;
mod outage;
mod trace;
mod udp;

pub use driver::{spawn_link, spawn_link_with_options, DriverError, DriverOptions, LinkHandle};
pub use engine::DirectionStats;
pub use outage::{Outage, OutageError, OutageSchedule, PeriodicOutage};
pub use trace::{CapacityTrace, TraceError};
pub use udp::{UdpAction, UdpError, UdpImpairment, DEFAULT_UDP_BURST_BYTES, MIN_UDP_BURST_BYTES};

/// Longest one-way delay or jitter accepted; longer values are almost certainly a unit mistake.
pub const MAX_DELAY: Duration = Duration::from_secs(60);

/// The emulation of one direction of a link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectionConfig {
    /// One-way propagation delay, added after serialisation.
    pub delay: Duration,
    /// Serialisation rate in bit/s; `None` = unlimited.
    pub rate_bps: Option<u64>,
    /// Drop-tail limit on the frames waiting for or in serialisation.
    pub queue: QueueLimit,
    /// Loss applied to frames that are not pure TCP ACKs.
    pub data_loss: LossModel,
    /// Loss applied to pure TCP ACKs.
    pub ack_loss: LossModel,
    /// Extra uniform delay in `0..=jitter`; departures stay in FIFO order (never reordering).
    pub jitter: Option<Duration>,
    /// A mahimahi capacity trace; replaces `rate_bps` when set.
    pub trace: Option<CapacityTrace>,
    /// Scheduled blackouts: every frame arriving during one is dropped (default: none). Absent
    /// from older serialized configs, and left out when empty.
    #[serde(default, skip_serializing_if = "OutageSchedule::is_empty")]
    pub outages: OutageSchedule,
    /// Drop or rate-limit UDP only, leaving TCP alone; `None` (default) = UDP like any traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<UdpImpairment>,
}

impl Default for DirectionConfig {
    /// A perfect link: no delay, unlimited rate and queue, no loss, no jitter.
    fn default() -> Self {
        DirectionConfig {
            delay: Duration::ZERO,
            rate_bps: None,
            queue: QueueLimit::Unlimited,
            data_loss: LossModel::None,
            ack_loss: LossModel::None,
            jitter: None,
            trace: None,
            outages: OutageSchedule::default(),
            udp: None,
        }
    }
}

/// Drop-tail limit of the queue in front of the serialiser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueLimit {
    /// No limit: every frame that is not lost is queued, however long the backlog.
    Unlimited,
    /// At most this many bytes (whole frames) waiting for or in serialisation.
    Bytes(u64),
    /// At most this many frames waiting for or in serialisation.
    Packets(u32),
}

/// How frames of one class (data or pure ACK) are lost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LossModel {
    /// No frame of this class is lost.
    None,
    /// Each frame is lost independently with probability `p`.
    Bernoulli {
        /// Probability (0..=1) that one frame is lost.
        p: f64,
    },
    /// Two-state Markov chain advanced once per frame of its class; bursts of loss in the bad
    /// state last on average `1 / p_bad_to_good` frames.
    GilbertElliott {
        /// Probability (0..=1), per frame, of moving from the good state to the bad one.
        p_good_to_bad: f64,
        /// Probability (0..=1), per frame, of moving from the bad state back to the good one.
        p_bad_to_good: f64,
        /// Probability (0..=1) that a frame is lost while the chain is in the good state.
        loss_in_good: f64,
        /// Probability (0..=1) that a frame is lost while the chain is in the bad state.
        loss_in_bad: f64,
    },
}

/// Why a [`DirectionConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A loss probability lies outside 0..=1.
    #[error("{field} = {value} is not a probability (it must lie in 0..=1)")]
    Probability {
        /// The offending field, e.g. `data_loss.p`.
        field: &'static str,
        /// The value it was given.
        value: f64,
    },
    /// `rate_bps` is `Some(0)`, a link that would never send.
    #[error("rate_bps = 0 would never send anything; use None for an unlimited rate")]
    ZeroRate,
    /// The queue limit is zero bytes or zero frames, so every frame would be dropped.
    #[error("a queue limit of 0 drops every frame; use at least one frame's worth")]
    ZeroQueueLimit,
    /// The delay or the jitter exceeds [`MAX_DELAY`].
    #[error("{field} = {value:?} exceeds the maximum of {max:?}", max = MAX_DELAY)]
    DelayTooLong {
        /// The offending field, `delay` or `jitter`.
        field: &'static str,
        /// The duration it was given.
        value: Duration,
    },
    /// The capacity trace is invalid.
    #[error("invalid capacity trace")]
    Trace(#[source] TraceError),
    /// The outage schedule is invalid.
    #[error("invalid outage schedule")]
    Outages(#[source] OutageError),
    /// The UDP impairment is invalid.
    #[error("invalid UDP impairment")]
    Udp(#[source] UdpError),
}

impl DirectionConfig {
    /// Checks every value; the engine assumes a validated config.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.delay > MAX_DELAY {
            return Err(ConfigError::DelayTooLong {
                field: "delay",
                value: self.delay,
            });
        }
        if let Some(jitter) = self.jitter {
            if jitter > MAX_DELAY {
                return Err(ConfigError::DelayTooLong {
                    field: "jitter",
                    value: jitter,
                });
            }
        }
        if self.rate_bps == Some(0) {
            return Err(ConfigError::ZeroRate);
        }
        match self.queue {
            QueueLimit::Bytes(0) | QueueLimit::Packets(0) => {
                return Err(ConfigError::ZeroQueueLimit)
            }
            _ => {}
        }
        self.data_loss.validate(true)?;
        self.ack_loss.validate(false)?;
        if let Some(trace) = &self.trace {
            trace.validate().map_err(ConfigError::Trace)?;
        }
        self.outages.validate().map_err(ConfigError::Outages)?;
        if let Some(udp) = &self.udp {
            udp.validate().map_err(ConfigError::Udp)?;
        }
        Ok(())
    }
}

impl LossModel {
    /// `data` tells the data-loss model from the ACK-loss one, for the field names in errors
    /// (static strings, so the error stays cheap to clone and compare).
    fn validate(&self, data: bool) -> Result<(), ConfigError> {
        let check = |field: &'static str, value: f64| {
            if (0.0..=1.0).contains(&value) {
                Ok(())
            } else {
                Err(ConfigError::Probability { field, value })
            }
        };
        match *self {
            LossModel::None => Ok(()),
            LossModel::Bernoulli { p } => check(if data { "data_loss.p" } else { "ack_loss.p" }, p),
            LossModel::GilbertElliott {
                p_good_to_bad,
                p_bad_to_good,
                loss_in_good,
                loss_in_bad,
            } => {
                let fields: [(&'static str, &'static str, f64); 4] = [
                    (
                        "data_loss.p_good_to_bad",
                        "ack_loss.p_good_to_bad",
                        p_good_to_bad,
                    ),
                    (
                        "data_loss.p_bad_to_good",
                        "ack_loss.p_bad_to_good",
                        p_bad_to_good,
                    ),
                    (
                        "data_loss.loss_in_good",
                        "ack_loss.loss_in_good",
                        loss_in_good,
                    ),
                    ("data_loss.loss_in_bad", "ack_loss.loss_in_bad", loss_in_bad),
                ];
                for (data_name, ack_name, value) in fields {
                    check(if data { data_name } else { ack_name }, value)?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert_eq!(DirectionConfig::default().validate(), Ok(()));
    }

    #[test]
    fn validation_rejects_bad_values() {
        let bad_p = DirectionConfig {
            data_loss: LossModel::Bernoulli { p: 1.5 },
            ..Default::default()
        };
        assert_eq!(
            bad_p.validate(),
            Err(ConfigError::Probability {
                field: "data_loss.p",
                value: 1.5
            })
        );
        let nan_ge = DirectionConfig {
            ack_loss: LossModel::GilbertElliott {
                p_good_to_bad: 0.1,
                p_bad_to_good: f64::NAN,
                loss_in_good: 0.0,
                loss_in_bad: 1.0,
            },
            ..Default::default()
        };
        assert!(matches!(
            nan_ge.validate(),
            Err(ConfigError::Probability {
                field: "ack_loss.p_bad_to_good",
                ..
            })
        ));
        let negative = DirectionConfig {
            data_loss: LossModel::Bernoulli { p: -0.01 },
            ..Default::default()
        };
        assert!(negative.validate().is_err());
        let zero_rate = DirectionConfig {
            rate_bps: Some(0),
            ..Default::default()
        };
        assert_eq!(zero_rate.validate(), Err(ConfigError::ZeroRate));
        for queue in [QueueLimit::Bytes(0), QueueLimit::Packets(0)] {
            let zero_queue = DirectionConfig {
                queue,
                ..Default::default()
            };
            assert_eq!(zero_queue.validate(), Err(ConfigError::ZeroQueueLimit));
        }
        let long = DirectionConfig {
            delay: Duration::from_secs(3600),
            ..Default::default()
        };
        assert!(matches!(
            long.validate(),
            Err(ConfigError::DelayTooLong { field: "delay", .. })
        ));
        let long_jitter = DirectionConfig {
            jitter: Some(Duration::from_secs(61)),
            ..Default::default()
        };
        assert!(matches!(
            long_jitter.validate(),
            Err(ConfigError::DelayTooLong {
                field: "jitter",
                ..
            })
        ));
    }

    #[test]
    fn config_round_trips_through_serde() {
        let config = DirectionConfig {
            delay: Duration::from_millis(10),
            rate_bps: Some(20_000_000),
            queue: QueueLimit::Bytes(10_000),
            data_loss: LossModel::Bernoulli { p: 0.01 },
            ack_loss: LossModel::GilbertElliott {
                p_good_to_bad: 0.01,
                p_bad_to_good: 0.5,
                loss_in_good: 0.0,
                loss_in_bad: 1.0,
            },
            jitter: Some(Duration::from_micros(500)),
            trace: Some(CapacityTrace::parse("1\n2\n").unwrap()),
            outages: OutageSchedule {
                periodic: Some(PeriodicOutage {
                    period: Duration::from_secs(15),
                    duration: Duration::from_millis(200),
                    offset: Duration::from_secs(1),
                }),
                once: vec![Outage {
                    start: Duration::from_secs(20),
                    duration: Duration::from_secs(5),
                }],
            },
            udp: Some(UdpImpairment {
                port: Some(443),
                action: UdpAction::RateLimit {
                    rate_bps: 1_000_000,
                    burst_bytes: 20_000,
                },
            }),
        };
        let json = serde_json::to_string(&config).unwrap();
        let back: DirectionConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, config);
    }

    /// A config serialized before outages and UDP impairments existed.
    const OLD_CONFIG_JSON: &str = r#"{"delay":{"secs":0,"nanos":10000000},"rate_bps":20000000,
        "queue":{"bytes":10000},"data_loss":{"bernoulli":{"p":0.01}},"ack_loss":"none",
        "jitter":null,"trace":null}"#;

    #[test]
    fn old_configs_still_parse_and_new_fields_default_to_off() {
        let old: DirectionConfig = serde_json::from_str(OLD_CONFIG_JSON).unwrap();
        assert!(old.outages.is_empty());
        assert_eq!(old.udp, None);
        assert_eq!(old.validate(), Ok(()));
        // Unset, the new fields are not written, so older readers keep reading new output.
        let json = serde_json::to_string(&old).unwrap();
        assert!(!json.contains("outages") && !json.contains("udp"), "{json}");
        // Old stats (without the new counters) parse too.
        let old_stats = serde_json::to_string(&DirectionStats::default())
            .unwrap()
            .replace(",\"outage_drops\":0,\"outage_drop_bytes\":0", "")
            .replace(",\"udp_drops\":0,\"udp_drop_bytes\":0", "");
        assert!(!old_stats.contains("outage") && !old_stats.contains("udp"));
        let stats: DirectionStats = serde_json::from_str(&old_stats).unwrap();
        assert_eq!(stats, DirectionStats::default());
    }

    #[test]
    fn new_fields_parse_with_defaults_and_reject_nonsense() {
        let parse = |extra: &str| {
            let json =
                OLD_CONFIG_JSON.replace("\"trace\":null", &format!("\"trace\":null,{extra}"));
            serde_json::from_str::<DirectionConfig>(&json)
        };
        let config = parse(
            r#""outages":{"periodic":{"period":{"secs":15,"nanos":0},
                "duration":{"secs":0,"nanos":200000000}}},
               "udp":{"action":{"rate_limit":{"rate_bps":1000000}}}"#,
        )
        .unwrap();
        let periodic = config.outages.periodic.unwrap();
        assert_eq!(periodic.offset, Duration::ZERO);
        assert!(config.outages.once.is_empty());
        assert_eq!(
            config.udp,
            Some(UdpImpairment {
                port: None,
                action: UdpAction::RateLimit {
                    rate_bps: 1_000_000,
                    burst_bytes: DEFAULT_UDP_BURST_BYTES
                }
            })
        );
        assert_eq!(config.validate(), Ok(()));
        let drop = parse(r#""udp":{"action":"drop","port":443}"#).unwrap();
        assert_eq!(drop.udp.map(|u| u.action), Some(UdpAction::Drop));
        // Unknown keys stay errors, inside the new tables too.
        assert!(parse(r#""udp":{"action":"drop","ports":443}"#).is_err());
        assert!(parse(r#""outages":{"every":1}"#).is_err());
        // Parsed but invalid: validation names the problem.
        let too_long = parse(
            r#""outages":{"periodic":{"period":{"secs":1,"nanos":0},
                "duration":{"secs":2,"nanos":0}}}"#,
        )
        .unwrap();
        assert!(matches!(
            too_long.validate(),
            Err(ConfigError::Outages(OutageError::LongerThanPeriod { .. }))
        ));
        let zero_rate = parse(r#""udp":{"action":{"rate_limit":{"rate_bps":0}}}"#).unwrap();
        assert_eq!(
            zero_rate.validate(),
            Err(ConfigError::Udp(UdpError::ZeroRate))
        );
    }
}
