//! `midway-launch`: starting a proxy process, waiting (bounded) until it is ready, signalling it
//! and stopping it, written once for the lab, the benchmark, the fault campaign and the tests.
//!
//! The lab and the benchmark measure the real `midway` binary, never a library call, and the
//! tests check that binary too; each used to start it, wait for it and stop it in its own way.
//! Here a [`Launch`] describes the command (the `midway proxy --config FILE` form, or any other
//! proxy such as HAProxy and Squid, which the lab and the benchmark run through the same steps)
//! and where its output goes; [`Launch::spawn`] starts it at a [`Place`] (this namespace, a named
//! network namespace, or a host of a `midway-labnet` topology); the [`Running`] process answers
//! bounded waits (a log line, or any readiness probe), takes signals (SIGHUP reloads midway; a
//! second process started with [`Launch::take_over`] is a binary upgrade) and is stopped with
//! SIGTERM, then SIGKILL after its grace period, when asked or when dropped.
//!
//! It sits beside `midway-labnet` (whose hosts it starts processes in) and below the lab, the
//! benchmark and the test kit; it knows nothing of configs or measurements.

mod error;
mod log;
pub mod metrics;
mod running;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::Sender;
use std::time::Duration;

use midway_labnet::{SpawnOptions, Topology};
use midway_sys::command::spawn_in_namespace;

pub use error::LaunchError;
pub use running::Running;

use log::{Log, LogTo};
use running::Process;

/// The line midway logs once its listeners are bound and its interception installed.
pub const READY_LINE: &str = "interception installed";
/// The line a midway started with `--take-over` logs once the previous one stopped accepting.
pub const TOOK_OVER_LINE: &str = "took over";

/// How long a process gets between SIGTERM and SIGKILL unless [`Launch::stop_grace`] says.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// Where a launched process runs.
#[derive(Debug, Clone, Copy)]
pub enum Place<'a> {
    /// In this process's network namespace.
    Here,
    /// In the named network namespace (`/run/netns/NAME`): started from a thread that joined it
    /// ([`midway_sys::command::spawn_in_namespace`]).
    Netns(&'a str),
    /// In a host of a lab topology: in its own process group, stopped by the topology's signal
    /// cleanup too, with the [`Launch::spawn_options`] (e.g. a hosts file).
    Host {
        /// The topology.
        topology: &'a Topology,
        /// The host's name in it.
        host: &'a str,
    },
}

/// A process to start: its command line, environment, niceness and log.
#[derive(Debug)]
pub struct Launch {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    nice: Option<i32>,
    /// Soft and hard `RLIMIT_NOFILE`; `None` for the hard: the spawner's.
    fd_limit: Option<(u64, Option<u64>)>,
    log: LogTo,
    grace: Duration,
    spawn_options: SpawnOptions,
}

impl Launch {
    /// `program` with no arguments yet (HAProxy, Squid: the lab's and the benchmark's other
    /// proxies). Its stderr is piped and kept for the waits until [`Launch::log_file`] or
    /// [`Launch::log_lines`] says otherwise.
    pub fn program(program: impl AsRef<OsStr>) -> Launch {
        Launch {
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            nice: None,
            fd_limit: None,
            log: LogTo::Pipe(None),
            grace: DEFAULT_GRACE,
            spawn_options: SpawnOptions::default(),
        }
    }

    /// The midway binary at `binary` as `BINARY proxy --config CONFIG`.
    pub fn midway(binary: impl AsRef<OsStr>, config: &Path) -> Launch {
        Launch::program(binary)
            .args(["proxy", "--config"])
            .arg(config)
    }

    /// Logs in JSON (`--log-format json` before the subcommand), the form the tests parse.
    /// For [`Launch::midway`] only.
    pub fn json_log(mut self) -> Launch {
        self.args
            .splice(0..0, ["--log-format", "json"].map(OsString::from));
        self
    }

    /// Starts as a binary upgrade of the midway already running on the same config
    /// (`--take-over`); wait for it with [`Running::wait_took_over`].
    pub fn take_over(self) -> Launch {
        self.arg("--take-over")
    }

    /// Adds one argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Launch {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Launch
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets an environment variable of the process (e.g. `MIDWAY_LOG`).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Launch {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Starts it through `nice -n NICE`, which execs it: its pid stays the one [`Running::id`]
    /// gives, and every thread it starts inherits the priority.
    pub fn nice(mut self, nice: i32) -> Launch {
        self.nice = Some(nice);
        self
    }

    /// Limits its open descriptors (soft and hard `RLIMIT_NOFILE`), e.g. to make it run out.
    pub fn fd_limit(mut self, limit: u64) -> Launch {
        self.fd_limit = Some((limit, Some(limit)));
        self
    }

    /// Lowers its soft `RLIMIT_NOFILE` only: the hard limit stays the spawner's, so it may
    /// raise it back.
    pub fn fd_soft_limit(mut self, limit: u64) -> Launch {
        self.fd_limit = Some((limit, None));
        self
    }

    /// Sends stdout and stderr to `path` (created or truncated), where the waits read them.
    pub fn log_file(mut self, path: impl Into<PathBuf>) -> Launch {
        self.log = LogTo::File(path.into());
        self
    }

    /// Pipes stderr (stdout is discarded) and sends every line of it to `lines` as it comes,
    /// those the waits look at included.
    pub fn log_lines(mut self, lines: Sender<String>) -> Launch {
        self.log = LogTo::Pipe(Some(lines));
        self
    }

    /// How long [`Running::stop`] (and dropping the [`Running`]) waits after SIGTERM before
    /// SIGKILL.
    pub fn stop_grace(mut self, grace: Duration) -> Launch {
        self.grace = grace;
        self
    }

    /// Options of a start in a lab host ([`Place::Host`]); ignored elsewhere.
    pub fn spawn_options(mut self, options: SpawnOptions) -> Launch {
        self.spawn_options = options;
        self
    }

    /// The program's name as errors and logs show it.
    fn program_name(&self) -> String {
        Path::new(&self.program)
            .file_name()
            .unwrap_or(&self.program)
            .to_string_lossy()
            .into_owned()
    }

    /// The command line, without the place: `[nice -n N] PROGRAM ARGS`, its environment and
    /// stdin closed.
    fn command(&self) -> Command {
        let mut words: Vec<OsString> = Vec::new();
        if let Some(nice) = self.nice {
            words.extend(["nice".into(), "-n".into(), nice.to_string().into()]);
        }
        words.push(self.program.clone());
        let mut command = Command::new(&words[0]);
        command
            .args(&words[1..])
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        if let Some((soft, hard)) = self.fd_limit {
            use nix::sys::resource::{getrlimit, setrlimit, Resource};
            use std::os::unix::process::CommandExt;
            // SAFETY: getrlimit(2) and setrlimit(2) are async-signal-safe and allocate nothing. A limit is the
            // process's, not a thread's, so it can only be set in the child, between fork and
            // exec (the places enter their namespace on the spawning thread instead).
            unsafe {
                command.pre_exec(move || {
                    let hard = match hard {
                        Some(hard) => hard,
                        None => getrlimit(Resource::RLIMIT_NOFILE)?.1,
                    };
                    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).map_err(std::io::Error::from)
                });
            }
        }
        command
    }

    /// Starts it at `place`. Nothing waits yet: see [`Running::wait_ready`],
    /// [`Running::wait_for_line`] and [`Running::wait_until`].
    pub fn spawn(self, place: Place<'_>) -> Result<Running, LaunchError> {
        let program = self.program_name();
        let mut command = self.command();
        match &self.log {
            LogTo::File(path) => {
                let file = std::fs::File::create(path).map_err(|source| LaunchError::Log {
                    path: path.clone(),
                    source,
                })?;
                let copy = file.try_clone().map_err(|source| LaunchError::Log {
                    path: path.clone(),
                    source,
                })?;
                command.stdout(copy).stderr(file);
            }
            LogTo::Pipe(_) => {
                command.stdout(Stdio::null()).stderr(Stdio::piped());
            }
        }
        let mut process = match place {
            Place::Here => {
                Process::Plain(command.spawn().map_err(|source| LaunchError::Spawn {
                    program: program.clone(),
                    source,
                })?)
            }
            Place::Netns(name) => Process::Plain(
                spawn_in_namespace(&midway_sys::netns::netns_path(name), command).map_err(
                    |source| LaunchError::SpawnInNetns {
                        program: program.clone(),
                        netns: name.to_owned(),
                        source,
                    },
                )?,
            ),
            Place::Host { topology, host } => Process::Host(
                topology
                    .spawn_with(host, command, &self.spawn_options)
                    .map_err(|source| LaunchError::SpawnInHost {
                        program: program.clone(),
                        host: host.to_string(),
                        source: Box::new(source),
                    })?,
            ),
        };
        let log = match self.log {
            LogTo::File(path) => Log::File(path),
            LogTo::Pipe(forward) => match process.child_mut().stderr.take() {
                Some(stderr) => Log::pipe(stderr, forward),
                None => Log::pipe(std::io::empty(), forward),
            },
        };
        Ok(Running::new(program, process, log, self.grace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_log_goes_before_the_subcommand_and_take_over_after_the_config() {
        let launch = Launch::midway("/bin/midway", Path::new("/c.toml"))
            .json_log()
            .take_over()
            .nice(-5);
        let command = launch.command();
        assert_eq!(command.get_program(), "nice");
        let args: Vec<_> = command.get_args().collect();
        assert_eq!(
            args,
            [
                "-n",
                "-5",
                "/bin/midway",
                "--log-format",
                "json",
                "proxy",
                "--config",
                "/c.toml",
                "--take-over"
            ]
        );
        assert_eq!(launch.program_name(), "midway");
    }
}
