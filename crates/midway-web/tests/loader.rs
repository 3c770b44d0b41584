// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The page loader against the real origin (and misbehaving servers) on loopback.

use std::io::Write;
use std::time::Duration;

use midway_testkit::web::*;
use midway_web::{
    load_pages, CacheMode, ConnectionLimit, HttpMode, RequestHeaders, SiteSpec, WebError,
};

#[test]
fn http_1_0_opens_one_connection_per_object_plus_one_per_page() {
    let spec = site(2, 65_000, 19, 2);
    let origin = start_origin(spec.clone());
    let load = load_spec(spec, origin.local_addr().port(), HttpMode::Http10, 6);
    let result = load_pages(&load).unwrap();

    assert_eq!(result.connections_opened, 2 * 20);
    assert_eq!(origin.stats().connections_accepted, 2 * 20);
    assert_eq!(result.bytes, 2 * 65_000);
    assert_eq!(result.pages.len(), 2);
    for (i, page) in result.pages.iter().enumerate() {
        assert_eq!(page.page, i as u32);
        assert_eq!(page.bytes, 65_000);
        assert_eq!(page.objects, 19);
        assert!(page.seconds > 0.0 && page.seconds < 20.0);
    }
    assert_eq!(origin.stats().max_requests_per_connection, 1);
}

#[test]
fn keep_alive_stays_within_the_connections_per_host() {
    let spec = site(1, 65_000, 12, 2);
    let origin = start_origin(spec.clone());
    let load = load_spec(spec, origin.local_addr().port(), HttpMode::KeepAlive, 2);
    let result = load_pages(&load).unwrap();
    // www.lab: the base document; s1.lab and s2.lab: at most 2 each.
    assert!(
        (3..=5).contains(&result.connections_opened),
        "{}",
        result.connections_opened
    );
    assert_eq!(
        u64::from(result.connections_opened),
        origin.stats().connections_accepted
    );
    assert_eq!(result.bytes, 65_000);
    assert_eq!(origin.stats().max_requests_in_one_read, 1, "no pipelining");
}

#[test]
fn keep_alive_reuses_connections_across_pages() {
    let spec = site(3, 20_000, 5, 0);
    let origin = start_origin(spec.clone());
    let load = load_spec(spec, origin.local_addr().port(), HttpMode::KeepAlive, 1);
    let result = load_pages(&load).unwrap();
    assert_eq!(result.connections_opened, 1);
    assert_eq!(origin.stats().max_requests_per_connection, 3 * 6);
    assert_eq!(result.bytes, 3 * 20_000);
}

#[test]
fn pipelining_writes_several_requests_at_once() {
    let spec = site(1, 65_000, 10, 0);
    let origin = start_origin(spec.clone());
    let load = load_spec(spec, origin.local_addr().port(), HttpMode::Pipelining, 1);
    let result = load_pages(&load).unwrap();
    assert_eq!(result.connections_opened, 1);
    assert_eq!(result.bytes, 65_000);
    let stats = origin.stats();
    assert_eq!(stats.max_requests_per_connection, 11);
    assert!(
        stats.max_requests_in_one_read >= 2,
        "origin saw at most {} request per read",
        stats.max_requests_in_one_read
    );
}

#[test]
fn pipelined_requests_cut_off_by_the_origin_are_retried_on_new_connections() {
    // 11 requests, the origin answers 3 per connection and drops the rest of each pipeline.
    let spec = SiteSpec {
        max_keepalive_requests: 3,
        ..site(1, 65_000, 10, 0)
    };
    let origin = start_origin(spec.clone());
    let load = load_spec(spec, origin.local_addr().port(), HttpMode::Pipelining, 1);
    let result = load_pages(&load).unwrap();
    assert_eq!(result.connections_opened, 4);
    assert_eq!(result.bytes, 65_000);
    let stats = origin.stats();
    assert_eq!(stats.connections_accepted, 4);
    assert_eq!(stats.requests_served, 11);
    assert!(stats.closed_max_requests >= 3);
}

#[test]
fn connections_closed_by_the_idle_timeout_are_replaced() {
    let spec = SiteSpec {
        keepalive_timeout: Duration::from_millis(50),
        ..site(3, 10_000, 0, 0)
    };
    let origin = start_origin(spec.clone());
    let mut load = load_spec(spec, origin.local_addr().port(), HttpMode::KeepAlive, 1);
    load.think_time = Duration::from_millis(400);
    let result = load_pages(&load).unwrap();
    assert_eq!(result.pages.len(), 3);
    assert_eq!(
        u64::from(result.connections_opened),
        origin.stats().connections_accepted
    );
    assert!(origin.stats().closed_idle >= 2);
    assert_eq!(result.connections_opened, 3);
}

#[test]
fn warm_hit_loads_everything_twice_and_measures_the_second_time() {
    let spec = site(2, 20_000, 3, 1);
    let origin = start_origin(spec.clone());
    let mut load = load_spec(spec, origin.local_addr().port(), HttpMode::Http10, 6);
    load.cache = CacheMode::WarmHit;
    let result = load_pages(&load).unwrap();
    assert_eq!(result.pages.len(), 2);
    assert_eq!(result.connections_opened, 2 * 4, "warm-up not counted");
    assert_eq!(origin.stats().requests_served, 2 * 2 * 4);
}

#[test]
fn through_a_proxy_requests_use_absolute_form_and_share_its_connections() {
    let spec = site(2, 65_000, 9, 2);
    let origin = start_origin(spec.clone());
    let proxy = RelayProxy::start(origin.local_addr());
    let port = origin.local_addr().port();
    let mut load = load_spec(spec.clone(), port, HttpMode::KeepAlive, 3);
    load.proxy = Some(proxy.addr);
    load.resolve.clear(); // names are the proxy's business
    load.cache = CacheMode::ForceMiss;
    let result = load_pages(&load).unwrap();

    assert_eq!(result.bytes, 2 * 65_000);
    // Objects on two hosts still share the proxy's 3 connections, kept across pages.
    assert_eq!(result.connections_opened, 3);
    assert_eq!(proxy.accepted.load(std::sync::atomic::Ordering::Relaxed), 3);
    let sent = proxy.sent_text();
    assert!(
        sent[0].starts_with(&format!(
            "GET http://www.lab:{port}/page/0.html HTTP/1.1\r\nHost: www.lab:{port}\r\n"
        )),
        "{}",
        sent[0]
    );
    let all: String = sent.concat();
    assert!(all.contains(&format!("GET http://s2.lab:{port}/obj/1/1 HTTP/1.1\r\n")));
    assert_eq!(all.matches("Pragma: no-cache\r\n").count(), 20);
    assert_eq!(all.matches("Cache-Control: no-cache\r\n").count(), 20);

    // HTTP/1.0 through the proxy: one proxy connection per object.
    let proxy = RelayProxy::start(origin.local_addr());
    load.proxy = Some(proxy.addr);
    load.mode = HttpMode::Http10;
    let result = load_pages(&load).unwrap();
    assert_eq!(result.connections_opened, 2 * 10);
    assert!(proxy
        .sent_text()
        .iter()
        .all(|s| s.contains(" HTTP/1.0\r\n")));

    // Pipelining through the proxy.
    let proxy = RelayProxy::start(origin.local_addr());
    load.proxy = Some(proxy.addr);
    load.mode = HttpMode::Pipelining;
    load.max_connections_per_host = 1;
    let result = load_pages(&load).unwrap();
    assert_eq!(result.connections_opened, 1);
    assert_eq!(result.bytes, 2 * 65_000);
}

#[test]
fn through_a_proxy_a_per_origin_limit_opens_connections_per_host_as_chromium_does() {
    let spec = site(2, 65_000, 9, 2);
    let origin = start_origin(spec.clone());
    let proxy = RelayProxy::start(origin.local_addr());
    let port = origin.local_addr().port();
    let mut load = load_spec(spec.clone(), port, HttpMode::KeepAlive, 3);
    load.proxy = Some(proxy.addr);
    load.connection_limit = ConnectionLimit::PerOrigin;
    load.cache = CacheMode::ForceMiss;
    let result = load_pages(&load).unwrap();
    assert_eq!(result.bytes, 2 * 65_000);
    // One for www.lab's base documents, 3 each for the objects on s1.lab and s2.lab, all to the
    // proxy and kept across pages (per server it would be 3 in all).
    assert_eq!(result.connections_opened, 1 + 3 + 3);
    assert_eq!(proxy.accepted.load(std::sync::atomic::Ordering::Relaxed), 7);

    // Chromium's header lines: about 380 bytes a request, as Chromium's own.
    let proxy = RelayProxy::start(origin.local_addr());
    load.proxy = Some(proxy.addr);
    load.request_headers = RequestHeaders::Chromium;
    load_pages(&load).unwrap();
    let all: String = proxy.sent_text().concat();
    let requests: Vec<&str> = all.split("\r\n\r\n").filter(|r| !r.is_empty()).collect();
    assert_eq!(requests.len(), 2 * 10);
    for request in &requests {
        assert!(
            request.contains("\r\nProxy-Connection: keep-alive\r\n"),
            "{request}"
        );
        assert!(request.contains("HeadlessChrome/156"), "{request}");
        assert!(
            (330..=450).contains(&(request.len() + 4)),
            "{} bytes: {request}",
            request.len()
        );
    }

    // More than a browser keeps to one proxy is refused, not silently modelled.
    load.max_connections_per_host = 11;
    assert!(matches!(
        load_pages(&load),
        Err(WebError::InvalidLoad {
            field: "max_connections_per_host",
            ..
        })
    ));
}

#[test]
fn a_corrupt_body_is_an_error() {
    let spec = site(1, 10_000, 0, 0);
    let (addr, server) = bad_server(|stream| {
        let body = vec![b'x'; 10_000];
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n";
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(&body).unwrap();
    });
    let load = load_spec(spec, addr.port(), HttpMode::KeepAlive, 1);
    let err = load_pages(&load).unwrap_err();
    assert!(matches!(err, WebError::BodyChecksum { .. }), "{err}");
    server.join().unwrap();
}

#[test]
fn a_short_body_is_an_error() {
    let spec = site(1, 10_000, 0, 0);
    let (addr, server) = bad_server(|stream| {
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 10000\r\n\r\n";
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(&[b'x'; 4000]).unwrap();
        // Dropping the stream closes it mid-body.
    });
    let load = load_spec(spec, addr.port(), HttpMode::KeepAlive, 1);
    let err = load_pages(&load).unwrap_err();
    assert!(
        matches!(
            err,
            WebError::BodyLength {
                expected: 10_000,
                got: 4000,
                ..
            }
        ),
        "{err}"
    );
    server.join().unwrap();
}

#[test]
fn a_wrong_length_announced_is_an_error() {
    let spec = site(1, 10_000, 0, 0);
    let (addr, server) = bad_server(|stream| {
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc";
        stream.write_all(head.as_bytes()).unwrap();
    });
    let load = load_spec(spec, addr.port(), HttpMode::Http10, 1);
    let err = load_pages(&load).unwrap_err();
    assert!(matches!(err, WebError::BodyLength { got: 3, .. }), "{err}");
    server.join().unwrap();
}

#[test]
fn the_timeout_bounds_a_load_that_never_ends() {
    let spec = site(1, 10_000, 0, 0);
    let (addr, server) = bad_server(|stream| {
        // Answer nothing; hold the connection until the client gives up.
        let mut byte = [0u8; 1];
        let _ = std::io::Read::read(stream, &mut byte);
    });
    let mut load = load_spec(spec, addr.port(), HttpMode::KeepAlive, 1);
    load.timeout = Duration::from_millis(300);
    let err = load_pages(&load).unwrap_err();
    assert!(matches!(err, WebError::Timeout { .. }), "{err}");
    server.join().unwrap();
}

#[test]
fn bad_load_descriptions_are_refused() {
    let spec = site(1, 10_000, 1, 1);
    let mut load = load_spec(spec.clone(), 80, HttpMode::KeepAlive, 1);
    load.resolve.remove("s1.lab");
    assert!(matches!(
        load_pages(&load),
        Err(WebError::Unresolved { host }) if host == "s1.lab"
    ));
    let load = load_spec(spec.clone(), 80, HttpMode::KeepAlive, 0);
    assert!(matches!(
        load_pages(&load),
        Err(WebError::InvalidLoad {
            field: "max_connections_per_host",
            ..
        })
    ));
    let load = load_spec(spec, 80, HttpMode::KeepAlive, 1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let inside = runtime.block_on(async { load_pages(&load) });
    assert!(matches!(inside, Err(WebError::InsideRuntime)));
}
