//! Prometheus metrics as tests read them: scraped from an HTTP endpoint or encoded from a
//! registry, one series looked up by name.

use std::net::SocketAddr;

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::net::WAIT;

/// `GET /metrics` from `addr` (bounded by [`WAIT`]); asserts a 200 and returns the whole
/// response, head included.
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

/// [`scrape`] without a runtime, for tests that drive the real binary from threads.
pub fn scrape_blocking(addr: SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// The text exposition of everything in `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

/// Value of the metric line `series value` (series = `name{labels}` exactly), if present.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
