//! The guard `scripts/test` runs around the whole suite (`scripts/host-state`): a snapshot of the
//! host-wide settings before, a comparison after, failing and naming what changed. Tested here on
//! a network namespace of its own, which the script reads when run inside it, so the test changes
//! nothing on the host: the guard must pass when nothing changed, and fail naming each setting a
//! "test" left changed (a sysctl, an nftables table, a namespace left behind).

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::{is_root, on_path, repo_root, TempDir};

/// A network namespace deleted on drop, even when the test fails.
struct Netns(String);

impl Netns {
    fn new(name: String) -> Netns {
        ip(&["netns", "add", &name]);
        Netns(name)
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.0, program])
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(out.status.success(), "ip {args:?}: {out:?}");
}

fn host_state(ns: &Netns, args: &[&str]) -> Output {
    let script = repo_root().join("scripts/host-state");
    ns.run(script.to_str().unwrap(), args)
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
    let out = ns.run("sysctl", &["-qw", "net.ipv4.tcp_congestion_control=reno"]);
    assert!(out.status.success(), "{out:?}");
    let out = ns.run("sysctl", &["-qw", "net.ipv4.tcp_wmem=4096 16384 65536"]);
    assert!(out.status.success(), "{out:?}");
    let out = ns.run("nft", &["add", "table", "inet", "midway_guard_test"]);
    assert!(out.status.success(), "{out:?}");
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
    assert!(report.contains(&leftover.0), "{report}");
    // Only what changed is named.
    assert!(!report.contains("tcp_rmem"), "{report}");
}
