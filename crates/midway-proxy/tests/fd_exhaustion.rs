//! fd exhaustion: with every file descriptor of the process in use, accept fails with EMFILE;
//! the proxy backs off (counted in `midway_accept_backoffs_total`), keeps running, and serves the
//! waiting client once descriptors are free again.
//!
//! A test binary of its own: it lowers RLIMIT_NOFILE for the whole process.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::time::Duration;

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use midway_testkit::metrics::*;
use midway_testkit::net::*;
use midway_testkit::proxy::*;

/// Restores the original limit even if the test fails.
struct RestoreLimit(u64, u64);

impl Drop for RestoreLimit {
    fn drop(&mut self) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, self.0, self.1);
    }
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

fn backoffs(proxy: &Running) -> f64 {
    metric(
        &encode(&proxy.registry),
        "midway_accept_backoffs_total{listener=\"fwd\"}",
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_backs_off_on_emfile_and_recovers() {
    let (echo, _server) = echo_server().await;
    let config = format!(
        r#"
[proxy]
allowed_clients = ["127.0.0.1"]
[spool]
dir = "SPOOL_DIR"
[[listeners]]
name = "fwd"
mode = "forward"
listen = "127.0.0.1:0"
target = "{echo}"
"#
    );
    let proxy = start(&config).await;
    let addr = proxy.addr("fwd");
    // Warm up: one full round trip so lazily created resources exist.
    let (a, b) = echo_roundtrip(TcpStream::connect(addr).await.unwrap(), 1000, 1).await;
    assert_eq!(a, b);

    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let _restore = RestoreLimit(soft, hard);
    setrlimit(Resource::RLIMIT_NOFILE, open_fds() + 64, hard).unwrap();

    // Use up every descriptor (bounded: the limit is at most 64 above what is open).
    let mut fillers: Vec<File> = Vec::new();
    for _ in 0..10_000 {
        match File::open("/dev/null") {
            Ok(f) => fillers.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                break;
            }
        }
    }
    assert!(
        File::open("/dev/null").is_err(),
        "descriptors not exhausted"
    );

    // One descriptor for the client; the kernel completes its handshake on the listen backlog,
    // and the proxy's accept() then fails with EMFILE.
    drop(fillers.pop());
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(b"ping").await.unwrap();
    let mut backed_off = false;
    for _ in 0..1500 {
        if backoffs(&proxy) >= 2.0 {
            backed_off = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(backed_off, "accept did not back off");
    assert!(!proxy.task.is_finished(), "proxy stopped");

    // Free the descriptors: the waiting client is served.
    drop(fillers);
    let mut reply = [0u8; 4];
    tokio::time::timeout(WAIT, client.read_exact(&mut reply))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&reply, b"ping");
    drop(client);

    // And so are new ones.
    let (a, b) = echo_roundtrip(TcpStream::connect(addr).await.unwrap(), 100_000, 2).await;
    assert_eq!(a, b);
    proxy.stop().await;
}
