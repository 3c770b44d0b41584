//! The harness of midway-relay's tests (feature `relay`), on real sockets: a test client and a test server on loopback (port 0), with midway's
//! relay between them, exactly as the proxy wires it (client = accepted socket, server =
//! connected socket).

use std::sync::Arc;
use std::time::Duration;

use midway_relay::{
    relay, BufferConfig, ClientWindow, RelayCounters, RelayError, RelayModel, RelayOptions,
    RelayReport, RelayResources, SpoolConfig,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Upper bound for any single wait in these tests; a hang fails instead of blocking CI.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(600);

/// One relayed connection: the test's two ends and the relay task between them.
pub struct Relayed {
    /// The test's client end (talks to midway's local segment).
    pub client: TcpStream,
    /// The test's server end (talks to midway's remote segment).
    pub server: TcpStream,
    /// The relay task; ends with its report.
    pub relay: JoinHandle<Result<RelayReport, RelayError>>,
    /// The relay's live byte counters.
    pub counters: Arc<RelayCounters>,
    /// Cancel to stop the relay.
    pub cancel: CancellationToken,
}

/// Reads the test's client and server ends to their end and asserts each ended with a reset,
/// not a FIN (the close rule for a connection the relay ended unfinished).
pub async fn assert_both_ends_reset(client: &mut TcpStream, server: &mut TcpStream) {
    use tokio::io::AsyncReadExt;
    for (name, stream) in [("client", client), ("server", server)] {
        let mut rest = Vec::new();
        let end = crate::wait::within(TEST_TIMEOUT, stream.read_to_end(&mut rest)).await;
        assert_eq!(
            end.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::ConnectionReset),
            "the test's {name} end"
        );
    }
}

/// Socket buffer size for every socket of a connection; None = kernel defaults (autotuning).
/// Small buffers make "the kernel cannot absorb this" true regardless of sysctls.
pub async fn relayed(
    model: RelayModel,
    resources: &Arc<RelayResources>,
    idle_timeout: Option<Duration>,
    socket_buffer: Option<usize>,
) -> Relayed {
    relayed_with(model, resources, idle_timeout, socket_buffer, None, None).await
}

/// As [`relayed`], with the relay parking after `park_after` without a byte
/// (`RelayOptions::park_after`).
pub async fn relayed_parking(
    model: RelayModel,
    resources: &Arc<RelayResources>,
    idle_timeout: Option<Duration>,
    park_after: Duration,
) -> Relayed {
    relayed_with(model, resources, idle_timeout, None, Some(park_after), None).await
}

/// As [`relayed`], with the bytes toward the client written only as far as `window` grants
/// (`RelayOptions::client_window`).
pub async fn relayed_windowed(
    model: RelayModel,
    resources: &Arc<RelayResources>,
    window: Arc<dyn ClientWindow>,
) -> Relayed {
    relayed_with(model, resources, None, None, None, Some(window)).await
}

async fn relayed_with(
    model: RelayModel,
    resources: &Arc<RelayResources>,
    idle_timeout: Option<Duration>,
    socket_buffer: Option<usize>,
    park_after: Option<Duration>,
    client_window: Option<Arc<dyn ClientWindow>>,
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
        park_after,
        client_window,
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

/// The buffer model with `buffer_bytes` per direction, splicing or copying.
pub fn buffer_model(buffer_bytes: usize, splice: bool) -> RelayModel {
    RelayModel::Buffer(BufferConfig {
        buffer_bytes,
        splice,
    })
}

/// The spool model: `memory_bytes` in memory, then up to `max_spool_bytes` on disk.
pub fn spool_model(memory_bytes: usize, max_spool_bytes: u64) -> RelayModel {
    RelayModel::Spool(SpoolConfig {
        memory_bytes,
        max_spool_bytes,
        buffer_bytes: 64 * 1024,
    })
}

/// Resources with their own spool dir (removed on drop).
pub struct TestResources {
    /// The spool directory, removed on drop.
    pub dir: tempfile::TempDir,
    /// Pipe pool and spool accounting, spooling into `dir`.
    pub resources: Arc<RelayResources>,
}

/// Relay resources with a fresh spool dir and the given limits.
pub fn resources(max_total_spool_bytes: u64, max_pipes: usize) -> TestResources {
    let dir = tempfile::tempdir().unwrap();
    let resources =
        RelayResources::new(dir.path().join("spool"), max_total_spool_bytes, max_pipes).unwrap();
    TestResources { dir, resources }
}

/// Waits until the server-to-client direction stops moving: the bytes delivered to the client
/// plus those the spool holds have not changed for `stable_rounds` polls (20 ms apart). Then a
/// server that writes more than the path holds is stalled, or finished into the spool.
pub async fn wait_until_server_to_client_settles(counters: &RelayCounters, stable_rounds: u32) {
    use std::sync::atomic::Ordering::Relaxed;
    crate::wait::wait_until_stable(
        TEST_TIMEOUT,
        || counters.server_to_client.load(Relaxed) + counters.spooled_now.load(Relaxed),
        stable_rounds,
    )
    .await;
}
