//! `midway-faults`: the fault campaign (see `midway_bench::faults`). Prints its figures and
//! exits non-zero when any transfer ended cleanly but truncated or corrupted.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use midway_bench::faults::{run_campaign, CampaignOptions};

#[derive(Parser)]
#[command(
    name = "midway-faults",
    about = "Transfers through every intercept mode and relay model, and through an edge and a gateway midway over each peer transport, under resets, stalls, loss, outages, reloads, upgrades and kill -9 (root)"
)]
struct Args {
    /// The midway binary.
    #[arg(long, default_value = "target/release/midway")]
    midway: PathBuf,
    /// The short form for CI (2,000 transfers through one midway and 900 through two) instead
    /// of the full 100,000 and 30,000.
    #[arg(long)]
    quick: bool,
    /// Transfers through one midway (overrides the form's count).
    #[arg(long)]
    transfers: Option<u64>,
    /// Transfers through two midways, edge and gateway (overrides the form's count).
    #[arg(long)]
    peer_transfers: Option<u64>,
    /// Seed of every random choice.
    #[arg(long)]
    seed: Option<u64>,
    /// Keep the midways' configs and logs (printed at the end; kept anyway when a transfer
    /// ended cleanly but truncated or corrupted).
    #[arg(long)]
    keep_logs: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut options = if args.quick {
        CampaignOptions::quick(args.midway)
    } else {
        CampaignOptions::full(args.midway)
    };
    if let Some(transfers) = args.transfers {
        options.transfers = transfers;
    }
    if let Some(transfers) = args.peer_transfers {
        options.peer_transfers = transfers;
    }
    if let Some(seed) = args.seed {
        options.seed = seed;
    }
    options.keep_logs = args.keep_logs;
    match run_campaign(&options) {
        Ok(report) => {
            print!("{}", report.render());
            if report.truncated_or_corrupted == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("midway-faults: {error:#}");
            ExitCode::FAILURE
        }
    }
}
