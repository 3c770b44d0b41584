//! [`Fingerprint`]: the SHA-256 of a certificate's SubjectPublicKeyInfo, the pin a midway lists
//! for each peer it accepts; and the parse of the few certificate fields the crate looks at.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

/// The prefix of a fingerprint's text form.
const PREFIX: &str = "sha256:";
/// Number of hex digits after the prefix.
const HEX_DIGITS: usize = 64;

/// The SHA-256 of a certificate's DER-encoded SubjectPublicKeyInfo (the algorithm and the public
/// key), as `openssl x509 -pubkey -noout | openssl pkey -pubin -outform der | sha256sum` prints
/// it.
///
/// It pins the key, not the certificate: a certificate renewed with the same key (a new
/// validity period) keeps its fingerprint, so the peers' configs need not change.
///
/// Text form (`Display`, `FromStr`): `sha256:` and 64 lowercase hex digits. Parsing also
/// accepts uppercase digits; it accepts no separators and no surrounding whitespace.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a DER-encoded SubjectPublicKeyInfo.
    pub fn of_spki(spki_der: &[u8]) -> Fingerprint {
        Fingerprint(Sha256::digest(spki_der).into())
    }

    /// The fingerprint of the key in a DER-encoded X.509 certificate.
    ///
    /// Fails if the DER is not a certificate; the error says what the parser found wrong.
    pub fn of_certificate(cert_der: &[u8]) -> Result<Fingerprint, CertificateParseError> {
        CertInfo::parse(cert_der).map(|info| info.fingerprint)
    }

    /// The 32 bytes of the digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The fingerprint with these 32 digest bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Fingerprint {
        Fingerprint(bytes)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PREFIX)?;
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Why a text is not a [`Fingerprint`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseFingerprintError {
    /// The text does not start with `sha256:`.
    #[error(
        "a peer fingerprint starts with \"sha256:\" (as `midway peer keygen` prints it); got {0:?}"
    )]
    MissingPrefix(String),
    /// The wrong number of characters after the prefix.
    #[error("a peer fingerprint has 64 hex digits after \"sha256:\"; this one has {found}")]
    WrongLength {
        /// Characters found after the prefix.
        found: usize,
    },
    /// A character after the prefix that is not a hex digit.
    #[error("a peer fingerprint has only hex digits after \"sha256:\"; found {character:?} at digit {position}")]
    NotHex {
        /// 1-based position among the digits after the prefix.
        position: usize,
        /// The offending character.
        character: char,
    },
}

impl FromStr for Fingerprint {
    type Err = ParseFingerprintError;

    fn from_str(text: &str) -> Result<Fingerprint, ParseFingerprintError> {
        let Some(hex) = text.strip_prefix(PREFIX) else {
            return Err(ParseFingerprintError::MissingPrefix(text.to_owned()));
        };
        if let Some((index, character)) = hex
            .chars()
            .enumerate()
            .find(|(_, c)| !c.is_ascii_hexdigit())
        {
            return Err(ParseFingerprintError::NotHex {
                position: index + 1,
                character,
            });
        }
        // All ASCII from here, so bytes are characters.
        if hex.len() != HEX_DIGITS {
            return Err(ParseFingerprintError::WrongLength { found: hex.len() });
        }
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
            *byte = (hex_value(pair[0]) << 4) | hex_value(pair[1]);
        }
        Ok(Fingerprint(bytes))
    }
}

/// The value of an ASCII hex digit (the caller checked it is one).
fn hex_value(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        b'a'..=b'f' => digit - b'a' + 10,
        b'A'..=b'F' => digit - b'A' + 10,
        _ => 0,
    }
}

/// A DER blob that is not an X.509 certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an X.509 certificate: {0}")]
pub struct CertificateParseError(String);

impl CertificateParseError {
    /// An error with this description.
    pub(crate) fn new(description: String) -> CertificateParseError {
        CertificateParseError(description)
    }
}

/// What the crate reads from a certificate: the key's fingerprint and the validity period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CertInfo {
    /// SHA-256 of the SubjectPublicKeyInfo.
    pub(crate) fingerprint: Fingerprint,
    /// notBefore, seconds since the Unix epoch.
    pub(crate) not_before: i64,
    /// notAfter, seconds since the Unix epoch.
    pub(crate) not_after: i64,
}

impl CertInfo {
    /// Parses a DER certificate (nothing may follow it).
    pub(crate) fn parse(cert_der: &[u8]) -> Result<CertInfo, CertificateParseError> {
        let (rest, cert) = x509_parser::parse_x509_certificate(cert_der)
            .map_err(|err| CertificateParseError(err.to_string()))?;
        if !rest.is_empty() {
            return Err(CertificateParseError(format!(
                "{} bytes after the certificate",
                rest.len()
            )));
        }
        let validity = cert.validity();
        Ok(CertInfo {
            fingerprint: Fingerprint::of_spki(cert.public_key().raw),
            not_before: validity.not_before.timestamp(),
            not_after: validity.not_after.timestamp(),
        })
    }

    /// Where `now` (seconds since the epoch) stands against the validity period (inclusive at
    /// both ends, RFC 5280 4.1.2.5).
    pub(crate) fn validity_at(&self, now: i64) -> Validity {
        if now < self.not_before {
            Validity::NotYetValid
        } else if now > self.not_after {
            Validity::Expired
        } else {
            Validity::Valid
        }
    }
}

/// A certificate's validity at some time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Validity {
    /// Before notBefore.
    NotYetValid,
    /// Within the period.
    Valid,
    /// After notAfter.
    Expired,
}

/// Seconds since the epoch as a `SystemTime` (negative: before the epoch).
pub(crate) fn system_time(unix_seconds: i64) -> SystemTime {
    let magnitude = Duration::from_secs(unix_seconds.unsigned_abs());
    if unix_seconds >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// A `SystemTime` as seconds since the epoch (whole seconds, towards the past).
pub(crate) fn unix_seconds(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
        Err(before) => {
            let before = before.duration();
            let whole = i64::try_from(before.as_secs()).unwrap_or(i64::MAX);
            if before.subsec_nanos() > 0 {
                -whole - 1
            } else {
                -whole
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    #[test]
    fn parse_print_round_trip() {
        let fingerprint: Fingerprint = SAMPLE.parse().unwrap();
        assert_eq!(fingerprint.as_bytes()[1], 0x11);
        assert_eq!(fingerprint.as_bytes()[31], 0xff);
        assert_eq!(fingerprint.to_string(), SAMPLE);
        assert_eq!(
            Fingerprint::from_bytes(*fingerprint.as_bytes()),
            fingerprint
        );
        assert_eq!(format!("{fingerprint:?}"), format!("Fingerprint({SAMPLE})"));
    }

    #[test]
    fn parse_accepts_uppercase_and_prints_lowercase() {
        let upper = format!("sha256:{}", SAMPLE["sha256:".len()..].to_uppercase());
        let fingerprint: Fingerprint = upper.parse().unwrap();
        assert_eq!(fingerprint.to_string(), SAMPLE);
    }

    #[test]
    fn parse_errors_say_what_is_wrong() {
        let hex = &SAMPLE["sha256:".len()..];
        let err = hex.parse::<Fingerprint>().unwrap_err();
        assert!(matches!(err, ParseFingerprintError::MissingPrefix(_)));
        assert!(err.to_string().contains("starts with \"sha256:\""), "{err}");

        let err = format!("SHA256:{hex}").parse::<Fingerprint>().unwrap_err();
        assert!(
            matches!(err, ParseFingerprintError::MissingPrefix(_)),
            "{err}"
        );

        let err = format!("sha256:{}", &hex[..62])
            .parse::<Fingerprint>()
            .unwrap_err();
        assert_eq!(err, ParseFingerprintError::WrongLength { found: 62 });
        assert!(err.to_string().contains("this one has 62"), "{err}");

        let err = format!("{SAMPLE}00").parse::<Fingerprint>().unwrap_err();
        assert_eq!(err, ParseFingerprintError::WrongLength { found: 66 });

        let err = "sha256:".parse::<Fingerprint>().unwrap_err();
        assert_eq!(err, ParseFingerprintError::WrongLength { found: 0 });

        let err = format!("sha256:{}g{}", &hex[..9], &hex[10..])
            .parse::<Fingerprint>()
            .unwrap_err();
        assert_eq!(
            err,
            ParseFingerprintError::NotHex {
                position: 10,
                character: 'g'
            }
        );
        assert!(err.to_string().contains("'g' at digit 10"), "{err}");

        let colons = "sha256:00:11".parse::<Fingerprint>().unwrap_err();
        assert_eq!(
            colons,
            ParseFingerprintError::NotHex {
                position: 3,
                character: ':'
            }
        );

        let err = format!(" {SAMPLE}").parse::<Fingerprint>().unwrap_err();
        assert!(matches!(err, ParseFingerprintError::MissingPrefix(_)));
    }

    #[test]
    fn garbage_der_is_not_a_certificate() {
        let err = Fingerprint::of_certificate(b"not a certificate").unwrap_err();
        assert!(
            err.to_string().starts_with("not an X.509 certificate"),
            "{err}"
        );
    }

    #[test]
    fn unix_seconds_round_trip() {
        for seconds in [-86_400 * 365, -1, 0, 1, 1_700_000_000] {
            assert_eq!(unix_seconds(system_time(seconds)), seconds);
        }
        let just_before_epoch = UNIX_EPOCH - Duration::from_millis(1);
        assert_eq!(unix_seconds(just_before_epoch), -1);
    }
}
