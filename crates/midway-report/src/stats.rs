//! Pure statistics behind the report tables: quantiles, the gain of splitting and the share of
//! runs a proxy improved. No I/O, no records: plain numbers in, numbers out, so every value in a
//! report can be checked by hand.
//!
//! Quantile definition: linear interpolation between closest ranks — type 7 of Hyndman & Fan
//! (1996), the default of R, NumPy and spreadsheets. For sorted values `x[0..n]` and `0 <= q <= 1`,
//! `h = (n - 1) q` and `Q(q) = x[floor(h)] + (h - floor(h)) (x[floor(h) + 1] - x[floor(h)])`.
//! The median is `Q(0.5)` (the mean of the two middle values for even `n`), the quartiles are
//! `Q(0.25)` and `Q(0.75)`.
//!
//! Gain of splitting, as the satellite paper defines it: `GoS = (T_split - T_direct) /
//! T_direct` where `T` is a throughput, so `GoS > 0` means the split connection was faster and
//! `GoS = 1` means twice as fast. The share of runs with `GoS > 0` is that paper's "guarantee of
//! performance improvement".
//!
//! Confidence intervals of these numbers are [`crate::interval`]'s.

/// Sorts the finite values ascending and drops NaN and infinities (a failed measurement must not
/// move a quantile).
pub fn sorted_finite(values: &[f64]) -> Vec<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    sorted
}

/// Quantile `q` (0..=1) of values already sorted ascending, by the definition in the module docs.
/// `None` when `sorted` is empty or `q` is outside 0..=1.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let h = (sorted.len() - 1) as f64 * q;
    let lower = h.floor() as usize;
    let upper = (lower + 1).min(sorted.len() - 1);
    let fraction = h - lower as f64;
    Some(sorted[lower] + fraction * (sorted[upper] - sorted[lower]))
}

/// Quantile `q` of unsorted values (non-finite values ignored). Use it for any percentile
/// (`quantile(v, 0.9)` is the 90th percentile).
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    quantile_sorted(&sorted_finite(values), q)
}

/// Median of the finite values; `None` when there are none.
pub fn median(values: &[f64]) -> Option<f64> {
    quantile(values, 0.5)
}

/// Arithmetic mean of the finite values; `None` when there are none.
pub fn mean(values: &[f64]) -> Option<f64> {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    (!finite.is_empty()).then(|| finite.iter().sum::<f64>() / finite.len() as f64)
}

/// Sample size, quartiles and median of a set of measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    /// Number of finite values the quantiles were computed from.
    pub n: usize,
    /// First quartile (25th percentile), in the unit of the values.
    pub q1: f64,
    /// Median (50th percentile), in the unit of the values.
    pub median: f64,
    /// Third quartile (75th percentile), in the unit of the values.
    pub q3: f64,
}

/// Quartiles and median of the finite values; `None` when there are none.
pub fn spread(values: &[f64]) -> Option<Spread> {
    let sorted = sorted_finite(values);
    Some(Spread {
        n: sorted.len(),
        q1: quantile_sorted(&sorted, 0.25)?,
        median: quantile_sorted(&sorted, 0.5)?,
        q3: quantile_sorted(&sorted, 0.75)?,
    })
}

/// `GoS = (split - baseline) / baseline` for two throughputs. `None` when the baseline is not a
/// positive finite number or `split` is not finite (no gain can be stated against nothing).
pub fn gain_of_splitting(split: f64, baseline: f64) -> Option<f64> {
    if !(baseline.is_finite() && baseline > 0.0 && split.is_finite()) {
        return None;
    }
    Some((split - baseline) / baseline)
}

/// GoS of each `(split, baseline)` pair — one pair per repetition, both measured under the same
/// parameters — skipping pairs where it is undefined.
pub fn paired_gains(pairs: impl IntoIterator<Item = (f64, f64)>) -> Vec<f64> {
    pairs
        .into_iter()
        .filter_map(|(split, baseline)| gain_of_splitting(split, baseline))
        .collect()
}

/// GoS of the medians: `(median(split) - median(baseline)) / median(baseline)`. Unlike the median
/// of paired gains it needs no pairing, so it also works when repetitions are missing.
pub fn gain_of_medians(split: &[f64], baseline: &[f64]) -> Option<f64> {
    gain_of_splitting(median(split)?, median(baseline)?)
}

/// How many of the gains are strictly positive, out of how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositiveShare {
    /// Number of gains strictly above zero.
    pub positive: usize,
    /// Number of gains counted.
    pub total: usize,
}

impl PositiveShare {
    /// The share as a fraction 0..=1; `None` for no samples.
    pub fn fraction(&self) -> Option<f64> {
        (self.total > 0).then(|| self.positive as f64 / self.total as f64)
    }
}

/// Share of gains with `GoS > 0` (a gain of exactly 0 is no improvement). Non-finite gains are
/// not counted at all.
pub fn share_positive(gains: &[f64]) -> PositiveShare {
    let finite = gains.iter().filter(|g| g.is_finite());
    PositiveShare {
        positive: finite.clone().filter(|g| **g > 0.0).count(),
        total: finite.count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_type_7_on_small_inputs() {
        let values = [4.0, 1.0, 3.0, 2.0];
        // h = 3q: Q(0.25) = x0 + 0.75 (x1 - x0) = 1.75; Q(0.75) = x2 + 0.25 (x3 - x2) = 3.25.
        assert_eq!(quantile(&values, 0.25), Some(1.75));
        assert_eq!(median(&values), Some(2.5));
        assert_eq!(quantile(&values, 0.75), Some(3.25));
        assert_eq!(quantile(&values, 0.0), Some(1.0));
        assert_eq!(quantile(&values, 1.0), Some(4.0));
        assert_eq!(quantile(&[10.0, 20.0, 30.0, 40.0, 50.0], 0.9), Some(46.0));
    }

    #[test]
    fn median_of_odd_count_is_the_middle_value() {
        assert_eq!(median(&[9.0, 1.0, 5.0]), Some(5.0));
        assert_eq!(median(&[7.0]), Some(7.0));
    }

    #[test]
    fn empty_input_and_bad_q_give_none() {
        assert_eq!(median(&[]), None);
        assert_eq!(spread(&[]), None);
        assert_eq!(quantile(&[1.0, 2.0], 1.5), None);
        assert_eq!(quantile(&[1.0, 2.0], -0.1), None);
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(mean(&[]), None);
        assert_eq!(mean(&[f64::NAN, f64::INFINITY]), None);
    }

    #[test]
    fn non_finite_values_are_ignored() {
        let s = spread(&[f64::NAN, 1.0, f64::INFINITY, 2.0, 3.0]).expect("three finite values");
        assert_eq!(
            s,
            Spread {
                n: 3,
                q1: 1.5,
                median: 2.0,
                q3: 2.5
            }
        );
    }

    #[test]
    fn mean_skips_non_finite_values() {
        assert_eq!(mean(&[1.0, 2.0, 6.0]), Some(3.0));
        assert_eq!(mean(&[f64::NAN, 4.0, f64::NEG_INFINITY, 2.0]), Some(3.0));
    }

    #[test]
    fn gain_of_splitting_exact() {
        assert_eq!(gain_of_splitting(15.0, 10.0), Some(0.5));
        assert_eq!(gain_of_splitting(5.0, 10.0), Some(-0.5));
        assert_eq!(gain_of_splitting(10.0, 10.0), Some(0.0));
        assert_eq!(gain_of_splitting(1.0, 0.0), None);
        assert_eq!(gain_of_splitting(1.0, -2.0), None);
        assert_eq!(gain_of_splitting(f64::NAN, 2.0), None);
    }

    #[test]
    fn paired_gains_and_their_share() {
        let gains = paired_gains([(12.0, 10.0), (8.0, 10.0), (20.0, 10.0), (3.0, 0.0)]);
        assert_eq!(gains, vec![0.2, -0.2, 1.0]);
        assert_eq!(median(&gains), Some(0.2));
        let share = share_positive(&gains);
        assert_eq!(
            share,
            PositiveShare {
                positive: 2,
                total: 3
            }
        );
        assert_eq!(share.fraction(), Some(2.0 / 3.0));
        assert_eq!(share_positive(&[0.0, 0.0]).positive, 0);
        assert_eq!(share_positive(&[]).fraction(), None);
    }

    #[test]
    fn gain_of_medians_differs_from_median_of_gains() {
        // Baselines 10, 16, 10: median 10, so the gain of medians is (12 - 10) / 10.
        let split = [12.0, 8.0, 20.0];
        let baseline = [10.0, 16.0, 10.0];
        assert_eq!(gain_of_medians(&split, &baseline), Some(0.2));
        // Baselines 10, 16, 15: gain of medians (12 - 15) / 15 = -0.2, yet the paired gains
        // 0.2, -0.5, 0.33 have median +0.2: the two summaries can disagree in sign.
        let baseline_b = [10.0, 16.0, 15.0];
        assert_eq!(gain_of_medians(&split, &baseline_b), Some(-0.2));
        let gains = paired_gains(split.into_iter().zip(baseline_b));
        assert_eq!(median(&gains), Some(0.2));
    }
}
