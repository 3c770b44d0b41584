//! DSCP carried across the split (`carry_dscp`), in network namespaces (root only; skipped
//! with a message otherwise): client -- midway (forward listeners, in the router namespace) --
//! server, over IPv4 and IPv6.
//!
//! The client marks its socket EF (0xb8, DSCP 46) before it connects; the server reads the
//! class the kernel kept from its client's packets (its listener keeps it). With `carry_dscp`
//! the server sees EF: fails if the accepted socket's marking is not read or not put on the
//! remote socket. Without it the server sees 0: fails if midway marks what it was not asked to.
//!
//! The server marks its replies AF11 (0x28, DSCP 10) and answers each byte with one. The
//! client reads the class of the last segment it received, round trip after round trip
//! (midway marks the local socket after the server's first bytes, so the first replies may go
//! unmarked): with `carry_dscp` it becomes AF11 within `SETTLE`; without, it stays 0. IPv4
//! keeps no received class on a connecting socket (neither the client's here, nor midway's
//! remote one): both read it through midway-sys's BPF socket filter.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use midway_sys::tos;
use midway_sys::tos_filter::ReceivedTosFilter;
use midway_testkit::host::is_root;
use midway_testkit::netns::{in_netns, Routed};
use midway_testkit::proxy::start_in_netns;
use socket2::{Domain, Protocol, Socket, Type};

const EF: u8 = 0xb8;
const AF11: u8 = 0x28;
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the client's round trips may take to see the server's marking.
const SETTLE: Duration = Duration::from_secs(5);
/// Round trips a client makes through a listener that does not carry the marking.
const UNCARRIED_ROUNDS: usize = 20;

/// One case: a listener of midway's and the server port behind it.
struct Case {
    carry: bool,
    listen: SocketAddr,
    server: SocketAddr,
}

/// The server in `ns`: accepts one connection on `addr`, reads the class of its client's
/// packets, marks its own AF11 and echoes byte for byte until the client closes. Returns the
/// class its client's packets carried.
fn start_server(ns: &str, addr: SocketAddr) -> JoinHandle<Option<u8>> {
    let listener = in_netns(ns, move || {
        let listener = TcpListener::bind(addr).unwrap();
        tos::set_keep_received_class(listener.as_fd(), true).unwrap();
        listener
    })
    .join()
    .unwrap();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let received = tos::received_class(stream.as_fd()).unwrap();
        tos::set_class(stream.as_fd(), AF11).unwrap();
        let mut byte = [0u8; 1];
        while stream.read(&mut byte).unwrap_or(0) == 1 {
            if stream.write_all(&byte).is_err() {
                break;
            }
        }
        received
    })
}

/// One round trip: a byte out, its echo back.
fn round_trip(stream: &mut TcpStream) {
    stream.write_all(b"x").unwrap();
    let mut byte = [0u8; 1];
    stream.read_exact(&mut byte).unwrap();
}

/// The client in `ns`: marks EF, connects to `proxy` and makes round trips until the last
/// segment it received carries AF11 (within `SETTLE`), or `UNCARRIED_ROUNDS` of them when the
/// marking is not expected. Returns the class of the last segment received.
fn run_client(ns: &str, proxy: SocketAddr, expect_carried: bool) -> Option<u8> {
    in_netns(ns, move || {
        let socket = Socket::new(
            Domain::for_address(proxy),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .unwrap();
        tos::set_class(socket.as_fd(), EF).unwrap();
        let filter = (!proxy.is_ipv6()).then(|| ReceivedTosFilter::load().unwrap());
        match &filter {
            Some(filter) => filter.attach(socket.as_fd()).unwrap(),
            None => tos::set_keep_received_class(socket.as_fd(), true).unwrap(),
        }
        socket.connect_timeout(&proxy.into(), IO_TIMEOUT).unwrap();
        let mut stream: TcpStream = socket.into();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let last_class = |stream: &TcpStream| match &filter {
            Some(filter) => filter.latest(stream.as_fd()).unwrap(),
            None => tos::received_class(stream.as_fd()).unwrap(),
        };
        round_trip(&mut stream);
        if expect_carried {
            let deadline = Instant::now() + SETTLE;
            while last_class(&stream) != Some(AF11) && Instant::now() < deadline {
                round_trip(&mut stream);
            }
        } else {
            for _ in 0..UNCARRIED_ROUNDS {
                round_trip(&mut stream);
            }
        }
        last_class(&stream)
    })
    .join()
    .unwrap()
}

#[test]
fn the_clients_and_the_servers_dscp_cross_the_split_when_the_listener_carries_it() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let net = Routed::new();
    let addr = |text: &str| -> SocketAddr { text.parse().unwrap() };
    let cases = [
        Case {
            carry: true,
            listen: addr("10.77.1.2:7100"),
            server: addr("10.77.2.2:5300"),
        },
        Case {
            carry: false,
            listen: addr("10.77.1.2:7101"),
            server: addr("10.77.2.2:5301"),
        },
        Case {
            carry: true,
            listen: addr("[fd77:1::2]:7102"),
            server: addr("[fd77:2::2]:5302"),
        },
        Case {
            carry: false,
            listen: addr("[fd77:1::2]:7103"),
            server: addr("[fd77:2::2]:5303"),
        },
    ];
    let mut config = String::from(
        "[proxy]\nallowed_clients = [\"10.77.1.0/24\", \"fd77:1::/64\"]\nshutdown_grace = \"1s\"\n",
    );
    for (i, case) in cases.iter().enumerate() {
        config.push_str(&format!(
            "[[listeners]]\nname = \"fwd{i}\"\nmode = \"forward\"\nlisten = \"{}\"\n\
             target = \"{}\"\ncarry_dscp = {}\n",
            case.listen, case.server, case.carry
        ));
    }
    let proxy = start_in_netns(net.router.name(), config);

    for case in &cases {
        let server = start_server(net.server.name(), case.server);
        let client_saw = run_client(net.client.name(), case.listen, case.carry);
        let server_saw = server.join().unwrap();
        let what = format!("listener {} (carry_dscp = {})", case.listen, case.carry);
        let expected_at_server = if case.carry { EF } else { 0 };
        assert_eq!(
            server_saw.map(|class| class & 0xfc),
            Some(expected_at_server),
            "{what}: the class of the client's packets at the server"
        );
        let expected_at_client = if case.carry { AF11 } else { 0 };
        assert_eq!(
            client_saw.map(|class| class & 0xfc),
            Some(expected_at_client),
            "{what}: the class of the server's packets at the client"
        );
    }
    proxy.stop();
}
