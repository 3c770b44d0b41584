//! The congestion control of a QUIC tunnel, chosen per peer.
//!
//! quinn's own NewReno, CUBIC and BBR, and midway's HighSpeed TCP (RFC 3649) and gentle
//! HighSpeed TCP. The last two are not reimplemented here: [`ModelController`] drives
//! midway-cc's window arithmetic (the same model the BPF versions in midway-bpf are checked
//! against: one model, two drivers) from quinn's congestion events.
//!
//! # From quinn's events to midway-cc's
//!
//! midway-cc counts in segments, the way the kernel does; quinn counts in bytes. The driver
//! keeps the model's `cwnd` in segments of the path's current maximum datagram size (the `mtu`
//! quinn passes, which is what quinn's own controllers add per round-trip) and translates:
//!
//! * `on_ack` of any packet: `now - sent` is kept if the packet is the newest the ACK frame
//!   acknowledges. If the packet was sent after the last reduction and the sender was not
//!   application-limited, its bytes are added to a byte count.
//! * `on_end_acks` (one ACK frame processed): `on_rtt_sample` with the newest packet's RTT,
//!   then `on_ack` with the whole segments counted; the rest of a segment is carried.
//! * `on_congestion_event` for a packet sent after the last reduction: `on_loss` then
//!   `on_recovery_end`, so the window falls to the new `ssthresh` at once, as in quinn's own
//!   controllers (QUIC has no fast recovery to wait for). In persistent congestion instead
//!   `on_retransmission_timeout`, and no recovery period afterwards (RFC 9002 §7.6.2).
//! * `on_congestion_event` for a packet sent up to the last reduction, persistent congestion
//!   or not: nothing, so one reduction per recovery period (quinn's controllers skip these
//!   the same way). The byte count is cleared at each reduction.
//! * `on_mtu_update`: the segment size changes; `cwnd` in segments is kept and the window in
//!   bytes rescales, as the kernel keeps `snd_cwnd` when the MSS changes.
//! * `window()`: `max(cwnd, 2)` segments in bytes, RFC 9002's minimum window of two
//!   datagrams (the model holds one segment after a timeout, as the kernel does).
//!
//! One QUIC ACK frame is one kernel ACK: the kernel calls `pkts_acked` (the RTT sample) before
//! `cong_avoid` (the growth) for each ACK, with the RTT of the most recently sent segment that
//! ACK acknowledged, and so does the driver. QUIC never retransmits a packet under its old
//! number, so every acknowledged packet gives an unambiguous sample; like the kernel's, it
//! includes the peer's ACK delay.

mod driver;
mod model;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

pub use driver::{
    initial_window_segments, GentleHighSpeedConfig, GentleHighSpeedController, HighSpeedConfig,
    HighSpeedController, ModelConfig, ModelController, MIN_WINDOW_SEGMENTS,
};
pub use model::WindowModel;

/// A tunnel's congestion control (`congestion_control` of a QUIC peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CongestionControl {
    /// quinn's NewReno.
    NewReno,
    /// quinn's CUBIC.
    Cubic,
    /// quinn's BBR.
    Bbr,
    /// HighSpeed TCP (RFC 3649), midway-cc's arithmetic.
    HighSpeed,
    /// Gentle HighSpeed TCP, midway-cc's arithmetic.
    GentleHighSpeed,
}

impl CongestionControl {
    /// Every congestion control, in the order of the enum.
    pub const ALL: [CongestionControl; 5] = [
        CongestionControl::NewReno,
        CongestionControl::Cubic,
        CongestionControl::Bbr,
        CongestionControl::HighSpeed,
        CongestionControl::GentleHighSpeed,
    ];

    /// The name a configuration gives it, and [`FromStr`] takes.
    pub fn name(self) -> &'static str {
        match self {
            CongestionControl::NewReno => "newreno",
            CongestionControl::Cubic => "cubic",
            CongestionControl::Bbr => "bbr",
            CongestionControl::HighSpeed => "highspeed",
            CongestionControl::GentleHighSpeed => "gentle_highspeed",
        }
    }

    /// The factory quinn builds each connection's controller with.
    pub fn factory(self) -> Arc<dyn quinn::congestion::ControllerFactory + Send + Sync> {
        match self {
            CongestionControl::NewReno => Arc::new(quinn::congestion::NewRenoConfig::default()),
            CongestionControl::Cubic => Arc::new(quinn::congestion::CubicConfig::default()),
            CongestionControl::Bbr => Arc::new(quinn::congestion::BbrConfig::default()),
            CongestionControl::HighSpeed => Arc::new(HighSpeedConfig::default()),
            CongestionControl::GentleHighSpeed => Arc::new(GentleHighSpeedConfig::default()),
        }
    }
}

impl FromStr for CongestionControl {
    type Err = UnknownCongestionControl;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        CongestionControl::ALL
            .into_iter()
            .find(|control| control.name() == name)
            .ok_or_else(|| UnknownCongestionControl {
                name: name.to_owned(),
            })
    }
}

/// A congestion control name [`CongestionControl::from_str`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown congestion control {name:?}: expected one of {}", ValidNames)]
pub struct UnknownCongestionControl {
    name: String,
}

impl UnknownCongestionControl {
    /// The name that was given.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The valid names, comma-separated, for the error message.
struct ValidNames;

impl fmt::Display for ValidNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, control) in CongestionControl::ALL.into_iter().enumerate() {
            if index > 0 {
                f.write_str(", ")?;
            }
            f.write_str(control.name())?;
        }
        Ok(())
    }
}
