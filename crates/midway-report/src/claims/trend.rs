//! Trends over a whole sweep ("the advantage becomes greater as T_INet increases"): Spearman's
//! rank correlation of the compared number with the sweep's order, and a bootstrap interval for
//! it that resamples the runs of every sweep point at once. A trend then agrees when the whole
//! interval is above zero (below, for a falling one), the way a comparison agrees when its whole
//! interval meets its range. Pure; the runs come from [`super::evaluate`].

use rand::{Rng, SeedableRng};

use crate::stats;

/// The trend interval's level. Its coverage at a few runs a point is not established (the
/// per-point intervals' methods, `crate::interval`, do not extend to a rank correlation over a
/// sweep), so reports call it a bootstrap interval.
pub(super) const LEVEL: f64 = 0.95;
/// Resamples behind the trend interval.
const RESAMPLES: usize = 2000;

/// The trend interval of the rank correlation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Interval {
    pub(super) low: f64,
    pub(super) high: f64,
}

/// The seed of the trend bootstrap (fixed: a report rebuilt from the same records prints the
/// same interval). Its own, so a trend does not share draws with the per-point intervals.
const TREND_SEED: u64 = 0x0074_7265_6e64;

/// The runs of one sweep point behind the compared number.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum PointRuns {
    /// A alone.
    One(Vec<f64>),
    /// A over B, run in pairs (same seeds): drawn together.
    Paired(Vec<(f64, f64)>),
    /// A over B, each drawn alone.
    Independent(Vec<f64>, Vec<f64>),
}

impl PointRuns {
    fn enough(&self) -> bool {
        let n = crate::interval::MIN_REPETITIONS;
        match self {
            PointRuns::One(a) => a.len() >= n,
            PointRuns::Paired(p) => p.len() >= n,
            PointRuns::Independent(a, b) => a.len() >= n && b.len() >= n,
        }
    }

    /// The compared number of one resample of these runs.
    fn resample(
        &self,
        rng: &mut rand_xoshiro::Xoshiro256PlusPlus,
        summary: &impl Fn(&[f64]) -> Option<f64>,
    ) -> Option<f64> {
        let draw = |values: &[f64], rng: &mut rand_xoshiro::Xoshiro256PlusPlus| -> Vec<f64> {
            (0..values.len())
                .map(|_| values[rng.gen_range(0..values.len())])
                .collect()
        };
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b != 0.0 => Some(a / b),
            _ => None,
        };
        match self {
            PointRuns::One(a) => summary(&draw(a, rng)),
            PointRuns::Paired(pairs) => {
                let drawn: Vec<(f64, f64)> = (0..pairs.len())
                    .map(|_| pairs[rng.gen_range(0..pairs.len())])
                    .collect();
                let (a, b): (Vec<f64>, Vec<f64>) = drawn.into_iter().unzip();
                ratio(summary(&a), summary(&b))
            }
            PointRuns::Independent(a, b) => {
                let a = draw(a, rng);
                let b = draw(b, rng);
                ratio(summary(&a), summary(&b))
            }
        }
    }
}

/// Average ranks (1-based) of `values`, ties sharing the mean of their ranks.
fn ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&i, &j| values[i].total_cmp(&values[j]));
    let mut ranks = vec![0.0; values.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && values[order[end]] == values[order[start]] {
            end += 1;
        }
        let rank = (start + end + 1) as f64 / 2.0;
        for &i in &order[start..end] {
            ranks[i] = rank;
        }
        start = end;
    }
    ranks
}

/// Spearman's rank correlation of `values` with their order (the sweep's, ascending): 1 when
/// they rise at every step, -1 when they fall at every step, 0 when all are equal.
pub(super) fn spearman(values: &[f64]) -> f64 {
    let n = values.len() as f64;
    let y = ranks(values);
    let mean = (n + 1.0) / 2.0;
    let (mut covariance, mut var_x, mut var_y) = (0.0, 0.0, 0.0);
    for (i, ry) in y.iter().enumerate() {
        let dx = (i + 1) as f64 - mean;
        let dy = ry - mean;
        covariance += dx * dy;
        var_x += dx * dx;
        var_y += dy * dy;
    }
    if var_y == 0.0 || var_x == 0.0 {
        0.0
    } else {
        covariance / (var_x * var_y).sqrt()
    }
}

/// The percentile bootstrap interval of the rank correlation: every point's runs resampled in
/// each round. `None` when a point has too few runs or most rounds leave a point undefined.
pub(super) fn interval(
    points: &[PointRuns],
    summary: impl Fn(&[f64]) -> Option<f64>,
) -> Option<Interval> {
    if !points.iter().all(PointRuns::enough) {
        return None;
    }
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(TREND_SEED);
    let mut estimates = Vec::with_capacity(RESAMPLES);
    for _ in 0..RESAMPLES {
        let values: Option<Vec<f64>> = points
            .iter()
            .map(|p| p.resample(&mut rng, &summary).filter(|v| v.is_finite()))
            .collect();
        if let Some(values) = values {
            estimates.push(spearman(&values));
        }
    }
    if estimates.len() * 2 < RESAMPLES {
        return None;
    }
    estimates.sort_by(f64::total_cmp);
    let tail = (1.0 - LEVEL) / 2.0;
    Some(Interval {
        low: stats::quantile_sorted(&estimates, tail)?,
        high: stats::quantile_sorted(&estimates, 1.0 - tail)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_correlation_of_rising_falling_flat_and_tied_values() {
        assert_eq!(spearman(&[1.0, 2.0, 5.0]), 1.0);
        assert_eq!(spearman(&[3.0, 2.0, 1.0]), -1.0);
        assert_eq!(spearman(&[2.0, 2.0, 2.0]), 0.0);
        // One step down among three: ranks 1, 3, 2 against 1, 2, 3.
        assert!((spearman(&[1.0, 3.0, 2.0]) - 0.5).abs() < 1e-12);
        assert_eq!(ranks(&[5.0, 1.0, 5.0]), vec![2.5, 1.0, 2.5]);
    }

    #[test]
    fn a_clear_rise_has_its_whole_interval_above_zero_and_noise_does_not() {
        let median = |v: &[f64]| stats::median(v);
        let clear: Vec<PointRuns> = [1.0, 2.0, 3.0, 4.0]
            .iter()
            .map(|level| PointRuns::One(vec![level - 0.1, *level, level + 0.1]))
            .collect();
        let i = interval(&clear, median).expect("interval");
        assert_eq!((i.low, i.high), (1.0, 1.0));
        // The same level at every point, with run-to-run spread: the interval spans zero.
        let flat: Vec<PointRuns> = (0..4)
            .map(|_| PointRuns::One(vec![0.9, 1.0, 1.1, 0.95, 1.05]))
            .collect();
        let i = interval(&flat, median).expect("interval");
        assert!(i.low < 0.0 && i.high > 0.0, "{i:?}");
        // One run a point: no interval.
        assert!(interval(
            &[PointRuns::One(vec![1.0]), PointRuns::One(vec![2.0])],
            median
        )
        .is_none());
    }
}
