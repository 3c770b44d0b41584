//! End to end: the README's main experiment in its quick form, with the real binary as the lab
//! runner and as the proxy. Needs root (network namespaces); skipped with a message otherwise.

use std::path::{Path, PathBuf};
use std::process::Command;

use midway_report::RunRecord;

fn midway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_midway"))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// /proc/self belongs to the effective user of the process reading it.
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A fresh folder under the system temp dir, removed on drop (also when the test fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("midway-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn base36(mut n: u32) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(digits[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap()
}

/// Namespaces made by process `pid` (labnet tags are the pid in base 36 plus a counter; the
/// quick run makes 9 topologies, so the counter is one character).
fn namespaces_of_pid(pid: u32) -> Vec<String> {
    let prefix = format!("mw{}", base36(pid));
    std::fs::read_dir("/run/netns")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| {
                    name.strip_prefix(&prefix).is_some_and(|rest| {
                        let rest = rest.as_bytes();
                        rest.len() > 2 && (rest[1] == b'-' || rest[1] == b'.')
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn quick_hfc_demo_measures_every_case_and_writes_the_report() {
    if !is_root() {
        eprintln!("skipped: `midway lab run` needs root");
        return;
    }
    let out = TempDir::new("lab-run");
    let out_dir = out.0.join("run");
    let child = midway()
        .args(["lab", "run", "scenarios/hfc-demo.toml", "--quick", "--out"])
        .arg(&out_dir)
        .current_dir(repo_root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("report: "), "{stdout}");

    let records = midway_report::read_records(&out_dir.join(midway_report::RESULTS_FILE)).unwrap();
    assert_eq!(records.len(), 9, "3 loss values x 3 cases");
    for case in ["direct", "midway", "haproxy"] {
        let mine: Vec<&RunRecord> = records.iter().filter(|r| r.case == case).collect();
        assert_eq!(mine.len(), 3, "{case}");
        for record in mine {
            assert!(record.ok, "{case} failed: {:?}", record.error);
            assert_eq!(record.bytes, 300_000);
            assert!(record.throughput_bps > 0.0);
            assert_eq!(record.scenario, "hfc-demo");
            assert_eq!(record.scenario_file, "scenarios/hfc-demo.toml");
            assert_eq!(record.sweep_param.as_deref(), Some("local loss (%)"));
        }
    }
    // midway's own counters were read from its metrics endpoint.
    let midway_record = records.iter().find(|r| r.case == "midway").unwrap();
    assert!(
        midway_record.retransmits.contains_key("proxy-local"),
        "{:?}",
        midway_record.retransmits
    );
    assert!(out_dir.join("report.md").exists());
    let left = namespaces_of_pid(pid);
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

#[test]
fn check_names_the_line_of_a_bad_value_without_root() {
    let fixture =
        repo_root().join("crates/midway-lab/tests/fixtures/bad-scenario/negative-delay.toml");
    let output = midway()
        .args(["lab", "check"])
        .arg(&fixture)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("line 19"), "{stderr}");
    assert!(stderr.contains("negative"), "{stderr}");

    let good = midway()
        .args(["lab", "check", "scenarios/hfc-demo.toml"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert!(String::from_utf8_lossy(&good.stdout).contains("is valid"));
}
