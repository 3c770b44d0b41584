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
//!
//! Pacing bounds the rate, not what is in flight: objects shorter than those 10 segments are
//! never paced, and 14 connections starting at once still overran a queue of 20 packets in
//! transparent mode. With the link's queue given (`queue_bytes`), a shared window bounds the
//! sum as well: the relays write a subscriber's bytes into its sockets only while all its
//! connections together hold less than the link's bandwidth-delay product (its payload
//! capacity times the smallest round trip seen) and half its queue unacknowledged. The other half is left to
//! what midway does not carry (DNS, QUIC, unproxied flows) and to retransmissions. The bytes
//! that wait stay in the relay's buffer, which pushes back on the remote segment as usual.
//! Under a window each connection is paced at the whole budget, not a split of it: the window
//! bounds the sum, and a split share would sit idle on a connection whose bytes wait for room
//! (in a trial of `tests/access_link_netns.rs` with split shares the windowed subscriber's
//! downloads took clearly longer than the paced-only one's; not kept, so no figure). A
//! connection whose bytes see no acknowledgement for [`STALLED_AFTER`] (a client that stopped
//! reading) stops counting, so it cannot hold its subscriber's other connections up.

use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

/// One `[[access_links]]` entry, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLink {
    /// Client prefixes behind links of this kind.
    pub clients: Vec<IpNet>,
    /// The link's rate toward one subscriber, bits per second.
    pub rate_bps: u64,
    /// The queue in front of one subscriber, bytes; when known, the shared window is on.
    pub queue_bytes: Option<u64>,
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

/// One full-size segment's payload (a 1500-byte MTU with timestamps): what the window grants
/// in, so that a connection that gets the last few bytes of room does not send a runt.
pub const SEGMENT_BYTES: u64 = 1448;

/// Ethernet, IPv4 and TCP headers (with timestamps) of one full-size segment on the link.
pub const HEADER_BYTES: u64 = 66;

/// The payload bytes per second a link of `rate_bps` carries at most (full-size segments).
pub fn link_payload_capacity(rate_bps: u64) -> u64 {
    (rate_bps / 8 * SEGMENT_BYTES / (SEGMENT_BYTES + HEADER_BYTES)).max(1)
}

/// The smallest shared window: four segments, so a link whose queue and bandwidth-delay product
/// are tiny still lets a connection recover a loss by fast retransmit.
pub const MIN_SHARED_WINDOW: u64 = 4 * SEGMENT_BYTES;

/// How long a connection's bytes may go without an acknowledgement before they stop counting
/// against its subscriber's window: several round trips of the slowest link midway paces for,
/// and beyond a retransmission timer of a lossy bearer's inflated round trip (about 1.4 s in
/// docs/results/narrow-cellular).
pub const STALLED_AFTER: Duration = Duration::from_secs(3);

/// The most bytes a subscriber's connections hold unacknowledged together: the link's
/// bandwidth-delay product at `payload_rate` (bytes per second, [`link_payload_capacity`])
/// over `min_rtt`, plus half of `queue_bytes` (see the module docs).
pub fn shared_window(payload_rate: u64, min_rtt: Duration, queue_bytes: u64) -> u64 {
    let bdp = u128::from(payload_rate) * min_rtt.as_micros() / 1_000_000;
    (u64::try_from(bdp).unwrap_or(u64::MAX))
        .saturating_add(queue_bytes / 2)
        .max(MIN_SHARED_WINDOW)
}

/// How many of `want` bytes one connection may write when its subscriber holds `held` of
/// `window`: all of them when they fit, otherwise the whole segments that fit.
pub fn window_grant(window: u64, held: u64, want: usize) -> usize {
    let room = window.saturating_sub(held);
    let want_bytes = want as u64;
    if want_bytes <= room {
        return want;
    }
    (room / SEGMENT_BYTES * SEGMENT_BYTES) as usize
}

/// Whether a connection's unacknowledged bytes still count against its subscriber's window:
/// not once `outstanding` bytes have waited [`STALLED_AFTER`] since the last acknowledgement
/// (`since_progress`).
pub fn counts_against_window(outstanding: u64, since_progress: Duration) -> bool {
    outstanding > 0 && since_progress < STALLED_AFTER
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(clients: &[&str], v4: u8, v6: u8) -> AccessLink {
        AccessLink {
            clients: clients.iter().map(|c| c.parse().unwrap()).collect(),
            rate_bps: 384_000,
            queue_bytes: None,
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
    fn the_shared_window_is_the_bdp_and_half_the_queue() {
        // The narrow-cellular bearer: 40,800 payload bytes/s, 150 ms, a 30 KB queue.
        assert_eq!(
            shared_window(40_800, Duration::from_millis(150), 30_000),
            6_120 + 15_000
        );
        // Tiny links still get four segments.
        assert_eq!(
            shared_window(2_000, Duration::from_millis(10), 1_000),
            5_792
        );
        assert_eq!(
            shared_window(u64::MAX, Duration::from_secs(10), u64::MAX),
            u64::MAX
        );
    }

    #[test]
    fn grants_are_whole_when_they_fit_and_whole_segments_otherwise() {
        assert_eq!(window_grant(20_000, 0, 6_000), 6_000);
        assert_eq!(window_grant(20_000, 14_000, 6_000), 6_000);
        assert_eq!(window_grant(20_000, 15_000, 6_000), 4_344);
        assert_eq!(window_grant(20_000, 19_000, 6_000), 0);
        assert_eq!(window_grant(20_000, 19_000, 900), 900);
        // Over the window (a newcomer's bytes before a pass): nothing.
        assert_eq!(window_grant(20_000, 25_000, 100), 0);
    }

    #[test]
    fn a_stalled_connection_stops_counting() {
        assert!(counts_against_window(1, Duration::ZERO));
        assert!(counts_against_window(
            1,
            STALLED_AFTER - Duration::from_millis(1)
        ));
        assert!(!counts_against_window(1, STALLED_AFTER));
        assert!(!counts_against_window(0, Duration::ZERO));
    }

    #[test]
    fn the_payload_capacity_leaves_out_the_headers() {
        assert_eq!(link_payload_capacity(384_000), 45_907);
        assert_eq!(link_payload_capacity(0), 1);
    }

    #[test]
    fn payload_rate_leaves_room_for_headers_and_acks() {
        assert_eq!(payload_bytes_per_second(384_000), 40_800);
        assert_eq!(payload_bytes_per_second(0), 1);
    }
}
