//! The test host: root and program checks, the workspace, the built `midway` binary (started,
//! waited for and stopped through `midway-launch`, as the lab and the benchmark start it) and
//! self-removing temp folders.

#![allow(
    clippy::expect_used,
    reason = "test-only crate: a failed expect fails the calling test"
)]

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub use midway_launch::{Launch, Place, Running};

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

/// How long a test's midway gets to drain after SIGTERM before SIGKILL when it is stopped or
/// dropped (also when the test fails).
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Starts the midway binary at `binary` as `midway --log-format json proxy --config CONFIG
/// EXTRA...` at `place` (this namespace, or a test's namespace as `Place::Netns(name)`). Every
/// line of its log goes to the returned receiver as it comes (drop the receiver to discard
/// them). The returned process is stopped when dropped: SIGTERM, up to 10 s, then SIGKILL.
pub fn spawn_midway(
    binary: impl AsRef<OsStr>,
    place: Place<'_>,
    config: &Path,
    extra: &[&str],
) -> (Running, mpsc::Receiver<String>) {
    let (tx, rx) = mpsc::channel();
    let midway = Launch::midway(binary, config)
        .json_log()
        .args(extra)
        .log_lines(tx)
        .stop_grace(STOP_GRACE)
        .spawn(place)
        .unwrap_or_else(|e| panic!("{}", crate::chain(&e)));
    (midway, rx)
}

/// Waits (up to `limit`) for the "listening" line of a midway from [`spawn_midway`] and returns
/// the bound address; panics with its log if none comes.
pub fn listening_addr(midway: &mut Running, limit: Duration) -> SocketAddr {
    let line = midway
        .wait_for_line(limit, "listening line", |line| {
            serde_json::from_str::<serde_json::Value>(line)
                .is_ok_and(|value| value["fields"]["message"] == "listening")
        })
        .unwrap_or_else(|e| panic!("midway never logged its listening address: {e}"));
    let value: serde_json::Value = serde_json::from_str(&line).unwrap();
    value["fields"]["addr"].as_str().unwrap().parse().unwrap()
}

/// Starts the midway binary at `binary` as `midway --log-format json proxy --config CONFIG` in
/// namespace `netns` and waits (up to `limit`) for its line saying its listeners are bound and
/// its interception installed. Returns the process (stopped when dropped) and every log line,
/// those already read included.
pub fn start_ready_in(
    binary: &str,
    netns: &str,
    config: &Path,
    limit: Duration,
) -> (Running, mpsc::Receiver<String>) {
    start_ready_in_with(binary, netns, config, &[], limit)
}

/// [`start_ready_in`] with `extra` arguments after the config (e.g. `--take-over`).
pub fn start_ready_in_with(
    binary: &str,
    netns: &str,
    config: &Path,
    extra: &[&str],
    limit: Duration,
) -> (Running, mpsc::Receiver<String>) {
    let (mut midway, log) = spawn_midway(binary, Place::Netns(netns), config, extra);
    midway
        .wait_ready(limit)
        .unwrap_or_else(|e| panic!("midway never said it was ready: {e}"));
    (midway, log)
}
