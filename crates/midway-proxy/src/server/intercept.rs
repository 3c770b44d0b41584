//! Find the target: what each intercept mode does with an accepted client before and after
//! the remote segment is connected. Every difference between the modes lives here, a peer
//! listener's included (its per-client limit, its segment label, its metrics, its header and
//! status byte; the header's I/O itself is `peering.rs`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::error::SetupError;
use super::peer_link::{accept_tls, PeerLink};
use super::peering::{self, Chain, GatewayContext, Peering};
use crate::access::{AccessList, ClientLimits};
use crate::config::{
    DeniedDestinations, Intercept, ListenerConfig, ListenerTransport, RuntimeConfig, TargetAddr,
};
use crate::metrics::Metrics;
use crate::peer::header::{canonical_socket_addr, PeerStatus};
use crate::socks5::{self, ReplyCode};

/// Where a split connection's remote segment goes, and how.
pub(super) struct Target<'c> {
    pub(super) addr: TargetAddr,
    /// Connect from the client's own address (transparent with `spoof_client_address`).
    pub(super) spoof_from: Option<IpAddr>,
    /// Addresses the target may not resolve to. Only a client-chosen target (SOCKS5) is
    /// checked against `denied_destinations`.
    pub(super) denied: Option<&'c DeniedDestinations>,
    /// A peer listener's connection: its place in the chain of midways, from the header.
    pub(super) chain: Option<Chain>,
}

/// What an intercept needs to know about the accepted connection.
pub(super) struct Accepted<'c> {
    pub(super) peer: SocketAddr,
    /// The address the listener really bound.
    pub(super) listener_addr: SocketAddr,
    /// The configuration it was accepted under, and its access list and peers.
    pub(super) config: &'c RuntimeConfig,
    pub(super) access: &'c AccessList,
    pub(super) peering: &'c Peering,
    pub(super) client_limits: &'c Arc<ClientLimits>,
    /// Fires when shutdown begins (a warm connection waiting for its header then ends).
    pub(super) shutdown: &'c CancellationToken,
}

/// Starts at zero the metrics a listener reports: its own, and those of the peer segment it
/// accepts (a peer listener) or connects through (`via`), with a peer listener's header
/// refusals.
pub(super) fn init_listener_metrics(metrics: &Metrics, listener: &ListenerConfig) {
    metrics.init_listener(&listener.name);
    super::proxied::init_metrics(metrics, listener);
    let peer_listener = matches!(listener.intercept, Intercept::Peer { .. });
    if peer_listener {
        metrics.init_peer_listener(&listener.name);
    }
    if peer_listener || !listener.via.is_empty() {
        metrics.init_peer_segment(&listener.name);
    }
}

impl Intercept {
    /// Whether the listening socket must be transparent (to accept TPROXY'd connections).
    pub(super) fn needs_transparent_listener(&self) -> bool {
        matches!(self, Intercept::Transparent { .. })
    }

    /// Whether the per-client limit is taken at accept, for the address that connected. A peer
    /// listener's connections all come from a few midways: it takes the limit for the client
    /// each header names instead (`peering.rs`).
    pub(super) fn limits_connecting_client(&self) -> bool {
        !matches!(self, Intercept::Peer { .. })
    }

    /// The label of the accepted socket's segment (metrics, end-of-connection log): a peer
    /// listener's accepted socket is the peer segment (with the local profile all the same).
    pub(super) fn accepted_segment(&self) -> &'static str {
        match self {
            Intercept::Peer { .. } => "peer",
            _ => "local",
        }
    }

    /// The accepted socket as the stream the listener speaks on: TLS for a peer listener with
    /// `transport = "tls"` (the handshake within `timeout`; a midway whose key is not listed is
    /// refused here), the socket itself otherwise.
    pub(super) async fn open_transport(
        &self,
        client: TcpStream,
        from: SocketAddr,
        timeout: std::time::Duration,
    ) -> Result<PeerLink, SetupError> {
        match self {
            Intercept::Peer {
                transport: ListenerTransport::Tls { server, .. },
                ..
            } => accept_tls(client, server, timeout)
                .await
                .map_err(|source| SetupError::PeerTls {
                    peer: from.to_string(),
                    reason: midway_tls::refusal_reason(&source),
                    source,
                }),
            _ => Ok(PeerLink::Tcp(client)),
        }
    }

    /// Finds the target of a connection to a relaying listener: the forward target, the
    /// client's SOCKS5 request, or the original destination.
    pub(super) async fn find_target<'c>(
        &self,
        client: &mut PeerLink,
        accepted: &Accepted<'c>,
    ) -> Result<Target<'c>, SetupError> {
        let config = accepted.config;
        match self {
            Intercept::Forward { target } => Ok(Target {
                addr: target.clone(),
                spoof_from: None,
                denied: None,
                chain: None,
            }),
            Intercept::Socks5 { auth } => {
                let addr =
                    tokio::time::timeout(config.handshake_timeout, socks5::handshake(client, auth))
                        .await
                        .map_err(|_| SetupError::HandshakeTimeout)??;
                Ok(Target {
                    addr,
                    spoof_from: None,
                    denied: Some(&config.denied_destinations),
                    chain: None,
                })
            }
            Intercept::Transparent {
                spoof_client_address,
                ..
            } => {
                // A transparent listener's clients are always plain TCP.
                let socket = client.tcp().ok_or(SetupError::NotARelayListener)?;
                let original = original_destination(socket, accepted.listener_addr)?;
                Ok(Target {
                    addr: TargetAddr::Ip(original),
                    spoof_from: spoof_client_address.then_some(accepted.peer.ip().to_canonical()),
                    denied: None,
                    chain: None,
                })
            }
            Intercept::Peer {
                keys,
                spoof_client_address,
                ..
            } => {
                let cx = GatewayContext {
                    from: accepted.peer,
                    keys,
                    config,
                    access: accepted.access,
                    client_limits: accepted.client_limits,
                    shutdown: accepted.shutdown,
                };
                let (destination, chain) = accepted.peering.accept_header(client, &cx).await?;
                Ok(Target {
                    addr: TargetAddr::Ip(destination),
                    spoof_from: spoof_client_address.then_some(chain.client().ip()),
                    // Checked against the header already (a refusal); checked again by connect.
                    denied: Some(&config.denied_destinations),
                    chain: Some(chain),
                })
            }
            // Served by the HTTP engine; never reaches the byte relay.
            Intercept::Http => Err(SetupError::NotARelayListener),
        }
    }

    /// Tells the client its target is connected, where the protocol says so (SOCKS5, and the
    /// status byte a peer listener answers a header with).
    pub(super) async fn report_connected(
        &self,
        client: &mut PeerLink,
        server: &PeerLink,
    ) -> Result<(), SetupError> {
        match self {
            Intercept::Socks5 { .. } => {
                let bound = server.tcp().and_then(|socket| socket.local_addr().ok());
                socks5::send_reply(client, ReplyCode::Succeeded, bound)
                    .await
                    .map_err(|e| SetupError::Handshake(e.into()))?;
            }
            Intercept::Peer { .. } => peering::send_status(client, PeerStatus::Connected)
                .await
                .map_err(|source| SetupError::PeerHandshake {
                    peer: "(the connecting midway)".into(),
                    source,
                })?,
            _ => {}
        }
        Ok(())
    }

    /// Tells the client the connection will not be relayed, then closes it.
    pub(super) async fn report_failure(&self, mut client: PeerLink, err: &SetupError) {
        if let Intercept::Peer { .. } = self {
            if matches!(err, SetupError::PeerRefused { .. }) {
                // A refused header learns nothing but a reset.
                client.reset();
            } else {
                // An accepted header whose onward connection failed: the previous midway
                // tells its client as if it had connected itself.
                let _ = peering::send_status(&mut client, err.peer_status()).await;
            }
        } else if let Intercept::Socks5 { .. } = self {
            if let Some(code) = err.socks_reply() {
                let _ = socks5::send_reply(&mut client, code, None).await;
            }
        } else {
            // The client believes it talks to the server (transparent) or to a fixed
            // service (forward): a reset is the closest thing to the server's refusal, and
            // the only honest end once some of its bytes were taken (sent on to a peer
            // ahead of its status), which a plain close would leave looking delivered.
            client.reset();
        }
    }

    /// Checks a connection to an HTTP-speaking listener before the engine serves it. The
    /// origin comes from each request's Host header or URI; a transparent listener's original
    /// destination is only checked for a loop back into this listener.
    pub(super) fn check_http_client(
        &self,
        client: &TcpStream,
        listener_addr: SocketAddr,
    ) -> Result<(), SetupError> {
        match self {
            Intercept::Transparent { .. } => original_destination(client, listener_addr).map(drop),
            _ => Ok(()),
        }
    }
}

/// TPROXY delivers the connection with its original destination as local address; a
/// connection to the listener itself would loop.
fn original_destination(
    client: &TcpStream,
    listener_addr: SocketAddr,
) -> Result<SocketAddr, SetupError> {
    let original = client
        .local_addr()
        .map(canonical_socket_addr)
        .map_err(SetupError::OriginalDestination)?;
    if original.port() == listener_addr.port()
        && (listener_addr.ip().is_unspecified() || listener_addr.ip() == original.ip())
    {
        return Err(SetupError::Loop);
    }
    Ok(original)
}
