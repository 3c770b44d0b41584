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
//!   server's first bytes (checked on a short, bounded schedule off the per-packet path). IPv4
//!   connecting sockets keep no received TOS in this kernel, so over an IPv4 remote segment
//!   the server's marking is not carried.
//!
//! Only the six DSCP bits are carried; the two ECN bits belong to each segment's own TCP.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use midway_relay::RelayCounters;
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

/// Carries the server's marking to the local socket once the relay has counted the server's
/// first bytes. Made before the relay takes both sockets; they are known by inode from then
/// on, so a closed one is never touched.
pub(super) struct ServerClassCarrier {
    remote: SocketId,
    local: SocketId,
}

impl ServerClassCarrier {
    /// `None` when there is nothing to carry: a segment without a TCP socket of its own, or an
    /// IPv4 remote segment (a connecting IPv4 socket never reads a received TOS).
    pub(super) fn new(
        remote: Option<&TcpStream>,
        local: Option<&TcpStream>,
    ) -> Option<ServerClassCarrier> {
        let (remote, local) = (remote?, local?);
        if !remote.peer_addr().is_ok_and(|addr| addr.is_ipv6()) {
            return None;
        }
        Some(ServerClassCarrier {
            remote: SocketId::new(remote),
            local: SocketId::new(local),
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
            let Some(class) = self
                .remote
                .borrow()
                .and_then(|fd| midway_sys::tos::received_class(fd).ok().flatten())
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
