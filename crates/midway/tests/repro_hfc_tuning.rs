// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! CI: the quick hfc-tuning reproduction (`midway lab reproduce hfc-tuning --quick`, figures
//! 4, 8-10, 15 and 17). Asserts only what is robust: every point ran, the untuned local server
//! (direct) is slower than midway at the headend under 1 % and 3 % data loss taken together
//! (modern hosts), the duplicate-ACK
//! threshold reaches a returning client's connection, fig. 10's runs moved three parallel
//! connections, and the report holds its plots and the claims table.

use midway_testkit::host::{is_root, TempDir};
use midway_testkit::repro::*;

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");

#[test]
fn quick_hfc_tuning_reproduction() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let out = TempDir::new("repro-hfc-tuning");
    let (records, report) = reproduce_quick(
        MIDWAY,
        "hfc-tuning",
        &[
            "fig4-15-17-legacy",
            "fig4-15-17-modern",
            "fig8-10-legacy",
            "fig10-3conn-legacy",
            "fig15-17-warm-legacy",
        ],
        &out.0,
    );
    assert_complete(&records, &out.0);
    // On modern hosts midway (hfc-local) beats the untuned local server under data loss: in the
    // full runs every repetition at 3 % and the medians at 1 %. The quick form runs each point
    // once, and one run at one loss rate was seen to flip (direct 2.52 against midway 2.47
    // Mbit/s at 3 %, both outside the full runs' ranges), so the two lossy points are summed.
    // On a legacy headend hfc-local keeps the host's locked 1 s RTO floor (the marked routing
    // table copies the route's metrics, and a per-socket RTO floor cannot undercut a locked
    // one), so there it ties with direct; it is not asserted.
    let experiment = "fig4-15-17-modern";
    let sum = |case: &str| -> f64 {
        [1.0, 3.0]
            .iter()
            .map(|&loss| {
                median(&records, experiment, case, loss)
                    .unwrap_or_else(|| panic!("{experiment}: no {case} run at {loss} %"))
            })
            .sum()
    };
    let (direct, proxied) = (sum("direct"), sum("midway"));
    assert!(
        direct < proxied,
        "{experiment} at 1 % + 3 % loss: direct {direct:.0} bit/s is not below midway {proxied:.0} bit/s"
    );
    // The duplicate-ACK threshold reaches a returning client's connection: after the warm-up
    // the headend's tcp_metrics cache holds reordering 1 for the client in the profiles that set
    // it, and Linux's 3, written out and locked, in the untuned pinned ones (a Reno sender's own
    // lowered threshold is not cached there).
    for record in records
        .iter()
        .filter(|r| r.experiment == "fig15-17-warm-legacy")
    {
        let cached = record.extra.get("cached_reordering").copied();
        match record.case.as_str() {
            "dupack-pinned" | "both-pinned" | "midway" => {
                assert_eq!(cached, Some(1.0), "{}: {:?}", record.case, record.extra)
            }
            "untuned-pinned" | "timer-pinned" => {
                assert_eq!(cached, Some(3.0), "{}: {:?}", record.case, record.extra)
            }
            _ => {}
        }
    }
    // Fig. 10: three parallel connections per run, each moving the quick run's 100 KB.
    let parallel: Vec<_> = records
        .iter()
        .filter(|r| r.experiment == "fig10-3conn-legacy")
        .collect();
    assert!(!parallel.is_empty(), "no fig10-3conn-legacy records");
    for record in parallel {
        assert_eq!(
            record.params.get("connections").and_then(|v| v.as_u64()),
            Some(3)
        );
        assert_eq!(record.bytes, 3 * 100_000, "{record:?}");
    }
    assert_claims_table_filled(&report, "hfc-tuning");
}
