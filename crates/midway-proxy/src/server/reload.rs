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
//!
//! The steps ([`reload`]): the checks (settings only a restart applies, route knobs, room in the
//! open-file limit for `max_connections`), the BPF congestion controls and the kernel check of
//! the new profiles, the listeners (kept ones get the new profile, new or moved ones are bound),
//! the next generation, the nftables rules; from there on nothing fails: the switch (served
//! metrics, limits, new HTTP engines' maintenance, removed listeners stopped, the generation
//! published, added listeners started, the old generation's warm pools retired and the new ones
//! started).

use std::collections::BTreeMap;
use std::sync::Arc;

use midway_tcp::{RouteKnobs, TcpProfile};

use super::congestion::register_congestion_controls;
use super::descriptors;
use super::error::{ErrorChain, ProxyError};
use super::generation::Generation;
use super::listeners::BoundListener;
use super::profiles;
use super::serving::Serving;
use super::Proxy;
use crate::config::RuntimeConfig;
use crate::nft;

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

/// Applies `config` to the running `proxy` as its next generation, and logs the outcome.
/// Nothing changes unless all of it can be applied: new listeners are bound first, then the
/// nftables rules are brought to the new plan, then the generation is switched and removed
/// listeners stop.
pub(super) fn reload(
    proxy: &mut Proxy,
    serving: &mut Serving,
    config: RuntimeConfig,
) -> Result<ReloadSummary, ProxyError> {
    let result = apply(proxy, serving, config);
    match &result {
        Ok(summary) => tracing::info!(
            generation = summary.generation,
            added = ?summary.added,
            removed = ?summary.removed,
            kept = summary.kept.len(),
            "reloaded: new connections use the new configuration, open ones keep theirs"
        ),
        Err(err) => {
            tracing::error!(error = %ErrorChain(err), "reload refused; the running configuration stays")
        }
    }
    result
}

fn apply(
    proxy: &mut Proxy,
    serving: &mut Serving,
    config: RuntimeConfig,
) -> Result<ReloadSummary, ProxyError> {
    let old = proxy.generation.clone();
    let refuse = |reason: String| ProxyError::ReloadRefused { reason };
    let changed = restart_only_changes(&old.config, &config);
    if !changed.is_empty() {
        return Err(refuse(format!(
            "{} changed; only a restart or a binary upgrade (`midway proxy --take-over`) applies {}",
            changed.join(", "),
            if changed.len() == 1 { "it" } else { "them" }
        )));
    }
    if !route_knobs_unchanged(proxy.route_knobs.as_ref(), &config, &config.profiles) {
        return Err(refuse(
            "the profiles with route-metric knobs (initial_cwnd, delayed_ack, rto_min_ms above 200, dupack_threshold) changed; a restart applies them".into(),
        ));
    }
    descriptors::check_current(&config)?;
    let used = profiles::referenced_profiles(&config);
    profiles::check_fast_open(&config)?;
    if let Some(registration) = register_congestion_controls(&used, &config.profiles)? {
        proxy.congestion_controls.push(registration);
    }
    // The route knobs stay as installed at start (checked above): their marks go on the new
    // profiles.
    let mut profiles = config.profiles.clone();
    if let Some(knobs) = &proxy.route_knobs {
        knobs.set_marks(profiles.values_mut());
    }
    let profiles = profiles::share_checked(&used, profiles)?;

    // Listeners: kept (same name, same socket identity), added, removed.
    let mut added = Vec::new();
    let mut kept = Vec::new();
    for listener in &config.listeners {
        if serving.listeners.keep(listener, &profiles)? {
            kept.push(listener.name.clone());
        } else {
            // New, or moved to another address: bound now; on a later error, dropping `added`
            // closes it again.
            added.push(BoundListener::bind(listener, &profiles, None)?);
        }
    }
    let generation = Generation::build(
        old.number + 1,
        config,
        &profiles,
        &proxy.shared,
        Some(&old),
        None,
    )?;

    let plan = nft::plan(&generation.config);
    // `nft` and `ip` run for a few milliseconds, like at a start.
    proxy
        .intercept
        .update(&plan)
        .map_err(ProxyError::Intercept)?;
    proxy.shared.set_intercept_tables(proxy.intercept.tables());

    // From here on nothing fails: switch. The new HTTP engines' metrics are served from now on
    // (a reload refused above registered nothing, so a retry cannot double them).
    generation.register_new_http_metrics(
        Some(&old),
        &mut proxy
            .served_registry
            .write()
            .unwrap_or_else(|p| p.into_inner()),
    );
    proxy.shared.set_limits(
        generation.config.max_connections,
        generation.config.max_connections_per_client,
    );
    let generation = Arc::new(generation);
    for engine in generation.http_engines() {
        if !old.http_engines().any(|e| Arc::ptr_eq(e, engine)) {
            serving.maintain_http_pool(engine);
        }
    }
    let removed: Vec<String> = serving
        .listeners
        .names()
        .filter(|name| !kept.contains(name))
        .cloned()
        .collect();
    for name in &removed {
        serving.listeners.stop(name);
    }
    let added_names: Vec<String> = added.iter().map(|b| b.name.clone()).collect();
    proxy.generation = generation.clone();
    serving.generations.send_replace(generation.clone());
    for bound in added {
        serving.listeners.start(bound);
    }
    old.retired.cancel();
    serving.start_pools(&generation);
    Ok(ReloadSummary {
        generation: generation.number,
        added: added_names,
        removed,
        kept,
    })
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
    check("access_links", old.access_links != new.access_links);
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
    check("control.socket", old.control != new.control);
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
