//! Interrupted runs leave nothing behind: a child process (this test binary, re-run in a special
//! mode) builds a topology; SIGINT makes it tear down before dying, and after SIGKILL
//! `clean_leftovers` removes what it left (needs root).

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use midway_labnet::{
    fresh_tag, DirectionConfig, HostSpec, LinkSpec, StackProfile, Topology, TopologySpec,
};
use midway_testkit::netns::namespaces_tagged;
use midway_testkit::wait::wait_exit;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const CHILD_ENV: &str = "MIDWAY_LABNET_SIGNAL_CHILD_TAG";

/// The child's side: only does something when started by `start_child`.
#[test]
#[ignore = "helper run as a child process by the other tests"]
fn signal_child() {
    let Ok(tag) = std::env::var(CHILD_ENV) else {
        return;
    };
    midway_labnet::install_cleanup_on_signal().expect("handlers");
    let spec = TopologySpec {
        hosts: vec![
            HostSpec {
                name: "a".into(),
                stack: StackProfile::Modern,
            },
            HostSpec {
                name: "b".into(),
                stack: StackProfile::Legacy,
            },
        ],
        links: vec![LinkSpec {
            a: "a".into(),
            b: "b".into(),
            a_to_b: DirectionConfig::default(),
            b_to_a: DirectionConfig::default(),
        }],
    };
    let topology = Topology::build(&spec, &tag, 1).expect("builds");
    // A process inside a host, as a scenario's server would be.
    let mut sleep = Command::new("sleep");
    sleep.arg("30");
    let _child = topology.spawn("b", sleep).expect("spawns");
    println!("READY");
    std::thread::sleep(Duration::from_secs(30));
}

fn start_child(tag: &str) -> std::process::Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "signal_child",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, tag)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("child starts");
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .take(50)
        .any(|l| l.map(|l| l.contains("READY")).unwrap_or(false));
    assert!(ready, "child never became ready");
    assert_eq!(namespaces_tagged(tag).len(), 3, "child built its topology");
    child
}

#[test]
fn sigint_tears_down_the_live_topology() {
    let tag = fresh_tag();
    let mut child = start_child(&tag);
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let status = wait_exit(
        &mut child,
        Duration::from_secs(10),
        "child did not exit after SIGINT",
    );
    assert!(!status.success());
    assert!(
        namespaces_tagged(&tag).is_empty(),
        "SIGINT left {:?}",
        namespaces_tagged(&tag)
    );
    assert!(!std::path::Path::new(&format!("{}/{tag}.pid", midway_labnet::PID_DIR)).exists());
}

#[test]
fn sigkill_leftovers_are_removed_by_clean_leftovers() {
    let tag = fresh_tag();
    let mut child = start_child(&tag);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(namespaces_tagged(&tag).len(), 3, "SIGKILL cannot clean up");
    let removed = midway_labnet::clean_leftovers().expect("cleans");
    assert!(removed >= 3);
    assert!(
        namespaces_tagged(&tag).is_empty(),
        "left {:?}",
        namespaces_tagged(&tag)
    );
}
