//! Aggregation of repeated throughput runs: medians, ranges and the ratio to `direct`.
//!
//! One run on a small VM varies by about ±10 % from the next, so the bench can repeat the
//! throughput part in rounds and report the median with its range. The ratio to `direct` is
//! taken within each round (the case's figure over direct's figure of the same round and stream
//! count) before the median, so slow drift of the machine cancels out of the ratio. Everything
//! here is pure: no I/O, no clock.

use serde::Serialize;

use crate::{Case, ThroughputRun};

/// The median of `values` (the mean of the two middle values for an even count; non-finite
/// values ignored): the lab report's definition, so bench and lab figures mean the same thing.
pub(crate) use midway_report::stats::median;

/// Median, smallest and largest of a set of figures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// Median of the figures (mean of the two middle ones for an even count).
    pub median: f64,
    /// Smallest figure.
    pub min: f64,
    /// Largest figure.
    pub max: f64,
}

impl Spread {
    /// `None` for no values.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let median = median(values)?;
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Spread { median, min, max })
    }
}

/// One figure of one case over the rounds (connection rate, idle memory).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseSpread {
    /// Name of the case ([`Case::name`]).
    pub case: &'static str,
    /// Rounds that measured it.
    pub rounds: usize,
    /// Median, smallest and largest over those rounds.
    pub spread: Spread,
}

/// The cases of `rows`, in the order they first appear.
pub(crate) fn cases_in_order<T>(
    rows: &[T],
    case: impl Fn(&T) -> &'static str,
) -> Vec<&'static str> {
    let mut cases: Vec<&'static str> = Vec::new();
    for row in rows {
        if !cases.contains(&case(row)) {
            cases.push(case(row));
        }
    }
    cases
}

/// Per case, in the order the cases first appear in `rows`, the spread of `value` over its
/// rows (one per round); rows without a value are left out, and a case with none has no spread.
pub(crate) fn spread_by_case<T>(
    rows: &[T],
    case: impl Fn(&T) -> &'static str,
    value: impl Fn(&T) -> Option<f64>,
) -> Vec<CaseSpread> {
    cases_in_order(rows, &case)
        .into_iter()
        .filter_map(|name| {
            let values: Vec<f64> = rows
                .iter()
                .filter(|r| case(r) == name)
                .filter_map(&value)
                .collect();
            Spread::of(&values).map(|spread| CaseSpread {
                case: name,
                rounds: values.len(),
                spread,
            })
        })
        .collect()
}

/// Sets each successful run's `ratio_to_direct` to its throughput over the throughput of the
/// successful `direct` run with the same round and stream count. Runs without such a partner
/// (direct failed or was not run in that round) keep `None`, as do failed runs.
pub(crate) fn fill_ratios_within_rounds(runs: &mut [ThroughputRun]) {
    let direct: Vec<(u32, usize, f64)> = runs
        .iter()
        .filter(|r| r.case == Case::Direct.name() && r.error.is_none())
        .map(|r| (r.round, r.streams, r.bits_per_second))
        .collect();
    for run in runs.iter_mut() {
        run.ratio_to_direct = None;
        if run.error.is_some() {
            continue;
        }
        let partner = direct
            .iter()
            .find(|(round, streams, _)| *round == run.round && *streams == run.streams);
        if let Some(&(_, _, base)) = partner {
            if base > 0.0 {
                run.ratio_to_direct = Some(run.bits_per_second / base);
            }
        }
    }
}

/// Figures of one (case, stream count) over all rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThroughputSummary {
    /// Name of the case ([`Case::name`]).
    pub case: &'static str,
    /// Parallel iperf3 streams.
    pub streams: usize,
    /// Runs that produced figures.
    pub rounds_ok: usize,
    /// Runs that failed; their messages are in `errors` and in the report's `runs`.
    pub rounds_failed: usize,
    /// Total throughput of the successful runs, in bit/s.
    pub bits_per_second: Option<Spread>,
    /// Median over the rounds of this case's throughput over direct's in the same round.
    pub ratio_to_direct_median: Option<f64>,
    /// How many rounds had a successful run of both this case and direct.
    pub ratio_rounds: usize,
    /// Median over the successful runs of the proxy's CPU seconds per 10^9 bytes moved.
    pub proxy_cpu_seconds_per_gb_median: Option<f64>,
    /// Median over the successful runs of the whole machine's busy CPU seconds per 10^9 bytes moved.
    pub machine_cpu_seconds_per_gb_median: Option<f64>,
    /// The highest peak of kernel TCP memory over the successful runs.
    pub peak_tcp_memory_bytes_max: Option<u64>,
    /// The kernel's TCP memory pressure threshold (`tcp_mem[1]`), bytes; the largest over the successful runs.
    pub tcp_memory_pressure_bytes: Option<u64>,
    /// "round N: message" for each failed run.
    pub errors: Vec<String>,
}

/// One summary per (case, stream count), in the order the pairs first appear in `runs`. Reads
/// `ratio_to_direct` as set by [`fill_ratios_within_rounds`].
pub(crate) fn summarize(runs: &[ThroughputRun]) -> Vec<ThroughputSummary> {
    let mut keys: Vec<(&'static str, usize)> = Vec::new();
    for run in runs {
        if !keys.contains(&(run.case, run.streams)) {
            keys.push((run.case, run.streams));
        }
    }
    keys.into_iter()
        .map(|(case, streams)| {
            let group: Vec<&ThroughputRun> = runs
                .iter()
                .filter(|r| r.case == case && r.streams == streams)
                .collect();
            summarize_group(case, streams, &group)
        })
        .collect()
}

fn summarize_group(
    case: &'static str,
    streams: usize,
    group: &[&ThroughputRun],
) -> ThroughputSummary {
    let ok: Vec<&ThroughputRun> = group
        .iter()
        .copied()
        .filter(|r| r.error.is_none())
        .collect();
    let errors: Vec<String> = group
        .iter()
        .filter_map(|r| r.error.as_ref().map(|e| format!("round {}: {e}", r.round)))
        .collect();
    let figures = |pick: fn(&ThroughputRun) -> Option<f64>| -> Vec<f64> {
        ok.iter().filter_map(|r| pick(r)).collect()
    };
    let bits_per_second = figures(|r| Some(r.bits_per_second));
    let ratios = figures(|r| r.ratio_to_direct);
    ThroughputSummary {
        case,
        streams,
        rounds_ok: ok.len(),
        rounds_failed: errors.len(),
        bits_per_second: Spread::of(&bits_per_second),
        ratio_to_direct_median: median(&ratios),
        ratio_rounds: ratios.len(),
        proxy_cpu_seconds_per_gb_median: median(&figures(|r| r.proxy_cpu_seconds_per_gb)),
        machine_cpu_seconds_per_gb_median: median(&figures(|r| r.machine_cpu_seconds_per_gb)),
        peak_tcp_memory_bytes_max: ok.iter().map(|r| r.peak_tcp_memory_bytes).max(),
        tcp_memory_pressure_bytes: ok.iter().map(|r| r.tcp_memory_pressure_bytes).max(),
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(case: Case, round: u32, streams: usize, gbit: f64) -> ThroughputRun {
        ThroughputRun {
            round,
            case: case.name(),
            streams,
            bits_per_second: gbit * 1e9,
            ratio_to_direct: None,
            bytes: (gbit * 1e9 / 8.0) as u64,
            proxy_cpu_seconds: None,
            proxy_cpu_seconds_per_gb: None,
            machine_cpu_seconds_per_gb: Some(gbit / 10.0),
            peak_tcp_memory_bytes: (gbit * 1e6) as u64,
            tcp_memory_pressure_bytes: 1_500_000_000,
            error: None,
        }
    }

    #[test]
    fn per_round_figures_give_each_case_its_median_and_range_in_first_seen_order() {
        let rows = [
            ("midway-forward", 6000.0),
            ("haproxy", 7000.0),
            ("midway-forward", 6600.0),
            ("haproxy", 7400.0),
            ("midway-forward", 6300.0),
            ("direct", f64::NAN),
        ];
        // A row without the figure (direct has no proxy memory) is left out, and so is a case
        // that has none.
        let spreads = spread_by_case(&rows, |r| r.0, |r| (!r.1.is_nan()).then_some(r.1));
        assert_eq!(spreads.len(), 2);
        assert_eq!(spreads[0].case, "midway-forward");
        assert_eq!(spreads[0].rounds, 3);
        assert_eq!(
            spreads[0].spread,
            Spread {
                median: 6300.0,
                min: 6000.0,
                max: 6600.0
            }
        );
        assert_eq!(spreads[1].case, "haproxy");
        assert_eq!(spreads[1].spread.median, 7200.0);
    }

    fn failed(case: Case, round: u32, streams: usize) -> ThroughputRun {
        ThroughputRun {
            bits_per_second: 0.0,
            machine_cpu_seconds_per_gb: None,
            peak_tcp_memory_bytes: 0,
            tcp_memory_pressure_bytes: 0,
            error: Some("iperf3 went away".into()),
            ..run(case, round, streams, 0.0)
        }
    }

    #[test]
    fn median_of_odd_count_is_the_middle_value() {
        assert_eq!(median(&[13.0, 11.2, 12.0, 11.6, 11.3]), Some(11.6));
        assert_eq!(median(&[4.0]), Some(4.0));
    }

    #[test]
    fn median_of_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[5.0, 7.0]), Some(6.0));
    }

    #[test]
    fn median_of_nothing_is_none() {
        assert_eq!(median(&[]), None);
        assert_eq!(Spread::of(&[]), None);
    }

    #[test]
    fn spread_has_median_min_and_max() {
        let spread = Spread::of(&[12.0, 11.2, 13.0]).unwrap();
        assert_eq!(
            spread,
            Spread {
                median: 12.0,
                min: 11.2,
                max: 13.0
            }
        );
    }

    #[test]
    fn ratio_pairs_each_run_with_direct_of_the_same_round_and_streams() {
        let mut runs = vec![
            run(Case::Direct, 1, 1, 10.0),
            run(Case::Direct, 1, 100, 20.0),
            run(Case::MidwayForward, 1, 1, 8.0),
            run(Case::MidwayForward, 1, 100, 10.0),
            run(Case::Direct, 2, 1, 16.0),
            run(Case::MidwayForward, 2, 1, 4.0),
        ];
        fill_ratios_within_rounds(&mut runs);
        let ratios: Vec<Option<f64>> = runs.iter().map(|r| r.ratio_to_direct).collect();
        assert_eq!(
            ratios,
            vec![
                Some(1.0),
                Some(1.0),
                Some(0.8),
                Some(0.5),
                Some(1.0),
                Some(0.25)
            ]
        );
    }

    #[test]
    fn a_round_without_direct_gives_no_ratio_and_is_left_out_of_the_median() {
        let mut runs = vec![
            run(Case::Direct, 1, 1, 10.0),
            run(Case::Haproxy, 1, 1, 5.0),
            failed(Case::Direct, 2, 1),
            run(Case::Haproxy, 2, 1, 9.0),
            run(Case::Direct, 3, 1, 10.0),
            run(Case::Haproxy, 3, 1, 7.0),
        ];
        fill_ratios_within_rounds(&mut runs);
        assert_eq!(runs[3].ratio_to_direct, None);
        let summaries = summarize(&runs);
        let haproxy = summaries.iter().find(|s| s.case == "haproxy").unwrap();
        assert_eq!(haproxy.rounds_ok, 3);
        assert_eq!(haproxy.ratio_rounds, 2);
        // Rounds 1 and 3: 0.5 and 0.7; round 2's 9 Gbit/s has no direct to compare with.
        assert!((haproxy.ratio_to_direct_median.unwrap() - 0.6).abs() < 1e-12);
        assert_eq!(haproxy.bits_per_second.unwrap().median, 7e9);
        let direct = summaries.iter().find(|s| s.case == "direct").unwrap();
        assert_eq!((direct.rounds_ok, direct.rounds_failed), (2, 1));
        assert_eq!(direct.errors, vec!["round 2: iperf3 went away".to_string()]);
    }

    #[test]
    fn a_failed_run_is_skipped_in_every_figure() {
        let mut runs = vec![
            run(Case::MidwayForward, 1, 100, 11.2),
            failed(Case::MidwayForward, 2, 100),
            run(Case::MidwayForward, 3, 100, 13.0),
            run(Case::MidwayForward, 4, 100, 12.0),
        ];
        fill_ratios_within_rounds(&mut runs);
        let summaries = summarize(&runs);
        assert_eq!(summaries.len(), 1);
        let s = &summaries[0];
        assert_eq!((s.rounds_ok, s.rounds_failed), (3, 1));
        let spread = s.bits_per_second.unwrap();
        assert_eq!(
            (spread.median, spread.min, spread.max),
            (12.0 * 1e9, 11.2 * 1e9, 13.0 * 1e9)
        );
        assert_eq!(s.machine_cpu_seconds_per_gb_median, Some(1.2));
        assert_eq!(s.peak_tcp_memory_bytes_max, Some(13_000_000));
        assert_eq!(s.ratio_to_direct_median, None);
        assert_eq!(s.proxy_cpu_seconds_per_gb_median, None);
    }

    #[test]
    fn even_number_of_rounds_takes_the_mean_of_the_middle_two() {
        let mut runs = Vec::new();
        for (round, (direct, proxy)) in [(10.0, 5.0), (10.0, 6.0), (20.0, 16.0), (10.0, 9.0)]
            .into_iter()
            .enumerate()
        {
            runs.push(run(Case::Direct, round as u32 + 1, 1, direct));
            runs.push(run(Case::HaproxySplice, round as u32 + 1, 1, proxy));
        }
        fill_ratios_within_rounds(&mut runs);
        let summaries = summarize(&runs);
        let splice = &summaries[1];
        assert_eq!(splice.case, "haproxy-splice");
        // Per-round ratios 0.5, 0.6, 0.8, 0.9: median 0.7 (not 7.5 / 10 from the medians).
        assert!((splice.ratio_to_direct_median.unwrap() - 0.7).abs() < 1e-12);
        assert_eq!(splice.bits_per_second.unwrap().median, 7.5e9);
        assert_eq!(summaries[0].bits_per_second.unwrap().median, 10e9);
    }

    #[test]
    fn summaries_follow_the_order_of_first_appearance() {
        let runs = vec![
            run(Case::Direct, 1, 1, 1.0),
            run(Case::Direct, 1, 100, 1.0),
            run(Case::Haproxy, 1, 1, 1.0),
            run(Case::Direct, 2, 1, 1.0),
            run(Case::Direct, 2, 100, 1.0),
            run(Case::Haproxy, 2, 1, 1.0),
        ];
        let keys: Vec<(&str, usize, usize)> = summarize(&runs)
            .iter()
            .map(|s| (s.case, s.streams, s.rounds_ok))
            .collect();
        assert_eq!(
            keys,
            vec![("direct", 1, 2), ("direct", 100, 2), ("haproxy", 1, 2)]
        );
    }
}
