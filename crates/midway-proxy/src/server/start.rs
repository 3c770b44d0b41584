//! Start: from a configuration to a bound, ready [`Proxy`], in this order — the open-file limit
//! (raised, and `max_connections` checked against it), the socket memory guard, the BPF
//! congestion controls the profiles name, the cleanup of what a crashed midway left (nftables,
//! policy routing, route knobs), the route-metric knobs, the kernel check of every used profile, the relay's spool and pipes, every listener and the metrics endpoint,
//! the upgrade socket, generation 1, and last the nftables rules and policy routing. Whatever
//! was installed before an error is removed again.
//!
//! A take-over (`upgrade.rs`) runs the same steps with what the running midway handed over
//! ([`Inherited`]): its sockets instead of binding, its BPF links, and its install record,
//! adopted at the very end (until then an error must leave that midway's interception alone).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};

use midway_bpf::Registration;
use midway_relay::RelayResources;
use midway_tcp::RouteKnobs;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::congestion::register_congestion_controls;
use super::control::ControlSocket;
use super::descriptors;
use super::error::ProxyError;
use super::generation::Generation;
use super::handover::{Inherited, UpgradeSocket};
use super::listeners::BoundListener;
use super::memory::socket_memory_guard;
use super::profiles;
use super::shared::Shared;
use super::Proxy;
use crate::config::RuntimeConfig;
use crate::nft;

/// Whose interception the new proxy installs into.
enum Interception {
    /// A fresh start: the record is begun (and a crashed midway's leftovers removed) before
    /// anything is installed.
    Begun(nft::Installed),
    /// A take-over: the running midway's record, adopted once everything else is ready.
    TakingOver { from_pid: u32, record_dir: PathBuf },
}

/// Starts a proxy with `config`, or (with `inherited`) with what the running midway handed
/// over; see the module's comment for the steps.
pub(super) async fn start(
    config: RuntimeConfig,
    registry: &mut Registry,
    mut inherited: Option<&mut Inherited>,
) -> Result<Proxy, ProxyError> {
    descriptors::raise_and_check(&config)?;
    let socket_memory = socket_memory_guard(config.socket_memory)?;
    let used = profiles::referenced_profiles(&config);
    profiles::check_fast_open(&config)?;
    let mut congestion_controls = Vec::new();
    if let Some(inherited) = inherited.as_deref_mut() {
        let links = std::mem::take(&mut inherited.congestion_controls);
        congestion_controls.push(Registration::adopt(links));
    }
    // Names adopted above are already registered: `register` shares them.
    congestion_controls.extend(register_congestion_controls(&used, &config.profiles)?);
    let mut interception = match inherited.as_deref() {
        None => Interception::Begun(
            nft::Installed::begin(&config.spool_dir, None).map_err(ProxyError::Intercept)?,
        ),
        Some(inherited) => Interception::TakingOver {
            from_pid: inherited.from_pid,
            record_dir: inherited.record_dir.clone(),
        },
    };
    let mut profiles = config.profiles.clone();
    let route_knobs = profiles::install_route_knobs(&config, &used, &mut profiles)?;
    let knob_record = route_knobs.as_ref().map(RouteKnobs::installed);
    if let (Interception::Begun(intercept), Some(knobs)) = (&mut interception, &knob_record) {
        intercept
            .record_route_knobs(knobs.clone())
            .map_err(ProxyError::Intercept)?;
    }
    let profiles = profiles::share_checked(&used, profiles)?;
    let resources = relay_resources(&config, inherited.is_none())?;
    let shared = Arc::new(Shared::new(&config, resources, socket_memory));
    // A take-over keeps the old process's drained listeners drained from its first accept.
    for name in inherited.iter().flat_map(|i| &i.drained) {
        shared
            .registry
            .drain_flag(name)
            .store(true, Ordering::Relaxed);
    }

    let mut listeners = Vec::with_capacity(config.listeners.len());
    for listener in &config.listeners {
        listeners.push(BoundListener::bind(
            listener,
            &profiles,
            inherited.as_deref_mut(),
        )?);
    }
    let metrics_listener = bind_metrics(&config, inherited).await?;
    // A take-over opens its upgrade socket only once the old process has let go of it.
    let upgrade_socket = match &interception {
        Interception::Begun(_) => UpgradeSocket::open(&config.spool_dir, false),
        Interception::TakingOver { .. } => None,
    };
    // A take-over opens its control socket only once the old process has let go (as the
    // upgrade socket).
    let control_socket = match (&interception, &config.control) {
        (Interception::Begun(_), Some(control)) => ControlSocket::open(control, None)?,
        _ => None,
    };
    let generation = Generation::build(1, config, &profiles, &shared, None, Some(registry))?;
    // Metrics are registered twice: into the caller's registry (for its own use) and into
    // one this proxy serves; both hold clones of the same values.
    let mut served = Registry::default();
    shared.metrics.register(registry);
    shared.metrics.register(&mut served);
    // A start that fails from here on ends the process; the served registry is its own.
    generation.register_new_http_metrics(None, &mut served);

    let plan = nft::plan(&generation.config);
    for (name, script, manage) in &plan.tables {
        if !manage {
            tracing::info!(table = %name, "nftables.manage = false; install these rules yourself:\n{script}");
        }
    }
    let intercept = match interception {
        Interception::Begun(mut intercept) => {
            intercept.update(&plan).map_err(ProxyError::Intercept)?;
            intercept
        }
        // The record is where the old process kept it; this process keeps it there.
        Interception::TakingOver {
            from_pid,
            record_dir,
        } => {
            let mut adopted = nft::Installed::begin(&record_dir, Some(from_pid))
                .map_err(ProxyError::Intercept)?;
            let adopted_all = match knob_record {
                Some(knobs) => adopted.record_route_knobs(knobs),
                None => Ok(()),
            }
            .and_then(|()| adopted.update(&plan));
            if let Err(err) = adopted_all {
                // The running midway still owns it.
                adopted.disown();
                return Err(ProxyError::Intercept(err));
            }
            adopted
        }
    };
    shared.set_intercept_tables(intercept.tables());
    // Until here a transparent listener may be bound without its rules: connections are not
    // diverted yet. Tests and operators wait for this line.
    tracing::info!(
        listeners = listeners.len(),
        intercepting = !intercept.is_empty(),
        "ready: listeners bound, interception installed"
    );

    let (control, control_requests) = mpsc::channel(4);
    Ok(Proxy {
        shared,
        generation: Arc::new(generation),
        listeners,
        metrics_listener,
        served_registry: Arc::new(RwLock::new(served)),
        intercept,
        route_knobs,
        congestion_controls,
        control,
        control_requests,
        upgrade_socket,
        control_socket,
    })
}

/// Sets up the relay's spool and pipes. A fresh start first removes spool files an earlier run
/// left behind; a take-over must not (the old process still spools there).
fn relay_resources(config: &RuntimeConfig, clean: bool) -> Result<Arc<RelayResources>, ProxyError> {
    if clean {
        let removed = midway_relay::clean_spool_dir(&config.spool_dir).map_err(|source| {
            ProxyError::SpoolClean {
                dir: config.spool_dir.clone(),
                source,
            }
        })?;
        if removed > 0 {
            tracing::info!(removed, dir = %config.spool_dir.display(), "removed spool files left by an earlier run");
        }
    }
    RelayResources::new(
        config.spool_dir.clone(),
        config.spool_max_total_bytes,
        config.max_pipes,
    )
    .map_err(ProxyError::Relay)
}

/// Binds the `/metrics` endpoint, if configured (or takes the socket `inherited` offers).
async fn bind_metrics(
    config: &RuntimeConfig,
    inherited: Option<&mut Inherited>,
) -> Result<Option<(Arc<TcpListener>, SocketAddr)>, ProxyError> {
    let Some(addr) = config.metrics_listen else {
        return Ok(None);
    };
    let err = |source| ProxyError::MetricsBind { addr, source };
    let listener = match inherited.and_then(|inherited| inherited.take_metrics(addr)) {
        Some(fd) => {
            let std_listener = std::net::TcpListener::from(fd);
            std_listener.set_nonblocking(true).map_err(err)?;
            TcpListener::from_std(std_listener).map_err(err)?
        }
        None => TcpListener::bind(addr).await.map_err(err)?,
    };
    let local = listener.local_addr().map_err(err)?;
    tracing::info!(addr = %local, "metrics at http://{local}/metrics");
    Ok(Some((Arc::new(listener), local)))
}
