// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Two-ended operation through the real binary: chains of midways in a network namespace each
//! test makes (loopback only, fixed ports there), every wait bounded, every process stopped.
//!
//! - a three-midway chain (edge -> middle -> gateway, each choosing the next by destination
//!   prefix) moves `$MIDWAY_TEST_BYTES` (default 1 GiB) intact both ways, carries a half-close
//!   and a reset end to end, and exports the peer metrics;
//! - a loop (A via B, B via A) is refused with a log line and a metric;
//! - a wrong key, an unknown key, garbage, a replayed or stale header and one at the hop cap are
//!   refused with a reset, counted, and the destination is never contacted.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use midway_proxy::peer::header::PeerHeader;
use midway_testkit::data::{bulk_bytes, receive_all, send_pattern};
use midway_testkit::host::{is_root, spawn_midway, Place, Running, TempDir};
use midway_testkit::metrics::metric;
use midway_testkit::netns::Netns;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(30);
const KEY_HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const KEY: [u8; 32] = [
    0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff,
    0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff,
];

/// A midway process in the test's namespace, its log collected; SIGTERM and a bounded wait on
/// drop.
struct Midway {
    /// Stopped (SIGTERM, bounded wait, then SIGKILL) when the test ends, pass or fail.
    _child: Running,
    log: Arc<Mutex<Vec<String>>>,
    metrics: SocketAddr,
}

impl Midway {
    /// Writes `config` (the `[proxy]` and `[metrics]` tables are added) and starts midway on it
    /// inside `ns`; waits for its `listeners` "listening" lines.
    fn start(
        ns: &Netns,
        dir: &Path,
        name: &str,
        metrics_port: u16,
        config: &str,
        listeners: usize,
    ) -> Midway {
        let path = dir.join(format!("{name}.toml"));
        let metrics: SocketAddr = format!("127.0.0.1:{metrics_port}").parse().unwrap();
        std::fs::write(
            &path,
            format!(
                "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\ndenied_destinations = []\n\
                 connect_timeout = \"3s\"\nshutdown_grace = \"1s\"\n\n\
                 [metrics]\nlisten = \"{metrics}\"\n\n[spool]\ndir = \"{}\"\n\n{config}",
                dir.join(format!("spool-{name}")).display()
            ),
        )
        .unwrap();
        let (child, lines) = spawn_midway(MIDWAY, Place::Netns(ns.name()), &path, &[]);
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in lines {
                sink.lock().unwrap().push(line);
            }
        });
        let midway = Midway {
            _child: child,
            log,
            metrics,
        };
        let started = Instant::now();
        while midway.count_lines(&["\"listening\""]) < listeners {
            assert!(
                started.elapsed() < LIMIT,
                "{name} did not start:\n{}",
                midway.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        midway
    }

    fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Log lines that contain every one of `needles`.
    fn count_lines(&self, needles: &[&str]) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|line| needles.iter().all(|n| line.contains(n)))
            .count()
    }
}

/// Runs the future `make` returns on a current-thread runtime inside `ns` (its sockets live
/// there), with a LocalSet for its servers.
fn in_ns<T: Send, Fut: std::future::Future<Output = T>>(
    ns: &Netns,
    make: impl FnOnce() -> Fut + Send,
) -> T {
    ns.enter(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async {
            tokio::time::timeout(LIMIT * 8, make())
                .await
                .expect("test in time")
        })
    })
}

/// GET /metrics (in the namespace the caller runs in).
async fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    out
}

/// A SOCKS5 CONNECT (no auth) to `target` through `proxy`; returns the stream and the reply
/// code.
async fn socks5(proxy: &str, target: SocketAddr) -> (TcpStream, u8) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(&[5, 1, 0]).await.unwrap();
    let mut greeting = [0; 2];
    stream.read_exact(&mut greeting).await.unwrap();
    assert_eq!(greeting, [5, 0]);
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

/// SO_LINGER 0: closing the socket then sends a reset.
fn linger_zero(stream: &TcpStream) {
    let linger = nix::libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    nix::sys::socket::setsockopt(stream, nix::sys::socket::sockopt::Linger, &linger).unwrap();
}

/// Counts accepted connections at `addr` and serves each with `serve`.
async fn server<F, Fut>(addr: &str, serve: F) -> Arc<AtomicUsize>
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let listener = TcpListener::bind(addr).await.unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::task::spawn_local(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::task::spawn_local(serve(stream));
        }
    });
    accepted
}

#[test]
fn three_midways_carry_bulk_half_close_and_reset_end_to_end() {
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace");
        return;
    }
    let ns = Netns::unique("mwpeer-chain");
    let dir = TempDir::new("peer-chain");
    let keys =
        format!("[keys.edge]\nsecret = \"{KEY_HEX}\"\n[keys.middle]\nsecret = \"{KEY_HEX}\"\n");
    // Each hop chooses by destination prefix: the edge has two peers and sends 127.0.0.0/8 to
    // the middle; the middle sends 127.0.0.1/32 to the gateway (more specific than its other
    // peer, which would fail: nothing listens there).
    let _gateway = Midway::start(
        &ns,
        dir.path(),
        "gateway",
        9102,
        &format!(
            "{keys}\n[[listeners]]\nname = \"from-middle\"\nmode = \"peer\"\n\
             listen = \"127.0.0.1:7200\"\nkeys = [\"middle\"]\n"
        ),
        1,
    );
    let _middle = Midway::start(
        &ns,
        dir.path(),
        "middle",
        9101,
        &format!(
            "{keys}\n[[peers]]\nname = \"gateway\"\naddress = \"127.0.0.1:7200\"\nkey = \"middle\"\n\
             destinations = [\"127.0.0.1/32\"]\n\n\
             [[peers]]\nname = \"nowhere\"\naddress = \"127.0.0.1:7999\"\nkey = \"middle\"\n\
             destinations = [\"127.0.0.0/8\"]\nwarm_connections = 0\n\n\
             [[listeners]]\nname = \"from-edge\"\nmode = \"peer\"\nlisten = \"127.0.0.1:7100\"\n\
             keys = [\"edge\"]\nvia = [\"nowhere\", \"gateway\"]\n"
        ),
        1,
    );
    let edge = Midway::start(
        &ns,
        dir.path(),
        "edge",
        9100,
        &format!(
            "{keys}\n[[peers]]\nname = \"middle\"\naddress = \"127.0.0.1:7100\"\nkey = \"edge\"\n\
             destinations = [\"127.0.0.0/8\"]\nwarm_connections = 2\n\n\
             [[peers]]\nname = \"elsewhere\"\naddress = \"127.0.0.1:7998\"\nkey = \"edge\"\n\
             destinations = [\"10.0.0.0/8\"]\nwarm_connections = 0\n\n\
             [[listeners]]\nname = \"socks\"\nmode = \"socks5\"\nlisten = \"127.0.0.1:7000\"\n\
             via = [\"elsewhere\", \"middle\"]\n"
        ),
        1,
    );
    let bytes = bulk_bytes(1 << 30) as u64;
    in_ns(&ns, || async {
        {
            {
                let edge_metrics = edge.metrics;
                // The warm pool fills before the first client.
                let deadline = Instant::now() + LIMIT;
                loop {
                    let text = scrape(edge_metrics).await;
                    if metric(&text, "midway_peer_warm_idle{peer=\"middle\"}") == Some(2.0) {
                        break;
                    }
                    assert!(Instant::now() < deadline, "warm pool never filled:\n{text}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }

                // Bulk: the server sends its pattern while it reads the client's to the end.
                let results = Arc::new(Mutex::new(Vec::new()));
                let sink = results.clone();
                server("127.0.0.1:9000", move |mut stream| {
                    let sink = sink.clone();
                    async move {
                        let (mut reader, mut writer) = stream.split();
                        let (sent, received) = tokio::join!(
                            send_pattern(&mut writer, bytes, 2),
                            receive_all(&mut reader)
                        );
                        sink.lock()
                            .unwrap()
                            .push((sent.unwrap(), received.unwrap()));
                    }
                })
                .await;
                let (mut stream, code) =
                    socks5("127.0.0.1:7000", "127.0.0.1:9000".parse().unwrap()).await;
                assert_eq!(code, 0, "SOCKS5 through the chain refused");
                let started = Instant::now();
                let (mut reader, mut writer) = stream.split();
                let (sent, received) = tokio::join!(
                    send_pattern(&mut writer, bytes, 1),
                    receive_all(&mut reader)
                );
                let (sent, (received_len, received)) = (sent.unwrap(), received.unwrap());
                eprintln!(
                    "{bytes} bytes each way through three midways in {:?}",
                    started.elapsed()
                );
                assert_eq!(received_len, bytes);
                let deadline = Instant::now() + LIMIT;
                while results.lock().unwrap().is_empty() {
                    assert!(Instant::now() < deadline, "server never finished");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let (server_sent, (server_received_len, server_received)) =
                    results.lock().unwrap()[0];
                assert_eq!(server_received_len, bytes);
                assert_eq!(server_received, sent, "client to server corrupted");
                assert_eq!(received, server_sent, "server to client corrupted");

                // Half-close: the server answers only after the client's FIN reached it.
                server("127.0.0.1:9001", |mut stream| async move {
                    let mut request = Vec::new();
                    stream.read_to_end(&mut request).await.unwrap();
                    let answer = format!("got {} bytes after your FIN", request.len());
                    stream.write_all(answer.as_bytes()).await.unwrap();
                })
                .await;
                let (mut stream, code) =
                    socks5("127.0.0.1:7000", "127.0.0.1:9001".parse().unwrap()).await;
                assert_eq!(code, 0);
                stream.write_all(b"hello").await.unwrap();
                stream.shutdown().await.unwrap();
                let mut answer = String::new();
                stream.read_to_string(&mut answer).await.unwrap();
                assert_eq!(answer, "got 5 bytes after your FIN");

                // Reset, server to client: the server resets after reading a byte.
                server("127.0.0.1:9002", |mut stream| async move {
                    let mut byte = [0; 1];
                    let _ = stream.read_exact(&mut byte).await;
                    linger_zero(&stream);
                    drop(stream);
                })
                .await;
                let (mut stream, code) =
                    socks5("127.0.0.1:7000", "127.0.0.1:9002".parse().unwrap()).await;
                assert_eq!(code, 0);
                stream.write_all(b"x").await.unwrap();
                let mut rest = Vec::new();
                let ended = stream.read_to_end(&mut rest).await;
                assert_eq!(
                    ended.map_err(|e| e.kind()),
                    Err(std::io::ErrorKind::ConnectionReset),
                    "the server's reset did not reach the client as a reset"
                );

                // Reset, client to server.
                let seen = Arc::new(Mutex::new(None));
                let sink = seen.clone();
                server("127.0.0.1:9003", move |mut stream| {
                    let sink = sink.clone();
                    async move {
                        let mut rest = Vec::new();
                        let ended = stream.read_to_end(&mut rest).await;
                        *sink.lock().unwrap() = Some(ended.map_err(|e| e.kind()));
                    }
                })
                .await;
                let (mut stream, code) =
                    socks5("127.0.0.1:7000", "127.0.0.1:9003".parse().unwrap()).await;
                assert_eq!(code, 0);
                stream.write_all(b"x").await.unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
                linger_zero(&stream);
                drop(stream);
                let deadline = Instant::now() + LIMIT;
                while seen.lock().unwrap().is_none() {
                    assert!(Instant::now() < deadline, "the server never saw the end");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert_eq!(
                    *seen.lock().unwrap(),
                    Some(Err(std::io::ErrorKind::ConnectionReset)),
                    "the client's reset did not reach the server as a reset"
                );

                // Metrics: connections per peer, warm takes, the peer segment's telemetry.
                let text = scrape(edge_metrics).await;
                let warm = metric(
                    &text,
                    "midway_peer_connections_total{peer=\"middle\",origin=\"warm\"}",
                )
                .unwrap();
                let fresh = metric(
                    &text,
                    "midway_peer_connections_total{peer=\"middle\",origin=\"fresh\"}",
                )
                .unwrap();
                assert_eq!(warm + fresh, 4.0, "{text}");
                assert!(
                    warm >= 1.0,
                    "no connection came from the warm pool:\n{text}"
                );
                assert_eq!(
                    metric(
                        &text,
                        "midway_peer_connections_total{peer=\"elsewhere\",origin=\"fresh\"}"
                    ),
                    Some(0.0)
                );
                assert!(text.contains("midway_segment_congestion_control_total{listener=\"socks\",segment=\"peer\""), "{text}");
                assert!(
                    text.contains(
                        "midway_segment_retransmits_total{listener=\"socks\",segment=\"peer\"}"
                    ),
                    "{text}"
                );
                let middle_text = scrape("127.0.0.1:9101".parse().unwrap()).await;
                assert!(middle_text.contains("midway_segment_congestion_control_total{listener=\"from-edge\",segment=\"peer\""), "{middle_text}");
                assert_eq!(
                    metric(
                        &middle_text,
                        "midway_peer_connections_total{peer=\"nowhere\",origin=\"fresh\"}"
                    ),
                    Some(0.0)
                );
                let gateway_text = scrape("127.0.0.1:9102".parse().unwrap()).await;
                assert!(gateway_text.contains("midway_segment_congestion_control_total{listener=\"from-middle\",segment=\"remote\""), "{gateway_text}");
            }
        }
    });
}

#[test]
fn a_loop_is_refused_with_a_log_line_and_a_metric() {
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace");
        return;
    }
    let ns = Netns::unique("mwpeer-loop");
    let dir = TempDir::new("peer-loop");
    let keys = format!("[keys.k]\nsecret = \"{KEY_HEX}\"\n");
    let a = Midway::start(
        &ns,
        dir.path(),
        "a",
        9100,
        &format!(
            "{keys}\n[[peers]]\nname = \"b\"\naddress = \"127.0.0.1:7200\"\nkey = \"k\"\n\n\
             [[listeners]]\nname = \"socks\"\nmode = \"socks5\"\nlisten = \"127.0.0.1:7000\"\nvia = [\"b\"]\n\n\
             [[listeners]]\nname = \"from-b\"\nmode = \"peer\"\nlisten = \"127.0.0.1:7100\"\n\
             keys = [\"k\"]\nvia = [\"b\"]\n"
        ),
        2,
    );
    let _b = Midway::start(
        &ns,
        dir.path(),
        "b",
        9101,
        &format!(
            "{keys}\n[[peers]]\nname = \"a\"\naddress = \"127.0.0.1:7100\"\nkey = \"k\"\n\n\
             [[listeners]]\nname = \"from-a\"\nmode = \"peer\"\nlisten = \"127.0.0.1:7200\"\n\
             keys = [\"k\"]\nvia = [\"a\"]\n"
        ),
        1,
    );
    in_ns(&ns, || async {
        {
            {
                let contacted = server("127.0.0.1:9000", |_| async {}).await;
                let (_stream, code) =
                    socks5("127.0.0.1:7000", "127.0.0.1:9000".parse().unwrap()).await;
                assert_ne!(code, 0, "a looping connection was relayed");
                let deadline = Instant::now() + LIMIT;
                while a.count_lines(&["peer_loop", "connection not relayed", "from-b"]) == 0 {
                    assert!(
                        Instant::now() < deadline,
                        "no loop log line:\n{}",
                        a.log_text()
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let text = scrape(a.metrics).await;
                assert_eq!(
                    metric(
                        &text,
                        "midway_peer_loops_refused_total{listener=\"from-b\"}"
                    ),
                    Some(1.0),
                    "{text}"
                );
                assert_eq!(
                    contacted.load(Ordering::SeqCst),
                    0,
                    "the destination was contacted"
                );
            }
        }
    });
}

fn header(key_name: &str, destination: SocketAddr) -> PeerHeader {
    let mut nonce = [0; 16];
    nonce[..8].copy_from_slice(&rand_u64().to_be_bytes());
    let mut chain_id = [0; 16];
    chain_id[..8].copy_from_slice(&rand_u64().to_be_bytes());
    PeerHeader {
        hops: 1,
        chain_id,
        nonce,
        timestamp_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
        key_name: key_name.into(),
        destination,
        client: "127.0.0.1:40000".parse().unwrap(),
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    hasher.finish()
}

/// Sends `bytes` to the gateway; returns the status byte, or the error kind the read ended in.
async fn send_header(bytes: &[u8]) -> Result<u8, std::io::ErrorKind> {
    let mut stream = TcpStream::connect("127.0.0.1:7200").await.unwrap();
    stream.write_all(bytes).await.map_err(|e| e.kind())?;
    let mut status = [0; 1];
    match stream.read(&mut status).await {
        Ok(1) => Ok(status[0]),
        Ok(_) => Err(std::io::ErrorKind::UnexpectedEof),
        Err(err) => Err(err.kind()),
    }
}

#[test]
fn wrong_keys_and_replays_are_reset_counted_and_never_connect() {
    if !is_root() {
        eprintln!("skipped: needs root for a network namespace");
        return;
    }
    let ns = Netns::unique("mwpeer-auth");
    let dir = TempDir::new("peer-auth");
    let gateway = Midway::start(
        &ns,
        dir.path(),
        "gateway",
        9102,
        &format!(
            "[keys.k]\nsecret = \"{KEY_HEX}\"\n[keys.other]\nsecret = \"{KEY_HEX}\"\n\n\
             [[listeners]]\nname = \"gw\"\nmode = \"peer\"\nlisten = \"127.0.0.1:7200\"\nkeys = [\"k\"]\n"
        ),
        1,
    );
    in_ns(&ns, || async {
        {
            {
                let contacted = server("127.0.0.1:9000", |_| async {}).await;
                let destination: SocketAddr = "127.0.0.1:9000".parse().unwrap();
                let reset = Err(std::io::ErrorKind::ConnectionReset);

                let wrong_key = header("k", destination).encode(&[7; 32]).unwrap();
                assert_eq!(send_header(&wrong_key).await, reset);
                // A key the gateway knows but this listener does not take.
                let other = header("other", destination).encode(&KEY).unwrap();
                assert_eq!(send_header(&other).await, reset);
                let garbage = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
                assert_eq!(send_header(garbage).await, reset);
                assert_eq!(
                    contacted.load(Ordering::SeqCst),
                    0,
                    "a refused header reached the destination"
                );

                let good = header("k", destination).encode(&KEY).unwrap();
                assert_eq!(send_header(&good).await, Ok(0));
                let deadline = Instant::now() + LIMIT;
                while contacted.load(Ordering::SeqCst) == 0 {
                    assert!(Instant::now() < deadline, "the good header never connected");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert_eq!(
                    send_header(&good).await,
                    reset,
                    "a replayed header was accepted"
                );
                let mut too_far = header("k", destination);
                too_far.hops = 8;
                assert_eq!(send_header(&too_far.encode(&KEY).unwrap()).await, reset);
                let mut stale = header("k", destination);
                stale.timestamp_ms -= 120_000;
                assert_eq!(send_header(&stale.encode(&KEY).unwrap()).await, reset);
                tokio::time::sleep(Duration::from_millis(200)).await;
                assert_eq!(contacted.load(Ordering::SeqCst), 1);

                let text = scrape(gateway.metrics).await;
                assert_eq!(
                    metric(
                        &text,
                        "midway_peer_hop_limit_refused_total{listener=\"gw\"}"
                    ),
                    Some(1.0),
                    "{text}"
                );
                for (reason, count) in [
                    ("peer_bad_mac", 1.0),
                    ("peer_unknown_key", 1.0),
                    ("peer_bad_header", 1.0),
                    ("peer_replay", 1.0),
                    ("peer_stale", 1.0),
                ] {
                    let series = format!(
                        "midway_peer_auth_failures_total{{listener=\"gw\",reason=\"{reason}\"}}"
                    );
                    assert_eq!(metric(&text, &series), Some(count), "{series} in\n{text}");
                }
                assert_eq!(
                    gateway.count_lines(&[
                        "connection not relayed",
                        "peer_bad_mac",
                        "authentication failed"
                    ]),
                    1,
                    "{}",
                    gateway.log_text()
                );
            }
        }
    });
}
