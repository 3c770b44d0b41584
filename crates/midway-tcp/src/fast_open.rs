//! TCP Fast Open (`fast_open` in a profile): what the kernel needs for it and how it is read
//! back. A listener takes it as `TCP_FASTOPEN` (its queue of pending Fast Open requests), an
//! outgoing socket as `TCP_FASTOPEN_CONNECT` (`connect()` returns at once and the SYN leaves
//! with the first write, carrying data when the socket has a cookie for the server).
//!
//! The kernel honours either only when `net.ipv4.tcp_fastopen`, a per-namespace sysctl, has the
//! matching bit: 1 lets sockets connect with Fast Open, 2 lets listeners accept it. midway never
//! writes it; [`TcpProfile::check_fast_open`] refuses to start where the bit is missing.

use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;

use midway_sys::sockopt::get_int;

use crate::apply::KnobError;
use crate::profile::TcpProfile;
use crate::verify::Mismatch;

/// A listener's Fast Open queue when the profile sets `fast_open` without `fast_open_queue`:
/// pending requests (SYNs with data whose handshake is not complete) the kernel keeps at once;
/// beyond them it falls back to a normal handshake. The kernel's own default for listeners
/// that the sysctl turns on without the socket option.
pub const DEFAULT_FAST_OPEN_QUEUE: u32 = 256;

/// The sysctl that enables Fast Open, per network namespace.
pub const FAST_OPEN_SYSCTL: &str = "net.ipv4.tcp_fastopen";

/// Which end of Fast Open a profile is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FastOpenSide {
    /// A listener's profile: accepts data in SYNs.
    Accepting,
    /// A remote segment's profile: connects with a cookie.
    Connecting,
}

impl FastOpenSide {
    /// The bit of [`FAST_OPEN_SYSCTL`] this side needs.
    pub fn sysctl_bit(self) -> u32 {
        match self {
            FastOpenSide::Connecting => 1,
            FastOpenSide::Accepting => 2,
        }
    }
}

impl fmt::Display for FastOpenSide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FastOpenSide::Accepting => "accepting (listener)",
            FastOpenSide::Connecting => "connecting (remote segment)",
        })
    }
}

/// The value [`FAST_OPEN_SYSCTL`] needs for `side`, given its value `current` (its other bits
/// kept); `None` when it already allows it.
pub fn fast_open_sysctl_needed(current: u32, side: FastOpenSide) -> Option<u32> {
    let bit = side.sysctl_bit();
    (current & bit == 0).then_some(current | bit)
}

impl TcpProfile {
    /// The Fast Open queue a listener with this profile gets (`None`: the profile leaves
    /// Fast Open alone; `Some(0)`: off).
    pub fn listener_fast_open_queue(&self) -> Option<u32> {
        self.fast_open.map(|on| match on {
            true => self.fast_open_queue.unwrap_or(DEFAULT_FAST_OPEN_QUEUE),
            false => 0,
        })
    }

    /// Checks that this namespace's [`FAST_OPEN_SYSCTL`] lets the kernel honour `fast_open`
    /// on `side` (nothing to check unless the profile turns it on). The error names the sysctl
    /// and the value it needs.
    pub fn check_fast_open(&self, side: FastOpenSide) -> Result<(), KnobError> {
        if self.fast_open != Some(true) {
            return Ok(());
        }
        let probe = |source| KnobError::Probe {
            knob: "fast_open",
            source,
        };
        let text = midway_sys::sysctl::read(FAST_OPEN_SYSCTL).map_err(probe)?;
        let current: u32 = text
            .trim()
            .parse()
            .map_err(|_| probe(io::Error::from(io::ErrorKind::InvalidData)))?;
        match fast_open_sysctl_needed(current, side) {
            None => Ok(()),
            Some(needed) => Err(KnobError::FastOpenDisabled {
                profile: self.name.clone(),
                side,
                current,
                needed,
            }),
        }
    }

    /// Reads Fast Open back from a live socket: a listener's queue (`TCP_FASTOPEN`) or an
    /// outgoing socket's `TCP_FASTOPEN_CONNECT`. Whether a connection really carried data in
    /// its SYN is in its `tcp_info` ([`midway_sys::tcp_info::TcpStats::syn_data`]).
    pub fn read_back_fast_open(
        &self,
        fd: BorrowedFd<'_>,
        side: FastOpenSide,
    ) -> io::Result<Vec<Mismatch>> {
        let mut out = Vec::new();
        match side {
            FastOpenSide::Accepting => {
                if let Some(queue) = self.listener_fast_open_queue() {
                    let got = get_int(fd, libc::IPPROTO_TCP, libc::TCP_FASTOPEN)?;
                    if i64::from(got) != i64::from(queue) {
                        out.push(Mismatch {
                            knob: "fast_open_queue",
                            wanted: queue.to_string(),
                            got: got.to_string(),
                        });
                    }
                }
            }
            FastOpenSide::Connecting => {
                if let Some(on) = self.fast_open {
                    let got = get_int(fd, libc::IPPROTO_TCP, libc::TCP_FASTOPEN_CONNECT)? != 0;
                    if got != on {
                        out.push(Mismatch {
                            knob: "fast_open",
                            wanted: on.to_string(),
                            got: got.to_string(),
                        });
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sysctl_needs_the_sides_bit_and_keeps_the_others() {
        use FastOpenSide::{Accepting, Connecting};
        assert_eq!(fast_open_sysctl_needed(1, Connecting), None);
        assert_eq!(fast_open_sysctl_needed(1, Accepting), Some(3));
        assert_eq!(fast_open_sysctl_needed(0, Connecting), Some(1));
        assert_eq!(fast_open_sysctl_needed(2, Connecting), Some(3));
        assert_eq!(fast_open_sysctl_needed(0x402, Accepting), None);
        assert_eq!(fast_open_sysctl_needed(0x400, Accepting), Some(0x402));
    }

    #[test]
    fn a_listeners_queue_reads_back() {
        use socket2::{Domain, Protocol, Socket, Type};
        use std::os::fd::AsFd;
        let mut profile = TcpProfile::kernel_default("p");
        profile.fast_open = Some(true);
        profile.fast_open_queue = Some(32);
        // TCP_FASTOPEN on a listener needs no sysctl bit (accepting with it does).
        let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        profile.apply_to_listener(&sock).unwrap();
        let side = FastOpenSide::Accepting;
        assert!(profile
            .read_back_fast_open(sock.as_fd(), side)
            .unwrap()
            .is_empty());
        profile.fast_open_queue = Some(33);
        let mismatches = profile.read_back_fast_open(sock.as_fd(), side).unwrap();
        assert_eq!(mismatches[0].got, "32");
    }

    #[test]
    fn a_listener_gets_the_default_queue_unless_the_profile_sets_one() {
        let mut profile = TcpProfile::kernel_default("p");
        assert_eq!(profile.listener_fast_open_queue(), None);
        profile.fast_open = Some(true);
        assert_eq!(
            profile.listener_fast_open_queue(),
            Some(DEFAULT_FAST_OPEN_QUEUE)
        );
        profile.fast_open_queue = Some(16);
        assert_eq!(profile.listener_fast_open_queue(), Some(16));
        profile.fast_open = Some(false);
        assert_eq!(profile.listener_fast_open_queue(), Some(0));
    }
}
