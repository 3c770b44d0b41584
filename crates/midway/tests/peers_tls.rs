// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `transport = "tls"` between two midways, through the real binary on loopback (ports chosen
//! by the kernel, every wait bounded, every process stopped):
//!
//! - keys from `midway peer keygen`; an edge (SOCKS5, `via` the gateway, warm connections)
//!   and a gateway (peer listener) pin each other's fingerprint; `$MIDWAY_TEST_BYTES` (1 GiB
//!   in CI, else 32 MiB) both ways arrive intact, a half-close travels end to end, and a reset
//!   from the server reaches the client as a reset;
//! - an edge whose key the gateway does not list is refused at the handshake (the gateway
//!   logs and counts it), its client gets a SOCKS5 failure, and the destination is never
//!   contacted; a plain-TCP client of the TLS peer listener is refused the same way.

mod peer_rig;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;

use midway_testkit::host::{Running, TempDir};
use peer_rig::{bulk_then_reset, destination, keygen, socks5, start, LIMIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn gateway(dir: &Path, allowed: &[&str]) -> (Running, SocketAddr) {
    let allowed: Vec<String> = allowed.iter().map(|f| format!("{f:?}")).collect();
    start(
        dir,
        "gateway",
        &format!(
            "[tls]\ncert = \"{0}/gw/peer.crt\"\nkey = \"{0}/gw/peer.key\"\n\n\
             [[listeners]]\nname = \"from-edges\"\nmode = \"peer\"\nlisten = \"127.0.0.1:0\"\n\
             keys = [\"k\"]\ntransport = \"tls\"\npeer_fingerprints = [{1}]\n",
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
    start(
        dir,
        name,
        &format!(
            "[tls]\ncert = \"{0}/{identity}/peer.crt\"\nkey = \"{0}/{identity}/peer.key\"\n\n\
             [[peers]]\nname = \"gw\"\naddress = \"{gateway}\"\nkey = \"k\"\ntransport = \"tls\"\n\
             fingerprint = \"{pin}\"\nwarm_connections = 2\n\n\
             [[listeners]]\nname = \"socks\"\nmode = \"socks5\"\nlisten = \"127.0.0.1:0\"\n\
             via = [\"gw\"]\n",
            dir.display()
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_tls_carries_bulk_half_close_and_reset_and_refuses_unknown_keys() {
    let dir = TempDir::new("peers-tls");
    let dir = dir.path();
    let gw_pin = keygen(&dir.join("gw"));
    let edge_pin = keygen(&dir.join("edge"));
    let _stranger_pin = keygen(&dir.join("stranger"));
    let (mut gateway, gateway_addr) = gateway(dir, &[&edge_pin]);
    let (mut edge_midway, edge_addr) = edge(dir, "edge", "edge", gateway_addr, &gw_pin);
    let (target, accepted, received) = destination().await;

    bulk_then_reset(edge_addr, target, &received).await;
    let before = accepted.load(Ordering::SeqCst);
    assert_eq!(before, 2);
    // Each end's connection log names the transport of its peer segment, with the TLS
    // segment's final tcp_info (read from its socket just before the relay closed it).
    edge_midway
        .wait_for_line(LIMIT, "the edge's log of a TLS peer segment", |line| {
            line.contains("\"remote_segment\":\"peer\"")
                && line.contains("\"remote_transport\":\"tls\"")
                && line.contains("\"remote_srtt_us\":")
        })
        .unwrap();
    gateway
        .wait_for_line(LIMIT, "the gateway's log of a TLS peer segment", |line| {
            line.contains("\"local_segment\":\"peer\"")
                && line.contains("\"local_transport\":\"tls\"")
        })
        .unwrap();

    // An edge with a key the gateway does not list: refused at the handshake, never relayed.
    let (_stranger, stranger_addr) = edge(dir, "stranger-edge", "stranger", gateway_addr, &gw_pin);
    tokio::time::timeout(LIMIT, async {
        let (_stream, code) = socks5(stranger_addr, target).await;
        assert_ne!(code, 0, "an unknown key must not be relayed");
        // A plain-TCP client of the TLS listener (an old edge, a scanner).
        let mut plain = TcpStream::connect(gateway_addr).await.unwrap();
        plain
            .write_all(b"MWPH not a TLS hello at all\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        let answer = plain.read(&mut buf).await;
        assert!(
            !matches!(answer, Ok(n) if n > 0 && !buf[..n].starts_with(&[0x15])),
            "a plain client got bytes other than a TLS alert: {answer:?}"
        );
    })
    .await
    .unwrap();
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        before,
        "the destination was contacted"
    );
    // The gateway said why, naming the reason its metric counts.
    gateway
        .wait_for_line(LIMIT, "the refusal of the unknown key", |line| {
            line.contains("peer_tls") && line.contains("unknown_peer")
        })
        .unwrap();
}
