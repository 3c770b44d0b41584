//! midway-tcp: per-segment TCP profiles and how Linux applies them.
//!
//! A *profile* is a named set of TCP knobs (congestion control, initial window, delayed ACK,
//! duplicate-ACK threshold, minimum RTO, buffers, MSS, not-sent low-water mark, keepalive, user
//! timeout) that midway puts on both sockets of a segment: the one it accepts and the one it
//! connects. Each knob goes through the mechanism Linux offers for it:
//!
//! | knob | mechanism | module |
//! |---|---|---|
//! | congestion control | `TCP_CONGESTION` | [`apply`] |
//! | delayed ACK off | `TCP_DELACK_MAX_US` at its floor + `TCP_QUICKACK` | [`apply`] |
//! | minimum RTO <= 200 ms | `TCP_RTO_MIN_US` | [`apply`] |
//! | minimum RTO > 200 ms | route metric `rto_min` | [`routes`] |
//! | initial window | route metric `initcwnd` | [`routes`] |
//! | duplicate-ACK threshold | route metric `reordering` (tcp_metrics cache, see caveat) | [`routes`] |
//! | buffers | `SO_SNDBUF`/`SO_RCVBUF` (`*FORCE` above `*mem_max`) on listener / before connect | [`apply`] |
//! | MSS, notsent_lowat, nodelay, keepalive, user timeout | their setsockopt | [`apply`] |
//!
//! Config goes in stages: [`ProfileSpec`] (file form) -> [`resolve_profiles`] (presets,
//! inheritance, validation) -> [`TcpProfile`] -> [`TcpProfile::check_supported`] against the
//! running kernel at start -> `apply_*` per socket. [`tcp_stats`] reads `tcp_info` back.

pub mod apply;
pub mod bufrule;
pub mod info;
pub mod profile;
pub mod routes;

pub use apply::{KnobError, Role};
pub use info::{congestion_control_of, tcp_stats, TcpStats};
pub use profile::{
    preset_names, resolve_profiles, AutoBuffer, BufferSize, Keepalive, ProfileError, ProfileSpec,
    TcpProfile,
};
pub use routes::{RouteKnobs, RouteKnobsError};
