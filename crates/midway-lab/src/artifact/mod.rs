//! `midway lab artifact`: reruns the subset of every reproduction its scenario's `[artifact]`
//! section names and sets each claim's verdict beside the committed full report's, so a reviewer
//! can test the artifact in under an hour instead of the full runs' 29 hours of transfers.
//!
//! The committed verdicts are recomputed from the committed records (`docs/results/PAPER/
//! results.jsonl`) with the shipped claims file and this build's evaluation, not read from the
//! report's markdown: both sides of the comparison are then judged by the same rules, whichever
//! the report crate has. The points are planned by the plan builder (`PlanOptions::artifact`)
//! and run by [`crate::run`], as `midway lab reproduce` runs them.

mod compare;
mod estimate;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use midway_report::claims::{ClaimsFile, JudgedClaim, Verdicts};
use midway_report::{RunRecord, DEFAULT_BASELINE_CASE, RESULTS_FILE};

use crate::cli::{
    default_jobs, repro_dir, repro_scenario, run, RunOptions, DEFAULT_RESULTS_ROOT, REPRO_PAPERS,
};
use crate::plan::{build_plan, PlanOptions, Point};
use crate::scenario::{ArtifactForm, LoadedScenario};
use compare::{Cell, Coverage, Row};
use estimate::{duration_text, estimate};

/// The options of `midway lab artifact`.
#[derive(Debug, clap::Args)]
pub struct ArtifactArgs {
    /// The shortest form: only the `[artifact]` entries marked `smoke = true` (about 2 minutes;
    /// what CI runs).
    #[arg(long)]
    smoke: bool,
    /// Only this paper (repeatable; default: hfc-proxy, hfc-tuning, overlay, satellite, umts).
    #[arg(long)]
    paper: Vec<String>,
    /// Print the subset, the claims it covers and its estimated duration; run nothing.
    #[arg(long)]
    estimate: bool,
    /// Output folder, one subfolder per paper (default lab-results/artifact-<time>); must be
    /// new unless --resume.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Topologies measured at once (default: one per CPU).
    #[arg(long)]
    jobs: Option<usize>,
    /// Continue an interrupted check in --out: skip points already measured successfully.
    #[arg(long)]
    resume: bool,
    /// Folder holding PAPER.toml and PAPER.claims.toml (default as for `midway lab reproduce`).
    #[arg(long)]
    scenarios: Option<PathBuf>,
    /// Folder of the committed full runs, DIR/PAPER/results.jsonl (default: docs/results of
    /// the source tree the scenarios are in).
    #[arg(long)]
    committed: Option<PathBuf>,
    /// Exit with an error when a covered claim's verdict differs from the committed one.
    #[arg(long)]
    fail_on_difference: bool,
    /// List every claim and target, not only those the subset measures.
    #[arg(long)]
    all_claims: bool,
}

/// One paper, planned: the points to run and what the committed run says.
struct Paper {
    name: String,
    scenario: PathBuf,
    points: Vec<Point>,
    claims: ClaimsFile,
    committed: Verdicts,
    /// Per claim, then per target, in file order: how much of what it reads the subset measures.
    coverage: (Vec<Coverage>, Vec<Coverage>),
    estimated_seconds: f64,
    /// Points no committed record measured (their duration is a guess).
    unknown: usize,
}

impl Paper {
    fn plan(
        name: &str,
        scenarios: &Path,
        committed_dir: &Path,
        form: ArtifactForm,
        jobs: usize,
    ) -> anyhow::Result<Paper> {
        let scenario = repro_scenario(scenarios, name)?;
        let loaded = LoadedScenario::load(&scenario)?;
        let subset = PlanOptions {
            artifact: Some(form),
            ..PlanOptions::default()
        };
        let points = build_plan(&loaded, &subset)?;
        let full = build_plan(&loaded, &PlanOptions::default())?;
        let claims_path = scenarios.join(format!("{name}.claims.toml"));
        let text = std::fs::read_to_string(&claims_path)
            .with_context(|| format!("cannot read {}", claims_path.display()))?;
        let claims = midway_report::claims::parse(&text)
            .with_context(|| format!("{}: not a valid claims file", claims_path.display()))?;
        let results = committed_dir.join(name).join(RESULTS_FILE);
        let records: Vec<RunRecord> = midway_report::read_records(&results)
            .with_context(|| format!("the committed run of {name}"))?;
        let committed = midway_report::claims::verdicts(&claims, &records, DEFAULT_BASELINE_CASE);
        let full_cells: BTreeSet<Cell> = full.iter().map(Cell::of).collect();
        let subset_cells: BTreeSet<Cell> = points.iter().map(Cell::of).collect();
        let coverage_of = |entries: &[midway_report::claims::Claim]| -> Vec<Coverage> {
            entries
                .iter()
                .map(|claim| {
                    let needed = compare::cells_read(claim, &full_cells, DEFAULT_BASELINE_CASE);
                    compare::coverage(&needed, &subset_cells)
                })
                .collect()
        };
        let coverage = (coverage_of(&claims.claims), coverage_of(&claims.targets));
        let estimated = estimate(&points, &records, jobs);
        Ok(Paper {
            name: name.to_string(),
            scenario,
            points,
            coverage,
            claims,
            committed,
            estimated_seconds: estimated.seconds,
            unknown: estimated.unknown,
        })
    }

    /// "fig13-legacy, fig5-bulk" (the experiments of the subset, in plan order).
    fn experiments(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for point in &self.points {
            if !names.contains(&point.experiment.as_str()) {
                names.push(&point.experiment);
            }
        }
        names.join(", ")
    }

    /// (covered, partly covered, tested) among `committed`: a claim the lab does not test is
    /// compared with nothing, whatever the subset measures.
    fn counts(committed: &[JudgedClaim], coverage: &[Coverage]) -> (usize, usize, usize) {
        let tested: Vec<Coverage> = committed
            .iter()
            .zip(coverage)
            .filter(|(judged, _)| judged.verdict != compare::NOT_TESTED)
            .map(|(_, coverage)| *coverage)
            .collect();
        let count = |wanted| tested.iter().filter(|c| **c == wanted).count();
        (
            count(Coverage::Covered),
            count(Coverage::Partly),
            tested.len(),
        )
    }

    /// The comparison rows, claims then targets, from the artifact run's verdicts.
    fn rows(&self, artifact: &Verdicts) -> Vec<Row> {
        let mut rows = compare::compare(
            "claim",
            &self.committed.claims,
            &artifact.claims,
            &self.coverage.0,
        );
        rows.extend(compare::compare(
            "target",
            &self.committed.targets,
            &artifact.targets,
            &self.coverage.1,
        ));
        rows
    }
}

/// Runs `midway lab artifact`.
pub(crate) fn execute(args: &ArtifactArgs) -> anyhow::Result<()> {
    let form = if args.smoke {
        ArtifactForm::Smoke
    } else {
        ArtifactForm::Full
    };
    let scenarios = match &args.scenarios {
        Some(dir) => dir.clone(),
        None => repro_dir()?,
    };
    let committed_dir = args
        .committed
        .clone()
        .unwrap_or_else(|| scenarios.join("../../docs/results"));
    let names: Vec<String> = if args.paper.is_empty() {
        REPRO_PAPERS.iter().map(|p| p.to_string()).collect()
    } else {
        args.paper.clone()
    };
    let jobs = args.jobs.unwrap_or_else(default_jobs);
    let mut papers = Vec::new();
    for name in &names {
        let paper = Paper::plan(name, &scenarios, &committed_dir, form, jobs)?;
        // A paper whose scenario marks nothing for this form has no part in it.
        if !paper.points.is_empty() {
            papers.push(paper);
        }
    }
    if papers.is_empty() {
        bail!(
            "no [artifact] entries for this form in the scenarios of {}",
            names.join(", ")
        );
    }
    print!("{}", plan_text(&papers, form, jobs));
    if args.estimate {
        return Ok(());
    }
    midway_labnet::require_root().context("midway lab artifact")?;
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(DEFAULT_RESULTS_ROOT).join(format!("artifact-{}", crate::time::compact_now()))
    });
    let started = Instant::now();
    let mut text = String::new();
    let mut summaries = String::new();
    let mut run_failures = Vec::new();
    let mut differing = 0;
    for paper in &papers {
        let paper_started = Instant::now();
        let folder = out.join(&paper.name);
        let options = RunOptions {
            scenario: paper.scenario.clone(),
            out: Some(folder.clone()),
            plan: PlanOptions {
                artifact: Some(form),
                ..PlanOptions::default()
            },
            jobs,
            resume: args.resume,
            keep_point_dirs: false,
            progress: true,
            allow_dirty: false,
        };
        // One paper's failure (a missing tool, say) leaves the others' comparisons worth having.
        let summary = match run(&options) {
            Ok(summary) => summary,
            Err(error) => {
                eprintln!("{}: the run failed: {error:#}", paper.name);
                run_failures.push(format!("{}: {error:#}", paper.name));
                continue;
            }
        };
        println!(
            "{}: {} points measured ({} failed, {} already done) in {}; records in {}",
            paper.name,
            summary.records,
            summary.failed,
            summary.skipped,
            duration_text(paper_started.elapsed().as_secs_f64()),
            folder.display()
        );
        if summary.failed > 0 {
            run_failures.push(format!(
                "{}: {} points failed (their errors are in {})",
                paper.name,
                summary.failed,
                folder.join(RESULTS_FILE).display()
            ));
        }
        // Every record of the folder: with --resume this call measured only what was missing.
        let records = midway_report::read_records(&folder.join(RESULTS_FILE))?;
        let artifact =
            midway_report::claims::verdicts(&paper.claims, &records, DEFAULT_BASELINE_CASE);
        let rows = paper.rows(&artifact);
        differing += rows
            .iter()
            .filter(|r| {
                matches!(
                    r.outcome,
                    compare::Outcome::Differs | compare::Outcome::Opposes
                )
            })
            .count();
        text.push_str(&compare::table(&paper.name, &rows, args.all_claims));
        let _ = writeln!(summaries, "- {}: {}", paper.name, compare::summary(&rows));
    }
    let report = format!(
        "{}\n{}{text}\n{summaries}\nMeasured in {} (--jobs {jobs}); records in {}.\n",
        heading(form),
        compare::TABLE_HEADER,
        duration_text(started.elapsed().as_secs_f64()),
        out.display()
    );
    print!("\n{report}");
    let saved = out.join("artifact.md");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    std::fs::write(
        &saved,
        format!("{}{report}", plan_text(&papers, form, jobs)),
    )
    .with_context(|| format!("cannot write {}", saved.display()))?;
    if !run_failures.is_empty() {
        bail!("the artifact run failed:\n  {}", run_failures.join("\n  "));
    }
    if args.fail_on_difference && differing > 0 {
        bail!("{differing} covered verdicts differ from the committed reports' (--fail-on-difference)");
    }
    Ok(())
}

fn heading(form: ArtifactForm) -> String {
    let name = match form {
        ArtifactForm::Full => "artifact check",
        ArtifactForm::Smoke => "artifact check (smoke form)",
    };
    format!(
        "Verdicts of the {name} against the committed full runs' (recomputed from their records \
         with this build):"
    )
}

/// What will run: per paper its experiments, points, the claims it covers and the estimate.
fn plan_text(papers: &[Paper], form: ArtifactForm, jobs: usize) -> String {
    let mut text = String::new();
    let form_name = match form {
        ArtifactForm::Full => "full form",
        ArtifactForm::Smoke => "smoke form",
    };
    let _ = writeln!(text, "Artifact check, {form_name}, --jobs {jobs}:");
    let mut total = 0.0;
    for paper in papers {
        total += paper.estimated_seconds;
        let claims = Paper::counts(&paper.committed.claims, &paper.coverage.0);
        let targets = Paper::counts(&paper.committed.targets, &paper.coverage.1);
        let partly = claims.1 + targets.1;
        let partly = if partly > 0 {
            format!(" ({partly} more partly: not compared)")
        } else {
            String::new()
        };
        let unknown = if paper.unknown > 0 {
            format!(
                " ({} points not in the committed records, guessed)",
                paper.unknown
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            text,
            "- {}: {} points ({}); covers {} of the {} claims and {} of the {} targets the lab \
             tests{partly}; estimated {}{unknown}",
            paper.name,
            paper.points.len(),
            paper.experiments(),
            claims.0,
            claims.2,
            targets.0,
            targets.2,
            duration_text(paper.estimated_seconds),
        );
    }
    let points: usize = papers.iter().map(|p| p.points.len()).sum();
    let _ = writeln!(
        text,
        "Total: {points} points, estimated {} (each point's transfer time as the committed \
         records measured it, plus set-up, {jobs} at once).\n",
        duration_text(total)
    );
    text
}

/// The size of a scenario's artifact subset for `midway lab check`: "N points (M in the smoke
/// form) at R repetitions", or `None` without an `[artifact]` section.
pub(crate) fn check_line(loaded: &LoadedScenario) -> anyhow::Result<Option<String>> {
    let Some(artifact) = &loaded.file.artifact else {
        return Ok(None);
    };
    let count = |form| -> anyhow::Result<usize> {
        let options = PlanOptions {
            artifact: Some(form),
            ..PlanOptions::default()
        };
        Ok(build_plan(loaded, &options)?.len())
    };
    Ok(Some(format!(
        "artifact check: {} points ({} in the smoke form) at {} repetitions",
        count(ArtifactForm::Full)?,
        count(ArtifactForm::Smoke)?,
        artifact.repetitions.get_ref()
    )))
}
