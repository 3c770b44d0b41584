//! Running code inside a network namespace. `setns(2)` changes the namespace of the calling
//! thread only, so each function here runs the caller's closure on a thread of its own that joins
//! the namespace first and ends when the closure returns: no other code ever runs on a thread
//! that was moved, and the caller's threads stay where they are.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use nix::sched::{setns, CloneFlags};

/// Where `ip netns add NAME` puts a namespace's handle.
pub const NETNS_DIR: &str = "/run/netns";

/// The handle of the namespace named `name` (as `ip netns` names it).
pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Moves the calling thread into the network namespace `namespace` (an open handle such as
/// `/run/netns/NAME`). Only for a thread that was started for work in that namespace and ends
/// with it (an emulator's forwarding thread, a scoped helper): code that later runs on a moved
/// thread would open its sockets in the wrong namespace. Everything else uses [`spawn_in`] or
/// [`run_in`].
pub fn enter(namespace: &File) -> io::Result<()> {
    setns(namespace.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// Starts `f` on a new thread that has joined the network namespace at `path`; the caller joins
/// the returned handle when it wants the result. The namespace is opened before the thread
/// starts, so a missing one is reported at once.
pub fn spawn_in<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<JoinHandle<io::Result<T>>> {
    let file = File::open(path).map_err(|e| with_path("cannot open network namespace", path, e))?;
    let owned_path = path.to_path_buf();
    std::thread::Builder::new()
        .name("in-netns".into())
        .spawn(move || {
            enter(&file)
                .map_err(|e| with_path("cannot enter network namespace", &owned_path, e))?;
            Ok(f())
        })
}

/// Runs `f` on a new thread inside the network namespace at `path` and returns its result. A
/// panic in `f` continues in the caller.
pub fn run_in<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    match spawn_in(path, f)?.join() {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn with_path(what: &str, path: &Path, error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("{what} {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_namespace_is_reported_with_its_path() {
        let error = run_in(Path::new("/run/netns/midway-sys-no-such-namespace"), || ())
            .expect_err("no such namespace");
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert!(error.to_string().contains("midway-sys-no-such-namespace"));
    }

    #[test]
    fn the_closure_runs_in_the_namespace_and_its_result_comes_back() {
        // The calling process's own namespace: always there, no root needed to enter it again
        // only if we are root; otherwise setns fails with EPERM, which is reported as an error.
        let result = run_in(Path::new("/proc/self/ns/net"), || 7);
        match result {
            Ok(value) => assert_eq!(value, 7),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}"),
        }
    }
}
