//! CI: the quick hfc-tuning reproduction (`midway lab reproduce hfc-tuning --quick`, figures
//! 4, 8-10, 15 and 17). Asserts
//! only what is robust: every point ran, the untuned local server (direct) is slower than midway
//! at the headend at >= 1 % data loss, and the report holds its plots and the claims table.

mod repro_common;
use repro_common::*;

#[test]
fn quick_hfc_tuning_reproduction() {
    if !is_root() {
        eprintln!("skipped: needs root for network namespaces");
        return;
    }
    let out = TempDir::new("repro-hfc-tuning");
    let (records, report) = reproduce_quick(
        "hfc-tuning",
        &["fig4-15-17-legacy", "fig4-15-17-modern", "fig8-10-legacy"],
        &out.0,
    );
    assert_complete(&records, &out.0);
    for experiment in ["fig4-15-17-legacy", "fig4-15-17-modern"] {
        for loss in [1.0, 3.0] {
            let direct = median(&records, experiment, "direct", loss)
                .unwrap_or_else(|| panic!("{experiment}: no direct run at {loss} %"));
            let proxied = median(&records, experiment, "midway", loss)
                .unwrap_or_else(|| panic!("{experiment}: no midway run at {loss} %"));
            assert!(
                direct < proxied,
                "{experiment} at {loss} % loss: direct {direct:.0} bit/s is not below midway {proxied:.0} bit/s"
            );
        }
    }
    assert_claims_table_filled(&report, "hfc-tuning");
}
