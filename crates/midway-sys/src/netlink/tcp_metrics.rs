//! The kernel's TCP metrics cache (`ip tcp_metrics show`): what Linux remembered about a peer
//! when a connection to it closed (RTT, window, slow-start threshold, reordering), which the
//! next connection to that peer starts from.
//!
//! The cache is read over generic netlink (family `tcp_metrics`), not rtnetlink, so it has a
//! socket of its own: [`TcpMetricsCache`] resolves the family's number with the controller
//! (`nlctrl`) once, then dumps the cache as `ip tcp_metrics show` does. Like a [`Netlink`]
//! socket, it stays in the network namespace it was opened in.
//!
//! [`Netlink`]: super::Netlink

use std::fmt::{self, Debug};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NlasIterator, ParseableParametrized, NLM_F_ACK, NLM_F_DUMP,
};
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
use netlink_sys::protocols::NETLINK_GENERIC;

use super::channel::Channel;
use super::NetlinkError;

/// The generic netlink family's name (`TCP_METRICS_GENL_NAME`).
const FAMILY_NAME: &str = "tcp_metrics";
/// `TCP_METRICS_GENL_VERSION`.
const FAMILY_VERSION: u8 = 1;
/// `TCP_METRICS_CMD_GET`.
const CMD_GET: u8 = 1;

// `TCP_METRICS_ATTR_*` (include/uapi/linux/tcp_metrics.h).
const ATTR_ADDR_IPV4: u16 = 1;
const ATTR_ADDR_IPV6: u16 = 2;
const ATTR_AGE: u16 = 3;
const ATTR_VALS: u16 = 6;
const ATTR_SADDR_IPV4: u16 = 11;
const ATTR_SADDR_IPV6: u16 = 12;

// Kinds inside `TCP_METRICS_ATTR_VALS`: `TCP_METRIC_*` + 1.
const VAL_SSTHRESH: u16 = 3;
const VAL_CWND: u16 = 4;
const VAL_REORDERING: u16 = 5;
const VAL_RTT_US: u16 = 6;
const VAL_RTTVAR_US: u16 = 7;

/// One entry of the cache: a destination (and, on kernels that key by it, the local source
/// address) with what the kernel keeps for it; a value the kernel did not report is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcpMetricsEntry {
    /// The peer.
    pub destination: Option<IpAddr>,
    /// The local address the connection used.
    pub source: Option<IpAddr>,
    /// How long ago the entry was last updated.
    pub age: Option<Duration>,
    /// Smoothed RTT, in microseconds.
    pub rtt_us: Option<u32>,
    /// RTT variance, in microseconds.
    pub rttvar_us: Option<u32>,
    /// Slow-start threshold, in segments.
    pub ssthresh: Option<u32>,
    /// Congestion window, in segments.
    pub cwnd: Option<u32>,
    /// Duplicate-ACK threshold the next connection starts with.
    pub reordering: Option<u32>,
}

impl fmt::Display for TcpMetricsEntry {
    /// Close to `ip tcp_metrics show`'s line: `10.0.1.1 age 0.52sec cwnd 10 rtt 40120us rttvar
    /// 20060us reordering 5 source 10.0.1.2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.destination {
            Some(address) => write!(f, "{address}")?,
            None => write!(f, "?")?,
        }
        if let Some(age) = self.age {
            write!(f, " age {:.3}sec", age.as_secs_f64())?;
        }
        for (name, value) in [("ssthresh", self.ssthresh), ("cwnd", self.cwnd)] {
            if let Some(value) = value {
                write!(f, " {name} {value}")?;
            }
        }
        for (name, value) in [("rtt", self.rtt_us), ("rttvar", self.rttvar_us)] {
            if let Some(value) = value {
                write!(f, " {name} {value}us")?;
            }
        }
        if let Some(reordering) = self.reordering {
            write!(f, " reordering {reordering}")?;
        }
        if let Some(source) = self.source {
            write!(f, " source {source}")?;
        }
        Ok(())
    }
}

/// A `tcp_metrics` message: a command and its attributes, kept raw (kind, value).
#[derive(Debug, Clone, PartialEq, Eq)]
struct TcpMetricsMessage {
    cmd: u8,
    attributes: Vec<(u16, Vec<u8>)>,
}

impl TcpMetricsMessage {
    fn nlas(&self) -> Vec<DefaultNla> {
        self.attributes
            .iter()
            .map(|(kind, value)| DefaultNla::new(*kind, value.clone()))
            .collect()
    }

    /// The entry this message describes.
    fn entry(&self) -> TcpMetricsEntry {
        let mut entry = TcpMetricsEntry::default();
        for (kind, value) in &self.attributes {
            match *kind {
                ATTR_ADDR_IPV4 | ATTR_ADDR_IPV6 => entry.destination = ip(value),
                ATTR_SADDR_IPV4 | ATTR_SADDR_IPV6 => entry.source = ip(value),
                ATTR_AGE => entry.age = u64_value(value).map(Duration::from_millis),
                ATTR_VALS => {
                    for nla in NlasIterator::new(value.as_slice()).flatten() {
                        let number = u32_value(nla.value());
                        match nla.kind() {
                            VAL_SSTHRESH => entry.ssthresh = number,
                            VAL_CWND => entry.cwnd = number,
                            VAL_REORDERING => entry.reordering = number,
                            VAL_RTT_US => entry.rtt_us = number,
                            VAL_RTTVAR_US => entry.rttvar_us = number,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        entry
    }
}

/// An address attribute: 4 bytes for IPv4, 16 for IPv6, in network order.
fn ip(value: &[u8]) -> Option<IpAddr> {
    match value.len() {
        4 => <[u8; 4]>::try_from(value)
            .ok()
            .map(|b| Ipv4Addr::from(b).into()),
        16 => <[u8; 16]>::try_from(value)
            .ok()
            .map(|b| Ipv6Addr::from(b).into()),
        _ => None,
    }
}

fn u32_value(value: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(value).ok().map(u32::from_ne_bytes)
}

fn u64_value(value: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(value).ok().map(u64::from_ne_bytes)
}

impl GenlFamily for TcpMetricsMessage {
    fn family_name() -> &'static str {
        FAMILY_NAME
    }

    fn command(&self) -> u8 {
        self.cmd
    }

    fn version(&self) -> u8 {
        FAMILY_VERSION
    }
}

impl Emitable for TcpMetricsMessage {
    fn buffer_len(&self) -> usize {
        self.nlas().as_slice().buffer_len()
    }

    fn emit(&self, buffer: &mut [u8]) {
        self.nlas().as_slice().emit(buffer)
    }
}

impl ParseableParametrized<[u8], GenlHeader> for TcpMetricsMessage {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        let attributes = NlasIterator::new(buf)
            .map(|nla| nla.map(|nla| (nla.kind(), nla.value().to_vec())))
            .collect::<Result<_, _>>()?;
        Ok(TcpMetricsMessage {
            cmd: header.cmd,
            attributes,
        })
    }
}

/// A generic netlink socket reading the TCP metrics cache of one network namespace.
#[derive(Debug)]
pub struct TcpMetricsCache {
    channel: Channel,
    family: u16,
}

impl TcpMetricsCache {
    /// The cache of the calling thread's network namespace.
    pub fn open() -> Result<TcpMetricsCache, NetlinkError> {
        let mut cache = TcpMetricsCache {
            channel: Channel::open(NETLINK_GENERIC)?,
            family: 0,
        };
        cache.family = cache.resolve_family()?;
        Ok(cache)
    }

    /// The cache of the network namespace whose handle is `path`, opened on a thread that
    /// joins it; the calling thread stays where it is.
    pub fn open_in(path: &Path) -> Result<TcpMetricsCache, NetlinkError> {
        crate::netns::run_in(path, TcpMetricsCache::open).map_err(|source| {
            NetlinkError::Namespace {
                path: path.to_owned(),
                source,
            }
        })?
    }

    /// The cache of the network namespace named `name` (in `/run/netns`).
    pub fn open_in_named(name: &str) -> Result<TcpMetricsCache, NetlinkError> {
        TcpMetricsCache::open_in(&crate::netns::netns_path(name))
    }

    /// Every entry (`ip tcp_metrics show`).
    pub fn entries(&mut self) -> Result<Vec<TcpMetricsEntry>, NetlinkError> {
        let mut message = GenlMessage::from_payload(TcpMetricsMessage {
            cmd: CMD_GET,
            attributes: Vec::new(),
        });
        message.set_resolved_family_id(self.family);
        let replies = self
            .channel
            .exchange(message, NLM_F_DUMP, "tcp_metrics show")?;
        Ok(replies.iter().map(|m| m.payload.entry()).collect())
    }

    /// The entries for `destination` (`ip tcp_metrics show ADDRESS`); empty if the kernel
    /// has cached nothing for it.
    pub fn entries_for(
        &mut self,
        destination: IpAddr,
    ) -> Result<Vec<TcpMetricsEntry>, NetlinkError> {
        Ok(self
            .entries()?
            .into_iter()
            .filter(|e| e.destination == Some(destination))
            .collect())
    }

    /// The number the kernel gave the `tcp_metrics` family.
    fn resolve_family(&mut self) -> Result<u16, NetlinkError> {
        let request = format!("genl ctrl get name {FAMILY_NAME}");
        let message = GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName(FAMILY_NAME.to_owned())],
        });
        let replies = self.channel.exchange(message, NLM_F_ACK, &request)?;
        replies
            .iter()
            .flat_map(|m| m.payload.nlas.iter())
            .find_map(|nla| match nla {
                GenlCtrlAttrs::FamilyId(id) => Some(*id),
                _ => None,
            })
            .ok_or_else(|| NetlinkError::Decode {
                request,
                message: "no family id in the answer".to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend(((value.len() + 4) as u16).to_ne_bytes());
        bytes.extend(kind.to_ne_bytes());
        bytes.extend(value);
        while bytes.len() % 4 != 0 {
            bytes.push(0);
        }
        bytes
    }

    #[test]
    fn an_entry_is_read_from_the_kernels_attributes() {
        let mut values = nla(VAL_CWND, &10u32.to_ne_bytes());
        values.extend(nla(VAL_REORDERING, &5u32.to_ne_bytes()));
        values.extend(nla(VAL_RTT_US, &40_120u32.to_ne_bytes()));
        let mut buf = nla(ATTR_ADDR_IPV4, &[10, 0, 1, 1]);
        buf.extend(nla(ATTR_AGE, &520u64.to_ne_bytes()));
        buf.extend(nla(ATTR_VALS, &values));
        buf.extend(nla(ATTR_SADDR_IPV4, &[10, 0, 1, 2]));
        let header = GenlHeader {
            cmd: CMD_GET,
            version: FAMILY_VERSION,
        };
        let message = TcpMetricsMessage::parse_with_param(&buf, header).unwrap();
        let entry = message.entry();
        assert_eq!(entry.destination, Some("10.0.1.1".parse().unwrap()));
        assert_eq!(entry.source, Some("10.0.1.2".parse().unwrap()));
        assert_eq!(entry.reordering, Some(5));
        assert_eq!(
            entry.to_string(),
            "10.0.1.1 age 0.520sec cwnd 10 rtt 40120us reordering 5 source 10.0.1.2"
        );
    }

    #[test]
    fn the_cache_of_this_namespace_can_be_read() {
        // Needs only a socket, no privilege: reading the cache is open to everyone.
        let mut cache = TcpMetricsCache::open().unwrap();
        assert_ne!(cache.family, 0);
        let entries = cache.entries().unwrap();
        assert!(entries.iter().all(|e| e.destination.is_some()));
        assert!(cache
            .entries_for("192.0.2.77".parse().unwrap())
            .unwrap()
            .is_empty());
    }
}
