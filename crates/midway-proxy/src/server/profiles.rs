//! The TCP profiles the listeners use: which ones, whether this kernel honours them, the
//! route-metric knobs some of them need, and each listener's profiles resolved once at start,
//! so that choosing a connection's profiles is a prefix match, never a lookup by name.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use midway_tcp::{FastOpenSide, RouteKnobs, TcpProfile};

use super::error::ProxyError;
use crate::config::{most_specific, ListenerConfig, RuntimeConfig};

/// A client override, resolved: clients in the prefix get these profiles where set.
type ResolvedOverride = (IpNet, Option<Arc<TcpProfile>>, Option<Arc<TcpProfile>>);

/// One listener's profiles, resolved at start with their route marks.
#[derive(Debug)]
pub(super) struct ListenerProfiles {
    local: Arc<TcpProfile>,
    remote: Arc<TcpProfile>,
    /// The client overrides, in the listener's order (longest prefix first).
    overrides: Vec<ResolvedOverride>,
}

impl ListenerProfiles {
    /// Resolves `listener`'s profile names in `profiles` (the proxy's copy, marks filled in).
    /// Validation has checked every name; a missing one is still an error here, not a panic.
    pub(super) fn resolve(
        listener: &ListenerConfig,
        profiles: &BTreeMap<String, Arc<TcpProfile>>,
    ) -> Result<ListenerProfiles, ProxyError> {
        let find = |name: &str| {
            profiles
                .get(name)
                .cloned()
                .ok_or_else(|| ProxyError::UnknownProfile {
                    listener: listener.name.clone(),
                    profile: name.to_owned(),
                })
        };
        let overrides = listener
            .client_profiles
            .iter()
            .map(|o| {
                Ok((
                    o.prefix,
                    o.local_profile.as_deref().map(find).transpose()?,
                    o.remote_profile.as_deref().map(find).transpose()?,
                ))
            })
            .collect::<Result<_, ProxyError>>()?;
        Ok(ListenerProfiles {
            local: find(&listener.local_profile)?,
            remote: find(&listener.remote_profile)?,
            overrides,
        })
    }

    /// The (local, remote) profiles of a connection from `client`.
    pub(super) fn for_client(&self, client: IpAddr) -> (&TcpProfile, &TcpProfile) {
        let (local, remote) = most_specific(
            client,
            self.overrides
                .iter()
                .map(|(prefix, local, remote)| (prefix, local.as_ref(), remote.as_ref())),
            (&self.local, &self.remote),
        );
        (local, remote)
    }

    /// The profile of the remote segment for clients without an override (the HTTP engine's
    /// upstream sockets, which clients share).
    pub(super) fn remote(&self) -> &TcpProfile {
        &self.remote
    }
}

/// Every profile name a listener (or a client override) or a peer refers to.
pub(super) fn referenced_profiles(config: &RuntimeConfig) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for l in &config.listeners {
        names.insert(l.local_profile.clone());
        names.insert(l.remote_profile.clone());
        for o in &l.client_profiles {
            names.extend(o.local_profile.iter().cloned());
            names.extend(o.remote_profile.iter().cloned());
        }
    }
    names.extend(config.peers.iter().map(|p| p.profile.clone()));
    names
}

/// Checks that `profiles` can honour every one of `names` on the running kernel.
fn check_profiles_supported<'a>(
    names: impl IntoIterator<Item = &'a String>,
    profiles: &BTreeMap<String, TcpProfile>,
) -> Result<(), ProxyError> {
    for name in names {
        if let Some(profile) = profiles.get(name) {
            profile
                .check_supported()
                .map_err(|source| ProxyError::ProfileUnsupported {
                    profile: name.clone(),
                    source: Box::new(source),
                })?;
        }
    }
    Ok(())
}

/// Each profile with `fast_open` and the side it is used on: listeners' local profiles
/// accept, remote segments' and peers' profiles connect.
fn fast_open_uses(config: &RuntimeConfig) -> BTreeSet<(String, FastOpenSide)> {
    let mut uses = BTreeSet::new();
    let mut add = |name: &String, side| {
        if config
            .profiles
            .get(name)
            .is_some_and(|p| p.fast_open == Some(true))
        {
            uses.insert((name.clone(), side));
        }
    };
    for l in &config.listeners {
        add(&l.local_profile, FastOpenSide::Accepting);
        add(&l.remote_profile, FastOpenSide::Connecting);
        for o in &l.client_profiles {
            o.local_profile
                .iter()
                .for_each(|n| add(n, FastOpenSide::Accepting));
            o.remote_profile
                .iter()
                .for_each(|n| add(n, FastOpenSide::Connecting));
        }
    }
    for p in &config.peers {
        add(&p.profile, FastOpenSide::Connecting);
    }
    uses
}

/// Checks that this namespace's `net.ipv4.tcp_fastopen` lets the kernel honour `fast_open`
/// where the config uses it (midway never writes the sysctl: it is the host's, or the
/// namespace's owner's, to set).
pub(super) fn check_fast_open(config: &RuntimeConfig) -> Result<(), ProxyError> {
    for (name, side) in fast_open_uses(config) {
        if let Some(profile) = config.profiles.get(&name) {
            profile
                .check_fast_open(side)
                .map_err(|source| ProxyError::ProfileUnsupported {
                    profile: name.clone(),
                    source: Box::new(source),
                })?;
        }
    }
    Ok(())
}

/// Checks that the running kernel can honour every profile a listener uses, and that the
/// open-file limit has room for `max_connections` (for `midway check-config`; [`super::Proxy::bind`] does the same after installing route knobs).
pub fn check_kernel_support(config: &RuntimeConfig) -> Result<(), ProxyError> {
    super::descriptors::raise_and_check(config)?;
    check_fast_open(config)?;
    let used = referenced_profiles(config);
    // midway's BPF congestion controls are registered for the check, and unregistered after it.
    let _registered = super::congestion::register_congestion_controls(&used, &config.profiles)?;
    check_profiles_supported(&used, &config.profiles)
}

/// The used profiles `RouteKnobs::install` must see: those with route-only knobs, and those with
/// an RTO floor even when the floor is a socket option — `install` gives them a table too when
/// the host's routes lock `rto_min` (a locked route floor overrides the socket's, so the option
/// alone would silently do nothing there), and leaves them out otherwise.
fn route_knob_candidates<'a>(
    used: &BTreeSet<String>,
    profiles: &'a BTreeMap<String, TcpProfile>,
) -> Vec<&'a TcpProfile> {
    used.iter()
        .filter_map(|n| profiles.get(n))
        .filter(|p| p.needs_route_knobs() || p.rto_min_ms.is_some())
        .collect()
}

/// Installs route-metric knobs for the used profiles that need them and fills in their marks;
/// `None` when no profile needs any.
pub(super) fn install_route_knobs(
    config: &RuntimeConfig,
    used: &BTreeSet<String>,
    profiles: &mut BTreeMap<String, TcpProfile>,
) -> Result<Option<RouteKnobs>, ProxyError> {
    let needing_knobs = route_knob_candidates(used, profiles);
    if needing_knobs.is_empty() {
        return Ok(None);
    }
    let knobs = RouteKnobs::install(
        &needing_knobs,
        config.route_knobs_table_base,
        config.route_knobs_mark_base,
    )
    .map_err(|source| ProxyError::RouteKnobs {
        table_base: config.route_knobs_table_base,
        mark_base: config.route_knobs_mark_base,
        source,
    })?;
    knobs.set_marks(profiles.values_mut());
    Ok(Some(knobs))
}

/// `profiles` (route marks filled in) as the proxy shares them, each behind an `Arc`, once the
/// running kernel is found to honour every one of `used`.
pub(super) fn share_checked(
    used: &BTreeSet<String>,
    profiles: BTreeMap<String, TcpProfile>,
) -> Result<BTreeMap<String, Arc<TcpProfile>>, ProxyError> {
    check_profiles_supported(used, &profiles)?;
    Ok(profiles
        .into_iter()
        .map(|(name, profile)| (name, Arc::new(profile)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_with_only_an_rto_floor_reach_route_knobs() {
        let mut timer_only = TcpProfile::kernel_default("timer-200ms");
        timer_only.rto_min_ms = Some(200);
        assert!(!timer_only.needs_route_knobs(), "a socket-option floor");
        let mut dupack = TcpProfile::kernel_default("dupack-1");
        dupack.dupack_threshold = Some(1);
        let plain = TcpProfile::kernel_default("plain");
        let unused = {
            let mut p = TcpProfile::kernel_default("unused");
            p.rto_min_ms = Some(40);
            p
        };
        let profiles: BTreeMap<String, TcpProfile> = [timer_only, dupack, plain, unused]
            .into_iter()
            .map(|p| (p.name.clone(), p))
            .collect();
        let used: BTreeSet<String> = ["timer-200ms", "dupack-1", "plain"]
            .into_iter()
            .map(String::from)
            .collect();
        let names: Vec<&str> = route_knob_candidates(&used, &profiles)
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["dupack-1", "timer-200ms"]);
    }
}
