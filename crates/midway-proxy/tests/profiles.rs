//! Profiles reach the right sockets: the local profile the accepted socket, the remote profile
//! the outgoing one, a client-prefix override only its clients. Read back with `ss -ti`
//! (congestion control is the knob `ss` prints for every socket).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

mod common;
use common::*;

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
