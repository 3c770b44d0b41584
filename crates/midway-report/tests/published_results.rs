//! The published reproductions under docs/results: the summary page quotes each report's
//! verdict counts as the report states them (issue 18: every number in a README comes from a
//! report it links), so rebuilding a report without updating the summary fails here.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::PathBuf;

use midway_report::claims::VERDICTS_LINE;

fn results_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/results")
}

#[test]
fn the_summary_quotes_every_reports_verdict_counts() {
    let dir = results_dir();
    let summary = fs::read_to_string(dir.join("README.md")).expect("docs/results/README.md");
    let mut reports = 0;
    for entry in fs::read_dir(&dir).expect("docs/results") {
        let folder = entry.expect("entry").path();
        let Ok(report) = fs::read_to_string(folder.join("report.md")) else {
            continue;
        };
        let Some(line) = report.lines().find(|l| l.starts_with(VERDICTS_LINE)) else {
            continue;
        };
        reports += 1;
        let paper = folder.file_name().unwrap().to_string_lossy().into_owned();
        let counts = line[VERDICTS_LINE.len()..].trim().trim_end_matches('.');
        let row = format!("| [{paper}]({paper}/report.md) | {counts} |");
        assert!(
            summary.contains(&row),
            "docs/results/README.md lacks the row `{row}` (the counts of {paper}/report.md)"
        );
    }
    assert!(reports >= 5, "only {reports} reports with a claims table");
}

#[test]
fn every_report_names_its_source_trees_and_they_are_clean() {
    let dir = results_dir();
    let mut reports = 0;
    for entry in fs::read_dir(&dir).expect("docs/results") {
        let folder = entry.expect("entry").path();
        let Ok(report) = fs::read_to_string(folder.join("report.md")) else {
            continue;
        };
        reports += 1;
        let name = folder.file_name().unwrap().to_string_lossy().into_owned();
        let trees = report
            .lines()
            .find_map(|l| l.strip_prefix("- Source trees: "))
            .unwrap_or_else(|| panic!("{name}/report.md names no source trees"));
        let all_clean = trees.split("; ").all(|tree| tree.contains(" clean: "));
        // Issue 18: a committed report is made from clean commits only.
        assert!(
            all_clean,
            "{name}/report.md has records from trees not known to be clean: {trees}"
        );
    }
    assert!(reports >= 6, "only {reports} reports under docs/results");
}
