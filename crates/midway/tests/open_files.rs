// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The open-file limit (issue 32): started with a low soft limit, midway raises its own as far
//! as the host allows (to the hard limit; with `CAP_SYS_RESOURCE` up to `fs.nr_open`), says how many connections that leaves room for,
//! and refuses a `max_connections` beyond it, at start and in `check-config`, with the numbers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use midway_testkit::host::{Launch, Place};
use midway_testkit::wait::wait_exit;

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(20);
/// The soft limit midway is started with: below what these configs need.
const STARTED_WITH: u64 = 1024;

fn write_config(dir: &Path, max_connections: u64) -> PathBuf {
    let path = dir.join("forward.toml");
    std::fs::write(
        &path,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\nmax_connections = {max_connections}\n\
             max_connections_per_client = 100\nmax_pipes = 0\nworker_threads = 1\n\
             [spool]\ndir = \"{}\"\n\n\
             [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"127.0.0.1:0\"\n\
             target = \"127.0.0.1:9\"\nrelay = \"buffer\"\n",
            dir.join("spool").display()
        ),
    )
    .unwrap();
    path
}

/// The soft "Max open files" of a running process.
fn soft_open_files(pid: u32) -> u64 {
    midway_sys::procfs::open_file_limit(pid).unwrap().0
}

/// As far as a process started by this one may raise its open-file limit: `fs.nr_open` with
/// `CAP_SYS_RESOURCE` (root, usually; some sandboxes take it away even from root), else the
/// hard limit.
fn ceiling() -> u64 {
    const CAP_SYS_RESOURCE: u32 = 24;
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
        .unwrap();
    if effective & (1 << CAP_SYS_RESOURCE) != 0 {
        midway_sys::sysctl::read_u64("fs.nr_open").unwrap()
    } else {
        midway_sys::fd_limit::open_file_limit().unwrap().hard
    }
}

#[test]
fn raises_its_limit_and_says_how_many_connections_it_has_room_for() {
    let ceiling = ceiling();
    assert!(
        ceiling >= 4 * STARTED_WITH,
        "a hard limit of {ceiling} is too low to test"
    );
    let dir = tempfile::tempdir().unwrap();
    // Two descriptors a connection: more than the start's soft limit has room for, well
    // within the ceiling.
    let wanted = ceiling / 4;
    let config = write_config(dir.path(), wanted);
    let mut midway = Launch::midway(MIDWAY, &config)
        .json_log()
        .fd_soft_limit(STARTED_WITH)
        .spawn(Place::Here)
        .unwrap();
    let line = midway
        .wait_for_line(LIMIT, "open-file limit line", |line| {
            line.contains("open-file limit")
        })
        .unwrap();
    midway.wait_ready(LIMIT).unwrap();
    assert_eq!(soft_open_files(midway.id()), ceiling, "{line}");
    let logged: serde_json::Value = serde_json::from_str(&line).unwrap();
    let fields = &logged["fields"];
    assert_eq!(fields["raised_from"], STARTED_WITH, "{line}");
    assert_eq!(fields["limit"], ceiling, "{line}");
    let room = fields["connections"].as_u64().unwrap();
    assert!(
        (wanted..ceiling / 2).contains(&room),
        "room for {room} connections: {line}"
    );
    assert!(midway.stop().unwrap().success());
}

#[test]
fn refuses_a_max_connections_beyond_the_hosts_ceiling() {
    let ceiling = ceiling();
    let dir = tempfile::tempdir().unwrap();
    // Two descriptors a connection: more connections than the ceiling has room for.
    let too_many = ceiling / 2 + 1;
    let config = write_config(dir.path(), too_many);
    let (lines, log) = std::sync::mpsc::channel();
    let mut midway = Launch::midway(MIDWAY, &config)
        .fd_soft_limit(STARTED_WITH)
        .log_lines(lines)
        .spawn(Place::Here)
        .unwrap();
    let status = wait_exit(midway.child_mut(), LIMIT, "midway did not exit");
    assert!(!status.success());
    // The exit can come before the reader thread has forwarded the last lines: read until it
    // hangs up at the end of stderr (bounded), not just what has arrived.
    let deadline = Instant::now() + LIMIT;
    let mut lines = Vec::new();
    while let Ok(line) = log.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        lines.push(line);
    }
    let stderr = lines.join("\n");
    assert!(
        stderr.contains(&format!("max_connections = {too_many}"))
            && stderr.contains(&format!("open-file limit is {ceiling}")),
        "{stderr}"
    );
}
/// `midway check-config CONFIG` with RLIMIT_NOFILE `soft`:`hard` and without
/// CAP_SYS_RESOURCE (dropped from the bounding and inheritable sets, so root loses it at exec).
fn check_config_without_cap_sys_resource(soft: u64, hard: u64, config: &Path) -> Output {
    Command::new("prlimit")
        .arg(format!("--nofile={soft}:{hard}"))
        .args([
            "setpriv",
            "--bounding-set=-sys_resource",
            "--inh-caps=-sys_resource",
        ])
        .args([MIDWAY, "check-config"])
        .arg(config)
        .output()
        .unwrap()
}

#[test]
fn without_cap_sys_resource_check_config_refuses_what_the_hard_limit_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    // Without CAP_SYS_RESOURCE the soft limit goes up to the hard limit (1,024 here) and no
    // further: 1,000 connections need about 2,000.
    let config = write_config(dir.path(), 1000);
    let out = check_config_without_cap_sys_resource(STARTED_WITH, STARTED_WITH, &config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("max_connections = 1000")
            && stderr.contains(&format!("open-file limit is {STARTED_WITH}")),
        "{stderr}"
    );
    // Within the hard limit it passes.
    let fits = write_config(dir.path(), 300);
    let out = check_config_without_cap_sys_resource(64, STARTED_WITH, &fits);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
