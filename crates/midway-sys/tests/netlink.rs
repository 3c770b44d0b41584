//! The kernel-facing layer against a real kernel: two network namespaces made with
//! `netns::create`, joined by a veth pair made over netlink, with addresses, a route with TCP
//! metrics and a fwmark rule written and read back, a program and a sysctl inside a namespace.
//! Needs root; touches nothing outside its own namespaces.

// Tests: an unwrap that fails is the test failing.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use ipnet::IpNet;
use midway_sys::command::Program;
use midway_sys::netlink::{
    AddressSpec, Family, FwmarkRule, Metric, Netlink, PermanentNeighbour, Route, RouteMetric,
    RouteMetrics, TcpMetricsCache, VethEnd,
};
use midway_sys::{netns, sysctl};

/// A namespace made for the test, removed on drop (also when the test fails).
struct Namespace(String);

impl Namespace {
    fn new(tag: &str) -> Namespace {
        let name = format!("mwsys-{}-{tag}", std::process::id());
        netns::create(&name).unwrap();
        Namespace(name)
    }

    fn netlink(&self) -> Netlink {
        Netlink::open_in_named(&self.0).unwrap()
    }

    fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        netns::run_in(&netns::netns_path(&self.0), f).unwrap()
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = netns::delete(&self.0);
    }
}

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

/// Server namespace `a` (10.235.0.1, fd00:235::1 on `va`) and client `b` (.2 on `vb`).
fn pair(tag: &str) -> (Namespace, Namespace) {
    let (a, b) = (
        Namespace::new(&format!("{tag}a")),
        Namespace::new(&format!("{tag}b")),
    );
    // Made from this thread's namespace, each end straight into its own.
    Netlink::open()
        .unwrap()
        .add_veth(
            &VethEnd::named("va").with_mtu(1400).in_named_namespace(&a.0),
            &VethEnd::named("vb").with_mtu(1400).in_named_namespace(&b.0),
        )
        .unwrap();
    for (ns, dev, v4, v6) in [
        (&a, "va", "10.235.0.1/24", "fd00:235::1/64"),
        (&b, "vb", "10.235.0.2/24", "fd00:235::2/64"),
    ] {
        let mut nl = ns.netlink();
        nl.set_link_up("lo").unwrap();
        nl.set_link_up(dev).unwrap();
        let device = nl.link_index(dev).unwrap();
        for address in [v4, v6] {
            nl.add_address(&AddressSpec {
                address: net(address),
                device,
                nodad: true,
            })
            .unwrap();
        }
    }
    (a, b)
}

#[test]
fn veth_addresses_and_links_come_up_and_carry_tcp() {
    let (a, b) = pair("l");
    let mut nl = a.netlink();
    let va = nl.link("va").unwrap();
    assert!(va.up);
    assert_eq!(va.mtu, Some(1400));
    assert_eq!(va.address_text().unwrap().len(), 17);
    let addresses = nl.addresses(va.index).unwrap();
    assert!(addresses.contains(&net("10.235.0.1/24")), "{addresses:?}");
    assert!(addresses.contains(&net("fd00:235::1/64")), "{addresses:?}");
    // No end of the pair was ever in this namespace.
    assert!(Netlink::open().unwrap().link("va").is_err());

    let listener = a.run(|| TcpListener::bind("10.235.0.1:0").unwrap());
    let port = listener.local_addr().unwrap().port();
    let mut client = b
        .run(move || {
            TcpStream::connect_timeout(
                &SocketAddr::from(([10, 235, 0, 1], port)),
                Duration::from_secs(5),
            )
        })
        .unwrap();
    let (mut accepted, peer) = listener.accept().unwrap();
    assert_eq!(peer.ip(), "10.235.0.2".parse::<IpAddr>().unwrap());
    client.write_all(b"ping").unwrap();
    let mut buf = [0; 4];
    accepted.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");

    // Deleting one end removes its peer in the other namespace.
    nl.delete_link("va").unwrap();
    assert!(b.netlink().link("vb").unwrap_err().is_not_found());
}

#[test]
fn a_route_with_metrics_and_a_rule_read_back_as_written() {
    let (a, _b) = pair("r");
    let mut nl = a.netlink();
    let device = nl.link_index("va").unwrap();
    let mut route = Route::to(net("10.236.0.0/16"));
    route.table = 100;
    route.gateway = Some("10.235.0.2".parse().unwrap());
    route.device = Some(device);
    route.metrics = "mtu lock 1300 advmss 1260 initcwnd 7 initrwnd 20 rto_min 300ms quickack 1 congctl reno reordering lock 5 features ecn"
        .parse()
        .unwrap();
    nl.add_route(&route).unwrap();
    assert!(nl.add_route(&route).unwrap_err().is_exists());

    let listed = nl.routes(Family::V4, 100).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let back = &listed[0];
    assert_eq!(
        (back.destination, back.gateway, back.device, back.table),
        (route.destination, route.gateway, route.device, 100)
    );
    let mut metrics: Vec<String> = back.metrics.iter().map(|m| m.to_string()).collect();
    let mut wanted: Vec<String> = route.metrics.iter().map(|m| m.to_string()).collect();
    metrics.sort();
    wanted.sort();
    assert_eq!(metrics, wanted);
    assert!(back.metrics.get(Metric::RtoMin).unwrap().locked);
    // The main table is a different table.
    assert!(!nl
        .routes(Family::V4, midway_sys::netlink::TABLE_MAIN)
        .unwrap()
        .iter()
        .any(|r| r.destination == route.destination));

    // Replace one metric on every route of the table; the others stay.
    let changed = nl
        .set_metric_on_routes(Family::V4, 100, &RouteMetric::new(Metric::InitCwnd, 12))
        .unwrap();
    assert_eq!(changed, 1);
    let back = nl.routes(Family::V4, 100).unwrap().remove(0);
    assert_eq!(
        back.metrics.get(Metric::InitCwnd).unwrap().number(),
        Some(12)
    );
    assert_eq!(
        back.metrics.get(Metric::CongCtl),
        Some(&RouteMetric::congctl("reno"))
    );

    // Two link-local routes to one prefix on different devices: `append` keeps both.
    let mut v6 = Route::to(net("fd00:237::/64"));
    v6.table = 100;
    v6.device = Some(device);
    v6.metrics = RouteMetrics::new().with(RouteMetric::new(Metric::InitCwnd, 8));
    nl.append_route(&v6).unwrap();
    v6.device = Some(nl.link_index("lo").unwrap());
    nl.append_route(&v6).unwrap();
    assert_eq!(nl.routes(Family::V6, 100).unwrap().len(), 2);

    let rule = FwmarkRule {
        mask: Some(u32::MAX),
        priority: Some(1000),
        ..FwmarkRule::new(Family::V4, 0x4d00, 100)
    };
    nl.add_rule(&rule).unwrap();
    assert!(nl.add_rule(&rule).unwrap_err().is_exists());
    let rules = nl.rules(Family::V4).unwrap();
    assert!(rules.contains(&rule), "{rules:?}");
    assert!(!nl.rules(Family::V6).unwrap().iter().any(|r| r.table == 100));
    nl.delete_rule(&rule).unwrap();
    assert!(nl.delete_rule(&rule).unwrap_err().is_not_found());
    assert!(!nl.rules(Family::V4).unwrap().contains(&rule));

    assert_eq!(nl.flush_table(Family::V4, 100).unwrap(), 1);
    assert_eq!(nl.flush_table(Family::V6, 100).unwrap(), 2);
    assert!(nl.routes(Family::V4, 100).unwrap().is_empty());
    assert_eq!(nl.flush_table(Family::V4, 100).unwrap(), 0);
    let error = nl.delete_route(&route).unwrap_err();
    assert!(error.is_not_found(), "{error}");
    assert!(
        error.to_string().contains("route del 10.236.0.0/16"),
        "{error}"
    );
}

#[test]
fn programs_and_sysctls_run_in_the_namespace_given() {
    let ns = Namespace::new("p");
    let inode = netns::inode(&ns.0).unwrap();
    let shown = Program::new("readlink")
        .arg("/proc/self/ns/net")
        .in_named_namespace(&ns.0)
        .output()
        .unwrap();
    assert_eq!(shown.trim(), format!("net:[{inode}]"));

    let root_forwarding = sysctl::read("net.ipv4.ip_forward").unwrap();
    let inside = ns.run(|| {
        sysctl::write("net.ipv4.ip_forward", "1").unwrap();
        sysctl::read_u64("net.ipv4.ip_forward").unwrap()
    });
    assert_eq!(inside, 1);
    assert_eq!(
        sysctl::read("net.ipv4.ip_forward").unwrap(),
        root_forwarding
    );
    let path = netns::netns_path(&ns.0);
    sysctl::write_in(&path, "net.ipv4.ip_local_port_range", "1024 65000").unwrap();
    assert_eq!(
        sysctl::read_in(&path, "net.ipv4.ip_local_port_range").unwrap(),
        "1024 65000"
    );
    assert_eq!(
        netns::create(&ns.0).unwrap_err().kind(),
        std::io::ErrorKind::AlreadyExists
    );
}

#[test]
fn a_pinned_neighbour_carries_tcp_and_the_closed_connection_is_cached() {
    let (a, b) = pair("n");
    let server_mac = a.netlink().link("va").unwrap().address.unwrap();
    let mut nl = b.netlink();
    let device = nl.link_index("vb").unwrap();
    let neighbour = PermanentNeighbour {
        address: "10.235.0.1".parse().unwrap(),
        link_address: server_mac,
        device,
    };
    // Replace: twice is fine.
    nl.replace_neighbour(&neighbour).unwrap();
    nl.replace_neighbour(&neighbour).unwrap();

    let mut cache = TcpMetricsCache::open_in_named(&a.0).unwrap();
    let client: IpAddr = "10.235.0.2".parse().unwrap();
    assert!(cache.entries_for(client).unwrap().is_empty());
    let listener = a.run(|| TcpListener::bind("10.235.0.1:0").unwrap());
    let port = listener.local_addr().unwrap().port();
    let mut stream = b
        .run(move || {
            TcpStream::connect_timeout(
                &SocketAddr::from(([10, 235, 0, 1], port)),
                Duration::from_secs(5),
            )
        })
        .unwrap();
    let (mut accepted, _) = listener.accept().unwrap();
    accepted.write_all(&vec![7; 200_000]).unwrap();
    let mut received = vec![0; 200_000];
    stream.read_exact(&mut received).unwrap();
    // The server closes first: Linux caches the peer when the closing side's socket goes.
    drop(accepted);
    drop(stream);
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let entries = loop {
        let entries = cache.entries_for(client).unwrap();
        if !entries.is_empty() || std::time::Instant::now() > deadline {
            break entries;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(entries[0].rtt_us.is_some(), "{}", entries[0]);
    assert!(entries[0].to_string().starts_with("10.235.0.2 age "));
}
