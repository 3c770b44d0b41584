//! Route-metric knobs (initial window, RTO floor above 200 ms, always-quickack, duplicate-ACK
//! threshold) on both segments. Each test builds two network namespaces joined by a veth pair
//! (server 10.231.0.1, client 10.231.0.2), installs RouteKnobs in each, and reads the knobs back
//! from the live accepted and connected sockets. Needs root.

// Tests: an unwrap that fails is the test failing.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::AsFd;
use std::time::Duration;

use midway_sys::netlink::{
    AddressSpec, Family, Metric, Netlink, Route, RouteMetric, TcpMetricsCache, VethEnd, TABLE_MAIN,
};
use midway_tcp::{
    delack_floor_us, get_int, tcp_stats, CarriedOptions, ReadBackWhen, Role, RouteKnobs,
    RouteKnobsError, TcpProfile, TCP_DELACK_MAX_US,
};
use midway_testkit::netns::Netns;
use midway_testkit::wait::wait_until;
use socket2::{Domain, Protocol, Socket, Type};

const SERVER: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 2);
const BASE_TABLE: u32 = 100;
const BASE_MARK: u32 = 0x4d00;

/// Server and client namespaces joined by a veth pair.
struct Topology {
    server: Netns,
    client: Netns,
}

fn topology() -> Topology {
    let t = Topology {
        server: Netns::unique("midway-tcp-test"),
        client: Netns::unique("midway-tcp-test"),
    };
    let (s, c) = (t.server.name(), t.client.name());
    netlink(s)
        .add_veth(
            &VethEnd::named("va"),
            &VethEnd::named("vb").in_named_namespace(c),
        )
        .unwrap();
    add_address(s, "va", "10.231.0.1/24");
    add_address(c, "vb", "10.231.0.2/24");
    netlink(s).set_link_up("va").unwrap();
    netlink(c).set_link_up("vb").unwrap();
    t
}

fn netlink(ns: &str) -> Netlink {
    Netlink::open_in_named(ns).unwrap()
}

/// `ip addr add ADDRESS dev DEVICE` (with `nodad` for IPv6, usable at once).
fn add_address(ns: &str, device: &str, address: &str) {
    let mut netlink = netlink(ns);
    let device = netlink.link_index(device).unwrap();
    let address: ipnet::IpNet = address.parse().unwrap();
    let nodad = address.addr().is_ipv6();
    netlink
        .add_address(&AddressSpec {
            address,
            device,
            nodad,
        })
        .unwrap();
}

/// `ip rule show` (IPv4), a line each in its words (`fwmark 0x4d00 lookup 100`).
fn rules_v4(ns: &str) -> String {
    let rules = netlink(ns).rules(Family::V4).unwrap();
    rules.iter().map(|rule| format!("{rule}\n")).collect()
}

/// The routes of `table` (`ip -4|-6 route show table T`), a line each in its words, devices by
/// name.
fn route_lines(ns: &str, family: Family, table: u32) -> String {
    let mut netlink = netlink(ns);
    let links = netlink.links().unwrap();
    let routes = netlink.routes(family, table).unwrap();
    routes
        .iter()
        .map(|route| {
            let mut line = route.to_string();
            if let Some(link) = links.iter().find(|l| Some(l.index) == route.device) {
                line = line.replace(
                    &format!("dev #{}", link.index),
                    &format!("dev {}", link.name),
                );
            }
            line + "\n"
        })
        .collect()
}

struct Conn {
    accepted: Socket,
    outgoing: Socket,
}

/// One connection client -> server with `profile` on both ends (listener + accepted in the
/// server namespace, outgoing in the client namespace).
fn connect(t: &Topology, server_profile: &TcpProfile, client_profile: &TcpProfile) -> Conn {
    let listener = t.server.enter(|| {
        let l = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        server_profile.apply_to_listener(&l).unwrap();
        l.bind(&SocketAddr::from((SERVER, 0)).into()).unwrap();
        l.listen(8).unwrap();
        l
    });
    let port = listener.local_addr().unwrap().as_socket().unwrap().port();
    let outgoing = t.client.enter(|| {
        let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        client_profile.apply_before_connect(&s).unwrap();
        s.connect(&SocketAddr::V4(SocketAddrV4::new(SERVER, port)).into())
            .unwrap();
        s
    });
    client_profile
        .apply_established(outgoing.as_fd(), Role::Outgoing, CarriedOptions::All)
        .unwrap();
    let (accepted, peer) = listener.accept().unwrap();
    assert_eq!(peer.as_socket().unwrap().ip(), std::net::IpAddr::V4(CLIENT));
    server_profile
        .apply_established(accepted.as_fd(), Role::Accepted, CarriedOptions::All)
        .unwrap();
    Conn { accepted, outgoing }
}

fn install(ns: &Netns, profile: &TcpProfile) -> (RouteKnobs, TcpProfile) {
    ns.enter(|| {
        let knobs = RouteKnobs::install(&[profile], BASE_TABLE, BASE_MARK).unwrap();
        let mut marked = profile.clone();
        knobs.set_marks([&mut marked]);
        assert_eq!(marked.route_mark, Some(BASE_MARK));
        (knobs, marked)
    })
}

fn route_profile() -> TcpProfile {
    let mut p = TcpProfile::kernel_default("routed");
    p.initial_cwnd = Some(7);
    p.rto_min_ms = Some(300);
    p.delayed_ack = Some(false);
    p
}

#[test]
fn initcwnd_rto_min_and_quickack_apply_to_both_segments() {
    let t = topology();
    let profile = route_profile();
    assert!(profile.needs_route_knobs());
    let (server_knobs, server_profile) = install(&t.server, &profile);
    let (client_knobs, client_profile) = install(&t.client, &profile);

    let conn = connect(&t, &server_profile, &client_profile);
    for (who, sock) in [("accepted", &conn.accepted), ("outgoing", &conn.outgoing)] {
        // Read before any data moves: the initial window is still untouched.
        let stats = tcp_stats(sock.as_fd()).unwrap();
        assert_eq!(stats.snd_cwnd, 7, "{who}: {stats:?}");
        assert!(stats.rto_us >= 300_000, "{who}: rto {}", stats.rto_us);
        assert_eq!(
            get_int(sock.as_fd(), libc::IPPROTO_TCP, TCP_DELACK_MAX_US).unwrap() as u32,
            delack_floor_us().unwrap()
        );
        assert_eq!(
            get_int(sock.as_fd(), libc::SOL_SOCKET, libc::SO_MARK).unwrap() as u32,
            BASE_MARK,
            "{who}"
        );
    }
    // The metrics really are in each namespace's table.
    for ns in [&t.server, &t.client] {
        let routes = netlink(ns.name()).routes(Family::V4, BASE_TABLE).unwrap();
        let metric = |m| routes[0].metrics.get(m).and_then(RouteMetric::number);
        assert_eq!(metric(Metric::InitCwnd), Some(7), "{routes:?}");
        assert_eq!(metric(Metric::RtoMin), Some(300), "{routes:?}");
        assert_eq!(metric(Metric::QuickAck), Some(1), "{routes:?}");
    }

    // Control: unmarked sockets in the same namespaces keep the kernel's values, so the checks
    // above cannot pass by accident.
    let plain = TcpProfile::kernel_default("plain");
    let control = connect(&t, &plain, &plain);
    for sock in [&control.accepted, &control.outgoing] {
        let stats = tcp_stats(sock.as_fd()).unwrap();
        assert_eq!(stats.snd_cwnd, 10);
        assert!(
            stats.rto_us < 300_000 && stats.rto_us >= 200_000,
            "{stats:?}"
        );
    }

    // Removal leaves no rule and no table behind.
    t.server.enter(|| server_knobs.remove()).unwrap();
    // From this thread, outside the client namespace: removal still happens in the namespace
    // the knobs were installed in.
    client_knobs.remove().unwrap();
    for ns in [&t.server, &t.client] {
        let rules = rules_v4(ns.name());
        assert!(!rules.contains("fwmark"), "{rules}");
        assert!(route_lines(ns.name(), Family::V4, BASE_TABLE)
            .trim()
            .is_empty());
    }
}

fn close_cleanly(conn: Conn) {
    let mut out = TcpStream::from(conn.outgoing);
    let mut acc = TcpStream::from(conn.accepted);
    out.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    acc.read_exact(&mut buf).unwrap();
    out.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(acc.read(&mut buf).unwrap(), 0);
    acc.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(out.read(&mut buf).unwrap(), 0);
}

fn has_metrics_entry(ns: &Netns, peer: Ipv4Addr) -> bool {
    !TcpMetricsCache::open_in_named(ns.name())
        .unwrap()
        .entries_for(peer.into())
        .unwrap()
        .is_empty()
}

/// Documents the caveat of `dupack_threshold`: Linux takes the route metric `reordering` only
/// from the tcp_metrics cache, so the first connection to a peer keeps the default (3) and
/// connections after one has closed get the profile's value, on both segments.
#[test]
fn dupack_threshold_applies_from_the_second_connection_on() {
    let t = topology();
    let mut profile = TcpProfile::kernel_default("dupack");
    profile.dupack_threshold = Some(5);
    let (_server_knobs, server_profile) = install(&t.server, &profile);
    let (_client_knobs, client_profile) = install(&t.client, &profile);
    t.server.enter(|| server_profile.check_supported()).unwrap();

    let first = connect(&t, &server_profile, &client_profile);
    for sock in [&first.accepted, &first.outgoing] {
        assert_eq!(tcp_stats(sock.as_fd()).unwrap().reordering, 3);
    }
    close_cleanly(first);
    // Wait (bounded) until both ends have written their tcp_metrics entry on close.
    wait_until(
        Duration::from_secs(5),
        || has_metrics_entry(&t.server, CLIENT) && has_metrics_entry(&t.client, SERVER),
        "no tcp_metrics entries after close",
    );

    let second = connect(&t, &server_profile, &client_profile);
    for (who, sock) in [
        ("accepted", &second.accepted),
        ("outgoing", &second.outgoing),
    ] {
        assert_eq!(tcp_stats(sock.as_fd()).unwrap().reordering, 5, "{who}");
    }
    // The cache is per address pair, not per mark: an unmarked connection to the same peer now
    // gets the value too (documented in midway_tcp::routes).
    let plain = TcpProfile::kernel_default("plain");
    let third = connect(&t, &plain, &plain);
    assert_eq!(tcp_stats(third.outgoing.as_fd()).unwrap().reordering, 5);
}

#[test]
fn install_refuses_a_table_in_use_and_leaves_nothing_behind() {
    let t = topology();
    let s = t.server.name();
    let mut server = netlink(s);
    let va = server.link_index("va").unwrap();
    server
        .add_route(&Route {
            table: 101,
            device: Some(va),
            ..Route::to("10.231.0.0/24".parse().unwrap())
        })
        .unwrap();
    let mut other = route_profile();
    other.name = "other".to_owned();
    let profiles = [&route_profile(), &other];
    let err = t
        .server
        .enter(|| RouteKnobs::install(&profiles, BASE_TABLE, BASE_MARK))
        .unwrap_err();
    assert!(
        matches!(err, RouteKnobsError::TableInUse { table: 101, .. }),
        "{err}"
    );
    // Table 100 (first profile) was installed, then removed on the error.
    let rules = rules_v4(s);
    assert!(!rules.contains("fwmark"), "{rules}");
    assert!(route_lines(s, Family::V4, 100).trim().is_empty());
    // The foreign table is untouched.
    assert!(route_lines(s, Family::V4, 101).contains("10.231.0.0/24"));
}

#[test]
fn profiles_without_route_knobs_install_nothing() {
    let t = topology();
    let mut p = TcpProfile::kernel_default("socket-only");
    p.rto_min_ms = Some(100);
    p.nodelay = Some(true);
    let knobs = t
        .server
        .enter(|| RouteKnobs::install(&[&p], BASE_TABLE, BASE_MARK))
        .unwrap();
    assert_eq!(knobs.mark_for("socket-only"), None);
    assert!(!rules_v4(t.server.name()).contains("fwmark"));
}

/// Data segments the receiver got and segments it sent (pure ACKs: it sends no data) while
/// the sender writes `count` chunks of 1000 bytes back to back and the receiver reads only
/// afterwards. Reading is what must not happen in between: a segment of exactly the receive
/// MSS with PSH makes the kernel ACK as soon as the application reads it, delayed ACKs or not.
/// Without reads, a delayed-ACK receiver ACKs about every second segment; a quick-ACK one
/// every segment.
fn acks_for_segments(sender: &Socket, receiver: &Socket, count: usize) -> (u32, u32) {
    sender.set_nodelay(true).unwrap();
    let mut tx = TcpStream::from(sender.try_clone().unwrap());
    let mut rx = TcpStream::from(receiver.try_clone().unwrap());
    let mut buf = vec![0u8; 1000 * count];
    // Leave the kernel's initial quick-ACK phase (at most 16 quick ACKs).
    for _ in 0..40 {
        tx.write_all(&[1u8; 1000]).unwrap();
        rx.read_exact(&mut buf[..1000]).unwrap();
    }
    let before = tcp_stats(receiver.as_fd()).unwrap();
    for _ in 0..count {
        tx.write_all(&[1u8; 1000]).unwrap();
    }
    rx.read_exact(&mut buf).unwrap();
    let after = tcp_stats(receiver.as_fd()).unwrap();
    (
        after.segs_in - before.segs_in,
        after.segs_out - before.segs_out,
    )
}

#[test]
fn delayed_ack_off_acks_every_segment_on_both_segments() {
    let t = topology();
    let mut profile = TcpProfile::kernel_default("quickack");
    profile.delayed_ack = Some(false);
    let (_server_knobs, server_profile) = install(&t.server, &profile);
    let (_client_knobs, client_profile) = install(&t.client, &profile);
    let conn = connect(&t, &server_profile, &client_profile);
    // Client -> server: the accepted socket receives; server -> client: the outgoing one.
    for (who, sender, receiver) in [
        ("accepted", &conn.outgoing, &conn.accepted),
        ("outgoing", &conn.accepted, &conn.outgoing),
    ] {
        let (segs, acks) = acks_for_segments(sender, receiver, 30);
        // The sender may coalesce some writes; enough separate segments remain to compare.
        assert!(segs >= 10, "{who}: {segs} segments");
        assert!(acks >= segs, "{who}: {acks} ACKs for {segs} segments");
    }
    // Control: without the profile the same exchange gets fewer ACKs than segments.
    let plain = TcpProfile::kernel_default("plain");
    let control = connect(&t, &plain, &plain);
    let (segs, acks) = acks_for_segments(&control.outgoing, &control.accepted, 30);
    assert!(
        segs >= 10 && acks < segs,
        "control: {acks} ACKs for {segs} segments"
    );
}

/// Every preset on both segments, every knob read back with `TcpProfile::read_back`, before
/// data moves and, for `dupack_threshold`, on a second connection after the first closed.
#[test]
fn presets_apply_to_both_segments() {
    let presets = midway_tcp::resolve_profiles(&Default::default()).unwrap();
    assert_eq!(presets.len(), 6);
    for preset in presets.values() {
        let t = topology();
        let (_server_knobs, server_profile) = install_any(&t.server, preset);
        let (_client_knobs, client_profile) = install_any(&t.client, preset);
        for p in [&server_profile, &client_profile] {
            p.check_supported()
                .unwrap_or_else(|e| panic!("{}: {e}", p.name));
        }
        let fresh = ReadBackWhen {
            before_data: true,
            metrics_cached: false,
        };
        let first = connect(&t, &server_profile, &client_profile);
        let check = |conn: &Conn, when: ReadBackWhen| {
            for (who, sock, p) in [
                ("accepted", &conn.accepted, &server_profile),
                ("outgoing", &conn.outgoing, &client_profile),
            ] {
                let mismatches = p.read_back(sock.as_fd(), when).unwrap();
                assert!(
                    mismatches.is_empty(),
                    "{} on the {who} socket: {mismatches:?}",
                    p.name
                );
            }
        };
        check(&first, fresh);
        if preset.dupack_threshold.is_none() {
            continue;
        }
        close_cleanly(first);
        wait_until(
            Duration::from_secs(5),
            || has_metrics_entry(&t.server, CLIENT) && has_metrics_entry(&t.client, SERVER),
            "no tcp_metrics entries after close",
        );
        let second = connect(&t, &server_profile, &client_profile);
        check(
            &second,
            ReadBackWhen {
                before_data: true,
                metrics_cached: true,
            },
        );
    }
}

/// Like `install`, for profiles that may need no route table.
fn install_any(ns: &Netns, profile: &TcpProfile) -> (RouteKnobs, TcpProfile) {
    ns.enter(|| {
        let knobs = RouteKnobs::install(&[profile], BASE_TABLE, BASE_MARK).unwrap();
        let mut marked = profile.clone();
        knobs.set_marks([&mut marked]);
        assert_eq!(marked.route_mark.is_some(), profile.needs_route_knobs());
        (knobs, marked)
    })
}

#[test]
fn read_back_reports_what_was_not_applied() {
    let mut p = TcpProfile::kernel_default("unapplied");
    p.congestion_control = Some("reno".to_owned());
    p.nodelay = Some(true);
    p.user_timeout_ms = Some(5000);
    p.max_pacing_rate_bps = Some(24_000_000);
    let plain = TcpProfile::kernel_default("plain");
    let t = topology();
    let conn = connect(&t, &plain, &plain);
    let when = ReadBackWhen {
        before_data: true,
        metrics_cached: false,
    };
    let knobs: Vec<_> = p
        .read_back(conn.outgoing.as_fd(), when)
        .unwrap()
        .into_iter()
        .map(|m| m.knob)
        .collect();
    assert_eq!(
        knobs,
        [
            "congestion_control",
            "nodelay",
            "user_timeout_ms",
            "max_pacing_rate_bps"
        ]
    );
}

#[test]
fn route_knobs_cover_ipv6_too() {
    let t = topology();
    add_address(t.server.name(), "va", "fd00:231::1/64");
    add_address(t.client.name(), "vb", "fd00:231::2/64");
    let mut profile = TcpProfile::kernel_default("v6");
    profile.initial_cwnd = Some(6);
    let (_server_knobs, server_profile) = install(&t.server, &profile);
    let (_client_knobs, client_profile) = install(&t.client, &profile);
    let server: std::net::Ipv6Addr = "fd00:231::1".parse().unwrap();
    let listener = t.server.enter(|| {
        let l = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP)).unwrap();
        server_profile.apply_to_listener(&l).unwrap();
        l.bind(&SocketAddr::from((server, 0)).into()).unwrap();
        l.listen(8).unwrap();
        l
    });
    let addr = listener.local_addr().unwrap();
    let outgoing = t.client.enter(|| {
        let s = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP)).unwrap();
        client_profile.apply_before_connect(&s).unwrap();
        s.connect(&addr).unwrap();
        s
    });
    let (accepted, _) = listener.accept().unwrap();
    for sock in [&accepted, &outgoing] {
        assert_eq!(tcp_stats(sock.as_fd()).unwrap().snd_cwnd, 6);
    }
}

/// Regression: with IPv6 on and two or more interfaces, `main` holds one `fe80::/64` route per
/// interface; copying them used to fail with "File exists" on the second one.
#[test]
fn install_copies_per_device_link_local_routes() {
    let ns = Netns::unique("midway-tcp-test");
    let n = ns.name();
    // Two veth pairs inside one namespace: four interfaces, each with its own fe80::/64 route.
    for (a, b) in [("va1", "vb1"), ("va2", "vb2")] {
        netlink(n)
            .add_veth(&VethEnd::named(a), &VethEnd::named(b))
            .unwrap();
    }
    add_address(n, "va1", "fd00:232:1::1/64");
    add_address(n, "va2", "fd00:232:2::1/64");
    for dev in ["va1", "vb1", "va2", "vb2"] {
        netlink(n).set_link_up(dev).unwrap();
    }
    // The kernel adds an interface's fe80::/64 route when its carrier comes up, a moment after
    // the link is set up; wait (bounded) for all four before copying, or a late one is missed.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while route_lines(n, Family::V6, TABLE_MAIN)
        .lines()
        .filter(|l| l.starts_with("fe80::/64"))
        .count()
        < 4
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let main = route_lines(n, Family::V6, TABLE_MAIN);
    let link_local_in_main = main.lines().filter(|l| l.starts_with("fe80::/64")).count();
    assert!(
        link_local_in_main >= 2,
        "the namespace should have several fe80::/64 routes:\n{main}"
    );

    let mut profile = TcpProfile::kernel_default("two-ifaces");
    profile.initial_cwnd = Some(8);
    let (knobs, _) = install(&ns, &profile);
    let table = route_lines(n, Family::V6, BASE_TABLE);
    let copied: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("fe80::/64"))
        .collect();
    assert_eq!(copied.len(), link_local_in_main, "{table}");
    for dev in ["va1", "vb1", "va2", "vb2"] {
        let line = copied
            .iter()
            .find(|l| l.contains(&format!(" dev {dev} ")))
            .unwrap_or_else(|| panic!("no fe80::/64 dev {dev} in table:\n{table}"));
        assert!(line.contains("initcwnd 8"), "{line}");
    }
    for prefix in ["fd00:232:1::/64", "fd00:232:2::/64"] {
        assert!(table.contains(prefix), "{prefix} missing:\n{table}");
    }
    ns.enter(|| knobs.remove()).unwrap();
    let after = route_lines(n, Family::V6, BASE_TABLE);
    assert!(after.trim().is_empty(), "table not flushed");
}

/// A host whose routes already carry metrics (a legacy lab host, or an operator's MTU lock) keeps
/// them in midway's table; the profile only adds or replaces its own knobs.
#[test]
fn copied_routes_keep_their_own_metrics() {
    let ns = Netns::unique("midway-tcp-test");
    let n = ns.name();
    netlink(n)
        .add_veth(&VethEnd::named("vm1"), &VethEnd::named("vm2"))
        .unwrap();
    add_address(n, "vm1", "10.233.0.1/24");
    for dev in ["vm1", "vm2"] {
        netlink(n).set_link_up(dev).unwrap();
    }
    netlink(n)
        .add_route(&Route {
            gateway: Some("10.233.0.2".parse().unwrap()),
            metrics: "mtu lock 576 advmss 536 initcwnd 2 rto_min 1000ms congctl reno"
                .parse()
                .unwrap(),
            ..Route::to("10.234.0.0/16".parse().unwrap())
        })
        .unwrap();
    let mut profile = TcpProfile::kernel_default("keeps-metrics");
    profile.initial_cwnd = Some(10);
    profile.dupack_threshold = Some(1);
    let (knobs, _) = install(&ns, &profile);
    let table = route_lines(n, Family::V4, BASE_TABLE);
    let line = table
        .lines()
        .find(|l| l.starts_with("10.234.0.0/16"))
        .unwrap_or_else(|| panic!("route not copied:\n{table}"));
    // In midway-sys's words: `ip` shows the RTO floor as `rto_min lock 1s`.
    for kept in [
        "mtu lock 576",
        "advmss 536",
        "rto_min 1000ms",
        "congctl reno",
    ] {
        assert!(line.contains(kept), "{kept:?} lost: {line}");
    }
    let copied = netlink(n).routes(Family::V4, BASE_TABLE).unwrap();
    let rto_min = copied
        .iter()
        .find(|r| r.destination.to_string() == "10.234.0.0/16")
        .and_then(|r| r.metrics.get(Metric::RtoMin).cloned())
        .unwrap();
    assert!(rto_min.locked, "rto_min lock lost: {line}");
    assert!(
        line.contains("initcwnd 10"),
        "profile's initcwnd missing: {line}"
    );
    assert!(
        !line.contains("initcwnd 2"),
        "host's initcwnd not replaced: {line}"
    );
    assert!(line.contains("reordering lock 1"), "{line}");
    ns.enter(|| knobs.remove()).unwrap();
}

/// On a host whose routes lock an RTO floor (the lab's legacy stack: 1 s), a profile's own floor
/// below 200 ms still takes effect: `RouteKnobs` gives the profile a table whose routes carry
/// the profile's floor instead, and its sockets the table's mark.
#[test]
fn profile_rto_floor_beats_a_locked_route_floor() {
    let t = topology();
    let c = t.client.name();
    let mut client = netlink(c);
    let vb = client.link_index("vb").unwrap();
    client
        .replace_route(&Route {
            device: Some(vb),
            metrics: "rto_min 1000ms".parse().unwrap(),
            ..Route::to("10.231.0.0/24".parse().unwrap())
        })
        .unwrap();
    let mut profile = TcpProfile::kernel_default("fine-timer");
    profile.rto_min_ms = Some(40);
    assert!(!profile.needs_route_knobs());
    // `install` asserts that the profile got a table and a mark.
    let (knobs, client_profile) = install(&t.client, &profile);
    let plain = TcpProfile::kernel_default("plain");
    let conn = connect(&t, &plain, &client_profile);
    let rto = tcp_stats(conn.outgoing.as_fd()).unwrap().rto_us;
    assert!(
        (40_000..200_000).contains(&rto),
        "the profile's 40 ms floor is not in effect: rto {rto} us"
    );
    // Control: an unmarked socket on the same host meets the locked 1 s floor.
    let control = connect(&t, &plain, &plain);
    let rto = tcp_stats(control.outgoing.as_fd()).unwrap().rto_us;
    assert!(rto >= 1_000_000, "control: rto {rto} us");
    t.client.enter(|| knobs.remove()).unwrap();
}
