//! midway-cc: the congestion-window arithmetic of the congestion controls midway runs between two
//! midways, as pure functions and state machines.
//!
//! No I/O and no clock: every event (segments acked, an RTT sample in microseconds, a loss, a
//! timeout) is passed in, so tests are exact and a trace computed by hand can be checked line by
//! line. The congestion controls themselves run in the kernel as BPF `struct_ops` programs
//! written in C; this crate is the reference they are checked against, table-driven. Everything
//! that decides a window is therefore integer arithmetic in the kernel's shape (`cwnd`,
//! `cwnd_cnt`, `ssthresh` in segments), and every lookup has a fixed number of steps, so that the
//! same code ports to C and passes the verifier.
//!
//! * [`highspeed`]: HighSpeed TCP, RFC 3649: `a(w)`, `b(w)` and `p(w)` from the RFC's formulas,
//!   the RFC's Appendix B table, its fixed-step lookup, and the window on ACKs and losses.
//! * [`gentle_highspeed`]: gentle HighSpeed TCP (Zhang, Hasegawa & Murata, MASCOTS 2004; refined
//!   in IEICE Trans. Commun. E89-B(3), 2006), the variant the overlay paper runs between its TCP
//!   proxies: HighSpeed TCP's increase while the path is not filling, Reno's while the RTT is
//!   raised, HighSpeed TCP's decrease.
//! * [`response`]: the response functions (average window at a random loss rate) of Reno,
//!   HighSpeed TCP and gentle HighSpeed TCP, which predict a flow's share of a path.
//! * [`window`]: the window both share: Reno slow start and the kernel's `cwnd_cnt` additive
//!   increase.
//!
//! Each module's documentation writes down its algorithm, its parameters and where they come
//! from, and which values are midway's own choice.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod gentle_highspeed;
pub mod highspeed;
pub mod response;
pub mod window;
