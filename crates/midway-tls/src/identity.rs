//! [`Identity`]: this midway's certificate and private key, loaded from PEM files and checked.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::InconsistentKeys;

use crate::config::provider;
use crate::error::TlsError;
use crate::fingerprint::{
    system_time, unix_seconds, CertInfo, CertificateParseError, Fingerprint, Validity,
};

/// The name of identities parsed from strings, in error messages.
const IN_MEMORY: &str = "<in-memory PEM>";

/// This midway's peer identity: one self-signed certificate and its private key.
///
/// Built by [`Identity::load`] (or [`Identity::from_pem`]), which checks that the key belongs
/// to the certificate and that the certificate has not expired; handed to
/// [`client_config`](crate::client_config) and [`server_config`](crate::server_config).
/// `Debug` shows the fingerprint and validity, never the key.
pub struct Identity {
    /// The certificate, DER.
    cert: CertificateDer<'static>,
    /// The private key, DER.
    key: PrivateKeyDer<'static>,
    /// The certificate's fingerprint and validity.
    info: CertInfo,
}

impl Identity {
    /// Loads the identity from a PEM certificate file (exactly one certificate) and a PEM
    /// private key file (exactly one PKCS#8, SEC1 or PKCS#1 key), as `midway peer keygen`
    /// writes them (`peer.crt`, `peer.key`).
    ///
    /// Fails, naming the file, if either cannot be read or parsed, if the key does not belong to
    /// the certificate, or if the certificate has already expired.
    pub fn load(
        cert_path: impl AsRef<Path>,
        key_path: impl AsRef<Path>,
    ) -> Result<Identity, TlsError> {
        let (cert_path, key_path) = (cert_path.as_ref(), key_path.as_ref());
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let (cert_pem, key_pem) = (read(cert_path)?, read(key_path)?);
        Identity::parse(&cert_pem, cert_path, &key_pem, key_path, SystemTime::now())
    }

    /// The identity from PEM text, with the checks of [`Identity::load`]; errors name the
    /// source `<in-memory PEM>`.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Identity, TlsError> {
        Identity::from_pem_at(cert_pem, key_pem, SystemTime::now())
    }

    /// [`Identity::from_pem`] with the expiry checked at `now` (tests build identities that are
    /// expired today by checking them at a time they were valid).
    pub(crate) fn from_pem_at(
        cert_pem: &str,
        key_pem: &str,
        now: SystemTime,
    ) -> Result<Identity, TlsError> {
        let in_memory = Path::new(IN_MEMORY);
        Identity::parse(
            cert_pem.as_bytes(),
            in_memory,
            key_pem.as_bytes(),
            in_memory,
            now,
        )
    }

    /// Parses and checks the PEM contents of the two files.
    fn parse(
        cert_pem: &[u8],
        cert_path: &Path,
        key_pem: &[u8],
        key_path: &Path,
        now: SystemTime,
    ) -> Result<Identity, TlsError> {
        let mut certs = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| pem_error(cert_path, err))?;
        let cert = match certs.len() {
            0 => {
                return Err(TlsError::NoCertificate {
                    path: cert_path.to_owned(),
                })
            }
            1 => certs.remove(0),
            count => {
                return Err(TlsError::TooManyCertificates {
                    path: cert_path.to_owned(),
                    count,
                })
            }
        };
        let mut keys = PrivateKeyDer::pem_slice_iter(key_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| pem_error(key_path, err))?;
        let key = match keys.len() {
            0 => {
                return Err(TlsError::NoPrivateKey {
                    path: key_path.to_owned(),
                })
            }
            1 => keys.remove(0),
            count => {
                return Err(TlsError::TooManyPrivateKeys {
                    path: key_path.to_owned(),
                    count,
                })
            }
        };
        let info = CertInfo::parse(&cert).map_err(|source| TlsError::BadCertificate {
            path: cert_path.to_owned(),
            source,
        })?;

        let signing_key = provider()
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|source| TlsError::UnsupportedKey {
                path: key_path.to_owned(),
                source,
            })?;
        match CertifiedKey::new(vec![cert.clone()], signing_key).keys_match() {
            // Unknown: the provider cannot derive the public key from this kind of private key;
            // the handshake's signatures will tell.
            Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => {
                return Err(TlsError::KeyMismatch {
                    cert_path: cert_path.to_owned(),
                    key_path: key_path.to_owned(),
                })
            }
            Err(other) => {
                return Err(TlsError::BadCertificate {
                    path: cert_path.to_owned(),
                    source: CertificateParseError::new(other.to_string()),
                })
            }
        }

        if info.validity_at(unix_seconds(now)) == Validity::Expired {
            return Err(TlsError::Expired {
                path: cert_path.to_owned(),
                not_after: rfc3339(info.not_after),
                not_after_unix: info.not_after,
            });
        }
        Ok(Identity { cert, key, info })
    }

    /// The fingerprint of this identity's key: what the peers list to accept this midway.
    pub fn fingerprint(&self) -> Fingerprint {
        self.info.fingerprint
    }

    /// The start of the certificate's validity period.
    pub fn not_before(&self) -> SystemTime {
        system_time(self.info.not_before)
    }

    /// The end of the certificate's validity period: after it, peers refuse this midway (and
    /// [`Identity::load`] refuses the files). Worth a warning some weeks before.
    pub fn not_after(&self) -> SystemTime {
        system_time(self.info.not_after)
    }

    /// The certificate, DER-encoded.
    pub fn certificate_der(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// A copy of the private key, for a rustls config.
    pub(crate) fn private_key_der(&self) -> PrivateKeyDer<'static> {
        self.key.clone_key()
    }
}

impl Clone for Identity {
    fn clone(&self) -> Identity {
        Identity {
            cert: self.cert.clone(),
            key: self.key.clone_key(),
            info: self.info,
        }
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("fingerprint", &self.info.fingerprint)
            .field("not_before", &rfc3339(self.info.not_before))
            .field("not_after", &rfc3339(self.info.not_after))
            .finish_non_exhaustive()
    }
}

/// A PEM parse error as [`TlsError`], readable (the parser's own `Display` prints byte arrays).
fn pem_error(path: &Path, err: pem::Error) -> TlsError {
    let message = match err {
        pem::Error::MissingSectionEnd { end_marker } => {
            format!(
                "a section has no {:?} line",
                String::from_utf8_lossy(&end_marker)
            )
        }
        pem::Error::IllegalSectionStart { line } => {
            format!(
                "malformed section start line {:?}",
                String::from_utf8_lossy(&line)
            )
        }
        other => other.to_string(),
    };
    TlsError::Pem {
        path: PathBuf::from(path),
        message,
    }
}

/// Seconds since the epoch in RFC 3339 (UTC), or the number if out of range.
pub(crate) fn rfc3339(unix_seconds: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix_seconds)
        .ok()
        .and_then(|time| {
            time.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{unix_seconds} s after the Unix epoch"))
}
