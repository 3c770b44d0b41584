//! Generating a peer identity (a key pair and its self-signed certificate) and writing it to
//! disk: what `midway peer keygen --out DIR` does.

use std::fmt;
use std::fs::{OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair,
    KeyUsagePurpose, PublicKeyData, SerialNumber,
};
use sha2::{Digest, Sha256};

use crate::error::TlsError;
use crate::fingerprint::{unix_seconds, Fingerprint};
use crate::identity::Identity;
use crate::SERVER_NAME;

/// The certificate file [`write_identity`] writes in its directory.
pub const CERT_FILE: &str = "peer.crt";
/// The private key file [`write_identity`] writes in its directory.
pub const KEY_FILE: &str = "peer.key";

/// How far before "now" a generated certificate's validity starts, so that a peer whose clock
/// is somewhat behind accepts it at once.
const BACKDATE: Duration = Duration::from_secs(3600);

/// A freshly generated identity, in the PEM text [`Identity::load`] reads back.
#[derive(Clone)]
pub struct GeneratedIdentity {
    /// The self-signed certificate, PEM (`-----BEGIN CERTIFICATE-----`).
    pub cert_pem: String,
    /// The private key, PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`). A secret.
    pub key_pem: String,
    /// The key's fingerprint: what the other midways list to accept this one.
    pub fingerprint: Fingerprint,
}

impl GeneratedIdentity {
    /// The generated identity as an [`Identity`], without a round trip through files.
    pub fn identity(&self) -> Result<Identity, TlsError> {
        Identity::from_pem(&self.cert_pem, &self.key_pem)
    }
}

impl fmt::Debug for GeneratedIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GeneratedIdentity")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// Generates a peer identity: a new ECDSA P-256 key and a self-signed certificate for it, valid
/// from an hour ago (for peers whose clocks are behind) until `valid_for` from now.
///
/// The certificate's subject common name is `common_name` (a label for people: the peers pin
/// the key, not a name); its subjectAltName holds the DNS name [`SERVER_NAME`] and
/// `common_name` (as a DNS name, or an IP address if it parses as one). Its key usage is
/// digitalSignature, for TLS server and client authentication; it is not a CA.
///
/// Fails on an empty or non-ASCII `common_name` and on a `valid_for` too large for X.509 dates.
pub fn generate_identity(
    common_name: &str,
    valid_for: Duration,
) -> Result<GeneratedIdentity, TlsError> {
    let now = SystemTime::now();
    let not_after = now.checked_add(valid_for).ok_or_else(|| {
        TlsError::InvalidParameters(format!("validity of {valid_for:?} is too long"))
    })?;
    let not_before = now.checked_sub(BACKDATE).unwrap_or(now);
    generate_identity_with_validity(common_name, not_before, not_after)
}

/// [`generate_identity`] with an explicit validity period, `not_before` to `not_after`
/// (stored at whole seconds). A period in the past makes an expired certificate, for tests.
pub fn generate_identity_with_validity(
    common_name: &str,
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<GeneratedIdentity, TlsError> {
    if common_name.is_empty() {
        return Err(TlsError::InvalidParameters(
            "the common name is empty".to_owned(),
        ));
    }
    if not_after <= not_before {
        return Err(TlsError::InvalidParameters(
            "the validity period ends before it starts".to_owned(),
        ));
    }
    let (not_before_unix, not_after_unix) = (unix_seconds(not_before), unix_seconds(not_after));
    let x509_time = |seconds: i64| {
        time::OffsetDateTime::from_unix_timestamp(seconds).map_err(|err| {
            TlsError::InvalidParameters(format!("validity date out of range: {err}"))
        })
    };

    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut names = vec![SERVER_NAME.to_owned()];
    if common_name != SERVER_NAME {
        names.push(common_name.to_owned());
    }
    let mut params = CertificateParams::new(names)?;
    let mut subject = DistinguishedName::new();
    subject.push(DnType::CommonName, common_name);
    params.distinguished_name = subject;
    params.not_before = x509_time(not_before_unix)?;
    params.not_after = x509_time(not_after_unix)?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    // rcgen's default serial is a hash of the key alone; a renewal with the same key would
    // reuse it. Hash the validity period in too, so that each certificate has its own.
    let mut serial = Sha256::new();
    serial.update(key.subject_public_key_info());
    serial.update(not_before_unix.to_be_bytes());
    serial.update(not_after_unix.to_be_bytes());
    let mut serial = serial.finalize()[..20].to_vec();
    serial[0] &= 0x7f; // positive, so it fits RFC 5280's 20 octets
    params.serial_number = Some(SerialNumber::from(serial));

    let cert = params.self_signed(&key)?;
    Ok(GeneratedIdentity {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        fingerprint: Fingerprint::of_spki(&key.subject_public_key_info()),
    })
}

/// The files [`write_identity`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityPaths {
    /// The certificate, `DIR/peer.crt`.
    pub cert: PathBuf,
    /// The private key, `DIR/peer.key`.
    pub key: PathBuf,
}

/// Writes `identity` to `dir` (created if missing): the certificate to [`CERT_FILE`] (mode
/// 0644) and the private key to [`KEY_FILE`] (created with mode 0600, so it is never readable
/// by others, not even briefly).
///
/// Refuses to overwrite: if either file exists, nothing is written and the error names it.
/// If the certificate cannot be written after the key was, the key is removed again.
pub fn write_identity(
    dir: impl AsRef<Path>,
    identity: &GeneratedIdentity,
) -> Result<IdentityPaths, TlsError> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let paths = IdentityPaths {
        cert: dir.join(CERT_FILE),
        key: dir.join(KEY_FILE),
    };
    for path in [&paths.key, &paths.cert] {
        if path.symlink_metadata().is_ok() {
            return Err(TlsError::AlreadyExists { path: path.clone() });
        }
    }
    write_new(&paths.key, identity.key_pem.as_bytes(), 0o600)?;
    if let Err(err) = write_new(&paths.cert, identity.cert_pem.as_bytes(), 0o644) {
        // Best effort: a lone key is useless, and would make the next attempt refuse.
        let _ = std::fs::remove_file(&paths.key);
        return Err(err);
    }
    Ok(paths)
}

/// Creates `path` (which must not exist) with `mode`, writes `contents` and syncs it; removes
/// the file again if writing fails.
fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), TlsError> {
    let mut file = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
    {
        Ok(file) => file,
        Err(source) if source.kind() == io::ErrorKind::AlreadyExists => {
            return Err(TlsError::AlreadyExists {
                path: path.to_owned(),
            })
        }
        Err(source) => {
            return Err(TlsError::Write {
                path: path.to_owned(),
                source,
            })
        }
    };
    let mut fill = || -> io::Result<()> {
        // The umask may have taken bits off; set exactly `mode`.
        file.set_permissions(Permissions::from_mode(mode))?;
        file.write_all(contents)?;
        file.sync_all()
    };
    fill().map_err(|source| {
        let _ = std::fs::remove_file(path);
        TlsError::Write {
            path: path.to_owned(),
            source,
        }
    })
}
