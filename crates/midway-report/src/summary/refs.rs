//! References from a summary's quoted numbers to the report rows they come from.
//!
//! A quoted number is followed by an HTML comment (invisible when the page is rendered):
//!
//! ```text
//! up to 3.93x<!-- ref hfc-proxy fig14-grid-local10-legacy @5 agrees -->
//! ```
//!
//! Words of the comment, after `ref`, in this order, all but the first two optional:
//!
//! - the report: the folder under docs/results (`hfc-proxy`);
//! - the row's experiment (`fig14-grid-local10-legacy`);
//! - `claim` or `target`: the table, where an experiment has rows in both;
//! - `@X`: the check whose first operand is at sweep value X, in a row that checks several;
//! - the field quoted: `value` (the compared number, the default), `a` or `b` (a ratio's
//!   operands), `lo` or `hi` (the interval's ends), `interval` (both: "LO..HI", "LO-HI" or
//!   "LO to HI" before the comment) or `none` (no number: the reference only asserts a verdict);
//! - the verdict the prose relies on: `agrees`, `disagrees`, `inconclusive` or `not-tested`;
//! - `"TEXT"` (anywhere after the experiment): words of the row's claim or of the check's
//!   expression, to pick one row among several of the experiment.
//!
//! The number must end the text before the comment, optionally followed by a unit (`x`, ` s`,
//! ` Mbit/s`, ` Gbit/s`). It matches the report when it is the report's number, or that number
//! rounded to the quote's decimals. A reference that resolves to no row, or to several rows
//! with different numbers or verdicts, is an error, as is a verdict that is not the row's.

use std::collections::BTreeMap;

use super::published::{Check, PublishedReport, Row, Table};

/// Start of a reference comment.
pub(crate) const REF_START: &str = "<!-- ref ";
const COMMENT_END: &str = "-->";
const UNITS: [&str; 5] = [" Mbit/s", " Gbit/s", " s", "x", " %"];

/// The quoted field of a row's check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Value,
    A,
    B,
    Lo,
    Hi,
    Interval,
    None,
}

/// A parsed reference comment.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reference {
    paper: String,
    experiment: String,
    table: Option<Table>,
    at: Option<String>,
    field: Field,
    verdict: Option<String>,
    text: Option<String>,
}

fn parse_reference(body: &str) -> Result<Reference, String> {
    let (words, text) = match body.split_once('"') {
        Some((before, quoted)) => {
            let (text, after) = quoted
                .split_once('"')
                .ok_or_else(|| format!("unclosed quote in `{body}`"))?;
            (format!("{before} {after}"), Some(text.to_string()))
        }
        None => (body.to_string(), None),
    };
    let mut words = words.split_whitespace();
    let paper = words
        .next()
        .ok_or("a reference names no report")?
        .to_string();
    let experiment = words
        .next()
        .ok_or_else(|| format!("reference to {paper} names no experiment"))?
        .to_string();
    let mut reference = Reference {
        paper,
        experiment,
        table: None,
        at: None,
        field: Field::Value,
        verdict: None,
        text,
    };
    for word in words {
        match word {
            "claim" => reference.table = Some(Table::Claims),
            "target" => reference.table = Some(Table::Targets),
            "value" => reference.field = Field::Value,
            "a" => reference.field = Field::A,
            "b" => reference.field = Field::B,
            "lo" => reference.field = Field::Lo,
            "hi" => reference.field = Field::Hi,
            "interval" => reference.field = Field::Interval,
            "none" => reference.field = Field::None,
            "agrees" | "disagrees" | "inconclusive" => reference.verdict = Some(word.into()),
            "not-tested" => reference.verdict = Some("not tested".into()),
            at if at.starts_with('@') => reference.at = Some(at[1..].to_string()),
            other => return Err(format!("unknown word `{other}` in reference `{body}`")),
        }
    }
    Ok(reference)
}

/// The sweep value of a check's first operand: "s median throughput @ 5 / ..." -> "5".
fn first_operand_at(check: &Check) -> Option<&str> {
    let first = check.expression.split(" / ").next()?;
    let at = first.rsplit_once(" @ ")?.1;
    Some(at.trim())
}

/// The strings a reference quotes from one check, e.g. ["1.59", "4.99"] for an interval.
fn quoted(check: &Check, field: Field) -> Option<Vec<String>> {
    let one = |s: &String| Some(vec![s.clone()]);
    match field {
        Field::Value => one(&check.value),
        Field::A => one(&check.operands.as_ref()?.0),
        Field::B => one(&check.operands.as_ref()?.1),
        Field::Lo => one(&check.interval.as_ref()?.0),
        Field::Hi => one(&check.interval.as_ref()?.1),
        Field::Interval => {
            let (lo, hi) = check.interval.as_ref()?;
            Some(vec![lo.clone(), hi.clone()])
        }
        Field::None => Some(Vec::new()),
    }
}

/// What a reference resolves to: the numbers it quotes and the row's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Resolved {
    numbers: Vec<String>,
    verdict: String,
}

fn resolve(
    reference: &Reference,
    reports: &BTreeMap<String, PublishedReport>,
) -> Result<Resolved, String> {
    let report = reports
        .get(&reference.paper)
        .ok_or_else(|| format!("no report docs/results/{}/report.md", reference.paper))?;
    let rows: Vec<&Row> = report
        .rows
        .iter()
        .filter(|r| r.experiment == reference.experiment)
        .filter(|r| reference.table.is_none_or(|t| r.table == t))
        .collect();
    if rows.is_empty() {
        return Err(format!(
            "{} has no claims or targets row for experiment `{}`",
            reference.paper, reference.experiment
        ));
    }
    let mut found: Vec<(Resolved, String)> = Vec::new();
    for row in rows {
        for check in &row.checks {
            if let Some(at) = &reference.at {
                if first_operand_at(check) != Some(at.as_str()) {
                    continue;
                }
            }
            if let Some(text) = &reference.text {
                if !row.says.contains(text.as_str()) && !check.expression.contains(text.as_str()) {
                    continue;
                }
            }
            if let Some(numbers) = quoted(check, reference.field) {
                let resolved = Resolved {
                    numbers,
                    verdict: row.verdict.clone(),
                };
                let label = format!("{} ({}): {}", row.figure, row.verdict, check.expression);
                found.push((resolved, label));
            }
        }
    }
    let Some((first, _)) = found.first() else {
        return Err(format!(
            "no check of {} `{}` matches the reference (its @X, field or \"TEXT\")",
            reference.paper, reference.experiment
        ));
    };
    if found.iter().any(|(r, _)| r != first) {
        let candidates: Vec<String> = found.iter().map(|(_, label)| label.clone()).collect();
        return Err(format!(
            "the reference matches several checks with different numbers or verdicts; add \
             claim/target, @X or \"TEXT\": {}",
            candidates.join(" | ")
        ));
    }
    Ok(first.clone())
}

/// Decimal places of a number as written.
fn decimals(number: &str) -> usize {
    number.split_once('.').map_or(0, |(_, d)| d.len())
}

/// Whether `quote` is the report's `number` or that number rounded to the quote's decimals.
fn matches(quote: &str, number: &str) -> bool {
    if quote == number {
        return true;
    }
    let (Ok(q), Ok(n)) = (quote.parse::<f64>(), number.parse::<f64>()) else {
        return false;
    };
    let places = decimals(quote);
    places < decimals(number)
        && (n - q).abs() <= 0.5 * 10f64.powi(-i32::try_from(places).unwrap_or(0)) + 1e-9
}

/// The trailing number of `text` and where it starts: "gives 3.93x" -> (11, "3.93").
fn trailing_number(text: &str) -> Option<(usize, &str)> {
    let mut text = text.trim_end();
    for unit in UNITS {
        if let Some(stripped) = text.strip_suffix(unit) {
            text = stripped;
            break;
        }
    }
    // Back over digits and one decimal point, so "1.59..4.99" ends with "4.99".
    let mut start = None;
    let mut seen_point = false;
    for (i, c) in text.char_indices().rev() {
        match c {
            '0'..='9' => start = Some(i),
            '.' if !seen_point && start.is_some() => seen_point = true,
            _ => break,
        }
    }
    let start = start?;
    let number = &text[start..];
    number.parse::<f64>().ok().map(|_| (start, number))
}

/// The numbers quoted before a reference and their byte ranges in `before`.
fn quoted_numbers(before: &str, field: Field) -> Option<Vec<(usize, usize)>> {
    match field {
        Field::None => Some(Vec::new()),
        Field::Interval => {
            let (hi_start, hi) = trailing_number(before)?;
            let rest = &before[..hi_start];
            let rest = ["..", "-", " to "]
                .iter()
                .find_map(|sep| rest.strip_suffix(sep))?;
            let (lo_start, lo) = trailing_number(rest)?;
            Some(vec![
                (lo_start, lo_start + lo.len()),
                (hi_start, hi_start + hi.len()),
            ])
        }
        _ => {
            let (start, number) = trailing_number(before)?;
            Some(vec![(start, start + number.len())])
        }
    }
}

/// One disagreement between a document and the reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LineProblem {
    /// 1-based line number.
    pub(crate) line: usize,
    /// What is wrong.
    pub(crate) message: String,
}

/// Checks every reference of `text` against `reports`; with `fix`, returns the text with each
/// quoted number that differs from its report replaced by the report's. Verdicts and
/// unresolvable references cannot be fixed by rewriting a number, so they stay problems.
pub(crate) fn check_references(
    text: &str,
    reports: &BTreeMap<String, PublishedReport>,
    fix: bool,
) -> (String, Vec<LineProblem>, usize) {
    let mut problems = Vec::new();
    let mut out = String::with_capacity(text.len());
    let mut count = 0;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let mut fixed = String::new();
        let mut rest = line;
        while let Some(at) = rest.find(REF_START) {
            count += 1;
            let mut before = rest[..at].to_string();
            let after = &rest[at + REF_START.len()..];
            let Some(end) = after.find(COMMENT_END) else {
                problems.push(LineProblem {
                    line: index + 1,
                    message: "unclosed reference comment".into(),
                });
                break;
            };
            let body = after[..end].trim();
            let comment = &rest[at..at + REF_START.len() + end + COMMENT_END.len()];
            let outcome = parse_reference(body)
                .and_then(|r| resolve(&r, reports).map(|resolved| (r, resolved)));
            match outcome {
                Err(message) => problems.push(LineProblem {
                    line: index + 1,
                    message,
                }),
                Ok((reference, resolved)) => {
                    if let Some(expected) = &reference.verdict {
                        if *expected != resolved.verdict {
                            problems.push(LineProblem {
                                line: index + 1,
                                message: format!(
                                    "`{body}`: the prose relies on \"{expected}\", the report \
                                     now says \"{}\"; rewrite the sentence and the reference",
                                    resolved.verdict
                                ),
                            });
                        }
                    }
                    match quoted_numbers(&before, reference.field) {
                        None => problems.push(LineProblem {
                            line: index + 1,
                            message: format!("`{body}`: no quoted number right before it"),
                        }),
                        Some(ranges) => {
                            // Replace from the last range so earlier offsets stay valid.
                            for (range, number) in ranges.iter().zip(&resolved.numbers).rev() {
                                let quote = before[range.0..range.1].to_string();
                                if matches(&quote, number) {
                                    continue;
                                }
                                if fix {
                                    before.replace_range(range.0..range.1, number);
                                } else {
                                    problems.push(LineProblem {
                                        line: index + 1,
                                        message: format!(
                                            "quotes {quote} where the report has {number} \
                                             (`{body}`)"
                                        ),
                                    });
                                }
                            }
                        }
                    }
                }
            }
            fixed.push_str(&before);
            fixed.push_str(comment);
            rest = &rest[at + comment.len()..];
        }
        fixed.push_str(rest);
        out.push_str(&fixed);
    }
    (out, problems, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reports() -> BTreeMap<String, PublishedReport> {
        let text = "\
## Paper vs lab: p

| figure | experiment | paper says | we measured | verdict | why / note |
|---|---|---|---|---|---|
| Fig. 14 | grid | beats direct | s median throughput @ 0 / direct median throughput @ 0 = 0.108 Mbit/s / 0.055 Mbit/s = 1.95, 95 % interval 1.33..1.96 (5 paired runs), needs > 1: met by 0.955; s median throughput @ 5 / direct median throughput @ 5 = 0.084 Mbit/s / 0.021 Mbit/s = 3.93, 95 % interval 1.59..4.99 (5 paired runs), needs > 1: met by 2.93 | agrees |  |

## midway's targets (not the paper's findings)

| figure | experiment | paper says | we measured | verdict | why / note |
|---|---|---|---|---|---|
| issue 4 | grid | spool frees the server | m median remote_segment_seconds @ 3 / h median remote_segment_seconds @ 3 = 2.616 s / 3.035 s = 0.862, 95 % interval 0.802..0.895 (5 paired runs), needs < 0.8: missed by 0.062 | **disagrees** |  |
";
        BTreeMap::from([("p".to_string(), PublishedReport::parse(text))])
    }

    fn problems(doc: &str) -> Vec<String> {
        let (_, problems, _) = check_references(doc, &reports(), false);
        problems.into_iter().map(|p| p.message).collect()
    }

    #[test]
    fn a_quote_that_matches_its_row_passes() {
        assert!(problems("up to 3.93x<!-- ref p grid claim @5 agrees -->.\n").is_empty());
        assert!(problems("(interval 1.59..4.99<!-- ref p grid claim @5 interval -->)").is_empty());
        assert!(problems("from 0.084<!-- ref p grid claim @5 a --> Mbit/s").is_empty());
        assert!(problems("0.86x<!-- ref p grid target disagrees -->").is_empty());
        assert!(problems("2.62 s<!-- ref p grid target a -->").is_empty());
        assert!(problems("misses it<!-- ref p grid \"frees\" none disagrees -->").is_empty());
    }

    #[test]
    fn a_drifted_number_fails_and_fix_rewrites_it() {
        let doc = "to 3.87x<!-- ref p grid claim @5 --> (10 %)\n";
        let found = problems(doc);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("quotes 3.87 where the report has 3.93"));
        let (fixed, left, count) = check_references(doc, &reports(), true);
        assert_eq!(fixed, "to 3.93x<!-- ref p grid claim @5 --> (10 %)\n");
        assert!(left.is_empty());
        assert_eq!(count, 1);
        let (fixed, _, _) =
            check_references("1.2-4.99<!-- ref p grid @5 interval -->", &reports(), true);
        assert_eq!(fixed, "1.59-4.99<!-- ref p grid @5 interval -->");
    }

    #[test]
    fn a_changed_verdict_or_an_unclear_reference_fails() {
        assert!(problems("3.93x<!-- ref p grid @5 disagrees -->")[0].contains("now says"));
        assert!(problems("1.95<!-- ref p grid -->")[0].contains("several checks"));
        assert!(problems("1.95<!-- ref p nothing -->")[0].contains("no claims or targets row"));
        assert!(problems("1.95<!-- ref q grid -->")[0].contains("no report"));
        assert!(problems("see<!-- ref p grid claim @5 -->")[0].contains("no quoted number"));
        assert!(problems("1.95<!-- ref p grid claim @0 sideways -->")[0].contains("unknown word"));
    }

    #[test]
    fn rounding_to_the_quotes_decimals_is_a_match() {
        assert!(matches("8.19", "8.190"));
        assert!(matches("0.57", "0.570"));
        assert!(matches("14.4", "14.375"));
        assert!(!matches("0.58", "0.570"));
        assert!(matches("3.9", "3.93"));
        assert!(!matches("3.8", "3.93"));
        assert!(
            !matches("3.930", "3.93"),
            "more decimals than the report has"
        );
    }
}
