//! Making sure a run leaves nothing behind: topologies and children registered with midway-sys's
//! cleanup registry, which the signal handler here empties; owner pid files per tag; and removal
//! of what a crashed run left.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use midway_sys::cleanup::{self, RegisterError};
use midway_sys::{netns, procfs};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::error::LabNetError;
use crate::spec::tag_of_netns_name;
use crate::sys;

/// Directory with one `<tag>.pid` file per live topology: "PID STARTTIME".
pub const PID_DIR: &str = "/run/midway-lab";

/// Fails at once, with a message that says why, when the process is not root.
pub fn require_root() -> Result<(), LabNetError> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(LabNetError::NotRoot)
    }
}

/// Registers a topology's namespaces (midway-sys's registry, which the signal cleanup empties)
/// under its tag, before any of them exists.
pub(crate) fn register_topology(tag: &str, netns: Vec<String>) -> Result<u64, LabNetError> {
    cleanup::register_namespaces(tag, netns).map_err(|e| match e {
        RegisterError::ShuttingDown => LabNetError::ShuttingDown,
        // Two live topologies of one process with one tag would tear down each other's namespaces.
        RegisterError::KeyInUse => LabNetError::TagInUse {
            tag: tag.to_owned(),
            pid: std::process::id() as i32,
        },
    })
}

pub(crate) fn unregister_topology(id: u64) {
    cleanup::unregister_namespaces(id);
}

pub(crate) fn register_child(pgid: i32) {
    cleanup::register_process_group(pgid);
}

pub(crate) fn unregister_child(pgid: i32) {
    cleanup::unregister_process_group(pgid);
}

fn pid_file(tag: &str) -> PathBuf {
    PathBuf::from(PID_DIR).join(format!("{tag}.pid"))
}

/// The owner recorded for `tag`, if the file exists and parses.
fn read_owner(tag: &str) -> Option<(i32, u64)> {
    let text = fs::read_to_string(pid_file(tag)).ok()?;
    let mut parts = text.split_whitespace();
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn owner_alive(owner: (i32, u64)) -> bool {
    procfs::process_start_time(owner.0) == Some(owner.1)
}

fn me() -> (i32, u64) {
    let pid = std::process::id() as i32;
    (pid, procfs::process_start_time(pid).unwrap_or(0))
}

/// Records this process as the owner of `tag`; refuses a tag owned by another live process.
pub(crate) fn claim_tag(tag: &str) -> Result<(), LabNetError> {
    fs::create_dir_all(PID_DIR).map_err(|e| LabNetError::io("cannot create", PID_DIR, e))?;
    let path = pid_file(tag);
    if let Some(owner) = read_owner(tag) {
        if owner != me() && owner_alive(owner) {
            return Err(LabNetError::TagInUse {
                tag: tag.to_owned(),
                pid: owner.0,
            });
        }
    }
    let (pid, start) = me();
    let mut file =
        fs::File::create(&path).map_err(|e| LabNetError::io("cannot create", &path, e))?;
    writeln!(file, "{pid} {start}").map_err(|e| LabNetError::io("cannot write", &path, e))
}

pub(crate) fn release_tag(tag: &str) {
    if read_owner(tag) == Some(me()) {
        let _ = fs::remove_file(pid_file(tag));
    }
}

fn live_tags_here() -> Vec<String> {
    cleanup::live_keys()
}

/// Whether nobody owns `tag` any more: its recorded owner is gone (or is this process, which has
/// no live topology with it), or no owner was ever recorded. Owners are recorded before any
/// namespace is created, so namespaces without an owner are leftovers.
fn tag_abandoned(tag: &str, live_here: &[String]) -> bool {
    match read_owner(tag) {
        Some(owner) if owner == me() => !live_here.iter().any(|t| t == tag),
        Some(owner) => !owner_alive(owner),
        None => true,
    }
}

/// If `tag` is abandoned, removes its namespaces and pid file and returns true; a tag in use
/// is left alone (false).
pub(crate) fn reclaim_abandoned_tag(tag: &str) -> Result<bool, LabNetError> {
    if !tag_abandoned(tag, &live_tags_here()) {
        return Ok(false);
    }
    let names: Vec<String> = netns::list()
        .into_iter()
        .filter(|n| tag_of_netns_name(n) == Some(tag))
        .collect();
    tracing::info!(tag, names = ?names, "removing leftovers of an abandoned tag");
    remove_namespaces(&names, std::time::Duration::from_millis(500))?;
    let _ = fs::remove_file(pid_file(tag));
    Ok(true)
}

/// Removes every namespace whose name carries the lab prefix and the tag of a run that is gone
/// (its recorded owner process no longer exists, or no owner was recorded), kills processes left
/// inside them, and removes stale pid files. Returns how many namespaces were removed.
pub fn clean_leftovers() -> Result<usize, LabNetError> {
    require_root()?;
    let live_here = live_tags_here();
    let mut owners: BTreeMap<String, bool> = BTreeMap::new();
    let mut leftovers = Vec::new();
    for name in netns::list() {
        let Some(tag) = tag_of_netns_name(&name) else {
            continue;
        };
        let alive = *owners
            .entry(tag.to_owned())
            .or_insert_with(|| match read_owner(tag) {
                // Our own process owns it only while a live topology says so.
                Some(owner) if owner == me() => live_here.iter().any(|t| t == tag),
                Some(owner) => owner_alive(owner),
                None => false,
            });
        if !alive {
            leftovers.push(name);
        }
    }
    remove_namespaces(&leftovers, std::time::Duration::from_millis(500))?;
    // Pid files of dead owners, with or without namespaces left.
    if let Ok(dir) = fs::read_dir(PID_DIR) {
        for entry in dir.flatten() {
            let name = entry.file_name();
            let Some(tag) = name.to_str().and_then(|n| n.strip_suffix(".pid")) else {
                continue;
            };
            if tag_abandoned(tag, &live_here) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
    if !leftovers.is_empty() {
        tracing::info!(count = leftovers.len(), names = ?leftovers, "removed leftover lab namespaces");
    }
    Ok(leftovers.len())
}

/// Stops processes inside the namespaces (SIGTERM, then SIGKILL after `grace`), then removes the
/// namespace handles.
pub(crate) fn remove_namespaces(
    names: &[String],
    grace: std::time::Duration,
) -> Result<(), LabNetError> {
    netns::remove_with_processes(names, grace)
        .map_err(|e| LabNetError::io("cannot remove namespaces", sys::NETNS_DIR, e))
}

/// Tears down every live topology of this process as fast as possible (children killed, namespace
/// handles removed, pid files released), and refuses to build new ones from then on. For signal
/// handlers (the process is expected to exit); returns how many topologies there were.
pub(crate) fn cleanup_live_topologies() -> usize {
    let (topologies, children) = cleanup::take_for_shutdown();
    for pgid in children {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    for topology in &topologies {
        let _ = remove_namespaces(&topology.namespaces, std::time::Duration::ZERO);
        release_tag(&topology.key);
    }
    topologies.len()
}

/// Installs SIGINT/SIGTERM/SIGHUP handling: tear down live topologies, then die of the signal as
/// the default action would. Call once from the CLI; later calls do nothing.
pub fn install_cleanup_on_signal() -> Result<(), LabNetError> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    static INSTALLED: OnceLock<()> = OnceLock::new();
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(LabNetError::Signals)?;
    std::thread::Builder::new()
        .name("labnet-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                let count = cleanup_live_topologies();
                eprintln!("midway lab: signal {signal}: removed {count} live topologies");
                // Handlers are still registered: restore the default action and re-raise.
                let _ = signal_hook::low_level::emulate_default_handler(signal);
                std::process::exit(128 + signal);
            }
        })
        .map_err(LabNetError::Signals)?;
    let _ = INSTALLED.set(());
    Ok(())
}
