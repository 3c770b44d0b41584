//! Driver integration tests (root): a real link between two namespaces through the emulator.
//!
//! Topology per test: `lemu-<pid>-<n>-a` (a0, 10.99.0.1/24) <-veth-> `...-l` (la | lb, the
//! emulator's namespace) <-veth-> `...-b` (b0, 10.99.0.2/24). A Drop guard deletes the namespaces.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use midway_linkemu::{
    spawn_link, DirectionConfig, DirectionStats, DriverError, LossModel, QueueLimit, UdpAction,
    UdpImpairment,
};
use midway_sys::command::{spawn_in_namespace, Program};
use midway_sys::netlink::{AddressSpec, Netlink, VethEnd};
use midway_testkit::netns::in_netns;
use midway_testkit::wait::poll_until;

static NEXT_TOPOLOGY: AtomicU32 = AtomicU32::new(0);

/// Three namespaces and two veth pairs; deleted on drop, even when the test fails.
struct Topology {
    names: [String; 3],
}

impl Topology {
    fn new() -> Topology {
        assert!(
            nix::unistd::geteuid().is_root(),
            "the driver tests need root (network namespaces and raw sockets)"
        );
        let prefix = format!(
            "lemu-{}-{}",
            std::process::id(),
            NEXT_TOPOLOGY.fetch_add(1, Ordering::Relaxed)
        );
        let topology = Topology {
            names: ["a", "l", "b"].map(|suffix| format!("{prefix}-{suffix}")),
        };
        let [a, l, b] = &topology.names;
        let mut sockets = Vec::new();
        for name in &topology.names {
            midway_sys::netns::create(name).expect("add namespace");
            let mut netlink = Netlink::open_in_named(name).expect("netlink");
            netlink.set_link_up("lo").expect("lo up");
            sockets.push(netlink);
        }
        let [na, nl, nb] = <[Netlink; 3]>::try_from(sockets).unwrap();
        let mut by_namespace = [(a, na), (l, nl), (b, nb)];
        by_namespace[0]
            .1
            .add_veth(
                &VethEnd::named("a0"),
                &VethEnd::named("la").in_named_namespace(l),
            )
            .expect("veth a0-la");
        by_namespace[1]
            .1
            .add_veth(
                &VethEnd::named("lb"),
                &VethEnd::named("b0").in_named_namespace(b),
            )
            .expect("veth lb-b0");
        // Keep the emulator's namespace quiet: no IPv6 chatter from la/lb.
        midway_sys::netns::run_in(&topology.path(1), || {
            midway_sys::sysctl::write("net.ipv6.conf.all.disable_ipv6", "1")
        })
        .unwrap()
        .expect("disable IPv6");
        for (index, interface) in [(0, "a0"), (1, "la"), (1, "lb"), (2, "b0")] {
            let (namespace, netlink) = &mut by_namespace[index];
            Program::new("ethtool")
                .args(["-K", interface, "gro", "off", "gso", "off", "tso", "off"])
                .args(["tx", "off", "rx", "off"])
                .in_named_namespace(namespace)
                .run()
                .expect("offloads off");
            netlink.set_link_up(interface).expect("link up");
        }
        for (index, interface, address) in [(0, "a0", "10.99.0.1/24"), (2, "b0", "10.99.0.2/24")] {
            let netlink = &mut by_namespace[index].1;
            let device = netlink.link_index(interface).expect("link index");
            netlink
                .add_address(&AddressSpec {
                    address: address.parse().unwrap(),
                    device,
                    nodad: false,
                })
                .expect("addr add");
        }
        topology
    }

    fn path(&self, index: usize) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.names[index])
    }

    fn a(&self) -> &str {
        &self.names[0]
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = midway_sys::netns::delete(name);
        }
    }
}

/// No frame suffered from the driver itself or from offloads left on.
fn assert_clean(stats: &DirectionStats) {
    assert_eq!(stats.kernel_drops, 0, "{stats:?}");
    assert_eq!(stats.io_errors, 0, "{stats:?}");
    assert_eq!(stats.oversized_frames, 0, "{stats:?}");
    assert_eq!(stats.partial_checksum_frames, 0, "{stats:?}");
    assert_eq!(stats.dropped_memory_frames, 0, "{stats:?}");
}

fn mean_send_lateness_us(stats: &DirectionStats) -> f64 {
    stats.send_lateness_total_ns as f64 / stats.sent_frames.max(1) as f64 / 1e3
}

fn symmetric(config: DirectionConfig) -> (DirectionConfig, DirectionConfig) {
    (config.clone(), config)
}

/// Pings from namespace a; returns (received, average RTT in ms).
fn ping(namespace: &str, count: u32) -> (u32, f64) {
    let mut ping = Command::new("ping");
    ping.args(["-q", "-n", "-i", "0.05", "-W", "2"])
        .args(["-c", &count.to_string(), "10.99.0.2"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Its output whatever its status: a ping that lost every packet exits with 1.
    let output = spawn_in_namespace(&midway_sys::netns::netns_path(namespace), ping)
        .expect("run ping")
        .wait_with_output()
        .expect("run ping");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let received = text
        .split(", ")
        .find_map(|part| part.strip_suffix(" received"))
        .and_then(|number| number.trim().parse().ok())
        .unwrap_or(0);
    let average = text
        .lines()
        .find(|line| line.starts_with("rtt"))
        .and_then(|line| line.split(" = ").nth(1))
        .and_then(|values| values.split('/').nth(1))
        .and_then(|average| average.parse().ok())
        .unwrap_or(f64::NAN);
    (received, average)
}

#[test]
fn ping_rtt_matches_the_configured_delay() {
    let topology = Topology::new();
    let config = DirectionConfig {
        delay: Duration::from_millis(10),
        rate_bps: Some(20_000_000),
        ..Default::default()
    };
    let (a_to_b, b_to_a) = symmetric(config);
    let link = spawn_link(&topology.path(1), "la", "lb", a_to_b, b_to_a, 7).expect("spawn link");
    // Resolve ARP first so that it does not add a round trip to the measured pings.
    assert_eq!(ping(topology.a(), 1).0, 1, "no ping reply through the link");
    let (received, average_ms) = ping(topology.a(), 40);
    // Two 98-byte frames serialised at 20 Mbit/s add 2 x 39.2 us to 2 x 10 ms.
    let expected_ms = 20.0 + 2.0 * 98.0 * 8.0 / 20e6 * 1e3;
    eprintln!("ping: {received}/40 received, average RTT {average_ms:.3} ms, expected {expected_ms:.3} ms, error {:+.3} ms", average_ms - expected_ms);
    assert_eq!(received, 40);
    assert!(
        (average_ms - expected_ms).abs() < 2.0,
        "average RTT {average_ms} ms, expected {expected_ms} ms"
    );
    let (a_to_b, b_to_a) = link.stop();
    eprintln!(
        "ping: emulator send lateness mean {:.1} / {:.1} us, max {:.1} / {:.1} us",
        mean_send_lateness_us(&a_to_b),
        mean_send_lateness_us(&b_to_a),
        a_to_b.send_lateness_max_ns as f64 / 1e3,
        b_to_a.send_lateness_max_ns as f64 / 1e3
    );
    assert!(a_to_b.sent_frames >= 41 && b_to_a.sent_frames >= 41);
    assert_clean(&a_to_b);
    assert_clean(&b_to_a);
}

/// Sends `total` bytes over TCP from host a to host b; returns (bytes received, bytes received
/// after the first `warm_up` bytes, time from the end of the warm-up to the last byte).
fn bulk_transfer(topology: &Topology, total: usize, warm_up: usize) -> (usize, usize, Duration) {
    let (port_tx, port_rx) = mpsc::channel();
    let server = in_netns(&topology.names[2], move || {
        let listener = TcpListener::bind("10.99.0.2:0").expect("bind");
        port_tx.send(listener.local_addr().unwrap().port()).unwrap();
        let (mut stream, _) = listener.accept().expect("accept");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut buffer = vec![0u8; 64 << 10];
        let mut received = 0usize;
        let mut warm_up_end = None;
        loop {
            let n = stream.read(&mut buffer).expect("read");
            if n == 0 {
                break;
            }
            received += n;
            if warm_up_end.is_none() && received >= warm_up {
                warm_up_end = Some((Instant::now(), received));
            }
        }
        let (start, start_bytes) = warm_up_end.expect("transfer shorter than warm-up");
        (received, received - start_bytes, start.elapsed())
    });
    let port = port_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("server port");
    let client = in_netns(&topology.names[0], move || {
        let address = SocketAddr::from(([10, 99, 0, 2], port));
        let mut stream =
            TcpStream::connect_timeout(&address, Duration::from_secs(10)).expect("connect");
        // Bounds every write and the final read if the link stops carrying traffic.
        stream
            .set_write_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let chunk = vec![0x5au8; 64 << 10];
        let mut sent = 0;
        while sent < total {
            let n = chunk.len().min(total - sent);
            stream.write_all(&chunk[..n]).expect("write");
            sent += n;
        }
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        // Wait for the server's FIN so the connection is fully done before the link stops.
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
    });
    let result = server.join().expect("server thread");
    client.join().expect("client thread");
    result
}

#[test]
fn bulk_tcp_goodput_matches_the_configured_rate() {
    const TOTAL_BYTES: usize = 6 << 20;
    const WARM_UP_BYTES: usize = 1 << 20;
    let rate_bps = 20_000_000u64;
    let topology = Topology::new();
    let config = DirectionConfig {
        delay: Duration::from_millis(10),
        rate_bps: Some(rate_bps),
        ..Default::default()
    };
    let (a_to_b, b_to_a) = symmetric(config);
    let link = spawn_link(&topology.path(1), "la", "lb", a_to_b, b_to_a, 8).expect("spawn link");

    let (received, measured_bytes, elapsed) = bulk_transfer(&topology, TOTAL_BYTES, WARM_UP_BYTES);
    let (a_to_b, b_to_a) = link.stop();
    assert_eq!(received, TOTAL_BYTES);
    // Full-size frames: 1514 bytes on the link carry 1448 bytes of payload (TCP timestamps on).
    let expected_bps = rate_bps as f64 * 1448.0 / 1514.0;
    let goodput_bps = measured_bytes as f64 * 8.0 / elapsed.as_secs_f64();
    eprintln!(
        "bulk: goodput {:.3} Mbit/s, expected {:.3} Mbit/s, error {:+.2} %; a->b {a_to_b:?}; b->a {b_to_a:?}",
        goodput_bps / 1e6,
        expected_bps / 1e6,
        (goodput_bps / expected_bps - 1.0) * 100.0
    );
    assert!(
        (goodput_bps / expected_bps - 1.0).abs() < 0.10,
        "goodput {goodput_bps} bit/s, expected {expected_bps}"
    );
    assert_clean(&a_to_b);
    assert_clean(&b_to_a);
    assert_eq!(a_to_b.dropped_loss_frames + a_to_b.dropped_queue_frames, 0);
}

fn within_bernoulli_bound(stats: &DirectionStats, p: f64) -> bool {
    let n = stats.arrived_frames as f64;
    let expected = n * p;
    let sigma = (n * p * (1.0 - p)).sqrt();
    (stats.dropped_loss_frames as f64 - expected).abs() < 4.0 * sigma
}

#[test]
fn bernoulli_loss_through_the_link_matches_the_stats() {
    const DATAGRAMS: usize = 4000;
    let p = 0.05;
    let topology = Topology::new();
    // A rate spreads the burst out as a real link would, so the receiving socket keeps up.
    let a_to_b = DirectionConfig {
        delay: Duration::from_millis(1),
        rate_bps: Some(20_000_000),
        data_loss: LossModel::Bernoulli { p },
        ..Default::default()
    };
    let b_to_a = DirectionConfig {
        delay: Duration::from_millis(1),
        ..Default::default()
    };
    let link = spawn_link(&topology.path(1), "la", "lb", a_to_b, b_to_a, 9).expect("spawn link");
    // Resolve ARP (itself subject to the loss) before the measured burst.
    assert!(
        ping(topology.a(), 5).0 >= 1,
        "no ping reply through the link"
    );
    let before = link.stats().0;

    let (port_tx, port_rx) = mpsc::channel();
    let receiver = in_netns(&topology.names[2], move || {
        let socket = UdpSocket::bind("10.99.0.2:0").expect("bind");
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBufForce, &(8 << 20))
            .expect("receive buffer");
        port_tx.send(socket.local_addr().unwrap().port()).unwrap();
        // The burst is over once nothing has come for a while; the read timeout bounds the loop.
        socket
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buffer = [0u8; 2048];
        let mut received = 0usize;
        while received < DATAGRAMS && socket.recv(&mut buffer).is_ok() {
            received += 1;
        }
        received
    });
    let port = port_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let sender = in_netns(&topology.names[0], move || {
        let socket = UdpSocket::bind("10.99.0.1:0").expect("bind");
        for index in 0..DATAGRAMS {
            let mut payload = [0u8; 100];
            payload[..8].copy_from_slice(&(index as u64).to_be_bytes());
            socket
                .send_to(&payload, SocketAddr::from(([10, 99, 0, 2], port)))
                .expect("send");
        }
    });
    sender.join().expect("sender");
    let received = receiver.join().expect("receiver");
    let (after, _) = link.stop();
    let burst = DirectionStats {
        arrived_frames: after.arrived_frames - before.arrived_frames,
        dropped_loss_frames: after.dropped_loss_frames - before.dropped_loss_frames,
        ..Default::default()
    };
    eprintln!(
        "loss: {received}/{DATAGRAMS} datagrams received; engine saw {} frames, lost {} ({:.3} %, p = {p})",
        burst.arrived_frames,
        burst.dropped_loss_frames,
        burst.dropped_loss_frames as f64 / burst.arrived_frames as f64 * 100.0
    );
    assert_clean(&after);
    assert_eq!(after.dropped_queue_frames, 0);
    assert!(burst.arrived_frames >= DATAGRAMS as u64);
    assert!(within_bernoulli_bound(&burst, p), "{burst:?}");
    // Every datagram was either delivered or lost by the emulator (a few other frames, such as
    // ARP, may also have been lost, hence >=).
    assert!(received + burst.dropped_loss_frames as usize >= DATAGRAMS);
    assert!(received < DATAGRAMS);
}

/// Sends `count` 100-byte datagrams from namespace index `from` to `to_address` in namespace
/// index `to`; returns how many arrived (the receiver gives up after 300 ms of silence).
fn udp_burst(
    topology: &Topology,
    from: usize,
    to: usize,
    to_address: [u8; 4],
    count: usize,
) -> usize {
    let (port_tx, port_rx) = mpsc::channel();
    let receiver = in_netns(&topology.names[to], move || {
        let socket = UdpSocket::bind(SocketAddr::from((to_address, 0))).expect("bind");
        port_tx.send(socket.local_addr().unwrap().port()).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut buffer = [0u8; 2048];
        let mut received = 0usize;
        while received < count && socket.recv(&mut buffer).is_ok() {
            received += 1;
        }
        received
    });
    let port = port_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let sender = in_netns(&topology.names[from], move || {
        let socket = UdpSocket::bind("0.0.0.0:0").expect("bind");
        for _ in 0..count {
            socket
                .send_to(&[7u8; 100], SocketAddr::from((to_address, port)))
                .expect("send");
        }
    });
    sender.join().expect("sender");
    receiver.join().expect("receiver")
}

#[test]
fn udp_is_blocked_while_tcp_passes() {
    const DATAGRAMS: usize = 50;
    let topology = Topology::new();
    let a_to_b = DirectionConfig {
        delay: Duration::from_millis(1),
        udp: Some(UdpImpairment {
            port: None,
            action: UdpAction::Drop,
        }),
        ..Default::default()
    };
    let b_to_a = DirectionConfig {
        delay: Duration::from_millis(1),
        ..Default::default()
    };
    let link = spawn_link(&topology.path(1), "la", "lb", a_to_b, b_to_a, 11).expect("spawn link");
    // Resolve ARP (not UDP, so it passes) before the datagrams.
    assert_eq!(ping(topology.a(), 1).0, 1, "no ping reply through the link");
    assert_eq!(udp_burst(&topology, 0, 2, [10, 99, 0, 2], DATAGRAMS), 0);
    // The other direction carries UDP.
    assert_eq!(
        udp_burst(&topology, 2, 0, [10, 99, 0, 1], DATAGRAMS),
        DATAGRAMS
    );
    // TCP goes through the blocked direction.
    let total = 256 << 10;
    let (received, _, _) = bulk_transfer(&topology, total, 0);
    assert_eq!(received, total);
    let (a_to_b, b_to_a) = link.stop();
    assert_clean(&a_to_b);
    assert_clean(&b_to_a);
    assert!(a_to_b.udp_drops >= DATAGRAMS as u64, "{a_to_b:?}");
    assert_eq!(b_to_a.udp_drops, 0, "{b_to_a:?}");
    assert_eq!(a_to_b.dropped_loss_frames + a_to_b.dropped_queue_frames, 0);
    assert_eq!(a_to_b.outage_drops, 0);
}

#[test]
fn checksum_offload_left_on_is_reported() {
    let topology = Topology::new();
    let link = spawn_link(
        &topology.path(1),
        "la",
        "lb",
        DirectionConfig::default(),
        DirectionConfig::default(),
        10,
    )
    .expect("spawn link");
    // Resolve ARP with offloads still off, then turn tx checksum offload back on in host a.
    assert_eq!(ping(topology.a(), 1).0, 1, "no ping reply through the link");
    Program::new("ethtool")
        .args(["-K", "a0", "tx", "on"])
        .in_named_namespace(topology.a())
        .run()
        .expect("tx checksum offload on");
    let sender = in_netns(&topology.names[0], || {
        let socket = UdpSocket::bind("10.99.0.1:0").expect("bind");
        for _ in 0..10 {
            socket.send_to(&[1u8; 100], "10.99.0.2:9").expect("send");
        }
    });
    sender.join().expect("sender");
    // The link thread publishes its counters every few milliseconds: wait for them, bounded.
    poll_until(Duration::from_secs(5), || {
        link.stats().0.partial_checksum_frames >= 10
    });
    let (a_to_b, _) = link.stop();
    assert!(a_to_b.partial_checksum_frames >= 10, "{a_to_b:?}");
}

#[test]
fn spawn_link_reports_bad_input() {
    let bad_config = DirectionConfig {
        data_loss: LossModel::Bernoulli { p: 2.0 },
        ..Default::default()
    };
    let error = spawn_link(
        std::path::Path::new("/run/netns/does-not-matter"),
        "la",
        "lb",
        DirectionConfig::default(),
        bad_config,
        1,
    )
    .unwrap_err();
    assert!(
        matches!(
            error,
            DriverError::InvalidConfig {
                direction: "b_to_a",
                ..
            }
        ),
        "{error:?}"
    );

    let missing = format!("/run/netns/lemu-{}-missing", std::process::id());
    let error = spawn_link(
        std::path::Path::new(&missing),
        "la",
        "lb",
        DirectionConfig::default(),
        DirectionConfig::default(),
        1,
    )
    .unwrap_err();
    assert!(matches!(error, DriverError::OpenNetns { .. }), "{error:?}");

    let topology = Topology::new();
    let error = spawn_link(
        &topology.path(1),
        "la",
        "nope0",
        DirectionConfig::default(),
        DirectionConfig::default(),
        1,
    )
    .unwrap_err();
    assert!(
        matches!(&error, DriverError::NoSuchInterface { name, .. } if name == "nope0"),
        "{error:?}"
    );
}

#[test]
fn drop_tail_queue_limits_the_bytes_waiting() {
    // A cable modem's 10 KB buffer in front of a 20 Mbit/s link: TCP overflows it.
    let topology = Topology::new();
    let a_to_b = DirectionConfig {
        delay: Duration::from_millis(10),
        rate_bps: Some(20_000_000),
        queue: QueueLimit::Bytes(10_000),
        ..Default::default()
    };
    let b_to_a = DirectionConfig {
        delay: Duration::from_millis(10),
        ..Default::default()
    };
    let link = spawn_link(&topology.path(1), "la", "lb", a_to_b, b_to_a, 11).expect("spawn link");
    let (received, _, _) = bulk_transfer(&topology, 2 << 20, 1);
    let (a_to_b, b_to_a) = link.stop();
    eprintln!(
        "queue: {} frames tail-dropped, max queue {} bytes / {} frames",
        a_to_b.dropped_queue_frames, a_to_b.max_queue_bytes, a_to_b.max_queue_frames
    );
    assert_eq!(received, 2 << 20);
    assert!(a_to_b.dropped_queue_frames > 0, "{a_to_b:?}");
    assert!(a_to_b.max_queue_bytes <= 10_000, "{a_to_b:?}");
    assert_eq!(a_to_b.dropped_loss_frames, 0);
    assert_clean(&a_to_b);
    assert_clean(&b_to_a);
}
