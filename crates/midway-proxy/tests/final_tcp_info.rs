//! The end-of-connection log carries each segment's *final* tcp_info, read by the relay's
//! close callback just before the sockets closed — not the sample taken right after connect.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use midway_testkit::net::*;
use midway_testkit::proxy::*;
use midway_testkit::wait::*;

/// Collects formatted log lines in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn field(line: &str, name: &str) -> Option<u64> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    line[start..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

// current_thread: the proxy's tasks run on this thread, under the scoped subscriber below.
#[tokio::test(flavor = "current_thread")]
async fn end_log_has_final_tcp_info_of_both_segments() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let (echo, _server) = echo_server().await;
    let config = format!(
        r#"
[proxy]
allowed_clients = ["127.0.0.0/8"]
shutdown_grace = "1s"
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
    let len = 1 << 20;
    let stream = tokio::net::TcpStream::connect(proxy.addr("fwd"))
        .await
        .unwrap();
    let (sent, received) = echo_roundtrip(stream, len, 3).await;
    assert_eq!(sent, received);
    let mut line = String::new();
    let logged = eventually(WAIT, || {
        line = captured
            .text()
            .lines()
            .find(|l| l.contains("connection closed"))
            .unwrap_or_default()
            .to_string();
        !line.is_empty()
    })
    .await;
    assert!(logged, "no end-of-connection log:\n{}", captured.text());
    // The only sample before the callback existed was taken right after connect: established,
    // nothing received yet. Final values: both directions were closed, all bytes received.
    for segment in ["local", "remote"] {
        let state = field(&line, &format!("{segment}_state")).expect("state logged");
        assert_ne!(
            state, 1,
            "{segment}: still ESTABLISHED, a stale sample: {line}"
        );
        let got = field(&line, &format!("{segment}_bytes_received")).expect("bytes logged");
        assert!(got >= len as u64, "{segment}: {got} bytes received: {line}");
    }
    proxy.stop().await;
}
