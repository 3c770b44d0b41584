// Tests: an unwrap that fails is the test failing.
#![allow(clippy::unwrap_used)]
//! Fuzzes the SOCKS5 wire format (`src/socks5/wire.rs`), the first thing a SOCKS5 listener does
//! with bytes from the network. The file is compiled on its own; its `TargetAddr` is the proxy's.
//!
//! Each of `parse_greeting`, `parse_password_auth` and `parse_request` is run on the whole input
//! and, as the handshake reads, one message after the other (greeting, credentials when the
//! greeting offers username/password, request). For each parser and input:
//!
//! - it never panics;
//! - `NeedBytes(k)` says `k` is more than it was given and at most the message's largest size
//!   (257, 513 and 262 bytes), so the handshake's read loop always makes progress and is bounded;
//! - `Complete(_, used)` has `used <= input.len()`, and every prefix shorter than `used` gives
//!   `NeedBytes(k)` with `prefix < k <= used` (a slow client is never refused);
//! - reading as the handshake does (start empty, read up to what `NeedBytes` asks, parse again)
//!   ends where one parse of the whole input does: the same message with `used` equal to the
//!   bytes read, the same error, or the same `NeedBytes` when the input runs out. So the
//!   handshake never consumes a byte past the message, and the result depends only on its bytes;
//! - a greeting's methods are the bytes after `VER NMETHODS`, and credentials are the bytes
//!   around the length octets; `Debug` of credentials does not depend on the password;
//! - a complete request is CONNECT (`05 01 00`) of 10, 22 or 7 + name-length bytes; an IP
//!   target written by `encode_reply`, with CONNECT in place of `REP`, parses back to the same
//!   target, and for address types 1 and 4 gives this request's own bytes; a name that is an IP
//!   literal gives that IP; any other name is a non-empty UTF-8 `Domain`; the port is the last
//!   two bytes;
//! - a version-5 request with reserved byte 0 and a known address type but another command is
//!   refused with `UnsupportedCommand` (RFC 1928's intent), and `request_reply()` is `Some`
//!   exactly for the errors a request reply answers (command, address type, reserved byte,
//!   domain).
//!
//! Run: `cargo fuzz run socks5` from crates/midway-proxy (or `scripts/fuzz-smoke`).
#![no_main]

/// What `wire.rs` names as `crate::config`: the proxy's own type.
mod config {
    pub(crate) use midway_proxy::config::TargetAddr;
}

#[allow(dead_code, unreachable_pub)]
#[path = "../../src/socks5/wire.rs"]
mod wire;

use std::fmt::Debug;
use std::net::IpAddr;

use config::TargetAddr;
use libfuzzer_sys::fuzz_target;
use wire::{
    encode_reply, parse_greeting, parse_password_auth, parse_request, Credentials, Parsed,
    ProtocolError, ReplyCode, METHOD_PASSWORD,
};

type Parser<T> = fn(&[u8]) -> Result<Parsed<T>, ProtocolError>;

/// Largest message each parser reads: `VER NMETHODS` + 255 methods, `VER ULEN` + 255 + `PLEN` +
/// 255, `VER CMD RSV ATYP LEN` + 255 + port.
const MAX_GREETING: usize = 2 + 255;
const MAX_AUTH: usize = 3 + 255 + 255;
const MAX_REQUEST: usize = 4 + 1 + 255 + 2;

/// Checks one parser's contract on `data`; returns the message and its length when complete.
fn check<T: PartialEq + Debug>(parse: Parser<T>, data: &[u8], max: usize) -> Option<(T, usize)> {
    let whole = parse(data);
    match &whole {
        Ok(Parsed::NeedBytes(k)) => assert!(*k > data.len() && *k <= max, "{k}"),
        Ok(Parsed::Complete(_, used)) => {
            assert!(*used <= data.len() && *used <= max, "{used}");
            for n in 0..*used {
                match parse(&data[..n]) {
                    Ok(Parsed::NeedBytes(k)) => assert!(n < k && k <= *used, "{n}: {k}"),
                    other => panic!("prefix {n} of a {used}-byte message: {other:?}"),
                }
            }
        }
        Err(_) => {}
    }
    // The handshake's read loop (`read_message`): parse, read what it asks for, parse again.
    let mut len = 0;
    loop {
        match parse(&data[..len]) {
            Ok(Parsed::NeedBytes(k)) => {
                assert!(k > len && k <= max, "{len}: {k}");
                if k > data.len() {
                    assert_eq!(whole, Ok(Parsed::NeedBytes(k)));
                    return None;
                }
                len = k;
            }
            Ok(Parsed::Complete(msg, used)) => {
                assert_eq!(used, len);
                assert!(
                    matches!(&whole, Ok(Parsed::Complete(m, u)) if *m == msg && *u == used),
                    "{whole:?} / {msg:?}"
                );
                return Some((msg, used));
            }
            Err(err) => {
                assert_eq!(whole, Err(err));
                return None;
            }
        }
    }
}

fn check_greeting(data: &[u8]) -> Option<(Vec<u8>, usize)> {
    let (greeting, used) = check(parse_greeting, data, MAX_GREETING)?;
    assert_eq!(data[0], 5);
    assert_eq!(data[1] as usize, greeting.methods.len());
    assert!(!greeting.methods.is_empty());
    assert_eq!(greeting.methods, &data[2..used]);
    Some((greeting.methods, used))
}

fn check_auth(data: &[u8]) -> Option<usize> {
    let (creds, used) = check(parse_password_auth, data, MAX_AUTH)?;
    let ulen = creds.username.len();
    assert_eq!(data[0], 1);
    assert_eq!(data[1] as usize, ulen);
    assert_eq!(creds.username, &data[2..2 + ulen]);
    assert_eq!(data[2 + ulen] as usize, creds.password.len());
    assert_eq!(creds.password, &data[3 + ulen..used]);
    assert!(!creds.username.is_empty() && !creds.password.is_empty());
    let other = Credentials {
        username: creds.username.clone(),
        password: b"another password".to_vec(),
    };
    assert_eq!(format!("{creds:?}"), format!("{other:?}"));
    Some(used)
}

fn check_request(data: &[u8]) -> Option<usize> {
    // The address type is checked before the command (RFC 1928: a valid address with another
    // command gets "command not supported").
    let version_and_reserved_ok = data.len() >= 5 && data[0] == 5 && data[2] == 0;
    if version_and_reserved_ok && matches!(data[3], 1 | 3 | 4) && data[1] != 1 {
        assert_eq!(
            parse_request(data),
            Err(ProtocolError::UnsupportedCommand(data[1]))
        );
    }
    if let Err(err) = parse_request(data) {
        let answered = matches!(
            err,
            ProtocolError::UnsupportedCommand(_)
                | ProtocolError::UnsupportedAddressType(_)
                | ProtocolError::BadReserved(_)
                | ProtocolError::BadDomain
        );
        assert_eq!(err.request_reply().is_some(), answered, "{err:?}");
        assert!(!err.to_string().is_empty());
    }
    let (target, used) = check(parse_request, data, MAX_REQUEST)?;
    assert_eq!(&data[..3], &[5, 1, 0]);
    let port = u16::from_be_bytes([data[used - 2], data[used - 1]]);
    match (data[3], &target) {
        (1 | 4, TargetAddr::Ip(_)) => assert_eq!(used, if data[3] == 1 { 10 } else { 22 }),
        (3, TargetAddr::Ip(addr)) => {
            let name = std::str::from_utf8(&data[5..used - 2]).unwrap();
            assert_eq!(name.parse::<IpAddr>().unwrap(), addr.ip());
            assert_eq!(addr.port(), port);
            assert_eq!(used, 7 + data[4] as usize);
        }
        (3, TargetAddr::Domain(name, p)) => {
            assert_eq!(name.as_bytes(), &data[5..used - 2]);
            assert!(!name.is_empty() && name.parse::<IpAddr>().is_err());
            assert_eq!(*p, port);
        }
        other => panic!("address type {:#04x} gave {:?}", other.0, other.1),
    }
    if let TargetAddr::Ip(addr) = target {
        // encode_reply writes an address as parse_request reads it: the reply with CONNECT in
        // place of REP is a request for the same target, and for address types 1 and 4 it is
        // this request.
        let mut again = encode_reply(ReplyCode::Succeeded, addr);
        assert_eq!(&again[..3], &[5, ReplyCode::Succeeded as u8, 0]);
        again[1] = 1;
        assert_eq!(
            parse_request(&again),
            Ok(Parsed::Complete(TargetAddr::Ip(addr), again.len()))
        );
        if data[3] != 3 {
            assert_eq!(again, &data[..used]);
        }
    }
    Some(used)
}

fuzz_target!(|data: &[u8]| {
    // Each parser on the whole input, and in the handshake's order: greeting, credentials if
    // the greeting offers username/password, then the request.
    check_auth(data);
    check_request(data);
    let Some((methods, used)) = check_greeting(data) else {
        return;
    };
    let mut rest = &data[used..];
    if methods.contains(&METHOD_PASSWORD) {
        let Some(used) = check_auth(rest) else {
            return;
        };
        rest = &rest[used..];
    }
    check_request(rest);
});
