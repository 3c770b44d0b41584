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
    pub proxy: FileProxy,
    pub metrics: Option<FileMetrics>,
    pub spool: Option<FileSpool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<String, ProfileSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<FileListener>,
}

/// `[proxy]`
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
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
    /// Socket memory guard: "auto", "off", or a budget in bytes (see midway-proxy's `sockmem`).
    pub socket_memory: Option<FileSocketMemory>,
    pub route_knobs_table_base: Option<u32>,
    pub route_knobs_mark_base: Option<u32>,
}

/// `socket_memory = "auto" | "off" | <bytes>`
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum FileSocketMemory {
    Keyword(String),
    Bytes(u64),
}

/// `[metrics]`
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileMetrics {
    pub listen: SocketAddr,
}

/// `[spool]`
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpool {
    pub dir: Option<PathBuf>,
    pub max_total_bytes: Option<u64>,
}

/// How connections reach a listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeName {
    Forward,
    Socks5,
    Transparent,
    /// Explicit HTTP proxy (`curl -x`, browsers' proxy setting), CONNECT included.
    Http,
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
    Buffer,
    Spool,
}

/// SOCKS5 authentication method name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthName {
    None,
    Password,
}

/// `[[listeners]]`
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
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
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
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
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileClientProfile {
    pub prefix: String,
    pub local_profile: Option<String>,
    pub remote_profile: Option<String>,
}

/// One SOCKS5 user. `Debug` hides the password.
#[derive(Clone, PartialEq, Deserialize, Serialize)]
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
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileNftables {
    pub manage: Option<bool>,
    pub table: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
    pub mark: Option<u32>,
    pub route_table: Option<u32>,
}
