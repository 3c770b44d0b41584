//! The process's open-file limit (`RLIMIT_NOFILE`), raised as far as the host allows.
//!
//! Every split connection holds descriptors, so the limit decides how many connections a process
//! can serve. An unprivileged process may raise its soft limit up to its hard limit; a process
//! with `CAP_SYS_RESOURCE` (root) may raise both up to `fs.nr_open`, the kernel's ceiling for one
//! process. Raising is harmless: descriptors are allocated as they are opened, not reserved.

use std::io;

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The limit before and after [`raise_open_file_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// The soft limit the process started with.
    pub before: u64,
    /// The soft limit now: what the process may open.
    pub soft: u64,
    /// The hard limit now.
    pub hard: u64,
}

impl OpenFileLimit {
    /// Whether the soft limit was raised.
    pub fn raised(&self) -> bool {
        self.soft > self.before
    }
}

/// The process's current limit, unchanged.
pub fn open_file_limit() -> io::Result<OpenFileLimit> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    Ok(OpenFileLimit {
        before: soft,
        soft,
        hard,
    })
}

/// Raises the soft limit to the hard limit, and both to `fs.nr_open` where the process may (it
/// has `CAP_SYS_RESOURCE`). A limit already above `fs.nr_open` (possible when it was lowered
/// after the limit was set) is left alone; so is the hard limit when raising it is refused.
pub fn raise_open_file_limit() -> io::Result<OpenFileLimit> {
    let (before, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    let ceiling = crate::sysctl::read_u64("fs.nr_open")?;
    let mut limit = OpenFileLimit {
        before,
        soft: before,
        hard,
    };
    if ceiling > hard && setrlimit(Resource::RLIMIT_NOFILE, ceiling, ceiling).is_ok() {
        limit.soft = ceiling;
        limit.hard = ceiling;
    } else if hard > before {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(io::Error::from)?;
        limit.soft = hard;
    }
    Ok(limit)
}

/// Sets the soft and hard limit of another process (`prlimit(2)`; needs `CAP_SYS_RESOURCE` to
/// raise one, or to change another user's process). Tests use it to make a running process run
/// out of descriptors.
pub fn set_open_file_limit_of(pid: u32, limit: u64) -> io::Result<()> {
    let new = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    let pid =
        libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `new` is a valid rlimit that outlives the call; the old limit is not asked for
    // (null), which prlimit(2) allows.
    let status = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) };
    if status == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
