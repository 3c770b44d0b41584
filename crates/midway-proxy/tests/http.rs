//! `mode = "http"` on loopback with the real curl: a cacheable page fetched twice through the
//! proxy reaches the origin once (the second answer is a cache hit), a client outside
//! `allowed_clients` is refused before any HTTP, CONNECT tunnels work, and origins in
//! `denied_destinations` get 403 for GET and CONNECT alike.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Output;

use midway_testkit::metrics::*;
use midway_testkit::net::*;
use midway_testkit::proxy::*;
use midway_testkit::wait::*;

const PAGE_BODY: &str = "midway http mode test page\n";

/// An origin server on loopback: answers every request on a keep-alive connection with a page
/// that may be cached for a minute, and counts the requests it saw.
fn origin() -> PageOrigin {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Cache-Control: public, max-age=60\r\nETag: \"v1\"\r\n\r\n{PAGE_BODY}",
        PAGE_BODY.len()
    );
    PageOrigin::serve(listener, response, WAIT * 4)
}

fn config(allowed: &str) -> String {
    format!(
        r#"
[proxy]
allowed_clients = ["{allowed}"]
# The test origins live on loopback, which the default denied_destinations refuses.
denied_destinations = []
connect_timeout = "2s"
shutdown_grace = "1s"
[metrics]
listen = "127.0.0.1:0"
[spool]
dir = "SPOOL_DIR"
[[listeners]]
name = "web"
mode = "http"
listen = "127.0.0.1:0"
[listeners.http]
max_pipelined = 4
upstream_idle_keep = "30s"
"#
    )
}

/// Runs curl with `args` (proxy variables from the environment removed, so only `-x` counts).
async fn curl(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["--silent", "--show-error", "--max-time", "20"])
            .args(&args)
            .env_remove("http_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("https_proxy")
            .env_remove("HTTPS_PROXY")
            .env_remove("all_proxy")
            .env_remove("ALL_PROXY")
            .env_remove("no_proxy")
            .env_remove("NO_PROXY")
            .output()
            .expect("curl is installed")
    })
    .await
    .unwrap()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn metric_now(metrics: SocketAddr, series: &str) -> Option<f64> {
    metric(&scrape(metrics).await, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_through_http_listener_second_fetch_is_a_cache_hit() {
    let origin = origin();
    let origin_addr = origin.addr;
    let proxy = start(&config("127.0.0.1/32")).await;
    let proxy_url = format!("http://{}", proxy.addr("web"));
    let page = format!("http://{origin_addr}/page");
    let metrics = proxy.metrics.unwrap();

    // Two separate curl runs: two client connections, the second answered from the cache.
    for round in 1..=2 {
        let out = curl(vec![
            "--include".into(),
            "-x".into(),
            proxy_url.clone(),
            page.clone(),
        ])
        .await;
        let body = text(&out);
        assert!(out.status.success(), "round {round}: {out:?}");
        assert!(body.starts_with("HTTP/1.1 200"), "round {round}: {body}");
        assert!(body.ends_with(PAGE_BODY), "round {round}: {body}");
        // The proxy says it handled the response.
        assert!(
            body.to_ascii_lowercase().contains("via: 1.1 midway"),
            "round {round}: {body}"
        );
    }
    assert_eq!(
        origin.requests(),
        1,
        "the second fetch must not reach the origin"
    );
    assert_eq!(
        metric_now(metrics, "midway_http_cache_hits_total{listener=\"web\"}").await,
        Some(1.0)
    );
    assert_eq!(
        metric_now(metrics, "midway_http_cache_misses_total{listener=\"web\"}").await,
        Some(1.0)
    );
    assert_eq!(
        metric_now(metrics, "midway_http_requests_total{listener=\"web\"}").await,
        Some(2.0)
    );
    // The ordinary per-listener accounting covers HTTP listeners as well.
    let accepted = "midway_connections_accepted_total{listener=\"web\"}";
    let active = "midway_connections_active{listener=\"web\"}";
    assert!(
        eventually_async(WAIT, || async {
            let t = scrape(metrics).await;
            metric(&t, accepted) == Some(2.0) && metric(&t, active) == Some(0.0)
        })
        .await,
        "{}",
        scrape(metrics).await
    );

    // Both directions of an HTTP connection are counted: the two requests (curl's GET heads are
    // well over 50 bytes each) and the two responses.
    let text = scrape(metrics).await;
    let up = metric(
        &text,
        "midway_bytes_total{listener=\"web\",direction=\"client_to_server\"}",
    );
    let down = metric(
        &text,
        "midway_bytes_total{listener=\"web\",direction=\"server_to_client\"}",
    );
    assert!(up.is_some_and(|b| b > 100.0), "{text}");
    assert!(
        down.is_some_and(|b| b > 2.0 * PAGE_BODY.len() as f64),
        "{text}"
    );

    let summary = proxy.stop().await;
    assert_eq!(summary.connections_served, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_outside_allowed_clients_is_refused() {
    let origin = origin();
    let origin_addr = origin.addr;
    // Only 127.0.0.1 may use the proxy; curl connects from 127.0.0.2 (also loopback).
    let proxy = start(&config("127.0.0.1/32")).await;
    let metrics = proxy.metrics.unwrap();
    let out = curl(vec![
        "--interface".into(),
        "127.0.0.2".into(),
        "-x".into(),
        format!("http://{}", proxy.addr("web")),
        format!("http://{origin_addr}/page"),
    ])
    .await;
    assert!(
        !out.status.success(),
        "refused client got an answer: {out:?}"
    );
    assert_eq!(text(&out), "", "no HTTP answer at all for a refused client");
    assert_eq!(origin.requests(), 0);
    assert_eq!(
        metric_now(
            metrics,
            "midway_connections_refused_total{listener=\"web\",reason=\"not_allowed\"}"
        )
        .await,
        Some(1.0)
    );
    assert_eq!(
        metric_now(metrics, "midway_http_requests_total{listener=\"web\"}").await,
        Some(0.0)
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tunnel_works() {
    let origin = origin();
    let origin_addr = origin.addr;
    let proxy = start(&config("127.0.0.0/8")).await;
    let metrics = proxy.metrics.unwrap();
    // --proxytunnel: curl sends CONNECT origin, then its GET through the tunnel; the proxy
    // only moves bytes, so both fetches reach the origin (no caching inside a tunnel).
    for _ in 0..2 {
        let out = curl(vec![
            "--proxytunnel".into(),
            "-x".into(),
            format!("http://{}", proxy.addr("web")),
            format!("http://{origin_addr}/page"),
        ])
        .await;
        assert!(out.status.success(), "{out:?}");
        assert_eq!(text(&out), PAGE_BODY);
    }
    assert_eq!(origin.requests(), 2);
    assert_eq!(
        metric_now(metrics, "midway_http_tunnels_total{listener=\"web\"}").await,
        Some(2.0)
    );
    assert_eq!(
        metric_now(metrics, "midway_http_cache_hits_total{listener=\"web\"}").await,
        Some(0.0)
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_origin_is_forbidden_by_default() {
    let origin = origin();
    let origin_addr = origin.addr;
    let config = config("127.0.0.0/8").replace("denied_destinations = []\n", "");
    let proxy = start(&config).await;
    let proxy_url = format!("http://{}", proxy.addr("web"));
    let out = curl(vec![
        "--include".into(),
        "-x".into(),
        proxy_url.clone(),
        format!("http://{origin_addr}/page"),
    ])
    .await;
    assert!(
        text(&out).starts_with("HTTP/1.1 403"),
        "GET to a loopback origin: {out:?}"
    );
    // CONNECT: curl reports the proxy's refusal as a failed tunnel (exit code 56).
    let out = curl(vec![
        "--proxytunnel".into(),
        "-x".into(),
        proxy_url,
        format!("http://localhost:{}/page", origin_addr.port()),
    ])
    .await;
    assert!(!out.status.success(), "CONNECT to loopback: {out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("403"),
        "CONNECT to loopback: {out:?}"
    );
    assert_eq!(origin.requests(), 0);
    proxy.stop().await;
}
