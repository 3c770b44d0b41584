//! Two-ended operation's I/O: the gateway side (a peer listener reads, authenticates and checks
//! the header a connecting midway sends) and the edge side (a connection through the next
//! midway: a pooled connection, the header, the status byte). The header itself and the
//! replay guard are pure (`crate::peer`); the warm pools are `pool.rs`.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::RngCore;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::error::{PeerRefusal, SetupError};
use super::own_addresses::is_denied;
use super::peer_link::PeerLink;
use super::pool::{PoolOrigin, WarmPool};
use crate::access::{AccessList, ClientLimits, ClientPermit};
use crate::config::{PeerConfig, PeerKey, RuntimeConfig};
use crate::metrics::Metrics;
use crate::peer::header::{
    header_len, ChainId, PeerHeader, PeerStatus, UnverifiedHeader, PREFIX_LEN,
};
use crate::peer::replay::ReplayGuard;

/// Most nonces the replay guard remembers (about 48 bytes each): a million is some 50 MB and
/// 33,000 new peer connections a second over a 30 s window.
const REPLAY_GUARD_CAPACITY: usize = 1 << 20;

/// This midway's peers, keys and the state the peer header needs.
pub(super) struct Peering {
    keys: BTreeMap<String, PeerKey>,
    /// One per `[[peers]]`, in file order (listeners' `via` holds indices into it).
    links: Vec<Arc<WarmPool>>,
    /// Shared with the generations before and after this one (see [`Peering::new`]).
    replay: Arc<Mutex<ReplayGuard>>,
    /// Chain ids of the connections this midway relays now: a header with one of them is a
    /// loop.
    chains: Arc<Mutex<HashSet<ChainId>>>,
    max_hops: u8,
}

/// A connection's place in a chain of midways, held while it is relayed here.
pub(super) struct Chain {
    id: ChainId,
    /// Midways crossed before this one (0 at the edge).
    hops: u8,
    /// The client as the edge saw it.
    client: SocketAddr,
    _registered: ChainRegistration,
    /// At a gateway: the header's client's slot of max_connections_per_client.
    _client_permit: Option<ClientPermit>,
}

impl Chain {
    /// The client as the edge saw it.
    pub(super) fn client(&self) -> SocketAddr {
        self.client
    }
}

/// Removes a chain id from the set of those in flight when the connection ends.
struct ChainRegistration {
    chains: Arc<Mutex<HashSet<ChainId>>>,
    id: ChainId,
}

impl Drop for ChainRegistration {
    fn drop(&mut self) {
        lock(&self.chains).remove(&self.id);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a peer listener needs to check a header.
pub(super) struct GatewayContext<'a> {
    /// The connecting midway.
    pub(super) from: SocketAddr,
    /// The listener's `keys`.
    pub(super) keys: &'a [String],
    pub(super) config: &'a RuntimeConfig,
    pub(super) access: &'a AccessList,
    pub(super) client_limits: &'a Arc<ClientLimits>,
    pub(super) shutdown: &'a CancellationToken,
}

impl Peering {
    /// The keys and limits of `config`, with one warm pool per `[[peers]]` entry (in order).
    /// A reload passes the `previous` generation's: the replay guard and the chains in flight
    /// carry over, so a header seen before the reload is still a replay after it, and a loop
    /// through a connection accepted before it is still found. (`peer_header_window` is one of
    /// the settings only a restart changes, so the guard's window stays right.)
    pub(super) fn new(
        config: &RuntimeConfig,
        pools: Vec<Arc<WarmPool>>,
        previous: Option<&Peering>,
    ) -> Peering {
        let (replay, chains) = match previous {
            Some(previous) => (previous.replay.clone(), previous.chains.clone()),
            None => (
                Arc::new(Mutex::new(ReplayGuard::new(
                    u64::try_from(config.peer_header_window.as_millis()).unwrap_or(u64::MAX),
                    REPLAY_GUARD_CAPACITY,
                ))),
                Arc::default(),
            ),
        };
        Peering {
            keys: config.keys.clone(),
            links: pools,
            replay,
            chains,
            max_hops: config.max_hops,
        }
    }

    /// The warm pools, one per peer.
    pub(super) fn pools(&self) -> &[Arc<WarmPool>] {
        &self.links
    }

    /// Registers `id` as in flight; `None` when it already is (a loop).
    fn register(&self, id: ChainId) -> Option<ChainRegistration> {
        lock(&self.chains).insert(id).then(|| ChainRegistration {
            chains: self.chains.clone(),
            id,
        })
    }

    /// A new chain for a connection this midway (an edge) sends through a peer.
    pub(super) fn start_chain(&self, client: SocketAddr) -> Chain {
        loop {
            let mut id = [0; 16];
            rand::thread_rng().fill_bytes(&mut id);
            // 128 random bits never collide in practice; the loop only keeps the set exact.
            if let Some(registration) = self.register(id) {
                return Chain {
                    id,
                    hops: 0,
                    client,
                    _registered: registration,
                    _client_permit: None,
                };
            }
        }
    }

    /// The gateway's side: reads one header from a connecting midway and checks it. The first
    /// byte may take up to `idle_timeout` (a warm connection waits for its client), the rest
    /// `handshake_timeout`. Returns the destination and the connection's chain.
    pub(super) async fn accept_header(
        &self,
        stream: &mut PeerLink,
        cx: &GatewayContext<'_>,
    ) -> Result<(SocketAddr, Chain), SetupError> {
        let refused = |refusal| SetupError::PeerRefused {
            from: cx.from,
            refusal,
        };
        let mut bytes = vec![0; PREFIX_LEN];
        let first = tokio::select! {
            _ = cx.shutdown.cancelled() => return Err(SetupError::PeerIdleClosed),
            first = tokio::time::timeout(cx.config.idle_timeout, stream.read(&mut bytes[..1])) => first,
        };
        match first {
            Ok(Ok(1)) => {}
            // EOF, reset or idle_timeout before the first byte: a warm connection that was
            // never used.
            _ => return Err(SetupError::PeerIdleClosed),
        }
        let rest = async {
            stream
                .read_exact(&mut bytes[1..])
                .await
                .map_err(PeerRefusal::Read)?;
            let len = header_len(&bytes).map_err(PeerRefusal::Malformed)?;
            bytes.resize(len, 0);
            stream
                .read_exact(&mut bytes[PREFIX_LEN..])
                .await
                .map_err(PeerRefusal::Read)?;
            Ok(())
        };
        tokio::time::timeout(cx.config.handshake_timeout, rest)
            .await
            .map_err(|_| refused(PeerRefusal::HeaderTimeout))?
            .map_err(refused)?;
        self.check_header(&bytes, cx).map_err(refused)
    }

    /// Authenticates and checks a complete header (see [`Peering::accept_header`]).
    fn check_header(
        &self,
        bytes: &[u8],
        cx: &GatewayContext<'_>,
    ) -> Result<(SocketAddr, Chain), PeerRefusal> {
        let unverified = UnverifiedHeader::decode(bytes).map_err(PeerRefusal::Malformed)?;
        let key_name = unverified.key_name().to_string();
        let key = cx
            .keys
            .contains(&key_name)
            .then(|| self.keys.get(&key_name))
            .flatten()
            .ok_or_else(|| PeerRefusal::UnknownKey(key_name.clone()))?;
        let header = unverified
            .verify(key.bytes())
            .map_err(|source| PeerRefusal::BadMac {
                key: key_name.clone(),
                source,
            })?;
        lock(&self.replay)
            .check(header.nonce, header.timestamp_ms, now_ms())
            .map_err(|source| PeerRefusal::NotFresh {
                key: key_name.clone(),
                source,
            })?;
        if header.hops >= self.max_hops {
            return Err(PeerRefusal::HopLimit {
                hops: header.hops,
                max: self.max_hops,
            });
        }
        // The header's addresses meet the same rules as a client and a target named by a
        // client of this midway would.
        let client = header.client;
        if !cx.access.allows(client.ip()) {
            return Err(PeerRefusal::ClientNotAllowed(client.ip()));
        }
        if is_denied(
            Some(&cx.config.denied_destinations),
            header.destination.ip(),
        ) {
            return Err(PeerRefusal::DestinationDenied(header.destination));
        }
        let registration = self
            .register(header.chain_id)
            .ok_or_else(|| PeerRefusal::Loop {
                chain: hex(&header.chain_id),
            })?;
        let permit = cx
            .client_limits
            .try_acquire(client.ip())
            .ok_or(PeerRefusal::ClientLimit(client.ip()))?;
        tracing::debug!(
            key = %key_name,
            hops = header.hops,
            chain = %hex(&header.chain_id),
            original_client = %client,
            "peer header accepted"
        );
        Ok((
            header.destination,
            Chain {
                id: header.chain_id,
                hops: header.hops,
                client,
                _registered: registration,
                _client_permit: Some(permit),
            },
        ))
    }

    /// The edge's side: a connection to `destination` through peer `index` (a warm one if the
    /// pool has one alive), the header sent and the peer's status read, all within `timeout`.
    /// A warm connection the peer turns out to have closed (EOF) is replaced by a fresh one,
    /// once; a reset (the peer refused the header) is not retried.
    ///
    /// With `early_from` (the client's plain TCP socket), the client's bytes go on after the
    /// header as they arrive, without waiting for the status (see [`EarlyData`]). Returns the
    /// connection and how many of the client's bytes it has carried already.
    pub(super) async fn connect_through(
        &self,
        index: usize,
        chain: &Chain,
        destination: SocketAddr,
        early_from: Option<&TcpStream>,
        timeout: Duration,
    ) -> Result<(PeerLink, u64), SetupError> {
        let pool = self.links.get(index).ok_or(SetupError::NotARelayListener)?;
        let peer = pool.config();
        let key = self
            .keys
            .get(&peer.key)
            .ok_or(SetupError::NotARelayListener)?;
        let attempt = async {
            let mut fresh_only = false;
            let mut early = EarlyData::new(early_from);
            loop {
                let (mut stream, origin) = pool.take(fresh_only).await?;
                if early.client.is_some() {
                    // The client's bytes may follow the header before any relay runs: a crash
                    // then must reset this connection too, or the gateway would read a FIN
                    // after them and end the server's stream cleanly but short (the fault
                    // campaign's catch). Plain TCP only: a TLS session that ends without its
                    // close_notify is an error at the gateway, and a dead QUIC tunnel resets
                    // its streams (their relay does not disarm a socket it did not arm).
                    if let Some(tcp) = stream.tcp_plain() {
                        midway_relay::reset_if_crashed(tcp);
                    }
                }
                let header = self.header_for(peer, chain, destination);
                let bytes = header.encode(key.bytes()).map_err(SetupError::PeerHeader)?;
                match exchange(&mut stream, &bytes, &mut early).await {
                    Ok(PeerStatus::Connected) => return Ok((stream, early.sent as u64)),
                    Ok(status) => {
                        return Err(SetupError::PeerStatus {
                            peer: peer.name.clone(),
                            status,
                        })
                    }
                    Err(ExchangeFailure::Client(source)) => {
                        return Err(SetupError::ClientEarlyData(source))
                    }
                    // The peer closed an idle warm connection (a FIN, not the reset that refuses a
                    // header) just after the liveness check: try once more on a fresh one. Only
                    // while none of the client's bytes went: a peer that read them may have
                    // passed them on before it went away, and sending them again could deliver
                    // a request twice.
                    Err(ExchangeFailure::Peer(err))
                        if origin == PoolOrigin::Warm
                            && !fresh_only
                            && early.sent == 0
                            && err.kind() == std::io::ErrorKind::UnexpectedEof =>
                    {
                        fresh_only = true
                    }
                    Err(ExchangeFailure::Peer(source)) => {
                        return Err(SetupError::PeerHandshake {
                            peer: peer.name.clone(),
                            source,
                        })
                    }
                }
            }
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(SetupError::PeerTimeout {
                    peer: peer.name.clone(),
                })
            })
    }

    /// The header for the next hop: one more hop, the same chain, a new nonce and time.
    fn header_for(&self, peer: &PeerConfig, chain: &Chain, destination: SocketAddr) -> PeerHeader {
        let mut nonce = [0; 16];
        rand::thread_rng().fill_bytes(&mut nonce);
        PeerHeader {
            hops: chain.hops.saturating_add(1),
            chain_id: chain.id,
            nonce,
            timestamp_ms: now_ms(),
            key_name: peer.key.clone(),
            destination,
            client: chain.client,
        }
    }
}

/// Most of a client's bytes an edge sends after the header before the next midway has answered
/// it: a request's head or a TLS ClientHello, the client's first flight.
const EARLY_DATA_MAX: usize = 16 * 1024;

/// The client's first bytes, sent after the header without waiting for the next midway's
/// status byte. Waiting cost every proxied connection a round trip of the peer segment before
/// its first request left (on a GEO hop, half a second: issue 30's page loads), which a
/// transparent edge had just saved the client by answering its handshake. The next midway
/// reads exactly one header and leaves what follows in its socket (`accept_header`), so the
/// bytes wait there while it connects onward, then go through its relay; if it cannot connect,
/// its status says so and both ends are reset as before: the client's bytes are lost only on a
/// connection that ends in a reset. Once bytes went, a closed connection is not retried on a
/// fresh one (the peer may have passed them on: a request must not arrive twice). Bytes are taken only from a plain TCP client whose proxy
/// protocol (if any) is done: a SOCKS5 client sends nothing before its reply.
struct EarlyData<'a> {
    client: Option<&'a TcpStream>,
    /// Bytes taken off the client's socket and sent.
    sent: usize,
    /// The client's end of stream was seen (the relay sees it again and carries the half-close).
    client_ended: bool,
}

impl<'a> EarlyData<'a> {
    fn new(client: Option<&'a TcpStream>) -> EarlyData<'a> {
        EarlyData {
            client,
            sent: 0,
            client_ended: false,
        }
    }

    /// The client socket while more of its bytes may be taken.
    fn open_client(&self) -> Option<&'a TcpStream> {
        self.client
            .filter(|_| !self.client_ended && self.sent < EARLY_DATA_MAX)
    }
}

/// Which side of a header exchange failed.
enum ExchangeFailure {
    Peer(std::io::Error),
    Client(std::io::Error),
}

/// Sends `header`, then the client's bytes as they come, until the one status byte the peer
/// answers with arrives.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    header: &[u8],
    early: &mut EarlyData<'_>,
) -> Result<PeerStatus, ExchangeFailure> {
    stream
        .write_all(header)
        .await
        .map_err(ExchangeFailure::Peer)?;
    // A TLS writer may hold records until flushed.
    stream.flush().await.map_err(ExchangeFailure::Peer)?;
    let mut status = [0u8; 1];
    let mut chunk = [0u8; 4096];
    loop {
        let client = early.open_client();
        let client_readable = async {
            match client {
                Some(client) => client.readable().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            // One byte: a read cancelled by the other branch has taken nothing.
            read = stream.read_exact(&mut status) => {
                read.map_err(ExchangeFailure::Peer)?;
                return Ok(PeerStatus::from_byte(status[0]));
            }
            ready = client_readable => {
                ready.map_err(ExchangeFailure::Client)?;
                let Some(client) = client else { continue };
                if early.sent == 0 {
                    midway_relay::reset_if_crashed(client);
                }
                let room = (EARLY_DATA_MAX - early.sent).min(chunk.len());
                match client.try_read(&mut chunk[..room]) {
                    Ok(0) => early.client_ended = true,
                    Ok(n) => {
                        stream
                            .write_all(&chunk[..n])
                            .await
                            .map_err(ExchangeFailure::Peer)?;
                        stream.flush().await.map_err(ExchangeFailure::Peer)?;
                        early.sent += n;
                    }
                    Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
                    // A reset client: the setup fails and the peer connection is reset, so
                    // the reset is not lost (a later read would see a clean end instead).
                    Err(err) => return Err(ExchangeFailure::Client(err)),
                }
            }
        }
    }
}

/// The gateway's answer to an accepted header, once the onward connection is made or failed.
pub(super) async fn send_status<S: AsyncWrite + Unpin>(
    stream: &mut S,
    status: PeerStatus,
) -> std::io::Result<()> {
    stream.write_all(&[status.to_byte()]).await?;
    // A TLS writer may hold records until flushed; the edge waits for this byte.
    stream.flush().await
}

/// Counts a refused header in the peer metrics (besides the refused-connections counter).
pub(super) fn count_refusal(metrics: &Metrics, listener: &str, refusal: &PeerRefusal) {
    if refusal.is_auth_failure() {
        metrics.peer_auth_failure(listener, refusal.reason());
    }
    match refusal {
        PeerRefusal::Loop { .. } => metrics
            .peer_loops_refused
            .get_or_create(&Metrics::listener(listener))
            .inc(),
        PeerRefusal::HopLimit { .. } => metrics
            .peer_hop_limit_refused
            .get_or_create(&Metrics::listener(listener))
            .inc(),
        _ => 0,
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A connected pair of loopback sockets: (the accepted end, the connecting end).
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let connecting = TcpStream::connect(listener.local_addr().unwrap());
        let (accepted, connecting) = tokio::join!(listener.accept(), connecting);
        (accepted.unwrap().0, connecting.unwrap())
    }

    /// Reads from `from` until `want` bytes came (bounded by the test's timeout).
    async fn read_bytes(from: &mut TcpStream, want: usize) -> Vec<u8> {
        let mut got = vec![0; want];
        tokio::time::timeout(Duration::from_secs(5), from.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        got
    }

    #[tokio::test]
    async fn the_clients_first_bytes_follow_the_header_before_the_status_comes() {
        let (client_at_edge, mut client) = pair().await;
        let (mut peer_at_edge, mut peer) = pair().await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut early = EarlyData::new(Some(&client_at_edge));
        let edge = exchange(&mut peer_at_edge, b"HEADER", &mut early);
        let gateway = async {
            // The status is sent only after the request is in: an edge that waited for it
            // would never send the request, and this test would time out.
            let got = read_bytes(&mut peer, 6 + 18).await;
            assert_eq!(&got, b"HEADERGET / HTTP/1.1\r\n\r\n");
            peer.write_all(&[PeerStatus::Connected.to_byte()])
                .await
                .unwrap();
        };
        let (status, ()) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(edge, gateway)
        })
        .await
        .unwrap();
        assert!(matches!(status, Ok(PeerStatus::Connected)));
        assert_eq!(early.sent, 18);
    }

    #[tokio::test]
    async fn a_connection_closed_after_the_clients_bytes_went_counts_them() {
        // `connect_through` retries a closed warm connection only while nothing of the
        // client's went: this is what it reads.
        let (client_at_edge, mut client) = pair().await;
        client.write_all(b"hello").await.unwrap();
        let mut early = EarlyData::new(Some(&client_at_edge));
        let (mut closed_at_edge, mut closed) = pair().await;
        let closing = async {
            read_bytes(&mut closed, 6 + 5).await;
            closed.shutdown().await.unwrap();
        };
        let (result, ()) = tokio::join!(
            exchange(&mut closed_at_edge, b"HEADER", &mut early),
            closing
        );
        assert!(
            matches!(result, Err(ExchangeFailure::Peer(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof)
        );
        assert_eq!(early.sent, 5);
    }

    #[tokio::test]
    async fn a_clients_end_of_stream_is_left_for_the_relay() {
        let (mut client_at_edge, mut client) = pair().await;
        client.write_all(b"bye").await.unwrap();
        client.shutdown().await.unwrap();
        let (mut peer_at_edge, mut peer) = pair().await;
        let mut early = EarlyData::new(Some(&client_at_edge));
        let answering = async {
            read_bytes(&mut peer, 6 + 3).await;
            // Give the edge time to see the client's end before the status comes.
            tokio::time::sleep(Duration::from_millis(50)).await;
            peer.write_all(&[PeerStatus::Refused.to_byte()])
                .await
                .unwrap();
        };
        let (status, ()) = tokio::join!(
            exchange(&mut peer_at_edge, b"HEADER", &mut early),
            answering
        );
        assert!(matches!(status, Ok(PeerStatus::Refused)));
        assert!(early.client_ended);
        // The relay still reads the end of stream.
        let mut rest = [0u8; 4];
        assert_eq!(client_at_edge.read(&mut rest).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn no_more_than_the_limit_is_taken_before_the_status() {
        let (client_at_edge, mut client) = pair().await;
        let (mut peer_at_edge, mut peer) = pair().await;
        let sending = async {
            // More than the limit; the rest stays in the client's socket for the relay.
            let _ = client.write_all(&vec![7u8; EARLY_DATA_MAX * 2]).await;
        };
        let mut early = EarlyData::new(Some(&client_at_edge));
        let answering = async {
            read_bytes(&mut peer, 6 + EARLY_DATA_MAX).await;
            peer.write_all(&[PeerStatus::Connected.to_byte()])
                .await
                .unwrap();
        };
        let (status, (), ()) = tokio::join!(
            exchange(&mut peer_at_edge, b"HEADER", &mut early),
            answering,
            sending
        );
        assert!(matches!(status, Ok(PeerStatus::Connected)));
        assert_eq!(early.sent, EARLY_DATA_MAX);
    }
}
