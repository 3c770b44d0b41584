//! The verdict of every claim and target of a claims file against a set of records, as data: what
//! the report's tables show, for a program that compares two sets of records (the lab's artifact
//! check sets an artifact run's verdicts beside the committed report's). The verdicts are the
//! report's own ([`super::evaluate`]), so they follow whatever rules the report follows.

use crate::analysis::analyse;
use crate::RunRecord;

use super::evaluate::evaluate;
use super::model::ClaimsFile;

/// One claim or target as judged against the records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgedClaim {
    /// The paper's figure or table ("Fig. 8").
    pub figure: String,
    /// The experiment the claim is checked against.
    pub experiment: String,
    /// What the report's "we measured" column says.
    pub measured: String,
    /// The verdict's category as the report's counts name it: "agrees", "inconclusive",
    /// "disagrees", "not tested", "no data" or "invalid check".
    pub verdict: &'static str,
}

/// The verdicts of a claims file: its claims, then its targets, each in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdicts {
    /// One per `[[claims]]` entry.
    pub claims: Vec<JudgedClaim>,
    /// One per `[[targets]]` entry.
    pub targets: Vec<JudgedClaim>,
}

/// Judges every claim and target of `file` against `records`, with gains of splitting computed
/// against `baseline_case`, exactly as the report written from these records would.
pub fn verdicts(file: &ClaimsFile, records: &[RunRecord], baseline_case: &str) -> Verdicts {
    let analysis = analyse(records, baseline_case);
    let judged = |claims| {
        evaluate(claims, &analysis)
            .into_iter()
            .map(|row| JudgedClaim {
                verdict: row.verdict.category(),
                figure: row.figure,
                experiment: row.experiment,
                measured: row.measured,
            })
            .collect()
    };
    Verdicts {
        claims: judged(&file.claims),
        targets: judged(&file.targets),
    }
}
