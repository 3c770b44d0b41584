//! midway-quic: the QUIC peer transport (`transport = "quic"` between two midways).
//!
//! One long-lived QUIC connection per peer carries every proxied connection as one
//! bidirectional stream, so a new connection on a warm tunnel starts at the tunnel's
//! congestion window instead of an initial window. Both ends authenticate with the same pinned
//! keys as `transport = "tls"` (midway-tls's rustls configs).
//!
//! * [`cc`]: the congestion control of a tunnel, chosen per peer: quinn's NewReno, CUBIC and
//!   BBR, and midway's HighSpeed and gentle HighSpeed TCP driven by midway-cc's window
//!   arithmetic (the model the BPF versions are checked against).

pub mod cc;
