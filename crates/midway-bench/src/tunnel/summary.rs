//! The tunnel benchmark's figures over its rounds (medians, ranges, the ratio to the `tcp`
//! transport paired within each round) and its markdown. Pure: no I/O, no clock.

use std::fmt::Write as _;

use serde::Serialize;

use super::{TunnelReport, TunnelRun};
use crate::summary::{median, Spread};

/// The targets the report compares with (it reports, it does not judge the run).
const QUIC_TARGET_STREAMS: usize = 100;
const QUIC_TARGET_BITS_PER_SECOND: f64 = 1e9;
const QUIC_TARGET_CPU_RATIO: f64 = 4.0;
const TLS_TARGET_CPU_RATIO: f64 = 1.5;

/// Sets each successful run's `ratio_to_tcp`: its total CPU-s/GB over that of the successful
/// `tcp` run with the same round and stream count (`None` without one).
pub(crate) fn fill_ratios_to_tcp(runs: &mut [TunnelRun]) {
    let tcp: Vec<(u32, usize, f64)> = runs
        .iter()
        .filter(|r| r.transport == "tcp" && r.error.is_none())
        .filter_map(|r| Some((r.round, r.streams, r.total_cpu_seconds_per_gb?)))
        .collect();
    for run in runs.iter_mut() {
        run.ratio_to_tcp = None;
        let Some(own) = run.total_cpu_seconds_per_gb.filter(|_| run.error.is_none()) else {
            continue;
        };
        let partner = tcp
            .iter()
            .find(|(round, streams, _)| *round == run.round && *streams == run.streams);
        if let Some(&(_, _, base)) = partner {
            if base > 0.0 {
                run.ratio_to_tcp = Some(own / base);
            }
        }
    }
}

/// Figures of one (transport, stream count) over all rounds: medians of the successful runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TunnelSummary {
    /// Name of the transport.
    pub transport: &'static str,
    /// Parallel iperf3 streams.
    pub streams: usize,
    /// Runs that produced figures.
    pub rounds_ok: usize,
    /// Runs that failed (their messages in `errors`).
    pub rounds_failed: usize,
    /// Throughput of all streams together, bit/s.
    pub bits_per_second: Option<Spread>,
    /// The edge's user CPU seconds per GB.
    pub edge_user_seconds_per_gb: Option<f64>,
    /// The edge's system CPU seconds per GB.
    pub edge_system_seconds_per_gb: Option<f64>,
    /// The edge's CPU seconds (user + system) per GB.
    pub edge_cpu_seconds_per_gb: Option<f64>,
    /// The gateway's user CPU seconds per GB.
    pub gateway_user_seconds_per_gb: Option<f64>,
    /// The gateway's system CPU seconds per GB.
    pub gateway_system_seconds_per_gb: Option<f64>,
    /// The gateway's CPU seconds (user + system) per GB.
    pub gateway_cpu_seconds_per_gb: Option<f64>,
    /// Both midways' CPU seconds per GB.
    pub total_cpu_seconds_per_gb: Option<f64>,
    /// Median over the rounds of the total CPU-s/GB over the `tcp` transport's in that round.
    pub ratio_to_tcp: Option<f64>,
    /// The whole machine's busy CPU seconds per GB.
    pub machine_cpu_seconds_per_gb: Option<f64>,
    /// "round N: message" for each failed run.
    pub errors: Vec<String>,
}

/// One summary per (transport, stream count), in the order the pairs first appear. Reads
/// `ratio_to_tcp` as [`fill_ratios_to_tcp`] set it.
pub(crate) fn summarize(runs: &[TunnelRun]) -> Vec<TunnelSummary> {
    let mut keys: Vec<(&'static str, usize)> = Vec::new();
    for run in runs {
        if !keys.contains(&(run.transport, run.streams)) {
            keys.push((run.transport, run.streams));
        }
    }
    keys.into_iter()
        .map(|(transport, streams)| {
            let group: Vec<&TunnelRun> = runs
                .iter()
                .filter(|r| r.transport == transport && r.streams == streams)
                .collect();
            let ok: Vec<&TunnelRun> = group
                .iter()
                .copied()
                .filter(|r| r.error.is_none())
                .collect();
            let med = |pick: &dyn Fn(&TunnelRun) -> Option<f64>| -> Option<f64> {
                median(&ok.iter().filter_map(|r| pick(r)).collect::<Vec<f64>>())
            };
            let throughput: Vec<f64> = ok.iter().map(|r| r.bits_per_second).collect();
            TunnelSummary {
                transport,
                streams,
                rounds_ok: ok.len(),
                rounds_failed: group.len() - ok.len(),
                bits_per_second: Spread::of(&throughput),
                edge_user_seconds_per_gb: med(&|r| r.edge_cpu.map(|c| c.user_seconds_per_gb)),
                edge_system_seconds_per_gb: med(&|r| r.edge_cpu.map(|c| c.system_seconds_per_gb)),
                edge_cpu_seconds_per_gb: med(&|r| r.edge_cpu.map(|c| c.cpu_seconds_per_gb)),
                gateway_user_seconds_per_gb: med(&|r| r.gateway_cpu.map(|c| c.user_seconds_per_gb)),
                gateway_system_seconds_per_gb: med(&|r| {
                    r.gateway_cpu.map(|c| c.system_seconds_per_gb)
                }),
                gateway_cpu_seconds_per_gb: med(&|r| r.gateway_cpu.map(|c| c.cpu_seconds_per_gb)),
                total_cpu_seconds_per_gb: med(&|r| r.total_cpu_seconds_per_gb),
                ratio_to_tcp: med(&|r| r.ratio_to_tcp),
                machine_cpu_seconds_per_gb: med(&|r| r.machine_cpu_seconds_per_gb),
                errors: group
                    .iter()
                    .filter_map(|r| r.error.as_ref().map(|e| format!("round {}: {e}", r.round)))
                    .collect(),
            }
        })
        .collect()
}

fn figure(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.2}"))
}

/// "total (user u + system s)" of one midway.
fn split(total: Option<f64>, user: Option<f64>, system: Option<f64>) -> String {
    match total {
        Some(total) => format!("{total:.2} ({} u + {} s)", figure(user), figure(system)),
        None => "-".into(),
    }
}

/// The report as markdown: a header line, the table, the failed runs, and the targets
/// beside the measured figures.
pub fn render_tunnel_markdown(report: &TunnelReport) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "kernel {}, {} CPUs, {} s per run, {} round(s), both midways at nice {}, profile `{}` on \
         every TCP segment",
        report.kernel,
        report.cpus,
        report.seconds_per_run,
        report.rounds,
        report.proxy_nice,
        report.midway_profile
    );
    if let Some(threads) = report.proxy_threads {
        let _ = write!(out, ", {threads} worker thread(s) per midway");
    }
    if report.quic_connections > 1 {
        let _ = write!(
            out,
            ", {} QUIC connections in the tunnel",
            report.quic_connections
        );
    }
    let _ = writeln!(
        out,
        ". Throughput as median (min-max) over the rounds; CPU-s/GB are medians of CPU seconds \
         per 10^9 bytes moved, per midway as total (user u + system s); the ratio is both \
         midways' CPU-s/GB over the tcp transport's, paired within each round.\n"
    );
    let _ = writeln!(
        out,
        "| transport | streams | rounds | Gbit/s | edge CPU-s/GB | gateway CPU-s/GB | total \
         CPU-s/GB | ratio to tcp | machine CPU-s/GB |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in &report.summary {
        let total = s.rounds_ok + s.rounds_failed;
        let rounds = if s.rounds_failed == 0 {
            total.to_string()
        } else {
            format!("{} of {total}", s.rounds_ok)
        };
        let Some(throughput) = s.bits_per_second else {
            // The first line only: the rest (a quoted log) is in the JSON report.
            let error = s.errors.first().and_then(|e| e.lines().next());
            let _ = writeln!(
                out,
                "| {} | {} | {rounds} | failed: {} | | | | | |",
                s.transport,
                s.streams,
                error.unwrap_or("")
            );
            continue;
        };
        let gbit = if s.rounds_ok > 1 {
            format!(
                "{:.2} ({:.2}-{:.2})",
                throughput.median / 1e9,
                throughput.min / 1e9,
                throughput.max / 1e9
            )
        } else {
            format!("{:.2}", throughput.median / 1e9)
        };
        let _ = writeln!(
            out,
            "| {} | {} | {rounds} | {gbit} | {} | {} | {} | {} | {} |",
            s.transport,
            s.streams,
            split(
                s.edge_cpu_seconds_per_gb,
                s.edge_user_seconds_per_gb,
                s.edge_system_seconds_per_gb
            ),
            split(
                s.gateway_cpu_seconds_per_gb,
                s.gateway_user_seconds_per_gb,
                s.gateway_system_seconds_per_gb
            ),
            figure(s.total_cpu_seconds_per_gb),
            figure(s.ratio_to_tcp),
            figure(s.machine_cpu_seconds_per_gb),
        );
    }
    let failures: Vec<String> = report
        .summary
        .iter()
        .filter(|s| s.rounds_ok > 0)
        .flat_map(|s| {
            s.errors.iter().map(move |e| {
                let first = e.lines().next().unwrap_or("");
                format!("- {} {} streams, {first}", s.transport, s.streams)
            })
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(out, "\nFailed runs (left out of the figures above):");
        for line in failures {
            let _ = writeln!(out, "{line}");
        }
    }
    out.push_str(&render_targets(&report.summary));
    out
}

/// The targets beside the medians: QUIC at least 1 Gbit/s at 100 streams at no more than
/// 4x the tcp transport's CPU-s/GB; TLS within 1.5x the tcp transport's CPU-s/GB.
fn render_targets(summary: &[TunnelSummary]) -> String {
    let mut lines = Vec::new();
    let verdict = |met: bool| if met { "met" } else { "not met" };
    for s in summary {
        match s.transport {
            "quic" if s.streams == QUIC_TARGET_STREAMS => {
                if let (Some(bps), Some(ratio)) = (s.bits_per_second, s.ratio_to_tcp) {
                    let met =
                        bps.median >= QUIC_TARGET_BITS_PER_SECOND && ratio <= QUIC_TARGET_CPU_RATIO;
                    lines.push(format!(
                        "- quic, {} streams: {:.2} Gbit/s (target at least {:.0}), {ratio:.2}x \
                         the tcp transport's CPU-s/GB (target at most {QUIC_TARGET_CPU_RATIO}): {}",
                        s.streams,
                        bps.median / 1e9,
                        QUIC_TARGET_BITS_PER_SECOND / 1e9,
                        verdict(met)
                    ));
                }
            }
            "tls" => {
                if let Some(ratio) = s.ratio_to_tcp {
                    lines.push(format!(
                        "- tls, {} streams: {ratio:.2}x the tcp transport's CPU-s/GB (target at \
                         most {TLS_TARGET_CPU_RATIO}): {}",
                        s.streams,
                        verdict(ratio <= TLS_TARGET_CPU_RATIO)
                    ));
                }
            }
            _ => {}
        }
    }
    if lines.is_empty() {
        return String::new();
    }
    format!(
        "\nAgainst issue 30's targets (medians of this run):\n{}\n",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tunnel::MidwayCpu;

    fn cpu(per_gb: f64) -> MidwayCpu {
        MidwayCpu {
            user_seconds: per_gb / 2.0,
            system_seconds: per_gb / 2.0,
            user_seconds_per_gb: per_gb / 2.0,
            system_seconds_per_gb: per_gb / 2.0,
            cpu_seconds_per_gb: per_gb,
        }
    }

    fn run(
        transport: &'static str,
        round: u32,
        streams: usize,
        gbit: f64,
        cpu_gb: f64,
    ) -> TunnelRun {
        TunnelRun {
            round,
            transport,
            streams,
            bits_per_second: gbit * 1e9,
            bytes: 1_000_000_000,
            edge_cpu: Some(cpu(cpu_gb / 2.0)),
            gateway_cpu: Some(cpu(cpu_gb / 2.0)),
            total_cpu_seconds_per_gb: Some(cpu_gb),
            ratio_to_tcp: None,
            machine_cpu_seconds_per_gb: Some(cpu_gb * 2.0),
            error: None,
        }
    }

    fn report(runs: Vec<TunnelRun>) -> TunnelReport {
        let mut runs = runs;
        fill_ratios_to_tcp(&mut runs);
        TunnelReport {
            kernel: "6.1".into(),
            cpus: 2,
            seconds_per_run: 10,
            rounds: 2,
            proxy_nice: -10,
            proxy_threads: None,
            quic_connections: 1,
            midway_profile: "lan".into(),
            summary: summarize(&runs),
            runs,
        }
    }

    #[test]
    fn ratios_pair_runs_of_the_same_round_and_streams() {
        let mut runs = vec![
            run("tcp", 1, 100, 5.0, 1.0),
            run("quic", 1, 100, 1.5, 3.0),
            run("tcp", 2, 100, 5.0, 2.0),
            run("quic", 2, 100, 1.5, 3.0),
            run("tls", 2, 1, 1.5, 3.0),
        ];
        fill_ratios_to_tcp(&mut runs);
        let ratios: Vec<Option<f64>> = runs.iter().map(|r| r.ratio_to_tcp).collect();
        assert_eq!(
            ratios,
            vec![Some(1.0), Some(3.0), Some(1.0), Some(1.5), None]
        );
        let summary = summarize(&runs);
        let quic = summary.iter().find(|s| s.transport == "quic").unwrap();
        assert_eq!(quic.ratio_to_tcp, Some(2.25));
        assert_eq!(quic.rounds_ok, 2);
    }

    #[test]
    fn the_table_shows_the_split_the_ratio_and_the_targets() {
        let mut failed = run("quic", 2, 100, 0.0, 0.0);
        failed.error = Some("tunnel\ndown".into());
        failed.total_cpu_seconds_per_gb = None;
        let out = render_tunnel_markdown(&report(vec![
            run("tcp", 1, 100, 5.0, 1.0),
            run("tls", 1, 100, 4.0, 1.2),
            run("quic", 1, 100, 1.5, 3.0),
            run("tcp", 2, 100, 6.0, 1.0),
            run("tls", 2, 100, 4.0, 1.6),
            failed,
        ]));
        assert!(
            out.contains(
                "| tls | 100 | 2 | 4.00 (4.00-4.00) | 0.70 (0.35 u + 0.35 s) | \
                 0.70 (0.35 u + 0.35 s) | 1.40 | 1.40 | 2.80 |"
            ),
            "{out}"
        );
        assert!(out.contains("| quic | 100 | 1 of 2 | 1.50 |"), "{out}");
        assert!(
            out.contains("- quic 100 streams, round 2: tunnel\n"),
            "{out}"
        );
        assert!(
            out.contains("- quic, 100 streams: 1.50 Gbit/s (target at least 1), 3.00x"),
            "{out}"
        );
        assert!(out.contains("(target at most 1.5): met"), "{out}");
    }

    #[test]
    fn a_transport_that_never_ran_shows_its_first_error() {
        let mut failed = run("tls", 1, 1, 0.0, 0.0);
        failed.error = Some("no tunnel".into());
        let out = render_tunnel_markdown(&report(vec![failed]));
        assert!(
            out.contains("| tls | 1 | 0 of 1 | failed: round 1: no tunnel |"),
            "{out}"
        );
        assert!(!out.contains("targets"), "{out}");
    }
}
