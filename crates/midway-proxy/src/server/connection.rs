//! One admitted connection, start to end: the local profile, then either the HTTP engine
//! (HTTP-speaking listeners) or find the target, connect and relay (split connections).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use midway_relay::RelayCounters;
use midway_tcp::{CarriedOptions, Role, TcpProfile};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tracing::{field, Instrument};

use super::access_links::SharedLink;
use super::connect::{apply_established, close_now, connect, resolve_first, Outgoing};
use super::dscp;
use super::error::{ErrorChain, SetupError};
use super::generation::{Generation, HttpListener};
use super::intercept::{Accepted, Target};
use super::log_limit::admit_out_of_resources;
use super::memory::{self, leaves_buffers, MemoryCaps};
use super::peer_link::{PeerLink, Transport};
use super::peering::{self, Chain};
use super::pool::WarmPool;
use super::profiles::ListenerProfiles;
use super::proxied::{self, ProxiedBy, ProxyHeaderRefusal};
use super::registry::Entry;
use super::relay::{self, ByteReporter, Split};
use super::shared::Shared;
use super::socket_id::SocketId;
use crate::access::ClientPermit;
use crate::config::{peer_for, Intercept, ListenerConfig, TargetAddr};
use crate::metrics::Metrics;
use crate::proxy_protocol::Proxied;

/// An admitted connection, owned by its task.
pub(super) struct Connection {
    pub(super) shared: Arc<Shared>,
    pub(super) listener: Arc<ListenerConfig>,
    /// The listener's profiles, resolved at start.
    pub(super) profiles: Arc<ListenerProfiles>,
    pub(super) http: Option<HttpListener>,
    /// The configuration it was accepted under, kept to its end (a reload does not change it).
    pub(super) generation: Arc<Generation>,
    /// The address the listener really bound.
    pub(super) listener_addr: SocketAddr,
    /// The client: the connecting address, or the one a load balancer's PROXY header names.
    pub(super) peer: SocketAddr,
    /// Set when `peer` came from a PROXY header.
    /// Boxed: most connections have none, and the slot is in every connection's task.
    pub(super) proxied: Option<Box<ProxiedBy>>,
    pub(super) cancel: CancellationToken,
    /// Fires when shutdown begins (before the grace period).
    pub(super) shutdown: CancellationToken,
    /// Returned when the connection ends: a slot of the total limit and of the client's (a peer
    /// listener takes the client's slot once the header names the client).
    pub(super) _permits: (tokio::sync::OwnedSemaphorePermit, Option<ClientPermit>),
}

/// The onward segment of a split connection.
pub(super) struct Onward {
    stream: PeerLink,
    /// `remote` (to the destination) or `peer` (to the next midway): the metric label.
    segment: &'static str,
    /// Set when the connection is part of a chain of midways: its id stays registered here
    /// (loop detection) while this is held.
    chain: Option<Chain>,
    /// The destination (for the control socket's status).
    target: Option<SocketAddr>,
    /// The peer it goes through, if any.
    peer: Option<Arc<WarmPool>>,
    /// The client's bytes a Fast Open SYN carried, taken off the client's queue at connect.
    sent_at_connect: u64,
}

/// Counts the connection as open (the listener's active gauge, the proxy's total) until the
/// task ends, however it ends. Keeps the listener, not its label: a label is a heap block
/// that every idle connection would hold.
struct ActiveGuard(Arc<Shared>, Arc<ListenerConfig>);

impl ActiveGuard {
    fn new(shared: Arc<Shared>, listener: Arc<ListenerConfig>) -> ActiveGuard {
        let labels = Metrics::listener(&listener.name);
        shared.metrics.active.get_or_create(&labels).inc();
        shared.connections_open.fetch_add(1, Ordering::Relaxed);
        ActiveGuard(shared, listener)
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        let labels = Metrics::listener(&self.1.name);
        self.0.metrics.active.get_or_create(&labels).dec();
        self.0.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connection {
    /// Serves the connection to its end; every outcome is logged and counted.
    ///
    /// The task's future is as large as its largest state, and it lives as long as the
    /// connection: everything before the relay (a PROXY header, opening a transport with its
    /// TLS handshake, finding the target and connecting, and the HTTP engine of an HTTP
    /// listener) is one boxed future, freed when the relay starts, so an idle relayed
    /// connection keeps only the relay's state (its per-connection memory, `midway-bench
    /// --idle`).
    ///
    /// The connection's `conn` span (made at accept, fields recorded as they become known)
    /// covers that setup; the relay runs in one remade from the same fields while it moves
    /// bytes and dropped while it is parked ([`Connection::relay`]).
    ///
    /// An `async move` block, not an async fn: an async fn stores each argument twice in its
    /// future (the argument and the local it becomes).
    pub(super) fn serve(self, client: TcpStream) -> impl Future<Output = ()> {
        let (mut this, client) = (self, client);
        async move {
            let _active = ActiveGuard::new(this.shared.clone(), this.listener.clone());
            // Matched where it is produced: a named result would keep its slot in the task
            // for the connection's life.
            let Some((split, _chain)) = Box::pin(this.prepare(client)).await else {
                return;
            };
            this.relay(split).await;
        }
    }

    /// Serves a stream of a QUIC peer listener's tunnel, which needs no opening: the header,
    /// the onward connection and the relay, as for a connection accepted over TCP.
    pub(super) fn serve_stream(self, client: PeerLink) -> impl Future<Output = ()> {
        let (this, client) = (self, client);
        async move {
            let _active = ActiveGuard::new(this.shared.clone(), this.listener.clone());
            let prepare = this
                .prepare_split(client, Instant::now())
                .instrument(this.span(None));
            let Some((split, _chain)) = Box::pin(prepare).await else {
                return;
            };
            this.relay(split).await;
        }
    }

    /// Everything before the relay: the PROXY header of a listed load balancer, then either
    /// the HTTP engine (an HTTP listener's connection, served to its end here) or opening the
    /// listener's transport, finding the target and connecting onward. The split connection
    /// ready to relay, with the chain registration to hold while it lives; `None` when it
    /// ended here (logged and counted).
    async fn prepare(&mut self, client: TcpStream) -> Option<(Split, Option<Box<Chain>>)> {
        let span = self.span(None);
        self.prepare_in_span(client).instrument(span).await
    }

    async fn prepare_in_span(&mut self, client: TcpStream) -> Option<(Split, Option<Box<Chain>>)> {
        let mut client = client;
        let started = Instant::now();
        if self
            .listener
            .proxy_protocol
            .expects_header_from(self.peer.ip())
        {
            let cancel = self.cancel.clone();
            let taken = tokio::select! {
                _ = cancel.cancelled() => return None,
                taken = self.take_proxy_header(&mut client) => taken,
            };
            if let Err(err) = taken {
                self.refuse(&err, "connection not relayed");
                close_now(client);
                return None;
            }
        }
        if let Some(http) = self.http.clone() {
            Box::pin(self.serve_http(client, http, started)).await;
            return None;
        }
        let (local, _) = self.profiles();
        let opened = tokio::select! {
            _ = self.cancel.cancelled() => {
                tracing::debug!("cancelled during setup");
                return None;
            }
            opened = self.open(client, local) => opened,
        };
        let client = match opened {
            Ok(client) => client,
            Err(err) => {
                self.refuse(&err, "connection not relayed");
                return None;
            }
        };
        self.prepare_split(client, started).await
    }

    /// The connection's `conn` span, from what is known of it now. Made at the start of the
    /// task (without a destination; it is recorded once known) and again whenever the relay
    /// runs. Behind a load balancer whose PROXY header is not read yet, the client and its
    /// profiles are unknown: [`Connection::take_proxy_header`] records them.
    fn span(&self, dst: Option<SocketAddr>) -> tracing::Span {
        let header_pending = self.proxied.is_none()
            && self
                .listener
                .proxy_protocol
                .expects_header_from(self.peer.ip());
        let known = (!header_pending).then_some(());
        let proxied_by = match &self.proxied {
            Some(proxied) => Some(proxied.balancer),
            None => header_pending.then_some(self.peer),
        };
        let (local, remote) = self.profiles();
        tracing::info_span!(
            "conn",
            listener = %self.listener.name,
            client = known.map(|()| field::display(self.peer)),
            proxied_by = proxied_by.map(field::display),
            dst = dst.map(field::display),
            local_profile = known.map(|()| field::display(&local.name)),
            remote_profile = known.map(|()| field::display(&remote.name)),
        )
    }

    /// Relays `split` to its end (see [`relay::relay`]) in the connection's `conn` span,
    /// remade from the connection's fields whenever the relay runs: held by every idle
    /// connection, a span cost about 440 bytes in the subscriber (its slot, its map of
    /// extensions, its formatted fields). The destination is the address connected to (a
    /// name the client gave appears resolved here).
    fn relay(&self, split: Split) -> impl Future<Output = ()> + '_ {
        let dst = split.target;
        let span = move || self.span(dst);
        relay::relay(
            split,
            &self.listener,
            &self.shared,
            self.generation.config.idle_timeout,
            self.cancel.clone(),
            span,
        )
    }

    /// Reads the PROXY header a listed load balancer starts the connection with, and admits
    /// the client it names as the accept loop admits one that connects itself (the access
    /// list, the per-client limit); that client is the connection's from here on (profiles,
    /// logs, the header this midway sends onward).
    async fn take_proxy_header(&mut self, client: &mut TcpStream) -> Result<(), SetupError> {
        let balancer = self.peer;
        let refused = |refusal| SetupError::ProxyHeader {
            from: balancer,
            refusal,
        };
        let header = proxied::read_header(client, self.generation.config.handshake_timeout)
            .await
            .map_err(refused)?;
        let (peer, destination) = match header {
            Proxied::Client {
                client,
                destination,
            } => (client, Some(destination)),
            // The load balancer's own connection (a health check): its real address is the
            // client, held to the same rules.
            Proxied::Local => (balancer, None),
        };
        if !self.generation.access.allows(peer.ip()) {
            return Err(refused(ProxyHeaderRefusal::ClientNotAllowed(peer.ip())));
        }
        let permit = self
            .shared
            .client_limits
            .try_acquire(peer.ip())
            .ok_or_else(|| refused(ProxyHeaderRefusal::ClientLimit(peer.ip())))?;
        self._permits.1 = Some(permit);
        self.peer = peer;
        self.proxied = Some(Box::new(ProxiedBy {
            balancer,
            destination,
        }));
        let span = tracing::Span::current();
        span.record("client", field::display(peer));
        let (local, remote) = self.profiles();
        span.record("local_profile", field::display(&local.name));
        span.record("remote_profile", field::display(&remote.name));
        Ok(())
    }

    /// Finds the target and connects onward: the split connection ready to relay, with the
    /// chain registration to hold while it lives (boxed: most connections have none, and the
    /// slot stays in the task for the connection's life); `None` when it ended here (logged
    /// and counted).
    async fn prepare_split(
        &self,
        mut client: PeerLink,
        started: Instant,
    ) -> Option<(Split, Option<Box<Chain>>)> {
        let (local, remote) = self.profiles();
        // Known at accept (the handshake's last packet), before any client byte.
        let client_class = if self.listener.carry_dscp {
            dscp::client_class(client.tcp())
        } else {
            None
        };
        let setup = tokio::select! {
            _ = self.cancel.cancelled() => {
                tracing::debug!("cancelled during setup");
                // A reset, not a close: the client's first bytes may already have been taken
                // (sent to a peer ahead of its status), so a close would look like a clean end.
                client.reset();
                return None;
            }
            setup = Box::pin(self.setup(&mut client, remote, client_class)) => setup,
        };
        let onward = match setup {
            Ok(onward) => onward,
            Err(SetupError::PeerIdleClosed) => {
                tracing::debug!("warm connection from a peer closed unused");
                return None;
            }
            Err(err) => {
                self.refuse(&err, "connection not relayed");
                self.listener.intercept.report_failure(client, &err).await;
                return None;
            }
        };
        let split = Split {
            client,
            server: onward.stream,
            started,
            adjustable: (leaves_buffers(local), leaves_buffers(remote)),
            segments: (self.listener.intercept.accepted_segment(), onward.segment),
            client_addr: self.peer,
            target: onward.target,
            peer: onward.peer,
            sent_at_connect: onward.sent_at_connect,
        };
        Some((split, onward.chain.map(Box::new)))
    }

    /// The (local, remote) profile for this client.
    fn profiles(&self) -> (&TcpProfile, &TcpProfile) {
        self.profiles.for_client(self.peer.ip())
    }

    /// What an accepted socket carries of its `local` profile: all its options when the
    /// listener carries the same profile (accepted sockets are copies of it; a reload puts a
    /// listener's new profile on the socket it keeps), none when a client prefix has its own.
    fn carried_by_listener(&self, local: &TcpProfile) -> CarriedOptions {
        if local.name == self.listener.local_profile {
            CarriedOptions::All
        } else {
            CarriedOptions::None
        }
    }

    /// Counts and logs a connection that ends before relaying or serving.
    fn refuse(&self, err: &SetupError, message: &str) {
        self.shared
            .metrics
            .refuse(&self.listener.name, err.reason());
        match err {
            SetupError::PeerRefused { refusal, .. } => {
                peering::count_refusal(&self.shared.metrics, &self.listener.name, refusal);
            }
            // A peer listener's TLS handshake: the connecting midway's key, or no TLS at all.
            SetupError::PeerTls { reason, .. }
                if !self.listener.intercept.limits_connecting_client() =>
            {
                self.shared
                    .metrics
                    .peer_auth_failure(&self.listener.name, &format!("tls_{reason}"));
            }
            _ => {}
        }
        if err.is_resource_exhaustion() {
            // One line per refused connection would flood the log exactly when the process
            // is out of descriptors; the metric above still counts each.
            if let Some(left_out) = admit_out_of_resources() {
                tracing::warn!(error = %ErrorChain(err), reason = err.reason(), left_out, "{message} (out of resources)");
            }
            return;
        }
        tracing::info!(error = %ErrorChain(err), reason = err.reason(), "{message}");
    }

    /// Applies the local profile and opens the listener's transport (a peer listener's TLS
    /// handshake) on the accepted socket.
    async fn open(&self, client: TcpStream, local: &TcpProfile) -> Result<PeerLink, SetupError> {
        apply_established(
            &client,
            local,
            Role::Accepted,
            self.carried_by_listener(local),
        )?;
        let timeout = self.generation.config.handshake_timeout;
        self.listener
            .intercept
            .open_transport(client, self.peer, timeout)
            .await
    }

    /// Finds the target and connects onward. Returns the onward segment.
    async fn setup(
        &self,
        client: &mut PeerLink,
        remote: &TcpProfile,
        client_class: Option<u8>,
    ) -> Result<Onward, SetupError> {
        let config = &self.generation.config;
        let intercept = &self.listener.intercept;
        let accepted = Accepted {
            peer: self.peer,
            listener_addr: self.listener_addr,
            config,
            access: &self.generation.access,
            peering: &self.generation.peering,
            client_limits: &self.shared.client_limits,
            shutdown: &self.shutdown,
        };
        let target = intercept.find_target(client, &accepted).await?;
        tracing::Span::current().record("dst", field::display(&target.addr));
        let onward = self
            .connect_onward(target, remote, client_class, client.tcp_plain())
            .await?;
        intercept.report_connected(client, &onward.stream).await?;
        Ok(onward)
    }

    /// The onward segment: through the peer of the listener's `via` whose destinations hold
    /// the target most specifically, else straight to the target with the remote profile.
    async fn connect_onward(
        &self,
        target: Target<'_>,
        remote: &TcpProfile,
        client_class: Option<u8>,
        plain_client: Option<&TcpStream>,
    ) -> Result<Onward, SetupError> {
        let config = &self.generation.config;
        let mut addr = target.addr;
        if !self.listener.via.is_empty() {
            // The header carries an address, and the peer is chosen by it: a name is resolved
            // here, once.
            let destination = resolve_first(&addr, target.denied, config.connect_timeout).await?;
            if let Some(&index) = peer_for(&config.peers, &self.listener.via, destination.ip()) {
                let chain = match target.chain {
                    Some(chain) => chain,
                    None => self.generation.peering.start_chain(self.peer),
                };
                // Boxed: inline, the peer path's state (14 KB) would be in every connection's
                // setup, and touching it costs each accept.
                let (stream, sent_at_connect) = Box::pin(self.generation.peering.connect_through(
                    index,
                    &chain,
                    destination,
                    plain_client,
                    config.connect_timeout,
                ))
                .await?;
                tracing::debug!(peer = %config.peers[index].name, transport = stream.transport().as_str(), "connected through peer");
                // A warm connection's SYN went long ago; its packets from here on are marked.
                if let (Some(class), Some(socket)) = (client_class, stream.tcp()) {
                    if let Err(err) = dscp::mark(socket, class) {
                        tracing::debug!(error = %err, "client's DSCP not carried to the peer");
                    }
                }
                return Ok(Onward {
                    stream,
                    segment: "peer",
                    chain: Some(chain),
                    target: Some(destination),
                    peer: self.generation.peering.pools().get(index).cloned(),
                    sent_at_connect,
                });
            }
            addr = TargetAddr::Ip(destination);
        }
        let sent_at_connect = AtomicU64::new(0);
        let (mut stream, connected_to) = connect(
            &addr,
            remote,
            Outgoing {
                spoof_from: target.spoof_from,
                class: client_class,
                keep_server_class: self.listener.carry_dscp,
                first_bytes_from: plain_client.map(|client| (client, &sent_at_connect)),
            },
            target.denied,
            config.connect_timeout,
        )
        .await?;
        apply_established(&stream, remote, Role::Outgoing, CarriedOptions::All)?;
        if self.listener.proxy_protocol.send {
            // At a gateway the client is the one the peer header names.
            let client = target.chain.as_ref().map_or(self.peer, Chain::client);
            let destination = self.original_destination(&stream)?;
            proxied::send_header(&mut stream, client, destination, config.connect_timeout).await?;
        }
        Ok(Onward {
            target: Some(connected_to),
            stream: PeerLink::Tcp(stream),
            segment: "remote",
            chain: target.chain,
            peer: None,
            sent_at_connect: sent_at_connect.into_inner(),
        })
    }

    /// The destination the PROXY header sent onward names: where the remote segment goes,
    /// except on a forward listener whose client came through a load balancer, where it is
    /// the address the client connected to there (carried on, as HAProxy's `send-proxy` does
    /// after `accept-proxy`).
    fn original_destination(&self, remote: &TcpStream) -> Result<SocketAddr, SetupError> {
        let carried = self
            .proxied
            .as_ref()
            .and_then(|proxied| proxied.destination);
        match (&self.listener.intercept, carried) {
            (Intercept::Forward { .. }, Some(destination)) => Ok(destination),
            _ => remote
                .peer_addr()
                .map_err(|source| SetupError::ProxyHeaderSend {
                    target: "the remote segment".to_string(),
                    source,
                }),
        }
    }

    /// An HTTP listener's connection: the engine reads requests and answers them (from the
    /// cache or through pooled upstream connections opened by
    /// [`super::connect::upstream_connector`]). Access control, limits and the active gauge
    /// were handled like for any connection; the socket memory guard counts it and caps its
    /// client socket like a relayed one's.
    async fn serve_http(&self, client: TcpStream, http: HttpListener, started: Instant) {
        let name = &self.listener.name;
        let metrics = &self.shared.metrics;
        let (local, _) = self.profiles();
        // The engine writes a response's head and its body pieces as they come; with Nagle on,
        // a short piece waits for the client's (often delayed) ACK of the previous one, which
        // cost the lab's web pages more than a second each.
        let carried = self.carried_by_listener(local);
        let prepared = apply_established(&client, local, Role::Accepted, carried).and_then(|()| {
            self.listener
                .intercept
                .check_http_client(&client, self.listener_addr)
        });
        if let Err(err) = prepared {
            self.refuse(&err, "connection not served");
            return;
        }
        // Counted by the memory guard while served; the caps reach the client socket here and
        // new upstream sockets in `upstream_connector` (pooled ones are shared by clients).
        let client_id = SocketId::new(&client);
        let mut memory = MemoryCaps::register(
            self.shared.socket_memory.as_ref(),
            &[("local", client_id, leaves_buffers(local))],
        );
        let access_share = self
            .shared
            .access_links
            .as_ref()
            .and_then(|links| links.join(self.peer.ip(), &client));
        // Listed by the control socket while served: its bytes live, its client socket's
        // tcp_info; the upstreams are pooled (shared between clients), so no remote socket.
        let counters = Arc::new(RelayCounters::default());
        let _registered = self.shared.registry.register(Entry {
            listener: self.listener.clone(),
            client: self.peer,
            target: None,
            started,
            counters: counters.clone(),
            sockets: [client_id, SocketId::of(None)],
            segments: [("local", Transport::Tcp), ("remote", Transport::Tcp)],
            peer: None,
            cancel: self.cancel.clone(),
        });
        let serve = std::pin::pin!(http.engine.serve_client(
            client,
            self.peer,
            http.connect_upstream.clone(),
            self.cancel.clone(),
            counters,
            access_share.as_ref().and_then(SharedLink::window),
        ));
        let result = memory::following_caps(memory.as_mut(), serve).await;
        let duration_ms = started.elapsed().as_millis() as u64;
        match result {
            Ok(report) => {
                ByteReporter::default().report(
                    metrics,
                    name,
                    report.bytes_from_client,
                    report.bytes_to_client,
                );
                tracing::info!(
                    requests = report.requests,
                    rejected = report.rejected,
                    tunnels = report.tunnels,
                    bytes_from_client = report.bytes_from_client,
                    bytes_to_client = report.bytes_to_client,
                    duration_ms,
                    "http connection closed"
                );
            }
            Err(err) => {
                metrics
                    .relay_errors
                    .get_or_create(&Metrics::listener(name))
                    .inc();
                tracing::info!(error = %ErrorChain(&err), duration_ms, "http connection failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future a function returns, without calling it.
    fn future_size<A, B, F: Future>(_: fn(A, B) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every connection's task holds this future (plus tokio's header) for its whole life, idle
    /// or not: the largest part of the memory an idle connection costs (`midway-bench --idle`).
    /// It was 4,240 bytes before the relay parked and the long-lived layers stored their
    /// arguments once, 1,872 after the relay's set-up moved out of it, 1,488 with 32-byte
    /// tcp_info samples, and 1,008 since metric labels, the span, the caps' watch future and
    /// the wide names went (docs/results/bench). tokio's cell around it is 128-byte aligned:
    /// up to 1,040 bytes it is 1,152, above that 1,280. A new state that needs more belongs in
    /// a box of its own.
    #[test]
    fn the_connection_future_stays_small() {
        let size = future_size(Connection::serve);
        eprintln!("Connection::serve's future is {size} bytes");
        assert!(size <= 1040, "Connection::serve's future is {size} bytes");
    }
}
