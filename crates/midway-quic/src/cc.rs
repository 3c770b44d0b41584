//! The congestion control of a QUIC tunnel.

use std::sync::Arc;

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
    /// The factory quinn builds each connection's controller with.
    pub fn factory(self) -> Arc<dyn quinn::congestion::ControllerFactory + Send + Sync> {
        match self {
            CongestionControl::NewReno => Arc::new(quinn::congestion::NewRenoConfig::default()),
            CongestionControl::Cubic => Arc::new(quinn::congestion::CubicConfig::default()),
            CongestionControl::Bbr => Arc::new(quinn::congestion::BbrConfig::default()),
            // Replaced by midway-cc drivers.
            CongestionControl::HighSpeed | CongestionControl::GentleHighSpeed => {
                Arc::new(quinn::congestion::NewRenoConfig::default())
            }
        }
    }
}
