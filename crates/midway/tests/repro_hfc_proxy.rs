// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! CI: the quick hfc-proxy reproduction (`midway lab reproduce hfc-proxy --quick`, figures 8,
//! 9 and 12; fig. 5's size sweep ends at the paper's 3 MB, about a minute a point on 8 KB
//! windows, and the quick form keeps a sweep's last value). Asserts only what is robust: every
//! point ran, direct is slower than the proxy at 3 % local loss, every record has the fig. 11
//! segment times, and the report holds its plots and the paper-vs-lab table filled from the
//! measured data.
//!
//! Not at 10 %: there a single run of a direct transfer varies by more than the proxies' gain
//! (in the full reproduction's five runs the proxy-to-direct ratio ranges over 1.67-3.73, and a
//! CI run on 2026-12-02 saw direct at 116 kbit/s against the full run's median of 47, above
//! store-and-forward's 114), so one quick run cannot show the order; the full reproduction
//! judges that claim on five paired runs with its interval.

use midway_testkit::host::{is_root, TempDir};
use midway_testkit::repro::*;

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");

#[test]
fn quick_hfc_proxy_reproduction() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let out = TempDir::new("repro-hfc-proxy");
    let (records, report) = reproduce_quick(
        MIDWAY,
        "hfc-proxy",
        &["fig8-9-legacy", "fig8-9-modern", "fig12-legacy"],
        &out.0,
    );
    assert_complete(&records, &out.0);
    // --quick keeps the first, middle and last loss values: 0, 3 and 10 %.
    let loss = 3.0;
    for experiment in ["fig8-9-legacy", "fig8-9-modern"] {
        let direct = median(&records, experiment, "direct", loss)
            .unwrap_or_else(|| panic!("{experiment}: no direct run at {loss} %"));
        for proxy in ["store-and-forward", "midway"] {
            let proxied = median(&records, experiment, proxy, loss)
                .unwrap_or_else(|| panic!("{experiment}: no {proxy} run at {loss} %"));
            assert!(
                direct < proxied,
                "{experiment} at {loss} % loss: direct {direct:.0} bit/s is not below {proxy} {proxied:.0} bit/s"
            );
        }
    }
    // Fig. 11 needs both segment completion times in every record.
    for record in &records {
        for metric in ["remote_segment_seconds", "local_segment_seconds"] {
            assert!(
                record.extra.get(metric).is_some_and(|s| *s > 0.0),
                "{} {}: no {metric}: {:?}",
                record.experiment,
                record.case,
                record.extra
            );
        }
    }
    assert_claims_table_filled(&report, "hfc-proxy");
}
