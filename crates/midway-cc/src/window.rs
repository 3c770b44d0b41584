//! The congestion window in the Linux kernel's shape: `cwnd` and `ssthresh` in segments and the
//! `cwnd_cnt` counter that turns a fractional per-ACK increase into whole segments.
//!
//! Both congestion controls of this crate grow their window through [`Window::on_ack`]: slow
//! start below `ssthresh` exactly as Reno does (RFC 5681 §3.1, one segment per segment acked,
//! never past `ssthresh`), and above it an additive increase of `a` segments per round-trip. The
//! increase is counted the way the kernel's `tcp_cong_avoid_ai()` counts it, because the BPF
//! implementations can write only `snd_cwnd`, `snd_cwnd_cnt` and `snd_ssthresh`: every acked
//! segment adds one to `cwnd_cnt`, and each time `cwnd_cnt` reaches `cwnd / a` the window grows
//! by one segment. Over one round-trip (`cwnd` segments acked) that is `a` segments, which is
//! RFC 3649's `w = w + a(w)/w` per ACK without fractions.

/// The smallest slow-start threshold any loss may leave, in segments (RFC 5681 §3.1, equation 4:
/// `ssthresh = max(FlightSize / 2, 2 * SMSS)`).
pub const MIN_SSTHRESH: u32 = 2;

/// The window a retransmission timeout restarts from, in segments (RFC 5681 §3.1, the loss
/// window `LW = 1 * SMSS`).
pub const LOSS_WINDOW: u32 = 1;

/// A congestion window, its slow-start threshold and the kernel's fractional-increase counter.
///
/// The fields are public because this struct exists to be compared, field by field, with the
/// kernel's `snd_cwnd`, `snd_cwnd_cnt` and `snd_ssthresh` after each event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Congestion window in segments (`snd_cwnd`).
    pub cwnd: u32,
    /// Segments acked towards the next one-segment increase in congestion avoidance
    /// (`snd_cwnd_cnt`).
    pub cwnd_cnt: u32,
    /// Slow-start threshold in segments (`snd_ssthresh`); `u32::MAX` before the first loss, as
    /// the kernel's `TCP_INFINITE_SSTHRESH` is "larger than any window".
    pub ssthresh: u32,
}

impl Window {
    /// A window that starts with `initial_cwnd` segments in slow start, with no threshold yet.
    pub const fn new(initial_cwnd: u32) -> Self {
        Self {
            cwnd: initial_cwnd,
            cwnd_cnt: 0,
            ssthresh: u32::MAX,
        }
    }

    /// Whether the next ACK is handled by slow start (`cwnd < ssthresh`, as in the kernel's
    /// `tcp_in_slow_start()`).
    pub const fn in_slow_start(&self) -> bool {
        self.cwnd < self.ssthresh
    }

    /// Grows the window for `acked` newly acknowledged segments, adding `increase_per_rtt`
    /// segments per round-trip in congestion avoidance.
    ///
    /// Slow start takes the ACKs first and stops at `ssthresh`; the ACKs it did not need go on to
    /// congestion avoidance, so one stretch ACK crossing `ssthresh` is not lost. An
    /// `increase_per_rtt` of 0 is treated as 1, so a caller's mistake cannot stall the window.
    pub fn on_ack(&mut self, acked: u32, increase_per_rtt: u32) {
        let acked = self.slow_start(acked);
        if acked == 0 {
            return;
        }
        let acks_per_increase = (self.cwnd / increase_per_rtt.max(1)).max(1);
        self.additive_increase(acks_per_increase, acked);
    }

    /// Reno slow start: one segment per segment acked, never past `ssthresh`. Returns the ACKs
    /// left over for congestion avoidance.
    fn slow_start(&mut self, acked: u32) -> u32 {
        if !self.in_slow_start() {
            return acked;
        }
        let room = self.ssthresh - self.cwnd;
        let used = acked.min(room);
        self.cwnd += used;
        acked - used
    }

    /// One segment of growth per `acks_per_increase` segments acked.
    fn additive_increase(&mut self, acks_per_increase: u32, acked: u32) {
        // Credit counted while the step was larger (a smaller a(w), or Reno mode) would otherwise
        // pay out several segments at once when the step shrinks; like the kernel, give one
        // segment for it and start counting afresh.
        if self.cwnd_cnt >= acks_per_increase {
            self.cwnd_cnt = 0;
            self.cwnd = self.cwnd.saturating_add(1);
        }
        self.cwnd_cnt = self.cwnd_cnt.saturating_add(acked);
        if self.cwnd_cnt >= acks_per_increase {
            let segments = self.cwnd_cnt / acks_per_increase;
            self.cwnd_cnt -= segments * acks_per_increase;
            self.cwnd = self.cwnd.saturating_add(segments);
        }
    }

    /// Sets `ssthresh` after a loss and returns it; the window itself is left to the caller,
    /// since fast recovery decides when `cwnd` falls to it.
    pub(crate) fn set_ssthresh_after_loss(&mut self, ssthresh: u32) -> u32 {
        self.ssthresh = ssthresh.max(MIN_SSTHRESH);
        self.ssthresh
    }

    /// Fast recovery ends: the window continues from the new `ssthresh` and the fractional
    /// counter restarts, as in the kernel's `tcp_end_cwnd_reduction()`.
    pub(crate) fn enter_congestion_avoidance_at_ssthresh(&mut self) {
        self.cwnd = self.ssthresh;
        self.cwnd_cnt = 0;
    }

    /// A retransmission timeout: back to the loss window in slow start (RFC 5681 §3.1).
    pub(crate) fn restart_after_timeout(&mut self) {
        self.cwnd = LOSS_WINDOW;
        self.cwnd_cnt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Acks one RTT's worth of segments (the window at the start of the RTT), one at a time.
    fn one_rtt(window: &mut Window, increase_per_rtt: u32) {
        for _ in 0..window.cwnd {
            window.on_ack(1, increase_per_rtt);
        }
    }

    #[test]
    fn slow_start_doubles_per_rtt_and_stops_at_ssthresh() {
        let mut window = Window::new(10);
        window.ssthresh = 25;
        one_rtt(&mut window, 1);
        assert_eq!(window.cwnd, 20);
        // 20 ACKs: 5 take the window to 25, the other 15 count towards the next segment
        // (25 ACKs per segment at a = 1).
        one_rtt(&mut window, 1);
        assert_eq!((window.cwnd, window.cwnd_cnt), (25, 15));
    }

    #[test]
    fn a_stretch_ack_crossing_ssthresh_hands_its_rest_to_congestion_avoidance() {
        let mut window = Window::new(10);
        window.ssthresh = 12;
        window.on_ack(5, 1);
        assert_eq!((window.cwnd, window.cwnd_cnt), (12, 3));
    }

    #[test]
    fn reno_congestion_avoidance_adds_one_segment_per_rtt() {
        let mut window = Window::new(30);
        window.ssthresh = 30;
        for expected in 31..=40 {
            one_rtt(&mut window, 1);
            assert_eq!((window.cwnd, window.cwnd_cnt), (expected, 0));
        }
    }

    #[test]
    fn increase_of_three_per_rtt_counts_cwnd_over_three_acks_per_segment() {
        // cwnd 300, a = 3: a segment every 100 ACKs while cwnd / 3 = 100 (cwnd 300..=302), then
        // every 101 (cwnd 303). 300 ACKs: +1 at 100 (301), +1 at 200 (302), +1 at 300 (303).
        let mut window = Window::new(300);
        window.ssthresh = 300;
        one_rtt(&mut window, 3);
        assert_eq!((window.cwnd, window.cwnd_cnt), (303, 0));
    }

    #[test]
    fn credit_from_a_larger_step_pays_one_segment_when_the_step_shrinks() {
        let mut window = Window::new(100);
        window.ssthresh = 100;
        window.cwnd_cnt = 60;
        // At a = 2 the step is 50: the 60 counted at a = 1 give one segment, then counting
        // restarts with this ACK.
        window.on_ack(1, 2);
        assert_eq!((window.cwnd, window.cwnd_cnt), (101, 1));
    }

    #[test]
    fn a_zero_increase_is_treated_as_one() {
        let mut window = Window::new(4);
        window.ssthresh = 4;
        window.on_ack(4, 0);
        assert_eq!((window.cwnd, window.cwnd_cnt), (5, 0));
    }

    #[test]
    fn ssthresh_never_falls_below_two_segments() {
        let mut window = Window::new(1);
        assert_eq!(window.set_ssthresh_after_loss(0), MIN_SSTHRESH);
        window.enter_congestion_avoidance_at_ssthresh();
        assert_eq!(window.cwnd, MIN_SSTHRESH);
    }
}
