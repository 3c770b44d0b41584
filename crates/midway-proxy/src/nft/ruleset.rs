//! The nftables ruleset (one `nft -f` script per table) and the policy routing that transparent
//! listeners need, planned from the configuration without touching the system.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;

use super::routes::{IpFamily, PolicyRoute};
use crate::config::{Intercept, NftConfig, RuntimeConfig};

/// What transparent interception installs: nft scripts per table and policy routing commands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct InterceptPlan {
    /// (table name, `nft -f` script creating it from scratch, managed?)
    pub tables: Vec<(String, String, bool)>,
    /// Policy routing, per (mark, route table) and address family, and whether midway
    /// installs it (managed).
    pub routes: Vec<(PolicyRoute, bool)>,
}

impl InterceptPlan {
    /// Whether midway installs any of it itself (`nftables.manage`).
    pub(crate) fn manages_anything(&self) -> bool {
        self.tables.iter().any(|(_, _, manage)| *manage) || self.routes.iter().any(|(_, m)| *m)
    }
}

fn tproxy_target(listen: SocketAddr) -> String {
    match listen {
        SocketAddr::V4(a) if a.ip().is_unspecified() => format!("tproxy ip to :{}", a.port()),
        SocketAddr::V4(a) => format!("tproxy ip to {}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) if a.ip().is_unspecified() => format!("tproxy ip6 to :{}", a.port()),
        SocketAddr::V6(a) => format!("tproxy ip6 to [{}]:{}", a.ip(), a.port()),
    }
}

fn set_of<T: ToString>(items: &[T], quote: bool) -> String {
    let parts: Vec<String> = items
        .iter()
        .map(|i| {
            if quote {
                format!("\"{}\"", i.to_string())
            } else {
                i.to_string()
            }
        })
        .collect();
    format!("{{ {} }}", parts.join(", "))
}

/// The set that, while it holds `tcp`, makes new connections bypass midway (overload).
pub(crate) const OVERLOAD_SET: &str = "overload";
/// A bypassed flow is forgotten after this long without a packet.
const BYPASS_TIMEOUT: &str = "2h";
/// Bypassed flows remembered at once per family; when full, new connections are split again.
const BYPASS_SET_SIZE: u32 = 65536;
const BYPASSED_KEY_V4: &str = "ip saddr . tcp sport . ip daddr . tcp dport";
const BYPASSED_KEY_V6: &str = "ip6 saddr . tcp sport . ip6 daddr . tcp dport";
const BYPASSED_FLOW_V4: &str = "@bypassed4 { ip saddr . tcp sport . ip daddr . tcp dport }";
const BYPASSED_FLOW_V6: &str = "@bypassed6 { ip6 saddr . tcp sport . ip6 daddr . tcp dport }";

/// The per-listener rules of one table, by chain.
#[derive(Debug, Default)]
struct ListenerRules {
    /// raw prerouting: no connection tracking for what the listener intercepts.
    notrack: Vec<String>,
    /// mangle prerouting, first: while overloaded, a new connection is remembered as bypassed
    /// and routed unsplit.
    bypass: Vec<String>,
    /// mangle prerouting, then: divert to the listener.
    divert: Vec<String>,
}

/// Builds the plan for every transparent listener (managed and not).
pub(crate) fn plan(config: &RuntimeConfig) -> InterceptPlan {
    // table -> (managed, marks, rules)
    let mut tables: BTreeMap<&str, (bool, BTreeSet<u32>, ListenerRules)> = BTreeMap::new();
    let mut routes: BTreeMap<(u32, u32), (bool, bool, bool)> = BTreeMap::new();
    for listener in &config.listeners {
        let Intercept::Transparent { nftables, .. } = &listener.intercept else {
            continue;
        };
        let NftConfig {
            manage,
            table,
            interfaces,
            ports,
            mark,
            route_table,
        } = nftables;
        let entry = tables
            .entry(table.as_str())
            .or_insert_with(|| (*manage, BTreeSet::new(), ListenerRules::default()));
        entry.1.insert(*mark);
        // What the listener intercepts: its interfaces and destination ports.
        let mut matches = String::new();
        if !interfaces.is_empty() {
            let _ = write!(matches, "iifname {} ", set_of(interfaces, true));
        }
        matches.push_str("meta l4proto tcp ");
        if !ports.is_empty() {
            let _ = write!(matches, "tcp dport {} ", set_of(ports, false));
        }
        let comment = format!("comment \"listener {}\"", listener.name.replace('"', "'"));
        let flow = if listener.listen.is_ipv4() {
            BYPASSED_FLOW_V4
        } else {
            BYPASSED_FLOW_V6
        };
        entry.2.notrack.push(format!("{matches}notrack {comment}"));
        entry.2.bypass.push(format!(
            "{matches}tcp flags & (syn | ack) == syn meta l4proto @{OVERLOAD_SET} add {flow} accept {comment}"
        ));
        entry.2.divert.push(format!(
            "{matches}{} meta mark set {mark:#x} accept {comment}",
            tproxy_target(listener.listen),
        ));
        // Policy routing only for the address families that have a listener: an IPv4-only
        // host (IPv6 disabled) must not need IPv6 routes.
        let (managed, v4, v6) = routes
            .entry((*mark, *route_table))
            .or_insert((false, false, false));
        *managed |= *manage;
        *v4 |= listener.listen.is_ipv4();
        *v6 |= listener.listen.is_ipv6();
    }

    let tables = tables
        .into_iter()
        .map(|(name, (manage, marks, rules))| {
            let mut script = String::new();
            // Declaring then deleting makes the script replace a leftover table from a crash.
            let _ = writeln!(script, "table inet {name}");
            let _ = writeln!(script, "delete table inet {name}");
            let _ = writeln!(script, "table inet {name} {{");
            let _ = writeln!(script, "  set {OVERLOAD_SET} {{ type inet_proto; }}");
            for (set, key) in [
                ("bypassed4", "ipv4_addr . inet_service . ipv4_addr . inet_service"),
                ("bypassed6", "ipv6_addr . inet_service . ipv6_addr . inet_service"),
            ] {
                let _ = writeln!(
                    script,
                    "  set {set} {{ type {key}; flags dynamic, timeout; timeout {BYPASS_TIMEOUT}; size {BYPASS_SET_SIZE}; }}"
                );
            }
            // Before connection tracking (priority raw): diverted flows end in midway's
            // sockets, so tracking them would only fill the conntrack table.
            let _ = writeln!(script, "  chain raw_prerouting {{");
            let _ = writeln!(
                script,
                "    type filter hook prerouting priority raw; policy accept;"
            );
            let _ = writeln!(
                script,
                "    meta l4proto tcp socket transparent 1 notrack"
            );
            for rule in &rules.notrack {
                let _ = writeln!(script, "    {rule}");
            }
            let _ = writeln!(script, "  }}");
            let _ = writeln!(script, "  chain raw_output {{");
            let _ = writeln!(
                script,
                "    type filter hook output priority raw; policy accept;"
            );
            let _ = writeln!(
                script,
                "    meta l4proto tcp socket transparent 1 notrack"
            );
            let _ = writeln!(script, "  }}");
            let _ = writeln!(script, "  chain prerouting {{");
            let _ = writeln!(
                script,
                "    type filter hook prerouting priority mangle; policy accept;"
            );
            for mark in marks {
                let _ = writeln!(
                    script,
                    "    meta l4proto tcp tcp flags & (syn | ack) != syn socket transparent 1 meta mark set {mark:#x} accept"
                );
            }
            // Flows that started while midway was overloaded stay unsplit to their end.
            let _ = writeln!(
                script,
                "    {} @bypassed4 update {BYPASSED_FLOW_V4} accept",
                BYPASSED_KEY_V4
            );
            let _ = writeln!(
                script,
                "    {} @bypassed6 update {BYPASSED_FLOW_V6} accept",
                BYPASSED_KEY_V6
            );
            for rule in rules.bypass.iter().chain(&rules.divert) {
                let _ = writeln!(script, "    {rule}");
            }
            let _ = writeln!(script, "  }}");
            let _ = writeln!(script, "}}");
            (name.to_string(), script, manage)
        })
        .collect();

    let mut policy_routes = Vec::new();
    for ((mark, table), (manage, v4, v6)) in routes {
        let families = [(v4, IpFamily::Ipv4), (v6, IpFamily::Ipv6)];
        for (_, family) in families.into_iter().filter(|f| f.0) {
            for entry in PolicyRoute::pair(family, mark, table) {
                policy_routes.push((entry, manage));
            }
        }
    }
    InterceptPlan {
        tables,
        routes: policy_routes,
    }
}

/// Text for `midway proxy --print-nft`: every table as an `nft -f` script, then the policy routing
/// as comments. Empty when no listener is transparent.
pub fn nft_ruleset(config: &RuntimeConfig) -> String {
    let plan = plan(config);
    let mut out = String::new();
    for (name, script, manage) in &plan.tables {
        let _ = writeln!(
            out,
            "# table {name}: {}",
            if *manage {
                "installed by midway at start, removed at stop"
            } else {
                "manage = false: install it yourself with `nft -f`"
            }
        );
        out.push_str(script);
    }
    if !plan.routes.is_empty() {
        out.push_str("# policy routing for marked packets (local delivery):\n");
        for (entry, _) in &plan.routes {
            let _ = writeln!(out, "# {entry}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::config::parse_config;

    use super::*;

    const TWO: &str = r#"
[proxy]
allowed_clients = ["10.1.0.0/24"]
[[listeners]]
name = "tp4"
mode = "transparent"
listen = "0.0.0.0:7000"
[listeners.nftables]
interfaces = ["veth-c"]
ports = [80, 443]
[[listeners]]
name = "tp6"
mode = "transparent"
listen = "[::1]:7001"
"#;

    #[test]
    fn ruleset_has_both_families_one_table() {
        let config = parse_config(TWO, "<test>").unwrap();
        let plan = plan(&config);
        assert_eq!(plan.tables.len(), 1);
        let script = &plan.tables[0].1;
        assert!(script.contains(
            "iifname { \"veth-c\" } meta l4proto tcp tcp dport { 80, 443 } tproxy ip to :7000 meta mark set 0x1 accept"
        ), "{script}");
        assert!(
            script.contains("meta l4proto tcp tproxy ip6 to [::1]:7001 meta mark set 0x1"),
            "{script}"
        );
        // Marked for local delivery once; exempt from connection tracking both ways.
        assert_eq!(
            script
                .matches("socket transparent 1 meta mark set 0x1")
                .count(),
            1
        );
        assert_eq!(script.matches("socket transparent 1 notrack").count(), 2);
        assert!(
            script
                .contains("iifname { \"veth-c\" } meta l4proto tcp tcp dport { 80, 443 } notrack"),
            "{script}"
        );
        // While overloaded, new connections are remembered and routed unsplit, before the
        // divert rules.
        let bypass = script
            .find("meta l4proto @overload add @bypassed4")
            .unwrap();
        let divert = script.find("tproxy ip to :7000").unwrap();
        assert!(bypass < divert, "{script}");
        assert!(
            script.contains("meta l4proto @overload add @bypassed6"),
            "{script}"
        );
        // New connections' SYNs skip the shortcut (a TIME_WAIT socket would swallow them).
        assert!(
            script.contains("tcp flags & (syn | ack) != syn socket transparent 1"),
            "{script}"
        );
        // IPv4 and IPv6: a rule and a route each.
        assert_eq!(plan.routes.len(), 4);
        assert_eq!(
            plan.routes[0].0.ip_words("add"),
            "-4 rule add fwmark 1 lookup 100"
        );
        assert_eq!(
            plan.routes[1].0.ip_words("del"),
            "-4 route del local 0.0.0.0/0 dev lo table 100"
        );
        let printed = nft_ruleset(&config);
        assert!(printed.contains("# ip -6 route add local ::/0 dev lo table 100"));
    }

    #[test]
    fn no_transparent_listener_no_rules() {
        let text = r#"
[proxy]
allowed_clients = ["10.1.0.0/24"]
[[listeners]]
name = "f"
mode = "forward"
listen = "127.0.0.1:0"
target = "127.0.0.1:1"
"#;
        let config = parse_config(text, "<test>").unwrap();
        assert_eq!(plan(&config), InterceptPlan::default());
        assert_eq!(nft_ruleset(&config), "");
    }
}
