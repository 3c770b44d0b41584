//! SOCKS5 (RFC 1928) CONNECT with no authentication or username/password (RFC 1929).
//!
//! The wire format is parsed by pure functions over byte slices ([`parse_greeting`],
//! [`parse_password_auth`], [`parse_request`]) that either return a message and the bytes it
//! used or say how many bytes they need in total. The async [`handshake`] reads exactly that many
//! bytes, so it never consumes data the client sent after its request: those bytes stay in the
//! socket for the relay.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::{Socks5Auth, TargetAddr};

const VERSION: u8 = 0x05;
const AUTH_VERSION: u8 = 0x01;
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

impl ReplyCode {
    /// The reply for a failed connect to the target.
    pub(crate) fn for_connect_error(err: &std::io::Error) -> ReplyCode {
        match err.raw_os_error() {
            Some(libc::ECONNREFUSED) => ReplyCode::ConnectionRefused,
            Some(libc::ENETUNREACH) => ReplyCode::NetworkUnreachable,
            Some(libc::EHOSTUNREACH) => ReplyCode::HostUnreachable,
            Some(libc::ETIMEDOUT) => ReplyCode::TtlExpired,
            _ if err.kind() == std::io::ErrorKind::TimedOut => ReplyCode::TtlExpired,
            _ => ReplyCode::GeneralFailure,
        }
    }
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

/// Constant-time comparison, so response timing does not reveal how much of a password matched.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a SOCKS5 handshake failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("client I/O during the SOCKS5 handshake")]
    Io(#[from] std::io::Error),
    #[error("SOCKS5 protocol violation")]
    Protocol(#[from] ProtocolError),
    #[error("client offered no authentication method this listener accepts")]
    NoAcceptableMethod,
    #[error("SOCKS5 authentication failed for user {username:?}")]
    AuthFailed { username: String },
}

impl HandshakeError {
    /// Short label for the refused-connections metric.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            HandshakeError::Io(_) => "socks5_io",
            HandshakeError::Protocol(_) => "socks5_protocol",
            HandshakeError::NoAcceptableMethod | HandshakeError::AuthFailed { .. } => "socks5_auth",
        }
    }
}

async fn read_message<T>(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    parse: impl Fn(&[u8]) -> Result<Parsed<T>, ProtocolError>,
) -> Result<T, HandshakeError> {
    buf.clear();
    // Each message is at most 3 + 255 + 255 bytes, so this loop runs a handful of times.
    loop {
        match parse(buf)? {
            Parsed::Complete(msg, used) => {
                debug_assert_eq!(used, buf.len());
                return Ok(msg);
            }
            Parsed::NeedBytes(total) => {
                let start = buf.len();
                buf.resize(total, 0);
                stream.read_exact(&mut buf[start..]).await?;
            }
        }
    }
}

/// Runs greeting, authentication and request; returns the requested target. The caller
/// connects and then calls [`send_reply`]. Protocol errors are answered where RFC 1928 allows.
pub(crate) async fn handshake(
    stream: &mut TcpStream,
    auth: &Socks5Auth,
) -> Result<TargetAddr, HandshakeError> {
    let mut buf = Vec::with_capacity(64);
    let greeting = read_message(stream, &mut buf, parse_greeting).await?;
    let wanted = match auth {
        Socks5Auth::None => METHOD_NONE,
        Socks5Auth::Password(_) => METHOD_PASSWORD,
    };
    if !greeting.methods.contains(&wanted) {
        stream.write_all(&[VERSION, METHOD_NO_ACCEPTABLE]).await?;
        return Err(HandshakeError::NoAcceptableMethod);
    }
    stream.write_all(&[VERSION, wanted]).await?;

    if let Socks5Auth::Password(users) = auth {
        let creds = read_message(stream, &mut buf, parse_password_auth).await?;
        // Compare against every user so the time taken does not depend on which one matched.
        let ok = users.iter().fold(false, |ok, (name, password)| {
            ok | (same_secret(name.as_bytes(), &creds.username)
                & same_secret(password.as_bytes(), &creds.password))
        });
        stream
            .write_all(&[AUTH_VERSION, if ok { 0 } else { 1 }])
            .await?;
        if !ok {
            return Err(HandshakeError::AuthFailed {
                username: String::from_utf8_lossy(&creds.username).into_owned(),
            });
        }
    }

    match read_message(stream, &mut buf, parse_request).await {
        Ok(target) => Ok(target),
        Err(HandshakeError::Protocol(err)) => {
            if let Some(code) = err.request_reply() {
                let unspecified = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
                // Best effort: the client may already be gone.
                let _ = stream.write_all(&encode_reply(code, unspecified)).await;
            }
            Err(HandshakeError::Protocol(err))
        }
        Err(other) => Err(other),
    }
}

/// Sends the request reply; `bound` is the remote segment's local address on success.
pub(crate) async fn send_reply(
    stream: &mut TcpStream,
    code: ReplyCode,
    bound: Option<SocketAddr>,
) -> std::io::Result<()> {
    let bound = bound.unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
    stream.write_all(&encode_reply(code, bound)).await
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

    #[test]
    fn connect_error_codes() {
        let refused = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
        assert_eq!(
            ReplyCode::for_connect_error(&refused),
            ReplyCode::ConnectionRefused
        );
        let timeout = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert_eq!(
            ReplyCode::for_connect_error(&timeout),
            ReplyCode::TtlExpired
        );
    }

    #[test]
    fn secrets_compare() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"ab"));
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
