//! The fault campaign's quick form (2,000 transfers through one midway and 900 through an edge
//! and a gateway, issue 17) end to end through the `midway-faults` command: it must run every
//! path (each peer transport included) and process fault and find no transfer that ended
//! cleanly but truncated or corrupted. The full campaign (100,000 and 30,000 transfers) is the
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
        "edge+gateway, tcp",
        "edge+gateway, tls",
        "edge+gateway, quic",
    ] {
        let row = rows
            .iter()
            .find(|r| r.starts_with(&format!("| {path} |")))
            .unwrap_or_else(|| panic!("no row for {path}: {stdout}"));
        let intact: u64 = row.split('|').nth(3).unwrap().trim().parse().unwrap();
        assert!(intact > 0, "no intact transfer through {path}: {stdout}");
    }
    // Both midways' faults: reloads, upgrades, kill -9 and their link's outages.
    for prefix in ["process faults:", "gateway midway"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?}: {stdout}"));
        let counts: Vec<u64> = line
            .replace("kill -9", "kill")
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        assert_eq!(counts.len(), 4, "{line}");
        assert!(
            counts.iter().all(|&n| n > 0),
            "a fault never happened: {line}"
        );
    }
    assert!(
        stdout.contains("| **all** |") && stdout.contains("| **0** |"),
        "{stdout}"
    );
}
