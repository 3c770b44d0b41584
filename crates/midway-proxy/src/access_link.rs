//! Subscribers' access links (`[[access_links]]`): every connection of one subscriber shares the
//! rate of the link in front of it. Pure: which subscriber a client is, and each connection's
//! pacing ceiling; `server::access_links` applies them to live sockets.
//!
//! Why: a browser opens six connections per host name, and Chromium about 20 to an explicit
//! proxy for a page of 19 requests. A split connection's local segment has the objects at hand,
//! so the subscriber's connections together overrun a narrow link's queue of a few dozen
//! packets, and the losses end in retransmission timeouts; a direct server's bytes come
//! through the Internet path spread out (docs/results/narrow-cellular/README.md).
//!
//! What: the busy connections of a subscriber (bytes written and not yet acknowledged) split
//! the link's payload rate evenly as their `SO_MAX_PACING_RATE`; the kernel paces each one
//! (internal TCP pacing, no `fq` needed). An idle connection is given an equal share among all
//! the subscriber's connections, so that a new round of requests on every idle connection at
//! once at most doubles the subscriber's rate until the next pass. Nothing is queued in midway:
//! the remote segments keep pulling from the servers and the bytes wait in the local sockets'
//! buffers, which push back on the relay as usual. Linux never paces a connection's first 10
//! segments, so the initial window is the local profile's business (`cellular-local`).

use std::net::IpAddr;

use ipnet::IpNet;

/// One `[[access_links]]` entry, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLink {
    /// Client prefixes behind links of this kind.
    pub clients: Vec<IpNet>,
    /// The link's rate toward one subscriber, bits per second.
    pub rate_bps: u64,
    /// Prefix length that makes one subscriber of an IPv4 client address.
    pub subscriber_prefix_v4: u8,
    /// Prefix length that makes one subscriber of an IPv6 client address.
    pub subscriber_prefix_v6: u8,
}

/// IPv4 default: every client address is its own subscriber.
pub const DEFAULT_SUBSCRIBER_PREFIX_V4: u8 = 32;
/// IPv6 default: a subscriber's devices share its /64.
pub const DEFAULT_SUBSCRIBER_PREFIX_V6: u8 = 64;

/// The part of a link's rate that pacing gives to TCP payload, in thousandths. Linux paces the
/// payload, while the link also carries 66 bytes of Ethernet, IPv4 and TCP headers (with
/// timestamps) per 1448-byte segment (4.4 %) and the subscriber's ACKs and handshakes. The rest,
/// about a tenth, drains what pacing cannot prevent: Linux never paces a connection's first 10
/// segments, and a connection turning busy runs at its old share until the next pass. (In
/// exploratory runs of scenarios/narrow-cellular.toml, 94 % left the access queue dropping about
/// twice as often through the HTTP proxy.)
pub const PAYLOAD_PER_MILLE: u64 = 850;

/// One subscriber: the access link (index into the config's list) and the client prefix that
/// makes the subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Subscriber {
    /// Index of the access link in the config's list.
    pub link: usize,
    /// The client prefix of the subscriber's length under that link.
    pub prefix: IpNet,
}

/// The subscriber `client` is, under the access link with the most specific prefix containing
/// it (the first in file order among equals); `None` when no access link covers it.
pub fn subscriber_of(links: &[AccessLink], client: IpAddr) -> Option<Subscriber> {
    let client = client.to_canonical();
    let (link, _) = links
        .iter()
        .enumerate()
        .filter_map(|(index, link)| {
            link.clients
                .iter()
                .filter(|net| net.contains(&client))
                .map(IpNet::prefix_len)
                .max()
                .map(|len| (index, len))
        })
        .min_by_key(|&(index, len)| (std::cmp::Reverse(len), index))?;
    let length = match client {
        IpAddr::V4(_) => links[link].subscriber_prefix_v4,
        IpAddr::V6(_) => links[link].subscriber_prefix_v6,
    };
    let prefix = IpNet::new(client, length).ok()?.trunc();
    Some(Subscriber { link, prefix })
}

/// The payload bytes per second a link of `rate_bps` gives its subscriber's connections.
pub fn payload_bytes_per_second(rate_bps: u64) -> u64 {
    (rate_bps / 8 * PAYLOAD_PER_MILLE / 1000).max(1)
}

/// Pacing ceiling (bytes per second) of each connection of one subscriber, in `busy`'s order:
/// the busy ones split `budget` evenly; an idle one gets an equal share among all of them, so
/// that when every idle connection turns busy at once (a browser's next round of requests) the
/// subscriber's rate at most doubles until the next pass.
pub fn pacing_shares(budget: u64, busy: &[bool]) -> Vec<u64> {
    let busy_count = busy.iter().filter(|b| **b).count() as u64;
    let busy_share = (budget / busy_count.max(1)).max(1);
    let idle_share = (budget / busy.len().max(1) as u64).max(1);
    busy.iter()
        .map(|&b| if b { busy_share } else { idle_share })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(clients: &[&str], v4: u8, v6: u8) -> AccessLink {
        AccessLink {
            clients: clients.iter().map(|c| c.parse().unwrap()).collect(),
            rate_bps: 384_000,
            subscriber_prefix_v4: v4,
            subscriber_prefix_v6: v6,
        }
    }

    #[test]
    fn the_most_specific_link_decides_and_the_subscriber_is_the_prefix_of_its_length() {
        let links = [
            link(&["10.0.0.0/8", "fd00::/16"], 32, 64),
            link(&["10.1.0.0/16"], 24, 64),
        ];
        let one = subscriber_of(&links, "10.2.3.4".parse().unwrap()).unwrap();
        assert_eq!(one.link, 0);
        assert_eq!(one.prefix, "10.2.3.4/32".parse::<IpNet>().unwrap());
        let two = subscriber_of(&links, "10.1.7.9".parse().unwrap()).unwrap();
        assert_eq!(two.link, 1);
        assert_eq!(two.prefix, "10.1.7.0/24".parse::<IpNet>().unwrap());
        let six = subscriber_of(&links, "fd00:1:2:3:4::5".parse().unwrap()).unwrap();
        assert_eq!(six.prefix, "fd00:1:2:3::/64".parse::<IpNet>().unwrap());
        // A v4-mapped address (a dual-stack listener's view of a v4 client) is the v4 client.
        let mapped = subscriber_of(&links, "::ffff:10.2.3.4".parse().unwrap()).unwrap();
        assert_eq!(mapped, one);
        assert_eq!(subscriber_of(&links, "192.0.2.1".parse().unwrap()), None);
    }

    #[test]
    fn equally_specific_links_go_to_the_first_in_file_order() {
        let links = [link(&["10.0.0.0/8"], 32, 64), link(&["10.0.0.0/8"], 24, 64)];
        let s = subscriber_of(&links, "10.9.9.9".parse().unwrap()).unwrap();
        assert_eq!(s.link, 0);
    }

    #[test]
    fn busy_connections_split_the_budget_and_idle_ones_an_equal_share_of_all() {
        assert_eq!(pacing_shares(48_000, &[]), Vec::<u64>::new());
        assert_eq!(pacing_shares(48_000, &[false]), vec![48_000]);
        assert_eq!(pacing_shares(48_000, &[true]), vec![48_000]);
        assert_eq!(
            pacing_shares(48_000, &[true, false, true]),
            vec![24_000, 16_000, 24_000]
        );
        assert_eq!(
            pacing_shares(48_000, &[false, false, true]),
            vec![16_000, 16_000, 48_000]
        );
        let six = pacing_shares(48_000, &[true; 6]);
        assert_eq!(six, vec![8_000; 6]);
        assert!(six.iter().sum::<u64>() <= 48_000);
        // Never zero: the kernel takes 0 as "send nothing".
        assert_eq!(pacing_shares(3, &[true; 5]), vec![1; 5]);
    }

    #[test]
    fn payload_rate_leaves_room_for_headers_and_acks() {
        assert_eq!(payload_bytes_per_second(384_000), 40_800);
        assert_eq!(payload_bytes_per_second(0), 1);
    }
}
