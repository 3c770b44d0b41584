// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `midway lab artifact`, as a reviewer runs it: the full form's plan (no root, nothing run) fits
//! in an hour and covers claims of every paper; the smoke form (CI's, about 2 minutes) runs and
//! sets its verdicts beside the committed ones. The verdicts themselves are not asserted: a
//! claim near its bound may come out either way on another machine, which the command reports
//! rather than fails on.

use std::process::{Command, Output};

use midway_testkit::host::{repo_root, TempDir};

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const PAPERS: [&str; 5] = ["hfc-proxy", "hfc-tuning", "overlay", "satellite", "umts"];

fn artifact(args: &[&str]) -> (Output, String) {
    let output = Command::new(MIDWAY)
        .args(["lab", "artifact", "--jobs", "2"])
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    (output, stdout)
}

/// The minutes of "estimated N min" (or seconds as a fraction) on the line starting `prefix`.
fn estimated_minutes(text: &str, prefix: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line `{prefix}`:\n{text}"));
    let rest = &line[line.find("estimated ").expect(line) + "estimated ".len()..];
    let mut words = rest.split_whitespace();
    let number: f64 = words.next().unwrap().parse().unwrap();
    match words
        .next()
        .unwrap()
        .trim_end_matches(|c: char| !c.is_alphabetic())
    {
        "min" => number,
        "s" => number / 60.0,
        unit => panic!("unit {unit} in {line}"),
    }
}

#[test]
fn the_full_form_fits_in_an_hour_and_covers_claims_of_every_paper() {
    let (_, stdout) = artifact(&["--estimate"]);
    for paper in PAPERS {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("- {paper}:")))
            .unwrap_or_else(|| panic!("{paper} not in the plan:\n{stdout}"));
        assert!(!line.contains("covers 0 of"), "{line}");
        assert!(!line.contains("guessed"), "{line}");
    }
    let total = estimated_minutes(&stdout, "Total:");
    assert!(
        total < 60.0,
        "the full form is estimated at {total} min:\n{stdout}"
    );
}

#[test]
#[ignore = "needs root (network namespaces) and squid; scripts/test runs it"]
fn the_smoke_form_sets_its_verdicts_beside_the_committed_ones() {
    let out = TempDir::new("artifact-smoke");
    let (_, stdout) = artifact(&["--smoke", "--out", out.path().to_str().unwrap()]);
    assert!(
        estimated_minutes(&stdout, "Total:") < 3.0,
        "CI's budget is a few minutes:\n{stdout}"
    );
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("| ")).collect();
    for paper in ["hfc-tuning", "satellite"] {
        let covered: Vec<&&str> = rows
            .iter()
            .filter(|r| r.starts_with(&format!("| {paper} | ")))
            .collect();
        assert!(!covered.is_empty(), "no row of {paper}:\n{stdout}");
        for row in covered {
            let cells: Vec<&str> = row.split(" | ").collect();
            // | paper | entry | figure | experiment | committed | artifact | comparison |
            assert!(
                ["agrees", "disagrees", "inconclusive"].contains(&cells[5]),
                "the run did not measure what the claim reads: {row}"
            );
        }
        assert!(
            stdout.contains(&format!("- {paper}: ")),
            "no summary of {paper}:\n{stdout}"
        );
    }
    assert!(out.path().join("artifact.md").is_file());
}
