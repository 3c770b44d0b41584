// Tests: an unwrap that fails is the test failing.
#![allow(clippy::unwrap_used)]
//! Fuzzes the peer header's decoder, the first thing a peer listener does with bytes from the
//! network: any input is refused with a typed error or decodes to a header that verifies only
//! with the key it was made with and encodes back to the same bytes.
//! Run: `cargo fuzz run peer_header` from crates/midway-proxy.
#![no_main]

#[allow(dead_code, unreachable_pub)]
#[path = "../../src/peer/header.rs"]
mod header;

use header::{header_len, UnverifiedHeader, MAX_HEADER_LEN, PREFIX_LEN};
use libfuzzer_sys::fuzz_target;

const KEY: &[u8] = b"midway fuzz key, 32 bytes long!!";

fuzz_target!(|data: &[u8]| {
    if data.len() >= PREFIX_LEN {
        if let Ok(len) = header_len(&data[..PREFIX_LEN]) {
            assert!(len <= MAX_HEADER_LEN);
        }
    }
    if let Ok(unverified) = UnverifiedHeader::decode(data) {
        assert_eq!(header_len(data).unwrap(), data.len());
        assert!(!unverified.key_name().is_empty());
        // Random bytes do not carry a valid MAC; when they do, the header round-trips.
        if let Ok(header) = unverified.verify(KEY) {
            assert_eq!(header.encode(KEY).unwrap(), data);
        }
    }
});
