//! The certificate verifiers of both ends: a peer is accepted if and only if its end-entity
//! certificate's key is pinned and the certificate is valid at the handshake's time.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme,
};

use crate::fingerprint::{CertInfo, Fingerprint, Validity};

/// The error a verifier reports for a certificate whose key is not pinned, inside
/// `rustls::Error::InvalidCertificate(CertificateError::Other(..))`: it carries the refused
/// key's fingerprint, so that the log says what to add if the peer should be accepted.
///
/// [`unknown_peer_fingerprint`](crate::unknown_peer_fingerprint) digs it out of an I/O error.
///
/// `Debug` prints the same sentence as `Display`: rustls shows the error inside
/// `CertificateError::Other` with `Debug`, and this keeps that message readable.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UnknownPeerKey(pub Fingerprint);

impl fmt::Debug for UnknownPeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for UnknownPeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "peer key {} is not among the accepted peers' fingerprints",
            self.0
        )
    }
}

impl std::error::Error for UnknownPeerKey {}

/// Verifies the peer's certificate by pin and validity period, and the handshake signatures
/// with the crypto provider's algorithms. Serves as the client's server verifier and as the
/// server's (mandatory) client verifier.
#[derive(Debug)]
pub(crate) struct PinnedPeers {
    /// Fingerprints of the accepted keys.
    pins: Vec<Fingerprint>,
    /// The provider whose signature verification algorithms check the handshake.
    provider: Arc<CryptoProvider>,
}

impl PinnedPeers {
    /// A verifier accepting exactly the keys in `pins`.
    pub(crate) fn new(pins: Vec<Fingerprint>, provider: Arc<CryptoProvider>) -> PinnedPeers {
        PinnedPeers { pins, provider }
    }

    /// Accepts `end_entity` if its key is pinned and `now` is within its validity period.
    ///
    /// Intermediates are ignored: trust rests on the pinned key alone, no chain is built.
    fn check(&self, end_entity: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
        let info = CertInfo::parse(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        if !self.pins.contains(&info.fingerprint) {
            let unknown = OtherError(Arc::new(UnknownPeerKey(info.fingerprint)));
            return Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                unknown,
            )));
        }
        let now_seconds = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
        let unix_time = |seconds: i64| {
            UnixTime::since_unix_epoch(Duration::from_secs(seconds.max(0).unsigned_abs()))
        };
        match info.validity_at(now_seconds) {
            Validity::Valid => Ok(()),
            Validity::Expired => Err(rustls::Error::InvalidCertificate(
                CertificateError::ExpiredContext {
                    time: now,
                    not_after: unix_time(info.not_after),
                },
            )),
            Validity::NotYetValid => Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidYetContext {
                    time: now,
                    not_before: unix_time(info.not_before),
                },
            )),
        }
    }
}

/// The handshake-signature checks both verifier traits ask for, written once.
impl PinnedPeers {
    fn tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Not reached (the configs allow TLS 1.3 only); correct if it were.
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl ServerCertVerifier for PinnedPeers {
    /// Checks pin and validity. The server name is not checked: the pin identifies the peer,
    /// whatever name it was dialled by (the client always sends [`crate::SERVER_NAME`], and
    /// every midway's certificate carries that same name, so a name check would add nothing).
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity, now)
            .map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes()
    }
}

impl ClientCertVerifier for PinnedPeers {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: the peers' certificates are self-signed, there is no CA to name.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity, now)
            .map(|()| ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::config::provider;
    use crate::keygen::{generate_identity, generate_identity_with_validity};

    fn der(pem: &str) -> CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    fn at(seconds: u64) -> UnixTime {
        UnixTime::since_unix_epoch(Duration::from_secs(seconds))
    }

    #[test]
    fn accepts_pinned_key_within_validity_only() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let end = start + Duration::from_secs(1000);
        let peer = generate_identity_with_validity("peer", start, end).unwrap();
        let other = generate_identity("other", Duration::from_secs(3600)).unwrap();
        let verifier = PinnedPeers::new(vec![other.fingerprint, peer.fingerprint], provider());
        let cert = der(&peer.cert_pem);

        verifier.check(&cert, at(1_700_000_000)).unwrap();
        verifier.check(&cert, at(1_700_001_000)).unwrap();
        let err = verifier.check(&cert, at(1_700_001_001)).unwrap_err();
        assert!(
            matches!(
                err,
                rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { .. })
            ),
            "{err}"
        );
        let err = verifier.check(&cert, at(1_699_999_999)).unwrap_err();
        assert!(
            matches!(
                err,
                rustls::Error::InvalidCertificate(CertificateError::NotValidYetContext { .. })
            ),
            "{err}"
        );

        let stranger = PinnedPeers::new(vec![other.fingerprint], provider());
        let err = stranger.check(&cert, at(1_700_000_000)).unwrap_err();
        let rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(inner))) = &err
        else {
            panic!("unexpected error {err:?}");
        };
        assert_eq!(
            inner.downcast_ref::<UnknownPeerKey>(),
            Some(&UnknownPeerKey(peer.fingerprint))
        );
        assert!(
            err.to_string().contains(&peer.fingerprint.to_string()),
            "{err}"
        );
    }

    #[test]
    fn rejects_garbage_certificate() {
        let verifier = PinnedPeers::new(Vec::new(), provider());
        let err = verifier
            .check(&CertificateDer::from(vec![1, 2, 3]), at(0))
            .unwrap_err();
        assert_eq!(
            err,
            rustls::Error::InvalidCertificate(CertificateError::BadEncoding)
        );
    }
}
