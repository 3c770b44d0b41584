//! Which plots a report has: one main plot per experiment with successful runs, one extra plot
//! per `[[plots]]` entry with `metrics`, their file stems, and a warning for whatever an entry
//! names that the results lack. Pure: the figures are resolved, not drawn.

use std::collections::BTreeSet;

use super::kinds::{main_figure, metrics_figure};
use super::Figure;
use crate::analysis::Experiment;
use crate::claims::{PaperPoint, PlotSpec, ReferenceLine, CLAIMS_FILE};

/// File names (without extension) for the experiments' plots: the name with anything but
/// letters, digits, `-`, `_` and `.` replaced, made unique by a numeric suffix.
pub(crate) fn file_stems(experiments: &[Experiment]) -> Vec<String> {
    let mut used = BTreeSet::new();
    experiments
        .iter()
        .map(|exp| {
            let mut base: String = exp
                .name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            if base.is_empty() || base.starts_with('.') {
                base.insert_str(0, "experiment");
            }
            let mut stem = base.clone();
            let mut counter = 2;
            while !used.insert(stem.to_lowercase()) {
                stem = format!("{base}-{counter}");
                counter += 1;
            }
            stem
        })
        .collect()
}

/// Every plot of a report, resolved but not drawn.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlotPlan {
    /// One entry per experiment, in the analysis' order.
    pub experiments: Vec<PlannedPlots>,
    /// What the `[[plots]]` entries asked for and could not get, one line each.
    pub warnings: Vec<String>,
}

/// The plots of one experiment, each with its file stem (name without extension).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlannedPlots {
    /// `None` when no run succeeded.
    pub main: Option<(String, Figure)>,
    /// The extra plots of its `[[plots]]` entries with `metrics`, in file order.
    pub extra: Vec<(String, Figure)>,
}

/// Resolves the plots of every experiment: the main plot (with the reference lines and title of
/// the `[[plots]]` entries naming the experiment) and one extra plot per entry with `metrics`,
/// stem `<experiment stem>-<n>`. Whatever an entry names that the results lack becomes a
/// warning, never an error.
pub(crate) fn plan(experiments: &[Experiment], specs: &[PlotSpec]) -> PlotPlan {
    let stems = file_stems(experiments);
    let mut used: BTreeSet<String> = stems.iter().map(|s| s.to_lowercase()).collect();
    // (entry index, text): sorted by entry at the end so the report lists them in file order.
    let mut warnings: Vec<(usize, String)> = Vec::new();
    for (index, spec) in specs.iter().enumerate() {
        if !experiments.iter().any(|e| e.name == spec.experiment) {
            warnings.push((
                index,
                format!(
                "{CLAIMS_FILE} [[plots]] #{}: experiment `{}` is not in the results; nothing drawn \
                 for it",
                index + 1,
                spec.experiment
            ),
            ));
        }
    }
    let mut planned = Vec::with_capacity(experiments.len());
    for (exp, stem) in experiments.iter().zip(&stems) {
        let mine: Vec<(usize, &PlotSpec)> = specs
            .iter()
            .enumerate()
            .filter(|(_, spec)| spec.experiment == exp.name)
            .collect();
        let context = |index: usize| {
            format!(
                "{CLAIMS_FILE} [[plots]] #{} (experiment `{}`)",
                index + 1,
                exp.name
            )
        };
        let has_runs = exp.rows.iter().any(|row| {
            if exp.web {
                row.page_load_seconds.is_some()
            } else {
                row.throughput_mbps.is_some()
            }
        });
        let title = mine
            .iter()
            .find(|(_, spec)| spec.metrics.is_empty())
            .and_then(|(_, spec)| spec.title.as_deref());
        let lines: Vec<ReferenceLine> = mine
            .iter()
            .flat_map(|(_, spec)| spec.lines.iter().cloned())
            .collect();
        let main = if has_runs {
            let points: Vec<PaperPoint> = mine
                .iter()
                .flat_map(|(_, spec)| spec.points.iter().cloned())
                .collect();
            let (figure, line_warnings) = main_figure(exp, title, &lines, &points);
            // A line's warning names its own label; attribute it to the entry holding it.
            for warning in line_warnings {
                let owner =
                    mine.iter()
                        .find(|(_, spec)| {
                            spec.lines
                                .iter()
                                .any(|l| warning.starts_with(&format!("line `{}`", l.label)))
                                || spec.points.iter().any(|p| {
                                    warning.starts_with(&format!("paper point `{}`", p.label))
                                })
                        })
                        .map(|(index, _)| *index)
                        .unwrap_or(mine.first().map(|(i, _)| *i).unwrap_or(0));
                warnings.push((owner, format!("{}: {warning}", context(owner))));
            }
            Some((stem.clone(), figure))
        } else {
            if let Some((index, _)) = mine.iter().find(|(_, spec)| !spec.lines.is_empty()) {
                warnings.push((
                    *index,
                    format!(
                        "{}: no successful run, so no main plot for the lines",
                        context(*index)
                    ),
                ));
            }
            None
        };
        let mut extra = Vec::new();
        let mut number = 0;
        for (index, spec) in mine.iter().filter(|(_, spec)| !spec.metrics.is_empty()) {
            number += 1;
            let (figure, figure_warnings) =
                metrics_figure(exp, &spec.metrics, &spec.cases, spec.title.as_deref());
            warnings.extend(
                figure_warnings
                    .into_iter()
                    .map(|w| (*index, format!("{}: {w}", context(*index)))),
            );
            if let Some(figure) = figure {
                let mut extra_stem = format!("{stem}-{number}");
                let mut counter = 2;
                while !used.insert(extra_stem.to_lowercase()) {
                    extra_stem = format!("{stem}-{number}-{counter}");
                    counter += 1;
                }
                extra.push((extra_stem, figure));
            }
        }
        planned.push(PlannedPlots { main, extra });
    }
    warnings.sort_by_key(|(index, _)| *index);
    PlotPlan {
        experiments: planned,
        warnings: warnings.into_iter().map(|(_, text)| text).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::analyse;
    use crate::claims::parse;
    use crate::plot::figure::{PlacedLine, XAxis};
    use crate::plot::kinds::THROUGHPUT_AXIS;
    use crate::plot::style::SERIES_COLORS;
    use crate::record::RunRecord;
    use std::collections::BTreeMap;

    fn record(experiment: &str, case: &str, x: serde_json::Value, rep: u32) -> RunRecord {
        RunRecord {
            scenario: "s".into(),
            scenario_file: "s.toml".into(),
            commit: "c".into(),
            experiment: experiment.into(),
            case: case.into(),
            sweep_param: Some("x".into()),
            params: BTreeMap::from([("x".to_string(), x)]),
            repetition: rep,
            seed: 1,
            bytes: 1000,
            seconds: 1.0,
            throughput_bps: 8e6 + 1e6 * f64::from(rep),
            retransmits: BTreeMap::new(),
            extra: BTreeMap::from([
                ("a_seconds".to_string(), 1.0 + f64::from(rep)),
                ("b_seconds".to_string(), 2.0),
            ]),
            ok: true,
            error: None,
            started_at: "2026-01-01T00:00:00Z".into(),
            tree: None,
            quick: None,
            load: None,
        }
    }

    /// Experiments: "lin" (x 10..40), "log" (x 1..10000), "cat" (text x), "one" (one point).
    fn experiments() -> Vec<Experiment> {
        let mut records = Vec::new();
        for rep in 0..3 {
            for case in ["direct", "proxy"] {
                for x in [10, 20, 40] {
                    records.push(record("lin", case, serde_json::json!(x), rep));
                }
                for x in [1, 100, 10000] {
                    records.push(record("log", case, serde_json::json!(x), rep));
                }
                for x in ["1.0", "1.1", "pipelining"] {
                    records.push(record("cat", case, serde_json::json!(x), rep));
                }
                records.push(record("one", case, serde_json::json!(5), rep));
            }
        }
        analyse(&records, "direct").experiments
    }

    fn plan_of(plots: &str) -> PlotPlan {
        let file = parse(&format!("paper = \"p\"\n{plots}")).expect("valid plots");
        plan(&experiments(), &file.plots)
    }

    #[test]
    fn without_annotations_every_main_plot_is_plain() {
        let plan = plan_of("");
        assert!(plan.warnings.is_empty());
        let stems: Vec<&str> = plan
            .experiments
            .iter()
            .map(|p| p.main.as_ref().expect("runs").0.as_str())
            .collect();
        assert_eq!(stems, ["lin", "log", "cat", "one"]);
        let lin = &plan.experiments[0].main.as_ref().expect("lin").1;
        assert_eq!(lin.y_desc, THROUGHPUT_AXIS);
        assert!(lin.lines.is_empty() && !lin.bars);
        // Throughput 8, 9, 10 Mbit/s: Q3 9.5, with 25 % headroom.
        assert_eq!(lin.y_range, 0.0..9.5 * 1.25);
        assert_eq!(lin.axis, XAxis::Linear(8.5..41.5));
        assert!(plan.experiments.iter().all(|p| p.extra.is_empty()));
    }

    #[test]
    fn the_papers_points_share_the_axes_of_the_lab_s() {
        let plan = plan_of(
            r#"
[[plots]]
experiment = "lin"
[[plots.points]]
label = "paper, proxy"
x = 20
y = 30.0
source = "Table II"
[[plots.points]]
label = "paper, proxy"
x = 80
y = 28.0
source = "Table II"
[[plots]]
experiment = "cat"
[[plots.points]]
label = "paper"
x = "pipelining"
y = 4.0
source = "text"
[[plots]]
experiment = "one"
[[plots.points]]
label = "paper, proxy"
case = "proxy"
y = 7.0
source = "text"
[[plots.points]]
label = "on a bar plot, x names nothing"
x = 5
y = 7.0
source = "text"
"#,
        );
        let main = |i: usize| &plan.experiments[i].main.as_ref().expect("main").1;
        let lin = main(0);
        let placed: Vec<(f64, f64)> = lin.paper_points.iter().map(|p| (p.x, p.y)).collect();
        assert_eq!(placed, [(20.0, 30.0), (80.0, 28.0)]);
        // The axes widen to hold the paper's numbers: x to 80, y above 30.
        assert!(
            matches!(&lin.axis, XAxis::Linear(r) if r.end > 80.0),
            "{:?}",
            lin.axis
        );
        assert!(lin.y_range.end > 30.0, "{:?}", lin.y_range);
        let cat = main(2);
        assert_eq!(cat.paper_points[0].x, 2.0, "the third category");
        let one = main(3);
        assert_eq!(one.paper_points.len(), 1);
        assert_eq!(one.paper_points[0].x, 1.0, "the proxy's bar");
        assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
        assert!(
            plan.warnings[0].contains("paper point `on a bar plot, x names nothing`")
                && plan.warnings[0].contains("give `case`"),
            "{:?}",
            plan.warnings
        );
    }

    #[test]
    fn lines_are_placed_on_every_kind_of_axis() {
        let plan = plan_of(
            r#"
[[plots]]
experiment = "lin"
title = "annotated"
[[plots.lines]]
label = "rule"
x = 100
[[plots.lines]]
label = "paper"
y = 20.0
[[plots]]
experiment = "log"
[[plots.lines]]
label = "zero"
x = 0
[[plots]]
experiment = "cat"
[[plots.lines]]
label = "keep-alive"
x = "1.1"
[[plots.lines]]
label = "as number"
x = 1.0
[[plots.lines]]
label = "missing"
x = "spdy"
[[plots]]
experiment = "one"
[[plots.lines]]
label = "vertical"
x = 5
[[plots.lines]]
label = "both"
x = 5
y = 1.0
[[plots.lines]]
label = "floor"
y = 1.0
"#,
        );
        let main = |i: usize| &plan.experiments[i].main.as_ref().expect("main").1;
        let lin = main(0);
        assert_eq!(lin.title, "annotated (3 runs per point)");
        assert_eq!(
            lin.lines,
            vec![
                PlacedLine::Vertical {
                    x: 100.0,
                    label: "rule".into()
                },
                PlacedLine::Horizontal {
                    y: 20.0,
                    label: "paper".into()
                },
            ]
        );
        // The axis and the y range grow to show the lines.
        assert_eq!(lin.axis, XAxis::Linear(5.5..104.5));
        assert_eq!(lin.y_range, 0.0..25.0);
        // A log axis cannot show x = 0: the axis stays logarithmic, the line is left out.
        assert_eq!(main(1).axis, XAxis::Log(1.0 / 1.25..10000.0 * 1.25));
        assert!(main(1).lines.is_empty());
        let cat = main(2);
        assert_eq!(
            cat.lines,
            vec![
                PlacedLine::Vertical {
                    x: 1.0,
                    label: "keep-alive".into()
                },
                PlacedLine::Vertical {
                    x: 0.0,
                    label: "as number".into()
                },
            ]
        );
        let one = main(3);
        assert!(one.bars);
        assert_eq!(
            one.lines,
            vec![PlacedLine::Horizontal {
                y: 1.0,
                label: "floor".into()
            }]
        );
        assert_eq!(plan.warnings.len(), 4, "{:#?}", plan.warnings);
        assert!(plan.warnings[0].ends_with(
            "#2 (experiment `log`): line `zero`: x = 0 cannot be drawn on the logarithmic x axis"
        ));
        let plan_warnings = &plan.warnings[1..];
        assert!(plan_warnings[0].starts_with(
            "claims.toml [[plots]] #3 (experiment `cat`): line `missing`: x = spdy is none of the \
             sweep values"
        ));
        assert!(plan_warnings[1].contains(
            "#4 (experiment `one`): line `vertical`: experiment `one` has a single sweep point"
        ));
        assert!(plan_warnings[2].contains("line `both` needs exactly one of `x`"));
    }

    #[test]
    fn a_positive_line_keeps_a_log_axis() {
        let plan =
            plan_of("[[plots]]\nexperiment = \"log\"\n[[plots.lines]]\nlabel = \"l\"\nx = 50000\n");
        let log = &plan.experiments[1].main.as_ref().expect("log").1;
        assert_eq!(log.axis, XAxis::Log(1.0 / 1.25..50000.0 * 1.25));
        assert!(plan.warnings.is_empty());
    }

    #[test]
    fn extra_plots_of_metrics_with_warnings() {
        let plan = plan_of(
            r#"
[[plots]]
experiment = "lin"
metrics = ["a_seconds", "b_seconds", "nope"]
cases = ["proxy", "ghost"]
[[plots]]
experiment = "lin"
metrics = ["nope"]
[[plots]]
experiment = "lin"
metrics = ["throughput"]
[[plots]]
experiment = "elsewhere"
"#,
        );
        let extra = &plan.experiments[0].extra;
        assert_eq!(extra.len(), 2, "the all-unknown entry draws nothing");
        assert_eq!(extra[0].0, "lin-1");
        assert_eq!(extra[1].0, "lin-3", "n counts the entries with metrics");
        let figure = &extra[0].1;
        assert_eq!(
            figure.title,
            "lin: a_seconds, b_seconds vs x (3 runs per point)"
        );
        assert_eq!(
            figure.y_desc,
            "a_seconds, b_seconds (s), median and quartiles"
        );
        let labels: Vec<&str> = figure.series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["proxy: a_seconds", "proxy: b_seconds"]);
        assert_eq!(figure.series[0].dash, None);
        assert!(figure.series[1].dash.is_some());
        // The proxy keeps its colour of the main plot (second case).
        assert_eq!(figure.series[0].color, SERIES_COLORS[1]);
        // a_seconds = 1 + rep over three repetitions: median 2, quartiles 1.5 and 2.5.
        let (x, spread) = figure.series[0].points[0];
        assert_eq!(
            (x, spread.q1, spread.median, spread.q3),
            (10.0, 1.5, 2.0, 2.5)
        );
        assert_eq!(
            extra[1].1.y_desc,
            "throughput (Mbit/s), median and quartiles"
        );
        let w = &plan.warnings;
        assert_eq!(w.len(), 5, "{w:#?}");
        assert!(w[0].contains("metric `nope` is not measured in experiment `lin`"));
        assert!(w[1].contains("case `ghost` is not in experiment `lin`"));
        assert!(w[2].starts_with("claims.toml [[plots]] #2 (experiment `lin`): metric `nope`"));
        assert!(w[3].contains("#2 (experiment `lin`): no measured metric left to plot"));
        assert!(w[4].contains("#4: experiment `elsewhere` is not in the results"));
    }

    #[test]
    fn extra_plot_stems_do_not_clash_with_experiments() {
        let mut exps = experiments();
        exps[1].name = "lin-1".into();
        let file =
            parse("paper = \"p\"\n[[plots]]\nexperiment = \"lin\"\nmetrics = [\"a_seconds\"]\n")
                .expect("valid");
        let plan = plan(&exps, &file.plots);
        assert_eq!(plan.experiments[1].main.as_ref().expect("main").0, "lin-1");
        assert_eq!(plan.experiments[0].extra[0].0, "lin-1-2");
    }
}
