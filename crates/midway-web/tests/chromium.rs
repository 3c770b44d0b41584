// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Headless Chromium loading the origin's pages on loopback, directly and through a proxy.
//! Skipped (with a message) when /usr/bin/chromium is not installed; scripts/install-deps
//! installs it, so CI runs these.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use midway_testkit::web::*;
use midway_web::{chromium_command, parse_chromium_output, BrowserSpec, CHROMIUM_PATH};

fn chromium_missing() -> bool {
    if Path::new(CHROMIUM_PATH).exists() {
        return false;
    }
    eprintln!("SKIPPED: {CHROMIUM_PATH} is not installed (Debian package `chromium`)");
    true
}

/// Runs the browser to completion (killing it after a bound) and returns its stdout.
fn run_browser(spec: &BrowserSpec) -> String {
    let mut command = chromium_command(spec);
    command.stderr(Stdio::null());
    let mut child: Child = command.spawn().expect("chromium starts");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stdout.read_to_string(&mut text).map(|_| text)
    });
    let deadline = Instant::now() + spec.timeout + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            // The browser leads its own process group: end it with all its helpers.
            let group = format!("-{}", child.id());
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &group])
                .status();
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("chromium did not exit in time");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    reader.join().unwrap().expect("chromium's stdout is text")
}

#[test]
fn chromium_loads_a_page_directly_and_reports_its_load_time() {
    if chromium_missing() {
        return;
    }
    let spec = site(1, 65_000, 19, 2);
    let origin = start_origin(spec.clone());
    let port = origin.local_addr().port();
    let profile = tempfile::tempdir().unwrap();
    let browser = BrowserSpec {
        url: format!("http://www.lab:{port}/page/0.html"),
        proxy: None,
        resolve: resolve_all(&spec),
        user_data_dir: profile.path().to_path_buf(),
        timeout: Duration::from_secs(60),
    };
    let output = run_browser(&browser);
    let seconds = parse_chromium_output(&output).unwrap_or_else(|e| panic!("{e}: {output}"));
    assert!(seconds > 0.0 && seconds < 60.0, "{seconds}");
    let stats = origin.stats();
    // Every body of the page was served once; the only 404 may be /favicon.ico.
    assert_eq!(stats.body_bytes_sent, 65_000);
    assert!(stats.not_found <= 1);
    assert!(stats.requests_served >= 20);
}

#[test]
fn chromium_loads_a_page_through_a_proxy() {
    if chromium_missing() {
        return;
    }
    let spec = site(1, 65_000, 7, 1);
    let origin = start_origin(spec.clone());
    let port = origin.local_addr().port();
    let proxy = RelayProxy::start(origin.local_addr());
    let profile = tempfile::tempdir().unwrap();
    let browser = BrowserSpec {
        url: format!("http://www.lab:{port}/page/0.html"),
        proxy: Some(proxy.addr),
        resolve: Default::default(),
        user_data_dir: profile.path().to_path_buf(),
        timeout: Duration::from_secs(60),
    };
    let output = run_browser(&browser);
    let seconds = parse_chromium_output(&output).unwrap_or_else(|e| panic!("{e}: {output}"));
    assert!(seconds > 0.0 && seconds < 60.0, "{seconds}");
    assert!(proxy.accepted.load(Ordering::Relaxed) >= 1);
    let sent: String = proxy.sent_text().concat();
    assert!(
        sent.contains(&format!(
            "GET http://www.lab:{port}/page/0.html HTTP/1.1\r\n"
        )),
        "{sent}"
    );
    assert_eq!(origin.stats().body_bytes_sent, 65_000);
}

#[test]
fn chromium_reports_no_time_when_the_page_cannot_load() {
    if chromium_missing() {
        return;
    }
    // A server that accepts and never answers: --timeout stops the load, the load event never
    // runs the timing script, and the output says so.
    let (addr, server) = bad_server(|stream| {
        let mut byte = [0u8; 1];
        let _ = stream.read(&mut byte);
    });
    let profile = tempfile::tempdir().unwrap();
    let spec = site(1, 10_000, 0, 0);
    let browser = BrowserSpec {
        url: format!("http://www.lab:{}/page/0.html", addr.port()),
        proxy: None,
        resolve: resolve_all(&spec),
        user_data_dir: profile.path().to_path_buf(),
        timeout: Duration::from_secs(2),
    };
    let output = run_browser(&browser);
    assert!(parse_chromium_output(&output).is_err(), "{output}");
    server.join().unwrap();
}
