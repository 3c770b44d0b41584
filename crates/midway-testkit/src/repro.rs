//! For the lab reproduction tests of the `midway` binary (feature `report`): run `midway lab
//! reproduce PAPER --quick` into a fresh folder and check only what is robust, and read the
//! records it wrote.

use std::path::Path;
use std::process::Command;

use midway_report::RunRecord;

/// Bound on one quick reproduction: the task budget is "well under 3 minutes".
pub const QUICK_BUDGET: std::time::Duration = std::time::Duration::from_secs(170);

/// Runs the quick reproduction of `paper`, limited to `experiments` (the figures with the robust
/// orderings; every experiment of a paper in --quick form would not fit the CI budget), and
/// returns its records and report text. `midway` is the binary under test
/// (`env!("CARGO_BIN_EXE_midway")`).
pub fn reproduce_quick(
    midway: &str,
    paper: &str,
    experiments: &[&str],
    out: &Path,
) -> (Vec<RunRecord>, String) {
    reproduce_quick_cases(midway, paper, experiments, &[], out)
}

/// [`reproduce_quick`] limited to `cases` as well (all when empty): the cases whose proxy can run
/// on this tree.
pub fn reproduce_quick_cases(
    midway: &str,
    paper: &str,
    experiments: &[&str],
    cases: &[&str],
    out: &Path,
) -> (Vec<RunRecord>, String) {
    let started = std::time::Instant::now();
    let mut command = Command::new(midway);
    command.args(["lab", "reproduce", paper, "--quick", "--jobs", "4", "--out"]);
    command.arg(out);
    for experiment in experiments {
        command.args(["--experiment", experiment]);
    }
    for case in cases {
        command.args(["--case", case]);
    }
    let output = command
        .current_dir(crate::host::repo_root())
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
    median_of(records, experiment, case, x, |r| Some(r.throughput_bps))
}

/// Median `page_load_seconds` of `case` in `experiment` at sweep value `x`.
pub fn median_page_load(
    records: &[RunRecord],
    experiment: &str,
    case: &str,
    x: f64,
) -> Option<f64> {
    median_of(records, experiment, case, x, |r| {
        r.extra.get("page_load_seconds").copied()
    })
}

/// Median of `value` over the successful records of `case` in `experiment` where the swept
/// parameter equals `x` (records without a value are passed over).
pub fn median_of(
    records: &[RunRecord],
    experiment: &str,
    case: &str,
    x: f64,
    value: impl Fn(&RunRecord) -> Option<f64>,
) -> Option<f64> {
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
        .filter_map(value)
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
        section
            .contains("| figure | experiment | paper says | we measured | verdict | why / note |"),
        "{section}"
    );
    // A row judged on measured numbers: agrees, disagrees, or (one run a side in the quick form,
    // so no interval) inconclusive; never "no data" or "not tested".
    let measured_rows = section
        .lines()
        .filter(|l| {
            l.starts_with("| ")
                && (l.contains("| agrees |")
                    || l.contains("| **disagrees** |")
                    || l.contains("| inconclusive |"))
        })
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
