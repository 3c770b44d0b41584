//! SOCKS5 (RFC 1928) CONNECT with no authentication or username/password (RFC 1929).
//!
//! The wire format is parsed by pure functions over byte slices ([`parse_greeting`],
//! [`parse_password_auth`], [`parse_request`], in `wire.rs`, which the fuzz target compiles on
//! its own) that either return a message and the bytes it used or say how many bytes they need
//! in total. The async [`handshake`] reads exactly that many bytes, so it never consumes data the
//! client sent after its request: those bytes stay in the socket for the relay.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::config::{Socks5Auth, TargetAddr};

mod wire;

pub(crate) use wire::ReplyCode;
use wire::{
    encode_reply, parse_greeting, parse_password_auth, parse_request, Parsed, ProtocolError,
    AUTH_VERSION, METHOD_NONE, METHOD_NO_ACCEPTABLE, METHOD_PASSWORD, VERSION,
};

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

async fn read_message<T, S: AsyncRead + Unpin>(
    stream: &mut S,
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
pub(crate) async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
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
pub(crate) async fn send_reply<S: AsyncWrite + Unpin>(
    stream: &mut S,
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
}
