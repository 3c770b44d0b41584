//! Connect: the remote segment's socket (resolution, denied destinations, profile before
//! connect, optional spoofed source address), the profile steps every proxy socket gets once
//! established, and the socket steps besides (the transparent option, a close with a reset).
//! The HTTP engine opens its upstream sockets through the same path.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use midway_http::ConnectUpstream;
use midway_tcp::{CarriedOptions, Role, TcpProfile};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::net::{TcpSocket, TcpStream};

use super::error::SetupError;
use super::memory::{self, leaves_buffers};
use super::own_addresses::is_denied;
use crate::config::{DeniedDestinations, TargetAddr};
use crate::sockmem::SocketMemory;

/// Makes a socket transparent (IP_TRANSPARENT / IPV6_TRANSPARENT): a listener then accepts
/// TPROXY'd connections, an outgoing socket may bind to an address that is not local.
pub(super) fn set_transparent(sock: &Socket, v6: bool) -> io::Result<()> {
    if v6 {
        midway_sys::sockopt::set_int(sock.as_fd(), libc::SOL_IPV6, libc::IPV6_TRANSPARENT, 1)
    } else {
        sock.set_ip_transparent(true)
    }
}

/// Closes with a reset, so a refused client learns at once and no TIME_WAIT stays behind.
pub(super) fn close_now(stream: TcpStream) {
    // Linger 0 does not block: the kernel sends RST and frees the socket at once.
    midway_relay::reset_if_crashed(&stream);
    drop(stream);
}

/// The profile steps of an established proxy socket: the knobs `carried` says it lacks (see
/// [`TcpProfile::apply_established`]), TCP_NODELAY among them unless the profile decides (see
/// [`default_nodelay`]).
pub(super) fn apply_established(
    stream: &TcpStream,
    profile: &TcpProfile,
    role: Role,
    carried: CarriedOptions,
) -> Result<(), SetupError> {
    if carried == CarriedOptions::None {
        default_nodelay(stream.as_fd(), profile).map_err(SetupError::Nodelay)?;
    }
    profile.apply_established(stream.as_fd(), role, carried)?;
    Ok(())
}

/// Turns Nagle's algorithm off on a proxy socket unless `profile` sets `nodelay` itself: on
/// listeners (accepted sockets inherit it) and on outgoing sockets before connect, like the
/// profile's own options.
///
/// A proxy forwards what it has when it has it; the end hosts already decided how to batch
/// their writes. With Nagle on, the short tail of every relayed chunk (or every small HTTP
/// response piece) waits for the ACK of the data before it, which on a delayed-ACK receiver
/// costs up to its delayed-ACK time per chunk, and under load keeps megabytes queued in the
/// socket (see docs/results/bench/README.md, "A profile of the relay"). HAProxy and Squid also set
/// TCP_NODELAY on both sides. A profile can still ask for Nagle with `nodelay = false`.
pub(super) fn default_nodelay(fd: BorrowedFd<'_>, profile: &TcpProfile) -> io::Result<()> {
    if profile.nodelay.is_none() {
        midway_sys::sockopt::set_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)?;
    }
    Ok(())
}

/// The HTTP engine's way to open an upstream connection: the same `connect` and profile steps
/// as a split connection's remote segment (profile before connect, route mark, established
/// knobs, TCP_NODELAY unless the profile decides), bounded by `connect_timeout`.
///
/// While the socket memory guard's caps are in force, a new upstream socket gets them at once
/// (for the buffers its profile leaves to the kernel). The engine pools upstream sockets and
/// shares them between clients, so they belong to no connection that could follow later cap
/// changes: a socket made under caps keeps them until it closes, one made before keeps its
/// autotuned buffers. The pool's keep time bounds both.
pub(super) fn upstream_connector(
    profile: TcpProfile,
    timeout: Duration,
    denied: Arc<DeniedDestinations>,
    socket_memory: Option<Arc<SocketMemory>>,
) -> ConnectUpstream {
    let profile = Arc::new(profile);
    Arc::new(move |addr: SocketAddr| {
        let profile = profile.clone();
        let denied = denied.clone();
        let socket_memory = socket_memory.clone();
        Box::pin(async move {
            let (stream, _) = connect(
                &TargetAddr::Ip(addr),
                &profile,
                Outgoing::default(),
                Some(&denied),
                timeout,
            )
            .await
            .map_err(SetupError::into_io)?;
            apply_established(&stream, &profile, Role::Outgoing, CarriedOptions::All)
                .map_err(SetupError::into_io)?;
            if let Some(guard) = &socket_memory {
                memory::cap_once(guard, &stream, leaves_buffers(&profile));
            }
            Ok(stream)
        })
    })
}

/// The addresses of `target` outside `denied`, in the resolver's order; an error when it
/// resolves to none or only to denied ones.
async fn resolve(
    target: &TargetAddr,
    denied: Option<&DeniedDestinations>,
) -> Result<Vec<SocketAddr>, SetupError> {
    let addrs: Vec<SocketAddr> = match target {
        TargetAddr::Ip(addr) => vec![*addr],
        TargetAddr::Domain(host, port) => tokio::net::lookup_host((host.as_str(), *port))
            .await
            .map_err(|source| SetupError::Resolve {
                target: target.to_string(),
                source,
            })?
            .collect(),
    };
    let resolved_any = !addrs.is_empty();
    let addrs: Vec<SocketAddr> = addrs
        .into_iter()
        .filter(|addr| !is_denied(denied, addr.ip()))
        .collect();
    if resolved_any && addrs.is_empty() {
        return Err(SetupError::DestinationDenied {
            target: target.to_string(),
        });
    }
    Ok(addrs)
}

/// The one address a connection through a peer goes to: the first of `target`'s outside
/// `denied` (the header carries an address, and the peer is chosen by it), within `timeout`.
pub(super) async fn resolve_first(
    target: &TargetAddr,
    denied: Option<&DeniedDestinations>,
    timeout: Duration,
) -> Result<SocketAddr, SetupError> {
    let target_text = target.to_string();
    match tokio::time::timeout(timeout, resolve(target, denied)).await {
        Ok(addrs) => addrs?.first().copied().ok_or(SetupError::NoAddress {
            target: target_text,
        }),
        Err(_) => Err(SetupError::ConnectTimeout {
            target: target_text,
        }),
    }
}

/// What a remote segment's socket carries of its client besides the profile.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Outgoing<'a> {
    /// Connect from the client's own address.
    pub(super) spoof_from: Option<IpAddr>,
    /// The traffic class the client's packets carried, whose DSCP the remote socket sends
    /// with from its SYN on (`carry_dscp`).
    pub(super) class: Option<u8>,
    /// Keep the traffic class of the server's packets, to carry it to the client (see
    /// `dscp.rs`).
    pub(super) keep_server_class: bool,
    /// The client's plain TCP socket, whose queued first bytes a Fast Open SYN carries
    /// (`fast_open.rs`), and where to count them (the relay never sees them); `None`: the SYN
    /// goes without data.
    pub(super) first_bytes_from: Option<(&'a TcpStream, &'a AtomicU64)>,
}

/// Resolves `target` and connects the remote segment with `profile`, as `outgoing` says, to
/// the first of its addresses that is not in `denied` and accepts. Returns the socket and the
/// address it connected to.
pub(super) async fn connect(
    target: &TargetAddr,
    profile: &TcpProfile,
    outgoing: Outgoing<'_>,
    denied: Option<&DeniedDestinations>,
    timeout: Duration,
) -> Result<(TcpStream, SocketAddr), SetupError> {
    let attempt = async {
        let addrs = resolve(target, denied).await?;
        let mut last_err = None;
        for addr in addrs {
            match connect_with_backup(addr, profile, outgoing).await {
                Ok(stream) => return Ok((stream, addr)),
                Err(err) => last_err = Some(err),
            }
        }
        Err(last_err.unwrap_or_else(|| SetupError::NoAddress {
            target: target.to_string(),
        }))
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err(SetupError::ConnectTimeout {
            target: target.to_string(),
        }),
    }
}

/// Connects to `addr`; when the profile sets `connect_backup_ms` and the first attempt is still
/// unanswered after that long, a second attempt (a new socket, so a new SYN at once rather than
/// the kernel's retransmission a second after the first) runs beside it. The first attempt to
/// connect wins and the other is dropped (closed, or reset by the kernel if it completes
/// later); if one fails, the other's outcome decides. A browser hides a lost SYN the same way
/// (Chromium's backup connect job), which midway's clients cannot do for its upstream side.
async fn connect_with_backup(
    addr: SocketAddr,
    profile: &TcpProfile,
    outgoing: Outgoing<'_>,
) -> Result<TcpStream, SetupError> {
    let first = connect_one(addr, profile, outgoing);
    // A Fast Open SYN may carry the client's bytes, which the server's application sees at
    // once: a second attempt would deliver them twice.
    let backup_ms = profile
        .connect_backup_ms
        .filter(|_| profile.fast_open != Some(true));
    let Some(backup_ms) = backup_ms else {
        return first.await;
    };
    tokio::pin!(first);
    tokio::select! {
        result = &mut first => return result,
        () = tokio::time::sleep(Duration::from_millis(u64::from(backup_ms))) => {}
    }
    tracing::debug!(%addr, backup_ms, "connect unanswered, starting a backup attempt");
    let second = connect_one(addr, profile, outgoing);
    tokio::pin!(second);
    tokio::select! {
        result = &mut first => match result {
            Ok(stream) => Ok(stream),
            Err(_) => second.await,
        },
        result = &mut second => match result {
            Ok(stream) => Ok(stream),
            Err(_) => first.await,
        },
    }
}

async fn connect_one(
    addr: SocketAddr,
    profile: &TcpProfile,
    outgoing: Outgoing<'_>,
) -> Result<TcpStream, SetupError> {
    let io_err = |source| SetupError::Connect {
        target: addr.to_string(),
        source,
    };
    // Non-blocking from the start (SOCK_NONBLOCK): two fcntl calls fewer per connection.
    let sock = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )
    .map_err(io_err)?;
    profile.apply_before_connect(&sock)?;
    default_nodelay(sock.as_fd(), profile).map_err(SetupError::Nodelay)?;
    if let Some(class) = outgoing.class {
        // Before connect, so the SYN carries the client's marking too.
        super::dscp::mark(&sock, class).map_err(io_err)?;
    }
    if outgoing.keep_server_class {
        super::dscp::keep_server_class(&sock, addr.is_ipv6());
    }
    if let Some(client) = outgoing.spoof_from {
        if client.is_ipv4() != addr.is_ipv4() {
            return Err(SetupError::SpoofFamily {
                client,
                target: addr,
            });
        }
        // IP_TRANSPARENT lets the socket bind to an address that is not local: the client's.
        set_transparent(&sock, addr.is_ipv6()).map_err(io_err)?;
        sock.bind(&SockAddr::from(SocketAddr::new(client, 0)))
            .map_err(io_err)?;
    }
    let std_stream: std::net::TcpStream = sock.into();
    let socket = TcpSocket::from_std_stream(std_stream);
    let stream = socket.connect(addr).await.map_err(io_err)?;
    if profile.fast_open == Some(true) {
        // TCP_FASTOPEN_CONNECT: connect() returned before the SYN left.
        let client = outgoing.first_bytes_from.map(|(client, _)| client);
        // Boxed: most connects use no Fast Open, and inline its state would be most of every
        // connect's future (1,688 of 1,920 bytes, twice with a backup attempt).
        let syn_data = Box::pin(super::fast_open::complete_handshake(&stream, client))
            .await
            .map_err(io_err)?;
        if let Some((_, sent)) = outgoing.first_bytes_from {
            sent.fetch_add(syn_data as u64, Ordering::Relaxed);
        }
        tracing::debug!(%addr, syn_data, "fast open connect");
    }
    Ok(stream)
}
