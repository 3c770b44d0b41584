// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Reload and binary upgrade through the real binary (issue 17): SIGHUP adds and removes
//! listeners and refuses a bad file while established connections go on untouched; a second
//! process started with `--take-over` takes the listening sockets over without refusing a
//! single connection, and the old one drains its open connection to the end, then exits.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use midway_testkit::host::{listening_addr, spawn_midway, Place, Running};
use midway_testkit::wait::{wait_exit, wait_until};

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(20);

/// An echo server for the connections of one test.
fn echo_server() -> SocketAddr {
    midway_testkit::net::echo_server_threads(10_000)
}

/// A port free right now on loopback (a take-over needs listeners at known ports).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn forward_listener(name: &str, listen: &str, target: SocketAddr) -> String {
    format!(
        "[[listeners]]\nname = \"{name}\"\nmode = \"forward\"\nlisten = \"{listen}\"\n\
         target = \"{target}\"\nrelay = \"buffer\"\n\n"
    )
}

fn write_config(path: &Path, spool: &Path, proxy_lines: &str, listeners: &str) {
    std::fs::write(
        path,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\nshutdown_grace = \"10s\"\n{proxy_lines}\n\
             [spool]\ndir = \"{}\"\n\n{listeners}",
            spool.display()
        ),
    )
    .unwrap();
}

fn start(config: &Path, extra: &[&str]) -> (Running, mpsc::Receiver<String>) {
    spawn_midway(MIDWAY, Place::Here, config, extra)
}

fn signal(child: &Running, signal: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
}

/// Waits for a log line containing every one of `parts`; returns it. Lines read on the way are
/// appended to `seen`.
fn wait_for_line(log: &mpsc::Receiver<String>, seen: &mut Vec<String>, parts: &[&str]) -> String {
    let deadline = Instant::now() + LIMIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = log
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no log line with {parts:?}; seen: {seen:#?}"));
        seen.push(line.clone());
        if parts.iter().all(|part| line.contains(part)) {
            return line;
        }
    }
}

/// The address in a `listening` line for listener `name`.
fn listening_line_addr(line: &str) -> SocketAddr {
    let value: serde_json::Value = serde_json::from_str(line).unwrap();
    value["fields"]["addr"].as_str().unwrap().parse().unwrap()
}

fn round_trip(addr: SocketAddr, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(LIMIT))?;
    stream.write_all(payload)?;
    stream.shutdown(Shutdown::Write)?;
    let mut back = Vec::new();
    stream.read_to_end(&mut back)?;
    Ok(back)
}

/// A connection that sent and got back its first half; finishing it checks the second half.
struct HalfDone {
    stream: TcpStream,
    second: Vec<u8>,
}

fn start_transfer(addr: SocketAddr, seed: u32) -> HalfDone {
    let payload: Vec<u8> = (0..2u32 << 20)
        .map(|i| (i.wrapping_mul(seed) % 251) as u8)
        .collect();
    let (first, second) = payload.split_at(payload.len() / 2);
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    stream.write_all(first).unwrap();
    let mut echoed = vec![0u8; first.len()];
    stream.read_exact(&mut echoed).unwrap();
    assert_eq!(echoed, first);
    HalfDone {
        stream,
        second: second.to_vec(),
    }
}

impl HalfDone {
    fn finish(mut self, what: &str) {
        self.stream.write_all(&self.second).unwrap();
        self.stream.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        self.stream.read_to_end(&mut rest).unwrap();
        assert!(
            rest == self.second,
            "{what}: the open connection lost bytes"
        );
    }
}

#[test]
fn sighup_adds_and_removes_listeners_refuses_bad_files_and_keeps_open_connections() {
    let echo = echo_server();
    let dir = tempfile::tempdir().unwrap();
    let (config, spool) = (dir.path().join("midway.toml"), dir.path().join("spool"));
    let a = forward_listener("a", "127.0.0.1:0", echo);
    let b = forward_listener("b", "127.0.0.1:0", echo);
    write_config(&config, &spool, "", &a);
    let (mut midway, log) = start(&config, &[]);
    let addr_a = listening_addr(&mut midway, LIMIT);
    let mut seen = Vec::new();

    let on_a = start_transfer(addr_a, 7);
    // Reload: b added, a kept (its socket and accept queue stay), a limit changed.
    write_config(
        &config,
        &spool,
        "max_connections = 500\n",
        &format!("{a}{b}"),
    );
    signal(&midway, nix::sys::signal::Signal::SIGHUP);
    let line = wait_for_line(&log, &mut seen, &["listening", "\"listener\":\"b\""]);
    let addr_b = listening_line_addr(&line);
    wait_for_line(&log, &mut seen, &["reloaded", "\"generation\":2"]);
    assert_eq!(round_trip(addr_b, b"through b").unwrap(), b"through b");
    assert_eq!(round_trip(addr_a, b"still a").unwrap(), b"still a");
    let second_on_a = start_transfer(addr_a, 11);

    // Reload: a removed. It stops accepting; its two open connections go on.
    write_config(&config, &spool, "", &b);
    signal(&midway, nix::sys::signal::Signal::SIGHUP);
    wait_for_line(&log, &mut seen, &["reloaded", "\"generation\":3"]);
    wait_until(
        LIMIT,
        || TcpStream::connect(addr_a).is_err(),
        "a removed listener kept accepting",
    );
    on_a.finish("opened before the first reload");
    second_on_a.finish("opened between the reloads");

    // A file that does not load, and one that changes a setting only a restart applies: both
    // refused, and the running configuration (b) stays.
    std::fs::write(&config, "[proxy\nallowed_clients = ").unwrap();
    signal(&midway, nix::sys::signal::Signal::SIGHUP);
    wait_for_line(&log, &mut seen, &["reload refused", "does not load"]);
    write_config(&config, &dir.path().join("elsewhere"), "", &b);
    signal(&midway, nix::sys::signal::Signal::SIGHUP);
    wait_for_line(&log, &mut seen, &["reload refused", "spool.dir"]);
    assert_eq!(round_trip(addr_b, b"b survives").unwrap(), b"b survives");

    signal(&midway, nix::sys::signal::Signal::SIGTERM);
    let status = wait_exit(
        midway.child_mut(),
        LIMIT,
        "midway did not exit after SIGTERM",
    );
    assert!(status.success(), "exit status {status}");
}

#[test]
fn take_over_refuses_no_connection_and_the_old_process_drains_then_exits() {
    let echo = echo_server();
    let dir = tempfile::tempdir().unwrap();
    let (config, spool) = (dir.path().join("midway.toml"), dir.path().join("spool"));
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics_port = free_port();
    let listener = forward_listener("fwd", &listen, echo);
    let metrics = format!("[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n\n");
    write_config(&config, &spool, "", &format!("{metrics}{listener}"));
    let (mut old, old_log) = start(&config, &[]);
    let addr = listening_addr(&mut old, LIMIT);
    let mut old_seen = Vec::new();
    wait_for_line(&old_log, &mut old_seen, &["interception installed"]);

    let open = start_transfer(addr, 13);
    // Clients connecting all along: none may be refused or cut.
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let clients = {
        let (stop, done, failed) = (stop.clone(), done.clone(), failed.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                match round_trip(addr, b"ping") {
                    Ok(back) if back == b"ping" => done.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    wait_until(
        LIMIT,
        || done.load(Ordering::Relaxed) >= 20,
        "clients never got through the old process",
    );

    let (mut new, new_log) = start(&config, &["--take-over"]);
    let new_addr = listening_addr(&mut new, LIMIT);
    assert_eq!(new_addr, addr);
    let mut new_seen = Vec::new();
    wait_for_line(&new_log, &mut new_seen, &["took over"]);
    assert!(
        new_seen
            .iter()
            .any(|l| l.contains("listening") && l.contains("\"taken_over\":true")),
        "the new process bound its own socket: {new_seen:#?}"
    );
    wait_for_line(&old_log, &mut old_seen, &["handed over"]);
    let before = done.load(Ordering::Relaxed);
    wait_until(
        LIMIT,
        || done.load(Ordering::Relaxed) >= before + 20,
        "clients did not get through the new process",
    );
    stop.store(true, Ordering::Relaxed);
    clients.join().unwrap();
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "connections failed during the take-over ({} succeeded)",
        done.load(Ordering::Relaxed)
    );

    // The old process still serves its open connection, then exits by itself.
    assert!(
        old.try_wait().unwrap().is_none(),
        "the old process quit before its connection ended"
    );
    open.finish("open across the take-over");
    let status = wait_exit(
        old.child_mut(),
        LIMIT,
        "the old process did not exit once drained",
    );
    assert!(status.success(), "old exit status {status}");

    // The new process serves, the metrics socket and the upgrade socket are its own.
    assert_eq!(round_trip(addr, b"after").unwrap(), b"after");
    let page = round_trip_http(metrics_port);
    assert!(page.contains("midway_connections_accepted"), "{page}");
    assert!(spool.join("midway-upgrade.sock").exists());
    signal(&new, nix::sys::signal::Signal::SIGTERM);
    let status = wait_exit(
        new.child_mut(),
        LIMIT,
        "the new process did not exit after SIGTERM",
    );
    assert!(status.success(), "new exit status {status}");
    assert!(!spool.join("midway-upgrade.sock").exists());
}

fn round_trip_http(port: u16) -> String {
    midway_testkit::metrics::scrape_blocking(SocketAddr::from(([127, 0, 0, 1], port)))
}

#[test]
fn take_over_without_a_running_midway_fails_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (config, spool) = (dir.path().join("midway.toml"), dir.path().join("spool"));
    let listener = forward_listener("fwd", "127.0.0.1:0", "127.0.0.1:9".parse().unwrap());
    write_config(&config, &spool, "", &listener);
    let out = Command::new(MIDWAY)
        .args(["proxy", "--take-over", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(
        message.contains("cannot take over") && message.contains("midway-upgrade.sock"),
        "{message}"
    );
}
