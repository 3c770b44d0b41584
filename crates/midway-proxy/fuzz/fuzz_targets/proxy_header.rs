// Tests: an unwrap that fails is the test failing.
#![allow(clippy::unwrap_used)]
//! Fuzzes the PROXY protocol header reader (`src/proxy_protocol.rs`), the first thing a listener
//! with `accept_proxy_protocol` runs on bytes from a listed load balancer. Properties:
//!
//! - `scan` never panics; every `Need(k)` asks for more than it was given and at most a v2
//!   header's largest size (16 + 65535 bytes);
//! - reading as the listener does (exactly what each `Need` asks for) ends, within the
//!   listener's bound on reads, in a header or an error, and never takes a byte past the
//!   header: a header found in the input is also found, with the same result, when bytes
//!   follow it;
//! - a client and destination a header names go through `v2_header` and back unchanged (as
//!   IPv6 when their families differ).
//!
//! Run: `cargo fuzz run proxy_header` from crates/midway-proxy (or `scripts/fuzz-smoke`).
#![no_main]

#[allow(dead_code, unreachable_pub)]
#[path = "../../src/proxy_protocol.rs"]
mod proxy_protocol;

use std::net::SocketAddr;

use libfuzzer_sys::fuzz_target;
use proxy_protocol::{scan, v2_header, Proxied, Scan};

/// The largest v2 header.
const MAX_HEADER: usize = 16 + 65535;
/// The listener's bound on reads of one header (`server/proxied.rs`).
const MAX_READS: usize = 128;

/// Reads `data` as the listener does: the outcome and the bytes taken.
fn read(data: &[u8]) -> (Option<Result<Proxied, String>>, usize) {
    let mut taken = 0;
    for _ in 0..MAX_READS {
        match scan(&data[..taken]) {
            Ok(Scan::Need(total)) => {
                assert!(total > taken, "Need({total}) after {taken} bytes");
                assert!(total <= MAX_HEADER, "Need({total})");
                if total > data.len() {
                    return (None, taken);
                }
                taken = total;
            }
            Ok(Scan::Complete(proxied)) => return (Some(Ok(proxied)), taken),
            Err(err) => return (Some(Err(err.to_string())), taken),
        }
    }
    panic!("no outcome within {MAX_READS} reads");
}

fn v6(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V4(v4) => SocketAddr::new(v4.ip().to_ipv6_mapped().into(), v4.port()),
        SocketAddr::V6(_) => addr,
    }
}

fuzz_target!(|data: &[u8]| {
    let (outcome, taken) = read(data);
    let Some(outcome) = outcome else {
        return;
    };
    // Bytes after the header change nothing.
    let mut longer = data[..taken].to_vec();
    longer.extend_from_slice(b"\r\n\0 client bytes");
    let (again, taken_again) = read(&longer);
    assert_eq!(again, Some(outcome.clone()));
    assert_eq!(taken_again, taken);
    if let Ok(Proxied::Client {
        client,
        destination,
    }) = outcome
    {
        let header = v2_header(client, destination).unwrap();
        let (back, used) = read(&header);
        assert_eq!(used, header.len());
        let Some(Ok(Proxied::Client {
            client: back_client,
            destination: back_destination,
        })) = back
        else {
            panic!("{back:?}");
        };
        let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
        if canonical(client).is_ipv4() == canonical(destination).is_ipv4() {
            assert_eq!(
                (back_client, back_destination),
                (canonical(client), canonical(destination))
            );
        } else {
            assert_eq!(
                (v6(back_client), v6(back_destination)),
                (v6(client), v6(destination))
            );
        }
    }
});
