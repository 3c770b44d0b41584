//! Network namespaces: creating and removing named ones (as `ip netns add` / `del` do), and
//! running code inside one. `setns(2)` changes the namespace of the calling thread only, so each
//! function here runs the caller's closure on a thread of its own that joins the namespace first
//! and ends when the closure returns: no other code ever runs on a thread that was moved, and
//! the caller's threads stay where they are.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
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

/// Creates a new, empty network namespace named `name` the way `ip netns add` does: a handle
/// file in [`NETNS_DIR`] with the namespace bind-mounted on it, so it lives until [`delete`]
/// (no process needs to stay in it). Its loopback is down, as in any new namespace. Fails with
/// `AlreadyExists` if the name is taken.
pub fn create(name: &str) -> io::Result<PathBuf> {
    use nix::mount::{mount, MsFlags};
    let dir = Path::new(NETNS_DIR);
    std::fs::create_dir_all(dir).map_err(|e| with_path("cannot create", dir, e))?;
    // As iproute2 does: the directory is a shared mount point, so a handle mounted later is
    // seen in every mount namespace that shares it, and unmounting it removes it everywhere.
    let shared = MsFlags::MS_SHARED | MsFlags::MS_REC;
    if mount(None::<&str>, dir, Some("none"), shared, None::<&str>).is_err() {
        let bind = MsFlags::MS_BIND | MsFlags::MS_REC;
        mount(Some(dir), dir, Some("none"), bind, None::<&str>)
            .map_err(|e| with_path("cannot bind-mount", dir, e.into()))?;
        mount(None::<&str>, dir, Some("none"), shared, None::<&str>)
            .map_err(|e| with_path("cannot make shared", dir, e.into()))?;
    }
    let path = netns_path(name);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| with_path("cannot create namespace handle", &path, e))?;
    let target = path.clone();
    // unshare(2) moves only this short-lived thread into the new namespace.
    let mounted = std::thread::Builder::new()
        .name("netns-create".into())
        .spawn(move || -> io::Result<()> {
            nix::sched::unshare(CloneFlags::CLONE_NEWNET)?;
            mount(
                Some("/proc/thread-self/ns/net"),
                &target,
                Some("none"),
                MsFlags::MS_BIND,
                None::<&str>,
            )?;
            Ok(())
        })?
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    if let Err(e) = mounted {
        let _ = std::fs::remove_file(&path);
        return Err(with_path("cannot create network namespace", &path, e));
    }
    Ok(path)
}

/// Inode of a namespace handle (identifies the namespace in `/proc/PID/ns/net`).
pub fn inode(name: &str) -> Option<u64> {
    std::fs::metadata(netns_path(name)).ok().map(|m| m.ino())
}

/// Processes (other than this one) whose network namespace is one of `inodes`.
pub fn processes_in(inodes: &[u64]) -> Vec<i32> {
    if inodes.is_empty() {
        return Vec::new();
    }
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/net"))
                .ok()
                .and_then(|l| {
                    l.to_str()?
                        .strip_prefix("net:[")?
                        .strip_suffix(']')?
                        .parse::<u64>()
                        .ok()
                })
                .is_some_and(|ino| inodes.contains(&ino))
        })
        .collect()
}

/// Removes a namespace handle the way `ip netns del` does (lazy unmount, then unlink); `false`
/// if there was none. The namespace itself disappears, with its interfaces, once no process or
/// socket holds it. Safe for a cleanup thread while the process is being stopped by a signal:
/// no fork, no allocation beyond the path.
pub fn delete(name: &str) -> io::Result<bool> {
    let path = netns_path(name);
    if !path.exists() {
        return Ok(false);
    }
    match nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(with_path("cannot unmount namespace", &path, e.into())),
    }
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(with_path("cannot remove namespace handle", &path, e)),
    }
}

/// Stops the processes inside the named namespaces (SIGTERM, then SIGKILL after `grace`), then
/// removes the namespace handles; the first error is returned after trying every name.
pub fn remove_with_processes(names: &[String], grace: std::time::Duration) -> io::Result<()> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let inodes: Vec<u64> = names.iter().filter_map(|n| inode(n)).collect();
    if !processes_in(&inodes).is_empty() {
        for pid in processes_in(&inodes) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline && !processes_in(&inodes).is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        for pid in processes_in(&inodes) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    let mut first_error = None;
    for name in names {
        if let Err(e) = delete(name) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Names of all namespace handles in `/run/netns`.
pub fn list() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    names
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
