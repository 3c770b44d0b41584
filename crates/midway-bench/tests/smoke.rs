//! The benchmark command end to end, as a user runs it, in its smallest form: every part
//! (namespaces, iperf3, midway in both modes, spliced HAProxy, connection rate, idle memory,
//! many concurrent connections and the proxy's stop with them open)
//! must produce figures, and the options that shape the run must reach the report. The figures
//! themselves are not judged here: they are benchmark output, not test assertions.
//!
//! Ignored by default because it needs root, iperf3, HAProxy and the release build of
//! `midway`; `scripts/test` runs it after the workspace tests have built that binary.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use midway_testkit::host::midway_binary;
use std::process::Command;

#[test]
#[ignore = "needs root, iperf3, haproxy and target/release/midway; run with --ignored"]
fn the_smallest_bench_run_reports_every_case() {
    let out = tempfile::tempdir().unwrap();
    let result = Command::new(env!("CARGO_BIN_EXE_midway-bench"))
        .arg("--midway")
        .arg(midway_binary())
        .args([
            "--cases",
            "direct,midway-forward,midway-transparent,haproxy-splice",
            "--streams",
            "1",
            "--seconds",
            "1",
            "--idle",
            "50",
            "--cps-seconds",
            "1",
            "--end-congestion-control",
            "cubic",
            "--router-congestion-control",
            "reno",
            "--router-quickack",
            "--connections",
            "200",
            "--hold",
            "1",
        ])
        .arg("--out")
        .arg(out.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = result.id();
    let result = result.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stdout}\n{stderr}");
    // The report in CI's log (the stage runs with --nocapture), idle memory per connection
    // among its figures: a number to watch from one run to the next, not a threshold.
    eprintln!("{stdout}");
    assert!(
        stdout.contains("midway's profile `lan` on both segments")
            && stdout.contains("congestion control cubic on the end hosts and reno for the router")
            && stdout.contains("the router's routes with `quickack 1`"),
        "{stdout}"
    );
    assert!(!stdout.contains("failed"), "{stdout}");

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("bench.json")).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    let cases: Vec<&str> = runs.iter().map(|r| r["case"].as_str().unwrap()).collect();
    assert_eq!(
        cases,
        [
            "direct",
            "midway-forward",
            "midway-transparent",
            "haproxy-splice"
        ]
    );
    for run in runs {
        assert!(run["bytes"].as_u64().unwrap() > 0, "{run}");
        if run["case"] != "direct" {
            assert!(run["proxy_cpu_seconds"].as_f64().unwrap() > 0.0, "{run}");
        }
    }
    for row in report["connection_rate"].as_array().unwrap() {
        assert!(
            row["connections_per_second"].as_f64().unwrap() > 0.0,
            "{row}"
        );
        assert_eq!(row["failures"], 0, "{row}");
    }
    let idle = report["idle_memory"].as_array().unwrap();
    // direct too: the end hosts' kernel memory, which a proxy's kernel share is read against.
    assert_eq!(idle.len(), 4, "{idle:?}");
    for row in idle {
        assert_eq!(row["connections"], 50, "{row}");
        // The bench runs as root: the sockets' slab objects are counted.
        assert!(
            row["kernel_slab_bytes_per_connection"].as_f64().is_some(),
            "{row}"
        );
    }
    assert_eq!(idle[0]["case"], "direct");
    assert!(
        idle[0]["user_bytes_per_connection"].is_null(),
        "{}",
        idle[0]
    );
    // One round: each proxy case's summary is that round's figure.
    let summary = report["idle_memory_summary"].as_array().unwrap();
    assert_eq!(summary.len(), 3, "{summary:?}");
    for (row, summed) in idle[1..].iter().zip(summary) {
        assert_eq!(row["case"], summed["case"], "{summed}");
        assert_eq!(summed["rounds"], 1, "{summed}");
        assert_eq!(
            row["user_bytes_per_connection"], summed["spread"]["median"],
            "{summed}"
        );
    }
    assert_eq!(
        report["connection_rate_summary"].as_array().unwrap().len(),
        report["connection_rate"].as_array().unwrap().len()
    );
    let held = report["connections"].as_array().unwrap();
    assert_eq!(held.len(), 3, "{held:?}");
    for row in held {
        assert_eq!(row["opened"], 200, "{row}");
        assert_eq!(row["answered_at_end"], 200, "{row}");
        assert_eq!(row["server_accepted"], 200, "{row}");
        assert!(row["proxy_open_fds"].as_u64().unwrap() >= 400, "{row}");
        // Then the proxy was stopped with them open. midway's close rule: a connection it
        // cannot finish ends with a reset at both ends, never a clean end of stream.
        if row["case"].as_str().unwrap().starts_with("midway") {
            // midway's own gauge counted every one of them.
            assert_eq!(row["proxy_counted_at_n"], 200, "{row}");
            assert!(row["stop_seconds"].as_f64().is_some(), "{row}");
            assert_eq!(row["client_resets"], 200, "{row}");
            assert_eq!(row["server_resets"], 200, "{row}");
        }
    }
    // The bench removes what it made.
    let left = midway_testkit::netns::namespaces_of_pid(pid);
    assert!(left.is_empty(), "left behind: {left:?}");
}
