//! One reading of the papers' words: the conventions a claim's check follows when the paper says
//! "almost N-fold", "over X", "significantly", "not decreased" or "grows as T increases". The
//! rules and the reasons for them are written down once, in scenarios/README.md ("Reading the
//! papers' words"); this file is the same rules as code. A claim names its convention and quotes
//! the paper's words (`[claims.reading]`); [`Reading::problem`] says whether its check follows
//! the convention, and [`undeclared`] finds the claims whose words use a convention's phrase
//! without declaring one.

use serde::Deserialize;

use super::model::{Check, Claim, Criterion};
use super::GOS_METRIC;

/// "almost E" accepts E down to this share of it: [0.85 E, E].
pub const ALMOST_SHARE: f64 = 0.85;
/// The smallest effect a qualitative word ("significantly", "remarkably", "much higher")
/// admits: a ratio of at least this (or at most [`NO_EFFECT_BAND`] below one).
pub const SMALLEST_QUALITATIVE_RATIO: f64 = 1.10;
/// "not decreased", "almost identical": the ratio within this distance of one, the band a
/// qualitative word's smallest effect leaves out.
pub const NO_EFFECT_BAND: f64 = 0.10;
/// Relative slack when comparing a check's numbers with the convention's (decimals in TOML).
const SLACK: f64 = 1e-9;

/// The conventions a claim may declare (`convention` in `[claims.reading]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Convention {
    /// "almost E": the named quantity lies in [0.85 E, E] (two-sided, `within`).
    Almost,
    /// "over X", "more than X": strictly beyond X (one-sided, `>` or `<`).
    Over,
    /// "significantly", "remarkably", "much higher": a ratio of at least 1.10 (or at most 0.90).
    Qualitative,
    /// "not decreased", "almost identical", "remains constant": the ratio within 1 +- 0.10.
    NoEffect,
    /// "grows as T increases", "the more so the larger": a rank correlation over the whole sweep.
    Trend,
}

impl Convention {
    fn name(self) -> &'static str {
        match self {
            Convention::Almost => "almost",
            Convention::Over => "over",
            Convention::Qualitative => "qualitative",
            Convention::NoEffect => "no-effect",
            Convention::Trend => "trend",
        }
    }
}

/// How a claim reads the paper's words: its convention, the words quoted, and the paper's
/// number where the convention needs one.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reading {
    /// The convention the check follows.
    pub convention: Convention,
    /// The paper's words, quoted (they must contain the convention's phrase).
    pub words: String,
    /// "almost" / "over": the paper's number as a ratio of A to B ("four-fold" 4, "as well as" 1).
    #[serde(default)]
    pub fold: Option<f64>,
    /// ... or as the percentage A is below B ("a 50 % reduction": 50).
    #[serde(default)]
    pub percent_less: Option<f64>,
    /// ... or as the percentage A is above B ("30 % more": 30).
    #[serde(default)]
    pub percent_more: Option<f64>,
}

/// Phrases that call for a convention, lowercase, each with the conventions that read it. A
/// claim whose words hold one must declare one of them.
fn phrases_in(text: &str) -> Vec<(&'static str, &'static [Convention])> {
    use Convention::*;
    let text = text.to_lowercase();
    let mut found = Vec::new();
    let words = |list: &[&'static str]| list.iter().find(|w| text.contains(**w)).copied();
    if let Some(word) = words(&["almost"]) {
        found.push((word, &[Almost, NoEffect][..]));
    }
    if let Some(word) = number_after(&text, &["over ", "more than "]) {
        found.push((word, &[Over][..]));
    }
    if let Some(word) = words(&[
        "significant",
        "remarkabl",
        "dramatic",
        "substantial",
        "considerabl",
        "greatly",
    ]) {
        found.push((word, &[Qualitative][..]));
    } else if much_comparative(&text) {
        found.push(("much ...er", &[Qualitative][..]));
    }
    let no_effect = words(&["not decreased", "identical", "remains constant"]);
    // A claim of no change names what it does not change with ("remains constant as the RTT
    // grows"): that is its own convention, not a trend.
    if let Some(word) = trend_phrase(&text).filter(|_| no_effect.is_none()) {
        found.push((word, &[Trend][..]));
    }
    if let Some(word) = no_effect {
        found.push((word, &[NoEffect][..]));
    }
    found
}

/// A phrase of change along a sweep: "grows with", "the more so", "falling with", or "as"
/// followed within a few words by "increases", "grows" or "bigger" ("as the loss increases",
/// "shrinks as the remote RTT grows").
fn trend_phrase(text: &str) -> Option<&'static str> {
    const FIXED: [&str; 4] = [
        "grows with",
        "the more so",
        "falling with",
        "becomes greater",
    ];
    if let Some(word) = FIXED.iter().find(|w| text.contains(**w)) {
        return Some(word);
    }
    let rising = ["increase", "grow", "bigger", "larger"];
    text.match_indices("as ")
        .filter(|(at, _)| *at == 0 || !text[..*at].ends_with(|c: char| c.is_alphanumeric()))
        .any(|(at, _)| {
            let after: String = text[at + 3..].chars().take(60).collect();
            rising.iter().any(|r| after.contains(r))
        })
        .then_some("as ... increases")
}

/// "much" before a comparative: "much higher", "much more", "much quicker".
fn much_comparative(text: &str) -> bool {
    text.match_indices("much ").any(|(at, lead)| {
        let next = text[at + lead.len()..]
            .split(|c: char| !c.is_alphabetic())
            .next()
            .unwrap_or("");
        next.ends_with("er") || matches!(next, "more" | "less")
    })
}

/// The first of `leads` followed by a number ("over 50 %", "more than three-fold"), if any.
fn number_after(text: &str, leads: &[&'static str]) -> Option<&'static str> {
    const NUMBER_WORDS: [&str; 9] = [
        "two", "three", "four", "five", "ten", "twice", "double", "half", "a third",
    ];
    leads.iter().copied().find(|lead| {
        text.match_indices(lead).any(|(at, _)| {
            // "no more than two" bounds from above: not the convention of "over".
            if text[..at].ends_with("no ") {
                return false;
            }
            let rest = &text[at + lead.len()..];
            rest.starts_with(|c: char| c.is_ascii_digit())
                || NUMBER_WORDS.iter().any(|w| rest.starts_with(w))
        })
    })
}

/// The texts of a claim that carry the paper's words or our reading of them.
fn texts(claim: &Claim) -> impl Iterator<Item = &str> {
    [
        Some(claim.says.as_str()),
        claim.paper_value.as_deref(),
        claim.target.as_deref(),
        claim.reading.as_ref().map(|r| r.words.as_str()),
    ]
    .into_iter()
    .flatten()
}

/// Why a checked claim whose words use a convention's phrase does not declare a fitting
/// convention (`None`: it does, or it uses none, or it has no check to follow one).
pub(super) fn undeclared(claim: &Claim) -> Option<String> {
    claim.check.as_ref()?;
    let declared = claim.reading.as_ref().map(|r| r.convention);
    for text in texts(claim) {
        for (phrase, readings) in phrases_in(text) {
            if !declared.is_some_and(|d| readings.contains(&d)) {
                let names: Vec<&str> = readings.iter().map(|c| c.name()).collect();
                return Some(format!(
                    "its words say \"{phrase}\": declare `[claims.reading]` with convention {} \
                     (scenarios/README.md, \"Reading the papers' words\")",
                    names.join(" or ")
                ));
            }
        }
    }
    None
}

fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= SLACK * a.abs().max(b.abs()).max(1.0)
}

impl Reading {
    /// The paper's number as the ratio A / B the convention bounds, and for "almost" the other
    /// end of the accepted range.
    fn range(&self) -> Result<(f64, f64), String> {
        match (self.fold, self.percent_less, self.percent_more) {
            (Some(n), None, None) if n > 0.0 => Ok((n, ALMOST_SHARE * n)),
            (None, Some(x), None) if (0.0..100.0).contains(&x) => {
                Ok((1.0 - x / 100.0, 1.0 - ALMOST_SHARE * x / 100.0))
            }
            (None, None, Some(x)) if x > 0.0 => {
                Ok((1.0 + x / 100.0, 1.0 + ALMOST_SHARE * x / 100.0))
            }
            _ => Err(format!(
                "convention `{}` needs exactly one of `fold` (> 0), `percent_less` (0..100) or \
                 `percent_more` (> 0): the paper's number",
                self.convention.name()
            )),
        }
    }

    /// Why `check` does not follow this reading's convention (`None`: it does).
    pub fn problem(&self, check: &Check) -> Option<String> {
        let phrase_ok = phrases_in(&self.words)
            .iter()
            .any(|(_, readings)| readings.contains(&self.convention));
        if !phrase_ok {
            return Some(format!(
                "reading `{}`: the quoted words \"{}\" hold none of its phrases",
                self.convention.name(),
                self.words
            ));
        }
        let numbers_given =
            self.fold.is_some() || self.percent_less.is_some() || self.percent_more.is_some();
        if self.convention == Convention::Trend {
            return match (check.trend, numbers_given) {
                (None, _) => Some("reading `trend` needs a check with `trend`".into()),
                (Some(_), true) => Some("reading `trend` takes no paper number".into()),
                (Some(_), false) => None,
            };
        }
        if check.trend.is_some() {
            return Some(format!(
                "reading `{}` is not a trend: drop `trend` or read the words as a trend",
                self.convention.name()
            ));
        }
        let criterion = match check.criterion().map(|c| ratio_space(check, c)) {
            Ok(Ok(criterion)) => criterion,
            Ok(Err(why)) => return Some(why),
            // The check's own problem is reported already.
            Err(_) => return None,
        };
        let text = criterion.text();
        let wrong = |rule: String| {
            Some(format!(
                "reading `{}` (\"{}\") needs {rule}; the check accepts {text}",
                self.convention.name(),
                self.words
            ))
        };
        match self.convention {
            Convention::Almost => {
                let (paper, other) = match self.range() {
                    Ok(range) => range,
                    Err(why) => return Some(why),
                };
                let (low, high) = (paper.min(other), paper.max(other));
                match criterion {
                    Criterion::Within { low: l, high: h } if same(l, low) && same(h, high) => None,
                    _ => wrong(format!(
                        "the ratio within {low:.4}..{high:.4} (`within`, value {:.4}, tolerance \
                         {:.4})",
                        (low + high) / 2.0,
                        (high - low) / 2.0
                    )),
                }
            }
            Convention::Over => {
                let (paper, _) = match self.range() {
                    Ok(range) => range,
                    Err(why) => return Some(why),
                };
                let beyond_one = self.percent_less.is_none();
                match criterion {
                    Criterion::Above {
                        bound,
                        strict: true,
                    } if beyond_one && same(bound, paper) => None,
                    Criterion::Below {
                        bound,
                        strict: true,
                    } if !beyond_one && same(bound, paper) => None,
                    _ => wrong(format!(
                        "the ratio strictly {} {paper:.4}",
                        if beyond_one { "above" } else { "below" }
                    )),
                }
            }
            Convention::Qualitative => {
                if numbers_given {
                    return Some("reading `qualitative` takes no paper number".into());
                }
                let up = SMALLEST_QUALITATIVE_RATIO;
                let down = 1.0 - NO_EFFECT_BAND;
                let admits = match criterion {
                    Criterion::Above { bound, .. } => bound >= up - SLACK,
                    Criterion::Below { bound, .. } => bound <= down + SLACK,
                    Criterion::Within { low, high } => low >= up - SLACK || high <= down + SLACK,
                };
                if admits {
                    None
                } else {
                    wrong(format!("a ratio of at least {up} or at most {down}"))
                }
            }
            Convention::NoEffect => match criterion {
                Criterion::Within { low, high }
                    if same(low, 1.0 - NO_EFFECT_BAND) && same(high, 1.0 + NO_EFFECT_BAND) =>
                {
                    None
                }
                _ if numbers_given => Some("reading `no-effect` takes no paper number".into()),
                _ => wrong(format!(
                    "the ratio within 1 +- {NO_EFFECT_BAND} (`within`, value 1, tolerance \
                     {NO_EFFECT_BAND})"
                )),
            },
            Convention::Trend => None,
        }
    }
}

/// The check's accepted range as a ratio of A to B: a gain of splitting is that ratio less one;
/// other checks of a single operand are no ratio, and no reading of a ratio applies to them.
fn ratio_space(check: &Check, criterion: Criterion) -> Result<Criterion, String> {
    let metric = check.a.metric.as_deref().unwrap_or(&check.metric);
    match (&check.b, metric) {
        (Some(_), _) => Ok(criterion),
        (None, GOS_METRIC) => Ok(match criterion {
            Criterion::Above { bound, strict } => Criterion::Above {
                bound: bound + 1.0,
                strict,
            },
            Criterion::Below { bound, strict } => Criterion::Below {
                bound: bound + 1.0,
                strict,
            },
            Criterion::Within { low, high } => Criterion::Within {
                low: low + 1.0,
                high: high + 1.0,
            },
        }),
        (None, _) => Err(
            "a reading of the paper's words bounds a ratio: the check needs `b` \
                          (or the metric `gos`)"
                .into(),
        ),
    }
}
