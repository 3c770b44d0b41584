//! What the peer-transport tests share: keys from the real `midway peer keygen`, a midway
//! started from a config body, a SOCKS5 client, and a destination that sends and checks bulk
//! bytes (or resets on request).

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use midway_testkit::data::{bulk_bytes, receive_all, send_pattern};
use midway_testkit::host::{listening_addr, spawn_midway, Place, Running};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub(crate) const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
pub(crate) const LIMIT: Duration = Duration::from_secs(30);
pub(crate) const KEY_HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
/// Bytes each way in the bulk check: enough for many TLS records and full socket buffers.
pub(crate) fn bulk() -> u64 {
    bulk_bytes(32 << 20) as u64
}

/// Runs `midway peer keygen --out DIR` and returns the fingerprint it printed.
pub(crate) fn keygen(dir: &Path) -> String {
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

pub(crate) fn start(dir: &Path, name: &str, body: &str) -> (Running, SocketAddr) {
    start_in(Place::Here, dir, name, body)
}

/// [`start`] in `place` (a namespace).
pub(crate) fn start_in(
    place: Place<'_>,
    dir: &Path,
    name: &str,
    body: &str,
) -> (Running, SocketAddr) {
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
    let (mut child, _lines) = spawn_midway(MIDWAY, place, &path, &[]);
    let addr = listening_addr(&mut child, LIMIT);
    (child, addr)
}

/// A SOCKS5 CONNECT through `proxy`; the stream and the reply code (0xff: no reply).
pub(crate) async fn socks5(proxy: SocketAddr, target: SocketAddr) -> (TcpStream, u8) {
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

/// A destination that counts its connections: each sends [`bulk`] bytes back while reading what
/// it gets to EOF; a connection whose first byte is `R` is reset instead.
/// What the destination received on each connection it read to the end: (bytes, SHA-256).
pub(crate) type Received = Arc<Mutex<Vec<(u64, [u8; 32])>>>;

pub(crate) async fn destination() -> (SocketAddr, Arc<AtomicUsize>, Received) {
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
                let (got, _) =
                    tokio::join!(receive_all(&mut read), send_pattern(&mut write, bulk(), 7));
                record.lock().unwrap().push(got.unwrap());
            });
        }
    });
    (addr, accepted, received)
}

/// Through the SOCKS5 listener at `proxy` to [`destination`]'s `target`: [`bulk`] bytes both
/// ways, the client's FIN first, each direction's bytes checked; then a connection the
/// destination resets must reach the client as a reset, not a clean end. Bounded by `LIMIT * 8`
/// (`$MIDWAY_TEST_BYTES` is 1 GiB in CI: minutes at most on a loaded 2-core machine).
pub(crate) async fn bulk_then_reset(proxy: SocketAddr, target: SocketAddr, received: &Received) {
    tokio::time::timeout(LIMIT * 8, async {
        let (stream, code) = socks5(proxy, target).await;
        assert_eq!(code, 0, "SOCKS5 reply through the peers");
        let (mut read, mut write) = stream.into_split();
        let sent = tokio::spawn(async move { send_pattern(&mut write, bulk(), 3).await });
        let (bytes, digest) = receive_all(&mut read).await.unwrap();
        let expected = send_pattern(&mut tokio::io::sink(), bulk(), 7)
            .await
            .unwrap();
        assert_eq!(bytes, bulk());
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
            Some(&(bulk(), sent)),
            "bytes from the client"
        );

        let (mut stream, code) = socks5(proxy, target).await;
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
}
