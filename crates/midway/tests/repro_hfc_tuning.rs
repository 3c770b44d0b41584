//! CI: the quick hfc-tuning reproduction (`midway lab reproduce hfc-tuning --quick`, figures
//! 4, 8-10, 15 and 17). Asserts only what is robust: every point ran, the untuned local server
//! (direct) is slower than midway at the headend at >= 1 % data loss, the duplicate-ACK
//! threshold reaches a returning client's connection, and the report holds its plots and the
//! claims table.

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
        &[
            "fig4-15-17-legacy",
            "fig4-15-17-modern",
            "fig8-10-legacy",
            "fig15-17-warm-legacy",
        ],
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
    // The duplicate-ACK threshold reaches a returning client's connection: after the warm-up
    // the headend's tcp_metrics cache holds reordering 1 for the client, and only for the
    // profiles that set it.
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
                assert_ne!(cached, Some(1.0), "{}: {:?}", record.case, record.extra)
            }
            _ => {}
        }
    }
    assert_claims_table_filled(&report, "hfc-tuning");
}
