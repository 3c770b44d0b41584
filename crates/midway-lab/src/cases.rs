//! What each case puts on the proxy host, as pure functions: midway's generated config, HAProxy's
//! and Squid's configs, where the client connects; and
//! parsers for what the lab reads back (midway's metrics, Squid's access log, the listening
//! sockets of `/proc/net/tcp`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use midway_config::haproxy::{HaproxyConfig, ListenSection};
use midway_config::squid::SquidConfig;
use midway_config::{
    overlay, ConfigBuilder, ListenerBuilder, ModeName, OverlayConflict, RelayName,
};

mod chain;

pub(crate) use chain::{chain_configs, random_key_hex, ChainIdentity};

use crate::scenario::{
    Case, CaseKind, Intercept, MidwayCase, RelayKind, SquidCase, UpstreamPersistence,
};

/// Port the proxy listens on inside the proxy host (each topology is its own namespace set, so a
/// fixed port cannot collide with another run).
pub(crate) const PROXY_PORT: u16 = 8080;
/// Where midway serves metrics inside the proxy host.
pub(crate) const METRICS_LISTEN: &str = "127.0.0.1:9464";
/// Name of the listener in generated midway configs (a label of its metrics).
pub(crate) const LISTENER_NAME: &str = "lab";

/// Addresses and names a case needs, taken from the built topology.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Placement {
    /// The server's address as seen from the client side, and the workload's port.
    pub server: SocketAddr,
    /// The proxy host's address on its link toward the client.
    pub proxy_addr: IpAddr,
    /// Prefix of the client's own link (the clients midway must allow).
    pub client_prefix: String,
    /// Prefix of the proxy host's link toward the client (the route route tuning changes).
    pub route_prefix: String,
    /// The proxy host's interface toward the client.
    pub client_iface: String,
    /// Spool folder for midway's store-and-forward relay.
    pub spool_dir: PathBuf,
}

/// Where the client connects: the server itself (direct, transparent) or the proxy's listener.
pub(crate) fn connect_target(case: &Case, placement: &Placement) -> SocketAddr {
    match case.kind {
        CaseKind::Direct => placement.server,
        CaseKind::Midway
            if case.midway.as_ref().map(|m| m.intercept) == Some(Intercept::Transparent) =>
        {
            placement.server
        }
        // A chain's first midway intercepts transparently.
        CaseKind::Chain => placement.server,
        CaseKind::Midway | CaseKind::Haproxy | CaseKind::Squid => {
            SocketAddr::new(placement.proxy_addr, PROXY_PORT)
        }
    }
}

/// The explicit HTTP proxy a web client must be configured with: Squid, or midway with
/// `intercept = "http"`. None when the client talks to `connect_target` itself.
pub(crate) fn explicit_proxy(case: &Case, placement: &Placement) -> Option<SocketAddr> {
    let explicit = match case.kind {
        CaseKind::Squid => true,
        CaseKind::Midway => case.midway.as_ref().map(|m| m.intercept) == Some(Intercept::Http),
        CaseKind::Direct | CaseKind::Haproxy | CaseKind::Chain => false,
    };
    explicit.then(|| SocketAddr::new(placement.proxy_addr, PROXY_PORT))
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigGenError {
    #[error("case `config` sets `{key}` to a value whose type differs from the generated one")]
    MergeConflict { key: String },
    #[error("cannot write the generated config as TOML")]
    Serialize(#[source] toml::ser::Error),
    #[error("case `quic`: {0}")]
    Quic(String),
}

impl From<OverlayConflict> for ConfigGenError {
    fn from(conflict: OverlayConflict) -> Self {
        ConfigGenError::MergeConflict { key: conflict.key }
    }
}

/// [`METRICS_LISTEN`] as a socket address.
#[allow(
    clippy::expect_used,
    reason = "METRICS_LISTEN is a literal IPv4 socket address"
)]
pub(crate) fn metrics_listen() -> SocketAddr {
    METRICS_LISTEN
        .parse()
        .expect("METRICS_LISTEN is a socket address")
}

/// The midway config of a case: one listener on [`PROXY_PORT`], metrics on
/// [`METRICS_LISTEN`], the case's profiles, then the case's `listener` and `config` tables merged.
pub(crate) fn midway_config(
    case: &MidwayCase,
    placement: &Placement,
) -> Result<String, ConfigGenError> {
    let listen = format!("0.0.0.0:{PROXY_PORT}");
    let mut listener = match case.intercept {
        Intercept::Forward => ListenerBuilder::forward(LISTENER_NAME, &listen, placement.server),
        Intercept::Transparent => ListenerBuilder::transparent(
            LISTENER_NAME,
            &listen,
            [placement.client_iface.clone()],
            [placement.server.port()],
        ),
        // Requests name their origin; the proxy resolves it (the hosts file of its host).
        Intercept::Http => ListenerBuilder::new(ModeName::Http, LISTENER_NAME, &listen),
    };
    // An HTTP listener answers requests itself and refuses relay settings.
    if case.intercept != Intercept::Http {
        listener = listener.relay(match case.relay {
            RelayKind::Buffer => RelayName::Buffer,
            RelayKind::Spool => RelayName::Spool,
        });
    }
    if let Some(profile) = &case.local_profile {
        listener = listener.local_profile(profile);
    }
    if let Some(profile) = &case.remote_profile {
        listener = listener.remote_profile(profile);
    }
    let written = ConfigBuilder::new([&placement.client_prefix])
        .metrics(metrics_listen())
        .spool_dir(&placement.spool_dir)
        .listener(listener.build())
        .build();
    let mut config = written.to_table().map_err(ConfigGenError::Serialize)?;
    // The scenario's own tables go on top: its HTTP engine settings and profiles as written
    // (checked by the proxy when it reads them), then its listener and config extras.
    let extras = |key: &str, table: &toml::Table| {
        (!table.is_empty())
            .then(|| toml::Table::from_iter([(key.to_owned(), table.clone().into())]))
    };
    let written_listener = match config.get_mut("listeners") {
        Some(toml::Value::Array(listeners)) => listeners.first_mut(),
        _ => None,
    };
    if let Some(toml::Value::Table(listener)) = written_listener {
        if case.intercept == Intercept::Http {
            if let Some(http) = extras("http", &case.http) {
                overlay(listener, &http, "listeners")?;
            }
        }
        overlay(listener, &case.listener, "listeners")?;
    }
    add_profiles(&mut config, &case.profiles)?;
    overlay(&mut config, &case.config, "")?;
    toml::to_string(&config).map_err(ConfigGenError::Serialize)
}

/// Adds a case's `[profiles.NAME]` tables as written (the proxy checks them when it reads them).
pub(crate) fn add_profiles(
    config: &mut toml::Table,
    profiles: &toml::Table,
) -> Result<(), ConfigGenError> {
    if !profiles.is_empty() {
        let profiles = toml::Table::from_iter([("profiles".to_owned(), profiles.clone().into())]);
        overlay(config, &profiles, "")?;
    }
    Ok(())
}

/// HAProxy in TCP mode, in the foreground (`haproxy -f FILE -db`), forwarding to the server.
pub(crate) fn haproxy_config(placement: &Placement) -> String {
    let mut config = HaproxyConfig::tcp(4096, Duration::from_secs(5), Duration::from_secs(600));
    config.comment = Some("generated by midway lab".into());
    config.sections.push(ListenSection {
        name: "lab".into(),
        bind: SocketAddr::new(placement.proxy_addr, PROXY_PORT),
        server_name: "s1".into(),
        server: placement.server,
    });
    config.to_string()
}

/// User Squid drops to after binding its port (Debian's package creates it and makes it the
/// owner of Squid's own folders).
pub(crate) const SQUID_USER: &str = "proxy";
/// What `upstream_persistence = "long"` keeps idle upstream connections for (midway's default).
pub(crate) const SQUID_LONG_IDLE: &str = "10 minutes";

/// Squid's service name (`squid -n`) for a topology: it names Squid's shared-memory segments
/// (`/dev/shm/<name>-cf__*.shm`), which Squids with the same name would share.
pub(crate) fn squid_service_name(topology_tag: &str) -> String {
    format!("mwlab{topology_tag}")
}

/// Squid's files inside `dir` (a folder the [`SQUID_USER`] can write).
pub(crate) fn squid_access_log(dir: &Path) -> PathBuf {
    dir.join("access.log")
}

/// Squid as an explicit HTTP proxy on the proxy's client-side address, for the client link only,
/// in the foreground (`squid -N -f FILE`), with its pid, logs and core files in `dir`. Everything
/// else keeps the defaults of Debian's Squid (5.x): memory cache of 256 MB, objects up to 512 KB
/// in memory, no disk cache, no pipelined-request prefetch, idle upstream connections closed after
/// 1 minute, Debian's refresh patterns.
pub(crate) fn squid_config(case: &SquidCase, placement: &Placement, dir: &Path) -> String {
    SquidConfig {
        comment: Some("generated by midway lab".into()),
        listen: SocketAddr::new(placement.proxy_addr, PROXY_PORT),
        allowed_clients: placement.client_prefix.clone(),
        run_dir: dir.to_path_buf(),
        user: SQUID_USER.into(),
        visible_hostname: "midway-lab-squid".into(),
        cache: case.cache,
        idle_upstream_keep: match case.upstream_persistence {
            UpstreamPersistence::Default => None,
            UpstreamPersistence::Long => Some(SQUID_LONG_IDLE.into()),
        },
    }
    .to_string()
}

/// Whether a user (`uid`, primary group `gid`) may enter a folder with this mode and owner:
/// the owner's, the group's or the others' execute bit, whichever class applies first.
pub(crate) fn may_traverse(mode: u32, owner: u32, group: u32, uid: u32, gid: u32) -> bool {
    if uid == 0 {
        return true;
    }
    let bit = if uid == owner {
        0o100
    } else if gid == group {
        0o010
    } else {
        0o001
    };
    mode & bit != 0
}

/// What Squid's access log (native `squid` format) says about a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SquidLogSummary {
    /// Requests logged.
    pub requests: u64,
    /// Requests answered from the cache (`TCP_HIT`, `TCP_MEM_HIT`, `TCP_IMS_HIT`, ...;
    /// `TCP_REFRESH_UNMODIFIED`, a revalidation, is not a hit).
    pub cache_hits: u64,
}

/// Counts requests (`TCP_*` results) and cache hits in Squid's native access log. The fourth
/// field of a line is `RESULT/STATUS`, e.g. `TCP_MEM_HIT/200`.
pub(crate) fn parse_squid_access_log(text: &str) -> SquidLogSummary {
    let mut summary = SquidLogSummary::default();
    for line in text.lines() {
        let Some(result) = line.split_whitespace().nth(3) else {
            continue;
        };
        let Some((code, _status)) = result.split_once('/') else {
            continue;
        };
        // `NONE_NONE/000` lines are connections closed before a request (a browser's
        // preconnect), not requests.
        if !code.starts_with("TCP_") {
            continue;
        }
        summary.requests += 1;
        if code.split('_').any(|part| part == "HIT") {
            summary.cache_hits += 1;
        }
    }
    summary
}

/// Sum of the gauge `connections_active` (None when midway does not export it).
pub(crate) fn active_connections(exposition: &str) -> Option<f64> {
    midway_launch::metrics::metric_sum(exposition, "connections_active")
}

/// Sums `midway_segment_retransmits_total` by segment from a Prometheus text exposition:
/// `{"local": n, "remote": m}`.
///
/// A counter family that is declared (`# TYPE ... counter`) but has no sample for a segment has
/// counted nothing there (prometheus-client creates a label set on its first increment), so
/// both segments are then reported as 0.
pub(crate) fn parse_segment_retransmits(exposition: &str) -> BTreeMap<String, u64> {
    let mut sums = BTreeMap::new();
    let declared = exposition.lines().any(|line| {
        let mut words = line.split_whitespace();
        words.next() == Some("#")
            && words.next() == Some("TYPE")
            && words.next().is_some_and(|name| {
                name == "segment_retransmits" || name.ends_with("_segment_retransmits")
            })
    });
    if declared {
        sums.insert("local".to_string(), 0);
        sums.insert("remote".to_string(), 0);
    }
    for (labels, value) in midway_launch::metrics::samples(exposition, "segment_retransmits_total")
    {
        let Some(segment) = labels.split(',').find_map(|label| {
            let (key, value) = label.split_once('=')?;
            (key.trim() == "segment").then(|| value.trim().trim_matches('"').to_string())
        }) else {
            continue;
        };
        *sums.entry(segment).or_insert(0) += value as u64;
    }
    sums
}

/// Ports in LISTEN state in the text of `/proc/net/tcp` or `/proc/net/tcp6`.
pub(crate) fn listening_ports(proc_net_tcp: &str) -> BTreeSet<u16> {
    const LISTEN: &str = "0A";
    proc_net_tcp
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let state = fields.nth(1)?;
            if state != LISTEN {
                return None;
            }
            let port = local.rsplit_once(':')?.1;
            u16::from_str_radix(port, 16).ok()
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The placement of a proxy between a client on 10.0.1.0/24 and a server on 10.0.2.2, for
    /// the unit tests of what is built from it.
    pub(crate) fn placement() -> Placement {
        Placement {
            server: "10.0.2.2:5001".parse().unwrap(),
            proxy_addr: "10.0.1.2".parse().unwrap(),
            client_prefix: "10.0.1.0/24".into(),
            route_prefix: "10.0.1.0/24".into(),
            client_iface: "e-client".into(),
            spool_dir: "/tmp/spool".into(),
        }
    }

    fn midway(intercept: Intercept) -> MidwayCase {
        MidwayCase {
            intercept,
            relay: RelayKind::Spool,
            local_profile: Some("hfc-local".into()),
            remote_profile: None,
            profiles: toml::from_str("[tuned]\ninherits = \"hfc-local\"\nrecv_buffer = 8192")
                .unwrap(),
            listener: toml::from_str("buffer_bytes = 65536").unwrap(),
            config: toml::from_str("[proxy]\nmax_connections = 10").unwrap(),
            http: toml::Table::new(),
        }
    }

    fn web_placement() -> Placement {
        Placement {
            server: "10.0.2.2:80".parse().unwrap(),
            ..placement()
        }
    }

    #[test]
    fn http_config_is_an_explicit_proxy_with_the_case_http_table_and_midway_accepts_it() {
        let case = MidwayCase {
            intercept: Intercept::Http,
            relay: RelayKind::Buffer,
            local_profile: Some("hfc-local".into()),
            remote_profile: Some("wan".into()),
            profiles: toml::Table::new(),
            listener: toml::Table::new(),
            config: toml::Table::new(),
            http: toml::from_str("cache = false\nupstream_idle_keep = \"10m\"").unwrap(),
        };
        let text = midway_config(&case, &web_placement()).unwrap();
        let config: toml::Table = toml::from_str(&text).unwrap();
        let listener = &config["listeners"][0];
        assert_eq!(listener["mode"].as_str(), Some("http"));
        assert!(listener.get("relay").is_none(), "{text}");
        assert!(listener.get("target").is_none(), "{text}");
        assert_eq!(listener["http"]["cache"].as_bool(), Some(false));
        // midway's own parser takes it as an HTTP listener with the cache off.
        let parsed = midway_proxy::config::parse_config(&text, "generated").unwrap();
        let http = parsed.listeners[0].http.as_ref().expect("an HTTP listener");
        assert!(!http.cache.enabled);
        let forward = midway_config(&midway(Intercept::Forward), &placement()).unwrap();
        midway_proxy::config::parse_config(&forward, "generated").unwrap();
    }

    #[test]
    fn explicit_proxies_are_squid_and_midway_http_only() {
        let placement = web_placement();
        let case = |kind: CaseKind, midway: Option<MidwayCase>| Case {
            name: "c".into(),
            kind,
            host: "proxy".into(),
            midway,
            squid: None,
            chain: None,
            route_tuning: None,
        };
        let proxy: SocketAddr = "10.0.1.2:8080".parse().unwrap();
        let mut http = midway(Intercept::Http);
        http.listener = toml::Table::new();
        assert_eq!(
            explicit_proxy(&case(CaseKind::Squid, None), &placement),
            Some(proxy)
        );
        assert_eq!(
            explicit_proxy(&case(CaseKind::Midway, Some(http.clone())), &placement),
            Some(proxy)
        );
        assert_eq!(
            connect_target(&case(CaseKind::Midway, Some(http)), &placement),
            proxy
        );
        let transparent = case(CaseKind::Midway, Some(midway(Intercept::Transparent)));
        assert_eq!(explicit_proxy(&transparent, &placement), None);
        assert_eq!(connect_target(&transparent, &placement), placement.server);
        assert_eq!(
            explicit_proxy(&case(CaseKind::Direct, None), &placement),
            None
        );
        assert_eq!(
            explicit_proxy(&case(CaseKind::Haproxy, None), &placement),
            None
        );
    }

    #[test]
    fn squid_config_limits_access_and_keeps_files_in_the_point_folder() {
        let dir = Path::new("/out/points/00001-web-squid-r0/squid");
        let default = squid_config(
            &SquidCase {
                cache: true,
                upstream_persistence: UpstreamPersistence::Default,
            },
            &web_placement(),
            dir,
        );
        let lines: Vec<&str> = default.lines().collect();
        for wanted in [
            "http_port 10.0.1.2:8080",
            "acl lab_clients src 10.0.1.0/24",
            "http_access allow lab_clients",
            "http_access deny all",
            "pid_filename /out/points/00001-web-squid-r0/squid/squid.pid",
            "access_log stdio:/out/points/00001-web-squid-r0/squid/access.log squid",
            "cache_log /out/points/00001-web-squid-r0/squid/cache.log",
            "cache_effective_user proxy",
            r"refresh_pattern -i (/cgi-bin/|\?) 0 0% 0",
        ] {
            assert!(lines.contains(&wanted), "missing `{wanted}` in:\n{default}");
        }
        // Allow comes before the final deny (Squid applies the first match).
        let allow = lines
            .iter()
            .position(|l| *l == "http_access allow lab_clients");
        let deny = lines.iter().position(|l| *l == "http_access deny all");
        assert!(allow < deny);
        assert!(!default.contains("cache deny all"));
        assert!(!default.contains("server_idle_pconn_timeout"));
        assert!(!default.contains("cache_dir"), "memory cache only");

        let off_long = squid_config(
            &SquidCase {
                cache: false,
                upstream_persistence: UpstreamPersistence::Long,
            },
            &web_placement(),
            dir,
        );
        let lines: Vec<&str> = off_long.lines().collect();
        assert!(lines.contains(&"cache deny all"), "{off_long}");
        assert!(
            lines.contains(&"server_idle_pconn_timeout 10 minutes"),
            "{off_long}"
        );
    }

    #[test]
    fn squid_service_names_are_short_alphanumeric_and_per_topology() {
        let longest = squid_service_name(&"z".repeat(midway_labnet::MAX_TAG));
        assert!(longest.len() <= 32, "{longest}");
        assert!(longest.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(squid_service_name("a1"), squid_service_name("a2"));
    }

    #[test]
    fn traversal_follows_the_first_matching_permission_class() {
        assert!(may_traverse(0o700, 13, 13, 13, 13));
        assert!(!may_traverse(0o700, 0, 0, 13, 13));
        assert!(may_traverse(0o701, 0, 0, 13, 13));
        assert!(may_traverse(0o710, 0, 13, 13, 13));
        // The owner class applies even when others could enter.
        assert!(!may_traverse(0o011, 13, 0, 13, 13));
        assert!(may_traverse(0o000, 5, 5, 0, 0));
    }

    #[test]
    fn squid_access_log_counts_requests_and_hits() {
        let log = "\
1700000000.100    120 10.0.1.1 TCP_MISS/200 3500 GET http://www.lab/page/0.html - HIER_DIRECT/10.0.2.2 text/html
1700000000.200      0 10.0.1.1 TCP_MEM_HIT/200 3500 GET http://s1.lab/obj/0/0 - HIER_NONE/- application/octet-stream
1700000000.300      1 10.0.1.1 TCP_HIT/200 3500 GET http://s1.lab/obj/0/1 - HIER_NONE/- application/octet-stream
1700000000.400     80 10.0.1.1 TCP_REFRESH_UNMODIFIED/200 3500 GET http://s1.lab/obj/0/2 - HIER_DIRECT/10.0.2.2 -
1700000000.500      0 10.0.1.1 TCP_DENIED/403 3900 GET http://other/ - HIER_NONE/- text/html
1700000000.600      0 10.0.1.1 NONE_NONE/000 0 - error:transaction-end-before-headers - HIER_NONE/- -
garbage line
";
        assert_eq!(
            parse_squid_access_log(log),
            SquidLogSummary {
                requests: 5,
                cache_hits: 2
            }
        );
        assert_eq!(parse_squid_access_log(""), SquidLogSummary::default());
    }

    #[test]
    fn forward_config_targets_the_server_and_merges_extras() {
        let text = midway_config(&midway(Intercept::Forward), &placement()).unwrap();
        let config: toml::Table = toml::from_str(&text).unwrap();
        let listener = &config["listeners"][0];
        assert_eq!(listener["mode"].as_str(), Some("forward"));
        assert_eq!(listener["target"].as_str(), Some("10.0.2.2:5001"));
        assert_eq!(listener["relay"].as_str(), Some("spool"));
        assert_eq!(listener["local_profile"].as_str(), Some("hfc-local"));
        assert_eq!(listener["buffer_bytes"].as_integer(), Some(65536));
        assert_eq!(config["proxy"]["max_connections"].as_integer(), Some(10));
        assert_eq!(
            config["proxy"]["allowed_clients"][0].as_str(),
            Some("10.0.1.0/24")
        );
        assert_eq!(
            config["profiles"]["tuned"]["recv_buffer"].as_integer(),
            Some(8192)
        );
    }

    #[test]
    fn transparent_config_intercepts_the_server_port_on_the_client_interface() {
        let text = midway_config(&midway(Intercept::Transparent), &placement()).unwrap();
        let config: toml::Table = toml::from_str(&text).unwrap();
        let nft = &config["listeners"][0]["nftables"];
        assert_eq!(nft["interfaces"][0].as_str(), Some("e-client"));
        assert_eq!(nft["ports"][0].as_integer(), Some(5001));
        assert!(config["listeners"][0].get("target").is_none());
    }

    #[test]
    fn merge_refuses_to_replace_a_table_with_a_value() {
        let mut case = midway(Intercept::Forward);
        case.config = toml::from_str("proxy = 3").unwrap();
        assert!(matches!(
            midway_config(&case, &placement()),
            Err(ConfigGenError::MergeConflict { .. })
        ));
    }

    #[test]
    fn haproxy_binds_the_proxy_address_and_forwards_to_the_server() {
        let cfg = haproxy_config(&placement());
        assert!(cfg.contains("bind 10.0.1.2:8080"));
        assert!(cfg.contains("server s1 10.0.2.2:5001"));
        assert!(cfg.contains("mode tcp"));
    }

    #[test]
    fn segment_retransmits_are_summed_per_segment() {
        let text = "# HELP midway_segment_retransmits_total x\n\
            midway_segment_retransmits_total{listener=\"lab\",segment=\"local\"} 12\n\
            midway_segment_retransmits_total{listener=\"other\",segment=\"local\"} 3\n\
            midway_segment_retransmits_total{segment=\"remote\",listener=\"lab\"} 0\n\
            midway_bytes_total{listener=\"lab\"} 99\n";
        let sums = parse_segment_retransmits(text);
        assert_eq!(sums.get("local"), Some(&15));
        assert_eq!(sums.get("remote"), Some(&0));
        assert_eq!(sums.len(), 2);
        // A registry prefix in front of the name does not matter.
        let prefixed = "midway_midway_segment_retransmits_total{segment=\"local\"} 4\n\
            midway_midway_connections_active{listener=\"lab\"} 1\n";
        assert_eq!(parse_segment_retransmits(prefixed).get("local"), Some(&4));
        assert_eq!(active_connections(prefixed), Some(1.0));
        assert_eq!(active_connections(text), None);
        let declared_only = "# HELP midway_segment_retransmits x\n\
            # TYPE midway_segment_retransmits counter\n";
        assert_eq!(
            parse_segment_retransmits(declared_only),
            BTreeMap::from([("local".to_string(), 0), ("remote".to_string(), 0)])
        );
        assert!(parse_segment_retransmits("").is_empty());
    }

    #[test]
    fn listening_ports_come_from_state_0a_only() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0\n\
   1: 0100007F:24F8 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0\n";
        assert_eq!(listening_ports(text), BTreeSet::from([8080]));
    }
}
