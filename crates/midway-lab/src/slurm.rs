//! `midway lab slurm`: a paper's reproduction as a Slurm job array, for sweeps that outgrow one
//! machine (at 5 repetitions the full reproductions are hours of transfers, and each run wants a
//! quiet kernel).
//!
//! One command does it all, in this order:
//! 1. **Pin** the commit: the checkout must be clean (uncommitted changes are not in a commit, so
//!    no task could run them); a clone of that commit goes to `OUT/source`, and a midway built
//!    from it (or the operator's `--binary`) to `OUT/bin/midway`. The tasks run only these, so
//!    the checkout may move on while the job waits in the queue, and every record names the
//!    pinned commit as "clean" (the lab reads it from `OUT/source`).
//! 2. **Submit** `OUT/slurm/job.sh`: an array of N tasks, task i runs shard i/N of the plan
//!    (`midway lab reproduce --shard i/N --resume`) into `OUT/shards/task-i`. Each task has a
//!    node to itself unless `--share-nodes`.
//! 3. **Wait** for the whole array (`sbatch --wait`).
//! 4. **Merge** the shards' results.jsonl into `OUT/results.jsonl` (every shard must be there) and
//!    build the report, with the paper's claims, in `OUT`.
//!
//! Slurm and MUNGE are the cluster's; this module only writes the job script and calls `sbatch`.
//! The script is made by a pure function ([`job_script`]) so its text is tested without Slurm.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::plan::{self, PlanOptions};
use crate::provenance::SourceTree;
use crate::scenario::LoadedScenario;

/// What `midway lab slurm` was asked to do.
#[derive(Debug, Clone)]
pub(crate) struct SlurmRequest {
    /// The paper to reproduce (a name `midway lab reproduce` knows).
    pub paper: String,
    /// Output folder, on storage every node sees.
    pub out: PathBuf,
    /// Array tasks (shards).
    pub tasks: usize,
    /// The quick form.
    pub quick: bool,
    /// Only these experiments (all if empty).
    pub experiments: Vec<String>,
    /// Only these cases (all if empty).
    pub cases: Vec<String>,
    /// `--jobs` of each task; `None` = one per CPU of its node.
    pub jobs: Option<usize>,
    /// Slurm partition.
    pub partition: Option<String>,
    /// Time limit of each task, Slurm's format.
    pub time_limit: Option<String>,
    /// Let tasks share a node.
    pub share_nodes: bool,
    /// A prebuilt midway instead of building one from the pinned commit.
    pub binary: Option<PathBuf>,
    /// More sbatch arguments.
    pub sbatch_args: Vec<String>,
    /// Submit again into an existing `out`.
    pub resume: bool,
}

/// Sub-folders and files of a Slurm run's `OUT`.
const SOURCE_DIR: &str = "source";
const BINARY: &str = "bin/midway";
const SLURM_DIR: &str = "slurm";
const JOB_SCRIPT: &str = "slurm/job.sh";
const MANIFEST: &str = "slurm/manifest.txt";
const SHARDS_DIR: &str = "shards";

/// What `prepare` pinned for a job: the tasks actually used, the run's folder (absolute: the
/// tasks start in Slurm's working folder), the binary and scenarios inside it, and the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PinnedJob {
    /// Array tasks (at most the plan's points).
    pub tasks: usize,
    /// `OUT`: task i writes `shards/task-i` and logs to `slurm/task-i.log` in it.
    pub out: PathBuf,
    /// The pinned midway binary.
    pub binary: PathBuf,
    /// The pinned scenarios folder (`OUT/source/scenarios/repro`).
    pub scenarios: PathBuf,
    /// The commit the binary and scenarios come from, for the script's header.
    pub commit: String,
}

/// The sbatch script of a job array: one `midway lab reproduce` shard per task, with the
/// request's filters and `--jobs`.
pub(crate) fn job_script(request: &SlurmRequest, job: &PinnedJob) -> String {
    let path = |p: &Path| quote(&p.display().to_string());
    let mut lines = vec![
        "#!/bin/sh".to_string(),
        format!("#SBATCH --job-name=midway-{}", request.paper),
        format!("#SBATCH --array=0-{}", job.tasks.saturating_sub(1)),
        "#SBATCH --nodes=1".to_string(),
        "#SBATCH --ntasks=1".to_string(),
        format!(
            "#SBATCH --output={}",
            job.out.join(SLURM_DIR).join("task-%a.log").display()
        ),
    ];
    if !request.share_nodes {
        // One task per node: runs measured beside another task's emulator would share its
        // kernel and CPUs.
        lines.push("#SBATCH --exclusive".to_string());
    }
    lines.push(format!(
        "# midway lab slurm: {} at commit {}, {} shards",
        request.paper, job.commit, job.tasks
    ));
    lines.push("set -eu".to_string());
    lines.push(r#"task="$SLURM_ARRAY_TASK_ID""#.to_string());
    // Which node ran the task, in its log: where a failed or slow shard ran.
    lines.push(
        r#"echo "midway lab slurm: task $task on node ${SLURMD_NODENAME:-unknown}""#.to_string(),
    );
    let mut command = vec![
        path(&job.binary),
        "lab".into(),
        "reproduce".into(),
        quote(&request.paper),
        "--scenarios".into(),
        path(&job.scenarios),
        "--shard".into(),
        format!(r#""$task/{}""#, job.tasks),
        "--out".into(),
        format!(r#"{}/"task-$task""#, path(&job.out.join(SHARDS_DIR))),
        // A task that Slurm requeues (node failure, preemption) goes on where it stopped.
        "--resume".into(),
    ];
    if request.quick {
        command.push("--quick".into());
    }
    for experiment in &request.experiments {
        command.push("--experiment".into());
        command.push(quote(experiment));
    }
    for case in &request.cases {
        command.push("--case".into());
        command.push(quote(case));
    }
    if let Some(jobs) = request.jobs {
        command.push("--jobs".into());
        command.push(jobs.to_string());
    }
    lines.push(format!("exec {}", command.join(" ")));
    let mut script = lines.join("\n");
    script.push('\n');
    script
}

/// `text` as one POSIX shell word.
fn quote(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b));
    if plain {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// The shards' results after the array ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Merged {
    /// Records written to `OUT/results.jsonl`.
    pub records: usize,
    /// Of those, failed points.
    pub failed: usize,
}

/// Why the shards cannot be merged.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MergeError {
    /// Tasks left no results (they failed before measuring, or never ran).
    #[error(
        "task(s) {tasks} left no results.jsonl; see their logs in {logs} and submit again with \
         --resume"
    )]
    MissingShards {
        /// The task numbers, e.g. "1, 3".
        tasks: String,
        /// The logs folder.
        logs: PathBuf,
    },
    /// A shard's results could not be read or the merged file written.
    #[error("cannot read or write {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A shard's results.jsonl is not the lab's records.
    #[error(transparent)]
    Records(#[from] midway_report::ReportError),
}

/// Concatenates `OUT/shards/task-{0..tasks}/results.jsonl` into `OUT/results.jsonl`, in task
/// order, and copies the scenario and claims beside it, so `OUT` is a results folder like any
/// other run's. Every shard must be there: a report of part of the plan would read as the whole.
pub(crate) fn merge_shards(out: &Path, tasks: usize) -> Result<Merged, MergeError> {
    let shard_dir = |task: usize| out.join(SHARDS_DIR).join(format!("task-{task}"));
    let missing: Vec<String> = (0..tasks)
        .filter(|&task| !shard_dir(task).join(midway_report::RESULTS_FILE).is_file())
        .map(|task| task.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(MergeError::MissingShards {
            tasks: missing.join(", "),
            logs: out.join(SLURM_DIR),
        });
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| MergeError::Io { path, source }
    };
    let mut merged = String::new();
    let mut summary = Merged {
        records: 0,
        failed: 0,
    };
    for task in 0..tasks {
        let path = shard_dir(task).join(midway_report::RESULTS_FILE);
        // Parsed first, so a torn or foreign file stops the merge instead of the report.
        let records = midway_report::read_records(&path)?;
        summary.records += records.len();
        summary.failed += records.iter().filter(|r| !r.ok).count();
        let text = fs::read_to_string(&path).map_err(io(&path))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            merged.push_str(line);
            merged.push('\n');
        }
    }
    let results = out.join(midway_report::RESULTS_FILE);
    let partial = out.join(format!("{}.partial", midway_report::RESULTS_FILE));
    fs::write(&partial, merged).map_err(io(&partial))?;
    fs::rename(&partial, &results).map_err(io(&results))?;
    for name in ["scenario.toml", midway_report::claims::CLAIMS_FILE] {
        let from = shard_dir(0).join(name);
        if from.is_file() {
            let to = out.join(name);
            fs::copy(&from, &to).map_err(io(&to))?;
        }
    }
    Ok(summary)
}

/// Pins, submits, waits, merges and reports (see the module's documentation).
pub(crate) fn run(request: &SlurmRequest) -> anyhow::Result<()> {
    if request.tasks == 0 {
        bail!("--tasks must be at least 1");
    }
    let out = absolute(&request.out)?;
    let script = out.join(JOB_SCRIPT);
    let tasks = if request.resume {
        if !script.is_file() {
            bail!(
                "--resume: {} is not a `midway lab slurm` folder (no {JOB_SCRIPT})",
                out.display()
            );
        }
        let text = fs::read_to_string(&script)?;
        let job_name = format!("#SBATCH --job-name=midway-{}", request.paper);
        if !text.lines().any(|line| line == job_name) {
            bail!(
                "--resume: {} is not a job for paper `{}`",
                script.display(),
                request.paper
            );
        }
        let tasks = tasks_of_script(&text)
            .with_context(|| format!("{}: no --array line", script.display()))?;
        println!("resuming {}: {tasks} tasks", out.display());
        tasks
    } else {
        prepare(request, &out)?
    };
    let mut sbatch = Command::new("sbatch");
    sbatch.arg("--parsable").arg("--wait");
    if let Some(partition) = &request.partition {
        sbatch.arg(format!("--partition={partition}"));
    }
    if let Some(limit) = &request.time_limit {
        sbatch.arg(format!("--time={limit}"));
    }
    sbatch.args(&request.sbatch_args).arg(&script);
    sbatch.current_dir(&out);
    println!(
        "submitting {tasks} tasks (sbatch {}); waiting for all of them",
        script.display()
    );
    // With --parsable, sbatch prints the job id as soon as the array is queued, then waits.
    let mut child = sbatch
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot run sbatch (is Slurm's client installed, and SLURM_CONF set?)")?;
    if let Some(stdout) = child.stdout.take() {
        use std::io::{BufRead, Read};
        let mut stdout = std::io::BufReader::new(stdout);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if !line.trim().is_empty() {
            println!("job array {} queued", line.trim());
        }
        // Read to the end (sbatch's exit) so it never writes into a closed pipe.
        let mut rest = String::new();
        stdout.read_to_string(&mut rest)?;
        print!("{rest}");
    }
    let status = child.wait().context("sbatch")?;
    if !status.success() {
        eprintln!(
            "sbatch reports a failed task ({status}); task logs: {}",
            out.join(SLURM_DIR).display()
        );
    }
    let merged = merge_shards(&out, tasks)?;
    println!(
        "merged {} records ({} failed points) from {tasks} shards into {}",
        merged.records,
        merged.failed,
        out.join(midway_report::RESULTS_FILE).display()
    );
    let summary = midway_report::write_report(&out, &midway_report::ReportOptions::default())?;
    for warning in &summary.warnings {
        eprintln!("report warning: {warning}");
    }
    println!("report: {}", summary.report_path.display());
    if !status.success() {
        bail!("a task of the job array failed; the report holds what the shards measured");
    }
    Ok(())
}

/// The number of tasks a job script was written for (its `--array=0-LAST` line).
fn tasks_of_script(script: &str) -> Option<usize> {
    script
        .lines()
        .find_map(|l| l.strip_prefix("#SBATCH --array=0-"))
        .and_then(|last| last.trim().parse::<usize>().ok())
        .map(|last| last + 1)
}

/// Pins the commit in `out` and writes the job script; returns the number of tasks (at most the
/// number of points).
fn prepare(request: &SlurmRequest, out: &Path) -> anyhow::Result<usize> {
    if out.exists() && fs::read_dir(out)?.next().is_some() {
        bail!(
            "{} exists and is not empty: choose a new --out, or pass --resume to submit its \
             job again",
            out.display()
        );
    }
    let repro = absolute(&crate::cli::repro_dir()?)?;
    crate::cli::repro_scenario(&repro, &request.paper)?;
    let tree = SourceTree::of(&repro);
    let Some(state) = tree.state.as_deref() else {
        bail!(
            "{} is not in a git checkout: the job array runs a commit, so it needs one",
            repro.display()
        );
    };
    if tree.is_dirty() {
        bail!(
            "the checkout {} has uncommitted changes ({state}); the job array runs a commit, \
             which would not have them: commit first",
            tree.commit
        );
    }
    let toplevel = git_line(&repro, &["rev-parse", "--show-toplevel"])?;
    let commit = git_line(&repro, &["rev-parse", "HEAD"])?;
    let relative = repro
        .strip_prefix(&toplevel)
        .with_context(|| format!("{} is not inside {toplevel}", repro.display()))?
        .to_path_buf();
    fs::create_dir_all(out.join(SLURM_DIR))
        .with_context(|| format!("cannot create {}", out.display()))?;
    let source = out.join(SOURCE_DIR);
    println!("pinning commit {commit} in {}", source.display());
    run_checked(
        Command::new("git")
            .args(["clone", "--quiet", "--no-checkout", &toplevel])
            .arg(&source),
    )?;
    run_checked(
        Command::new("git")
            .current_dir(&source)
            .args(["checkout", "--quiet", "--detach", &commit]),
    )?;
    let scenarios = source.join(&relative);
    let loaded = LoadedScenario::load(&scenarios.join(format!("{}.toml", request.paper)))?;
    let points = plan::build_plan(
        &loaded,
        &PlanOptions {
            quick: request.quick,
            experiments: request.experiments.clone(),
            cases: request.cases.clone(),
            ..PlanOptions::default()
        },
    )?
    .len();
    if points == 0 {
        bail!("nothing to run: the plan (after --experiment and --case) is empty");
    }
    let tasks = request.tasks.min(points);
    if tasks < request.tasks {
        println!(
            "the plan has {points} points: {tasks} tasks, not {}",
            request.tasks
        );
    }
    let binary = out.join(BINARY);
    if let Some(folder) = binary.parent() {
        fs::create_dir_all(folder)?;
    }
    let binary_origin = match &request.binary {
        Some(given) => {
            fs::copy(given, &binary).with_context(|| format!("cannot copy {}", given.display()))?;
            format!(
                "given with --binary ({}); the operator vouches it was built from the commit",
                given.display()
            )
        }
        None => {
            println!("building midway from the pinned commit (cargo build --release --locked)");
            // The clone's own target folder, named explicitly: a CARGO_TARGET_DIR or a cargo
            // config of the operator's would otherwise put the binary somewhere else.
            let target = source.join("target");
            run_checked(
                Command::new("cargo")
                    .current_dir(&source)
                    .args([
                        "build",
                        "--release",
                        "--locked",
                        "-p",
                        "midway",
                        "--target-dir",
                    ])
                    .arg(&target),
            )?;
            fs::copy(target.join("release/midway"), &binary)?;
            "built from the pinned commit (cargo build --release --locked -p midway)".to_string()
        }
    };
    let job = PinnedJob {
        tasks,
        out: out.to_path_buf(),
        binary,
        scenarios,
        commit: commit.clone(),
    };
    fs::write(out.join(JOB_SCRIPT), job_script(request, &job))?;
    fs::write(
        out.join(MANIFEST),
        format!(
            "paper: {}\ncommit: {commit}\ntasks: {tasks} ({points} points)\nnodes: {}\nbinary: \
             {binary_origin}\n",
            request.paper,
            if request.share_nodes {
                "tasks may share a node (--share-nodes)"
            } else {
                "one task per node (--exclusive)"
            }
        ),
    )?;
    Ok(tasks)
}

/// `path` made absolute against the current folder (the tasks start elsewhere).
fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    Ok(if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()?.join(path)
    })
}

/// The trimmed output of `git ARGS` in `dir` (the provenance module's git), or why not.
fn git_line(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    crate::provenance::git(dir, args)
        .map(|out| String::from_utf8_lossy(&out).trim().to_string())
        .filter(|line| !line.is_empty())
        .with_context(|| format!("git {} failed in {}", args.join(" "), dir.display()))
}

/// Runs `command`, failing with its name and status if it fails.
fn run_checked(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("cannot run {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> SlurmRequest {
        SlurmRequest {
            paper: "umts".into(),
            out: "/srv/my run".into(),
            tasks: 4,
            quick: true,
            experiments: vec!["fig5-bulk".into()],
            cases: vec![],
            jobs: Some(1),
            partition: None,
            time_limit: None,
            share_nodes: false,
            binary: None,
            sbatch_args: vec![],
            resume: false,
        }
    }

    fn job() -> PinnedJob {
        PinnedJob {
            tasks: 3,
            out: "/srv/my run".into(),
            binary: "/srv/my run/bin/midway".into(),
            scenarios: "/srv/my run/source/scenarios/repro".into(),
            commit: "abc123".into(),
        }
    }

    #[test]
    fn the_job_script_runs_one_pinned_shard_per_task_alone_on_its_node() {
        let script = job_script(&request(), &job());
        assert!(script.starts_with("#!/bin/sh\n"), "{script}");
        assert!(script.contains("#SBATCH --array=0-2\n"), "{script}");
        assert!(script.contains("#SBATCH --exclusive\n"), "{script}");
        assert!(
            script.contains("#SBATCH --output=/srv/my run/slurm/task-%a.log\n"),
            "{script}"
        );
        assert!(
            script.contains(
                "echo \"midway lab slurm: task $task on node ${SLURMD_NODENAME:-unknown}\"\n"
            ),
            "{script}"
        );
        assert!(
            script.contains(
                "exec '/srv/my run/bin/midway' lab reproduce umts --scenarios \
                 '/srv/my run/source/scenarios/repro' --shard \"$task/3\" --out \
                 '/srv/my run/shards'/\"task-$task\" --resume --quick --experiment fig5-bulk \
                 --jobs 1\n"
            ),
            "{script}"
        );
        assert_eq!(tasks_of_script(&script), Some(3));
        let shared = job_script(
            &SlurmRequest {
                share_nodes: true,
                ..request()
            },
            &job(),
        );
        assert!(!shared.contains("--exclusive"), "{shared}");
    }

    #[test]
    fn shell_words_are_quoted_when_needed() {
        assert_eq!(quote("fig5-bulk"), "fig5-bulk");
        assert_eq!(quote("/a b/c"), "'/a b/c'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("$HOME"), "'$HOME'");
    }

    fn record_line(case: &str, ok: bool) -> String {
        serde_json::json!({
            "scenario": "s", "scenario_file": "s.toml", "commit": "abc123",
            "experiment": "e", "case": case, "sweep_param": null, "params": {},
            "repetition": 0, "seed": 1, "bytes": 10, "seconds": 1.0,
            "throughput_bps": 80.0, "retransmits": {}, "extra": {}, "ok": ok,
            "error": null, "started_at": "2026-11-25T00:00:00Z"
        })
        .to_string()
    }

    #[test]
    fn shards_merge_in_task_order_and_a_missing_one_stops_the_merge() {
        let out = tempfile::tempdir().unwrap();
        for (task, lines) in [(0, vec![record_line("a", true)]), (1, vec![])] {
            let dir = out.path().join(format!("shards/task-{task}"));
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join("results.jsonl"), lines.join("\n")).unwrap();
        }
        let error = merge_shards(out.path(), 3).unwrap_err().to_string();
        assert!(error.contains("task(s) 2 left no results.jsonl"), "{error}");
        assert!(!out.path().join("results.jsonl").exists());

        let dir = out.path().join("shards/task-2");
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("results.jsonl"),
            format!("{}\n{}\n", record_line("b", true), record_line("c", false)),
        )
        .unwrap();
        fs::write(
            out.path().join("shards/task-0/claims.toml"),
            "paper = \"x\"\n",
        )
        .unwrap();
        let merged = merge_shards(out.path(), 3).unwrap();
        assert_eq!(
            merged,
            Merged {
                records: 3,
                failed: 1
            }
        );
        let cases: Vec<String> = midway_report::read_records(&out.path().join("results.jsonl"))
            .unwrap()
            .into_iter()
            .map(|r| r.case)
            .collect();
        assert_eq!(cases, ["a", "b", "c"]);
        assert!(out.path().join("claims.toml").is_file());
    }
}
