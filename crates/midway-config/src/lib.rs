//! midway-config: midway's configuration file as types, and the configurations of the peers the
//! lab and the benchmark run beside it (HAProxy, Squid). Nothing here does I/O.
//!
//! - `file`: the TOML file as written ([`FileConfig`] and its parts), `Deserialize` for the
//!   proxy, which validates it into its runtime form, and `Serialize` for the programs that write
//!   configs: the lab's cases and the benchmark. Unset keys are left out of what is written, so a
//!   written file says only what its writer chose.
//! - `profile`: the file form of a TCP profile ([`ProfileSpec`]); midway-tcp resolves and
//!   applies it.
//! - `builder`: [`ConfigBuilder`] and [`ListenerBuilder`], the way programs make a config.
//! - `overlay`: deep-merging extra TOML (a scenario's `config` table, the benchmark's
//!   `--midway-*-extra` lines) onto a written config.
//! - [`haproxy`]: HAProxy's configuration in TCP mode, as the lab and the benchmark run it
//!   (public as a module: the lab and the benchmark name its types by that path).
//!
//! Programs write configs through these types, never by formatting text, so what they write is
//! what the proxy reads: a field renamed here is renamed for every writer at compile time.

#![forbid(unsafe_code)]

mod builder;
mod file;
pub mod haproxy;
mod overlay;
mod profile;
pub mod squid;

pub use builder::{ConfigBuilder, ListenerBuilder};
pub use file::{
    ApplicationName, AuthName, FileAccessLink, FileClientProfile, FileConfig, FileControl,
    FileHttp, FileKey, FileListener, FileMetrics, FileNftables, FilePeer, FileProxy, FileQuic,
    FileSocketMemory, FileSpool, FileTls, FileUser, ModeName, ProxyProtocolVersion, RelayName,
    TransportName,
};
pub use overlay::{overlay, OverlayConflict};
pub use profile::{AutoBuffer, BufferSize, Keepalive, ProfileSpec};
