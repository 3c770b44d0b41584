//! The `midway lab` subcommands.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use midway_report::RunRecord;

use crate::plan::{self, PlanOptions, Point, Shard};
use crate::provenance::{is_published_results, SourceTree};
use crate::runner::{self, RunContext};
use crate::scenario::{CaseKind, LoadedScenario};

/// Workers when `--jobs` is not given: one per CPU.
///
/// Measured on the 2-core lab machine with `--check-concurrency` (hfc-demo, 3 MB): with 4 jobs
/// every proxy case kept its median within 2 % of the serial run, but the lossless direct case,
/// whose throughput hangs on exactly when slow start overflows the 10 KB modem queue, lost about
/// 10 % (median 2.44 vs 2.75 Mbit/s over 8 repetitions); with 2 jobs it matched (2.90). One job
/// per core keeps the emulator's timing honest; more is a choice to check on each machine.
pub(crate) fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}
/// Where runs go when `--out` is not given: `lab-results/<scenario>-<UTC time>`.
pub(crate) const DEFAULT_RESULTS_ROOT: &str = "lab-results";

/// The `midway lab` subcommands, parsed by clap; [`execute`] runs one.
#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Run a scenario: sweeps x cases x repetitions, results to DIR/results.jsonl, report at the end.
    Run {
        /// Scenario file (TOML), e.g. scenarios/hfc-demo.toml.
        scenario: PathBuf,
        /// Output folder (default lab-results/<scenario>-<time>); must be new unless --resume.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Short version: first, middle and last sweep value, one repetition, the file's [quick] overrides.
        #[arg(long)]
        quick: bool,
        /// Topologies measured at once (default: one per CPU).
        #[arg(long)]
        jobs: Option<usize>,
        /// Repetitions of every point, overriding the file.
        #[arg(long)]
        repetitions: Option<u32>,
        /// Run only this experiment (repeatable).
        #[arg(long)]
        experiment: Vec<String>,
        /// Run only this case of each experiment (repeatable).
        #[arg(long)]
        case: Vec<String>,
        /// Continue an interrupted run in --out: skip points already measured successfully.
        #[arg(long)]
        resume: bool,
        /// Base seed, overriding the file's (every point's seed is derived from it).
        #[arg(long)]
        seed: Option<u64>,
        /// "i/n": run only every n-th point starting at i; shards' results.jsonl files concatenate.
        #[arg(long)]
        shard: Option<String>,
        /// Run the points twice, with --baseline-jobs B and with --jobs N, into OUT/jobs-B and
        /// OUT/jobs-N, and print each cell's median ratio of throughputs with its interval
        /// (repetitions paired by seed; 93.8 % with 5 pairs) and whether it differs. With --resume each pass measures
        /// only what its folder lacks (a finished check just prints its table again).
        #[arg(long)]
        check_concurrency: bool,
        /// The baseline's jobs for --check-concurrency.
        #[arg(long, default_value_t = 1, requires = "check_concurrency")]
        baseline_jobs: usize,
        /// Keep every point's folder (generated configs, proxy logs), not only failed ones.
        #[arg(long)]
        keep_point_dirs: bool,
        /// Run into docs/results even from a source tree with uncommitted changes (the report
        /// says so at its top).
        #[arg(long)]
        allow_dirty: bool,
    },
    /// Reproduce a paper's figures: runs the shipped scenarios/repro/PAPER.toml (legacy and
    /// modern hosts) and adds the table "paper says / we measured / agrees?" from PAPER.claims.toml.
    Reproduce {
        /// hfc-proxy, hfc-tuning, overlay, satellite or umts.
        paper: String,
        /// Output folder (default lab-results/<paper>-<time>); must be new unless --resume.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Short version: first, middle and last sweep value, one repetition.
        #[arg(long)]
        quick: bool,
        /// Topologies measured at once (default: one per CPU).
        #[arg(long)]
        jobs: Option<usize>,
        /// Run only this experiment (repeatable).
        #[arg(long)]
        experiment: Vec<String>,
        /// Run only this case of each experiment (repeatable).
        #[arg(long)]
        case: Vec<String>,
        /// Continue an interrupted run in --out.
        #[arg(long)]
        resume: bool,
        /// Folder holding PAPER.toml and PAPER.claims.toml (default: MIDWAY_REPRO_DIR, else
        /// scenarios/repro in the current folder or in the source tree of this binary).
        #[arg(long)]
        scenarios: Option<PathBuf>,
        /// "i/n": run only every n-th point starting at i (what each task of `midway lab
        /// slurm` runs); shards' results.jsonl files concatenate.
        #[arg(long)]
        shard: Option<String>,
        /// Run into docs/results even from a source tree with uncommitted changes (the report
        /// says so at its top).
        #[arg(long)]
        allow_dirty: bool,
    },
    /// Artifact check: rerun the `[artifact]` subset of every paper's scenario (under an hour;
    /// --smoke: about 2 minutes) and print, claim by claim, whether its verdict matches the
    /// committed full run's. Exits with an error only when the run fails: a covered verdict may
    /// differ without the artifact being broken (another machine's timing; a claim whose
    /// interval straddles its bound comes out either way), so differences are for the reader to
    /// weigh; --fail-on-difference makes them an error.
    Artifact(crate::artifact::ArtifactArgs),
    /// Run a paper's reproduction as a Slurm job array: pins the current commit (a clone of it
    /// beside the results, and a midway built from it), submits one shard per array task (one
    /// task per node unless --share-nodes), waits, merges the shards' results and builds the
    /// report. The tasks run `midway lab reproduce`, so they need root on the nodes.
    Slurm {
        /// hfc-proxy, hfc-tuning, overlay, satellite or umts.
        paper: String,
        /// Output folder on storage every node sees (default lab-results/<paper>-slurm-<time>);
        /// must be new unless --resume.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Array tasks, i.e. shards of the plan.
        #[arg(long, default_value_t = 4)]
        tasks: usize,
        /// Short version: first, middle and last sweep value, one repetition.
        #[arg(long)]
        quick: bool,
        /// Run only this experiment (repeatable).
        #[arg(long)]
        experiment: Vec<String>,
        /// Run only this case of each experiment (repeatable).
        #[arg(long)]
        case: Vec<String>,
        /// Topologies each task measures at once (default: one per CPU of its node).
        #[arg(long)]
        jobs: Option<usize>,
        /// Slurm partition (default: the cluster's default partition).
        #[arg(long)]
        partition: Option<String>,
        /// Time limit of each task, in Slurm's format (e.g. 4:00:00).
        #[arg(long)]
        time_limit: Option<String>,
        /// Let tasks share a node (default: each task has a node to itself, so runs do not
        /// share a kernel; every record keeps its load average either way).
        #[arg(long)]
        share_nodes: bool,
        /// Use this midway binary in the tasks instead of building one from the pinned commit
        /// (it must have been built from that commit; the job's manifest says which was used).
        #[arg(long)]
        binary: Option<PathBuf>,
        /// Further arguments for sbatch (repeatable), e.g. --sbatch-arg=--account=lab.
        #[arg(long, allow_hyphen_values = true)]
        sbatch_arg: Vec<String>,
        /// Submit again into an existing --out (same pinned commit and binary): every task
        /// skips the points its shard has already measured.
        #[arg(long)]
        resume: bool,
    },
    /// Rebuild the report of a results folder.
    Report {
        /// Results folder holding results.jsonl (the --out of a run).
        dir: PathBuf,
    },
    /// Check the emulator against its configuration.
    Selftest {
        /// Short version: one rate, about 5 s, instead of rates from 1 to 500 Mbit/s.
        #[arg(long)]
        quick: bool,
    },
    /// Validate a scenario file without running it (no root needed).
    Check {
        /// Scenario file (TOML) to validate.
        scenario: PathBuf,
    },
    /// Remove namespaces and links left by a crashed run.
    Clean,
    /// Print Chromium's connections and requests from its net log (a point's
    /// `chromium-N/profile/netlog.json`, kept with `--keep-point-dirs`), in ms from the page's
    /// request.
    Timeline {
        /// The net log file.
        netlog: PathBuf,
    },
}

/// Runs a `midway lab` subcommand.
pub fn execute(cmd: LabCommand) -> anyhow::Result<()> {
    match cmd {
        LabCommand::Run {
            scenario,
            out,
            quick,
            jobs,
            repetitions,
            experiment,
            case,
            resume,
            seed,
            shard,
            check_concurrency,
            baseline_jobs,
            keep_point_dirs,
            allow_dirty,
        } => {
            midway_labnet::require_root().context("midway lab run")?;
            let shard = shard.map(|s| s.parse::<Shard>()).transpose()?;
            let options = RunOptions {
                scenario,
                out,
                plan: PlanOptions {
                    quick,
                    artifact: None,
                    experiments: experiment,
                    cases: case,
                    repetitions,
                    seed,
                    shard,
                },
                jobs: jobs.unwrap_or_else(default_jobs),
                resume,
                keep_point_dirs,
                progress: true,
                allow_dirty,
            };
            if check_concurrency {
                check_concurrency_run(&options, baseline_jobs)
            } else {
                run_and_summarise(&options)
            }
        }
        LabCommand::Reproduce {
            paper,
            out,
            quick,
            jobs,
            experiment,
            case,
            resume,
            scenarios,
            shard,
            allow_dirty,
        } => {
            midway_labnet::require_root().context("midway lab reproduce")?;
            let shard = shard.map(|s| s.parse::<Shard>()).transpose()?;
            let dir = match scenarios {
                Some(dir) => dir,
                None => repro_dir()?,
            };
            let scenario = repro_scenario(&dir, &paper)?;
            let out = out.unwrap_or_else(|| {
                PathBuf::from(DEFAULT_RESULTS_ROOT)
                    .join(format!("{paper}-{}", crate::time::compact_now()))
            });
            // The claims go beside the results, where every report build (this run's, and any
            // later `midway lab report OUT`) finds them and adds the paper-vs-lab table.
            fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
            let claims = dir.join(format!("{paper}.claims.toml"));
            fs::copy(&claims, out.join(midway_report::claims::CLAIMS_FILE))
                .with_context(|| format!("cannot copy {}", claims.display()))?;
            let options = RunOptions {
                scenario,
                out: Some(out),
                plan: PlanOptions {
                    quick,
                    experiments: experiment,
                    cases: case,
                    shard,
                    ..PlanOptions::default()
                },
                jobs: jobs.unwrap_or_else(default_jobs),
                resume,
                keep_point_dirs: false,
                progress: true,
                allow_dirty,
            };
            run_and_summarise(&options)
        }
        LabCommand::Artifact(args) => crate::artifact::execute(&args),
        LabCommand::Slurm {
            paper,
            out,
            tasks,
            quick,
            experiment,
            case,
            jobs,
            partition,
            time_limit,
            share_nodes,
            binary,
            sbatch_arg,
            resume,
        } => {
            let out = out.unwrap_or_else(|| {
                PathBuf::from(DEFAULT_RESULTS_ROOT)
                    .join(format!("{paper}-slurm-{}", crate::time::compact_now()))
            });
            let request = crate::slurm::SlurmRequest {
                paper,
                out,
                tasks,
                quick,
                experiments: experiment,
                cases: case,
                jobs,
                partition,
                time_limit,
                share_nodes,
                binary,
                sbatch_args: sbatch_arg,
                resume,
            };
            crate::slurm::run(&request)
        }
        LabCommand::Report { dir } => {
            let summary =
                midway_report::write_report(&dir, &midway_report::ReportOptions::default())?;
            println!(
                "report: {} ({} records, {} failed)",
                summary.report_path.display(),
                summary.records,
                summary.failed_records
            );
            print_report_warnings(&summary.warnings);
            Ok(())
        }
        LabCommand::Selftest { quick } => {
            midway_labnet::require_root().context("midway lab selftest")?;
            midway_labnet::install_cleanup_on_signal()?;
            let options = if quick {
                midway_labnet::selftest::SelftestOptions::quick()
            } else {
                midway_labnet::selftest::SelftestOptions::full()
            };
            let report = midway_labnet::selftest::run(&options)?;
            println!("{report}");
            if report.all_passed() {
                Ok(())
            } else {
                bail!("the emulator does not hold its configuration (see the table above)")
            }
        }
        LabCommand::Check { scenario } => {
            let loaded = LoadedScenario::load(&scenario)?;
            print!("{}", check_summary(&loaded)?);
            Ok(())
        }
        LabCommand::Timeline { netlog } => {
            let text = fs::read_to_string(&netlog)
                .with_context(|| format!("cannot read {}", netlog.display()))?;
            let timeline = crate::netlog::parse_netlog(&text)
                .with_context(|| format!("{}", netlog.display()))?;
            print!("{}", crate::netlog::render(&timeline));
            Ok(())
        }
        LabCommand::Clean => {
            midway_labnet::require_root().context("midway lab clean")?;
            let removed = midway_labnet::clean_leftovers()?;
            println!("removed {removed} leftover namespace(s)");
            Ok(())
        }
    }
}

/// What `midway lab check` prints: the plan's size, full and quick, and what it needs.
pub fn check_summary(loaded: &LoadedScenario) -> anyhow::Result<String> {
    use std::fmt::Write;
    let full = plan::build_plan(loaded, &PlanOptions::default())?;
    let quick = plan::build_plan(
        loaded,
        &PlanOptions {
            quick: true,
            ..PlanOptions::default()
        },
    )?;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{}: scenario `{}` is valid",
        loaded.path.display(),
        loaded.base.name
    );
    for experiment in &loaded.file.experiments {
        let name = experiment.name.get_ref();
        let count = |points: &[Point]| points.iter().filter(|p| &p.experiment == name).count();
        let sweep = experiment
            .sweep
            .as_ref()
            .map(|s| {
                format!(
                    "{} over {} ({} values)",
                    s.label,
                    s.param.get_ref(),
                    s.values.get_ref().len()
                )
            })
            .unwrap_or_else(|| "no sweep".into());
        let limit = experiment
            .max_jobs
            .as_ref()
            .map(|m| format!("; at most {} at once", m.get_ref()))
            .unwrap_or_default();
        let _ = writeln!(
            text,
            "  experiment {name}: {sweep}; {} points ({} with --quick){limit}",
            count(&full),
            count(&quick)
        );
    }
    let _ = writeln!(
        text,
        "  total: {} points ({} with --quick)",
        full.len(),
        quick.len()
    );
    if let Some(line) = crate::artifact::check_line(loaded)? {
        let _ = writeln!(text, "  {line}");
    }
    if let Some(missing) = missing_congestion_controls(&full) {
        let _ = writeln!(text, "  warning: {missing}");
    }
    let needs_haproxy = loaded
        .base
        .cases
        .values()
        .any(|c| c.kind == CaseKind::Haproxy);
    if needs_haproxy && which("haproxy").is_none() {
        let _ = writeln!(
            text,
            "  warning: a case needs haproxy, which is not on PATH (apt-get install haproxy)"
        );
    }
    let needs_squid = loaded
        .base
        .cases
        .values()
        .any(|c| c.kind == CaseKind::Squid);
    if needs_squid && which("squid").is_none() {
        let _ = writeln!(
            text,
            "  warning: a case needs squid, which is not on PATH (apt-get install squid)"
        );
    }
    let needs_chromium = full.iter().any(|point| {
        matches!(&point.scenario.workload, crate::scenario::Workload::Web(web)
            if web.client == crate::scenario::WebClient::Chromium)
    });
    if needs_chromium && which("chromium").is_none() {
        let _ = writeln!(
            text,
            "  warning: the workload needs chromium, which is not on PATH (apt-get install chromium)"
        );
    }
    Ok(text)
}

/// Congestion controls the points ask for that this kernel does not offer, as a message.
fn missing_congestion_controls(points: &[Point]) -> Option<String> {
    let available = midway_sys::sysctl::available_congestion_controls().ok()?;
    let mut wanted = std::collections::BTreeSet::new();
    for point in points {
        if let crate::scenario::Workload::Bulk(bulk) = &point.scenario.workload {
            wanted.extend(bulk.server_congestion_control.clone());
            wanted.extend(bulk.client_congestion_control.clone());
        }
        for case in point.scenario.cases.values() {
            if let Some(tuning) = &case.route_tuning {
                wanted.extend(tuning.congctl.clone());
            }
        }
    }
    let missing: Vec<String> = wanted
        .into_iter()
        .filter(|cc| !available.contains(cc))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "congestion control {} not available on this kernel (it has: {})",
            missing.join(", "),
            available.join(" ")
        )
    })
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}

/// Options of one run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The scenario file (TOML) to run.
    pub scenario: PathBuf,
    /// Output folder; `None` = `lab-results/<scenario name>-<UTC time>`.
    pub out: Option<PathBuf>,
    /// Which points to run (quick, experiments, repetitions, seed, shard).
    pub plan: PlanOptions,
    /// Topologies measured at once.
    pub jobs: usize,
    /// Continue a run in `out`: skip points already measured successfully; without it an
    /// existing results.jsonl in `out` is an error.
    pub resume: bool,
    /// Keep every point's folder (generated configs, proxy logs), not only failed ones.
    pub keep_point_dirs: bool,
    /// Show a progress bar on the terminal.
    pub progress: bool,
    /// Run into docs/results even from a source tree with uncommitted changes.
    pub allow_dirty: bool,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The folder the results went to.
    pub out_dir: PathBuf,
    /// Points planned (after shard).
    pub planned: usize,
    /// Points skipped because `--resume` found them already measured.
    pub skipped: usize,
    /// Points measured now (records appended to results.jsonl), failed ones included.
    pub records: usize,
    /// Of those, points whose measurement failed.
    pub failed: usize,
    /// The markdown report written at the end, or `None` if it could not be made.
    pub report: Option<PathBuf>,
    /// The records appended by this run, in the order they were written.
    pub records_written: Vec<RunRecord>,
}

fn print_summary(summary: &RunSummary) {
    println!(
        "measured {} points ({} failed, {} already done) in {}",
        summary.records,
        summary.failed,
        summary.skipped,
        summary.out_dir.display()
    );
    match &summary.report {
        Some(path) => println!("report: {}", path.display()),
        None => println!("no report (no successful records)"),
    }
}

/// The midway binary for proxy cases: `MIDWAY_BIN`, else this executable.
pub(crate) fn midway_binary() -> anyhow::Result<PathBuf> {
    match std::env::var_os("MIDWAY_BIN") {
        Some(path) => Ok(PathBuf::from(path)),
        // The running binary's own image, even if the file is rebuilt during a long sweep
        // (exec of /proc/self/exe in the forked child runs the parent's executable), so every
        // point of a run uses the same midway.
        None if Path::new("/proc/self/exe").exists() => Ok(PathBuf::from("/proc/self/exe")),
        None => std::env::current_exe().context("cannot find the midway binary (set MIDWAY_BIN)"),
    }
}

/// Loads, plans and runs a scenario, then writes the report.
pub fn run(options: &RunOptions) -> anyhow::Result<RunSummary> {
    let loaded = LoadedScenario::load(&options.scenario)?;
    let points = plan::build_plan(&loaded, &options.plan)?;
    if points.is_empty() {
        bail!("nothing to run: the plan (after --experiment and --shard) is empty");
    }
    if let Some(missing) = missing_congestion_controls(&points) {
        bail!("{}: {missing}", options.scenario.display());
    }
    let out_dir = options.out.clone().unwrap_or_else(|| {
        PathBuf::from(DEFAULT_RESULTS_ROOT).join(format!(
            "{}-{}",
            loaded.base.name,
            crate::time::compact_now()
        ))
    });
    // Absolute: the proxies run with working directories of their own (Squid opened
    // "docs/results/.../access.log" relative to its own and refused to start).
    let out_dir = std::path::absolute(&out_dir)
        .with_context(|| format!("cannot resolve {}", out_dir.display()))?;
    let scenario_dir = options
        .scenario
        .parent()
        .map(Path::to_path_buf)
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("."));
    let tree = SourceTree::of(&scenario_dir);
    if tree.is_dirty() && is_published_results(&out_dir) && !options.allow_dirty {
        bail!(
            "{}: the source tree {} has uncommitted changes ({}); a report under docs/results \
             must come from a clean commit: commit first, or pass --allow-dirty (the report then \
             says so at its top)",
            out_dir.display(),
            tree.commit,
            tree.state.as_deref().unwrap_or("?")
        );
    }
    let results = out_dir.join(midway_report::RESULTS_FILE);
    if results.exists() && !options.resume {
        bail!(
            "{} already exists: pass --resume to continue that run, or choose another --out",
            results.display()
        );
    }
    fs::create_dir_all(&out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    let planned = points.len();
    let points = if options.resume && results.exists() {
        let records = midway_report::read_records(&results)?;
        refuse_mixed_load(&results, &records, &points, options.jobs)?;
        plan::skip_done(points, &plan::done_keys(&records))
    } else {
        points
    };
    let skipped = planned - points.len();
    // Keep the scenario beside its results so the folder alone can repeat the run.
    let copy = out_dir.join("scenario.toml");
    if !copy.exists() {
        fs::write(&copy, &loaded.text)
            .with_context(|| format!("cannot write {}", copy.display()))?;
    }
    // A scenario's claims (SCENARIO.claims.toml beside it: the papers' numbers to set beside the
    // lab's) go with it, so its report ends with the "paper vs lab" table as a reproduction's
    // does. `reproduce` has already put its own there.
    let claims_copy = out_dir.join(midway_report::claims::CLAIMS_FILE);
    let claims_beside = options.scenario.with_extension("claims.toml");
    if !claims_copy.exists() && claims_beside.is_file() {
        fs::copy(&claims_beside, &claims_copy)
            .with_context(|| format!("cannot copy {}", claims_beside.display()))?;
    }
    midway_labnet::install_cleanup_on_signal()?;
    let context = RunContext {
        out_dir: out_dir.clone(),
        commit: tree.commit.clone(),
        tree: tree.state.clone(),
        quick: options.plan.quick,
        jobs: options.jobs,
        scenario_dir,
        scenario_file: options.scenario.display().to_string(),
        midway_bin: midway_binary()?,
        keep_point_dirs: options.keep_point_dirs,
    };
    let bar = if options.progress {
        ProgressBar::new(points.len() as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} points, eta {eta} {msg}",
        )
        .context("the progress bar's template")?
        .progress_chars("=> "),
    );
    let mut failed = 0;
    let written = runner::run_points(&context, &points, options.jobs, &results, |record| {
        bar.inc(1);
        if record.ok {
            bar.set_message(format!(
                "{} {} {:.2} Mbit/s",
                record.experiment,
                record.case,
                record.throughput_bps / 1e6
            ));
        } else {
            failed += 1;
            bar.println(format!(
                "point failed: {} {} rep {}: {}",
                record.experiment,
                record.case,
                record.repetition,
                record.error.as_deref().unwrap_or("?")
            ));
        }
    })?;
    bar.finish_and_clear();
    let report =
        match midway_report::write_report(&out_dir, &midway_report::ReportOptions::default()) {
            Ok(summary) => {
                print_report_warnings(&summary.warnings);
                Some(summary.report_path)
            }
            Err(error) => {
                eprintln!("no report: {:#}", anyhow::Error::from(error));
                None
            }
        };
    Ok(RunSummary {
        out_dir,
        planned,
        skipped,
        records: written.len(),
        failed,
        report,
        records_written: written,
    })
}

/// Refuses to resume the run in `results` when this pass would measure `points` under another
/// load policy than its records were (another `--jobs`, or an experiment whose `max_jobs` the
/// scenario has changed since). One report does not mix them
/// ([`midway_report::mixed_load_policies`]); the lab refuses before it measures anything rather
/// than leave a folder the report then refuses.
fn refuse_mixed_load(
    results: &Path,
    records: &[RunRecord],
    points: &[Point],
    jobs: usize,
) -> anyhow::Result<()> {
    let this_pass = points.iter().map(|point| RunRecord {
        load: Some(runner::load_policy(jobs, point)),
        ..plan::skeleton_record(point, "", "", "")
    });
    let together: Vec<RunRecord> = records.iter().cloned().chain(this_pass).collect();
    if let Some(mixed) = midway_report::mixed_load_policies(&together) {
        bail!(
            "{}: resuming it with --jobs {jobs} and this scenario would mix load policies in one \
             report ({mixed}; this pass's points counted as records); runs measured under \
             different loads are not comparable: resume with the --jobs and the scenario it was \
             started with, or choose another --out",
            results.display()
        );
    }
    Ok(())
}

/// Runs the plan with the baseline's jobs, then with N, and prints each cell's median of paired
/// ratios with its interval and verdict ([`crate::concurrency`]).
fn check_concurrency_run(options: &RunOptions, baseline_jobs: usize) -> anyhow::Result<()> {
    let base = options.out.clone().unwrap_or_else(|| {
        PathBuf::from(DEFAULT_RESULTS_ROOT)
            .join(format!("concurrency-{}", crate::time::compact_now()))
    });
    let jobs = options.jobs;
    if baseline_jobs == 0 || jobs == baseline_jobs {
        bail!(
            "--check-concurrency compares --baseline-jobs {baseline_jobs} with --jobs {jobs}: \
             give two different, non-zero counts"
        );
    }
    let mut runs = Vec::new();
    for j in [baseline_jobs, jobs] {
        let mut one = options.clone();
        one.jobs = j;
        one.out = Some(base.join(format!("jobs-{j}")));
        let started = std::time::Instant::now();
        let summary = run(&one)?;
        println!(
            "--jobs {j}: {} points in {:.1} s ({} failed)",
            summary.records,
            started.elapsed().as_secs_f64(),
            summary.failed
        );
        // Every record in the folder, not only this call's: with --resume a pass measures only
        // what its folder lacks, and a finished check prints its table again from the records.
        let results = summary.out_dir.join(midway_report::RESULTS_FILE);
        runs.push(midway_report::read_records(&results)?);
    }
    let rows = crate::concurrency::compare(&runs[0], &runs[1]);
    println!(
        "{:<26} {:<30} {:>10} {:>5} {:>10} {:>10} {:>7} {:>31}  verdict",
        "experiment",
        "case",
        "x",
        "pairs",
        format!("jobs={baseline_jobs}"),
        format!("jobs={jobs}"),
        "ratio",
        "interval"
    );
    for row in &rows {
        let interval = row.interval.map_or("-".into(), |i| {
            format!("{} {:.3}..{:.3}", i.label(), i.low, i.high)
        });
        println!(
            "{:<26} {:<30} {:>10} {:>5} {:>10.3} {:>10.3} {:>7.3} {:>31}  {}",
            row.key.0,
            row.key.1,
            row.key.2,
            row.pairs,
            row.baseline_median,
            row.parallel_median,
            row.ratio,
            interval,
            row.verdict().text()
        );
    }
    let differing = rows
        .iter()
        .filter(|r| r.verdict() == crate::concurrency::ConcurrencyVerdict::Differs)
        .count();
    println!(
        "{differing} of {} cells differ (the interval of the median paired ratio excludes 1); \
         medians in Mbit/s; records in {}",
        rows.len(),
        base.display()
    );
    Ok(())
}

/// What the report builder could not honour (e.g. a `[[plots]]` entry naming an unknown
/// experiment); the same lines are at the top of the report.
fn print_report_warnings(warnings: &[String]) {
    for warning in warnings {
        eprintln!("report warning: {warning}");
    }
}

/// Papers `midway lab reproduce` knows (each has scenarios/repro/PAPER.toml and .claims.toml).
pub(crate) const REPRO_PAPERS: [&str; 5] =
    ["hfc-proxy", "hfc-tuning", "overlay", "satellite", "umts"];

/// The folder of the shipped reproduction scenarios: `MIDWAY_REPRO_DIR`, else `scenarios/repro`
/// under the current folder, else under the source tree this binary was built from.
pub(crate) fn repro_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("MIDWAY_REPRO_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let candidates = [
        PathBuf::from("scenarios/repro"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/repro"),
    ];
    candidates
        .iter()
        .find(|dir| dir.is_dir())
        .cloned()
        .with_context(|| {
            format!(
                "cannot find the reproduction scenarios (looked in {}); pass --scenarios DIR or set MIDWAY_REPRO_DIR",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// `DIR/PAPER.toml`, after checking PAPER is one the lab reproduces.
pub(crate) fn repro_scenario(dir: &Path, paper: &str) -> anyhow::Result<PathBuf> {
    if !REPRO_PAPERS.contains(&paper) {
        bail!(
            "unknown paper `{paper}`: midway lab reproduce knows {}",
            REPRO_PAPERS.join(", ")
        );
    }
    let path = dir.join(format!("{paper}.toml"));
    if !path.is_file() {
        bail!("no scenario {} for paper `{paper}`", path.display());
    }
    Ok(path)
}

/// Runs the plan, prints the summary, and points at the results file when points failed (a failed
/// point is recorded, not fatal, so the sweep goes on).
fn run_and_summarise(options: &RunOptions) -> anyhow::Result<()> {
    let summary = run(options)?;
    print_summary(&summary);
    if summary.failed > 0 {
        eprintln!(
            "{} of {} points failed; their errors are in {}",
            summary.failed,
            summary.records,
            summary.out_dir.join(midway_report::RESULTS_FILE).display()
        );
    }
    Ok(())
}
