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
    about = "Transfers through every intercept mode and relay model under resets, stalls, loss, outages, reloads, upgrades and kill -9 (root)"
)]
struct Args {
    /// The midway binary.
    #[arg(long, default_value = "target/release/midway")]
    midway: PathBuf,
    /// The short form for CI (about 2,000 transfers) instead of the full 100,000.
    #[arg(long)]
    quick: bool,
    /// Transfers in all (overrides the form's count).
    #[arg(long)]
    transfers: Option<u64>,
    /// Seed of every random choice.
    #[arg(long)]
    seed: Option<u64>,
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
    if let Some(seed) = args.seed {
        options.seed = seed;
    }
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
