// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! midway as a systemd service, without systemd: the unit and the default configuration the
//! package installs (`packaging/`) are checked as shipped, and the real binary speaks the
//! notification protocol to a socket this test holds in the manager's place (`NOTIFY_SOCKET`):
//! READY=1 once it serves, WATCHDOG=1 at half `WATCHDOG_USEC`, RELOADING=1 with the monotonic
//! time then READY=1 around a SIGHUP, STOPPING=1 at SIGTERM.

use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

use midway_testkit::host::repo_root;
use midway_testkit::wait::wait_exit;

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(20);

/// A child process killed if the test fails before it stops it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The next notification that contains `wanted`, within [`LIMIT`]; every one read is kept in
/// `seen` for the failure message.
fn wait_for(socket: &UnixDatagram, seen: &mut Vec<String>, wanted: &str) -> String {
    let deadline = Instant::now() + LIMIT;
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        socket
            .set_read_timeout(Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            ))
            .unwrap();
        let Ok(n) = socket.recv(&mut buf) else { break };
        let message = String::from_utf8_lossy(&buf[..n]).into_owned();
        seen.push(message.clone());
        if message.contains(wanted) {
            return message;
        }
    }
    panic!("no {wanted:?} within {LIMIT:?}; got {seen:?}");
}

#[test]
fn notifies_ready_watchdog_reload_and_stop() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("forward.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\n\
             [spool]\ndir = \"{}\"\n\n\
             [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"127.0.0.1:0\"\n\
             target = \"127.0.0.1:9\"\n",
            dir.path().join("spool").display()
        ),
    )
    .unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    // systemd names the process the watchdog is meant for (WATCHDOG_PID): the shell's own pid,
    // which exec hands to midway.
    let child = Command::new("sh")
        .arg("-c")
        .arg("WATCHDOG_PID=$$ exec \"$0\" --log-format json proxy --config \"$1\"")
        .arg(MIDWAY)
        .arg(&config)
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "400000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let pid = nix::unistd::Pid::from_raw(child.0.id() as i32);
    let mut seen = Vec::new();
    let ready = wait_for(&socket, &mut seen, "READY=1");
    assert!(!ready.contains("MAINPID"), "{ready:?}");
    // Two pings at half the 400 ms watchdog.
    let started = Instant::now();
    wait_for(&socket, &mut seen, "WATCHDOG=1");
    wait_for(&socket, &mut seen, "WATCHDOG=1");
    assert!(started.elapsed() < Duration::from_secs(2), "{seen:?}");

    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let reloading = wait_for(&socket, &mut seen, "RELOADING=1");
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading:?}");
    wait_for(&socket, &mut seen, "READY=1");

    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    wait_for(&socket, &mut seen, "STOPPING=1");
    let status = wait_exit(&mut child.0, LIMIT, "midway did not stop");
    assert!(status.success(), "{status}");
}

/// The shipped default configuration loads as it is, and the unit passes `systemd-analyze
/// verify` (its binary path pointed at the one under test: verify checks that it exists).
#[test]
fn the_packaged_unit_and_default_config_check() {
    let packaging = repo_root().join("packaging");
    let out = Command::new(MIDWAY)
        .arg("check-config")
        .arg(packaging.join("midway.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(packaging.join("midway.service"))
        .unwrap()
        .replace("/usr/bin/midway", MIDWAY);
    let path = dir.path().join("midway.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .env("SYSTEMD_LOG_LEVEL", "warning")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    // Warnings about this unit's own lines fail it too; the host's other units are not ours.
    let ours: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("midway.service"))
        .collect();
    assert!(ours.is_empty(), "{ours:#?}");
}
