//! The tunnel benchmark end to end, as a user runs it, in its smallest form: each transport
//! (tcp, tls, quic) at 1 and 100 streams for two seconds must produce figures for both midways,
//! and the bench must remove what it made. The figures themselves are not judged here.
//!
//! Ignored by default because it needs root, iperf3 and the release build of `midway`.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use midway_testkit::host::midway_binary;
use std::process::Command;

#[test]
#[ignore = "needs root, iperf3 and target/release/midway; run with --ignored"]
fn the_smallest_tunnel_run_reports_every_transport() {
    let out = tempfile::tempdir().unwrap();
    let result = Command::new(env!("CARGO_BIN_EXE_midway-bench"))
        .arg("tunnel")
        .arg("--midway")
        .arg(midway_binary())
        .args([
            "--streams",
            "1,100",
            "--seconds",
            "2",
            "--transports",
            "tcp,tls,quic",
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
    assert!(!stdout.contains("failed"), "{stdout}\n{stderr}");
    assert!(stdout.contains("| transport | streams |"), "{stdout}");

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("tunnel.json")).unwrap()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    let cases: Vec<(&str, u64)> = runs
        .iter()
        .map(|r| {
            (
                r["transport"].as_str().unwrap(),
                r["streams"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        cases,
        [
            ("tcp", 1),
            ("tcp", 100),
            ("tls", 1),
            ("tls", 100),
            ("quic", 1),
            ("quic", 100)
        ]
    );
    for run in runs {
        assert!(run["error"].is_null(), "{run}");
        assert!(run["bytes"].as_u64().unwrap() > 0, "{run}");
        for end in ["edge_cpu", "gateway_cpu"] {
            let cpu = &run[end];
            let seconds =
                cpu["user_seconds"].as_f64().unwrap() + cpu["system_seconds"].as_f64().unwrap();
            assert!(seconds > 0.0, "{end}: {run}");
        }
        assert!(run["ratio_to_tcp"].as_f64().unwrap() > 0.0, "{run}");
    }
    assert_eq!(report["summary"].as_array().unwrap().len(), 6);
    // The bench removes what it made.
    let left = midway_testkit::netns::namespaces_of_pid(pid);
    assert!(left.is_empty(), "left behind: {left:?}");
}
