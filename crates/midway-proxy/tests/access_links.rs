//! Subscribers' access links on a live proxy: the connections of a subscriber under an
//! `[[access_links]]` entry share its rate (their local sockets carry pacing ceilings, and six
//! downloads at once take at least as long as the link's rate allows), while another
//! subscriber's connections are not paced at all and finish at loopback speed.
//!
//! Two subscribers on loopback: 127.0.0.2 (under the access link) and 127.0.0.3 (not). The
//! clients ask for a 1448-byte MSS, as an Ethernet path would give, so that Linux's unpaced
//! start (it never paces a connection's first 10 segments) stays small beside the transfer.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, RawFd};
use std::time::{Duration, Instant};

use midway_proxy::access_link::payload_bytes_per_second;
use nix::sys::socket::{setsockopt, sockopt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use midway_testkit::net::sockets_where;
use midway_testkit::proxy::*;
use midway_testkit::wait::*;

const RATE_BPS: u64 = 4_000_000;
const CONNECTIONS: usize = 6;
const PER_CONNECTION: usize = 256 * 1024;
const MSS: u32 = 1448;
const SHAPED: &str = "127.0.0.2";
const UNSHAPED: &str = "127.0.0.3";

/// Writes `PER_CONNECTION` bytes on every connection, then closes it.
async fn source() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        // Bounded by the test: it makes 2 x CONNECTIONS connections, then the runtime ends.
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let block = vec![0x6du8; PER_CONNECTION];
                let _ = stream.write_all(&block).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

async fn connect_from(client: &str, proxy: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(client.parse().unwrap(), 0))
        .unwrap();
    setsockopt(&socket.as_fd(), sockopt::TcpMaxSeg, &MSS).unwrap();
    socket.connect(proxy).await.unwrap()
}

/// Reads every connection to its end; the bytes read and the time it took.
async fn download(streams: Vec<TcpStream>) -> (usize, Duration) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for mut stream in streams {
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::with_capacity(PER_CONNECTION);
            tokio::time::timeout(WAIT * 4, stream.read_to_end(&mut got))
                .await
                .expect("download in time")
                .unwrap();
            got.len()
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    (total, started.elapsed())
}

/// The proxy's accepted sockets (local address = its listener) from `client`, in this process.
fn accepted_from(listen: SocketAddr, client: &str) -> Vec<RawFd> {
    let client: IpAddr = client.parse().unwrap();
    sockets_where(|local, peer| local == listen && peer.ip() == client)
}

fn max_pacing_rate(fd: RawFd) -> u64 {
    // SAFETY: the fd was listed in /proc/self/fd a moment ago and its connection is held open
    // by the test; a reused fd would only misread.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    midway_sys::sockopt::get_max_pacing_rate(fd).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribers_connections_share_its_access_link_and_another_subscriber_is_not_paced() {
    let target = source().await;
    let config = format!(
        r#"
[proxy]
allowed_clients = ["127.0.0.0/8"]
shutdown_grace = "1s"
[spool]
dir = "SPOOL_DIR"
[[access_links]]
clients = ["{SHAPED}/32"]
rate_bps = {RATE_BPS}
[[listeners]]
name = "fwd"
mode = "forward"
listen = "127.0.0.1:0"
target = "{target}"
"#
    );
    let running = start(&config).await;
    let listen = running.addr("fwd");
    let budget = payload_bytes_per_second(RATE_BPS);

    let mut shaped = Vec::new();
    let mut unshaped = Vec::new();
    for _ in 0..CONNECTIONS {
        shaped.push(connect_from(SHAPED, listen).await);
        unshaped.push(connect_from(UNSHAPED, listen).await);
    }
    // Every shaped local socket carries a ceiling of at most the subscriber's budget (set when
    // its relay starts, before midway writes to it); the other subscriber's carry none. The
    // sockets are accepted before their relays start, hence the wait.
    let all_paced = || {
        let sockets = accepted_from(listen, SHAPED);
        sockets.len() == CONNECTIONS && sockets.iter().all(|&fd| max_pacing_rate(fd) <= budget)
    };
    assert!(
        eventually(WAIT, all_paced).await,
        "the shaped subscriber's local sockets are not all paced at most at {budget} B/s: {:?}",
        accepted_from(listen, SHAPED)
            .into_iter()
            .map(max_pacing_rate)
            .collect::<Vec<_>>()
    );
    for fd in accepted_from(listen, UNSHAPED) {
        assert_eq!(
            u128::from(max_pacing_rate(fd)),
            u128::from(libc::c_ulong::MAX),
            "another subscriber is not paced"
        );
    }

    let (unshaped_result, shaped_result) = tokio::join!(download(unshaped), download(shaped));
    let (bytes, took) = shaped_result;
    assert_eq!(bytes, CONNECTIONS * PER_CONNECTION, "every byte arrives");
    assert_eq!(unshaped_result.0, CONNECTIONS * PER_CONNECTION);
    // At the subscriber's budget the bytes take at least this long; Linux sends the first 10
    // segments of each connection unpaced, and a pass of the sampler may briefly give a
    // newcomer its share before the others' shrink: a fifth is left for both.
    let unpaced = CONNECTIONS * 10 * MSS as usize;
    let at_budget = Duration::from_secs_f64((bytes - unpaced) as f64 / budget as f64);
    println!(
        "shaped subscriber: {bytes} bytes in {took:?} (at least {at_budget:?} at {budget} B/s); \
         the other subscriber: {:?}",
        unshaped_result.1
    );
    assert!(
        took >= at_budget.mul_f64(0.8),
        "six connections of one subscriber took {took:?}, faster than its link allows ({at_budget:?})"
    );
    assert!(
        unshaped_result.1 < at_budget / 4,
        "the other subscriber's downloads took {:?}, as if they shared the link",
        unshaped_result.1
    );
    running.stop().await;
}
