//! Stage 3's result: the validated configuration the proxy runs with.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use midway_http::HttpProxyConfig;
use midway_relay::RelayModel;
use midway_tcp::TcpProfile;

use crate::sockmem::SocketMemorySetting;

/// Validated configuration the proxy runs with.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where the config came from (file path), for messages.
    pub origin: String,
    /// Client prefixes allowed to use the proxy; never empty.
    pub allowed_clients: Vec<IpNet>,
    /// Prefixes SOCKS5 and HTTP listeners refuse to connect to (client-chosen targets only:
    /// forward targets are the operator's, transparent ones are routed packets' destinations).
    pub denied_destinations: Vec<IpNet>,
    /// Total split connections served at once, all listeners together.
    pub max_connections: usize,
    /// Split connections one client address may hold at once.
    pub max_connections_per_client: usize,
    /// Time allowed to establish a remote segment.
    pub connect_timeout: Duration,
    /// A split connection with no byte in either direction for this long is closed.
    pub idle_timeout: Duration,
    /// After shutdown is requested, connections may finish for this long before they are cancelled.
    pub shutdown_grace: Duration,
    /// Time a SOCKS5 client has to complete its greeting, authentication and request.
    pub handshake_timeout: Duration,
    /// Splice pipe pairs held at once (each costs two file descriptors).
    pub max_pipes: usize,
    /// Threads of the async runtime that runs every connection; `None`: one per CPU.
    pub worker_threads: Option<usize>,
    /// Socket memory guard for relayed sockets.
    pub socket_memory: SocketMemorySetting,
    /// First routing table / fwmark for profiles that need route-metric knobs.
    pub route_knobs_table_base: u32,
    /// See [`Self::route_knobs_table_base`].
    pub route_knobs_mark_base: u32,
    /// Address of the Prometheus `/metrics` endpoint, if any.
    pub metrics_listen: Option<SocketAddr>,
    /// Where spool-mode relays keep their files.
    pub spool_dir: PathBuf,
    /// Disk all spool files together may use.
    pub spool_max_total_bytes: u64,
    /// Every profile by name: the presets plus `[profiles.*]`.
    pub profiles: BTreeMap<String, TcpProfile>,
    /// Every listener, in file order.
    pub listeners: Vec<ListenerConfig>,
}

impl RuntimeConfig {
    /// Whether a client-chosen target at `addr` is refused (see
    /// [`super::DEFAULT_DENIED_DESTINATIONS`]).
    pub fn is_denied_destination(&self, addr: IpAddr) -> bool {
        denied(&self.denied_destinations, addr)
    }
}

/// Whether `addr` (IPv4-mapped IPv6 taken as its IPv4 address) falls in one of `prefixes`.
pub fn denied(prefixes: &[IpNet], addr: IpAddr) -> bool {
    let addr = addr.to_canonical();
    prefixes.iter().any(|net| net.contains(&addr))
}

/// One validated listener.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// Unique name, used in logs and as the `listener` metric label.
    pub name: String,
    /// Address to listen on (port 0: any free port).
    pub listen: SocketAddr,
    /// How connections reach this listener, with the mode's settings.
    pub intercept: Intercept,
    /// Byte relay of split connections (unused by listeners that speak HTTP).
    pub relay: RelayModel,
    /// Set when the listener speaks HTTP: `mode = "http"`, or transparent with
    /// `application = "http"`. Then [`Self::remote_profile`] applies to every upstream
    /// connection (they are pooled across clients, so there are no per-client remote overrides).
    pub http: Option<HttpProxyConfig>,
    /// Profile names (keys of [`RuntimeConfig::profiles`]) used unless a client prefix overrides.
    pub local_profile: String,
    /// See [`Self::local_profile`].
    pub remote_profile: String,
    /// Overrides per client prefix, longest prefix first.
    pub client_profiles: Vec<ClientProfileOverride>,
}

impl ListenerConfig {
    /// Profile names (local, remote) for a client: the longest matching override wins per segment.
    pub fn profiles_for(&self, client: IpAddr) -> (&str, &str) {
        most_specific(
            client,
            self.client_profiles.iter().map(|o| {
                (
                    &o.prefix,
                    o.local_profile.as_deref(),
                    o.remote_profile.as_deref(),
                )
            }),
            (&self.local_profile, &self.remote_profile),
        )
    }
}

/// The (local, remote) choice for `client`: per segment, the first override whose prefix
/// contains the client and that sets that segment, else the default. Overrides come longest
/// prefix first (validation sorts them), so the first match is the most specific one. The one
/// rule for profile names and for the proxy's resolved profiles alike.
pub fn most_specific<'a, T: ?Sized>(
    client: IpAddr,
    overrides: impl IntoIterator<Item = (&'a IpNet, Option<&'a T>, Option<&'a T>)>,
    default: (&'a T, &'a T),
) -> (&'a T, &'a T) {
    let mut local = None;
    let mut remote = None;
    for (prefix, over_local, over_remote) in overrides {
        if !prefix.contains(&client) {
            continue;
        }
        local = local.or(over_local);
        remote = remote.or(over_remote);
    }
    (local.unwrap_or(default.0), remote.unwrap_or(default.1))
}

/// Profile override for clients in `prefix`.
#[derive(Debug, Clone)]
pub struct ClientProfileOverride {
    /// Clients this override applies to.
    pub prefix: IpNet,
    /// Profile of the local segment for these clients, if overridden.
    pub local_profile: Option<String>,
    /// Profile of the remote segment for these clients, if overridden.
    pub remote_profile: Option<String>,
}

/// How connections reach a listener, with the mode's settings.
#[derive(Debug, Clone)]
pub enum Intercept {
    /// Every connection goes to one target.
    Forward {
        /// Where every connection goes.
        target: TargetAddr,
    },
    /// SOCKS5 (RFC 1928) CONNECT.
    Socks5 {
        /// How clients authenticate.
        auth: Socks5Auth,
    },
    /// nftables TPROXY: the accepted socket's local address is the original destination.
    Transparent {
        /// Connect the remote segment from the client's own address.
        spoof_client_address: bool,
        /// The interception rules and policy routing.
        nftables: NftConfig,
    },
    /// Explicit HTTP proxy: each request names its origin (absolute URI, CONNECT authority).
    Http,
}

impl Intercept {
    /// The `mode` value that selects this intercept, for logs.
    pub fn mode_name(&self) -> &'static str {
        match self {
            Intercept::Forward { .. } => "forward",
            Intercept::Socks5 { .. } => "socks5",
            Intercept::Transparent { .. } => "transparent",
            Intercept::Http => "http",
        }
    }
}

/// Where a remote segment goes: an address, or a name resolved when connecting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetAddr {
    /// An address, connected as is.
    Ip(SocketAddr),
    /// A host name and port, resolved when connecting.
    Domain(String, u16),
}

impl TargetAddr {
    /// Parses `ip:port`, `[v6]:port` or `host:port`.
    pub fn parse(text: &str) -> Result<TargetAddr, String> {
        if let Ok(addr) = text.parse::<SocketAddr>() {
            return Ok(TargetAddr::Ip(addr));
        }
        let (host, port) = text
            .rsplit_once(':')
            .ok_or_else(|| "expected \"host:port\" (e.g. \"10.2.0.2:5201\")".to_string())?;
        let port: u16 = port
            .parse()
            .map_err(|_| format!("port {port:?} is not a number 0..65535"))?;
        if host.is_empty() || host.contains(':') || host.len() > 255 {
            return Err("expected \"host:port\"; write IPv6 addresses as \"[addr]:port\"".into());
        }
        Ok(TargetAddr::Domain(host.to_string(), port))
    }
}

impl fmt::Display for TargetAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetAddr::Ip(addr) => write!(f, "{addr}"),
            TargetAddr::Domain(host, port) => write!(f, "{host}:{port}"),
        }
    }
}

/// SOCKS5 authentication.
#[derive(Clone)]
pub enum Socks5Auth {
    /// No authentication.
    None,
    /// RFC 1929 username/password; (name, password) pairs.
    Password(Vec<(String, String)>),
}

impl fmt::Debug for Socks5Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Socks5Auth::None => f.write_str("None"),
            Socks5Auth::Password(users) => {
                let names: Vec<&str> = users.iter().map(|(n, _)| n.as_str()).collect();
                f.debug_struct("Password").field("users", &names).finish()
            }
        }
    }
}

/// nftables / policy routing for one transparent listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftConfig {
    /// Install at start and remove at stop; otherwise only print the rules.
    pub manage: bool,
    /// Name of the nftables table (shared by listeners that name the same one).
    pub table: String,
    /// Interfaces whose incoming traffic is intercepted; empty: all.
    pub interfaces: Vec<String>,
    /// Destination ports intercepted; empty: all.
    pub ports: Vec<u16>,
    /// fwmark that routes intercepted packets to local delivery.
    pub mark: u32,
    /// Routing table holding `local default dev lo` for `mark`.
    pub route_table: u32,
}
