// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! CI: `midway lab slurm` on a real two-node Slurm cluster on this one host (munged, slurmctld
//! and two slurmds from Debian's packages, Slurm's "multiple slurmd": each node a slurmd of its
//! own on its own port, started here with a configuration of the test's own, on free local
//! ports, and stopped after, pass or fail). The quick form of the umts bulk experiment runs as a
//! 2-task job array from a clean clone of this checkout's commit, one task per node at the same
//! time; the task logs must name two different nodes, the merged results must hold every point
//! once, measured by both tasks, each record naming the pinned commit as clean, and the report
//! must be built from them with the paper's claims. The job builds its midway from the
//! pinned clone, as an operator's does; `MIDWAY_SLURM_TEST_PREBUILT=1` hands it this test's
//! binary instead (`--binary`), which skips the build.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use midway_testkit::host::{is_root, on_path, repo_root, TempDir};
use midway_testkit::wait::{poll_until, wait_exit};

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
/// The nodes' names in the test cluster's configuration, one slurmd each (told which with
/// `-N`); both are this host.
const NODES: [&str; 2] = ["midway-lab-a", "midway-lab-b"];
/// The whole job: 6 quick points of about 5 s, two tasks at the same time (one per node, each
/// wants its node to itself), plus sbatch's polling.
const JOB_LIMIT: Duration = Duration::from_secs(600);
/// With this variable set to 1 the test hands the job the midway it was built with
/// (`--binary`) instead of letting `midway lab slurm` build one from the pinned clone, the path
/// an operator takes (a release build of the workspace from scratch: about 6.5 minutes on 2
/// cores). scripts/test sets it, to keep CI within its time; unset, the test builds.
const PREBUILT: &str = "MIDWAY_SLURM_TEST_PREBUILT";
/// The time a release build from scratch may add to the job.
const BUILD_LIMIT: Duration = Duration::from_secs(1800);

/// A Slurm cluster of [`NODES`] on this host living in one folder; stops its daemons when
/// dropped.
struct Cluster {
    dir: PathBuf,
    conf: PathBuf,
}

impl Cluster {
    fn start(dir: &Path) -> Cluster {
        use std::os::unix::fs::PermissionsExt;
        let munge = dir.join("munge");
        std::fs::create_dir_all(&munge).unwrap();
        // munged wants its key private; the socket's folder must be enterable by all.
        std::fs::set_permissions(&munge, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut key = [0u8; 128];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut key)
            .unwrap();
        let key_file = munge.join("munge.key");
        std::fs::write(&key_file, key).unwrap();
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o400)).unwrap();
        let socket = munge.join("munge.sock");
        let conf = dir.join("slurm.conf");
        let cluster = Cluster {
            dir: dir.to_path_buf(),
            conf: conf.clone(),
        };
        // From here on, a failure stops whatever has started.
        run(Command::new("munged")
            .arg("--force")
            .arg(format!("--key-file={}", key_file.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", munge.join("munged.pid").display()))
            .arg(format!("--log-file={}", munge.join("munged.log").display()))
            .arg(format!("--seed-file={}", munge.join("seed").display())));
        std::fs::create_dir_all(dir.join("state")).unwrap();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let [controller_port, ports @ ..] = free_ports::<{ NODES.len() + 1 }>();
        // slurmctld runs only where the configuration names this host as the controller.
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        let host = host.trim().split('.').next().unwrap().to_string();
        let d = dir.display();
        // Both nodes are this host: each slurmd has its own port, and its own spool folder, pid
        // file and log (`%n`: the node's name).
        let nodes: String = NODES
            .iter()
            .zip(ports)
            .map(|(node, port)| {
                format!(
                    "NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} \
                     CPUs={cpus} State=UNKNOWN\n"
                )
            })
            .collect();
        std::fs::write(
            &conf,
            format!(
                "ClusterName=midwaytest\n\
                 SlurmctldHost={host}(127.0.0.1)\n\
                 SlurmctldPort={controller_port}\n\
                 SlurmUser=root\n\
                 SlurmdUser=root\n\
                 AuthType=auth/munge\n\
                 AuthInfo=socket={}\n\
                 CredType=cred/munge\n\
                 StateSaveLocation={d}/state\n\
                 SlurmdSpoolDir={d}/spool-%n\n\
                 SlurmctldPidFile={d}/slurmctld.pid\n\
                 SlurmdPidFile={d}/slurmd-%n.pid\n\
                 SlurmctldLogFile={d}/slurmctld.log\n\
                 SlurmdLogFile={d}/slurmd-%n.log\n\
                 ProctrackType=proctrack/linuxproc\n\
                 TaskPlugin=task/none\n\
                 JobAcctGatherType=jobacct_gather/none\n\
                 AccountingStorageType=accounting_storage/none\n\
                 SelectType=select/cons_tres\n\
                 SelectTypeParameters=CR_Core\n\
                 SwitchType=switch/none\n\
                 MpiDefault=none\n\
                 ReturnToService=2\n\
                 PlugStackConfig=/dev/null\n\
                 {nodes}\
                 PartitionName=lab Nodes={} Default=YES MaxTime=INFINITE State=UP\n",
                socket.display(),
                NODES.join(","),
            ),
        )
        .unwrap();
        run(Command::new("slurmctld").arg("-f").arg(&conf).arg("-i"));
        for node in NODES {
            run(Command::new("slurmd")
                .arg("-f")
                .arg(&conf)
                .args(["-N", node]));
        }
        let mut expected: Vec<String> = NODES.iter().map(|n| format!("{n} idle")).collect();
        expected.sort();
        let idle = poll_until(Duration::from_secs(30), || {
            let out = cluster
                .command("sinfo")
                .args(["-h", "-N", "-o", "%N %T"])
                .output()
                .unwrap();
            let mut states: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| l.trim().to_string())
                .collect();
            states.sort();
            states == expected
        });
        assert!(idle, "the nodes never became idle:\n{}", cluster.logs());
        cluster
    }

    /// A Slurm client command talking to this cluster.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env("SLURM_CONF", &self.conf);
        command
    }

    fn logs(&self) -> String {
        std::iter::once("slurmctld.log".to_string())
            .chain(NODES.iter().map(|node| format!("slurmd-{node}.log")))
            .map(|name| {
                let text = std::fs::read_to_string(self.dir.join(&name)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                format!(
                    "--- {name}:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Cluster {
    /// The daemons' process ids, from their pid files.
    fn pids(&self) -> Vec<(String, i32)> {
        std::iter::once("slurmctld".to_string())
            .chain(NODES.iter().map(|node| format!("slurmd-{node}")))
            .map(|name| (name.clone(), format!("{name}.pid")))
            .chain(std::iter::once((
                "munged".to_string(),
                "munge/munged.pid".to_string(),
            )))
            .filter_map(|(name, file)| {
                let text = std::fs::read_to_string(self.dir.join(file)).ok()?;
                Some((name, text.trim().parse().ok()?))
            })
            .collect()
    }
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let pids = self.pids();
        let _ = self
            .command("scancel")
            .args(["--full", "--user=root"])
            .status();
        // slurmctld and the slurmds stop on `scontrol shutdown`, munged on SIGTERM; whatever has not
        // stopped 20 s later is killed.
        let _ = self.command("scontrol").arg("shutdown").status();
        for (name, pid) in pids {
            if name == "munged" {
                let _ = Command::new("kill").arg(pid.to_string()).status();
            }
            if !poll_until(Duration::from_secs(20), || !alive(pid)) {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
    }
}

/// `N` distinct free TCP ports on this host for the daemons (found by binding port 0, all held
/// until each is found, then released).
fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: [TcpListener; N] =
        std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").unwrap());
    listeners.map(|l| l.local_addr().unwrap().port())
}

fn run(command: &mut Command) {
    let status = command.stdin(Stdio::null()).status().unwrap();
    assert!(status.success(), "{command:?}: {status}");
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_quick_reproduction_runs_as_a_slurm_job_array_from_a_pinned_commit() {
    if !is_root() {
        eprintln!("skipped: needs root (the Slurm daemons and the lab's namespaces)");
        return;
    }
    for program in [
        "munged",
        "slurmctld",
        "slurmd",
        "sbatch",
        "sinfo",
        "scontrol",
    ] {
        assert!(
            on_path(program),
            "{program} is not installed: run scripts/install-deps"
        );
    }
    let dir = TempDir::new("slurm");
    // The commit under test, cloned clean: uncommitted edits of a developer's checkout are not
    // in it, as they would not be in a cluster's job.
    let checkout = dir.path().join("checkout");
    git(
        &repo_root(),
        &["clone", "--quiet", ".", checkout.to_str().unwrap()],
    );
    let head = git(&checkout, &["rev-parse", "--short", "HEAD"]);
    let cluster = Cluster::start(&dir.path().join("cluster"));

    let out = dir.path().join("run");
    let build_from_clone = !std::env::var(PREBUILT).is_ok_and(|v| v == "1");
    let mut midway = cluster.command(MIDWAY);
    midway
        .args([
            "lab",
            "slurm",
            "umts",
            "--quick",
            "--experiment",
            "fig5-bulk",
        ])
        .args(["--tasks", "2", "--jobs", "1"]);
    if !build_from_clone {
        midway.args(["--binary", MIDWAY]);
    }
    midway
        .arg("--out")
        .arg(&out)
        .env("MIDWAY_REPRO_DIR", checkout.join("scenarios/repro"))
        .current_dir(dir.path())
        .stdin(Stdio::null());
    let limit = if build_from_clone {
        JOB_LIMIT + BUILD_LIMIT
    } else {
        JOB_LIMIT
    };
    let mut child = midway.spawn().unwrap();
    let status = wait_exit(&mut child, limit, "midway lab slurm did not finish");
    let task_logs: String = (0..2)
        .map(|t| {
            std::fs::read_to_string(out.join(format!("slurm/task-{t}.log"))).unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("\n---\n");
    assert!(
        status.success(),
        "midway lab slurm: {status}\ntask logs:\n{task_logs}\n{}",
        cluster.logs()
    );
    // One task per node: each task's log names the node that ran it (the job script's echo
    // before the exec), and the two are the cluster's two nodes.
    let ran_on: Vec<String> = (0..2)
        .map(|t| {
            let log = std::fs::read_to_string(out.join(format!("slurm/task-{t}.log"))).unwrap();
            let prefix = format!("midway lab slurm: task {t} on node ");
            log.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("task {t}'s log names no node:\n{log}"))
                .trim()
                .to_string()
        })
        .collect();
    for node in &ran_on {
        assert!(NODES.contains(&node.as_str()), "{ran_on:?} vs {NODES:?}");
    }
    assert_ne!(ran_on[0], ran_on[1], "both tasks ran on one node");

    let records = midway_report::read_records(&out.join(midway_report::RESULTS_FILE)).unwrap();
    // 3 loss rates x 2 cases, one repetition each, every point exactly once.
    assert_eq!(records.len(), 6, "{records:#?}");
    let mut keys: Vec<String> = records
        .iter()
        .map(|r| format!("{} {}", r.case, r.params[r.sweep_param.as_deref().unwrap()]))
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 6, "{keys:?}");
    for record in &records {
        assert!(record.ok, "{record:#?}");
        assert!(
            record.commit.starts_with(&head),
            "{} vs {head}",
            record.commit
        );
        assert_eq!(record.tree.as_deref(), Some("clean"), "{record:#?}");
    }
    // Both tasks measured their shard.
    for task in 0..2 {
        let shard = midway_report::read_records(&out.join(format!(
            "shards/task-{task}/{}",
            midway_report::RESULTS_FILE
        )))
        .unwrap();
        assert_eq!(shard.len(), 3, "task {task}: {shard:#?}");
    }
    let manifest = std::fs::read_to_string(out.join("slurm/manifest.txt")).unwrap();
    assert!(manifest.contains("one task per node"), "{manifest}");
    let origin = if build_from_clone {
        "built from the pinned commit"
    } else {
        "given with --binary"
    };
    assert!(manifest.contains(origin), "{manifest}");
    let report = std::fs::read_to_string(out.join(midway_report::REPORT_FILE)).unwrap();
    assert!(report.contains("fig5-bulk"), "{report}");
    assert!(
        report.contains(midway_report::claims::VERDICTS_LINE),
        "{report}"
    );
    assert!(
        report.contains(&head) && report.contains("clean"),
        "{report}"
    );

    // Submitting the same job again (what an operator does after a failed task) measures only
    // what is missing, here nothing: the merged results stay the same 6 records.
    let mut again = cluster.command(MIDWAY);
    again
        .args(["lab", "slurm", "umts", "--resume", "--out"])
        .arg(&out)
        .current_dir(dir.path())
        .stdin(Stdio::null());
    let mut child = again.spawn().unwrap();
    let status = wait_exit(
        &mut child,
        JOB_LIMIT,
        "midway lab slurm --resume did not finish",
    );
    assert!(status.success(), "midway lab slurm --resume: {status}");
    let resumed = midway_report::read_records(&out.join(midway_report::RESULTS_FILE)).unwrap();
    assert_eq!(resumed.len(), 6, "{resumed:#?}");

    let pids = cluster.pids();
    assert_eq!(pids.len(), NODES.len() + 2, "{pids:?}");
    drop(cluster);
    for (name, pid) in pids {
        assert!(
            !alive(pid),
            "{name} ({pid}) still runs after the cluster stopped"
        );
    }
}
