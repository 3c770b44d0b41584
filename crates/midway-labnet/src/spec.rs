//! What a topology is made of, its validation, and the pure plan derived from it: namespace and
//! interface names, addresses, routes. Nothing here touches the system, so all of it is unit-tested.

use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use midway_linkemu::DirectionConfig;
use serde::{Deserialize, Serialize};

use crate::error::LabNetError;

/// Prefix of every name (namespace) the lab creates; `clean_leftovers` looks for it.
pub(crate) const NAME_PREFIX: &str = "mw";
/// Longest accepted host name.
pub(crate) const MAX_HOST_NAME: usize = 32;
/// Longest accepted tag (tags go into every namespace name).
pub const MAX_TAG: usize = 12;
/// One /24 per link, numbered 1..=255 in the third octet.
pub(crate) const MAX_LINKS: usize = 255;
/// Linux limit for interface names (IFNAMSIZ - 1).
const MAX_IFNAME: usize = 15;
/// Interface names of a link's two ends inside the link's own namespace.
pub(crate) const LINK_PEER_A: &str = "pa";
pub(crate) const LINK_PEER_B: &str = "pb";

/// A topology: hosts (each a network namespace) and the emulated links between them.
#[derive(Clone, Debug)]
pub struct TopologySpec {
    /// The hosts, each with a unique name.
    pub hosts: Vec<HostSpec>,
    /// The links; link n (from 0) gets the subnets 10.0.(n+1).0/24 and fd00:0:(n+1)::/64.
    pub links: Vec<LinkSpec>,
}

/// One host: a network namespace with a TCP stack profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSpec {
    /// The host's name (a-z, 0-9, '_', '-', starting with a letter, at most 32 characters); it
    /// goes into the name of the host's network namespace.
    pub name: String,
    /// The TCP stack profile the host's namespace gets.
    pub stack: StackProfile,
}

/// The TCP stack a host runs (the crate's `stack` module sets its sysctls and route metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StackProfile {
    /// Linux defaults of a fresh namespace (BBR on this kernel, SACK, timestamps, RACK, IW10).
    #[default]
    Modern,
    /// As close to a 1990s host as Linux allows: Reno, no SACK/timestamps, RTO floor 1 s,
    /// small receive window, MSS 536, initial window 2.
    Legacy,
}

impl std::fmt::Display for StackProfile {
    /// The profile's name as in scenario files: `modern` or `legacy`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StackProfile::Modern => "modern",
            StackProfile::Legacy => "legacy",
        })
    }
}

/// A point-to-point emulated link between hosts `a` and `b`, configured per direction.
#[derive(Clone, Debug)]
pub struct LinkSpec {
    /// Name of the host at end a.
    pub a: String,
    /// Name of the host at end b.
    pub b: String,
    /// Emulation of the traffic from a to b.
    pub a_to_b: DirectionConfig,
    /// Emulation of the traffic from b to a.
    pub b_to_a: DirectionConfig,
}

/// Checks a tag: it goes into every name and must be parseable back by `clean_leftovers`.
pub(crate) fn validate_tag(tag: &str) -> Result<(), LabNetError> {
    let ok = !tag.is_empty()
        && tag.len() <= MAX_TAG
        && tag
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(LabNetError::InvalidTag {
            tag: tag.to_owned(),
            max: MAX_TAG,
        })
    }
}

fn validate_host_name(name: &str) -> Result<(), LabNetError> {
    let mut bytes = name.bytes();
    let ok = name.len() <= MAX_HOST_NAME
        && bytes.next().is_some_and(|c| c.is_ascii_lowercase())
        && bytes.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-');
    if ok {
        Ok(())
    } else {
        Err(LabNetError::InvalidHostName {
            name: name.to_owned(),
            max: MAX_HOST_NAME,
        })
    }
}

/// Validates a spec without creating anything: host names, duplicates, links to unknown hosts,
/// self-links, duplicate links, link count.
pub fn validate(spec: &TopologySpec) -> Result<(), LabNetError> {
    if spec.hosts.is_empty() {
        return Err(LabNetError::NoHosts);
    }
    let mut seen = BTreeMap::new();
    for host in &spec.hosts {
        validate_host_name(&host.name)?;
        if seen.insert(host.name.as_str(), ()).is_some() {
            return Err(LabNetError::DuplicateHost(host.name.clone()));
        }
    }
    if spec.links.len() > MAX_LINKS {
        return Err(LabNetError::TooManyLinks {
            count: spec.links.len(),
            max: MAX_LINKS,
        });
    }
    let known = || {
        spec.hosts
            .iter()
            .map(|h| h.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut pairs = BTreeMap::new();
    for (index, link) in spec.links.iter().enumerate() {
        for end in [&link.a, &link.b] {
            if !seen.contains_key(end.as_str()) {
                return Err(LabNetError::UnknownHost {
                    index,
                    host: end.clone(),
                    known: known(),
                });
            }
        }
        if link.a == link.b {
            return Err(LabNetError::SelfLink {
                index,
                host: link.a.clone(),
            });
        }
        for (from, to, config) in [
            (&link.a, &link.b, &link.a_to_b),
            (&link.b, &link.a, &link.b_to_a),
        ] {
            config
                .validate()
                .map_err(|source| LabNetError::InvalidLinkConfig {
                    index,
                    a: from.clone(),
                    b: to.clone(),
                    source,
                })?;
        }
        let pair = if link.a < link.b {
            (&link.a, &link.b)
        } else {
            (&link.b, &link.a)
        };
        if pairs.insert(pair, ()).is_some() {
            return Err(LabNetError::DuplicateLink {
                a: link.a.clone(),
                b: link.b.clone(),
            });
        }
    }
    Ok(())
}

/// Name of the namespace of host `host` in a topology tagged `tag`.
pub fn host_netns_name(tag: &str, host: &str) -> String {
    format!("{NAME_PREFIX}{tag}-{host}")
}

/// Name of the namespace that holds the emulator of link `index` (0-based). The '.' cannot occur in
/// host names, so it never clashes with a host's namespace.
pub fn link_netns_name(tag: &str, index: usize) -> String {
    format!("{NAME_PREFIX}{tag}.l{}", index + 1)
}

/// The tag carried by a namespace name made by this crate, if it is one.
pub(crate) fn tag_of_netns_name(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let end = rest.find(['-', '.'])?;
    let tag = &rest[..end];
    validate_tag(tag).ok().map(|_| tag)
}

/// One end of a link on a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HostEnd {
    pub host: usize,
    pub iface: String,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
}

#[derive(Clone, Debug)]
pub(crate) struct LinkPlan {
    pub netns: String,
    pub a: HostEnd,
    pub b: HostEnd,
    pub v4_prefix: Ipv4Net,
    pub v6_prefix: Ipv6Net,
}

/// A route toward a prefix that is not on a host's own links.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RoutePlan {
    pub prefix: IpNet,
    pub via: IpAddr,
    pub dev: String,
}

#[derive(Clone, Debug)]
pub(crate) struct HostPlan {
    pub name: String,
    pub netns: String,
    /// Indices of the links this host is on.
    pub links: Vec<usize>,
    pub routes: Vec<RoutePlan>,
}

/// Everything `build` creates, computed up front.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub hosts: Vec<HostPlan>,
    pub links: Vec<LinkPlan>,
}

impl Plan {
    /// Index of the host called `name`, if there is one.
    pub(crate) fn host_index(&self, name: &str) -> Option<usize> {
        self.hosts.iter().position(|h| h.name == name)
    }

    /// The link between two hosts and which end is `host` (true = end a).
    pub(crate) fn link_between(&self, host: usize, neighbour: usize) -> Option<(usize, bool)> {
        self.hosts[host].links.iter().find_map(|&l| {
            let link = &self.links[l];
            if link.a.host == host && link.b.host == neighbour {
                Some((l, true))
            } else if link.b.host == host && link.a.host == neighbour {
                Some((l, false))
            } else {
                None
            }
        })
    }

    /// `host`'s end of the link to `neighbour`, if they are neighbours.
    pub(crate) fn end(&self, host: usize, neighbour: usize) -> Option<&HostEnd> {
        let (l, is_a) = self.link_between(host, neighbour)?;
        Some(if is_a {
            &self.links[l].a
        } else {
            &self.links[l].b
        })
    }
}

fn host_iface_name(neighbour: &str, link_index: usize) -> String {
    let wanted = format!("to-{neighbour}");
    if wanted.len() <= MAX_IFNAME {
        wanted
    } else {
        // "l<n>" cannot collide with "to-*" names on the same host.
        format!("l{}", link_index + 1)
    }
}

/// Validates `spec` and derives names, addresses and shortest-path routes.
pub(crate) fn plan(spec: &TopologySpec, tag: &str) -> Result<Plan, LabNetError> {
    validate_tag(tag)?;
    validate(spec)?;
    // `validate` has checked every link's ends; the errors below repeat its wording.
    let index_of = |index: usize, name: &str| {
        spec.hosts
            .iter()
            .position(|h| h.name == name)
            .ok_or_else(|| LabNetError::UnknownHost {
                index,
                host: name.to_owned(),
                known: String::new(),
            })
    };
    let mut hosts: Vec<HostPlan> = spec
        .hosts
        .iter()
        .map(|h| HostPlan {
            name: h.name.clone(),
            netns: host_netns_name(tag, &h.name),
            links: Vec::new(),
            routes: Vec::new(),
        })
        .collect();
    let mut links = Vec::with_capacity(spec.links.len());
    for (l, link) in spec.links.iter().enumerate() {
        let (a, b) = (index_of(l, &link.a)?, index_of(l, &link.b)?);
        let third = u8::try_from(l + 1).map_err(|_| LabNetError::TooManyLinks {
            count: spec.links.len(),
            max: MAX_LINKS,
        })?;
        let v4_prefix = Ipv4Net::new_assert(Ipv4Addr::new(10, 0, third, 0), 24);
        let v6_prefix = Ipv6Net::new_assert(
            Ipv6Addr::new(0xfd00, 0, u16::from(third), 0, 0, 0, 0, 0),
            64,
        );
        let end = |host: usize, neighbour: &str, last: u8| HostEnd {
            host,
            iface: host_iface_name(neighbour, l),
            v4: Ipv4Addr::new(10, 0, third, last),
            v6: Ipv6Addr::new(0xfd00, 0, u16::from(third), 0, 0, 0, 0, u16::from(last)),
        };
        links.push(LinkPlan {
            netns: link_netns_name(tag, l),
            a: end(a, &link.b, 1),
            b: end(b, &link.a, 2),
            v4_prefix,
            v6_prefix,
        });
        hosts[a].links.push(l);
        hosts[b].links.push(l);
    }
    let mut plan = Plan { hosts, links };
    for h in 0..plan.hosts.len() {
        plan.hosts[h].routes = routes_for(&plan, h);
    }
    Ok(plan)
}

/// Breadth-first search from `from`: hop count and first link taken toward every reachable host.
fn bfs(plan: &Plan, from: usize) -> Vec<Option<(usize, usize)>> {
    let mut best: Vec<Option<(usize, usize)>> = vec![None; plan.hosts.len()];
    let mut queue = VecDeque::new();
    // (hops, first link) for the source itself is never used as a route.
    best[from] = Some((0, usize::MAX));
    queue.push_back(from);
    while let Some(h) = queue.pop_front() {
        // Only reached hosts are queued.
        let Some((hops, first)) = best[h] else {
            continue;
        };
        for &l in &plan.hosts[h].links {
            let link = &plan.links[l];
            let next = if link.a.host == h {
                link.b.host
            } else {
                link.a.host
            };
            if best[next].is_none() {
                let first = if h == from { l } else { first };
                best[next] = Some((hops + 1, first));
                queue.push_back(next);
            }
        }
    }
    best
}

fn routes_for(plan: &Plan, h: usize) -> Vec<RoutePlan> {
    let reach = bfs(plan, h);
    let mut routes = Vec::new();
    for link in &plan.links {
        if link.a.host == h || link.b.host == h {
            continue; // connected prefix
        }
        // Route toward whichever end of the link is nearer.
        let target = match (reach[link.a.host], reach[link.b.host]) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            (Some(a), None) => Some(a),
            (None, Some(b)) => Some(b),
            (None, None) => None,
        };
        let Some((_, first_link)) = target else {
            continue;
        };
        let first = &plan.links[first_link];
        let (mine, theirs) = if first.a.host == h {
            (&first.a, &first.b)
        } else {
            (&first.b, &first.a)
        };
        routes.push(RoutePlan {
            prefix: IpNet::V4(link.v4_prefix),
            via: IpAddr::V4(theirs.v4),
            dev: mine.iface.clone(),
        });
        routes.push(RoutePlan {
            prefix: IpNet::V6(link.v6_prefix),
            via: IpAddr::V6(theirs.v6),
            dev: mine.iface.clone(),
        });
    }
    routes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str) -> HostSpec {
        HostSpec {
            name: name.into(),
            stack: StackProfile::Modern,
        }
    }

    fn link(a: &str, b: &str) -> LinkSpec {
        LinkSpec {
            a: a.into(),
            b: b.into(),
            a_to_b: DirectionConfig::default(),
            b_to_a: DirectionConfig::default(),
        }
    }

    fn chain() -> TopologySpec {
        TopologySpec {
            hosts: vec![host("client"), host("proxy"), host("server")],
            links: vec![link("client", "proxy"), link("proxy", "server")],
        }
    }

    #[test]
    fn chain_addresses_and_routes() {
        let plan = plan(&chain(), "t1").unwrap();
        assert_eq!(plan.hosts[0].netns, "mwt1-client");
        assert_eq!(plan.links[1].netns, "mwt1.l2");
        let c = plan.end(0, 1).unwrap();
        assert_eq!(
            (c.iface.as_str(), c.v4),
            ("to-proxy", Ipv4Addr::new(10, 0, 1, 1))
        );
        let s = plan.end(2, 1).unwrap();
        assert_eq!(s.v4, Ipv4Addr::new(10, 0, 2, 2));
        assert_eq!(s.v6, "fd00:0:2::2".parse::<Ipv6Addr>().unwrap());
        // The client reaches the server's link through the proxy; the proxy needs no routes.
        assert_eq!(
            plan.hosts[0].routes,
            vec![
                RoutePlan {
                    prefix: "10.0.2.0/24".parse().unwrap(),
                    via: "10.0.1.2".parse().unwrap(),
                    dev: "to-proxy".into()
                },
                RoutePlan {
                    prefix: "fd00:0:2::/64".parse().unwrap(),
                    via: "fd00:0:1::2".parse().unwrap(),
                    dev: "to-proxy".into()
                },
            ]
        );
        assert!(plan.hosts[1].routes.is_empty());
        assert_eq!(
            plan.hosts[2].routes[0].via,
            "10.0.2.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn shortest_path_wins_over_longer_one() {
        // a - b - c - d and a shortcut a - d: a reaches c's links via the nearer end.
        let spec = TopologySpec {
            hosts: ["a", "b", "c", "d"].into_iter().map(host).collect(),
            links: vec![
                link("a", "b"),
                link("b", "c"),
                link("c", "d"),
                link("a", "d"),
            ],
        };
        let plan = plan(&spec, "x").unwrap();
        let a_routes = &plan.hosts[0].routes;
        let to_bc = a_routes
            .iter()
            .find(|r| r.prefix == "10.0.2.0/24".parse().unwrap())
            .unwrap();
        assert_eq!(to_bc.dev, "to-b");
        let to_cd = a_routes
            .iter()
            .find(|r| r.prefix == "10.0.3.0/24".parse().unwrap())
            .unwrap();
        assert_eq!(to_cd.dev, "to-d");
        assert_eq!(to_cd.via, "10.0.4.2".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn long_neighbour_names_get_short_ifaces() {
        let spec = TopologySpec {
            hosts: vec![host("a"), host("averyveryverylongname")],
            links: vec![link("a", "averyveryverylongname")],
        };
        let plan = plan(&spec, "x").unwrap();
        assert_eq!(plan.links[0].a.iface, "l1");
        assert_eq!(plan.links[0].b.iface, "to-a");
    }

    #[test]
    fn validation_errors() {
        let mut spec = chain();
        spec.links.push(link("client", "nowhere"));
        assert!(matches!(
            plan(&spec, "t"),
            Err(LabNetError::UnknownHost { index: 2, .. })
        ));
        let mut spec = chain();
        spec.hosts.push(host("proxy"));
        assert!(matches!(plan(&spec, "t"), Err(LabNetError::DuplicateHost(h)) if h == "proxy"));
        let mut spec = chain();
        spec.links.push(link("server", "proxy"));
        assert!(matches!(
            plan(&spec, "t"),
            Err(LabNetError::DuplicateLink { .. })
        ));
        let mut spec = chain();
        spec.links.push(link("proxy", "proxy"));
        assert!(matches!(
            plan(&spec, "t"),
            Err(LabNetError::SelfLink { .. })
        ));
        let mut spec = chain();
        spec.hosts[0].name = "Bad.Name".into();
        assert!(matches!(
            plan(&spec, "t"),
            Err(LabNetError::InvalidHostName { .. })
        ));
        assert!(matches!(
            plan(&chain(), "has-dash"),
            Err(LabNetError::InvalidTag { .. })
        ));
        assert!(matches!(
            plan(
                &TopologySpec {
                    hosts: vec![],
                    links: vec![]
                },
                "t"
            ),
            Err(LabNetError::NoHosts)
        ));
    }

    #[test]
    fn bad_outages_and_udp_impairments_name_the_link_direction() {
        use midway_linkemu::{
            ConfigError, OutageError, OutageSchedule, PeriodicOutage, UdpAction, UdpError,
            UdpImpairment,
        };
        use std::time::Duration;
        let mut spec = chain();
        spec.links[1].b_to_a.outages = OutageSchedule {
            periodic: Some(PeriodicOutage {
                period: Duration::from_millis(100),
                duration: Duration::from_millis(100),
                offset: Duration::ZERO,
            }),
            once: Vec::new(),
        };
        match validate(&spec) {
            Err(LabNetError::InvalidLinkConfig {
                index: 1,
                a,
                b,
                source: ConfigError::Outages(OutageError::LongerThanPeriod { .. }),
            }) => assert_eq!((a.as_str(), b.as_str()), ("server", "proxy")),
            other => panic!("unexpected: {other:?}"),
        }
        let mut spec = chain();
        spec.links[0].a_to_b.udp = Some(UdpImpairment {
            port: None,
            action: UdpAction::RateLimit {
                rate_bps: 0,
                burst_bytes: 10_000,
            },
        });
        assert!(matches!(
            validate(&spec),
            Err(LabNetError::InvalidLinkConfig {
                index: 0,
                source: ConfigError::Udp(UdpError::ZeroRate),
                ..
            })
        ));
        // Valid ones pass.
        spec.links[0].a_to_b.udp = Some(UdpImpairment {
            port: Some(443),
            action: UdpAction::Drop,
        });
        assert!(validate(&spec).is_ok());
    }

    #[test]
    fn tags_round_trip_through_names() {
        assert_eq!(
            tag_of_netns_name(&host_netns_name("ab12", "my-host")),
            Some("ab12")
        );
        assert_eq!(tag_of_netns_name(&link_netns_name("ab12", 3)), Some("ab12"));
        assert_eq!(tag_of_netns_name("mwprobe"), None);
        assert_eq!(tag_of_netns_name("other-ns"), None);
    }

    #[test]
    fn stack_profile_serde_is_lowercase() {
        assert_eq!(
            serde_json::to_string(&StackProfile::Legacy).unwrap(),
            "\"legacy\""
        );
        assert_eq!(
            serde_json::from_str::<StackProfile>("\"modern\"").unwrap(),
            StackProfile::Modern
        );
        assert!(serde_json::from_str::<StackProfile>("\"Modern\"").is_err());
    }
}
