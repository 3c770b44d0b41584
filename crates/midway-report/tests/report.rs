// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End to end: a synthetic results.jsonl written into a temporary folder, a real report and real
//! PNG/SVG files written from it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use midway_report::{
    read_records, write_report, ReportError, ReportOptions, RunRecord, RESULTS_FILE,
};
use serde_json::json;

const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

fn record(
    experiment: &str,
    case: &str,
    sweep: Option<(&str, serde_json::Value)>,
    rep: u32,
    mbps: f64,
) -> RunRecord {
    let mut params = BTreeMap::from([("remote_rtt_ms".to_string(), json!(100))]);
    if let Some((name, value)) = &sweep {
        params.insert(name.to_string(), value.clone());
    }
    RunRecord {
        scenario: "hfc-test".into(),
        scenario_file: "scenarios/hfc-test.toml".into(),
        commit: "1234abc".into(),
        experiment: experiment.into(),
        case: case.into(),
        sweep_param: sweep.map(|(name, _)| name.to_string()),
        params,
        repetition: rep,
        seed: 1000 + rep as u64,
        bytes: 3_000_000,
        seconds: 24.0 / mbps,
        throughput_bps: mbps * 1e6,
        retransmits: BTreeMap::from([
            ("client".to_string(), u64::from(rep)),
            ("server".to_string(), 2 * u64::from(rep)),
        ]),
        extra: BTreeMap::new(),
        ok: true,
        error: None,
        started_at: format!("2026-11-21T06:{:02}:00Z", 10 + rep),
        tree: None,
        quick: None,
        load: None,
    }
}

/// Throughput of `case` at loss `loss` in repetition `rep`: a base value plus 0.5 Mbit/s per
/// repetition, so the median over five repetitions is base + 1 and the quartiles base + 0.5 and
/// base + 1.5 (type 7, exact).
fn loss_sweep_mbps(case: &str, loss: f64, rep: u32) -> f64 {
    let base = match case {
        "direct" => 10.0 / (1.0 + 100.0 * loss),
        "midway" => 14.0 - 20.0 * loss,
        _ => 12.0 - 40.0 * loss,
    };
    base + 0.5 * f64::from(rep)
}

fn synthetic_records() -> Vec<RunRecord> {
    let mut records = Vec::new();
    // Repetitions written in a shuffled order, as parallel runs finish.
    let rep_order = [3, 0, 4, 1, 2];
    for loss in [0.0, 0.01, 0.05] {
        for rep in rep_order {
            for case in ["midway", "direct", "haproxy"] {
                records.push(record(
                    "fig8-loss",
                    case,
                    Some(("local_loss", json!(loss))),
                    rep,
                    loss_sweep_mbps(case, loss, rep),
                ));
            }
        }
    }
    // A size sweep over three decades (log axis) with a segment time in `extra`.
    for size in [10_000u64, 100_000, 1_000_000, 3_000_000] {
        for rep in 0..3 {
            for (case, factor) in [("direct", 1.0), ("midway", 1.5)] {
                let mbps = factor * (size as f64).log10() + f64::from(rep);
                let mut r = record(
                    "fig5-size",
                    case,
                    Some(("size_bytes", json!(size))),
                    rep,
                    mbps,
                );
                r.extra
                    .insert("remote_segment_seconds".into(), 0.25 * f64::from(rep + 1));
                records.push(r);
            }
        }
    }
    // A single point without sweep.
    for rep in 0..3 {
        for (case, mbps) in [("direct", 5.0), ("midway", 8.0)] {
            records.push(record("single", case, None, rep, mbps + f64::from(rep)));
        }
    }
    let mut failed = record(
        "fig8-loss",
        "midway",
        Some(("local_loss", json!(0.05))),
        5,
        0.0,
    );
    failed.ok = false;
    failed.throughput_bps = 0.0;
    failed.error = Some("workload timed out after 60 s".into());
    records.push(failed);
    records
}

fn write_results(dir: &Path, records: &[RunRecord]) {
    let mut file = std::fs::File::create(dir.join(RESULTS_FILE)).expect("create results");
    for r in records {
        writeln!(file, "{}", serde_json::to_string(r).expect("serialise")).expect("write");
    }
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).expect("png exists");
    assert_eq!(bytes[..8], PNG_SIGNATURE, "{} is a PNG", path.display());
    assert!(
        bytes.len() > 10_000,
        "{} has {} bytes",
        path.display(),
        bytes.len()
    );
}

#[test]
fn report_from_synthetic_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    let records = synthetic_records();
    assert!(!records.is_empty());
    write_results(dir.path(), &records);

    let summary = write_report(dir.path(), &ReportOptions::default()).expect("report");
    assert_eq!(summary.records, records.len());
    assert_eq!(summary.failed_records, 1);
    assert_eq!(summary.report_path, dir.path().join("report.md"));
    assert_eq!(summary.plots.len(), 6, "png and svg for three experiments");

    let report = std::fs::read_to_string(&summary.report_path).expect("report.md");
    // Header.
    assert!(report.contains("- Scenario: `hfc-test`"), "{report}");
    assert!(report.contains("- Commit: `1234abc`"));
    assert!(report.contains("2026-11-21T06:10:00Z to 2026-11-21T06:15:00Z"));
    assert!(report.contains("- Records: 76 (1 failed)"));
    assert!(report.contains("workload timed out after 60 s"));

    // Medians and quartiles: midway at 1 % loss has 13.8 + 0.5 rep -> 14.8, Q1 14.3, Q3 15.3.
    // Paired GoS against direct (5 + 0.5 rep) falls with rep from (13.8 - 5) / 5 = 1.76; the
    // median is rep 2's (14.8 - 6) / 6 = 1.4667. Retransmits: client rep, server 2 rep.
    assert!(
        report.contains(
            "| 0.01 | midway | 5 | 14.8 | 14.3 | 15.3 | +1.47 | +1.47 | 5/5 (100 %) | 2 | 4 |"
        ),
        "{report}"
    );
    assert!(report.contains("| 0.01 | direct | 5 | 6.00 | 5.50 | 6.50 | (baseline) |"));
    // At 5 % loss the failed run is left out: still five midway runs.
    assert!(report.contains("| 0.05 | midway | 5 | 14.0 | 13.5 | 14.5 |"));
    // haproxy at 5 % loss: 10 + 0.5 rep vs direct 1.667 + 0.5 rep.
    assert!(report.contains("| 0.05 | haproxy | 5 | 11.0 | 10.5 | 11.5 |"));

    // Plots are embedded, reproduction line present.
    assert!(report.contains("![fig8-loss: throughput by case](plots/fig8-loss.png)"));
    assert!(report.contains("`midway lab run scenarios/hfc-test.toml` on commit `1234abc`"));

    // Extra measurements get their own table: median of 0.25, 0.5, 0.75.
    assert!(report.contains("| size_bytes | case | remote_segment_seconds |"));
    assert!(report.contains("| 3000000 | midway | 0.500 |"));

    for plot in &summary.plots {
        assert!(plot.starts_with(dir.path().join("plots")));
        if plot.extension().is_some_and(|e| e == "png") {
            assert_png(plot);
        } else {
            let svg = std::fs::read_to_string(plot).expect("svg exists");
            assert!(svg.starts_with("<svg"), "{}", plot.display());
            assert!(svg.len() > 2_000);
            assert!(svg.contains("midway") && svg.contains("direct"));
            assert!(svg.contains("throughput (Mbit/s)"));
        }
    }

    // Rebuilding gives the same report (plotting is a separate, repeatable step).
    let again = write_report(dir.path(), &ReportOptions::default()).expect("second report");
    let report_again = std::fs::read_to_string(&again.report_path).expect("report.md");
    assert_eq!(report, report_again);

    // Keep the files for a look by hand when asked.
    if let Some(keep) = std::env::var_os("MIDWAY_REPORT_KEEP") {
        let keep = Path::new(&keep);
        std::fs::create_dir_all(keep.join("plots")).expect("keep dir");
        std::fs::copy(&summary.report_path, keep.join("report.md")).expect("copy");
        for plot in &summary.plots {
            std::fs::copy(
                plot,
                keep.join("plots").join(plot.file_name().expect("name")),
            )
            .expect("copy plot");
        }
    }
}

#[test]
fn custom_baseline_and_title() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_results(dir.path(), &synthetic_records());
    let opts = ReportOptions {
        title: Some("HFC figure 8".into()),
        baseline_case: "haproxy".into(),
    };
    let summary = write_report(dir.path(), &opts).expect("report");
    let report = std::fs::read_to_string(summary.report_path).expect("report.md");
    assert!(report.starts_with("# HFC figure 8\n"));
    // midway (14 + 0.5 rep) vs haproxy (12 + 0.5 rep) at 0 % loss: medians 15 and 13,
    // (15 - 13) / 13 = +0.15; the paired gains fall with rep, their median is rep 2's, the same.
    assert!(
        report.contains("| 0.0 | haproxy | 5 | 13.0 | 12.5 | 13.5 | (baseline) |"),
        "{report}"
    );
    assert!(
        report.contains("| 0.0 | midway | 5 | 15.0 | 14.5 | 15.5 | +0.15 | +0.15 | 5/5 (100 %) |")
    );
    // fig5 has no haproxy case: said so instead of a gain.
    assert!(report.contains("No `haproxy` case in this experiment"));
}

#[test]
fn malformed_line_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = serde_json::to_string(&record("e", "direct", None, 0, 1.0)).expect("json");
    let path = dir.path().join(RESULTS_FILE);
    std::fs::write(
        &path,
        format!("{good}\n\n{good}\n{{\"scenario\": 3}}\n{good}\n"),
    )
    .expect("w");
    let err = read_records(&path).expect_err("line 4 is bad");
    match &err {
        ReportError::BadLine { line, .. } => assert_eq!(*line, 4),
        other => panic!("expected BadLine, got {other:?}"),
    }
    assert!(
        err.to_string()
            .ends_with("results.jsonl:4: not a valid run record"),
        "{err}"
    );
    let err = write_report(dir.path(), &ReportOptions::default()).expect_err("bad line");
    assert!(matches!(err, ReportError::BadLine { line: 4, .. }));
}

#[test]
fn unknown_field_is_rejected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut value = serde_json::to_value(record("e", "direct", None, 0, 1.0)).expect("json");
    value["surprise"] = json!(1);
    let path = dir.path().join(RESULTS_FILE);
    std::fs::write(&path, format!("{value}\n")).expect("write");
    let err = read_records(&path).expect_err("unknown field");
    assert!(matches!(err, ReportError::BadLine { line: 1, .. }));
}

#[test]
fn missing_and_empty_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = write_report(dir.path(), &ReportOptions::default()).expect_err("no file");
    assert!(matches!(err, ReportError::NoResultsFile { .. }), "{err:?}");
    std::fs::write(dir.path().join(RESULTS_FILE), "\n").expect("write");
    let err = write_report(dir.path(), &ReportOptions::default()).expect_err("empty");
    assert!(matches!(err, ReportError::NoRecords { .. }), "{err:?}");
    assert!(!dir.path().join("report.md").exists());
}

/// The bulk report of the synthetic records, byte for byte. The golden file was written by the
/// report code before web experiments and `[[plots]]` existed, so this test shows bulk reports
/// are unchanged by them. Rewrite it (after checking the diff by hand) with
/// `MIDWAY_REPORT_BLESS=1 cargo test -p midway-report --test report`.
#[test]
fn bulk_report_matches_golden() {
    let golden_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/bulk-report.md");
    let dir = tempfile::tempdir().expect("tempdir");
    write_results(dir.path(), &synthetic_records());
    let summary = write_report(dir.path(), &ReportOptions::default()).expect("report");
    let report = std::fs::read_to_string(summary.report_path).expect("report.md");
    if std::env::var_os("MIDWAY_REPORT_BLESS").is_some() {
        std::fs::create_dir_all(golden_path.parent().expect("parent")).expect("golden dir");
        std::fs::write(&golden_path, &report).expect("bless golden");
    }
    let golden = std::fs::read_to_string(&golden_path).expect("golden file");
    assert_eq!(
        report,
        golden,
        "bulk report differs from {}",
        golden_path.display()
    );
}

/// Page load time (s) of `case` in HTTP mode `http` at repetition `rep`.
fn page_load(case: &str, http: &str, rep: u32) -> f64 {
    let (base, step) = match (case, http) {
        ("direct", "1.0") => (8.0, 0.5),
        ("direct", "1.1") => (5.0, 0.5),
        ("direct", _) => (4.0, 0.5),
        ("midway-http", "1.0") => (3.0, 0.25),
        ("midway-http", "1.1") => (2.5, 0.25),
        ("midway-http", _) => (2.0, 0.25),
        (_, "1.0") => (4.0, 0.25),
        _ => (3.0, 0.25),
    };
    base + step * f64::from(rep)
}

/// A web experiment as the lab records it (one 65 kB page per run; throughput = bytes * 8 /
/// load time; extras as the web workload writes them), next to the bulk records.
fn web_and_bulk_records() -> Vec<RunRecord> {
    let mut records = synthetic_records();
    for http in ["1.0", "1.1", "pipelining"] {
        for rep in 0..5 {
            for case in ["direct", "midway-http", "squid"] {
                let seconds = page_load(case, http, rep);
                let mut r = record("web-http", case, Some(("http", json!(http))), rep, 1.0);
                r.bytes = 65_000;
                r.seconds = seconds;
                r.throughput_bps = 65_000.0 * 8.0 / seconds;
                r.retransmits.clear();
                r.extra = BTreeMap::from([
                    ("page_load_seconds".to_string(), seconds),
                    ("page_load_max_seconds".to_string(), seconds),
                    ("connections_opened".to_string(), 20.0 + f64::from(rep)),
                    ("pages".to_string(), 1.0),
                    ("objects".to_string(), 19.0),
                ]);
                if case != "direct" {
                    r.extra.insert("cache_hits".into(), 0.0);
                }
                records.push(r);
            }
        }
    }
    records
}

const WEB_CLAIMS: &str = r#"
paper = "satellite"

[[claims]]
figure = "Fig. 4"
experiment = "web-http"
says = "the HTTP proxy halves the page load time with HTTP/1.0"
[claims.check]
metric = "page_load_seconds"
a = { case = "midway-http", x = "1.0" }
b = { case = "direct", x = "1.0" }
op = "<="
open_side = "the paper gives a bound"
value = 0.5

[[claims]]
figure = "Fig. 4"
experiment = "web-http"
says = "squid improves every repetition in every mode"
[claims.check]
metric = "gos_positive_share"
a = { case = "squid" }
op = ">="
open_side = "a share cannot exceed 1"
value = 1.0

[[claims]]
figure = "Fig. 4"
experiment = "web-http"
says = "(mean) squid is 3x faster than direct with HTTP/1.1"
[claims.check]
metric = "page_load_seconds"
stat = "mean"
a = { case = "squid", x = "1.1" }
b = { case = "direct", x = "1.1" }
op = "<="
open_side = "the paper gives a bound"
value = 0.333

[[plots]]
experiment = "web-http"
[[plots.lines]]
label = "paper: 2.5 s with a proxy"
y = 2.5
[[plots.lines]]
label = "keep-alive"
x = "1.1"

[[plots]]
experiment = "web-http"
title = "web-http: TCP connections per run"
metrics = ["connections_opened"]

[[plots]]
experiment = "fig5-size"
metrics = ["remote_segment_seconds", "no_such_metric"]
cases = ["midway"]
[[plots.lines]]
label = "buffer rule"
x = 24000

[[plots]]
experiment = "fig99"
metrics = ["remote_segment_seconds"]
"#;

#[test]
fn web_experiment_reports_page_load_time_and_claims_annotate_plots() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_results(dir.path(), &web_and_bulk_records());
    std::fs::write(dir.path().join("claims.toml"), WEB_CLAIMS).expect("claims");
    let summary = write_report(dir.path(), &ReportOptions::default()).expect("report");
    let report = std::fs::read_to_string(&summary.report_path).expect("report.md");

    // The web table: page load quartiles and mean in seconds, GoS on throughput. midway-http
    // with HTTP/1.0 loads in 3 + 0.25 rep s, direct in 8 + 0.5 rep s: medians 3.5 and 9, GoS of
    // medians 9 / 3.5 - 1 = 1.571; paired gains 1.667 ... 1.5, median rep 2's 9 / 3.5 - 1.
    assert!(
        report.contains(
            "| http | case | n | median page load s | Q1 | Q3 | mean | GoS paired vs direct | \
             GoS of medians | GoS > 0 |\n|---|---|---|---|---|---|---|---|---|---|\n"
        ),
        "{report}"
    );
    assert!(
        report.contains(
            "| 1.0 | midway-http | 5 | 3.50 | 3.25 | 3.75 | 3.50 | +1.57 | +1.57 | 5/5 (100 %) |\n"
        ),
        "{report}"
    );
    assert!(
        report.contains("| 1.0 | direct | 5 | 9.00 | 8.50 | 9.50 | 9.00 | (baseline) |  |  |\n")
    );
    assert!(report.contains("Web experiment: the measurement is the page load time in seconds"));
    assert!(report.contains("![web-http: page load time by case](plots/web-http.png)"));
    // Other extras in their own table, without the page load time, and without a counter that
    // is zero in every row (named below the tables instead).
    assert!(
        report.contains(
            "| http | case | connections_opened | objects | page_load_max_seconds | pages |"
        ),
        "{report}"
    );
    assert!(report.contains("| 1.1 | direct | 22.0 | 19.0 | 6.00 | 1.00 |"));
    assert!(
        report.contains(
            "Zero in every row, so left out of the tables (kept in results.jsonl): `cache_hits`."
        ),
        "{report}"
    );
    // The bulk experiments next to it are reported as before.
    assert!(report.contains(
        "| 0.01 | midway | 5 | 14.8 | 14.3 | 15.3 | +1.47 | +1.47 | 5/5 (100 %) | 2 | 4 |"
    ));
    assert!(report.contains("![fig8-loss: throughput by case](plots/fig8-loss.png)"));

    // Claims: A, B and the ratio are shown, and by how much the target is met or missed.
    assert!(
        report.contains(
            "midway-http median page_load_seconds @ 1.0 / direct median page_load_seconds @ 1.0 \
             = 3.500 s / 9.000 s, median of the paired ratios 0.389, 93.8 % interval \
             0.375..0.400 (5 paired runs), needs <= 0.5: met by 0.111 | agrees |"
        ),
        "{report}"
    );
    assert!(report.contains("squid gos_positive_share @ 1.0 = 1.000 (5/5 runs with GoS > 0)"));
    // squid 1.1: 3 + 0.25 rep (mean 3.5) vs direct 5 + 0.5 rep (mean 6): 0.583 > 0.333. Fieller:
    // |3.5 - 6 r| <= 2.7764 sqrt(0.03125) |1 - 2 r| gives 0.5716..0.5996.
    assert!(
        report.contains(
            "squid mean page_load_seconds @ 1.1 / direct mean page_load_seconds @ 1.1 = 3.500 s / \
             6.000 s = 0.583, 95 % t interval 0.572..0.600 (5 paired runs), needs <= 0.333: \
             missed by 0.250 | **disagrees** |"
        ),
        "{report}"
    );
    // 5 of 5 runs with a gain cannot show a share of 1 (Clopper-Pearson reaches down to 0.478).
    assert!(report.contains(
        "Verdicts of the paper's claims: 1 agree, 1 inconclusive, 1 disagree, 0 not tested."
    ));

    // [[plots]]: the extra plot is written and linked; what the results lack is a warning.
    // Every title says what kind of run it shows.
    assert!(
        report.contains(
            "![web-http: TCP connections per run (5 runs per point)](plots/web-http-1.png)\n\n\
             (vector version: [plots/web-http-1.svg](plots/web-http-1.svg))"
        ),
        "{report}"
    );
    assert!(
        report.contains(
            "![fig5-size: remote_segment_seconds vs size_bytes (3 runs per point)]\
             (plots/fig5-size-1.png)"
        ),
        "{report}"
    );
    let expected_warnings = [
        "claims.toml [[plots]] #3 (experiment `fig5-size`): metric `no_such_metric` is not measured in experiment `fig5-size`",
        "claims.toml [[plots]] #4: experiment `fig99` is not in the results; nothing drawn for it",
    ];
    assert_eq!(summary.warnings.len(), 2, "{:?}", summary.warnings);
    for (warning, expected) in summary.warnings.iter().zip(expected_warnings) {
        assert!(warning.starts_with(expected), "{warning}");
        assert!(
            report.contains(&format!("- **Warning:** {warning}\n")),
            "{report}"
        );
    }
    let plots_dir = dir.path().join("plots");
    for stem in ["web-http", "web-http-1", "fig5-size-1", "fig8-loss"] {
        assert_png(&plots_dir.join(format!("{stem}.png")));
        assert!(plots_dir.join(format!("{stem}.svg")).exists(), "{stem}.svg");
    }
    let web_svg = std::fs::read_to_string(plots_dir.join("web-http.svg")).expect("svg");
    assert!(web_svg.contains("page load time (s), median and quartiles; lower is better"));
    assert!(web_svg.contains("pipelining") && web_svg.contains("keep-alive"));
    assert!(web_svg.contains("paper: 2.5 s with a proxy"));
    assert!(!web_svg.contains("throughput (Mbit/s)"));
    let extra_svg = std::fs::read_to_string(plots_dir.join("fig5-size-1.svg")).expect("svg");
    assert!(extra_svg.contains("remote_segment_seconds (s), median and quartiles"));
    // The extra plot of fig5-size holds only the chosen case.
    assert!(extra_svg.contains("midway") && !extra_svg.contains("direct"));
    // The main plot of fig5-size has its reference line.
    let fig5_svg = std::fs::read_to_string(plots_dir.join("fig5-size.svg")).expect("svg");
    assert!(fig5_svg.contains("buffer rule"));

    if let Some(keep) = std::env::var_os("MIDWAY_REPORT_KEEP_WEB") {
        let keep = Path::new(&keep);
        std::fs::create_dir_all(keep.join("plots")).expect("keep dir");
        std::fs::copy(&summary.report_path, keep.join("report.md")).expect("copy");
        for plot in &summary.plots {
            std::fs::copy(
                plot,
                keep.join("plots").join(plot.file_name().expect("name")),
            )
            .expect("copy plot");
        }
    }
}

#[test]
fn a_broken_claims_file_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_results(dir.path(), &synthetic_records());
    std::fs::write(
        dir.path().join("claims.toml"),
        "paper = \"p\"\n[[plots]]\nexperiment = \"fig8-loss\"\nlines = 3\n",
    )
    .expect("claims");
    let err = write_report(dir.path(), &ReportOptions::default()).expect_err("bad claims");
    assert!(
        matches!(
            err,
            ReportError::Claims(midway_report::claims::ClaimsError::Parse { .. })
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .ends_with("claims.toml: not a valid claims file"),
        "{err}"
    );
}

/// Issue 18: the load a run was measured under is recorded and shown, and a report refuses to
/// mix runs measured under different load policies (`--jobs`).
#[test]
fn the_load_is_shown_and_mixed_load_policies_are_refused() {
    use midway_report::RunLoad;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut records = synthetic_records();
    for (index, r) in records.iter_mut().enumerate() {
        r.load = Some(RunLoad {
            jobs: 2,
            cpus: 2,
            loadavg_1m: Some(1.0 + index as f64 / 100.0),
            max_jobs: None,
        });
    }
    write_results(dir.path(), &records);
    let summary = write_report(dir.path(), &ReportOptions::default()).expect("one policy");
    let report = std::fs::read_to_string(summary.report_path).expect("report.md");
    assert!(
        report.contains(
            "- Load: `--jobs 2` on 2 CPUs; 1-minute load average at the runs' starts 1.00.."
        ),
        "{report}"
    );

    records[0].load = Some(RunLoad {
        jobs: 1,
        cpus: 2,
        loadavg_1m: None,
        max_jobs: None,
    });
    write_results(dir.path(), &records);
    match write_report(dir.path(), &ReportOptions::default()) {
        Err(error @ ReportError::MixedLoad { .. }) => {
            let text = error.to_string();
            assert!(
                text.contains("--jobs 1 (1 records), --jobs 2 (75 records)"),
                "{text}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// An experiment's own limit (`max_jobs`) is part of the load policy: the header names it, and a
/// report refuses one experiment measured partly with and partly without it.
#[test]
fn an_experiments_own_limit_is_shown_and_mixing_it_is_refused() {
    use midway_report::RunLoad;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut records = synthetic_records();
    for r in records.iter_mut() {
        r.load = Some(RunLoad {
            jobs: 16,
            cpus: 2,
            loadavg_1m: None,
            max_jobs: (r.experiment == "single").then_some(2),
        });
    }
    write_results(dir.path(), &records);
    let summary = write_report(dir.path(), &ReportOptions::default()).expect("one policy");
    let report = std::fs::read_to_string(summary.report_path).expect("report.md");
    assert!(
        report.contains("- Load: `--jobs 16` on 2 CPUs; experiments with a limit of their own")
            && report.contains("`single` at most 2"),
        "{report}"
    );

    let first_single = records
        .iter_mut()
        .find(|r| r.experiment == "single")
        .expect("a single record");
    first_single.load.as_mut().expect("load").max_jobs = None;
    write_results(dir.path(), &records);
    match write_report(dir.path(), &ReportOptions::default()) {
        Err(error @ ReportError::MixedLoad { .. }) => {
            let text = error.to_string();
            assert!(
                text.contains("`single` without a limit of its own (1 records)")
                    && text.contains("`single` at most 2 at once (5 records)"),
                "{text}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}
