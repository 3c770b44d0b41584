//! Route-metric knobs: what Linux offers only per destination.
//!
//! | profile knob | route metric | read by the kernel |
//! |---|---|---|
//! | `initial_cwnd` | `initcwnd N` | `tcp_init_cwnd()` from the socket's route, every connection |
//! | `delayed_ack = false` | `quickack 1` | `tcp_init_transfer()` sets `dst_quick_ack`, every connection |
//! | `rto_min_ms` > 200 | `rto_min T`, locked | `tcp_rto_min()`, only when the metric is locked |
//! | `dupack_threshold` | `reordering lock N` | **only through the tcp_metrics cache**, see below |
//!
//! Selection per socket: each profile that needs any of these gets a routing table of its own
//! (`base_table + i`) holding a copy of the main table's routes (IPv4 and IPv6) with the metrics
//! added, and a policy rule `fwmark M lookup T` (`M = base_mark + i`, priority
//! [`RULE_PRIORITY`]). The profile's sockets carry `SO_MARK = M` ([`crate::TcpProfile::route_mark`]).
//! Accepted sockets work too: a request socket takes the listener's `sk_mark` (with
//! `tcp_fwmark_accept = 0`, the default, and also with 1 because the listener's mark is
//! non-zero), the SYN-ACK and the child socket route with it, so the child gets the metrics.
//!
//! `dupack_threshold` caveat: `tcp_init_metrics()` copies `reordering` from the tcp_metrics
//! entry of the peer address, and such an entry is created (from the route's metrics) only when
//! an earlier connection to that address closes. The first connection to each destination keeps
//! `net.ipv4.tcp_reordering`; later ones get the profile's value, until `ip tcp_metrics flush`
//! or the entry's expiry (one hour); nothing applies with `tcp_no_metrics_save = 1`
//! ([`crate::TcpProfile::check_supported`] refuses that and warns about the rest). The cache is
//! keyed by address pair, not by mark: once an entry exists, connections of *other* profiles to
//! that peer get the value too, and an entry first created by an unmarked connection carries no
//! `reordering` at all. So `dupack_threshold` is a per-destination hint, not a per-connection
//! control; the tests pin exactly this behaviour.
//!
//! Namespaces: [`RouteKnobs`] keeps the netlink socket it installed with, opened in the network
//! namespace of the installing thread; a netlink socket stays in the namespace it was opened in,
//! so the rules and tables are removed there, whichever thread drops it.
//!
//! Limits: the copy is taken at install time (later changes to the main table are not followed);
//! destinations in the `local` table (addresses of this host, loopback) are looked up before any
//! policy rule and never get the metrics; multipath routes are not copied (warned). Routes that
//! differ only by device (every IPv6 interface has its own `fe80::/64`) are all copied, with
//! `append`, so link-local peers get the metrics too.
//!
//! Mechanism: rtnetlink through [`midway_sys::netlink`] (no iproute2 needed): each route of
//! `main` is read with its metrics and their locks as the kernel keeps them, and written back
//! into the profile's table with the profile's metrics laid over its own. The result reads back
//! with `ip route show table T` as an operator would check it; this runs only at start and stop.

use midway_sys::netlink::{
    Family, FwmarkRule, Metric, Netlink, NetlinkError, Route, RouteMetric, RouteMetrics, TABLE_MAIN,
};
use serde::{Deserialize, Serialize};

use crate::TcpProfile;

/// Priority of midway's policy rules: after `local` (0), before `main` (32766).
pub(crate) const RULE_PRIORITY: u32 = 1000;

/// Route-knob installation failed; nothing outside midway's own tables and rules was changed.
#[derive(Debug, thiserror::Error)]
pub enum RouteKnobsError {
    /// A netlink request (listing or changing routes and rules) failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// A routing table midway would use already has routes.
    #[error(
        "routing table {table} (for profile {profile:?}) is not empty; pick another base table"
    )]
    TableInUse {
        /// Number of the routing table.
        table: u32,
        /// Profile the table was meant for.
        profile: String,
    },
    /// A policy rule midway would add clashes with one already there.
    #[error("a policy rule already uses fwmark {mark:#x} or table {table}; pick another base mark / table")]
    RuleInUse {
        /// The fwmark midway would match.
        mark: u32,
        /// The routing table midway would select.
        table: u32,
    },
    /// The base mark or table plus the number of profiles does not fit in 32 bits.
    #[error("base mark {base_mark:#x} / base table {base_table} + {count} profiles overflows")]
    Overflow {
        /// First fwmark (`route_knobs_mark_base`).
        base_mark: u32,
        /// First routing table (`route_knobs_table_base`).
        base_table: u32,
        /// Profiles that need a table.
        count: usize,
    },
    /// The base table is one the kernel reserves (0, 253, 254, 255).
    #[error("base table {0} is reserved (0, 253-255 are the kernel's)")]
    ReservedTable(u32),
}

/// One profile's installed table and rule, as a crash-recovery record keeps them: a later start
/// removes them with [`RouteKnobs::remove_leftovers`] when the process that installed them died.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstalledKnob {
    /// The fwmark its rule matches.
    pub mark: u32,
    /// Its routing table.
    pub table: u32,
    /// Address families ("-4", "-6") it was installed for.
    pub families: Vec<String>,
}

/// Installed tables and rules; removed by [`RouteKnobs::remove`] or on drop.
#[derive(Debug)]
pub struct RouteKnobs {
    entries: Vec<Entry>,
    removed: bool,
    /// Opened in the installing thread's network namespace, where it stays.
    netlink: Netlink,
}

#[derive(Debug, Clone)]
struct Entry {
    profile: String,
    mark: u32,
    table: u32,
    /// Address families for which a rule and a table were installed.
    families: Vec<Family>,
    /// The route metrics its table carries ([`profile_metrics`]).
    metrics: RouteMetrics,
}

/// How a crash-recovery record names a family (the `ip -4` / `ip -6` flag, kept so records
/// written by earlier versions still read).
fn family_flag(family: Family) -> &'static str {
    match family {
        Family::V4 => "-4",
        Family::V6 => "-6",
    }
}

/// The route metrics of a profile (empty if it needs none).
pub(crate) fn profile_metrics(profile: &TcpProfile) -> RouteMetrics {
    let mut metrics = RouteMetrics::new();
    if let Some(n) = profile.initial_cwnd {
        metrics.set(RouteMetric::new(Metric::InitCwnd, n));
    }
    if let Some(n) = profile.dupack_threshold {
        // Locked, so tcp_update_metrics() does not overwrite the cached value with what a
        // connection measured.
        metrics.set(RouteMetric::locked(Metric::Reordering, n));
    }
    if let Some(ms) = profile.rto_min_ms {
        // tcp_rto_min() honours only a locked metric. Also written for floors the socket
        // option could set (<= 200 ms): a locked `rto_min` on the copied route would otherwise
        // override the socket's floor (see [`RouteKnobs::install`]).
        metrics.set(RouteMetric::rto_min_ms(ms));
    }
    if profile.delayed_ack == Some(false) {
        metrics.set(RouteMetric::new(Metric::QuickAck, 1));
    }
    metrics
}

/// Whether any of these routes sets `rto_min` (which the kernel honours only locked, and which
/// then beats the socket's own floor).
fn routes_set_rto_min(routes: &[Route]) -> bool {
    routes
        .iter()
        .any(|r| r.metrics.get(Metric::RtoMin).is_some())
}

/// Whether any route of `main` (IPv4 or IPv6) sets `rto_min`.
fn main_routes_lock_rto_min(netlink: &mut Netlink) -> Result<bool, RouteKnobsError> {
    for family in [Family::V4, Family::V6] {
        let routes = match netlink.routes(family, TABLE_MAIN) {
            Ok(routes) => routes,
            // IPv6 may be disabled.
            Err(_) if family == Family::V6 => continue,
            Err(e) => return Err(e.into()),
        };
        if routes_set_rto_min(&routes) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `route` of `main` as it goes into a profile's `table`: everything kept (type, gateway,
/// device, protocol, scope, source, priority, onlink) and the profile's metrics laid over the
/// route's own, so a profile that only raises the initial window keeps the host's MTU lock,
/// RTO floor and congestion control.
fn copy_into_table(route: &Route, table: u32, metrics: &RouteMetrics) -> Route {
    Route {
        table,
        metrics: route.metrics.overlaid(metrics),
        ..route.clone()
    }
}

impl RouteKnobs {
    /// Installs one table and one rule per profile that [`TcpProfile::needs_route_knobs`]
    /// (others are ignored; duplicates by name once), in the calling thread's network
    /// namespace. On error, whatever was installed so far is removed again.
    ///
    /// A profile that sets `rto_min_ms` gets a table too when a route of `main` carries a
    /// (always locked) `rto_min`: the kernel's `tcp_rto_min()` prefers a locked route floor to
    /// the socket's `TCP_RTO_MIN_US`, so on such a host (e.g. the lab's legacy stack, 1 s) the
    /// socket option alone would silently do nothing; the profile's table replaces the floor.
    pub fn install(
        profiles: &[&TcpProfile],
        base_table: u32,
        base_mark: u32,
    ) -> Result<RouteKnobs, RouteKnobsError> {
        let mut netlink = Netlink::open()?;
        let floor_locked_by_routes = profiles.iter().any(|p| p.rto_min_ms.is_some())
            && main_routes_lock_rto_min(&mut netlink)?;
        let wanted_here = |p: &TcpProfile| {
            p.needs_route_knobs() || (floor_locked_by_routes && p.rto_min_ms.is_some())
        };
        let mut wanted: Vec<&TcpProfile> = Vec::new();
        for p in profiles.iter().copied().filter(|p| wanted_here(p)) {
            if !wanted.iter().any(|w| w.name == p.name) {
                wanted.push(p);
            }
        }
        let count = wanted.len();
        let overflow = || RouteKnobsError::Overflow {
            base_mark,
            base_table,
            count,
        };
        let last = u32::try_from(count).map_err(|_| overflow())?;
        if base_table.checked_add(last).is_none()
            || base_mark.checked_add(last).is_none()
            || base_mark == 0
        {
            return Err(overflow());
        }
        let reserved = |t: u32| t == 0 || (253..=255).contains(&t);
        if (base_table..base_table.saturating_add(last)).any(reserved) {
            return Err(RouteKnobsError::ReservedTable(base_table));
        }
        let mut knobs = RouteKnobs {
            entries: Vec::new(),
            removed: false,
            netlink,
        };
        for (i, profile) in wanted.into_iter().enumerate() {
            let entry = Entry {
                profile: profile.name.clone(),
                mark: base_mark + i as u32,
                table: base_table + i as u32,
                families: Vec::new(),
                metrics: profile_metrics(profile),
            };
            knobs.entries.push(entry);
            let idx = knobs.entries.len() - 1;
            // On error `knobs` drops here and removes what was installed.
            knobs.install_entry(idx)?;
        }
        Ok(knobs)
    }

    fn install_entry(&mut self, idx: usize) -> Result<(), RouteKnobsError> {
        let Entry {
            profile,
            mark,
            table,
            metrics,
            ..
        } = self.entries[idx].clone();
        for family in [Family::V4, Family::V6] {
            let routes = match self.netlink.routes(family, TABLE_MAIN) {
                Ok(routes) => routes,
                // IPv6 may be disabled: then there is nothing to copy for it.
                Err(_) if family == Family::V6 => continue,
                Err(e) => return Err(e.into()),
            };
            if routes.is_empty() {
                continue;
            }
            if !self.netlink.routes(family, table)?.is_empty() {
                return Err(RouteKnobsError::TableInUse { table, profile });
            }
            let rules = self.netlink.rules(family)?;
            if rules
                .iter()
                .any(|r| r.table == table || r.fwmark == Some(mark))
            {
                return Err(RouteKnobsError::RuleInUse { mark, table });
            }
            // From here on this family is ours to remove, even if a later step fails.
            self.entries[idx].families.push(family);
            for route in &routes {
                if route.multipath {
                    tracing::warn!(profile = %profile, dst = %route.destination, "multipath route not copied into the route-knob table");
                    continue;
                }
                self.netlink
                    .append_route(&copy_into_table(route, table, &metrics))?;
            }
            self.netlink.add_rule(&knob_rule(family, mark, table))?;
        }
        tracing::info!(profile = %profile, mark, table, metrics = %metrics, "route-metric knobs installed");
        Ok(())
    }

    /// Whether these tables are exactly what `profiles` would install: the same profiles by
    /// name, each with the same route metrics. A reload keeps the installed knobs only then
    /// (the tables are copies taken at install time; changing them under live sockets is left
    /// to a restart).
    pub fn serves_exactly(&self, profiles: &[&TcpProfile]) -> bool {
        let wanted: Vec<&TcpProfile> = profiles
            .iter()
            .copied()
            .filter(|p| p.needs_route_knobs() || self.mark_for(&p.name).is_some())
            .collect();
        wanted.len() == self.entries.len()
            && wanted.iter().all(|p| {
                self.entries
                    .iter()
                    .any(|e| e.profile == p.name && e.metrics == profile_metrics(p))
            })
    }

    /// `SO_MARK` to put on that profile's sockets, if it has route knobs.
    pub fn mark_for(&self, profile_name: &str) -> Option<u32> {
        self.entries
            .iter()
            .find(|e| e.profile == profile_name)
            .map(|e| e.mark)
    }

    /// Routing table installed for that profile.
    pub fn table_for(&self, profile_name: &str) -> Option<u32> {
        self.entries
            .iter()
            .find(|e| e.profile == profile_name)
            .map(|e| e.table)
    }

    /// Sets [`TcpProfile::route_mark`] on every profile that has a table here.
    pub fn set_marks<'a>(&self, profiles: impl IntoIterator<Item = &'a mut TcpProfile>) {
        for p in profiles {
            if let Some(mark) = self.mark_for(&p.name) {
                p.route_mark = Some(mark);
            }
        }
    }

    /// Removes every rule and table, through the socket of the namespace they were installed
    /// in. A rule or table that is gone already (or was never filled: failure half way) is not
    /// an error.
    fn remove_all(&mut self) -> Result<(), RouteKnobsError> {
        let mut first_err: Option<NetlinkError> = None;
        for entry in self.entries.drain(..) {
            for &family in &entry.families {
                let rule = knob_rule(family, entry.mark, entry.table);
                let steps = [
                    self.netlink.delete_rule(&rule),
                    self.netlink.flush_table(family, entry.table).map(drop),
                ];
                for result in steps {
                    if let Err(e) = result {
                        if !e.is_not_found() && first_err.is_none() {
                            first_err = Some(e);
                        }
                    }
                }
            }
        }
        self.removed = true;
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// What is installed, for a crash-recovery record.
    pub fn installed(&self) -> Vec<InstalledKnob> {
        self.entries
            .iter()
            .map(|e| InstalledKnob {
                mark: e.mark,
                table: e.table,
                families: e
                    .families
                    .iter()
                    .map(|&f| family_flag(f).to_owned())
                    .collect(),
            })
            .collect()
    }

    /// Removes the rules and tables a midway that did not stop cleanly recorded, in the calling
    /// thread's namespace. Parts already gone are not an error.
    pub fn remove_leftovers(knobs: &[InstalledKnob]) -> Result<(), RouteKnobsError> {
        let entries = knobs
            .iter()
            .map(|knob| Entry {
                profile: String::new(),
                mark: knob.mark,
                table: knob.table,
                families: [Family::V4, Family::V6]
                    .into_iter()
                    .filter(|&f| knob.families.iter().any(|k| k == family_flag(f)))
                    .collect(),
                metrics: RouteMetrics::new(),
            })
            .collect();
        let mut leftovers = RouteKnobs {
            entries,
            removed: false,
            netlink: Netlink::open()?,
        };
        leftovers.remove_all()
    }

    /// Removes midway's rules and tables (only those installed here).
    pub fn remove(mut self) -> Result<(), RouteKnobsError> {
        self.remove_all()
    }
}

/// midway's rule for a profile: `fwmark MARK/0xffffffff lookup TABLE priority 1000`.
fn knob_rule(family: Family, mark: u32, table: u32) -> FwmarkRule {
    FwmarkRule {
        mask: Some(u32::MAX),
        priority: Some(RULE_PRIORITY),
        ..FwmarkRule::new(family, mark, table)
    }
}

impl Drop for RouteKnobs {
    fn drop(&mut self) {
        if !self.removed {
            if let Err(e) = self.remove_all() {
                tracing::error!(error = %e, "removing route-metric knobs");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(dst: &str, device: u32, metrics: &str) -> Route {
        let mut route = Route::to(dst.parse().unwrap());
        route.device = Some(device);
        route.metrics = metrics.parse().unwrap();
        route
    }

    #[test]
    fn rto_min_on_any_main_route_is_seen() {
        let legacy = [
            route("0.0.0.0/0", 2, "mtu lock 576 advmss 536 rto_min lock 1s"),
            route("10.0.1.0/24", 2, ""),
        ];
        assert!(routes_set_rto_min(&legacy));
        let plain = [route("0.0.0.0/0", 2, ""), route("10.0.1.0/24", 2, "")];
        assert!(!routes_set_rto_min(&plain));
    }

    #[test]
    fn profile_metrics_override_only_their_own_keys() {
        let main = route(
            "0.0.0.0/0",
            2,
            "mtu lock 576 advmss 536 initcwnd 2 rto_min lock 1s congctl reno",
        );
        let profile: RouteMetrics = "initcwnd 10 reordering lock 1 quickack 1".parse().unwrap();
        let copy = copy_into_table(&main, 100, &profile);
        assert_eq!(
            copy.metrics,
            "mtu lock 576 advmss 536 rto_min 1s congctl reno initcwnd 10 reordering lock 1 quickack 1"
                .parse::<RouteMetrics>()
                .unwrap()
        );
        assert_eq!((copy.table, copy.device), (100, Some(2)));
    }

    #[test]
    fn a_profiles_metrics_are_its_route_knobs() {
        let mut profile = TcpProfile::kernel_default("routed");
        profile.initial_cwnd = Some(7);
        profile.rto_min_ms = Some(300);
        profile.delayed_ack = Some(false);
        profile.dupack_threshold = Some(5);
        assert_eq!(
            profile_metrics(&profile).to_string(),
            "initcwnd 7 reordering lock 5 rto_min 300ms quickack 1"
        );
        assert!(profile_metrics(&TcpProfile::kernel_default("plain")).is_empty());
        assert_eq!(family_flag(Family::V6), "-6");
    }
}
