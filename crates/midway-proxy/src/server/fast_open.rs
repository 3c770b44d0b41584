//! TCP Fast Open on the remote segment (a remote profile with `fast_open`): the handshake that
//! `TCP_FASTOPEN_CONNECT` defers until the first send is started here, at connect, with the
//! client's bytes that are already at midway, so the connect path stays what it is without
//! Fast Open: it returns an established socket (or the connect's error) and nothing waits for
//! a first write that may never come.
//!
//! Why not leave the SYN to the relay's first write: a server that speaks first (SMTP, SSH, a
//! banner through a forward listener) would never be contacted while its client waits for it,
//! and a SOCKS5 client would get its success reply before the server was reached. Instead:
//! - the client's bytes already queued on the accepted socket (its first flight: always there
//!   when the client used Fast Open itself, often in forward and transparent mode, never for a
//!   SOCKS5 client, which waits for the reply) are peeked and sent in the SYN; once the
//!   handshake completes, exactly the bytes the kernel took are read off the client's queue,
//!   so the relay carries on after them;
//! - with none, an empty send starts the handshake (the SYN asks for a cookie, or carries the
//!   cookie without data).
//!
//! Without a cookie for the server the kernel connects as usual (and asks for one): the bytes
//! then go as ordinary data after the handshake, which costs nothing either. The bytes sent
//! here are added to the relay's byte counts by the caller.

use std::io;
use std::os::fd::AsFd;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// The most of the client's first bytes offered to the SYN; the kernel takes what fits in one
/// segment (an MSS less the options), so more would never go.
const SYN_DATA_MAX: usize = 1460;

/// Readiness rounds before giving up on a handshake that neither completes nor fails (each
/// waits for an event of the socket; the caller's connect timeout bounds the time).
const HANDSHAKE_ROUNDS: usize = 64;

/// Starts the deferred handshake of `remote` (connected with `TCP_FASTOPEN_CONNECT`) with the
/// bytes `client` has queued, waits until it completes, and takes the bytes the SYN carried
/// off `client`'s queue. Returns how many went.
pub(super) async fn complete_handshake(
    remote: &TcpStream,
    client: Option<&TcpStream>,
) -> io::Result<usize> {
    let mut first = [0u8; SYN_DATA_MAX];
    let queued = match client {
        Some(client) => midway_sys::sockopt::peek_now(client.as_fd(), &mut first)?,
        None => 0,
    };
    let mut sent = None;
    for _ in 0..HANDSHAKE_ROUNDS {
        remote.writable().await?;
        // The first send offers the client's bytes; later ones are empty and only ask
        // whether the handshake is done (0 once established, EAGAIN while in progress).
        let offer: &[u8] = if sent.is_none() {
            &first[..queued]
        } else {
            &[]
        };
        let result = remote.try_io(Interest::WRITABLE, || {
            match midway_sys::sockopt::send_now(remote.as_fd(), offer) {
                // The SYN left without data (no bytes, or no cookie): like EAGAIN, wait
                // for the handshake (and let tokio clear the readiness it cached).
                Err(err) if err.raw_os_error() == Some(libc::EINPROGRESS) => {
                    Err(io::ErrorKind::WouldBlock.into())
                }
                other => other,
            }
        });
        match result {
            Ok(n) if sent.is_none() => sent = Some(n),
            Ok(_) => break,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                sent.get_or_insert(0);
            }
            Err(err) => return Err(err),
        }
        if let Some(err) = remote.take_error()? {
            return Err(err);
        }
    }
    // The handshake is complete: the peer address is known only to a connected socket.
    remote.peer_addr()?;
    let sent = sent.unwrap_or(0);
    if let Some(client) = client.filter(|_| sent > 0) {
        midway_relay::reset_if_crashed(client);
        take_off_queue(client, sent)?;
    }
    Ok(sent)
}

/// Reads `n` bytes off `client`'s queue, which holds them (they were peeked). Straight from
/// the socket: tokio may not have seen it readable yet, and needs not (a later read of its own
/// that finds nothing only clears what it cached).
fn take_off_queue(client: &TcpStream, n: usize) -> io::Result<()> {
    let mut scratch = [0u8; SYN_DATA_MAX];
    let mut left = n.min(scratch.len());
    // Each read takes at least one byte of what was peeked, so this ends within `n` rounds.
    while left > 0 {
        match midway_sys::sockopt::read_now(client.as_fd(), &mut scratch[..left])? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            read => left -= read,
        }
    }
    Ok(())
}
