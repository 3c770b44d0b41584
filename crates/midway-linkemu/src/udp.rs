//! UDP-only impairment: an ISP that blocks or throttles UDP and leaves TCP alone.
//!
//! A [`UdpImpairment`] applies to the frames `classify` recognises as UDP over IPv4 or IPv6
//! (VLAN tag and IPv6 extension headers skipped), optionally only those with a given source or
//! destination port. It either drops them all or polices them with a token bucket: a frame passes
//! if the bucket holds its size, which it then takes; otherwise it is dropped (no shaping, no
//! queue). The bucket starts full, fills at `rate_bps` and holds at most `burst_bytes`. Sizes are
//! whole Ethernet frames, as everywhere in the emulator.
//!
//! Fragments: the first fragment of a UDP datagram carries its ports; later ones do not, so with
//! a `port` they pass (the receiver cannot reassemble the datagram anyway once the first fragment
//! is gone), and without one they are impaired like any UDP frame.
//!
//! The bucket keeps its level in units of 10^-9 bit, so refill and cost are exact integers:
//! `elapsed_ns * rate_bps` units arrive, a frame of `L` bytes costs `L * 8 * 10^9` units.

use serde::{Deserialize, Serialize};

use crate::classify::UdpInfo;

/// Default depth of the token bucket: ten full-size (1514-byte) Ethernet frames.
pub const DEFAULT_UDP_BURST_BYTES: u64 = 10 * FULL_FRAME_BYTES;
/// Smallest accepted bucket depth: one full-size Ethernet frame (1500-byte MTU), else such
/// datagrams could never pass.
pub const MIN_UDP_BURST_BYTES: u64 = FULL_FRAME_BYTES;
const FULL_FRAME_BYTES: u64 = 1514;
const UNITS_PER_BIT: u128 = 1_000_000_000;

/// What happens to UDP on one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UdpImpairment {
    /// Only UDP datagrams with this source or destination port; `None` = all UDP.
    #[serde(default)]
    pub port: Option<u16>,
    /// Drop them, or police them to a rate.
    pub action: UdpAction,
}

/// The treatment of the UDP frames a [`UdpImpairment`] selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum UdpAction {
    /// Every selected frame is dropped.
    Drop,
    /// A token bucket: frames beyond `rate_bps` (after a burst of `burst_bytes`) are dropped.
    RateLimit {
        /// Long-run rate allowed through, in bit/s of Ethernet frames; more than zero.
        rate_bps: u64,
        /// Bucket depth in bytes (default [`DEFAULT_UDP_BURST_BYTES`]); at least
        /// [`MIN_UDP_BURST_BYTES`].
        #[serde(default = "default_burst")]
        burst_bytes: u64,
    },
}

fn default_burst() -> u64 {
    DEFAULT_UDP_BURST_BYTES
}

/// Why a [`UdpImpairment`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UdpError {
    /// The rate limit is zero.
    #[error("udp rate_limit rate_bps = 0 lets nothing through; use the drop action instead")]
    ZeroRate,
    /// The bucket cannot hold one full-size frame.
    #[error(
        "udp rate_limit burst_bytes = {burst} is less than one full-size frame ({min} bytes), \
         so full-size datagrams could never pass",
        min = MIN_UDP_BURST_BYTES
    )]
    BurstTooSmall {
        /// The depth it was given.
        burst: u64,
    },
    /// Port 0 is never a datagram's port.
    #[error("udp port = 0 matches no datagram; leave `port` out to select all UDP")]
    ZeroPort,
}

impl UdpImpairment {
    /// Checks every value.
    pub fn validate(&self) -> Result<(), UdpError> {
        if self.port == Some(0) {
            return Err(UdpError::ZeroPort);
        }
        match self.action {
            UdpAction::Drop => Ok(()),
            UdpAction::RateLimit { rate_bps: 0, .. } => Err(UdpError::ZeroRate),
            UdpAction::RateLimit { burst_bytes, .. } if burst_bytes < MIN_UDP_BURST_BYTES => {
                Err(UdpError::BurstTooSmall { burst: burst_bytes })
            }
            UdpAction::RateLimit { .. } => Ok(()),
        }
    }

    /// Whether this impairment applies to a UDP frame with `info`.
    fn selects(&self, info: UdpInfo) -> bool {
        match self.port {
            None => true,
            Some(port) => info
                .ports
                .is_some_and(|(source, destination)| source == port || destination == port),
        }
    }
}

/// The state of one direction's UDP impairment: the token bucket's level.
#[derive(Debug, Clone)]
pub(crate) struct UdpPolicer {
    impairment: UdpImpairment,
    /// Tokens, in units of 10^-9 bit.
    level: u128,
    last_ns: u64,
}

impl UdpPolicer {
    /// A policer with a full bucket.
    pub(crate) fn new(impairment: UdpImpairment) -> UdpPolicer {
        let level = match impairment.action {
            UdpAction::Drop => 0,
            UdpAction::RateLimit { burst_bytes, .. } => capacity(burst_bytes),
        };
        UdpPolicer {
            impairment,
            level,
            last_ns: 0,
        }
    }

    /// Decides whether a frame of `len` bytes arriving at `now_ns` is dropped; `udp` is `None`
    /// for frames that are not UDP, which always pass and take no tokens.
    pub(crate) fn drops(&mut self, now_ns: u64, len: u64, udp: Option<UdpInfo>) -> bool {
        let Some(info) = udp else {
            return false;
        };
        if !self.impairment.selects(info) {
            return false;
        }
        match self.impairment.action {
            UdpAction::Drop => true,
            UdpAction::RateLimit {
                rate_bps,
                burst_bytes,
            } => {
                // Arrivals are in time order; a step back in time refills nothing.
                let elapsed = now_ns.saturating_sub(self.last_ns);
                self.last_ns = self.last_ns.max(now_ns);
                self.level = (self.level + u128::from(elapsed) * u128::from(rate_bps))
                    .min(capacity(burst_bytes));
                let cost = u128::from(len) * 8 * UNITS_PER_BIT;
                if self.level >= cost {
                    self.level -= cost;
                    false
                } else {
                    true
                }
            }
        }
    }
}

fn capacity(burst_bytes: u64) -> u128 {
    u128::from(burst_bytes) * 8 * UNITS_PER_BIT
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::classify::{FrameClass, FrameKind};
    use crate::engine::{Direction, DropReason, Verdict};
    use crate::DirectionConfig;

    const MS: u64 = 1_000_000;
    const UDP_443: Option<UdpInfo> = Some(UdpInfo {
        ports: Some((50_000, 443)),
    });

    fn limit(rate_bps: u64, burst_bytes: u64) -> UdpImpairment {
        UdpImpairment {
            port: None,
            action: UdpAction::RateLimit {
                rate_bps,
                burst_bytes,
            },
        }
    }

    #[test]
    fn the_bucket_starts_full_and_refills_at_the_rate() {
        // 12 Mbit/s: 1500 bytes of tokens per ms; the bucket holds two such frames.
        let mut policer = UdpPolicer::new(limit(12_000_000, 3000));
        assert!(!policer.drops(0, 1500, UDP_443));
        assert!(!policer.drops(0, 1500, UDP_443));
        assert!(policer.drops(0, 1500, UDP_443));
        // The bucket is empty: even a 1-byte frame is dropped.
        assert!(policer.drops(0, 1, UDP_443));
        // 1 ms refills exactly one frame's worth; 1 ns less does not.
        assert!(policer.drops(MS - 1, 1500, UDP_443));
        assert!(!policer.drops(MS, 1500, UDP_443));
        assert!(policer.drops(MS, 1, UDP_443));
        // Half a millisecond: 750 bytes, whatever the frame sizes in between.
        assert!(!policer.drops(MS + MS / 2, 750, UDP_443));
        assert!(policer.drops(MS + MS / 2, 1, UDP_443));
        // A long idle time fills the bucket only up to its depth.
        assert!(!policer.drops(1000 * MS, 1500, UDP_443));
        assert!(!policer.drops(1000 * MS, 1500, UDP_443));
        assert!(policer.drops(1000 * MS, 1500, UDP_443));
        // Non-UDP frames pass and take nothing; time going back refills nothing.
        assert!(!policer.drops(1000 * MS, 1500, None));
        assert!(policer.drops(999 * MS, 1, UDP_443));
    }

    #[test]
    fn the_long_run_rate_is_the_configured_one() {
        // 1 Mbit/s offered 10 Mbit/s of 1250-byte frames (one per ms) for 10 s.
        let mut policer = UdpPolicer::new(limit(1_000_000, 2500));
        let passed = (0..10_000u64)
            .filter(|&k| !policer.drops(k * MS, 1250, UDP_443))
            .count() as u64;
        // The two-frame burst at 0 and 1 ms, then one frame per 10 kbit refilled: at 11, 21, ...,
        // 9991 ms (999 frames).
        assert_eq!(passed, 1001);
    }

    #[test]
    fn drop_selects_by_port_and_leaves_other_traffic_alone() {
        let mut all = UdpPolicer::new(UdpImpairment {
            port: None,
            action: UdpAction::Drop,
        });
        assert!(all.drops(0, 100, UDP_443));
        assert!(all.drops(0, 100, Some(UdpInfo { ports: None })));
        assert!(!all.drops(0, 100, None));
        let mut quic = UdpPolicer::new(UdpImpairment {
            port: Some(443),
            action: UdpAction::Drop,
        });
        assert!(quic.drops(0, 100, UDP_443));
        assert!(quic.drops(
            0,
            100,
            Some(UdpInfo {
                ports: Some((443, 50_000))
            })
        ));
        assert!(!quic.drops(
            0,
            100,
            Some(UdpInfo {
                ports: Some((53, 50_000))
            })
        ));
        // A later fragment has no ports: not selected by a port.
        assert!(!quic.drops(0, 100, Some(UdpInfo { ports: None })));
    }

    #[test]
    fn nonsense_values_are_rejected() {
        assert_eq!(limit(0, 3000).validate(), Err(UdpError::ZeroRate));
        let small = limit(1_000_000, 1000).validate().unwrap_err();
        assert_eq!(small, UdpError::BurstTooSmall { burst: 1000 });
        assert!(small.to_string().contains("1514"), "{small}");
        assert_eq!(limit(1, MIN_UDP_BURST_BYTES).validate(), Ok(()));
        let port_zero = UdpImpairment {
            port: Some(0),
            action: UdpAction::Drop,
        };
        assert_eq!(port_zero.validate(), Err(UdpError::ZeroPort));
    }

    #[test]
    fn the_engine_drops_udp_and_passes_tcp() {
        let config = DirectionConfig {
            delay: Duration::from_millis(5),
            udp: Some(UdpImpairment {
                port: None,
                action: UdpAction::Drop,
            }),
            ..Default::default()
        };
        let mut direction = Direction::new(config, 1);
        let udp = FrameClass {
            kind: FrameKind::Other,
            udp: UDP_443,
        };
        let tcp = FrameClass {
            kind: FrameKind::Other,
            udp: None,
        };
        let ack = FrameClass {
            kind: FrameKind::PureAck,
            udp: None,
        };
        assert_eq!(
            direction.arrive_frame(0, 1200, udp),
            Verdict::Dropped(DropReason::Udp)
        );
        assert_eq!(
            direction.arrive_frame(0, 1514, tcp),
            Verdict::Accepted {
                id: 0,
                departure_ns: 5 * MS
            }
        );
        assert!(matches!(
            direction.arrive_frame(0, 66, ack),
            Verdict::Accepted { id: 1, .. }
        ));
        let stats = direction.stats();
        assert_eq!((stats.udp_drops, stats.udp_drop_bytes), (1, 1200));
        assert_eq!(stats.dropped_loss_frames, 0);
    }

    #[test]
    fn an_outage_takes_precedence_and_dropped_frames_take_no_tokens() {
        let config = DirectionConfig {
            udp: Some(limit(12_000_000, 1500)),
            outages: crate::OutageSchedule {
                once: vec![crate::Outage {
                    start: Duration::ZERO,
                    duration: Duration::from_millis(1),
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        let mut direction = Direction::new(config, 1);
        let udp = FrameClass {
            kind: FrameKind::Other,
            udp: UDP_443,
        };
        assert_eq!(
            direction.arrive_frame(0, 1500, udp),
            Verdict::Dropped(DropReason::Outage)
        );
        // The bucket is still full when the outage ends.
        assert!(matches!(
            direction.arrive_frame(MS, 1500, udp),
            Verdict::Accepted { .. }
        ));
        assert_eq!(
            direction.arrive_frame(MS, 1500, udp),
            Verdict::Dropped(DropReason::Udp)
        );
        let stats = direction.stats();
        assert_eq!((stats.outage_drops, stats.udp_drops), (1, 1));
    }
}
