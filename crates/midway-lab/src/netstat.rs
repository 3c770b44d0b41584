//! TCP loss-recovery counters of a host's network namespace (`/proc/net/netstat`, the numbers
//! `nstat` shows as `TcpExt*`). Each point builds fresh namespaces, so a namespace's counters
//! are exactly what that point's sockets did there: on the proxy host, the proxy's two segments.
//! They show whether a tuning took effect (fast retransmits instead of timeouts), and
//! [`cached_reordering`] reads what the tcp_metrics cache holds for a returning client.

use std::collections::BTreeMap;

use midway_sys::netlink::TcpMetricsEntry;

/// The counters the lab records, by the name `nstat` gives them (without the `TcpExt` or `Tcp`
/// prefix). `ActiveOpens` (from `/proc/net/snmp`) counts the connections the host opened: on
/// the client, how many a browser or the loader opened, which the lab compares between them.
pub(crate) const RECORDED: [&str; 6] = [
    "TCPFastRetrans",
    "TCPTimeouts",
    "TCPLossProbes",
    "TCPSlowStartRetrans",
    "TCPRenoRecovery",
    "ActiveOpens",
];

/// Parses the text of `/proc/net/netstat` (pairs of lines: `Prefix: names...` then
/// `Prefix: values...`) into `TcpExt` counters. Lines that do not pair up are skipped.
pub(crate) fn parse_tcp_ext(text: &str) -> BTreeMap<String, u64> {
    parse_prefixed(text, "TcpExt")
}

/// The `Tcp` counters (`ActiveOpens`, `PassiveOpens`, ...) of `/proc/net/snmp`, which pairs
/// its lines the same way.
pub(crate) fn parse_tcp(text: &str) -> BTreeMap<String, u64> {
    parse_prefixed(text, "Tcp")
}

fn parse_prefixed(text: &str, prefix: &str) -> BTreeMap<String, u64> {
    let mut counters = BTreeMap::new();
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        let (Some((names_prefix, names)), Some((values_prefix, values))) =
            (names.split_once(':'), values.split_once(':'))
        else {
            continue;
        };
        if names_prefix != prefix || values_prefix != prefix {
            continue;
        }
        for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(value) = value.parse::<u64>() {
                counters.insert(name.to_string(), value);
            }
        }
    }
    counters
}

/// Reads the `TcpExt` and `Tcp` counters of the calling thread's network namespace.
/// `/proc/thread-self` (not `/proc/self`): the thread, not the process, is the one inside the
/// host's namespace.
pub(crate) fn read_tcp_counters() -> std::io::Result<BTreeMap<String, u64>> {
    let mut counters = parse_tcp_ext(&std::fs::read_to_string("/proc/thread-self/net/netstat")?);
    counters.extend(parse_tcp(&std::fs::read_to_string(
        "/proc/thread-self/net/snmp",
    )?));
    Ok(counters)
}

/// The largest `reordering` of a peer's tcp_metrics entries (the threshold the next
/// connection to that peer starts with), if any entry has one.
pub(crate) fn cached_reordering(entries: &[TcpMetricsEntry]) -> Option<u32> {
    entries.iter().filter_map(|entry| entry.reordering).max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcp_ext_pairs_and_skips_others() {
        let text = "TcpExt: SyncookiesSent TCPFastRetrans TCPTimeouts\n\
                    TcpExt: 0 7 3\n\
                    IpExt: InNoRoutes InOctets\n\
                    IpExt: 0 12345\n";
        let counters = parse_tcp_ext(text);
        assert_eq!(counters.get("TCPFastRetrans"), Some(&7));
        assert_eq!(counters.get("TCPTimeouts"), Some(&3));
        assert!(!counters.contains_key("InOctets"));
    }

    #[test]
    fn parses_tcp_of_snmp_and_skips_negative_values() {
        let text = "Ip: Forwarding DefaultTTL\n\
                    Ip: 1 64\n\
                    Tcp: RtoAlgorithm MaxConn ActiveOpens PassiveOpens\n\
                    Tcp: 1 -1 30435 30287\n\
                    TcpExt: TCPTimeouts\n\
                    TcpExt: 9\n";
        let counters = parse_tcp(text);
        assert_eq!(counters.get("ActiveOpens"), Some(&30435));
        assert_eq!(counters.get("PassiveOpens"), Some(&30287));
        assert!(!counters.contains_key("MaxConn"));
        assert!(!counters.contains_key("TCPTimeouts"));
        assert!(!counters.contains_key("DefaultTTL"));
    }

    #[test]
    fn cached_reordering_reads_ip_tcp_metrics_output() {
        // `10.0.1.1 age 0.512sec cwnd 10 rtt 21000us reordering 1 source 10.0.1.2` and
        // `10.0.2.2 age 3sec cwnd 10 rtt 1000us source 10.0.2.1`, as the cache gives them.
        let entry = |destination: &str, rtt_us, reordering, source: &str| TcpMetricsEntry {
            destination: Some(destination.parse().unwrap()),
            source: Some(source.parse().unwrap()),
            cwnd: Some(10),
            rtt_us: Some(rtt_us),
            reordering,
            ..TcpMetricsEntry::default()
        };
        let entries = [
            entry("10.0.1.1", 21000, Some(1), "10.0.1.2"),
            entry("10.0.2.2", 1000, None, "10.0.2.1"),
        ];
        assert_eq!(cached_reordering(&entries), Some(1));
        assert_eq!(cached_reordering(&entries[1..]), None);
    }

    #[test]
    fn reads_this_namespace() {
        let counters = read_tcp_counters().expect("/proc/thread-self/net is readable");
        assert!(counters.contains_key("TCPTimeouts"));
        assert!(counters.contains_key("ActiveOpens"));
    }
}
