//! Shared by the repro_* tests: run `midway lab reproduce PAPER --quick` into a fresh folder and
//! check only what is robust. Needs root (network namespaces) and HAProxy; skipped otherwise.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use midway_report::RunRecord;

/// Bound on one quick reproduction: the task budget is "well under 3 minutes".
pub const QUICK_BUDGET: std::time::Duration = std::time::Duration::from_secs(170);

pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A fresh folder under the system temp dir, removed on drop (also when the test fails).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
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

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the quick reproduction of `paper`, limited to `experiments` (the figures with the robust
/// orderings; every experiment of a paper in --quick form would not fit the CI budget), and
/// returns its records and report text.
pub fn reproduce_quick(paper: &str, experiments: &[&str], out: &Path) -> (Vec<RunRecord>, String) {
    let started = std::time::Instant::now();
    let mut command = Command::new(env!("CARGO_BIN_EXE_midway"));
    command.args(["lab", "reproduce", paper, "--quick", "--jobs", "4", "--out"]);
    command.arg(out);
    for experiment in experiments {
        command.args(["--experiment", experiment]);
    }
    let output = command
        .current_dir(repo_root())
        .output()
        .expect("run midway lab reproduce");
    assert!(
        output.status.success(),
        "midway lab reproduce {paper} --quick failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let elapsed = started.elapsed();
    eprintln!("quick {paper}: {elapsed:?}");
    assert!(
        elapsed < QUICK_BUDGET,
        "the quick {paper} reproduction took {elapsed:?}, over its CI budget {QUICK_BUDGET:?}"
    );
    let records = midway_report::read_records(&out.join(midway_report::RESULTS_FILE)).unwrap();
    let report = std::fs::read_to_string(out.join(midway_report::REPORT_FILE)).unwrap();
    (records, report)
}

/// Median throughput of `case` in `experiment` where the swept parameter equals `x`.
pub fn median(records: &[RunRecord], experiment: &str, case: &str, x: f64) -> Option<f64> {
    let mut values: Vec<f64> = records
        .iter()
        .filter(|r| r.ok && r.experiment == experiment && r.case == case)
        .filter(|r| {
            let param = r.sweep_param.as_deref().unwrap_or("");
            r.params
                .get(param)
                .and_then(|v| v.as_f64())
                .is_some_and(|v| (v - x).abs() < 1e-9)
        })
        .map(|r| r.throughput_bps)
        .collect();
    values.sort_by(f64::total_cmp);
    (!values.is_empty()).then(|| values[values.len() / 2])
}

/// The report has the paper-vs-lab table and at least one row was computed from measured data.
pub fn assert_claims_table_filled(report: &str, paper: &str) {
    let section = report
        .split(&format!("## Paper vs lab: {paper}"))
        .nth(1)
        .unwrap_or_else(|| panic!("no claims table in the report:\n{report}"));
    assert!(
        section.contains("| figure | experiment | paper says | we measured | agrees? | why not |"),
        "{section}"
    );
    let measured_rows = section
        .lines()
        .filter(|l| l.starts_with("| ") && (l.contains("| yes |") || l.contains("| **no** |")))
        .count();
    assert!(
        measured_rows >= 1,
        "no claim was checked against measured data:\n{section}"
    );
}

/// Every record succeeded and no plot is missing.
pub fn assert_complete(records: &[RunRecord], out: &Path) {
    let failed: Vec<_> = records.iter().filter(|r| !r.ok).collect();
    assert!(failed.is_empty(), "failed points: {failed:#?}");
    let plots = std::fs::read_dir(out.join(midway_report::PLOTS_DIR))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "png"))
        .count();
    assert!(
        plots >= 2,
        "expected one plot per experiment, found {plots}"
    );
}
