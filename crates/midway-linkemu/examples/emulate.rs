//! Runs one emulated link from the command line, for manual measurements:
//! `emulate NETNS_PATH IFACE_A IFACE_B DELAY_MS RATE_MBIT SECONDS [LOSS_P]` (rate 0 = unlimited).
//! Prints the statistics of both directions as JSON when done.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use midway_linkemu::{
    spawn_link_with_options, DirectionConfig, DirectionStats, DriverOptions, LossModel,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 6 {
        return Err(
            "usage: emulate NETNS_PATH IFACE_A IFACE_B DELAY_MS RATE_MBIT SECONDS [LOSS_P]".into(),
        );
    }
    let delay_ms: f64 = args[3].parse()?;
    let rate_mbit: f64 = args[4].parse()?;
    let seconds: u64 = args[5].parse()?;
    let loss: f64 = args.get(6).map(|p| p.parse()).transpose()?.unwrap_or(0.0);
    let config = DirectionConfig {
        delay: Duration::from_secs_f64(delay_ms / 1e3),
        rate_bps: (rate_mbit > 0.0).then_some((rate_mbit * 1e6) as u64),
        data_loss: if loss > 0.0 {
            LossModel::Bernoulli { p: loss }
        } else {
            LossModel::None
        },
        ..Default::default()
    };
    // LEMU_RT=0 runs the threads under the normal scheduler.
    let options = DriverOptions {
        realtime_priority: match std::env::var("LEMU_RT").as_deref() {
            Ok("0") => None,
            _ => DriverOptions::default().realtime_priority,
        },
        // LEMU_SPIN_US=N busy-polls the last N microseconds before each departure.
        busy_poll: std::env::var("LEMU_SPIN_US")
            .ok()
            .and_then(|us| us.parse().ok())
            .map(Duration::from_micros)
            .unwrap_or(DriverOptions::default().busy_poll),
    };
    let link = spawn_link_with_options(
        Path::new(&args[0]),
        &args[1],
        &args[2],
        config.clone(),
        config,
        1,
        options,
    )?;
    std::thread::sleep(Duration::from_secs(seconds));
    let (a_to_b, b_to_a) = link.stop();
    for (name, stats) in [("a_to_b", a_to_b), ("b_to_a", b_to_a)] {
        println!("{name}: {}", summary(&stats));
    }
    Ok(())
}

fn summary(stats: &DirectionStats) -> String {
    let mean_us = |total: u64| total as f64 / stats.sent_frames.max(1) as f64 / 1e3;
    format!(
        "arrived {} sent {} lost {} queue-dropped {} kernel-drops {} io-errors {} oversized {} partial-csum {} | send late: mean {:.1} us, max {:.1} us, >100us {} | receive late: mean {:.1} us, max {:.1} us",
        stats.arrived_frames,
        stats.sent_frames,
        stats.dropped_loss_frames,
        stats.dropped_queue_frames,
        stats.kernel_drops,
        stats.io_errors,
        stats.oversized_frames,
        stats.partial_checksum_frames,
        mean_us(stats.send_lateness_total_ns),
        stats.send_lateness_max_ns as f64 / 1e3,
        stats.late_sends,
        mean_us(stats.receive_lateness_total_ns),
        stats.receive_lateness_max_ns as f64 / 1e3,
    )
}
