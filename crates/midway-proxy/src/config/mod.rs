//! Configuration in three stages.
//!
//! 1. TOML text -> file structs ([`FileConfig`] and friends, in `file.rs`), every struct
//!    `deny_unknown_fields` so a typo is an error naming the key and its line (toml's span is
//!    kept).
//! 2. Missing values are filled from the named `DEFAULT_*` constants below.
//! 3. Cross-field validation produces a [`RuntimeConfig`] (`runtime.rs`): prefixes parsed,
//!    profile names resolved against the presets and `[profiles.*]`, mode-specific keys
//!    checked (`validate.rs` for the file and `[proxy]`, `listener.rs` per listener, `http.rs`
//!    for `[listeners.http]`, `proxy_protocol.rs` for a listener's PROXY protocol keys,
//!    `peers.rs` for `[keys.*]` and `[[peers]]`). Every error names the origin (file), the key path
//!    (`listeners[0].target`) and how to fix it.
//!
//! Secrets (SOCKS5 passwords) never appear in an error message or in `Debug` output.

mod access_links;
mod control;
mod http;
mod listener;
mod peers;
mod proxy_protocol;
mod quic;
mod runtime;
mod transport;
mod validate;

use std::path::{Path, PathBuf};
use std::time::Duration;

use midway_tcp::ProfileError;

pub use access_links::MIN_ACCESS_RATE_BPS;
pub use control::{
    default_control_socket, ControlConfig, CONTROL_SOCKET_NAME, DEFAULT_CONTROL_SOCKET,
};
/// Stage 1, the file as written, is midway-config's: the proxy reads it, the lab and the
/// benchmark write it.
pub use midway_config::{
    ApplicationName, AuthName, FileAccessLink, FileClientProfile, FileConfig, FileControl,
    FileHttp, FileKey, FileListener, FileMetrics, FileNftables, FilePeer, FileProxy, FileQuic,
    FileSocketMemory, FileSpool, FileTls, FileUser, ModeName, ProxyProtocolVersion, RelayName,
    TransportName,
};
pub use proxy_protocol::ProxyProtocolSettings;
pub use runtime::*;

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
/// Destinations a client-chosen target (SOCKS5, HTTP, a peer header) may not reach unless the
/// operator says otherwise: every address of the proxy host's own interfaces (`"self"`), its
/// loopback and unspecified addresses, and link-local ones (cloud metadata services live at
/// 169.254.169.254). An allowed client must not be able to use midway to reach services that
/// listen only on the gateway itself, such as midway's own metrics endpoint on `0.0.0.0`;
/// Squid's default `http_access deny to_localhost` / `to_linklocal` draw the same line.
/// IPv4-mapped IPv6 addresses are checked as the IPv4 address they carry.
pub const DEFAULT_DENIED_DESTINATIONS: [&str; 7] = [
    "self",
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

/// Midways a connection may cross, this one included, unless `[proxy] max_hops` says otherwise.
pub const DEFAULT_MAX_HOPS: u8 = 8;
/// Largest `max_hops` accepted: a longer chain is a configuration mistake, not a network.
pub const MAX_MAX_HOPS: u8 = 32;
/// A peer header's timestamp may be this far from the receiver's clock (either way); the
/// midways' clocks must agree to well within it (NTP does).
pub const DEFAULT_PEER_HEADER_WINDOW: Duration = Duration::from_secs(30);
/// Idle connections an edge keeps open to each peer.
pub const DEFAULT_WARM_CONNECTIONS: usize = 4;
/// Most warm connections per peer accepted.
pub const MAX_WARM_CONNECTIONS: usize = 1024;
/// A warm connection unused for this long is replaced by a new one. Shorter than the default
/// `idle_timeout`, after which the receiving midway would close it.
pub const DEFAULT_WARM_MAX_IDLE: Duration = Duration::from_secs(60);
/// Destinations a peer without `destinations` takes: all.
pub const ALL_DESTINATIONS: [&str; 2] = ["0.0.0.0/0", "::/0"];

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

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why reading failed.
        #[source]
        source: std::io::Error,
    },
    /// TOML syntax, a wrong type or an unknown key (stage 1).
    #[error("{origin}:{line}:{column}: {message}")]
    Syntax {
        /// Where the text came from (a path, or e.g. `"<test>"`).
        origin: String,
        /// 1-based; 0 when toml gives no position.
        line: usize,
        /// 1-based, in characters; 0 when toml gives no position.
        column: usize,
        /// toml's message, with the offending line quoted unless it may hold a secret.
        message: String,
    },
    /// A value that parses but cannot be used (stage 3).
    #[error("{origin}: {key}: {problem}")]
    Invalid {
        /// Where the text came from.
        origin: String,
        /// Key path, e.g. `listeners[0].target`.
        key: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
    /// A `[profiles.*]` table is inconsistent (unknown parent, bad value, ...).
    #[error("{origin}: [profiles]: invalid profile")]
    Profile {
        /// Where the text came from.
        origin: String,
        /// What is wrong with the profile.
        #[source]
        source: ProfileError,
    },
}

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
    validate::validate(file, origin)
}

/// Stage 1's error: toml's message with line and column, the offending line quoted.
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

#[cfg(test)]
mod tests;
