//! A reload that adds an HTTP listener but is refused registers nothing: after a refused reload
//! and a good one adding the same listener, `/metrics` shows that listener's HTTP series once
//! (before, the refused reload had already registered the new engine, so the good one served
//! every series twice).

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use midway_proxy::{parse_config, Proxy, ProxyError};
use midway_testkit::metrics::scrape;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// Listener `web` (HTTP) always; `new_listener` adds the HTTP listener `added`, listed first so
/// that it is built before `web`; `web_pipelined` is web's `max_pipelined` (changing it is
/// refused by a reload).
fn config(spool: &str, new_listener: bool, web_pipelined: u32) -> String {
    let added = if new_listener {
        "[[listeners]]\nname = \"added\"\nmode = \"http\"\nlisten = \"127.0.0.1:0\"\n"
    } else {
        ""
    };
    format!(
        r#"
[proxy]
allowed_clients = ["127.0.0.1/32"]
shutdown_grace = "1s"
[metrics]
listen = "127.0.0.1:0"
[spool]
dir = "{spool}"
{added}
[[listeners]]
name = "web"
mode = "http"
listen = "127.0.0.1:0"
[listeners.http]
max_pipelined = {web_pipelined}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reload_leaves_no_http_metrics_behind() {
    let spool = tempfile::tempdir().unwrap();
    let spool = spool.path().to_str().unwrap().to_string();
    let parse = |text: String| parse_config(&text, "<test>").unwrap_or_else(|e| panic!("{e}"));
    let mut registry = Registry::default();
    let proxy = Proxy::bind(parse(config(&spool, false, 4)), &mut registry)
        .await
        .unwrap();
    let metrics = proxy.metrics_addr().unwrap();
    let handle = proxy.handle();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(proxy.run(shutdown.clone()));

    // `added` is built, then `web`'s changed http settings refuse the whole reload.
    let refused = handle.reload(parse(config(&spool, true, 8))).await;
    assert!(
        matches!(refused, Err(ProxyError::ReloadRefused { .. })),
        "{refused:?}"
    );
    handle.reload(parse(config(&spool, true, 4))).await.unwrap();

    let text = scrape(metrics).await;
    let series = |listener: &str| {
        text.lines()
            .filter(|l| {
                l.starts_with(&format!(
                    "midway_http_tunnels_total{{listener=\"{listener}\"}}"
                ))
            })
            .count()
    };
    assert_eq!(series("added"), 1, "{text}");
    assert_eq!(series("web"), 1, "{text}");

    shutdown.cancel();
    task.await.unwrap().unwrap();
}
