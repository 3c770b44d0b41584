//! Response functions: the average congestion window, in segments, that each congestion control
//! holds at a steady random packet loss rate `p`. They predict a flow's throughput on a path
//! before it is measured (`w * MSS / RTT`, capped by the path's capacity), which is how the lab
//! chooses a path on which the congestion controls can differ at all.
//!
//! * Reno: `w = 1.22 / sqrt(p)` (Mathis, Semke, Mahdavi & Ott, "The macroscopic behavior of the
//!   TCP congestion avoidance algorithm", CCR 27(3), 1997: `sqrt(3/2) / sqrt(p)`, delayed ACKs
//!   off), the response function RFC 3649 §5 starts from.
//! * HighSpeed TCP: `w = 0.12 / p^0.835` (RFC 3649 §5), the straight line in log-log scale
//!   from (`LOW_P`, `LOW_WINDOW`) to (`HIGH_P`, `HIGH_WINDOW`); at windows up to
//!   [`highspeed::LOW_WINDOW`] it is Reno's. (The table [`highspeed`] steps through follows §7's
//!   `p(w) = 0.078 / w^1.2`, whose inverse gives about 2.5 % less at `p = 1e-5`.)
//! * gentle HighSpeed TCP: HighSpeed TCP's. Its mode ([`crate::gentle_highspeed`]) is
//!   HighSpeed while the RTT is not raised, and random loss on a path that the flow does not fill
//!   raises no queue; its decrease is always HighSpeed's. It differs from HighSpeed TCP only once
//!   the window reaches the path's bandwidth-delay product and a queue builds (Reno's increase
//!   then), which the capacity cap of a prediction already covers.

use crate::highspeed;

/// Mathis' constant `sqrt(3/2)`, rounded as the literature and RFC 3649 print it.
pub const RENO_COEFFICIENT: f64 = 1.22;

/// The coefficient of RFC 3649 §5's `w = 0.12 / p^0.835`.
pub const HIGHSPEED_COEFFICIENT: f64 = 0.12;

/// The exponent of RFC 3649 §5's `w = 0.12 / p^0.835`.
pub const HIGHSPEED_EXPONENT: f64 = 0.835;

/// Reno's average window in segments at loss rate `p` (0 < p <= 1).
pub fn reno_window(p: f64) -> f64 {
    RENO_COEFFICIENT / p.sqrt()
}

/// HighSpeed TCP's average window in segments at loss rate `p`: RFC 3649 §5's response function,
/// Reno's where that gives no more than [`highspeed::LOW_WINDOW`].
pub fn highspeed_window(p: f64) -> f64 {
    let reno = reno_window(p);
    if reno <= f64::from(highspeed::LOW_WINDOW) {
        return reno;
    }
    HIGHSPEED_COEFFICIENT / p.powf(HIGHSPEED_EXPONENT)
}

/// gentle HighSpeed TCP's average window in segments at loss rate `p` on a path it does not fill
/// (see the module docs): HighSpeed TCP's.
pub fn gentle_highspeed_window(p: f64) -> f64 {
    highspeed_window(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, relative: f64) -> bool {
        (a - b).abs() <= relative * b.abs()
    }

    #[test]
    fn reno_and_highspeed_meet_at_the_low_window() {
        // RFC 3649 §5: Reno's response function gives 38 segments at p = 1e-3, where HighSpeed
        // TCP's line starts (0.12 / 1e-3^0.835 = 38.4: the RFC rounds its coefficient).
        assert!(close(reno_window(highspeed::LOW_P), 38.6, 0.01));
        assert!(close(
            HIGHSPEED_COEFFICIENT / highspeed::LOW_P.powf(HIGHSPEED_EXPONENT),
            f64::from(highspeed::LOW_WINDOW),
            0.02
        ));
        // Above that loss rate HighSpeed TCP is Reno.
        assert_eq!(highspeed_window(0.01), reno_window(0.01));
    }

    #[test]
    fn highspeed_reaches_the_rfcs_high_window() {
        // RFC 3649 §5: 83,000 segments at p = 1e-7.
        assert!(close(
            highspeed_window(highspeed::HIGH_P),
            f64::from(highspeed::HIGH_WINDOW),
            0.02
        ));
        // At p = 1e-5: Reno 386 segments, HighSpeed TCP 1795, and §7's table-consistent
        // inverse (0.078 / p)^(1 / 1.2) within 3 % of it.
        assert!(close(reno_window(1e-5), 385.8, 0.001));
        assert!(close(highspeed_window(1e-5), 1795.0, 0.001));
        let table_inverse =
            (highspeed::LOSS_RATE_COEFFICIENT / 1e-5).powf(1.0 / highspeed::LOSS_RATE_EXPONENT);
        assert!(close(table_inverse, highspeed_window(1e-5), 0.03));
        assert_eq!(gentle_highspeed_window(1e-5), highspeed_window(1e-5));
    }
}
