//! The runner on real namespaces (root only; skipped with a message otherwise): a small
//! scenario with the `direct` and `haproxy` cases, run through the library as the CLI does.
//! The `midway` case needs the built binary and is covered by crates/midway/tests/lab_run.rs.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use midway_lab::{run, PlanOptions, RunOptions};
use midway_testkit::host::is_root;
use midway_testkit::netns::namespaces_of_pid;

const SCENARIO: &str = r#"
name = "runner-test"
description = "two links, small transfers"
source = "test"
seed = 7
[hosts.client]
[hosts.proxy]
[hosts.server]
[roles]
client = "client"
proxy = "proxy"
server = "server"
[links.access]
a = "client"
b = "proxy"
[links.access.a_to_b]
delay = "2ms"
rate = "10Mbit"
[links.access.b_to_a]
delay = "2ms"
rate = "20Mbit"
queue = "30KB"
[links.internet]
a = "proxy"
b = "server"
[links.internet.a_to_b]
delay = "5ms"
[links.internet.b_to_a]
delay = "5ms"
[workload]
kind = "bulk"
bytes = "200KB"
timeout = "60s"
[cases.direct]
kind = "direct"
[cases.haproxy]
kind = "haproxy"
[cases.haproxy-tuned]
kind = "haproxy"
route_tuning = { initcwnd = 20, quickack = true, rto_min = "20ms", congctl = "reno" }
[[experiments]]
name = "loss"
cases = ["direct", "haproxy", "haproxy-tuned"]
[experiments.sweep]
param = "links.access.b_to_a.data_loss"
label = "loss"
values = [{ bernoulli = 0.0 }, { bernoulli = 0.02 }]
"#;

/// The options `midway lab run SCENARIO --out OUT --jobs JOBS [--resume]` gives the library.
fn options(
    scenario: std::path::PathBuf,
    out: std::path::PathBuf,
    jobs: usize,
    resume: bool,
) -> RunOptions {
    RunOptions {
        scenario,
        out: Some(out),
        plan: PlanOptions::default(),
        jobs,
        resume,
        keep_point_dirs: false,
        progress: false,
        allow_dirty: false,
    }
}

/// Tests of this file run one at a time: each checks that no namespace of this process is left,
/// which another test's live topology would break.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn direct_and_haproxy_points_run_and_leave_nothing_behind() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("runner-test.toml");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let out = dir.path().join("out");
    let summary = run(&options(scenario.clone(), out.clone(), 3, false)).unwrap();
    assert_eq!(summary.records, 6);
    for record in &summary.records_written {
        eprintln!(
            "{} loss={} {:.2} Mbit/s retransmits {:?} extra {:?}",
            record.case,
            record.params["loss"],
            record.throughput_bps / 1e6,
            record.retransmits,
            record.extra
        );
        assert!(record.ok, "{} failed: {:?}", record.case, record.error);
        assert_eq!(record.bytes, 200_000);
        assert!(record.seconds > 0.0);
        assert!(record.retransmits.contains_key("client"));
        assert!(record.retransmits.contains_key("server"));
    }
    // Lossy points lost frames on the emulated downstream direction.
    let lossy_drops: f64 = summary
        .records_written
        .iter()
        .filter(|r| r.params["loss"] == serde_json::json!(0.02))
        .map(|r| r.extra["access.b_to_a.drops"])
        .sum();
    assert!(lossy_drops > 0.0);
    assert!(out.join("results.jsonl").exists());
    assert!(out.join("report.md").exists());
    let left = namespaces_of_pid(std::process::id());
    assert!(left.is_empty(), "namespaces left behind: {left:?}");

    // Every record says how the machine was loaded: the run's --jobs.
    assert!(summary
        .records_written
        .iter()
        .all(|r| r.load.as_ref().is_some_and(|l| l.jobs == 3)));
    // Resuming with another --jobs would mix load policies in one report: refused.
    let resume = |jobs: usize| run(&options(scenario.clone(), out.clone(), jobs, true));
    let refused = resume(2).expect_err("another --jobs");
    assert!(
        refused.to_string().contains("--jobs 2 (")
            && refused.to_string().contains("--jobs 3 (6 records)"),
        "{refused:#}"
    );
    // Resume: nothing left to do, nothing appended.
    let again = resume(3).unwrap();
    assert_eq!((again.records, again.skipped), (0, 6));
    let lines = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 6);
}

/// An experiment with a limit of its own (`max_jobs = 1`) runs between unlimited ones without
/// holding the run up, and each of its records says the limit it ran under.
#[test]
fn an_experiment_with_its_own_limit_runs_and_records_it() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("runner-limit-test.toml");
    let limited = "\n[[experiments]]\nname = \"alone\"\ncases = [\"direct\"]\nrepetitions = 2\nmax_jobs = 1\n";
    std::fs::write(&scenario, format!("{SCENARIO}{limited}")).unwrap();
    let out = dir.path().join("out");
    let summary = run(&options(scenario.clone(), out.clone(), 3, false)).unwrap();
    assert_eq!(summary.records, 8);
    for record in &summary.records_written {
        assert!(record.ok, "{} failed: {:?}", record.case, record.error);
        let load = record.load.as_ref().unwrap();
        assert_eq!(load.jobs, 3);
        let expected = (record.experiment == "alone").then_some(1);
        assert_eq!(load.max_jobs, expected, "{}", record.experiment);
    }
    let left = namespaces_of_pid(std::process::id());
    assert!(left.is_empty(), "namespaces left behind: {left:?}");

    // The scenario's limit changed since: resuming with the same --jobs would still mix two
    // limits in one experiment, and is refused before anything runs.
    std::fs::write(
        &scenario,
        format!("{SCENARIO}{}", limited.replace("= 1", "= 2")),
    )
    .unwrap();
    let refused = run(&options(scenario, out.clone(), 3, true)).expect_err("another max_jobs");
    let message = refused.to_string();
    assert!(
        message.contains("`alone` at most 1 at once (2 records)")
            && message.contains("`alone` at most 2 at once"),
        "{refused:#}"
    );
    let lines = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 8);
}

const COMMAND_SCENARIO: &str = r#"
name = "command-test"
description = "iperf3 as an external workload"
source = "test"
[hosts.client]
[hosts.proxy]
[hosts.server]
[roles]
client = "client"
proxy = "proxy"
server = "server"
[links.access]
a = "client"
b = "proxy"
[links.access.b_to_a]
delay = "2ms"
rate = "20Mbit"
[links.internet]
a = "proxy"
b = "server"
[workload]
kind = "command"
bytes = "500KB"
port = 5201
timeout = "60s"
[workload.server]
host = "server"
argv = ["iperf3", "--server", "--one-off", "--port", "{port}"]
listen_port = 5201
[workload.client]
host = "client"
argv = ["sh", "-c", "iperf3 --client {target} --port {target_port} --bytes {bytes} --reverse >/dev/null && echo MIDWAY_METRIC done 1"]
[cases.direct]
kind = "direct"
[cases.haproxy]
kind = "haproxy"
[[experiments]]
name = "main"
cases = ["direct", "haproxy"]
"#;

#[test]
fn a_command_workload_runs_in_its_hosts_and_reports_its_metric_lines() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    if std::process::Command::new("iperf3")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: iperf3 is not installed");
        return;
    }
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("command-test.toml");
    std::fs::write(&scenario, COMMAND_SCENARIO).unwrap();
    let summary = run(&options(scenario, dir.path().join("out"), 2, false)).unwrap();
    assert_eq!(summary.records, 2);
    for record in &summary.records_written {
        assert!(record.ok, "{} failed: {:?}", record.case, record.error);
        assert_eq!(record.extra.get("done"), Some(&1.0), "{:?}", record.extra);
        assert!(record.seconds > 0.0);
    }
    let left = namespaces_of_pid(std::process::id());
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

const WEB_SCENARIO: &str = r#"
name = "web-test"
description = "page loads through the library runner"
source = "test"
[hosts.client]
[hosts.proxy]
[hosts.server]
[roles]
client = "client"
proxy = "proxy"
server = "server"
[links.access]
a = "client"
b = "proxy"
[links.access.b_to_a]
delay = "2ms"
rate = "20Mbit"
[links.internet]
a = "proxy"
b = "server"
[workload]
kind = "web"
hosts = ["www.lab", "s1.lab", "s2.lab"]
object_hosts = 2
pages = 2
page_bytes = "30KB"
objects = 6
http = "1.0"
timeout = "30s"
[cases.direct]
kind = "direct"
[cases.haproxy]
kind = "haproxy"
[cases.squid]
kind = "squid"
cache = false
upstream_persistence = "long"
[[experiments]]
name = "web"
cases = ["direct", "haproxy", "squid"]
"#;

#[test]
fn web_pages_load_direct_through_a_forward_proxy_and_through_squid() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let with_squid = std::path::Path::new("/usr/sbin/squid").exists();
    let dir = tempfile::tempdir().unwrap();
    // Squid drops to its own user, which must be able to enter the output folder.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let scenario = dir.path().join("web-test.toml");
    let text = if with_squid {
        WEB_SCENARIO.to_string()
    } else {
        eprintln!("note: squid is not installed; its case is not run");
        WEB_SCENARIO.replace(
            "cases = [\"direct\", \"haproxy\", \"squid\"]",
            "cases = [\"direct\", \"haproxy\"]",
        )
    };
    std::fs::write(&scenario, text).unwrap();
    let summary = run(&options(scenario, dir.path().join("out"), 3, false)).unwrap();
    assert_eq!(summary.records, if with_squid { 3 } else { 2 });
    for record in &summary.records_written {
        assert!(record.ok, "{} failed: {:?}", record.case, record.error);
        assert_eq!(record.bytes, 60_000, "two pages");
        let extra = |key: &str| record.extra[key];
        assert_eq!(extra("pages"), 2.0);
        assert_eq!(extra("objects"), 12.0);
        // HTTP/1.0: one connection per request, 7 requests per page, all reaching the origin.
        assert_eq!(extra("connections_opened"), 14.0, "{}", record.case);
        assert_eq!(extra("origin_requests"), 14.0, "{}", record.case);
        assert!(extra("page_load_max_seconds") >= extra("page_load_seconds"));
        assert!((record.seconds - 2.0 * extra("page_load_seconds")).abs() < 1e-9);
    }
    if with_squid {
        let squid = summary
            .records_written
            .iter()
            .find(|r| r.case == "squid")
            .unwrap();
        assert_eq!(squid.extra["proxy_requests"], 14.0);
        assert_eq!(squid.extra["cache_hits"], 0.0, "cache = false");
    }
    let left = namespaces_of_pid(std::process::id());
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}
