//! One cell of a check judged: the compared number (A, or A over B), its confidence interval
//! from [`crate::interval`] (the method follows the statistic and whether the runs are paired),
//! whether the runs are deterministic, the cell's outcome, and whether the cell is closer to its
//! threshold than its interval is wide. Pure; the words around it are [`super::evaluate`]'s.

use crate::interval::{self, Interval, Ratio};
use crate::markdown::number;
use crate::stats;

use super::model::{Criterion, Stat};

/// How an operand's repetitions are summarised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Summary {
    Stat(Stat),
    /// The mean of 0/1 indicators: a share.
    Share,
}

/// A summarised measurement of one operand, with how it was counted when that helps a reader.
pub(super) struct Measured {
    pub value: f64,
    /// E.g. "4/5 runs" for a share.
    pub detail: Option<String>,
    /// The repetitions the value summarises, each with its run's seed when it has one (a gain
    /// of splitting is already a pair of runs and has none).
    pub samples: Vec<(Option<u64>, f64)>,
    /// How `samples` are summarised into `value`.
    pub summary: Summary,
}

impl Measured {
    fn values(&self) -> Vec<f64> {
        self.samples.iter().map(|(_, v)| *v).collect()
    }
}

/// The number a cell compares with the check, and what stands behind it.
pub(super) struct Compared {
    /// A, or A / B: the ratio of the summaries, except for paired medians, where it is the
    /// median of the per-pair ratios (the statistic whose interval is exact).
    pub value: f64,
    /// Its interval, or why there is none.
    pub interval: Result<Interval, String>,
    /// Whether the runs of A and B were paired by seed.
    pub paired: bool,
    /// Whether every side's runs agree to within [`interval::DETERMINISTIC_SPREAD`].
    pub deterministic: bool,
    /// Runs behind the interval: pairs, or the smaller side's runs.
    pub runs: usize,
}

/// The pairs `(a, b)` of runs with the same seed, when both sides were measured with the same
/// set of distinct seeds (cases at one point); `None` otherwise.
pub(super) fn pairs_by_seed(a: &Measured, b: &Measured) -> Option<Vec<(f64, f64)>> {
    let seeds = |m: &Measured| -> Option<Vec<u64>> {
        let mut seeds: Vec<u64> = m.samples.iter().map(|(s, _)| *s).collect::<Option<_>>()?;
        seeds.sort_unstable();
        let before = seeds.len();
        seeds.dedup();
        (seeds.len() == before).then_some(seeds)
    };
    if seeds(a)? != seeds(b)? {
        return None;
    }
    Some(
        a.samples
            .iter()
            .filter_map(|(seed, va)| {
                let vb = b.samples.iter().find(|(s, _)| s == seed)?.1;
                Some((*va, vb))
            })
            .collect(),
    )
}

/// A's summary, or A's over B's, with its interval: runs paired by seed when both sides were
/// measured with the same seeds, else two independent samples.
pub(super) fn compare(a: &Measured, b: Option<&Measured>) -> Compared {
    let (va, text) = (a.values(), |e: interval::NoInterval| e.text());
    let Some(b) = b else {
        let interval = match a.summary {
            Summary::Stat(Stat::Median) => interval::median_interval(&va),
            Summary::Stat(Stat::Mean) => interval::mean_interval(&va),
            Summary::Share => {
                let successes = va.iter().filter(|v| **v > 0.0).count();
                interval::share_interval(successes, va.len())
            }
        };
        return Compared {
            value: a.value,
            interval: interval.map_err(text),
            paired: false,
            // A share's runs are 0 or 1: all alike says nothing about the emulator.
            deterministic: a.summary != Summary::Share && interval::is_deterministic(&va),
            runs: va.len(),
        };
    };
    let vb = b.values();
    let deterministic = interval::is_deterministic(&va) && interval::is_deterministic(&vb);
    let ratio = a.value / b.value;
    let unpaired = |interval: Result<Interval, String>| Compared {
        value: ratio,
        interval,
        paired: false,
        deterministic,
        runs: va.len().min(vb.len()),
    };
    match (a.summary, b.summary, pairs_by_seed(a, b)) {
        (Summary::Share, _, _) | (_, Summary::Share, _) => {
            unpaired(Err("no interval for a ratio of shares".to_string()))
        }
        (sa, sb, _) if sa != sb => unpaired(Err("A and B summarised differently".to_string())),
        (Summary::Stat(Stat::Median), _, Some(pairs)) => {
            let ratios = interval::paired_ratios(&pairs);
            Compared {
                value: stats::median(&ratios).unwrap_or(f64::NAN),
                interval: interval::median_interval(&ratios).map_err(text),
                paired: true,
                deterministic,
                runs: ratios.len(),
            }
        }
        (Summary::Stat(Stat::Mean), _, Some(pairs)) => Compared {
            value: ratio,
            interval: interval::ratio_of_means_interval(Ratio::Paired(&pairs)).map_err(text),
            paired: true,
            deterministic,
            runs: pairs.len(),
        },
        (Summary::Stat(Stat::Median), _, None) => {
            unpaired(interval::ratio_of_medians_interval(&va, &vb).map_err(text))
        }
        (Summary::Stat(Stat::Mean), _, None) => {
            unpaired(interval::ratio_of_means_interval(Ratio::Independent(&va, &vb)).map_err(text))
        }
    }
}

/// How one cell of a check came out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum PointOutcome {
    Holds,
    Fails,
    Unsure,
}

/// The cell's outcome: it holds when the number and its whole interval are accepted, fails when
/// the whole interval is rejected, and is unsure otherwise (or without an interval, or with one
/// below [`interval::MIN_VERDICT_LEVEL`] unless the runs are deterministic: the level counts the
/// chance of a sampling spread fooling the verdict, and repeated runs have none to sample).
pub(super) fn judge(criterion: Criterion, compared: &Compared) -> PointOutcome {
    match compared.interval {
        Ok(i) if i.level < interval::MIN_VERDICT_LEVEL && !compared.deterministic => {
            PointOutcome::Unsure
        }
        Ok(i)
            if compared.value.is_finite()
                && criterion.accepts(compared.value)
                && criterion.accepts_all(i.low, i.high) =>
        {
            PointOutcome::Holds
        }
        Ok(i) if criterion.rejects_all(i.low, i.high) => PointOutcome::Fails,
        _ => PointOutcome::Unsure,
    }
}

/// "93.8 % interval 0.91..1.20 (5 paired runs)", "runs deterministic (...)", or why there is no
/// interval. The run counts let a reader see a cell measured fewer than 5 times.
pub(super) fn interval_text(compared: &Compared, a: &Measured, b: Option<&Measured>) -> String {
    let runs = match (compared.paired, b) {
        (true, _) => format!("{} paired runs", compared.runs),
        (false, Some(b)) => format!("{} and {} runs", a.samples.len(), b.samples.len()),
        (false, None) => format!("{} runs", a.samples.len()),
    };
    match &compared.interval {
        Ok(i) if compared.deterministic => format!(
            "runs deterministic ({runs} within {} %, interval {}..{})",
            interval::DETERMINISTIC_SPREAD * 100.0,
            number(i.low),
            number(i.high),
        ),
        Ok(i) => format!(
            "{} {}..{} ({runs})",
            i.label(),
            number(i.low),
            number(i.high)
        ),
        Err(why) => format!("no interval ({why})"),
    }
}

/// How far `x` is from the edge of the accepted range (inside or out).
pub(super) fn distance(criterion: Criterion, x: f64) -> f64 {
    match criterion {
        Criterion::Above { bound, .. } | Criterion::Below { bound, .. } => (x - bound).abs(),
        Criterion::Within { low, high } => (x - low).abs().min((x - high).abs()),
    }
}

/// A cell whose number lies nearer the check's threshold than its interval is wide: its verdict
/// turns on less than the runs' own uncertainty.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CloseCall {
    /// The cell's label ("proxy median throughput @ 1 / direct ...").
    pub cell: String,
    pub runs: usize,
    pub distance: f64,
    pub width: f64,
    /// Runs that would shrink the width below the distance ([`interval::runs_needed`]); `None`
    /// when the number sits on the threshold.
    pub runs_needed: Option<usize>,
}

/// The cell as a [`CloseCall`] when its distance from the threshold is below its interval's
/// width and its outcome is unsure. A cell whose whole interval already clears or misses the
/// threshold is decided, however near the number is (the interval counts the runs' spread);
/// deterministic runs are left out too, as more of them would repeat the same number.
pub(super) fn close_call(
    criterion: Criterion,
    compared: &Compared,
    outcome: PointOutcome,
    cell: &str,
) -> Option<CloseCall> {
    let interval = compared.interval.as_ref().ok()?;
    let distance = distance(criterion, compared.value);
    let width = interval.width();
    let turns = outcome == PointOutcome::Unsure && distance < width;
    (turns && !compared.deterministic).then(|| CloseCall {
        cell: cell.to_string(),
        runs: compared.runs,
        distance,
        width,
        runs_needed: interval::runs_needed(compared.runs, width, distance),
    })
}
