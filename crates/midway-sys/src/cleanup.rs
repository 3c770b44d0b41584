//! What this process must remove if a signal stops it: the network namespaces it made and the
//! process groups it started in them. Builders register each before it exists and unregister it
//! once they removed it themselves; a signal-handling thread takes everything at once with
//! [`take_for_shutdown`], after which nothing new may be registered, so a namespace is either
//! seen by the cleanup or never made.
//!
//! The lab's topologies (midway-labnet) and through them the benchmark use it; the decisions of
//! what to do on a signal (messages, exit codes, pid files) stay with them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterError {
    /// The cleanup has started: the process is exiting and must not make anything new.
    ShuttingDown,
    /// Another live registration of this process has the same key.
    KeyInUse,
}

/// A set of namespaces registered together under a key (the lab's topology tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The key given at registration.
    pub key: String,
    /// Names of the namespaces (as `ip netns` names them).
    pub namespaces: Vec<String>,
}

#[derive(Default)]
struct Registry {
    namespaces: BTreeMap<u64, Registered>,
    process_groups: BTreeMap<i32, ()>,
    next_id: u64,
}

/// Set once the cleanup has started; checked under the registry's lock.
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

fn registry() -> MutexGuard<'static, Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    // Every change is a single insert or remove, so a panic while the lock was held leaves the
    // data consistent: take it anyway.
    REGISTRY
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Registers namespaces about to be made, under a key no other live registration has; returns
/// the id to unregister them with.
pub fn register_namespaces(key: &str, namespaces: Vec<String>) -> Result<u64, RegisterError> {
    let mut registry = registry();
    if SHUTTING_DOWN.load(Ordering::SeqCst) {
        return Err(RegisterError::ShuttingDown);
    }
    if registry.namespaces.values().any(|r| r.key == key) {
        return Err(RegisterError::KeyInUse);
    }
    registry.next_id += 1;
    let id = registry.next_id;
    registry.namespaces.insert(
        id,
        Registered {
            key: key.to_owned(),
            namespaces,
        },
    );
    Ok(id)
}

/// Forgets namespaces the caller removed itself.
pub fn unregister_namespaces(id: u64) {
    registry().namespaces.remove(&id);
}

/// The keys of every live registration.
pub fn live_keys() -> Vec<String> {
    registry()
        .namespaces
        .values()
        .map(|r| r.key.clone())
        .collect()
}

/// Registers a process group (a child started in its own group) to be killed on shutdown.
pub fn register_process_group(pgid: i32) {
    registry().process_groups.insert(pgid, ());
}

/// Forgets a process group that has ended.
pub fn unregister_process_group(pgid: i32) {
    registry().process_groups.remove(&pgid);
}

/// Starts the shutdown: from now on every registration is refused, and everything registered
/// is handed over, to be removed by the caller (process groups first, then namespaces).
pub fn take_for_shutdown() -> (Vec<Registered>, Vec<i32>) {
    let mut registry = registry();
    SHUTTING_DOWN.store(true, Ordering::SeqCst);
    let namespaces = std::mem::take(&mut registry.namespaces)
        .into_values()
        .collect();
    let groups = std::mem::take(&mut registry.process_groups)
        .into_keys()
        .collect();
    (namespaces, groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test, since the registry is process-wide and shutdown cannot be undone.
    #[test]
    fn keys_are_unique_and_shutdown_takes_everything_and_refuses_more() {
        let id = register_namespaces("a", vec!["mwa-x".into()]).unwrap();
        assert_eq!(
            register_namespaces("a", vec![]),
            Err(RegisterError::KeyInUse)
        );
        unregister_namespaces(id);
        register_namespaces("a", vec!["mwa-y".into()]).unwrap();
        register_process_group(42);
        register_process_group(43);
        unregister_process_group(43);
        let (namespaces, groups) = take_for_shutdown();
        assert_eq!(
            namespaces,
            vec![Registered {
                key: "a".into(),
                namespaces: vec!["mwa-y".into()]
            }]
        );
        assert_eq!(groups, vec![42]);
        assert_eq!(
            register_namespaces("b", vec![]),
            Err(RegisterError::ShuttingDown)
        );
    }
}
