//! The text of `report.md`, from an [`Analysis`]: no I/O, so the layout is testable and other
//! reports (paper comparisons) can reuse the table helpers.

use std::fmt::Write as _;

use crate::analysis::{Analysis, CaseRow, Experiment, FailedRun, PAGE_LOAD_METRIC};
use crate::stats::PositiveShare;
use crate::ReportOptions;

/// Relative links (from the report) to the plots of one experiment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlotLinks {
    pub png: String,
    pub svg: String,
}

/// The plots of one experiment: its main plot and the extra plots of its `[[plots]]` entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ExperimentPlots {
    pub main: Option<PlotLinks>,
    pub extra: Vec<ExtraPlot>,
}

/// An extra plot and the caption it is linked with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExtraPlot {
    pub title: String,
    pub links: PlotLinks,
}

/// The whole report with extra plots and warnings (about the claims file's `[[plots]]`, listed
/// in the header). `plots[i]` belongs to `analysis.experiments[i]`.
pub(crate) fn render_with(
    analysis: &Analysis,
    opts: &ReportOptions,
    plots: &[ExperimentPlots],
    warnings: &[String],
) -> String {
    let mut out = String::new();
    let title = opts
        .title
        .clone()
        .unwrap_or_else(|| format!("Lab report: {}", analysis.scenarios.join(", ")));
    let _ = writeln!(out, "# {title}\n");
    let dirty: usize = analysis
        .trees
        .iter()
        .filter(|t| t.is_dirty())
        .map(|t| t.records)
        .sum();
    if dirty > 0 {
        let _ = writeln!(
            out,
            "**Not from a clean commit: {dirty} of {} records were measured with uncommitted \
             changes in the source tree** (the lab refuses that for docs/results unless told \
             `--allow-dirty`); see \"Source trees\" below.\n",
            analysis.records
        );
    }
    header(&mut out, analysis, opts, warnings);
    runs_left_out(&mut out, analysis);
    let no_plots = ExperimentPlots::default();
    for (index, experiment) in analysis.experiments.iter().enumerate() {
        experiment_section(&mut out, experiment, plots.get(index).unwrap_or(&no_plots));
    }
    out
}

fn header(out: &mut String, analysis: &Analysis, opts: &ReportOptions, warnings: &[String]) {
    let _ = writeln!(out, "- Scenario: {}", code_list(&analysis.scenarios));
    let _ = writeln!(
        out,
        "- Scenario file: {}",
        code_list(&analysis.scenario_files)
    );
    let commit_note = if analysis.commits.len() > 1 {
        " — **warning: the records come from more than one tree**"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "- Commit: {}{commit_note}",
        code_list(&analysis.commits)
    );
    let trees: Vec<String> = analysis
        .trees
        .iter()
        .map(|tree| {
            let state = match tree.state.as_deref() {
                _ if tree.is_dirty() => format!(
                    "with uncommitted changes{}",
                    tree.state
                        .as_deref()
                        .and_then(|s| s.strip_prefix(crate::record::TREE_DIRTY_PREFIX))
                        .map(|hash| format!(" (diff {hash})"))
                        .unwrap_or_default()
                ),
                _ if tree.is_clean() => "clean".to_string(),
                _ => "tree state not recorded".to_string(),
            };
            format!("`{}` {state}: {} records", tree.commit, tree.records)
        })
        .collect();
    let _ = writeln!(out, "- Source trees: {}", trees.join("; "));
    if !analysis.load_jobs.is_empty() {
        let list = |set: &std::collections::BTreeSet<u32>| {
            set.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let averages = match (
            crate::stats::quantile(&analysis.load_averages, 0.0),
            crate::stats::median(&analysis.load_averages),
            crate::stats::quantile(&analysis.load_averages, 1.0),
        ) {
            (Some(low), Some(median), Some(high)) => format!(
                "; 1-minute load average at the runs' starts {}..{} (median {})",
                number(low),
                number(high),
                number(median)
            ),
            _ => String::new(),
        };
        let limits = if analysis.load_limits.is_empty() {
            String::new()
        } else {
            let each: Vec<String> = analysis
                .load_limits
                .iter()
                .map(|(experiment, limit)| format!("`{experiment}` at most {limit}"))
                .collect();
            format!(
                "; experiments with a limit of their own (the scenario's `max_jobs`, topologies \
                 at once while one of their runs goes on): {}",
                each.join(", ")
            )
        };
        let _ = writeln!(
            out,
            "- Load: `--jobs {}` on {} CPUs{averages}{limits}",
            list(&analysis.load_jobs),
            list(&analysis.load_cpus)
        );
    }
    if let (Some(first), Some(last)) = (&analysis.first_start, &analysis.last_start) {
        let _ = writeln!(out, "- Runs started: {first} to {last}");
    }
    let without_entry = match analysis.no_warmup_entry.len() {
        0 => String::new(),
        n => format!(", {n} left out: no returning client, see \"Runs left out\""),
    };
    let _ = writeln!(
        out,
        "- Records: {} ({} failed{without_entry})",
        analysis.records,
        analysis.failed.len()
    );
    for warning in warnings {
        let _ = writeln!(out, "- **Warning:** {}", cell(warning));
    }
    let _ = writeln!(
        out,
        "\nThroughput is application payload over the time from connect to the last byte, in \
         Mbit/s (10^6 bit/s). Quartiles Q1/Q3 and medians use linear interpolation between closest \
         ranks (Hyndman-Fan type 7, as R and NumPy). Gain of splitting GoS = (T_case - T_{base}) \
         / T_{base} on throughputs: \"GoS paired\" is the median over repetitions of the gain of \
         each repetition against the `{base}` run with the same parameters and repetition index, \
         \"GoS of medians\" compares the median throughputs, \"GoS > 0\" counts the repetitions \
         the case was faster. Retransmits are medians of tcp_info total_retrans per endpoint \
         socket. Failed runs are left out of every number.\n",
        base = opts.baseline_case
    );
}

fn runs_left_out(out: &mut String, analysis: &Analysis) {
    runs_table(out, "## Failed runs\n", "error", &analysis.failed);
    runs_table(
        out,
        "## Runs left out\n\nThese runs succeeded, but their warm-up transfers (up to the lab's \
         limit) left no tcp_metrics entry for the client at the local segment's sender: Linux \
         caches no connection that closes in retransmission backoff. Their measured connection \
         started as a first connection, so it does not measure the returning client its \
         experiment is about, and no number of this report counts it.\n",
        "reason",
        &analysis.no_warmup_entry,
    );
}

fn runs_table(out: &mut String, heading: &str, reason: &str, runs: &[FailedRun]) {
    if runs.is_empty() {
        return;
    }
    let _ = writeln!(out, "{heading}");
    let _ = writeln!(
        out,
        "| experiment | case | parameters (besides the experiment's fixed ones) | repetition | seed \
         | {reason} |\n|---|---|---|---|---|---|"
    );
    for run in runs {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            cell(&run.experiment),
            cell(&run.case),
            cell(&run.params),
            run.repetition,
            run.seed,
            cell(&run.error)
        );
    }
    out.push('\n');
}

fn experiment_section(out: &mut String, exp: &Experiment, plots: &ExperimentPlots) {
    let _ = writeln!(out, "## Experiment `{}`\n", exp.name);
    match &exp.sweep_param {
        Some(param) => {
            let _ = write!(out, "Swept parameter: `{param}`.");
        }
        None => out.push_str("No swept parameter."),
    }
    if !exp.fixed_params.is_empty() {
        let fixed: Vec<String> = exp
            .fixed_params
            .iter()
            .map(|(k, v)| format!("`{k}={v}`"))
            .collect();
        let _ = write!(out, " Fixed: {}.", fixed.join(", "));
    }
    out.push_str("\n\n");
    if exp.web {
        let _ = writeln!(
            out,
            "Web experiment: the measurement is the page load time in seconds \
             (`{PAGE_LOAD_METRIC}`, the mean load time of the pages of one run; lower is better), \
             as median, quartiles and mean over the runs. The GoS columns stay computed on \
             throughput (the pages' bytes over their summed load time), so GoS = T_{base} / T_case \
             - 1 in load time: +1.00 means the pages loaded in half the time.\n",
            base = exp.baseline_case
        );
    }
    if !exp.baseline_present {
        let _ = writeln!(
            out,
            "No `{}` case in this experiment: no gain of splitting is computed.\n",
            exp.baseline_case
        );
    }
    if let Some(plot) = &plots.main {
        let what = if exp.web {
            "page load time"
        } else {
            "throughput"
        };
        let _ = writeln!(
            out,
            "![{name}: {what} by case]({png})\n\n(vector version: [{svg}]({svg}))\n",
            name = exp.name,
            png = plot.png,
            svg = plot.svg
        );
    }
    for extra in &plots.extra {
        let _ = writeln!(
            out,
            "![{title}]({png})\n\n(vector version: [{svg}]({svg}))\n",
            title = extra.title.replace(['[', ']'], ""),
            png = extra.links.png,
            svg = extra.links.svg
        );
    }

    // Counters that are zero in every row say nothing a reader needs; they stay in the records.
    let any_nonzero = |value: &dyn Fn(&CaseRow) -> Option<f64>| {
        exp.rows
            .iter()
            .any(|row| value(row).is_some_and(|v| v != 0.0))
    };
    let (endpoints, zero_endpoints): (Vec<String>, Vec<String>) =
        exp.endpoints.iter().cloned().partition(|endpoint| {
            any_nonzero(&|row: &CaseRow| row.retransmits_median.get(endpoint).copied())
        });
    let (extra_names, zero_extras): (Vec<String>, Vec<String>) = table_extra_names(exp)
        .into_iter()
        .partition(|name| any_nonzero(&|row: &CaseRow| row.extra_median.get(name).copied()));
    let variants = distinct_variants(exp);
    for variant in &variants {
        if variants.len() > 1 {
            let _ = writeln!(out, "### {variant}\n");
        }
        let rows: Vec<&CaseRow> = exp.rows.iter().filter(|r| &r.variant == variant).collect();
        main_table(out, exp, &endpoints, &rows);
        if !extra_names.is_empty() {
            extra_table(out, exp, &extra_names, &rows);
        }
    }
    let hidden: Vec<String> = zero_endpoints
        .iter()
        .map(|e| format!("`retrans {e}`"))
        .chain(zero_extras.iter().map(|name| format!("`{name}`")))
        .collect();
    if !hidden.is_empty() {
        let _ = writeln!(
            out,
            "Zero in every row, so left out of the tables (kept in results.jsonl): {}.\n",
            hidden.join(", ")
        );
    }

    let files = code_list(&exp.scenario_files);
    let _ =
        writeln!(
        out,
        "Reproduce: `midway lab run {}` on commit {} (seeds of every run are in results.jsonl).\n",
        exp.scenario_files.first().map(String::as_str).unwrap_or("?"),
        code_list(&exp.commits)
    );
    if exp.scenario_files.len() > 1 {
        let _ = writeln!(out, "(records of this experiment come from {files})\n");
    }
}

/// The `extra` measurements of the "other measurements" table: all but the page load time of a
/// web experiment, which has its own table.
fn table_extra_names(exp: &Experiment) -> Vec<String> {
    exp.extra_names
        .iter()
        .filter(|name| !(exp.web && name.as_str() == PAGE_LOAD_METRIC))
        .cloned()
        .collect()
}

/// GoS paired, GoS of medians and the GoS > 0 share of a row (blank for the baseline).
fn gos_cells(row: &CaseRow) -> (String, String, String) {
    if row.is_baseline {
        ("(baseline)".to_string(), "".to_string(), "".to_string())
    } else {
        (
            row.gos_median_paired.map(gain).unwrap_or_else(dash),
            row.gos_of_medians.map(gain).unwrap_or_else(dash),
            share_text(row.gos_positive),
        )
    }
}

fn retransmit_cells(out: &mut String, endpoints: &[String], row: &CaseRow) {
    for endpoint in endpoints {
        let value = row
            .retransmits_median
            .get(endpoint)
            .map(|v| count(*v))
            .unwrap_or_else(dash);
        let _ = write!(out, " {value} |");
    }
}

/// The main table of an experiment: the primary metric's spread per row (page load time in
/// seconds for a web experiment, with its mean; throughput in Mbit/s otherwise), the gain of
/// splitting (always on throughput) and the retransmit medians.
fn main_table(out: &mut String, exp: &Experiment, endpoints: &[String], rows: &[&CaseRow]) {
    let sweep = exp.sweep_param.as_deref().unwrap_or("point");
    let base = &exp.baseline_case;
    let (label, with_mean) = if exp.web {
        ("median page load s", true)
    } else {
        ("median Mbit/s", false)
    };
    let mean_header = if with_mean { " mean |" } else { "" };
    let _ = write!(
        out,
        "| {} | case | n | {label} | Q1 | Q3 |{mean_header} GoS paired vs {base} | GoS of medians | GoS > 0 |",
        cell(sweep)
    );
    for endpoint in endpoints {
        let _ = write!(out, " retrans {} |", cell(endpoint));
    }
    out.push('\n');
    let columns = 9 + usize::from(with_mean) + endpoints.len();
    out.push_str(&"|---".repeat(columns));
    out.push_str("|\n");
    for row in rows {
        let spread = if exp.web {
            row.page_load_seconds
        } else {
            row.throughput_mbps
        };
        let (n, median, q1, q3) = match spread {
            Some(s) => (
                s.n.to_string(),
                number(s.median),
                number(s.q1),
                number(s.q3),
            ),
            None => ("0".into(), "-".into(), "-".into(), "-".into()),
        };
        let mean = if with_mean {
            format!(" {} |", row.page_load_mean.map(number).unwrap_or_else(dash))
        } else {
            String::new()
        };
        let (gos_paired, gos_medians, share) = gos_cells(row);
        let _ = write!(
            out,
            "| {} | {} | {n} | {median} | {q1} | {q3} |{mean} {gos_paired} | {gos_medians} | {share} |",
            cell(&row.sweep_label),
            cell(&row.case)
        );
        retransmit_cells(out, endpoints, row);
        out.push('\n');
    }
    out.push('\n');
}

fn extra_table(out: &mut String, exp: &Experiment, extra_names: &[String], rows: &[&CaseRow]) {
    let sweep = exp.sweep_param.as_deref().unwrap_or("point");
    let _ = write!(
        out,
        "Other measurements (medians):\n\n| {} | case |",
        cell(sweep)
    );
    for name in extra_names {
        let _ = write!(out, " {} |", cell(name));
    }
    out.push('\n');
    out.push_str(&"|---".repeat(2 + extra_names.len()));
    out.push_str("|\n");
    for row in rows {
        let _ = write!(out, "| {} | {} |", cell(&row.sweep_label), cell(&row.case));
        for name in extra_names {
            let value = row
                .extra_median
                .get(name)
                .map(|v| number(*v))
                .unwrap_or_else(dash);
            let _ = write!(out, " {value} |");
        }
        out.push('\n');
    }
    out.push('\n');
}

fn distinct_variants(exp: &Experiment) -> Vec<String> {
    let mut variants: Vec<String> = Vec::new();
    for row in &exp.rows {
        if !variants.contains(&row.variant) {
            variants.push(row.variant.clone());
        }
    }
    variants
}

/// A number with about three significant digits, no exponent for the ranges a lab sees.
pub(crate) fn number(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 100.0 {
        format!("{value:.0}")
    } else if magnitude >= 10.0 {
        format!("{value:.1}")
    } else if magnitude >= 1.0 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}

/// A gain as a signed number with two decimals (+0.52 = 52 % faster).
pub(crate) fn gain(value: f64) -> String {
    format!("{value:+.2}")
}

/// A median of counts: whole numbers without decimals, halves with one.
pub(crate) fn count(value: f64) -> String {
    if value == value.trunc() {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// "3/5 (60 %)", or "-" without pairs.
pub(crate) fn share_text(share: PositiveShare) -> String {
    match share.fraction() {
        Some(fraction) => format!(
            "{}/{} ({:.0} %)",
            share.positive,
            share.total,
            fraction * 100.0
        ),
        None => dash(),
    }
}

fn dash() -> String {
    "-".to_string()
}

/// Escapes what would break a markdown table cell.
pub(crate) fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn code_list(items: &[String]) -> String {
    if items.is_empty() {
        return "-".to_string();
    }
    items
        .iter()
        .map(|i| format!("`{i}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formatting() {
        assert_eq!(number(12.0), "12.0");
        assert_eq!(number(6.0), "6.00");
        assert_eq!(count(2.0), "2");
        assert_eq!(count(2.5), "2.5");
        assert_eq!(number(12.26), "12.3");
        assert_eq!(number(1.357), "1.36");
        assert_eq!(number(0.2612), "0.261");
        assert_eq!(number(1234.4), "1234");
        assert_eq!(gain(0.5), "+0.50");
        assert_eq!(gain(-0.126), "-0.13");
        assert_eq!(
            share_text(PositiveShare {
                positive: 3,
                total: 4
            }),
            "3/4 (75 %)"
        );
        assert_eq!(cell("a|b"), "a\\|b");
    }
}
