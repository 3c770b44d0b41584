//! The "paper vs lab" markdown table: one row per checked claim, and its place at the end of a
//! report. Text only; the verdicts come from [`super::evaluate`].

use std::fmt::Write as _;

use super::evaluate::{evaluate, ClaimRow, Verdict};
use super::model::ClaimsFile;
use crate::analysis::Analysis;
// The report's own cell escaping, so a claims row and a results row escape alike.
use crate::markdown::cell;

/// The markdown section with the table.
pub(crate) fn render(file: &ClaimsFile, rows: &[ClaimRow]) -> String {
    let mut text = String::new();
    let agree = rows.iter().filter(|r| r.verdict == Verdict::Agrees).count();
    let checked = rows
        .iter()
        .filter(|r| matches!(r.verdict, Verdict::Agrees | Verdict::Disagrees))
        .count();
    let _ = writeln!(text, "## Paper vs lab: {}\n", file.paper);
    let _ = writeln!(
        text,
        "{agree} of {checked} checked claims agree (medians of the runs above unless a row says \
         mean; a ratio is case A's number over case B's; \"met by\" / \"missed by\" is the \
         distance of the compared number from the target).\n"
    );
    let _ = writeln!(
        text,
        "| figure | experiment | paper says | we measured | agrees? | why not |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|");
    for row in rows {
        let verdict = match &row.verdict {
            Verdict::Agrees => "yes".to_string(),
            Verdict::Disagrees => "**no**".to_string(),
            Verdict::NotChecked => "(not checked)".to_string(),
            Verdict::NoData(why) => format!("no data: {why}"),
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

/// Appends the claims table of `file` to the report `text`, when the file has claims (a file
/// with only `[[plots]]` adds no table).
pub(crate) fn append_table(file: &ClaimsFile, analysis: &Analysis, mut text: String) -> String {
    if file.claims.is_empty() {
        return text;
    }
    let rows = evaluate(file, analysis);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push('\n');
    text.push_str(&render(file, &rows));
    text
}
