//! The ECMP network: its hosts and links, the router commands (multipath routes or a resilient
//! nexthop group, the L4 hash policy), a gateway's death and return, and the per-flow packet
//! counters each gateway keeps in an nftables table of its own. The commands are built by pure
//! functions (unit-tested); `apply` runs them inside a host.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::Context;
use midway_labnet::{DirectionConfig, HostSpec, LinkSpec, StackProfile, Topology, TopologySpec};

/// The router on the clients' side: spreads client-to-server flows over the gateways.
pub(crate) const EDGE: &str = "edge";
/// The router on the servers' side: spreads server-to-client packets over the gateways.
pub(crate) const CORE: &str = "core";
pub(crate) const CLIENT: &str = "client";
pub(crate) const SERVER: &str = "server";
/// The gateways, each running a transparent midway. Their order is the next hops' order on both
/// routers.
pub(crate) const GATEWAYS: [&str; 2] = ["gw1", "gw2"];
/// Table of the per-flow counters on each gateway (midway's own is `midway`).
const WATCH_TABLE: &str = "ecmpwatch";
/// Nexthop ids of the resilient variants: object k of gateway i is `NEXTHOP_BASE + i +
/// NEXTHOP_STRIDE * k`, the group is `GROUP_ID`.
const NEXTHOP_BASE: u32 = 1;
const NEXTHOP_STRIDE: u32 = 10;
const GROUP_ID: u32 = 100;
/// Buckets of the resilient group, and how long a bucket must be idle before it may move to
/// another next hop (seconds).
pub(crate) const RESILIENT_BUCKETS: u32 = 32;
pub(crate) const RESILIENT_IDLE_SECS: u32 = 2;
/// `net.ipv4.fib_multipath_hash_seed` of both routers: the same seed (and the same next hops in
/// the same order) makes the server-to-client hash pick the gateway the client-to-server hash
/// picked, so a flow routed unsplit crosses one gateway both ways.
pub(crate) const HASH_SEED: u32 = 32;

/// How the routers spread flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spreading {
    /// `ip route ... nexthop via A ... nexthop via B ...`: hash-threshold over the live next hops.
    Multipath,
    /// `ip nexthop add id .. group ..  type resilient`: a bucket keeps its next hop while busy.
    /// `objects` next hop objects per gateway: the kernel hashes a packet to a bucket (and so
    /// marks the bucket busy) only while the group has more than one member, so with two
    /// gateways, one object each, the survivor's buckets all look idle when the other returns.
    Resilient { objects: u32 },
}

impl Spreading {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Spreading::Multipath => "multipath route",
            Spreading::Resilient { objects: 1 } => "resilient nexthop group",
            Spreading::Resilient { .. } => "resilient nexthop group, two next hops per gateway",
        }
    }
}

/// The nexthop id of gateway `g`'s object `k` in the resilient variants.
pub(crate) fn nexthop_id(g: usize, k: u32) -> u32 {
    NEXTHOP_BASE + g as u32 + NEXTHOP_STRIDE * k
}

/// One link direction: a fixed one-way delay, no rate limit, no loss.
fn delay(ms: u64) -> DirectionConfig {
    DirectionConfig {
        delay: std::time::Duration::from_millis(ms),
        ..DirectionConfig::default()
    }
}

/// client - edge - {gw1, gw2} - core - server; every gateway reaches both routers.
pub(crate) fn topology_spec() -> TopologySpec {
    let host = |name: &str| HostSpec {
        name: name.into(),
        stack: StackProfile::Modern,
    };
    let link = |a: &str, b: &str, ms: u64| LinkSpec {
        a: a.into(),
        b: b.into(),
        a_to_b: delay(ms),
        b_to_a: delay(ms),
    };
    let mut hosts = vec![host(CLIENT), host(EDGE)];
    hosts.extend(GATEWAYS.iter().map(|g| host(g)));
    hosts.extend([host(CORE), host(SERVER)]);
    let mut links = vec![link(CLIENT, EDGE, 1)];
    links.extend(GATEWAYS.iter().map(|g| link(EDGE, g, 1)));
    links.extend(GATEWAYS.iter().map(|g| link(g, CORE, 1)));
    links.push(link(CORE, SERVER, 10));
    TopologySpec { hosts, links }
}

/// One next hop of a router: the gateway's address on the shared link and the router's interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NextHop {
    pub via: String,
    pub dev: String,
}

/// The next hops of `router` toward the gateways, in [`GATEWAYS`] order.
pub(crate) fn next_hops(topology: &Topology, router: &str) -> Vec<NextHop> {
    GATEWAYS
        .iter()
        .map(|g| NextHop {
            via: topology.addr(g, router).to_string(),
            dev: topology.iface(router, g).to_owned(),
        })
        .collect()
}

/// The commands (argv of `ip` or `sysctl`) that make `prefix` an ECMP route over `hops` with an
/// L4 hash. `alive[i]` false leaves next hop i out (a resilient group cannot hold a next hop
/// whose link is down: the kernel deletes such nexthop objects).
pub(crate) fn ecmp_commands(
    spreading: Spreading,
    prefix: &str,
    hops: &[NextHop],
    alive: &[bool],
) -> Vec<Vec<String>> {
    let words = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    let mut commands = vec![
        words("sysctl -q -w net.ipv4.fib_multipath_hash_policy=1"),
        words(&format!(
            "sysctl -q -w net.ipv4.fib_multipath_hash_seed={HASH_SEED}"
        )),
    ];
    let live: Vec<(usize, &NextHop)> = hops
        .iter()
        .enumerate()
        .filter(|(i, _)| alive.get(*i).copied().unwrap_or(true))
        .collect();
    match spreading {
        Spreading::Multipath => {
            let mut route = words(&format!("ip route replace {prefix}"));
            for (_, hop) in &live {
                route.extend(words(&format!(
                    "nexthop via {} dev {} weight 1",
                    hop.via, hop.dev
                )));
            }
            commands.push(route);
        }
        Spreading::Resilient { objects } => {
            for (i, hop) in &live {
                for k in 0..objects {
                    commands.push(words(&format!(
                        "ip nexthop replace id {} via {} dev {}",
                        nexthop_id(*i, k),
                        hop.via,
                        hop.dev
                    )));
                }
            }
            let members: Vec<String> = live
                .iter()
                .flat_map(|(i, _)| (0..objects).map(|k| nexthop_id(*i, k).to_string()))
                .collect();
            commands.push(words(&format!(
                "ip nexthop replace id {GROUP_ID} group {} type resilient buckets {RESILIENT_BUCKETS} idle_timer {RESILIENT_IDLE_SECS}",
                members.join("/")
            )));
            commands.push(words(&format!("ip route replace {prefix} nhid {GROUP_ID}")));
        }
    }
    commands
}

/// Runs `argv` inside `host`, failing with its output.
pub(crate) fn run_in(topology: &Topology, host: &str, argv: &[String]) -> anyhow::Result<String> {
    let (program, args) = argv.split_first().context("empty command")?;
    topology
        .program(host, program)
        .args(args)
        .output()
        .with_context(|| format!("{host}: {}", argv.join(" ")))
}

/// Runs every command in `host`, in order.
pub(crate) fn apply(
    topology: &Topology,
    host: &str,
    commands: &[Vec<String>],
) -> anyhow::Result<()> {
    commands
        .iter()
        .try_for_each(|argv| run_in(topology, host, argv).map(drop))
}

/// `ip link set DEV up|down` for each router's interface toward `gateway`: what a router sees
/// when a directly cabled gateway loses power (carrier) or comes back.
pub(crate) fn set_gateway_links(
    topology: &Topology,
    gateway: &str,
    up: bool,
) -> anyhow::Result<()> {
    for router in [EDGE, CORE] {
        let argv: Vec<String> = ["ip", "link", "set", topology.iface(router, gateway)]
            .iter()
            .map(|s| (*s).to_owned())
            .chain([if up { "up" } else { "down" }.to_owned()])
            .collect();
        run_in(topology, router, &argv)?;
    }
    Ok(())
}

/// The nftables script of a gateway's counters: a set per kind, keyed by the client's flow
/// (client address, client port, server address, server port), with a packet counter per flow.
/// `syn`: the flow's SYNs arriving from the clients' router; `up`: every packet of the flow from
/// the clients' router; `down`: every packet of the flow leaving toward it (forwarded, or sent
/// by midway for the local segment).
pub(crate) fn watch_script(client_iface: &str, port: u16) -> String {
    let set = |name: &str| {
        format!("  set {name} {{ type ipv4_addr . inet_service . ipv4_addr . inet_service; flags dynamic; size 65535; counter; }}\n")
    };
    let up_key = "ip saddr . tcp sport . ip daddr . tcp dport";
    let down_key = "ip daddr . tcp dport . ip saddr . tcp sport";
    format!(
        "table inet {WATCH_TABLE} {{\n{}{}{}  chain pre {{\n    type filter hook prerouting priority -400; policy accept;\n    iifname \"{client_iface}\" tcp dport {port} tcp flags & (syn | ack) == syn update @syn {{ {up_key} }}\n    iifname \"{client_iface}\" tcp dport {port} update @up {{ {up_key} }}\n  }}\n  chain post {{\n    type filter hook postrouting priority 400; policy accept;\n    oifname \"{client_iface}\" tcp sport {port} update @down {{ {down_key} }}\n  }}\n}}\n",
        set("syn"),
        set("up"),
        set("down"),
    )
}

/// Installs the counters on `gateway`.
pub(crate) fn install_watch(topology: &Topology, gateway: &str, port: u16) -> anyhow::Result<()> {
    let script = watch_script(topology.iface(gateway, EDGE), port);
    topology
        .program(gateway, "nft")
        .args(["-f", "-"])
        .stdin(script)
        .run()
        .with_context(|| format!("{gateway}: cannot install the flow counters"))?;
    Ok(())
}

/// Empties `gateway`'s counters (before a phase: client ports are reused between phases).
pub(crate) fn reset_watch(topology: &Topology, gateway: &str) -> anyhow::Result<()> {
    for set in ["syn", "up", "down"] {
        let argv: Vec<String> = ["nft", "flush", "set", "inet", WATCH_TABLE, set]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        run_in(topology, gateway, &argv)?;
    }
    Ok(())
}

/// Packets a gateway counted for one flow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FlowCount {
    pub syn: u64,
    pub up: u64,
    pub down: u64,
}

/// A gateway's counters, by client flow (client address:port; the server is always the same).
pub(crate) type Counters = BTreeMap<SocketAddrV4, FlowCount>;

/// Reads `gateway`'s counters.
pub(crate) fn read_watch(topology: &Topology, gateway: &str) -> anyhow::Result<Counters> {
    let mut counters = Counters::new();
    for set in ["syn", "up", "down"] {
        let argv: Vec<String> = ["nft", "list", "set", "inet", WATCH_TABLE, set]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let text = run_in(topology, gateway, &argv)?;
        for (client, packets) in parse_set(&text) {
            let count = counters.entry(client).or_default();
            match set {
                "syn" => count.syn += packets,
                "up" => count.up += packets,
                _ => count.down += packets,
            }
        }
    }
    Ok(counters)
}

/// The elements of `nft list set` output: `A . P . B . Q counter packets N bytes M`, as the client
/// end (A:P) and N. Elements that do not parse are skipped.
pub(crate) fn parse_set(text: &str) -> Vec<(SocketAddrV4, u64)> {
    let Some(start) = text.find("elements = {") else {
        return Vec::new();
    };
    let body = &text[start + "elements = {".len()..];
    let body = body.split('}').next().unwrap_or("");
    body.split(',')
        .filter_map(|element| {
            let words: Vec<&str> = element.split_whitespace().collect();
            // A . P . B . Q counter packets N bytes M
            let addr: Ipv4Addr = words.first()?.parse().ok()?;
            let port: u16 = words.get(2)?.parse().ok()?;
            let at = words.iter().position(|w| *w == "packets")?;
            let packets: u64 = words.get(at + 1)?.parse().ok()?;
            Some((SocketAddrV4::new(addr, port), packets))
        })
        .collect()
}

/// The resilient group's buckets on `router` that the kernel saw carry a packet within the
/// idle timer, and all of them (`ip -s nexthop bucket show`; iproute2 6.1's `nhid` filter
/// does not work, so the dump is filtered here).
pub(crate) fn busy_buckets(topology: &Topology, router: &str) -> anyhow::Result<(usize, usize)> {
    let argv: Vec<String> = ["ip", "-s", "nexthop", "bucket", "show"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    let out = run_in(topology, router, &argv)?;
    Ok(parse_busy_buckets(&out))
}

fn parse_busy_buckets(dump: &str) -> (usize, usize) {
    let group = GROUP_ID.to_string();
    let idle_times: Vec<f64> = dump
        .lines()
        .filter(|line| line.split_whitespace().nth(1) == Some(group.as_str()))
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "idle_time")?;
            words.get(at + 1)?.parse().ok()
        })
        .collect();
    let busy = idle_times
        .iter()
        .filter(|t| **t < f64::from(RESILIENT_IDLE_SECS))
        .count();
    (busy, idle_times.len())
}

/// `ip route` (and `ip nexthop`) of a router, for the report.
pub(crate) fn routes_text(topology: &Topology, router: &str) -> String {
    let mut text = String::new();
    for argv in [["ip", "route", "show"], ["ip", "nexthop", "show"]] {
        let argv: Vec<String> = argv.iter().map(|s| (*s).to_owned()).collect();
        if let Ok(out) = run_in(topology, router, &argv) {
            text.push_str(&out);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hops() -> Vec<NextHop> {
        vec![
            NextHop {
                via: "10.0.2.2".into(),
                dev: "to-gw1".into(),
            },
            NextHop {
                via: "10.0.3.2".into(),
                dev: "to-gw2".into(),
            },
        ]
    }

    fn joined(commands: &[Vec<String>]) -> Vec<String> {
        commands.iter().map(|c| c.join(" ")).collect()
    }

    #[test]
    fn a_multipath_route_lists_the_live_next_hops_after_the_l4_hash() {
        let c = joined(&ecmp_commands(
            Spreading::Multipath,
            "10.0.6.0/24",
            &hops(),
            &[true, true],
        ));
        assert_eq!(c[0], "sysctl -q -w net.ipv4.fib_multipath_hash_policy=1");
        assert_eq!(c[1], "sysctl -q -w net.ipv4.fib_multipath_hash_seed=32");
        assert_eq!(c[2], "ip route replace 10.0.6.0/24 nexthop via 10.0.2.2 dev to-gw1 weight 1 nexthop via 10.0.3.2 dev to-gw2 weight 1");
        let one = joined(&ecmp_commands(
            Spreading::Multipath,
            "10.0.6.0/24",
            &hops(),
            &[true, false],
        ));
        assert_eq!(
            one[2],
            "ip route replace 10.0.6.0/24 nexthop via 10.0.2.2 dev to-gw1 weight 1"
        );
    }

    #[test]
    fn a_resilient_group_holds_the_live_next_hops_and_the_route_points_at_it() {
        let c = joined(&ecmp_commands(
            Spreading::Resilient { objects: 1 },
            "10.0.1.0/24",
            &hops(),
            &[false, true],
        ));
        assert_eq!(
            c[2..],
            [
                "ip nexthop replace id 2 via 10.0.3.2 dev to-gw2".to_owned(),
                "ip nexthop replace id 100 group 2 type resilient buckets 32 idle_timer 2"
                    .to_owned(),
                "ip route replace 10.0.1.0/24 nhid 100".to_owned(),
            ]
        );
    }

    #[test]
    fn paired_objects_put_every_gateway_in_the_group_twice() {
        let c = joined(&ecmp_commands(
            Spreading::Resilient { objects: 2 },
            "10.0.1.0/24",
            &hops(),
            &[true, false],
        ));
        assert_eq!(
            c[2..],
            [
                "ip nexthop replace id 1 via 10.0.2.2 dev to-gw1".to_owned(),
                "ip nexthop replace id 11 via 10.0.2.2 dev to-gw1".to_owned(),
                "ip nexthop replace id 100 group 1/11 type resilient buckets 32 idle_timer 2"
                    .to_owned(),
                "ip route replace 10.0.1.0/24 nhid 100".to_owned(),
            ]
        );
    }

    #[test]
    fn busy_buckets_are_those_used_within_the_idle_timer() {
        let dump = "id 100 index 0 idle_time 0.01 nhid 2 \nid 100 index 1 idle_time 13.63 nhid 1 \nid 7 index 0 idle_time 0 nhid 3 \nid 100 index 2 idle_time 1.99 nhid 1 \n";
        assert_eq!(parse_busy_buckets(dump), (2, 3));
    }

    #[test]
    fn set_elements_give_the_client_end_and_the_packets() {
        let text = "table inet ecmpwatch {\n\tset up {\n\t\ttype ipv4_addr . inet_service . ipv4_addr . inet_service\n\t\tsize 65535\n\t\tflags dynamic\n\t\tcounter\n\t\telements = { 10.0.1.101 . 39072 . 10.0.6.2 . 5001 counter packets 7 bytes 420,\n\t\t\t     10.0.1.102 . 39076 . 10.0.6.2 . 5001 counter packets 1 bytes 60 }\n\t}\n}";
        assert_eq!(
            parse_set(text),
            vec![
                ("10.0.1.101:39072".parse().unwrap(), 7),
                ("10.0.1.102:39076".parse().unwrap(), 1)
            ]
        );
        assert!(parse_set("table inet ecmpwatch {\n\tset up {\n\t}\n}").is_empty());
    }

    #[test]
    fn the_watch_counts_both_directions_on_the_client_side_interface() {
        let script = watch_script("to-edge", 5001);
        assert!(script.contains("iifname \"to-edge\" tcp dport 5001 update @up"));
        assert!(script.contains("oifname \"to-edge\" tcp sport 5001 update @down { ip daddr . tcp dport . ip saddr . tcp sport }"));
        assert!(script.contains("tcp flags & (syn | ack) == syn update @syn"));
    }

    #[test]
    fn every_gateway_reaches_both_routers() {
        let spec = topology_spec();
        for g in GATEWAYS {
            for r in [EDGE, CORE] {
                assert!(spec
                    .links
                    .iter()
                    .any(|l| (l.a == g && l.b == r) || (l.a == r && l.b == g)));
            }
        }
        midway_labnet::validate(&spec).unwrap();
    }
}
