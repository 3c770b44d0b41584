//! The rustls client and server configs of the peer transports.

use std::sync::{Arc, OnceLock};

use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::server::NoServerSessionStorage;
use rustls::{ClientConfig, ServerConfig};

use crate::error::TlsError;
use crate::fingerprint::Fingerprint;
use crate::identity::Identity;
use crate::verify::PinnedPeers;

/// The ALPN protocol both ends offer and require: a TLS client speaking anything else (HTTP,
/// a later incompatible midway peer protocol) is refused with `no_application_protocol`.
pub const ALPN: &[u8] = b"midway-peer/1";

/// The crypto provider of every config: ring, explicitly (not the process default, and never
/// aws-lc).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// The config of the midway that dials the peer connection: TLS 1.3 only, the ring provider,
/// ALPN [`ALPN`], presenting `identity` as its client certificate, and accepting the server
/// if and only if its key's fingerprint is in `pinned` and its certificate is valid at the
/// time of the handshake.
///
/// The server name the connector is given (use [`crate::server_name`]) is not checked: the pin
/// is the check. Every midway's certificate names the same [`crate::SERVER_NAME`], so a name
/// would tell the peers apart no better than the key does, and the key cannot be forged. SNI
/// is not sent, and sessions are not resumed: every connection is a full handshake, so every
/// connection is checked against the current pins and the certificate's validity.
///
/// Fails with [`TlsError::NoPeers`] if `pinned` is empty: such a config refuses every server.
pub fn client_config(
    identity: &Identity,
    pinned: Vec<Fingerprint>,
) -> Result<Arc<ClientConfig>, TlsError> {
    if pinned.is_empty() {
        return Err(TlsError::NoPeers);
    }
    let provider = provider();
    let verifier = Arc::new(PinnedPeers::new(pinned, provider.clone()));
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(
            vec![identity.certificate_der().clone()],
            identity.private_key_der(),
        )?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.enable_sni = false;
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

/// The config of the midway that accepts peer connections: TLS 1.3 only, the ring provider,
/// ALPN [`ALPN`], presenting `identity`, and requiring a client certificate whose key's
/// fingerprint is in `allowed` and which is valid at the time of the handshake. A client
/// without a certificate is refused.
///
/// No session tickets and no session cache: every connection is a full handshake, checked
/// against the current pins.
///
/// Fails with [`TlsError::NoPeers`] if `allowed` is empty: such a config refuses every client.
pub fn server_config(
    identity: &Identity,
    allowed: Vec<Fingerprint>,
) -> Result<Arc<ServerConfig>, TlsError> {
    if allowed.is_empty() {
        return Err(TlsError::NoPeers);
    }
    let provider = provider();
    let verifier = Arc::new(PinnedPeers::new(allowed, provider.clone()));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![identity.certificate_der().clone()],
            identity.private_key_der(),
        )?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}
