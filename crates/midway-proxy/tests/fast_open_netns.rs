//! TCP Fast Open on both segments (`fast_open` in the profiles), in network namespaces (root
//! only; skipped with a message otherwise): client -- midway (a forward listener whose local
//! and remote profiles have `fast_open`, in the router namespace) -- server. Each namespace
//! the test made gets `net.ipv4.tcp_fastopen = 3`; no other is touched.
//!
//! The server greets every connection ("hi") and echoes the client's line. The client uses
//! Fast Open too, and writes its line at once.
//! - First connection: no cookie yet on either segment, so neither SYN carries data (both ask
//!   for a cookie); it must still work.
//! - Second: the client's SYN carries its line to midway (the client's tcp_info shows SYN
//!   data: fails if the listener has no Fast Open queue), and midway's SYN carries it on to
//!   the server (the server's accepted socket shows SYN data: fails if midway does not send
//!   the client's queued bytes in its SYN).
//! - Third: the client connects without Fast Open and waits for the greeting before it
//!   writes (a server that speaks first): fails (times out) if midway's Fast Open connect
//!   waits for the client's first byte before sending its SYN.
//! - And `check-config` in a namespace whose sysctl lacks the listener's bit refuses, naming
//!   the sysctl and the value it needs.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::thread::JoinHandle;
use std::time::Duration;

use midway_proxy::{check_kernel_support, parse_config};
use midway_sys::tcp_info::tcp_stats;
use midway_testkit::host::is_root;
use midway_testkit::netns::{in_netns, Netns, Routed};
use midway_testkit::proxy::start_in_netns;
use socket2::{Domain, Protocol, Socket, Type};

const IO_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECTIONS: usize = 3;
const PROFILES: &str = "[profiles.tfo]\ninherits = \"default\"\nfast_open = true\n";

/// The server in `ns`: a Fast Open listener on `addr` that greets each of `connections`
/// connections, echoes its line and closes it. Returns, per connection, whether its SYN
/// carried data.
fn start_server(ns: &str, addr: SocketAddr, connections: usize) -> JoinHandle<Vec<bool>> {
    let listener = in_netns(ns, move || {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        socket.set_reuse_address(true).unwrap();
        midway_sys::sockopt::set_int(socket.as_fd(), libc::IPPROTO_TCP, libc::TCP_FASTOPEN, 16)
            .unwrap();
        socket.bind(&addr.into()).unwrap();
        socket.listen(16).unwrap();
        TcpListener::from(socket)
    })
    .join()
    .unwrap();
    std::thread::spawn(move || {
        (0..connections)
            .map(|_| {
                let (mut stream, _) = listener.accept().unwrap();
                let syn_data = tcp_stats(stream.as_fd()).unwrap().syn_data();
                stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                stream.write_all(b"hi\n").unwrap();
                let mut line = String::new();
                BufReader::new(stream.try_clone().unwrap())
                    .read_line(&mut line)
                    .unwrap();
                stream.write_all(line.as_bytes()).unwrap();
                syn_data
            })
            .collect()
    })
}

/// One connection from `ns` to `proxy`: with Fast Open the client writes its line at once
/// (in its SYN when it has a cookie); without, it waits for the greeting first. Returns
/// whether its SYN carried data, after checking the greeting and the echo.
fn exchange(ns: &str, proxy: SocketAddr, fast_open: bool) -> bool {
    in_netns(ns, move || {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        if fast_open {
            midway_sys::sockopt::set_int(
                socket.as_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_FASTOPEN_CONNECT,
                1,
            )
            .unwrap();
        }
        socket.connect_timeout(&proxy.into(), IO_TIMEOUT).unwrap();
        let mut stream: TcpStream = socket.into();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut greeting = String::new();
        if fast_open {
            stream.write_all(b"hello\n").unwrap();
        } else {
            reader.read_line(&mut greeting).unwrap();
            stream.write_all(b"hello\n").unwrap();
        }
        if greeting.is_empty() {
            reader.read_line(&mut greeting).unwrap();
        }
        let mut echo = String::new();
        reader.read_line(&mut echo).unwrap();
        assert_eq!((greeting.as_str(), echo.as_str()), ("hi\n", "hello\n"));
        tcp_stats(stream.as_fd()).unwrap().syn_data()
    })
    .join()
    .unwrap()
}

#[test]
fn fast_open_carries_data_in_the_syn_on_both_segments_and_never_waits_for_it() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let net = Routed::new();
    for ns in [&net.client, &net.router, &net.server] {
        ns.set_sysctls(&[("net.ipv4.tcp_fastopen", "3")]);
    }
    let listen: SocketAddr = "10.77.1.2:7200".parse().unwrap();
    let server_addr: SocketAddr = "10.77.2.2:5400".parse().unwrap();
    let config = format!(
        "[proxy]\nallowed_clients = [\"10.77.1.0/24\"]\nshutdown_grace = \"1s\"\n{PROFILES}\
         [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"{listen}\"\n\
         target = \"{server_addr}\"\nlocal_profile = \"tfo\"\nremote_profile = \"tfo\"\n"
    );
    let proxy = start_in_netns(net.router.name(), config);
    let server = start_server(net.server.name(), server_addr, CONNECTIONS);

    let client_syn_data = [
        exchange(net.client.name(), listen, true),
        exchange(net.client.name(), listen, true),
        exchange(net.client.name(), listen, false),
    ];
    let server_syn_data = server.join().unwrap();
    proxy.stop();

    assert_eq!(
        client_syn_data,
        [false, true, false],
        "client -> midway: SYN data once the client has midway's cookie"
    );
    assert_eq!(
        server_syn_data,
        [false, true, false],
        "midway -> server: SYN data once midway has the server's cookie and the client's \
         bytes are there"
    );
}

#[test]
fn check_config_names_the_sysctl_a_fast_open_listener_needs() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let ns = Netns::unique("mwt-tfo");
    // Connecting only: the kernel's default.
    ns.set_sysctls(&[("net.ipv4.tcp_fastopen", "1")]);
    let config = format!(
        "[proxy]\nallowed_clients = [\"127.0.0.1\"]\n{PROFILES}\
         [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"127.0.0.1:0\"\n\
         target = \"127.0.0.1:5201\"\nlocal_profile = \"tfo\"\n"
    );
    let config = parse_config(&config, "<test>").unwrap();
    let remote_only = {
        let mut config = config.clone();
        config.listeners[0].local_profile = "default".into();
        config.listeners[0].remote_profile = "tfo".into();
        config
    };
    let (listener_check, remote_check) = in_netns(ns.name(), move || {
        (
            check_kernel_support(&config).map_err(|e| midway_testkit::chain(&e)),
            check_kernel_support(&remote_only).map_err(|e| midway_testkit::chain(&e)),
        )
    })
    .join()
    .unwrap();
    let err = listener_check.expect_err("a Fast Open listener with tcp_fastopen = 1");
    assert!(err.contains("net.ipv4.tcp_fastopen = 3"), "{err}");
    remote_check.expect("connecting with Fast Open needs only bit 1");
}
