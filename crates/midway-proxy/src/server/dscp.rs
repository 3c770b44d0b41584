//! DSCP carried across the split (a listener's `carry_dscp`): the marking the client's packets
//! carry goes onto the remote socket before it connects (so the SYN has it), and the server's
//! onto the local socket once the server's first bytes have arrived. Access networks (DOCSIS,
//! mobile) classify service flows by DSCP; without this the split would drop the marking.
//!
//! When each marking is known (midway-sys's `tos` module has the kernel's rules):
//! - the client's: at accept, from the packet that completed the handshake (IPv4 and IPv6;
//!   the listening socket asks the kernel to keep it, accepted sockets inherit that), so no
//!   client byte is needed and server-speaks-first protocols are marked too;
//! - the server's: from the last segment received, read once after the relay has seen the
//!   server's first bytes (checked on a short, bounded schedule off the per-packet path). An
//!   IPv6 socket keeps it when asked; an IPv4 connecting socket keeps none, so there a BPF
//!   socket filter records it (midway-sys's `tos_filter`, loaded once, attached before connect
//!   and detached once read). Loading it needs `CAP_BPF`: without, the server's marking is
//!   not carried over IPv4 remote segments (logged once).
//!
//! Only the six DSCP bits are carried; the two ECN bits belong to each segment's own TCP.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use midway_relay::RelayCounters;
use midway_sys::tos_filter::ReceivedTosFilter;
use tokio::net::TcpStream;

use super::socket_id::SocketId;

/// The DSCP bits of the traffic class byte (the low two are ECN).
const DSCP_MASK: u8 = 0xfc;

/// First wait before looking for the server's first bytes; each later wait doubles, up to
/// [`SERVER_CHECK_MAX_WAIT`].
const SERVER_CHECK_FIRST_WAIT: Duration = Duration::from_millis(1);
const SERVER_CHECK_MAX_WAIT: Duration = Duration::from_secs(2);
/// Checks before giving up on a server that sends nothing (about a minute with the waits
/// above): a connection whose server stays silent keeps the local segment unmarked.
const SERVER_CHECKS: u32 = 40;

/// The class byte to send with: `received`'s DSCP with `current`'s ECN bits.
pub(super) fn carried(received: u8, current: u8) -> u8 {
    (received & DSCP_MASK) | (current & !DSCP_MASK)
}

/// The traffic class the client's packets carried, read on the accepted socket (`None` when
/// the kernel kept none, or the segment has no TCP socket of its own).
pub(super) fn client_class(client: Option<&TcpStream>) -> Option<u8> {
    let client = client?;
    match midway_sys::tos::received_class(client.as_fd()) {
        Ok(class) => class,
        Err(err) => {
            tracing::debug!(error = %err, "client's traffic class not readable");
            None
        }
    }
}

/// Puts `received`'s DSCP on `socket` (a remote socket before it connects, or the local one).
pub(super) fn mark(socket: impl AsFd, received: u8) -> std::io::Result<()> {
    let fd = socket.as_fd();
    let current = midway_sys::tos::class(fd)?;
    midway_sys::tos::set_class(fd, carried(received, current))
}

/// The filter that records the TOS IPv4 remote sockets receive, loaded on first use; `None`
/// when this process may not load BPF programs.
fn ipv4_filter() -> Option<&'static ReceivedTosFilter> {
    static FILTER: OnceLock<Option<ReceivedTosFilter>> = OnceLock::new();
    FILTER
        .get_or_init(|| match ReceivedTosFilter::load() {
            Ok(filter) => Some(filter),
            Err(err) => {
                tracing::warn!(error = %err, "carry_dscp: the server's DSCP is not carried over IPv4 remote segments (its BPF socket filter needs CAP_BPF)");
                None
            }
        })
        .as_ref()
}

/// Asks a remote socket, before it connects, to keep the traffic class of the server's
/// packets: the kernel's own option over IPv6, the BPF filter over IPv4. A failure only means
/// the server's marking is not carried, so it is logged, not returned.
pub(super) fn keep_server_class(socket: impl AsFd, v6: bool) {
    let fd = socket.as_fd();
    let kept = if v6 {
        midway_sys::tos::set_keep_received_class(fd, true)
    } else {
        match ipv4_filter() {
            Some(filter) => filter.attach(fd),
            None => return,
        }
    };
    if let Err(err) = kept {
        tracing::debug!(error = %err, "server's DSCP will not be carried");
    }
}

/// The traffic class the server's packets carried, read on the remote socket (taking the
/// IPv4 filter off it).
fn server_class(fd: BorrowedFd<'_>, v6: bool) -> Option<u8> {
    let read = if v6 {
        midway_sys::tos::received_class(fd)
    } else {
        ipv4_filter()?.take(fd)
    };
    read.ok().flatten()
}

/// Carries the server's marking to the local socket once the relay has counted the server's
/// first bytes. Made before the relay takes both sockets; they are known by inode from then
/// on, so a closed one is never touched.
pub(super) struct ServerClassCarrier {
    remote: SocketId,
    local: SocketId,
    remote_v6: bool,
}

impl ServerClassCarrier {
    /// `None` when there is nothing to carry: a segment without a TCP socket of its own, or an
    /// IPv4 remote segment without the BPF filter.
    pub(super) fn new(
        remote: Option<&TcpStream>,
        local: Option<&TcpStream>,
    ) -> Option<ServerClassCarrier> {
        let (remote, local) = (remote?, local?);
        let remote_v6 = remote.peer_addr().ok()?.is_ipv6();
        if !remote_v6 && ipv4_filter().is_none() {
            return None;
        }
        Some(ServerClassCarrier {
            remote: SocketId::new(remote),
            local: SocketId::new(local),
            remote_v6,
        })
    }

    /// Waits (bounded) for the server's first bytes, then marks the local socket once.
    pub(super) async fn run(mut self, counters: Arc<RelayCounters>) {
        let mut wait = SERVER_CHECK_FIRST_WAIT;
        for _ in 0..SERVER_CHECKS {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(SERVER_CHECK_MAX_WAIT);
            if counters.server_to_client.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let remote_v6 = self.remote_v6;
            let Some(class) = self
                .remote
                .borrow()
                .and_then(|fd| server_class(fd, remote_v6))
            else {
                return;
            };
            if let Some(fd) = self.local.borrow() {
                match mark(fd, class) {
                    Ok(()) => tracing::debug!(class, "server's DSCP carried to the client"),
                    Err(err) => tracing::debug!(error = %err, "server's DSCP not carried"),
                }
            }
            return;
        }
        // A server silent this long: the IPv4 filter need not run on the socket any longer.
        let remote_v6 = self.remote_v6;
        if let Some(fd) = self.remote.borrow() {
            let _ = server_class(fd, remote_v6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_the_dscp_and_keeps_the_segments_ecn_bits() {
        assert_eq!(carried(0xb8, 0), 0xb8);
        assert_eq!(carried(0xb9, 0x02), 0xba, "ECN bits come from the segment");
        assert_eq!(carried(0x03, 0x01), 0x01, "ECN bits alone carry nothing");
        assert_eq!(carried(0, 0xb8), 0, "an unmarked peer clears the marking");
    }
}
