// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! midway as a systemd service, without systemd: the unit and the default configuration the
//! package installs (`packaging/`) are checked as shipped, and the real binary speaks the
//! notification protocol to a socket this test holds in the manager's place (`NOTIFY_SOCKET`):
//! READY=1 once it serves, WATCHDOG=1 at half `WATCHDOG_USEC`, RELOADING=1 with the monotonic
//! time then READY=1 around a SIGHUP, STOPPING=1 at SIGTERM; and a binary upgrade the manager
//! follows: SIGUSR2 starts the binary again as the running one's child, which announces itself
//! as the main process before the old one stops, while a held connection lives on in the old.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
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

/// `midway proxy --config CONFIG` as systemd starts a `Type=notify` unit with a 400 ms
/// watchdog: the notification socket (bound in `dir`, returned) in `NOTIFY_SOCKET`, and
/// `WATCHDOG_PID` naming the process, here the shell's own pid, which exec hands to midway.
fn start_under_manager(
    dir: &std::path::Path,
    config: &std::path::Path,
    stderr: std::process::Stdio,
) -> (UnixDatagram, KillOnDrop) {
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    let child = Command::new("sh")
        .arg("-c")
        .arg("WATCHDOG_PID=$$ exec \"$0\" --log-format json proxy --config \"$1\"")
        .arg(MIDWAY)
        .arg(config)
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "400000")
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    (socket, KillOnDrop(child))
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
    let (socket, mut child) = start_under_manager(dir.path(), &config, std::process::Stdio::null());
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

fn echo_once(stream: &mut TcpStream, payload: &[u8]) {
    stream.write_all(payload).unwrap();
    let mut back = vec![0; payload.len()];
    stream.read_exact(&mut back).unwrap();
    assert_eq!(back, payload);
}

/// Ends `pid` (not this test's child: it belongs to whoever adopted it) if the test fails
/// before it stops it.
struct KillPidOnDrop(Option<i32>);

impl Drop for KillPidOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Whether `pid` is still a running process (not gone, not a zombie awaiting its reaper).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z')
        })
        .unwrap_or(false)
}

#[test]
fn sigusr2_upgrades_to_a_child_the_manager_follows() {
    let echo = midway_testkit::net::echo_server_threads(1_000);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("forward.toml");
    // A take-over finds listeners by their configured address: a fixed port.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\nshutdown_grace = \"1s\"\n\
             [spool]\ndir = \"{}\"\n\n\
             [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"127.0.0.1:{port}\"\n\
             target = \"{echo}\"\n",
            dir.path().join("spool").display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("midway.log")).unwrap();
    let (socket, mut old) = start_under_manager(dir.path(), &config, log.into());
    let old_pid = old.0.id() as i32;
    let mut seen = Vec::new();
    wait_for(&socket, &mut seen, "READY=1");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut held = TcpStream::connect(addr).unwrap();
    held.set_read_timeout(Some(LIMIT)).unwrap();
    echo_once(&mut held, b"before");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old_pid),
        nix::sys::signal::Signal::SIGUSR2,
    )
    .unwrap();
    let announced = wait_for(&socket, &mut seen, "MAINPID=");
    let new_pid: i32 = announced
        .lines()
        .find_map(|l| l.strip_prefix("MAINPID="))
        .unwrap()
        .parse()
        .unwrap();
    let mut new = KillPidOnDrop(Some(new_pid));
    assert_ne!(new_pid, old_pid);
    // Announced while the old process still serves: the manager never sees its main exit.
    assert!(
        alive(old_pid),
        "the old process quit before the new one was announced"
    );
    let stat = std::fs::read_to_string(format!("/proc/{new_pid}/stat")).unwrap();
    let parent: i32 = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        parent, old_pid,
        "the new process is not the old one's child"
    );
    let cmdline = std::fs::read(format!("/proc/{new_pid}/cmdline")).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("--take-over"),
        "{cmdline:?}"
    );
    wait_for(&socket, &mut seen, "READY=1");

    // New connections reach the new process; the held one lives on in the old, which exits
    // once it ends.
    let mut fresh = TcpStream::connect(addr).unwrap();
    fresh.set_read_timeout(Some(LIMIT)).unwrap();
    echo_once(&mut fresh, b"fresh");
    echo_once(&mut held, b"after the upgrade");
    held.shutdown(Shutdown::Write).unwrap();
    assert_eq!(held.read(&mut [0; 16]).unwrap(), 0);
    let status = wait_exit(
        &mut old.0,
        LIMIT,
        "the old process did not exit once drained",
    );
    assert!(status.success(), "{status}");
    // The watchdog goes on from the new process (the old one is gone).
    wait_for(&socket, &mut seen, "WATCHDOG=1");
    let keep = fresh;

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(new_pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_for(&socket, &mut seen, "STOPPING=1");
    let deadline = Instant::now() + LIMIT;
    while alive(new_pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive(new_pid),
        "the new process did not stop: {}",
        std::fs::read_to_string(dir.path().join("midway.log")).unwrap()
    );
    new.0 = None;
    drop(keep);
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
