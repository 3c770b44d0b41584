//! midway's own BPF congestion controls (`highspeed`, `gentle-highspeed`; see `midway-bpf`):
//! when a used profile names one, it is registered with the kernel at start, before any
//! listener is bound or any profile is checked, and held for the life of the [`super::Proxy`].
//! Dropping the proxy (or the process exiting) unregisters it again; a name another midway on
//! the same kernel registered already is shared (registration is kernel-wide, network
//! namespaces are not).

use std::collections::{BTreeMap, BTreeSet};

use midway_bpf::{Algorithm, Registration};
use midway_tcp::{KnobError, TcpProfile};

use super::error::ProxyError;

/// Registers every BPF congestion control the profiles named in `used` ask for; `None` when
/// none does. The error names the first profile asking for the algorithm that failed and its
/// `congestion_control` knob.
pub(super) fn register_congestion_controls(
    used: &BTreeSet<String>,
    profiles: &BTreeMap<String, TcpProfile>,
) -> Result<Option<Registration>, ProxyError> {
    // Each algorithm with the first profile (in name order) that asks for it.
    let mut wanted: Vec<(Algorithm, &TcpProfile)> = Vec::new();
    for profile in used.iter().filter_map(|name| profiles.get(name)) {
        if let Some(algorithm) = profile.bpf_congestion_control() {
            if !wanted.iter().any(|(seen, _)| *seen == algorithm) {
                wanted.push((algorithm, profile));
            }
        }
    }
    if wanted.is_empty() {
        return Ok(None);
    }
    let algorithms: Vec<Algorithm> = wanted.iter().map(|(algorithm, _)| *algorithm).collect();
    match midway_bpf::register(&algorithms) {
        Ok(registration) => {
            for (algorithm, ownership) in registration.algorithms() {
                tracing::info!(
                    congestion_control = algorithm.profile_name(),
                    kernel_name = algorithm.kernel_name(),
                    "BPF congestion control {ownership}"
                );
            }
            Ok(Some(registration))
        }
        Err(source) => {
            let algorithm = source.algorithm();
            let profile = wanted
                .iter()
                .find(|(wanted, _)| *wanted == algorithm)
                .map_or_else(|| wanted[0].1, |(_, profile)| *profile);
            Err(ProxyError::ProfileUnsupported {
                profile: profile.name.clone(),
                source: Box::new(KnobError::BpfCongestionControl {
                    profile: profile.name.clone(),
                    name: profile.congestion_control.clone().unwrap_or_default(),
                    kernel_name: algorithm.kernel_name(),
                    source,
                }),
            })
        }
    }
}
