//! The UDP endpoints: the edge's (one per peer, client only) and a QUIC peer listener's (server
//! only), with midway-tls's rustls configs and a tunnel's transport settings.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{ClientConfig, Endpoint, EndpointConfig, ServerConfig, TokioRuntime};
use socket2::{Domain, Protocol, Socket, Type};

use crate::error::QuicError;
use crate::settings::TunnelSettings;

/// The UDP socket buffers a tunnel asks for (past `net.core.rmem_max` where the process may:
/// `SO_RCVBUFFORCE` needs CAP_NET_ADMIN, which midway has): a burst of a Gbit/s tunnel must wait
/// in the kernel while the endpoint task is busy, not be dropped.
const SOCKET_BUFFER_BYTES: libc::c_int = 8 << 20;

/// The edge's config for connecting to one peer.
pub fn client_config(
    tls: Arc<rustls::ClientConfig>,
    settings: &TunnelSettings,
) -> Result<ClientConfig, QuicError> {
    let crypto = QuicClientConfig::try_from(tls).map_err(|e| QuicError::Config(e.to_string()))?;
    let mut config = ClientConfig::new(Arc::new(crypto));
    config.transport_config(settings.transport_config());
    Ok(config)
}

/// A QUIC peer listener's config; also what a reload installs with
/// [`Endpoint::set_server_config`] (new connections check the new pins).
pub fn server_config(
    tls: Arc<rustls::ServerConfig>,
    settings: &TunnelSettings,
) -> Result<ServerConfig, QuicError> {
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| QuicError::Config(e.to_string()))?;
    let mut config = ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(settings.transport_config());
    // Peers are midways behind NATs and satellite terminals whose outside address changes.
    config.migration(true);
    Ok(config)
}

/// A UDP socket bound to `addr` with large buffers. `reuse_port` lets a new midway bind the
/// listener's port while the one it upgrades still holds it.
pub fn bind_udp(addr: SocketAddr, reuse_port: bool) -> Result<UdpSocket, QuicError> {
    let err = |source| QuicError::Socket { addr, source };
    let socket =
        Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(err)?;
    if addr.is_ipv6() {
        // As for TCP listeners: [::] is IPv6 only, so an IPv4 listener may share the port.
        socket.set_only_v6(true).map_err(err)?;
    }
    if reuse_port {
        socket.set_reuse_port(true).map_err(err)?;
    }
    grow_buffers(&socket);
    socket.bind(&addr.into()).map_err(err)?;
    Ok(socket.into())
}

/// Asks for [`SOCKET_BUFFER_BYTES`] each way, forcing past the sysctl limits where allowed and
/// settling for what the limits give otherwise.
fn grow_buffers(socket: &Socket) {
    let fd = socket.as_fd();
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if midway_sys::sockopt::set_int(fd, libc::SOL_SOCKET, force, SOCKET_BUFFER_BYTES).is_err() {
            let _ = midway_sys::sockopt::set_int(fd, libc::SOL_SOCKET, plain, SOCKET_BUFFER_BYTES);
        }
    }
}

/// A client-only endpoint on `socket`.
pub fn client_endpoint(socket: UdpSocket) -> Result<Endpoint, QuicError> {
    let addr = socket.local_addr().map_err(|source| QuicError::Socket {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    Endpoint::new(
        EndpointConfig::default(),
        None,
        socket,
        Arc::new(TokioRuntime),
    )
    .map_err(|source| QuicError::Socket { addr, source })
}

/// A server endpoint (a QUIC peer listener) on `socket`.
pub fn server_endpoint(socket: UdpSocket, config: ServerConfig) -> Result<Endpoint, QuicError> {
    let addr = socket.local_addr().map_err(|source| QuicError::Socket {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    Endpoint::new(
        EndpointConfig::default(),
        Some(config),
        socket,
        Arc::new(TokioRuntime),
    )
    .map_err(|source| QuicError::Socket { addr, source })
}
