//! Reload (SIGHUP): the configuration file is read again and applied without touching an
//! established connection. Listeners added are bound, listeners removed stop accepting (their
//! open connections go on), listeners kept keep their socket and accept queue; profiles,
//! limits, access lists, peers and keys apply to connections accepted from then on; the
//! nftables rules follow the transparent listeners. A configuration that cannot be applied is
//! refused as a whole, with the reason logged, and the running one stays.
//!
//! Settings that belong to the process are not reloaded: changing one refuses the reload and
//! names it (a restart or a binary upgrade, `--take-over`, applies them) — see
//! [`restart_only_changes`].

use std::collections::BTreeMap;
use std::sync::Arc;

use midway_tcp::{RouteKnobs, TcpProfile};

use super::profiles;
use crate::config::RuntimeConfig;

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadSummary {
    /// The new generation's number (1 is the configuration the proxy started with).
    pub generation: u64,
    /// Listeners bound by this reload.
    pub added: Vec<String>,
    /// Listeners that stopped accepting.
    pub removed: Vec<String>,
    /// Listeners whose socket was kept.
    pub kept: Vec<String>,
}

/// The settings of `new` that differ from `old` and only a restart (or an upgrade) applies.
pub(super) fn restart_only_changes(old: &RuntimeConfig, new: &RuntimeConfig) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let mut check = |name: &'static str, differs: bool| {
        if differs {
            changed.push(name);
        }
    };
    check(
        "proxy.worker_threads",
        old.worker_threads != new.worker_threads,
    );
    check(
        "proxy.socket_memory",
        old.socket_memory != new.socket_memory,
    );
    check("proxy.max_pipes", old.max_pipes != new.max_pipes);
    check(
        "proxy.route_knobs_table_base",
        old.route_knobs_table_base != new.route_knobs_table_base,
    );
    check(
        "proxy.route_knobs_mark_base",
        old.route_knobs_mark_base != new.route_knobs_mark_base,
    );
    check(
        "proxy.peer_header_window",
        old.peer_header_window != new.peer_header_window,
    );
    check("metrics.listen", old.metrics_listen != new.metrics_listen);
    check("spool.dir", old.spool_dir != new.spool_dir);
    check(
        "spool.max_total_bytes",
        old.spool_max_total_bytes != new.spool_max_total_bytes,
    );
    changed
}

/// Whether the route-knob tables installed at start (`installed`) are exactly what the used
/// profiles of a new configuration need. They are copies of the main routing table taken at
/// install time, selected by marks on live sockets: a reload keeps them only unchanged.
pub(super) fn route_knobs_unchanged(
    installed: Option<&RouteKnobs>,
    config: &RuntimeConfig,
    profiles: &BTreeMap<String, TcpProfile>,
) -> bool {
    let used = profiles::referenced_profiles(config);
    let candidates: Vec<&TcpProfile> = used.iter().filter_map(|n| profiles.get(n)).collect();
    match installed {
        Some(knobs) => knobs.serves_exactly(&candidates),
        None => !candidates.iter().any(|p| p.needs_route_knobs()),
    }
}

/// The profiles of `config` as the proxy shares them: marks of the installed route knobs filled
/// in, each behind an `Arc`.
pub(super) fn shared_profiles(
    config: &RuntimeConfig,
    knobs: Option<&RouteKnobs>,
) -> BTreeMap<String, Arc<TcpProfile>> {
    let mut profiles = config.profiles.clone();
    if let Some(knobs) = knobs {
        knobs.set_marks(profiles.values_mut());
    }
    profiles
        .into_iter()
        .map(|(name, profile)| (name, Arc::new(profile)))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::config::parse_config;

    const BASE: &str = r#"
[proxy]
allowed_clients = ["127.0.0.0/8"]
[[listeners]]
name = "fwd"
mode = "forward"
listen = "127.0.0.1:0"
target = "127.0.0.1:9"
"#;

    fn config(text: &str) -> RuntimeConfig {
        parse_config(text, "test").unwrap()
    }

    #[test]
    fn limits_and_listeners_are_reloadable() {
        let old = config(BASE);
        let mut new = old.clone();
        new.max_connections = 7;
        new.max_connections_per_client = 3;
        new.idle_timeout = Duration::from_secs(9);
        new.allowed_clients = vec!["10.0.0.0/8".parse().unwrap()];
        new.listeners.clear();
        assert!(restart_only_changes(&old, &new).is_empty());
    }

    #[test]
    fn process_settings_are_named() {
        let old = config(BASE);
        let mut new = old.clone();
        new.spool_dir = PathBuf::from("/elsewhere");
        new.max_pipes += 1;
        new.metrics_listen = Some("127.0.0.1:9100".parse().unwrap());
        assert_eq!(
            restart_only_changes(&old, &new),
            ["proxy.max_pipes", "metrics.listen", "spool.dir"]
        );
    }

    #[test]
    fn no_route_knobs_stay_unchanged_only_without_route_knob_profiles() {
        let plain = config(BASE);
        assert!(route_knobs_unchanged(None, &plain, &plain.profiles));
        let with_initcwnd = config(&format!(
            "{BASE}local_profile = \"big\"\n[profiles.big]\ninitial_cwnd = 40\n"
        ));
        assert!(!route_knobs_unchanged(
            None,
            &with_initcwnd,
            &with_initcwnd.profiles
        ));
    }
}
