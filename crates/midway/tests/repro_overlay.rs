// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! CI: the quick overlay reproduction (`midway lab reproduce overlay --quick`, figures 8-11).
//! Asserts only what is robust: every point ran; with 64 KB end hosts the direct transfer is
//! window-limited below 80 % of the 70 Mbit/s bottleneck on the short path; every fig. 11 record
//! carries the competing Reno flow's throughput; the report holds the paper-vs-lab table.
//! Through the two midways, 64 KB end hosts move more than directly.

use midway_testkit::host::{is_root, TempDir};
use midway_testkit::repro::*;

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");

/// The bottleneck between the proxies, Mbit/s (the paper's estimate).
const BOTTLENECK_MBPS: f64 = 70.0;

#[test]
fn quick_overlay_reproduction() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let out = TempDir::new("repro-overlay");
    let (records, report) = reproduce_quick_cases(MIDWAY, "overlay", &[], &[], &out.0);
    assert_complete(&records, &out.0);
    let mbps = |experiment: &str, case: &str, x: f64| {
        median(&records, experiment, case, x)
            .unwrap_or_else(|| panic!("{experiment}: no {case} run at {x}"))
            / 1e6
    };
    // 64 KB end-host buffers cannot fill the 18 ms path's 150 KB bandwidth-delay product.
    let direct_64k = mbps("fig8-9-short", "direct", 65536.0);
    assert!(
        direct_64k < 0.8 * BOTTLENECK_MBPS,
        "direct with 64 KB buffers moved {direct_64k:.1} Mbit/s"
    );
    // Fig. 11: the competing end-to-end Reno flow ran beside every measured transfer.
    let fig11: Vec<_> = records
        .iter()
        .filter(|r| r.experiment == "fig11-long")
        .collect();
    assert!(!fig11.is_empty(), "no fig. 11 records");
    for record in fig11 {
        assert!(
            record
                .extra
                .get("competing_throughput_mbps")
                .is_some_and(|m| *m > 0.0),
            "{}: no competing flow: {:?}",
            record.case,
            record.extra
        );
        assert_eq!(
            record
                .params
                .get("competing_congestion_control")
                .and_then(|v| v.as_str()),
            Some("reno")
        );
    }
    // Through the two midways, 64 KB end hosts move more than directly (figs. 8-9).
    let chain_64k = mbps("fig8-9-short", "chain-reno", 65536.0);
    assert!(
        chain_64k > direct_64k,
        "chain-reno {chain_64k:.1} Mbit/s is not above direct {direct_64k:.1} Mbit/s"
    );
    assert_claims_table_filled(&report, "overlay");
}
