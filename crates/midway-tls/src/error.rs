//! [`TlsError`]: what can go wrong loading, generating or writing an identity, or building a
//! TLS config, worded for the operator who has to fix it.

use std::io;
use std::path::PathBuf;

use crate::fingerprint::CertificateParseError;

/// An error loading, generating or writing a peer identity, or building a TLS config.
///
/// Each message names the file concerned (or `<in-memory PEM>` for identities parsed from
/// strings) and, where there is one, what to do.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A PEM file is malformed (an unterminated section, bad base64).
    #[error("{} is not valid PEM: {message}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What the PEM parser found.
        message: String,
    },
    /// The certificate file holds no certificate.
    #[error("{} holds no certificate (expected one \"-----BEGIN CERTIFICATE-----\" block, as `midway peer keygen` writes to peer.crt)", path.display())]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The certificate file holds more than one certificate.
    #[error("{} holds {count} certificates; a midway peer identity is exactly one self-signed certificate", path.display())]
    TooManyCertificates {
        /// The file.
        path: PathBuf,
        /// How many it holds.
        count: usize,
    },
    /// The key file holds no private key.
    #[error("{} holds no private key (expected one \"-----BEGIN PRIVATE KEY-----\" block, as `midway peer keygen` writes to peer.key)", path.display())]
    NoPrivateKey {
        /// The file.
        path: PathBuf,
    },
    /// The key file holds more than one private key.
    #[error("{} holds {count} private keys; a midway peer identity has exactly one", path.display())]
    TooManyPrivateKeys {
        /// The file.
        path: PathBuf,
        /// How many it holds.
        count: usize,
    },
    /// The certificate does not parse as X.509.
    #[error("{}: {source}", path.display())]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// What the parser found.
        source: CertificateParseError,
    },
    /// The private key is of a kind the crypto provider cannot sign with.
    #[error("{}: unusable private key ({source}); use an ECDSA P-256/P-384, Ed25519 or RSA key, e.g. from `midway peer keygen`", path.display())]
    UnsupportedKey {
        /// The key file.
        path: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
    /// The private key does not belong to the certificate.
    #[error("the private key in {} does not belong to the certificate in {} (files of two different identities?)", key_path.display(), cert_path.display())]
    KeyMismatch {
        /// The certificate file.
        cert_path: PathBuf,
        /// The key file.
        key_path: PathBuf,
    },
    /// The certificate's validity period has ended.
    #[error("the certificate in {} expired at {not_after} (Unix time {not_after_unix}); renew it with the same key (the peers' pins stay valid) or generate a new identity with `midway peer keygen` and update the peers' pins", path.display())]
    Expired {
        /// The certificate file.
        path: PathBuf,
        /// notAfter, RFC 3339.
        not_after: String,
        /// notAfter, seconds since the Unix epoch.
        not_after_unix: i64,
    },
    /// A TLS config was asked for with an empty list of peer fingerprints: it would refuse
    /// every peer.
    #[error("no peer fingerprints configured: list the fingerprint of each peer to accept (the other side's `midway peer keygen` printed it)")]
    NoPeers,
    /// The identity's parameters are unusable (an empty common name, a validity period that
    /// ends before it starts).
    #[error("cannot generate a peer identity: {0}")]
    InvalidParameters(String),
    /// rcgen failed to generate the key or certificate.
    #[error("cannot generate a peer identity: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file to write exists already.
    #[error("{} exists already; not overwriting an identity (move it away first, or choose another directory)", path.display())]
    AlreadyExists {
        /// The file.
        path: PathBuf,
    },
    /// A file or directory could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// rustls refused to build the config.
    #[error("cannot build the TLS config: {0}")]
    Rustls(#[from] rustls::Error),
}
