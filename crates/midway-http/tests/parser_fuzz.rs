// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Bounded, seeded fuzzing of the request parser and body decoder that runs in `cargo test`
//! (the cargo-fuzz target in `fuzz/` explores further when cargo-fuzz is available).

use midway_http::framing::{BodyDecoder, BodyKind};
use midway_http::head::{parse_request, parse_response, Parsed};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SEEDS: &[&[u8]] = &[
    b"GET http://example.com/a?b=c HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n",
    b"POST http://h:8080/p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n",
    b"PUT http://h/p HTTP/1.0\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nabc",
    b"CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n",
    b"GET /origin-form HTTP/1.1\r\nHost: [::1]:81\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
];

const DICTIONARY: &[&[u8]] = &[
    b"\r\n",
    b"\r\n\r\n",
    b":",
    b" ",
    b"HTTP/1.1",
    b"HTTP/1.0",
    b"chunked",
    b"Content-Length: ",
    b"Transfer-Encoding: ",
    b"Host: ",
    b"http://",
    b"CONNECT ",
    b"0\r\n",
    b"ffffffffffffffff",
    b"\x00",
    b"\xff",
];

fn mutate(rng: &mut ChaCha8Rng, input: &mut Vec<u8>) {
    for _ in 0..rng.gen_range(1..6) {
        match rng.gen_range(0..5) {
            0 if !input.is_empty() => {
                let at = rng.gen_range(0..input.len());
                input[at] = rng.gen();
            }
            1 if !input.is_empty() => {
                let at = rng.gen_range(0..input.len());
                let len = rng.gen_range(0..=(input.len() - at).min(16));
                input.drain(at..at + len);
            }
            2 => {
                let at = rng.gen_range(0..=input.len());
                let word = DICTIONARY[rng.gen_range(0..DICTIONARY.len())];
                input.splice(at..at, word.iter().copied());
            }
            3 => {
                let at = rng.gen_range(0..=input.len());
                let byte: u8 = rng.gen();
                let count = rng.gen_range(1..64);
                input.splice(at..at, std::iter::repeat_n(byte, count));
            }
            _ => input.truncate(rng.gen_range(0..=input.len())),
        }
    }
}

/// Everything the proxy does with a client's bytes: head, then body framing. Must never panic
/// and must never consume more than it was given.
fn exercise(input: &[u8]) -> bool {
    let mut parsed = false;
    if let Ok(Parsed::Complete(head, len)) = parse_request(input, 4096) {
        parsed = true;
        assert!(len <= input.len());
        let mut decoder = BodyDecoder::new(head.body);
        let mut rest = &input[len..];
        for _ in 0..=rest.len() {
            match decoder.step(rest) {
                Ok(step) => {
                    assert!(step.consumed <= rest.len() && step.payload.end <= step.consumed);
                    if step.consumed == 0 {
                        break;
                    }
                    rest = &rest[step.consumed..];
                }
                Err(_) => break,
            }
        }
    }
    if let Ok(Parsed::Complete(head, _)) = parse_response(input, 4096) {
        let _ = head.body_kind(&http::Method::GET);
    }
    let mut chunked = BodyDecoder::new(BodyKind::Chunked);
    let _ = chunked.step(input);
    parsed
}

#[test]
fn seeded_random_and_mutated_inputs_never_panic() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x6d69_6477_6179);
    let mut parsed = 0;
    const ROUNDS: usize = 20_000;
    for round in 0..ROUNDS {
        let mut input = if round % 4 == 0 {
            (0..rng.gen_range(0..512)).map(|_| rng.gen()).collect()
        } else {
            SEEDS[rng.gen_range(0..SEEDS.len())].to_vec()
        };
        mutate(&mut rng, &mut input);
        if exercise(&input) {
            parsed += 1;
        }
    }
    // The mutations must leave enough valid requests to reach the body decoder.
    assert!(parsed > ROUNDS / 20, "only {parsed} inputs parsed");
    for seed in SEEDS {
        exercise(seed);
    }
}
