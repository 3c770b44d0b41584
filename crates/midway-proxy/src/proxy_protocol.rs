//! The PROXY protocol's headers (HAProxy's `proxy-protocol.txt`), without I/O: the v2 header a
//! listener with `proxy_protocol = "v2"` writes first on its remote segment, and the v2 or v1
//! header a listener with `accept_proxy_protocol` reads from a load balancer, recognised a
//! piece at a time so that the reader never takes a byte past the header.
//!
//! The encoding and decoding are the `ppp` crate's (2.3, Apache-2.0, maintained): it builds
//! and parses both versions, TLVs included, tells an incomplete header from a bad one, does no
//! I/O and brings one dependency (thiserror 1). Writing the binary format by hand would be
//! little code, but one more parser of untrusted bytes to test and fuzz. What `ppp` does not
//! decide is policy: what LOCAL and UNSPEC mean to midway, which families it relays, how much
//! it reads before refusing; that is here.

use std::net::{IpAddr, SocketAddr};

use ppp::v2;

/// The v2 header's 12-byte signature.
const V2_SIGNATURE: &[u8] = v2::PROTOCOL_PREFIX;
/// The fixed part of a v2 header: signature, version and command, family and protocol,
/// length of what follows.
const V2_FIXED_LEN: usize = 16;
/// How a v1 header starts.
const V1_PREFIX: &[u8] = b"PROXY ";
/// The shortest v1 header, `PROXY UNKNOWN\r\n`.
const V1_MIN_LEN: usize = 15;
/// The longest v1 header, CRLF included (the specification's bound).
const V1_MAX_LEN: usize = 107;
/// Enough of a header's start to tell v1 from v2 from anything else.
const PROBE_LEN: usize = V1_PREFIX.len();

/// What a complete header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proxied {
    /// A proxied connection: the client as the load balancer saw it, and the address the
    /// client connected to there (the original destination).
    Client {
        client: SocketAddr,
        destination: SocketAddr,
    },
    /// The load balancer's own connection (a v2 LOCAL command, such as a health check; or a
    /// header with no addresses, v2 UNSPEC or v1 UNKNOWN): the connection's real addresses
    /// stand.
    Local,
}

/// Where reading a header stands after the bytes so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// Read until this many bytes in all are there (never past the header's end), then scan
    /// again.
    Need(usize),
    /// The header is complete: exactly the bytes given.
    Complete(Proxied),
}

/// Why the bytes are not an acceptable header.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HeaderError {
    #[error("not a PROXY protocol header")]
    NotAHeader,
    #[error("malformed v2 header")]
    V2(#[source] v2::ParseError),
    #[error("malformed v1 header")]
    V1(#[source] ppp::v1::BinaryParseError),
    #[error("v1 header longer than {V1_MAX_LEN} bytes")]
    V1TooLong,
    #[error("header carries {0}, which midway does not relay")]
    Unsupported(&'static str),
}

/// The first `bytes` of a connection's stream, read so far: how many more are needed, or the
/// header they make. Call with at least nothing; every `Need` is more than `bytes.len()`.
pub(crate) fn scan(bytes: &[u8]) -> Result<Scan, HeaderError> {
    if bytes.len() < PROBE_LEN {
        return Ok(Scan::Need(PROBE_LEN));
    }
    if bytes.starts_with(V1_PREFIX) {
        return scan_v1(bytes);
    }
    if !bytes.starts_with(&V2_SIGNATURE[..PROBE_LEN]) {
        return Err(HeaderError::NotAHeader);
    }
    if bytes.len() < V2_FIXED_LEN {
        return Ok(Scan::Need(V2_FIXED_LEN));
    }
    if !bytes.starts_with(V2_SIGNATURE) {
        return Err(HeaderError::NotAHeader);
    }
    let total = V2_FIXED_LEN + usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
    if bytes.len() < total {
        return Ok(Scan::Need(total));
    }
    let header = v2::Header::try_from(&bytes[..total]).map_err(HeaderError::V2)?;
    if header.command == v2::Command::Local {
        return Ok(Scan::Complete(Proxied::Local));
    }
    if header.protocol == v2::Protocol::Datagram {
        return Err(HeaderError::Unsupported("a datagram (UDP) connection"));
    }
    Ok(Scan::Complete(match header.addresses {
        v2::Addresses::IPv4(a) => Proxied::Client {
            client: SocketAddr::new(IpAddr::V4(a.source_address), a.source_port),
            destination: SocketAddr::new(IpAddr::V4(a.destination_address), a.destination_port),
        },
        v2::Addresses::IPv6(a) => Proxied::Client {
            client: SocketAddr::new(IpAddr::V6(a.source_address), a.source_port),
            destination: SocketAddr::new(IpAddr::V6(a.destination_address), a.destination_port),
        },
        // The specification leaves UNSPEC with PROXY to the receiver: the real addresses,
        // as for LOCAL.
        v2::Addresses::Unspecified => Proxied::Local,
        v2::Addresses::Unix(_) => return Err(HeaderError::Unsupported("Unix socket addresses")),
    }))
}

/// A v1 (text) header, one line ending in CRLF.
fn scan_v1(bytes: &[u8]) -> Result<Scan, HeaderError> {
    if !bytes.ends_with(b"\r\n") {
        if bytes.len() >= V1_MAX_LEN {
            return Err(HeaderError::V1TooLong);
        }
        // The line's end is unknown: a byte at a time past the shortest header, so that no
        // byte of the client's own is taken.
        return Ok(Scan::Need((bytes.len() + 1).max(V1_MIN_LEN)));
    }
    let header = ppp::v1::Header::try_from(bytes).map_err(HeaderError::V1)?;
    Ok(Scan::Complete(match header.addresses {
        ppp::v1::Addresses::Tcp4(a) => Proxied::Client {
            client: SocketAddr::new(IpAddr::V4(a.source_address), a.source_port),
            destination: SocketAddr::new(IpAddr::V4(a.destination_address), a.destination_port),
        },
        ppp::v1::Addresses::Tcp6(a) => Proxied::Client {
            client: SocketAddr::new(IpAddr::V6(a.source_address), a.source_port),
            destination: SocketAddr::new(IpAddr::V6(a.destination_address), a.destination_port),
        },
        ppp::v1::Addresses::Unknown => Proxied::Local,
    }))
}

/// The v2 header (PROXY command, TCP) that tells a server `client` connected to
/// `destination`. Both are taken as IPv4 where they are IPv4-mapped; if one is IPv4 and the
/// other IPv6, both go as IPv6 (the header has one family).
pub(crate) fn v2_header(client: SocketAddr, destination: SocketAddr) -> std::io::Result<Vec<u8>> {
    let canonical = |addr: SocketAddr| SocketAddr::new(addr.ip().to_canonical(), addr.port());
    let (client, destination) = match (canonical(client), canonical(destination)) {
        (c @ SocketAddr::V4(_), d @ SocketAddr::V4(_)) => (c, d),
        (c, d) => (as_v6(c), as_v6(d)),
    };
    v2::Builder::with_addresses(
        v2::Version::Two | v2::Command::Proxy,
        v2::Protocol::Stream,
        (client, destination),
    )
    .build()
}

fn as_v6(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) => SocketAddr::new(IpAddr::V6(ip.to_ipv6_mapped()), addr.port()),
        IpAddr::V6(_) => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `stream` to [`scan`] as a reader would: as many bytes as each `Need` asks for.
    /// Returns the outcome and how many bytes were taken.
    fn read(stream: &[u8]) -> (Result<Proxied, String>, usize) {
        let mut taken = 0;
        // A header is at most 16 + 65535 bytes and every step takes at least one more.
        for _ in 0..=V2_FIXED_LEN + usize::from(u16::MAX) {
            match scan(&stream[..taken]) {
                Ok(Scan::Need(total)) => {
                    assert!(total > taken, "Need({total}) after {taken} bytes");
                    if total > stream.len() {
                        return (Err("truncated".into()), taken);
                    }
                    taken = total;
                }
                Ok(Scan::Complete(proxied)) => return (Ok(proxied), taken),
                Err(err) => return (Err(err.to_string()), taken),
            }
        }
        unreachable!("scan never completes");
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_built_v2_header_reads_back_and_no_byte_past_it_is_taken() {
        let header = v2_header(addr("192.0.2.7:40000"), addr("198.51.100.1:443")).unwrap();
        assert_eq!(header.len(), 16 + 12);
        let mut stream = header.clone();
        stream.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let (proxied, taken) = read(&stream);
        assert_eq!(taken, header.len());
        assert_eq!(
            proxied.unwrap(),
            Proxied::Client {
                client: addr("192.0.2.7:40000"),
                destination: addr("198.51.100.1:443"),
            }
        );
    }

    #[test]
    fn mixed_and_mapped_families() {
        // IPv4-mapped addresses go as IPv4.
        let header = v2_header(addr("[::ffff:10.0.0.1]:1"), addr("10.0.0.2:2")).unwrap();
        assert_eq!(header.len(), 16 + 12);
        // One of each family: both as IPv6.
        let header = v2_header(addr("10.0.0.1:1"), addr("[2001:db8::1]:2")).unwrap();
        assert_eq!(header.len(), 16 + 36);
        let (proxied, _) = read(&header);
        assert_eq!(
            proxied.unwrap(),
            Proxied::Client {
                client: addr("[::ffff:10.0.0.1]:1"),
                destination: addr("[2001:db8::1]:2"),
            }
        );
    }

    #[test]
    fn v1_headers_are_read_to_their_line_end() {
        let stream = b"PROXY TCP4 192.0.2.7 198.51.100.1 40000 443\r\nhello";
        let (proxied, taken) = read(stream);
        assert_eq!(taken, stream.len() - b"hello".len());
        assert_eq!(
            proxied.unwrap(),
            Proxied::Client {
                client: addr("192.0.2.7:40000"),
                destination: addr("198.51.100.1:443"),
            }
        );
        let (proxied, taken) = read(b"PROXY UNKNOWN\r\nx");
        assert_eq!((proxied.unwrap(), taken), (Proxied::Local, 15));
        let long = [b"PROXY ".as_slice(), &[b'1'; 200]].concat();
        assert!(read(&long).0.unwrap_err().contains("longer"));
    }

    #[test]
    fn local_and_unspecified_mean_the_real_addresses() {
        let mut local = V2_SIGNATURE.to_vec();
        local.extend_from_slice(&[0x20, 0x00, 0, 0]);
        assert_eq!(read(&local).0.unwrap(), Proxied::Local);
        let mut unspecified = V2_SIGNATURE.to_vec();
        unspecified.extend_from_slice(&[0x21, 0x00, 0, 0]);
        assert_eq!(read(&unspecified).0.unwrap(), Proxied::Local);
    }

    #[test]
    fn garbage_truncation_and_unsupported_families_are_refused() {
        let (result, taken) = read(b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(result.unwrap_err(), "not a PROXY protocol header");
        assert_eq!(taken, PROBE_LEN, "refused after the first bytes");
        let mut bad_signature = V2_SIGNATURE[..PROBE_LEN].to_vec();
        bad_signature.extend_from_slice(&[0; 10]);
        assert!(read(&bad_signature).0.is_err());

        let header = v2_header(addr("192.0.2.7:40000"), addr("198.51.100.1:443")).unwrap();
        let (result, _) = read(&header[..20]);
        assert_eq!(result.unwrap_err(), "truncated");

        let mut version_one = header.clone();
        version_one[12] = 0x11;
        assert!(read(&version_one).0.unwrap_err().contains("malformed v2"));

        let mut udp = header.clone();
        udp[13] = 0x12;
        assert!(read(&udp).0.unwrap_err().contains("datagram"));

        let mut unix = V2_SIGNATURE.to_vec();
        unix.extend_from_slice(&[0x21, 0x31, 0, 216]);
        unix.extend_from_slice(&[0; 216]);
        assert!(read(&unix).0.unwrap_err().contains("Unix"));
    }
}
