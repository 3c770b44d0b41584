//! Tests across the modules: identities on disk, and real TLS handshakes over loopback TCP.

mod handshake;
mod identity;
