//! CI: the quick hfc-proxy reproduction (`midway lab reproduce hfc-proxy --quick`, figures 5,
//! 7, 8 and 9). Asserts only what is robust: every point ran, direct is slower than the proxy
//! at >= 1 % local loss, and the report holds its plots and the paper-vs-lab table filled from
//! the measured data.

mod repro_common;
use repro_common::*;

#[test]
fn quick_hfc_proxy_reproduction() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let out = TempDir::new("repro-hfc-proxy");
    let (records, report) = reproduce_quick(
        "hfc-proxy",
        &["fig8-9-legacy", "fig8-9-modern", "fig5-7-legacy"],
        &out.0,
    );
    assert_complete(&records, &out.0);
    for experiment in ["fig8-9-legacy", "fig8-9-modern"] {
        // --quick keeps the first, middle and last loss values: 0, 1 and 3 %.
        for loss in [1.0, 3.0] {
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
    }
    assert_claims_table_filled(&report, "hfc-proxy");
}
