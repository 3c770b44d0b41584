//! Several gateways behind ECMP (issue 32; design in docs/ecmp.md), as root:
//! `cargo build --locked --release -p midway && cargo run --locked --release -p midway-lab --example ecmp`.
//! Options: `--midway PATH` (default target/release/midway), `--out DIR` (default
//! lab-results/ecmp). Writes DIR/report.md; exits non-zero when a claim fails.

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser)]
struct Cli {
    /// The midway binary the gateways run.
    #[arg(long, default_value = "target/release/midway")]
    midway: PathBuf,
    /// The run's folder.
    #[arg(long, default_value = "lab-results/ecmp")]
    out: PathBuf,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let options = midway_lab::EcmpOptions {
        midway: cli.midway,
        out: cli.out,
    };
    match midway_lab::run_ecmp(&options) {
        Ok((report, all_hold)) => {
            println!("{}", report.display());
            if all_hold {
                std::process::ExitCode::SUCCESS
            } else {
                eprintln!("midway ecmp: some claims fail, see the report");
                std::process::ExitCode::FAILURE
            }
        }
        Err(error) => {
            eprintln!("midway ecmp: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
