//! Real-socket harness: a test client and a test server on loopback (port 0), with midway's
//! relay between them, exactly as the proxy wires it (client = accepted socket, server =
//! connected socket).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use midway_relay::{
    relay, BufferConfig, RelayCounters, RelayError, RelayModel, RelayOptions, RelayReport,
    RelayResources, SpoolConfig,
};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Upper bound for any single wait in these tests; a hang fails instead of blocking CI.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(600);

pub struct Relayed {
    /// The test's client end (talks to midway's local segment).
    pub client: TcpStream,
    /// The test's server end (talks to midway's remote segment).
    pub server: TcpStream,
    pub relay: JoinHandle<Result<RelayReport, RelayError>>,
    pub counters: Arc<RelayCounters>,
    pub cancel: CancellationToken,
}

/// Socket buffer size for every socket of a connection; None = kernel defaults (autotuning).
/// Small buffers make "the kernel cannot absorb this" true regardless of sysctls.
pub async fn relayed(
    model: RelayModel,
    resources: &Arc<RelayResources>,
    idle_timeout: Option<Duration>,
    socket_buffer: Option<usize>,
) -> Relayed {
    let client_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(client_listener.local_addr().unwrap())
        .await
        .unwrap();
    let (proxy_client_side, _) = client_listener.accept().await.unwrap();
    let server_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_server_side = TcpStream::connect(server_listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = server_listener.accept().await.unwrap();
    if let Some(size) = socket_buffer {
        for stream in [&client, &proxy_client_side, &proxy_server_side, &server] {
            let sock = socket2::SockRef::from(stream);
            sock.set_recv_buffer_size(size).unwrap();
            sock.set_send_buffer_size(size).unwrap();
        }
    }
    let counters = Arc::new(RelayCounters::default());
    let cancel = CancellationToken::new();
    let options = RelayOptions {
        idle_timeout,
        counters: Arc::clone(&counters),
        ..RelayOptions::default()
    };
    let resources = Arc::clone(resources);
    let token = cancel.clone();
    let relay = tokio::spawn(async move {
        relay(
            proxy_client_side,
            proxy_server_side,
            &model,
            &resources,
            options,
            token,
        )
        .await
    });
    Relayed {
        client,
        server,
        relay,
        counters,
        cancel,
    }
}

pub fn buffer_model(buffer_bytes: usize, splice: bool) -> RelayModel {
    RelayModel::Buffer(BufferConfig {
        buffer_bytes,
        splice,
    })
}

pub fn spool_model(memory_bytes: usize, max_spool_bytes: u64) -> RelayModel {
    RelayModel::Spool(SpoolConfig {
        memory_bytes,
        max_spool_bytes,
        buffer_bytes: 64 * 1024,
    })
}

/// Resources with their own spool dir (removed on drop).
pub struct TestResources {
    pub dir: tempfile::TempDir,
    pub resources: Arc<RelayResources>,
}

pub fn resources(max_total_spool_bytes: u64, max_pipes: usize) -> TestResources {
    let dir = tempfile::tempdir().unwrap();
    let resources =
        RelayResources::new(dir.path().join("spool"), max_total_spool_bytes, max_pipes).unwrap();
    TestResources { dir, resources }
}

/// Deterministic pseudo-random bytes (xorshift64*), cheap enough for hundreds of MiB in debug.
pub struct Pattern {
    state: u64,
}

impl Pattern {
    pub fn new(seed: u64) -> Self {
        Pattern {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.state ^= self.state >> 12;
            self.state ^= self.state << 25;
            self.state ^= self.state >> 27;
            let word = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// Writes `len` pattern bytes, then shuts the write side down (FIN). Returns their SHA-256.
pub async fn send_pattern<W: AsyncWriteExt + Unpin>(
    writer: &mut W,
    len: u64,
    seed: u64,
) -> std::io::Result<[u8; 32]> {
    let mut pattern = Pattern::new(seed);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        pattern.fill(&mut buf[..n]);
        hasher.update(&buf[..n]);
        writer.write_all(&buf[..n]).await?;
        left -= n as u64;
    }
    writer.shutdown().await?;
    Ok(hasher.finalize().into())
}

/// Reads to EOF; returns (bytes, SHA-256).
pub async fn receive_all<R: AsyncReadExt + Unpin>(
    reader: &mut R,
) -> std::io::Result<(u64, [u8; 32])> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            return Ok((total, hasher.finalize().into()));
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
}

pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Polls `probe` until it stops changing for `stable_rounds` consecutive 20 ms samples
/// (bounded by TEST_TIMEOUT). Used to let kernel buffers fill before asserting on a stall;
/// the assertions that follow hold however long this waits.
pub async fn wait_until_stable(mut probe: impl FnMut() -> u64, stable_rounds: u32) -> u64 {
    let deadline = tokio::time::Instant::now() + TEST_TIMEOUT;
    let mut last = probe();
    let mut stable = 0;
    while stable < stable_rounds {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never became stable"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = probe();
        if now == last {
            stable += 1;
        } else {
            stable = 0;
            last = now;
        }
    }
    last
}

/// Polls until `cond` holds (bounded by TEST_TIMEOUT).
pub async fn wait_for(mut cond: impl FnMut() -> bool, what: &str) {
    let deadline = tokio::time::Instant::now() + TEST_TIMEOUT;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TEST_TIMEOUT, future)
        .await
        .expect("test step exceeded TEST_TIMEOUT")
}
