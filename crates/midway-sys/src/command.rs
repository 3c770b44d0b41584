//! The one way midway runs a program that has to stay a program (`nft -f`, `ethtool`, HAProxy,
//! iperf3, Squid): to completion, optionally fed a script on standard input, optionally inside a
//! named network namespace, with one error type that names the whole command line and what the
//! program wrote to standard error. Everything the kernel offers through netlink or `/proc/sys`
//! goes through [`crate::netlink`] and [`crate::sysctl`] instead.
//!
//! Inside a namespace, the program is started from a thread that has joined it
//! ([`crate::netns::run_in`]): a child inherits the network namespace of the thread that forks
//! it, so no `ip netns exec` (and no iproute2) is needed, and no code runs between fork and exec.
//! A long-running child (a proxy, a server, a traffic generator) the caller manages itself is
//! started the same way by [`spawn_in_namespace`], with the caller's own `Command` (standard
//! I/O, environment, `process_group`).

use std::ffi::{OsStr, OsString};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

/// A program that could not be run, or ran and failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The program could not be started (not installed, not executable), or its pipes failed.
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        /// The command line, as [`Program::command_line`] writes it.
        command: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The network namespace the program was to run in could not be entered.
    #[error("cannot run `{command}` in network namespace {}: {source}", namespace.display())]
    Namespace {
        /// The command line.
        command: String,
        /// The namespace's handle.
        namespace: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The program ran and exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// How it exited.
        status: ExitStatus,
        /// What it wrote to standard error, trimmed.
        stderr: String,
    },
}

impl CommandError {
    /// What the program wrote to standard error, when it ran and failed.
    pub fn stderr(&self) -> Option<&str> {
        match self {
            CommandError::Failed { stderr, .. } => Some(stderr),
            _ => None,
        }
    }
}

/// A program with its arguments, standard input and namespace; run with [`Program::run`] or
/// [`Program::output`].
#[derive(Debug, Clone)]
pub struct Program {
    program: OsString,
    args: Vec<OsString>,
    stdin: Option<String>,
    namespace: Option<PathBuf>,
}

impl Program {
    /// `program`, found on `PATH` as `std::process::Command` finds it, with no arguments.
    pub fn new(program: impl AsRef<OsStr>) -> Program {
        Program {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            stdin: None,
            namespace: None,
        }
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Program {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Program
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Feeds `text` to the program's standard input (e.g. an `nft -f -` script).
    pub fn stdin(mut self, text: impl Into<String>) -> Program {
        self.stdin = Some(text.into());
        self
    }

    /// Runs the program inside the network namespace whose handle is `path` (as
    /// [`crate::netns::netns_path`] gives it).
    pub fn in_namespace(mut self, path: impl AsRef<Path>) -> Program {
        self.namespace = Some(path.as_ref().to_owned());
        self
    }

    /// Runs the program inside the network namespace named `name` (in `/run/netns`).
    pub fn in_named_namespace(self, name: &str) -> Program {
        self.in_namespace(crate::netns::netns_path(name))
    }

    /// The command line for messages: program and arguments separated by spaces, then the
    /// standard input (lines joined by "; ") after `<<<`, then the namespace.
    pub fn command_line(&self) -> String {
        let mut line = self.program.to_string_lossy().into_owned();
        for arg in &self.args {
            line.push(' ');
            line.push_str(&arg.to_string_lossy());
        }
        if let Some(input) = &self.stdin {
            line.push_str(" <<< ");
            line.push_str(input.trim_end().replace('\n', "; ").as_str());
        }
        if let Some(namespace) = &self.namespace {
            line.push_str(" (in ");
            line.push_str(&namespace.display().to_string());
            line.push(')');
        }
        line
    }

    /// Runs the program to completion; `Ok` if it exited with status 0.
    pub fn run(&self) -> Result<(), CommandError> {
        self.output().map(drop)
    }

    /// Runs the program to completion and returns its standard output if it exited with
    /// status 0.
    pub fn output(&self) -> Result<String, CommandError> {
        match &self.namespace {
            None => self.run_here(),
            Some(path) => {
                let this = self.clone();
                crate::netns::run_in(path, move || this.run_here()).map_err(|source| {
                    CommandError::Namespace {
                        command: self.command_line(),
                        namespace: path.clone(),
                        source,
                    }
                })?
            }
        }
    }

    /// A `std::process::Command` for the program and its arguments, for a long-running child
    /// the caller manages itself (its namespace and standard input are the caller's to set).
    pub fn to_command(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.program);
        command.args(&self.args);
        command
    }

    fn run_here(&self) -> Result<String, CommandError> {
        let spawn_error = |source| CommandError::Spawn {
            command: self.command_line(),
            source,
        };
        let mut child = self
            .to_command()
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        if let (Some(text), Some(mut pipe)) = (&self.stdin, child.stdin.take()) {
            // Dropping the pipe at the end of this block closes it: the program sees the end.
            pipe.write_all(text.as_bytes()).map_err(spawn_error)?;
        }
        let output = child.wait_with_output().map_err(spawn_error)?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(CommandError::Failed {
                command: self.command_line(),
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            })
        }
    }
}

/// Starts `command` inside the network namespace whose handle is `namespace` and returns the
/// running child, for the caller to manage (wait, signal, read its pipes). Everything set on
/// `command` applies as usual: standard I/O, environment, `process_group` (set by `posix_spawn`,
/// not by code after the fork). The child is started from a short-lived thread that joined the
/// namespace, so it inherits it without `ip netns exec`.
///
/// A tokio child is started the same way: `crate::netns::run_in(path, move || { let _runtime =
/// handle.enter(); tokio_command.spawn() })`.
pub fn spawn_in_namespace(namespace: &Path, command: Command) -> Result<Child, CommandError> {
    spawn_in_namespace_with(namespace, command, || Ok(()))
}

/// [`spawn_in_namespace`] with `prepare` run first on the thread that joined the namespace,
/// just before the child is started: what it changes about that thread (e.g. a mount namespace
/// of its own, `unshare(CLONE_NEWNS)`, with a file bind-mounted in it) the child inherits,
/// again with no code between fork and exec. The thread ends with the spawn, so nothing else
/// ever runs on it. An error of `prepare` is a [`CommandError::Spawn`].
pub fn spawn_in_namespace_with(
    namespace: &Path,
    mut command: Command,
    prepare: impl FnOnce() -> io::Result<()> + Send + 'static,
) -> Result<Child, CommandError> {
    let line = describe(&command);
    let spawned = crate::netns::run_in(namespace, move || {
        prepare()?;
        command.spawn()
    });
    match spawned {
        Ok(Ok(child)) => Ok(child),
        Ok(Err(source)) => Err(CommandError::Spawn {
            command: line,
            source,
        }),
        Err(source) => Err(CommandError::Namespace {
            command: line,
            namespace: namespace.to_owned(),
            source,
        }),
    }
}

/// A `Command`'s program and arguments separated by spaces, for messages.
fn describe(command: &Command) -> String {
    let mut line = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_and_stdin_come_back() {
        assert_eq!(Program::new("echo").arg("hi").output().unwrap(), "hi\n");
        let echoed = Program::new("cat").stdin("a\nb\n").output().unwrap();
        assert_eq!(echoed, "a\nb\n");
    }

    #[test]
    fn a_failure_names_the_command_and_its_stderr() {
        let error = Program::new("sh")
            .args(["-c", "echo oops >&2; exit 3"])
            .run()
            .unwrap_err();
        assert_eq!(error.stderr(), Some("oops"));
        let text = error.to_string();
        assert!(text.contains("`sh -c echo oops >&2; exit 3`"), "{text}");
        assert!(text.contains("oops"), "{text}");
    }

    #[test]
    fn a_missing_program_is_a_spawn_error_with_its_name() {
        let error = Program::new("midway-no-such-program").run().unwrap_err();
        assert!(matches!(error, CommandError::Spawn { .. }), "{error}");
        assert!(error.to_string().contains("midway-no-such-program"));
    }

    #[test]
    fn the_command_line_shows_input_and_namespace() {
        let program = Program::new("nft")
            .args(["-f", "-"])
            .stdin("add table inet x\nflush table inet x\n")
            .in_named_namespace("lab-1");
        assert_eq!(
            program.command_line(),
            "nft -f - <<< add table inet x; flush table inet x (in /run/netns/lab-1)"
        );
    }

    #[test]
    fn a_missing_namespace_is_reported() {
        let error = Program::new("true")
            .in_named_namespace("midway-sys-no-such-namespace")
            .run()
            .unwrap_err();
        assert!(matches!(error, CommandError::Namespace { .. }), "{error}");
    }

    #[test]
    fn a_child_spawned_in_a_namespace_keeps_the_callers_stdio() {
        // The process's own namespace: entering it needs root; without root the error names it.
        let mut command = Command::new("echo");
        command.arg("inside").stdout(Stdio::piped());
        match spawn_in_namespace(Path::new("/proc/self/ns/net"), command) {
            Ok(child) => {
                let output = child.wait_with_output().unwrap();
                assert_eq!(String::from_utf8_lossy(&output.stdout), "inside\n");
            }
            Err(error) => assert!(matches!(error, CommandError::Namespace { .. }), "{error}"),
        }
    }

    #[test]
    fn spawning_in_a_missing_namespace_names_the_command() {
        let error = spawn_in_namespace(
            Path::new("/run/netns/midway-sys-no-such-namespace"),
            Command::new("sleep"),
        )
        .unwrap_err();
        assert!(matches!(error, CommandError::Namespace { .. }), "{error}");
        assert!(error.to_string().contains("sleep"), "{error}");
    }
}
