// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The binary as an operator meets it: version, config checking, and `midway proxy` serving a
//! transfer, then draining it on SIGTERM and exiting cleanly.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use midway_testkit::host::{listening_addr, repo_root, spawn_midway, Place, Running};
use midway_testkit::net::echo_once;
use midway_testkit::wait::{poll_until, wait_exit, wait_until};

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(20);

#[test]
fn prints_its_version() {
    let out = Command::new(MIDWAY).arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.trim(), format!("midway {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn check_config_accepts_every_example_and_names_what_is_wrong() {
    let examples: Vec<_> = std::fs::read_dir(repo_root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    assert!(examples.len() >= 3, "examples missing: {examples:?}");
    // The examples with an encrypted peer segment name their key pair under /etc/midway/tls:
    // checked with a pair from `midway peer keygen` in its place.
    let keys = tempfile::tempdir().unwrap();
    let tls_dir = keys.path().join("tls");
    let keygen = Command::new(MIDWAY)
        .args(["peer", "keygen", "--out"])
        .arg(&tls_dir)
        .output()
        .unwrap();
    assert!(keygen.status.success(), "{keygen:?}");
    // The two-ended examples name their pre-shared key file /etc/midway/edge-a.key.
    let psk = keys.path().join("edge-a.key");
    std::fs::write(&psk, "00112233445566778899aabbccddeeff\n").unwrap();
    for example in &examples {
        let text = std::fs::read_to_string(example).unwrap();
        let copy = keys.path().join(example.file_name().unwrap());
        let text = text
            .replace("/etc/midway/tls", &tls_dir.display().to_string())
            .replace("/etc/midway/edge-a.key", &psk.display().to_string());
        std::fs::write(&copy, text).unwrap();
        let checked = copy;
        let out = Command::new(MIDWAY)
            .arg("check-config")
            .arg(&checked)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            example.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[proxy]\nallowed_clients = []\n").unwrap();
    let out = Command::new(MIDWAY)
        .arg("check-config")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(message.contains("allowed_clients"), "{message}");
}

/// Writes a forward config into `dir` (the `[proxy]` table gets `proxy_lines`; the listener
/// forwards to `target`) and starts the real binary on it, logging JSON to a piped stderr.
fn start_forward_proxy(
    dir: &Path,
    proxy_lines: &str,
    target: &str,
) -> (Running, mpsc::Receiver<String>) {
    let config = write_forward_config(dir, proxy_lines, target);
    spawn_midway(MIDWAY, Place::Here, &config, &[])
}

/// The forward config [`start_forward_proxy`] runs, written into `dir`; its path.
fn write_forward_config(dir: &Path, proxy_lines: &str, target: &str) -> std::path::PathBuf {
    let config = dir.join("forward.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\n{proxy_lines}\n\
             [spool]\ndir = \"{}\"\n\n\
             [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"127.0.0.1:0\"\n\
             target = \"{target}\"\nrelay = \"buffer\"\n",
            dir.join("spool").display()
        ),
    )
    .unwrap();
    config
}

#[test]
fn proxy_serves_then_drains_on_sigterm() {
    let echo = echo_once();
    let dir = tempfile::tempdir().unwrap();
    let (mut child, log_rx) =
        start_forward_proxy(dir.path(), "shutdown_grace = \"10s\"\n", &format!("{echo}"));
    let addr = listening_addr(&mut child, LIMIT);

    // A transfer in flight when SIGTERM arrives: half sent before, half after.
    let mut client = TcpStream::connect(addr).unwrap();
    client.set_read_timeout(Some(LIMIT)).unwrap();
    let payload: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
    let (first, second) = payload.split_at(payload.len() / 2);
    client.write_all(first).unwrap();
    let mut echoed = vec![0u8; first.len()];
    client.read_exact(&mut echoed).unwrap();
    assert_eq!(echoed, first);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    // New connections are no longer accepted once midway drains; wait until that is so.
    wait_until(
        LIMIT,
        || TcpStream::connect(addr).is_err(),
        "midway kept accepting after SIGTERM",
    );

    client.write_all(second).unwrap();
    client.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).unwrap();
    assert_eq!(
        rest, second,
        "the in-flight connection lost bytes during the drain"
    );

    let status = wait_exit(
        child.child_mut(),
        LIMIT,
        "midway did not exit after draining",
    );
    assert!(status.success(), "exit status {status}");
    let log: Vec<String> = log_rx.try_iter().collect();
    assert!(
        log.iter()
            .any(|l| l.contains("termination signal received")),
        "no shutdown line in the log: {log:#?}"
    );
}

/// A transfer still running when the grace period ends is cut: the client must see a reset,
/// never a clean end of stream after a truncated transfer, and the server must be told too
/// (issue 17, defect 2).
#[test]
fn sigterm_resets_transfers_still_running_after_the_grace_period() {
    // A server that sends 64 KiB every 50 ms for up to 20 s: still sending when the 1 s grace
    // period ends.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server_addr = server.local_addr().unwrap();
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut conn, _) = server.accept()?;
        let chunk = vec![7u8; 64 * 1024];
        for _ in 0..400 {
            conn.write_all(&chunk)?;
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    });
    let dir = tempfile::tempdir().unwrap();
    let (mut child, log_rx) = start_forward_proxy(
        dir.path(),
        "shutdown_grace = \"1s\"\n",
        &format!("{server_addr}"),
    );
    let addr = listening_addr(&mut child, LIMIT);
    let mut client = TcpStream::connect(addr).unwrap();
    client.set_read_timeout(Some(LIMIT)).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    client.read_exact(&mut buf).unwrap();

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let ended = loop {
        match client.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(_) => continue,
            Err(e) => break Err(e.kind()),
        }
    };
    assert_eq!(
        ended,
        Err(std::io::ErrorKind::ConnectionReset),
        "the client got a clean end of stream on a transfer its server had not finished"
    );
    let sent = sender.join().unwrap();
    assert!(
        sent.is_err(),
        "the server was never told its transfer was cut"
    );
    let status = wait_exit(
        child.child_mut(),
        LIMIT,
        "midway did not exit after the grace period",
    );
    assert!(status.success(), "exit status {status}");
    let log: Vec<String> = log_rx.try_iter().collect();
    assert!(
        log.iter().any(
            |l| l.contains("resetting the connections still open") && l.contains("\"reset\":1")
        ),
        "no line saying how many were reset: {log:#?}"
    );
}

/// kill -9 during a transfer: the kernel closes the dead process's sockets, and both ends must
/// learn the transfer broke (a reset), never see a clean end of a truncated stream (issue 17,
/// the fault campaign's `kill -9` restarts).
#[test]
fn kill_9_during_a_transfer_resets_both_ends() {
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server_addr = server.local_addr().unwrap();
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut conn, _) = server.accept()?;
        let chunk = vec![7u8; 64 * 1024];
        for _ in 0..400 {
            conn.write_all(&chunk)?;
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    });
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _log_rx) = start_forward_proxy(dir.path(), "", &format!("{server_addr}"));
    let addr = listening_addr(&mut child, LIMIT);
    let mut client = TcpStream::connect(addr).unwrap();
    client.set_read_timeout(Some(LIMIT)).unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    client.read_exact(&mut buf).unwrap();
    // Everything sent so far is read: no unread bytes make the kernel reset on its own.
    std::thread::sleep(Duration::from_millis(200));
    while client.set_nonblocking(true).is_ok() && client.read(&mut buf).is_ok_and(|n| n > 0) {}
    client.set_nonblocking(false).unwrap();

    child.kill().unwrap();
    wait_exit(child.child_mut(), LIMIT, "midway did not die");
    let ended = loop {
        match client.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(_) => continue,
            Err(e) => break Err(e.kind()),
        }
    };
    assert_eq!(
        ended,
        Err(std::io::ErrorKind::ConnectionReset),
        "the client got a clean end of stream from a midway that died mid-transfer"
    );
    assert!(
        sender.join().unwrap().is_err(),
        "the server was never told its transfer was cut"
    );
}

/// How many threads of `pid` are the runtime's workers (tokio names them "tokio-rt-worker").
fn runtime_workers(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == "tokio-rt-worker")
        .count()
}

#[test]
fn worker_threads_sets_the_runtime_size() {
    let dir = tempfile::tempdir().unwrap();
    for (setting, expected) in [
        ("worker_threads = 3\n", 3),
        (
            "",
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        ),
    ] {
        let (mut child, _log_rx) = start_forward_proxy(dir.path(), setting, "127.0.0.1:9");
        listening_addr(&mut child, LIMIT);
        // The runtime starts its workers in the background: wait (bounded) until they are all
        // there, then check there are no more than asked.
        let mut workers = 0;
        poll_until(LIMIT, || {
            workers = runtime_workers(child.id());
            workers >= expected
        });
        child.kill().unwrap();
        child.child_mut().wait().unwrap();
        assert_eq!(workers, expected, "with {setting:?}");
    }
}

/// Text logs into a file or pipe carry no colour codes (journald and log shippers keep them
/// as they are); under systemd (`JOURNAL_STREAM` set) they also leave the timestamp to the
/// journal.
#[test]
fn text_logs_have_no_colour_codes_off_a_terminal_and_no_timestamp_under_systemd() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_forward_config(dir.path(), "", "127.0.0.1:9");
    // midway's line once its listeners are bound (midway-launch's READY_LINE).
    let ready_line = "interception installed";
    for journald in [false, true] {
        let log = dir.path().join(format!("journald-{journald}.log"));
        let mut command = Command::new(MIDWAY);
        command
            .args(["proxy", "--config"])
            .arg(&config)
            .env_remove("NO_COLOR")
            .env_remove("JOURNAL_STREAM")
            .stderr(std::fs::File::create(&log).unwrap());
        if journald {
            command.env("JOURNAL_STREAM", "8:12345");
        }
        let mut child = command.spawn().unwrap();
        let read = || std::fs::read_to_string(&log).unwrap_or_default();
        wait_until(
            LIMIT,
            || read().contains(ready_line),
            "midway never said it was ready",
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        wait_exit(&mut child, LIMIT, "midway did not stop");
        let text = read();
        assert!(!text.contains('\u{1b}'), "colour codes in {text:?}");
        let ready = text.lines().find(|l| l.contains(ready_line)).unwrap();
        // A timestamp starts with the year; a level name does not.
        let stamped = ready.trim_start().starts_with("20");
        assert_eq!(stamped, !journald, "{ready:?}");
    }
}
