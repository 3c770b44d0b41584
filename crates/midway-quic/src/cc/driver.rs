//! [`ModelController`]: quinn's congestion controller interface in front of a midway-cc window
//! model (the mapping is in the [module documentation](super)).

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use midway_cc::gentle_highspeed::GentleHighSpeed;
use midway_cc::highspeed::HighSpeed;
use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics};
use quinn_proto::RttEstimator;

use super::WindowModel;

/// The smallest window [`ModelController`] reports, in datagrams: RFC 9002 §7.2's
/// `kMinimumWindow`, also the floor of quinn's own controllers.
///
/// midway-cc's model may hold one segment (the kernel's loss window after a timeout); a QUIC
/// sender never goes below two datagrams.
pub const MIN_WINDOW_SEGMENTS: u32 = 2;

/// RFC 9002 §7.2's byte limit of the initial window.
const INITIAL_WINDOW_BYTES: u64 = 14_720;

/// RFC 9002 §7.2's datagram limit of the initial window (and the kernel's initial window).
const INITIAL_WINDOW_MAX_SEGMENTS: u64 = 10;

/// The initial window in segments of `segment_size` bytes: RFC 9002 §7.2's
/// `min(10 * max_datagram_size, max(2 * max_datagram_size, 14720))` bytes, in whole segments
/// (10 at quinn's initial 1200 bytes, 9 at 1500, 2 at 9000).
pub fn initial_window_segments(segment_size: u16) -> u32 {
    let mss = u64::from(segment_size.max(1));
    let bytes = (INITIAL_WINDOW_MAX_SEGMENTS * mss).min(INITIAL_WINDOW_BYTES.max(2 * mss));
    u32::try_from(bytes / mss).unwrap_or(MIN_WINDOW_SEGMENTS)
}

/// A midway-cc window model behind quinn's [`Controller`] interface.
///
/// The model counts segments of the current maximum datagram size; the controller keeps the
/// bytes acked towards the next whole segment, the recovery period and the RTT sample of the ACK
/// being processed. Every method but [`Controller::on_ack`] takes plain values, and that one
/// forwards to [`ModelController::on_packet_acked`] (quinn's `RttEstimator` is not needed: the
/// RTT sample is `now - sent`), so a trace can drive it exactly without a connection.
#[derive(Debug, Clone)]
pub struct ModelController<M> {
    model: M,
    /// Bytes per segment: the current maximum datagram size.
    segment_size: u64,
    /// The initial window in bytes, as built.
    initial_window: u64,
    /// When the window was last reduced; packets sent up to then neither grow the window nor
    /// reduce it again.
    recovery_start: Option<Instant>,
    /// Bytes acknowledged towards the next whole segment (after an ACK frame, less than one
    /// segment).
    acked_bytes: u64,
    /// The RTT of the most recently sent packet the ACK frame being processed acknowledges.
    newest_rtt_us: Option<u32>,
}

/// HighSpeed TCP (RFC 3649) on quinn: midway-cc's [`HighSpeed`] driven by quinn's events.
pub type HighSpeedController = ModelController<HighSpeed>;

/// Gentle HighSpeed TCP on quinn: midway-cc's [`GentleHighSpeed`] driven by quinn's events.
pub type GentleHighSpeedController = ModelController<GentleHighSpeed>;

impl<M: WindowModel> ModelController<M> {
    /// A connection in slow start with `initial_cwnd` segments of `current_mtu` bytes.
    pub fn new(initial_cwnd: u32, current_mtu: u16) -> Self {
        Self::with_model(M::new(initial_cwnd), current_mtu)
    }

    /// A connection whose model is in the given state (for traces that start mid-connection),
    /// with segments of `current_mtu` bytes and no recovery period.
    pub fn with_model(model: M, current_mtu: u16) -> Self {
        let segment_size = u64::from(current_mtu.max(1));
        let mut controller = Self {
            model,
            segment_size,
            initial_window: 0,
            recovery_start: None,
            acked_bytes: 0,
            newest_rtt_us: None,
        };
        controller.initial_window = controller.window();
        controller
    }

    /// The model's state.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// Bytes per segment: the path's current maximum datagram size.
    pub fn segment_size(&self) -> u64 {
        self.segment_size
    }

    /// When the window was last reduced, if a recovery period is running.
    pub fn recovery_start(&self) -> Option<Instant> {
        self.recovery_start
    }

    /// Bytes acknowledged towards the next whole segment, not yet given to the model.
    pub fn acked_bytes(&self) -> u64 {
        self.acked_bytes
    }

    /// One packet of `bytes`, sent at `sent`, acknowledged at `now`: what
    /// [`Controller::on_ack`] does, without quinn's `RttEstimator`.
    ///
    /// Its RTT is a candidate for the ACK frame's sample. Its bytes count towards the window
    /// unless the sender was application-limited or the packet was sent before the last
    /// reduction. The model sees both at [`Controller::on_end_acks`].
    pub fn on_packet_acked(&mut self, now: Instant, sent: Instant, bytes: u64, app_limited: bool) {
        let rtt_us = micros(now.saturating_duration_since(sent));
        self.newest_rtt_us = Some(self.newest_rtt_us.map_or(rtt_us, |us| us.min(rtt_us)));
        if app_limited || self.sent_before_reduction(sent) {
            return;
        }
        self.acked_bytes = self.acked_bytes.saturating_add(bytes);
    }

    /// The ACK frame is processed: its RTT sample, then its whole segments, to the model.
    fn end_of_ack_frame(&mut self) {
        if let Some(rtt_us) = self.newest_rtt_us.take() {
            self.model.on_rtt_sample(rtt_us);
        }
        let segments = self.acked_bytes / self.segment_size;
        if segments > 0 {
            self.acked_bytes -= segments * self.segment_size;
            self.model
                .on_ack(u32::try_from(segments).unwrap_or(u32::MAX));
        }
    }

    /// Whether a packet sent at `sent` belongs to the current recovery period.
    fn sent_before_reduction(&self, sent: Instant) -> bool {
        self.recovery_start.is_some_and(|start| sent <= start)
    }

    /// Bytes per segment times `segments`.
    fn bytes(&self, segments: u32) -> u64 {
        u64::from(segments).saturating_mul(self.segment_size)
    }
}

impl<M: WindowModel> Controller for ModelController<M> {
    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        _rtt: &RttEstimator,
    ) {
        self.on_packet_acked(now, sent, bytes, app_limited);
    }

    fn on_end_acks(
        &mut self,
        _now: Instant,
        _in_flight: u64,
        _app_limited: bool,
        _largest_packet_num_acked: Option<u64>,
    ) {
        self.end_of_ack_frame();
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        _lost_bytes: u64,
    ) {
        if self.sent_before_reduction(sent) {
            return;
        }
        self.acked_bytes = 0;
        if is_persistent_congestion {
            // RFC 9002 §7.6.2 and its Appendix B.8: back to the minimum window, in slow start,
            // with no recovery period left.
            self.model.on_retransmission_timeout();
            self.recovery_start = None;
        } else {
            // quinn has no fast recovery to wait for: the window falls to ssthresh now.
            self.model.on_loss();
            self.model.on_recovery_end();
            self.recovery_start = Some(now);
        }
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.segment_size = u64::from(new_mtu.max(1));
    }

    fn window(&self) -> u64 {
        self.bytes(self.model.window().cwnd.max(MIN_WINDOW_SEGMENTS))
    }

    fn metrics(&self) -> ControllerMetrics {
        let ssthresh = self.model.window().ssthresh;
        let mut metrics = ControllerMetrics::default();
        metrics.congestion_window = self.window();
        metrics.ssthresh = (ssthresh != u32::MAX).then(|| self.bytes(ssthresh));
        metrics
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        self.initial_window
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// Builds a [`ModelController`] per connection: quinn's [`ControllerFactory`] for a midway-cc
/// window model.
pub struct ModelConfig<M> {
    initial_window_segments: Option<u32>,
    model: PhantomData<fn() -> M>,
}

/// The factory of [`HighSpeedController`].
pub type HighSpeedConfig = ModelConfig<HighSpeed>;

/// The factory of [`GentleHighSpeedController`].
pub type GentleHighSpeedConfig = ModelConfig<GentleHighSpeed>;

impl<M> ModelConfig<M> {
    /// The initial window in segments (at least [`MIN_WINDOW_SEGMENTS`]) instead of RFC 9002's
    /// for the connection's initial MTU ([`initial_window_segments`]).
    pub fn initial_window(&mut self, segments: u32) -> &mut Self {
        self.initial_window_segments = Some(segments.max(MIN_WINDOW_SEGMENTS));
        self
    }
}

impl<M> Default for ModelConfig<M> {
    fn default() -> Self {
        Self {
            initial_window_segments: None,
            model: PhantomData,
        }
    }
}

impl<M> Clone for ModelConfig<M> {
    fn clone(&self) -> Self {
        Self {
            initial_window_segments: self.initial_window_segments,
            model: PhantomData,
        }
    }
}

impl<M> fmt::Debug for ModelConfig<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelConfig")
            .field("model", &std::any::type_name::<M>())
            .field("initial_window_segments", &self.initial_window_segments)
            .finish()
    }
}

impl<M: WindowModel> ControllerFactory for ModelConfig<M> {
    fn build(self: Arc<Self>, _now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        let segments = self
            .initial_window_segments
            .unwrap_or_else(|| initial_window_segments(current_mtu));
        Box::new(ModelController::<M>::new(segments, current_mtu))
    }
}

/// A duration in whole microseconds, saturating at `u32::MAX` (71 minutes).
fn micros(duration: Duration) -> u32 {
    u32::try_from(duration.as_micros()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_window_follows_rfc_9002() {
        assert_eq!(initial_window_segments(1200), 10);
        assert_eq!(initial_window_segments(1452), 10);
        // 14720 / 1500 = 9.8: the byte limit binds.
        assert_eq!(initial_window_segments(1500), 9);
        // max(2 * 9000, 14720) = 18000: two datagrams.
        assert_eq!(initial_window_segments(9000), 2);
        assert_eq!(initial_window_segments(0), 10);
    }

    #[test]
    fn metrics_report_the_window_and_ssthresh_in_bytes() {
        let mut controller = HighSpeedController::new(10, 1200);
        assert_eq!(controller.metrics().congestion_window, 12_000);
        assert_eq!(controller.metrics().ssthresh, None);
        let now = Instant::now();
        controller.on_congestion_event(now, now, false, 1200);
        // Reno's half below Low_Window: 5 segments.
        assert_eq!(controller.metrics().ssthresh, Some(6_000));
        assert_eq!(controller.metrics().congestion_window, 6_000);
    }

    #[test]
    fn the_config_s_initial_window_is_used_and_floored() {
        let now = Instant::now();
        let mut config = GentleHighSpeedConfig::default();
        config.initial_window(32);
        let controller = Arc::new(config.clone()).build(now, 1200);
        assert_eq!(
            (controller.window(), controller.initial_window()),
            (38_400, 38_400)
        );
        config.initial_window(0);
        assert_eq!(Arc::new(config).build(now, 1200).window(), 2_400);
    }

    #[test]
    fn an_rtt_past_71_minutes_saturates() {
        assert_eq!(micros(Duration::from_secs(5_000)), u32::MAX);
        assert_eq!(micros(Duration::from_micros(18_000)), 18_000);
    }
}
