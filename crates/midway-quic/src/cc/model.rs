//! The window models of midway-cc as one interface, so one driver runs each of them.

use std::fmt;

use midway_cc::gentle_highspeed::GentleHighSpeed;
use midway_cc::highspeed::HighSpeed;
use midway_cc::window::Window;

/// A midway-cc window model as [`ModelController`](super::ModelController) drives it: the
/// kernel-shaped events of midway-cc, in segments and microseconds.
///
/// Each method forwards to the model's method of the same name; nothing here changes the
/// arithmetic.
pub trait WindowModel: Clone + fmt::Debug + Send + Sync + 'static {
    /// A connection starting in slow start with `initial_cwnd` segments.
    fn new(initial_cwnd: u32) -> Self;

    /// The window state: `cwnd`, `cwnd_cnt`, `ssthresh`, in segments.
    fn window(&self) -> Window;

    /// One RTT sample in microseconds, before the ACK it came with is counted (the kernel's
    /// `pkts_acked`). Models that do not use the RTT ignore it.
    fn on_rtt_sample(&mut self, rtt_us: u32);

    /// `acked` more segments acknowledged outside recovery (the kernel's `cong_avoid`).
    fn on_ack(&mut self, acked: u32);

    /// A loss: sets `ssthresh` from the current `cwnd` and returns it.
    fn on_loss(&mut self) -> u32;

    /// The reduction is complete: `cwnd` continues from `ssthresh`.
    fn on_recovery_end(&mut self);

    /// A retransmission timeout: `ssthresh` as for a loss, slow start from one segment.
    fn on_retransmission_timeout(&mut self);
}

impl WindowModel for HighSpeed {
    fn new(initial_cwnd: u32) -> Self {
        HighSpeed::new(initial_cwnd)
    }

    fn window(&self) -> Window {
        HighSpeed::window(self)
    }

    fn on_rtt_sample(&mut self, _rtt_us: u32) {}

    fn on_ack(&mut self, acked: u32) {
        HighSpeed::on_ack(self, acked);
    }

    fn on_loss(&mut self) -> u32 {
        HighSpeed::on_loss(self)
    }

    fn on_recovery_end(&mut self) {
        HighSpeed::on_recovery_end(self);
    }

    fn on_retransmission_timeout(&mut self) {
        HighSpeed::on_retransmission_timeout(self);
    }
}

impl WindowModel for GentleHighSpeed {
    fn new(initial_cwnd: u32) -> Self {
        GentleHighSpeed::new(initial_cwnd)
    }

    fn window(&self) -> Window {
        GentleHighSpeed::window(self)
    }

    fn on_rtt_sample(&mut self, rtt_us: u32) {
        GentleHighSpeed::on_rtt_sample(self, rtt_us);
    }

    fn on_ack(&mut self, acked: u32) {
        GentleHighSpeed::on_ack(self, acked);
    }

    fn on_loss(&mut self) -> u32 {
        GentleHighSpeed::on_loss(self)
    }

    fn on_recovery_end(&mut self) {
        GentleHighSpeed::on_recovery_end(self);
    }

    fn on_retransmission_timeout(&mut self) {
        GentleHighSpeed::on_retransmission_timeout(self);
    }
}
