//! Profiles reach the right sockets: the local profile the accepted socket, the remote profile
//! the outgoing one, a client-prefix override only its clients. Read back with `ss -ti`
//! (congestion control is the knob `ss` prints for every socket).

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use midway_testkit::net::*;
use midway_testkit::proxy::*;
use midway_testkit::wait::*;

fn ss(filter: &str) -> String {
    let out = std::process::Command::new("ss")
        .args(["-tinH", "state", "established", filter])
        .output()
        .expect("ss");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn congestion_controls(text: &str) -> Vec<&'static str> {
    let mut found = Vec::new();
    for token in text.split_whitespace() {
        for cc in ["reno", "bbr", "cubic"] {
            if token == cc {
                found.push(cc);
            }
        }
    }
    found
}

#[tokio::test]
async fn local_remote_and_override_profiles_on_live_sockets() {
    let (echo, _server) = echo_server().await;
    let config = format!(
        r#"
[proxy]
allowed_clients = ["127.0.0.0/8"]
[spool]
dir = "SPOOL_DIR"
[profiles.lp]
congestion_control = "reno"
[profiles.rp]
congestion_control = "bbr"
[profiles.op]
congestion_control = "bbr"
[[listeners]]
name = "fwd"
mode = "forward"
listen = "127.0.0.1:0"
target = "{echo}"
local_profile = "lp"
remote_profile = "rp"
[[listeners.client_profiles]]
prefix = "127.0.0.2/32"
local_profile = "op"
"#
    );
    let proxy = start(&config).await;
    let addr = proxy.addr("fwd");

    let mut plain = TcpStream::connect(addr).await.unwrap();
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut special = socket.connect(addr).await.unwrap();
    // A round trip each: both split connections are fully set up.
    for s in [&mut plain, &mut special] {
        s.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
    }

    let port = addr.port();
    let plain_local = ss(&format!("( sport = :{port} and dst 127.0.0.1 )"));
    assert_eq!(congestion_controls(&plain_local), ["reno"], "{plain_local}");
    let special_local = ss(&format!("( sport = :{port} and dst 127.0.0.2 )"));
    assert_eq!(
        congestion_controls(&special_local),
        ["bbr"],
        "{special_local}"
    );
    let remote = ss(&format!("( dport = :{} )", echo.port()));
    assert_eq!(congestion_controls(&remote), ["bbr", "bbr"], "{remote}");
    drop((plain, special));
    let summary = proxy.stop().await;
    assert_eq!(summary.connections_served, 2);
}

/// TCP_NODELAY of the in-process proxy's socket whose local and peer addresses are these
/// (found among this process's file descriptors; the proxy runs in the test process).
fn proxy_socket_nodelay(local: std::net::SocketAddr, peer: std::net::SocketAddr) -> Option<bool> {
    use std::os::fd::{AsRawFd, BorrowedFd};
    let entries = std::fs::read_dir("/proc/self/fd").unwrap();
    for entry in entries.flatten() {
        let Ok(raw) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // SAFETY: the descriptor stays open while this function runs (the connections are held
        // by the caller); a descriptor closed meanwhile only makes the calls below fail.
        let fd = unsafe { BorrowedFd::borrow_raw(raw) };
        let sock = socket2::SockRef::from(&fd);
        let matches = sock.local_addr().ok().and_then(|a| a.as_socket()) == Some(local)
            && sock.peer_addr().ok().and_then(|a| a.as_socket()) == Some(peer);
        if matches {
            assert_eq!(fd.as_raw_fd(), raw);
            return sock.nodelay().ok();
        }
    }
    None
}

/// Relayed sockets get TCP_NODELAY unless their profile sets `nodelay`; a profile asking for
/// Nagle (`nodelay = false`) keeps it on its segment only.
#[tokio::test]
async fn relay_sockets_get_nodelay_unless_the_profile_decides() {
    let (echo, _server) = echo_server().await;
    let config = format!(
        r#"
[proxy]
allowed_clients = ["127.0.0.0/8"]
[spool]
dir = "SPOOL_DIR"
[profiles.nagle]
nodelay = false
[[listeners]]
name = "plain"
mode = "forward"
listen = "127.0.0.1:0"
target = "{echo}"
[[listeners]]
name = "nagle-local"
mode = "forward"
listen = "127.0.0.1:0"
target = "{echo}"
local_profile = "nagle"
"#
    );
    let proxy = start(&config).await;
    for (listener, local_expected) in [("plain", true), ("nagle-local", false)] {
        let addr = proxy.addr(listener);
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        client.read_exact(&mut b).await.unwrap();
        let client_addr = client.local_addr().unwrap();
        assert_eq!(
            proxy_socket_nodelay(addr, client_addr),
            Some(local_expected),
            "{listener}: accepted socket"
        );
        // The outgoing socket: the only socket of this process connected to the echo server
        // whose own address is not the echo server's.
        let remote = ss(&format!("( dport = :{} )", echo.port()));
        let outgoing: Vec<std::net::SocketAddr> = remote
            .lines()
            .filter_map(|line| line.split_whitespace().nth(2)?.parse().ok())
            .collect();
        assert_eq!(outgoing.len(), 1, "{remote}");
        assert_eq!(
            proxy_socket_nodelay(outgoing[0], echo),
            Some(true),
            "{listener}: outgoing socket (default profile)"
        );
        drop(client);
        // Let the relay close before the next listener's connection is counted in `ss`.
        assert!(
            eventually(WAIT, || ss(&format!("( dport = :{} )", echo.port()))
                .trim()
                .is_empty())
            .await
        );
    }
    proxy.stop().await;
}
