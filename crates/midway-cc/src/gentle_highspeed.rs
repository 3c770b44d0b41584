//! Gentle HighSpeed TCP (gHSTCP): HighSpeed TCP that grows like Reno while the round-trip time
//! rises.
//!
//! # Sources
//!
//! * Z. Zhang, G. Hasegawa, M. Murata, "Performance analysis and improvement of HighSpeed TCP
//!   with TailDrop/RED routers", Proc. MASCOTS 2004, October 2004: proposes gHSTCP. It watches
//!   the trend of the RTT and switches between two control modes with it.
//! * Z. Zhang, G. Hasegawa, M. Murata, "Experimental results of implementing high-speed and
//!   parallel TCP variants for long fat networks", IEICE Transactions on Communications
//!   E89-B(3), pp. 775–783, March 2006: the refined gHSTCP for real networks, which decides the
//!   mode by comparing the RTT with two thresholds.
//! * K. Yamanegi, T. Hama, G. Hasegawa, M. Murata, H. Shimonishi, T. Murase, "Implementation
//!   experiments of the TCP proxy mechanism" (the overlay paper, `shared/seeds/002`), §2.2.2 and
//!   §4.2: gHSTCP on the connection between two TCP proxies, the setting midway rebuilds. It
//!   states that gHSTCP changes only how HSTCP increases its window, and that it uses Reno's
//!   algorithm while the observed RTT shows an increasing trend.
//!
//! Only the abstracts of the first two papers and the overlay paper's summary were available
//! when this module was written; no public implementation of gHSTCP exists. What they fix is
//! implemented as stated; every number they leave open is a named constant below, marked as
//! midway's choice, so that it can be replaced when the papers' values are read.
//!
//! # The algorithm
//!
//! Slow start is Reno's. Congestion avoidance runs in one of two [`Mode`]s:
//!
//! * [`Mode::HighSpeed`] while the path is not filling: HighSpeed TCP's increase, `a(w)`
//!   segments per round-trip from RFC 3649's table ([`crate::highspeed`]);
//! * [`Mode::Reno`] while the RTT is raised, i.e. a queue is building at the bottleneck: one
//!   segment per round-trip, so that the flow stops pushing the queue towards overflow and
//!   leaves a competing Reno flow its share (the overlay paper, §2.2.2).
//!
//! On a loss both modes back off like HighSpeed TCP: `ssthresh = max(cwnd * (1 - b(cwnd)), 2)`
//! with `b` from RFC 3649's table. The overlay paper describes gHSTCP as changing only the
//! increase, so the decrease stays HSTCP's in either mode.
//!
//! The mode follows the refined gHSTCP: two thresholds between the smallest and the largest RTT
//! seen, with the smoothed RTT compared against them.
//!
//! ```text
//! spread = max_rtt - min_rtt
//! upper  = min_rtt + spread * RENO_MODE_ABOVE_EIGHTHS / 8          (4/8: half-way)
//! lower  = min_rtt + spread * HIGHSPEED_MODE_BELOW_EIGHTHS / 8     (2/8: a quarter of the way)
//!
//! HighSpeed mode -> Reno mode       when srtt > upper
//! Reno mode      -> HighSpeed mode  when srtt < lower
//! ```
//!
//! The gap between the thresholds is hysteresis: without it the RTT's noise around one
//! threshold would flip the mode every sample.
//!
//! # midway's choices where the available sources are silent
//!
//! * Threshold positions: [`RENO_MODE_ABOVE_EIGHTHS`] (upper, half-way from the minimum to the
//!   maximum RTT) and [`HIGHSPEED_MODE_BELOW_EIGHTHS`] (lower, a quarter of the way). On the
//!   overlay paper's Osaka–Tokyo path (minimum RTT about 18 ms, maximum about 30 ms; §3.2,
//!   fig. 7) they are 24 ms and 21 ms. Eighths, so that the BPF code needs shifts only.
//! * Smoothing: the smoothed RTT is RFC 6298's `SRTT = 7/8 SRTT + 1/8 R` ([`SRTT_GAIN_SHIFT`]),
//!   kept scaled by 8 in integers as the kernel keeps `srtt_us`; the first sample sets it.
//! * Minimum and maximum: of the raw RTT samples. Both survive a loss detected by duplicate ACKs
//!   (the path and its buffer are the same after it; the maximum is the RTT of a full buffer,
//!   which is what the upper threshold is measured against). Both are forgotten on a
//!   retransmission timeout, after which the path may have changed, and the mode returns to
//!   HighSpeed.
//! * Too small a spread: while `max - min` is below [`MIN_QUEUEING_SPREAD_US`] (1 ms) no queue
//!   has been seen, the thresholds are not defined and the mode is HighSpeed; otherwise RTT
//!   jitter of a few microseconds on a fresh connection would count as a rising RTT.
//! * The mode is decided on every RTT sample, in slow start as well, so that congestion
//!   avoidance starts in the right mode.

use crate::highspeed;
use crate::window::Window;

/// The smoothed RTT moves by `1 / 2^SRTT_GAIN_SHIFT` of each sample's difference: RFC 6298's
/// alpha of 1/8. midway's choice (the available texts do not give the gain).
pub const SRTT_GAIN_SHIFT: u32 = 3;

/// The thresholds are placed in eighths of the spread between the minimum and maximum RTT.
pub const THRESHOLD_EIGHTHS_SHIFT: u32 = 3;

/// Upper threshold: Reno mode once the smoothed RTT is above `min + spread * 4 / 8`. midway's
/// choice (the refined gHSTCP's value was not available).
pub const RENO_MODE_ABOVE_EIGHTHS: u32 = 4;

/// Lower threshold: back to HighSpeed mode once the smoothed RTT is below
/// `min + spread * 2 / 8`. midway's choice (the refined gHSTCP's value was not available).
pub const HIGHSPEED_MODE_BELOW_EIGHTHS: u32 = 2;

/// Below this spread between the largest and smallest RTT, in microseconds, no queue has been
/// seen and the mode stays HighSpeed. midway's choice.
pub const MIN_QUEUEING_SPREAD_US: u32 = 1_000;

/// How congestion avoidance grows the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The path is not filling: RFC 3649's `a(w)` segments per round-trip.
    HighSpeed,
    /// The RTT is raised, a queue is building: one segment per round-trip, as Reno.
    Reno,
}

/// The two RTT thresholds of the mode switch, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Below this smoothed RTT, Reno mode returns to HighSpeed mode.
    pub lower_us: u32,
    /// Above this smoothed RTT, HighSpeed mode changes to Reno mode.
    pub upper_us: u32,
}

/// The RTT state gHSTCP decides with: smoothed RTT, smallest and largest sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RttTracker {
    /// Smoothed RTT times 8, in microseconds (the kernel's `srtt_us` scaling); `None` before
    /// the first sample.
    srtt_x8_us: Option<u32>,
    /// Smallest and largest sample, in microseconds; `None` before the first sample.
    range_us: Option<(u32, u32)>,
}

impl RttTracker {
    /// A tracker that has seen no sample.
    pub const fn new() -> Self {
        Self {
            srtt_x8_us: None,
            range_us: None,
        }
    }

    /// Takes one RTT sample, in microseconds.
    pub fn on_sample(&mut self, rtt_us: u32) {
        self.srtt_x8_us = Some(match self.srtt_x8_us {
            // The first sample is the smoothed RTT (RFC 6298 §2.2).
            None => rtt_us.saturating_mul(1 << SRTT_GAIN_SHIFT),
            // 8 * SRTT' = 8 * SRTT - SRTT + R, i.e. SRTT' = 7/8 SRTT + 1/8 R.
            Some(srtt_x8) => (srtt_x8 - (srtt_x8 >> SRTT_GAIN_SHIFT)).saturating_add(rtt_us),
        });
        self.range_us = Some(match self.range_us {
            None => (rtt_us, rtt_us),
            Some((min, max)) => (min.min(rtt_us), max.max(rtt_us)),
        });
    }

    /// The smoothed RTT in microseconds, once a sample has been seen.
    pub fn smoothed_us(&self) -> Option<u32> {
        self.srtt_x8_us.map(|srtt_x8| srtt_x8 >> SRTT_GAIN_SHIFT)
    }

    /// The smallest RTT sample seen, in microseconds.
    pub fn min_us(&self) -> Option<u32> {
        self.range_us.map(|(min, _)| min)
    }

    /// The largest RTT sample seen, in microseconds.
    pub fn max_us(&self) -> Option<u32> {
        self.range_us.map(|(_, max)| max)
    }

    /// The mode-switch thresholds, once the RTTs seen are at least [`MIN_QUEUEING_SPREAD_US`]
    /// apart.
    pub fn thresholds(&self) -> Option<Thresholds> {
        let (min, max) = self.range_us?;
        let spread = max - min;
        if spread < MIN_QUEUEING_SPREAD_US {
            return None;
        }
        // In u64: spread * 4 passes u32::MAX for spreads above about 18 minutes; the result
        // is at most spread, so it fits back.
        let eighths = |count: u32| {
            let offset = (u64::from(spread) * u64::from(count)) >> THRESHOLD_EIGHTHS_SHIFT;
            min + u32::try_from(offset).unwrap_or(spread)
        };
        Some(Thresholds {
            lower_us: eighths(HIGHSPEED_MODE_BELOW_EIGHTHS),
            upper_us: eighths(RENO_MODE_ABOVE_EIGHTHS),
        })
    }
}

/// The mode after the smoothed RTT `srtt_us` is compared with `thresholds` in `mode`.
pub fn next_mode(mode: Mode, srtt_us: u32, thresholds: Option<Thresholds>) -> Mode {
    let Some(thresholds) = thresholds else {
        return Mode::HighSpeed;
    };
    match mode {
        Mode::HighSpeed if srtt_us > thresholds.upper_us => Mode::Reno,
        Mode::Reno if srtt_us < thresholds.lower_us => Mode::HighSpeed,
        unchanged => unchanged,
    }
}

/// gHSTCP's window: Reno's slow start; in congestion avoidance `a(w)` per round-trip in
/// HighSpeed mode or 1 in Reno mode; HighSpeed TCP's `b(w)` on a loss.
///
/// Fed in the kernel's order: [`GentleHighSpeed::on_rtt_sample`] with each ACK's RTT sample
/// (the kernel's `pkts_acked`), then [`GentleHighSpeed::on_ack`] with the segments it acked
/// (`cong_avoid`); [`GentleHighSpeed::on_loss`] and [`GentleHighSpeed::on_recovery_end`] around
/// fast recovery; [`GentleHighSpeed::on_retransmission_timeout`] on a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GentleHighSpeed {
    window: Window,
    mode: Mode,
    rtt: RttTracker,
}

impl GentleHighSpeed {
    /// A connection starting in slow start with `initial_cwnd` segments, in HighSpeed mode, with
    /// no RTT seen.
    pub const fn new(initial_cwnd: u32) -> Self {
        Self::with_window(Window::new(initial_cwnd))
    }

    /// A connection in the given window state, in HighSpeed mode, with no RTT seen.
    pub const fn with_window(window: Window) -> Self {
        Self {
            window,
            mode: Mode::HighSpeed,
            rtt: RttTracker::new(),
        }
    }

    /// The window state: `cwnd`, `cwnd_cnt`, `ssthresh`.
    pub const fn window(&self) -> Window {
        self.window
    }

    /// The current congestion-avoidance mode.
    pub const fn mode(&self) -> Mode {
        self.mode
    }

    /// The RTT state the mode is decided with.
    pub const fn rtt(&self) -> RttTracker {
        self.rtt
    }

    /// Segments per round-trip congestion avoidance adds now: `a(cwnd)` in HighSpeed mode, 1 in
    /// Reno mode.
    pub fn increase_per_rtt(&self) -> u32 {
        match self.mode {
            Mode::HighSpeed => highspeed::table_increase(self.window.cwnd),
            Mode::Reno => 1,
        }
    }

    /// Takes one RTT sample, in microseconds, and decides the mode with it.
    pub fn on_rtt_sample(&mut self, rtt_us: u32) {
        self.rtt.on_sample(rtt_us);
        if let Some(srtt_us) = self.rtt.smoothed_us() {
            self.mode = next_mode(self.mode, srtt_us, self.rtt.thresholds());
        }
    }

    /// `acked` more segments acknowledged outside recovery: slow start below `ssthresh`, then
    /// the current mode's increase.
    pub fn on_ack(&mut self, acked: u32) {
        let increase = self.increase_per_rtt();
        self.window.on_ack(acked, increase);
    }

    /// A loss detected by duplicate ACKs, in either mode: `ssthresh = max(cwnd * (1 - b(cwnd)),
    /// 2)` with HighSpeed TCP's `b`. Returns the new `ssthresh`; `cwnd` stays until
    /// [`GentleHighSpeed::on_recovery_end`]. The RTT state and the mode are kept.
    pub fn on_loss(&mut self) -> u32 {
        let ssthresh = highspeed::ssthresh_after_loss(self.window.cwnd);
        self.window.set_ssthresh_after_loss(ssthresh)
    }

    /// Fast recovery is over: the window continues from `ssthresh` in congestion avoidance.
    pub fn on_recovery_end(&mut self) {
        self.window.enter_congestion_avoidance_at_ssthresh();
    }

    /// A retransmission timeout: `ssthresh` as for any loss, slow start from one segment, the
    /// RTT state forgotten and the mode back to HighSpeed.
    pub fn on_retransmission_timeout(&mut self) {
        self.on_loss();
        self.window.restart_after_timeout();
        self.rtt = RttTracker::new();
        self.mode = Mode::HighSpeed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_congestion_avoidance(cwnd: u32) -> GentleHighSpeed {
        GentleHighSpeed::with_window(Window {
            cwnd,
            cwnd_cnt: 0,
            ssthresh: cwnd,
        })
    }

    /// One round-trip: as many single-segment ACKs as the window held when it began.
    fn one_rtt(flow: &mut GentleHighSpeed) {
        for _ in 0..flow.window().cwnd {
            flow.on_ack(1);
        }
    }

    #[test]
    fn smoothed_rtt_moves_an_eighth_of_the_way_to_each_sample() {
        let mut rtt = RttTracker::new();
        assert_eq!(rtt.smoothed_us(), None);
        rtt.on_sample(100_000);
        assert_eq!(rtt.smoothed_us(), Some(100_000));
        // 7/8 * 100 ms + 1/8 * 180 ms = 110 ms; then 7/8 * 110 + 1/8 * 190 = 120 ms.
        rtt.on_sample(180_000);
        assert_eq!(rtt.smoothed_us(), Some(110_000));
        rtt.on_sample(190_000);
        assert_eq!(rtt.smoothed_us(), Some(120_000));
    }

    #[test]
    fn min_and_max_follow_the_raw_samples() {
        let mut rtt = RttTracker::new();
        assert_eq!((rtt.min_us(), rtt.max_us()), (None, None));
        for (sample, min, max) in [
            (20_000, 20_000, 20_000),
            (18_000, 18_000, 20_000),
            (30_000, 18_000, 30_000),
            (25_000, 18_000, 30_000),
            (17_500, 17_500, 30_000),
        ] {
            rtt.on_sample(sample);
            assert_eq!(
                (rtt.min_us(), rtt.max_us()),
                (Some(min), Some(max)),
                "{sample}"
            );
        }
    }

    #[test]
    fn thresholds_on_the_overlay_papers_path() {
        // Minimum about 18 ms, maximum about 30 ms (overlay paper §3.2, fig. 7): 12 ms of queue.
        let mut rtt = RttTracker::new();
        rtt.on_sample(18_000);
        rtt.on_sample(30_000);
        assert_eq!(
            rtt.thresholds(),
            Some(Thresholds {
                lower_us: 21_000,
                upper_us: 24_000
            })
        );
    }

    #[test]
    fn no_thresholds_until_the_rtts_spread_by_a_millisecond() {
        let mut rtt = RttTracker::new();
        rtt.on_sample(10_000);
        assert_eq!(rtt.thresholds(), None);
        rtt.on_sample(10_999);
        assert_eq!(rtt.thresholds(), None);
        rtt.on_sample(11_000);
        assert_eq!(
            rtt.thresholds(),
            Some(Thresholds {
                lower_us: 10_250,
                upper_us: 10_500
            })
        );
    }

    #[test]
    fn thresholds_of_huge_rtts_do_not_overflow() {
        let mut rtt = RttTracker::new();
        rtt.on_sample(0);
        rtt.on_sample(u32::MAX);
        let thresholds = rtt.thresholds();
        assert_eq!(
            thresholds,
            Some(Thresholds {
                lower_us: u32::MAX / 4,
                upper_us: u32::MAX / 2
            })
        );
        rtt.on_sample(u32::MAX);
        assert!(rtt.smoothed_us().is_some());
    }

    #[test]
    fn the_switch_rules_at_and_around_the_thresholds() {
        let thresholds = Some(Thresholds {
            lower_us: 21_000,
            upper_us: 24_000,
        });
        // Strictly above the upper threshold to leave HighSpeed mode.
        assert_eq!(
            next_mode(Mode::HighSpeed, 24_000, thresholds),
            Mode::HighSpeed
        );
        assert_eq!(next_mode(Mode::HighSpeed, 24_001, thresholds), Mode::Reno);
        // Between the thresholds each mode stays.
        assert_eq!(
            next_mode(Mode::HighSpeed, 22_000, thresholds),
            Mode::HighSpeed
        );
        assert_eq!(next_mode(Mode::Reno, 22_000, thresholds), Mode::Reno);
        // Strictly below the lower threshold to leave Reno mode.
        assert_eq!(next_mode(Mode::Reno, 21_000, thresholds), Mode::Reno);
        assert_eq!(next_mode(Mode::Reno, 20_999, thresholds), Mode::HighSpeed);
        // Without thresholds, HighSpeed.
        assert_eq!(next_mode(Mode::Reno, 50_000, None), Mode::HighSpeed);
    }

    #[test]
    fn mode_follows_a_rising_then_falling_rtt() {
        let mut flow = in_congestion_avoidance(1000);
        // The empty path: 18 ms.
        flow.on_rtt_sample(18_000);
        assert_eq!(flow.mode(), Mode::HighSpeed);
        // The queue fills to 30 ms; thresholds 21 and 24 ms from the first 30 ms sample on.
        // The smoothed RTT (7/8 old + 1/8 sample, in whole microseconds) climbs past 24 ms on
        // the sixth sample.
        for (srtt, mode) in [
            (19_500, Mode::HighSpeed),
            (20_812, Mode::HighSpeed),
            (21_961, Mode::HighSpeed),
            (22_965, Mode::HighSpeed),
            (23_845, Mode::HighSpeed),
            (24_614, Mode::Reno),
        ] {
            flow.on_rtt_sample(30_000);
            assert_eq!((flow.rtt().smoothed_us(), flow.mode()), (Some(srtt), mode));
        }
        // The queue drains back to 18 ms: Reno mode holds below 24 ms and leaves only under
        // 21 ms, on the sixth sample.
        for (srtt, mode) in [
            (23_787, Mode::Reno),
            (23_064, Mode::Reno),
            (22_431, Mode::Reno),
            (21_877, Mode::Reno),
            (21_393, Mode::Reno),
            (20_968, Mode::HighSpeed),
        ] {
            flow.on_rtt_sample(18_000);
            assert_eq!((flow.rtt().smoothed_us(), flow.mode()), (Some(srtt), mode));
        }
        assert_eq!(
            (flow.rtt().min_us(), flow.rtt().max_us()),
            (Some(18_000), Some(30_000))
        );
    }

    #[test]
    fn highspeed_mode_grows_by_a_of_w_and_reno_mode_by_one() {
        // cwnd 1000 is in the row of 851: a = 7. A segment after 142 ACKs (1000 / 7), then
        // every 143 (1001 / 7 .. 1006 / 7): 142 + 6 * 143 = 1000 ACKs give 7 segments.
        let mut fast = in_congestion_avoidance(1000);
        assert_eq!(fast.increase_per_rtt(), 7);
        one_rtt(&mut fast);
        assert_eq!((fast.window().cwnd, fast.window().cwnd_cnt), (1007, 0));

        let mut gentle = in_congestion_avoidance(1000);
        gentle.on_rtt_sample(18_000);
        for _ in 0..6 {
            gentle.on_rtt_sample(30_000);
        }
        assert_eq!(gentle.mode(), Mode::Reno);
        assert_eq!(gentle.increase_per_rtt(), 1);
        one_rtt(&mut gentle);
        assert_eq!((gentle.window().cwnd, gentle.window().cwnd_cnt), (1001, 0));
    }

    #[test]
    fn a_switch_mid_round_trip_changes_the_step_at_the_next_ack() {
        let mut flow = in_congestion_avoidance(1000);
        flow.on_rtt_sample(18_000);
        for _ in 0..6 {
            flow.on_rtt_sample(30_000);
        }
        // Reno mode: 500 ACKs count towards the 1000 a segment needs.
        for _ in 0..500 {
            flow.on_ack(1);
        }
        assert_eq!((flow.window().cwnd, flow.window().cwnd_cnt), (1000, 500));
        // The queue drains, HighSpeed mode (a = 7, a segment per 142 ACKs): the 500 counted
        // pay one segment, and counting restarts with this ACK.
        for _ in 0..6 {
            flow.on_rtt_sample(18_000);
        }
        assert_eq!(flow.mode(), Mode::HighSpeed);
        flow.on_ack(1);
        assert_eq!((flow.window().cwnd, flow.window().cwnd_cnt), (1001, 1));
    }

    #[test]
    fn both_modes_back_off_by_highspeeds_b_of_w() {
        // cwnd 1000, b = 0.34: ssthresh 660, in either mode.
        let mut fast = in_congestion_avoidance(1000);
        assert_eq!(fast.on_loss(), 660);
        let mut gentle = in_congestion_avoidance(1000);
        gentle.on_rtt_sample(18_000);
        for _ in 0..6 {
            gentle.on_rtt_sample(30_000);
        }
        assert_eq!(gentle.mode(), Mode::Reno);
        assert_eq!(gentle.on_loss(), 660);
        gentle.on_recovery_end();
        assert_eq!(
            gentle.window(),
            Window {
                cwnd: 660,
                cwnd_cnt: 0,
                ssthresh: 660
            }
        );
        // Below Low_Window the decrease is Reno's half.
        assert_eq!(in_congestion_avoidance(30).on_loss(), 15);
    }

    #[test]
    fn a_loss_keeps_the_rtt_range_and_the_mode() {
        let mut flow = in_congestion_avoidance(1000);
        flow.on_rtt_sample(18_000);
        for _ in 0..6 {
            flow.on_rtt_sample(30_000);
        }
        let before = (flow.rtt(), flow.mode());
        flow.on_loss();
        flow.on_recovery_end();
        assert_eq!((flow.rtt(), flow.mode()), before);
    }

    #[test]
    fn a_timeout_forgets_the_rtts_and_returns_to_highspeed_mode() {
        let mut flow = in_congestion_avoidance(1000);
        flow.on_rtt_sample(18_000);
        for _ in 0..6 {
            flow.on_rtt_sample(30_000);
        }
        assert_eq!(flow.mode(), Mode::Reno);
        flow.on_retransmission_timeout();
        assert_eq!(flow.mode(), Mode::HighSpeed);
        assert_eq!(flow.rtt(), RttTracker::new());
        assert_eq!(
            flow.window(),
            Window {
                cwnd: 1,
                cwnd_cnt: 0,
                ssthresh: 660
            }
        );
        // The first sample after the timeout is the new minimum and maximum.
        flow.on_rtt_sample(40_000);
        assert_eq!(
            (
                flow.rtt().min_us(),
                flow.rtt().max_us(),
                flow.rtt().smoothed_us()
            ),
            (Some(40_000), Some(40_000), Some(40_000))
        );
    }

    #[test]
    fn slow_start_is_renos_in_either_mode() {
        let mut flow = GentleHighSpeed::new(10);
        flow.on_rtt_sample(18_000);
        for _ in 0..6 {
            flow.on_rtt_sample(30_000);
        }
        assert_eq!(flow.mode(), Mode::Reno);
        for expected in [20, 40, 80] {
            one_rtt(&mut flow);
            assert_eq!(flow.window().cwnd, expected);
        }
    }

    #[test]
    fn a_trace_of_round_trips_through_both_modes_and_a_loss() {
        // Congestion avoidance at 300 (row 221: a = 3) on an 18 ms path.
        let mut flow = in_congestion_avoidance(300);
        flow.on_rtt_sample(18_000);
        // RTT 1, empty path, HighSpeed: a segment per 100 ACKs (300 / 3 .. 302 / 3): 303.
        one_rtt(&mut flow);
        assert_eq!((flow.window().cwnd, flow.window().cwnd_cnt), (303, 0));
        // The queue fills; six 30 ms samples reach Reno mode (see the rising-RTT test).
        for _ in 0..6 {
            flow.on_rtt_sample(30_000);
        }
        assert_eq!(flow.mode(), Mode::Reno);
        // RTT 2 and 3 in Reno mode: one segment each.
        one_rtt(&mut flow);
        assert_eq!((flow.window().cwnd, flow.window().cwnd_cnt), (304, 0));
        one_rtt(&mut flow);
        assert_eq!((flow.window().cwnd, flow.window().cwnd_cnt), (305, 0));
        // Loss at 305 (b = 0.41): 305 - floor(125.05) = 180.
        assert_eq!(flow.on_loss(), 180);
        flow.on_recovery_end();
        // The queue drains; six 18 ms samples return to HighSpeed mode.
        for _ in 0..6 {
            flow.on_rtt_sample(18_000);
        }
        assert_eq!(flow.mode(), Mode::HighSpeed);
        // RTT 4 at 180 (row 118: a = 2): a segment per 90 ACKs: 182.
        one_rtt(&mut flow);
        assert_eq!((flow.window().cwnd, flow.window().cwnd_cnt), (182, 0));
    }
}
