// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The origin on real loopback sockets, driven by a raw HTTP client.

use std::io::Write;
use std::time::{Duration, Instant};

use midway_testkit::web::*;
use midway_web::fnv1a;
use midway_web::SiteSpec;

#[test]
fn serves_pages_and_objects_with_exact_sizes_and_checksums() {
    let spec = site(2, 65_000, 19, 2);
    let layout = spec.layout().unwrap();
    let origin = start_origin(spec);
    let addr = origin.local_addr();
    let host = |name: &str| format!("{name}:{}", addr.port());
    let mut stream = connect(addr);
    let mut buf = Vec::new();

    let requests = [
        get("/page/1.html", &host("www.lab"), ""),
        get("/obj/1/0", &host("s1.lab"), ""),
        get("/obj/1/1", &host("S2.LAB"), ""),
        get("/obj/1/1", &host("s1.lab"), ""), // object 1 lives on s2
        get("/favicon.ico", &host("www.lab"), ""),
        get("/page/0.html", &host("nowhere.lab"), ""),
    ];
    for request in &requests {
        stream.write_all(request.as_bytes()).unwrap();
    }
    let mut responses = Vec::new();
    for _ in &requests {
        responses.push(read_response(&mut stream, &mut buf, false).expect("a response"));
    }
    let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 404, 404, 404]);

    let base = &responses[0];
    assert_eq!(base.body.len() as u64, layout.base_bytes);
    assert_eq!(
        base.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let text = String::from_utf8(base.body.clone()).unwrap();
    assert!(text.contains(&format!("src=\"http://s1.lab:{}/obj/1/0\"", addr.port())));
    assert!(
        text.contains("midway-plt:"),
        "the timing script is in the page"
    );
    for response in &responses[..3] {
        let sum = format!("{:016x}", fnv1a(&response.body));
        assert_eq!(response.header("x-midway-sum"), Some(sum.as_str()));
        assert_eq!(response.header("etag"), Some(format!("\"{sum}\"").as_str()));
        assert_eq!(response.header("cache-control"), Some("max-age=3600"));
        assert!(response.header("last-modified").is_some());
        assert!(response.header("date").is_some());
    }
    for object in &responses[1..3] {
        assert_eq!(object.body.len() as u64, layout.object_bytes);
        assert!(object.body.starts_with(b"GIF89a"));
    }
    assert_eq!(responses[2].header("connection"), Some("keep-alive"));
    assert_eq!(
        responses[2].header("keep-alive"),
        Some("timeout=15, max=97")
    );

    // HEAD: the same head, no body.
    stream
        .write_all(format!("HEAD /obj/1/0 HTTP/1.1\r\nHost: {}\r\n\r\n", host("s1.lab")).as_bytes())
        .unwrap();
    let head = read_response(&mut stream, &mut buf, true).unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("content-length"),
        Some(layout.object_bytes.to_string().as_str())
    );

    let stats = origin.stats();
    assert_eq!(stats.connections_accepted, 1);
    assert_eq!(stats.requests_served, 7);
    assert_eq!(stats.not_found, 3);
    assert_eq!(
        stats.body_bytes_sent,
        layout.base_bytes + 2 * layout.object_bytes
    );
}

#[test]
fn validators_give_304_and_no_cache_is_announced() {
    let spec = SiteSpec {
        cache_max_age: None,
        ..site(1, 20_000, 2, 1)
    };
    let origin = start_origin(spec);
    let addr = origin.local_addr();
    let host = format!("s1.lab:{}", addr.port());
    let mut stream = connect(addr);
    let mut buf = Vec::new();

    stream
        .write_all(get("/obj/0/1", &host, "").as_bytes())
        .unwrap();
    let full = read_response(&mut stream, &mut buf, false).unwrap();
    assert_eq!(full.status, 200);
    assert_eq!(full.header("cache-control"), Some("no-cache"));
    let etag = full.header("etag").unwrap().to_string();
    let last_modified = full.header("last-modified").unwrap().to_string();

    let conditional = [
        format!("If-None-Match: {etag}\r\n"),
        format!("If-None-Match: \"other\", W/{etag}\r\n"),
        format!("If-Modified-Since: {last_modified}\r\n"),
    ];
    for header in &conditional {
        stream
            .write_all(get("/obj/0/1", &host, header).as_bytes())
            .unwrap();
        let response = read_response(&mut stream, &mut buf, false).unwrap();
        assert_eq!(response.status, 304, "for {header}");
        assert!(response.body.is_empty());
        assert_eq!(response.header("etag"), Some(etag.as_str()));
    }
    // A validator that does not match gets the full body.
    stream
        .write_all(get("/obj/0/1", &host, "If-None-Match: \"stale\"\r\n").as_bytes())
        .unwrap();
    let response = read_response(&mut stream, &mut buf, false).unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.body, full.body);
    assert_eq!(origin.stats().not_modified, 3);
}

#[test]
fn idle_persistent_connection_is_closed_after_the_keepalive_timeout() {
    let keepalive = Duration::from_millis(300);
    let spec = SiteSpec {
        keepalive_timeout: keepalive,
        ..site(1, 10_000, 0, 0)
    };
    let origin = start_origin(spec);
    let addr = origin.local_addr();
    let mut stream = connect(addr);
    let mut buf = Vec::new();
    stream
        .write_all(get("/page/0.html", "www.lab", "").as_bytes())
        .unwrap();
    assert_eq!(
        read_response(&mut stream, &mut buf, false).unwrap().status,
        200
    );
    let answered = Instant::now();
    assert!(reads_eof(&mut stream), "origin closes the idle connection");
    // The close must not come before the timeout (a lower bound: no flake under load).
    assert!(answered.elapsed() >= keepalive - Duration::from_millis(20));
    assert_eq!(origin.stats().closed_idle, 1);
}

#[test]
fn pipelined_requests_beyond_max_keepalive_requests_are_left_unanswered() {
    let spec = SiteSpec {
        max_keepalive_requests: 3,
        ..site(1, 10_000, 4, 0)
    };
    let origin = start_origin(spec);
    let addr = origin.local_addr();
    let mut stream = connect(addr);
    let mut buf = Vec::new();
    let pipeline: String = (0..5)
        .map(|j| get(&format!("/obj/0/{}", j % 4), "www.lab", ""))
        .collect();
    stream.write_all(pipeline.as_bytes()).unwrap();
    let mut answered = Vec::new();
    while let Some(response) = read_response(&mut stream, &mut buf, false) {
        answered.push(response);
    }
    assert_eq!(answered.len(), 3);
    assert_eq!(answered[1].header("keep-alive"), Some("timeout=15, max=1"));
    assert_eq!(answered[2].header("connection"), Some("close"));
    let stats = origin.stats();
    assert_eq!(stats.closed_max_requests, 1);
    assert_eq!(stats.max_requests_per_connection, 3);
    assert_eq!(stats.max_requests_in_one_read, 5, "one write, one read");
}

#[test]
fn http_1_0_closes_unless_it_asks_for_keep_alive() {
    let origin = start_origin(site(1, 10_000, 0, 0));
    let addr = origin.local_addr();

    let mut stream = connect(addr);
    let mut buf = Vec::new();
    stream
        .write_all(b"GET /page/0.html HTTP/1.0\r\nHost: www.lab\r\n\r\n")
        .unwrap();
    let response = read_response(&mut stream, &mut buf, false).unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.header("connection"), Some("close"));
    assert!(reads_eof(&mut stream));

    // HTTP/1.0 without Host: the first site, like Apache's default virtual host.
    let mut stream = connect(addr);
    let mut buf = Vec::new();
    let keep = b"GET /page/0.html HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
    stream.write_all(keep).unwrap();
    let first = read_response(&mut stream, &mut buf, false).unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(first.header("connection"), Some("keep-alive"));
    stream.write_all(keep).unwrap();
    assert_eq!(
        read_response(&mut stream, &mut buf, false).unwrap().status,
        200
    );
    assert_eq!(origin.stats().connections_accepted, 2);
}

#[test]
fn absolute_form_is_routed_by_its_authority() {
    let origin = start_origin(site(1, 10_000, 1, 1));
    let addr = origin.local_addr();
    let mut stream = connect(addr);
    let mut buf = Vec::new();
    let request = format!(
        "GET http://s1.lab:{}/obj/0/0 HTTP/1.1\r\nHost: ignored.lab\r\n\r\n",
        addr.port()
    );
    stream.write_all(request.as_bytes()).unwrap();
    assert_eq!(
        read_response(&mut stream, &mut buf, false).unwrap().status,
        200
    );
}

#[test]
fn bad_requests_get_400_and_a_close() {
    let origin = start_origin(site(1, 10_000, 0, 0));
    let addr = origin.local_addr();
    for bad in [
        &b"GET /page/0.html HTTP/1.1\r\n\r\n"[..], // HTTP/1.1 without Host
        b"\x16\x03\x01 hello\r\n\r\n",
        b"POST /page/0.html HTTP/1.1\r\nHost: www.lab\r\nContent-Length: 3\r\n\r\nabc",
    ] {
        let mut stream = connect(addr);
        let mut buf = Vec::new();
        stream.write_all(bad).unwrap();
        let response = read_response(&mut stream, &mut buf, false).unwrap();
        assert_eq!(response.status, 400, "{:?}", String::from_utf8_lossy(bad));
        assert!(reads_eof(&mut stream));
    }
    let mut stream = connect(addr);
    let mut buf = Vec::new();
    stream
        .write_all(b"DELETE /page/0.html HTTP/1.1\r\nHost: www.lab\r\n\r\n")
        .unwrap();
    assert_eq!(
        read_response(&mut stream, &mut buf, false).unwrap().status,
        405
    );

    // A head that does not end within the limit.
    let mut stream = connect(addr);
    let mut buf = Vec::new();
    let huge = format!(
        "GET /page/0.html HTTP/1.1\r\nHost: www.lab\r\nX-Filler: {}\r\n",
        "a".repeat(20_000)
    );
    stream.write_all(huge.as_bytes()).unwrap();
    assert_eq!(
        read_response(&mut stream, &mut buf, false).unwrap().status,
        431
    );
    assert!(reads_eof(&mut stream));
}

#[test]
fn invalid_site_is_refused_before_binding() {
    let spec = SiteSpec {
        object_hosts: 5,
        ..site(1, 10_000, 3, 2)
    };
    let err = midway_web::Origin::start("127.0.0.1:0".parse().unwrap(), spec).unwrap_err();
    assert!(err.to_string().contains("object_hosts"), "{err}");
}
