//! Stage 3's result: the validated configuration the proxy runs with.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
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
    pub denied_destinations: DeniedDestinations,
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
    /// The control socket (`midway status`), unless turned off.
    pub control: Option<super::ControlConfig>,
    /// Where spool-mode relays keep their files.
    pub spool_dir: PathBuf,
    /// Disk all spool files together may use.
    pub spool_max_total_bytes: u64,
    /// Every profile by name: the presets plus `[profiles.*]`.
    pub profiles: BTreeMap<String, TcpProfile>,
    /// Pre-shared keys by name (`[keys.NAME]`), read and checked at load.
    pub keys: BTreeMap<String, PeerKey>,
    /// Other midways connections may go through (`[[peers]]`), in file order.
    pub peers: Vec<PeerConfig>,
    /// Midways a connection may cross, this one included: a peer header that arrives with this
    /// many hops already is refused.
    pub max_hops: u8,
    /// A peer header whose timestamp is further than this from this midway's clock is refused;
    /// nonces seen inside it are refused as replays.
    pub peer_header_window: Duration,
    /// Every listener, in file order.
    pub listeners: Vec<ListenerConfig>,
    /// Subscribers' access links (`[[access_links]]`), in file order; empty: every connection
    /// keeps its own profile's pacing.
    pub access_links: Vec<crate::access_link::AccessLink>,
}

impl RuntimeConfig {
    /// Whether a client-chosen target at `addr` is in one of the denied prefixes (see
    /// [`super::DEFAULT_DENIED_DESTINATIONS`]); the proxy also refuses this host's own
    /// addresses when [`DeniedDestinations::own_addresses`] is set, which needs a lookup.
    pub fn is_denied_destination(&self, addr: IpAddr) -> bool {
        denied(&self.denied_destinations.prefixes, addr)
    }
}

/// Where a client-chosen target (SOCKS5, HTTP, a peer header) may not go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeniedDestinations {
    /// Prefixes refused whatever the host's addresses.
    pub prefixes: Vec<IpNet>,
    /// Also refuse every address of this host's own interfaces (`"self"` in the list): the
    /// services that listen only on the gateway, such as midway's metrics endpoint on
    /// `0.0.0.0`, are not for clients. Read from the interfaces at connect time, since they
    /// change (DHCP, failover).
    pub own_addresses: bool,
}

/// Whether `addr` (IPv4-mapped IPv6 taken as its IPv4 address) falls in one of `prefixes`.
pub fn denied(prefixes: &[IpNet], addr: IpAddr) -> bool {
    let addr = addr.to_canonical();
    prefixes.iter().any(|net| net.contains(&addr))
}

/// A pre-shared key (at least 16 bytes). `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct PeerKey(Vec<u8>);

impl PeerKey {
    /// The key from its bytes (validation checks the length).
    pub fn new(bytes: Vec<u8>) -> PeerKey {
        PeerKey(bytes)
    }

    /// The key's bytes, for the HMAC.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeerKey(<{} bytes hidden>)", self.0.len())
    }
}

/// Another midway connections go through (`[[peers]]`).
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// Unique name: listeners' `via` names it; the `peer` metric label.
    pub name: String,
    /// The peer's `mode = "peer"` listener.
    pub address: TargetAddr,
    /// Name of the key (in [`RuntimeConfig::keys`]) shared with the peer.
    pub key: String,
    /// Profile name of the peer segment.
    pub profile: String,
    /// Destinations sent through this peer (every destination by default).
    pub destinations: Vec<IpNet>,
    /// Idle connections kept open to the peer (0: connect on demand).
    pub warm_connections: usize,
    /// A warm connection unused for this long is replaced.
    pub warm_max_idle: Duration,
    /// How the peer segment to this peer is carried.
    pub transport: PeerTransport,
}

/// How an edge reaches a peer (`[[peers]] transport`).
#[derive(Debug, Clone)]
pub enum PeerTransport {
    /// A plain TCP connection per proxied connection.
    Tcp,
    /// TLS 1.3 over each TCP connection; the peer must present the pinned key.
    Tls {
        /// TLS 1.3 with this midway's key pair (`[tls]`), accepting only the pinned key.
        client: Arc<rustls::ClientConfig>,
        /// The peer's key fingerprint.
        pinned: midway_tls::Fingerprint,
    },
    /// One QUIC connection (a tunnel) to the peer carrying each proxied connection as a
    /// stream; the peer must present the pinned key.
    Quic {
        /// The TLS config of the tunnel's handshake, and of the fallback's.
        client: Arc<rustls::ClientConfig>,
        /// quinn's config of the tunnel (TLS and transport settings).
        tunnel: Box<midway_quic::ClientConfig>,
        /// The peer's key fingerprint.
        pinned: midway_tls::Fingerprint,
        /// The tunnel's settings (`[peers.quic]`).
        settings: Box<midway_quic::TunnelSettings>,
        /// While the tunnel cannot be set up, new connections go over TLS to the same address.
        fallback: bool,
        /// QUIC connections the tunnel keeps to the peer (at least 1).
        connections: usize,
    },
}

impl PeerTransport {
    /// The `transport` value, for logs and metric labels.
    pub fn name(&self) -> &'static str {
        match self {
            PeerTransport::Tcp => "tcp",
            PeerTransport::Tls { .. } => "tls",
            PeerTransport::Quic { .. } => "quic",
        }
    }
}

/// What a peer listener accepts (`transport` of a `mode = "peer"` listener).
#[derive(Debug, Clone)]
pub enum ListenerTransport {
    /// Plain TCP connections.
    Tcp,
    /// TLS 1.3 only, from midways whose key is listed.
    Tls {
        /// TLS 1.3 with this midway's key pair (`[tls]`), requiring a listed client key.
        server: Arc<rustls::ServerConfig>,
        /// Fingerprints of the midways allowed to connect.
        allowed: Vec<midway_tls::Fingerprint>,
    },
    /// QUIC tunnels on a UDP socket at the listener's address, from midways whose key is
    /// listed; each stream is one proxied connection.
    Quic {
        /// quinn's config of the listener (TLS requiring a listed key, transport settings).
        tunnel: Box<midway_quic::ServerConfig>,
        /// Fingerprints of the midways allowed to connect.
        allowed: Vec<midway_tls::Fingerprint>,
        /// The tunnels' settings (`[listeners.quic]`).
        settings: Box<midway_quic::TunnelSettings>,
    },
}

impl ListenerTransport {
    /// The `transport` value, for logs and metric labels.
    pub fn name(&self) -> &'static str {
        match self {
            ListenerTransport::Tcp => "tcp",
            ListenerTransport::Tls { .. } => "tls",
            ListenerTransport::Quic { .. } => "quic",
        }
    }
}

/// The peer (an index into `peers`) whose destinations hold `destination` most specifically,
/// among those a listener names in `via` (indices into `peers`); ties go to the first in `via`.
pub fn peer_for<'a>(
    peers: &'a [PeerConfig],
    via: &'a [usize],
    destination: IpAddr,
) -> Option<&'a usize> {
    let routes = via.iter().flat_map(|index| {
        peers
            .get(*index)
            .into_iter()
            .flat_map(move |peer| peer.destinations.iter().map(move |net| (net, index)))
    });
    longest_prefix_match(destination, routes)
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
    /// Peers (indices into [`RuntimeConfig::peers`]) this listener sends connections through
    /// where their destinations match; empty: always straight to the destination.
    pub via: Vec<usize>,
    /// Carry the DSCP marking across the split: the client's to the remote segment, the
    /// server's to the local one (`server/dscp.rs`).
    pub carry_dscp: bool,
    /// PROXY protocol: whether the remote segment starts with a header, and which sources
    /// must start theirs with one.
    pub proxy_protocol: super::ProxyProtocolSettings,
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

/// The (local, remote) choice for `client`: per segment, the override with the longest prefix
/// that contains the client and sets that segment, else the default. The one rule for profile
/// names and for the proxy's resolved profiles alike.
pub fn most_specific<'a, T: ?Sized>(
    client: IpAddr,
    overrides: impl IntoIterator<Item = (&'a IpNet, Option<&'a T>, Option<&'a T>)> + Clone,
    default: (&'a T, &'a T),
) -> (&'a T, &'a T) {
    let local = longest_prefix_match(
        client,
        overrides
            .clone()
            .into_iter()
            .filter_map(|(prefix, local, _)| local.map(|l| (prefix, l))),
    );
    let remote = longest_prefix_match(
        client,
        overrides
            .into_iter()
            .filter_map(|(prefix, _, remote)| remote.map(|r| (prefix, r))),
    );
    (local.unwrap_or(default.0), remote.unwrap_or(default.1))
}

/// The value of the longest prefix in `entries` that contains `addr` (IPv4-mapped IPv6 taken
/// as its IPv4 address); among equally long ones the first. The one most-specific-prefix rule:
/// profile overrides per client, peers per destination.
pub fn longest_prefix_match<'a, T: ?Sized>(
    addr: IpAddr,
    entries: impl IntoIterator<Item = (&'a IpNet, &'a T)>,
) -> Option<&'a T> {
    let addr = addr.to_canonical();
    let mut best: Option<(u8, &'a T)> = None;
    for (prefix, value) in entries {
        if prefix.contains(&addr) && best.is_none_or(|(len, _)| prefix.prefix_len() > len) {
            best = Some((prefix.prefix_len(), value));
        }
    }
    best.map(|(_, value)| value)
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
    /// Connections from other midways, each starting with an authenticated peer header.
    Peer {
        /// Names of the keys (in [`RuntimeConfig::keys`]) a connecting midway may use.
        keys: Vec<String>,
        /// Connect to the destination from the client's address the header carries.
        spoof_client_address: bool,
        /// What connecting midways must speak.
        transport: ListenerTransport,
    },
}

impl Intercept {
    /// The `mode` value that selects this intercept, for logs.
    pub fn mode_name(&self) -> &'static str {
        match self {
            Intercept::Forward { .. } => "forward",
            Intercept::Socks5 { .. } => "socks5",
            Intercept::Transparent { .. } => "transparent",
            Intercept::Http => "http",
            Intercept::Peer { .. } => "peer",
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
        check_host_name(host)?;
        Ok(TargetAddr::Domain(host.to_string(), port))
    }
}

/// A host name as DNS has them (RFC 1123 labels; `_` allowed, as some internal names have
/// it). A name whose last label is all digits is no name at all (RFC 3696, 2): it is an IPv4
/// address mistyped (`10.2.0.300`), which would otherwise be looked up and fail at every
/// connection instead of at load.
fn check_host_name(host: &str) -> Result<(), String> {
    let name = host.strip_suffix('.').unwrap_or(host);
    let labels: Vec<&str> = name.split('.').collect();
    if labels
        .last()
        .is_some_and(|last| !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!(
            "{host:?} is neither an IPv4 address (four numbers 0-255) nor a host name"
        ));
    }
    for label in labels {
        let valid = (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !valid {
            return Err(format!(
                "{host:?} is not a host name (letters, digits and '-' between dots)"
            ));
        }
    }
    Ok(())
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
