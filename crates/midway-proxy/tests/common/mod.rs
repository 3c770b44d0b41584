//! Shared harness for the integration tests: real sockets on loopback, port 0 everywhere.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use midway_proxy::{parse_config, Proxy, ShutdownSummary};
use prometheus_client::registry::Registry;
use rand::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Upper bound for any single wait in these tests; a hang fails instead of blocking CI.
pub const WAIT: Duration = Duration::from_secs(30);

/// Bytes for the large checksum transfers; `MIDWAY_TEST_BYTES=1073741824` for the 1 GiB run.
pub fn bulk_bytes() -> usize {
    std::env::var("MIDWAY_TEST_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32 << 20)
}

pub struct Running {
    pub addrs: Vec<(String, SocketAddr)>,
    pub metrics: Option<SocketAddr>,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<ShutdownSummary, midway_proxy::ProxyError>>,
    pub registry: Registry,
    _spool: tempfile::TempDir,
}

impl Running {
    pub fn addr(&self, name: &str) -> SocketAddr {
        self.addrs
            .iter()
            .find(|(n, _)| n == name)
            .expect("listener")
            .1
    }

    pub async fn stop(self) -> ShutdownSummary {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("proxy stops in time")
            .expect("proxy task")
            .expect("proxy run")
    }
}

/// Parses `config` (with `SPOOL_DIR` replaced by a fresh temporary directory), binds and runs it.
pub async fn start(config: &str) -> Running {
    // RUST_LOG=midway_proxy=debug shows the proxy's logs in a failing test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let spool = tempfile::tempdir().unwrap();
    let text = config.replace("SPOOL_DIR", spool.path().to_str().unwrap());
    let config = parse_config(&text, "<test>").unwrap_or_else(|e| panic!("{e}"));
    let mut registry = Registry::default();
    let proxy = Proxy::bind(config, &mut registry)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let addrs = proxy.local_addrs();
    let metrics = proxy.metrics_addr();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(proxy.run(shutdown.clone()));
    Running {
        addrs,
        metrics,
        shutdown,
        task,
        registry,
        _spool: spool,
    }
}

pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

/// An echo server: writes back everything, carries the client's FIN back as its own FIN.
pub async fn echo_server() -> (SocketAddr, JoinHandle<()>) {
    let listener = listen_v4(1024);
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let mut stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                // Out of fds (the fd-exhaustion test): wait for some to be freed.
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
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

/// Sends `len` seeded random bytes, half-closes, reads the echo to EOF; returns both digests.
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

/// True when the peer closes (EOF or reset) before sending anything.
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

/// GET /metrics over plain HTTP/1.0.
pub async fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut out))
        .await
        .expect("scrape in time")
        .unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// Value of one metric line `name{labels} value`, if present.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Polls `check` every 20 ms until it is true or `WAIT` passes.
pub async fn eventually<F: FnMut() -> bool>(mut check: F) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}

/// A loopback listener with an explicit backlog (the default 128 overflows under 200 connects).
pub fn listen_v4(backlog: u32) -> TcpListener {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    socket.listen(backlog).unwrap()
}

/// Reads from `stream` into `buf` until `buf` holds a whole HTTP head; returns the head's length
/// (up to and including the blank line), or `None` on EOF, error, or a head over 64 KiB.
pub async fn read_request_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(pos + 4);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
    }
}
