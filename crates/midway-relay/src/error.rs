//! Typed relay errors: which side failed, what was being done, and whether bytes were lost.

use std::io;

/// The party an I/O error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The local segment (the connection midway accepted).
    Client,
    /// The remote segment (the connection midway opened).
    Server,
    /// The spool file on disk (spool model only).
    SpoolDisk,
    /// Inside midway (pipe pool, resources).
    Internal,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Client => "client",
            Side::Server => "server",
            Side::SpoolDisk => "spool disk",
            Side::Internal => "internal",
        })
    }
}

/// Why a relay, or the creation of its shared resources, failed.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// An I/O error other than a reset on one side. `data_lost` is true when bytes that had been
    /// read from one side could not be delivered to the other (the connection was aborted).
    #[error("relay I/O error on the {side} side while {operation} (bytes lost: {data_lost})")]
    Io {
        /// The side (or the spool disk, or midway itself) the error came from.
        side: Side,
        /// What the relay was doing, e.g. "reading" or "writing to the spool".
        operation: &'static str,
        /// True when bytes read from one side could not be delivered to the other.
        data_lost: bool,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// The spool directory could not be created or used.
    #[error("spool directory {path} is unusable")]
    SpoolDir {
        /// The spool directory that was being created or used.
        path: std::path::PathBuf,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },
    /// A configuration value cannot work (for example a zero buffer size).
    #[error("invalid relay configuration: {0}")]
    InvalidConfig(&'static str),
}
