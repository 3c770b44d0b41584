//! Loopback peers and socket helpers: echo servers (async and blocking), listeners with a
//! backlog, checksummed echo round trips and HTTP request heads.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Upper bound for one wait of the helpers here; a hang fails instead of blocking CI.
pub const WAIT: Duration = Duration::from_secs(30);

/// A loopback listener with an explicit backlog (the default 128 overflows under 200 connects).
pub fn listen_v4(backlog: u32) -> TcpListener {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    socket.listen(backlog).unwrap()
}

/// An echo server on loopback for any number of connections: writes back everything, carries
/// the client's FIN back as its own FIN. Runs until the task is aborted or the runtime ends.
pub async fn echo_server() -> (SocketAddr, JoinHandle<()>) {
    echo_server_on(listen_v4(1024))
}

/// [`echo_server`] bound to `addr` (such as `"[::1]:0"`); panics if it cannot bind.
pub async fn echo_server_at(addr: &str) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| panic!("cannot bind {addr}: {e}"));
    echo_server_on(listener)
}

fn echo_server_on(listener: TcpListener) -> (SocketAddr, JoinHandle<()>) {
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let mut stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                // Out of fds (the fd-exhaustion test): wait for some to be freed.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    (addr, task)
}

/// A blocking echo server on loopback for up to `connections` connections, each on a thread
/// of its own: writes back everything, then closes its side. For tests without a runtime
/// (driving the real binary); runs until the test process ends.
pub fn echo_server_threads(connections: usize) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(connections) {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut reader = stream.try_clone().unwrap();
                let _ = std::io::copy(&mut reader, &mut stream);
                let _ = stream.shutdown(Shutdown::Write);
            });
        }
    });
    addr
}

/// A blocking echo server on loopback for one connection, on a thread of its own: returns
/// everything it reads, then closes its side.
pub fn echo_once() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            let mut copy = stream.try_clone().unwrap();
            let _ = std::io::copy(&mut stream, &mut copy);
            let _ = copy.shutdown(Shutdown::Write);
        }
    });
    addr
}

/// Sends `len` seeded random bytes, half-closes, reads the echo to EOF (asserting its length);
/// returns the digests of what was sent and what came back. Bounded by 4 × [`WAIT`].
pub async fn echo_roundtrip(mut stream: TcpStream, len: usize, seed: u64) -> ([u8; 32], [u8; 32]) {
    let (mut r, mut w) = stream.split();
    let writer = async {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut left = len;
        while left > 0 {
            let n = left.min(buf.len());
            rng.fill_bytes(&mut buf[..n]);
            hash.update(&buf[..n]);
            w.write_all(&buf[..n]).await.unwrap();
            left -= n;
        }
        w.shutdown().await.unwrap();
        hash.finalize().into()
    };
    let reader = async {
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0;
        loop {
            let n = r.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            total += n;
            hash.update(&buf[..n]);
        }
        assert_eq!(total, len, "echo length");
        hash.finalize().into()
    };
    let (sent, received) = tokio::time::timeout(WAIT * 4, async { tokio::join!(writer, reader) })
        .await
        .expect("round trip in time");
    (sent, received)
}

/// True when the peer closes (EOF or reset) before sending anything; panics after [`WAIT`].
pub async fn closed_without_data(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(WAIT, stream.read(&mut buf))
        .await
        .expect("closed in time")
    {
        Ok(0) => true,
        Ok(_) => false,
        Err(_) => true,
    }
}

/// Largest request head the head readers accept.
const MAX_HEAD: usize = 64 * 1024;

/// The length of the HTTP head at the start of `buf` (up to and including the blank line).
fn head_len(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// Reads from `stream` into `buf` until `buf` holds a whole HTTP head; returns the head's length
/// (up to and including the blank line), or `None` on EOF, error, or a head over 64 KiB.
pub async fn read_request_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(len) = head_len(buf) {
            return Some(len);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

/// [`read_request_head`] on a blocking stream (its read timeout bounds each read).
pub fn read_request_head_blocking(stream: &mut impl Read, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(len) = head_len(buf) {
            return Some(len);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

/// A blocking HTTP/1.1 origin on a listener the test bound (on loopback, or inside a network
/// namespace: its sockets stay there). It answers every request on a keep-alive connection (at
/// most 64 a connection) and [`PageOrigin::requests`] counts them. It stops accepting when
/// dropped or once `limit` has passed; each read is bounded by `limit` too.
pub struct PageOrigin {
    /// The listener's address.
    pub addr: SocketAddr,
    /// Requests answered so far.
    pub requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PageOrigin {
    /// Answers every request with the same `response` (a whole HTTP response, head and body).
    pub fn serve(listener: std::net::TcpListener, response: String, limit: Duration) -> PageOrigin {
        let response = response.into_bytes();
        PageOrigin::respond(listener, limit, move |_| response.clone())
    }

    /// Answers each request with the bytes `answer` makes of its head (request line and
    /// header lines, as text).
    pub fn respond(
        listener: std::net::TcpListener,
        limit: Duration,
        answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static,
    ) -> PageOrigin {
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (counter, stopped) = (requests.clone(), stop.clone());
        let answer = Arc::new(answer);
        let thread = std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + limit;
            while !stopped.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                let mut stream = match listener.accept() {
                    Ok((stream, _)) => stream,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    Err(e) => panic!("origin accept: {e}"),
                };
                stream.set_nonblocking(false).unwrap();
                stream.set_read_timeout(Some(limit)).unwrap();
                let (counter, answer) = (counter.clone(), answer.clone());
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    // Bounded: a test connection carries a handful of requests.
                    for _ in 0..64 {
                        let Some(end) = read_request_head_blocking(&mut stream, &mut buf) else {
                            return;
                        };
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end);
                        counter.fetch_add(1, Ordering::SeqCst);
                        if stream.write_all(&answer(&head)).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        PageOrigin {
            addr,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for PageOrigin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The connected IPv4 sockets of this process whose (local, peer) addresses match: a test finds
/// the proxy's own sockets this way to read their options back.
pub fn sockets_where(matches: impl Fn(SocketAddr, SocketAddr) -> bool) -> Vec<std::os::fd::RawFd> {
    use nix::sys::socket::{getpeername, getsockname, SockaddrStorage};
    let addr = |storage: Option<SockaddrStorage>| {
        storage
            .as_ref()
            .and_then(|s| s.as_sockaddr_in())
            .map(|a| SocketAddr::from((a.ip(), a.port())))
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let local = addr(getsockname::<SockaddrStorage>(fd).ok());
        let peer = addr(getpeername::<SockaddrStorage>(fd).ok());
        if let (Some(local), Some(peer)) = (local, peer) {
            if matches(local, peer) {
                found.push(fd);
            }
        }
    }
    found
}
