//! Route-metric knobs: what Linux offers only per destination.
//!
//! | profile knob | route metric | read by the kernel |
//! |---|---|---|
//! | `initial_cwnd` | `initcwnd N` | `tcp_init_cwnd()` from the socket's route, every connection |
//! | `delayed_ack = false` | `quickack 1` | `tcp_init_transfer()` sets `dst_quick_ack`, every connection |
//! | `rto_min_ms` > 200 | `rto_min T` (iproute2 locks it) | `tcp_rto_min()`, only when the metric is locked |
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
//! Namespaces: `ip` runs in the network namespace of the calling thread. [`RouteKnobs`]
//! remembers the namespace it was installed in and removes its rules and tables there, whichever
//! thread drops it.
//!
//! Limits: the copy is taken at install time (later changes to the main table are not followed);
//! destinations in the `local` table (addresses of this host, loopback) are looked up before any
//! policy rule and never get the metrics; multipath routes are not copied (warned). Routes that
//! differ only by device (every IPv6 interface has its own `fe80::/64`) are all copied, with
//! `ip route append`, so link-local peers get the metrics too.
//!
//! Mechanism: the `ip` command of iproute2 with JSON output (`ip -j`), not rtnetlink: it is
//! installed wherever midway's intercept runs, its JSON is stable, it encodes metrics and
//! their locks exactly as an operator would type them (so the installed state can be checked
//! by hand with the same command), and this runs only at start and stop.

use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::TcpProfile;

/// Priority of midway's policy rules: after `local` (0), before `main` (32766).
pub(crate) const RULE_PRIORITY: u32 = 1000;

/// Route-knob installation failed; nothing outside midway's own tables and rules was changed.
#[derive(Debug, thiserror::Error)]
pub enum RouteKnobsError {
    /// `ip` could not be started.
    #[error("cannot run `ip` (iproute2 is needed for route-metric knobs)")]
    Spawn(#[source] std::io::Error),
    /// `ip` ran and failed.
    #[error("`ip {args}` failed ({status}): {stderr}")]
    Command {
        /// The `ip` arguments, space-separated.
        args: String,
        /// How `ip` exited.
        status: std::process::ExitStatus,
        /// What `ip` wrote to standard error.
        stderr: String,
    },
    /// `ip -json` printed something that is not the JSON expected.
    #[error("cannot parse the JSON of `ip {args}`")]
    Parse {
        /// The `ip` arguments, space-separated.
        args: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
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
    /// Removing the knobs could not return to the namespace they were installed in.
    #[error("cannot enter the network namespace the route knobs were installed in")]
    EnterNetns(#[source] std::io::Error),
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
    /// Network namespace of the installing thread (`/proc/thread-self/ns/net`).
    netns: Option<std::fs::File>,
}

#[derive(Debug, Clone)]
struct Entry {
    profile: String,
    mark: u32,
    table: u32,
    /// Address families ("-4"/"-6") for which a rule and a table were installed.
    families: Vec<&'static str>,
    /// The route metrics its table carries ([`metric_args`]).
    metrics: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct JsonRoute {
    #[serde(rename = "type")]
    kind: Option<String>,
    dst: String,
    gateway: Option<String>,
    dev: Option<String>,
    protocol: Option<String>,
    scope: Option<String>,
    prefsrc: Option<String>,
    metric: Option<u32>,
    #[serde(default)]
    flags: Vec<String>,
    nexthops: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
struct JsonRule {
    table: Option<String>,
    fwmark: Option<String>,
}

fn ip(args: &[String]) -> Result<String, RouteKnobsError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(RouteKnobsError::Spawn)?;
    if !out.status.success() {
        return Err(RouteKnobsError::Command {
            args: args.join(" "),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip_json<T: serde::de::DeserializeOwned>(args: &[String]) -> Result<Vec<T>, RouteKnobsError> {
    let text = ip(args)?;
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(&text).map_err(|source| RouteKnobsError::Parse {
        args: args.join(" "),
        source,
    })
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// The metric arguments of `ip route append` for a profile (empty if it needs none).
pub(crate) fn metric_args(profile: &TcpProfile) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(n) = profile.initial_cwnd {
        args.extend(["initcwnd".to_owned(), n.to_string()]);
    }
    if let Some(n) = profile.dupack_threshold {
        // Locked, so tcp_update_metrics() does not overwrite the cached value with what a
        // connection measured.
        args.extend(["reordering".to_owned(), "lock".to_owned(), n.to_string()]);
    }
    if let Some(ms) = profile.rto_min_ms {
        // tcp_rto_min() honours only a locked metric; iproute2 always locks `rto_min`. Also
        // written for floors the socket option could set (<= 200 ms): a locked `rto_min` on the
        // copied route would otherwise override the socket's floor (see
        // [`RouteKnobs::install`]).
        args.extend(["rto_min".to_owned(), format!("{ms}ms")]);
    }
    if profile.delayed_ack == Some(false) {
        args.extend(["quickack".to_owned(), "1".to_owned()]);
    }
    args
}

/// Route metrics iproute2 prints after a route, each as `key [lock] value`.
const ROUTE_METRIC_KEYS: [&str; 16] = [
    "mtu",
    "advmss",
    "rtt",
    "rttvar",
    "reordering",
    "window",
    "cwnd",
    "ssthresh",
    "rto_min",
    "initcwnd",
    "initrwnd",
    "features",
    "quickack",
    "congctl",
    "fastopen_no_cookie",
    "hoplimit",
];

/// Metrics iproute2 prints with `lock` but does not take `lock` for as input: `rto_min` is always
/// locked when set, the others have no lock.
const METRICS_WITHOUT_LOCK_ARGUMENT: [&str; 4] =
    ["rto_min", "quickack", "features", "fastopen_no_cookie"];

/// Splits metric arguments (`["initcwnd", "10", "reordering", "lock", "1"]`) into one group per
/// metric, in the form `ip route` takes them back. Tokens that are not metrics are skipped, so a
/// whole `ip route show` line can be fed in.
fn metric_groups(tokens: &[&str]) -> Vec<Vec<String>> {
    let mut groups = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if ROUTE_METRIC_KEYS.contains(&tokens[i]) {
            let key = tokens[i];
            let mut group = vec![key.to_owned()];
            i += 1;
            if tokens.get(i) == Some(&"lock") {
                if !METRICS_WITHOUT_LOCK_ARGUMENT.contains(&key) {
                    group.push("lock".to_owned());
                }
                i += 1;
            }
            if let Some(value) = tokens.get(i) {
                group.push((*value).to_owned());
            }
            groups.push(group);
        }
        i += 1;
    }
    groups
}

/// The metrics a route in `main` already carries, read from iproute2's text output (its JSON
/// output drops the `lock` flags, and a lost `mtu lock` or `rto_min` lock changes behaviour).
/// `text` is the whole `ip route show table main`; the route's line is the one with its
/// destination and device.
fn existing_metrics(text: &str, route: &JsonRoute) -> Vec<Vec<String>> {
    let line = text.lines().find(|line| {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let dst_matches = tokens.first() == Some(&route.dst.as_str())
            || (tokens.get(1) == Some(&route.dst.as_str()) && route.kind.is_some());
        let dev_matches = route
            .dev
            .as_deref()
            .is_none_or(|dev| tokens.windows(2).any(|w| w[0] == "dev" && w[1] == dev));
        dst_matches && dev_matches
    });
    line.map(|l| metric_groups(&l.split_whitespace().collect::<Vec<_>>()))
        .unwrap_or_default()
}

/// The route's own metrics with the profile's laid over them: a profile that only raises the
/// initial window must not also drop the host's MTU lock, RTO floor or congestion control.
fn merged_metrics(existing: Vec<Vec<String>>, profile_metrics: &[String]) -> Vec<String> {
    let tokens: Vec<&str> = profile_metrics.iter().map(String::as_str).collect();
    let ours = metric_groups(&tokens);
    let mut merged: Vec<String> = existing
        .into_iter()
        .filter(|group| !ours.iter().any(|o| o[0] == group[0]))
        .flatten()
        .collect();
    merged.extend(ours.into_iter().flatten());
    merged
}

/// Whether any route of `main` (IPv4 or IPv6) sets `rto_min`, which iproute2 always locks.
fn main_routes_lock_rto_min() -> Result<bool, RouteKnobsError> {
    for family in ["-4", "-6"] {
        let text = match ip(&strings(&[family, "route", "show", "table", "main"])) {
            Ok(text) => text,
            // IPv6 may be disabled.
            Err(RouteKnobsError::Command { .. }) if family == "-6" => continue,
            Err(e) => return Err(e),
        };
        if text_sets_rto_min(&text) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether an `ip route show` text has a route with an `rto_min` metric.
fn text_sets_rto_min(text: &str) -> bool {
    text.lines().any(|line| {
        metric_groups(&line.split_whitespace().collect::<Vec<_>>())
            .iter()
            .any(|group| group[0] == "rto_min")
    })
}

/// `ip route append` arguments that recreate `route` in `table` with `metrics` added.
///
/// `append`, not `add`: the main table may hold several routes to one prefix that differ only
/// in their device — with IPv6 every interface has its own `fe80::/64` route at the same metric.
/// `add` asks the kernel for an exclusive create (NLM_F_EXCL) and the second copy fails with
/// "File exists"; `append` creates each one next to the others, as the kernel did in `main`.
/// The link-local routes are worth copying, not skipping: a marked socket talking to a
/// link-local neighbour must get the profile's metrics too, and without a route in the marked
/// table its lookup would fall through to `main` and silently lose them.
fn copy_route_args(family: &str, route: &JsonRoute, table: u32, metrics: &[String]) -> Vec<String> {
    let mut args = strings(&[family, "route", "append", "table"]);
    args.push(table.to_string());
    if let Some(kind) = &route.kind {
        args.push(kind.clone());
    }
    args.push(route.dst.clone());
    let mut push = |key: &str, val: &Option<String>| {
        if let Some(v) = val {
            args.extend([key.to_owned(), v.clone()]);
        }
    };
    push("via", &route.gateway);
    push("dev", &route.dev);
    push("proto", &route.protocol);
    push("scope", &route.scope);
    push("src", &route.prefsrc);
    if let Some(m) = route.metric {
        args.extend(["metric".to_owned(), m.to_string()]);
    }
    if route.flags.iter().any(|f| f == "onlink") {
        args.push("onlink".to_owned());
    }
    args.extend(metrics.iter().cloned());
    args
}

impl RouteKnobs {
    /// Installs one table and one rule per profile that [`TcpProfile::needs_route_knobs`]
    /// (others are ignored; duplicates by name once). On error, whatever was installed so far is
    /// removed again.
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
        let floor_locked_by_routes =
            profiles.iter().any(|p| p.rto_min_ms.is_some()) && main_routes_lock_rto_min()?;
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
        let netns = std::fs::File::open("/proc/thread-self/ns/net").ok();
        let mut knobs = RouteKnobs {
            entries: Vec::new(),
            removed: false,
            netns,
        };
        for (i, profile) in wanted.into_iter().enumerate() {
            let entry = Entry {
                profile: profile.name.clone(),
                mark: base_mark + i as u32,
                table: base_table + i as u32,
                families: Vec::new(),
                metrics: metric_args(profile),
            };
            knobs.entries.push(entry);
            let idx = knobs.entries.len() - 1;
            // On error `knobs` drops here and removes what was installed.
            knobs.install_entry(idx, profile)?;
        }
        Ok(knobs)
    }

    fn install_entry(&mut self, idx: usize, profile: &TcpProfile) -> Result<(), RouteKnobsError> {
        let (mark, table) = (self.entries[idx].mark, self.entries[idx].table);
        let metrics = metric_args(profile);
        for family in ["-4", "-6"] {
            let routes: Vec<JsonRoute> =
                match ip_json(&strings(&["-j", family, "route", "show", "table", "main"])) {
                    Ok(routes) => routes,
                    // IPv6 may be disabled: then there is nothing to copy for it.
                    Err(RouteKnobsError::Command { .. }) if family == "-6" => continue,
                    Err(e) => return Err(e),
                };
            if routes.is_empty() {
                continue;
            }
            let main_text = ip(&strings(&[family, "route", "show", "table", "main"]))?;
            let existing: Vec<serde_json::Value> = match ip_json(&strings(&[
                "-j",
                family,
                "route",
                "show",
                "table",
                &table.to_string(),
            ])) {
                Ok(routes) => routes,
                // A table with no routes does not exist for the kernel: that is what we want.
                Err(RouteKnobsError::Command { stderr, .. })
                    if stderr.contains("does not exist") =>
                {
                    Vec::new()
                }
                Err(e) => return Err(e),
            };
            if !existing.is_empty() {
                return Err(RouteKnobsError::TableInUse {
                    table,
                    profile: profile.name.clone(),
                });
            }
            let rules: Vec<JsonRule> = ip_json(&strings(&["-j", family, "rule", "show"]))?;
            let ours = |r: &JsonRule| {
                r.table.as_deref() == Some(table.to_string().as_str())
                    || r.fwmark
                        .as_deref()
                        .and_then(|m| u32::from_str_radix(m.trim_start_matches("0x"), 16).ok())
                        == Some(mark)
            };
            if rules.iter().any(ours) {
                return Err(RouteKnobsError::RuleInUse { mark, table });
            }
            // From here on this family is ours to remove, even if a later step fails.
            self.entries[idx].families.push(family);
            for route in &routes {
                if route.nexthops.is_some() {
                    tracing::warn!(profile = %profile.name, dst = %route.dst, "multipath route not copied into the route-knob table");
                    continue;
                }
                let metrics = merged_metrics(existing_metrics(&main_text, route), &metrics);
                ip(&copy_route_args(family, route, table, &metrics))?;
            }
            ip(&strings(&[
                family,
                "rule",
                "add",
                "fwmark",
                &format!("{mark:#x}/0xffffffff"),
                "table",
                &table.to_string(),
                "priority",
                &RULE_PRIORITY.to_string(),
            ]))?;
        }
        tracing::info!(profile = %profile.name, mark, table, metrics = %metrics.join(" "), "route-metric knobs installed");
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
                    .any(|e| e.profile == p.name && e.metrics == metric_args(p))
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

    /// Removes everything, from the namespace it was installed in.
    fn remove_all(&mut self) -> Result<(), RouteKnobsError> {
        use std::os::unix::fs::MetadataExt;
        let ino = |f: &std::fs::File| f.metadata().map(|m| (m.dev(), m.ino())).ok();
        let here = std::fs::File::open("/proc/thread-self/ns/net").ok();
        let same = match (&self.netns, &here) {
            (Some(installed), Some(here)) => ino(installed) == ino(here),
            _ => true,
        };
        if same {
            return self.remove_here();
        }
        let installed = self.netns.take();
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    if let Some(ns) = &installed {
                        midway_sys::netns::enter(ns).map_err(RouteKnobsError::EnterNetns)?;
                    }
                    self.remove_here()
                })
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    fn remove_here(&mut self) -> Result<(), RouteKnobsError> {
        let mut first_err = None;
        for entry in self.entries.drain(..) {
            for family in &entry.families {
                let table = entry.table.to_string();
                let steps = [
                    strings(&[
                        family,
                        "rule",
                        "del",
                        "fwmark",
                        &format!("{:#x}/0xffffffff", entry.mark),
                        "table",
                        &table,
                        "priority",
                        &RULE_PRIORITY.to_string(),
                    ]),
                    strings(&[family, "route", "flush", "table", &table]),
                ];
                for step in steps {
                    if let Err(e) = ip(&step) {
                        // A rule or table that was never filled (failure half way) is not an error.
                        let missing = matches!(&e, RouteKnobsError::Command { stderr, .. }
                            if stderr.contains("No such file") || stderr.contains("does not exist"));
                        if !missing && first_err.is_none() {
                            first_err = Some(e);
                        }
                    }
                }
            }
        }
        self.removed = true;
        first_err.map_or(Ok(()), Err)
    }

    /// What is installed, for a crash-recovery record.
    pub fn installed(&self) -> Vec<InstalledKnob> {
        self.entries
            .iter()
            .map(|e| InstalledKnob {
                mark: e.mark,
                table: e.table,
                families: e.families.iter().map(|f| f.to_string()).collect(),
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
                families: knob
                    .families
                    .iter()
                    .filter_map(|f| match f.as_str() {
                        "-4" => Some("-4"),
                        "-6" => Some("-6"),
                        _ => None,
                    })
                    .collect(),
                metrics: Vec::new(),
            })
            .collect();
        let mut leftovers = RouteKnobs {
            entries,
            removed: false,
            netns: None,
        };
        leftovers.remove_here()
    }

    /// Removes midway's rules and tables (only those installed here).
    pub fn remove(mut self) -> Result<(), RouteKnobsError> {
        self.remove_all()
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

    #[test]
    fn rto_min_on_any_main_route_is_seen() {
        let legacy = "default via 10.0.1.1 dev v0 mtu lock 576 advmss 536 rto_min lock 1s\n\
                      10.0.1.0/24 dev v0 proto kernel scope link src 10.0.1.2\n";
        assert!(text_sets_rto_min(legacy));
        let plain = "default via 10.0.1.1 dev v0\n10.0.1.0/24 dev v0 proto kernel scope link\n";
        assert!(!text_sets_rto_min(plain));
    }

    fn route(dst: &str, dev: &str) -> JsonRoute {
        JsonRoute {
            kind: None,
            dst: dst.to_owned(),
            gateway: None,
            dev: Some(dev.to_owned()),
            protocol: None,
            scope: None,
            prefsrc: None,
            metric: None,
            flags: Vec::new(),
            nexthops: None,
        }
    }

    const LEGACY_MAIN: &str = "\
default via 10.0.1.1 dev v0 mtu lock 576 advmss 536 initcwnd 2 rto_min lock 1s congctl reno
10.0.1.0/24 dev v0 proto kernel scope link src 10.0.1.2 mtu lock 576 advmss 536
10.0.2.0/24 dev v1 proto kernel scope link src 10.0.2.2
";

    #[test]
    fn reads_metrics_with_their_locks_from_the_routes_own_line() {
        let groups = existing_metrics(LEGACY_MAIN, &route("default", "v0"));
        assert_eq!(
            groups,
            vec![
                vec!["mtu", "lock", "576"],
                vec!["advmss", "536"],
                vec!["initcwnd", "2"],
                vec!["rto_min", "1s"],
                vec!["congctl", "reno"],
            ]
        );
        assert!(existing_metrics(LEGACY_MAIN, &route("10.0.2.0/24", "v1")).is_empty());
        assert_eq!(
            existing_metrics(LEGACY_MAIN, &route("10.0.1.0/24", "v0")).len(),
            2
        );
        // Same prefix on another device: not this line.
        assert!(existing_metrics(LEGACY_MAIN, &route("10.0.1.0/24", "v9")).is_empty());
    }

    #[test]
    fn profile_metrics_override_only_their_own_keys() {
        let existing = existing_metrics(LEGACY_MAIN, &route("default", "v0"));
        let profile = strings(&["initcwnd", "10", "reordering", "lock", "1", "quickack", "1"]);
        let merged = merged_metrics(existing, &profile);
        assert_eq!(
            merged.join(" "),
            "mtu lock 576 advmss 536 rto_min 1s congctl reno initcwnd 10 reordering lock 1 quickack 1"
        );
    }
}
