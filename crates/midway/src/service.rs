//! midway under a service manager: systemd's notification protocol (`Type=notify`, through the
//! sd-notify crate). Every call is a no-op when `NOTIFY_SOCKET` is not set (run from a shell, a
//! test, the lab), and a failed notification is logged, never fatal: serving matters more than
//! telling.
//!
//! - READY=1 once the listeners are bound and the interception installed (the same moment as
//!   the log's ready line).
//! - A binary upgrade the manager follows: SIGUSR2 makes the running midway start its binary's
//!   file again (the new one, after a package upgrade) with the same arguments and
//!   `--take-over`, as its own child, so the new process is inside the unit. The new process
//!   sends MAINPID with its own pid once it serves and before it tells the old one to stop
//!   (the unit needs `NotifyAccess=all`: the sender is not yet the main process), so the
//!   manager never sees its main process exit; if the take-over fails after that, it gives the
//!   old pid back.
//! - RELOADING=1 with the monotonic time when SIGHUP arrives, READY=1 when the reload is done
//!   (applied or refused: the process serves either way).
//! - STOPPING=1 when a termination signal starts the drain.
//! - WATCHDOG=1 at half the unit's `WatchdogSec`, from a task of the proxy's own runtime: a
//!   runtime that stops running tasks stops the pings, and the manager restarts midway.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sd_notify::NotifyState;

/// Tells the manager midway serves; `took_over`: this process replaced a running midway.
pub(crate) fn ready(took_over: bool) {
    let pid = std::process::id();
    if took_over {
        notify(&[NotifyState::MainPid(pid), NotifyState::Ready]);
    } else {
        notify(&[NotifyState::Ready]);
    }
}

/// [`midway_proxy::Proxy::take_over`], telling the manager the new main process at the moment
/// both serve, and the old pid again if the take-over fails after that.
pub(crate) async fn take_over(
    config: midway_proxy::config::RuntimeConfig,
    registry: &mut prometheus_client::registry::Registry,
) -> anyhow::Result<midway_proxy::Proxy> {
    // The pid of the midway taken over from, once this one announced itself in its place.
    let announced = std::cell::Cell::new(None);
    let result = midway_proxy::Proxy::take_over(config, registry, |old_pid| {
        notify(&[NotifyState::MainPid(std::process::id())]);
        announced.set(Some(old_pid));
    })
    .await;
    if let (Err(_), Some(old_pid)) = (&result, announced.get()) {
        // The old midway still serves: it is the main process again.
        notify(&[NotifyState::MainPid(old_pid)]);
    }
    Ok(result?)
}

/// On SIGUSR2, starts this binary's file again with this process's arguments and
/// `--take-over`, as a child (inside the same unit). One at a time: a signal while a successor
/// starts is logged and ignored; a successor that fails is logged and this process serves on.
pub(crate) fn upgrade_on_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut signals = signal(SignalKind::user_defined2())?;
    let starting = Arc::new(AtomicBool::new(false));
    tokio::spawn(async move {
        while signals.recv().await.is_some() {
            if starting.swap(true, Ordering::SeqCst) {
                tracing::warn!("SIGUSR2: an upgrade is already under way; ignored");
                continue;
            }
            match spawn_successor() {
                Ok(mut child) => {
                    tracing::info!(
                        pid = child.id(),
                        "SIGUSR2: started the new binary to take over"
                    );
                    let starting = Arc::clone(&starting);
                    tokio::spawn(async move {
                        // A successor that took over keeps running past this process's end;
                        // one that exits while this process lives has failed.
                        match child.wait().await {
                            Ok(status) if status.success() => tracing::info!(
                                "the new midway stopped before this one finished draining"
                            ),
                            status => tracing::error!(
                                status = ?status,
                                "the new midway failed: if it had not taken over, this one serves on"
                            ),
                        }
                        starting.store(false, Ordering::SeqCst);
                    });
                }
                Err(error) => {
                    tracing::error!(error = format!("{error:#}"), "upgrade failed");
                    starting.store(false, Ordering::SeqCst);
                }
            }
        }
    });
    Ok(())
}

/// This binary's file and arguments, with `--take-over`.
fn spawn_successor() -> anyhow::Result<tokio::process::Child> {
    let (program, arguments) = successor_command(std::env::args_os().collect())?;
    tokio::process::Command::new(&program)
        .args(&arguments)
        .stdin(std::process::Stdio::null())
        // The watchdog is meant for whichever process is main: the successor's own check
        // must not find this process's pid there.
        .env_remove("WATCHDOG_PID")
        .spawn()
        .with_context(|| format!("cannot start {}", program.display()))
}

/// The program to start and its arguments: the path this process was started by (a package
/// upgrade replaces the file; `/proc/self/exe` would name the deleted old one), its arguments,
/// and `--take-over` unless already there.
fn successor_command(mut argv: Vec<OsString>) -> anyhow::Result<(PathBuf, Vec<OsString>)> {
    anyhow::ensure!(
        !argv.is_empty(),
        "no program name in this process's arguments"
    );
    let started_as = PathBuf::from(argv.remove(0));
    let program = if started_as.components().count() > 1 {
        started_as
    } else {
        std::env::current_exe().context("cannot find this binary's file")?
    };
    if !argv.iter().any(|a| a == "--take-over") {
        argv.push("--take-over".into());
    }
    Ok((program, argv))
}

/// A reload starts.
pub(crate) fn reloading() {
    // systemd 253 and newer want the monotonic time with RELOADING=1 (to match it against its
    // own clock); reading CLOCK_MONOTONIC does not fail on Linux.
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
}

/// The reload is over, applied or refused.
pub(crate) fn reloaded() {
    notify(&[NotifyState::Ready]);
}

/// The drain starts.
pub(crate) fn stopping() {
    notify(&[NotifyState::Stopping]);
}

/// Pings the manager's watchdog until the runtime ends, if the unit has one. The runtime's own
/// task decides each ping (a runtime that stops running tasks stops them); a thread of its own
/// sends them, since a manager that does not read its socket makes the send block, and a
/// blocked worker thread would stall connections and the shutdown. Pings it cannot take yet
/// are dropped: one late ping says as much as several.
pub(crate) fn spawn_watchdog() {
    let Some(timeout) = watchdog_timeout() else {
        return;
    };
    let every = (timeout / 2).max(Duration::from_millis(100));
    let (pings, to_send) = std::sync::mpsc::sync_channel::<()>(1);
    let sender = std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            while to_send.recv().is_ok() {
                notify(&[NotifyState::Watchdog]);
            }
        });
    if let Err(error) = sender {
        tracing::warn!(error = %error, "cannot start the watchdog thread; no watchdog pings");
        return;
    }
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let _ = pings.try_send(());
        }
    });
}

/// The unit's watchdog timeout, when it has one meant for this process: `WATCHDOG_USEC`, and
/// `WATCHDOG_PID` either this process's pid or absent, as libsystemd's `sd_watchdog_enabled`
/// reads them (the sd-notify crate's check insists on the pid, which an upgrade's successor,
/// started before its pid is known, cannot be given).
fn watchdog_timeout() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    let meant_for_us = match std::env::var("WATCHDOG_PID") {
        Ok(pid) => pid.parse::<u32>().ok() == Some(std::process::id()),
        Err(_) => true,
    };
    (meant_for_us && usec > 0).then(|| Duration::from_micros(usec))
}

fn notify(states: &[NotifyState<'_>]) {
    if let Err(err) = sd_notify::notify(false, states) {
        tracing::warn!(error = %err, "cannot notify the service manager");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_successor_runs_the_same_file_and_arguments_with_take_over() {
        let argv = [
            "/usr/bin/midway",
            "proxy",
            "--config",
            "/etc/midway/midway.toml",
        ];
        let (program, arguments) =
            successor_command(argv.iter().map(OsString::from).collect()).unwrap();
        assert_eq!(program, PathBuf::from("/usr/bin/midway"));
        assert_eq!(
            arguments,
            [
                "proxy",
                "--config",
                "/etc/midway/midway.toml",
                "--take-over"
            ]
            .map(OsString::from)
            .to_vec()
        );
        // A successor's own successor does not repeat the flag.
        let (_, again) = successor_command(
            std::iter::once(OsString::from("/usr/bin/midway"))
                .chain(arguments)
                .collect(),
        )
        .unwrap();
        assert_eq!(again.iter().filter(|a| *a == "--take-over").count(), 1);
    }

    #[test]
    fn a_bare_program_name_resolves_to_this_binary() {
        let (program, _) = successor_command(vec!["midway".into(), "proxy".into()]).unwrap();
        assert!(program.is_absolute(), "{}", program.display());
    }
}
