// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Conformance suite: real proxy, real origin, real sockets on loopback.

use std::sync::atomic::Ordering;
use std::time::Duration;

use http::Method;
use midway_http::HttpProxyConfig;
use midway_testkit::http::*;
use midway_testkit::net::echo_server;

fn config() -> HttpProxyConfig {
    HttpProxyConfig::default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_fetched_in_parallel_and_answered_in_order() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let mut client = Client::connect(proxy.addr).await;
    let o = origin.addr;
    // One write with three requests: the first can only complete if the second is fetched
    // concurrently; the POST must come after both.
    client
        .send(&format!(
            "{}{}POST http://{o}/echo-body HTTP/1.1\r\nHost: {o}\r\nContent-Length: 3\r\n\r\nabc{}",
            get(o, "/wait-for-peer"),
            get(o, "/peer"),
            get(o, "/conn-id")
        ))
        .await;
    let first = client.read_response(&Method::GET).await;
    let second = client.read_response(&Method::GET).await;
    let third = client.read_response(&Method::POST).await;
    let fourth = client.read_response(&Method::GET).await;
    assert_eq!(first.text(), "first");
    assert_eq!(second.text(), "second");
    assert_eq!(third.text(), "3 bytes, sum 294");
    assert!(fourth.text().parse::<usize>().is_ok());
    assert!(
        origin.state.connections.load(Ordering::SeqCst) >= 2,
        "parallel fetch needs two upstream connections"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_idempotent_request_waits_for_earlier_responses() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let o = origin.addr;
    let mut client = Client::connect(proxy.addr).await;
    client
        .send(&format!(
            "{}POST http://{o}/echo-body HTTP/1.1\r\nHost: {o}\r\nContent-Length: 2\r\n\r\nhi",
            get(o, "/gated")
        ))
        .await;
    for _ in 0..500 {
        if origin.state.hits("/gated") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(origin.state.hits("/gated"), 1);
    // While the GET is unanswered the POST must not reach the origin.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        origin.state.hits("/echo-body"),
        0,
        "POST overtook an unanswered request"
    );
    origin.state.gate.notify_one();
    assert_eq!(client.read_response(&Method::GET).await.text(), "gated 1");
    assert_eq!(
        client.read_response(&Method::POST).await.text(),
        "2 bytes, sum 209"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_chunked_and_close_delimited_bodies() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let o = origin.addr;
    let mut client = Client::connect(proxy.addr).await;
    client.send(&get(o, "/len/100000")).await;
    let response = client.read_response(&Method::GET).await;
    assert_eq!(response.header("content-length"), Some("100000"));
    assert_eq!(
        response.body,
        (0..100000).map(|i| (i % 251) as u8).collect::<Vec<u8>>()
    );

    client.send(&get(o, "/chunked")).await;
    let response = client.read_response(&Method::GET).await;
    assert_eq!(response.header("transfer-encoding"), Some("chunked"));
    assert_eq!(response.text(), "chunked body in three parts");

    // Close-delimited upstream body reaches an HTTP/1.1 client re-framed as chunked, and
    // the client connection stays usable.
    client.send(&get(o, "/close-delimited")).await;
    let response = client.read_response(&Method::GET).await;
    assert_eq!(response.text(), "until the end");
    assert_eq!(response.header("transfer-encoding"), Some("chunked"));
    client.send(&get(o, "/len/10")).await;
    assert_eq!(client.read_response(&Method::GET).await.body.len(), 10);

    // An HTTP/1.0 client cannot take chunked: it gets the body close-delimited.
    let mut old = Client::connect(proxy.addr).await;
    old.send(&format!("GET http://{o}/chunked HTTP/1.0\r\n\r\n"))
        .await;
    let response = old.read_response(&Method::GET).await;
    assert_eq!(response.text(), "chunked body in three parts");
    assert!(response.header("transfer-encoding").is_none());
    assert!(old.closed_cleanly().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_content_length_and_chunked() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let o = origin.addr;
    let mut client = Client::connect(proxy.addr).await;
    let body = vec![7u8; 70_000];
    let mut raw = format!(
        "POST http://{o}/echo-body HTTP/1.1\r\nHost: {o}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(&body);
    raw.extend_from_slice(format!("POST http://{o}/echo-body HTTP/1.1\r\nHost: {o}\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n2\r\nef\r\n0\r\n\r\n").as_bytes());
    tokio::io::AsyncWriteExt::write_all(&mut client.stream, &raw)
        .await
        .unwrap();
    assert_eq!(
        client.read_response(&Method::POST).await.text(),
        "70000 bytes, sum 490000"
    );
    assert_eq!(
        client.read_response(&Method::POST).await.text(),
        "6 bytes, sum 597"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_request_keeps_length_and_has_no_body() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let o = origin.addr;
    let mut client = Client::connect(proxy.addr).await;
    client
        .send(&format!(
            "HEAD http://{o}/len/500 HTTP/1.1\r\nHost: {o}\r\n\r\n{}",
            get(o, "/len/3")
        ))
        .await;
    let head = client.read_response(&Method::HEAD).await;
    assert_eq!(head.header("content-length"), Some("500"));
    assert!(head.body.is_empty());
    // The next response on the same connection is intact, so no body bytes leaked.
    assert_eq!(client.read_response(&Method::GET).await.body, vec![0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_stripped_and_via_added() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let o = origin.addr;
    let response = fetch(
        proxy.addr,
        o,
        "/echo-headers",
        "Connection: keep-alive, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: 300\r\nProxy-Connection: keep-alive\r\nX-End: yes\r\nVia: 1.0 browser-side\r\n",
    )
    .await;
    let seen = origin.state.last_headers.lock().unwrap().clone();
    let names: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
    for hop in ["x-secret", "keep-alive", "proxy-connection"] {
        assert!(!names.contains(&hop), "{hop} reached the origin: {names:?}");
    }
    assert!(seen.contains(&("x-end".into(), "yes".into())));
    assert!(
        seen.contains(&("via".into(), "1.0 browser-side, 1.1 midway".into())),
        "{seen:?}"
    );
    // Response side: the origin's Connection-named and Keep-Alive fields are gone.
    assert!(response.header("x-hop").is_none());
    assert!(response.header("keep-alive").is_none());
    assert_eq!(response.header("x-end"), Some("kept"));
    assert_eq!(response.header("via"), Some("1.1 midway"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_freshness_cases() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let (p, o) = (proxy.addr, origin.addr);
    let hits = |path: &str| origin.state.hits(path);

    // max-age: the second request is a hit.
    assert_eq!(
        fetch(p, o, "/max-age/300", "").await.text(),
        "max-age body 1"
    );
    assert_eq!(
        fetch(p, o, "/max-age/300", "").await.text(),
        "max-age body 1"
    );
    assert_eq!(hits("/max-age/300"), 1);
    assert_eq!(proxy.metric("http_cache_hits_total"), 1.0);
    assert!(proxy.metric("http_cache_served_bytes_total") >= 14.0);

    // Request Cache-Control: no-cache and Pragma: no-cache force the origin.
    assert_eq!(
        fetch(p, o, "/max-age/300", "Cache-Control: no-cache\r\n")
            .await
            .text(),
        "max-age body 2"
    );
    assert_eq!(
        fetch(p, o, "/max-age/300", "Pragma: no-cache\r\n")
            .await
            .text(),
        "max-age body 3"
    );
    assert_eq!(hits("/max-age/300"), 3);

    // no-store responses are never stored.
    fetch(p, o, "/no-store", "").await;
    assert_eq!(fetch(p, o, "/no-store", "").await.text(), "no-store body 2");

    // Response Pragma: no-cache (without Cache-Control) means revalidate each time.
    fetch(p, o, "/pragma", "").await;
    fetch(p, o, "/pragma", "").await;
    assert_eq!(hits("/pragma"), 2);

    // max-age=0: stored but stale at once; without validators the origin is asked again.
    fetch(p, o, "/max-age/0", "").await;
    assert_eq!(fetch(p, o, "/max-age/0", "").await.text(), "max-age body 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revalidation_with_etag_and_last_modified() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let (p, o) = (proxy.addr, origin.addr);
    for (path, body) in non_empty(&[
        ("/etag", "etag body"),
        ("/last-modified", "last-modified body"),
    ]) {
        let before = origin.state.not_modified.load(Ordering::SeqCst);
        let first = fetch(p, o, path, "").await;
        assert_eq!(first.text(), *body);
        let second = fetch(p, o, path, "").await;
        // The origin answered 304; the client still gets the full stored response.
        assert_eq!(second.head.status, 200);
        assert_eq!(second.text(), *body);
        assert_eq!(origin.state.hits(path), 2);
        assert_eq!(origin.state.not_modified.load(Ordering::SeqCst), before + 1);
    }
    assert_eq!(proxy.metric("http_cache_revalidations_total"), 2.0);

    // Without the cache, a client's own conditional request gets the origin's 304 as is,
    // with no body, and the connection stays usable.
    let mut uncached = config();
    uncached.cache.enabled = false;
    let plain = start_proxy(uncached).await;
    let mut client = Client::connect(plain.addr).await;
    client
        .send(&format!(
            "GET http://{o}/etag HTTP/1.1\r\nHost: {o}\r\nIf-None-Match: {ETAG}\r\n\r\n{}",
            get(o, "/len/4")
        ))
        .await;
    let response = client.read_response(&Method::GET).await;
    assert_eq!(response.head.status, 304);
    assert_eq!(response.header("etag"), Some(ETAG));
    assert!(response.body.is_empty());
    assert_eq!(client.read_response(&Method::GET).await.body.len(), 4);
}

/// Issue 17, defect 3: an origin whose 304 carries no validator (Python's http.server) made the
/// cache answer a plain GET with `304 Not Modified` and no body every time the entry went stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_304_without_validators_never_reaches_a_plain_get() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let (p, o) = (proxy.addr, origin.addr);
    let first = fetch(p, o, "/bare-304", "").await;
    assert_eq!(first.head.status, 200);
    assert_eq!(first.text(), "bare-304 body");
    for round in 0..2 {
        let again = fetch(p, o, "/bare-304", "").await;
        assert_eq!(again.head.status, 200, "round {round}");
        assert_eq!(again.text(), "bare-304 body", "round {round}");
    }
    // Each stale round asked conditionally, got the bare 304, and asked again without
    // conditions.
    assert_eq!(origin.state.not_modified.load(Ordering::SeqCst), 2);
    assert_eq!(origin.state.hits("/bare-304"), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_make_one_upstream_fetch() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let (p, o) = (proxy.addr, origin.addr);
    const CLIENTS: usize = 6;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            fetch(p, o, "/gated", "").await.text()
        }));
    }
    // Wait (bounded) until every request reached the proxy and the leader reached the origin.
    for _ in 0..500 {
        if proxy.metric("http_requests_total") as usize == CLIENTS
            && origin.state.hits("/gated") == 1
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(proxy.metric("http_requests_total") as usize, CLIENTS);
    // Give followers a moment to queue behind the leader, which makes a missing lock visible.
    tokio::time::sleep(Duration::from_millis(50)).await;
    origin.state.gate.notify_one();
    for task in tasks {
        assert_eq!(task.await.unwrap(), "gated 1");
    }
    assert_eq!(origin.state.hits("/gated"), 1);
    assert_eq!(proxy.metric("http_cache_misses_total"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connection_is_reused_across_clients_after_idle_pause() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let (p, o) = (proxy.addr, origin.addr);
    let first = fetch(p, o, "/conn-id", "").await.text();
    assert_eq!(
        proxy
            .proxy
            .idle_upstream_connections(&format!("127.0.0.1:{}", o.port())),
        1
    );
    tokio::time::sleep(Duration::from_millis(300)).await; // an idle period between page loads
    let second = fetch(p, o, "/conn-id", "").await.text();
    assert_eq!(
        first, second,
        "the second client must use the pooled connection"
    );
    assert_eq!(origin.state.connections.load(Ordering::SeqCst), 1);
    assert_eq!(proxy.metric("http_upstream_connects_total"), 1.0);
    assert_eq!(proxy.metric("http_upstream_reuses_total"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_connection_closed_by_origin_is_replaced_transparently() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let (p, o) = (proxy.addr, origin.addr);
    // The 404 path closes the origin side after answering, but says nothing: the proxy
    // pools it, finds it closed at checkout and uses a fresh connection.
    assert_eq!(fetch(p, o, "/unknown", "").await.head.status, 404);
    let response = fetch(p, o, "/conn-id", "").await;
    assert_eq!(response.head.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tunnel_relays_both_ways() {
    let (echo_addr, _echo) = echo_server().await;
    let proxy = start_proxy(config()).await;
    let mut client = Client::connect(proxy.addr).await;
    client
        .send(&format!(
            "CONNECT {echo_addr} HTTP/1.1\r\nHost: {echo_addr}\r\n\r\nearly bytes|"
        ))
        .await;
    let response = client.read_response(&Method::CONNECT).await;
    assert_eq!(response.head.status, 200);
    client.send("later bytes").await;
    tokio::io::AsyncWriteExt::shutdown(&mut client.stream)
        .await
        .unwrap();
    let mut echoed = client.take_buffered();
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut client.stream, &mut echoed),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(String::from_utf8_lossy(&echoed), "early bytes|later bytes");
    assert_eq!(proxy.metric("http_tunnels_total"), 1.0);
}

/// The close rule through a tunnel: an origin that resets after sending part of its answer makes
/// the client see a reset too, never a clean end of stream after the truncated bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tunnel_passes_an_origin_reset_on_as_a_reset() {
    let origin = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin_addr = origin.local_addr().unwrap();
    let origin_task = tokio::spawn(async move {
        let (mut stream, _) = origin.accept().await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut stream, b"part of an answer")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(stream);
    });
    let proxy = start_proxy(config()).await;
    let mut client = Client::connect(proxy.addr).await;
    client
        .send(&format!(
            "CONNECT {origin_addr} HTTP/1.1\r\nHost: {origin_addr}\r\n\r\n"
        ))
        .await;
    let response = client.read_response(&Method::CONNECT).await;
    assert_eq!(response.head.status, 200);
    let mut received = client.take_buffered();
    let end = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut client.stream, &mut received),
    )
    .await
    .unwrap();
    let error = end.expect_err("the tunnel ended with a clean end of stream after a reset");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    assert_eq!(String::from_utf8_lossy(&received), "part of an answer");
    origin_task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_gets_400_and_a_clean_close() {
    let proxy = start_proxy(config()).await;
    let inputs: &[&[u8]] = &[
        b"\x16\x03\x01\x02\x00garbage that is not http\r\n\r\n",
        b"GET http://a/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET http://a/ HTTP/1.1\r\nBad Header\r\n\r\n",
    ];
    for input in non_empty(inputs) {
        let mut client = Client::connect(proxy.addr).await;
        tokio::io::AsyncWriteExt::write_all(&mut client.stream, input)
            .await
            .unwrap();
        let response = client.read_response(&Method::GET).await;
        assert_eq!(
            response.head.status,
            400,
            "{}",
            String::from_utf8_lossy(input)
        );
        assert_eq!(response.header("connection"), Some("close"));
        assert!(client.closed_cleanly().await);
    }
    // Oversized heads get 431.
    let mut client = Client::connect(proxy.addr).await;
    client
        .send(&format!(
            "GET http://a/ HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(40_000)
        ))
        .await;
    assert_eq!(client.read_response(&Method::GET).await.head.status, 431);
    assert!(client.closed_cleanly().await);
    assert_eq!(proxy.metric("http_bad_requests_total"), 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_rate_and_idle_limits() {
    let origin = start_origin(false).await;
    let mut config = config();
    config.client.requests_per_second = 0.001;
    config.client.request_burst = 2;
    config.client.idle_timeout = Duration::from_millis(200);
    config.client.head_read_timeout = Duration::from_millis(500);
    let proxy = start_proxy(config).await;
    let o = origin.addr;
    let mut client = Client::connect(proxy.addr).await;
    client
        .send(&format!(
            "{}{}{}",
            get(o, "/len/1"),
            get(o, "/len/2"),
            get(o, "/len/3")
        ))
        .await;
    assert_eq!(client.read_response(&Method::GET).await.body.len(), 1);
    assert_eq!(client.read_response(&Method::GET).await.body.len(), 2);
    assert_eq!(client.read_response(&Method::GET).await.head.status, 429);
    assert!(client.closed_cleanly().await);

    // An idle client is closed after the idle timeout.
    let mut idle = Client::connect(proxy.addr).await;
    assert!(idle.closed_cleanly().await);

    // A head that starts but never ends is cut off after the head timeout (slow loris),
    // even though bytes keep trickling in faster than the idle timeout.
    let mut slow = Client::connect(proxy.addr).await;
    slow.send(&format!("GET http://{o}/len/1 HTTP/1.1\r\n"))
        .await;
    let mut closed = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if tokio::io::AsyncWriteExt::write_all(&mut slow.stream, b"X-Drip: 1\r\n")
            .await
            .is_err()
        {
            closed = true;
            break;
        }
        let mut probe = [0u8; 1];
        if let Ok(0) = slow.stream.try_read(&mut probe) {
            closed = true;
            break;
        }
    }
    assert!(
        closed,
        "a never-ending head must not keep the connection open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_client_without_keep_alive_is_closed_after_response() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let o = origin.addr;
    let mut client = Client::connect(proxy.addr).await;
    client
        .send(&format!("GET http://{o}/len/5 HTTP/1.0\r\n\r\n"))
        .await;
    let response = client.read_response(&Method::GET).await;
    assert_eq!(response.body.len(), 5);
    assert_eq!(response.header("connection"), Some("close"));
    assert!(client.closed_cleanly().await);
    // With keep-alive asked for, it stays open.
    let mut client = Client::connect(proxy.addr).await;
    client.send(&format!("GET http://{o}/len/5 HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET http://{o}/len/6 HTTP/1.0\r\n\r\n")).await;
    assert_eq!(
        client
            .read_response(&Method::GET)
            .await
            .header("connection"),
        Some("keep-alive")
    );
    assert_eq!(client.read_response(&Method::GET).await.body.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_origin_gets_502() {
    let unused = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = unused.local_addr().unwrap();
    drop(unused);
    let proxy = start_proxy(config()).await;
    let response = fetch(proxy.addr, dead, "/x", "").await;
    assert_eq!(response.head.status, 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_cannot_make_the_proxy_buffer_without_bound() {
    let origin = start_origin(true).await;
    let mut config = config();
    config.client.max_pipelined = 3;
    // Small kernel buffers on the proxy's upstream sockets, as a TCP profile could set them,
    // so what the origin managed to write approximates what the proxy holds.
    let connect: midway_http::ConnectUpstream = std::sync::Arc::new(|addr| {
        Box::pin(async move {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.set_recv_buffer_size(32 * 1024)?;
            socket.connect(addr).await
        })
    });
    let proxy = start_proxy_with(config, connect).await;
    let o = origin.addr;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(32 * 1024).unwrap();
    let stream = socket.connect(proxy.addr).await.unwrap();
    const BODY: u64 = 32 * 1024 * 1024;
    let path = format!("/big/{BODY}");
    let mut requests = String::new();
    for _ in 0..3 {
        requests.push_str(&get(o, &path));
    }
    let mut client = stream;
    tokio::io::AsyncWriteExt::write_all(&mut client, requests.as_bytes())
        .await
        .unwrap();
    // Never read: wait (bounded) until the origin stops making progress.
    let mut last = 0;
    let mut still = 0;
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = origin.state.big_bytes_written.load(Ordering::SeqCst);
        if now == last && now > 0 {
            still += 1;
            if still >= 10 {
                break;
            }
        } else {
            still = 0;
        }
        last = now;
    }
    let written = origin.state.big_bytes_written.load(Ordering::SeqCst);
    assert!(
        still >= 10,
        "origin never stalled; it wrote {written} bytes"
    );
    // 3 responses x (4 pieces x 16 KiB + read buffer) plus kernel buffers: a few MiB at most,
    // far below the 96 MiB requested.
    eprintln!("origin wrote {written} bytes before stalling");
    assert!(
        written < 12 * 1024 * 1024,
        "proxy let {written} bytes through to a client that reads nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_tier_serves_objects_evicted_from_memory() {
    let origin = start_origin(false).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config.cache.memory_bytes = 40;
    config.cache.max_object_bytes = 20;
    config.cache.disk = Some(midway_http::DiskCacheConfig {
        dir: dir.path().to_path_buf(),
        max_bytes: 1000,
    });
    let proxy = start_proxy(config).await;
    let (p, o) = (proxy.addr, origin.addr);
    let paths: Vec<String> = (1..=5).map(|i| format!("/max-age/{}", 1000 + i)).collect();
    for path in non_empty(&paths) {
        assert_eq!(fetch(p, o, path, "").await.text(), "max-age body 1");
    }
    let (memory, disk) = proxy.proxy.cache_stored_bytes();
    assert!(memory <= 40 && disk > 0, "memory {memory} disk {disk}");
    // Every object is still served from the cache, the oldest from disk.
    for path in &paths {
        assert_eq!(fetch(p, o, path, "").await.text(), "max-age body 1");
        assert_eq!(origin.state.hits(path), 1);
    }
    assert_eq!(proxy.metric("http_cache_hits_total"), 5.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_curl_through_the_proxy() {
    let origin = start_origin(false).await;
    let proxy = start_proxy(config()).await;
    let url = format!("http://{}/max-age/60", origin.addr);
    let proxy_url = format!("http://{}", proxy.addr);
    let run = move || {
        std::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-D",
                "-",
                "-x",
                &proxy_url,
                &url,
                &url,
            ])
            .output()
            .expect("curl is installed")
    };
    let output = tokio::task::spawn_blocking(run).await.unwrap();
    assert!(
        output.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout).to_lowercase();
    // Two URLs on one command line: curl reuses its proxy connection for the second.
    assert_eq!(text.matches("http/1.1 200 ok").count(), 2, "{text}");
    assert_eq!(text.matches("via: 1.1 midway").count(), 2, "{text}");
    assert_eq!(
        text.matches("max-age body 1").count(),
        2,
        "second answer is a cache hit: {text}"
    );
    assert_eq!(origin.state.hits("/max-age/60"), 1);

    // A POST with a body large enough for curl to send `Expect: 100-continue`.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("upload");
    std::fs::write(&file, vec![1u8; 200_000]).unwrap();
    let url = format!("http://{}/echo-body", origin.addr);
    let proxy_url = format!("http://{}", proxy.addr);
    let data = format!("@{}", file.display());
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-x",
                &proxy_url,
                "--data-binary",
                &data,
                &url,
            ])
            .output()
            .expect("curl is installed")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "200000 bytes, sum 200000"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_upstream_connections_expire_after_keep_time() {
    let origin = start_origin(false).await;
    let mut config = config();
    config.upstream.idle_keep = Duration::from_millis(200);
    let proxy = start_proxy(config).await;
    let cancel = tokio_util::sync::CancellationToken::new();
    tokio::spawn(proxy.proxy.clone().run_pool_maintenance(cancel.clone()));
    let authority = format!("127.0.0.1:{}", origin.addr.port());
    fetch(proxy.addr, origin.addr, "/conn-id", "").await;
    assert_eq!(proxy.proxy.idle_upstream_connections(&authority), 1);
    for _ in 0..300 {
        if proxy.proxy.idle_upstream_connections(&authority) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(proxy.proxy.idle_upstream_connections(&authority), 0);
    assert_eq!(proxy.metric("http_upstream_idle_connections"), 0.0);
    fetch(proxy.addr, origin.addr, "/conn-id", "").await;
    assert_eq!(origin.state.connections.load(Ordering::SeqCst), 2);
    cancel.cancel();
}
