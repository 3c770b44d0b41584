//! midway-tcp: per-segment TCP profiles and how Linux applies them.
//!
//! A *profile* is a named set of TCP knobs (congestion control, initial window, delayed ACK,
//! duplicate-ACK threshold, minimum RTO, buffers, MSS, not-sent low-water mark, keepalive, user
//! timeout, pacing ceiling) that midway puts on both sockets of a segment: the one it accepts and the one it
//! connects. Each knob goes through the mechanism Linux offers for it:
//!
//! | knob | mechanism | module |
//! |---|---|---|
//! | congestion control | `TCP_CONGESTION` (midway's BPF `highspeed` / `gentle-highspeed` by their kernel names `mw_highspeed` / `mw_gentle_hs`, registered by the proxy via `midway-bpf`) | `apply` |
//! | delayed ACK off | route metric `quickack 1` + `TCP_DELACK_MAX_US` at its floor + `TCP_QUICKACK` | `routes`, `apply` |
//! | minimum RTO <= 200 ms | `TCP_RTO_MIN_US` | `apply` |
//! | minimum RTO > 200 ms | route metric `rto_min` | `routes` |
//! | initial window | route metric `initcwnd` | `routes` |
//! | duplicate-ACK threshold | route metric `reordering` (tcp_metrics cache, see caveat) | `routes` |
//! | buffers | `SO_SNDBUF`/`SO_RCVBUF` (`*FORCE` above `*mem_max`) on listener / before connect | `apply` |
//! | MSS, notsent_lowat, nodelay, keepalive, user timeout | their setsockopt | `apply` |
//! | TCP Fast Open (`fast_open`, `fast_open_queue`) | `TCP_FASTOPEN` (queue) on the listener, `TCP_FASTOPEN_CONNECT` before connect; needs `net.ipv4.tcp_fastopen` bits, checked, never written | `apply`, `fast_open` |
//! | pacing ceiling (`max_pacing_rate_bps`) | `SO_MAX_PACING_RATE` (bytes/s = bps / 8); paces any congestion control (TCP's internal pacing, Linux >= 4.13, no fq qdisc needed) | `apply` |
//!
//! Config goes in stages: [`ProfileSpec`] (file form) -> [`resolve_profiles`] (presets,
//! inheritance, validation) -> [`TcpProfile`] -> [`TcpProfile::check_supported`] against the
//! running kernel at start -> `apply_*` per socket. [`tcp_stats`] reads `tcp_info` back, and
//! [`TcpProfile::read_back`] compares a live socket with its profile, knob by knob.
//!
//! Start-up and per-connection use (route knobs need root; a profile the kernel cannot honour
//! stops start-up with an error naming the knob):
//!
//! ```no_run
//! use std::collections::BTreeMap;
//! use std::os::fd::AsFd;
//! use midway_tcp::{resolve_profiles, CarriedOptions, ProfileSpec, Role, RouteKnobs, TcpProfile};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let specs: BTreeMap<String, ProfileSpec> = BTreeMap::new(); // from `[profiles.*]`
//! let mut profiles = resolve_profiles(&specs)?;
//! for p in profiles.values() {
//!     p.check_supported()?;
//! }
//! let used: Vec<&TcpProfile> = vec![&profiles["hfc-local"], &profiles["wan"]];
//! let route_knobs = RouteKnobs::install(&used, 1000, 0x4d57_0000)?; // keep alive until stop
//! route_knobs.set_marks(profiles.values_mut());
//! let (local, remote) = (&profiles["hfc-local"], &profiles["wan"]);
//!
//! let listener = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
//! local.apply_to_listener(&listener)?; // before bind/listen
//! // ... bind, listen, accept:
//! let (accepted, _) = listener.accept()?;
//! local.apply_established(accepted.as_fd(), Role::Accepted, CarriedOptions::All)?;
//!
//! let outgoing = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
//! remote.apply_before_connect(&outgoing)?;
//! // ... connect:
//! remote.apply_established(outgoing.as_fd(), Role::Outgoing, CarriedOptions::All)?;
//! route_knobs.remove()?; // at stop (drop also removes)
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

mod apply;
mod bufrule;
mod fast_open;
/// `tcp_info` read back from a live socket (kept at this path for the crates that read it here).
pub use midway_sys::tcp_info as info;
mod presets;
mod profile;
mod routes;
mod verify;

/// Raw socket-option access the integration tests use to check what the knobs did.
pub use apply::{delack_floor_us, get_int, get_max_pacing_rate, TCP_DELACK_MAX_US, TCP_RTO_MIN_US};
pub use apply::{CarriedOptions, KnobError, Role};
pub use bufrule::BufRuleError;
pub use fast_open::{
    fast_open_sysctl_needed, FastOpenSide, DEFAULT_FAST_OPEN_QUEUE, FAST_OPEN_SYSCTL,
};
pub use info::{congestion_control_of, tcp_stats, TcpStats};
pub use presets::preset_names;
pub use profile::{
    resolve_profiles, AutoBuffer, BufferSize, Keepalive, ProfileError, ProfileSpec, TcpProfile,
};
pub use routes::{InstalledKnob, RouteKnobs, RouteKnobsError};
pub use verify::{Mismatch, ReadBackWhen};
