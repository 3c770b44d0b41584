//! The socket memory guard on a live proxy: when the machine's TCP memory passes the configured
//! budget, relayed sockets' buffers are capped (read back from the proxy's own sockets), the cap
//! is lifted when memory falls, and relayed bytes stay intact through both changes.
//!
//! Machine TCP memory is raised by the test itself: loopback socket pairs written full and never
//! read. Kept in its own test binary so no other test's sockets run at the same time.

use std::io::Write;
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::os::fd::{BorrowedFd, RawFd};

use midway_proxy::sockmem::{machine_tcp_memory_bytes, KernelMemoryLimits};
use nix::sys::socket::{getpeername, getsockname, getsockopt, sockopt, SockaddrStorage};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::*;

const BUDGET: u64 = 16 << 20;
const CONNECTIONS: usize = 4;

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

fn std_addr(storage: &SockaddrStorage) -> Option<SocketAddr> {
    storage
        .as_sockaddr_in()
        .map(|a| SocketAddr::from((a.ip(), a.port())))
}

/// The proxy's sockets in this process: accepted ones (local address = the listener) and
/// outgoing ones (peer = the echo server).
fn proxy_sockets(listen: SocketAddr, target: SocketAddr) -> Vec<RawFd> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        let local = getsockname::<SockaddrStorage>(fd).ok();
        let peer = getpeername::<SockaddrStorage>(fd).ok();
        let (Some(local), Some(peer)) = (
            local.as_ref().and_then(std_addr),
            peer.as_ref().and_then(std_addr),
        ) else {
            continue;
        };
        if local == listen || peer == target {
            found.push(fd);
        }
    }
    found
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

#[tokio::test]
async fn guard_caps_relayed_buffers_under_memory_pressure_and_lifts_them_after() {
    let limits = KernelMemoryLimits::read().unwrap();
    // Sockets of an earlier test may still be closing; the guard must start below half the
    // budget for "lifted" to be observable.
    assert!(
        eventually(|| machine_tcp_memory_bytes().unwrap() < BUDGET / 4).await,
        "this machine uses {} bytes of TCP memory; the test needs less than {}",
        machine_tcp_memory_bytes().unwrap(),
        BUDGET / 4
    );
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
        eventually(|| sockets.iter().all(|&fd| buffers(fd) == (1 << 20, 1 << 20))).await,
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
        eventually(|| sockets.iter().all(|&fd| buffers(fd) == lifted)).await,
        "lifted buffers: {:?}, want {lifted:?}",
        sockets.iter().map(|&fd| buffers(fd)).collect::<Vec<_>>()
    );
    let (sent, received) = echo_roundtrip(clients.pop().unwrap(), 8 << 20, 8).await;
    assert_eq!(sent, received);

    drop(clients);
    running.stop().await;
}
