// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `transport = "tls"` between two midways, through the real binary on loopback (ports chosen
//! by the kernel, every wait bounded, every process stopped):
//!
//! - keys from `midway peer keygen`; an edge (SOCKS5, `via` the gateway, warm connections)
//!   and a gateway (peer listener) pin each other's fingerprint; bulk bytes both ways arrive
//!   intact, a half-close travels end to end, and a reset from the server reaches the client
//!   as a reset;
//! - an edge whose key the gateway does not list is refused at the handshake (the gateway
//!   logs and counts it), its client gets a SOCKS5 failure, and the destination is never
//!   contacted; a plain-TCP client of the TLS peer listener is refused the same way.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use midway_testkit::data::{receive_all, send_pattern};
use midway_testkit::host::{listening_addr, spawn_midway, Place, Running, TempDir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(30);
const KEY_HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
/// Bytes each way in the bulk check: enough for many TLS records and full socket buffers.
const BULK_BYTES: u64 = 32 << 20;

/// Runs `midway peer keygen --out DIR` and returns the fingerprint it printed.
fn keygen(dir: &Path) -> String {
    let output = Command::new(MIDWAY)
        .args(["peer", "keygen", "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let fingerprint = stdout
        .lines()
        .find_map(|line| line.strip_prefix("fingerprint: "))
        .unwrap_or_else(|| panic!("no fingerprint in {stdout}"))
        .to_string();
    assert!(fingerprint.starts_with("sha256:"), "{fingerprint}");
    // The key is its owner's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join("peer.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "peer.key mode {mode:o}");
    // A second keygen into the same folder never overwrites the key.
    let again = Command::new(MIDWAY)
        .args(["peer", "keygen", "--out"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(!again.status.success());
    fingerprint
}

fn start(dir: &Path, name: &str, body: &str) -> (Running, SocketAddr) {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\ndenied_destinations = []\n\
             connect_timeout = \"3s\"\nshutdown_grace = \"1s\"\n\n\
             [keys.k]\nsecret = \"{KEY_HEX}\"\n\n[spool]\ndir = \"{}\"\n\n{body}",
            dir.join(format!("spool-{name}")).display()
        ),
    )
    .unwrap();
    let (mut child, _lines) = spawn_midway(MIDWAY, Place::Here, &path, &[]);
    let addr = listening_addr(&mut child, LIMIT);
    (child, addr)
}

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

/// A SOCKS5 CONNECT through `proxy`; the stream and the reply code (0xff: no reply).
async fn socks5(proxy: SocketAddr, target: SocketAddr) -> (TcpStream, u8) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(&[5, 1, 0]).await.unwrap();
    let mut greeting = [0; 2];
    stream.read_exact(&mut greeting).await.unwrap();
    let SocketAddr::V4(v4) = target else {
        panic!("v4 targets only")
    };
    let mut request = vec![5, 1, 0, 1];
    request.extend_from_slice(&v4.ip().octets());
    request.extend_from_slice(&v4.port().to_be_bytes());
    stream.write_all(&request).await.unwrap();
    let mut reply = [0; 10];
    match stream.read_exact(&mut reply).await {
        Ok(_) => (stream, reply[1]),
        Err(_) => (stream, 0xff),
    }
}

/// A destination that counts its connections: each sends BULK_BYTES back while reading what
/// it gets to EOF; a connection whose first byte is `R` is reset instead.
/// What the destination received on each connection it read to the end: (bytes, SHA-256).
type Received = Arc<Mutex<Vec<(u64, [u8; 32])>>>;

async fn destination() -> (SocketAddr, Arc<AtomicUsize>, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let received = Received::default();
    let record = received.clone();
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let record = record.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                let mut peek = stream;
                if peek.peek(&mut first).await.unwrap_or(0) == 1 && first[0] == b'R' {
                    socket2::SockRef::from(&peek)
                        .set_linger(Some(Duration::ZERO))
                        .unwrap();
                    return;
                }
                let (mut read, mut write) = peek.split();
                let (got, _) = tokio::join!(
                    receive_all(&mut read),
                    send_pattern(&mut write, BULK_BYTES, 7)
                );
                record.lock().unwrap().push(got.unwrap());
            });
        }
    });
    (addr, accepted, received)
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

    tokio::time::timeout(LIMIT, async {
        // Bulk both ways, the client's FIN first; the destination's bytes arrive intact after.
        let (stream, code) = socks5(edge_addr, target).await;
        assert_eq!(code, 0, "SOCKS5 reply through the TLS peer");
        let (mut read, mut write) = stream.into_split();
        let sent = tokio::spawn(async move { send_pattern(&mut write, BULK_BYTES, 3).await });
        let (bytes, digest) = receive_all(&mut read).await.unwrap();
        let expected = {
            let mut sink = Vec::new();
            send_pattern(&mut sink, BULK_BYTES, 7).await.unwrap()
        };
        assert_eq!(bytes, BULK_BYTES);
        assert_eq!(digest, expected, "bytes from the destination");
        let sent = sent.await.unwrap().unwrap();
        // The client's FIN went first; the destination has read to it.
        for _ in 0..100 {
            if !received.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            received.lock().unwrap().first(),
            Some(&(BULK_BYTES, sent)),
            "bytes from the client"
        );

        // A reset by the destination reaches the client as a reset, not a clean end.
        let (mut stream, code) = socks5(edge_addr, target).await;
        assert_eq!(code, 0);
        stream.write_all(b"R").await.unwrap();
        let mut buf = [0u8; 16];
        let outcome = stream.read(&mut buf).await;
        assert!(
            matches!(&outcome, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "client saw {outcome:?} after the destination's reset"
        );
    })
    .await
    .unwrap();
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
