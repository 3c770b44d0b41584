// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A QUIC tunnel's outages, through the real binary in a network namespace each test makes
//! (loopback there, fixed ports), with nftables rules in that namespace only dropping the
//! tunnel's UDP packets:
//!
//! - a 3 s blackout in the middle of a transfer (shorter than the tunnel's 10 s idle timeout)
//!   costs time but resets nothing: every byte arrives, on the same tunnel;
//! - a blackout longer than the idle timeout closes the tunnel and resets its connection on
//!   both sides (never a clean end after a truncated stream);
//! - with UDP dropped from the start, the first connection goes over TLS within the QUIC
//!   handshake timeout plus a second; once UDP passes again the edge sets the tunnel up and new
//!   connections use it.

mod peer_rig;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use midway_testkit::data::{receive_all, send_pattern};
use midway_testkit::host::{is_root, Place, Running, TempDir};
use midway_testkit::netns::Netns;
use peer_rig::{keygen, socks5, start_in, LIMIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const GATEWAY: &str = "127.0.0.1:7400";
const DESTINATION: &str = "127.0.0.1:7500";
/// Bytes the destination sends per connection: enough to be mid-transfer when the path goes
/// dark, paced so the transfer lasts several seconds.
const PACED_BYTES: usize = 8 << 20;
const PACED_CHUNK: usize = 64 << 10;
const PACED_EVERY: Duration = Duration::from_millis(40);

fn gateway(ns: &Netns, dir: &Path, edge_pin: &str, idle: &str) -> Running {
    let body = format!(
        "[tls]\ncert = \"{0}/gw/peer.crt\"\nkey = \"{0}/gw/peer.key\"\n\n\
         [[listeners]]\nname = \"tunnels\"\nmode = \"peer\"\nlisten = \"{GATEWAY}\"\n\
         keys = [\"k\"]\ntransport = \"quic\"\npeer_fingerprints = [\"{edge_pin}\"]\n\
         [listeners.quic]\nidle_timeout = \"{idle}\"\n\n\
         [[listeners]]\nname = \"tls-fallback\"\nmode = \"peer\"\nlisten = \"{GATEWAY}\"\n\
         keys = [\"k\"]\ntransport = \"tls\"\npeer_fingerprints = [\"{edge_pin}\"]\n",
        dir.display()
    );
    let (mut gateway, _) = start_in(Place::Netns(ns.name()), dir, "gateway", &body);
    gateway
        .wait_for_line(LIMIT, "the fallback listener", |line| {
            line.contains("listening") && line.contains("tls-fallback")
        })
        .unwrap();
    gateway
}

fn edge(ns: &Netns, dir: &Path, gw_pin: &str, idle: &str) -> (Running, SocketAddr) {
    let body = format!(
        "[tls]\ncert = \"{0}/edge/peer.crt\"\nkey = \"{0}/edge/peer.key\"\n\n\
         [[peers]]\nname = \"gw\"\naddress = \"{GATEWAY}\"\nkey = \"k\"\ntransport = \"quic\"\n\
         fingerprint = \"{gw_pin}\"\n\
         [peers.quic]\nidle_timeout = \"{idle}\"\nhandshake_timeout = \"1s\"\n\n\
         [[listeners]]\nname = \"socks\"\nmode = \"socks5\"\nlisten = \"127.0.0.1:1080\"\n\
         via = [\"gw\"]\n",
        dir.display()
    );
    start_in(Place::Netns(ns.name()), dir, "edge", &body)
}

/// Drops the tunnel's UDP packets both ways (an nftables table of the test's namespace).
fn go_dark(ns: &Netns) {
    let port = GATEWAY.rsplit(':').next().unwrap();
    for command in [
        "add table inet blackout".to_string(),
        "add chain inet blackout input { type filter hook input priority 0; }".to_string(),
        format!("add rule inet blackout input udp dport {port} drop"),
        format!("add rule inet blackout input udp sport {port} drop"),
    ] {
        let args: Vec<&str> = command.split(' ').collect();
        let output = ns.exec("nft", &args);
        assert!(output.status.success(), "nft {command}: {output:?}");
    }
}

fn light(ns: &Netns) {
    let output = ns.exec("nft", &["delete", "table", "inet", "blackout"]);
    assert!(output.status.success(), "{output:?}");
}

/// Runs `make`'s future on a current-thread runtime inside `ns`.
fn in_ns<T: Send, Fut: std::future::Future<Output = T>>(
    ns: &Netns,
    make: impl FnOnce() -> Fut + Send,
) -> T {
    ns.enter(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            tokio::time::timeout(LIMIT * 4, make())
                .await
                .expect("test in time")
        })
    })
}

/// A destination that sends [`PACED_BYTES`] in chunks at a steady pace, then its FIN, after
/// reading the client's request to its FIN.
async fn paced_destination() {
    let listener = TcpListener::bind(DESTINATION).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                stream.read_to_end(&mut request).await.unwrap();
                let mut pattern = midway_testkit::data::Pattern::new(11);
                let mut chunk = vec![0; PACED_CHUNK];
                for _ in 0..PACED_BYTES / PACED_CHUNK {
                    pattern.fill(&mut chunk);
                    stream.write_all(&chunk).await.unwrap();
                    tokio::time::sleep(PACED_EVERY).await;
                }
                stream.shutdown().await.unwrap();
            });
        }
    });
}

/// SHA-256 of the bytes [`paced_destination`] sends.
fn paced_digest() -> [u8; 32] {
    let mut pattern = midway_testkit::data::Pattern::new(11);
    let mut all = vec![0; PACED_BYTES];
    for chunk in all.chunks_mut(PACED_CHUNK) {
        pattern.fill(chunk);
    }
    midway_testkit::data::sha256(&all)
}

#[test]
fn a_blackout_shorter_than_the_idle_timeout_resets_nothing() {
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace");
        return;
    }
    let ns = Netns::unique("mwquic-dark");
    let dir = TempDir::new("quic-dark");
    let dir = dir.path();
    let gw_pin = keygen(&dir.join("gw"));
    let edge_pin = keygen(&dir.join("edge"));
    let mut gateway = gateway(&ns, dir, &edge_pin, "10s");
    let (mut edge, edge_addr) = edge(&ns, dir, &gw_pin, "10s");
    edge.wait_for_line(LIMIT, "the tunnel up", |line| {
        line.contains("QUIC tunnel to peer up")
    })
    .unwrap();
    let target: SocketAddr = DESTINATION.parse().unwrap();

    let (bytes, digest) = in_ns(&ns, || async {
        paced_destination().await;
        let (mut stream, code) = socks5(edge_addr, target).await;
        assert_eq!(code, 0, "SOCKS5 reply through the tunnel");
        send_pattern(&mut stream, 1000, 5).await.unwrap();
        let receiving = tokio::spawn(async move { receive_all(&mut stream).await });
        // Mid-transfer (the destination sends for about 5 s): dark for 3 s.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        go_dark(&ns);
        tokio::time::sleep(Duration::from_secs(3)).await;
        light(&ns);
        receiving.await.unwrap().unwrap()
    });
    assert_eq!(bytes, PACED_BYTES as u64, "every byte after the blackout");
    assert_eq!(digest, paced_digest());
    // The same tunnel carried it: never closed, never set up again.
    let closed = edge.wait_for_line(Duration::from_millis(200), "a tunnel close", |line| {
        line.contains("QUIC tunnel to peer closed")
    });
    assert!(
        closed.is_err(),
        "the tunnel closed during a blackout shorter than its idle timeout: {closed:?}"
    );
    gateway
        .wait_for_line(LIMIT, "the relayed connection's end", |line| {
            line.contains("\"local_transport\":\"quic\"")
                && line.contains("\"server_to_client_end\":\"Fin\"")
        })
        .unwrap();
}

#[test]
fn with_udp_dropped_connections_go_over_tls_until_the_tunnel_is_up() {
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace");
        return;
    }
    let ns = Netns::unique("mwquic-noudp");
    let dir = TempDir::new("quic-noudp");
    let dir = dir.path();
    let gw_pin = keygen(&dir.join("gw"));
    let edge_pin = keygen(&dir.join("edge"));
    go_dark(&ns);
    let _gateway = gateway(&ns, dir, &edge_pin, "10s");
    let (mut edge, edge_addr) = edge(&ns, dir, &gw_pin, "10s");
    let target: SocketAddr = DESTINATION.parse().unwrap();

    let took = in_ns(&ns, || async {
        paced_destination().await;
        let started = Instant::now();
        let (mut stream, code) = socks5(edge_addr, target).await;
        let took = started.elapsed();
        assert_eq!(code, 0, "the first connection over the TLS fallback");
        stream.shutdown().await.unwrap();
        let (bytes, _) = receive_all(&mut stream).await.unwrap();
        assert_eq!(bytes, PACED_BYTES as u64);
        took
    });
    // The QUIC handshake timeout is 1 s.
    assert!(
        took < Duration::from_secs(2),
        "first connection took {took:?}"
    );
    edge.wait_for_line(LIMIT, "the fallback's connection log", |line| {
        line.contains("\"remote_transport\":\"tls\"")
    })
    .unwrap();

    // UDP passes again: the edge's retries set the tunnel up, and new connections use it.
    light(&ns);
    edge.wait_for_line(LIMIT, "the tunnel up again", |line| {
        line.contains("QUIC tunnel to peer up again")
    })
    .unwrap();
    in_ns(&ns, || async {
        paced_destination().await;
        let (mut stream, code) = socks5(edge_addr, target).await;
        assert_eq!(code, 0);
        stream.shutdown().await.unwrap();
        let (bytes, _) = receive_all(&mut stream).await.unwrap();
        assert_eq!(bytes, PACED_BYTES as u64);
    });
    edge.wait_for_line(LIMIT, "a connection over the tunnel", |line| {
        line.contains("\"remote_transport\":\"quic\"")
    })
    .unwrap();
}

#[test]
fn a_blackout_longer_than_the_idle_timeout_resets_the_connection() {
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace");
        return;
    }
    let ns = Netns::unique("mwquic-long");
    let dir = TempDir::new("quic-long");
    let dir = dir.path();
    let gw_pin = keygen(&dir.join("gw"));
    let edge_pin = keygen(&dir.join("edge"));
    let mut gateway = gateway(&ns, dir, &edge_pin, "2s");
    let (mut edge, edge_addr) = edge(&ns, dir, &gw_pin, "2s");
    edge.wait_for_line(LIMIT, "the tunnel up", |line| {
        line.contains("QUIC tunnel to peer up")
    })
    .unwrap();
    let target: SocketAddr = DESTINATION.parse().unwrap();

    let outcome = in_ns(&ns, || async {
        paced_destination().await;
        let (mut stream, code) = socks5(edge_addr, target).await;
        assert_eq!(code, 0);
        send_pattern(&mut stream, 1000, 5).await.unwrap();
        let receiving = tokio::spawn(async move { receive_all(&mut stream).await });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        go_dark(&ns);
        tokio::time::sleep(Duration::from_secs(5)).await;
        light(&ns);
        receiving.await.unwrap()
    });
    assert!(
        matches!(&outcome, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the client saw {outcome:?}, not a reset"
    );
    edge.wait_for_line(LIMIT, "the tunnel's close", |line| {
        line.contains("QUIC tunnel to peer closed")
    })
    .unwrap();
    // The gateway reset its side too: its relay ended with the stream lost, not a FIN.
    gateway
        .wait_for_line(LIMIT, "the gateway's end of the connection", |line| {
            line.contains("\"local_transport\":\"quic\"")
                && !line.contains("\"server_to_client_end\":\"Fin\"")
        })
        .unwrap();
}
