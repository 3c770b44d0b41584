//! Forward mode on loopback: both relay models, many small transfers, access control, limits,
//! unreachable targets, graceful shutdown and the metrics endpoint.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use midway_testkit::metrics::*;
use midway_testkit::net::*;
use midway_testkit::proxy::*;

fn forward_config(target: SocketAddr, relay: &str, extra_proxy: &str) -> String {
    format!(
        r#"
[proxy]
allowed_clients = ["127.0.0.0/8"]
connect_timeout = "1s"
shutdown_grace = "5s"
{extra_proxy}
[metrics]
listen = "127.0.0.1:0"
[spool]
dir = "SPOOL_DIR"
[[listeners]]
name = "fwd"
mode = "forward"
listen = "127.0.0.1:0"
target = "{target}"
relay = "{relay}"
"#
    )
}

/// `relay` is the value of the listener's `relay` key; `splice = false` forces the copy path.
async fn bulk_through(relay: &str, splice: bool) {
    let (echo, _server) = echo_server().await;
    let mut config = forward_config(echo, relay, "");
    if !splice {
        config.push_str("splice = false\n");
    }
    let proxy = start(&config).await;
    let stream = TcpStream::connect(proxy.addr("fwd")).await.unwrap();
    let len = bulk_bytes();
    let (sent, received) = echo_roundtrip(stream, len, 7).await;
    assert_eq!(sent, received, "checksums differ through relay = {relay}");

    // The byte counters saw both directions once the connection is done.
    let metrics = proxy.metrics.unwrap();
    let want = len as f64;
    let mut text = String::new();
    // Counters are added when the relay ends, just after the client saw EOF, and the connection
    // leaves the active gauge a moment later, after its end-of-connection log: poll briefly.
    let done = {
        let mut ok = false;
        for _ in 0..100 {
            text = scrape(metrics).await;
            let c2s = metric(
                &text,
                "midway_bytes_total{listener=\"fwd\",direction=\"client_to_server\"}",
            );
            let s2c = metric(
                &text,
                "midway_bytes_total{listener=\"fwd\",direction=\"server_to_client\"}",
            );
            let active = metric(&text, "midway_connections_active{listener=\"fwd\"}");
            if c2s == Some(want) && s2c == Some(want) && active == Some(0.0) {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        ok
    };
    assert!(done, "byte counters or active gauge wrong:\n{text}");
    assert_eq!(
        metric(&text, "midway_connections_accepted_total{listener=\"fwd\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&text, "midway_connections_active{listener=\"fwd\"}"),
        Some(0.0)
    );
    // At least the end-of-connection observation, plus one per 2 s of transfer.
    let srtt_count = metric(
        &text,
        "midway_segment_srtt_seconds_count{listener=\"fwd\",segment=\"remote\"}",
    );
    assert!(srtt_count.unwrap_or(0.0) >= 1.0, "{text}");
    assert!(
        text.contains("midway_segment_cwnd_segments_bucket{"),
        "{text}"
    );
    assert!(text.contains("midway_spool_bytes "), "{text}");
    assert!(text.contains("midway_splice_pipes_in_use "), "{text}");
    let summary = proxy.stop().await;
    assert_eq!(summary.connections_served, 1);
    assert_eq!(summary.open_at_shutdown, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_checksums_buffer() {
    bulk_through("buffer", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_checksums_buffer_copy_without_splice() {
    bulk_through("buffer", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_checksums_spool() {
    bulk_through("spool", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_transfers_both_models() {
    for relay in ["buffer", "spool"] {
        let (echo, _server) = echo_server().await;
        let proxy = start(&forward_config(echo, relay, "")).await;
        let addr = proxy.addr("fwd");
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..200u64 {
            tasks.spawn(async move {
                let stream = TcpStream::connect(addr).await.unwrap();
                // 0 bytes .. ~64 KiB, different per connection.
                let len = ((i * 7919) % 65_536) as usize * (i % 2) as usize;
                let (sent, received) = echo_roundtrip(stream, len, i).await;
                assert_eq!(sent, received, "connection {i}");
            });
        }
        while let Some(result) = tasks.join_next().await {
            result.unwrap();
        }
        let summary = proxy.stop().await;
        assert_eq!(summary.connections_served, 200, "relay = {relay}");
    }
}

#[tokio::test]
async fn client_outside_allowed_prefixes_is_refused() {
    let (echo, _server) = echo_server().await;
    let config = forward_config(echo, "buffer", "").replace("127.0.0.0/8", "127.0.0.2/32");
    let proxy = start(&config).await;
    let addr = proxy.addr("fwd");

    // From 127.0.0.1: not allowed, closed without a byte.
    let mut refused = TcpStream::connect(addr).await.unwrap();
    let _ = refused.write_all(b"hello").await;
    assert!(closed_without_data(&mut refused).await);

    // From 127.0.0.2: allowed, echoed.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let allowed = socket.connect(addr).await.unwrap();
    let (sent, received) = echo_roundtrip(allowed, 1000, 1).await;
    assert_eq!(sent, received);

    let text = scrape(proxy.metrics.unwrap()).await;
    assert_eq!(
        metric(
            &text,
            "midway_connections_refused_total{listener=\"fwd\",reason=\"not_allowed\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "midway_connections_accepted_total{listener=\"fwd\"}"),
        Some(1.0)
    );
    proxy.stop().await;
}

#[tokio::test]
async fn refusing_target_closes_the_client() {
    // Bind then drop: nothing listens on this port any more, connects are refused.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = start(&forward_config(closed, "buffer", "")).await;
    let mut client = TcpStream::connect(proxy.addr("fwd")).await.unwrap();
    assert!(closed_without_data(&mut client).await);
    let text = scrape(proxy.metrics.unwrap()).await;
    assert_eq!(
        metric(
            &text,
            "midway_connections_refused_total{listener=\"fwd\",reason=\"connect_refused\"}"
        ),
        Some(1.0),
        "{text}"
    );
    proxy.stop().await;
}

/// A target whose accept queue is full: the kernel drops further SYNs, so connect never
/// completes and the proxy's connect timeout (1 s here) must close the client.
#[tokio::test]
async fn silent_target_hits_connect_timeout() {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    sock.listen(0).unwrap();
    let silent: SocketAddr = sock.local_addr().unwrap().as_socket().unwrap();
    // Fill the backlog (never accepted); keep these streams open for the test's duration.
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(silent)).await
        {
            fillers.push(s);
        }
    }
    let proxy = start(&forward_config(silent, "buffer", "")).await;
    let started = std::time::Instant::now();
    let mut client = TcpStream::connect(proxy.addr("fwd")).await.unwrap();
    assert!(closed_without_data(&mut client).await);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed before the timeout"
    );
    let text = scrape(proxy.metrics.unwrap()).await;
    assert_eq!(
        metric(
            &text,
            "midway_connections_refused_total{listener=\"fwd\",reason=\"connect_timeout\"}"
        ),
        Some(1.0),
        "{text}"
    );
    drop(fillers);
    proxy.stop().await;
}

#[tokio::test]
async fn per_client_limit_refuses_the_extra_connection() {
    let (echo, _server) = echo_server().await;
    let proxy = start(&forward_config(
        echo,
        "buffer",
        "max_connections_per_client = 2",
    ))
    .await;
    let addr = proxy.addr("fwd");
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        // A round trip proves the connection is being served (holds its permit).
        s.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.unwrap();
        held.push(s);
    }
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(closed_without_data(&mut third).await);
    let text = scrape(proxy.metrics.unwrap()).await;
    assert_eq!(
        metric(
            &text,
            "midway_connections_refused_total{listener=\"fwd\",reason=\"client_limit\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "midway_connections_active{listener=\"fwd\"}"),
        Some(2.0)
    );
    // Free a slot: a new connection is served again.
    drop(held.pop());
    let metrics = proxy.metrics.unwrap();
    let mut freed = false;
    for _ in 0..200 {
        let text = scrape(metrics).await;
        if metric(&text, "midway_connections_active{listener=\"fwd\"}") == Some(1.0) {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed);
    let again = TcpStream::connect(addr).await.unwrap();
    let (a, b) = echo_roundtrip(again, 100, 3).await;
    assert_eq!(a, b);
    proxy.stop().await;
}

/// At the total limit the next client waits (its connection is not accepted) and is served as
/// soon as a slot frees up.
#[tokio::test]
async fn total_limit_queues_until_a_slot_frees() {
    let (echo, _server) = echo_server().await;
    let proxy = start(&forward_config(echo, "buffer", "max_connections = 1")).await;
    let addr = proxy.addr("fwd");
    let mut first = TcpStream::connect(addr).await.unwrap();
    first.write_all(b"1").await.unwrap();
    let mut b = [0u8; 1];
    first.read_exact(&mut b).await.unwrap();

    let mut second = TcpStream::connect(addr).await.unwrap();
    second.write_all(b"2").await.unwrap();
    // Not served while the first holds the only slot.
    let waited = tokio::time::timeout(Duration::from_millis(300), second.read_exact(&mut b)).await;
    assert!(
        waited.is_err(),
        "second connection served beyond max_connections"
    );
    let text = scrape(proxy.metrics.unwrap()).await;
    assert_eq!(
        metric(&text, "midway_connections_accepted_total{listener=\"fwd\"}"),
        Some(1.0)
    );

    first.shutdown().await.unwrap();
    drop(first);
    tokio::time::timeout(WAIT, second.read_exact(&mut b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&b, b"2");
    proxy.stop().await;
}

/// Shutdown while a transfer runs: the listener closes at once, the transfer completes intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_drains_in_flight_transfer() {
    let (echo, _server) = echo_server().await;
    let proxy = start(&forward_config(echo, "buffer", "")).await;
    let addr = proxy.addr("fwd");
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(b"before").await.unwrap();
    let mut b = [0u8; 6];
    client.read_exact(&mut b).await.unwrap();

    proxy.shutdown.cancel();
    // New connections are no longer accepted (refused or reset once the listener closes).
    let mut closed = false;
    for _ in 0..200 {
        match TcpStream::connect(addr).await {
            Err(_) => {
                closed = true;
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    assert!(closed, "listener still accepting after shutdown");

    // The in-flight connection still works within the grace period.
    let (sent, received) = echo_roundtrip(client, 4 << 20, 9).await;
    assert_eq!(sent, received);
    let summary = tokio::time::timeout(WAIT, proxy.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // Probe connections made while the listener was closing may have been accepted too.
    assert!(summary.open_at_shutdown >= 1, "{summary:?}");
    assert_eq!(summary.cancelled_after_grace, 0);
}

/// A connection still open when the grace period ends is cancelled, and run() returns.
#[tokio::test]
async fn shutdown_cancels_after_grace() {
    let (echo, _server) = echo_server().await;
    let config = forward_config(echo, "buffer", "")
        .replace("shutdown_grace = \"5s\"", "shutdown_grace = \"200ms\"");
    let proxy = start(&config).await;
    let mut client = TcpStream::connect(proxy.addr("fwd")).await.unwrap();
    client.write_all(b"x").await.unwrap();
    let mut b = [0u8; 1];
    client.read_exact(&mut b).await.unwrap();
    let summary = proxy.stop().await;
    assert_eq!(summary.open_at_shutdown, 1);
    assert_eq!(summary.cancelled_after_grace, 1);
    // The client sees its connection end.
    assert!(closed_without_data(&mut client).await);
}

#[tokio::test]
async fn metrics_endpoint_404_elsewhere() {
    let (echo, _server) = echo_server().await;
    let proxy = start(&forward_config(echo, "buffer", "")).await;
    let mut stream = TcpStream::connect(proxy.metrics.unwrap()).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 404"), "{out}");
    proxy.stop().await;
}
