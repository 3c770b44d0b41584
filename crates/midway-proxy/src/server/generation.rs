//! A generation: what a connection reads from the configuration when it is accepted — the
//! configuration itself, the access list, each listener's profiles and HTTP engine, the peers
//! and their warm pools. The start builds the first one; each reload (SIGHUP) builds the next,
//! and accept loops pick up the newest at their next accept. A connection keeps the generation
//! it was accepted under to its end, so a reload never changes an established connection.
//!
//! What lives longer than a generation is in `shared.rs` (metrics, spool and pipes, the
//! memory guard, the limits' counters) and in the proxy (listening sockets, nftables, route
//! knobs, BPF registrations).

use std::collections::BTreeMap;
use std::sync::Arc;

use midway_http::{ConnectUpstream, HttpProxy, HttpProxyConfig};
use midway_tcp::TcpProfile;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use super::connect;
use super::error::ProxyError;
use super::intercept::init_listener_metrics;
use super::peering::Peering;
use super::pool::WarmPool;
use super::profiles::ListenerProfiles;
use super::shared::Shared;
use crate::access::AccessList;
use crate::config::{ListenerConfig, RuntimeConfig};

/// One generation of the configuration, shared by the connections accepted under it.
pub(super) struct Generation {
    /// 1 at start, one more per reload (in logs).
    pub(super) number: u64,
    pub(super) config: Arc<RuntimeConfig>,
    pub(super) access: AccessList,
    pub(super) peering: Peering,
    /// Each listener's part, by name.
    pub(super) listeners: BTreeMap<String, ListenerState>,
    /// Fired when a newer generation replaces this one: its warm pools stop and close their
    /// idle connections (connections taken from them are not affected).
    pub(super) retired: CancellationToken,
}

/// The HTTP engine of one listener.
#[derive(Clone)]
pub(super) struct HttpListener {
    pub(super) engine: Arc<HttpProxy>,
    /// Opens upstream sockets exactly like the remote segment of a split connection.
    pub(super) connect_upstream: ConnectUpstream,
}

/// One listener's part of a generation.
#[derive(Clone)]
pub(super) struct ListenerState {
    pub(super) config: Arc<ListenerConfig>,
    /// Its profiles, resolved with the generation.
    pub(super) profiles: Arc<ListenerProfiles>,
    /// Listeners that speak HTTP: the engine and the upstream connector it uses.
    pub(super) http: Option<HttpListener>,
}

impl Generation {
    /// Builds generation `number` of `config`, with `profiles` (marks filled in). An HTTP
    /// listener that `previous` has under the same name with the same `http` settings keeps
    /// its engine (its cache and upstream pool); the replay guard and the chains in flight
    /// carry over, so a reload neither reopens a replay window nor forgets a loop.
    pub(super) fn build(
        number: u64,
        config: RuntimeConfig,
        profiles: &BTreeMap<String, Arc<TcpProfile>>,
        shared: &Shared,
        previous: Option<&Generation>,
        mut caller: Option<&mut Registry>,
    ) -> Result<Generation, ProxyError> {
        let mut listeners = BTreeMap::new();
        for listener in &config.listeners {
            let listener_profiles = Arc::new(ListenerProfiles::resolve(listener, profiles)?);
            let kept = previous
                .and_then(|p| p.listeners.get(&listener.name))
                .filter(|old| old.config.http == listener.http)
                .and_then(|old| old.http.clone());
            let http = match (kept, &listener.http) {
                (_, None) => None,
                (Some(kept), Some(_)) => Some(HttpListener {
                    // The engine stays; its upstream sockets follow the new remote profile.
                    connect_upstream: connect::upstream_connector(
                        listener_profiles.remote().clone(),
                        config.connect_timeout,
                        Arc::new(config.denied_destinations.clone()),
                        shared.socket_memory.clone(),
                    ),
                    engine: kept.engine,
                }),
                (None, Some(http_config)) => {
                    if previous.is_some_and(|p| p.listeners.contains_key(&listener.name)) {
                        return Err(ProxyError::ReloadRefused {
                            reason: format!(
                                "listener {}: its `http` settings changed (the engine and its cache are kept for the process's life; restart or upgrade to change them)",
                                listener.name
                            ),
                        });
                    }
                    Some(http_listener(
                        listener,
                        http_config,
                        &config,
                        &listener_profiles,
                        shared,
                        caller.as_deref_mut(),
                    )?)
                }
            };
            init_listener_metrics(&shared.metrics, listener);
            listeners.insert(
                listener.name.clone(),
                ListenerState {
                    config: Arc::new(listener.clone()),
                    profiles: listener_profiles,
                    http,
                },
            );
        }
        let mut pools = Vec::with_capacity(config.peers.len());
        for peer in &config.peers {
            shared.metrics.init_peer(&peer.name);
            let profile =
                profiles
                    .get(&peer.profile)
                    .cloned()
                    .ok_or_else(|| ProxyError::UnknownProfile {
                        listener: format!("peer {}", peer.name),
                        profile: peer.profile.clone(),
                    })?;
            pools.push(Arc::new(WarmPool::new(
                peer.clone(),
                profile,
                config.connect_timeout,
                shared.metrics.clone(),
            )));
        }
        let peering = Peering::new(&config, pools, previous.map(|p| &p.peering));
        Ok(Generation {
            number,
            access: AccessList::new(config.allowed_clients.clone()),
            config: Arc::new(config),
            peering,
            listeners,
            retired: CancellationToken::new(),
        })
    }

    /// Registers the metrics of the HTTP engines this generation created (not those it kept
    /// from `previous`) into `served`, the registry `/metrics` serves. Called once the
    /// generation is in use: a start or reload that fails after building it leaves the served
    /// registry as it was, so retrying it does not register an engine twice.
    pub(super) fn register_new_http_metrics(
        &self,
        previous: Option<&Generation>,
        served: &mut Registry,
    ) {
        for (name, listener) in &self.listeners {
            let Some(http) = &listener.http else { continue };
            let kept =
                previous.is_some_and(|p| p.http_engines().any(|e| Arc::ptr_eq(e, &http.engine)));
            if !kept {
                http.engine.metrics().register(
                    served
                        .sub_registry_with_prefix("midway")
                        .sub_registry_with_label(listener_label(name)),
                );
            }
        }
    }

    /// The HTTP engines this generation created or kept.
    pub(super) fn http_engines(&self) -> impl Iterator<Item = &Arc<HttpProxy>> + '_ {
        self.listeners
            .values()
            .filter_map(|l| l.http.as_ref().map(|h| &h.engine))
    }
}

/// The `listener` label of a listener's metrics.
fn listener_label(
    name: &str,
) -> (
    std::borrow::Cow<'static, str>,
    std::borrow::Cow<'static, str>,
) {
    (
        std::borrow::Cow::Borrowed("listener"),
        std::borrow::Cow::Owned(name.to_string()),
    )
}

/// A new HTTP engine for `listener`. At start its metrics go into the caller's registry too;
/// the served registry gets them once the generation is in use
/// ([`Generation::register_new_http_metrics`]).
fn http_listener(
    listener: &ListenerConfig,
    http_config: &HttpProxyConfig,
    config: &RuntimeConfig,
    profiles: &ListenerProfiles,
    shared: &Shared,
    caller: Option<&mut Registry>,
) -> Result<HttpListener, ProxyError> {
    let mut own = Registry::default();
    let engine = HttpProxy::new(
        http_config.clone(),
        // CONNECT tunnels relay with the proxy's own pipes and limits.
        shared.resources.clone(),
        match caller {
            Some(registry) => registry,
            None => &mut own,
        }
        .sub_registry_with_prefix("midway")
        .sub_registry_with_label(listener_label(&listener.name)),
    )
    .map_err(|source| ProxyError::Http {
        listener: listener.name.clone(),
        source,
    })?;
    Ok(HttpListener {
        engine,
        connect_upstream: connect::upstream_connector(
            profiles.remote().clone(),
            config.connect_timeout,
            Arc::new(config.denied_destinations.clone()),
            shared.socket_memory.clone(),
        ),
    })
}
