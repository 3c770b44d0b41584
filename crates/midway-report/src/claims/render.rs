//! The "paper vs lab" markdown tables — the paper's claims, then midway's own targets — each row
//! "paper says / we measured / verdict / why", and their place at the end of a report. Text
//! only; the verdicts come from [`super::evaluate`].

use std::fmt::Write as _;

use super::evaluate::{evaluate, ClaimRow, Verdict};
use super::model::ClaimsFile;
use crate::analysis::Analysis;
// The report's own cell escaping, so a claims row and a results row escape alike.
use crate::markdown::cell;

/// The verdict categories in the order the counts list them.
const CATEGORIES: [&str; 6] = [
    "agrees",
    "inconclusive",
    "disagrees",
    "not tested",
    "no data",
    "invalid check",
];

/// Prefix of the line that counts the paper's claims by verdict (other tools read it, e.g. the
/// test that docs/results/README.md quotes the reports' counts).
pub const VERDICTS_LINE: &str = "Verdicts of the paper's claims:";

/// "3 agree, 1 inconclusive, 0 disagree, 2 not tested" (no data and invalid checks only when
/// there are some).
pub(crate) fn counts(rows: &[ClaimRow]) -> String {
    CATEGORIES
        .iter()
        .map(|category| {
            let n = rows
                .iter()
                .filter(|r| r.verdict.category() == *category)
                .count();
            (category, n)
        })
        .filter(|(category, n)| *n > 0 || !matches!(**category, "no data" | "invalid check"))
        .map(|(category, n)| {
            let word = match *category {
                "agrees" => "agree",
                "disagrees" => "disagree",
                other => other,
            };
            format!("{n} {word}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

const HOW_TO_READ: &str = "Numbers are medians of the runs above unless a row says mean; a ratio \
is case A's number over case B's. Each compared number has a 95 % bootstrap interval over the \
repetitions (runs of two cases at one point share their seed and are resampled as pairs). A \
claim **agrees** when the number and its whole interval meet the check, **disagrees** when the \
whole interval misses it, and is **inconclusive** otherwise; \"met by\" / \"missed by\" is the \
distance of the number from the accepted range.";

fn table(rows: &[ClaimRow]) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "| figure | experiment | paper says | we measured | verdict | why / note |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|");
    for row in rows {
        let verdict = match &row.verdict {
            Verdict::Agrees => "agrees".to_string(),
            Verdict::Inconclusive => "inconclusive".to_string(),
            Verdict::Disagrees => "**disagrees**".to_string(),
            Verdict::NotTested(why) => format!("not tested: {why}"),
            Verdict::NoData(why) => format!("no data: {why}"),
            Verdict::Invalid(why) => format!("**invalid check**: {why}"),
        };
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} |",
            cell(&row.figure),
            cell(&row.experiment),
            cell(&row.says),
            cell(&row.measured),
            cell(&verdict),
            cell(row.why_not.as_deref().unwrap_or(""))
        );
    }
    text
}

/// The markdown sections: the claims file's problems (if any), the paper's claims, midway's
/// targets. A file with targets only (a probe of midway's own, no paper) has no paper section and
/// no [`VERDICTS_LINE`], so it never passes for a reproduction.
pub(crate) fn render(file: &ClaimsFile, claims: &[ClaimRow], targets: &[ClaimRow]) -> String {
    let mut text = String::new();
    const TARGETS_HEADING: &str = "## midway's targets (not the paper's findings)";
    if claims.is_empty() {
        let _ = writeln!(text, "{TARGETS_HEADING}\n");
        let _ = writeln!(
            text,
            "From: {}. No claim of a paper is checked here.\n",
            file.paper
        );
    } else {
        let _ = writeln!(text, "## Paper vs lab: {}\n", file.paper);
    }
    let problems = file.problems();
    if !problems.is_empty() {
        let _ = writeln!(text, "Problems in the claims file:\n");
        for problem in &problems {
            let _ = writeln!(text, "- {problem}");
        }
        text.push('\n');
    }
    let _ = writeln!(text, "{HOW_TO_READ}\n");
    if !claims.is_empty() {
        let _ = writeln!(text, "{VERDICTS_LINE} {}.\n", counts(claims));
        text.push_str(&table(claims));
        if !targets.is_empty() {
            let _ = writeln!(text, "\n{TARGETS_HEADING}\n");
        }
    }
    if !targets.is_empty() {
        let _ = writeln!(text, "Verdicts of the targets: {}.\n", counts(targets));
        text.push_str(&table(targets));
    }
    text
}

/// Appends the claims tables of `file` to the report `text`, when the file has claims or
/// targets (a file with only `[[plots]]` adds no table).
pub(crate) fn append_table(file: &ClaimsFile, analysis: &Analysis, mut text: String) -> String {
    if file.claims.is_empty() && file.targets.is_empty() {
        return text;
    }
    let claims = evaluate(&file.claims, analysis);
    let targets = evaluate(&file.targets, analysis);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push('\n');
    text.push_str(&render(file, &claims, &targets));
    text
}
