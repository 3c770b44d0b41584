//! Confidence intervals of the numbers the claims compare, chosen so that the level a report
//! prints is the level the interval has at the lab's 5-10 repetitions. No random numbers: the same
//! records always give the same interval.
//!
//! One method per statistic:
//!
//! - **A median** (and a paired ratio, which is the median of the per-pair ratios `a_i / b_i`):
//!   the exact distribution-free interval between order statistics, `[x(k), x(n + 1 - k)]` of the
//!   sorted values, whose coverage is `1 - 2 P(Binomial(n, 1/2) <= k - 1)` for any continuous
//!   distribution (at least that with ties). `k` is the largest index whose level is still at
//!   least [`TARGET_LEVEL`]; below 6 runs no `k` reaches it and the interval is `[min, max]` at
//!   its own level: 75 % at 3 runs, 87.5 % at 4, 93.75 % at 5. From 6 runs on the level is 95 %
//!   or more (96.9 % at 6, 97.9 % at 10). See [`order_statistic_level`].
//! - **A ratio of the medians of two independent samples** (cases not measured in pairs): each
//!   median gets its order-statistic interval at `sqrt(0.95)` (or the most its runs allow), and
//!   the ratio's interval is every quotient of a value of A's interval by one of B's. Both
//!   intervals hold at once with probability at least the product of their levels (the samples
//!   are independent), and then the ratio is inside: at least 87.9 % with 5 runs a side, at least
//!   95 % from 10 a side. No model of the distributions is assumed (a Hodges-Lehmann interval on
//!   log ratios would be narrower but assumes the two cases differ only by a scale factor, which a
//!   proxy that changes the shape of the spread breaks).
//! - **A mean and a ratio of means**: no interval of a mean holds for every distribution at a
//!   fixed n (Bahadur & Savage, 1956), so these rest on a model: Student's t for one mean and
//!   Fieller's interval for a ratio (paired: t on `a_i - r b_i`; independent: t with
//!   `min(n_a, n_b) - 1` degrees of freedom, the conservative choice for unequal variances).
//!   Exact for normal runs at any n; on skewed runs they cover less (88 % on exponential runs at
//!   n = 5, 92 % at 20, as the coverage test prints). Reports mark them "t interval".
//! - **A share** (runs with a gain, out of all): the Clopper-Pearson interval, at least 95 %.
//!
//! A percentile bootstrap was used before: at 5 runs its "95 %" interval of a median is
//! `[min, max]` (93.75 %) and its interval of a mean covers about 84 % of normal samples, which the
//! coverage test (`tests/coverage.rs`) shows.
//!
//! Runs whose values all agree to within [`DETERMINISTIC_SPREAD`] are deterministic
//! ([`is_deterministic`]): their interval has (almost) no width because the emulated runs repeat
//! each other, not because the number is known to that precision.

use crate::stats::{mean, median, sorted_finite};

/// The level every interval aims at.
pub const TARGET_LEVEL: f64 = 0.95;
/// Fewest values a side an interval is computed from; with one run there is no spread.
pub const MIN_REPETITIONS: usize = 2;
/// An interval below this level decides no verdict. 5 runs reach 93.75 % (one sample or pairs)
/// and at least 87.9 % (two independent samples); 4 runs a side of two samples reach only 76.6 %,
/// and 3 runs 75 %: a verdict resting on a one-in-four chance of a miss is no verdict.
pub const MIN_VERDICT_LEVEL: f64 = 0.85;
/// Relative spread `(max - min) / |median|` below which runs count as deterministic: below the
/// reports' three significant digits they print as one number, and what is left (a few 1e-4 in
/// the satellite runs) is the host's timing, not the sampled network.
pub const DETERMINISTIC_SPREAD: f64 = 1e-3;

/// What an interval's level rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// Order statistics of one sample: the level is exact (at least that with ties).
    OrderStatistics,
    /// Two independent order-statistic intervals combined: the level is a lower bound.
    CombinedOrderStatistics,
    /// Clopper-Pearson: the level is a lower bound.
    ClopperPearson,
    /// Student's t or Fieller: exact when the runs are normal, an approximation otherwise.
    StudentT,
}

/// A confidence interval, `low <= high`, in the unit of the statistic, with its level.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// Lower end.
    pub low: f64,
    /// Upper end.
    pub high: f64,
    /// Confidence level (0..1) the interval has at its number of runs.
    pub level: f64,
    /// What the level rests on.
    pub basis: Basis,
}

impl Interval {
    /// `high - low`.
    pub fn width(&self) -> f64 {
        self.high - self.low
    }

    /// "93.8 % interval", "≥ 87.9 % interval" (a lower bound) or "95 % t interval" (a model's).
    pub fn label(&self) -> String {
        let percent = format!("{:.1}", self.level * 100.0);
        let percent = percent.trim_end_matches(".0");
        match self.basis {
            Basis::OrderStatistics => format!("{percent} % interval"),
            Basis::CombinedOrderStatistics | Basis::ClopperPearson => {
                format!("≥ {percent} % interval")
            }
            Basis::StudentT => format!("{percent} % t interval"),
        }
    }
}

/// Why a statistic has no interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoInterval {
    /// Fewer than [`MIN_REPETITIONS`] finite values on a side.
    TooFewRuns,
    /// The denominator's interval reaches zero, so the ratio's is unbounded.
    UnboundedRatio,
}

impl NoInterval {
    /// The reason as the reports print it.
    pub fn text(self) -> String {
        match self {
            NoInterval::TooFewRuns => format!("fewer than {MIN_REPETITIONS} runs a side"),
            NoInterval::UnboundedRatio => {
                "the denominator's interval reaches 0, so the ratio's is unbounded".to_string()
            }
        }
    }
}

/// `P(Binomial(n, p) <= k)`, summed in log space so large `n` does not underflow.
fn binomial_cdf(n: usize, k: usize, p: f64) -> f64 {
    if p <= 0.0 {
        return 1.0;
    }
    if p >= 1.0 {
        return if k >= n { 1.0 } else { 0.0 };
    }
    let (log_p, log_q) = (p.ln(), (1.0 - p).ln());
    let mut log_choose = 0.0;
    let mut total = 0.0;
    for i in 0..=k.min(n) {
        if i > 0 {
            log_choose += ((n - i + 1) as f64 / i as f64).ln();
        }
        total += (log_choose + i as f64 * log_p + (n - i) as f64 * log_q).exp();
    }
    total.min(1.0)
}

/// Coverage of `[x(k), x(n + 1 - k)]` (1-based order statistics) as an interval of the median of
/// `n` runs: `1 - 2 P(Binomial(n, 1/2) <= k - 1)`, whatever the (continuous) distribution.
pub fn order_statistic_level(n: usize, k: usize) -> f64 {
    if k == 0 || 2 * k > n + 1 {
        return 0.0;
    }
    1.0 - 2.0 * binomial_cdf(n, k - 1, 0.5)
}

/// The largest `k` whose order-statistic interval has at least `target`, or 1 (`[min, max]`, the
/// most `n` runs give) when none has; with its level.
fn order_statistic_index(n: usize, target: f64) -> (usize, f64) {
    let mut best = (1, order_statistic_level(n, 1));
    for k in 2..=n.div_ceil(2) {
        let level = order_statistic_level(n, k);
        if level < target {
            break;
        }
        best = (k, level);
    }
    best
}

/// The level [`median_interval`] has with `n` runs (0 below [`MIN_REPETITIONS`]).
pub fn median_level(n: usize) -> f64 {
    if n < MIN_REPETITIONS {
        return 0.0;
    }
    order_statistic_index(n, TARGET_LEVEL).1
}

/// Order-statistic interval of the median of the finite `values`, at `target` or the most the
/// runs allow.
fn order_statistic_interval(values: &[f64], target: f64) -> Result<Interval, NoInterval> {
    let sorted = sorted_finite(values);
    let n = sorted.len();
    if n < MIN_REPETITIONS {
        return Err(NoInterval::TooFewRuns);
    }
    let (k, level) = order_statistic_index(n, target);
    Ok(Interval {
        low: sorted[k - 1],
        high: sorted[n - k],
        level,
        basis: Basis::OrderStatistics,
    })
}

/// Distribution-free interval of the median of the finite `values` (module docs).
pub fn median_interval(values: &[f64]) -> Result<Interval, NoInterval> {
    order_statistic_interval(values, TARGET_LEVEL)
}

/// The ratio `a / b` of each pair with finite sides and `b != 0`: a paired ratio's sample.
pub fn paired_ratios(pairs: &[(f64, f64)]) -> Vec<f64> {
    pairs
        .iter()
        .filter(|(a, b)| a.is_finite() && b.is_finite() && *b != 0.0)
        .map(|(a, b)| a / b)
        .collect()
}

/// Interval of `median(a) / median(b)` for independent samples (module docs): at least the
/// product of the two order-statistic levels.
pub fn ratio_of_medians_interval(a: &[f64], b: &[f64]) -> Result<Interval, NoInterval> {
    let per_side = TARGET_LEVEL.sqrt();
    let ia = order_statistic_interval(a, per_side)?;
    let ib = order_statistic_interval(b, per_side)?;
    let (low, high) = divide(ia.low, ia.high, ib.low, ib.high)?;
    Ok(Interval {
        low,
        high,
        level: ia.level * ib.level,
        basis: Basis::CombinedOrderStatistics,
    })
}

/// Every quotient `x / y` with `x` in `[al, ah]` and `y` in `[bl, bh]`, as an interval; unbounded
/// when `[bl, bh]` holds 0.
fn divide(al: f64, ah: f64, bl: f64, bh: f64) -> Result<(f64, f64), NoInterval> {
    if bl <= 0.0 && bh >= 0.0 {
        return Err(NoInterval::UnboundedRatio);
    }
    let corners = [al / bl, al / bh, ah / bl, ah / bh];
    let low = corners.iter().copied().fold(f64::INFINITY, f64::min);
    let high = corners.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Ok((low, high))
}

/// Two-sided 97.5 % quantiles of Student's t for 1..=30 degrees of freedom.
const T_975: [f64; 30] = [
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010,
    2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687,
    2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
];
/// The standard normal's 97.5 % quantile.
const Z_975: f64 = 1.959_963_985;

/// Student's t quantile for a two-sided 95 % interval with `df` degrees of freedom: the table up
/// to 30, then the Cornish-Fisher expansion (within 1e-4 of the exact value from 30 on).
fn t_975(df: usize) -> f64 {
    if let Some(t) = df.checked_sub(1).and_then(|i| T_975.get(i)) {
        return *t;
    }
    let (z, v) = (Z_975, df as f64);
    z + (z.powi(3) + z) / (4.0 * v)
        + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * v * v)
        + (3.0 * z.powi(7) + 19.0 * z.powi(5) + 17.0 * z.powi(3) - 15.0 * z) / (384.0 * v.powi(3))
}

/// Sample covariance of `x` and `y` (divisor `n - 1`).
fn covariance(x: &[f64], y: &[f64]) -> f64 {
    let (mx, my) = (x.iter().sum::<f64>(), y.iter().sum::<f64>());
    let n = x.len() as f64;
    let (mx, my) = (mx / n, my / n);
    x.iter()
        .zip(y)
        .map(|(a, b)| (a - mx) * (b - my))
        .sum::<f64>()
        / (n - 1.0)
}

fn finite(values: &[f64]) -> Vec<f64> {
    values.iter().copied().filter(|v| v.is_finite()).collect()
}

/// Student's t interval of the mean of the finite `values`.
pub fn mean_interval(values: &[f64]) -> Result<Interval, NoInterval> {
    let values = finite(values);
    if values.len() < MIN_REPETITIONS {
        return Err(NoInterval::TooFewRuns);
    }
    let m = mean(&values).ok_or(NoInterval::TooFewRuns)?;
    let half =
        t_975(values.len() - 1) * (covariance(&values, &values) / values.len() as f64).sqrt();
    Ok(Interval {
        low: m - half,
        high: m + half,
        level: TARGET_LEVEL,
        basis: Basis::StudentT,
    })
}

/// The two sides of a ratio.
#[derive(Debug, Clone, Copy)]
pub enum Ratio<'a> {
    /// Measured in pairs `(a, b)` (same seed, so the same emulated conditions).
    Paired(&'a [(f64, f64)]),
    /// Two independent samples `a` and `b`.
    Independent(&'a [f64], &'a [f64]),
}

/// Fieller's interval of `mean(a) / mean(b)`: every `r` for which `mean(a) - r mean(b)` is not
/// rejected by a two-sided 5 % t test (module docs).
pub fn ratio_of_means_interval(data: Ratio<'_>) -> Result<Interval, NoInterval> {
    // Means, variances and covariance of the two means, and the t test's degrees of freedom.
    let (ma, mb, vaa, vbb, vab, df) = match data {
        Ratio::Paired(pairs) => {
            let pairs: Vec<(f64, f64)> = pairs
                .iter()
                .copied()
                .filter(|(a, b)| a.is_finite() && b.is_finite())
                .collect();
            if pairs.len() < MIN_REPETITIONS {
                return Err(NoInterval::TooFewRuns);
            }
            let (a, b): (Vec<f64>, Vec<f64>) = pairs.into_iter().unzip();
            let n = a.len() as f64;
            let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
            let (vaa, vbb) = (covariance(&a, &a) / n, covariance(&b, &b) / n);
            (ma, mb, vaa, vbb, covariance(&a, &b) / n, a.len() - 1)
        }
        Ratio::Independent(a, b) => {
            let (a, b) = (finite(a), finite(b));
            if a.len() < MIN_REPETITIONS || b.len() < MIN_REPETITIONS {
                return Err(NoInterval::TooFewRuns);
            }
            let (na, nb) = (a.len() as f64, b.len() as f64);
            let (ma, mb) = (a.iter().sum::<f64>() / na, b.iter().sum::<f64>() / nb);
            let (vaa, vbb) = (covariance(&a, &a) / na, covariance(&b, &b) / nb);
            (ma, mb, vaa, vbb, 0.0, a.len().min(b.len()) - 1)
        }
    };
    // (ma - r mb)^2 <= t^2 (vaa - 2 r vab + r^2 vbb), i.e. q2 r^2 + q1 r + q0 <= 0.
    let t2 = t_975(df).powi(2);
    let q2 = mb * mb - t2 * vbb;
    let q1 = -2.0 * (ma * mb - t2 * vab);
    let q0 = ma * ma - t2 * vaa;
    if q2 <= 0.0 {
        // B's mean is not told apart from 0: the set of ratios is unbounded.
        return Err(NoInterval::UnboundedRatio);
    }
    // The discriminant is >= 0 in exact arithmetic (r = ma / mb satisfies the inequality).
    let root = (q1 * q1 - 4.0 * q2 * q0).max(0.0).sqrt();
    Ok(Interval {
        low: (-q1 - root) / (2.0 * q2),
        high: (-q1 + root) / (2.0 * q2),
        level: TARGET_LEVEL,
        basis: Basis::StudentT,
    })
}

/// Clopper-Pearson interval of a share of `successes` out of `total` trials.
pub fn share_interval(successes: usize, total: usize) -> Result<Interval, NoInterval> {
    if total < MIN_REPETITIONS || successes > total {
        return Err(NoInterval::TooFewRuns);
    }
    let tail = (1.0 - TARGET_LEVEL) / 2.0;
    // P(X <= x; p) falls as p grows: bisect for the p where it crosses `target`.
    let solve = |x: usize, target: f64| {
        let (mut low, mut high) = (0.0_f64, 1.0_f64);
        for _ in 0..60 {
            let mid = (low + high) / 2.0;
            if binomial_cdf(total, x, mid) > target {
                low = mid;
            } else {
                high = mid;
            }
        }
        (low + high) / 2.0
    };
    // Lower end: P(X >= s; p) = tail, i.e. P(X <= s - 1; p) = 1 - tail. Upper: P(X <= s; p) = tail.
    let low = match successes {
        0 => 0.0,
        s => solve(s - 1, 1.0 - tail),
    };
    let high = if successes == total {
        1.0
    } else {
        solve(successes, tail)
    };
    Ok(Interval {
        low,
        high,
        level: TARGET_LEVEL,
        basis: Basis::ClopperPearson,
    })
}

/// Whether the finite `values` (at least [`MIN_REPETITIONS`]) all agree to within
/// [`DETERMINISTIC_SPREAD`] of their median: repetitions of a deterministic emulation.
pub fn is_deterministic(values: &[f64]) -> bool {
    let sorted = sorted_finite(values);
    let (Some(first), Some(last), Some(middle)) = (sorted.first(), sorted.last(), median(&sorted))
    else {
        return false;
    };
    sorted.len() >= MIN_REPETITIONS && last - first <= DETERMINISTIC_SPREAD * middle.abs()
}

/// How many runs would shrink an interval of `width`, measured over `runs` runs, below
/// `distance` (the number's distance from the check's threshold): an interval's width falls as
/// `1 / sqrt(n)` (the standard error of a median or a mean), so `runs (width / distance)^2`,
/// rounded up. `None` when the number sits on the threshold (no number of runs settles it).
pub fn runs_needed(runs: usize, width: f64, distance: f64) -> Option<usize> {
    if !(distance > 0.0 && width.is_finite()) {
        return None;
    }
    let needed = (runs as f64 * (width / distance).powi(2)).ceil();
    Some((needed as usize).max(runs + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance
    }

    #[test]
    fn order_statistic_levels_by_hand() {
        // [min, max] misses the median only when all runs fall on one side: 2 (1/2)^n.
        assert_eq!(order_statistic_level(5, 1), 1.0 - 2.0 / 32.0);
        assert_eq!(order_statistic_level(6, 1), 1.0 - 2.0 / 64.0);
        // n = 10, k = 2: P(Bin <= 1) = 11 / 1024.
        assert_eq!(order_statistic_level(10, 2), 1.0 - 22.0 / 1024.0);
        assert_eq!(median_level(1), 0.0);
        assert_eq!(median_level(3), 0.75);
        assert_eq!(median_level(4), 0.875);
        assert_eq!(median_level(5), 0.9375);
        assert_eq!(median_level(6), 0.96875);
        assert!(close(median_level(10), 1.0 - 22.0 / 1024.0, 1e-12));
        for n in 6..200 {
            assert!(median_level(n) >= TARGET_LEVEL, "n = {n}");
        }
    }

    #[test]
    fn median_interval_is_min_max_at_five_runs_and_narrows_at_ten() {
        let five = median_interval(&[9.0, 11.0, 10.0, 10.5, 9.5]).unwrap();
        assert_eq!((five.low, five.high), (9.0, 11.0));
        assert_eq!(five.label(), "93.8 % interval");
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        let ten = median_interval(&ten).unwrap();
        assert_eq!((ten.low, ten.high), (2.0, 9.0));
        assert_eq!(ten.label(), "97.9 % interval");
        assert_eq!(median_interval(&[4.0]), Err(NoInterval::TooFewRuns));
        assert_eq!(
            median_interval(&[f64::NAN, 1.0]),
            Err(NoInterval::TooFewRuns)
        );
    }

    #[test]
    fn pairing_makes_a_ratio_exact_when_the_sides_move_together() {
        // B is always 2 x A, though both vary a lot from pair to pair.
        let pairs = [(1.0, 2.0), (5.0, 10.0), (3.0, 6.0), (8.0, 16.0), (2.0, 4.0)];
        let paired = median_interval(&paired_ratios(&pairs)).unwrap();
        assert_eq!((paired.low, paired.high), (0.5, 0.5));
        let (a, b): (Vec<f64>, Vec<f64>) = pairs.iter().copied().unzip();
        let apart = ratio_of_medians_interval(&a, &b).unwrap();
        assert!(apart.low < 0.5 && apart.high > 0.5, "{apart:?}");
        assert!(close(apart.level, 0.9375 * 0.9375, 1e-12));
        assert_eq!(apart.label(), "≥ 87.9 % interval");
        assert_eq!((apart.low, apart.high), (1.0 / 16.0, 8.0 / 2.0));
    }

    #[test]
    fn a_denominator_reaching_zero_gives_no_ratio_interval() {
        let a = [1.0, 2.0, 3.0];
        assert_eq!(
            ratio_of_medians_interval(&a, &[-1.0, 0.5, 1.0]),
            Err(NoInterval::UnboundedRatio)
        );
        assert_eq!(
            ratio_of_means_interval(Ratio::Independent(&a, &[0.0, 0.0, 0.0])),
            Err(NoInterval::UnboundedRatio)
        );
        // A negative denominator is fine when it stays away from 0.
        let negative = ratio_of_medians_interval(&a, &[-2.0, -1.0, -4.0]).unwrap();
        assert_eq!((negative.low, negative.high), (-3.0, -0.25));
    }

    #[test]
    fn student_t_by_hand() {
        // Mean 3, s = sqrt(2.5), n = 5: half width 2.7764 sqrt(0.5).
        let i = mean_interval(&[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        let half = 2.7764 * 0.5_f64.sqrt();
        assert!(close(i.low, 3.0 - half, 1e-9) && close(i.high, 3.0 + half, 1e-9));
        assert_eq!(i.label(), "95 % t interval");
        // The expansion joins the table: df 30 within 1e-4, and tends to z.
        assert!(close(t_975(31), 2.0395, 1e-4));
        assert!(close(t_975(120), 1.9799, 1e-4));
        assert!(t_975(10_000) > Z_975 && t_975(10_000) < Z_975 + 1e-3);
    }

    #[test]
    fn fieller_without_spread_is_the_ratio_and_with_spread_contains_it() {
        let point = ratio_of_means_interval(Ratio::Paired(&[(3.0, 2.0); 4])).unwrap();
        assert!(close(point.low, 1.5, 1e-12) && close(point.high, 1.5, 1e-12));
        let pairs = [
            (10.0, 5.0),
            (12.0, 5.5),
            (9.0, 5.2),
            (11.0, 4.8),
            (10.5, 5.1),
        ];
        let paired = ratio_of_means_interval(Ratio::Paired(&pairs)).unwrap();
        let (a, b): (Vec<f64>, Vec<f64>) = pairs.iter().copied().unzip();
        let ratio = mean(&a).unwrap() / mean(&b).unwrap();
        assert!(paired.low < ratio && ratio < paired.high, "{paired:?}");
        let apart = ratio_of_means_interval(Ratio::Independent(&a, &b)).unwrap();
        assert!(apart.low < ratio && ratio < apart.high, "{apart:?}");
    }

    #[test]
    fn clopper_pearson_by_hand() {
        // 5 of 5: the lower end solves p^5 = 0.025.
        let all = share_interval(5, 5).unwrap();
        assert!(close(all.low, 0.025_f64.powf(0.2), 1e-9) && all.high == 1.0);
        // 0 of 5 mirrors it.
        let none = share_interval(0, 5).unwrap();
        assert!(none.low == 0.0 && close(none.high, 1.0 - 0.025_f64.powf(0.2), 1e-9));
        // 4 of 10: the textbook 0.1216..0.7376.
        let some = share_interval(4, 10).unwrap();
        assert!(close(some.low, 0.1216, 1e-4) && close(some.high, 0.7376, 1e-4));
        assert_eq!(some.label(), "≥ 95 % interval");
    }

    #[test]
    fn deterministic_runs_and_runs_needed() {
        assert!(is_deterministic(&[5.0; 5]));
        assert!(is_deterministic(&[100.0, 100.05, 99.98]));
        assert!(!is_deterministic(&[100.0, 100.5, 99.98]));
        assert!(!is_deterministic(&[1.0]));
        assert!(!is_deterministic(&[-0.001, 0.001, 0.0]));
        // Width 0.2 against a distance of 0.1: four times the runs.
        assert_eq!(runs_needed(5, 0.2, 0.1), Some(20));
        assert_eq!(runs_needed(5, 0.2, 0.0), None);
        // Never fewer than one more run than now.
        assert_eq!(runs_needed(5, 0.1, 0.099_999), Some(6));
    }
}
