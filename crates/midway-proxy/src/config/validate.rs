//! Stage 3: file structs -> [`RuntimeConfig`]. The `[proxy]`, `[spool]` and `[metrics]`
//! sections here, each listener in [`super::listener`], `[listeners.http]` in [`super::http`],
//! and the checks across listeners last. Every check names the key and says how to fix it;
//! checks run in the file's order and the first problem is the one reported.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use midway_tcp::TcpProfile;

use super::listener::{validate_listener, PeerNames};
use super::peers::{keys, peers};
use super::{
    ConfigError, DeniedDestinations, FileConfig, FileListener, FileSocketMemory, FileSpool,
    Intercept, ListenerConfig, ListenerTransport, RuntimeConfig, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_DENIED_DESTINATIONS, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_CLIENT, DEFAULT_MAX_HOPS,
    DEFAULT_MAX_PIPES, DEFAULT_PEER_HEADER_WINDOW, DEFAULT_ROUTE_KNOBS_MARK_BASE,
    DEFAULT_ROUTE_KNOBS_TABLE_BASE, DEFAULT_SHUTDOWN_GRACE, DEFAULT_SPOOL_DIR,
    DEFAULT_SPOOL_MAX_TOTAL_BYTES, MAX_MAX_HOPS, MAX_WORKER_THREADS, MIN_SOCKET_MEMORY_BUDGET,
};
use crate::sockmem::SocketMemorySetting;

/// Turns values into [`ConfigError::Invalid`]s that name the file and the key.
pub(super) struct Validator<'a> {
    pub(super) origin: &'a str,
}

impl Validator<'_> {
    pub(super) fn invalid(
        &self,
        key: impl Into<String>,
        problem: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origin.to_string(),
            key: key.into(),
            problem: problem.into(),
        }
    }

    /// An IP prefix or a single address, normalised (host bits cleared).
    pub(super) fn prefix(&self, key: &str, text: &str) -> Result<IpNet, ConfigError> {
        if let Ok(net) = text.parse::<IpNet>() {
            // Normalise 10.1.0.7/24 to 10.1.0.0/24 so matching and printing agree.
            return Ok(net.trunc());
        }
        if let Ok(addr) = text.parse::<IpAddr>() {
            return Ok(IpNet::from(addr));
        }
        Err(self.invalid(
            key,
            format!("{text:?} is not an IP prefix; write e.g. \"10.1.0.0/24\" or \"fd00:1::/64\""),
        ))
    }

    /// A count of at least 1, or `default` when not set.
    pub(super) fn positive(
        &self,
        key: &str,
        value: Option<usize>,
        default: usize,
    ) -> Result<usize, ConfigError> {
        match value {
            Some(0) => Err(self.invalid(key, "must be at least 1")),
            Some(v) => Ok(v),
            None => Ok(default),
        }
    }

    /// A duration longer than zero, or `default` when not set.
    pub(super) fn duration(
        &self,
        key: &str,
        value: Option<Duration>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match value {
            Some(d) if d.is_zero() => {
                Err(self.invalid(key, "must be longer than zero, e.g. \"5s\""))
            }
            Some(d) => Ok(d),
            None => Ok(default),
        }
    }

    /// A profile name that `profiles` defines.
    pub(super) fn profile_name(
        &self,
        key: &str,
        name: &str,
        profiles: &BTreeMap<String, TcpProfile>,
    ) -> Result<String, ConfigError> {
        if profiles.contains_key(name) {
            Ok(name.to_string())
        } else {
            let known: Vec<&str> = profiles.keys().map(String::as_str).collect();
            Err(self.invalid(
                key,
                format!(
                    "unknown profile {name:?}; define [profiles.{name}] or use one of: {}",
                    known.join(", ")
                ),
            ))
        }
    }
}

/// A section of the file whose keys share a path (`listeners[0]`, `listeners[0].http`).
pub(super) struct Section<'v> {
    pub(super) v: &'v Validator<'v>,
    base: String,
}

impl<'v> Section<'v> {
    pub(super) fn new(v: &'v Validator<'v>, base: String) -> Section<'v> {
        Section { v, base }
    }

    /// The full key path of `field` in this section.
    pub(super) fn key(&self, field: &str) -> String {
        format!("{}.{field}", self.base)
    }

    /// [`Validator::invalid`] for `field` of this section.
    pub(super) fn invalid(&self, field: &str, problem: impl Into<String>) -> ConfigError {
        self.v.invalid(self.key(field), problem)
    }

    /// [`Validator::positive`] for `field` of this section.
    pub(super) fn positive(
        &self,
        field: &str,
        value: Option<usize>,
        default: usize,
    ) -> Result<usize, ConfigError> {
        self.v.positive(&self.key(field), value, default)
    }

    /// [`Validator::duration`] for `field` of this section.
    pub(super) fn duration(
        &self,
        field: &str,
        value: Option<Duration>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        self.v.duration(&self.key(field), value, default)
    }

    /// Refuses the first of `keys` (field, whether set) that is set: `problem` says why.
    pub(super) fn refuse_set_keys(
        &self,
        keys: &[(&str, bool)],
        problem: &str,
    ) -> Result<(), ConfigError> {
        match keys.iter().find(|(_, set)| *set) {
            Some((field, _)) => Err(self.invalid(field, problem)),
            None => Ok(()),
        }
    }

    /// [`Validator::profile_name`] for `field` of this section.
    pub(super) fn profile_name(
        &self,
        field: &str,
        name: &str,
        profiles: &BTreeMap<String, TcpProfile>,
    ) -> Result<String, ConfigError> {
        self.v.profile_name(&self.key(field), name, profiles)
    }
}

/// The whole file -> [`RuntimeConfig`]; `origin` names the file in errors.
pub(super) fn validate(file: FileConfig, origin: &str) -> Result<RuntimeConfig, ConfigError> {
    let v = Validator { origin };
    let proxy = file.proxy;

    let allowed_clients = allowed_clients(&v, proxy.allowed_clients.unwrap_or_default())?;
    let denied_destinations = denied_destinations(&v, proxy.denied_destinations.as_deref())?;
    let max_connections = v.positive(
        "proxy.max_connections",
        proxy.max_connections,
        DEFAULT_MAX_CONNECTIONS,
    )?;
    let max_connections_per_client = v.positive(
        "proxy.max_connections_per_client",
        proxy.max_connections_per_client,
        DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    )?;
    let max_pipes = proxy.max_pipes.unwrap_or(DEFAULT_MAX_PIPES);
    let worker_threads = worker_threads(&v, proxy.worker_threads)?;
    let socket_memory = socket_memory(&v, proxy.socket_memory)?;
    let connect_timeout = v.duration(
        "proxy.connect_timeout",
        proxy.connect_timeout,
        DEFAULT_CONNECT_TIMEOUT,
    )?;
    let idle_timeout = v.duration(
        "proxy.idle_timeout",
        proxy.idle_timeout,
        DEFAULT_IDLE_TIMEOUT,
    )?;
    let shutdown_grace = proxy.shutdown_grace.unwrap_or(DEFAULT_SHUTDOWN_GRACE);
    let handshake_timeout = v.duration(
        "proxy.handshake_timeout",
        proxy.handshake_timeout,
        DEFAULT_HANDSHAKE_TIMEOUT,
    )?;
    let (spool_dir, spool_max_total_bytes) = spool(&v, file.spool)?;

    let profiles =
        midway_tcp::resolve_profiles(&file.profiles).map_err(|source| ConfigError::Profile {
            origin: origin.to_string(),
            source,
        })?;
    let max_hops = match proxy.max_hops {
        None => DEFAULT_MAX_HOPS,
        Some(hops) if (2..=MAX_MAX_HOPS).contains(&hops) => hops,
        Some(hops) => {
            return Err(v.invalid(
                "proxy.max_hops",
                format!(
                    "{hops} is outside 2..={MAX_MAX_HOPS} (an edge and a gateway are 2 hops);                      leave it out for {DEFAULT_MAX_HOPS}"
                ),
            ))
        }
    };
    let peer_header_window = v.duration(
        "proxy.peer_header_window",
        proxy.peer_header_window,
        DEFAULT_PEER_HEADER_WINDOW,
    )?;
    let keys = keys(&v, file.keys)?;
    let identity = super::transport::identity(&v, file.tls)?;
    let peers = peers(&v, file.peers, &keys, &profiles, identity.as_ref())?;
    let names = PeerNames {
        peers: &peers,
        keys: &keys,
        identity: identity.as_ref(),
    };
    let listeners = listeners(&v, file.listeners, &profiles, &names)?;
    let access_links = super::access_links::access_links(&v, file.access_links)?;
    let runtime_directory = std::env::var_os("RUNTIME_DIRECTORY");
    let control = super::control::control(&v, file.control, runtime_directory.as_deref())?;

    Ok(RuntimeConfig {
        origin: origin.to_string(),
        allowed_clients,
        denied_destinations,
        max_connections,
        max_connections_per_client,
        connect_timeout,
        idle_timeout,
        shutdown_grace,
        handshake_timeout,
        max_pipes,
        worker_threads,
        socket_memory,
        route_knobs_table_base: proxy
            .route_knobs_table_base
            .unwrap_or(DEFAULT_ROUTE_KNOBS_TABLE_BASE),
        route_knobs_mark_base: proxy
            .route_knobs_mark_base
            .unwrap_or(DEFAULT_ROUTE_KNOBS_MARK_BASE),
        metrics_listen: file.metrics.map(|m| m.listen),
        control,
        spool_dir,
        spool_max_total_bytes,
        profiles,
        keys,
        peers,
        max_hops,
        peer_header_window,
        listeners,
        access_links,
    })
}

/// `proxy.allowed_clients`: required, never empty.
fn allowed_clients(v: &Validator<'_>, allowed: Vec<String>) -> Result<Vec<IpNet>, ConfigError> {
    if allowed.is_empty() {
        return Err(v.invalid(
            "proxy.allowed_clients",
            "required and must not be empty (midway is never an open proxy); \
             list the client prefixes, e.g. allowed_clients = [\"10.1.0.0/24\"]",
        ));
    }
    prefixes(v, "proxy.allowed_clients", &allowed)
}

/// `proxy.denied_destinations`, or [`DEFAULT_DENIED_DESTINATIONS`] when not set.
/// The keyword of `denied_destinations` for this host's own interface addresses.
const OWN_ADDRESSES: &str = "self";

fn denied_destinations(
    v: &Validator<'_>,
    denied: Option<&[String]>,
) -> Result<DeniedDestinations, ConfigError> {
    let list: Vec<String> = match denied {
        Some(list) => list.to_vec(),
        None => DEFAULT_DENIED_DESTINATIONS
            .iter()
            .map(|text| text.to_string())
            .collect(),
    };
    let own_addresses = list.iter().any(|entry| entry == OWN_ADDRESSES);
    let prefix_texts: Vec<String> = list
        .into_iter()
        .filter(|entry| entry != OWN_ADDRESSES)
        .collect();
    Ok(DeniedDestinations {
        prefixes: prefixes(v, "proxy.denied_destinations", &prefix_texts)?,
        own_addresses,
    })
}

/// Every entry of the list `key` as a prefix.
fn prefixes(v: &Validator<'_>, key: &str, list: &[String]) -> Result<Vec<IpNet>, ConfigError> {
    list.iter()
        .enumerate()
        .map(|(i, text)| v.prefix(&format!("{key}[{i}]"), text))
        .collect()
}

/// `proxy.worker_threads`: 1..=[`MAX_WORKER_THREADS`], or `None` (one per CPU).
fn worker_threads(v: &Validator<'_>, threads: Option<usize>) -> Result<Option<usize>, ConfigError> {
    match threads {
        Some(0) => Err(v.invalid("proxy.worker_threads", "must be at least 1")),
        Some(n) if n > MAX_WORKER_THREADS => Err(v.invalid(
            "proxy.worker_threads",
            format!(
                "{n} is more than {MAX_WORKER_THREADS}; use about one per CPU, or leave it \
                 out for exactly that"
            ),
        )),
        other => Ok(other),
    }
}

/// `proxy.socket_memory = "auto" | "off" | <bytes>`.
fn socket_memory(
    v: &Validator<'_>,
    setting: Option<FileSocketMemory>,
) -> Result<SocketMemorySetting, ConfigError> {
    match setting {
        None => Ok(SocketMemorySetting::Auto),
        Some(FileSocketMemory::Keyword(word)) if word == "auto" => Ok(SocketMemorySetting::Auto),
        Some(FileSocketMemory::Keyword(word)) if word == "off" => Ok(SocketMemorySetting::Off),
        Some(FileSocketMemory::Bytes(bytes)) if bytes >= MIN_SOCKET_MEMORY_BUDGET => {
            Ok(SocketMemorySetting::Budget(bytes))
        }
        Some(FileSocketMemory::Bytes(bytes)) => Err(v.invalid(
            "proxy.socket_memory",
            format!(
                "{bytes} bytes is too small a budget for the socket memory guard (at least \
                 {MIN_SOCKET_MEMORY_BUDGET}); write \"auto\" (half of net.ipv4.tcp_mem's \
                 pressure value), \"off\", or a byte count such as 536870912"
            ),
        )),
        Some(FileSocketMemory::Keyword(word)) => Err(v.invalid(
            "proxy.socket_memory",
            format!(
                "{word:?} is not a setting; write \"auto\" (half of net.ipv4.tcp_mem's \
                 pressure value), \"off\", or a byte count such as 536870912"
            ),
        )),
    }
}

/// `[spool]`: the directory and the disk all spool files may use together.
fn spool(v: &Validator<'_>, spool: Option<FileSpool>) -> Result<(PathBuf, u64), ConfigError> {
    let spool = spool.unwrap_or(FileSpool {
        dir: None,
        max_total_bytes: None,
    });
    let dir = spool
        .dir
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SPOOL_DIR));
    if dir.as_os_str().is_empty() {
        return Err(v.invalid("spool.dir", "must not be empty"));
    }
    let max_total_bytes = spool
        .max_total_bytes
        .unwrap_or(DEFAULT_SPOOL_MAX_TOTAL_BYTES);
    Ok((dir, max_total_bytes))
}

/// Every `[[listeners]]` table (at least one), with unique names and addresses, then the
/// checks across listeners.
fn listeners(
    v: &Validator<'_>,
    files: Vec<FileListener>,
    profiles: &BTreeMap<String, TcpProfile>,
    peer_names: &PeerNames<'_>,
) -> Result<Vec<ListenerConfig>, ConfigError> {
    if files.is_empty() {
        return Err(v.invalid(
            "listeners",
            "at least one [[listeners]] table is required (mode, listen, ...)",
        ));
    }
    let mut names = BTreeSet::new();
    let mut addrs = BTreeMap::new();
    let mut listeners = Vec::with_capacity(files.len());
    for (index, listener) in files.into_iter().enumerate() {
        let config = validate_listener(v, index, listener, profiles, peer_names)?;
        if !names.insert(config.name.clone()) {
            return Err(v.invalid(
                format!("listeners[{index}].name"),
                format!(
                    "duplicate listener name {:?}; give every listener its own name",
                    config.name
                ),
            ));
        }
        if config.listen.port() != 0 {
            // A QUIC peer listener's socket is UDP: it shares its port with a TCP listener
            // (its TLS fallback, typically).
            let udp = matches!(
                &config.intercept,
                Intercept::Peer {
                    transport: ListenerTransport::Quic { .. },
                    ..
                }
            );
            if let Some(other) = addrs.insert((config.listen, udp), config.name.clone()) {
                return Err(v.invalid(
                    format!("listeners[{index}].listen"),
                    format!("{} is already used by listener {other:?}", config.listen),
                ));
            }
        }
        listeners.push(config);
    }
    check_nft_tables(v, &listeners)?;
    check_http_cache_dirs(v, &listeners)?;
    Ok(listeners)
}

/// Two HTTP listeners must not share a disk cache directory: each removes stale files there
/// at start and evicts by its own accounting.
fn check_http_cache_dirs(
    v: &Validator<'_>,
    listeners: &[ListenerConfig],
) -> Result<(), ConfigError> {
    let mut owner: BTreeMap<&Path, &str> = BTreeMap::new();
    for (index, listener) in listeners.iter().enumerate() {
        let Some(disk) = listener.http.as_ref().and_then(|h| h.cache.disk.as_ref()) else {
            continue;
        };
        if let Some(other) = owner.insert(&disk.dir, &listener.name) {
            return Err(v.invalid(
                format!("listeners[{index}].http.cache_disk_dir"),
                format!(
                    "{} is already the cache directory of listener {other:?}; give each HTTP \
                     listener its own",
                    disk.dir.display()
                ),
            ));
        }
    }
    Ok(())
}

/// Listeners sharing one nftables table must agree on whether midway manages it, and a mark
/// must always lead to the same route table.
fn check_nft_tables(v: &Validator<'_>, listeners: &[ListenerConfig]) -> Result<(), ConfigError> {
    let mut manage_by_table: BTreeMap<&str, bool> = BTreeMap::new();
    let mut table_by_mark: BTreeMap<u32, u32> = BTreeMap::new();
    for (index, listener) in listeners.iter().enumerate() {
        if let Intercept::Transparent { nftables, .. } = &listener.intercept {
            if let Some(&manage) = manage_by_table.get(nftables.table.as_str()) {
                if manage != nftables.manage {
                    return Err(v.invalid(
                        format!("listeners[{index}].nftables.manage"),
                        format!(
                            "listeners sharing table {:?} must agree on manage",
                            nftables.table
                        ),
                    ));
                }
            }
            manage_by_table.insert(&nftables.table, nftables.manage);
            if let Some(&rt) = table_by_mark.get(&nftables.mark) {
                if rt != nftables.route_table {
                    return Err(v.invalid(
                        format!("listeners[{index}].nftables.route_table"),
                        format!(
                            "mark {} is already routed to table {rt}; use the same table",
                            nftables.mark
                        ),
                    ));
                }
            }
            table_by_mark.insert(nftables.mark, nftables.route_table);
        }
    }
    Ok(())
}
