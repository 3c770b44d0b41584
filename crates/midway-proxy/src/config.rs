//! Configuration in three stages.
//!
//! 1. TOML text -> file structs ([`FileConfig`] and friends), every struct `deny_unknown_fields`
//!    so a typo is an error naming the key and its line (toml's span is kept).
//! 2. Missing values are filled from the named `DEFAULT_*` constants below.
//! 3. Cross-field validation produces a [`RuntimeConfig`]: prefixes parsed, profile names
//!    resolved against the presets and `[profiles.*]`, mode-specific keys checked. Every error
//!    names the origin (file), the key path (`listeners[0].target`) and how to fix it.
//!
//! Secrets (SOCKS5 passwords) never appear in an error message or in `Debug` output.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::sockmem::SocketMemorySetting;
use ipnet::IpNet;
use midway_http::config as http_defaults;
use midway_http::{
    CacheConfig, ClientLimits as HttpClientLimits, DiskCacheConfig, HttpProxyConfig,
    KeepaliveProbes, UpstreamPoolConfig,
};
use midway_relay::{BufferConfig, RelayModel, SpoolConfig};
use midway_tcp::{ProfileError, ProfileSpec, TcpProfile};
use serde::Deserialize;

/// Total split connections served at once, all listeners together.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Split connections one client address may hold at once.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 512;
/// Time allowed to establish the remote segment.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A split connection with no byte in either direction for this long is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// After shutdown is requested, relays may finish for this long before they are cancelled.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Time a SOCKS5 client has to complete its greeting, authentication and request.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Smallest explicit `socket_memory` budget: 16 MiB, a few hundred connections' worth of the
/// guard's smallest buffers. Less would cap every busy gateway at once.
pub const MIN_SOCKET_MEMORY_BUDGET: u64 = 16 << 20;
/// Splice pipe pairs held at once (each costs two file descriptors).
pub const DEFAULT_MAX_PIPES: usize = 1024;
/// Destinations a client-chosen target (SOCKS5, HTTP) may not reach unless the operator says
/// otherwise: the proxy host's own loopback and unspecified addresses and link-local ones
/// (cloud metadata services live at 169.254.169.254). An allowed client must not be able to use
/// midway to reach services that listen only on the gateway itself, such as midway's own
/// metrics endpoint; Squid's default `http_access deny to_localhost` / `to_linklocal` draw the
/// same line. IPv4-mapped IPv6 addresses are checked as the IPv4 address they carry.
pub const DEFAULT_DENIED_DESTINATIONS: [&str; 6] = [
    "127.0.0.0/8",
    "0.0.0.0/8",
    "169.254.0.0/16",
    "::1/128",
    "::/128",
    "fe80::/10",
];
/// Where spool-mode relays keep their files.
pub const DEFAULT_SPOOL_DIR: &str = "/var/spool/midway";
/// All spool files together may use this much disk (1 GiB).
pub const DEFAULT_SPOOL_MAX_TOTAL_BYTES: u64 = 1 << 30;
/// Per-direction relay buffer. 256 KiB covers the bandwidth-delay product of a 20 Mbit/s,
/// 100 ms path in one buffer; the lab measures the effect of other sizes.
pub const DEFAULT_BUFFER_BYTES: usize = 256 * 1024;

/// Upper bound on `[proxy] worker_threads`: far more threads than any gateway has CPUs only adds
/// contention, and a typo such as 40000 should be an error rather than a thread storm.
pub const MAX_WORKER_THREADS: usize = 1024;
/// Spool mode: bytes kept in memory before spilling to disk.
pub const DEFAULT_SPOOL_MEMORY_BYTES: usize = 1 << 20;
/// Spool mode: bytes one connection may hold on disk.
pub const DEFAULT_SPOOL_MAX_BYTES: u64 = 256 << 20;
/// Profile used for a segment whose listener names none (the kernel as configured).
pub const DEFAULT_PROFILE: &str = "default";
/// Name of the nftables table midway owns.
pub const DEFAULT_NFT_TABLE: &str = "midway";
/// fwmark that routes intercepted packets to local delivery.
pub const DEFAULT_NFT_MARK: u32 = 1;
/// Routing table holding `local default dev lo` for [`DEFAULT_NFT_MARK`].
pub const DEFAULT_NFT_ROUTE_TABLE: u32 = 100;
/// First routing table for profiles with route-metric knobs (one table per such profile).
pub const DEFAULT_ROUTE_KNOBS_TABLE_BASE: u32 = 1000;
/// `Via` pseudonym of HTTP listeners (`Via: 1.1 midway`).
pub const DEFAULT_HTTP_VIA_NAME: &str = "midway";
/// HTTP listeners cache responses unless `cache = false`.
pub const DEFAULT_HTTP_CACHE: bool = true;
/// HTTP listeners keep pooled upstream connections alive with TCP keepalive probes.
pub const DEFAULT_HTTP_UPSTREAM_KEEPALIVE: bool = true;
/// Largest `max_header_bytes` accepted: bigger heads are not a real client's.
pub const MAX_HTTP_HEADER_BYTES: usize = 1 << 20;
// The other HTTP defaults are midway-http's `DEFAULT_*` constants (`midway_http::config`):
// one source for the engine and the file format.

/// First `SO_MARK` for profiles with route-metric knobs; far from the small marks operators and
/// the TPROXY rules use.
pub const DEFAULT_ROUTE_KNOBS_MARK_BASE: u32 = 0x6d77_0000;

// ---------------------------------------------------------------------------------------------
// Stage 1: file structs
// ---------------------------------------------------------------------------------------------

/// The whole file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub proxy: FileProxy,
    pub metrics: Option<FileMetrics>,
    pub spool: Option<FileSpool>,
    #[serde(default)]
    pub profiles: BTreeMap<String, ProfileSpec>,
    #[serde(default)]
    pub listeners: Vec<FileListener>,
}

/// `[proxy]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileProxy {
    pub allowed_clients: Option<Vec<String>>,
    pub denied_destinations: Option<Vec<String>>,
    pub max_connections: Option<usize>,
    pub max_connections_per_client: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub idle_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub shutdown_grace: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub handshake_timeout: Option<Duration>,
    pub max_pipes: Option<usize>,
    pub worker_threads: Option<usize>,
    /// Socket memory guard: "auto", "off", or a budget in bytes (see [`crate::sockmem`]).
    pub socket_memory: Option<FileSocketMemory>,
    pub route_knobs_table_base: Option<u32>,
    pub route_knobs_mark_base: Option<u32>,
}

/// `socket_memory = "auto" | "off" | <bytes>`
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum FileSocketMemory {
    Keyword(String),
    Bytes(u64),
}

/// `[metrics]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileMetrics {
    pub listen: SocketAddr,
}

/// `[spool]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpool {
    pub dir: Option<PathBuf>,
    pub max_total_bytes: Option<u64>,
}

/// How connections reach a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeName {
    Forward,
    Socks5,
    Transparent,
    /// Explicit HTTP proxy (`curl -x`, browsers' proxy setting), CONNECT included.
    Http,
}

/// What a transparent listener does with intercepted connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApplicationName {
    /// Split the TCP connection and relay bytes (the default).
    Tcp,
    /// Serve intercepted port-80 traffic with the HTTP engine (cache, pipelining, warm pool).
    Http,
}

/// Relay model name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RelayName {
    Buffer,
    Spool,
}

/// SOCKS5 authentication method name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthName {
    None,
    Password,
}

/// `[[listeners]]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileListener {
    pub name: Option<String>,
    pub mode: Option<ModeName>,
    pub listen: Option<String>,
    pub target: Option<String>,
    pub relay: Option<RelayName>,
    pub buffer_bytes: Option<usize>,
    pub splice: Option<bool>,
    pub spool_memory_bytes: Option<usize>,
    pub spool_max_bytes: Option<u64>,
    pub local_profile: Option<String>,
    pub remote_profile: Option<String>,
    #[serde(default)]
    pub client_profiles: Vec<FileClientProfile>,
    pub auth: Option<AuthName>,
    pub users: Option<Vec<FileUser>>,
    pub spoof_client_address: Option<bool>,
    pub nftables: Option<FileNftables>,
    /// Transparent listeners only: `"tcp"` (default) or `"http"`.
    pub application: Option<ApplicationName>,
    pub http: Option<FileHttp>,
}

/// `[listeners.http]`: the HTTP engine of `mode = "http"` and of transparent listeners with
/// `application = "http"`. Every key is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHttp {
    // Client side.
    pub max_header_bytes: Option<usize>,
    pub max_pipelined: Option<usize>,
    pub requests_per_second: Option<f64>,
    pub request_burst: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    pub client_idle_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub head_read_timeout: Option<Duration>,
    // Upstream side.
    pub upstream_max_idle: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    pub upstream_idle_keep: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub upstream_response_timeout: Option<Duration>,
    pub upstream_keepalive: Option<bool>,
    #[serde(default, with = "humantime_serde")]
    pub keepalive_idle: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub keepalive_interval: Option<Duration>,
    pub keepalive_retries: Option<u32>,
    // Cache.
    pub cache: Option<bool>,
    pub cache_memory_bytes: Option<u64>,
    pub cache_max_object_bytes: Option<u64>,
    pub cache_disk_dir: Option<PathBuf>,
    pub cache_disk_bytes: Option<u64>,
    pub via_name: Option<String>,
}

/// `[[listeners.client_profiles]]`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileClientProfile {
    pub prefix: String,
    pub local_profile: Option<String>,
    pub remote_profile: Option<String>,
}

/// One SOCKS5 user. `Debug` hides the password.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileUser {
    pub name: String,
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
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileNftables {
    pub manage: Option<bool>,
    pub table: Option<String>,
    #[serde(default)]
    pub interfaces: Vec<String>,
    #[serde(default)]
    pub ports: Vec<u16>,
    pub mark: Option<u32>,
    pub route_table: Option<u32>,
}

// ---------------------------------------------------------------------------------------------
// Stage 3: runtime config
// ---------------------------------------------------------------------------------------------

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
    pub max_connections: usize,
    pub max_connections_per_client: usize,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub shutdown_grace: Duration,
    pub handshake_timeout: Duration,
    pub max_pipes: usize,
    /// Threads of the async runtime that runs every connection; `None`: one per CPU.
    pub worker_threads: Option<usize>,
    /// Socket memory guard for relayed sockets.
    pub socket_memory: SocketMemorySetting,
    /// First routing table / fwmark for profiles that need route-metric knobs.
    pub route_knobs_table_base: u32,
    pub route_knobs_mark_base: u32,
    /// Address of the Prometheus `/metrics` endpoint, if any.
    pub metrics_listen: Option<SocketAddr>,
    pub spool_dir: PathBuf,
    pub spool_max_total_bytes: u64,
    /// Every profile by name: the presets plus `[profiles.*]`.
    pub profiles: BTreeMap<String, TcpProfile>,
    pub listeners: Vec<ListenerConfig>,
}

impl RuntimeConfig {
    /// Whether a client-chosen target at `addr` is refused (see [`DEFAULT_DENIED_DESTINATIONS`]).
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
    pub name: String,
    pub listen: SocketAddr,
    pub intercept: Intercept,
    /// Byte relay of split connections (unused by listeners that speak HTTP).
    pub relay: RelayModel,
    /// Set when the listener speaks HTTP: `mode = "http"`, or transparent with
    /// `application = "http"`. Then [`Self::remote_profile`] applies to every upstream
    /// connection (they are pooled across clients, so there are no per-client remote overrides).
    pub http: Option<HttpProxyConfig>,
    /// Profile names (keys of [`RuntimeConfig::profiles`]) used unless a client prefix overrides.
    pub local_profile: String,
    pub remote_profile: String,
    /// Overrides per client prefix, longest prefix first.
    pub client_profiles: Vec<ClientProfileOverride>,
}

impl ListenerConfig {
    /// Profile names (local, remote) for a client: the longest matching override wins per segment.
    pub fn profiles_for(&self, client: IpAddr) -> (&str, &str) {
        let mut local = None;
        let mut remote = None;
        // Sorted longest prefix first, so the first match per segment is the most specific one.
        for over in self
            .client_profiles
            .iter()
            .filter(|o| o.prefix.contains(&client))
        {
            if local.is_none() {
                local = over.local_profile.as_deref();
            }
            if remote.is_none() {
                remote = over.remote_profile.as_deref();
            }
        }
        (
            local.unwrap_or(&self.local_profile),
            remote.unwrap_or(&self.remote_profile),
        )
    }
}

/// Profile override for clients in `prefix`.
#[derive(Debug, Clone)]
pub struct ClientProfileOverride {
    pub prefix: IpNet,
    pub local_profile: Option<String>,
    pub remote_profile: Option<String>,
}

/// How connections reach a listener, with the mode's settings.
#[derive(Debug, Clone)]
pub enum Intercept {
    /// Every connection goes to one target.
    Forward { target: TargetAddr },
    /// SOCKS5 (RFC 1928) CONNECT.
    Socks5 { auth: Socks5Auth },
    /// nftables TPROXY: the accepted socket's local address is the original destination.
    Transparent {
        spoof_client_address: bool,
        nftables: NftConfig,
    },
    /// Explicit HTTP proxy: each request names its origin (absolute URI, CONNECT authority).
    Http,
}

impl Intercept {
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
    Ip(SocketAddr),
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
    pub table: String,
    pub interfaces: Vec<String>,
    pub ports: Vec<u16>,
    pub mark: u32,
    pub route_table: u32,
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// TOML syntax, a wrong type or an unknown key (stage 1).
    #[error("{origin}:{line}:{column}: {message}")]
    Syntax {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// A value that parses but cannot be used (stage 3).
    #[error("{origin}: {key}: {problem}")]
    Invalid {
        origin: String,
        key: String,
        problem: String,
    },
    /// A `[profiles.*]` table is inconsistent (unknown parent, bad value, ...).
    #[error("{origin}: [profiles]: invalid profile")]
    Profile {
        origin: String,
        #[source]
        source: ProfileError,
    },
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

/// Reads and validates a config file.
pub fn load_config(path: &Path) -> Result<RuntimeConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_config(&text, &path.display().to_string())
}

/// Validates config text; `origin` names it in errors (a path, or e.g. `"<test>"`).
pub fn parse_config(text: &str, origin: &str) -> Result<RuntimeConfig, ConfigError> {
    let file: FileConfig = toml::from_str(text).map_err(|err| syntax_error(text, origin, &err))?;
    validate(file, origin)
}

fn syntax_error(text: &str, origin: &str, err: &toml::de::Error) -> ConfigError {
    let (line, column) = match err.span() {
        Some(span) => line_column(text, span.start),
        None => (0, 0),
    };
    let mut message = err.message().trim_end().replace('\n', "; ");
    if message.contains("expected a duration") {
        message.push_str(" (write e.g. \"5s\", \"500ms\", \"2m\")");
    }
    // Quote the offending line so the key is named even when toml's message does not name it,
    // unless the line may hold a secret.
    if let Some(text_line) = text.lines().nth(line.wrapping_sub(1)) {
        let text_line = text_line.trim();
        if !text_line.is_empty() && !text_line.contains("password") && text_line.len() <= 200 {
            message.push_str(&format!(" in `{text_line}`"));
        }
    }
    ConfigError::Syntax {
        origin: origin.to_string(),
        line,
        column,
        message,
    }
}

/// 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

struct Validator<'a> {
    origin: &'a str,
}

impl Validator<'_> {
    fn invalid(&self, key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origin.to_string(),
            key: key.into(),
            problem: problem.into(),
        }
    }

    fn prefix(&self, key: &str, text: &str) -> Result<IpNet, ConfigError> {
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

    fn positive(
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

    fn duration(
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

    fn profile_name(
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

fn validate(file: FileConfig, origin: &str) -> Result<RuntimeConfig, ConfigError> {
    let v = Validator { origin };
    let proxy = file.proxy;

    let allowed = proxy.allowed_clients.unwrap_or_default();
    if allowed.is_empty() {
        return Err(v.invalid(
            "proxy.allowed_clients",
            "required and must not be empty (midway is never an open proxy); \
             list the client prefixes, e.g. allowed_clients = [\"10.1.0.0/24\"]",
        ));
    }
    let allowed_clients = allowed
        .iter()
        .enumerate()
        .map(|(i, text)| v.prefix(&format!("proxy.allowed_clients[{i}]"), text))
        .collect::<Result<Vec<_>, _>>()?;
    let denied_destinations = match &proxy.denied_destinations {
        Some(list) => list
            .iter()
            .enumerate()
            .map(|(i, text)| v.prefix(&format!("proxy.denied_destinations[{i}]"), text))
            .collect::<Result<Vec<_>, _>>()?,
        None => DEFAULT_DENIED_DESTINATIONS
            .iter()
            .map(|text| text.parse::<IpNet>().expect("default prefixes are valid"))
            .collect(),
    };

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
    let worker_threads = match proxy.worker_threads {
        Some(0) => return Err(v.invalid("proxy.worker_threads", "must be at least 1")),
        Some(n) if n > MAX_WORKER_THREADS => {
            return Err(v.invalid(
                "proxy.worker_threads",
                format!(
                    "{n} is more than {MAX_WORKER_THREADS}; use about one per CPU, or leave it \
                     out for exactly that"
                ),
            ))
        }
        other => other,
    };
    let socket_memory = match proxy.socket_memory {
        None => SocketMemorySetting::Auto,
        Some(FileSocketMemory::Keyword(word)) if word == "auto" => SocketMemorySetting::Auto,
        Some(FileSocketMemory::Keyword(word)) if word == "off" => SocketMemorySetting::Off,
        Some(FileSocketMemory::Bytes(bytes)) if bytes >= MIN_SOCKET_MEMORY_BUDGET => {
            SocketMemorySetting::Budget(bytes)
        }
        Some(FileSocketMemory::Bytes(bytes)) => {
            return Err(v.invalid(
                "proxy.socket_memory",
                format!(
                    "{bytes} bytes is too small a budget for the socket memory guard (at least \
                     {MIN_SOCKET_MEMORY_BUDGET}); write \"auto\" (half of net.ipv4.tcp_mem's \
                     pressure value), \"off\", or a byte count such as 536870912"
                ),
            ))
        }
        Some(FileSocketMemory::Keyword(word)) => {
            return Err(v.invalid(
                "proxy.socket_memory",
                format!(
                    "{word:?} is not a setting; write \"auto\" (half of net.ipv4.tcp_mem's \
                     pressure value), \"off\", or a byte count such as 536870912"
                ),
            ))
        }
    };
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

    let spool = file.spool.unwrap_or(FileSpool {
        dir: None,
        max_total_bytes: None,
    });
    let spool_dir = spool
        .dir
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SPOOL_DIR));
    if spool_dir.as_os_str().is_empty() {
        return Err(v.invalid("spool.dir", "must not be empty"));
    }
    let spool_max_total_bytes = spool
        .max_total_bytes
        .unwrap_or(DEFAULT_SPOOL_MAX_TOTAL_BYTES);

    let profiles =
        midway_tcp::resolve_profiles(&file.profiles).map_err(|source| ConfigError::Profile {
            origin: origin.to_string(),
            source,
        })?;

    if file.listeners.is_empty() {
        return Err(v.invalid(
            "listeners",
            "at least one [[listeners]] table is required (mode, listen, ...)",
        ));
    }
    let mut names = BTreeSet::new();
    let mut addrs = BTreeMap::new();
    let mut listeners = Vec::with_capacity(file.listeners.len());
    for (index, listener) in file.listeners.into_iter().enumerate() {
        let config = validate_listener(&v, index, listener, &profiles)?;
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
            if let Some(other) = addrs.insert(config.listen, config.name.clone()) {
                return Err(v.invalid(
                    format!("listeners[{index}].listen"),
                    format!("{} is already used by listener {other:?}", config.listen),
                ));
            }
        }
        listeners.push(config);
    }
    check_nft_tables(&v, &listeners)?;
    check_http_cache_dirs(&v, &listeners)?;

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
        spool_dir,
        spool_max_total_bytes,
        profiles,
        listeners,
    })
}

fn validate_listener(
    v: &Validator<'_>,
    index: usize,
    file: FileListener,
    profiles: &BTreeMap<String, TcpProfile>,
) -> Result<ListenerConfig, ConfigError> {
    let key = |field: &str| format!("listeners[{index}].{field}");
    let name = match file.name {
        Some(name) if !name.trim().is_empty() => name,
        _ => {
            return Err(v.invalid(
                key("name"),
                "required: a short unique name, e.g. name = \"fwd\"",
            ))
        }
    };
    let mode = file.mode.ok_or_else(|| {
        v.invalid(
            key("mode"),
            "required: \"forward\", \"socks5\", \"transparent\" or \"http\"",
        )
    })?;
    let listen_text = file
        .listen
        .ok_or_else(|| v.invalid(key("listen"), "required: e.g. listen = \"0.0.0.0:9000\""))?;
    let listen: SocketAddr = listen_text.parse().map_err(|_| {
        v.invalid(
            key("listen"),
            format!("{listen_text:?} is not ip:port; write e.g. \"0.0.0.0:9000\" or \"[::]:9000\""),
        )
    })?;

    let mode_str = |m: ModeName| match m {
        ModeName::Forward => "forward",
        ModeName::Socks5 => "socks5",
        ModeName::Transparent => "transparent",
        ModeName::Http => "http",
    };
    let only_for = |field: &str, wanted: ModeName| {
        v.invalid(
            key(field),
            format!(
                "only allowed when mode = \"{}\" (this listener has mode = \"{}\"); remove it",
                mode_str(wanted),
                mode_str(mode)
            ),
        )
    };
    if mode != ModeName::Forward && file.target.is_some() {
        return Err(only_for("target", ModeName::Forward));
    }
    if mode != ModeName::Socks5 && file.auth.is_some() {
        return Err(only_for("auth", ModeName::Socks5));
    }
    if mode != ModeName::Socks5 && file.users.is_some() {
        return Err(only_for("users", ModeName::Socks5));
    }
    if mode != ModeName::Transparent && file.spoof_client_address.is_some() {
        return Err(only_for("spoof_client_address", ModeName::Transparent));
    }
    if mode != ModeName::Transparent && file.nftables.is_some() {
        return Err(only_for("nftables", ModeName::Transparent));
    }
    if mode != ModeName::Transparent && file.application.is_some() {
        return Err(v.invalid(
            key("application"),
            format!(
                "only allowed when mode = \"transparent\" (this listener has mode = \"{}\"); \
                 for an explicit HTTP proxy write mode = \"http\" instead",
                mode_str(mode)
            ),
        ));
    }
    let speaks_http = mode == ModeName::Http || file.application == Some(ApplicationName::Http);
    if !speaks_http && file.http.is_some() {
        return Err(v.invalid(
            key("http"),
            "[listeners.http] only applies to mode = \"http\" or to a transparent listener with \
             application = \"http\"; remove it or set one of those",
        ));
    }
    if speaks_http {
        // The HTTP engine answers requests itself (CONNECT tunnels included): no byte relay.
        let relay_keys = [
            ("relay", file.relay.is_some()),
            ("buffer_bytes", file.buffer_bytes.is_some()),
            ("splice", file.splice.is_some()),
            ("spool_memory_bytes", file.spool_memory_bytes.is_some()),
            ("spool_max_bytes", file.spool_max_bytes.is_some()),
        ];
        if let Some((field, _)) = relay_keys.iter().find(|(_, set)| *set) {
            return Err(v.invalid(
                key(field),
                "an HTTP listener does not relay bytes, so relay settings do not apply; remove it \
                 (HTTP settings go in [listeners.http])",
            ));
        }
        if file.spoof_client_address == Some(true) {
            return Err(v.invalid(
                key("spoof_client_address"),
                "cannot be used with application = \"http\": pooled upstream connections are \
                 shared by all clients, so they cannot carry one client's address; set it to \
                 false or use application = \"tcp\"",
            ));
        }
        if let Some(i) = file
            .client_profiles
            .iter()
            .position(|o| o.remote_profile.is_some())
        {
            return Err(v.invalid(
                format!("{}[{i}].remote_profile", key("client_profiles")),
                "an HTTP listener pools upstream connections across clients, so the upstream \
                 segment has one profile: set the listener's remote_profile instead",
            ));
        }
    }

    let intercept = match mode {
        ModeName::Forward => {
            let text = file.target.ok_or_else(|| {
                v.invalid(
                    key("target"),
                    "is required when mode = \"forward\"; e.g. target = \"10.2.0.2:5201\"",
                )
            })?;
            let target = TargetAddr::parse(&text)
                .map_err(|problem| v.invalid(key("target"), format!("{text:?}: {problem}")))?;
            Intercept::Forward { target }
        }
        ModeName::Socks5 => {
            let auth = match (file.auth.unwrap_or(AuthName::None), file.users) {
                (AuthName::None, None) => Socks5Auth::None,
                (AuthName::None, Some(_)) => {
                    return Err(v.invalid(
                        key("users"),
                        "users need auth = \"password\"; set it or remove users",
                    ))
                }
                (AuthName::Password, None) => return Err(v.invalid(
                    key("users"),
                    "auth = \"password\" requires users = [{ name = \"...\", password = \"...\" }]",
                )),
                (AuthName::Password, Some(users)) => {
                    if users.is_empty() {
                        return Err(v.invalid(
                            key("users"),
                            "auth = \"password\" requires at least one user",
                        ));
                    }
                    let mut seen = BTreeSet::new();
                    let mut pairs = Vec::with_capacity(users.len());
                    for (i, user) in users.into_iter().enumerate() {
                        // RFC 1929 carries each field in 1..=255 bytes.
                        if user.name.is_empty() || user.name.len() > 255 {
                            return Err(v.invalid(
                                format!("{}[{i}].name", key("users")),
                                "must be 1..255 bytes",
                            ));
                        }
                        if user.password.is_empty() || user.password.len() > 255 {
                            return Err(v.invalid(
                                format!("{}[{i}].password", key("users")),
                                "must be 1..255 bytes",
                            ));
                        }
                        if !seen.insert(user.name.clone()) {
                            return Err(v.invalid(
                                format!("{}[{i}].name", key("users")),
                                format!("duplicate user {:?}", user.name),
                            ));
                        }
                        pairs.push((user.name, user.password));
                    }
                    Socks5Auth::Password(pairs)
                }
            };
            Intercept::Socks5 { auth }
        }
        ModeName::Transparent => {
            let nft = file.nftables.unwrap_or(FileNftables {
                manage: None,
                table: None,
                interfaces: Vec::new(),
                ports: Vec::new(),
                mark: None,
                route_table: None,
            });
            let table = nft.table.unwrap_or_else(|| DEFAULT_NFT_TABLE.to_string());
            if table.is_empty()
                || !table
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(v.invalid(
                    key("nftables.table"),
                    format!("{table:?} is not a valid table name; use letters, digits, '_' or '-'"),
                ));
            }
            for (i, iface) in nft.interfaces.iter().enumerate() {
                // IFNAMSIZ is 16 including the terminating NUL.
                if iface.is_empty()
                    || iface.len() > 15
                    || !iface
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_-.@".contains(c))
                {
                    return Err(v.invalid(
                        format!("{}[{i}]", key("nftables.interfaces")),
                        format!(
                            "{iface:?} is not an interface name (1..15 of letters, digits, '_-.@')"
                        ),
                    ));
                }
            }
            if nft.ports.contains(&0) {
                return Err(v.invalid(
                    key("nftables.ports"),
                    "port 0 cannot be intercepted; use 1..65535",
                ));
            }
            let mark = nft.mark.unwrap_or(DEFAULT_NFT_MARK);
            if mark == 0 {
                return Err(v.invalid(key("nftables.mark"), "must not be 0 (0 means unmarked)"));
            }
            let route_table = nft.route_table.unwrap_or(DEFAULT_NFT_ROUTE_TABLE);
            // 253..255 are the kernel's default/main/local tables.
            if route_table == 0 || (253..=255).contains(&route_table) {
                return Err(v.invalid(
                    key("nftables.route_table"),
                    "must be a table of its own (1..252 or above 255), not default/main/local",
                ));
            }
            if listen.port() == 0 {
                return Err(v.invalid(
                    key("listen"),
                    "a transparent listener needs a fixed port for the tproxy rule",
                ));
            }
            Intercept::Transparent {
                spoof_client_address: file.spoof_client_address.unwrap_or(false),
                nftables: NftConfig {
                    manage: nft.manage.unwrap_or(true),
                    table,
                    interfaces: nft.interfaces,
                    ports: nft.ports,
                    mark,
                    route_table,
                },
            }
        }
        ModeName::Http => Intercept::Http,
    };
    let http = if speaks_http {
        Some(http_config(v, &key("http"), file.http.unwrap_or_default())?)
    } else {
        None
    };

    let relay_name = file.relay.unwrap_or(RelayName::Buffer);
    let buffer_bytes = file.buffer_bytes.unwrap_or(DEFAULT_BUFFER_BYTES);
    if buffer_bytes < 4096 {
        return Err(v.invalid(key("buffer_bytes"), "must be at least 4096"));
    }
    if relay_name == RelayName::Buffer
        && (file.spool_memory_bytes.is_some() || file.spool_max_bytes.is_some())
    {
        let field = if file.spool_memory_bytes.is_some() {
            "spool_memory_bytes"
        } else {
            "spool_max_bytes"
        };
        return Err(v.invalid(
            key(field),
            "spool_memory_bytes / spool_max_bytes only apply with relay = \"spool\"",
        ));
    }
    if relay_name == RelayName::Spool && file.splice.is_some() {
        return Err(v.invalid(key("splice"), "only applies with relay = \"buffer\""));
    }
    let relay = match relay_name {
        RelayName::Buffer => RelayModel::Buffer(BufferConfig {
            buffer_bytes,
            splice: file.splice.unwrap_or(true),
        }),
        RelayName::Spool => {
            let memory_bytes = file
                .spool_memory_bytes
                .unwrap_or(DEFAULT_SPOOL_MEMORY_BYTES);
            if memory_bytes < 4096 {
                return Err(v.invalid(key("spool_memory_bytes"), "must be at least 4096"));
            }
            RelayModel::Spool(SpoolConfig {
                memory_bytes,
                max_spool_bytes: file.spool_max_bytes.unwrap_or(DEFAULT_SPOOL_MAX_BYTES),
                buffer_bytes,
            })
        }
    };

    let local_profile = v.profile_name(
        &key("local_profile"),
        file.local_profile.as_deref().unwrap_or(DEFAULT_PROFILE),
        profiles,
    )?;
    let remote_profile = v.profile_name(
        &key("remote_profile"),
        file.remote_profile.as_deref().unwrap_or(DEFAULT_PROFILE),
        profiles,
    )?;
    let mut client_profiles = Vec::with_capacity(file.client_profiles.len());
    for (i, over) in file.client_profiles.into_iter().enumerate() {
        let base = format!("{}[{i}]", key("client_profiles"));
        let prefix = v.prefix(&format!("{base}.prefix"), &over.prefix)?;
        if over.local_profile.is_none() && over.remote_profile.is_none() {
            return Err(v.invalid(
                &base,
                "names neither local_profile nor remote_profile; add one or remove it",
            ));
        }
        let local_profile = over
            .local_profile
            .map(|n| v.profile_name(&format!("{base}.local_profile"), &n, profiles))
            .transpose()?;
        let remote_profile = over
            .remote_profile
            .map(|n| v.profile_name(&format!("{base}.remote_profile"), &n, profiles))
            .transpose()?;
        client_profiles.push(ClientProfileOverride {
            prefix,
            local_profile,
            remote_profile,
        });
    }
    // Longest prefix first; stable sort keeps file order among equal lengths.
    client_profiles.sort_by_key(|o| std::cmp::Reverse(o.prefix.prefix_len()));

    Ok(ListenerConfig {
        name,
        listen,
        intercept,
        relay,
        http,
        local_profile,
        remote_profile,
        client_profiles,
    })
}

/// `[listeners.http]` -> the engine's config. `base` is the key path of the section.
fn http_config(
    v: &Validator<'_>,
    base: &str,
    file: FileHttp,
) -> Result<HttpProxyConfig, ConfigError> {
    let key = |field: &str| format!("{base}.{field}");
    let max_header_bytes = file
        .max_header_bytes
        .unwrap_or(http_defaults::DEFAULT_MAX_HEADER_BYTES);
    if !(256..=MAX_HTTP_HEADER_BYTES).contains(&max_header_bytes) {
        return Err(v.invalid(
            key("max_header_bytes"),
            format!("must be between 256 and {MAX_HTTP_HEADER_BYTES} (e.g. 32768)"),
        ));
    }
    let max_pipelined = v.positive(
        &key("max_pipelined"),
        file.max_pipelined,
        http_defaults::DEFAULT_MAX_PIPELINED,
    )?;
    let requests_per_second = file
        .requests_per_second
        .unwrap_or(http_defaults::DEFAULT_REQUESTS_PER_SECOND);
    if !(requests_per_second.is_finite() && requests_per_second > 0.0) {
        return Err(v.invalid(
            key("requests_per_second"),
            "must be a positive number of requests per second, e.g. 200",
        ));
    }
    let request_burst = file
        .request_burst
        .unwrap_or(http_defaults::DEFAULT_REQUEST_BURST);
    if request_burst == 0 {
        return Err(v.invalid(key("request_burst"), "must be at least 1, e.g. 100"));
    }
    let client = HttpClientLimits {
        max_header_bytes,
        max_pipelined,
        requests_per_second,
        request_burst,
        idle_timeout: v.duration(
            &key("client_idle_timeout"),
            file.client_idle_timeout,
            http_defaults::DEFAULT_CLIENT_IDLE_TIMEOUT,
        )?,
        head_read_timeout: v.duration(
            &key("head_read_timeout"),
            file.head_read_timeout,
            http_defaults::DEFAULT_HEAD_READ_TIMEOUT,
        )?,
    };

    let keepalive_on = file
        .upstream_keepalive
        .unwrap_or(DEFAULT_HTTP_UPSTREAM_KEEPALIVE);
    let keepalive = if keepalive_on {
        let retries = file
            .keepalive_retries
            .unwrap_or(http_defaults::DEFAULT_KEEPALIVE_RETRIES);
        if retries == 0 {
            return Err(v.invalid(
                key("keepalive_retries"),
                "must be at least 1; to turn probes off write upstream_keepalive = false",
            ));
        }
        Some(KeepaliveProbes {
            idle: v.duration(
                &key("keepalive_idle"),
                file.keepalive_idle,
                http_defaults::DEFAULT_KEEPALIVE_IDLE,
            )?,
            interval: v.duration(
                &key("keepalive_interval"),
                file.keepalive_interval,
                http_defaults::DEFAULT_KEEPALIVE_INTERVAL,
            )?,
            retries,
        })
    } else {
        let set = [
            ("keepalive_idle", file.keepalive_idle.is_some()),
            ("keepalive_interval", file.keepalive_interval.is_some()),
            ("keepalive_retries", file.keepalive_retries.is_some()),
        ];
        if let Some((field, _)) = set.iter().find(|(_, s)| *s) {
            return Err(v.invalid(
                key(field),
                "has no effect with upstream_keepalive = false; remove it or turn probes on",
            ));
        }
        None
    };
    let upstream = UpstreamPoolConfig {
        // 0 is allowed: no idle connection is kept (every request opens a new one).
        max_idle_per_origin: file
            .upstream_max_idle
            .unwrap_or(http_defaults::DEFAULT_MAX_IDLE_PER_ORIGIN),
        idle_keep: v.duration(
            &key("upstream_idle_keep"),
            file.upstream_idle_keep,
            http_defaults::DEFAULT_UPSTREAM_IDLE_KEEP,
        )?,
        keepalive,
        response_timeout: v.duration(
            &key("upstream_response_timeout"),
            file.upstream_response_timeout,
            http_defaults::DEFAULT_UPSTREAM_RESPONSE_TIMEOUT,
        )?,
    };

    let enabled = file.cache.unwrap_or(DEFAULT_HTTP_CACHE);
    if !enabled {
        let set = [
            ("cache_memory_bytes", file.cache_memory_bytes.is_some()),
            (
                "cache_max_object_bytes",
                file.cache_max_object_bytes.is_some(),
            ),
            ("cache_disk_dir", file.cache_disk_dir.is_some()),
            ("cache_disk_bytes", file.cache_disk_bytes.is_some()),
        ];
        if let Some((field, _)) = set.iter().find(|(_, s)| *s) {
            return Err(v.invalid(
                key(field),
                "has no effect with cache = false; remove it or set cache = true",
            ));
        }
    }
    let memory_bytes = file
        .cache_memory_bytes
        .unwrap_or(http_defaults::DEFAULT_CACHE_MEMORY_BYTES);
    // With only a memory cap given, the object cap follows it down instead of failing.
    let max_object_bytes = file
        .cache_max_object_bytes
        .unwrap_or(http_defaults::DEFAULT_CACHE_MAX_OBJECT_BYTES.min(memory_bytes));
    if max_object_bytes > memory_bytes {
        return Err(v.invalid(
            key("cache_max_object_bytes"),
            format!(
                "{max_object_bytes} is more than cache_memory_bytes ({memory_bytes}); an object \
                 is stored in memory first, so lower it or raise cache_memory_bytes"
            ),
        ));
    }
    let disk =
        match (file.cache_disk_dir, file.cache_disk_bytes) {
            (None, Some(_)) => return Err(v.invalid(
                key("cache_disk_bytes"),
                "needs cache_disk_dir = \"/var/cache/midway\" (a directory of its own); add it \
                 or remove cache_disk_bytes",
            )),
            (None, None) => None,
            (Some(dir), bytes) => {
                if dir.as_os_str().is_empty() || dir.is_relative() {
                    return Err(v.invalid(
                        key("cache_disk_dir"),
                        "must be an absolute path, e.g. \"/var/cache/midway\"",
                    ));
                }
                let max_bytes = bytes.unwrap_or(http_defaults::DEFAULT_CACHE_DISK_BYTES);
                if max_bytes < max_object_bytes {
                    return Err(v.invalid(
                        key("cache_disk_bytes"),
                        format!(
                            "{max_bytes} cannot hold one object of cache_max_object_bytes \
                         ({max_object_bytes}); raise it"
                        ),
                    ));
                }
                Some(DiskCacheConfig { dir, max_bytes })
            }
        };
    let via_name = file
        .via_name
        .unwrap_or_else(|| DEFAULT_HTTP_VIA_NAME.to_string());
    if via_name.is_empty() || !via_name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(v.invalid(
            key("via_name"),
            format!("{via_name:?} must be one token without spaces, e.g. \"midway\""),
        ));
    }

    let config = HttpProxyConfig {
        client,
        upstream,
        cache: CacheConfig {
            enabled,
            memory_bytes,
            max_object_bytes,
            disk,
        },
        via_name,
        ..HttpProxyConfig::default()
    };
    // Backstop: the engine's own checks (the ones above give the better messages).
    config
        .validate()
        .map_err(|err| v.invalid(base, err.to_string()))?;
    Ok(config)
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

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[proxy]
allowed_clients = ["10.1.0.7/24", "fd00:1::/64", "127.0.0.1"]
[[listeners]]
name = "fwd"
mode = "forward"
listen = "127.0.0.1:0"
target = "127.0.0.1:5201"
"#;

    #[test]
    fn minimal_config_gets_defaults() {
        let config = parse_config(MINIMAL, "<test>").unwrap();
        assert_eq!(config.allowed_clients[0].to_string(), "10.1.0.0/24");
        assert_eq!(config.allowed_clients[2].to_string(), "127.0.0.1/32");
        assert_eq!(config.max_connections, DEFAULT_MAX_CONNECTIONS);
        assert_eq!(config.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        let listener = &config.listeners[0];
        assert_eq!(listener.local_profile, "default");
        assert!(matches!(listener.relay, RelayModel::Buffer(_)));
        assert!(matches!(
            &listener.intercept,
            Intercept::Forward { target: TargetAddr::Ip(a) } if a.port() == 5201
        ));
    }

    #[test]
    fn denied_destinations_default_to_the_gateway_itself() {
        let config = parse_config(MINIMAL, "<test>").unwrap();
        for denied in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "169.254.169.254",
            "::1",
            "::",
        ] {
            let addr: IpAddr = denied.parse().unwrap();
            assert!(config.is_denied_destination(addr), "{denied}");
        }
        for mapped in ["::ffff:127.0.0.1", "::ffff:169.254.1.1"] {
            let addr: IpAddr = mapped.parse().unwrap();
            assert!(config.is_denied_destination(addr), "{mapped}");
        }
        for allowed in ["10.2.0.2", "192.0.2.1", "2001:db8::1", "::ffff:10.2.0.2"] {
            let addr: IpAddr = allowed.parse().unwrap();
            assert!(!config.is_denied_destination(addr), "{allowed}");
        }
        let open = MINIMAL.replace("[proxy]\n", "[proxy]\ndenied_destinations = []\n");
        let config = parse_config(&open, "<test>").unwrap();
        assert!(!config.is_denied_destination("127.0.0.1".parse().unwrap()));
        let own = MINIMAL.replace(
            "[proxy]\n",
            "[proxy]\ndenied_destinations = [\"10.9.0.0/16\"]\n",
        );
        let config = parse_config(&own, "<test>").unwrap();
        assert!(config.is_denied_destination("10.9.1.1".parse().unwrap()));
        assert!(
            !config.is_denied_destination("127.0.0.1".parse().unwrap()),
            "an explicit list replaces the default"
        );
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = MINIMAL.replace("target = ", "tagret = ");
        let err = parse_config(&text, "x.toml").unwrap_err().to_string();
        assert!(err.contains("tagret"), "{err}");
        assert!(err.starts_with("x.toml:8:"), "{err}");
    }

    #[test]
    fn longest_client_prefix_wins_per_segment() {
        let text = format!(
            "{MINIMAL}\n[[listeners.client_profiles]]\nprefix = \"10.0.0.0/8\"\nlocal_profile = \"wan\"\nremote_profile = \"wan\"\n\
             [[listeners.client_profiles]]\nprefix = \"10.1.0.128/25\"\nlocal_profile = \"satellite-local\"\n"
        );
        let config = parse_config(&text, "<test>").unwrap();
        let l = &config.listeners[0];
        assert_eq!(
            l.profiles_for("10.1.0.200".parse().unwrap()),
            ("satellite-local", "wan")
        );
        assert_eq!(l.profiles_for("10.1.0.2".parse().unwrap()), ("wan", "wan"));
        assert_eq!(
            l.profiles_for("192.0.2.1".parse().unwrap()),
            ("default", "default")
        );
    }

    #[test]
    fn target_parsing() {
        assert_eq!(
            TargetAddr::parse("[::1]:80").unwrap(),
            TargetAddr::Ip("[::1]:80".parse().unwrap())
        );
        assert_eq!(
            TargetAddr::parse("example.org:443").unwrap(),
            TargetAddr::Domain("example.org".into(), 443)
        );
        assert!(TargetAddr::parse("example.org").is_err());
        assert!(TargetAddr::parse("::1:80").is_err());
        assert!(TargetAddr::parse("host:99999").is_err());
    }

    #[test]
    fn passwords_not_in_debug() {
        let text = r#"
[proxy]
allowed_clients = ["127.0.0.1"]
[[listeners]]
name = "s"
mode = "socks5"
listen = "127.0.0.1:0"
auth = "password"
users = [{ name = "alice", password = "sekrit-pw" }]
"#;
        let config = parse_config(text, "<test>").unwrap();
        let dbg = format!("{config:?}");
        assert!(dbg.contains("alice"));
        assert!(!dbg.contains("sekrit-pw"));
    }

    const HTTP: &str = r#"
[proxy]
allowed_clients = ["127.0.0.1"]
[[listeners]]
name = "web"
mode = "http"
listen = "127.0.0.1:0"
remote_profile = "wan"
"#;

    #[test]
    fn http_listener_without_section_gets_engine_defaults() {
        let config = parse_config(HTTP, "<test>").unwrap();
        let listener = &config.listeners[0];
        assert!(matches!(listener.intercept, Intercept::Http));
        let http = listener.http.as_ref().unwrap();
        let defaults = HttpProxyConfig::default();
        assert_eq!(http.client.max_pipelined, defaults.client.max_pipelined);
        assert_eq!(http.upstream.idle_keep, defaults.upstream.idle_keep);
        assert_eq!(http.cache.memory_bytes, defaults.cache.memory_bytes);
        assert!(http.cache.enabled && http.cache.disk.is_none());
        assert_eq!(http.via_name, DEFAULT_HTTP_VIA_NAME);
        // Split-connection listeners have no engine.
        assert!(parse_config(MINIMAL, "<test>").unwrap().listeners[0]
            .http
            .is_none());
    }

    #[test]
    fn http_section_maps_keys_and_small_memory_lowers_object_cap() {
        let text = format!(
            "{HTTP}[listeners.http]\nupstream_keepalive = false\nupstream_max_idle = 0\n\
             cache_memory_bytes = 100000\nclient_idle_timeout = \"7s\"\n"
        );
        let config = parse_config(&text, "<test>").unwrap();
        let http = config.listeners[0].http.as_ref().unwrap();
        assert!(http.upstream.keepalive.is_none());
        assert_eq!(http.upstream.max_idle_per_origin, 0);
        assert_eq!(http.cache.memory_bytes, 100_000);
        assert_eq!(http.cache.max_object_bytes, 100_000);
        assert_eq!(http.client.idle_timeout, Duration::from_secs(7));
    }

    #[test]
    fn transparent_http_application_and_shared_cache_dir() {
        let transparent = |name: &str, port: u16, dir: &str| {
            format!(
                "[[listeners]]\nname = \"{name}\"\nmode = \"transparent\"\n\
                 application = \"http\"\nlisten = \"0.0.0.0:{port}\"\n\
                 [listeners.http]\ncache_disk_dir = \"{dir}\"\n"
            )
        };
        let base = "[proxy]\nallowed_clients = [\"10.0.0.0/8\"]\n";
        let one = format!("{base}{}", transparent("a", 7080, "/var/cache/m/a"));
        let config = parse_config(&one, "<test>").unwrap();
        assert!(matches!(
            config.listeners[0].intercept,
            Intercept::Transparent { .. }
        ));
        assert!(config.listeners[0].http.is_some());
        let two = format!("{one}{}", transparent("b", 7081, "/var/cache/m/a"));
        let err = parse_config(&two, "<test>").unwrap_err().to_string();
        assert!(err.contains("listeners[1].http.cache_disk_dir"), "{err}");
        assert!(
            err.contains("already the cache directory of listener \"a\""),
            "{err}"
        );
    }

    #[test]
    fn line_column_counts_from_one() {
        assert_eq!(line_column("ab\ncd", 0), (1, 1));
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
    }
}
