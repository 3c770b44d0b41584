// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! An allowed client cannot use midway to reach services that listen only on the gateway, on
//! any of its addresses: the metrics endpoint bound to 0.0.0.0 is refused through SOCKS5 and
//! HTTP at the gateway's non-loopback address too (issue 17, defect 4), while a destination
//! elsewhere is still reached. The real binary in a namespace of the test's own.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use midway_testkit::host::start_ready_in;
use midway_testkit::netns::{in_netns, run_words, Netns};
use midway_testkit::wait::wait_exit;

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(20);
/// The gateway's own non-loopback address (its end of a veth to the neighbour).
const GATEWAY: &str = "10.98.0.1";
const METRICS_PORT: u16 = 9100;

/// SOCKS5 CONNECT to `target` through the proxy at 127.0.0.1:1080; returns the reply code.
fn socks5_connect(target: [u8; 4], port: u16) -> u8 {
    let mut conn = TcpStream::connect("127.0.0.1:1080").unwrap();
    conn.set_read_timeout(Some(LIMIT)).unwrap();
    conn.write_all(&[5, 1, 0]).unwrap();
    let mut choice = [0u8; 2];
    conn.read_exact(&mut choice).unwrap();
    assert_eq!(choice, [5, 0]);
    let mut request = vec![5, 1, 0, 1];
    request.extend_from_slice(&target);
    request.extend_from_slice(&port.to_be_bytes());
    conn.write_all(&request).unwrap();
    let mut reply = [0u8; 10];
    conn.read_exact(&mut reply).unwrap();
    reply[1]
}

/// GET through the HTTP proxy at 127.0.0.1:3128; returns the status line.
fn http_get(url: &str, host: &str) -> String {
    let mut conn = TcpStream::connect("127.0.0.1:3128").unwrap();
    conn.set_read_timeout(Some(LIMIT)).unwrap();
    write!(
        conn,
        "GET {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut status = String::new();
    BufReader::new(conn).read_line(&mut status).unwrap();
    status.trim().to_string()
}

#[test]
fn services_on_the_gateways_own_addresses_are_not_reachable_through_it() {
    let ns = Netns::unique("mwt-gw");
    let name = ns.name();
    // The gateway's own address on a veth, and behind it a neighbour (a second namespace) that
    // runs a service clients may reach.
    let neighbour = Netns::unique("mwt-nb");
    let nb = neighbour.name();
    run_words(&format!(
        "ip -n {name} link add v0 type veth peer name v1 netns {nb}"
    ));
    run_words(&format!("ip -n {name} addr add {GATEWAY}/24 dev v0"));
    run_words(&format!("ip -n {name} link set v0 up"));
    run_words(&format!("ip -n {nb} addr add 10.98.0.2/24 dev v1"));
    run_words(&format!("ip -n {nb} link set v1 up"));
    let service = in_netns(nb, || {
        let listener = TcpListener::bind("10.98.0.2:8080").unwrap();
        for stream in listener.incoming().take(2) {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
        }
    });

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\n\
             [metrics]\nlisten = \"0.0.0.0:{METRICS_PORT}\"\n\
             [spool]\ndir = \"{}\"\n\n\
             [[listeners]]\nname = \"socks\"\nmode = \"socks5\"\nlisten = \"127.0.0.1:1080\"\n\n\
             [[listeners]]\nname = \"web\"\nmode = \"http\"\nlisten = \"127.0.0.1:3128\"\n",
            dir.path().join("spool").display()
        ),
    )
    .unwrap();
    let (mut midway, _log) = start_ready_in(MIDWAY, name, &config, LIMIT);

    let (socks_own, socks_neighbour, http_own, http_neighbour) = in_netns(name, || {
        (
            socks5_connect([10, 98, 0, 1], METRICS_PORT),
            socks5_connect([10, 98, 0, 2], 8080),
            http_get(&format!("http://{GATEWAY}:{METRICS_PORT}/metrics"), GATEWAY),
            http_get("http://10.98.0.2:8080/", "10.98.0.2:8080"),
        )
    })
    .join()
    .unwrap();
    // SOCKS5 reply 2: connection not allowed by ruleset.
    assert_eq!(
        socks_own, 2,
        "SOCKS5 reached the gateway's own metrics endpoint"
    );
    assert!(http_own.contains(" 403 "), "HTTP: {http_own}");
    // A destination elsewhere is reached as before.
    assert_eq!(socks_neighbour, 0);
    assert!(http_neighbour.contains(" 200 "), "HTTP: {http_neighbour}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(midway.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_exit(midway.child_mut(), LIMIT, "midway did not stop");
    let _ = service.join();
}
