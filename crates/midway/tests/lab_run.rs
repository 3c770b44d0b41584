// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End to end: the README's main experiment in its quick form, with the real binary as the lab
//! runner and as the proxy. Needs root (network namespaces); skipped with a message otherwise.

use std::process::Command;

use midway_report::RunRecord;
use midway_testkit::host::{is_root, output_and_pid, repo_root, TempDir};
use midway_testkit::netns::namespaces_of_pid;

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");

#[test]
fn quick_hfc_demo_measures_every_case_and_writes_the_report() {
    if !is_root() {
        eprintln!("skipped: `midway lab run` needs root");
        return;
    }
    let out = TempDir::new("lab-run");
    let out_dir = out.0.join("run");
    let (pid, output) = output_and_pid(
        Command::new(MIDWAY)
            .args(["lab", "run", "scenarios/hfc-demo.toml", "--quick", "--out"])
            .arg(&out_dir)
            .current_dir(repo_root()),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("report: "), "{stdout}");

    let records = midway_report::read_records(&out_dir.join(midway_report::RESULTS_FILE)).unwrap();
    assert_eq!(
        records.len(),
        11,
        "3 loss values x 3 cases, then server-held's 2 cases"
    );
    for case in ["direct", "midway", "haproxy"] {
        let mine: Vec<&RunRecord> = records
            .iter()
            .filter(|r| r.case == case && r.experiment == "local-loss")
            .collect();
        assert_eq!(mine.len(), 3, "{case}");
        for record in mine {
            assert!(record.ok, "{case} failed: {:?}", record.error);
            assert_eq!(record.bytes, 300_000);
            assert!(record.throughput_bps > 0.0);
            assert_eq!(record.scenario, "hfc-demo");
            assert_eq!(record.scenario_file, "scenarios/hfc-demo.toml");
            assert_eq!(record.sweep_param.as_deref(), Some("local loss (%)"));
        }
    }
    // server-held: 10 MB in the quick form, and the server's connection time was measured.
    for case in ["haproxy-tuned", "midway-spool"] {
        let record = records
            .iter()
            .find(|r| r.case == case && r.experiment == "server-held")
            .unwrap_or_else(|| panic!("no server-held run of {case}"));
        assert!(record.ok, "{case} failed: {:?}", record.error);
        assert_eq!(record.bytes, 10_000_000);
        assert!(
            record
                .extra
                .get("remote_segment_seconds")
                .is_some_and(|s| *s > 0.0),
            "{case}: {:?}",
            record.extra
        );
    }
    // midway's own counters were read from its metrics endpoint.
    let midway_record = records.iter().find(|r| r.case == "midway").unwrap();
    assert!(
        midway_record.retransmits.contains_key("proxy-local"),
        "{:?}",
        midway_record.retransmits
    );
    assert!(out_dir.join("report.md").exists());
    let left = namespaces_of_pid(pid);
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

#[test]
fn check_names_the_line_of_a_bad_value_without_root() {
    let fixture =
        repo_root().join("crates/midway-lab/tests/fixtures/bad-scenario/negative-delay.toml");
    let output = Command::new(MIDWAY)
        .args(["lab", "check"])
        .arg(&fixture)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("line 19"), "{stderr}");
    assert!(stderr.contains("negative"), "{stderr}");

    let good = Command::new(MIDWAY)
        .args(["lab", "check", "scenarios/hfc-demo.toml"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert!(String::from_utf8_lossy(&good.stdout).contains("is valid"));
}
