//! Trend claims over a whole sweep ("the advantage becomes greater as T_INet increases"),
//! judged by a test whose level holds by construction: the permutation test of the rank
//! correlation of the runs with the sweep ([`crate::trend`]). A trend **agrees** when the
//! one-sided p-value of the claimed direction is at most [`ALPHA`] (2.5 %, the one-sided tail of
//! the other checks' 95 % intervals) and the compared numbers' own rank correlation with the
//! sweep has the claimed sign; it **disagrees** when the other direction's p-value is at most
//! [`ALPHA`], and is **inconclusive** otherwise. With no trend at all, each happens at most 2.5 %
//! of the time whatever the runs' distribution and number (measured on synthetic sweeps of 3-6
//! points of 3-10 runs in `tests/coverage.rs`).
//!
//! The runs of a point are the test's units: a case's runs; for A over B run in pairs (same
//! seeds), the per-pair ratios, each pair moving as one; for a gain of splitting, the paired
//! gains. A over B from unpaired runs gives no per-run number and no test (inconclusive).
//! Where every point's runs agree to within [`interval::DETERMINISTIC_SPREAD`] the runs show
//! that the emulation repeats itself, not a sampling spread, and as for the other checks the
//! verdict rests on the numbers alone: their rank correlation with the sweep agrees when it has
//! the claimed sign and disagrees otherwise (equal numbers show no trend).
//!
//! Until 2026-12-02 reports judged a trend by a seeded percentile bootstrap interval of the
//! points' rank correlation, agreeing when it lay wholly on the claimed side of zero. Its
//! coverage was never established, and on synthetic sweeps without a trend it agreed with a
//! falling one about 5 % of the time at 3 points of 3 runs, twice its one-sided 2.5 %
//! (`tests/coverage.rs` keeps a copy and checks that it does). Pure; the runs come from
//! [`super::evaluate`].

use crate::interval;
use crate::markdown::number;
use crate::trend::{permutation_test, spearman, ALPHA, MIN_RUNS, PERMUTATIONS};

use super::evaluate::Verdict;
use super::model::Criterion;

/// The runs of one sweep point behind the compared number.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum PointRuns {
    /// A alone.
    One(Vec<f64>),
    /// A over B, run in pairs (same seeds).
    Paired(Vec<(f64, f64)>),
    /// A over B, not paired.
    Independent(Vec<f64>, Vec<f64>),
}

impl PointRuns {
    /// The point's units for the test: runs, per-pair ratios, or none.
    fn units(&self) -> Option<Vec<f64>> {
        match self {
            PointRuns::One(values) => Some(values.clone()),
            PointRuns::Paired(pairs) => Some(interval::paired_ratios(pairs)),
            PointRuns::Independent(..) => None,
        }
    }
}

/// "0.0005" / "0.031" / "0.82": a p-value, to its first significant digits.
fn p_text(p: f64) -> String {
    if p < 0.01 {
        format!("{p:.4}")
    } else {
        number(p)
    }
}

/// The trend over `compared` (the compared number at each sweep point, in sweep order) and the
/// runs behind it, judged by `criterion` (above zero: rising; below: falling). Returns the text
/// after the numbers and the verdict.
pub(super) fn judge(
    compared: &[f64],
    runs: &[PointRuns],
    criterion: Criterion,
) -> (String, Verdict) {
    let falling = matches!(criterion, Criterion::Below { .. });
    let direction = if falling { "falling" } else { "rising" };
    let rho = spearman(compared);
    let head = format!(
        "Spearman's rank correlation with the sweep {} (a {direction} trend over all {} points \
         needs it {})",
        number(rho),
        compared.len(),
        criterion.text()
    );
    let units: Option<Vec<Vec<f64>>> = runs.iter().map(PointRuns::units).collect();
    let paired = runs.iter().any(|r| matches!(r, PointRuns::Paired(_)));
    let Some(test) = units.as_deref().and_then(permutation_test) else {
        let why = if units.is_none() {
            "no trend test: A and B were not run in pairs, so no run has a ratio of its own"
                .to_string()
        } else {
            format!("no trend test: fewer than {MIN_RUNS} runs at a point")
        };
        return (format!("{head}; {why}"), Verdict::Inconclusive);
    };
    let (p, p_other) = if falling {
        (test.p_falling, test.p_rising)
    } else {
        (test.p_rising, test.p_falling)
    };
    let text = format!(
        "{head}; of the {} {} with the sweep {}, permutation test ({PERMUTATIONS} seeded \
         random rearrangements of them among the points) one-sided p = {} for a {direction} \
         trend, needs p <= {ALPHA} (the test's one-sided level, which holds whatever the \
         runs' distribution)",
        test.runs,
        if paired { "per-pair ratios" } else { "runs" },
        number(test.correlation),
        p_text(p),
    );
    let deterministic = units
        .iter()
        .flatten()
        .all(|unit| interval::is_deterministic(unit));
    if deterministic {
        let verdict = if criterion.accepts(rho) {
            Verdict::Agrees
        } else {
            Verdict::Disagrees
        };
        return (
            format!(
                "{text}; runs deterministic (every point's within {} %): the verdict rests on \
                 the numbers' rank correlation alone",
                interval::DETERMINISTIC_SPREAD * 100.0
            ),
            verdict,
        );
    }
    let verdict = if p <= ALPHA && criterion.accepts(rho) {
        Verdict::Agrees
    } else if p_other <= ALPHA {
        Verdict::Disagrees
    } else {
        Verdict::Inconclusive
    };
    let text = match verdict {
        Verdict::Disagrees => format!(
            "{text}; the other way p = {} (a trend against the claim)",
            p_text(p_other)
        ),
        _ => text,
    };
    (text, verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FALLING: Criterion = Criterion::Below {
        bound: 0.0,
        strict: true,
    };

    fn one(levels: &[f64]) -> (Vec<f64>, Vec<PointRuns>) {
        let runs: Vec<PointRuns> = levels
            .iter()
            .map(|l| PointRuns::One(vec![l - 0.1, *l, l + 0.1]))
            .collect();
        (levels.to_vec(), runs)
    }

    #[test]
    fn a_clear_fall_agrees_a_clear_rise_disagrees_and_noise_is_inconclusive() {
        let (compared, runs) = one(&[4.0, 3.0, 2.0, 1.0]);
        let (text, verdict) = judge(&compared, &runs, FALLING);
        assert_eq!(verdict, Verdict::Agrees, "{text}");
        assert!(text.contains("p = 0.0005 for a falling trend"), "{text}");
        let (compared, runs) = one(&[1.0, 2.0, 3.0, 4.0]);
        let (text, verdict) = judge(&compared, &runs, FALLING);
        assert_eq!(verdict, Verdict::Disagrees, "{text}");
        let flat: Vec<PointRuns> = (0..4)
            .map(|_| PointRuns::One(vec![0.9, 1.0, 1.1, 0.95, 1.05]))
            .collect();
        let (_, verdict) = judge(&[1.0; 4], &flat, FALLING);
        assert_eq!(verdict, Verdict::Inconclusive);
    }

    #[test]
    fn pairs_are_tested_on_their_ratios_and_unpaired_runs_not_at_all() {
        // B varies far more than the ratio, which falls cleanly: the pairs' ratios show it.
        let runs: Vec<PointRuns> = [1.0, 0.9, 0.8]
            .iter()
            .map(|r| {
                PointRuns::Paired(
                    [5.0, 50.0, 500.0]
                        .iter()
                        .map(|b| (b * r * (1.0 + b / 1e4), *b))
                        .collect(),
                )
            })
            .collect();
        let (text, verdict) = judge(&[1.0, 0.9, 0.8], &runs, FALLING);
        assert_eq!(verdict, Verdict::Agrees, "{text}");
        assert!(text.contains("of the 9 per-pair ratios"), "{text}");
        let unpaired: Vec<PointRuns> = (0..3)
            .map(|i| PointRuns::Independent(vec![3.0 - i as f64; 3], vec![1.0; 3]))
            .collect();
        let (text, verdict) = judge(&[3.0, 2.0, 1.0], &unpaired, FALLING);
        assert_eq!(verdict, Verdict::Inconclusive);
        assert!(text.contains("no trend test"), "{text}");
    }
}
