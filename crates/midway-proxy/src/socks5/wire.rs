//! The SOCKS5 wire format: pure functions over byte slices, no I/O.
//!
//! This file depends only on std, `thiserror` and [`TargetAddr`], so the fuzz target
//! (`crates/midway-proxy/fuzz/fuzz_targets/socks5.rs`) compiles it on its own with `#[path]`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::config::TargetAddr;

/// Protocol version byte of every SOCKS5 message.
pub(crate) const VERSION: u8 = 0x05;
/// Version byte of the username/password sub-negotiation (RFC 1929).
pub(crate) const AUTH_VERSION: u8 = 0x01;
/// Method: no authentication required.
pub(crate) const METHOD_NONE: u8 = 0x00;
/// Method: username/password (RFC 1929).
pub(crate) const METHOD_PASSWORD: u8 = 0x02;
/// Method reply: no acceptable methods.
pub(crate) const METHOD_NO_ACCEPTABLE: u8 = 0xff;
const CMD_CONNECT: u8 = 0x01;
const ATYP_IPV4: u8 = 0x01;
const ATYP_DOMAIN: u8 = 0x03;
const ATYP_IPV6: u8 = 0x04;

/// Reply codes (RFC 1928 section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ReplyCode {
    Succeeded = 0x00,
    GeneralFailure = 0x01,
    NotAllowed = 0x02,
    NetworkUnreachable = 0x03,
    HostUnreachable = 0x04,
    ConnectionRefused = 0x05,
    TtlExpired = 0x06,
    CommandNotSupported = 0x07,
    AddressTypeNotSupported = 0x08,
}

/// Result of a parser: a message with the bytes it used, or the total length it needs.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed<T> {
    Complete(T, usize),
    NeedBytes(usize),
}

/// A protocol violation; `reply` is the reply the protocol allows before closing, if any.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProtocolError {
    #[error("not SOCKS version 5 (first byte {0:#04x})")]
    BadVersion(u8),
    #[error("greeting offers no authentication method")]
    NoMethods,
    #[error("bad username/password sub-negotiation version {0:#04x}")]
    BadAuthVersion(u8),
    #[error("empty username or password")]
    EmptyCredential,
    #[error("command {0:#04x} is not supported (only CONNECT)")]
    UnsupportedCommand(u8),
    #[error("address type {0:#04x} is not supported")]
    UnsupportedAddressType(u8),
    #[error("reserved byte is {0:#04x}, must be 0")]
    BadReserved(u8),
    #[error("domain name is empty or not valid UTF-8")]
    BadDomain,
}

impl ProtocolError {
    /// Reply code to send before closing, when a request reply is allowed at this point.
    pub(crate) fn request_reply(&self) -> Option<ReplyCode> {
        match self {
            ProtocolError::UnsupportedCommand(_) => Some(ReplyCode::CommandNotSupported),
            ProtocolError::UnsupportedAddressType(_) => Some(ReplyCode::AddressTypeNotSupported),
            ProtocolError::BadReserved(_) | ProtocolError::BadDomain => {
                Some(ReplyCode::GeneralFailure)
            }
            _ => None,
        }
    }
}

/// Client greeting: the methods offered.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Greeting {
    pub methods: Vec<u8>,
}

/// RFC 1929 credentials.
#[derive(PartialEq, Eq)]
pub(crate) struct Credentials {
    pub username: Vec<u8>,
    pub password: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &String::from_utf8_lossy(&self.username))
            .field("password", &"<hidden>")
            .finish()
    }
}

/// `VER NMETHODS METHODS...`
pub(crate) fn parse_greeting(buf: &[u8]) -> Result<Parsed<Greeting>, ProtocolError> {
    if buf.len() < 2 {
        return Ok(Parsed::NeedBytes(2));
    }
    if buf[0] != VERSION {
        return Err(ProtocolError::BadVersion(buf[0]));
    }
    let n = buf[1] as usize;
    if n == 0 {
        return Err(ProtocolError::NoMethods);
    }
    if buf.len() < 2 + n {
        return Ok(Parsed::NeedBytes(2 + n));
    }
    Ok(Parsed::Complete(
        Greeting {
            methods: buf[2..2 + n].to_vec(),
        },
        2 + n,
    ))
}

/// `VER ULEN UNAME PLEN PASSWD` (RFC 1929).
pub(crate) fn parse_password_auth(buf: &[u8]) -> Result<Parsed<Credentials>, ProtocolError> {
    if buf.len() < 2 {
        return Ok(Parsed::NeedBytes(2));
    }
    if buf[0] != AUTH_VERSION {
        return Err(ProtocolError::BadAuthVersion(buf[0]));
    }
    let ulen = buf[1] as usize;
    if buf.len() < 2 + ulen + 1 {
        return Ok(Parsed::NeedBytes(2 + ulen + 1));
    }
    let plen = buf[2 + ulen] as usize;
    let total = 3 + ulen + plen;
    if buf.len() < total {
        return Ok(Parsed::NeedBytes(total));
    }
    if ulen == 0 || plen == 0 {
        return Err(ProtocolError::EmptyCredential);
    }
    Ok(Parsed::Complete(
        Credentials {
            username: buf[2..2 + ulen].to_vec(),
            password: buf[3 + ulen..total].to_vec(),
        },
        total,
    ))
}

/// `VER CMD RSV ATYP DST.ADDR DST.PORT`; only CONNECT is accepted.
pub(crate) fn parse_request(buf: &[u8]) -> Result<Parsed<TargetAddr>, ProtocolError> {
    if buf.len() < 5 {
        return Ok(Parsed::NeedBytes(5));
    }
    if buf[0] != VERSION {
        return Err(ProtocolError::BadVersion(buf[0]));
    }
    if buf[2] != 0 {
        return Err(ProtocolError::BadReserved(buf[2]));
    }
    // The address type is checked before the command so a non-CONNECT request with a valid
    // address still gets "command not supported", as RFC 1928 intends.
    let addr_len = match buf[3] {
        ATYP_IPV4 => 4,
        ATYP_IPV6 => 16,
        ATYP_DOMAIN => 1 + buf[4] as usize,
        other => return Err(ProtocolError::UnsupportedAddressType(other)),
    };
    if buf[1] != CMD_CONNECT {
        return Err(ProtocolError::UnsupportedCommand(buf[1]));
    }
    let total = 4 + addr_len + 2;
    if buf.len() < total {
        return Ok(Parsed::NeedBytes(total));
    }
    let port = u16::from_be_bytes([buf[total - 2], buf[total - 1]]);
    let addr = &buf[4..4 + addr_len];
    let target = match buf[3] {
        ATYP_IPV4 => TargetAddr::Ip(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3])),
            port,
        )),
        ATYP_IPV6 => {
            #[allow(
                clippy::expect_used,
                reason = "addr_len is 16 for ATYP_IPV6 and the buffer was checked to hold it"
            )]
            let octets: [u8; 16] = addr.try_into().expect("length checked above");
            TargetAddr::Ip(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(octets)), port))
        }
        _ => {
            let name = std::str::from_utf8(&addr[1..]).map_err(|_| ProtocolError::BadDomain)?;
            if name.is_empty() {
                return Err(ProtocolError::BadDomain);
            }
            // A domain that is an IP literal is treated as that address (no resolver round trip).
            match name.parse::<IpAddr>() {
                Ok(ip) => TargetAddr::Ip(SocketAddr::new(ip, port)),
                Err(_) => TargetAddr::Domain(name.to_string(), port),
            }
        }
    };
    Ok(Parsed::Complete(target, total))
}

/// `VER REP RSV ATYP BND.ADDR BND.PORT`
pub(crate) fn encode_reply(code: ReplyCode, bound: SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(22);
    out.extend_from_slice(&[VERSION, code as u8, 0]);
    match bound.ip() {
        IpAddr::V4(ip) => {
            out.push(ATYP_IPV4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(ATYP_IPV6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&bound.port().to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_incremental() {
        assert_eq!(parse_greeting(&[]).unwrap(), Parsed::NeedBytes(2));
        assert_eq!(parse_greeting(&[5, 2]).unwrap(), Parsed::NeedBytes(4));
        assert_eq!(
            parse_greeting(&[5, 2, 0, 2]).unwrap(),
            Parsed::Complete(
                Greeting {
                    methods: vec![0, 2]
                },
                4
            )
        );
        assert_eq!(parse_greeting(&[4, 1]), Err(ProtocolError::BadVersion(4)));
        assert_eq!(
            parse_greeting(b"GET / HTTP/1.1"),
            Err(ProtocolError::BadVersion(b'G'))
        );
        assert_eq!(parse_greeting(&[5, 0]), Err(ProtocolError::NoMethods));
    }

    #[test]
    fn password_auth() {
        let msg = [1, 5, b'a', b'l', b'i', b'c', b'e', 2, b'p', b'w'];
        assert_eq!(
            parse_password_auth(&msg[..3]).unwrap(),
            Parsed::NeedBytes(8)
        );
        assert_eq!(
            parse_password_auth(&msg[..8]).unwrap(),
            Parsed::NeedBytes(10)
        );
        match parse_password_auth(&msg).unwrap() {
            Parsed::Complete(c, 10) => {
                assert_eq!(c.username, b"alice");
                assert_eq!(c.password, b"pw");
                assert!(!format!("{c:?}").contains("pw\""));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse_password_auth(&[5, 1]),
            Err(ProtocolError::BadAuthVersion(5))
        );
        assert_eq!(
            parse_password_auth(&[1, 0, 1, b'x']),
            Err(ProtocolError::EmptyCredential)
        );
    }

    #[test]
    fn request_address_types() {
        let v4 = [5, 1, 0, 1, 10, 2, 0, 2, 0x14, 0x51];
        assert_eq!(parse_request(&v4[..5]).unwrap(), Parsed::NeedBytes(10));
        assert_eq!(
            parse_request(&v4).unwrap(),
            Parsed::Complete(TargetAddr::Ip("10.2.0.2:5201".parse().unwrap()), 10)
        );
        let mut v6 = vec![5, 1, 0, 4];
        v6.extend_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&[0, 80]);
        assert_eq!(
            parse_request(&v6).unwrap(),
            Parsed::Complete(TargetAddr::Ip("[fd00::2]:80".parse().unwrap()), 22)
        );
        let mut dom = vec![5, 1, 0, 3, 11];
        dom.extend_from_slice(b"example.org");
        dom.extend_from_slice(&[1, 187]);
        assert_eq!(parse_request(&dom[..5]).unwrap(), Parsed::NeedBytes(18));
        assert_eq!(
            parse_request(&dom).unwrap(),
            Parsed::Complete(TargetAddr::Domain("example.org".into(), 443), 18)
        );
        let mut lit = vec![5, 1, 0, 3, 9];
        lit.extend_from_slice(b"127.0.0.1");
        lit.extend_from_slice(&[0, 7]);
        assert_eq!(
            parse_request(&lit).unwrap(),
            Parsed::Complete(TargetAddr::Ip("127.0.0.1:7".parse().unwrap()), 16)
        );
    }

    #[test]
    fn request_errors_and_their_replies() {
        let bind = [5, 2, 0, 1, 1, 2, 3, 4, 0, 80];
        let err = parse_request(&bind).unwrap_err();
        assert_eq!(err, ProtocolError::UnsupportedCommand(2));
        assert_eq!(err.request_reply(), Some(ReplyCode::CommandNotSupported));
        let err = parse_request(&[5, 1, 0, 9, 0]).unwrap_err();
        assert_eq!(
            err.request_reply(),
            Some(ReplyCode::AddressTypeNotSupported)
        );
        assert_eq!(
            parse_request(&[5, 1, 7, 1, 0]),
            Err(ProtocolError::BadReserved(7))
        );
        assert_eq!(
            parse_request(&[5, 1, 0, 3, 0, 0, 80]),
            Err(ProtocolError::BadDomain)
        );
        assert_eq!(
            parse_request(&[5, 1, 0, 3, 1, 0xff, 0, 80]),
            Err(ProtocolError::BadDomain)
        );
        assert_eq!(
            parse_request(&[4, 1, 0, 1, 0]),
            Err(ProtocolError::BadVersion(4))
        );
    }

    #[test]
    fn reply_encoding() {
        assert_eq!(
            encode_reply(ReplyCode::Succeeded, "10.0.0.1:1080".parse().unwrap()),
            vec![5, 0, 0, 1, 10, 0, 0, 1, 0x04, 0x38]
        );
        let v6 = encode_reply(ReplyCode::ConnectionRefused, "[::1]:1".parse().unwrap());
        assert_eq!(v6.len(), 22);
        assert_eq!(v6[1], 5);
        assert_eq!(v6[3], ATYP_IPV6);
    }

    /// Every prefix of a valid message asks for more bytes, never errors: a slow client is fine.
    #[test]
    fn prefixes_never_error() {
        let mut dom = vec![5, 1, 0, 3, 3];
        dom.extend_from_slice(b"a.b");
        dom.extend_from_slice(&[0, 80]);
        for n in 0..dom.len() {
            assert!(
                matches!(parse_request(&dom[..n]), Ok(Parsed::NeedBytes(k)) if k > n),
                "{n}"
            );
        }
    }
}
