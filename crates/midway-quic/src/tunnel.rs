//! The edge's side of a tunnel: one QUIC connection to one peer, set up on first use (or
//! ahead of time by the proxy's upkeep task), carrying each proxied connection as a stream,
//! and set up again when it closes.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::{ClientConfig, Connection, Endpoint, VarInt};

use crate::endpoint::{bind_udp, client_endpoint};
use crate::error::QuicError;
use crate::stream::QuicPeer;

/// The application error code of a tunnel closed by its midway (shutdown, a reload that
/// removed the peer).
pub const CLOSED_BY_MIDWAY: VarInt = VarInt::from_u32(0);

/// What a tunnel looks like now, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TunnelStats {
    /// A connection is up.
    pub up: bool,
    /// Smoothed round-trip time.
    pub rtt: Duration,
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// Packets sent, and declared lost, over the connection's life.
    pub sent_packets: u64,
    /// Packets declared lost.
    pub lost_packets: u64,
    /// Streams (proxied connections) open now.
    pub streams_open: u64,
    /// Connections set up since the tunnel was made (1 = never re-established).
    pub connections: u64,
}

/// One peer's tunnel.
pub struct Tunnel {
    /// The peer as configured (`host:port`), resolved at every connect.
    address: String,
    /// The name the peer's certificate is checked against (midway-tls's fixed name).
    server_name: &'static str,
    config: ClientConfig,
    handshake_timeout: Duration,
    /// The UDP endpoint, made at the first connect for the peer's address family.
    endpoint: Mutex<Option<Endpoint>>,
    /// The connection in use; replaced when it closes.
    current: Mutex<Option<Connection>>,
    /// Held during a handshake, so connects are single-flight: callers arriving during one
    /// wait for it.
    connecting: tokio::sync::Mutex<()>,
    streams_open: Arc<AtomicU64>,
    connections: AtomicU64,
}

impl Tunnel {
    /// A tunnel to `address` (`host:port`) with `config` (see [`crate::client_config`]); no
    /// connection yet.
    pub fn new(address: String, config: ClientConfig, handshake_timeout: Duration) -> Tunnel {
        Tunnel {
            address,
            server_name: midway_tls::SERVER_NAME,
            config,
            handshake_timeout,
            endpoint: Mutex::new(None),
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            streams_open: Arc::default(),
            connections: AtomicU64::new(0),
        }
    }

    /// A new stream for one proxied connection, on the live connection or on a new one.
    pub async fn open(&self) -> Result<QuicPeer, QuicError> {
        let connection = self.connection().await?;
        let (send, recv) = match connection.open_bi().await {
            Ok(pair) => pair,
            // Closed between the check and the open (an idle timeout, the peer restarting):
            // once more on a new connection.
            Err(_) => self
                .connection()
                .await?
                .open_bi()
                .await
                .map_err(QuicError::Open)?,
        };
        Ok(self.count(QuicPeer::new(send, recv)))
    }

    /// A new stream on the live connection, without a handshake: fails at once when there is
    /// no live connection (the caller decides whether to wait for one or fall back).
    pub async fn open_live(&self) -> Result<QuicPeer, QuicError> {
        let connection = self
            .live()
            .ok_or(QuicError::Open(quinn::ConnectionError::LocallyClosed))?;
        let (send, recv) = connection.open_bi().await.map_err(QuicError::Open)?;
        Ok(self.count(QuicPeer::new(send, recv)))
    }

    fn count(&self, stream: QuicPeer) -> QuicPeer {
        stream.counted_in(self.streams_open.clone())
    }

    /// The live connection, set up first if there is none (within the handshake timeout).
    pub async fn connection(&self) -> Result<Connection, QuicError> {
        if let Some(connection) = self.live() {
            return Ok(connection);
        }
        let _single_flight = self.connecting.lock().await;
        if let Some(connection) = self.live() {
            return Ok(connection);
        }
        let connection = self.connect().await?;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(connection.clone());
        Ok(connection)
    }

    /// The live connection if there is one, without setting one up.
    pub fn live(&self) -> Option<Connection> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .filter(|c| c.close_reason().is_none())
            .cloned()
    }

    /// A handshake with the peer.
    async fn connect(&self) -> Result<Connection, QuicError> {
        let peer = tokio::net::lookup_host(&self.address)
            .await
            .map_err(|source| QuicError::Resolve {
                name: self.address.clone(),
                source,
            })?
            .next()
            .ok_or_else(|| QuicError::Resolve {
                name: self.address.clone(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
            })?;
        let endpoint = self.endpoint_for(peer)?;
        let connecting = endpoint
            .connect_with(self.config.clone(), peer, self.server_name)
            .map_err(|source| QuicError::Connect { peer, source })?;
        let handshake = async {
            let connection = connecting.await?;
            crate::await_ready(&connection).await?;
            Ok(connection)
        };
        let connection = tokio::time::timeout(self.handshake_timeout, handshake)
            .await
            .map_err(|_| QuicError::HandshakeTimeout {
                peer,
                after: self.handshake_timeout,
            })?
            .map_err(|source| QuicError::Handshake { peer, source })?;
        self.connections.fetch_add(1, Ordering::Relaxed);
        Ok(connection)
    }

    /// The endpoint for a peer at `peer`: the one made before if its family matches.
    fn endpoint_for(&self, peer: SocketAddr) -> Result<Endpoint, QuicError> {
        let mut slot = self.endpoint.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(endpoint) = slot.as_ref() {
            if endpoint
                .local_addr()
                .is_ok_and(|a| a.is_ipv6() == peer.is_ipv6())
            {
                return Ok(endpoint.clone());
            }
        }
        let any = if peer.is_ipv6() {
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))
        } else {
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))
        };
        let endpoint = client_endpoint(bind_udp(any, false)?)?;
        *slot = Some(endpoint.clone());
        Ok(endpoint)
    }

    /// Streams (proxied connections) open now, on this tunnel's connections old and new.
    pub fn streams_open(&self) -> u64 {
        self.streams_open.load(Ordering::Relaxed)
    }

    /// Now's figures.
    pub fn stats(&self) -> TunnelStats {
        let mut stats = TunnelStats {
            streams_open: self.streams_open.load(Ordering::Relaxed),
            connections: self.connections.load(Ordering::Relaxed),
            ..TunnelStats::default()
        };
        if let Some(connection) = self.live() {
            let path = connection.stats().path;
            stats.up = true;
            stats.rtt = path.rtt;
            stats.cwnd = path.cwnd;
            stats.sent_packets = path.sent_packets;
            stats.lost_packets = path.lost_packets;
        }
        stats
    }

    /// Closes the connection (its streams end with a reset on both sides) and the endpoint.
    pub fn close(&self) {
        if let Some(connection) = self.live() {
            connection.close(CLOSED_BY_MIDWAY, b"closed");
        }
        if let Some(endpoint) = self
            .endpoint
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            endpoint.close(CLOSED_BY_MIDWAY, b"closed");
        }
    }
}
