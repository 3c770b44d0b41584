// Tests: an unwrap that fails is the test failing.
#![allow(clippy::unwrap_used)]
//! Fuzzes the client-facing parser: request head, then the body framing it selects.
//! `head.rs` and `framing.rs` are compiled on their own (they need only http, httparse, bytes and
//! thiserror), not the HTTP engine around them.
//! Run: `cargo fuzz run request_parser` from crates/midway-http.
#![no_main]

#[allow(dead_code, unreachable_pub)]
#[path = "../../src/framing.rs"]
mod framing;
#[allow(dead_code, unreachable_pub)]
#[path = "../../src/head.rs"]
mod head;

use framing::BodyDecoder;
use head::{parse_request, Parsed};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Parsed::Complete(head, len)) = parse_request(data, 8192) {
        assert!(len <= data.len());
        let mut decoder = BodyDecoder::new(head.body);
        let mut rest = &data[len..];
        for _ in 0..=rest.len() {
            let Ok(step) = decoder.step(rest) else { break };
            assert!(step.consumed <= rest.len() && step.payload.end <= step.consumed);
            if step.consumed == 0 {
                break;
            }
            rest = &rest[step.consumed..];
        }
    }
});
