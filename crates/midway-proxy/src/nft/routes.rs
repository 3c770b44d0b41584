//! The policy routing that delivers marked packets locally: `fwmark M lookup T` and a `local`
//! default route on `lo` in table `T`, per address family, set over rtnetlink (no iproute2).

use std::fmt;

use midway_sys::netlink::{Family, FwmarkRule, Netlink, NetlinkError, Route, RouteKind};
use serde::{Deserialize, Serialize};

/// The loopback interface the `local` routes point at.
const LOOPBACK: &str = "lo";

/// An address family as the install record writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum IpFamily {
    Ipv4,
    Ipv6,
}

impl IpFamily {
    fn netlink(self) -> Family {
        match self {
            IpFamily::Ipv4 => Family::V4,
            IpFamily::Ipv6 => Family::V6,
        }
    }

    /// `ip`'s family flag.
    fn flag(self) -> &'static str {
        match self {
            IpFamily::Ipv4 => "-4",
            IpFamily::Ipv6 => "-6",
        }
    }
}

/// One piece of policy routing midway adds for transparent interception; what the install
/// record lists, so a crash's leftovers are removed exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum PolicyRoute {
    /// `ip rule add fwmark MARK lookup TABLE`.
    Rule {
        family: IpFamily,
        mark: u32,
        table: u32,
    },
    /// `ip route add local default dev lo table TABLE`.
    LocalRoute { family: IpFamily, table: u32 },
}

impl PolicyRoute {
    /// The rule and the route that deliver packets marked `mark` locally through `table`.
    pub(crate) fn pair(family: IpFamily, mark: u32, table: u32) -> [PolicyRoute; 2] {
        [
            PolicyRoute::Rule {
                family,
                mark,
                table,
            },
            PolicyRoute::LocalRoute { family, table },
        ]
    }

    /// The `ip` command (after `ip`) an operator would type for `verb` ("add" or "del"), for
    /// `--print-nft` and messages.
    pub(crate) fn ip_words(&self, verb: &str) -> String {
        match *self {
            PolicyRoute::Rule {
                family,
                mark,
                table,
            } => format!("{} rule {verb} fwmark {mark} lookup {table}", family.flag()),
            PolicyRoute::LocalRoute { family, table } => format!(
                "{} route {verb} local {} dev {LOOPBACK} table {table}",
                family.flag(),
                family.netlink().any()
            ),
        }
    }

    /// Adds it; `EEXIST` ([`NetlinkError::is_exists`]) when an identical one is there.
    pub(crate) fn add(&self, netlink: &mut Netlink) -> Result<(), NetlinkError> {
        match *self {
            PolicyRoute::Rule {
                family,
                mark,
                table,
            } => netlink.add_rule(&FwmarkRule::new(family.netlink(), mark, table)),
            PolicyRoute::LocalRoute { family, table } => {
                let route = local_route(netlink, family, table)?;
                netlink.add_route(&route)
            }
        }
    }

    /// Removes it (the first matching rule, as `ip rule del` does).
    pub(crate) fn delete(&self, netlink: &mut Netlink) -> Result<(), NetlinkError> {
        match *self {
            PolicyRoute::Rule {
                family,
                mark,
                table,
            } => netlink.delete_rule(&FwmarkRule::new(family.netlink(), mark, table)),
            PolicyRoute::LocalRoute { family, table } => {
                let route = local_route(netlink, family, table)?;
                netlink.delete_route(&route)
            }
        }
    }

    /// Reads an entry of an install record written before the record was typed: the `ip`
    /// arguments of the delete command, in the two shapes that version wrote.
    pub(crate) fn from_old_delete(args: &[String]) -> Option<PolicyRoute> {
        let words: Vec<&str> = args.iter().map(String::as_str).collect();
        let family = |flag: &str| match flag {
            "-4" => Some(IpFamily::Ipv4),
            "-6" => Some(IpFamily::Ipv6),
            _ => None,
        };
        match words.as_slice() {
            [flag, "rule", "del", "fwmark", mark, "lookup", table] => Some(PolicyRoute::Rule {
                family: family(flag)?,
                mark: mark.parse().ok()?,
                table: table.parse().ok()?,
            }),
            [flag, "route", "del", "local", default, "dev", "lo", "table", table] => {
                let family = family(flag)?;
                let expected = match family {
                    IpFamily::Ipv4 => "0.0.0.0/0",
                    IpFamily::Ipv6 => "::/0",
                };
                (*default == expected).then_some(())?;
                Some(PolicyRoute::LocalRoute {
                    family,
                    table: table.parse().ok()?,
                })
            }
            _ => None,
        }
    }
}

/// `local default dev lo table TABLE`.
fn local_route(netlink: &mut Netlink, family: IpFamily, table: u32) -> Result<Route, NetlinkError> {
    Ok(Route {
        table,
        kind: RouteKind::Local,
        device: Some(netlink.link_index(LOOPBACK)?),
        ..Route::to(family.netlink().any())
    })
}

impl fmt::Display for PolicyRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ip {}", self.ip_words("add"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split(' ').map(String::from).collect()
    }

    #[test]
    fn the_old_records_ip_arguments_read_as_typed_entries() {
        for (family, mark, table) in [(IpFamily::Ipv4, 1, 100), (IpFamily::Ipv6, 7, 1000)] {
            for entry in PolicyRoute::pair(family, mark, table) {
                let old = words(&entry.ip_words("del"));
                assert_eq!(PolicyRoute::from_old_delete(&old), Some(entry), "{old:?}");
            }
        }
        assert_eq!(
            PolicyRoute::from_old_delete(&words("-4 route del local ::/0 dev lo table 1")),
            None
        );
        assert_eq!(
            PolicyRoute::from_old_delete(&words("-4 rule del fwmark x lookup 1")),
            None
        );
    }

    #[test]
    fn printed_as_the_ip_command_an_operator_would_type() {
        let [rule, route] = PolicyRoute::pair(IpFamily::Ipv6, 1, 100);
        assert_eq!(rule.ip_words("add"), "-6 rule add fwmark 1 lookup 100");
        assert_eq!(
            route.to_string(),
            "ip -6 route add local ::/0 dev lo table 100"
        );
    }
}
