//! The summaries quote the published reports exactly: every generated block (the verdict
//! counts) is what the reports give, every referenced number is its report row's, and no page
//! dates history by the project's numbered sessions or rounds (issue 33).
//!
//! After rebuilding reports, re-sync the summaries with
//! `MIDWAY_SYNC_SUMMARIES=1 cargo test --locked -p midway-report --test summaries`; what it
//! cannot rewrite (a verdict the prose relies on changed) it lists, for a hand edit.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use midway_report::summary;

const SYNC_ENV: &str = "MIDWAY_SYNC_SUMMARIES";

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_summaries_quote_the_reports_and_date_their_history() {
    let root = repository();
    let outcome = if std::env::var_os(SYNC_ENV).is_some() {
        let outcome = summary::sync(&root).expect("sync the summaries");
        for page in &outcome.rewritten {
            eprintln!("rewrote {}", page.display());
        }
        outcome
    } else {
        summary::check(&root).expect("read the summaries and reports")
    };
    let problems: Vec<String> = outcome.problems.iter().map(ToString::to_string).collect();
    assert!(
        problems.is_empty(),
        "{} problems:\n{}\n\nNumbers and generated tables: {SYNC_ENV}=1 cargo test --locked -p \
         midway-report --test summaries rewrites them from the reports; a changed verdict or a \
         history reference needs a hand edit.",
        problems.len(),
        problems.join("\n")
    );
    assert!(outcome.pages >= 10, "only {} pages read", outcome.pages);
    // The two summaries quote each reproduction's headline numbers; fewer references than this
    // means quotes lost their references (a quote without one is checked by nothing).
    assert!(
        outcome.references >= 40,
        "only {} references to report rows",
        outcome.references
    );
}
