//! A launched process: bounded waits until it is ready, signals, and its stop.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use midway_labnet::HostChild;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::log::Log;
use crate::{LaunchError, READY_LINE, TOOK_OVER_LINE};

/// How often the log waits look again.
const LINE_POLL: Duration = Duration::from_millis(20);

/// The child as it was started: a plain child, or one in a lab host (its own process group,
/// known to the topology's signal cleanup).
#[derive(Debug)]
pub(crate) enum Process {
    /// Started here or in a named network namespace.
    Plain(Child),
    /// Started in a lab host.
    Host(HostChild),
}

impl Process {
    /// The child.
    pub(crate) fn child_mut(&mut self) -> &mut Child {
        match self {
            Process::Plain(child) => child,
            Process::Host(child) => child.child_mut(),
        }
    }
}

/// A started process. Dropping it stops it like [`Running::stop`].
#[derive(Debug)]
pub struct Running {
    program: String,
    pid: u32,
    process: Process,
    log: Log,
    grace: Duration,
    /// Set by the first stop, so neither a second one nor `drop` signals a reused pid.
    stopped: bool,
}

impl Running {
    pub(crate) fn new(program: String, mut process: Process, log: Log, grace: Duration) -> Self {
        let pid = process.child_mut().id();
        Running {
            program,
            pid,
            process,
            log,
            grace,
            stopped: false,
        }
    }

    /// Its process id (through `nice`, which execs it, still its own).
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// The child process, e.g. to wait for its exit.
    pub fn child_mut(&mut self) -> &mut Child {
        self.process.child_mut()
    }

    /// Whether it has exited, without waiting.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child_mut().try_wait()
    }

    /// Sends `signal` to it.
    pub fn signal(&self, signal: Signal) -> Result<(), LaunchError> {
        nix::sys::signal::kill(Pid::from_raw(self.pid as i32), signal).map_err(|source| {
            LaunchError::Signal {
                program: self.program.clone(),
                signal,
                source,
            }
        })
    }

    /// Asks midway to reload its configuration file (SIGHUP).
    pub fn reload(&self) -> Result<(), LaunchError> {
        self.signal(Signal::SIGHUP)
    }

    /// SIGKILL at once (a crash, as the fault campaign and the tests make one); the stop or drop
    /// that follows reaps it.
    pub fn kill(&mut self) -> std::io::Result<()> {
        self.child_mut().kill()
    }

    /// The end of its log, for a message of the caller's.
    pub fn log_tail(&self) -> String {
        self.log.tail()
    }

    /// Waits up to `limit` for a log line that `matches` accepts (one logged before the call
    /// counts) and returns it; fails if the process exits first. `what` names the line in the
    /// error.
    pub fn wait_for_line(
        &mut self,
        limit: Duration,
        what: &str,
        mut matches: impl FnMut(&str) -> bool,
    ) -> Result<String, LaunchError> {
        let mut found = None;
        self.poll(limit, LINE_POLL, what, |log| {
            found = log.find(&mut matches);
            Ok::<_, std::convert::Infallible>(found.is_some())
        })?;
        Ok(found.unwrap_or_default())
    }

    /// Waits up to `limit` for midway's line saying its listeners are bound and its interception
    /// installed ([`READY_LINE`]; logged at `info`, so not with `MIDWAY_LOG=warn`).
    pub fn wait_ready(&mut self, limit: Duration) -> Result<(), LaunchError> {
        self.wait_for_line(limit, "ready line", |line| line.contains(READY_LINE))
            .map(drop)
    }

    /// Waits up to `limit` for a midway started with [`crate::Launch::take_over`] to say it took
    /// over ([`TOOK_OVER_LINE`]).
    pub fn wait_took_over(&mut self, limit: Duration) -> Result<(), LaunchError> {
        self.wait_for_line(limit, "take-over line", |line| {
            line.contains(TOOK_OVER_LINE)
        })
        .map(drop)
    }

    /// Polls `ready` every `poll` until it says yes; fails if the process exits first, if
    /// `limit` passes, or if `ready` fails. `what` names the condition in the error. For
    /// readiness the log cannot show: ports listening, an nftables table present.
    pub fn wait_until<E>(
        &mut self,
        limit: Duration,
        poll: Duration,
        what: &str,
        mut ready: impl FnMut() -> Result<bool, E>,
    ) -> Result<(), LaunchError>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        self.poll(limit, poll, what, |_| ready())
    }

    /// [`Running::wait_until`] with a probe that may read the log.
    fn poll<E>(
        &mut self,
        limit: Duration,
        poll: Duration,
        what: &str,
        mut ready: impl FnMut(&Log) -> Result<bool, E>,
    ) -> Result<(), LaunchError>
    where
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let deadline = Instant::now() + limit;
        loop {
            let is_ready = ready(&self.log).map_err(|source| LaunchError::Probe {
                program: self.program.clone(),
                source: source.into(),
            })?;
            if is_ready {
                return Ok(());
            }
            let exited = self.try_wait().map_err(|source| LaunchError::Wait {
                program: self.program.clone(),
                source,
            })?;
            if let Some(status) = exited {
                return Err(LaunchError::Exited {
                    program: self.program.clone(),
                    status,
                    log_tail: self.log.tail(),
                });
            }
            if Instant::now() >= deadline {
                return Err(LaunchError::NotReady {
                    program: self.program.clone(),
                    what: what.to_string(),
                    limit,
                    log_tail: self.log.tail(),
                });
            }
            std::thread::sleep(poll);
        }
    }

    /// SIGTERM, up to the grace period to exit (midway drains its connections), then SIGKILL
    /// (in a lab host: to its whole process group); returns how it ended.
    pub fn stop(mut self) -> Result<ExitStatus, LaunchError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<ExitStatus, LaunchError> {
        let wait_error = |program: &str| {
            let program = program.to_string();
            move |source| LaunchError::Wait { program, source }
        };
        if self.stopped {
            return Err(already_stopped(&self.program));
        }
        self.stopped = true;
        match &mut self.process {
            Process::Plain(child) => {
                if let Some(status) = child.try_wait().map_err(wait_error(&self.program))? {
                    return Ok(status);
                }
                // Already gone if it exited between the look and the signal: the wait says so.
                let _ = nix::sys::signal::kill(Pid::from_raw(self.pid as i32), Signal::SIGTERM);
                let deadline = Instant::now() + self.grace;
                while Instant::now() < deadline {
                    if let Some(status) = child.try_wait().map_err(wait_error(&self.program))? {
                        return Ok(status);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = child.kill();
                child.wait().map_err(wait_error(&self.program))
            }
            Process::Host(child) => {
                if child
                    .try_wait()
                    .map_err(wait_error(&self.program))?
                    .is_none()
                {
                    let _ = nix::sys::signal::kill(Pid::from_raw(self.pid as i32), Signal::SIGTERM);
                    let _ = child.wait_timeout(self.grace);
                }
                // The lab's own stop: the process group SIGTERMed, SIGKILLed after its bound.
                child.stop_in_place().map_err(wait_error(&self.program))
            }
        }
    }
}

/// The error of a second stop (only `drop` can come after `stop`, and it checks).
fn already_stopped(program: &str) -> LaunchError {
    LaunchError::Wait {
        program: program.to_string(),
        source: std::io::Error::other("already stopped"),
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.stop_inner();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::{Launch, Place};

    use super::*;

    fn shell(script: &str) -> Launch {
        Launch::program("sh").args(["-c", script])
    }

    #[test]
    fn a_logged_line_is_found_and_the_stop_is_a_sigterm() {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut running =
            shell("echo starting >&2; echo 'ready: interception installed' >&2; exec sleep 30")
                .log_lines(tx)
                .spawn(Place::Here)
                .unwrap();
        running.wait_ready(Duration::from_secs(10)).unwrap();
        let status = running.stop().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc_sigterm())
        );
        let lines: Vec<String> = rx.try_iter().collect();
        assert_eq!(lines, ["starting", "ready: interception installed"]);
    }

    #[test]
    fn an_exit_during_the_wait_fails_with_the_log() {
        let dir = std::env::temp_dir().join(format!("midway-launch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("exit.log");
        let mut running = shell("echo 'cannot bind' >&2; exit 3")
            .log_file(&log)
            .spawn(Place::Here)
            .unwrap();
        let error = running.wait_ready(Duration::from_secs(10)).unwrap_err();
        assert!(matches!(error, LaunchError::Exited { .. }), "{error}");
        assert!(error.to_string().contains("cannot bind"), "{error}");
        let _ = std::fs::remove_dir_all(Path::new(&dir));
    }

    #[test]
    fn a_wait_is_bounded_and_a_stubborn_process_is_killed() {
        let mut running = shell("trap '' TERM; echo up >&2; while :; do sleep 0.05; done")
            .stop_grace(Duration::from_millis(200))
            .spawn(Place::Here)
            .unwrap();
        running
            .wait_for_line(Duration::from_secs(10), "up", |l| l == "up")
            .unwrap();
        let error = running
            .wait_until(Duration::from_millis(100), LINE_POLL, "never", || {
                Ok::<_, std::io::Error>(false)
            })
            .unwrap_err();
        assert!(matches!(error, LaunchError::NotReady { .. }), "{error}");
        let status = running.stop().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(Signal::SIGKILL as i32)
        );
    }

    fn libc_sigterm() -> i32 {
        Signal::SIGTERM as i32
    }
}
