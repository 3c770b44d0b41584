// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A transparent midway killed with SIGKILL: its nftables table, fwmark rules and local routes
//! stay behind, new connections fail open (routed to the server unsplit, intact), and the next
//! start removes exactly what the dead one installed, nothing else, installs its own once, and
//! a clean stop leaves the router as it found it (issue 17, defect 5). A binary upgrade hands
//! the interception over without a gap, and a reload brings the rules to the new listeners.
//!
//!   client (10.77.1.1) -- router (runs the real binary) -- server (10.77.2.2)

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use midway_sys::command::Program;
use midway_sys::netlink::{Family, FwmarkRule, Netlink};
use midway_testkit::host::{start_ready_in, start_ready_in_with, Running};
use midway_testkit::netns::{in_netns, Routed};
use midway_testkit::wait::wait_exit;

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(20);
const SERVER_PORT: u16 = 5201;
const TABLE: &str = "midway-crash";

/// Starts the real binary in the router namespace, ready; returns it and its log lines.
fn start_midway(router: &str, config: &std::path::Path) -> (Running, mpsc::Receiver<String>) {
    start_ready_in(MIDWAY, router, config, LIMIT)
}

/// IPv4 policy rules of `ns` (`ip -4 rule show`, a line each in its words: `fwmark 0x1 lookup
/// 100`) that contain `needle`.
fn rules_with(ns: &str, needle: &str) -> usize {
    let rules = Netlink::open_in_named(ns)
        .unwrap()
        .rules(Family::V4)
        .unwrap();
    rules
        .iter()
        .map(|rule| rule.to_string())
        .filter(|line| line.contains(needle))
        .count()
}

/// IPv4 routes of `table` in `ns` (`ip -4 route show table T`, in its words) that contain
/// `needle`.
fn routes_with(ns: &str, table: u32, needle: &str) -> usize {
    let routes = Netlink::open_in_named(ns)
        .unwrap()
        .routes(Family::V4, table)
        .unwrap();
    routes
        .iter()
        .filter(|route| route.to_string().contains(needle))
        .count()
}

fn nft_table_exists(ns: &str, table: &str) -> bool {
    Program::new("nft")
        .args(["list", "table", "inet", table])
        .in_named_namespace(ns)
        .run()
        .is_ok()
}

/// One echo round trip of 1 MiB from the client namespace to the server's address.
fn echo_round_trip(client_ns: &str) -> bool {
    in_netns(client_ns, || {
        let attempt = || -> std::io::Result<bool> {
            let target = ("10.77.2.2", SERVER_PORT);
            let mut stream = TcpStream::connect(target)?;
            stream.set_read_timeout(Some(LIMIT))?;
            let payload: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
            let mut reader = stream.try_clone()?;
            let expected = payload.clone();
            let receiver = std::thread::spawn(move || {
                let mut got = Vec::new();
                reader.read_to_end(&mut got).map(|_| got == expected)
            });
            stream.write_all(&payload)?;
            stream.shutdown(Shutdown::Write)?;
            receiver.join().unwrap_or(Ok(false))
        };
        attempt().unwrap_or_else(|e| {
            eprintln!("round trip failed: {e}");
            false
        })
    })
    .join()
    .unwrap()
}

#[test]
fn a_restart_after_kill_9_removes_exactly_what_the_dead_midway_installed() {
    let topo = Routed::new();
    let (client, router, server) = (topo.client.name(), topo.router.name(), topo.server.name());
    // Echo server: a thread per connection, for the life of the test.
    // It reports each client address it sees: the router's when midway split the connection,
    // the client's own when the connection was routed unsplit.
    let (ready_tx, ready_rx) = mpsc::channel();
    let (seen_tx, seen_rx) = mpsc::channel();
    in_netns(server, move || {
        let listener = TcpListener::bind(("10.77.2.2", SERVER_PORT)).unwrap();
        ready_tx.send(()).unwrap();
        for stream in listener.incoming().take(8) {
            let Ok(mut stream) = stream else { continue };
            if let Ok(peer) = stream.peer_addr() {
                let _ = seen_tx.send(peer.ip().to_string());
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
    // Someone else's policy rule and table on the router: midway must never touch them.
    Netlink::open_in_named(router)
        .unwrap()
        .add_rule(&FwmarkRule::new(Family::V4, 0x2, 200))
        .unwrap();
    Program::new("nft")
        .args(["add", "table", "inet", "not-midway"])
        .in_named_namespace(router)
        .run()
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("transparent.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"10.77.1.0/24\"]\n[spool]\ndir = \"{}\"\n\n\
             [[listeners]]\nname = \"tp\"\nmode = \"transparent\"\nlisten = \"0.0.0.0:7000\"\n\
             [listeners.nftables]\nmanage = true\ntable = \"{TABLE}\"\n\
             interfaces = [\"veth-rc\"]\nports = [{SERVER_PORT}]\n",
            dir.path().join("spool").display()
        ),
    )
    .unwrap();
    let marked_rule = "fwmark 0x1 lookup 100";
    let seen_by_server = || seen_rx.recv_timeout(LIMIT).unwrap();
    const SPLIT: &str = "10.77.2.1";
    const UNSPLIT: &str = "10.77.1.1";

    let (mut first, first_log) = start_midway(router, &config);
    assert!(
        echo_round_trip(client),
        "a split connection failed: {:#?}",
        first_log.try_iter().collect::<Vec<_>>()
    );
    assert_eq!(seen_by_server(), SPLIT);
    first.kill().unwrap();
    wait_exit(first.child_mut(), LIMIT, "midway did not die");
    // What a crash leaves: the table, one rule per family, the local routes.
    assert!(nft_table_exists(router, TABLE));
    assert_eq!(rules_with(router, marked_rule), 1);
    // New connections fail open: nothing listens for the TPROXY rule, so it does not match
    // and the connection is routed to the server unsplit.
    assert!(
        echo_round_trip(client),
        "a connection failed while midway was dead"
    );
    assert_eq!(seen_by_server(), UNSPLIT);

    let (mut second, second_log) = start_midway(router, &config);
    let log: Vec<String> = second_log.try_iter().collect();
    assert!(
        log.iter()
            .any(|l| l.contains("did not stop cleanly") && l.contains(TABLE)),
        "the restart did not say what it removed: {log:#?}"
    );
    // Installed once, not once more per crash.
    assert_eq!(rules_with(router, marked_rule), 1);
    assert_eq!(routes_with(router, 100, "local"), 1);
    assert!(
        echo_round_trip(client),
        "a split connection failed after the restart"
    );
    assert_eq!(seen_by_server(), SPLIT);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_exit(second.child_mut(), LIMIT, "midway did not stop");
    assert!(status.success(), "exit status {status}");

    // Clean stop: nothing of midway's is left, and the neighbour's rule and table are intact.
    assert!(!nft_table_exists(router, TABLE));
    assert_eq!(rules_with(router, marked_rule), 0);
    assert_eq!(routes_with(router, 100, "local"), 0);
    assert_eq!(rules_with(router, "fwmark 0x2 lookup 200"), 1);
    assert!(nft_table_exists(router, "not-midway"));
    assert!(!dir
        .path()
        .join("spool")
        .join("midway-installed.toml")
        .exists());
}

/// An echo server at 10.77.2.2 in `server` for the life of the test; each connection's client
/// address goes to the returned receiver (the router's when split, the client's when not).
fn echo_server_in(server: &str) -> mpsc::Receiver<String> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let (seen_tx, seen_rx) = mpsc::channel();
    in_netns(server, move || {
        let listener = TcpListener::bind(("10.77.2.2", SERVER_PORT)).unwrap();
        ready_tx.send(()).unwrap();
        for stream in listener.incoming().take(32) {
            let Ok(mut stream) = stream else { continue };
            if let Ok(peer) = stream.peer_addr() {
                let _ = seen_tx.send(peer.ip().to_string());
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
    seen_rx
}

fn wait_for_line(log: &mpsc::Receiver<String>, part: &str) {
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains(part)) {
        seen.push(
            log.recv_timeout(LIMIT)
                .unwrap_or_else(|_| panic!("no log line with {part:?}: {seen:#?}")),
        );
    }
}

#[test]
fn a_take_over_keeps_the_interception_and_a_reload_follows_the_listeners() {
    let topo = Routed::new();
    let (client, router, server) = (topo.client.name(), topo.router.name(), topo.server.name());
    let seen_rx = echo_server_in(server);
    let seen_by_server = || seen_rx.recv_timeout(LIMIT).unwrap();
    const SPLIT: &str = "10.77.2.1";
    const UNSPLIT: &str = "10.77.1.1";
    const TAKEN: &str = "midway-takeover";
    let marked_rule = "fwmark 0x1 lookup 100";

    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let config = dir.path().join("transparent.toml");
    let transparent = format!(
        "[[listeners]]\nname = \"tp\"\nmode = \"transparent\"\nlisten = \"0.0.0.0:7000\"\n\
         [listeners.nftables]\nmanage = true\ntable = \"{TAKEN}\"\n\
         interfaces = [\"veth-rc\"]\nports = [{SERVER_PORT}]\n"
    );
    let forward_only = "[[listeners]]\nname = \"fwd\"\nmode = \"forward\"\n\
                        listen = \"127.0.0.1:7001\"\ntarget = \"10.77.2.2:5201\"\n";
    let write = |listeners: &str| {
        std::fs::write(
            &config,
            format!(
                "[proxy]\nallowed_clients = [\"10.77.1.0/24\", \"127.0.0.0/8\"]\n\
                 [spool]\ndir = \"{}\"\n\n{listeners}",
                spool.display()
            ),
        )
        .unwrap()
    };
    write(&transparent);

    let (mut old, _old_log) = start_midway(router, &config);
    assert!(echo_round_trip(client), "a split connection failed");
    assert_eq!(seen_by_server(), SPLIT);

    let (mut new, new_log) = start_ready_in_with(MIDWAY, router, &config, &["--take-over"], LIMIT);
    wait_for_line(&new_log, "took over");
    // Nothing was open: the old process exits by itself, leaving the interception in place.
    let status = wait_exit(old.child_mut(), LIMIT, "the old process did not exit");
    assert!(status.success(), "old exit status {status}");
    assert!(nft_table_exists(router, TAKEN));
    assert_eq!(rules_with(router, marked_rule), 1);
    let record = std::fs::read_to_string(spool.join("midway-installed.toml")).unwrap();
    assert!(
        record.contains(&format!("pid = {}", new.id())),
        "the record does not name the new process: {record}"
    );
    assert!(
        echo_round_trip(client),
        "a split connection failed after the take-over"
    );
    assert_eq!(seen_by_server(), SPLIT);

    // Reload without the transparent listener: the rules go, connections route unsplit.
    write(forward_only);
    let hangup = |child: &Running| {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGHUP,
        )
        .unwrap()
    };
    hangup(&new);
    wait_for_line(&new_log, "reloaded");
    assert!(!nft_table_exists(router, TAKEN));
    assert_eq!(rules_with(router, marked_rule), 0);
    assert!(echo_round_trip(client), "an unsplit connection failed");
    assert_eq!(seen_by_server(), UNSPLIT);
    // And back.
    write(&transparent);
    hangup(&new);
    wait_for_line(&new_log, "reloaded");
    assert!(nft_table_exists(router, TAKEN));
    assert!(
        echo_round_trip(client),
        "a split connection failed after the reload"
    );
    assert_eq!(seen_by_server(), SPLIT);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(new.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_exit(new.child_mut(), LIMIT, "the new process did not stop");
    assert!(status.success(), "new exit status {status}");
    assert!(!nft_table_exists(router, TAKEN));
    assert_eq!(rules_with(router, marked_rule), 0);
    assert_eq!(routes_with(router, 100, "local"), 0);
    assert!(!spool.join("midway-installed.toml").exists());
}

/// A profile with a route-only knob gets a routing table and a policy rule (`midway_tcp`'s
/// route knobs). After `kill -9` they stay; the restart must remove them from the install
/// record and install its own once, where it used to refuse ("table not empty"); a clean stop
/// leaves none.
#[test]
fn a_restart_after_kill_9_removes_the_route_knob_table_and_rule() {
    let topo = Routed::new();
    let router = topo.router.name();
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let config = dir.path().join("knobs.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"10.77.1.0/24\"]\n[spool]\ndir = \"{}\"\n\
             [profiles.wide]\ninitial_cwnd = 40\n\n\
             [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"10.77.1.2:7002\"\n\
             target = \"10.77.2.2:{SERVER_PORT}\"\nremote_profile = \"wide\"\n",
            spool.display()
        ),
    )
    .unwrap();
    let knob_rule = "lookup 1000";
    let (mut first, _first_log) = start_midway(router, &config);
    assert_eq!(rules_with(router, knob_rule), 1);
    assert!(routes_with(router, 1000, "initcwnd 40") >= 1);
    let record = std::fs::read_to_string(spool.join("midway-installed.toml")).unwrap();
    assert!(record.contains("route_knobs"), "not recorded: {record}");
    first.kill().unwrap();
    wait_exit(first.child_mut(), LIMIT, "midway did not die");
    assert_eq!(rules_with(router, knob_rule), 1, "a crash leaves the rule");

    let (mut second, second_log) = start_midway(router, &config);
    let log: Vec<String> = second_log.try_iter().collect();
    assert!(
        log.iter().any(|l| l.contains("did not stop cleanly")),
        "the restart did not say what it removed: {log:#?}"
    );
    assert_eq!(rules_with(router, knob_rule), 1, "installed once");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = wait_exit(second.child_mut(), LIMIT, "midway did not stop");
    assert!(status.success(), "exit status {status}");
    assert_eq!(rules_with(router, knob_rule), 0);
    assert_eq!(routes_with(router, 1000, "initcwnd"), 0);
    assert!(!spool.join("midway-installed.toml").exists());
}
