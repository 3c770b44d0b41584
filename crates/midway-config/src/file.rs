//! The file as written (stage 1 of the proxy's configuration). Every struct is `deny_unknown_fields`, so a typo is an error
//! naming the key and its line; every value is optional here and filled in by stage 3.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::profile::ProfileSpec;

/// The whole file as written.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Proxy-wide settings (`[proxy]`); every key optional.
    pub proxy: FileProxy,
    /// Prometheus endpoint (`[metrics]`); absent: no endpoint.
    pub metrics: Option<FileMetrics>,
    /// Where spool-mode relays keep their files (`[spool]`); absent: defaults.
    pub spool: Option<FileSpool>,
    /// The control socket `midway status` talks to (`[control]`); absent: the default path.
    pub control: Option<FileControl>,
    /// TCP profiles by name (`[profiles.NAME]`), added to the presets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<String, ProfileSpec>,
    /// Pre-shared keys by name (`[keys.NAME]`) that midways use to authenticate each other; the
    /// name travels in the peer header so the receiving midway knows which key to check with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub keys: BTreeMap<String, FileKey>,
    /// Other midways this one sends connections through (`[[peers]]`), in file order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<FilePeer>,
    /// This midway's key pair on encrypted peer transports (`[tls]`); needed by any peer or
    /// peer listener with `transport = "tls"`.
    pub tls: Option<FileTls>,
    /// Listeners (`[[listeners]]`), in file order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<FileListener>,
    /// Subscribers' access links (`[[access_links]]`): the downlink rate every connection of
    /// one subscriber shares, by client prefix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_links: Vec<FileAccessLink>,
}

/// `[keys.NAME]`: one pre-shared key, given inline or in a file (not both). `Debug` hides it.
#[skip_serializing_none]
#[derive(Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileKey {
    /// The key as hexadecimal text (at least 32 digits, i.e. 16 bytes).
    pub secret: Option<String>,
    /// A file whose first line is the key as hexadecimal text (kept out of the config file).
    pub secret_file: Option<PathBuf>,
}

impl fmt::Debug for FileKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileKey")
            .field("secret", &self.secret.as_ref().map(|_| "<hidden>"))
            .field("secret_file", &self.secret_file)
            .finish()
    }
}

/// `[tls]`: this midway's identity toward other midways: its certificate and private key, as
/// `midway peer keygen` writes them. Peers pin the certificate's key by its fingerprint.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileTls {
    /// PEM certificate file (`peer.crt`).
    pub cert: Option<PathBuf>,
    /// PEM private key file (`peer.key`, readable by midway only).
    pub key: Option<PathBuf>,
}

/// How the peer segment is carried between two midways.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportName {
    /// One plain TCP connection per proxied connection (the default).
    Tcp,
    /// TLS 1.3 over each peer TCP connection, both midways authenticated by pinned keys.
    Tls,
    /// One QUIC connection per peer carrying every proxied connection as a stream.
    Quic,
}

/// `[[peers]]`: another midway, reached over the peer segment, that connections go through.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FilePeer {
    /// Unique peer name, named by listeners' `via` and used as the `peer` metric label.
    pub name: Option<String>,
    /// The peer's `mode = "peer"` listener (`"ip:port"` or `"host:port"`).
    pub address: Option<String>,
    /// Name of the `[keys.NAME]` entry shared with the peer.
    pub key: Option<String>,
    /// Profile name of the peer segment (this midway to the peer).
    pub profile: Option<String>,
    /// Destinations (CIDR text) sent through this peer; absent: every destination. When several
    /// peers of a listener's `via` match, the most specific prefix wins.
    pub destinations: Option<Vec<String>>,
    /// Connections to the peer kept open and idle, ready for the next client (0: connect on demand).
    pub warm_connections: Option<usize>,
    /// A warm connection unused for this long is replaced by a new one (humantime text).
    #[serde(default, with = "humantime_serde")]
    pub warm_max_idle: Option<Duration>,
    /// How the peer segment is carried; absent: `"tcp"`.
    pub transport: Option<TransportName>,
    /// `transport = "tls"` or `"quic"`: the peer's key fingerprint (`sha256:...`, printed by
    /// its `midway peer keygen`); the peer is refused at the handshake unless its key has it.
    pub fingerprint: Option<String>,
    /// `transport = "quic"`: the tunnel's settings (`[peers.quic]`).
    pub quic: Option<FileQuic>,
}

/// `[peers.quic]` and a QUIC peer listener's `[listeners.quic]`: the tunnel's settings. Every
/// field is optional; flow-control windows default to the path's bandwidth-delay product.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileQuic {
    /// `newreno`, `cubic` (default), `bbr`, `highspeed` or `gentle_highspeed`.
    pub congestion_control: Option<String>,
    /// The path's rate, bits per second, for the default windows (default 100 Mbit/s).
    #[serde(
        default,
        deserialize_with = "crate::profile::deserialize_bits_per_second"
    )]
    pub path_rate_bps: Option<u64>,
    /// The path's round trip, for the default windows (humantime text; default 600ms).
    #[serde(default, with = "humantime_serde")]
    pub path_rtt: Option<Duration>,
    /// Bytes one stream may have in flight toward this midway (default: four times the path's
    /// bandwidth-delay product).
    pub stream_window: Option<u64>,
    /// Bytes all streams together may have in flight toward this midway (default: twice the
    /// stream window).
    pub connection_window: Option<u64>,
    /// Streams (proxied connections) the other midway may have open at once on the tunnel.
    pub max_streams: Option<u32>,
    /// The tunnel closes after this long without a packet (a longer outage resets its
    /// connections); default 30s.
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// A PING after this long without sending (NAT bindings); default a third of
    /// `idle_timeout`, at most 10s; `"0s"` for none.
    #[serde(default, with = "humantime_serde")]
    pub keep_alive: Option<Duration>,
    /// Ask the other midway to acknowledge only every this many packets (fewer ACKs on a
    /// narrow return link); default QUIC's two.
    pub ack_every: Option<u32>,
    /// Edge only: give up on a tunnel's handshake after this long (default 5s).
    #[serde(default, with = "humantime_serde")]
    pub handshake_timeout: Option<Duration>,
    /// Edge only: `"tls"` (default) sends new connections over TLS to the same peer address
    /// while the tunnel cannot be set up; `"none"` refuses them instead.
    pub fallback: Option<String>,
    /// Edge only: QUIC connections the tunnel keeps to the peer (default 1); new streams go to
    /// the one with the fewest open. More than one only where one connection's packet
    /// processing, which runs on one thread, is the limit.
    pub connections: Option<u32>,
}

/// `[proxy]`
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileProxy {
    /// Client prefixes (CIDR text, e.g. `"10.1.0.0/16"`) allowed to use the proxy.
    pub allowed_clients: Option<Vec<String>>,
    /// Prefixes (CIDR text) SOCKS5 and HTTP listeners refuse to connect to; absent: the default list.
    pub denied_destinations: Option<Vec<String>>,
    /// Split connections served at once, all listeners together.
    pub max_connections: Option<usize>,
    /// Split connections one client address may hold at once.
    pub max_connections_per_client: Option<usize>,
    /// Time allowed to establish a remote segment (humantime text, e.g. `"10s"`).
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    /// Midways a connection may cross, this one included; a peer header that arrives with this
    /// many hops already is refused.
    pub max_hops: Option<u8>,
    /// A peer header whose timestamp is further than this from this midway's clock is refused;
    /// the nonces of this window are remembered to refuse replays (humantime text).
    #[serde(default, with = "humantime_serde")]
    pub peer_header_window: Option<Duration>,
    /// A split connection with no byte in either direction for this long is closed (humantime text).
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    /// After shutdown is requested, connections may finish for this long (humantime text).
    #[serde(default, with = "humantime_serde")]
    pub shutdown_grace: Option<Duration>,
    /// Time a SOCKS5 client has to complete its handshake (humantime text).
    #[serde(default, with = "humantime_serde")]
    pub handshake_timeout: Option<Duration>,
    /// Splice pipe pairs held at once (each costs two file descriptors).
    pub max_pipes: Option<usize>,
    /// Threads of the proxy's async runtime; absent: one per CPU.
    pub worker_threads: Option<usize>,
    /// Socket memory guard: "auto", "off", or a budget in bytes (see midway-proxy's `sockmem`).
    pub socket_memory: Option<FileSocketMemory>,
    /// First routing table number used for profiles that need route-metric knobs.
    pub route_knobs_table_base: Option<u32>,
    /// First fwmark used for profiles that need route-metric knobs.
    pub route_knobs_mark_base: Option<u32>,
}

/// `socket_memory = "auto" | "off" | <bytes>`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum FileSocketMemory {
    /// A keyword: `"auto"` (budget from the kernel's TCP memory limits) or `"off"`.
    Keyword(String),
    /// A budget in bytes.
    Bytes(u64),
}

/// `[[access_links]]`: the access link in front of the subscribers in `clients`.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileAccessLink {
    /// Client prefixes behind links of this kind (required, never empty).
    pub clients: Option<Vec<String>>,
    /// The link's rate toward one subscriber, bits per second (required): an integer or a whole
    /// float (`384e3`).
    #[serde(
        default,
        deserialize_with = "crate::profile::deserialize_bits_per_second"
    )]
    pub rate_bps: Option<u64>,
    /// The queue in front of one subscriber, bytes (optional): when given, the subscriber's
    /// connections together hold at most the link's bandwidth-delay product and half of it
    /// unacknowledged.
    pub queue_bytes: Option<u64>,
    /// Prefix length that makes one subscriber of an IPv4 client address (default 32: every
    /// address is a subscriber).
    pub subscriber_prefix_v4: Option<u8>,
    /// Prefix length that makes one subscriber of an IPv6 client address (default 64: a
    /// subscriber's devices share its /64).
    pub subscriber_prefix_v6: Option<u8>,
}

/// `[metrics]`
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileMetrics {
    /// Address the `/metrics` HTTP endpoint listens on.
    pub listen: SocketAddr,
}

/// `[control]`: the Unix socket of the control protocol (`midway status`, drain, close).
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileControl {
    /// `false` turns the control socket off (default `true`).
    pub enabled: Option<bool>,
    /// Path of the socket; `""` turns it off. Default: `$RUNTIME_DIRECTORY/control.sock`
    /// under systemd's `RuntimeDirectory=`, else `/run/midway/control.sock`.
    pub socket: Option<PathBuf>,
}

/// `[spool]`
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpool {
    /// Directory of the spool files.
    pub dir: Option<PathBuf>,
    /// Disk all spool files together may use, bytes.
    pub max_total_bytes: Option<u64>,
}

/// How connections reach a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeName {
    /// Every connection goes to one configured `target`.
    Forward,
    /// SOCKS5 (RFC 1928) CONNECT: each client names its target.
    Socks5,
    /// nftables TPROXY interception: the original destination is the target.
    Transparent,
    /// Explicit HTTP proxy (`curl -x`, browsers' proxy setting), CONNECT included.
    Http,
    /// Connections from other midways: each starts with an authenticated peer header naming
    /// the original destination and client.
    Peer,
}

/// What a transparent listener does with intercepted connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ApplicationName {
    /// Split the TCP connection and relay bytes (the default).
    Tcp,
    /// Serve intercepted port-80 traffic with the HTTP engine (cache, pipelining, warm pool).
    Http,
}

/// Relay model name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RelayName {
    /// Buffer-and-forward: at most `buffer_bytes` held per direction, so a slow reader pushes back on the sender.
    Buffer,
    /// Store-and-forward: server-to-client bytes go to memory and then a spool file, so the remote segment never waits for the local one.
    Spool,
}

/// SOCKS5 authentication method name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthName {
    /// No authentication.
    None,
    /// RFC 1929 username/password, checked against `users`.
    Password,
}

/// `[[listeners]]`
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileListener {
    /// Unique listener name, used in logs and as the `listener` metric label.
    pub name: Option<String>,
    /// How connections reach the listener.
    pub mode: Option<ModeName>,
    /// Address to listen on (`"ip:port"`; port 0: any free port).
    pub listen: Option<String>,
    /// Forward listeners: where every connection goes (`"ip:port"` or `"host:port"`).
    pub target: Option<String>,
    /// Byte relay of split connections.
    pub relay: Option<RelayName>,
    /// Cap on bytes held per direction (user-space buffer, or pipe size when splicing), bytes; at least 4096.
    pub buffer_bytes: Option<usize>,
    /// Buffer relay only: move bytes with `splice(2)` through pooled pipes when one is free.
    pub splice: Option<bool>,
    /// Spool relay only: server-to-client bytes kept in memory before going to the spool file.
    pub spool_memory_bytes: Option<usize>,
    /// Spool relay only: per-connection cap on bytes in the spool file.
    pub spool_max_bytes: Option<u64>,
    /// Profile name of the local segment (proxy to client).
    pub local_profile: Option<String>,
    /// Profile name of the remote segment (proxy to target).
    pub remote_profile: Option<String>,
    /// Profile overrides per client prefix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_profiles: Vec<FileClientProfile>,
    /// SOCKS5 listeners: how clients authenticate.
    pub auth: Option<AuthName>,
    /// SOCKS5 listeners with `auth = "password"`: the accepted users.
    pub users: Option<Vec<FileUser>>,
    /// Transparent and peer listeners: connect the remote segment from the client's own address
    /// (a peer listener takes it from the peer header).
    pub spoof_client_address: Option<bool>,
    /// Relaying listeners: carry the DSCP the client marks its packets with to the remote
    /// segment, and the server's back to the client (default false).
    pub carry_dscp: Option<bool>,
    /// Relaying listeners (any mode but `http`): names of `[[peers]]` to send connections
    /// through; a connection whose destination none of them covers goes straight to it.
    pub via: Option<Vec<String>>,
    /// Peer listeners: names of the `[keys.NAME]` a connecting midway may authenticate with.
    pub keys: Option<Vec<String>>,
    /// Peer listeners: the transport connecting midways use; absent: `"tcp"`.
    pub transport: Option<TransportName>,
    /// Peer listeners with `transport = "tls"` or `"quic"`: fingerprints (`sha256:...`) of the
    /// midways allowed to connect; any other key is refused at the handshake.
    pub peer_fingerprints: Option<Vec<String>>,
    /// Peer listeners with `transport = "quic"`: the tunnel's settings (`[listeners.quic]`).
    pub quic: Option<FileQuic>,
    /// Transparent listeners: the interception rules and policy routing.
    pub nftables: Option<FileNftables>,
    /// Transparent listeners only: `"tcp"` (default) or `"http"`.
    pub application: Option<ApplicationName>,
    /// HTTP engine settings of listeners that speak HTTP.
    pub http: Option<FileHttp>,
    /// Relaying listeners (not `http`): `"v2"` starts every remote segment with a PROXY
    /// protocol v2 header naming the client and the original destination.
    pub proxy_protocol: Option<ProxyProtocolVersion>,
    /// Forward, socks5 and http listeners: sources (CIDR text) allowed to send a PROXY
    /// protocol header (load balancers); a connection from one of them must start with one.
    pub accept_proxy_protocol: Option<Vec<String>>,
}

/// `proxy_protocol = "v2"`: the PROXY protocol version a listener sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum ProxyProtocolVersion {
    /// The binary version 2 header.
    #[serde(rename = "v2")]
    V2,
}

/// `[listeners.http]`: the HTTP engine of `mode = "http"` and of transparent listeners with
/// `application = "http"`. Every key is optional.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileHttp {
    // Client side.
    /// Largest request head accepted from a client, bytes; bigger heads get 431 and a close.
    pub max_header_bytes: Option<usize>,
    /// Requests of one client connection in flight (read but not yet answered) at once.
    pub max_pipelined: Option<usize>,
    /// Sustained requests per second per client connection (token-bucket rate).
    pub requests_per_second: Option<f64>,
    /// Requests a client connection may make in a burst above the rate (token-bucket depth).
    pub request_burst: Option<u32>,
    /// A client connection with no request and nothing in flight is closed after this long (humantime text).
    #[serde(default, with = "humantime_serde")]
    pub client_idle_timeout: Option<Duration>,
    /// A started request head must be complete within this time (slow-loris guard; humantime text).
    #[serde(default, with = "humantime_serde")]
    pub head_read_timeout: Option<Duration>,
    // Upstream side.
    /// Idle upstream connections kept per origin (`host:port`) for reuse.
    pub upstream_max_idle: Option<usize>,
    /// How long an idle upstream connection is kept for reuse (humantime text).
    #[serde(default, with = "humantime_serde")]
    pub upstream_idle_keep: Option<Duration>,
    /// How long to wait for an origin's response head (humantime text).
    #[serde(default, with = "humantime_serde")]
    pub upstream_response_timeout: Option<Duration>,
    /// Whether upstream connections use TCP keepalive probes.
    pub upstream_keepalive: Option<bool>,
    /// Upstream keepalive: idle time before the first probe (humantime text).
    #[serde(default, with = "humantime_serde")]
    pub keepalive_idle: Option<Duration>,
    /// Upstream keepalive: time between unanswered probes (humantime text).
    #[serde(default, with = "humantime_serde")]
    pub keepalive_interval: Option<Duration>,
    /// Upstream keepalive: unanswered probes after which the connection is dropped.
    pub keepalive_retries: Option<u32>,
    // Cache.
    /// Whether responses are cached.
    pub cache: Option<bool>,
    /// Capacity of the cache's memory store, bytes of response bodies.
    pub cache_memory_bytes: Option<u64>,
    /// Largest response the cache stores, bytes.
    pub cache_max_object_bytes: Option<u64>,
    /// Directory of the disk store, where objects evicted from memory spill; absent: memory only.
    pub cache_disk_dir: Option<PathBuf>,
    /// Capacity of the disk store, bytes.
    pub cache_disk_bytes: Option<u64>,
    /// Pseudonym put in `Via` headers (`Via: 1.1 <via_name>`).
    pub via_name: Option<String>,
}

/// `[[listeners.client_profiles]]`
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileClientProfile {
    /// Clients this override applies to (CIDR text, e.g. `"10.1.2.0/24"`).
    pub prefix: String,
    /// Profile name of the local segment for these clients; absent: the listener's.
    pub local_profile: Option<String>,
    /// Profile name of the remote segment for these clients; absent: the listener's.
    pub remote_profile: Option<String>,
}

/// One SOCKS5 user. `Debug` hides the password.
#[derive(Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileUser {
    /// User name the client sends.
    pub name: String,
    /// Password the client must send with the name.
    pub password: String,
}

impl fmt::Debug for FileUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileUser")
            .field("name", &self.name)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// `[listeners.nftables]`
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileNftables {
    /// Install the rules at start and remove them at stop; otherwise only print them.
    pub manage: Option<bool>,
    /// Name of the nftables table.
    pub table: Option<String>,
    /// Interfaces whose incoming traffic is intercepted; empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
    /// Destination ports intercepted; empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    /// fwmark that routes intercepted packets to local delivery.
    pub mark: Option<u32>,
    /// Routing table holding `local default dev lo` for `mark`.
    pub route_table: Option<u32>,
}
