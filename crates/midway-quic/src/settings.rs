//! A tunnel's settings and the quinn transport config made from them.
//!
//! Flow-control windows default to multiples of the path's bandwidth-delay product (BDP). A
//! stream may have four BDPs unacknowledged: one for the path itself, one for a bottleneck
//! queue as deep as the BDP (the round trip under load doubles), one for the round trip a lost
//! packet at the window's left edge holds the window still, and one because credit comes back
//! in steps, not byte by byte. With one BDP a 10 MB download across a 20 Mbit/s GEO hop with a
//! full queue and 0.5 % loss moved half the link rate in our lab (docs/results/peer-transports).
//! The connection may have twice a stream's (so a second connection is not starved while the
//! first one's window is full), and the sender buffers as much. Without a path rate given,
//! midway's defaults assume a 100 Mbit/s, 600 ms path. A window is a ceiling, not a
//! reservation: memory is used only for bytes the receiving midway has not passed on yet, and
//! the connection window bounds that per tunnel.

use std::sync::Arc;
use std::time::Duration;

use quinn::{AckFrequencyConfig, IdleTimeout, TransportConfig, VarInt};

use crate::cc::CongestionControl;

/// The path a default window is sized for when none is configured: 100 Mbit/s ...
pub const DEFAULT_PATH_RATE_BPS: u64 = 100_000_000;
/// ... over a 600 ms round trip (a GEO hop).
pub const DEFAULT_PATH_RTT: Duration = Duration::from_millis(600);
/// A stream's default window in bandwidth-delay products (see the module documentation).
pub const STREAM_WINDOW_BDPS: u64 = 4;
/// Smallest stream window accepted: below this a stream stalls every few packets.
pub const MIN_STREAM_WINDOW: u64 = 64 * 1024;
/// Largest window accepted (QUIC's variable-length integers go higher; memory does not).
pub const MAX_WINDOW: u64 = 1 << 32;
/// Default number of streams (proxied connections) open at once on one tunnel.
pub const DEFAULT_MAX_STREAMS: u32 = 10_000;
/// Default idle timeout of the tunnel: a path dark for less than this loses no connection.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default QUIC handshake timeout, after which a peer falls back to `tls`.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A tunnel's settings (one `[[peers]]` entry with `transport = "quic"`, or a QUIC peer
/// listener). Both ends apply their own; flow control is what each end grants the other.
#[derive(Debug, Clone, PartialEq)]
pub struct TunnelSettings {
    /// The congestion control of the connection.
    pub congestion_control: CongestionControl,
    /// Bytes one stream may have unacknowledged toward this end.
    pub stream_window: u64,
    /// Bytes all streams together may have unacknowledged toward this end; also the send
    /// buffer.
    pub connection_window: u64,
    /// Streams the other end may have open at once toward this end.
    pub max_streams: u32,
    /// The tunnel closes after this long without a packet from the other end (the smaller of
    /// both ends' values applies).
    pub idle_timeout: Duration,
    /// A PING after this long without sending, to keep NAT bindings and the idle timer alive;
    /// `None` for none.
    pub keep_alive: Option<Duration>,
    /// Ask the other end to acknowledge only every this many ack-eliciting packets (the ACK
    /// frequency extension; fewer ACKs on a narrow return link). `None`: QUIC's default (every
    /// second packet).
    pub ack_every: Option<u32>,
    /// Give up on a handshake after this long.
    pub handshake_timeout: Duration,
}

impl Default for TunnelSettings {
    fn default() -> TunnelSettings {
        TunnelSettings::for_path(DEFAULT_PATH_RATE_BPS, DEFAULT_PATH_RTT)
    }
}

impl TunnelSettings {
    /// Settings for a path of `rate_bps` and round trip `rtt`: windows from its
    /// bandwidth-delay product (see the module documentation), the other values the defaults.
    pub fn for_path(rate_bps: u64, rtt: Duration) -> TunnelSettings {
        let stream_window = bdp_bytes(rate_bps, rtt)
            .saturating_mul(STREAM_WINDOW_BDPS)
            .clamp(MIN_STREAM_WINDOW, MAX_WINDOW / 2);
        TunnelSettings {
            congestion_control: CongestionControl::Cubic,
            stream_window,
            connection_window: stream_window * 2,
            max_streams: DEFAULT_MAX_STREAMS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            keep_alive: Some(keep_alive_for(DEFAULT_IDLE_TIMEOUT)),
            ack_every: None,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }

    /// quinn's transport config for these settings.
    pub fn transport_config(&self) -> Arc<TransportConfig> {
        let mut transport = TransportConfig::default();
        let window = |bytes: u64| VarInt::from_u64(bytes.min(MAX_WINDOW)).unwrap_or(VarInt::MAX);
        transport
            .stream_receive_window(window(self.stream_window))
            .receive_window(window(self.connection_window))
            .send_window(self.connection_window.min(MAX_WINDOW))
            .max_concurrent_bidi_streams(VarInt::from_u32(self.max_streams))
            // A tunnel carries bidirectional streams only, and the listener's one READY message
            // (`accept_handshake`).
            .max_concurrent_uni_streams(VarInt::from_u32(1))
            .datagram_receive_buffer_size(None)
            .max_idle_timeout(IdleTimeout::try_from(self.idle_timeout).ok())
            .keep_alive_interval(self.keep_alive)
            .congestion_controller_factory(self.congestion_control.factory());
        if let Some(every) = self.ack_every {
            let mut ack = AckFrequencyConfig::default();
            ack.ack_eliciting_threshold(VarInt::from_u32(every.saturating_sub(1)));
            transport.ack_frequency_config(Some(ack));
        }
        Arc::new(transport)
    }
}

/// The bandwidth-delay product of `rate_bps` over `rtt`, in bytes.
pub fn bdp_bytes(rate_bps: u64, rtt: Duration) -> u64 {
    let bits = u128::from(rate_bps) * rtt.as_micros() / 1_000_000;
    u64::try_from(bits / 8).unwrap_or(u64::MAX)
}

/// A keep-alive interval that keeps a tunnel with `idle_timeout` alive through the loss of two
/// PINGs in a row, and a NAT binding of the usual 30 s or more: a third of the timeout, at most
/// 10 s.
pub fn keep_alive_for(idle_timeout: Duration) -> Duration {
    (idle_timeout / 3).min(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdp_of_a_geo_hop() {
        // 20 Mbit/s over 600 ms: 1.5 MB.
        assert_eq!(bdp_bytes(20_000_000, Duration::from_millis(600)), 1_500_000);
        assert_eq!(bdp_bytes(0, Duration::from_secs(1)), 0);
        assert_eq!(bdp_bytes(u64::MAX, Duration::from_secs(3600)), u64::MAX);
    }

    #[test]
    fn windows_follow_the_path() {
        let geo = TunnelSettings::for_path(20_000_000, Duration::from_millis(600));
        assert_eq!(geo.stream_window, 6_000_000);
        assert_eq!(geo.connection_window, 12_000_000);
        // A tiny path still gets a window that does not stall every packet.
        let tiny = TunnelSettings::for_path(64_000, Duration::from_millis(10));
        assert_eq!(tiny.stream_window, MIN_STREAM_WINDOW);
        let huge = TunnelSettings::for_path(u64::MAX, Duration::from_secs(10));
        assert_eq!(huge.stream_window, MAX_WINDOW / 2);
        assert_eq!(huge.connection_window, MAX_WINDOW);
    }

    #[test]
    fn default_is_the_documented_path() {
        let settings = TunnelSettings::default();
        assert_eq!(settings.stream_window, 30_000_000);
        assert_eq!(settings.keep_alive, Some(Duration::from_secs(10)));
        assert_eq!(
            keep_alive_for(Duration::from_secs(6)),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn transport_config_builds_with_every_option() {
        let mut settings = TunnelSettings {
            ack_every: Some(10),
            keep_alive: None,
            ..TunnelSettings::default()
        };
        let _ = settings.transport_config();
        settings.idle_timeout = Duration::from_secs(u64::MAX / 4);
        let _ = settings.transport_config();
    }
}
