// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The real binary registers midway's BPF congestion controls when a profile names them: both
//! are listed in `tcp_available_congestion_control` while it runs and gone after it exits, and
//! nothing else on the host changes (issue 16). A binary upgrade hands the registrations over:
//! they stay while the new process runs, after the old one exited (issue 17).

use std::sync::mpsc;
use std::time::Duration;

use midway_testkit::host::{is_root, listening_addr, spawn_midway, Place, Running};
use midway_testkit::wait::{poll_until, wait_exit};

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(20);
const KERNEL_NAMES: [&str; 2] = ["mw_highspeed", "mw_gentle_hs"];

/// The tests here look at one kernel-wide list: one at a time.
static KERNEL_LIST: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn listed() -> Vec<String> {
    midway_sys::sysctl::available_congestion_controls()
        .unwrap()
        .into_iter()
        .filter(|name| KERNEL_NAMES.contains(&name.as_str()))
        .collect()
}

#[test]
fn registered_while_midway_runs_and_gone_after_it_exits() {
    if !is_root() {
        eprintln!("skipped: registering BPF congestion controls needs root");
        return;
    }
    let _one_at_a_time = KERNEL_LIST.lock().unwrap_or_else(|p| p.into_inner());
    assert!(
        listed().is_empty(),
        "registered before the test: {:?}",
        listed()
    );
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "127.0.0.1:0");
    let (mut midway, _log) = start(&config, &[]);
    listening_addr(&mut midway, LIMIT);
    assert_eq!(listed().len(), 2, "while running: {:?}", listed());

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(midway.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_exit(midway.child_mut(), LIMIT, "midway did not stop");
    assert!(status.success(), "exit status {status}");
    // The kernel frees a struct_ops map after an RCU grace period: a moment, not at once.
    assert!(
        poll_until(Duration::from_secs(10), || listed().is_empty()),
        "still registered after midway exited: {:?}",
        listed()
    );
}

/// A config whose two profiles name both controls, with one forward listener on `listen`.
fn write_config(dir: &std::path::Path, listen: &str) -> std::path::PathBuf {
    let config = dir.join("bpf.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\n[spool]\ndir = \"{}\"\n\
             [profiles.long-fat]\ncongestion_control = \"highspeed\"\n\
             [profiles.gentle]\ncongestion_control = \"gentle-highspeed\"\n\n\
             [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"{listen}\"\n\
             target = \"127.0.0.1:9\"\nlocal_profile = \"gentle\"\nremote_profile = \"long-fat\"\n",
            dir.join("spool").display()
        ),
    )
    .unwrap();
    config
}

fn start(config: &std::path::Path, extra: &[&str]) -> (Running, mpsc::Receiver<String>) {
    spawn_midway(MIDWAY, Place::Here, config, extra)
}

fn stop(midway: &mut Running, what: &str) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(midway.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_exit(midway.child_mut(), LIMIT, what);
    assert!(status.success(), "{what}: exit status {status}");
}

#[test]
fn a_take_over_keeps_them_registered_until_the_new_process_exits() {
    if !is_root() {
        eprintln!("skipped: registering BPF congestion controls needs root");
        return;
    }
    let _one_at_a_time = KERNEL_LIST.lock().unwrap_or_else(|p| p.into_inner());
    assert!(
        listed().is_empty(),
        "registered before the test: {:?}",
        listed()
    );
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = write_config(dir.path(), &format!("127.0.0.1:{port}"));
    let (mut old, _old_log) = start(&config, &[]);
    listening_addr(&mut old, LIMIT);
    assert_eq!(
        listed().len(),
        2,
        "while the old process runs: {:?}",
        listed()
    );

    let (mut new, new_log) = start(&config, &["--take-over"]);
    listening_addr(&mut new, LIMIT);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("took over")) {
        seen.push(
            new_log
                .recv_timeout(LIMIT)
                .unwrap_or_else(|_| panic!("the new process never took over: {seen:#?}")),
        );
    }
    // No connection is open: the old process drains at once and exits by itself.
    let status = wait_exit(old.child_mut(), LIMIT, "the old process did not exit");
    assert!(status.success(), "old exit status {status}");
    // Given time to go if the old process's exit had unregistered them.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        listed().len(),
        2,
        "the new process lost the registrations: {:?}",
        listed()
    );

    stop(&mut new, "the new process did not stop");
    assert!(
        poll_until(Duration::from_secs(10), || listed().is_empty()),
        "still registered after the new process exited: {:?}",
        listed()
    );
}
