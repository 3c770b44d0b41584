//! The harness of midway-proxy's tests (feature `proxy`): a proxy parsed from a config text,
//! bound on loopback (port 0 everywhere) and run until stopped.

#![allow(
    clippy::expect_used,
    reason = "test-only crate: a failed expect fails the calling test"
)]

use std::net::SocketAddr;

use midway_proxy::{parse_config, Proxy, ShutdownSummary};
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use crate::net::WAIT;

/// Bytes for the large checksum transfers: 32 MiB, `MIDWAY_TEST_BYTES=1073741824` for the 1 GiB
/// run.
pub fn bulk_bytes() -> usize {
    crate::data::bulk_bytes(32 << 20)
}

/// A proxy started by [`start`].
pub struct Running {
    /// Bound address of each listener, by listener name.
    pub addrs: Vec<(String, SocketAddr)>,
    /// Bound address of the `/metrics` endpoint, if the config has one.
    pub metrics: Option<SocketAddr>,
    /// Cancel to shut the proxy down.
    pub shutdown: CancellationToken,
    /// The proxy's run; ends with its shutdown summary.
    pub task: JoinHandle<Result<ShutdownSummary, midway_proxy::ProxyError>>,
    /// The registry holding the proxy's metrics.
    pub registry: Registry,
    _spool: tempfile::TempDir,
}

impl Running {
    /// The bound address of listener `name`.
    pub fn addr(&self, name: &str) -> SocketAddr {
        self.addrs
            .iter()
            .find(|(n, _)| n == name)
            .expect("listener")
            .1
    }

    /// Cancels the proxy and waits (bounded by [`WAIT`]) for its shutdown summary.
    pub async fn stop(self) -> ShutdownSummary {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("proxy stops in time")
            .expect("proxy task")
            .expect("proxy run")
    }
}

/// Logs to the test's output as `RUST_LOG` asks: `RUST_LOG=midway_proxy=debug` shows the
/// proxy's logs in a failing test's output. Once per process; later calls do nothing.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Parses `config` (with `SPOOL_DIR` replaced by a fresh temporary directory), binds and runs it.
pub async fn start(config: &str) -> Running {
    init_logging();
    let spool = tempfile::tempdir().unwrap();
    let text = config.replace("SPOOL_DIR", spool.path().to_str().unwrap());
    let config = parse_config(&text, "<test>").unwrap_or_else(|e| panic!("{e}"));
    let mut registry = Registry::default();
    let proxy = Proxy::bind(config, &mut registry)
        .await
        .unwrap_or_else(|e| panic!("{}", crate::chain(&e)));
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

/// midway run in-process on a thread of its own that has joined network namespace `ns`, so
/// that its listeners and outgoing sockets belong to that namespace. Stopped by [`InNetns::stop`],
/// or when dropped (a failing test still stops it).
pub struct InNetns {
    shutdown: CancellationToken,
    handle: Option<std::thread::JoinHandle<ShutdownSummary>>,
}

/// Parses `config`, binds it inside `ns` and runs it there; returns once it is bound.
pub fn start_in_netns(ns: &str, config: String) -> InNetns {
    init_logging();
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let handle = crate::netns::in_netns(ns, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let config = parse_config(&config, "<test in a namespace>")
                .unwrap_or_else(|e| panic!("config: {e}"));
            let proxy = Proxy::bind(config, &mut Registry::default())
                .await
                .unwrap_or_else(|e| panic!("bind: {}", crate::chain(&e)));
            ready_tx.send(()).expect("the test waits");
            proxy
                .run(token)
                .await
                .unwrap_or_else(|e| panic!("run: {}", crate::chain(&e)))
        })
    });
    ready_rx.recv_timeout(WAIT).expect("proxy ready");
    InNetns {
        shutdown,
        handle: Some(handle),
    }
}

impl InNetns {
    /// Shuts the proxy down and returns its summary.
    pub fn stop(mut self) -> ShutdownSummary {
        self.shutdown.cancel();
        self.handle
            .take()
            .expect("stopped once")
            .join()
            .expect("proxy thread")
    }
}

impl Drop for InNetns {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
