//! `midway lab` without the rest of the binary, for working on the lab alone:
//! `cargo run -p midway-lab --example lab -- run scenarios/hfc-demo.toml --quick`.
//! Proxy cases need `MIDWAY_BIN` pointing at a built `midway`.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: midway_lab::LabCommand,
}

fn main() -> std::process::ExitCode {
    match midway_lab::execute(Cli::parse().command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("midway lab: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
