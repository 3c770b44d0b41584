//! The socket memory guard on a live proxy: when the machine's TCP memory passes the configured
//! budget, relayed sockets', HTTP listeners' client sockets' and new upstream sockets' buffers
//! are capped (read back from the proxy's own sockets), the cap is lifted when memory falls, and
//! the bytes stay intact through both changes.
//!
//! Machine TCP memory is raised by the test itself: loopback socket pairs written full and never
//! read. Kept in its own test binary so no other test's sockets run at the same time, and the
//! tests here take turns ([`MACHINE_MEMORY`]).

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::os::fd::{BorrowedFd, RawFd};

use midway_sys::procfs::{machine_tcp_memory_bytes, KernelMemoryLimits};
use nix::sys::socket::{getsockopt, sockopt};
use rand::{RngCore, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use midway_testkit::metrics::*;
use midway_testkit::net::*;
use midway_testkit::proxy::*;
use midway_testkit::wait::*;

const BUDGET: u64 = 16 << 20;
const CONNECTIONS: usize = 4;

/// Held by each test for its whole run: every test fills and watches the machine's TCP memory,
/// so two at once would see each other's.
static MACHINE_MEMORY: Mutex<()> = Mutex::const_new(());

/// Loopback pairs whose queues are written full: they hold TCP memory until dropped.
struct Filler {
    _pairs: Vec<(StdStream, StdStream)>,
}

impl Filler {
    /// Adds pairs until the machine uses `target` bytes of TCP memory (at most 2000 pairs).
    fn fill_to(target: u64) -> Filler {
        let listener = StdListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let chunk = vec![0x5au8; 64 * 1024];
        let mut pairs = Vec::new();
        while machine_tcp_memory_bytes().unwrap() < target {
            assert!(
                pairs.len() < 2000,
                "TCP memory did not reach {target} bytes"
            );
            let mut writer = StdStream::connect(addr).unwrap();
            let (reader, _) = listener.accept().unwrap();
            writer.set_nonblocking(true).unwrap();
            // Bounded: a never-read queue takes a few MiB at most before EAGAIN.
            for _ in 0..1024 {
                match writer.write(&chunk) {
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("filler write: {e}"),
                }
            }
            pairs.push((writer, reader));
        }
        Filler { _pairs: pairs }
    }
}

/// The proxy's sockets in this process: accepted ones (local address = the listener) and
/// outgoing ones (peer = the echo server).
fn proxy_sockets(listen: SocketAddr, target: SocketAddr) -> Vec<RawFd> {
    sockets_where(|local, peer| local == listen || peer == target)
}

fn buffers(fd: RawFd) -> (usize, usize) {
    // SAFETY: the fd was listed in /proc/self/fd a moment ago and belongs to a connection the
    // test keeps open; reading an option of a closed or reused fd would only fail or misread.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    (
        getsockopt(&fd, sockopt::RcvBuf).unwrap_or(0),
        getsockopt(&fd, sockopt::SndBuf).unwrap_or(0),
    )
}

async fn ping(stream: &mut TcpStream, tag: u8) {
    let sent = [tag; 1000];
    stream.write_all(&sent).await.unwrap();
    let mut got = [0u8; 1000];
    tokio::time::timeout(WAIT, stream.read_exact(&mut got))
        .await
        .expect("echo in time")
        .unwrap();
    assert_eq!(got, sent);
}

async fn cap_metric(running: &Running) -> f64 {
    let text = scrape(running.metrics.unwrap()).await;
    metric(&text, "midway_socket_buffer_cap_bytes").expect("cap gauge exported")
}

async fn wait_for_cap(running: &Running, want: impl Fn(f64) -> bool) -> f64 {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let cap = cap_metric(running).await;
        if want(cap) || tokio::time::Instant::now() > deadline {
            return cap;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Sockets of an earlier test may still be closing; the guard must start below half the budget
/// for "lifted" to be observable.
async fn wait_for_low_machine_memory() {
    assert!(
        eventually(WAIT, || machine_tcp_memory_bytes().unwrap() < BUDGET / 4).await,
        "this machine uses {} bytes of TCP memory; the test needs less than {}",
        machine_tcp_memory_bytes().unwrap(),
        BUDGET / 4
    );
}

#[tokio::test]
async fn guard_caps_relayed_buffers_under_memory_pressure_and_lifts_them_after() {
    let _turn = MACHINE_MEMORY.lock().await;
    let limits = KernelMemoryLimits::read().unwrap();
    wait_for_low_machine_memory().await;
    let (echo, _server) = echo_server().await;
    let config = format!(
        r#"
[proxy]
allowed_clients = ["127.0.0.0/8"]
shutdown_grace = "1s"
socket_memory = {BUDGET}
[metrics]
listen = "127.0.0.1:0"
[spool]
dir = "SPOOL_DIR"
[[listeners]]
name = "fwd"
mode = "forward"
listen = "127.0.0.1:0"
target = "{echo}"
"#
    );
    let running = start(&config).await;
    let listen = running.addr("fwd");
    let mut clients = Vec::new();
    for i in 0..CONNECTIONS {
        let mut stream = TcpStream::connect(listen).await.unwrap();
        ping(&mut stream, i as u8).await;
        clients.push(stream);
    }
    assert_eq!(
        cap_metric(&running).await,
        0.0,
        "no cap while memory is low"
    );

    // Over the budget: 4 connections share 16 MiB, 1 MiB per buffer.
    let filler = Filler::fill_to(BUDGET + (4 << 20));
    let cap = wait_for_cap(&running, |c| c > 0.0).await;
    assert_eq!(cap, (1u64 << 20) as f64, "share of the budget per buffer");
    let sockets = proxy_sockets(listen, echo);
    assert_eq!(
        sockets.len(),
        2 * CONNECTIONS,
        "both segments of every connection"
    );
    assert!(
        eventually(WAIT, || sockets
            .iter()
            .all(|&fd| buffers(fd) == (1 << 20, 1 << 20)))
        .await,
        "capped buffers read back from the proxy's sockets: {:?}",
        sockets.iter().map(|&fd| buffers(fd)).collect::<Vec<_>>()
    );
    // Bytes keep flowing, intact, on a capped connection.
    let (sent, received) = echo_roundtrip(clients.pop().unwrap(), 8 << 20, 7).await;
    assert_eq!(sent, received);

    // Memory back under half the budget: caps lifted to the autotuning maxima.
    drop(filler);
    let cap = wait_for_cap(&running, |c| c == 0.0).await;
    assert_eq!(cap, 0.0, "caps lifted once memory fell");
    let sockets = proxy_sockets(listen, echo);
    assert_eq!(sockets.len(), 2 * (CONNECTIONS - 1));
    let lifted = (
        limits.autotune_max_recv as usize,
        limits.autotune_max_send as usize,
    );
    assert!(
        eventually(WAIT, || sockets.iter().all(|&fd| buffers(fd) == lifted)).await,
        "lifted buffers: {:?}, want {lifted:?}",
        sockets.iter().map(|&fd| buffers(fd)).collect::<Vec<_>>()
    );
    let (sent, received) = echo_roundtrip(clients.pop().unwrap(), 8 << 20, 8).await;
    assert_eq!(sent, received);

    drop(clients);
    running.stop().await;
}

const PAGE_BODY: &[u8] = b"midway socket memory test page\n";
/// Large enough that the 1 MiB capped buffers fill several times over while it passes.
const BULK_LEN: usize = 4 << 20;

/// The `/bulk` body: seeded random bytes, so a corrupted or misordered byte shows.
fn bulk_body(seed: u64) -> Vec<u8> {
    let mut body = vec![0u8; BULK_LEN];
    rand_chacha::ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut body);
    body
}

/// A keep-alive origin: `/bulk/SEED` answers [`bulk_body`], anything else the short page; no
/// response may be cached, so every request goes through the proxy's upstream sockets.
fn origin() -> PageOrigin {
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    PageOrigin::respond(listener, WAIT * 4, |head| {
        let path = head.split(' ').nth(1).unwrap_or("/");
        let body = match path.strip_prefix("/bulk/").map(str::parse::<u64>) {
            Some(Ok(seed)) => bulk_body(seed),
            _ => PAGE_BODY.to_vec(),
        };
        let mut response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
             Content-Length: {}\r\nCache-Control: no-store\r\n\r\n",
            body.len()
        )
        .into_bytes();
        response.extend_from_slice(&body);
        response
    })
}

/// Sends `GET http://ORIGIN/PATH` on the keep-alive `stream` and reads one whole response;
/// returns its head and its Content-Length body.
async fn get(stream: &mut TcpStream, origin: SocketAddr, path: &str) -> (String, Vec<u8>) {
    let request = format!("GET http://{origin}{path} HTTP/1.1\r\nHost: {origin}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    tokio::time::timeout(WAIT, async {
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let head_end = loop {
            if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break pos + 4;
            }
            assert!(buf.len() < 64 * 1024, "response head too long");
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "proxy closed before the response head");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("no Content-Length in {head}"));
        let mut body = buf.split_off(head_end);
        assert!(body.len() <= length, "more bytes than the response: {head}");
        let already = body.len();
        body.resize(length, 0);
        stream.read_exact(&mut body[already..]).await.unwrap();
        (head, body)
    })
    .await
    .expect("response in time")
}

#[tokio::test]
async fn guard_counts_http_clients_and_caps_their_sockets_under_memory_pressure() {
    let _turn = MACHINE_MEMORY.lock().await;
    let limits = KernelMemoryLimits::read().unwrap();
    wait_for_low_machine_memory().await;
    let second_server = origin();
    let origin_server = origin();
    let (second_origin, origin) = (second_server.addr, origin_server.addr);
    let config = format!(
        r#"
[proxy]
allowed_clients = ["127.0.0.0/8"]
# The test origin lives on loopback, which the default denied_destinations refuses.
denied_destinations = []
connect_timeout = "2s"
shutdown_grace = "1s"
socket_memory = {BUDGET}
[metrics]
listen = "127.0.0.1:0"
[spool]
dir = "SPOOL_DIR"
[[listeners]]
name = "web"
mode = "http"
listen = "127.0.0.1:0"
"#
    );
    let running = start(&config).await;
    let listen = running.addr("web");
    // Keep-alive clients: one complete request and response each, then idle.
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut stream = TcpStream::connect(listen).await.unwrap();
        let (head, body) = get(&mut stream, origin, "/page").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body, PAGE_BODY);
        clients.push(stream);
    }
    assert_eq!(
        cap_metric(&running).await,
        0.0,
        "no cap while memory is low"
    );
    let accepted = || sockets_where(|local, _| local == listen);
    assert_eq!(accepted().len(), CONNECTIONS, "the proxy's client sockets");

    // Over the budget: only the 4 HTTP clients are live, so they share 16 MiB at 1 MiB per
    // buffer (an uncounted client would leave the guard idle or its share larger).
    let filler = Filler::fill_to(BUDGET + (4 << 20));
    let cap = wait_for_cap(&running, |c| c > 0.0).await;
    assert_eq!(cap, (1u64 << 20) as f64, "share of the budget per buffer");
    let sockets = accepted();
    assert_eq!(sockets.len(), CONNECTIONS);
    assert!(
        eventually(WAIT, || sockets
            .iter()
            .all(|&fd| buffers(fd) == (1 << 20, 1 << 20)))
        .await,
        "capped buffers read back from the proxy's client sockets: {:?}",
        sockets.iter().map(|&fd| buffers(fd)).collect::<Vec<_>>()
    );
    // A response several times the capped buffers passes intact on a capped connection.
    let (head, body) = get(&mut clients[0], origin, "/bulk/7").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body == bulk_body(7), "bulk body through a capped socket");
    // An upstream connection made while the caps are in force gets them at once (a second
    // origin, so the pool has nothing to reuse).
    let (head, body) = get(&mut clients[2], second_origin, "/bulk/9").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        body == bulk_body(9),
        "bulk body over a capped upstream socket"
    );
    let upstream = sockets_where(|_, peer| peer == second_origin);
    assert_eq!(
        upstream.len(),
        1,
        "one pooled upstream socket to the second origin"
    );
    assert_eq!(
        buffers(upstream[0]),
        (1 << 20, 1 << 20),
        "capped buffers read back from the new upstream socket"
    );

    // Memory back under half the budget: caps lifted to the autotuning maxima.
    drop(filler);
    let cap = wait_for_cap(&running, |c| c == 0.0).await;
    assert_eq!(cap, 0.0, "caps lifted once memory fell");
    let sockets = accepted();
    assert_eq!(sockets.len(), CONNECTIONS);
    let lifted = (
        limits.autotune_max_recv as usize,
        limits.autotune_max_send as usize,
    );
    assert!(
        eventually(WAIT, || sockets.iter().all(|&fd| buffers(fd) == lifted)).await,
        "lifted buffers: {:?}, want {lifted:?}",
        sockets.iter().map(|&fd| buffers(fd)).collect::<Vec<_>>()
    );
    let (head, body) = get(&mut clients[1], origin, "/bulk/8").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body == bulk_body(8), "bulk body after the caps were lifted");

    drop(clients);
    running.stop().await;
}
