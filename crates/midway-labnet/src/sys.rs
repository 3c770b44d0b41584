//! Thin system helpers: running `ip`/`ethtool`, entering a namespace on a thread, deleting a
//! namespace in-process (safe from a signal-handling thread), finding processes in a namespace.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::LabNetError;

pub(crate) use midway_sys::netns::{netns_path, NETNS_DIR};

/// Runs a command to completion; a non-zero exit becomes `CommandFailed` with its stderr.
pub(crate) fn run(mut cmd: Command, stdin: Option<&str>) -> Result<(), LabNetError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let described = describe(&cmd);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().map_err(|source| LabNetError::Spawn {
        program: program.clone(),
        source,
    })?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().ok_or_else(|| LabNetError::Spawn {
            program: program.clone(),
            source: std::io::Error::other("its stdin is not a pipe"),
        })?;
        pipe.write_all(input.as_bytes())
            .map_err(|source| LabNetError::Spawn {
                program: program.clone(),
                source,
            })?;
    }
    let out = child
        .wait_with_output()
        .map_err(|source| LabNetError::Spawn { program, source })?;
    if out.status.success() {
        Ok(())
    } else {
        let mut command = described;
        if let Some(input) = stdin {
            command.push_str(" <<< ");
            command.push_str(&input.replace('\n', "; "));
        }
        Err(LabNetError::CommandFailed {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// `ip [-n NETNS] -batch -` fed with `lines` (one command per line, without the leading `ip`).
pub(crate) fn ip_batch(netns: Option<&str>, lines: &[String]) -> Result<(), LabNetError> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    cmd.args(["-batch", "-"]);
    let mut input = lines.join("\n");
    input.push('\n');
    run(cmd, Some(&input))
}

/// Turns off every offload that would let one "packet" be many frames (GSO/TSO/GRO) or leave
/// checksums to hardware that does not exist (veth needs `tx off`), so the emulator handles one
/// real frame per packet.
pub(crate) fn offloads_off(netns: &str, iface: &str) -> Result<(), LabNetError> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns, "ethtool", "-K", iface]);
    cmd.args([
        "gso", "off", "tso", "off", "gro", "off", "tx", "off", "rx", "off", "sg", "off",
    ]);
    run(cmd, None)
}

/// Runs `f` on a new thread that has joined network namespace `path`; returns its result. A
/// panic in `f` is carried to the caller.
pub(crate) fn in_netns<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, LabNetError> {
    midway_sys::netns::run_in(path, f).map_err(|source| LabNetError::EnterNamespace {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a sysctl of the calling thread's network namespace (`/proc/sys/net/...` follows the
/// namespace of the thread that opens it).
pub(crate) fn write_sysctl(key: &str, value: &str) -> Result<(), LabNetError> {
    let path = sysctl_path(key);
    fs::write(&path, value).map_err(|e| LabNetError::io("cannot write sysctl", path, e))
}

pub(crate) fn read_sysctl(key: &str) -> Result<String, LabNetError> {
    let path = sysctl_path(key);
    fs::read_to_string(&path)
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .map_err(|e| LabNetError::io("cannot read sysctl", path, e))
}

fn sysctl_path(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key.replace('.', "/"))
}
