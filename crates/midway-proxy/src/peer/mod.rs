//! Two-ended operation's pure parts: the authenticated header that starts every connection
//! between midways ([`header`]) and the replay guard that refuses a header seen before
//! ([`replay`]). The I/O around them (gateway, edge, warm pool) is in the server
//! (`server/peering.rs`, `server/pool.rs`).

pub mod header;
pub mod replay;
