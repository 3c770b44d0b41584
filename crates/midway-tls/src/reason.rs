//! Classifying a failed peer handshake for metrics and logs.

use std::io;

use rustls::{AlertDescription, CertificateError};

use crate::fingerprint::Fingerprint;
use crate::verify::UnknownPeerKey;

/// Every value [`refusal_reason`] and [`tls_refusal_reason`] return, to register a metric's
/// label values up front.
pub const REFUSAL_REASONS: &[&str] = &[
    "unknown_peer",
    "expired",
    "bad_certificate",
    "no_certificate",
    "rejected_by_peer",
    "expired_at_peer",
    "alpn_mismatch",
    "incompatible",
    "not_tls",
    "closed",
    "timeout",
    "other",
];

/// Why a peer handshake (or the first read after it) failed, as a short label for a metric or
/// log field, from the I/O error tokio-rustls returned (it wraps the `rustls::Error` in an
/// `io::Error` of kind `InvalidData`):
///
/// * `unknown_peer`: this side refused the peer's key: its fingerprint is not pinned
///   ([`unknown_peer_fingerprint`] gives it).
/// * `expired`: this side refused the peer's certificate: expired, or not valid yet (a clock
///   off by more than the hour a generated certificate is backdated).
/// * `bad_certificate`: this side refused an unparsable certificate or a bad handshake
///   signature.
/// * `no_certificate`: the client presented no certificate (seen by the server; the client
///   sees it as the server's `certificate_required` alert).
/// * `rejected_by_peer`: the peer refused this side's certificate, typically because this
///   side's key is not in its list (an alert received: `certificate_unknown`, `unknown_ca`,
///   `bad_certificate`, `access_denied`, `unsupported_certificate`).
/// * `expired_at_peer`: the peer refused this side's certificate as expired or not yet valid
///   (alert `certificate_expired`): renew it, or check the clocks.
/// * `alpn_mismatch`: the other end speaks TLS but not the midway peer protocol.
/// * `incompatible`: no common TLS version, cipher suite or signature scheme.
/// * `not_tls`: the other end sent something that is not TLS.
/// * `closed`: the connection was closed or reset during the handshake.
/// * `timeout`: an I/O error of kind `TimedOut` (turn a `tokio::time::timeout` elapsing into
///   one to count it here).
/// * `other`: anything else.
///
/// In TLS 1.3 the client's handshake completes before the server has checked the client's
/// certificate, so a server that refuses the client shows on the client at its first read (as
/// `rejected_by_peer`, `expired_at_peer` or `no_certificate`), or as `closed` if the server
/// reset the connection over data it never read.
pub fn refusal_reason(err: &io::Error) -> &'static str {
    if let Some(tls) = rustls_error(err) {
        return tls_refusal_reason(tls);
    }
    match err.kind() {
        io::ErrorKind::TimedOut => "timeout",
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => "closed",
        _ => "other",
    }
}

/// [`refusal_reason`] of a `rustls::Error` itself.
pub fn tls_refusal_reason(err: &rustls::Error) -> &'static str {
    use rustls::Error;
    match err {
        Error::InvalidCertificate(CertificateError::Other(other))
            if other.0.downcast_ref::<UnknownPeerKey>().is_some() =>
        {
            "unknown_peer"
        }
        Error::InvalidCertificate(CertificateError::UnknownIssuer) => "unknown_peer",
        Error::InvalidCertificate(
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. },
        ) => "expired",
        Error::InvalidCertificate(_) => "bad_certificate",
        Error::NoCertificatesPresented => "no_certificate",
        Error::NoApplicationProtocol => "alpn_mismatch",
        Error::PeerIncompatible(_) => "incompatible",
        Error::InvalidMessage(_) => "not_tls",
        Error::AlertReceived(alert) => match alert {
            AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::AccessDenied
            | AlertDescription::UnsupportedCertificate => "rejected_by_peer",
            AlertDescription::CertificateExpired => "expired_at_peer",
            AlertDescription::CertificateRequired => "no_certificate",
            AlertDescription::NoApplicationProtocol => "alpn_mismatch",
            AlertDescription::ProtocolVersion
            | AlertDescription::HandshakeFailure
            | AlertDescription::InsufficientSecurity => "incompatible",
            AlertDescription::DecodeError | AlertDescription::UnexpectedMessage => "not_tls",
            _ => "other",
        },
        _ => "other",
    }
}

/// The fingerprint of the key this side refused, if `err` is an `unknown_peer` refusal: the
/// value to add to the config if that peer should be accepted.
pub fn unknown_peer_fingerprint(err: &io::Error) -> Option<Fingerprint> {
    match rustls_error(err)? {
        rustls::Error::InvalidCertificate(CertificateError::Other(other)) => other
            .0
            .downcast_ref::<UnknownPeerKey>()
            .map(|unknown| unknown.0),
        _ => None,
    }
}

/// The `rustls::Error` inside an I/O error from tokio-rustls, if any.
fn rustls_error(err: &io::Error) -> Option<&rustls::Error> {
    err.get_ref()?.downcast_ref::<rustls::Error>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrap(err: rustls::Error) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, err)
    }

    #[test]
    fn classifies_wrapped_and_plain_errors() {
        let expired = rustls::Error::InvalidCertificate(CertificateError::Expired);
        assert_eq!(refusal_reason(&wrap(expired)), "expired");
        let alert = rustls::Error::AlertReceived(AlertDescription::CertificateUnknown);
        assert_eq!(refusal_reason(&wrap(alert)), "rejected_by_peer");
        let alert = rustls::Error::AlertReceived(AlertDescription::CertificateExpired);
        assert_eq!(refusal_reason(&wrap(alert)), "expired_at_peer");
        assert_eq!(
            refusal_reason(&wrap(rustls::Error::NoApplicationProtocol)),
            "alpn_mismatch"
        );
        assert_eq!(
            refusal_reason(&io::Error::from(io::ErrorKind::TimedOut)),
            "timeout"
        );
        assert_eq!(
            refusal_reason(&io::Error::from(io::ErrorKind::UnexpectedEof)),
            "closed"
        );
        assert_eq!(refusal_reason(&io::Error::other("something")), "other");
        assert_eq!(
            unknown_peer_fingerprint(&io::Error::other("something")),
            None
        );
    }

    #[test]
    fn every_reason_is_listed() {
        let errors = [
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
            rustls::Error::InvalidCertificate(CertificateError::NotValidYet),
            rustls::Error::InvalidCertificate(CertificateError::BadEncoding),
            rustls::Error::NoCertificatesPresented,
            rustls::Error::AlertReceived(AlertDescription::UnknownCA),
            rustls::Error::AlertReceived(AlertDescription::CertificateExpired),
            rustls::Error::AlertReceived(AlertDescription::HandshakeFailure),
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
            rustls::Error::General("x".to_owned()),
        ];
        for err in &errors {
            let reason = tls_refusal_reason(err);
            assert!(REFUSAL_REASONS.contains(&reason), "{reason} ({err})");
        }
    }
}
