//! The fault campaign's quick form (about 2,000 transfers, issue 17) end to end through the
//! `midway-faults` command: it must run every path and process fault and find no transfer that
//! ended cleanly but truncated or corrupted. The full campaign (100,000 transfers) is the
//! command itself (README).
//!
//! Ignored by default because it needs root and the release build of `midway`; `scripts/test`
//! runs it after the workspace tests have built that binary.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use midway_testkit::host::midway_binary;
use std::process::Command;

#[test]
#[ignore = "needs root and target/release/midway; run with --ignored"]
fn the_quick_campaign_finds_no_truncated_or_corrupted_transfer() {
    let result = Command::new(env!("CARGO_BIN_EXE_midway-faults"))
        .arg("--midway")
        .arg(midway_binary())
        .arg("--quick")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&result.stdout);
    let stderr = String::from_utf8_lossy(&result.stderr);
    println!("{stdout}");
    assert!(result.status.success(), "{stdout}\n{stderr}");
    // Every path carried transfers, and every kind of process fault happened at least once.
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("| ")).collect();
    for path in [
        "forward, buffer",
        "forward, spool",
        "socks5, buffer",
        "socks5, spool",
        "transparent, buffer",
        "transparent, spool",
        "http CONNECT",
    ] {
        let row = rows
            .iter()
            .find(|r| r.starts_with(&format!("| {path} |")))
            .unwrap_or_else(|| panic!("no row for {path}: {stdout}"));
        let intact: u64 = row.split('|').nth(3).unwrap().trim().parse().unwrap();
        assert!(intact > 0, "no intact transfer through {path}: {stdout}");
    }
    assert!(
        stdout.contains("| **all** |") && stdout.contains("| **0** |"),
        "{stdout}"
    );
}
