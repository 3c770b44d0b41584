//! The peer header: the first bytes of every connection from one midway to another. Pure: no
//! I/O and no clock (the caller passes the time), so it is unit-tested and fuzzed as it is.
//! This file uses only std, `hmac`, `sha2` and `thiserror`: the fuzz target
//! (`crates/midway-proxy/fuzz`) compiles it on its own.
//!
//! Layout, version 1 (all integers big-endian):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `MWPH` |
//! | 4 | 1 | version, 1 |
//! | 5 | 1 | flags, none defined: must be 0 |
//! | 6 | 1 | hop count: midways the connection crossed before the receiver |
//! | 7 | 1 | length of the key name, 1..=64 |
//! | 8 | 1 | destination family, 4 or 6 |
//! | 9 | 1 | client family, 4 or 6 |
//! | 10 | 16 | chain id, the same on every hop of one connection |
//! | 26 | 16 | nonce, random per header |
//! | 42 | 8 | timestamp, milliseconds since the Unix epoch |
//! | 50 | n | key name (ASCII letters, digits, `_`, `-`, `.`) |
//! | | 4 or 16, 2 | destination address, port |
//! | | 4 or 16, 2 | client address, port |
//! | | 32 | HMAC-SHA256 with the named key over every byte before it |
//!
//! The fixed prefix ([`PREFIX_LEN`] bytes) tells the whole length ([`header_len`]), so a reader
//! reads exactly one header and never a byte of what follows it. Everything but the MAC is
//! authenticated, the key name included (a header cannot be moved to another key).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The first four bytes of every peer header.
pub const MAGIC: [u8; 4] = *b"MWPH";
/// The version this code writes and reads.
pub const VERSION: u8 = 1;
/// Bytes that tell the length of the rest: magic, version, flags, hops, key name length and the
/// two address families.
pub const PREFIX_LEN: usize = 10;
/// Longest key name.
pub const MAX_KEY_NAME_LEN: usize = 64;
/// Length of the HMAC-SHA256 tag.
pub const MAC_LEN: usize = 32;
/// Longest possible header (two IPv6 addresses and the longest key name).
pub const MAX_HEADER_LEN: usize = FIXED_LEN + MAX_KEY_NAME_LEN + 2 * (16 + 2) + MAC_LEN;
/// Bytes before the key name.
const FIXED_LEN: usize = PREFIX_LEN + 16 + 16 + 8;

/// A connection's identity along a chain of midways; a midway refuses one it already relays.
pub type ChainId = [u8; 16];

/// What one midway tells the next about a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerHeader {
    /// Midways the connection crossed before the receiver (1 from an edge).
    pub hops: u8,
    /// The same on every hop of one connection.
    pub chain_id: ChainId,
    /// Random per header; the receiver refuses a nonce it saw inside its time window.
    pub nonce: [u8; 16],
    /// When the sender wrote the header, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// Name of the pre-shared key the MAC is made with (the receiver looks it up by this name).
    pub key_name: String,
    /// Where the client wanted to go.
    pub destination: SocketAddr,
    /// The client, as the edge saw it.
    pub client: SocketAddr,
}

/// Why bytes are not a peer header, or not one this midway accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer bytes than the header needs.
    #[error("truncated: {got} bytes, the header needs {need}")]
    Truncated {
        /// Bytes given.
        got: usize,
        /// Bytes the header needs.
        need: usize,
    },
    /// More bytes than the header's own length.
    #[error("{got} bytes, but the header is {len}")]
    Oversized {
        /// Bytes given.
        got: usize,
        /// The header's length.
        len: usize,
    },
    /// Not a midway peer header at all.
    #[error("bad magic (not a midway peer)")]
    BadMagic,
    /// A version this midway does not speak.
    #[error("unsupported version {0}")]
    UnsupportedVersion(u8),
    /// Flags this version does not define.
    #[error("unknown flags {0:#04x}")]
    UnknownFlags(u8),
    /// An address family byte other than 4 or 6.
    #[error("bad address family {0}")]
    BadFamily(u8),
    /// A key name that is empty, too long or has characters outside the allowed set.
    #[error("bad key name")]
    BadKeyName,
    /// The MAC does not match: wrong key, or the header was changed on the way.
    #[error("MAC mismatch (wrong key or altered header)")]
    BadMac,
    /// A key shorter than the minimum was given to sign or verify with.
    #[error("key too short")]
    KeyTooShort,
}

/// Shortest pre-shared key accepted, bytes.
pub const MIN_KEY_LEN: usize = 16;

/// Whether `name` may be a key name in a header.
pub fn valid_key_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_KEY_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn family_len(family: u8) -> Result<usize, HeaderError> {
    match family {
        4 => Ok(4),
        6 => Ok(16),
        other => Err(HeaderError::BadFamily(other)),
    }
}

/// The whole header's length, from its first [`PREFIX_LEN`] bytes; checks what they say.
pub fn header_len(prefix: &[u8]) -> Result<usize, HeaderError> {
    if prefix.len() < PREFIX_LEN {
        return Err(HeaderError::Truncated {
            got: prefix.len(),
            need: PREFIX_LEN,
        });
    }
    if prefix[0..4] != MAGIC {
        return Err(HeaderError::BadMagic);
    }
    if prefix[4] != VERSION {
        return Err(HeaderError::UnsupportedVersion(prefix[4]));
    }
    if prefix[5] != 0 {
        return Err(HeaderError::UnknownFlags(prefix[5]));
    }
    let key_len = usize::from(prefix[7]);
    if key_len == 0 || key_len > MAX_KEY_NAME_LEN {
        return Err(HeaderError::BadKeyName);
    }
    let dst = family_len(prefix[8])?;
    let client = family_len(prefix[9])?;
    Ok(FIXED_LEN + key_len + dst + 2 + client + 2 + MAC_LEN)
}

fn family_of(addr: &SocketAddr) -> u8 {
    if addr.is_ipv4() {
        4
    } else {
        6
    }
}

fn put_addr(out: &mut Vec<u8>, addr: &SocketAddr) {
    match addr.ip() {
        IpAddr::V4(v4) => out.extend_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out.extend_from_slice(&v6.octets()),
    }
    out.extend_from_slice(&addr.port().to_be_bytes());
}

fn mac_of(key: &[u8]) -> Result<Hmac<Sha256>, HeaderError> {
    if key.len() < MIN_KEY_LEN {
        return Err(HeaderError::KeyTooShort);
    }
    // HMAC takes keys of any length; the length check above is the only failure.
    Hmac::<Sha256>::new_from_slice(key).map_err(|_| HeaderError::KeyTooShort)
}

/// `[::ffff:a.b.c.d]:port` -> `a.b.c.d:port`, anything else unchanged: std's
/// [`IpAddr::to_canonical`] for a socket address, the crate's one. A header carries IPv4-mapped
/// addresses as the IPv4 address they carry (and a TPROXY'd original destination is compared and
/// connected to that way). It lives here because the fuzz target compiles this file alone.
pub(crate) fn canonical_socket_addr(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

impl PeerHeader {
    /// The header's bytes, MAC made with `key` (at least [`MIN_KEY_LEN`] bytes).
    pub fn encode(&self, key: &[u8]) -> Result<Vec<u8>, HeaderError> {
        if !valid_key_name(&self.key_name) {
            return Err(HeaderError::BadKeyName);
        }
        let mut mac = mac_of(key)?;
        let destination = canonical_socket_addr(self.destination);
        let client = canonical_socket_addr(self.client);
        let mut out = Vec::with_capacity(MAX_HEADER_LEN);
        out.extend_from_slice(&MAGIC);
        out.push(VERSION);
        out.push(0);
        out.push(self.hops);
        // valid_key_name bounds the length to MAX_KEY_NAME_LEN, which fits a byte.
        out.push(self.key_name.len() as u8);
        out.push(family_of(&destination));
        out.push(family_of(&client));
        out.extend_from_slice(&self.chain_id);
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&self.timestamp_ms.to_be_bytes());
        out.extend_from_slice(self.key_name.as_bytes());
        put_addr(&mut out, &destination);
        put_addr(&mut out, &client);
        mac.update(&out);
        out.extend_from_slice(&mac.finalize().into_bytes());
        Ok(out)
    }
}

/// A header whose structure is sound but whose MAC is not checked yet: the receiver looks up
/// [`UnverifiedHeader::key_name`] and calls [`UnverifiedHeader::verify`] with that key.
#[derive(Debug, Clone)]
pub struct UnverifiedHeader<'a> {
    bytes: &'a [u8],
    header: PeerHeader,
}

impl<'a> UnverifiedHeader<'a> {
    /// Parses exactly one header: `bytes` must be as long as the header says, no shorter
    /// (truncated) and no longer (oversized).
    pub fn decode(bytes: &'a [u8]) -> Result<UnverifiedHeader<'a>, HeaderError> {
        let len = header_len(bytes)?;
        if bytes.len() < len {
            return Err(HeaderError::Truncated {
                got: bytes.len(),
                need: len,
            });
        }
        if bytes.len() > len {
            return Err(HeaderError::Oversized {
                got: bytes.len(),
                len,
            });
        }
        let mut reader = Reader {
            bytes: &bytes[PREFIX_LEN..],
        };
        let chain_id = reader.array::<16>();
        let nonce = reader.array::<16>();
        let timestamp_ms = u64::from_be_bytes(reader.array::<8>());
        let key_name = std::str::from_utf8(reader.take(usize::from(bytes[7])))
            .ok()
            .filter(|name| valid_key_name(name))
            .ok_or(HeaderError::BadKeyName)?
            .to_string();
        let destination = reader.addr(bytes[8]);
        let client = reader.addr(bytes[9]);
        Ok(UnverifiedHeader {
            bytes,
            header: PeerHeader {
                hops: bytes[6],
                chain_id,
                nonce,
                timestamp_ms,
                key_name,
                destination,
                client,
            },
        })
    }

    /// The key the sender says it signed with.
    pub fn key_name(&self) -> &str {
        &self.header.key_name
    }

    /// Checks the MAC with `key` (constant time) and returns the header.
    pub fn verify(self, key: &[u8]) -> Result<PeerHeader, HeaderError> {
        let mut mac = mac_of(key)?;
        let (signed, tag) = self.bytes.split_at(self.bytes.len() - MAC_LEN);
        mac.update(signed);
        mac.verify_slice(tag).map_err(|_| HeaderError::BadMac)?;
        Ok(self.header)
    }
}

/// Reads fields whose lengths [`header_len`] has already checked against the input.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        head
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N));
        out
    }

    /// `family` was checked by [`header_len`]: 4 or 6.
    fn addr(&mut self, family: u8) -> SocketAddr {
        let ip = if family == 4 {
            IpAddr::V4(Ipv4Addr::from(self.array::<4>()))
        } else {
            IpAddr::V6(Ipv6Addr::from(self.array::<16>()))
        };
        let port = u16::from_be_bytes(self.array::<2>());
        SocketAddr::new(ip, port)
    }
}

/// The one byte a receiving midway answers a header with once its onward connection is made
/// (or could not be made). A refused header gets no status: a reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerStatus {
    /// The onward connection is made; bytes may flow.
    Connected,
    /// The destination (or a later midway's) refused the connection.
    Refused,
    /// No route to the destination, or it cannot be resolved.
    Unreachable,
    /// The onward connect timed out.
    TimedOut,
    /// Any other failure to connect onward.
    Failed,
}

impl PeerStatus {
    /// The byte on the wire.
    pub fn to_byte(self) -> u8 {
        match self {
            PeerStatus::Connected => 0,
            PeerStatus::Refused => 1,
            PeerStatus::Unreachable => 2,
            PeerStatus::TimedOut => 3,
            PeerStatus::Failed => 4,
        }
    }

    /// The status a byte stands for; unknown bytes are failures.
    pub fn from_byte(byte: u8) -> PeerStatus {
        match byte {
            0 => PeerStatus::Connected,
            1 => PeerStatus::Refused,
            2 => PeerStatus::Unreachable,
            3 => PeerStatus::TimedOut,
            _ => PeerStatus::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn sample(v6: bool) -> PeerHeader {
        PeerHeader {
            hops: 1,
            chain_id: [7; 16],
            nonce: [9; 16],
            timestamp_ms: 1_700_000_000_123,
            key_name: "edge-a".into(),
            destination: if v6 {
                "[fd00:2::2]:5201".parse().unwrap()
            } else {
                "10.2.0.2:5201".parse().unwrap()
            },
            client: "10.1.0.9:40000".parse().unwrap(),
        }
    }

    #[test]
    fn round_trip_both_families() {
        for v6 in [false, true] {
            let header = sample(v6);
            let bytes = header.encode(KEY).unwrap();
            assert_eq!(header_len(&bytes[..PREFIX_LEN]).unwrap(), bytes.len());
            let parsed = UnverifiedHeader::decode(&bytes).unwrap();
            assert_eq!(parsed.key_name(), "edge-a");
            assert_eq!(parsed.verify(KEY).unwrap(), header);
        }
        assert!(sample(true).encode(KEY).unwrap().len() <= MAX_HEADER_LEN);
    }

    #[test]
    fn mapped_addresses_travel_as_ipv4() {
        let mut header = sample(false);
        header.client = "[::ffff:10.1.0.9]:40000".parse().unwrap();
        let bytes = header.encode(KEY).unwrap();
        let back = UnverifiedHeader::decode(&bytes)
            .unwrap()
            .verify(KEY)
            .unwrap();
        assert_eq!(back.client, "10.1.0.9:40000".parse().unwrap());
    }

    #[test]
    fn every_bit_flip_is_refused() {
        let bytes = sample(true).encode(KEY).unwrap();
        for index in 0..bytes.len() {
            for bit in 0..8 {
                let mut changed = bytes.clone();
                changed[index] ^= 1 << bit;
                let verified =
                    UnverifiedHeader::decode(&changed).and_then(|header| header.verify(KEY));
                assert!(verified.is_err(), "flip of byte {index} bit {bit} accepted");
            }
        }
    }

    #[test]
    fn wrong_key_is_refused() {
        let bytes = sample(false).encode(KEY).unwrap();
        let parsed = UnverifiedHeader::decode(&bytes).unwrap();
        assert_eq!(
            parsed.verify(b"fedcba9876543210fedcba9876543210"),
            Err(HeaderError::BadMac)
        );
        let parsed = UnverifiedHeader::decode(&bytes).unwrap();
        assert_eq!(parsed.verify(b"short"), Err(HeaderError::KeyTooShort));
        assert_eq!(
            sample(false).encode(b"short"),
            Err(HeaderError::KeyTooShort)
        );
    }

    #[test]
    fn truncated_and_oversized_input_is_refused() {
        let bytes = sample(false).encode(KEY).unwrap();
        for len in 0..bytes.len() {
            assert!(
                matches!(
                    UnverifiedHeader::decode(&bytes[..len]),
                    Err(HeaderError::Truncated { .. })
                ),
                "{len} bytes"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            UnverifiedHeader::decode(&longer),
            Err(HeaderError::Oversized { .. })
        ));
    }

    #[test]
    fn bad_prefixes_are_named() {
        let bytes = sample(false).encode(KEY).unwrap();
        let with = |index: usize, value: u8| {
            let mut changed = bytes.clone();
            changed[index] = value;
            UnverifiedHeader::decode(&changed).map(|_| ())
        };
        assert_eq!(with(0, b'X'), Err(HeaderError::BadMagic));
        assert_eq!(with(4, 2), Err(HeaderError::UnsupportedVersion(2)));
        assert_eq!(with(5, 1), Err(HeaderError::UnknownFlags(1)));
        assert_eq!(with(7, 0), Err(HeaderError::BadKeyName));
        assert_eq!(with(7, 65), Err(HeaderError::BadKeyName));
        assert_eq!(with(8, 5), Err(HeaderError::BadFamily(5)));
        assert_eq!(with(FIXED_LEN, b' '), Err(HeaderError::BadKeyName));
        let mut bad_name = sample(false);
        bad_name.key_name = "a b".into();
        assert_eq!(bad_name.encode(KEY), Err(HeaderError::BadKeyName));
    }

    #[test]
    fn status_bytes_round_trip() {
        for status in [
            PeerStatus::Connected,
            PeerStatus::Refused,
            PeerStatus::Unreachable,
            PeerStatus::TimedOut,
            PeerStatus::Failed,
        ] {
            assert_eq!(PeerStatus::from_byte(status.to_byte()), status);
        }
        assert_eq!(PeerStatus::from_byte(200), PeerStatus::Failed);
    }
}
