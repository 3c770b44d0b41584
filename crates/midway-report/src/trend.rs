//! A trend over a sweep, tested: does a number rise (or fall) from one sweep point to the next?
//!
//! The runs of every point are pooled and ranked, and Spearman's rank correlation of the runs
//! with the sweep (each run at its point's place in the sweep) is the test's statistic. Under the
//! null hypothesis the runs of every point come from one distribution, so any rearrangement of
//! the runs among the points (each point keeping its number of runs) is as likely as the one
//! measured; the one-sided p-value is the share of rearrangements whose correlation is at least
//! as far in the claimed direction as the measured one. It is estimated from
//! [`PERMUTATIONS`] random rearrangements drawn from a fixed seed (a report rebuilt from the same
//! records prints the same p-value), counting the measured arrangement as one of them:
//! `p = (1 + as extreme) / (1 + PERMUTATIONS)`. That estimate never falls at or below a level
//! α with probability above α under the null, however few the runs and whatever their
//! distribution (ties included, ranked as midranks), so a trend accepted at `p <= ALPHA` has a
//! false agreement rate of at most [`ALPHA`] by construction
//! (`crates/midway-report/tests/coverage.rs` measures it on synthetic sweeps).
//!
//! What the runs of a point are is the caller's choice and decides the null hypothesis: the
//! runs of one case; for a ratio of two cases run in pairs (same seed, so the same emulated
//! conditions), the per-pair ratios, each pair a unit that moves as one (the pairs of different
//! points have different seeds and are independent, so under "the ratio does not change along
//! the sweep" they are exchangeable; swapping A and B inside a pair would test "A and B are
//! alike", another question); for a gain of splitting, the per-pair gains. Runs of two cases
//! that are not paired give no per-run number, and no test here.
//!
//! What a rejection says: the points' runs are not alike, and larger values sit at larger (or
//! smaller) sweep values more than chance arranges them: a rank test detects ordered shifts of
//! the runs' distribution, not of their median or mean alone. Pure.

use rand::{Rng, SeedableRng};

/// The level of a one-sided trend test: the highest p-value at which a trend agrees (and at
/// which a trend the other way disagrees), matching the one-sided tail of the 95 % intervals
/// of the other checks.
pub const ALPHA: f64 = 0.025;
/// Random rearrangements behind a p-value: its smallest value is then 1 / 2,000, and near
/// [`ALPHA`] its Monte Carlo error is about 0.0035 (which moves a verdict only for a p-value
/// that close to the level; the level itself holds whatever the count).
pub const PERMUTATIONS: usize = 1_999;
/// The seed of the rearrangements (fixed: the same records give the same p-value).
const SEED: u64 = 0x0074_7265_6e64;

/// Average ranks (1-based) of `values`, ties sharing the mean of their ranks.
pub fn ranks(values: &[f64]) -> Vec<f64> {
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

/// Pearson's correlation of two equally long series (0 when either is constant).
fn correlation(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    if sxx == 0.0 || syy == 0.0 {
        0.0
    } else {
        sxy / (sxx * syy).sqrt()
    }
}

/// Spearman's rank correlation of `values` with their order (the sweep's, ascending): 1 when
/// they rise at every step, -1 when they fall at every step, 0 when all are equal.
pub fn spearman(values: &[f64]) -> f64 {
    let order: Vec<f64> = (1..=values.len()).map(|i| i as f64).collect();
    correlation(&order, &ranks(values))
}

/// The outcome of [`permutation_test`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrendTest {
    /// Spearman's rank correlation of the pooled runs with the sweep (each run ranked at its
    /// point's place, ties as midranks).
    pub correlation: f64,
    /// One-sided p-value of a rising trend: the estimated share of rearrangements whose
    /// correlation is at least the measured one.
    pub p_rising: f64,
    /// One-sided p-value of a falling trend (at most the measured correlation).
    pub p_falling: f64,
    /// Runs in all.
    pub runs: usize,
}

/// Fewest runs a point needs for the test (one run says nothing of its point's spread, but a
/// rearrangement test holds its level with any number; two keep a lone run from deciding).
pub const MIN_RUNS: usize = 2;

/// Tests the runs of each sweep point (in sweep order) for a trend; `None` with fewer than
/// three points, a point with fewer than [`MIN_RUNS`] finite runs, or a non-finite run.
pub fn permutation_test(points: &[Vec<f64>]) -> Option<TrendTest> {
    if points.len() < 3
        || points
            .iter()
            .any(|p| p.len() < MIN_RUNS || p.iter().any(|v| !v.is_finite()))
    {
        return None;
    }
    let values: Vec<f64> = points.iter().flatten().copied().collect();
    // Each run's place in the sweep, as midranks of its point's index.
    let place: Vec<f64> = ranks(
        &points
            .iter()
            .enumerate()
            .flat_map(|(i, p)| std::iter::repeat_n(i as f64, p.len()))
            .collect::<Vec<f64>>(),
    );
    let mut shuffled = ranks(&values);
    let correlation = self::correlation(&place, &shuffled);
    // With both margins fixed, the correlation is an increasing function of this sum.
    let statistic = |r: &[f64]| place.iter().zip(r).map(|(x, y)| x * y).sum::<f64>();
    let measured = statistic(&shuffled);
    // Sums equal up to rounding count as equal (ties of the statistic count as extreme).
    let slack = 1e-9 * measured.abs().max(1.0);
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(SEED);
    let (mut at_least, mut at_most) = (0usize, 0usize);
    for _ in 0..PERMUTATIONS {
        for i in (1..shuffled.len()).rev() {
            shuffled.swap(i, rng.gen_range(0..=i));
        }
        let s = statistic(&shuffled);
        at_least += usize::from(s >= measured - slack);
        at_most += usize::from(s <= measured + slack);
    }
    let p = |count: usize| (1 + count) as f64 / (1 + PERMUTATIONS) as f64;
    Some(TrendTest {
        correlation,
        p_rising: p(at_least),
        p_falling: p(at_most),
        runs: values.len(),
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
    fn a_clear_rise_is_found_and_noise_is_not() {
        let clear: Vec<Vec<f64>> = [1.0, 2.0, 3.0, 4.0]
            .iter()
            .map(|level| vec![level - 0.1, *level, level + 0.1])
            .collect();
        let t = permutation_test(&clear).expect("a test");
        assert!(t.correlation > 0.9, "{t:?}");
        assert!(t.p_rising <= ALPHA && t.p_falling > 0.5, "{t:?}");
        // Exactly one arrangement of 12 runs in 4 groups of 3 (of 369,600) is as extreme: the
        // estimate is the smallest it can be.
        assert_eq!(t.p_rising, 1.0 / (1 + PERMUTATIONS) as f64);
        // The same runs at every point: no trend either way.
        let flat: Vec<Vec<f64>> = (0..4).map(|_| vec![0.9, 1.0, 1.1, 0.95, 1.05]).collect();
        let t = permutation_test(&flat).expect("a test");
        assert!(t.p_rising > 0.4 && t.p_falling > 0.4, "{t:?}");
        assert_eq!(t.correlation, 0.0);
        // Too few points or runs: no test.
        assert!(permutation_test(&clear[..2]).is_none());
        assert!(permutation_test(&[vec![1.0], vec![2.0], vec![3.0]]).is_none());
    }
}
