// Tests: an unwrap that fails is the test failing.
#![allow(clippy::unwrap_used)]
//! The real binary registers midway's BPF congestion controls when a profile names them: both
//! are listed in `tcp_available_congestion_control` while it runs and gone after it exits, and
//! nothing else on the host changes (issue 16).

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use midway_testkit::host::{is_root, listening_addr, StopOnDrop};
use midway_testkit::wait::{poll_until, wait_exit};

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(20);
const KERNEL_NAMES: [&str; 2] = ["mw_highspeed", "mw_gentle_hs"];

fn listed() -> Vec<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap()
        .split_whitespace()
        .filter(|name| KERNEL_NAMES.contains(name))
        .map(str::to_owned)
        .collect()
}

#[test]
fn registered_while_midway_runs_and_gone_after_it_exits() {
    if !is_root() {
        eprintln!("skipped: registering BPF congestion controls needs root");
        return;
    }
    assert!(
        listed().is_empty(),
        "registered before the test: {:?}",
        listed()
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bpf.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\n[spool]\ndir = \"{}\"\n\
             [profiles.long-fat]\ncongestion_control = \"highspeed\"\n\
             [profiles.gentle]\ncongestion_control = \"gentle-highspeed\"\n\n\
             [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"127.0.0.1:0\"\n\
             target = \"127.0.0.1:9\"\nlocal_profile = \"gentle\"\nremote_profile = \"long-fat\"\n",
            dir.path().join("spool").display()
        ),
    )
    .unwrap();
    let mut midway = StopOnDrop(
        Command::new(MIDWAY)
            .args(["--log-format", "json", "proxy", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (log_tx, _log) = mpsc::channel();
    listening_addr(midway.stderr.take().unwrap(), log_tx, LIMIT);
    assert_eq!(listed().len(), 2, "while running: {:?}", listed());

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(midway.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_exit(&mut midway, LIMIT, "midway did not stop");
    assert!(status.success(), "exit status {status}");
    // The kernel frees a struct_ops map after an RCU grace period: a moment, not at once.
    assert!(
        poll_until(Duration::from_secs(10), || listed().is_empty()),
        "still registered after midway exited: {:?}",
        listed()
    );
}
