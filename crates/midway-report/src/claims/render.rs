//! The "paper vs lab" markdown tables — the paper's claims, then midway's own targets — each row
//! "paper says / we measured / verdict / why", and their place at the end of a report. Text
//! only; the verdicts come from [`super::evaluate`].

use std::fmt::Write as _;

use super::evaluate::{evaluate, evaluate_sanity, ClaimRow, SanityRow, Verdict};
use super::model::ClaimsFile;
use super::predict;
use crate::analysis::Analysis;
use crate::concurrency::CellKey;
use crate::interval;
use crate::load_checks::{self, Sensitive, Sensitivity};
// The report's own cell escaping, so a claims row and a results row escape alike.
use crate::markdown::{cell, number};

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

/// How to read the tables; the levels and thresholds come from [`crate::interval`].
fn how_to_read() -> String {
    let percent = |x: f64| {
        format!("{:.1}", x * 100.0)
            .trim_end_matches(".0")
            .to_string()
    };
    format!(
        "Numbers are medians of the runs above unless a row says mean; a ratio is case A's \
         number over case B's, and for runs of two cases paired by seed (same emulated \
         conditions) the median of the per-pair ratios. Each compared number has an interval \
         over the repetitions, labelled with the level it has at its number of runs: for a \
         median or a paired ratio the exact order-statistic interval, which holds for any \
         distribution ({} % with 5 runs, where it runs from the smallest to the largest run; \
         {} % or more from 6 runs on); for a ratio of two unpaired medians the two medians' \
         intervals combined (\"≥\": at least that level); for a mean a t interval (Student's, \
         or Fieller's for a ratio; exact for normal runs, not otherwise); for a share the \
         Clopper-Pearson interval. A claim **agrees** when the number and its whole interval \
         meet the check at every point, **disagrees** when the whole interval misses it at a \
         point, and is **inconclusive** otherwise (also where an interval's level is below {} \
         %). \"Runs deterministic\" marks runs that agree to within {} %: the repetitions then \
         show that the emulation repeats itself, not a sampling spread, and the verdict rests \
         on the number alone. \"met by\" / \"missed by\" is the distance of the number from \
         the accepted range.",
        percent(interval::median_level(5)),
        percent(interval::TARGET_LEVEL),
        percent(interval::MIN_VERDICT_LEVEL),
        percent(interval::DETERMINISTIC_SPREAD),
    )
}

/// A verdict as a table cell: the three judged outcomes in `words` (a claim's and a sanity
/// check's tables name them differently), the others with their reason.
fn verdict_text(verdict: &Verdict, [holds, unsure, fails]: [&str; 3]) -> String {
    match verdict {
        Verdict::Agrees => holds.to_string(),
        Verdict::Inconclusive => unsure.to_string(),
        Verdict::Disagrees => fails.to_string(),
        Verdict::NotTested(why) => format!("not tested: {why}"),
        Verdict::NoData(why) => format!("no data: {why}"),
        Verdict::Invalid(why) => format!("**invalid check**: {why}"),
    }
}

/// The marks beside a judged verdict: every cell it reads that a load check found moved and this
/// report measured at a higher load than the check's clean one (empty: none).
fn load_marks(row: &ClaimRow, sensitive: &[Sensitive]) -> Vec<String> {
    if !matches!(
        row.verdict,
        Verdict::Agrees | Verdict::Inconclusive | Verdict::Disagrees
    ) {
        return Vec::new();
    }
    sensitive
        .iter()
        .filter(|s| s.marks() && row.cells.contains(&s.row.key))
        .map(Sensitive::mark_text)
        .collect()
}

fn table(rows: &[ClaimRow], sensitive: &[Sensitive]) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "| figure | experiment | paper says | we measured | verdict | why / note |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|");
    for row in rows {
        let mut verdict = verdict_text(&row.verdict, ["agrees", "inconclusive", "**disagrees**"]);
        let marks = load_marks(row, sensitive);
        if !marks.is_empty() {
            let _ = write!(
                verdict,
                "; **{}** (section \"Load sensitivity\"): {}",
                load_checks::MARK,
                marks.join("; ")
            );
        }
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

/// The cells of judged claims whose number is nearer the threshold than its interval is wide,
/// with the runs that would settle them; empty when there are none.
fn close_calls(heading: &str, rows: &[ClaimRow]) -> String {
    let mut text = String::new();
    let calls: Vec<_> = rows
        .iter()
        .flat_map(|row| row.close_calls.iter().map(move |call| (row, call)))
        .collect();
    if calls.is_empty() {
        return text;
    }
    let _ = writeln!(
        text,
        "\n### {heading}: verdicts that turn on less than their interval's width\n\n\
         In these cells the interval reaches across the check's threshold and the number lies \
         nearer the threshold than the interval is wide, so the cell's outcome rests on less \
         than the runs' own spread. An interval narrows as one over the square root of the \
         runs, so about runs x (width / distance)^2 would bring its width below the distance, \
         and an interval around the number would then no longer reach the threshold (an \
         estimate from this spread; no number of runs settles a number on the threshold). Cells \
         whose whole interval clears or misses the threshold are decided and not listed, nor \
         are deterministic runs: more of them repeat the same number.\n"
    );
    let _ = writeln!(
        text,
        "| figure | experiment | verdict | cell | distance | width | runs | runs needed |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|---|---|");
    for (row, call) in calls {
        let needed = call
            .runs_needed
            .map_or("none settles it".to_string(), |n| n.to_string());
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} | {} | {needed} |",
            cell(&row.figure),
            cell(&row.experiment),
            row.verdict.category(),
            cell(&call.cell),
            number(call.distance),
            number(call.width),
            call.runs,
        );
    }
    text
}

/// Heading of the sanity checks' section.
pub const SANITY_HEADING: &str = "## Sanity checks (settled before any run; not claims)";

const SANITY_HOW_TO_READ: &str = "Each row is a check whose outcome arithmetic or physics settles \
before any run (the column \"settled by\" says how), so meeting it says nothing about a paper or \
about midway: it shows that the lab builds the path it says. They are judged by the same rule as \
the claims (**as expected** when the number and its whole interval meet the check, \
**unexpected** when the whole interval misses it, unsure otherwise) and are never counted among \
the claims or the targets. An unexpected row is a fault of the lab to find before any verdict \
above is read.";

fn sanity_table(rows: &[SanityRow]) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "| figure | experiment | expected | settled by | we measured | outcome |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|");
    for row in rows {
        let outcome = verdict_text(&row.verdict, ["as expected", "unsure", "**unexpected**"]);
        let expected = match &row.note {
            Some(note) => format!("{} (note: {note})", row.says),
            None => row.says.clone(),
        };
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} |",
            cell(&row.figure),
            cell(&row.experiment),
            cell(&expected),
            cell(&row.settled_by),
            cell(&row.measured),
            cell(&outcome)
        );
    }
    text
}

/// "2 as expected, 0 unsure, 0 unexpected" (and the rows that could not be judged).
fn sanity_counts(rows: &[SanityRow]) -> String {
    let count = |f: fn(&Verdict) -> bool| rows.iter().filter(|r| f(&r.verdict)).count();
    let mut text = format!(
        "{} as expected, {} unsure, {} unexpected",
        count(|v| *v == Verdict::Agrees),
        count(|v| *v == Verdict::Inconclusive),
        count(|v| *v == Verdict::Disagrees)
    );
    let other = count(|v| {
        !matches!(
            v,
            Verdict::Agrees | Verdict::Inconclusive | Verdict::Disagrees
        )
    });
    if other > 0 {
        let _ = write!(text, ", {other} not judged");
    }
    text
}

/// The markdown sections: the claims file's problems (if any), the paper's claims, midway's
/// targets. A file with targets only (a probe of midway's own, no paper) has no paper section and
/// no [`VERDICTS_LINE`], so it never passes for a reproduction.
pub(crate) fn render(
    file: &ClaimsFile,
    claims: &[ClaimRow],
    targets: &[ClaimRow],
    sensitive: &[Sensitive],
) -> String {
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
    let _ = writeln!(text, "{}\n", how_to_read());
    if !claims.is_empty() {
        let _ = writeln!(text, "{VERDICTS_LINE} {}.\n", counts(claims));
        text.push_str(&table(claims, sensitive));
        text.push_str(&close_calls("The paper's claims", claims));
        if !targets.is_empty() {
            let _ = writeln!(text, "\n{TARGETS_HEADING}\n");
        }
    }
    if !targets.is_empty() {
        let _ = writeln!(text, "Verdicts of the targets: {}.\n", counts(targets));
        text.push_str(&table(targets, sensitive));
        text.push_str(&close_calls("midway's targets", targets));
    }
    text
}

/// The sanity checks' section (empty without any).
pub(crate) fn render_sanity(rows: &[SanityRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "\n{SANITY_HEADING}\n\n{SANITY_HOW_TO_READ}\n\nSanity checks: {}.\n\n{}",
        sanity_counts(rows),
        sanity_table(rows)
    )
}

/// "Fig. 5 (claim, `fig5-legacy`, agrees)" for every row reading `key`.
fn readers(rows: &[(&str, &[ClaimRow])], key: &CellKey) -> Vec<String> {
    rows.iter()
        .flat_map(|(kind, rows)| {
            rows.iter()
                .filter(|row| row.cells.contains(key))
                .map(move |row| {
                    format!(
                        "{} ({kind}, `{}`, {})",
                        row.figure,
                        row.experiment,
                        row.verdict.category()
                    )
                })
        })
        .collect()
}

/// Appends the claims tables of `file` (`None`: the folder has no claims file) to the report
/// `text`, when the file has claims or targets (a file with only `[[plots]]` adds no table),
/// then the load sensitivity of the cells `checks` compared (when a load checks file names
/// any), the predicted shares and the sanity checks.
pub(crate) fn append_table(
    file: Option<&ClaimsFile>,
    analysis: &Analysis,
    load: Option<&Sensitivity>,
    mut text: String,
) -> String {
    let empty = ClaimsFile {
        paper: String::new(),
        claims: Vec::new(),
        targets: Vec::new(),
        sanity: Vec::new(),
        predictions: Vec::new(),
        plots: Vec::new(),
    };
    let file = file.unwrap_or(&empty);
    let has_tables = !file.claims.is_empty() || !file.targets.is_empty();
    if !has_tables && file.sanity.is_empty() && file.predictions.is_empty() && load.is_none() {
        return text;
    }
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let claims = evaluate(&file.claims, analysis);
    let targets = evaluate(&file.targets, analysis);
    let sensitive = load.map_or(&[][..], |load| load.cells.as_slice());
    if has_tables {
        text.push('\n');
        text.push_str(&render(file, &claims, &targets, sensitive));
    }
    if let Some(load) = load {
        let rows: [(&str, &[ClaimRow]); 2] = [("claim", &claims), ("target", &targets)];
        text.push_str(&load_checks::render(load, &|key| readers(&rows, key)));
    }
    text.push_str(&predict::render(&file.predictions, analysis));
    text.push_str(&render_sanity(&evaluate_sanity(&file.sanity, analysis)));
    text
}
