// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `transport = "quic"` between two midways, through the real binary on loopback (ports chosen
//! by the kernel, every wait bounded, every process stopped):
//!
//! - an edge (SOCKS5, `via` the gateway over a QUIC tunnel) and a gateway (a QUIC peer
//!   listener) pin each other's keys; `$MIDWAY_TEST_BYTES` (1 GiB in CI, else 32 MiB) both
//!   ways arrive intact over streams of one tunnel, a half-close travels end to end, a reset
//!   from the server reaches the client as a reset, and both ends log the transport;
//! - an edge whose key the gateway does not list is refused at the tunnel's handshake (logged
//!   and counted), its client gets a SOCKS5 failure, the destination is never contacted;
//! - an edge whose gateway answers no QUIC (only TLS over TCP at that port) falls back to TLS:
//!   the first connection succeeds within the QUIC handshake timeout plus a second, and the
//!   fallback is counted;
//! - a tunnel of two QUIC connections (`connections = 2`) spreads connections held at once
//!   over both.

mod peer_rig;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use midway_testkit::data::receive_all;
use midway_testkit::host::{Running, TempDir};
use peer_rig::{bulk, bulk_then_reset, destination, keygen, socks5, start, LIMIT};
use tokio::io::AsyncWriteExt;

fn gateway(dir: &Path, transport: &str, allowed: &[&str]) -> (Running, SocketAddr) {
    let allowed: Vec<String> = allowed.iter().map(|f| format!("{f:?}")).collect();
    start(
        dir,
        &format!("gateway-{transport}"),
        &format!(
            "[tls]\ncert = \"{0}/gw/peer.crt\"\nkey = \"{0}/gw/peer.key\"\n\n\
             [[listeners]]\nname = \"from-edges\"\nmode = \"peer\"\nlisten = \"127.0.0.1:0\"\n\
             keys = [\"k\"]\ntransport = \"{transport}\"\npeer_fingerprints = [{1}]\n",
            dir.display(),
            allowed.join(", ")
        ),
    )
}

fn edge(
    dir: &Path,
    name: &str,
    identity: &str,
    gateway: SocketAddr,
    pin: &str,
) -> (Running, SocketAddr) {
    edge_with(dir, name, identity, gateway, pin, "")
}

/// [`edge`] with more `[peers.quic]` lines.
fn edge_with(
    dir: &Path,
    name: &str,
    identity: &str,
    gateway: SocketAddr,
    pin: &str,
    quic_lines: &str,
) -> (Running, SocketAddr) {
    start(
        dir,
        name,
        &format!(
            "[tls]\ncert = \"{0}/{identity}/peer.crt\"\nkey = \"{0}/{identity}/peer.key\"\n\n\
             [[peers]]\nname = \"gw\"\naddress = \"{gateway}\"\nkey = \"k\"\ntransport = \"quic\"\n\
             fingerprint = \"{pin}\"\n\n\
             [peers.quic]\ncongestion_control = \"cubic\"\nhandshake_timeout = \"1s\"\n{quic_lines}\n\
             [[listeners]]\nname = \"socks\"\nmode = \"socks5\"\nlisten = \"127.0.0.1:0\"\n\
             via = [\"gw\"]\n",
            dir.display()
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_tunnel_carries_bulk_half_close_and_reset_and_refuses_unknown_keys() {
    let dir = TempDir::new("peers-quic");
    let dir = dir.path();
    let gw_pin = keygen(&dir.join("gw"));
    let edge_pin = keygen(&dir.join("edge"));
    let _stranger_pin = keygen(&dir.join("stranger"));
    let (mut gateway, gateway_addr) = gateway(dir, "quic", &[&edge_pin]);
    let (mut edge_midway, edge_addr) = edge(dir, "edge", "edge", gateway_addr, &gw_pin);
    let (target, accepted, received) = destination().await;

    bulk_then_reset(edge_addr, target, &received).await;
    let before = accepted.load(Ordering::SeqCst);
    assert_eq!(before, 2);
    edge_midway
        .wait_for_line(LIMIT, "the edge's log of a QUIC peer segment", |line| {
            line.contains("\"remote_segment\":\"peer\"")
                && line.contains("\"remote_transport\":\"quic\"")
        })
        .unwrap();
    gateway
        .wait_for_line(LIMIT, "the gateway's log of a QUIC peer segment", |line| {
            line.contains("\"local_segment\":\"peer\"")
                && line.contains("\"local_transport\":\"quic\"")
        })
        .unwrap();
    // One tunnel carried both connections.
    gateway
        .wait_for_line(LIMIT, "the tunnel accepted", |line| {
            line.contains("QUIC tunnel accepted")
        })
        .unwrap();

    // An edge with a key the gateway does not list: refused at the handshake, never relayed.
    let (_stranger, stranger_addr) = edge(dir, "stranger-edge", "stranger", gateway_addr, &gw_pin);
    tokio::time::timeout(LIMIT, async {
        let (_stream, code) = socks5(stranger_addr, target).await;
        assert_ne!(code, 0, "an unknown key must not be relayed");
    })
    .await
    .unwrap();
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        before,
        "the destination was contacted"
    );
    gateway
        .wait_for_line(LIMIT, "the refusal of the unknown key", |line| {
            line.contains("QUIC tunnel refused") && line.contains("unknown_peer")
        })
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_whose_gateway_answers_no_quic_falls_back_to_tls() {
    let dir = TempDir::new("peers-quic-fallback");
    let dir = dir.path();
    let gw_pin = keygen(&dir.join("gw"));
    let edge_pin = keygen(&dir.join("edge"));
    // Only TLS over TCP at the gateway's port: QUIC handshakes there go unanswered, as where
    // the path drops UDP.
    let (_gateway, gateway_addr) = gateway(dir, "tls", &[&edge_pin]);
    let (mut edge_midway, edge_addr) = edge(dir, "edge", "edge", gateway_addr, &gw_pin);
    let (target, accepted, _received) = destination().await;

    let started = Instant::now();
    let (mut stream, code) = tokio::time::timeout(LIMIT, socks5(edge_addr, target))
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(code, 0, "the first connection goes over the TLS fallback");
    // The handshake timeout is 1s; the TLS connection and the header add a little.
    assert!(took < Duration::from_secs(2), "took {took:?}");
    stream.shutdown().await.unwrap();
    let (bytes, _) = tokio::time::timeout(LIMIT, receive_all(&mut stream))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(bytes, bulk());
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    edge_midway
        .wait_for_line(LIMIT, "the edge's warning", |line| {
            line.contains("QUIC tunnel to peer cannot be set up") && line.contains("timeout")
        })
        .unwrap();
    edge_midway
        .wait_for_line(LIMIT, "the fallback connection's log", |line| {
            line.contains("\"remote_transport\":\"tls\"")
        })
        .unwrap();
}

/// The middle midway of an encrypted chain relays one peer stream into another: edge -QUIC->
/// middle -TLS-> gateway, bytes intact both ways and a reset carried end to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_middle_midway_relays_quic_in_to_tls_out() {
    let dir = TempDir::new("peers-quic-chain");
    let dir = dir.path();
    let gw_pin = keygen(&dir.join("gw"));
    let middle_pin = keygen(&dir.join("middle"));
    let edge_pin = keygen(&dir.join("edge"));
    let (_gateway, gateway_addr) = start(
        dir,
        "gateway",
        &format!(
            "[tls]\ncert = \"{0}/gw/peer.crt\"\nkey = \"{0}/gw/peer.key\"\n\n\
             [[listeners]]\nname = \"from-middle\"\nmode = \"peer\"\nlisten = \"127.0.0.1:0\"\n\
             keys = [\"k\"]\ntransport = \"tls\"\npeer_fingerprints = [\"{middle_pin}\"]\n",
            dir.display()
        ),
    );
    let (mut middle, middle_addr) = start(
        dir,
        "middle",
        &format!(
            "[tls]\ncert = \"{0}/middle/peer.crt\"\nkey = \"{0}/middle/peer.key\"\n\n\
             [[peers]]\nname = \"gw\"\naddress = \"{gateway_addr}\"\nkey = \"k\"\n\
             transport = \"tls\"\nfingerprint = \"{gw_pin}\"\n\n\
             [[listeners]]\nname = \"from-edge\"\nmode = \"peer\"\nlisten = \"127.0.0.1:0\"\n\
             keys = [\"k\"]\ntransport = \"quic\"\npeer_fingerprints = [\"{edge_pin}\"]\n\
             via = [\"gw\"]\n",
            dir.display()
        ),
    );
    let (_edge, edge_addr) = edge(dir, "edge", "edge", middle_addr, &middle_pin);
    let (target, accepted, received) = destination().await;

    bulk_then_reset(edge_addr, target, &received).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    middle
        .wait_for_line(
            LIMIT,
            "the middle's log of both encrypted segments",
            |line| {
                line.contains("\"local_transport\":\"quic\"")
                    && line.contains("\"remote_transport\":\"tls\"")
            },
        )
        .unwrap();
}

/// `connections = 2`: the edge keeps two QUIC connections to the gateway and four connections
/// held at once go two to each (a new stream takes the connection with the fewest open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_of_two_connections_spreads_streams_over_both() {
    let dir = TempDir::new("peers-quic-lanes");
    let dir = dir.path();
    let gw_pin = keygen(&dir.join("gw"));
    let edge_pin = keygen(&dir.join("edge"));
    let (mut gateway, gateway_addr) = gateway(dir, "quic", &[&edge_pin]);
    let (mut edge_midway, edge_addr) = edge_with(
        dir,
        "edge",
        "edge",
        gateway_addr,
        &gw_pin,
        "connections = 2\n",
    );
    for lane in 0..2 {
        edge_midway
            .wait_for_line(LIMIT, "a lane of the tunnel up", |line| {
                line.contains("QUIC tunnel to peer up")
                    && line.contains(&format!("\"lane\":{lane}"))
            })
            .unwrap();
    }
    let (target, accepted, _received) = destination().await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let (stream, code) = tokio::time::timeout(LIMIT, socks5(edge_addr, target))
            .await
            .unwrap();
        assert_eq!(code, 0);
        held.push(stream);
    }
    // The destination counts a connection when its accept task runs, which may be just after
    // the SOCKS5 reply reached the client.
    tokio::time::timeout(LIMIT, async {
        while accepted.load(Ordering::SeqCst) < 4 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap();
    // Reset by the client: each connection's end is logged by the gateway with the QUIC
    // connection (the edge's UDP address) it came over.
    for stream in held {
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
    }
    // The log is searched from its start at every poll: lines are keyed by their text.
    let mut ends = std::collections::HashMap::<String, String>::new();
    gateway
        .wait_for_line(LIMIT, "four connections' ends over two lanes", |line| {
            if !line.contains("\"local_transport\":\"quic\"") {
                return false;
            }
            let Some(client) = line.split("\"client\":\"").nth(1) else {
                return false;
            };
            let client = client.split('"').next().unwrap_or_default().to_string();
            ends.insert(line.to_string(), client);
            ends.len() == 4
        })
        .unwrap();
    let mut per_lane = std::collections::HashMap::<&str, usize>::new();
    for client in ends.values() {
        *per_lane.entry(client).or_default() += 1;
    }
    let mut counts: Vec<usize> = per_lane.values().copied().collect();
    counts.sort_unstable();
    assert_eq!(counts, [2, 2], "{per_lane:?}");
}
