//! Generating, writing and loading identities, and the errors an operator sees.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;

use crate::*;

const DAY: Duration = Duration::from_secs(86_400);

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn write(dir: &Path, name: &str, contents: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn generated_certificate_has_pinned_key_names_and_validity() {
    let generated = generate_identity("edge-1.example", 30 * DAY).unwrap();
    let now = SystemTime::now();
    let der = CertificateDer::from_pem_slice(generated.cert_pem.as_bytes()).unwrap();
    assert_eq!(
        Fingerprint::of_certificate(&der).unwrap(),
        generated.fingerprint
    );

    let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
    let names: Vec<String> = cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|name| match name {
            GeneralName::DNSName(dns) => dns.to_string(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(names, [SERVER_NAME, "edge-1.example"]);
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .unwrap()
        .as_str()
        .unwrap();
    assert_eq!(cn, "edge-1.example");
    assert!(!cert.is_ca());
    assert!(generated.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));

    let identity = generated.identity().unwrap();
    assert_eq!(identity.fingerprint(), generated.fingerprint);
    let near = |a: SystemTime, b: SystemTime| {
        let gap = a
            .duration_since(b)
            .or_else(|_| b.duration_since(a))
            .unwrap();
        assert!(gap < Duration::from_secs(120), "{a:?} vs {b:?}");
    };
    near(identity.not_after(), now + 30 * DAY);
    near(identity.not_before(), now - Duration::from_secs(3600));

    let debug = format!("{identity:?} {generated:?}");
    assert!(
        debug.contains(&generated.fingerprint.to_string()),
        "{debug}"
    );
    assert!(!debug.contains("PRIVATE"), "{debug}");
}

#[test]
fn each_generation_has_its_own_key() {
    let a = generate_identity("edge", DAY).unwrap();
    let b = generate_identity("edge", DAY).unwrap();
    assert_ne!(a.fingerprint, b.fingerprint);
}

#[test]
fn generation_refuses_bad_parameters() {
    let err = generate_identity("", DAY).unwrap_err();
    assert!(err.to_string().contains("common name is empty"), "{err}");
    let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let err = generate_identity_with_validity("edge", start, start).unwrap_err();
    assert!(err.to_string().contains("ends before it starts"), "{err}");
    assert!(generate_identity("edge", Duration::MAX).is_err());
}

#[test]
fn write_then_load_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("identity");
    let generated = generate_identity("gateway", DAY).unwrap();
    let paths = write_identity(&out, &generated).unwrap();
    assert_eq!(paths.cert, out.join(CERT_FILE));
    assert_eq!(paths.key, out.join(KEY_FILE));
    assert_eq!(mode(&paths.key), 0o600);
    assert_eq!(mode(&paths.cert), 0o644);
    let identity = Identity::load(&paths.cert, &paths.key).unwrap();
    assert_eq!(identity.fingerprint(), generated.fingerprint);
}

#[test]
fn write_identity_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let first = generate_identity("edge", DAY).unwrap();
    let paths = write_identity(dir.path(), &first).unwrap();
    let second = generate_identity("edge", DAY).unwrap();
    let err = write_identity(dir.path(), &second).unwrap_err();
    assert!(
        matches!(&err, TlsError::AlreadyExists { path } if *path == paths.key),
        "{err}"
    );
    assert!(err.to_string().contains("not overwriting"), "{err}");
    assert_eq!(std::fs::read_to_string(&paths.key).unwrap(), first.key_pem);
    assert_eq!(
        std::fs::read_to_string(&paths.cert).unwrap(),
        first.cert_pem
    );
    assert_eq!(mode(&paths.key), 0o600);

    // A certificate alone also blocks, and no key is left behind.
    let other = tempfile::tempdir().unwrap();
    let cert = write(other.path(), CERT_FILE, "old");
    let err = write_identity(other.path(), &second).unwrap_err();
    assert!(
        matches!(&err, TlsError::AlreadyExists { path } if *path == cert),
        "{err}"
    );
    assert!(!other.path().join(KEY_FILE).exists());
}

#[test]
fn load_missing_file_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let generated = generate_identity("edge", DAY).unwrap();
    let key = write(dir.path(), "peer.key", &generated.key_pem);
    let missing = dir.path().join("nope.crt");
    let err = Identity::load(&missing, &key).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, TlsError::Read { .. }));
    assert!(
        message.contains(&format!("cannot read {}", missing.display())),
        "{message}"
    );
}

#[test]
fn load_key_of_another_certificate_is_a_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        generate_identity("a", DAY).unwrap(),
        generate_identity("b", DAY).unwrap(),
    );
    let cert = write(dir.path(), "a.crt", &a.cert_pem);
    let key = write(dir.path(), "b.key", &b.key_pem);
    let err = Identity::load(&cert, &key).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, TlsError::KeyMismatch { .. }), "{message}");
    assert!(message.contains("does not belong"), "{message}");
    assert!(
        message.contains("a.crt") && message.contains("b.key"),
        "{message}"
    );
}

#[test]
fn load_garbage_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let generated = generate_identity("edge", DAY).unwrap();
    let good_cert = write(dir.path(), "good.crt", &generated.cert_pem);
    let good_key = write(dir.path(), "good.key", &generated.key_pem);

    let garbage = write(dir.path(), "garbage.pem", "this is not PEM at all\n");
    let message = Identity::load(&garbage, &good_key).unwrap_err().to_string();
    assert!(
        message.contains("garbage.pem holds no certificate"),
        "{message}"
    );
    let message = Identity::load(&good_cert, &garbage)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("garbage.pem holds no private key"),
        "{message}"
    );

    // Swapped files: the key file holds no certificate.
    let message = Identity::load(&good_key, &good_cert)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("good.key holds no certificate"),
        "{message}"
    );

    let unterminated = write(dir.path(), "cut.crt", "-----BEGIN CERTIFICATE-----\nMIIB\n");
    let err = Identity::load(&unterminated, &good_key).unwrap_err();
    assert!(matches!(err, TlsError::Pem { .. }), "{err}");
    assert!(
        err.to_string().contains("cut.crt is not valid PEM"),
        "{err}"
    );

    let bad_base64 = write(
        dir.path(),
        "b64.crt",
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    );
    let err = Identity::load(&bad_base64, &good_key).unwrap_err();
    assert!(matches!(err, TlsError::Pem { .. }), "{err}");

    let not_der = write(
        dir.path(),
        "der.crt",
        "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n",
    );
    let err = Identity::load(&not_der, &good_key).unwrap_err();
    assert!(matches!(err, TlsError::BadCertificate { .. }), "{err}");
    assert!(
        err.to_string().contains("not an X.509 certificate"),
        "{err}"
    );

    let two = write(
        dir.path(),
        "two.crt",
        &format!("{}{}", generated.cert_pem, generated.cert_pem),
    );
    let message = Identity::load(&two, &good_key).unwrap_err().to_string();
    assert!(
        message.contains("two.crt holds 2 certificates"),
        "{message}"
    );
}

#[test]
fn load_refuses_expired_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let now = SystemTime::now();
    let generated = generate_identity_with_validity("edge", now - 10 * DAY, now - DAY).unwrap();
    let cert = write(dir.path(), "old.crt", &generated.cert_pem);
    let key = write(dir.path(), "old.key", &generated.key_pem);
    let err = Identity::load(&cert, &key).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, TlsError::Expired { .. }), "{message}");
    assert!(message.contains("old.crt expired at"), "{message}");
}

#[test]
fn certificate_renewed_with_same_key_keeps_fingerprint() {
    // The pin is the SubjectPublicKeyInfo: a second certificate for the same key has the same
    // fingerprint although its bytes differ.
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let certify = |days: i64| {
        let mut params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_owned()]).unwrap();
        params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(days);
        params.self_signed(&key).unwrap()
    };
    let (old, new) = (certify(1), certify(365));
    assert_ne!(old.der(), new.der());
    assert_eq!(
        Fingerprint::of_certificate(old.der()).unwrap(),
        Fingerprint::of_certificate(new.der()).unwrap()
    );
}
