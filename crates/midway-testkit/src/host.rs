//! The test host: root and program checks, the workspace, the built `midway` binary and
//! self-removing temp folders.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Whether this process runs as root. /proc/self belongs to the effective user of the process
/// reading it.
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Whether `program` is an executable file in one of PATH's folders.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// The workspace root (scenarios/, examples/, scripts/).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// The release `midway` binary for tests of other packages: `$MIDWAY_BIN`, or
/// `target/release/midway` of the workspace (`cargo build --release -p midway`). Tests of the
/// `midway` package use `env!("CARGO_BIN_EXE_midway")` instead.
pub fn midway_binary() -> PathBuf {
    match std::env::var_os("MIDWAY_BIN") {
        Some(path) => PathBuf::from(path),
        None => repo_root().join("target/release/midway"),
    }
}

/// A fresh folder `midway-NAME-PID` under the system temp dir, removed on drop (also when the
/// test fails). Mode 0755, so programs the lab runs as another user (Squid drops to `proxy`)
/// can enter it.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Makes the folder, removing what an earlier run of the same process id left there.
    pub fn new(name: &str) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("midway-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        TempDir(path)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `command` to its end with stdout and stderr captured; returns its process id (to look
/// for what it left behind, see [`crate::netns::namespaces_of_pid`]) and its output.
pub fn output_and_pid(command: &mut Command) -> (u32, Output) {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    (pid, child.wait_with_output().unwrap())
}

/// Reads a `midway --log-format json` log (the child's piped stderr) until its "listening" line
/// and returns the bound address; panics if none comes within `limit`. The whole log, that line
/// included, keeps flowing into `rest` (drop its receiver to discard it).
pub fn listening_addr(
    stderr: impl Read + Send + 'static,
    rest: mpsc::Sender<String>,
    limit: Duration,
) -> SocketAddr {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if !sent {
                if let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) {
                    if value["fields"]["message"] == "listening" {
                        let addr: SocketAddr =
                            value["fields"]["addr"].as_str().unwrap().parse().unwrap();
                        let _ = tx.send(addr);
                        sent = true;
                    }
                }
            }
            let _ = rest.send(line);
        }
    });
    rx.recv_timeout(limit)
        .expect("midway never logged its listening address")
}

/// A child process stopped when the guard drops, also when the test fails: SIGTERM, up to 10 s
/// to exit, then SIGKILL; always reaped. Derefs to the [`Child`].
#[derive(Debug)]
pub struct StopOnDrop(pub Child);

impl std::ops::Deref for StopOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for StopOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the midway binary at `binary` as `midway --log-format json proxy --config CONFIG` in
/// namespace `netns` and waits (up to `limit`) for its line saying its listeners are bound and
/// its interception installed. Returns the child and every log line, those already read
/// included.
pub fn start_ready_in(
    binary: &str,
    netns: &str,
    config: &Path,
    limit: Duration,
) -> (StopOnDrop, mpsc::Receiver<String>) {
    start_ready_in_with(binary, netns, config, &[], limit)
}

/// [`start_ready_in`] with `extra` arguments after the config (e.g. `--take-over`).
pub fn start_ready_in_with(
    binary: &str,
    netns: &str,
    config: &Path,
    extra: &[&str],
    limit: Duration,
) -> (StopOnDrop, mpsc::Receiver<String>) {
    // Guarded from here on: a test that fails (or a start that never gets ready) stops it.
    let mut child = StopOnDrop(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                netns,
                binary,
                "--log-format",
                "json",
                "proxy",
                "--config",
            ])
            .arg(config)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (log_tx, log_rx) = mpsc::channel();
    listening_addr(child.stderr.take().unwrap(), log_tx, limit);
    // The listener is bound before the rules exist: wait for the line that says both are.
    let mut lines = Vec::new();
    loop {
        let line = log_rx
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("midway never said it was ready: {lines:#?}"));
        let ready = line.contains("interception installed");
        lines.push(line);
        if ready {
            break;
        }
    }
    let (tx, rx) = mpsc::channel();
    for line in lines.into_iter().chain(log_rx.try_iter()) {
        tx.send(line).unwrap();
    }
    // Later lines keep arriving on the original receiver; forward them.
    std::thread::spawn(move || {
        while let Ok(line) = log_rx.recv() {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (child, rx)
}
