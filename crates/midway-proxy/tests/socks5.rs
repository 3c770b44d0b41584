//! SOCKS5 on loopback: CONNECT by IPv4 and by name through both relay models, password
//! authentication, garbage, unsupported commands, refused targets, targets in
//! `denied_destinations` and the handshake timeout.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use midway_testkit::metrics::*;
use midway_testkit::net::*;
use midway_testkit::proxy::*;

fn socks_config(relay: &str, auth: &str) -> String {
    format!(
        r#"
[proxy]
allowed_clients = ["127.0.0.0/8", "::1"]
# The tests' targets live on loopback, which the default denied_destinations refuses.
denied_destinations = []
connect_timeout = "2s"
handshake_timeout = "500ms"
[metrics]
listen = "127.0.0.1:0"
[spool]
dir = "SPOOL_DIR"
[[listeners]]
name = "socks"
mode = "socks5"
listen = "127.0.0.1:0"
relay = "{relay}"
{auth}
"#
    )
}

const PASSWORD_AUTH: &str = r#"auth = "password"
users = [{ name = "alice", password = "wonderland" }, { name = "bob", password = "builder" }]"#;

fn connect_request_v4(target: SocketAddr) -> Vec<u8> {
    let SocketAddr::V4(v4) = target else {
        panic!("v4 only")
    };
    let mut req = vec![5, 1, 0, 1];
    req.extend_from_slice(&v4.ip().octets());
    req.extend_from_slice(&v4.port().to_be_bytes());
    req
}

fn connect_request_domain(name: &str, port: u16) -> Vec<u8> {
    let mut req = vec![5, 1, 0, 3, name.len() as u8];
    req.extend_from_slice(name.as_bytes());
    req.extend_from_slice(&port.to_be_bytes());
    req
}

async fn read_reply(stream: &mut TcpStream) -> Vec<u8> {
    // Replies with an IPv4 or IPv6 bound address: read the fixed head, then the rest.
    let mut head = [0u8; 4];
    tokio::time::timeout(WAIT, stream.read_exact(&mut head))
        .await
        .unwrap()
        .unwrap();
    let rest = match head[3] {
        1 => 6,
        4 => 18,
        other => panic!("unexpected ATYP {other}"),
    };
    let mut tail = vec![0u8; rest];
    stream.read_exact(&mut tail).await.unwrap();
    let mut reply = head.to_vec();
    reply.extend_from_slice(&tail);
    reply
}

/// Greeting with no-auth, then CONNECT; returns the reply code.
async fn socks_connect(proxy: SocketAddr, request: &[u8]) -> (TcpStream, u8) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    let mut method = [0u8; 2];
    s.read_exact(&mut method).await.unwrap();
    assert_eq!(method, [5, 0]);
    s.write_all(request).await.unwrap();
    let reply = read_reply(&mut s).await;
    (s, reply[1])
}

async fn refused(proxy: &Running, reason: &str) -> Option<f64> {
    let text = scrape(proxy.metrics.unwrap()).await;
    metric(
        &text,
        &format!("midway_connections_refused_total{{listener=\"socks\",reason=\"{reason}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_ipv4_both_relay_models() {
    for relay in ["buffer", "spool"] {
        let (echo, _server) = echo_server().await;
        let proxy = start(&socks_config(relay, "")).await;
        let (stream, code) = socks_connect(proxy.addr("socks"), &connect_request_v4(echo)).await;
        assert_eq!(code, 0);
        let (sent, received) = echo_roundtrip(stream, bulk_bytes(), 11).await;
        assert_eq!(sent, received, "relay = {relay}");
        proxy.stop().await;
    }
}

/// "localhost" resolves to ::1 and 127.0.0.1; the echo server is on IPv4 only, so this also
/// shows the proxy trying the next address after a refused one.
#[tokio::test]
async fn connect_by_domain_name() {
    let (echo, _server) = echo_server().await;
    let proxy = start(&socks_config("buffer", "")).await;
    let (stream, code) = socks_connect(
        proxy.addr("socks"),
        &connect_request_domain("localhost", echo.port()),
    )
    .await;
    assert_eq!(code, 0);
    let (sent, received) = echo_roundtrip(stream, 100_000, 12).await;
    assert_eq!(sent, received);
    proxy.stop().await;
}

/// The client sends its greeting and request one byte at a time.
#[tokio::test]
async fn byte_by_byte_handshake() {
    let (echo, _server) = echo_server().await;
    let proxy = start(&socks_config("buffer", "")).await;
    let mut s = TcpStream::connect(proxy.addr("socks")).await.unwrap();
    s.set_nodelay(true).unwrap();
    for b in [5u8, 1, 0] {
        s.write_all(&[b]).await.unwrap();
    }
    let mut method = [0u8; 2];
    s.read_exact(&mut method).await.unwrap();
    for b in connect_request_v4(echo) {
        s.write_all(&[b]).await.unwrap();
        tokio::task::yield_now().await;
    }
    assert_eq!(read_reply(&mut s).await[1], 0);
    let (a, b) = echo_roundtrip(s, 1000, 13).await;
    assert_eq!(a, b);
    proxy.stop().await;
}

#[tokio::test]
async fn password_auth_accepts_right_and_rejects_wrong() {
    let (echo, _server) = echo_server().await;
    let proxy = start(&socks_config("buffer", PASSWORD_AUTH)).await;
    let addr = proxy.addr("socks");

    let login = |user: &str, pass: &str| {
        let mut msg = vec![1, user.len() as u8];
        msg.extend_from_slice(user.as_bytes());
        msg.push(pass.len() as u8);
        msg.extend_from_slice(pass.as_bytes());
        msg
    };

    // Right credentials (second user).
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&[5, 2, 0, 2]).await.unwrap();
    let mut two = [0u8; 2];
    s.read_exact(&mut two).await.unwrap();
    assert_eq!(two, [5, 2], "server must pick username/password");
    s.write_all(&login("bob", "builder")).await.unwrap();
    s.read_exact(&mut two).await.unwrap();
    assert_eq!(two, [1, 0]);
    s.write_all(&connect_request_v4(echo)).await.unwrap();
    assert_eq!(read_reply(&mut s).await[1], 0);
    let (a, b) = echo_roundtrip(s, 5000, 14).await;
    assert_eq!(a, b);

    // Wrong password: status 1, then closed.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&[5, 1, 2]).await.unwrap();
    s.read_exact(&mut two).await.unwrap();
    s.write_all(&login("alice", "builder")).await.unwrap();
    s.read_exact(&mut two).await.unwrap();
    assert_eq!(two, [1, 1]);
    assert!(closed_without_data(&mut s).await);

    // Only "no auth" offered to a password listener: 0xFF, then closed.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    s.read_exact(&mut two).await.unwrap();
    assert_eq!(two, [5, 0xff]);
    assert!(closed_without_data(&mut s).await);

    assert_eq!(refused(&proxy, "socks5_auth").await, Some(2.0));
    proxy.stop().await;
}

#[tokio::test]
async fn garbage_is_closed_without_reply() {
    let proxy = start(&socks_config("buffer", "")).await;
    let mut s = TcpStream::connect(proxy.addr("socks")).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_without_data(&mut s).await);

    // A greeting that offers zero methods.
    let mut s = TcpStream::connect(proxy.addr("socks")).await.unwrap();
    s.write_all(&[5, 0]).await.unwrap();
    assert!(closed_without_data(&mut s).await);
    assert_eq!(refused(&proxy, "socks5_protocol").await, Some(2.0));
    proxy.stop().await;
}

#[tokio::test]
async fn unsupported_command_and_address_type_get_their_reply() {
    let proxy = start(&socks_config("buffer", "")).await;
    // BIND (0x02).
    let (mut s, code) =
        socks_connect(proxy.addr("socks"), &[5, 2, 0, 1, 127, 0, 0, 1, 0, 80]).await;
    assert_eq!(code, 0x07);
    assert!(closed_without_data(&mut s).await);
    // UDP ASSOCIATE (0x03).
    let (_s, code) = socks_connect(proxy.addr("socks"), &[5, 3, 0, 1, 127, 0, 0, 1, 0, 80]).await;
    assert_eq!(code, 0x07);
    // Address type 0x09.
    let mut s = TcpStream::connect(proxy.addr("socks")).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    let mut two = [0u8; 2];
    s.read_exact(&mut two).await.unwrap();
    s.write_all(&[5, 1, 0, 9, 1, 2, 3]).await.unwrap();
    assert_eq!(read_reply(&mut s).await[1], 0x08);
    proxy.stop().await;
}

#[tokio::test]
async fn refused_target_gets_connection_refused_reply() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = start(&socks_config("buffer", "")).await;
    let (mut s, code) = socks_connect(proxy.addr("socks"), &connect_request_v4(closed)).await;
    assert_eq!(code, 0x05);
    assert!(closed_without_data(&mut s).await);
    assert_eq!(refused(&proxy, "connect_refused").await, Some(1.0));

    proxy.stop().await;
}

#[tokio::test]
async fn silent_client_hits_handshake_timeout() {
    let proxy = start(&socks_config("buffer", "")).await;
    let started = std::time::Instant::now();
    let mut s = TcpStream::connect(proxy.addr("socks")).await.unwrap();
    s.write_all(&[5]).await.unwrap(); // half a greeting, then silence
    assert!(closed_without_data(&mut s).await);
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(refused(&proxy, "socks5_timeout").await, Some(1.0));
    proxy.stop().await;
}

#[tokio::test]
async fn connect_ipv6_target() {
    // IPv6 loopback is needed for this test.
    let (echo, _server) = echo_server_at("[::1]:0").await;
    let proxy = start(&socks_config("buffer", "")).await;
    let SocketAddr::V6(v6) = echo else {
        unreachable!()
    };
    let mut req = vec![5, 1, 0, 4];
    req.extend_from_slice(&v6.ip().octets());
    req.extend_from_slice(&v6.port().to_be_bytes());
    let (stream, code) = socks_connect(proxy.addr("socks"), &req).await;
    assert_eq!(code, 0);
    let (a, b) = echo_roundtrip(stream, 200_000, 15).await;
    assert_eq!(a, b);
    proxy.stop().await;
}

/// Without `denied_destinations` in the config, the proxy host's loopback is out of reach: the
/// reply is "not allowed by ruleset", the target never sees a connection, and the refusal is
/// counted. IPv4-mapped IPv6 (`::ffff:127.0.0.1`) and names resolving to loopback are refused too.
#[tokio::test]
async fn loopback_targets_are_denied_by_default() {
    let target = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target_addr = target.local_addr().unwrap();
    let config = socks_config("buffer", "").replace("denied_destinations = []\n", "");
    let proxy = start(&config).await;

    let (_s, code) = socks_connect(proxy.addr("socks"), &connect_request_v4(target_addr)).await;
    assert_eq!(code, 2, "IPv4 loopback");

    let mut mapped = vec![5, 1, 0, 4];
    mapped.extend_from_slice(
        &"::ffff:127.0.0.1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    mapped.extend_from_slice(&target_addr.port().to_be_bytes());
    let (_s, code) = socks_connect(proxy.addr("socks"), &mapped).await;
    assert_eq!(code, 2, "IPv4-mapped IPv6 loopback");

    let (_s, code) = socks_connect(
        proxy.addr("socks"),
        &connect_request_domain("localhost", target_addr.port()),
    )
    .await;
    assert_eq!(code, 2, "a name that resolves to loopback");

    assert!(
        tokio::time::timeout(Duration::from_millis(300), target.accept())
            .await
            .is_err(),
        "the denied target saw a connection"
    );
    assert_eq!(refused(&proxy, "denied_destination").await, Some(3.0));
    proxy.stop().await;
}
