//! midway-relay's integration tests, both relay models over real loopback sockets. One test
//! binary with a module per file, not a binary per file: each binary compiled and optimised its
//! own copy of tokio's and the test kit's generic code, which made a large part of CI's build.
//! `cargo test -p midway-relay --test integration parking::` runs one file's tests.

mod backpressure;
mod client_window;
mod close_rule;
mod halfclose_reset;
mod lifecycle;
mod parking;
mod stream_relay;
mod transfer;
