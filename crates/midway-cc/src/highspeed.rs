//! HighSpeed TCP, RFC 3649 (S. Floyd, December 2003, Experimental).
//!
//! # The algorithm
//!
//! HighSpeed TCP keeps Reno's AIMD shape but makes both of its parameters functions of the
//! current window `w` (in segments), so that a flow can hold a window of tens of thousands of
//! segments at a loss rate real paths deliver:
//!
//! * in congestion avoidance, per acknowledged segment, `w = w + a(w) / w`: `a(w)` segments per
//!   round-trip;
//! * on a loss (three duplicate ACKs), `w = (1 - b(w)) * w`.
//!
//! Up to `Low_Window` the functions are Reno's, `a(w) = 1` and `b(w) = 1/2`, so a HighSpeed flow
//! with a small window is a Reno flow. Slow start and the retransmission timeout stay Reno's
//! (RFC 5681): RFC 3649 changes congestion avoidance and the response to a loss. A gentler slow
//! start for large windows is a separate proposal (Limited Slow-Start, RFC 3742), not
//! implemented here.
//!
//! # Parameters (RFC 3649 §5 and §7)
//!
//! | name | value | meaning |
//! |---|---|---|
//! | `Low_Window` | 38 | up to here it is Reno; Reno's `w = 1.2 / sqrt(p)` is 38 at `p = 10^-3` |
//! | `High_Window` | 83000 | the window of a 10 Gbit/s, 100 ms path with 1500-byte packets |
//! | `High_P` | 10^-7 | the loss rate at which the response function reaches `High_Window` |
//! | `High_Decrease` | 0.1 | `b(High_Window)` (§7) |
//!
//! The response function is a straight line in log-log between (`Low_P` = 10^-3, `Low_Window`)
//! and (`High_P`, `High_Window`) (§5): `w = 0.12 / p^0.835`, or, solved for the loss rate
//! (§7, which turns the response function into `a(w)` and `b(w)`),
//!
//! ```text
//! p(w) = 0.078 / w^1.2
//! ```
//!
//! `b(w)` falls linearly in `log(w)` from 0.5 at `Low_Window` to `High_Decrease` at
//! `High_Window` (§7):
//!
//! ```text
//! b(w) = (High_Decrease - 0.5) * (log(w) - log(Low_Window))
//!                              / (log(High_Window) - log(Low_Window)) + 0.5
//! ```
//!
//! and `a(w)` is what makes an AIMD flow with that `b(w)` follow the response function (§7,
//! from the AIMD steady-state window `w = sqrt(a (2 - b) / (2 b p))`):
//!
//! ```text
//! a(w) = w^2 * p(w) * 2 * b(w) / (2 - b(w))
//! ```
//!
//! [`increase_segments`], [`decrease_factor`] and [`loss_rate`] compute these in `f64`. They are
//! the reference the table is tested against, not what the BPF code runs.
//!
//! # The table (RFC 3649 Appendix B)
//!
//! Appendix B tabulates the functions for the default parameters: row `k` is the window at which
//! `a(w)` reaches `k` segments, with `b(w)` there printed to two decimals, from (38, 1, 0.50) to
//! (84035, 71, 0.10). [`AIMD_TABLE`] holds those rows with `b` in hundredths, exactly as the RFC
//! prints it, so that every row can be read against the RFC. The rows from 4596 to 84035 were
//! also read against a second public transcription of the same table (FreeBSD's SCTP HighSpeed
//! congestion control, which prints `b` the same way) and agree row for row. The window
//! arithmetic uses the table, never the formulas:
//!
//! * the row used for a window is the last row whose window is at most `cwnd` (a window below 38
//!   uses the first row, Reno's 1 and 0.50; a window past 84035 keeps the last row's 71 and
//!   0.10, as the table ends there). Between two rows the lower row's `a` and `b` hold: the
//!   increase steps up and the decrease steps down only where the RFC's rows say so;
//! * the lookup is a binary search with a fixed number of steps ([`table_row_index`]): BPF has
//!   no floating point, and a row-by-row walk over the table runs into the verifier's
//!   instruction limit (`shared/docs/LINUX-TCP-KNOBS.md`), while seven halving steps find the
//!   row among 71 for every window;
//! * on a loss `ssthresh = max(cwnd - cwnd * b / 100, 2)`: `(1 - b(w)) * w` rounded up, with
//!   Reno's floor of two segments (RFC 5681 §3.1).
//!
//! The table agrees with the printed `p(w) = 0.078 / w^1.2`, not with the unrounded log-log line
//! (`0.07805 / w^1.1979`): with the unrounded constants `a(84035)` is 72.7, outside the table's
//! rounding, while the printed ones give 70.96. The tests pin this down.

use crate::window::{Window, MIN_SSTHRESH};

/// Up to this window (in segments) HighSpeed TCP is Reno: `a(w) = 1`, `b(w) = 0.5` (RFC 3649 §5).
pub const LOW_WINDOW: u32 = 38;

/// The window (in segments) the response function reaches at `HIGH_P` (RFC 3649 §5).
pub const HIGH_WINDOW: u32 = 83_000;

/// The loss rate at which the response function reaches `HIGH_WINDOW` (RFC 3649 §5).
pub const HIGH_P: f64 = 1e-7;

/// The loss rate at which Reno's response function gives `LOW_WINDOW` (RFC 3649 §5).
pub const LOW_P: f64 = 1e-3;

/// `b(HIGH_WINDOW)`: the decrease factor at the high end (RFC 3649 §7).
pub const HIGH_DECREASE: f64 = 0.1;

/// Reno's decrease factor, `b(w)` up to `LOW_WINDOW`.
pub const RENO_DECREASE: f64 = 0.5;

/// The coefficient of `p(w) = 0.078 / w^1.2` as RFC 3649 §7 prints it.
pub const LOSS_RATE_COEFFICIENT: f64 = 0.078;

/// The exponent of `p(w) = 0.078 / w^1.2` as RFC 3649 §7 prints it.
pub const LOSS_RATE_EXPONENT: f64 = 1.2;

/// `b(w)`, the fraction of the window given up on a loss (RFC 3649 §7): 0.5 up to
/// `LOW_WINDOW`, then linear in `log(w)` down to `HIGH_DECREASE` at `HIGH_WINDOW`, and on below
/// it along the same line past `HIGH_WINDOW`.
pub fn decrease_factor(window: f64) -> f64 {
    if window <= f64::from(LOW_WINDOW) {
        return RENO_DECREASE;
    }
    let low = f64::from(LOW_WINDOW).ln();
    let high = f64::from(HIGH_WINDOW).ln();
    (HIGH_DECREASE - RENO_DECREASE) * (window.ln() - low) / (high - low) + RENO_DECREASE
}

/// `p(w) = 0.078 / w^1.2`: the loss rate at which HighSpeed TCP's response function holds a
/// window of `window` segments (RFC 3649 §7). Meaningful from `LOW_WINDOW` up; below it the
/// response function is Reno's.
pub fn loss_rate(window: f64) -> f64 {
    LOSS_RATE_COEFFICIENT / window.powf(LOSS_RATE_EXPONENT)
}

/// `a(w) = w^2 * p(w) * 2 * b(w) / (2 - b(w))`, the segments added per round-trip in congestion
/// avoidance (RFC 3649 §7); 1 up to `LOW_WINDOW`.
pub fn increase_segments(window: f64) -> f64 {
    if window <= f64::from(LOW_WINDOW) {
        return 1.0;
    }
    let decrease = decrease_factor(window);
    window * window * loss_rate(window) * 2.0 * decrease / (2.0 - decrease)
}

/// One row of RFC 3649 Appendix B.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AimdRow {
    /// The window, in segments, from which this row applies.
    pub window: u32,
    /// `a(w)`: segments added per round-trip in congestion avoidance.
    pub increase: u32,
    /// `b(w)` in hundredths, as the RFC prints it (0.44 is 44).
    pub decrease_hundredths: u32,
}

/// Shorthand for the rows below; keeps the table one line per RFC row.
const fn row(window: u32, increase: u32, decrease_hundredths: u32) -> AimdRow {
    AimdRow {
        window,
        increase,
        decrease_hundredths,
    }
}

/// RFC 3649 Appendix B: `w`, `a(w)`, `b(w)` for `Low_Window` 38, `High_Window` 83000, `High_P`
/// 10^-7 and `High_Decrease` 0.1, with `b` in hundredths.
pub const AIMD_TABLE: [AimdRow; 71] = [
    row(38, 1, 50),
    row(118, 2, 44),
    row(221, 3, 41),
    row(347, 4, 38),
    row(495, 5, 37),
    row(663, 6, 35),
    row(851, 7, 34),
    row(1058, 8, 33),
    row(1284, 9, 32),
    row(1529, 10, 31),
    row(1793, 11, 30),
    row(2076, 12, 29),
    row(2378, 13, 28),
    row(2699, 14, 28),
    row(3039, 15, 27),
    row(3399, 16, 27),
    row(3778, 17, 26),
    row(4177, 18, 26),
    row(4596, 19, 25),
    row(5036, 20, 25),
    row(5497, 21, 24),
    row(5979, 22, 24),
    row(6483, 23, 23),
    row(7009, 24, 23),
    row(7558, 25, 22),
    row(8130, 26, 22),
    row(8726, 27, 22),
    row(9346, 28, 21),
    row(9991, 29, 21),
    row(10661, 30, 21),
    row(11358, 31, 20),
    row(12082, 32, 20),
    row(12834, 33, 20),
    row(13614, 34, 19),
    row(14424, 35, 19),
    row(15265, 36, 19),
    row(16137, 37, 19),
    row(17042, 38, 18),
    row(17981, 39, 18),
    row(18955, 40, 18),
    row(19965, 41, 17),
    row(21013, 42, 17),
    row(22101, 43, 17),
    row(23230, 44, 17),
    row(24402, 45, 16),
    row(25618, 46, 16),
    row(26881, 47, 16),
    row(28193, 48, 16),
    row(29557, 49, 15),
    row(30975, 50, 15),
    row(32450, 51, 15),
    row(33986, 52, 15),
    row(35586, 53, 14),
    row(37253, 54, 14),
    row(38992, 55, 14),
    row(40808, 56, 14),
    row(42707, 57, 13),
    row(44694, 58, 13),
    row(46776, 59, 13),
    row(48961, 60, 13),
    row(51258, 61, 13),
    row(53677, 62, 12),
    row(56230, 63, 12),
    row(58932, 64, 12),
    row(61799, 65, 12),
    row(64851, 66, 11),
    row(68113, 67, 11),
    row(71617, 68, 11),
    row(75401, 69, 10),
    row(79517, 70, 10),
    row(84035, 71, 10),
];

/// The steps of [`table_row_index`]'s binary search: powers of two from the largest below the
/// table's length down to one, so that their sums reach every index. Seven steps for 71 rows.
pub const TABLE_SEARCH_STEPS: [usize; 7] = [64, 32, 16, 8, 4, 2, 1];

/// The index of the row of [`AIMD_TABLE`] that applies to `cwnd`: the last row whose window is
/// at most `cwnd`, or the first row for a window below it.
///
/// A binary search in a fixed number of steps, written to port to BPF C as is: start at row 0
/// and, for each step of [`TABLE_SEARCH_STEPS`], move forward by the step if the row there
/// exists and its window is at most `cwnd`. The rows' windows increase, so after the last step
/// the index is the last row not past `cwnd`. The loop runs seven times whatever `cwnd` is,
/// which the verifier accepts (bounded, unrollable), where a walk from row 0 would be up to 71
/// data-dependent iterations.
pub fn table_row_index(cwnd: u32) -> usize {
    let mut index = 0;
    for step in TABLE_SEARCH_STEPS {
        let candidate = index + step;
        if candidate < AIMD_TABLE.len() && AIMD_TABLE[candidate].window <= cwnd {
            index = candidate;
        }
    }
    index
}

/// The row of [`AIMD_TABLE`] that applies to `cwnd` (see [`table_row_index`]).
pub fn table_row(cwnd: u32) -> AimdRow {
    AIMD_TABLE[table_row_index(cwnd)]
}

/// `a(cwnd)` from the table: segments added per round-trip in congestion avoidance.
pub fn table_increase(cwnd: u32) -> u32 {
    table_row(cwnd).increase
}

/// The slow-start threshold after a loss at `cwnd`: `max(cwnd - cwnd * b / 100, 2)` with `b`
/// from the table, i.e. `(1 - b(w)) * w` rounded up and at least two segments.
pub fn ssthresh_after_loss(cwnd: u32) -> u32 {
    let decrease_hundredths = u64::from(table_row(cwnd).decrease_hundredths);
    // cwnd * b can pass u32::MAX for a large cwnd; the product is at most cwnd, so it fits back.
    let given_up = u64::from(cwnd) * decrease_hundredths / 100;
    let kept = u64::from(cwnd) - given_up;
    u32::try_from(kept).unwrap_or(u32::MAX).max(MIN_SSTHRESH)
}

/// HighSpeed TCP's window: Reno's slow start, the table's `a(w)` per round-trip in congestion
/// avoidance, the table's `b(w)` on a loss.
///
/// Events are fed in the order the kernel calls a congestion control: [`HighSpeed::on_ack`] for
/// each ACK outside recovery, [`HighSpeed::on_loss`] when a loss starts fast recovery,
/// [`HighSpeed::on_recovery_end`] when it ends, [`HighSpeed::on_retransmission_timeout`] on a
/// timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HighSpeed {
    window: Window,
}

impl HighSpeed {
    /// A connection starting in slow start with `initial_cwnd` segments and no threshold yet.
    pub const fn new(initial_cwnd: u32) -> Self {
        Self {
            window: Window::new(initial_cwnd),
        }
    }

    /// A connection in the given window state, for traces that start mid-connection.
    pub const fn with_window(window: Window) -> Self {
        Self { window }
    }

    /// The window state: `cwnd`, `cwnd_cnt`, `ssthresh`.
    pub const fn window(&self) -> Window {
        self.window
    }

    /// `acked` more segments acknowledged outside recovery: slow start below `ssthresh`, then
    /// `a(cwnd)` segments per round-trip.
    pub fn on_ack(&mut self, acked: u32) {
        let increase = table_increase(self.window.cwnd);
        self.window.on_ack(acked, increase);
    }

    /// A loss detected by duplicate ACKs: `ssthresh = max(cwnd * (1 - b(cwnd)), 2)`. Returns
    /// the new `ssthresh`; `cwnd` stays until [`HighSpeed::on_recovery_end`].
    pub fn on_loss(&mut self) -> u32 {
        let ssthresh = ssthresh_after_loss(self.window.cwnd);
        self.window.set_ssthresh_after_loss(ssthresh)
    }

    /// Fast recovery is over: the window continues from `ssthresh` in congestion avoidance.
    pub fn on_recovery_end(&mut self) {
        self.window.enter_congestion_avoidance_at_ssthresh();
    }

    /// A retransmission timeout: `ssthresh` as for any loss, then slow start from one segment
    /// (RFC 5681 §3.1; RFC 3649 does not change timeouts).
    pub fn on_retransmission_timeout(&mut self) {
        self.on_loss();
        self.window.restart_after_timeout();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest integer window whose formula `a(w)` reaches `increase`, searching upwards
    /// from `start`.
    fn first_window_reaching(increase: u32, start: u32) -> u32 {
        let mut window = start;
        while increase_segments(f64::from(window)) < f64::from(increase) {
            window += 1;
        }
        window
    }

    #[test]
    fn the_table_has_the_rfc_rows_in_order() {
        assert_eq!(AIMD_TABLE.len(), 71);
        assert_eq!(AIMD_TABLE[0], row(LOW_WINDOW, 1, 50));
        assert_eq!(AIMD_TABLE[70], row(84035, 71, 10));
        for (index, entry) in AIMD_TABLE.iter().enumerate() {
            // Row k (counting from 1) is where a(w) reaches k.
            assert_eq!(entry.increase as usize, index + 1, "row {index}");
        }
        for pair in AIMD_TABLE.windows(2) {
            assert!(pair[0].window < pair[1].window, "{pair:?}");
        }
    }

    #[test]
    fn every_row_matches_the_formula_within_the_rfc_rounding() {
        for entry in AIMD_TABLE {
            let window = f64::from(entry.window);
            // a is printed as a whole number: the formula must round to it.
            let increase = increase_segments(window);
            assert!(
                (increase - f64::from(entry.increase)).abs() < 0.5,
                "a({}) = {increase}, table {}",
                entry.window,
                entry.increase
            );
            // Tighter: every row sits where the formula crosses its integer, to within 0.05
            // segments per round-trip (the residuals run smoothly from +0.01 to -0.045). A
            // mistyped window would stand out of that curve.
            assert!(
                (increase - f64::from(entry.increase)).abs() < 0.05,
                "a({}) = {increase}, table {}",
                entry.window,
                entry.increase
            );
            // b is printed to two decimals: the formula must round to it.
            let decrease = decrease_factor(window);
            assert!(
                (decrease * 100.0 - f64::from(entry.decrease_hundredths)).abs() <= 0.5,
                "b({}) = {decrease}, table {}",
                entry.window,
                entry.decrease_hundredths
            );
        }
    }

    #[test]
    fn the_rows_residuals_against_the_formula_run_smoothly() {
        // a(w_k) - k changes by at most 0.0036 from one row to the next (the RFC computed the
        // rows with slightly different arithmetic, so the residual drifts, but slowly). A window
        // mistyped by a few segments jumps out of that drift: 0.005 catches an error of about
        // 1/200 of the gap to the next row.
        let residual = |entry: &AimdRow| {
            increase_segments(f64::from(entry.window)) - f64::from(entry.increase)
        };
        for pair in AIMD_TABLE[1..].windows(2) {
            let jump = residual(&pair[1]) - residual(&pair[0]);
            assert!(jump.abs() < 0.005, "{pair:?}: residual jumps by {jump}");
        }
    }

    #[test]
    fn every_row_lies_where_the_formula_reaches_its_increase() {
        // Row k's window is where a(w) first reaches k. The RFC's own computation differs from
        // the printed formula in the last digits: the windows agree to within 0.3 % (the largest
        // gap is 215 segments at the last row, 84035 against 84250).
        let mut search_from = LOW_WINDOW + 1;
        for entry in &AIMD_TABLE[1..] {
            let formula = first_window_reaching(entry.increase, search_from);
            let gap = entry.window.abs_diff(formula);
            assert!(
                gap * 1000 <= entry.window * 3,
                "a = {}: table {}, formula {formula}",
                entry.increase,
                entry.window
            );
            search_from = formula;
        }
    }

    #[test]
    fn the_printed_constants_are_the_rounded_log_log_line() {
        // §5: the line through (Low_P, Low_Window) and (High_P, High_Window) in log-log; §7
        // prints it rounded as p(w) = 0.078 / w^1.2.
        let slope =
            (f64::from(HIGH_WINDOW).ln() - f64::from(LOW_WINDOW).ln()) / (HIGH_P.ln() - LOW_P.ln());
        assert!((slope + 0.835).abs() < 0.0005, "{slope}");
        let exponent = -1.0 / slope;
        let coefficient = LOW_P * f64::from(LOW_WINDOW).powf(exponent);
        assert!((exponent - LOSS_RATE_EXPONENT).abs() < 0.005, "{exponent}");
        assert!(
            (coefficient - LOSS_RATE_COEFFICIENT).abs() < 0.0005,
            "{coefficient}"
        );
        // Unrounded, a(84035) leaves the table's rounding; printed, it does not.
        let unrounded = |w: f64| {
            let b = decrease_factor(w);
            w * w * coefficient / w.powf(exponent) * 2.0 * b / (2.0 - b)
        };
        assert!(unrounded(84035.0) > 72.0);
        assert!((increase_segments(84035.0) - 71.0).abs() < 0.5);
    }

    #[test]
    fn up_to_low_window_it_is_reno() {
        for window in [1.0, 2.0, 10.0, 37.0, 38.0] {
            assert_eq!(increase_segments(window), 1.0);
            assert_eq!(decrease_factor(window), 0.5);
        }
        for cwnd in [0, 1, 2, 10, 37, 38, 117] {
            assert_eq!(table_row(cwnd), row(38, 1, 50), "cwnd {cwnd}");
        }
        // Reno's halving, rounded up, with the floor of two.
        assert_eq!(ssthresh_after_loss(38), 19);
        assert_eq!(ssthresh_after_loss(37), 19);
        assert_eq!(ssthresh_after_loss(10), 5);
        assert_eq!(ssthresh_after_loss(3), 2);
        assert_eq!(ssthresh_after_loss(1), 2);
        assert_eq!(ssthresh_after_loss(0), 2);
    }

    #[test]
    fn just_past_low_window_the_formula_leaves_reno_continuously() {
        let a = increase_segments(39.0);
        let b = decrease_factor(39.0);
        assert!(a > 0.9 && a < 1.1, "{a}");
        assert!(b < 0.5 && b > 0.49, "{b}");
    }

    #[test]
    fn the_formula_increase_rises_and_decrease_falls_with_the_window() {
        let mut previous = (increase_segments(39.0), decrease_factor(39.0));
        for window in 40..=100_000u32 {
            let current = (
                increase_segments(f64::from(window)),
                decrease_factor(f64::from(window)),
            );
            assert!(current.0 > previous.0, "a at {window}");
            assert!(current.1 < previous.1, "b at {window}");
            previous = current;
        }
        assert!((decrease_factor(f64::from(HIGH_WINDOW)) - HIGH_DECREASE).abs() < 1e-12);
    }

    #[test]
    fn the_table_increase_never_falls_and_decrease_never_rises() {
        for pair in AIMD_TABLE.windows(2) {
            assert!(pair[1].increase > pair[0].increase, "{pair:?}");
            assert!(
                pair[1].decrease_hundredths <= pair[0].decrease_hundredths,
                "{pair:?}"
            );
        }
        let mut previous = table_row(0);
        for cwnd in 0..=90_000 {
            let current = table_row(cwnd);
            assert!(current.increase >= previous.increase, "cwnd {cwnd}");
            assert!(
                current.decrease_hundredths <= previous.decrease_hundredths,
                "cwnd {cwnd}"
            );
            previous = current;
        }
    }

    #[test]
    fn the_fixed_step_search_equals_a_linear_walk_for_every_window() {
        let linear = |cwnd: u32| {
            AIMD_TABLE
                .iter()
                .rposition(|entry| entry.window <= cwnd)
                .unwrap_or(0)
        };
        for cwnd in (0..=90_000).chain([u32::MAX - 1, u32::MAX]) {
            assert_eq!(table_row_index(cwnd), linear(cwnd), "cwnd {cwnd}");
        }
        // Each row's own window and the one before it, named.
        for (index, entry) in AIMD_TABLE.iter().enumerate() {
            assert_eq!(table_row_index(entry.window), index);
            if index > 0 {
                assert_eq!(table_row_index(entry.window - 1), index - 1);
            }
        }
    }

    #[test]
    fn the_search_steps_reach_every_index_of_the_table() {
        let total: usize = TABLE_SEARCH_STEPS.iter().sum();
        assert!(total >= AIMD_TABLE.len() - 1);
        assert!(TABLE_SEARCH_STEPS[0] < AIMD_TABLE.len());
        assert!(TABLE_SEARCH_STEPS[0] * 2 >= AIMD_TABLE.len());
    }

    #[test]
    fn past_the_last_row_the_last_row_applies() {
        assert_eq!(table_row(84_035), row(84035, 71, 10));
        assert_eq!(table_row(1_000_000), row(84035, 71, 10));
        assert_eq!(table_row(u32::MAX), row(84035, 71, 10));
        // 10 % of u32::MAX given up, computed without overflow.
        assert_eq!(ssthresh_after_loss(u32::MAX), 3_865_470_566);
    }

    #[test]
    fn loss_gives_up_the_rows_fraction_rounded_in_the_windows_favour() {
        // cwnd 1000 lies in row 851 (a 7, b 0.34): 1000 - 340.
        assert_eq!(ssthresh_after_loss(1000), 660);
        // cwnd 118 (b 0.44): 118 - floor(51.92) = 67.
        assert_eq!(ssthresh_after_loss(118), 67);
        // cwnd 10000 in row 9991 (b 0.21): 10000 - 2100.
        assert_eq!(ssthresh_after_loss(10_000), 7900);
        // cwnd 84035 (b 0.10): 84035 - 8403.
        assert_eq!(ssthresh_after_loss(84_035), 75_632);
    }

    /// One round-trip: as many single-segment ACKs as the window held when it began.
    fn one_rtt(flow: &mut HighSpeed) {
        for _ in 0..flow.window().cwnd {
            flow.on_ack(1);
        }
    }

    fn state(flow: &HighSpeed) -> (u32, u32) {
        let window = flow.window();
        (window.cwnd, window.cwnd_cnt)
    }

    #[test]
    fn congestion_avoidance_trace_across_the_row_at_221() {
        // Start in congestion avoidance at 216, in the row of 118 (a = 2).
        let mut flow = HighSpeed::with_window(Window {
            cwnd: 216,
            cwnd_cnt: 0,
            ssthresh: 216,
        });
        // RTT 1: 216 ACKs, a segment every 216/2 = 108 (then 217/2 = 108): 218, count 0.
        one_rtt(&mut flow);
        assert_eq!(state(&flow), (218, 0));
        // RTT 2: 218 ACKs, a segment every 109: 220, count 0.
        one_rtt(&mut flow);
        assert_eq!(state(&flow), (220, 0));
        // RTT 3: 220 ACKs. After 110 the window is 221, the row of 221 (a = 3), so a segment
        // every 221/3 = 73: after 73 more, 222 (step 74); the last 37 ACKs stay counted.
        one_rtt(&mut flow);
        assert_eq!(state(&flow), (222, 37));
        // RTT 4: 222 ACKs with 37 counted, step 74: 37 more give 223, 74 more 224, 74 more 225
        // (step 75); 37 are left.
        one_rtt(&mut flow);
        assert_eq!(state(&flow), (225, 37));
        // RTT 5: 225 ACKs, step 75 (cwnd 225..=227): 38 more give 226, 75 more 227, 75 more
        // 228 (step 76); 37 left.
        one_rtt(&mut flow);
        assert_eq!(state(&flow), (228, 37));
    }

    #[test]
    fn trace_from_slow_start_through_a_loss() {
        let mut flow = HighSpeed::new(10);
        // Slow start doubles per round-trip: 10, 20, 40, 80, 160.
        for expected in [20, 40, 80, 160] {
            one_rtt(&mut flow);
            assert_eq!(state(&flow), (expected, 0));
        }
        // A loss at 160 (row 118: b 0.44): ssthresh 160 - floor(70.4) = 90.
        assert_eq!(flow.on_loss(), 90);
        assert_eq!(flow.window().cwnd, 160);
        flow.on_recovery_end();
        assert_eq!(
            flow.window(),
            Window {
                cwnd: 90,
                cwnd_cnt: 0,
                ssthresh: 90
            }
        );
        // Congestion avoidance at 90 is Reno (a = 1): one segment per round-trip.
        for expected in 91..=95 {
            one_rtt(&mut flow);
            assert_eq!(state(&flow), (expected, 0));
        }
    }

    #[test]
    fn a_timeout_restarts_slow_start_from_one_segment() {
        let mut flow = HighSpeed::with_window(Window {
            cwnd: 1000,
            cwnd_cnt: 5,
            ssthresh: 800,
        });
        flow.on_retransmission_timeout();
        assert_eq!(
            flow.window(),
            Window {
                cwnd: 1,
                cwnd_cnt: 0,
                ssthresh: 660
            }
        );
        flow.on_ack(1);
        assert_eq!(flow.window().cwnd, 2);
    }
}
