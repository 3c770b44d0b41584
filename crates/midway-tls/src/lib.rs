//! midway-tls: the identity and TLS configs of the encrypted peer transports between two
//! midways (`transport = "tls"`: TLS 1.3 over each peer TCP connection with tokio-rustls; later
//! `transport = "quic"`, quinn, which takes the same rustls configs).
//!
//! Authentication is mutual and by pinned key, not by a CA. Each midway has one key pair and a
//! self-signed certificate ([`generate_identity`], [`write_identity`]: `midway peer keygen`),
//! loaded with [`Identity::load`]. Each side lists the [`Fingerprint`]s (SHA-256 of the
//! SubjectPublicKeyInfo, `sha256:` and 64 hex digits) of the peers it accepts;
//! [`client_config`] and [`server_config`] build rustls configs whose verifiers accept exactly
//! the certificates whose key is listed and whose validity period contains the handshake's
//! time. An unknown or expired peer is refused during the handshake, and
//! [`refusal_reason`] tells which for metrics and logs.
//!
//! Both configs: TLS 1.3 only, the ring crypto provider (no aws-lc), ALPN [`ALPN`]
//! (`midway-peer/1`), a client certificate required, no session resumption.
//!
//! ```no_run
//! # async fn dial(tcp: tokio::net::TcpStream) -> Result<(), Box<dyn std::error::Error>> {
//! use midway_tls::{client_config, server_name, Identity};
//! let identity = Identity::load("/etc/midway/peer.crt", "/etc/midway/peer.key")?;
//! let pinned = vec!["sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff".parse()?];
//! let config = client_config(&identity, pinned)?;
//! // With tokio-rustls: tokio_rustls::TlsConnector::from(config).connect(server_name(), tcp).await
//! # let _ = (config, server_name(), tcp); Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod config;
mod error;
mod fingerprint;
mod identity;
mod keygen;
mod reason;
mod verify;

#[cfg(test)]
mod tests;

pub use config::{client_config, server_config, ALPN};
pub use error::TlsError;
pub use fingerprint::{CertificateParseError, Fingerprint, ParseFingerprintError};
pub use identity::Identity;
pub use keygen::{
    generate_identity, generate_identity_with_validity, write_identity, GeneratedIdentity,
    IdentityPaths, CERT_FILE, KEY_FILE,
};
pub use reason::{refusal_reason, tls_refusal_reason, unknown_peer_fingerprint, REFUSAL_REASONS};
pub use verify::UnknownPeerKey;

/// The rustls this crate builds its configs with, for the types of its API.
pub use rustls;

/// The server name a client gives its connector ([`server_name`]), and a DNS name in every
/// generated certificate. Not checked by the peer (the pinned key is the check; see
/// [`client_config`]), but a valid name is needed to call the connector.
pub const SERVER_NAME: &str = "midway-peer";

/// [`SERVER_NAME`] as the `ServerName` a `tokio_rustls::TlsConnector` takes.
pub fn server_name() -> rustls::pki_types::ServerName<'static> {
    #[allow(
        clippy::expect_used,
        reason = "SERVER_NAME is a constant valid DNS name (tested)"
    )]
    rustls::pki_types::ServerName::try_from(SERVER_NAME).expect("SERVER_NAME is a valid DNS name")
}
