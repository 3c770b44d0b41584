//! Which claims a subset covers, and the artifact run's verdicts set beside the committed ones.
//! Pure: the verdicts come from `midway_report::claims::verdicts`, the cells from the plans.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use midway_report::claims::{
    AxisValue, Claim, JudgedClaim, Operand, GOS_METRIC, GOS_POSITIVE_SHARE_METRIC,
};

use crate::plan::Point;

/// One case at one sweep value of one experiment: what a claim's check reads, and what a plan
/// measures (at some number of repetitions).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cell {
    pub experiment: String,
    pub case: String,
    /// The record's sweep value as JSON text (`1000000.0`, `"miss"`); `None` without a sweep.
    pub x: Option<String>,
}

impl Cell {
    pub(crate) fn of(point: &Point) -> Cell {
        let x = point
            .sweep_param
            .as_ref()
            .and_then(|label| point.params.get(label))
            .map(|value| value.to_string());
        Cell {
            experiment: point.experiment.clone(),
            case: point.case.clone(),
            x,
        }
    }

    /// Whether a check's `x` names this cell's sweep value, as the report's evaluation matches
    /// them ([`AxisValue::matches`]).
    fn at(&self, x: &AxisValue) -> bool {
        let value: Option<serde_json::Value> =
            self.x.as_deref().and_then(|t| serde_json::from_str(t).ok());
        match value {
            Some(serde_json::Value::Number(n)) => x.matches(&n.to_string(), n.as_f64()),
            Some(serde_json::Value::String(s)) => x.matches(&s, None),
            _ => false,
        }
    }
}

/// The cells of `plan` that `claim`'s check reads, by the rules of the claims format: an operand
/// at its `x`, at the other operand's when it has none, at every sweep value of case A when
/// neither has one (B then at the same values); a gain of splitting also reads the baseline case
/// at the same cells. Empty for a claim without a check.
pub(crate) fn cells_read(claim: &Claim, plan: &BTreeSet<Cell>, baseline: &str) -> BTreeSet<Cell> {
    let Some(check) = &claim.check else {
        return BTreeSet::new();
    };
    let experiment_of = |operand: &Operand| {
        operand
            .experiment
            .clone()
            .unwrap_or_else(|| claim.experiment.clone())
    };
    let (xa, xb) = match (
        check.a.x.as_ref(),
        check.b.as_ref().and_then(|b| b.x.as_ref()),
    ) {
        (Some(a), Some(b)) => (Some(a), Some(b)),
        (Some(x), None) | (None, Some(x)) => (Some(x), Some(x)),
        (None, None) => (None, None),
    };
    let select = |operand: &Operand, x: Option<&AxisValue>, at_xs: Option<&BTreeSet<Cell>>| {
        let experiment = experiment_of(operand);
        let metric = operand.metric.as_deref().unwrap_or(&check.metric);
        let paired = metric == GOS_METRIC || metric == GOS_POSITIVE_SHARE_METRIC;
        let own: BTreeSet<Cell> = plan
            .iter()
            .filter(|c| c.experiment == experiment && c.case == operand.case)
            .filter(|c| match (x, at_xs) {
                (Some(x), _) => c.at(x),
                (None, Some(cells)) => cells.iter().any(|a| a.x == c.x),
                (None, None) => true,
            })
            .cloned()
            .collect();
        let baseline_cells: BTreeSet<Cell> = if paired {
            plan.iter()
                .filter(|c| c.experiment == experiment && c.case == baseline)
                .filter(|c| own.iter().any(|o| o.x == c.x))
                .cloned()
                .collect()
        } else {
            BTreeSet::new()
        };
        (own, baseline_cells)
    };
    let (a_cells, a_baseline) = select(&check.a, xa, None);
    let mut cells: BTreeSet<Cell> = a_cells.union(&a_baseline).cloned().collect();
    if let Some(b) = &check.b {
        let (b_cells, b_baseline) = select(b, xb, Some(&a_cells));
        cells.extend(b_cells);
        cells.extend(b_baseline);
    }
    cells
}

/// How much of what a claim reads the subset measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coverage {
    /// Every cell the claim reads in the full run.
    Covered,
    /// Some of them: its verdict would rest on fewer cells than the committed one.
    Partly,
    /// None (or the claim reads nothing: no check).
    Not,
}

/// The coverage of a claim reading `needed` (from the full plan) by a subset measuring `subset`.
pub(crate) fn coverage(needed: &BTreeSet<Cell>, subset: &BTreeSet<Cell>) -> Coverage {
    let measured = needed.iter().filter(|c| subset.contains(*c)).count();
    if needed.is_empty() || measured == 0 {
        Coverage::Not
    } else if measured == needed.len() {
        Coverage::Covered
    } else {
        Coverage::Partly
    }
}

/// A claim's artifact verdict against its committed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Outcome {
    /// Same verdict.
    Matches,
    /// Another verdict, one of them undecided ("inconclusive", "no data").
    Differs,
    /// "agrees" against "disagrees": the two runs decided opposite ways.
    Opposes,
    /// The subset measures part of what the claim reads: not compared.
    PartlyCovered,
    /// The subset measures nothing the claim reads.
    NotCovered,
    /// The claims file says why the lab does not test the claim (or it has no check).
    NotTested,
}

impl Outcome {
    pub(crate) fn text(self) -> &'static str {
        match self {
            Outcome::Matches => "match",
            Outcome::Differs => "differs",
            Outcome::Opposes => "differs (opposite verdict)",
            Outcome::PartlyCovered => "partly covered",
            Outcome::NotCovered => "not covered",
            Outcome::NotTested => "not tested",
        }
    }
}

/// The verdict category the report gives a claim the lab does not test.
pub(crate) const NOT_TESTED: &str = "not tested";

/// One line of the comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    /// "claim 4" or "target 2": the entry's place in the claims file, from 1.
    pub id: String,
    pub figure: String,
    pub experiment: String,
    pub committed: &'static str,
    /// The artifact run's verdict, when it measured what the claim reads.
    pub artifact: Option<&'static str>,
    pub outcome: Outcome,
}

/// Sets each entry's artifact verdict beside its committed one. `kind` names the entries
/// ("claim", "target"); the three lists are in claims-file order.
pub(crate) fn compare(
    kind: &str,
    committed: &[JudgedClaim],
    artifact: &[JudgedClaim],
    coverage: &[Coverage],
) -> Vec<Row> {
    committed
        .iter()
        .zip(artifact)
        .zip(coverage)
        .enumerate()
        .map(|(index, ((committed, artifact), coverage))| {
            let outcome = match coverage {
                _ if committed.verdict == NOT_TESTED => Outcome::NotTested,
                Coverage::Not => Outcome::NotCovered,
                Coverage::Partly => Outcome::PartlyCovered,
                Coverage::Covered if committed.verdict == artifact.verdict => Outcome::Matches,
                Coverage::Covered => match (committed.verdict, artifact.verdict) {
                    ("agrees", "disagrees") | ("disagrees", "agrees") => Outcome::Opposes,
                    _ => Outcome::Differs,
                },
            };
            let shown = matches!(
                outcome,
                Outcome::Matches | Outcome::Differs | Outcome::Opposes | Outcome::PartlyCovered
            );
            Row {
                id: format!("{kind} {}", index + 1),
                figure: committed.figure.clone(),
                experiment: committed.experiment.clone(),
                committed: committed.verdict,
                artifact: shown.then_some(artifact.verdict),
                outcome,
            }
        })
        .collect()
}

/// "12 covered: 10 match, 2 differ (1 opposite); 1 partly covered, 40 not covered, 18 not
/// tested".
pub(crate) fn summary(rows: &[Row]) -> String {
    let count = |outcome: Outcome| rows.iter().filter(|r| r.outcome == outcome).count();
    let matches = count(Outcome::Matches);
    let opposite = count(Outcome::Opposes);
    let differ = count(Outcome::Differs) + opposite;
    format!(
        "{} covered: {matches} match, {differ} differ ({opposite} opposite); {} partly covered, \
         {} not covered, {} not tested",
        matches + differ,
        count(Outcome::PartlyCovered),
        count(Outcome::NotCovered),
        count(Outcome::NotTested)
    )
}

/// The markdown table of `rows` (every row with `all`, else those the subset covers at least
/// partly), one paper's.
pub(crate) fn table(paper: &str, rows: &[Row], all: bool) -> String {
    let mut text = String::new();
    for row in rows {
        let listed = all
            || matches!(
                row.outcome,
                Outcome::Matches | Outcome::Differs | Outcome::Opposes | Outcome::PartlyCovered
            );
        if listed {
            let _ = writeln!(
                text,
                "| {paper} | {} | {} | {} | {} | {} | {} |",
                row.id,
                row.figure.replace('|', "\\|"),
                row.experiment,
                row.committed,
                row.artifact.unwrap_or("-"),
                row.outcome.text()
            );
        }
    }
    text
}

/// The header of [`table`].
pub(crate) const TABLE_HEADER: &str = "| paper | entry | figure | experiment | committed report | \
artifact run | comparison |\n|---|---|---|---|---|---|---|\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(experiment: &str, case: &str, x: Option<&str>) -> Cell {
        Cell {
            experiment: experiment.into(),
            case: case.into(),
            x: x.map(str::to_string),
        }
    }

    fn claims(text: &str) -> Vec<Claim> {
        midway_report::claims::parse(text).unwrap().claims
    }

    fn judged(verdict: &'static str) -> JudgedClaim {
        JudgedClaim {
            figure: "Fig. 1".into(),
            experiment: "e".into(),
            measured: String::new(),
            verdict,
        }
    }

    /// Experiment `e` sweeps x over 0, 1 and 2 ("miss", "hit" for `t`) with cases direct,
    /// proxy and other.
    fn full_plan() -> BTreeSet<Cell> {
        let mut plan = BTreeSet::new();
        for case in ["direct", "proxy", "other"] {
            for x in ["0.0", "1.0", "2.0"] {
                plan.insert(cell("e", case, Some(x)));
            }
            for x in ["\"miss\"", "\"hit\""] {
                plan.insert(cell("t", case, Some(x)));
            }
        }
        plan
    }

    #[test]
    fn a_check_reads_its_cells_by_the_claims_formats_rules() {
        let file = r#"
paper = "p"
[[claims]]
figure = "f"
experiment = "e"
says = "proxy beats direct at 1"
[claims.check]
a = { case = "proxy", x = 1 }
b = { case = "direct" }
op = ">"
value = 1.0
open_side = "an ordering"
[[claims]]
figure = "f"
experiment = "e"
says = "proxy beats direct everywhere"
[claims.check]
a = { case = "proxy" }
b = { case = "direct" }
op = ">"
value = 1.0
open_side = "an ordering"
[[claims]]
figure = "f"
experiment = "t"
says = "a gain of splitting on a hit, against another experiment's miss"
[claims.check]
metric = "gos"
a = { case = "proxy", x = "hit" }
b = { case = "other", x = 0, experiment = "e", metric = "throughput" }
op = ">"
value = 1.0
open_side = "an ordering"
[[claims]]
figure = "f"
experiment = "e"
says = "no check"
not_tested = "why"
"#;
        let claims = claims(file);
        let plan = full_plan();
        let read = |i: usize| cells_read(&claims[i], &plan, "direct");
        assert_eq!(
            read(0),
            [
                cell("e", "direct", Some("1.0")),
                cell("e", "proxy", Some("1.0"))
            ]
            .into()
        );
        assert_eq!(read(1).len(), 6, "both cases at every sweep value");
        assert_eq!(
            read(2),
            [
                cell("e", "other", Some("0.0")),
                cell("t", "direct", Some("\"hit\"")),
                cell("t", "proxy", Some("\"hit\"")),
            ]
            .into(),
            "a gain reads the baseline at its cell; B is read in its own experiment"
        );
        assert!(read(3).is_empty());
    }

    #[test]
    fn coverage_is_whole_partial_or_none() {
        let needed: BTreeSet<Cell> =
            [cell("e", "a", Some("1.0")), cell("e", "b", Some("1.0"))].into();
        let subset: BTreeSet<Cell> = [cell("e", "a", Some("1.0"))].into();
        assert_eq!(coverage(&needed, &needed), Coverage::Covered);
        assert_eq!(coverage(&needed, &subset), Coverage::Partly);
        assert_eq!(coverage(&needed, &BTreeSet::new()), Coverage::Not);
        assert_eq!(coverage(&BTreeSet::new(), &subset), Coverage::Not);
    }

    #[test]
    fn verdicts_compare_only_where_the_subset_measured_what_the_claim_reads() {
        let committed = [
            judged("agrees"),
            judged("agrees"),
            judged("agrees"),
            judged("disagrees"),
            judged("inconclusive"),
            judged("not tested"),
            judged("agrees"),
        ];
        let artifact = [
            judged("agrees"),
            judged("inconclusive"),
            judged("disagrees"),
            judged("disagrees"),
            judged("no data"),
            judged("not tested"),
            judged("agrees"),
        ];
        use Coverage::*;
        let coverage = [Covered, Covered, Covered, Partly, Not, Covered, Covered];
        let rows = compare("claim", &committed, &artifact, &coverage);
        let outcomes: Vec<Outcome> = rows.iter().map(|r| r.outcome).collect();
        assert_eq!(
            outcomes,
            [
                Outcome::Matches,
                Outcome::Differs,
                Outcome::Opposes,
                Outcome::PartlyCovered,
                Outcome::NotCovered,
                Outcome::NotTested,
                Outcome::Matches,
            ]
        );
        assert_eq!(rows[1].id, "claim 2");
        assert_eq!(
            rows[4].artifact, None,
            "no verdict shown for what was not measured"
        );
        assert_eq!(
            summary(&rows),
            "4 covered: 2 match, 2 differ (1 opposite); 1 partly covered, 1 not covered, 1 not \
             tested"
        );
        let table = table("p", &rows, false);
        assert_eq!(table.lines().count(), 5, "{table}");
        assert!(
            table.contains(
                "| p | claim 3 | Fig. 1 | e | agrees | disagrees | differs (opposite verdict) |"
            ),
            "{table}"
        );
    }
}
