//! Thin system helpers over `midway-sys`: entering a namespace on a thread, a namespace's
//! sysctls, its netlink socket, and `ethtool` (a program that stays a program).

use std::path::Path;

use midway_sys::command::Program;
use midway_sys::netlink::{Netlink, NetlinkError};

use crate::error::LabNetError;

pub(crate) use midway_sys::netns::{netns_path, NETNS_DIR};

/// Turns off every offload that would let one "packet" be many frames (GSO/TSO/GRO) or leave
/// checksums to hardware that does not exist (veth needs `tx off`), so the emulator handles one
/// real frame per packet.
pub(crate) fn offloads_off(netns: &str, iface: &str) -> Result<(), LabNetError> {
    Program::new("ethtool")
        .args(["-K", iface])
        .args([
            "gso", "off", "tso", "off", "gro", "off", "tx", "off", "rx", "off", "sg", "off",
        ])
        .in_named_namespace(netns)
        .run()
        .map_err(LabNetError::Program)
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

/// Writes sysctls of the calling thread's network namespace (`/proc/sys/net/...` follows the
/// namespace of the thread that opens it).
pub(crate) fn write_sysctls<K: AsRef<str>, V: AsRef<str>>(
    values: &[(K, V)],
) -> Result<(), LabNetError> {
    values.iter().try_for_each(|(key, value)| {
        midway_sys::sysctl::write(key.as_ref(), value.as_ref()).map_err(LabNetError::Sysctl)
    })
}

/// Reads a sysctl of the calling thread's network namespace.
pub(crate) fn read_sysctl(key: &str) -> Result<String, LabNetError> {
    midway_sys::sysctl::read(key).map_err(LabNetError::Sysctl)
}

/// Writes each namespace's sysctls and opens a netlink socket in it, all namespaces at once
/// (one thread each, which ends with its work); the sockets come back in the order of
/// `namespaces`, and stay in their namespace whichever thread uses them.
pub(crate) fn configure_namespaces(
    namespaces: Vec<(String, Vec<(String, String)>)>,
) -> Result<Vec<Netlink>, LabNetError> {
    let mut threads = Vec::new();
    for (netns, values) in namespaces {
        let path = netns_path(&netns);
        let thread = midway_sys::netns::spawn_in(&path, move || -> Result<Netlink, LabNetError> {
            write_sysctls(&values)?;
            Netlink::open().map_err(netlink_error(&netns))
        })
        .map_err(|source| LabNetError::EnterNamespace {
            path: path.clone(),
            source,
        });
        threads.push((path, thread));
    }
    // Every thread is joined, also after an error, so none outlives the set-up.
    let joined: Vec<Result<Netlink, LabNetError>> = threads
        .into_iter()
        .map(|(path, thread)| match thread?.join() {
            Ok(entered) => entered
                .map_err(|source| LabNetError::EnterNamespace { path, source })
                .and_then(|configured| configured),
            Err(panic) => std::panic::resume_unwind(panic),
        })
        .collect();
    joined.into_iter().collect()
}

/// Attaches the namespace's name to a netlink error.
pub(crate) fn netlink_error(netns: &str) -> impl FnOnce(NetlinkError) -> LabNetError + '_ {
    move |source| LabNetError::Netlink {
        netns: netns.to_owned(),
        source,
    }
}
