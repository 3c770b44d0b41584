//! Blocks of a summary written entirely from the reports:
//!
//! ```text
//! <!-- begin generated: verdicts hfc-proxy hfc-tuning -->
//! (the table, rewritten by the sync)
//! <!-- end generated -->
//! ```
//!
//! `verdicts` is the only kind: one row per named report with its claims' and targets' counts
//! (counted from the report's rows, which must agree with the counts the report prints) and the
//! source trees its records come from.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::published::{PublishedReport, Table};
use super::refs::LineProblem;

const BEGIN: &str = "<!-- begin generated: ";
const END: &str = "<!-- end generated -->";

/// The verdicts table for `papers`, its links relative to the summary (`to_results` is the path
/// from the summary's folder to docs/results, e.g. "" or "docs/results/").
fn verdicts_table(
    papers: &[&str],
    reports: &BTreeMap<String, PublishedReport>,
    to_results: &str,
) -> Result<String, String> {
    let mut text = String::from(
        "| report | the paper's claims | midway's targets | records from |\n|---|---|---|---|\n",
    );
    for paper in papers {
        let report = reports
            .get(*paper)
            .ok_or_else(|| format!("no report docs/results/{paper}/report.md"))?;
        let counts = |table| {
            if report.has(table) {
                report.counts(table)
            } else {
                "-".to_string()
            }
        };
        let (claims, targets) = (counts(Table::Claims), counts(Table::Targets));
        for (stated, counted, what) in [
            (&report.stated_claim_counts, &claims, "claims"),
            (&report.stated_target_counts, &targets, "targets"),
        ] {
            if let Some(stated) = stated {
                if stated != counted {
                    return Err(format!(
                        "{paper}/report.md states {what} \"{stated}\" but its rows count \
                         \"{counted}\""
                    ));
                }
            }
        }
        let trees = report.source_trees.as_deref().unwrap_or("not stated");
        let _ = writeln!(
            text,
            "| [{paper}]({to_results}{paper}/report.md) | {claims} | {targets} | {trees} |"
        );
    }
    Ok(text)
}

/// Rewrites every generated block of `text`; the problems are blocks that cannot be generated.
pub(crate) fn regenerate(
    text: &str,
    reports: &BTreeMap<String, PublishedReport>,
    to_results: &str,
) -> (String, Vec<LineProblem>) {
    let mut out = String::with_capacity(text.len());
    let mut problems = Vec::new();
    let mut lines = text.split_inclusive('\n').enumerate();
    while let Some((index, line)) = lines.next() {
        out.push_str(line);
        let Some(spec) = line
            .trim()
            .strip_prefix(BEGIN)
            .and_then(|s| s.strip_suffix("-->"))
        else {
            continue;
        };
        let mut words = spec.split_whitespace();
        let kind = words.next().unwrap_or_default();
        let papers: Vec<&str> = words.collect();
        let generated = match kind {
            "verdicts" => verdicts_table(&papers, reports, to_results),
            other => Err(format!("unknown generated block `{other}`")),
        };
        let mut old = String::new();
        let mut closed = false;
        for (_, line) in lines.by_ref() {
            if line.trim() == END {
                closed = true;
                match &generated {
                    Ok(table) => out.push_str(table),
                    Err(_) => out.push_str(&old),
                }
                out.push_str(line);
                break;
            }
            old.push_str(line);
        }
        if !closed {
            problems.push(LineProblem {
                line: index + 1,
                message: format!("generated block without `{END}`"),
            });
            out.push_str(&old);
        }
        if let Err(message) = generated {
            problems.push(LineProblem {
                line: index + 1,
                message,
            });
        }
    }
    (out, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reports() -> BTreeMap<String, PublishedReport> {
        let text = "\
- Source trees: `abc1234` clean: 10 records

## Paper vs lab: p

Verdicts of the paper's claims: 1 agree, 0 inconclusive, 0 disagree, 0 not tested.

| figure | experiment | paper says | we measured | verdict | why / note |
|---|---|---|---|---|---|
| Fig. 1 | e | x | a @ 1 / b @ 1 = 1 / 1 = 1.00, 95 % interval 1.00..1.00 (5 paired runs), needs > 0.5: met by 0.5 | agrees |  |
";
        BTreeMap::from([("p".to_string(), PublishedReport::parse(text))])
    }

    #[test]
    fn the_block_is_rewritten_from_the_report() {
        let doc = "intro\n<!-- begin generated: verdicts p -->\n| stale |\n<!-- end generated -->\nafter\n";
        let (text, problems) = regenerate(doc, &reports(), "docs/results/");
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            text,
            "intro\n<!-- begin generated: verdicts p -->\n\
             | report | the paper's claims | midway's targets | records from |\n|---|---|---|---|\n\
             | [p](docs/results/p/report.md) | 1 agree, 0 inconclusive, 0 disagree, 0 not tested | - | `abc1234` clean: 10 records |\n\
             <!-- end generated -->\nafter\n"
        );
        let (again, _) = regenerate(&text, &reports(), "docs/results/");
        assert_eq!(again, text, "regenerating is idempotent");
    }

    #[test]
    fn counts_that_disagree_with_the_reports_own_line_are_a_problem() {
        let mut reports = reports();
        if let Some(report) = reports.get_mut("p") {
            report.stated_claim_counts = Some("2 agree".into());
        }
        let doc = "<!-- begin generated: verdicts p -->\n<!-- end generated -->\n";
        let (_, problems) = regenerate(doc, &reports, "");
        assert!(
            problems[0].message.contains("states claims"),
            "{problems:?}"
        );
        let (_, problems) = regenerate("<!-- begin generated: verdicts q -->\n", &reports, "");
        assert_eq!(
            problems.len(),
            2,
            "unclosed and unknown report: {problems:?}"
        );
    }
}
