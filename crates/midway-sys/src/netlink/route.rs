//! Routes: list a table, add / append / replace / delete one, flush a table, and set one metric
//! on every route of a table, as `ip route` does.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::{Netlink, NetlinkError, RouteMetric, RouteMetrics};

/// The `main` routing table.
pub const TABLE_MAIN: u32 = 254;
/// The `local` routing table (addresses of this host; looked up before any policy rule).
pub const TABLE_LOCAL: u32 = 255;

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4 (`ip -4`).
    V4,
    /// IPv6 (`ip -6`).
    V6,
}

impl Family {
    /// The family of `address`.
    pub fn of(address: IpAddr) -> Family {
        match address {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub(crate) fn netlink(self) -> AddressFamily {
        match self {
            Family::V4 => AddressFamily::Inet,
            Family::V6 => AddressFamily::Inet6,
        }
    }

    /// The prefix that covers every address of the family (`default`).
    pub fn any(self) -> IpNet {
        match self {
            Family::V4 => IpNet::V4(ipnet::Ipv4Net::default()),
            Family::V6 => IpNet::V6(ipnet::Ipv6Net::default()),
        }
    }
}

/// A route's type (`RTN_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    /// An ordinary route (the default).
    Unicast,
    /// `local`: deliver to this host.
    Local,
    /// `blackhole`: drop silently.
    Blackhole,
    /// `unreachable`: drop with "host unreachable".
    Unreachable,
    /// `prohibit`: drop with "administratively prohibited".
    Prohibit,
    /// `throw`: continue with the next policy rule.
    Throw,
    /// Any other type, by number.
    Other(u8),
}

impl RouteKind {
    fn to_u8(self) -> u8 {
        match self {
            RouteKind::Unicast => 1,
            RouteKind::Local => 2,
            RouteKind::Blackhole => 6,
            RouteKind::Unreachable => 7,
            RouteKind::Prohibit => 8,
            RouteKind::Throw => 9,
            RouteKind::Other(n) => n,
        }
    }

    fn from_u8(n: u8) -> RouteKind {
        match n {
            1 => RouteKind::Unicast,
            2 => RouteKind::Local,
            6 => RouteKind::Blackhole,
            7 => RouteKind::Unreachable,
            8 => RouteKind::Prohibit,
            9 => RouteKind::Throw,
            n => RouteKind::Other(n),
        }
    }
}

/// Who installed a route (`RTPROT_*`, `ip route ... proto`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteProtocol {
    /// Not given (matches any when deleting).
    Unspec,
    /// `kernel`: the kernel's own (connected prefixes).
    Kernel,
    /// `boot`: what `ip route add` sets by default.
    Boot,
    /// `static`: an administrator's.
    Static,
    /// Any other, by number.
    Other(u8),
}

impl RouteProtocol {
    fn to_u8(self) -> u8 {
        match self {
            RouteProtocol::Unspec => 0,
            RouteProtocol::Kernel => 2,
            RouteProtocol::Boot => 3,
            RouteProtocol::Static => 4,
            RouteProtocol::Other(n) => n,
        }
    }

    fn from_u8(n: u8) -> RouteProtocol {
        match n {
            0 => RouteProtocol::Unspec,
            2 => RouteProtocol::Kernel,
            3 => RouteProtocol::Boot,
            4 => RouteProtocol::Static,
            n => RouteProtocol::Other(n),
        }
    }
}

/// How far a route's destination is (`RT_SCOPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteScope {
    /// Anywhere (routes through a gateway).
    Universe,
    /// On a directly attached link.
    Link,
    /// On this host.
    Host,
    /// No destination (matches any when deleting).
    Nowhere,
    /// Any other, by number.
    Other(u8),
}

impl RouteScope {
    fn to_u8(self) -> u8 {
        match self {
            RouteScope::Universe => 0,
            RouteScope::Link => 253,
            RouteScope::Host => 254,
            RouteScope::Nowhere => 255,
            RouteScope::Other(n) => n,
        }
    }

    fn from_u8(n: u8) -> RouteScope {
        match n {
            0 => RouteScope::Universe,
            253 => RouteScope::Link,
            254 => RouteScope::Host,
            255 => RouteScope::Nowhere,
            n => RouteScope::Other(n),
        }
    }
}

/// One route. Build one with [`Route::to`] and set the fields that matter; routes listed by
/// [`Netlink::routes`] have every field the kernel reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination prefix (`0.0.0.0/0`, `::/0` for `default`).
    pub destination: IpNet,
    /// Routing table.
    pub table: u32,
    /// Type.
    pub kind: RouteKind,
    /// `via`.
    pub gateway: Option<IpAddr>,
    /// `dev`, as an interface index ([`Netlink::link_index`]).
    pub device: Option<u32>,
    /// `proto`.
    pub protocol: RouteProtocol,
    /// `scope`; `None` chooses as `ip route add` does: host for `local`, link for a route
    /// without gateway, universe otherwise.
    pub scope: Option<RouteScope>,
    /// `src`: preferred source address.
    pub preferred_source: Option<IpAddr>,
    /// `metric`: the route's priority among routes to the same prefix.
    pub priority: Option<u32>,
    /// `onlink`: the gateway is on the link even if no prefix says so.
    pub onlink: bool,
    /// The TCP metrics (`initcwnd`, `rto_min`, ...).
    pub metrics: RouteMetrics,
    /// Whether the kernel listed it with several next hops (which this type does not carry:
    /// such a route cannot be recreated from it).
    pub multipath: bool,
}

impl Route {
    /// A unicast route to `destination` in `main`, protocol `boot`, as `ip route add` starts.
    pub fn to(destination: IpNet) -> Route {
        Route {
            destination,
            table: TABLE_MAIN,
            kind: RouteKind::Unicast,
            gateway: None,
            device: None,
            protocol: RouteProtocol::Boot,
            scope: None,
            preferred_source: None,
            priority: None,
            onlink: false,
            metrics: RouteMetrics::new(),
            multipath: false,
        }
    }

    /// The route's address family.
    pub fn family(&self) -> Family {
        Family::of(self.destination.addr())
    }

    fn effective_scope(&self) -> RouteScope {
        self.scope.unwrap_or(match (self.kind, self.gateway) {
            (RouteKind::Local, _) => RouteScope::Host,
            (RouteKind::Unicast, None) => RouteScope::Link,
            _ => RouteScope::Universe,
        })
    }

    /// The rtnetlink message that adds this route (`for_delete`: scope and protocol left as
    /// wildcards and no metrics, so the kernel matches the route however it was added).
    pub(crate) fn message(&self, for_delete: bool) -> RouteMessage {
        let mut message = RouteMessage::default();
        let header: &mut RouteHeader = &mut message.header;
        header.address_family = self.family().netlink();
        header.destination_prefix_length = self.destination.prefix_len();
        header.table = u8::try_from(self.table).unwrap_or(0);
        header.kind = RouteKind::to_u8(self.kind).into();
        if for_delete {
            header.scope = RouteScope::Nowhere.to_u8().into();
            header.protocol = RouteProtocol::Unspec.to_u8().into();
        } else {
            header.scope = self.effective_scope().to_u8().into();
            header.protocol = self.protocol.to_u8().into();
        }
        if self.onlink {
            header.flags = RouteFlags::Onlink;
        }
        let attributes = &mut message.attributes;
        if self.destination.prefix_len() > 0 {
            attributes.push(RouteAttribute::Destination(self.destination.addr().into()));
        }
        attributes.push(RouteAttribute::Table(self.table));
        if let Some(gateway) = self.gateway {
            attributes.push(RouteAttribute::Gateway(gateway.into()));
        }
        if let Some(device) = self.device {
            attributes.push(RouteAttribute::Oif(device));
        }
        if let Some(source) = self.preferred_source {
            attributes.push(RouteAttribute::PrefSource(source.into()));
        }
        if let Some(priority) = self.priority {
            attributes.push(RouteAttribute::Priority(priority));
        }
        if !for_delete && !self.metrics.is_empty() {
            attributes.push(RouteAttribute::Metrics(self.metrics.to_netlink()));
        }
        message
    }

    /// The route a kernel message describes; `None` for a family or address midway does not
    /// handle (MPLS, a gateway given as `via inet ...`).
    pub(crate) fn from_message(message: &RouteMessage) -> Option<Route> {
        let header = &message.header;
        let family = match header.address_family {
            AddressFamily::Inet => Family::V4,
            AddressFamily::Inet6 => Family::V6,
            _ => return None,
        };
        let mut route = Route::to(family.any());
        let mut destination = None;
        route.table = u32::from(header.table);
        route.kind = RouteKind::from_u8(header.kind.into());
        route.protocol = RouteProtocol::from_u8(header.protocol.into());
        route.scope = Some(RouteScope::from_u8(header.scope.into()));
        route.onlink = header.flags.contains(RouteFlags::Onlink);
        for attribute in &message.attributes {
            match attribute {
                RouteAttribute::Destination(a) => destination = Some(ip(a)?),
                RouteAttribute::Table(t) => route.table = *t,
                RouteAttribute::Gateway(a) => route.gateway = Some(ip(a)?),
                RouteAttribute::Oif(i) => route.device = Some(*i),
                RouteAttribute::PrefSource(a) => route.preferred_source = Some(ip(a)?),
                RouteAttribute::Priority(p) => route.priority = Some(*p),
                RouteAttribute::Metrics(m) => route.metrics = RouteMetrics::from_netlink(m),
                RouteAttribute::MultiPath(_) => route.multipath = true,
                _ => {}
            }
        }
        let address = destination.unwrap_or(route.destination.addr());
        route.destination = IpNet::new(address, header.destination_prefix_length).ok()?;
        Some(route)
    }
}

fn ip(address: &RouteAddress) -> Option<IpAddr> {
    match address {
        RouteAddress::Inet(a) => Some(IpAddr::V4(*a)),
        RouteAddress::Inet6(a) => Some(IpAddr::V6(*a)),
        _ => None,
    }
}

impl fmt::Display for Route {
    /// In `ip route`'s words, the device by index (`dev #3`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            RouteKind::Unicast => {}
            RouteKind::Local => write!(f, "local ")?,
            RouteKind::Blackhole => write!(f, "blackhole ")?,
            RouteKind::Unreachable => write!(f, "unreachable ")?,
            RouteKind::Prohibit => write!(f, "prohibit ")?,
            RouteKind::Throw => write!(f, "throw ")?,
            RouteKind::Other(n) => write!(f, "type {n} ")?,
        }
        write!(f, "{}", self.destination)?;
        if let Some(gateway) = self.gateway {
            write!(f, " via {gateway}")?;
        }
        if let Some(device) = self.device {
            write!(f, " dev #{device}")?;
        }
        write!(f, " table {}", self.table)?;
        if let Some(source) = self.preferred_source {
            write!(f, " src {source}")?;
        }
        if let Some(priority) = self.priority {
            write!(f, " metric {priority}")?;
        }
        if self.onlink {
            write!(f, " onlink")?;
        }
        if !self.metrics.is_empty() {
            write!(f, " {}", self.metrics)?;
        }
        Ok(())
    }
}

impl Netlink {
    /// The routes of `table` for `family` (`ip -4|-6 route show table T`), leaving out the
    /// kernel's cached clones.
    pub fn routes(&mut self, family: Family, table: u32) -> Result<Vec<Route>, NetlinkError> {
        let mut query = RouteMessage::default();
        query.header.address_family = family.netlink();
        let request = format!("route show table {table} ({family:?})");
        let messages = self.dump(RouteNetlinkMessage::GetRoute(query), &request)?;
        Ok(messages
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(route) => Some(route),
                _ => None,
            })
            // A kernel without IPv6 answers an IPv6 dump with every family's routes.
            .filter(|m| m.header.address_family == family.netlink())
            .filter(|m| !m.header.flags.contains(RouteFlags::Cloned))
            .filter_map(Route::from_message)
            .filter(|r| r.table == table)
            .collect())
    }

    /// `ip route add`: fails with `EEXIST` if the route exists.
    pub fn add_route(&mut self, route: &Route) -> Result<(), NetlinkError> {
        self.route_request(route, NLM_F_CREATE | NLM_F_EXCL, "add")
    }

    /// `ip route append`: adds the route next to others to the same prefix that differ in
    /// device or gateway (every IPv6 interface has its own `fe80::/64` at the same metric).
    pub fn append_route(&mut self, route: &Route) -> Result<(), NetlinkError> {
        self.route_request(route, NLM_F_CREATE | NLM_F_APPEND, "append")
    }

    /// `ip route replace`: adds the route or replaces the one to the same prefix (and
    /// priority) with it.
    pub fn replace_route(&mut self, route: &Route) -> Result<(), NetlinkError> {
        self.route_request(route, NLM_F_CREATE | NLM_F_REPLACE, "replace")
    }

    /// `ip route del`: removes the route (matched by destination, table, type, device,
    /// gateway and priority where given).
    pub fn delete_route(&mut self, route: &Route) -> Result<(), NetlinkError> {
        let request = format!("route del {route}");
        self.request(
            RouteNetlinkMessage::DelRoute(route.message(true)),
            0,
            &request,
        )
    }

    /// `ip route flush table T`: removes every route of `table` for `family`; how many there
    /// were. An empty (or never used) table is not an error.
    pub fn flush_table(&mut self, family: Family, table: u32) -> Result<usize, NetlinkError> {
        let routes = self.routes(family, table)?;
        for route in &routes {
            match self.delete_route(route) {
                Err(e) if e.is_not_found() => {}
                other => other?,
            }
        }
        Ok(routes.len())
    }

    /// Sets `metric` on every route of `table` for `family`, replacing an earlier value of the
    /// same metric and keeping the others (multipath routes are left alone). Returns how many
    /// routes were changed.
    pub fn set_metric_on_routes(
        &mut self,
        family: Family,
        table: u32,
        metric: &RouteMetric,
    ) -> Result<usize, NetlinkError> {
        let mut changed = 0;
        for mut route in self.routes(family, table)? {
            if route.multipath {
                continue;
            }
            route.metrics.set(metric.clone());
            self.replace_route(&route)?;
            changed += 1;
        }
        Ok(changed)
    }

    fn route_request(&mut self, route: &Route, flags: u16, verb: &str) -> Result<(), NetlinkError> {
        let request = format!("route {verb} {route}");
        self.request(
            RouteNetlinkMessage::NewRoute(route.message(false)),
            flags,
            &request,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::Metric;

    fn net(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    #[test]
    fn a_route_survives_the_trip_through_its_message() {
        let mut route = Route::to(net("10.234.0.0/16"));
        route.table = 1000;
        route.gateway = Some("10.233.0.2".parse().unwrap());
        route.device = Some(3);
        route.priority = Some(5);
        route.metrics = "mtu lock 576 initcwnd 10 rto_min 1s congctl reno"
            .parse()
            .unwrap();
        let message = route.message(false);
        // Tables above 255 go in RTA_TABLE only.
        assert_eq!(message.header.table, 0);
        let back = Route::from_message(&message).unwrap();
        assert_eq!(back.scope, Some(RouteScope::Universe));
        assert_eq!(
            Route {
                scope: None,
                ..back
            },
            route
        );
        assert_eq!(
            route.to_string(),
            "10.234.0.0/16 via 10.233.0.2 dev #3 table 1000 metric 5 mtu lock 576 initcwnd 10 rto_min 1000ms congctl reno"
        );
    }

    #[test]
    fn scope_follows_ip_route_add() {
        let mut local = Route::to(Family::V6.any());
        local.kind = RouteKind::Local;
        assert_eq!(local.effective_scope(), RouteScope::Host);
        assert_eq!(local.to_string(), "local ::/0 table 254");
        assert_eq!(
            Route::to(net("10.0.0.0/24")).effective_scope(),
            RouteScope::Link
        );
        let mut via = Route::to(Family::V4.any());
        via.gateway = Some("10.0.0.1".parse().unwrap());
        assert_eq!(via.effective_scope(), RouteScope::Universe);
        // The default route carries no RTA_DST.
        assert!(!via
            .message(false)
            .attributes
            .iter()
            .any(|a| matches!(a, RouteAttribute::Destination(_))));
    }

    #[test]
    fn a_delete_matches_any_scope_and_protocol_and_sends_no_metrics() {
        let mut route = Route::to(net("fd00::/64"));
        route.metrics.set(RouteMetric::new(Metric::InitCwnd, 4));
        let message = route.message(true);
        assert_eq!(u8::from(message.header.scope), 255);
        assert_eq!(u8::from(message.header.protocol), 0);
        assert!(!message
            .attributes
            .iter()
            .any(|a| matches!(a, RouteAttribute::Metrics(_))));
    }

    #[test]
    fn any_is_the_default_prefix() {
        assert_eq!(Family::V4.any(), net("0.0.0.0/0"));
        assert_eq!(Family::V6.any(), net("::/0"));
    }
}
