//! The benchmark's report: markdown tables for the terminal and bench.md, and bench.json with
//! every run.

use std::fmt::Write as _;
use std::path::Path;

use crate::configs::MIDWAY_SHUTDOWN_GRACE;
use crate::connections::STOP_LIMIT;
use crate::summary::{self, Spread, ThroughputSummary};
use crate::{BenchReport, Case, ConnectionsRow, IdleMemoryRow};

/// The report as markdown tables.
pub fn render_markdown(report: &BenchReport) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "kernel {}, {} CPUs, {} s per throughput run, proxy at nice {}, midway's profile `{}` \
         on both segments, congestion control {} on the end hosts and {} for the router's \
         other sockets (HAProxy's)",
        report.kernel,
        report.cpus,
        report.seconds_per_run,
        report.proxy_nice,
        report.midway_profile,
        report.end_congestion_control,
        report.router_congestion_control
    );
    if report.router_quickack {
        let _ = write!(out, ", the router's routes with `quickack 1`");
    }
    if let Some(threads) = report.proxy_threads {
        let _ = write!(out, ", {threads} proxy thread(s)");
    }
    if let Some(max) = report.client_wmem_max {
        let _ = write!(out, ", clients' tcp_wmem max {max} bytes");
    }
    if report.rounds > 1 {
        let _ = write!(
            out,
            ", {} rounds: medians over the rounds as median (min-max), ratio to direct paired \
             within each round, peak TCP memory the highest",
            report.rounds
        );
    }
    let _ = writeln!(out, "\n");
    out.push_str(&render_throughput_table(&report.throughput));
    let _ = writeln!(
        out,
        "\n| case | rounds | connections/s | failures | proxy CPU-µs/conn | machine CPU-µs/conn |\n\
         |---|---:|---:|---:|---:|---:|"
    );
    for r in &report.connection_rate_summary {
        let rows: Vec<_> = report
            .connection_rate
            .iter()
            .filter(|row| row.case == r.case)
            .collect();
        let failures: u64 = rows.iter().map(|row| row.failures).sum();
        let proxy_cpu: Vec<f64> = rows
            .iter()
            .filter_map(|row| row.proxy_cpu_us_per_connection)
            .collect();
        let machine_cpu: Vec<f64> = rows
            .iter()
            .map(|row| row.machine_cpu_us_per_connection)
            .collect();
        let cpu = |values: &[f64]| Spread::of(values).map_or("-".into(), |s| spread(&s, 1.0, 0));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            r.case,
            r.rounds,
            spread(&r.spread, 1.0, 0),
            failures,
            cpu(&proxy_cpu),
            cpu(&machine_cpu),
        );
    }
    out.push_str(&render_idle_table(report));
    if !report.connections.is_empty() {
        out.push_str(&render_connections_table(&report.connections));
    }
    out
}

/// The idle-memory table: the proxy's user-space bytes per idle connection, the kernel's (socket
/// buffers and slab objects, machine-wide), the proxy's share of the slab (its row minus
/// `direct`'s of the same round: the end hosts' sockets are in both), then where the slab bytes
/// went in the first round.
fn render_idle_table(report: &BenchReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| case | rounds | idle connections | proxy user-space KiB/conn | kernel TCP buffers KiB/conn (sockstat) | \
         kernel slab KiB/conn (machine-wide) | the proxy's kernel slab KiB/conn (minus direct) |\n\
         |---|---:|---:|---:|---:|---:|---:|"
    );
    let cases = summary::cases_in_order(&report.idle_memory, |row| row.case);
    let direct_slab = |round: u32| {
        report
            .idle_memory
            .iter()
            .find(|row| row.case == Case::Direct.name() && row.round == round)
            .and_then(|row| row.kernel_slab_bytes_per_connection)
    };
    let kib = |values: &[f64]| Spread::of(values).map_or("-".into(), |s| spread(&s, 1024.0, 1));
    for case in &cases {
        let rows: Vec<&IdleMemoryRow> = report
            .idle_memory
            .iter()
            .filter(|row| row.case == *case)
            .collect();
        let user = report
            .idle_memory_summary
            .iter()
            .find(|summed| summed.case == *case)
            .map_or("-".into(), |summed| spread(&summed.spread, 1024.0, 1));
        let buffers: Vec<f64> = rows
            .iter()
            .map(|row| row.kernel_tcp_bytes_per_connection)
            .collect();
        let slab: Vec<f64> = rows
            .iter()
            .filter_map(|row| row.kernel_slab_bytes_per_connection)
            .collect();
        let share: Vec<f64> = if *case == Case::Direct.name() {
            Vec::new()
        } else {
            rows.iter()
                .filter_map(|row| {
                    Some(row.kernel_slab_bytes_per_connection? - direct_slab(row.round)?)
                })
                .collect()
        };
        let _ = writeln!(
            out,
            "| {case} | {} | {} | {user} | {} | {} | {} |",
            rows.len(),
            rows.first().map_or(0, |row| row.connections),
            kib(&buffers),
            kib(&slab),
            kib(&share),
        );
    }
    let first: Vec<&IdleMemoryRow> = report
        .idle_memory
        .iter()
        .filter(|row| row.round == 1 && !row.kernel_slab_caches.is_empty())
        .collect();
    if !first.is_empty() {
        out.push_str("\nWhere the kernel's slab bytes per idle connection went (first round, machine-wide, bytes; `proc_inode_cache` and as many dentries, made by whatever lists the processes' descriptors in /proc, are left out of the figures above):\n\n| case | caches that grew |\n|---|---|\n");
        for row in first {
            let caches: Vec<String> = row
                .kernel_slab_caches
                .iter()
                .map(|growth| format!("{} {:.0}", growth.cache, growth.bytes_per_connection))
                .collect();
            let _ = writeln!(out, "| {} | {} |", row.case, caches.join(", "));
        }
    }
    out
}

/// `spread` divided by `unit`, with `decimals`: the median alone for one value, else the
/// median with (min-max).
fn spread(spread: &Spread, unit: f64, decimals: usize) -> String {
    let (median, min, max) = (spread.median / unit, spread.min / unit, spread.max / unit);
    if spread.min == spread.max {
        format!("{median:.decimals$}")
    } else {
        format!("{median:.decimals$} ({min:.decimals$}-{max:.decimals$})")
    }
}

/// The `--connections` table: one line per proxy case, then the first failure of each case
/// whose connections did not all open.
pub(crate) fn render_connections_table(rows: &[ConnectionsRow]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| case | connections opened | in flight | open s | connect+echo p50 / p99 / max ms | retransmitted | \
         proxy RSS MiB at N | proxy KiB/conn | kernel TCP buffers KiB/conn (sockstat) | \
         kernel slab KiB/conn (machine-wide) | machine KiB/conn (MemAvailable) | proxy fds / limit | MemAvailable GiB at N | \
         midway's own count at N | answered after hold |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} of {} | {} | {:.1} | {} / {} / {} | {} | {:.0} | {:.1} | {:.1} | {} | {:.1} | {} / {} | {:.1} | {} | {} of {} after {} s |",
            r.case,
            r.opened,
            r.connections,
            r.in_flight,
            r.open_seconds,
            ms(r.open_latency_p50_ms),
            ms(r.open_latency_p99_ms),
            ms(r.open_latency_max_ms),
            r.retransmitted_opens,
            r.proxy_rss_at_n_bytes as f64 / 1048576.0,
            r.user_bytes_per_connection / 1024.0,
            r.kernel_tcp_bytes_per_connection / 1024.0,
            r.kernel_slab_bytes_per_connection
                .map_or("-".into(), |bytes| format!("{:.1}", bytes / 1024.0)),
            r.machine_bytes_per_connection / 1024.0,
            r.proxy_open_fds,
            r.proxy_fd_limit,
            r.mem_available_at_n_bytes as f64 / 1073741824.0,
            r.proxy_counted_at_n.map_or("-".into(), |n| n.to_string()),
            r.answered_at_end,
            r.connections,
            r.hold_seconds,
        );
    }
    let _ = writeln!(
        out,
        "\nThe proxy stopped (SIGTERM) with the connections open: how long until it exited, and how \
         each connection ended. midway resets what is open when its `shutdown_grace` ({} s here) \
         runs out; a clean end of stream is a truncation the client cannot see.\n\n\
         | case | SIGTERM to exit, s | client: reset / clean end / other / none | \
         server: reset / clean end / other / none |\n|---|---:|---:|---:|",
        MIDWAY_SHUTDOWN_GRACE.as_secs()
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} / {} / {} / {} | {} / {} / {} / {} |",
            r.case,
            r.stop_seconds.map_or_else(
                || format!("not within {} s", STOP_LIMIT.as_secs()),
                |s| format!("{s:.1}")
            ),
            r.client_resets,
            r.client_clean_ends,
            r.client_other_ends,
            r.client_no_end,
            r.server_resets,
            r.server_clean_ends,
            r.server_other_ends,
            r.server_no_end,
        );
    }
    for r in rows {
        if let Some(error) = &r.first_open_error {
            let _ = writeln!(
                out,
                "- {}: {} did not open, the first: {}",
                r.case,
                r.failed_to_open,
                error.replace('\n', " ")
            );
        }
        if r.keepalive_failures > 0 {
            let _ = writeln!(
                out,
                "- {}: {} stopped answering keep-alives during the hold",
                r.case, r.keepalive_failures
            );
        }
    }
    out
}

/// The throughput table, one line per case and stream count, then the failed runs if any.
pub fn render_throughput_table(summaries: &[ThroughputSummary]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| case | streams | rounds | Gbit/s | ratio to direct | proxy CPU-s/GB | machine CPU-s/GB | peak TCP mem (MiB) / pressure (MiB) |");
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let optional = |value: Option<f64>| value.map_or("-".into(), |v| format!("{v:.2}"));
    for s in summaries {
        let total = s.rounds_ok + s.rounds_failed;
        let rounds = if s.rounds_failed == 0 {
            total.to_string()
        } else {
            format!("{} of {total}", s.rounds_ok)
        };
        let Some(throughput) = s.bits_per_second else {
            let error = s.errors.first().map_or("", String::as_str);
            let _ = writeln!(
                out,
                "| {} | {} | {rounds} | failed: {} | | | | |",
                s.case,
                s.streams,
                error.replace('\n', " ")
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
            "| {} | {} | {rounds} | {gbit} | {} | {} | {} | {:.0} / {:.0} |",
            s.case,
            s.streams,
            optional(s.ratio_to_direct_median),
            optional(s.proxy_cpu_seconds_per_gb_median),
            optional(s.machine_cpu_seconds_per_gb_median),
            s.peak_tcp_memory_bytes_max.unwrap_or(0) as f64 / 1048576.0,
            s.tcp_memory_pressure_bytes.unwrap_or(0) as f64 / 1048576.0,
        );
    }
    let failures: Vec<String> = summaries
        .iter()
        .filter(|s| s.rounds_ok > 0)
        .flat_map(|s| {
            s.errors.iter().map(move |e| {
                format!(
                    "- {} {} streams, {}",
                    s.case,
                    s.streams,
                    e.replace('\n', " ")
                )
            })
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(out, "\nFailed runs (left out of the figures above):");
        for line in failures {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// Writes the report as pretty-printed JSON to `path`.
pub fn write_json(report: &BenchReport, path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(report)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary;
    use crate::{Case, ThroughputRun};

    fn run(case: Case, round: u32, gbit: f64) -> ThroughputRun {
        ThroughputRun {
            round,
            case: case.name(),
            streams: 100,
            bits_per_second: gbit * 1e9,
            ratio_to_direct: None,
            bytes: 1_000_000_000,
            proxy_cpu_seconds: Some(0.3),
            proxy_cpu_seconds_per_gb: Some(0.3),
            machine_cpu_seconds_per_gb: Some(1.1),
            peak_tcp_memory_bytes: 10 * 1048576,
            tcp_memory_pressure_bytes: 1499 * 1048576,
            error: None,
        }
    }

    fn table(runs: &mut [ThroughputRun]) -> String {
        summary::fill_ratios_within_rounds(runs);
        render_throughput_table(&summary::summarize(runs))
    }

    #[test]
    fn one_round_shows_plain_figures() {
        let out = table(&mut [
            run(Case::Direct, 1, 20.0),
            run(Case::MidwayForward, 1, 12.81),
        ]);
        assert!(
            out.contains("| midway-forward | 100 | 1 | 12.81 | 0.64 | 0.30 | 1.10 | 10 / 1499 |"),
            "{out}"
        );
        assert!(!out.contains("Failed runs"), "{out}");
    }

    #[test]
    fn several_rounds_show_the_range_and_failures() {
        let mut failed = run(Case::MidwayForward, 3, 0.0);
        failed.error = Some("iperf3\nexited".into());
        let out = table(&mut [
            run(Case::Direct, 1, 20.0),
            run(Case::MidwayForward, 1, 11.2),
            run(Case::Direct, 2, 20.0),
            run(Case::MidwayForward, 2, 13.2),
            run(Case::Direct, 3, 20.0),
            failed,
        ]);
        assert!(
            out.contains("| direct | 100 | 3 | 20.00 (20.00-20.00) | 1.00 |"),
            "{out}"
        );
        assert!(
            out.contains("| midway-forward | 100 | 2 of 3 | 12.20 (11.20-13.20) | 0.61 |"),
            "{out}"
        );
        assert!(
            out.contains("- midway-forward 100 streams, round 3: iperf3 exited"),
            "{out}"
        );
    }

    #[test]
    fn a_case_that_never_ran_shows_its_first_error() {
        let mut failed = run(Case::Haproxy, 1, 0.0);
        failed.error = Some("haproxy did not come up".into());
        let out = table(&mut [failed]);
        assert!(
            out.contains(
                "| haproxy | 100 | 0 of 1 | failed: round 1: haproxy did not come up | | | | |"
            ),
            "{out}"
        );
    }
}
