// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The loader and Chromium through the real midway HTTP proxy (`midway proxy`, listener mode
//! "http") on loopback. Ignored by default because it needs a built midway binary from another
//! package: `cargo build --release -p midway && cargo test -p midway-web --test midway_proxy --
//! --ignored` (or set MIDWAY_BIN). Page hosts are loopback names midway resolves itself.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use midway_testkit::host::{listening_addr, midway_binary, spawn_midway, Place, Running};
use midway_testkit::web::*;
use midway_web::{
    chromium_command, load_pages, parse_chromium_output, BrowserSpec, CacheMode, HttpMode,
    SiteSpec, CHROMIUM_PATH,
};

/// Starts `midway proxy` with one http listener on a kernel-chosen loopback port, allowed to
/// reach loopback origins (denied by default).
fn start_midway(dir: &std::path::Path) -> (Running, SocketAddr) {
    let binary = midway_binary();
    assert!(
        binary.exists(),
        "{} missing: build it with `cargo build --release -p midway` or set MIDWAY_BIN",
        binary.display()
    );
    let config = dir.join("midway.toml");
    std::fs::write(
        &config,
        "[proxy]\nallowed_clients = [\"127.0.0.0/8\", \"::1/128\"]\n\
         denied_destinations = [\"169.254.0.0/16\"]\n\n\
         [[listeners]]\nname = \"web\"\nmode = \"http\"\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    // Stopped when the test ends, even on failure; its log is not needed.
    let (mut midway, _log) = spawn_midway(binary, Place::Here, &config, &[]);
    let addr = listening_addr(&mut midway, STEP);
    (midway, addr)
}

fn loopback_site() -> SiteSpec {
    SiteSpec {
        hosts: vec!["localhost".into(), "127.0.0.1".into()],
        ..site(2, 65_000, 19, 1)
    }
}

#[test]
#[ignore = "needs target/release/midway; run with --ignored"]
fn loader_through_midway_in_every_mode_and_from_its_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (_midway, proxy) = start_midway(dir.path());
    let spec = loopback_site();
    let origin = start_origin(spec.clone());
    let mut load = load_spec(spec, origin.local_addr().port(), HttpMode::Http10, 6);
    load.proxy = Some(proxy);
    load.cache = CacheMode::ForceMiss;

    let result = load_pages(&load).unwrap();
    assert_eq!(result.connections_opened, 2 * 20);
    assert_eq!(result.bytes, 2 * 65_000);

    load.mode = HttpMode::KeepAlive;
    let result = load_pages(&load).unwrap();
    assert!(
        result.connections_opened <= 6,
        "{}",
        result.connections_opened
    );

    load.mode = HttpMode::Pipelining;
    load.max_connections_per_host = 1;
    let result = load_pages(&load).unwrap();
    assert_eq!(result.connections_opened, 1);
    assert_eq!(result.bytes, 2 * 65_000);

    // Once a plain load has filled midway's cache (max-age=3600), the next one is answered
    // from it: the origin sees no request.
    load.cache = CacheMode::Plain;
    load_pages(&load).unwrap();
    let before = origin.stats().requests_served;
    let result = load_pages(&load).unwrap();
    assert_eq!(result.bytes, 2 * 65_000);
    assert_eq!(
        origin.stats().requests_served,
        before,
        "all from midway's cache"
    );

    // A forced miss goes to the origin again (or at least revalidates there).
    load.cache = CacheMode::ForceMiss;
    load_pages(&load).unwrap();
    assert!(origin.stats().requests_served > before);

    load.cache = CacheMode::WarmHit;
    let result = load_pages(&load).unwrap();
    assert_eq!(result.pages.len(), 2);
}

#[test]
#[ignore = "needs target/release/midway; run with --ignored"]
fn chromium_through_midway() {
    assert!(
        std::path::Path::new(CHROMIUM_PATH).exists(),
        "{CHROMIUM_PATH} missing"
    );
    let dir = tempfile::tempdir().unwrap();
    let (_midway, proxy) = start_midway(dir.path());
    let spec = loopback_site();
    let origin = start_origin(spec);
    let browser = BrowserSpec {
        url: format!(
            "http://localhost:{}/page/0.html",
            origin.local_addr().port()
        ),
        proxy: Some(proxy),
        resolve: Default::default(),
        user_data_dir: dir.path().join("profile"),
        timeout: Duration::from_secs(60),
    };
    let output = chromium_command(&browser)
        .stderr(Stdio::null())
        .output()
        .expect("chromium runs");
    let output = String::from_utf8_lossy(&output.stdout);
    let seconds = parse_chromium_output(&output).unwrap_or_else(|e| panic!("{e}: {output}"));
    assert!(seconds > 0.0 && seconds < 60.0);
    assert_eq!(origin.stats().body_bytes_sent, 65_000);
}
