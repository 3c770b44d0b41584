// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A results folder naming a concurrency check (`load-checks.toml`): synthetic records of a
//! report and of a check at two loads, written into a temporary folder, and the report written
//! from them. The verdict of a claim is marked load-sensitive exactly when its check reads a
//! cell the check found moved and the report measured that cell above the check's clean load.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;

use midway_report::load_checks::LOAD_CHECKS_FILE;
use midway_report::{write_report, ReportError, ReportOptions, RunLoad, RunRecord, RESULTS_FILE};
use serde_json::json;

fn record(
    case: &str,
    loss: u32,
    rep: u32,
    mbps: f64,
    jobs: u32,
    max_jobs: Option<u32>,
) -> RunRecord {
    RunRecord {
        scenario: "s".into(),
        scenario_file: "s.toml".into(),
        commit: "1234abc".into(),
        experiment: "e".into(),
        case: case.into(),
        sweep_param: Some("loss".into()),
        params: BTreeMap::from([("loss".to_string(), json!(loss))]),
        repetition: rep,
        seed: 100 * u64::from(loss) + u64::from(rep),
        bytes: 3_000_000,
        seconds: 24.0 / mbps,
        throughput_bps: mbps * 1e6,
        retransmits: BTreeMap::new(),
        extra: BTreeMap::new(),
        ok: true,
        error: None,
        started_at: format!("2026-12-01T06:{:02}:00Z", 10 + rep),
        tree: Some("clean".into()),
        quick: None,
        load: Some(RunLoad {
            jobs,
            cpus: 2,
            loadavg_1m: None,
            max_jobs,
        }),
    }
}

const CASES: [&str; 3] = ["direct", "midway", "haproxy"];

/// Every cell at `jobs`, 5 repetitions; `level(case, loss)` gives its throughput, to which each
/// repetition adds a little of its own.
fn records(jobs: u32, max_jobs: Option<u32>, level: impl Fn(&str, u32) -> f64) -> Vec<RunRecord> {
    let mut out = Vec::new();
    for loss in [0, 1] {
        for case in CASES {
            for rep in 0..5 {
                let mbps = level(case, loss) * (1.0 + 0.01 * f64::from(rep));
                out.push(record(case, loss, rep, mbps, jobs, max_jobs));
            }
        }
    }
    out
}

fn write_records(dir: &Path, records: &[RunRecord]) {
    fs::create_dir_all(dir).unwrap();
    let mut file = fs::File::create(dir.join(RESULTS_FILE)).unwrap();
    for r in records {
        writeln!(file, "{}", serde_json::to_string(r).unwrap()).unwrap();
    }
}

fn report_level(case: &str, loss: u32) -> f64 {
    match case {
        "direct" => 4.0 - f64::from(loss),
        "midway" => 12.0,
        _ => 10.0,
    }
}

/// The check: at 16 jobs midway @ 1 and direct @ 0 lose a fifth; every other cell is measured
/// at 16 jobs as at 2, but for a spread around 1 (one repetition up, one down), so its interval
/// holds 1.
fn check_level_16(case: &str, loss: u32) -> f64 {
    match (case, loss) {
        ("midway", 1) | ("direct", 0) => 0.8 * report_level(case, loss),
        _ => report_level(case, loss),
    }
}

const CLAIMS: &str = r#"
paper = "p"
[[claims]]
figure = "F1"
experiment = "e"
says = "reads-moved"
[claims.check]
a = { case = "midway", x = 1 }
b = { case = "haproxy", x = 1 }
op = ">"
value = 1.0
open_side = "ordering only"

[[claims]]
figure = "F2"
experiment = "e"
says = "reads-unmoved"
[claims.check]
a = { case = "haproxy", x = 1 }
b = { case = "haproxy", x = 0 }
op = "within"
value = 1.0
tolerance = 0.1

[[claims]]
figure = "F3"
experiment = "e"
says = "gain-reads-moved-baseline"
[claims.check]
metric = "gos"
a = { case = "haproxy", x = 0 }
op = ">"
value = 0.0
open_side = "ordering only"

[[claims]]
figure = "F4"
experiment = "e"
says = "not-tested-reads-moved"
not_tested = "no mechanism"
[claims.check]
a = { case = "midway", x = 1 }
op = ">"
value = 1.0
open_side = "ordering only"
"#;

const CHECKS: &str = "[[checks]]\nrecords = \"check\"\nbaseline_jobs = 2\njobs = 16\n";

/// Writes a results folder with the report's records, the claims and the check; returns the
/// report's text.
fn report(dir: &Path, report_records: &[RunRecord]) -> Result<String, ReportError> {
    write_records(dir, report_records);
    fs::write(dir.join("claims.toml"), CLAIMS).unwrap();
    fs::write(dir.join(LOAD_CHECKS_FILE), CHECKS).unwrap();
    write_records(&dir.join("check/jobs-2"), &records(2, None, report_level));
    let mut loaded = records(16, None, check_level_16);
    // The 16-jobs pass of an unmoved cell: one repetition 2 % up, another 2 % down.
    for r in loaded.iter_mut() {
        let moved = matches!(
            (r.case.as_str(), r.params["loss"].as_u64()),
            ("midway", Some(1)) | ("direct", Some(0))
        );
        if !moved {
            let factor = match r.repetition {
                0 => 1.02,
                4 => 0.98,
                _ => 1.0,
            };
            r.throughput_bps *= factor;
        }
    }
    write_records(&dir.join("check/jobs-16"), &loaded);
    let summary = write_report(dir, &ReportOptions::default())?;
    Ok(fs::read_to_string(summary.report_path).unwrap())
}

/// The verdict cell of the claims row whose "paper says" is `says`.
fn verdict<'a>(text: &'a str, says: &str) -> &'a str {
    let line = text
        .lines()
        .find(|l| l.starts_with('|') && l.contains(&format!("| {says} |")))
        .unwrap_or_else(|| panic!("no row {says}"));
    line.split(" | ").nth(4).unwrap()
}

fn section(text: &str) -> &str {
    let start = text.find("## Load sensitivity").expect("the section");
    &text[start..]
}

#[test]
fn verdicts_reading_a_moved_cell_measured_above_the_clean_load_are_marked() {
    let dir = tempfile::tempdir().unwrap();
    let text = report(dir.path(), &records(16, None, report_level)).unwrap();
    // Judged as without the check; marked beside the verdict.
    assert!(verdict(&text, "reads-moved").starts_with("agrees; **load-sensitive**"));
    assert!(verdict(&text, "reads-moved").contains("`e` midway @ 1: median "));
    // A gain of splitting reads the baseline case's runs too.
    let gain = verdict(&text, "gain-reads-moved-baseline");
    assert!(gain.starts_with("agrees; **load-sensitive**"), "{gain}");
    assert!(gain.contains("`e` direct @ 0"), "{gain}");
    assert!(!gain.contains("midway"), "{gain}");
    // Unmoved cells mark nothing; a row not judged is not marked, but is listed as a reader.
    assert_eq!(verdict(&text, "reads-unmoved"), "agrees");
    assert!(verdict(&text, "not-tested-reads-moved").starts_with("not tested: no mechanism"));
    assert!(!verdict(&text, "not-tested-reads-moved").contains("load-sensitive"));
    assert!(text.contains(
        "Verdicts of the paper's claims: 3 agree, 0 inconclusive, 0 disagree, 1 not tested."
    ));
    let section = section(&text);
    assert!(
        section.contains("- `check`: 16 jobs against 2 jobs, 2 of 6 cells differ."),
        "{section}"
    );
    let row = |cell: &str| {
        section
            .lines()
            .find(|l| l.contains(cell))
            .unwrap_or_else(|| panic!("no row {cell} in {section}"))
    };
    let moved = row("`e` midway @ 1");
    assert!(moved.contains("| 0.800 |"), "{moved}");
    assert!(moved.contains("| 16 jobs | yes |"), "{moved}");
    assert!(
        moved.contains("F1 (claim, `e`, agrees); F4 (claim, `e`, not tested)"),
        "{moved}"
    );
    let baseline = row("`e` direct @ 0");
    assert!(baseline.contains("F3 (claim, `e`, agrees)"), "{baseline}");
    assert!(!section.contains("`e` haproxy"), "{section}");
}

#[test]
fn cells_measured_at_the_clean_load_are_listed_but_not_marked() {
    let dir = tempfile::tempdir().unwrap();
    // --jobs 16, but the experiment's own limit held it at 2 at once: the check's clean load.
    let text = report(dir.path(), &records(16, Some(2), report_level)).unwrap();
    for says in ["reads-moved", "reads-unmoved", "gain-reads-moved-baseline"] {
        assert_eq!(verdict(&text, says), "agrees", "{says}");
    }
    let section = section(&text);
    assert!(section.contains("| 2 jobs | no |"), "{section}");
    assert!(!text.contains("**load-sensitive**"));
}

#[test]
fn a_check_whose_records_ran_at_another_load_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    report(dir.path(), &records(16, None, report_level)).unwrap();
    // The 16-jobs folder's records say 4 jobs.
    write_records(
        &dir.path().join("check/jobs-16"),
        &records(4, None, report_level),
    );
    let error = write_report(dir.path(), &ReportOptions::default()).unwrap_err();
    assert!(matches!(error, ReportError::LoadChecks(_)), "{error}");
    let chain = format!(
        "{error}: {}",
        std::error::Error::source(&error)
            .map(ToString::to_string)
            .unwrap_or_default()
    );
    assert!(chain.contains("ran at 4 jobs"), "{chain}");
}
