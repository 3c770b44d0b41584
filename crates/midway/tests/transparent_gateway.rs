// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A transparent midway as a busy gateway meets it, through the real binary in three
//! namespaces (client -- router running midway -- server):
//!
//! - overload fails open: at its connection limit, new intercepted connections bypass midway
//!   (routed unsplit) instead of waiting; below 95 % of the limit they are split again, and a
//!   connection that started bypassed stays unsplit and intact to its end;
//! - diverted flows create no connection-tracking entries, while a flow midway does not
//!   intercept does (so the check can tell);
//! - overload never strands a connection: 60 connections opened in a burst and held against a
//!   limit of 20 are each served, split or bypassed, within a second (one that completed its
//!   handshake before the bypass switched on used to wait in the accept queue for a slot that
//!   never freed).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use midway_sys::command::Program;
use midway_testkit::host::start_ready_in;
use midway_testkit::netns::{in_netns, Routed};
use midway_testkit::wait::{wait_exit, wait_until};

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(20);
const INTERCEPTED_PORT: u16 = 5201;
const NOT_INTERCEPTED_PORT: u16 = 5202;
const MAX_CONNECTIONS: usize = 10;
/// The client address as the server sees it: the router's when midway split the connection.
const SPLIT: &str = "10.77.2.1";
const UNSPLIT: &str = "10.77.1.1";

/// Echo servers on both ports in the server namespace; each connection's client address is
/// reported.
fn start_servers(ns: &str) -> mpsc::Receiver<(u16, String)> {
    let (seen_tx, seen_rx) = mpsc::channel();
    for port in [INTERCEPTED_PORT, NOT_INTERCEPTED_PORT] {
        let (ready_tx, ready_rx) = mpsc::channel();
        let seen_tx = seen_tx.clone();
        in_netns(ns, move || {
            let listener = TcpListener::bind(("10.77.2.2", port)).unwrap();
            ready_tx.send(()).unwrap();
            for stream in listener.incoming().take(64) {
                let Ok(mut stream) = stream else { continue };
                if let Ok(peer) = stream.peer_addr() {
                    let _ = seen_tx.send((port, peer.ip().to_string()));
                }
                std::thread::spawn(move || {
                    let _ = stream.set_read_timeout(Some(LIMIT));
                    let mut copy = stream.try_clone().unwrap();
                    let _ = std::io::copy(&mut stream, &mut copy);
                    let _ = copy.shutdown(Shutdown::Write);
                });
            }
        });
        ready_rx.recv_timeout(LIMIT).unwrap();
    }
    seen_rx
}

/// A connection from the client namespace to the server on `port`, with one echo checked.
fn connect(client_ns: &str, port: u16) -> TcpStream {
    connect_within(client_ns, port, LIMIT)
}

/// [`connect`], the echo answered within `deadline`.
fn connect_within(client_ns: &str, port: u16, deadline: Duration) -> TcpStream {
    in_netns(client_ns, move || {
        let mut stream = TcpStream::connect(("10.77.2.2", port)).unwrap();
        stream.set_read_timeout(Some(deadline)).unwrap();
        echo(&mut stream, b"hello");
        stream.set_read_timeout(Some(LIMIT)).unwrap();
        stream
    })
    .join()
    .unwrap()
}

fn echo(stream: &mut TcpStream, payload: &[u8]) {
    stream.write_all(payload).unwrap();
    let mut back = vec![0u8; payload.len()];
    stream.read_exact(&mut back).unwrap();
    assert_eq!(back, payload);
}

/// Connection-tracking entries in namespace `ns` for TCP flows from `src` to destination port
/// `port` (as first seen: the original direction).
fn conntrack_entries(ns: &str, src: &str, port: u16) -> usize {
    // /proc/thread-self: /proc/net would show the namespace of the process's main thread.
    let table = in_netns(ns, || {
        std::fs::read_to_string("/proc/thread-self/net/nf_conntrack").unwrap()
    })
    .join()
    .unwrap();
    let (src, port) = (format!(" src={src} "), format!(" dport={port} "));
    table
        .lines()
        .filter(|l| l.contains(" tcp ") && l.contains(&src) && l.contains(&port))
        .count()
}

/// A transparent midway in `router` with `max_connections`, intercepting [`INTERCEPTED_PORT`]
/// from the client side.
fn start_transparent(
    router: &str,
    dir: &std::path::Path,
    max_connections: usize,
) -> (midway_testkit::host::Running, mpsc::Receiver<String>) {
    let config = dir.join("transparent.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"10.77.1.0/24\"]\nmax_connections = {max_connections}\n\
             [spool]\ndir = \"{}\"\n\n\
             [[listeners]]\nname = \"tp\"\nmode = \"transparent\"\nlisten = \"0.0.0.0:7000\"\n\
             [listeners.nftables]\nmanage = true\ntable = \"midway-gw\"\n\
             interfaces = [\"veth-rc\"]\nports = [{INTERCEPTED_PORT}]\n",
            dir.join("spool").display()
        ),
    )
    .unwrap();
    start_ready_in(MIDWAY, router, &config, LIMIT)
}

/// SIGTERM to `midway`, the `held` connections closed during its drain; it must exit cleanly.
fn stop_cleanly(midway: &mut midway_testkit::host::Running, held: Vec<TcpStream>) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(midway.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    drop(held);
    let status = wait_exit(midway.child_mut(), LIMIT, "midway did not stop");
    assert!(status.success(), "exit status {status}");
}

#[test]
fn at_its_limit_midway_fails_open_and_diverted_flows_are_not_tracked() {
    let topo = Routed::new();
    let (client, router, server) = (topo.client.name(), topo.router.name(), topo.server.name());
    let seen = start_servers(server);
    let seen_by_server = |port: u16| {
        let (got_port, addr) = seen.recv_timeout(LIMIT).unwrap();
        assert_eq!(got_port, port);
        addr
    };
    // Turn connection tracking on in the router, as any stateful firewall rule would.
    let nft = |args: &[&str]| {
        Program::new("nft")
            .args(args)
            .in_named_namespace(router)
            .output()
            .unwrap()
    };
    nft(&["add", "table", "inet", "firewall"]);
    nft(&[
        "add",
        "chain",
        "inet",
        "firewall",
        "forward",
        "{ type filter hook forward priority 0; }",
    ]);
    nft(&[
        "add", "rule", "inet", "firewall", "forward", "ct", "state", "new", "counter",
    ]);

    let dir = tempfile::tempdir().unwrap();
    let (mut midway, log) = start_transparent(router, dir.path(), MAX_CONNECTIONS);

    // Up to the limit, every connection is split.
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        held.push(connect(client, INTERCEPTED_PORT));
        assert_eq!(seen_by_server(INTERCEPTED_PORT), SPLIT);
    }
    // Diverted flows (client to server, ending in midway) are not tracked; a flow through the
    // router that midway does not intercept is, so tracking is really on. midway's own remote
    // segments (router to server) are tracked like any connection the router makes: one per
    // split connection, as the unsplit flow would have been, so midway adds no entry.
    let mut untouched = connect(client, NOT_INTERCEPTED_PORT);
    assert_eq!(seen_by_server(NOT_INTERCEPTED_PORT), UNSPLIT);
    assert_eq!(conntrack_entries(router, UNSPLIT, NOT_INTERCEPTED_PORT), 1);
    assert_eq!(conntrack_entries(router, UNSPLIT, INTERCEPTED_PORT), 0);
    assert!(conntrack_entries(router, SPLIT, INTERCEPTED_PORT) <= MAX_CONNECTIONS);

    // At the limit midway switches to bypass within its 1 s sampling; a new connection is then
    // routed unsplit instead of waiting for a slot.
    let log_lines = std::cell::RefCell::new(Vec::new());
    let said = |needle: &str| {
        let mut lines = log_lines.borrow_mut();
        lines.extend(log.try_iter());
        lines.iter().any(|l: &String| l.contains(needle))
    };
    wait_until(
        LIMIT,
        || said("overloaded"),
        "midway never switched to bypass",
    );
    let mut bypassed = connect(client, INTERCEPTED_PORT);
    assert_eq!(seen_by_server(INTERCEPTED_PORT), UNSPLIT);

    // Below 95 % of the limit, new connections are split again...
    held.truncate(MAX_CONNECTIONS - 2);
    wait_until(LIMIT, || said("split again"), "midway never left bypass");
    held.push(connect(client, INTERCEPTED_PORT));
    assert_eq!(seen_by_server(INTERCEPTED_PORT), SPLIT);
    // ...and the connection that started bypassed still works, unsplit, to its end.
    echo(&mut bypassed, &vec![42u8; 1 << 20]);
    bypassed.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    bypassed.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    echo(&mut untouched, b"still here");

    stop_cleanly(&mut midway, held);
}

#[test]
fn overload_serves_every_connection_of_a_burst_within_a_second() {
    const LIMIT_OF_20: usize = 20;
    const BURST: usize = 60;
    let topo = Routed::new();
    let (client, router, server) = (topo.client.name(), topo.router.name(), topo.server.name());
    let seen = start_servers(server);
    let dir = tempfile::tempdir().unwrap();
    let (mut midway, _log) = start_transparent(router, dir.path(), LIMIT_OF_20);

    // One after the other, as fast as each is answered, every one held: the connections after
    // the 20th arrive before the overload check's periodic look.
    let mut held = Vec::new();
    for n in 0..BURST {
        let started = std::time::Instant::now();
        held.push(connect_within(
            client,
            INTERCEPTED_PORT,
            Duration::from_secs(1),
        ));
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "connection {n} took {took:?}"
        );
    }
    let (mut split, mut unsplit) = (0, 0);
    for _ in 0..BURST {
        match seen.recv_timeout(LIMIT).unwrap() {
            (INTERCEPTED_PORT, addr) if addr == SPLIT => split += 1,
            (INTERCEPTED_PORT, addr) if addr == UNSPLIT => unsplit += 1,
            other => panic!("{other:?}"),
        }
    }
    // Split: the 20 and what the kernel had queued before the bypass took effect.
    assert!(split >= LIMIT_OF_20, "{split} split");
    assert!(unsplit > 0, "none bypassed: {split} split");
    eprintln!(
        "{split} split (over the limit: {}), {unsplit} bypassed",
        split - LIMIT_OF_20
    );

    stop_cleanly(&mut midway, held);
}
