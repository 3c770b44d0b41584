//! midway under a service manager: systemd's notification protocol (`Type=notify`, through the
//! sd-notify crate). Every call is a no-op when `NOTIFY_SOCKET` is not set (run from a shell, a
//! test, the lab), and a failed notification is logged, never fatal: serving matters more than
//! telling.
//!
//! - READY=1 once the listeners are bound and the interception installed (the same moment as
//!   the log's ready line), with MAINPID when this process took over from a running midway, so
//!   the manager follows the new process (the unit needs `NotifyAccess=all` for that).
//! - RELOADING=1 with the monotonic time when SIGHUP arrives, READY=1 when the reload is done
//!   (applied or refused: the process serves either way).
//! - STOPPING=1 when a termination signal starts the drain.
//! - WATCHDOG=1 at half the unit's `WatchdogSec`, from a task of the proxy's own runtime: a
//!   runtime that stops running tasks stops the pings, and the manager restarts midway.

use std::time::Duration;

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

/// Pings the manager's watchdog until the runtime ends, if the unit has one.
pub(crate) fn spawn_watchdog() {
    let Some(timeout) = watchdog_timeout() else {
        return;
    };
    let every = (timeout / 2).max(Duration::from_millis(100));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            notify(&[NotifyState::Watchdog]);
        }
    });
}

/// The unit's watchdog timeout, when it has one meant for this process.
fn watchdog_timeout() -> Option<Duration> {
    let mut usec = 0;
    sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec))
}

fn notify(states: &[NotifyState<'_>]) {
    if let Err(err) = sd_notify::notify(false, states) {
        tracing::warn!(error = %err, "cannot notify the service manager");
    }
}
