//! The lab issue's acceptance test: a two-host topology, the selftest in its quick form, measured
//! RTT / rate / loss asserted against the configuration (needs root).

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use midway_labnet::selftest::{self, SelftestOptions, RATE_TOLERANCE, RTT_TOLERANCE};

#[test]
fn quick_selftest_matches_the_configuration() {
    let opts = SelftestOptions::quick();
    let report = selftest::run(&opts).expect("selftest runs");
    eprintln!("{report}");
    assert_eq!(report.rows.len(), opts.rates_bps.len());
    let row = &report.rows[0];
    assert!(
        row.rtt_samples >= opts.rtt_probes / 2,
        "too few RTT samples: {}",
        row.rtt_samples
    );
    assert!(
        row.measured_rtt.abs_diff(row.expected_rtt) <= RTT_TOLERANCE,
        "RTT {:?} vs configured {:?}",
        row.measured_rtt,
        row.expected_rtt
    );
    assert!(
        (row.measured_goodput_bps / row.expected_goodput_bps - 1.0).abs() <= RATE_TOLERANCE,
        "goodput {} vs expected {} bit/s",
        row.measured_goodput_bps,
        row.expected_goodput_bps
    );
    let lost = row.loss_sent - row.loss_received;
    assert!(
        row.loss_sent >= 500,
        "enough loss probes: {}",
        row.loss_sent
    );
    assert!(
        (row.loss_bounds.0..=row.loss_bounds.1).contains(&lost),
        "lost {lost} of {} (p = {})",
        row.loss_sent,
        opts.loss
    );
    assert!(lost > 0, "2 % loss configured but nothing lost");
    assert_eq!(report.highest_passing_rate_bps, Some(opts.rates_bps[0]));
    assert!(report.goal_met() && report.all_passed());
}
