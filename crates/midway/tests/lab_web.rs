// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! End to end: a tiny web scenario with the real binary as the lab runner and as the proxy, through
//! every web case (direct, midway-tcp, midway-http, Squid) and, when `/usr/bin/chromium` exists,
//! one Chromium load. Checks that the proxy cases really carried the requests (their own counters:
//! midway's metrics, Squid's access log) and that a warm cache answers. Needs root (network
//! namespaces) and Squid; skipped with a message otherwise.

use std::path::Path;
use std::process::Command;

use midway_report::RunRecord;
use midway_testkit::host::{is_root, on_path, output_and_pid, TempDir};
use midway_testkit::netns::{entries_of_pid, namespaces_of_pid};

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");

/// One page of 1 base document + 4 objects on a second host name, over a fast short path.
const SCENARIO: &str = r#"
name = "lab-web-test"
description = "tiny web workload through every web case"
source = "test"
seed = 3
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
delay = "5ms"
rate = "20Mbit"
[links.access.b_to_a]
delay = "5ms"
rate = "20Mbit"
[links.internet]
a = "proxy"
b = "server"
[links.internet.a_to_b]
delay = "10ms"
[links.internet.b_to_a]
delay = "10ms"
[workload]
kind = "web"
hosts = ["www.lab", "s1.lab"]
page_bytes = "20KB"
objects = 4
timeout = "30s"
[cases.direct]
kind = "direct"
[cases.midway-tcp]
kind = "midway"
intercept = "transparent"
[cases.midway-http]
kind = "midway"
intercept = "http"
[cases.squid]
kind = "squid"
[[experiments]]
name = "plain"
cases = ["direct", "midway-tcp", "midway-http", "squid"]
[[experiments]]
name = "hit"
cases = ["midway-http", "squid"]
set = { "workload.cache" = "hit", "workload.http" = "pipelining" }
[[experiments]]
name = "chromium"
cases = ["direct", "squid"]
set = { "workload.client" = "chromium" }
"#;

/// Requests of one page load: the base document and its objects.
const PAGE_REQUESTS: f64 = 5.0;

fn extra(record: &RunRecord, key: &str) -> f64 {
    *record.extra.get(key).unwrap_or_else(|| {
        panic!(
            "{}/{}: no `{key}` in {:?}",
            record.experiment, record.case, record.extra
        )
    })
}

fn find<'a>(records: &'a [RunRecord], experiment: &str, case: &str) -> &'a RunRecord {
    records
        .iter()
        .find(|r| r.experiment == experiment && r.case == case)
        .unwrap_or_else(|| panic!("no record for {experiment}/{case}"))
}

fn run_lab(scenario: &Path, out_dir: &Path, experiments: &[&str]) -> Vec<RunRecord> {
    let mut command = Command::new(MIDWAY);
    command
        .args(["lab", "run"])
        .arg(scenario)
        .arg("--out")
        .arg(out_dir);
    for experiment in experiments {
        command.args(["--experiment", experiment]);
    }
    let (pid, output) = output_and_pid(&mut command);
    let left = namespaces_of_pid(pid);
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
    // Squid's shared memory is named after the topology (`squid -n mwlab<tag>`), and removed.
    let segments = entries_of_pid(Path::new("/dev/shm"), "mwlab", pid, b"-");
    assert!(
        segments.is_empty(),
        "Squid segments left behind: {segments:?}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let records =
        midway_report::read_records(&out_dir.join(midway_report::RESULTS_FILE)).unwrap_or_default();
    let errors: Vec<String> = records
        .iter()
        .filter(|r| !r.ok)
        .map(|r| format!("{}/{}: {:?}", r.experiment, r.case, r.error))
        .collect();
    assert!(
        output.status.success() && errors.is_empty(),
        "failed points: {errors:#?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    records
}

#[test]
fn a_page_loads_through_every_web_case_and_the_proxies_carry_it() {
    if !is_root() {
        eprintln!("skipped: `midway lab run` needs root");
        return;
    }
    if !on_path("squid") {
        eprintln!("skipped: squid is not installed (scripts/install-deps)");
        return;
    }
    let dir = TempDir::new("lab-web");
    let scenario = dir.0.join("lab-web-test.toml");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let with_chromium = Path::new("/usr/bin/chromium").exists();
    let mut experiments = vec!["plain", "hit"];
    if with_chromium {
        experiments.push("chromium");
    } else {
        eprintln!("note: /usr/bin/chromium is missing; the Chromium load is not tested");
    }
    let records = run_lab(&scenario, &dir.0.join("run"), &experiments);
    assert_eq!(records.len(), 6 + if with_chromium { 2 } else { 0 });

    for record in &records {
        assert!(extra(record, "page_load_seconds") > 0.0, "{record:?}");
        assert_eq!(
            record.bytes, 20_000,
            "{}/{}",
            record.experiment, record.case
        );
        assert!(record.throughput_bps > 0.0);
    }
    for record in records.iter().filter(|r| r.experiment != "chromium") {
        // The loader fetched the page's base document and every object.
        assert_eq!(extra(record, "objects"), 4.0, "{record:?}");
        assert!(extra(record, "connections_opened") >= 1.0);
    }

    // Without a proxy every request reaches the origin; midway-tcp's split carried the
    // connections (the runner fails a transparent point whose midway accepted none, and reads
    // midway's per-segment counters).
    let direct = find(&records, "plain", "direct");
    assert_eq!(extra(direct, "origin_requests"), PAGE_REQUESTS);
    assert!(!direct.extra.contains_key("proxy_requests"));
    let split = find(&records, "plain", "midway-tcp");
    assert!(split.retransmits.contains_key("proxy-local"), "{split:?}");
    assert_eq!(extra(split, "origin_requests"), PAGE_REQUESTS);

    // The explicit proxies saw every request (midway's metrics, Squid's access log), and with
    // the default plain load nothing came from a cache.
    for case in ["midway-http", "squid"] {
        let record = find(&records, "plain", case);
        assert!(
            extra(record, "proxy_requests") >= PAGE_REQUESTS,
            "{case}: {record:?}"
        );
        assert_eq!(extra(record, "cache_hits"), 0.0, "{case}");
    }

    // A warm cache answers the measured load: only the unmeasured warm-up reached the origin.
    for case in ["midway-http", "squid"] {
        let record = find(&records, "hit", case);
        assert!(
            extra(record, "cache_hits") >= PAGE_REQUESTS,
            "{case}: {record:?}"
        );
        assert_eq!(extra(record, "origin_requests"), PAGE_REQUESTS, "{case}");
        assert!(
            extra(record, "proxy_requests") >= 2.0 * PAGE_REQUESTS,
            "{case}"
        );
    }

    if with_chromium {
        let browser = find(&records, "chromium", "direct");
        assert!(
            extra(browser, "origin_requests") >= PAGE_REQUESTS,
            "{browser:?}"
        );
        let proxied = find(&records, "chromium", "squid");
        assert!(
            extra(proxied, "proxy_requests") >= PAGE_REQUESTS,
            "{proxied:?}"
        );
    }
}
