//! Runs the full link-emulator selftest and prints its table (as root):
//! `cargo run --release -p midway-labnet --example selftest [--quick]`.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

fn main() -> Result<(), Box<dyn std::error::Error>> {
    midway_labnet::install_cleanup_on_signal()?;
    let quick = std::env::args().any(|a| a == "--quick");
    let opts = if quick {
        midway_labnet::selftest::SelftestOptions::quick()
    } else {
        midway_labnet::selftest::SelftestOptions::full()
    };
    let report = midway_labnet::selftest::run(&opts)?;
    print!("{report}");
    Ok(())
}
