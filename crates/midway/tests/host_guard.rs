// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The guard `scripts/test` runs around the whole suite (`scripts/host-state`): a snapshot of the
//! host-wide settings before, a comparison after, failing and naming what changed. Tested here on
//! a network namespace of its own, which the script reads when run inside it, so the test changes
//! nothing on the host: the guard must pass when nothing changed, and fail naming each setting a
//! "test" left changed (a sysctl, an nftables table, a namespace left behind).

use std::path::Path;
use std::process::Output;

use midway_sys::command::Program;
use midway_sys::sysctl;
use midway_testkit::host::{is_root, on_path, repo_root, TempDir};
use midway_testkit::netns::Netns;

fn host_state(ns: &Netns, args: &[&str]) -> Output {
    let script = repo_root().join("scripts/host-state");
    ns.exec(script.to_str().unwrap(), args)
}

fn snapshot(ns: &Netns, file: &Path) {
    let out = host_state(ns, &[]);
    assert!(out.status.success(), "{out:?}");
    std::fs::write(file, &out.stdout).unwrap();
}

#[test]
fn the_host_guard_names_every_setting_left_changed() {
    if !is_root() || !on_path("nft") {
        eprintln!("skipped: needs root and nft");
        return;
    }
    let dir = TempDir::new("host-guard");
    let before = dir.0.join("before");
    let ns = Netns::new(format!("mwguard{}", std::process::id()));
    snapshot(&ns, &before);
    let text = std::fs::read_to_string(&before).unwrap();
    for key in [
        "sysctl net.ipv4.tcp_congestion_control = ",
        "sysctl net.ipv4.tcp_allowed_congestion_control = ",
        "sysctl net.ipv4.tcp_wmem = ",
        "sysctl net.core.rmem_max = ",
        "nft tables = ",
        "netns = ",
        "processes = ",
    ] {
        assert!(text.contains(key), "the snapshot lacks {key:?}:\n{text}");
    }

    // Nothing changed: the guard passes and says nothing.
    let unchanged = host_state(&ns, &["--compare", before.to_str().unwrap()]);
    assert!(unchanged.status.success(), "{unchanged:?}");
    assert!(unchanged.stderr.is_empty(), "{unchanged:?}");

    // What a careless test could leave behind: a default congestion control, a buffer limit, an
    // nftables table, a namespace.
    let out = ns.enter(|| sysctl::write("net.ipv4.tcp_congestion_control", "reno"));
    assert!(out.is_ok(), "{out:?}");
    let out = ns.enter(|| sysctl::write("net.ipv4.tcp_wmem", "4096 16384 65536"));
    assert!(out.is_ok(), "{out:?}");
    let out = Program::new("nft")
        .args(["add", "table", "inet", "midway_guard_test"])
        .in_named_namespace(ns.name())
        .run();
    assert!(out.is_ok(), "{out:?}");
    let leftover = Netns::new(format!("mwguard{}left", std::process::id()));

    let changed = host_state(&ns, &["--compare", before.to_str().unwrap()]);
    let report = String::from_utf8_lossy(&changed.stderr);
    assert_eq!(changed.status.code(), Some(1), "{report}");
    for named in [
        "sysctl net.ipv4.tcp_congestion_control changed",
        "sysctl net.ipv4.tcp_wmem changed",
        "nft tables changed",
        "netns changed",
    ] {
        assert!(report.contains(named), "{named:?} not reported:\n{report}");
    }
    assert!(report.contains("midway_guard_test"), "{report}");
    assert!(report.contains(leftover.name()), "{report}");
    // Only what changed is named.
    assert!(!report.contains("tcp_rmem"), "{report}");
}
