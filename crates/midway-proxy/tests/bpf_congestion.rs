//! midway's BPF congestion controls through the proxy: a profile naming `highspeed` or
//! `gentle-highspeed` makes the proxy register them at start, and its sockets then run them,
//! read back by their kernel names (`ss -ti` prints the congestion control of every socket).

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use midway_testkit::net::*;
use midway_testkit::proxy::*;

fn ss(filter: &str) -> String {
    let out = std::process::Command::new("ss")
        .args(["-tinH", "state", "established", filter])
        .output()
        .expect("ss");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn bpf_congestion_controls(text: &str) -> Vec<&str> {
    text.split_whitespace()
        .filter(|token| *token == "mw_highspeed" || *token == "mw_gentle_hs")
        .collect()
}

#[tokio::test]
async fn a_profile_naming_highspeed_runs_mw_highspeed_on_the_remote_socket() {
    if !midway_testkit::host::is_root() {
        eprintln!("skipped: registering BPF congestion controls needs root");
        return;
    }
    let (echo, _server) = echo_server().await;
    let config = format!(
        r#"
[proxy]
allowed_clients = ["127.0.0.0/8"]
[spool]
dir = "SPOOL_DIR"
[profiles.lp]
congestion_control = "gentle-highspeed"
[profiles.rp]
congestion_control = "highspeed"
[[listeners]]
name = "fwd"
mode = "forward"
listen = "127.0.0.1:0"
target = "{echo}"
local_profile = "lp"
remote_profile = "rp"
"#
    );
    let proxy = start(&config).await;
    let addr = proxy.addr("fwd");
    let mut client = TcpStream::connect(addr).await.unwrap();
    // 1 MiB there and back: both segments carry data under their congestion controls.
    let payload: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let (mut reader, mut writer) = client.split();
    let (written, echoed) = tokio::join!(
        async {
            writer.write_all(&payload).await.unwrap();
        },
        async {
            let mut echoed = vec![0u8; payload.len()];
            reader.read_exact(&mut echoed).await.unwrap();
            echoed
        }
    );
    let () = written;
    assert!(echoed == payload, "echoed data differs");

    let remote = ss(&format!("( dport = :{} )", echo.port()));
    assert_eq!(
        bpf_congestion_controls(&remote),
        ["mw_highspeed"],
        "{remote}"
    );
    let local = ss(&format!("( sport = :{} )", addr.port()));
    assert_eq!(bpf_congestion_controls(&local), ["mw_gentle_hs"], "{local}");
    drop(client);
    let summary = proxy.stop().await;
    assert_eq!(summary.connections_served, 1);
}
