// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! CI: the quick satellite and umts reproductions (`midway lab reproduce satellite --quick`,
//! `... umts --quick`), the web experiments of issue 5. Asserts only what is robust: every point
//! ran and recorded a page load time, the reports hold their tables and the paper-vs-lab table
//! filled from measured data, and on the GEO link midway-http with a cache hit loads the page
//! faster than direct HTTP/1.0 (one round trip per request against two per object plus slow
//! start: several seconds apart, far beyond run-to-run noise).

use midway_report::RunRecord;
use midway_testkit::host::{is_root, TempDir};
use midway_testkit::repro::*;

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");

/// Every record is a web run: it carries a positive page load time.
fn assert_page_loads_recorded(records: &[RunRecord]) {
    assert!(!records.is_empty(), "no records");
    for record in records {
        let seconds = record.extra.get("page_load_seconds").copied();
        assert!(
            seconds.is_some_and(|s| s > 0.0 && s.is_finite()),
            "{} / {} rep {}: no page load time in {:?}",
            record.experiment,
            record.case,
            record.repetition,
            record.extra
        );
    }
}

/// The report shows the web experiments as page load times.
fn assert_page_load_tables(report: &str) {
    assert!(
        report.to_lowercase().contains("page load"),
        "the report has no page load table:\n{report}"
    );
}

#[test]
fn quick_satellite_reproduction() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let out = TempDir::new("repro-satellite");
    let (records, report) = reproduce_quick(MIDWAY, "satellite", &["target", "fig5-6-65k"], &out.0);
    assert_complete(&records, &out.0);
    assert_page_loads_recorded(&records);
    // target: x = 0 is HTTP/1.0 with a plain request, x = 2 pipelining with a cache hit.
    let direct = median_page_load(&records, "target", "direct", 0.0)
        .expect("target: no direct HTTP/1.0 run");
    let cached = median_page_load(&records, "target", "midway-http", 2.0)
        .expect("target: no midway-http pipelining + hit run");
    assert!(
        cached < direct,
        "target: midway-http with a hit took {cached:.2} s, direct HTTP/1.0 {direct:.2} s"
    );
    // fig5-6-65k: one 65 KB file; x = 1 is a hit through the cache, x = 0 a miss (direct has no
    // cache: its miss is an ordinary HTTP/1.0 download).
    let direct =
        median_page_load(&records, "fig5-6-65k", "direct", 0.0).expect("fig5-6-65k: no direct run");
    let cached = median_page_load(&records, "fig5-6-65k", "midway-http", 1.0)
        .expect("fig5-6-65k: no midway-http hit run");
    assert!(
        cached < direct,
        "fig5-6-65k: midway-http with a hit took {cached:.2} s, direct {direct:.2} s"
    );
    assert_page_load_tables(&report);
    assert_claims_table_filled(&report, "satellite");
}

#[test]
fn quick_umts_reproduction() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let out = TempDir::new("repro-umts");
    let (records, report) = reproduce_quick(MIDWAY, "umts", &["table1", "fig13-14-loss"], &out.0);
    assert_complete(&records, &out.0);
    assert_page_loads_recorded(&records);
    for case in ["direct", "midway-tcp", "squid", "midway-http"] {
        for x in [0.0, 1.0, 2.0] {
            assert!(
                median_page_load(&records, "table1", case, x).is_some(),
                "table1: no {case} run at HTTP configuration {x}"
            );
        }
    }
    assert_page_load_tables(&report);
    assert_claims_table_filled(&report, "umts");
}
