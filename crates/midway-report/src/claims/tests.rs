//! Tests of the whole claims path: a claims file parsed, evaluated against an analysis built from
//! records, and rendered. They cross the files of this module, hence their own file.

use super::evaluate::{evaluate, ClaimRow, Verdict};
use super::render::render;
use super::*;
use crate::analysis::{analyse, Analysis};
use crate::record::RunRecord;
use std::collections::BTreeMap;

pub(super) fn record(case: &str, loss: f64, repetition: u32, mbps: f64) -> RunRecord {
    let mut params = BTreeMap::new();
    params.insert("loss (%)".to_string(), serde_json::json!(loss));
    let mut extra = BTreeMap::new();
    extra.insert("remote_segment_seconds".to_string(), 1.5);
    RunRecord {
        scenario: "s".into(),
        scenario_file: "s.toml".into(),
        commit: "c".into(),
        experiment: "fig8".into(),
        case: case.into(),
        sweep_param: Some("loss (%)".into()),
        params,
        repetition,
        seed: u64::from(repetition),
        bytes: 1_000_000,
        seconds: 8.0 / mbps,
        throughput_bps: mbps * 1e6,
        retransmits: BTreeMap::new(),
        extra,
        ok: true,
        error: None,
        started_at: "2026-01-01T00:00:00Z".into(),
        tree: None,
        quick: None,
        load: None,
    }
}

fn analysis() -> Analysis {
    let mut records = Vec::new();
    for rep in 0..3 {
        records.push(record("direct", 0.0, rep, 4.0));
        records.push(record("direct", 1.0, rep, 1.0));
        records.push(record("proxy", 0.0, rep, 5.0));
        records.push(record("proxy", 1.0, rep, 4.8));
    }
    analyse(&records, "direct")
}

const CLAIMS: &str = r#"
paper = "p"
[[claims]]
figure = "Fig. 8"
experiment = "fig8"
says = "proxy keeps 90 %"
[claims.check]
a = { case = "proxy", x = 1 }
b = { case = "proxy", x = 0 }
op = ">="
open_side = "test: the ordering only"
value = 0.9

[[claims]]
figure = "Fig. 8"
experiment = "fig8"
says = "direct keeps 90 %"
why_not = "loss"
[claims.check]
a = { case = "direct", x = 1 }
b = { case = "direct", x = 0 }
op = ">="
open_side = "test: the ordering only"
value = 0.9

[[claims]]
figure = "Fig. 8"
experiment = "fig8"
says = "proxy beats direct everywhere"
[claims.check]
a = { case = "proxy" }
b = { case = "direct" }
op = ">"
open_side = "test: the ordering only"
value = 1.0

[[claims]]
figure = "Fig. 11"
experiment = "fig8"
says = "remote segment finishes early"
[claims.check]
metric = "remote_segment_seconds"
a = { case = "proxy", x = 1 }
op = "<"
open_side = "test: the ordering only"
value = 2.0

[[claims]]
figure = "Fig. 5"
experiment = "fig5"
says = "not run"
why_not = "skipped"
"#;

#[test]
fn checks_ratios_all_cells_extras_and_missing_experiments() {
    let file = parse(CLAIMS).unwrap();
    let rows = evaluate(&file.claims, &analysis());
    assert_eq!(rows[0].verdict, Verdict::Agrees, "{}", rows[0].measured);
    assert!(rows[0].measured.contains("0.96"), "{}", rows[0].measured);
    assert_eq!(rows[0].why_not, None);
    assert_eq!(rows[1].verdict, Verdict::Disagrees);
    assert_eq!(rows[1].why_not.as_deref(), Some("loss"));
    assert_eq!(rows[2].verdict, Verdict::Agrees, "{}", rows[2].measured);
    assert_eq!(rows[3].verdict, Verdict::Agrees, "{}", rows[3].measured);
    assert!(matches!(rows[4].verdict, Verdict::NoData(_)));
    let table = render(&file, &rows, &[], &[]);
    assert!(
        table.contains(
            "Verdicts of the paper's claims: 3 agree, 0 inconclusive, 1 disagree, 0 not tested, \
             1 no data."
        ),
        "{table}"
    );
    assert!(table.contains("| **disagrees** |"), "{table}");
}

#[test]
fn a_missing_case_is_no_data_not_agreement() {
    let file = parse(
        r#"paper = "p"
[[claims]]
figure = "F"
experiment = "fig8"
says = "x"
[claims.check]
a = { case = "nope", x = 1 }
op = ">"
open_side = "test: the ordering only"
value = 0.0
"#,
    )
    .unwrap();
    let rows = evaluate(&file.claims, &analysis());
    assert!(matches!(rows[0].verdict, Verdict::NoData(_)));
}

#[test]
fn an_experiment_without_sweep_is_one_point() {
    let mut records = Vec::new();
    for rep in 0..3 {
        for (case, mbps) in [("tuned", 3.0), ("untuned", 1.0)] {
            let mut r = record(case, 0.0, rep, mbps);
            r.experiment = "warm".into();
            r.sweep_param = None;
            r.params.clear();
            records.push(r);
        }
    }
    let file = parse(
        r#"paper = "p"
[[claims]]
figure = "F"
experiment = "warm"
says = "tuned is 2x"
[claims.check]
a = { case = "tuned" }
b = { case = "untuned" }
op = ">="
open_side = "test: the ordering only"
value = 2.0
"#,
    )
    .unwrap();
    let rows = evaluate(&file.claims, &analyse(&records, "untuned"));
    assert_eq!(rows[0].verdict, Verdict::Agrees, "{}", rows[0].measured);
    assert!(rows[0].measured.contains("= 3.00"), "{}", rows[0].measured);
}

/// A web experiment swept over the HTTP mode: one page per run, page load times per
/// repetition; the throughput is the page's bytes over its load time, as the lab records it.
fn web_analysis() -> Analysis {
    let page_loads: [(&str, &str, [f64; 5]); 4] = [
        ("direct", "1.0", [10.0, 10.0, 10.0, 10.0, 10.0]),
        ("midway-http", "1.0", [2.0, 2.0, 2.0, 2.0, 30.0]),
        ("direct", "1.1", [6.0, 6.0, 6.0, 6.0, 6.0]),
        ("midway-http", "1.1", [3.0, 3.0, 3.0, 3.0, 3.0]),
    ];
    let mut records = Vec::new();
    for (case, http, loads) in page_loads {
        for (rep, seconds) in loads.into_iter().enumerate() {
            let mut r = record(case, 0.0, rep as u32, 1.0);
            r.experiment = "web".into();
            r.sweep_param = Some("http".into());
            r.params = BTreeMap::from([("http".to_string(), serde_json::json!(http))]);
            r.bytes = 65_000;
            r.seconds = seconds;
            r.throughput_bps = 65_000.0 * 8.0 / seconds;
            r.extra = BTreeMap::from([
                ("page_load_seconds".to_string(), seconds),
                ("connections_opened".to_string(), 20.0),
            ]);
            records.push(r);
        }
    }
    analyse(&records, "direct")
}

fn check_claim(check: &str) -> String {
    format!(
        "paper = \"sat\"\n[[claims]]\nfigure = \"F\"\nexperiment = \"web\"\nsays = \"s\"\n\
         [claims.check]\n{check}\n"
    )
}

fn check_one(analysis: &Analysis, check: &str) -> ClaimRow {
    let file = parse(&check_claim(check)).expect("valid claims");
    evaluate(&file.claims, analysis).remove(0)
}

#[test]
fn page_load_checks_show_a_b_ratio_and_margin() {
    let analysis = web_analysis();
    let row = check_one(
        &analysis,
        r#"metric = "page_load_seconds"
a = { case = "midway-http", x = "1.0" }
b = { case = "direct", x = "1.0" }
op = "<="
open_side = "test: the ordering only"
value = 0.5"#,
    );
    // One load in five (30 s) went the other way: with 5 runs the median's interval runs from
    // the smallest to the largest paired ratio, so it reaches 3.0 and the claim is not shown,
    // though the median meets it.
    assert_eq!(row.verdict, Verdict::Inconclusive, "{}", row.measured);
    assert_eq!(
        row.measured,
        "midway-http median page_load_seconds @ 1.0 / direct median page_load_seconds @ 1.0 \
         = 2.000 s / 10.000 s, median of the paired ratios 0.200, 93.8 % interval 0.200..3.00 \
         (5 paired runs), needs <= 0.5: met by 0.300"
    );
    // A number names the text sweep value that reads as it; without x every cell counts.
    let row = check_one(
        &analysis,
        r#"metric = "page_load_seconds"
a = { case = "midway-http" }
b = { case = "direct" }
op = "<="
open_side = "test: the ordering only"
value = 0.4"#,
    );
    assert_eq!(row.verdict, Verdict::Disagrees, "{}", row.measured);
    assert!(
        row.measured
            .contains("@ 1.1 = 3.000 s / 6.000 s, median of the paired ratios 0.500, runs deterministic (5 paired runs within 0.1 %, interval 0.500..0.500), needs <= 0.4: missed by 0.100"),
        "{}",
        row.measured
    );
    assert!(row.measured.contains("@ 1.0 / "), "{}", row.measured);
    let row = check_one(
        &analysis,
        r#"metric = "page_load_seconds"
a = { case = "midway-http", x = 1.1 }
op = "<"
open_side = "test: the ordering only"
value = 3.5"#,
    );
    assert_eq!(row.verdict, Verdict::Agrees, "{}", row.measured);
    assert_eq!(
        row.measured,
        "midway-http median page_load_seconds @ 1.1 = 3.000 s, runs deterministic (5 runs within \
         0.1 %, interval 3.00..3.00), needs < 3.5: met by 0.500"
    );
}

#[test]
fn mean_and_median_can_disagree() {
    let analysis = web_analysis();
    let check = |stat: &str| {
        check_one(
            &analysis,
            &format!(
                r#"metric = "page_load_seconds"
stat = "{stat}"
a = {{ case = "midway-http", x = "1.0" }}
b = {{ case = "direct", x = "1.0" }}
op = "<="
open_side = "test: the ordering only"
value = 0.5"#
            ),
        )
    };
    // Loads 2, 2, 2, 2, 30: median 2, mean 7.6 against 10. The median meets the check, the
    // mean misses it; with one run in five so far out, neither interval decides.
    let median = check("median");
    assert_eq!(median.verdict, Verdict::Inconclusive, "{}", median.measured);
    assert!(
        median.measured.contains("paired ratios 0.200,"),
        "{}",
        median.measured
    );
    let mean = check("mean");
    assert_eq!(mean.verdict, Verdict::Inconclusive, "{}", mean.measured);
    assert!(
        mean.measured.contains(
            "midway-http mean page_load_seconds @ 1.0 / direct mean page_load_seconds @ 1.0 \
             = 7.600 s / 10.000 s = 0.760, 95 % t interval -0.795..2.31 (5 paired runs), \
             needs <= 0.5: missed by 0.260"
        ),
        "{}",
        mean.measured
    );
    // Throughput under the mean: 65 kB over 2 s is 0.26 Mbit/s, over 30 s 0.0173.
    let row = check_one(
        &analysis,
        r#"stat = "mean"
a = { case = "midway-http", x = "1.0" }
op = ">"
open_side = "test: the ordering only"
value = 0.2"#,
    );
    assert_eq!(row.verdict, Verdict::Inconclusive, "{}", row.measured);
    assert!(row.measured.contains("= 0.211 Mbit/s"), "{}", row.measured);
    assert!(parse(&check_claim(
        "stat = \"mode\"\na = { case = \"d\" }\nop = \">\"\nvalue = 1.0\nopen_side = \"t\""
    ))
    .is_err());
}

#[test]
fn gos_positive_share_is_the_guarantee_of_improvement() {
    let analysis = web_analysis();
    let share = |value: f64| {
        check_one(
            &analysis,
            &format!(
                r#"metric = "gos_positive_share"
a = {{ case = "midway-http", x = "1.0" }}
op = ">="
open_side = "test: the ordering only"
value = {value}"#
            ),
        )
    };
    // Four of five repetitions loaded faster than direct's 10 s: the share meets 0.8, but five
    // runs cannot show a share of 0.8 (the Clopper-Pearson interval reaches 0.284).
    let met = share(0.8);
    assert_eq!(met.verdict, Verdict::Inconclusive, "{}", met.measured);
    assert_eq!(
        met.measured,
        "midway-http gos_positive_share @ 1.0 = 0.800 (4/5 runs with GoS > 0), \
         ≥ 95 % interval 0.284..0.995 (5 runs), needs >= 0.8: met by 0.000"
    );
    let missed = share(0.9);
    assert_eq!(missed.verdict, Verdict::Inconclusive, "{}", missed.measured);
    assert!(
        missed.measured.ends_with("missed by 0.100"),
        "{}",
        missed.measured
    );
    // At HTTP/1.1 every run was faster, yet 5 of 5 cannot show a share of 0.8 either: a true
    // share of 0.5 gives 5 of 5 once in 32 runs, so the interval reaches down to 0.478.
    let all = check_one(
        &analysis,
        "metric = \"gos_positive_share\"\na = { case = \"midway-http\", x = \"1.1\" }\n\
         op = \">=\"\nvalue = 0.8\nopen_side = \"a share\"",
    );
    assert_eq!(all.verdict, Verdict::Inconclusive, "{}", all.measured);
    assert!(
        all.measured.contains("≥ 95 % interval 0.478..1.00"),
        "{}",
        all.measured
    );
    // The median paired gain: 10 / 2 - 1 = 4 in four repetitions.
    let gos = check_one(
        &analysis,
        r#"metric = "gos"
a = { case = "midway-http", x = "1.0" }
op = ">"
open_side = "test: the ordering only"
value = 3.0"#,
    );
    assert_eq!(gos.verdict, Verdict::Inconclusive, "{}", gos.measured);
    assert!(
        gos.measured.contains("= 4.000 (5 pairs)"),
        "{}",
        gos.measured
    );
    // The baseline has no gain against itself.
    let baseline = check_one(
        &analysis,
        r#"metric = "gos_positive_share"
a = { case = "direct", x = "1.0" }
op = ">="
open_side = "test: the ordering only"
value = 0.5"#,
    );
    assert!(
        matches!(&baseline.verdict, Verdict::NoData(why) if why.contains("baseline")),
        "{:?}",
        baseline.verdict
    );
}

#[test]
fn an_unchecked_web_claim_shows_page_load_medians() {
    let file =
        parse("paper = \"p\"\n[[claims]]\nfigure = \"F\"\nexperiment = \"web\"\nsays = \"s\"\n")
            .expect("valid");
    let row = evaluate(&file.claims, &web_analysis()).remove(0);
    assert_eq!(row.verdict, Verdict::NotTested("no machine check".into()));
    assert!(
        row.measured
            .starts_with("median page load s: direct @ 1.0: 10.00; midway-http @ 1.0: 2.00;"),
        "{}",
        row.measured
    );
}

#[test]
fn unknown_metric_and_sweep_value_are_no_data() {
    let analysis = web_analysis();
    let row = check_one(
        &analysis,
        r#"metric = "cache_hits"
a = { case = "midway-http", x = "1.0" }
op = ">"
open_side = "test: the ordering only"
value = 0.0"#,
    );
    match &row.verdict {
        Verdict::NoData(why) => assert!(
            why.contains("`cache_hits` is not measured") && why.contains("page_load_seconds"),
            "{why}"
        ),
        other => panic!("expected no data, got {other:?}"),
    }
    let row = check_one(
        &analysis,
        r#"a = { case = "midway-http", x = "pipelining" }
op = ">"
open_side = "test: the ordering only"
value = 0.0"#,
    );
    assert_eq!(
        row.verdict,
        Verdict::NoData("no `midway-http` run @ pipelining".into())
    );
}

#[test]
fn plots_section_parses() {
    let file = parse(
        r#"paper = "p"
[[plots]]
experiment = "fig8-10-modern"
title = "segments"
metrics = ["remote_segment_seconds", "local_segment_seconds"]
cases = ["store-and-forward"]
[[plots.lines]]
label = "buffer rule"
x = 24000
[[plots.lines]]
label = "paper: 1.2 s"
y = 1.2
[[plots.lines]]
label = "text"
x = "pipelining"

[[plots]]
experiment = "other"
"#,
    )
    .expect("valid plots");
    assert!(file.claims.is_empty());
    assert_eq!(file.plots.len(), 2);
    let spec = &file.plots[0];
    assert_eq!(spec.title.as_deref(), Some("segments"));
    assert_eq!(spec.metrics.len(), 2);
    assert_eq!(spec.lines[0].x, Some(AxisValue::Number(24000.0)));
    assert_eq!(spec.lines[1].y, Some(1.2));
    assert_eq!(spec.lines[2].x, Some(AxisValue::Text("pipelining".into())));
    assert!(file.plots[1].lines.is_empty() && file.plots[1].metrics.is_empty());
    // A file without claims adds no table.
    let text = append_table(Some(&file), &analysis(), None, "# r\n".to_string());
    assert_eq!(text, "# r\n");
    assert!(parse("paper = \"p\"\n[[plots]]\nexperiment = \"e\"\ncolour = 1\n").is_err());
}

#[test]
fn an_operand_may_come_from_another_experiment() {
    let mut records = Vec::new();
    for rep in 0..3 {
        records.push(record("proxy", 0.0, rep, 5.0));
        let mut other = record("proxy", 0.0, rep, 10.0);
        other.experiment = "fig9".into();
        records.push(other);
    }
    let analysis = analyse(&records, "direct");
    let file = parse(
        r#"
paper = "p"
[[claims]]
figure = "Fig. 9"
experiment = "fig9"
says = "the other layout doubles the proxy's throughput"
[claims.check]
a = { case = "proxy", x = 0 }
b = { case = "proxy", x = 0, experiment = "fig8" }
op = ">="
open_side = "test: the ordering only"
value = 2.0

[[claims]]
figure = "Fig. 9"
experiment = "fig9"
says = "an operand in a missing experiment has no data"
[claims.check]
a = { case = "proxy", x = 0, experiment = "nowhere" }
op = ">="
open_side = "test: the ordering only"
value = 1.0
"#,
    )
    .unwrap();
    let rows = evaluate(&file.claims, &analysis);
    assert_eq!(rows[0].verdict, Verdict::Agrees, "{}", rows[0].measured);
    assert!(
        rows[0].measured.contains("fig8/proxy"),
        "{}",
        rows[0].measured
    );
    assert!(
        matches!(&rows[1].verdict, Verdict::NoData(why) if why.contains("nowhere")),
        "{:?}",
        rows[1].verdict
    );
}

/// Runs of `a` and `b` at one point of experiment `e`, paired by repetition (same seed).
pub(super) fn paired_runs(a: &[f64], b: &[f64]) -> Analysis {
    let mut records = Vec::new();
    for (rep, (ta, tb)) in a.iter().zip(b).enumerate() {
        for (case, mbps) in [("proxy", *ta), ("direct", *tb)] {
            let mut r = record(case, 0.0, rep as u32, mbps);
            r.experiment = "e".into();
            records.push(r);
        }
    }
    analyse(&records, "direct")
}

fn ratio_claim(op_and_value: &str) -> ClaimsFile {
    parse(&format!(
        "paper = \"p\"\n[[claims]]\nfigure = \"F\"\nexperiment = \"e\"\nsays = \"s\"\n\
         [claims.check]\na = {{ case = \"proxy\", x = 0 }}\nb = {{ case = \"direct\", x = 0 }}\n\
         {op_and_value}\n"
    ))
    .expect("valid claims")
}

#[test]
fn a_margin_inside_the_run_to_run_spread_is_inconclusive() {
    // Median ratio 10.5 / 10 = 1.05 > 1, but two of five runs went the other way: the interval
    // reaches below 1, so "proxy beats direct" is not shown.
    let analysis = paired_runs(&[8.0, 12.0, 10.5, 9.0, 13.0], &[10.0; 5]);
    let file = ratio_claim("op = \">\"\nvalue = 1.0\nopen_side = \"ordering\"");
    let row = evaluate(&file.claims, &analysis).remove(0);
    assert_eq!(row.verdict, Verdict::Inconclusive, "{}", row.measured);
    assert!(
        row.measured
            .contains("paired ratios 1.05, 93.8 % interval 0.800..1.30 (5 paired runs)"),
        "{}",
        row.measured
    );
    // Every run ahead: the whole interval is above 1.
    let analysis = paired_runs(&[12.0, 12.5, 13.0, 12.2, 12.8], &[10.0; 5]);
    let row = evaluate(&file.claims, &analysis).remove(0);
    assert_eq!(row.verdict, Verdict::Agrees, "{}", row.measured);
    // Every run behind: the whole interval is below 1.
    let analysis = paired_runs(&[8.0, 8.5, 9.0, 8.2, 8.8], &[10.0; 5]);
    let row = evaluate(&file.claims, &analysis).remove(0);
    assert_eq!(row.verdict, Verdict::Disagrees, "{}", row.measured);
}

#[test]
fn a_cell_inside_its_own_spread_asks_for_more_runs_and_a_decided_one_does_not() {
    let file = ratio_claim("op = \">\"\nvalue = 1.0\nopen_side = \"ordering\"");
    // Paired ratios 0.8..1.3 around 1.05: 0.05 from the threshold, 0.5 wide, so about
    // 5 x (0.5 / 0.05)^2 = 500 runs.
    let analysis = paired_runs(&[8.0, 12.0, 10.5, 9.0, 13.0], &[10.0; 5]);
    let row = evaluate(&file.claims, &analysis).remove(0);
    assert_eq!(row.close_calls.len(), 1, "{:?}", row.close_calls);
    let call = &row.close_calls[0];
    assert_eq!(
        call.cell,
        "proxy median throughput @ 0 / direct median throughput @ 0"
    );
    assert_eq!((call.runs, call.runs_needed), (5, Some(500)));
    assert!((call.distance - 0.05).abs() < 1e-9 && (call.width - 0.5).abs() < 1e-9);
    let table = render(&file, std::slice::from_ref(&row), &[], &[]);
    assert!(
        table.contains(
            "### The paper's claims: verdicts that turn on less than their interval's width"
        ),
        "{table}"
    );
    assert!(table.contains("| 0.050 | 0.500 | 5 | 500 |"), "{table}");
    // Every run ahead, by more than the spread: decided, nothing to list, no section.
    let analysis = paired_runs(&[12.0, 12.5, 13.0, 12.2, 12.8], &[10.0; 5]);
    let row = evaluate(&file.claims, &analysis).remove(0);
    assert_eq!(row.verdict, Verdict::Agrees);
    assert!(row.close_calls.is_empty(), "{:?}", row.close_calls);
    assert!(!render(&file, &[row], &[], &[]).contains("verdicts that turn on"));
    // Deterministic runs 0.02 % apart, 0.01 % above the threshold: the interval straddles it,
    // yet more runs would repeat the same numbers, so the cell is named, not listed.
    let analysis = paired_runs(&[10.001, 10.0, 10.002, 10.001, 9.9995], &[10.0; 5]);
    let row = evaluate(&file.claims, &analysis).remove(0);
    assert_eq!(row.verdict, Verdict::Inconclusive, "{}", row.measured);
    assert!(
        row.measured
            .contains("runs deterministic (5 paired runs within 0.1 %, interval 1.000..1.00)"),
        "{}",
        row.measured
    );
    assert!(row.close_calls.is_empty(), "{:?}", row.close_calls);
}

#[test]
fn a_two_sided_check_fails_when_the_effect_is_zero_or_too_large() {
    // The paper's effect: a proxy 25 % faster, within 0.1.
    let file = ratio_claim("op = \"within\"\nvalue = 1.25\ntolerance = 0.1");
    assert!(file.problems().is_empty(), "{:?}", file.problems());
    let verdict_for = |proxy: f64| {
        let analysis = paired_runs(&[proxy; 5], &[10.0; 5]);
        evaluate(&file.claims, &analysis).remove(0)
    };
    assert_eq!(verdict_for(12.4).verdict, Verdict::Agrees);
    // No effect at all: a one-sided ">= 1" would have agreed.
    let none = verdict_for(10.0);
    assert_eq!(none.verdict, Verdict::Disagrees, "{}", none.measured);
    assert!(
        none.measured
            .contains("needs within 1.15..1.35: missed by 0.150"),
        "{}",
        none.measured
    );
    assert_eq!(verdict_for(20.0).verdict, Verdict::Disagrees);
}

#[test]
fn the_claims_file_names_what_a_reviewer_would_reject() {
    let file = parse(
        r#"paper = "p"
[[claims]]
figure = "F1"
experiment = "e"
says = "one-sided without a reason"
[claims.check]
a = { case = "proxy" }
op = ">"
value = 1.0

[[claims]]
figure = "F2"
experiment = "e"
says = "two-sided without a tolerance"
[claims.check]
a = { case = "proxy" }
op = "within"
value = 1.0

[[claims]]
figure = "F3"
experiment = "e"
says = "no check, no reason"

[[claims]]
figure = "F4"
experiment = "e"
says = "no check, with a reason"
not_tested = "the paper gives nothing to compare"

[[targets]]
figure = "issue 16"
experiment = "e"
says = "target with a tolerance on a one-sided check"
[targets.check]
a = { case = "proxy" }
op = ">="
value = 1.5
tolerance = 0.1
"#,
    )
    .expect("valid shape");
    let problems = file.problems();
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(problems[0].contains("claim \"F1\"") && problems[0].contains("open_side"));
    assert!(problems[1].contains("F2") && problems[1].contains("tolerance"));
    assert!(problems[2].contains("F3") && problems[2].contains("not_tested"));
    assert!(problems[3].contains("target \"issue 16\"") && problems[3].contains("within"));
    // The report shows them, and an invalid check is never counted as agreeing.
    let text = append_table(
        Some(&file),
        &paired_runs(&[12.0; 3], &[10.0; 3]),
        None,
        String::new(),
    );
    assert!(text.contains("Problems in the claims file:"), "{text}");
    assert!(text.contains("**invalid check**"), "{text}");
}

#[test]
fn not_tested_claims_and_targets_have_their_own_places() {
    let file = parse(
        r#"paper = "p"
[[claims]]
figure = "Fig. 9"
experiment = "e"
says = "fast retransmit on the first duplicate ACK doubles throughput"
not_tested = "no connection in the lab sees a duplicate ACK before its first timeout"
[claims.check]
a = { case = "proxy", x = 0 }
b = { case = "direct", x = 0 }
op = "within"
value = 2.0
tolerance = 0.5

[[targets]]
figure = "issue 16"
experiment = "e"
says = "proxy at least 1.1x direct"
[targets.check]
a = { case = "proxy", x = 0 }
b = { case = "direct", x = 0 }
op = ">="
value = 1.1
open_side = "a target is a threshold"
"#,
    )
    .expect("valid");
    assert!(file.problems().is_empty(), "{:?}", file.problems());
    let text = append_table(
        Some(&file),
        &paired_runs(&[20.0; 3], &[10.0; 3]),
        None,
        String::new(),
    );
    // The check is measured and shown, but the verdict is "not tested", never "agrees".
    assert!(
        text.contains("not tested: no connection in the lab sees a duplicate ACK"),
        "{text}"
    );
    assert!(
        text.contains(
            "Verdicts of the paper's claims: 0 agree, 0 inconclusive, 0 disagree, 1 not tested."
        ),
        "{text}"
    );
    assert!(
        text.contains("## midway's targets (not the paper's findings)"),
        "{text}"
    );
    assert!(
        text.contains(
            "Verdicts of the targets: 1 agree, 0 inconclusive, 0 disagree, 0 not tested."
        ),
        "{text}"
    );
}

#[test]
fn a_file_of_targets_only_has_no_paper_section() {
    let file = parse(
        r#"paper = "midway's own probe"
[[targets]]
figure = "issue 4"
experiment = "e"
says = "proxy beats direct"
[targets.check]
a = { case = "proxy", x = 0 }
b = { case = "direct", x = 0 }
op = ">"
value = 1.0
open_side = "the issue asks only to beat it"
"#,
    )
    .expect("valid");
    let text = append_table(
        Some(&file),
        &paired_runs(&[20.0; 3], &[10.0; 3]),
        None,
        String::new(),
    );
    assert!(!text.contains("Paper vs lab"), "{text}");
    assert!(!text.contains(VERDICTS_LINE), "{text}");
    assert!(
        text.contains(
            "## midway's targets (not the paper's findings)\n\nFrom: midway's own probe."
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "Verdicts of the targets: 1 agree, 0 inconclusive, 0 disagree, 0 not tested."
        ),
        "{text}"
    );
}
