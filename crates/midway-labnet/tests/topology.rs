//! Real topologies in network namespaces (needs root; every test removes what it creates, even
//! when it fails, because `Topology` tears down on drop).

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use midway_labnet::{
    fresh_tag, DirectionConfig, HostSpec, LabNetError, LinkSpec, StackProfile, Topology,
    TopologySpec,
};
use midway_sys::netlink::Netlink;
use midway_testkit::netns::namespaces_tagged;

/// The namespaces that exist, for messages.
fn all_namespaces() -> String {
    midway_sys::netns::list().join("\n")
}

fn delayed(ms: u64) -> DirectionConfig {
    DirectionConfig {
        delay: Duration::from_millis(ms),
        ..DirectionConfig::default()
    }
}

fn host(name: &str, stack: StackProfile) -> HostSpec {
    HostSpec {
        name: name.into(),
        stack,
    }
}

fn link(a: &str, b: &str, ms: u64) -> LinkSpec {
    LinkSpec {
        a: a.into(),
        b: b.into(),
        a_to_b: delayed(ms),
        b_to_a: delayed(ms),
    }
}

fn chain() -> TopologySpec {
    TopologySpec {
        hosts: vec![
            host("client", StackProfile::Modern),
            host("proxy", StackProfile::Modern),
            host("server", StackProfile::Legacy),
        ],
        links: vec![link("client", "proxy", 5), link("proxy", "server", 10)],
    }
}

/// Min RTT of `count` pings from `from` to `to` (ms), or None if none came back.
fn ping_min_ms(topology: &Topology, from: &str, to: std::net::IpAddr, count: u32) -> Option<f64> {
    let text = topology
        .program(from, "ping")
        .args([
            "-n",
            "-q",
            "-c",
            &count.to_string(),
            "-i",
            "0.05",
            "-W",
            "2",
            &to.to_string(),
        ])
        .output()
        .ok()?;
    // "rtt min/avg/max/mdev = 30.1/30.2/30.4/0.1 ms"
    let line = text.lines().find(|l| l.contains("min/avg/max"))?;
    line.split('=')
        .nth(1)?
        .trim()
        .split('/')
        .next()?
        .parse()
        .ok()
}

#[test]
fn chain_pings_end_to_end_over_v4_and_v6_and_tears_down() {
    let tag = fresh_tag();
    let topology = Topology::build(&chain(), &tag, 1).expect("builds");
    assert_eq!(
        namespaces_tagged(&tag).len(),
        5,
        "3 hosts + 2 links: {}",
        all_namespaces()
    );
    let server = topology.addr("server", "proxy");
    assert_eq!(server.to_string(), "10.0.2.2");
    assert_eq!(topology.iface("client", "proxy"), "to-proxy");
    assert_eq!(
        topology.link_prefix("proxy", "server").to_string(),
        "10.0.2.0/24"
    );
    // The first ping resolves neighbours; min RTT is 2 x (5 + 10) ms plus a little.
    let rtt = ping_min_ms(&topology, "client", server, 5).expect("IPv4 ping end to end answers");
    assert!(
        (30.0..31.0).contains(&rtt),
        "IPv4 RTT {rtt} ms, expected 30 ms"
    );
    let rtt6 = ping_min_ms(&topology, "client", topology.addr6("server", "proxy"), 5)
        .expect("IPv6 ping answers");
    assert!(
        (30.0..31.0).contains(&rtt6),
        "IPv6 RTT {rtt6} ms, expected 30 ms"
    );
    // Offloads are off on the host ends (one frame per packet) and the link ends have no IPv6.
    let features = topology
        .program("client", "ethtool")
        .args(["-k", "to-proxy"])
        .output()
        .expect("ethtool runs");
    for off in [
        "tcp-segmentation-offload: off",
        "generic-segmentation-offload: off",
        "tx-checksumming: off",
    ] {
        assert!(features.contains(off), "{off:?} not in:\n{features}");
    }
    let link_ns = midway_labnet::link_netns_name(&tag, 0);
    let mut netlink = Netlink::open_in_named(&link_ns).expect("netlink in the link namespace");
    let mut v6 = Vec::new();
    for link in netlink.links().expect("links") {
        let addresses = netlink.addresses(link.index).expect("addresses");
        v6.extend(addresses.into_iter().filter(|a| a.addr().is_ipv6()));
    }
    assert!(v6.is_empty(), "IPv6 in the link namespace: {v6:?}");
    let stats = topology.link_stats();
    assert_eq!(stats.len(), 2);
    assert_eq!(stats[0].0, "client-proxy");
    assert!(
        stats[0].1.sent_frames >= 10,
        "pings crossed the emulator: {:?}",
        stats[0].1
    );
    topology.teardown().expect("tears down");
    assert!(
        namespaces_tagged(&tag).is_empty(),
        "left: {}",
        all_namespaces()
    );
    assert!(!std::path::Path::new(&format!("{}/{tag}.pid", midway_labnet::PID_DIR)).exists());
}

#[test]
fn invalid_specs_fail_before_anything_is_created() {
    let tag = fresh_tag();
    let mut unknown = chain();
    unknown.links.push(link("client", "nowhere", 1));
    assert!(matches!(
        Topology::build(&unknown, &tag, 1),
        Err(LabNetError::UnknownHost { .. })
    ));
    let mut duplicate = chain();
    duplicate.hosts.push(host("proxy", StackProfile::Modern));
    assert!(matches!(
        Topology::build(&duplicate, &tag, 1),
        Err(LabNetError::DuplicateHost(_))
    ));
    let mut bad_loss = chain();
    bad_loss.links[0].a_to_b.data_loss = midway_labnet::LossModel::Bernoulli { p: 1.5 };
    let err = Topology::build(&bad_loss, &tag, 1).unwrap_err();
    assert!(
        matches!(err, LabNetError::InvalidLinkConfig { index: 0, .. }),
        "{err}"
    );
    assert!(
        namespaces_tagged(&tag).is_empty(),
        "validation created something: {}",
        all_namespaces()
    );
    assert!(!std::path::Path::new(&format!("{}/{tag}.pid", midway_labnet::PID_DIR)).exists());
}

#[test]
fn two_topologies_side_by_side_with_same_addresses() {
    let (t1, t2) = (fresh_tag(), fresh_tag());
    let a = Topology::build(&chain(), &t1, 1).expect("first builds");
    let b = Topology::build(&chain(), &t2, 2).expect("second builds");
    assert_eq!(a.addr("server", "proxy"), b.addr("server", "proxy"));
    assert_ne!(a.netns_name("server"), b.netns_name("server"));
    assert!(ping_min_ms(&b, "client", b.addr("server", "proxy"), 2).is_some());
    // The same tag again is refused while it is live.
    assert!(matches!(
        Topology::build(&chain(), &t1, 1),
        Err(LabNetError::NameTaken(_))
    ));
    drop(a);
    drop(b);
    assert!(namespaces_tagged(&t1).is_empty() && namespaces_tagged(&t2).is_empty());
}

#[test]
fn legacy_host_sysctls_and_routes_read_back() {
    let tag = fresh_tag();
    let topology = Topology::build(&chain(), &tag, 1).expect("builds");
    let read = |host: &str, key: &'static str| {
        topology.in_host(host, move || {
            std::fs::read_to_string(format!("/proc/sys/net/ipv4/{key}"))
                .expect("sysctl readable")
                .trim()
                .to_owned()
        })
    };
    assert_eq!(read("server", "tcp_congestion_control"), "reno");
    assert_eq!(read("server", "tcp_sack"), "0");
    assert_eq!(read("server", "tcp_timestamps"), "0");
    assert_eq!(read("server", "tcp_recovery"), "0");
    assert_eq!(
        read("server", "tcp_rmem")
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["4096", "16384", "16384"]
    );
    assert_eq!(
        read("client", "tcp_sack"),
        "1",
        "modern host keeps the defaults"
    );
    assert_eq!(read("proxy", "ip_forward"), "1");
    assert_eq!(read("client", "ip_forward"), "0");
    // Read back in `ip`'s words, as a reader of the lab's hosts would see them.
    let routes = topology
        .program("server", "ip")
        .args(["route", "show"])
        .output()
        .expect("ip route");
    assert_eq!(routes.lines().count(), 2, "{routes}");
    // `ip` shows rto_min as locked (the kernel sets the lock bit with it).
    for wanted in [
        "rto_min lock 1s",
        "initcwnd 2",
        "advmss 536",
        "congctl reno",
        "mtu lock 576",
    ] {
        assert!(
            routes.lines().all(|l| l.contains(wanted)),
            "{wanted:?} missing in:\n{routes}"
        );
    }
    let routes6 = topology
        .program("server", "ip")
        .args(["-6", "route", "show"])
        .output()
        .expect("ip -6 route");
    let ours6: Vec<&str> = routes6.lines().filter(|l| l.starts_with("fd00:")).collect();
    assert_eq!(ours6.len(), 2, "{routes6}");
    for wanted in [
        "rto_min lock 1s",
        "initcwnd 2",
        "advmss 536",
        "congctl reno",
    ] {
        assert!(
            ours6.iter().all(|l| l.contains(wanted)),
            "{wanted:?} missing in:\n{routes6}"
        );
    }
    // The real window a legacy host advertises is below its 8 KB buffer (Linux doubles SO_RCVBUF
    // and advertises part of it).
    let window = topology
        .advertised_window("server", "proxy")
        .expect("window measured");
    assert!((1000..=8192).contains(&window), "legacy window {window}");
    eprintln!("legacy advertised window: {window} bytes");
    // Switching back to modern restores a fresh namespace's values.
    topology
        .apply_stack("server", StackProfile::Modern)
        .expect("switches");
    assert_eq!(read("server", "tcp_sack"), "1");
    assert_eq!(
        read("server", "tcp_congestion_control"),
        read("client", "tcp_congestion_control")
    );
}

#[test]
fn panic_inside_a_host_closure_still_tears_down() {
    let tag = fresh_tag();
    let result = std::panic::catch_unwind(|| {
        let topology = Topology::build(&chain(), &tag, 1).expect("builds");
        topology.in_host("client", || panic!("boom inside the host"));
    });
    assert!(result.is_err(), "the panic reached the caller");
    assert!(
        namespaces_tagged(&tag).is_empty(),
        "left after panic: {}",
        all_namespaces()
    );
}

#[test]
fn spawned_child_runs_in_the_host_and_is_stopped_on_drop() {
    let tag = fresh_tag();
    let topology = Topology::build(&chain(), &tag, 1).expect("builds");
    // A plain command: spawn puts it into the host's namespace itself.
    let mut sleep = Command::new("sleep");
    sleep.arg("60");
    let mut child = topology.spawn("server", sleep).expect("spawns");
    let pid = child.id();
    let ns_of = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    let host_ns = topology.in_host("server", || {
        std::fs::read_link("/proc/thread-self/ns/net").unwrap()
    });
    assert_eq!(ns_of(pid), Some(host_ns));
    assert!(child.try_wait().unwrap().is_none());
    drop(child);
    assert!(ns_of(pid).is_none(), "child still alive after drop");
}

/// Runs `getent hosts NAME` in `host` with `options`; (exit code, stdout).
fn getent_hosts(
    topology: &Topology,
    host: &str,
    name: &str,
    options: &midway_labnet::SpawnOptions,
) -> (Option<i32>, String) {
    use std::io::Read;
    let mut getent = Command::new("getent");
    getent
        .args(["hosts", name])
        .stdout(std::process::Stdio::piped());
    let mut child = topology.spawn_with(host, getent, options).expect("spawns");
    let status = child
        .wait_timeout(Duration::from_secs(20))
        .unwrap()
        .expect("getent ends");
    let mut out = String::new();
    child
        .child_mut()
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    (status.code(), out)
}

#[test]
fn a_hosts_file_is_seen_by_the_spawned_child_only() {
    let tag = fresh_tag();
    let topology = Topology::build(&chain(), &tag, 1).expect("builds");
    let server = topology.addr("server", "proxy");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hosts");
    let entries = std::collections::BTreeMap::from([
        ("www.lab".to_string(), server),
        ("s1.lab".to_string(), server),
    ]);
    std::fs::write(&file, midway_labnet::hosts_file_text(&entries).unwrap()).unwrap();
    let before = std::fs::read_to_string("/etc/hosts").unwrap();
    let with_file = midway_labnet::SpawnOptions {
        hosts_file: Some(file.clone()),
    };
    let (code, out) = getent_hosts(&topology, "client", "s1.lab", &with_file);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out.split_whitespace().next(),
        Some(server.to_string().as_str()),
        "{out}"
    );
    // Neither this process nor a child spawned without the option sees the lab's names.
    assert_eq!(std::fs::read_to_string("/etc/hosts").unwrap(), before);
    let (code, out) = getent_hosts(
        &topology,
        "client",
        "s1.lab",
        &midway_labnet::SpawnOptions::default(),
    );
    assert_ne!(code, Some(0), "resolved without the hosts file: {out}");
    // A missing file is an error before anything is spawned.
    let missing = midway_labnet::SpawnOptions {
        hosts_file: Some(dir.path().join("no-such-file")),
    };
    let error = topology
        .spawn_with("client", Command::new("true"), &missing)
        .unwrap_err();
    assert!(matches!(error, LabNetError::Io { .. }), "{error}");
}

#[test]
fn clean_leftovers_removes_namespaces_of_a_dead_owner() {
    // A finished child process provides a pid that is certainly dead.
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let tag = fresh_tag();
    let name = midway_labnet::host_netns_name(&tag, "ghost");
    std::fs::create_dir_all(midway_labnet::PID_DIR).unwrap();
    std::fs::write(
        format!("{}/{tag}.pid", midway_labnet::PID_DIR),
        format!("{dead_pid} 1\n"),
    )
    .unwrap();
    midway_sys::netns::create(&name).unwrap();
    // A live topology of this process is not touched.
    let live_tag = fresh_tag();
    let live = Topology::build(&chain(), &live_tag, 1).expect("builds");
    let removed = midway_labnet::clean_leftovers().expect("cleans");
    assert!(removed >= 1);
    assert!(
        namespaces_tagged(&tag).is_empty(),
        "leftover not removed: {}",
        all_namespaces()
    );
    assert!(!std::path::Path::new(&format!("{}/{tag}.pid", midway_labnet::PID_DIR)).exists());
    assert_eq!(
        namespaces_tagged(&live_tag).len(),
        5,
        "live topology touched"
    );
    drop(live);
}

#[test]
fn topology_and_children_can_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Topology>();
    send_sync::<midway_labnet::HostChild>();
}

#[test]
fn build_and_teardown_are_quick_enough_for_sweeps() {
    // Not a speed assertion: prints the cost so regressions are visible in `--nocapture` runs.
    let tag = fresh_tag();
    let started = std::time::Instant::now();
    let topology = Topology::build(&chain(), &tag, 1).expect("builds");
    let built = started.elapsed();
    topology.teardown().expect("tears down");
    eprintln!(
        "3-host chain: build {built:?}, teardown {:?}",
        started.elapsed() - built
    );
    assert!(namespaces_tagged(&tag).is_empty());
}

#[test]
fn build_reclaims_names_of_a_dead_run_with_the_same_tag() {
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let tag = fresh_tag();
    std::fs::create_dir_all(midway_labnet::PID_DIR).unwrap();
    std::fs::write(
        format!("{}/{tag}.pid", midway_labnet::PID_DIR),
        format!("{dead_pid} 1\n"),
    )
    .unwrap();
    let leftover = midway_labnet::host_netns_name(&tag, "client");
    midway_sys::netns::create(&leftover).unwrap();
    let topology = Topology::build(&chain(), &tag, 1).expect("builds over a dead run's leftovers");
    assert_eq!(namespaces_tagged(&tag).len(), 5);
    drop(topology);
    assert!(namespaces_tagged(&tag).is_empty());
}

#[test]
fn several_topologies_build_in_parallel() {
    let handles: Vec<_> = (0..6)
        .map(|i| {
            std::thread::spawn(move || {
                let tag = fresh_tag();
                let topology = Topology::build(&chain(), &tag, i).expect("builds in parallel");
                let rtt = ping_min_ms(&topology, "client", topology.addr("server", "proxy"), 2);
                drop(topology);
                (tag, rtt)
            })
        })
        .collect();
    for handle in handles {
        let (tag, rtt) = handle.join().expect("no panic");
        assert!(rtt.is_some_and(|ms| ms >= 30.0), "{tag}: {rtt:?}");
        assert!(namespaces_tagged(&tag).is_empty());
    }
}
