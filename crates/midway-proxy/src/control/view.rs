//! What `midway status` shows, as pure functions of a [`Status`]: the filters (client prefix,
//! listener, peer), the sort orders, the table, and the live view of `--watch` (totals per
//! listener and per peer, then the connections, fastest first when a previous snapshot gives
//! rates). No I/O and no clock: the caller passes the time between two snapshots.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;

use super::protocol::{ConnectionStatus, SegmentStatus, Status};

/// A client prefix (`10.1.0.0/24`) or one address (`10.1.0.7`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientFilter(IpNet);

/// A `--client` value that is neither a prefix nor an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is neither a prefix (10.1.0.0/24) nor an address (10.1.0.7)")]
pub struct FilterError(String);

impl FromStr for ClientFilter {
    type Err = FilterError;
    fn from_str(text: &str) -> Result<ClientFilter, FilterError> {
        if let Ok(net) = text.parse::<IpNet>() {
            return Ok(ClientFilter(net.trunc()));
        }
        text.parse::<IpAddr>()
            .map(|ip| ClientFilter(IpNet::from(ip)))
            .map_err(|_| FilterError(text.to_string()))
    }
}

impl ClientFilter {
    fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 client on a dual-stack listener appears as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.contains(&ip)
    }
}

/// Which connections to show; every given criterion must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Clients in this prefix.
    pub client: Option<ClientFilter>,
    /// Connections of this listener.
    pub listener: Option<String>,
    /// Connections through this peer.
    pub peer: Option<String>,
}

impl Filter {
    /// Whether `connection` is to be shown.
    pub fn matches(&self, connection: &ConnectionStatus) -> bool {
        self.client
            .is_none_or(|client| client.contains(connection.client.ip()))
            && self
                .listener
                .as_ref()
                .is_none_or(|name| *name == connection.listener)
            && self
                .peer
                .as_ref()
                .is_none_or(|name| connection.peer.as_ref() == Some(name))
    }
}

/// The order of the connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    /// Oldest first.
    Age,
    /// Most bytes (both directions) first; with a previous snapshot (`--watch`), the highest
    /// rate since it first.
    #[default]
    Bytes,
    /// By client address.
    Client,
    /// The largest smoothed RTT of either segment first.
    Srtt,
}

impl FromStr for SortKey {
    type Err = String;
    fn from_str(text: &str) -> Result<SortKey, String> {
        match text {
            "age" => Ok(SortKey::Age),
            "bytes" => Ok(SortKey::Bytes),
            "client" => Ok(SortKey::Client),
            "srtt" => Ok(SortKey::Srtt),
            other => Err(format!(
                "unknown sort key {other:?}: age, bytes, client or srtt"
            )),
        }
    }
}

/// Bytes per second of each connection since `previous` (by id), for connections that were in
/// it.
fn rates(status: &Status, previous: Option<&Status>, elapsed: Duration) -> BTreeMap<u64, f64> {
    let Some(previous) = previous else {
        return BTreeMap::new();
    };
    let seconds = elapsed.as_secs_f64();
    if seconds <= 0.0 {
        return BTreeMap::new();
    }
    let before: BTreeMap<u64, u64> = previous
        .connections
        .iter()
        .map(|c| (c.id, c.bytes_up + c.bytes_down))
        .collect();
    status
        .connections
        .iter()
        .filter_map(|c| {
            let then = *before.get(&c.id)?;
            let now = c.bytes_up + c.bytes_down;
            Some((c.id, now.saturating_sub(then) as f64 / seconds))
        })
        .collect()
}

fn max_srtt(connection: &ConnectionStatus) -> u32 {
    connection
        .segments
        .iter()
        .filter_map(|s| s.tcp.as_ref().map(|t| t.srtt_us))
        .max()
        .unwrap_or(0)
}

/// The connections `filter` keeps, in `sort` order (`rates` orders `Bytes` when present).
fn selected<'a>(
    status: &'a Status,
    filter: &Filter,
    sort: SortKey,
    rates: &BTreeMap<u64, f64>,
) -> Vec<&'a ConnectionStatus> {
    let mut rows: Vec<_> = status
        .connections
        .iter()
        .filter(|c| filter.matches(c))
        .collect();
    match sort {
        SortKey::Age => rows.sort_by(|a, b| b.age_ms.cmp(&a.age_ms).then(a.id.cmp(&b.id))),
        SortKey::Bytes if !rates.is_empty() => rows.sort_by(|a, b| {
            let rate = |c: &ConnectionStatus| rates.get(&c.id).copied().unwrap_or(0.0);
            rate(b).total_cmp(&rate(a)).then(a.id.cmp(&b.id))
        }),
        SortKey::Bytes => rows.sort_by(|a, b| {
            (b.bytes_up + b.bytes_down)
                .cmp(&(a.bytes_up + a.bytes_down))
                .then(a.id.cmp(&b.id))
        }),
        SortKey::Client => rows.sort_by(|a, b| a.client.cmp(&b.client).then(a.id.cmp(&b.id))),
        SortKey::Srtt => rows.sort_by(|a, b| max_srtt(b).cmp(&max_srtt(a)).then(a.id.cmp(&b.id))),
    }
    rows
}

/// `midway status`: one line per connection `filter` keeps, in `sort` order, under a header.
pub fn render_table(status: &Status, filter: &Filter, sort: SortKey) -> String {
    let rows = selected(status, filter, sort, &BTreeMap::new());
    let mut out = summary(status, rows.len());
    out.push_str(&table(&rows, None));
    out
}

/// `midway status --watch`: totals per listener and per peer, then as many connections as fit
/// in `height` lines (at least one); with `previous` (the snapshot `elapsed` earlier) a rate column, and `Bytes`
/// sorts by it (the fastest first).
pub fn render_watch(
    status: &Status,
    previous: Option<&Status>,
    elapsed: Duration,
    filter: &Filter,
    sort: SortKey,
    height: usize,
) -> String {
    let rates = rates(status, previous, elapsed);
    let rows = selected(status, filter, sort, &rates);
    let mut out = summary(status, rows.len());
    let mut per_peer: BTreeMap<&str, (usize, f64)> = BTreeMap::new();
    let mut per_listener: BTreeMap<&str, f64> = BTreeMap::new();
    for c in &status.connections {
        let rate = rates.get(&c.id).copied().unwrap_or(0.0);
        *per_listener.entry(&c.listener).or_default() += rate;
        if let Some(peer) = &c.peer {
            let entry = per_peer.entry(peer).or_default();
            entry.0 += 1;
            entry.1 += rate;
        }
    }
    for listener in &status.listeners {
        let rate = per_listener
            .get(listener.name.as_str())
            .copied()
            .unwrap_or(0.0);
        let _ = writeln!(
            out,
            "  listener {:<12} {:<11} {:>5} open  {:>10}{}",
            listener.name,
            listener.mode,
            listener.open,
            bit_rate(rate * 8.0),
            if listener.drained { "  DRAINED" } else { "" }
        );
    }
    for (peer, (open, rate)) in &per_peer {
        let _ = writeln!(
            out,
            "  peer     {peer:<12} {:<11} {open:>5} open  {:>10}",
            "",
            bit_rate(rate * 8.0)
        );
    }
    out.push_str(
        "  segments: A = accepted (client side), B = onward (server side); DLV = delivery rate\n\n",
    );
    // The table's header and the "more" line besides what is written so far.
    let used = out.lines().count() + 2;
    let shown = rows.len().min(height.saturating_sub(used).max(1));
    out.push_str(&table(&rows[..shown], previous.map(|_| &rates)));
    if rows.len() > shown {
        let _ = writeln!(out, "... {} more", rows.len() - shown);
    }
    out
}

fn summary(status: &Status, shown: usize) -> String {
    format!(
        "midway pid {}  generation {}  open {}  served {}  spool {}  shown {}\n",
        status.pid,
        status.generation,
        status.totals.open,
        status.totals.served,
        bytes(status.totals.spool_bytes),
        shown
    )
}

/// The connection table, columns padded to their widest cell.
fn table(rows: &[&ConnectionStatus], rates: Option<&BTreeMap<u64, f64>>) -> String {
    let mut header: Vec<String> = ["ID", "LISTENER", "CLIENT -> TARGET", "AGE", "UP", "DOWN"]
        .map(String::from)
        .to_vec();
    if rates.is_some() {
        header.push("RATE".into());
    }
    for side in ["A", "B"] {
        for column in ["SRTT", "CWND", "RTX", "DLV", "CC"] {
            header.push(format!("{side}.{column}"));
        }
    }
    header.extend(["RELAY", "SPOOL", "PEER"].map(String::from));
    let mut cells = vec![header];
    for c in rows {
        // An HTTP client connection's requests go to origins of its choosing, through pooled
        // upstreams: no one target.
        let target = match c.target {
            Some(target) => target.to_string(),
            None if c.relay == "http" => "origins".to_string(),
            None => "?".to_string(),
        };
        let mut row = vec![
            c.id.to_string(),
            c.listener.clone(),
            format!("{} -> {target}", c.client),
            age(c.age_ms),
            bytes(c.bytes_up),
            bytes(c.bytes_down),
        ];
        if let Some(rates) = rates {
            row.push(rates.get(&c.id).map_or("-".into(), |r| bit_rate(r * 8.0)));
        }
        for index in 0..2 {
            row.extend(segment_cells(c.segments.get(index)));
        }
        row.push(c.relay.clone());
        row.push(bytes(c.spool_bytes));
        row.push(peer_cell(c));
        cells.push(row);
    }
    let columns = cells[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join(" ").trim_end());
        out.push('\n');
    }
    out
}

/// Segment A is the accepted one (local, or peer at a gateway), B the onward one; the roles
/// and transports are in the PEER column.
fn segment_cells(segment: Option<&SegmentStatus>) -> [String; 5] {
    let Some(tcp) = segment.and_then(|s| s.tcp.as_ref()) else {
        return ["-", "-", "-", "-", "-"].map(String::from);
    };
    [
        micros(tcp.srtt_us),
        tcp.cwnd.to_string(),
        tcp.retransmits.to_string(),
        bit_rate(tcp.delivery_rate_bps as f64),
        tcp.congestion_control.clone().unwrap_or_else(|| "-".into()),
    ]
}

/// `-` for a direct connection; else the peer's name and the segments' roles and transports
/// where they are not plain TCP to a client and a server.
fn peer_cell(c: &ConnectionStatus) -> String {
    let segments: Vec<String> = c
        .segments
        .iter()
        .map(|s| format!("{}/{}", s.role, s.transport))
        .collect();
    let plain = c
        .segments
        .iter()
        .all(|s| s.transport == "tcp" && s.role != "peer");
    match (&c.peer, plain) {
        (None, true) => "-".into(),
        (None, false) => segments.join(","),
        (Some(peer), _) => format!("{peer} ({})", segments.join(",")),
    }
}

fn micros(us: u32) -> String {
    if us >= 10_000 {
        format!("{}ms", us / 1000)
    } else if us >= 1000 {
        format!("{:.1}ms", f64::from(us) / 1000.0)
    } else {
        format!("{us}us")
    }
}

fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn bytes(n: u64) -> String {
    scaled(n as f64, "B", 1024.0)
}

fn bit_rate(bps: f64) -> String {
    scaled(bps, "b/s", 1000.0)
}

fn scaled(mut value: f64, unit: &str, step: f64) -> String {
    let prefixes = ["", "k", "M", "G", "T"];
    let mut index = 0;
    while value >= step && index + 1 < prefixes.len() {
        value /= step;
        index += 1;
    }
    if index == 0 {
        format!("{value:.0}{unit}")
    } else {
        format!("{value:.1}{}{unit}", prefixes[index])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::protocol::{ListenerStatus, TcpInfoStatus, Totals};

    fn segment(role: &str, srtt_us: u32) -> SegmentStatus {
        SegmentStatus {
            role: role.into(),
            transport: "tcp".into(),
            tcp: Some(TcpInfoStatus {
                srtt_us,
                rttvar_us: 100,
                cwnd: 10,
                mss: 1448,
                retransmits: 2,
                delivery_rate_bps: 12_000_000,
                congestion_control: Some("bbr".into()),
                unacked: 0,
            }),
        }
    }

    fn connection(id: u64, client: &str, listener: &str, bytes: u64) -> ConnectionStatus {
        ConnectionStatus {
            id,
            listener: listener.into(),
            client: client.parse().unwrap(),
            target: Some("192.0.2.1:80".parse().unwrap()),
            age_ms: id * 1000,
            bytes_up: bytes,
            bytes_down: 0,
            relay: "buffer".into(),
            spool_bytes: 0,
            peer: None,
            segments: vec![segment("local", 800 * id as u32), segment("remote", 40_000)],
        }
    }

    fn status() -> Status {
        let mut through_peer = connection(3, "10.2.0.9:4000", "edge", 10);
        through_peer.peer = Some("gw".into());
        through_peer.segments[1].role = "peer".into();
        through_peer.segments[1].transport = "quic".into();
        through_peer.segments[1].tcp = None;
        Status {
            generation: 2,
            pid: 77,
            listeners: vec![
                ListenerStatus {
                    name: "fwd".into(),
                    mode: "forward".into(),
                    drained: true,
                    open: 2,
                },
                ListenerStatus {
                    name: "edge".into(),
                    mode: "socks5".into(),
                    drained: false,
                    open: 1,
                },
            ],
            connections: vec![
                connection(1, "10.1.0.7:5000", "fwd", 500),
                connection(2, "[::ffff:10.1.0.8]:5001", "fwd", 9000),
                through_peer,
            ],
            totals: Totals {
                open: 3,
                served: 10,
                spool_bytes: 0,
            },
        }
    }

    fn ids(status: &Status, filter: &Filter, sort: SortKey) -> Vec<u64> {
        selected(status, filter, sort, &BTreeMap::new())
            .iter()
            .map(|c| c.id)
            .collect()
    }

    #[test]
    fn filters_by_client_prefix_listener_and_peer() {
        let status = status();
        let client = |text: &str| Filter {
            client: Some(text.parse().unwrap()),
            ..Filter::default()
        };
        assert_eq!(ids(&status, &client("10.1.0.0/24"), SortKey::Age), [2, 1]);
        // The mapped IPv6 form of an IPv4 client matches its IPv4 prefix.
        assert_eq!(ids(&status, &client("10.1.0.8"), SortKey::Age), [2]);
        let listener = Filter {
            listener: Some("edge".into()),
            ..Filter::default()
        };
        assert_eq!(ids(&status, &listener, SortKey::Age), [3]);
        let peer = Filter {
            peer: Some("gw".into()),
            ..Filter::default()
        };
        assert_eq!(ids(&status, &peer, SortKey::Age), [3]);
        assert!("10.1.0.0/33".parse::<ClientFilter>().is_err());
        assert!("host".parse::<ClientFilter>().is_err());
    }

    #[test]
    fn sorts_by_each_key() {
        let status = status();
        let all = Filter::default();
        assert_eq!(ids(&status, &all, SortKey::Age), [3, 2, 1]);
        assert_eq!(ids(&status, &all, SortKey::Bytes), [2, 1, 3]);
        assert_eq!(ids(&status, &all, SortKey::Client), [1, 3, 2]);
        // Connection 3's onward segment has no tcp_info; its local srtt is 2.4 ms.
        assert_eq!(ids(&status, &all, SortKey::Srtt), [1, 2, 3]);
        assert_eq!("srtt".parse::<SortKey>(), Ok(SortKey::Srtt));
        assert!("speed".parse::<SortKey>().is_err());
    }

    #[test]
    fn table_shows_both_segments_and_the_peer() {
        let text = render_table(&status(), &Filter::default(), SortKey::Age);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(lines[0].contains("generation 2"), "{text}");
        assert!(lines[1].starts_with("ID "), "{text}");
        assert!(
            lines[1].contains("A.SRTT") && lines[1].contains("B.CC"),
            "{text}"
        );
        let first = lines[2];
        assert!(first.starts_with("3 "), "{text}");
        assert!(first.contains("10.2.0.9:4000 -> 192.0.2.1:80"), "{text}");
        assert!(first.contains("gw (local/tcp,peer/quic)"), "{text}");
        let last = lines[4];
        assert!(last.contains("800us") && last.contains("40ms"), "{text}");
        assert!(last.contains("12.0Mb/s") && last.contains("bbr"), "{text}");
        assert!(last.contains("500B"), "{text}");
    }

    #[test]
    fn watch_ranks_by_rate_and_totals_listeners_and_peers() {
        let before = status();
        let mut now = status();
        // Connection 1 moved 1 MB in the 2 s between the snapshots; 2 moved nothing.
        now.connections[0].bytes_down += 1_000_000;
        let text = render_watch(
            &now,
            Some(&before),
            Duration::from_secs(2),
            &Filter::default(),
            SortKey::Bytes,
            // Six lines of totals and legend, the header, two rows and the "more" line.
            10,
        );
        assert!(text.contains("listener fwd"), "{text}");
        assert!(text.contains("4.0Mb/s  DRAINED"), "{text}");
        assert!(text.contains("peer     gw"), "{text}");
        let table: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("ID ")).collect();
        assert!(table[0].contains("RATE"), "{text}");
        assert!(table[1].starts_with("1 "), "{text}");
        assert_eq!(table.last(), Some(&"... 1 more"), "{text}");
    }

    #[test]
    fn units_read_at_a_glance() {
        assert_eq!(age(59_999), "59s");
        assert_eq!(age(61_000), "1m01s");
        assert_eq!(age(7_260_000), "2h01m");
        assert_eq!(bytes(1536), "1.5kB");
        assert_eq!(bit_rate(999.0), "999b/s");
        assert_eq!(micros(1500), "1.5ms");
    }
}
