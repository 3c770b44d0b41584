//! A published report read back: its "paper vs lab" and "midway's targets" rows, each check's
//! numbers as the report prints them, and the header's source trees. The summaries quote these,
//! so they are read from the report's text (what a reader sees), not recomputed from records.

use crate::claims::VERDICTS_LINE;

/// Heading prefix of the paper's claims table.
const CLAIMS_HEADING: &str = "## Paper vs lab";
/// Heading prefix of midway's targets table.
const TARGETS_HEADING: &str = "## midway's targets";
/// Line prefix counting the targets by verdict.
const TARGET_VERDICTS_LINE: &str = "Verdicts of the targets:";
/// Header line naming the trees the records come from.
const SOURCE_TREES_LINE: &str = "- Source trees: ";

/// Which of a report's two tables a row is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// The paper's claims.
    Claims,
    /// midway's own targets.
    Targets,
}

/// One compared number of a row: "A / B = a / b = value, 95 % interval lo..hi, ...", or
/// "case @ x: value" in a row without a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What is compared, e.g. "store-and-forward median throughput @ 5 / direct median
    /// throughput @ 5".
    pub expression: String,
    /// The compared number as printed ("3.93").
    pub value: String,
    /// The interval's ends as printed, when the row has an interval.
    pub interval: Option<(String, String)>,
    /// A's and B's numbers of a ratio, as printed without their unit ("0.084", "0.021").
    pub operands: Option<(String, String)>,
}

/// One row of a claims or targets table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The table it is in.
    pub table: Table,
    /// "Fig. 14 (grid)", "issue 4", ...
    pub figure: String,
    /// The experiment the row reads.
    pub experiment: String,
    /// The claim in the report's words.
    pub says: String,
    /// Its compared numbers, in the order the report prints them.
    pub checks: Vec<Check>,
    /// "agrees", "inconclusive", "disagrees", "not tested", "no data" or "invalid check".
    pub verdict: String,
}

/// What the summaries read from one report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishedReport {
    /// Rows of both tables, claims first.
    pub rows: Vec<Row>,
    /// The header's source trees, e.g. "`ed593c2` clean: 1780 records".
    pub source_trees: Option<String>,
    /// The counts the report itself prints for its claims, e.g. "28 agree, 5 inconclusive, ...".
    pub stated_claim_counts: Option<String>,
    /// The counts the report itself prints for its targets.
    pub stated_target_counts: Option<String>,
}

/// The verdict categories in the order a count lists them (the report's own order).
const CATEGORIES: [(&str, &str); 6] = [
    ("agrees", "agree"),
    ("inconclusive", "inconclusive"),
    ("disagrees", "disagree"),
    ("not tested", "not tested"),
    ("no data", "no data"),
    ("invalid check", "invalid check"),
];

impl PublishedReport {
    /// Reads a report's text; rows it cannot split into six cells are skipped (the tables are
    /// machine-written, so that only happens to a hand-edited report).
    pub fn parse(text: &str) -> Self {
        let mut report = PublishedReport::default();
        let mut table = None;
        for line in text.lines() {
            if let Some(trees) = line.strip_prefix(SOURCE_TREES_LINE) {
                report.source_trees = Some(trees.trim().to_string());
            } else if line.starts_with(CLAIMS_HEADING) {
                table = Some(Table::Claims);
            } else if line.starts_with(TARGETS_HEADING) {
                table = Some(Table::Targets);
            } else if line.starts_with("## ") {
                table = None;
            } else if let Some(counts) = line.strip_prefix(VERDICTS_LINE) {
                report.stated_claim_counts = Some(counts.trim().trim_end_matches('.').into());
            } else if let Some(counts) = line.strip_prefix(TARGET_VERDICTS_LINE) {
                report.stated_target_counts = Some(counts.trim().trim_end_matches('.').into());
            } else if let Some(table) = table {
                if let Some(row) = parse_row(table, line) {
                    report.rows.push(row);
                }
            }
        }
        report
    }

    /// "28 agree, 5 inconclusive, 5 disagree, 18 not tested" for one table, counted from its
    /// rows (no data and invalid checks only when there are some, as the report counts).
    pub fn counts(&self, table: Table) -> String {
        CATEGORIES
            .iter()
            .map(|(category, word)| {
                let n = self
                    .rows
                    .iter()
                    .filter(|r| r.table == table && r.verdict == *category)
                    .count();
                (category, word, n)
            })
            .filter(|(category, _, n)| *n > 0 || !matches!(**category, "no data" | "invalid check"))
            .map(|(_, word, n)| format!("{n} {word}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether the report has rows in `table`.
    pub fn has(&self, table: Table) -> bool {
        self.rows.iter().any(|r| r.table == table)
    }
}

/// The cells of a markdown table row, split at unescaped bars and unescaped again.
fn cells(line: &str) -> Option<Vec<String>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    let mut cells = vec![String::new()];
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                chars.next();
                cells.last_mut()?.push('|');
            }
            '|' => cells.push(String::new()),
            other => cells.last_mut()?.push(other),
        }
    }
    Some(cells.into_iter().map(|c| c.trim().to_string()).collect())
}

fn parse_row(table: Table, line: &str) -> Option<Row> {
    let cells = cells(line)?;
    let [figure, experiment, says, measured, verdict, _why] =
        <[String; 6]>::try_from(cells).ok()?;
    if figure == "figure" || figure.starts_with("---") {
        return None;
    }
    let verdict = verdict.replace("**", "");
    // "agrees", "not tested: why", "agrees; load-sensitive (...): ...".
    let verdict = verdict
        .split([':', ';'])
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    Some(Row {
        table,
        figure,
        experiment,
        says,
        checks: measured.split("; ").filter_map(parse_check).collect(),
        verdict,
    })
}

/// The leading number of `text` ("0.084 Mbit/s" -> "0.084"), if it starts with one.
pub(crate) fn leading_number(text: &str) -> Option<&str> {
    let text = text.trim_start();
    let end = text
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || c == '.' || (i == 0 && c == '-')))
        .map_or(text.len(), |(i, _)| i);
    let number = text[..end].trim_end_matches('.');
    number.parse::<f64>().ok().map(|_| number)
}

fn parse_check(segment: &str) -> Option<Check> {
    let Some((expression, rest)) = segment.split_once(" = ") else {
        // A row without a check lists its values: "[median page load s: ]case @ x: value".
        let (expression, value) = segment.rsplit_once(": ")?;
        return Some(Check {
            expression: expression.to_string(),
            value: leading_number(value)?.to_string(),
            interval: None,
            operands: None,
        });
    };
    let (head, interval) = match rest.find("interval ") {
        Some(at) => {
            let ends = &rest[at + "interval ".len()..];
            let (lo, hi) = ends.split_once("..")?;
            let head = rest[..at].rsplit_once(", ").map_or(rest, |(h, _)| h);
            let interval = (
                leading_number(lo)?.to_string(),
                leading_number(hi)?.to_string(),
            );
            (head, Some(interval))
        }
        None => (rest.split(", ").next().unwrap_or(rest), None),
    };
    // A paired median is judged on the median of the per-pair ratios, written after the two
    // operands' medians: "a / b, median of the paired ratios value".
    let split = head
        .rsplit_once(", median of the paired ratios ")
        .or_else(|| head.rsplit_once(" = "));
    let (operands, value) = match split {
        Some((operands, value)) => {
            let (a, b) = operands.split_once(" / ")?;
            let pair = (
                leading_number(a)?.to_string(),
                leading_number(b)?.to_string(),
            );
            (Some(pair), value)
        }
        None => (None, head),
    };
    Some(Check {
        expression: expression.to_string(),
        value: leading_number(value)?.to_string(),
        interval,
        operands,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "\
# Lab report: x
- Source trees: `ed593c2` clean: 1780 records; `1ac42e7` clean: 90 records

## Paper vs lab: x

Verdicts of the paper's claims: 1 agree, 0 inconclusive, 1 disagree, 1 not tested.

| figure | experiment | paper says | we measured | verdict | why / note |
|---|---|---|---|---|---|
| Fig. 14 | grid | beats \\| direct | s median throughput @ 0 / direct median throughput @ 0 = 0.108 Mbit/s / 0.055 Mbit/s = 1.95, 95 % interval 1.33..1.96 (5 paired runs), needs > 1: met by 0.955; s median throughput @ 5 / direct median throughput @ 5 = 0.084 Mbit/s / 0.021 Mbit/s = 3.93, 95 % interval 1.59..4.99 (5 paired runs), needs > 1: met by 2.93 | agrees |  |
| Fig. 8 | f8 | gos | s median gos @ 10 = 1.306 (5 pairs), 95 % interval 0.669..2.73 (5 runs), needs > 0: met by 1.31 | **disagrees** | why |
| Fig. 3 | t1 | pages | median page load s: direct @ 0: 4.2; squid @ 0: 4.1 | not tested: no mechanism |  |

## midway's targets (not the paper's findings)

Verdicts of the targets: 0 agree, 1 inconclusive, 0 disagree, 0 not tested.

| figure | experiment | paper says | we measured | verdict | why / note |
|---|---|---|---|---|---|
| issue 4 | b | spool | m median remote_segment_seconds @ 3 / h median remote_segment_seconds @ 3 = 2.616 s / 3.035 s = 0.862, 95 % interval 0.802..0.895 (5 paired runs), needs < 0.8: missed by 0.062 | inconclusive |  |
";

    #[test]
    fn reads_rows_checks_counts_and_trees() {
        let report = PublishedReport::parse(REPORT);
        assert_eq!(report.rows.len(), 4);
        let grid = &report.rows[0];
        assert_eq!(grid.says, "beats | direct");
        assert_eq!(grid.checks.len(), 2);
        assert_eq!(grid.checks[1].value, "3.93");
        assert_eq!(
            grid.checks[1].interval,
            Some(("1.59".to_string(), "4.99".to_string()))
        );
        assert_eq!(
            grid.checks[1].operands,
            Some(("0.084".to_string(), "0.021".to_string()))
        );
        assert_eq!(report.rows[1].checks[0].value, "1.306");
        assert_eq!(report.rows[1].checks[0].operands, None);
        assert_eq!(report.rows[1].verdict, "disagrees");
        assert_eq!(report.rows[2].verdict, "not tested");
        assert_eq!(
            report.rows[2].checks[0].expression,
            "median page load s: direct @ 0"
        );
        assert_eq!(report.rows[2].checks[1].value, "4.1");
        assert_eq!(report.rows[3].table, Table::Targets);
        assert_eq!(report.rows[3].checks[0].value, "0.862");
        assert_eq!(
            report.counts(Table::Claims),
            report.stated_claim_counts.clone().unwrap()
        );
        assert_eq!(
            report.counts(Table::Targets),
            report.stated_target_counts.clone().unwrap()
        );
        assert_eq!(
            report.source_trees.as_deref(),
            Some("`ed593c2` clean: 1780 records; `1ac42e7` clean: 90 records")
        );
    }

    #[test]
    fn a_paired_median_quotes_the_median_of_the_ratios() {
        let check = parse_check(
            "s-f median throughput @ 1 / direct median throughput @ 1 = 0.563 Mbit/s / 0.472 \
             Mbit/s, median of the paired ratios 1.19, 93.8 % interval 1.19..1.23 (5 paired runs), \
             needs within 1.15..1.35: met by 0.043",
        )
        .expect("a check");
        assert_eq!(check.value, "1.19");
        assert_eq!(
            check.operands,
            Some(("0.563".to_string(), "0.472".to_string()))
        );
        assert_eq!(
            check.interval,
            Some(("1.19".to_string(), "1.23".to_string()))
        );
    }

    #[test]
    fn leading_numbers() {
        assert_eq!(leading_number("0.084 Mbit/s"), Some("0.084"));
        assert_eq!(leading_number("-0.5x"), Some("-0.5"));
        assert_eq!(leading_number("1.306 (5 pairs)"), Some("1.306"));
        assert_eq!(leading_number("1.24 (5 and 5 runs)"), Some("1.24"));
        assert_eq!(leading_number("n/a"), None);
    }
}
