//! The listening sockets, from bind to stop: each listener is bound (or taken over from the
//! midway this one upgrades) at start or by a reload, gets its own accept loop (`accept.rs`)
//! once the proxy runs, and stops on its own when a reload removes it, or with all the others at
//! a handover or shutdown.
//!
//! A QUIC peer listener is a UDP socket with a QUIC endpoint and its own accept loop
//! (`quic_accept.rs`). It is bound with `SO_REUSEPORT` instead of being handed over: a QUIC
//! connection's state lives in the process that set it up, so the midway a binary upgrade
//! replaces closes its tunnels when it stops listening (their connections end with a reset on
//! both sides, the close rule) and the edges set up new ones with the new process (or fall back
//! to TLS until they can).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;

use midway_tcp::{KnobError, Role, TcpProfile};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::accept::{accept_loop, AcceptLoop};
use super::connect::{default_nodelay, set_transparent};
use super::error::ProxyError;
use super::generation::Generation;
use super::handover::{Inherited, ListenerKey};
use super::quic_accept::{quic_accept_loop, QuicAcceptLoop};
use super::shared::Shared;
use crate::config::{Intercept, ListenerConfig, ListenerTransport};

/// Backlog of every listener. Large, so bursts and the total-limit wait queue in the kernel.
const LISTEN_BACKLOG: i32 = 4096;

/// A listening socket's identity across reloads and processes: its configured address and
/// whether it is transparent.
pub(super) fn listener_key(listener: &ListenerConfig) -> ListenerKey {
    ListenerKey {
        listen: listener.listen,
        transparent: listener.intercept.needs_transparent_listener(),
        udp: quic_config(listener).is_some(),
    }
}

/// A QUIC peer listener's endpoint config.
fn quic_config(listener: &ListenerConfig) -> Option<&midway_quic::ServerConfig> {
    match &listener.intercept {
        Intercept::Peer {
            transport: ListenerTransport::Quic { tunnel, .. },
            ..
        } => Some(tunnel.as_ref()),
        _ => None,
    }
}

/// A listening socket: TCP, or a QUIC peer listener's endpoint.
#[derive(Clone)]
enum Listening {
    Tcp(Arc<TcpListener>),
    Quic(midway_quic::Endpoint),
}

/// A listening socket, bound (or taken over) at start or by a reload, not accepting yet.
pub(super) struct BoundListener {
    pub(super) name: String,
    key: ListenerKey,
    listener: Listening,
    /// The address it really bound (port 0 resolved).
    pub(super) addr: SocketAddr,
}

impl BoundListener {
    /// Binds `listener` (or takes the socket `inherited` offers for it) and puts its local
    /// profile (one of `profiles`) on it.
    pub(super) fn bind(
        listener: &ListenerConfig,
        profiles: &SharedProfiles,
        inherited: Option<&mut Inherited>,
    ) -> Result<BoundListener, ProxyError> {
        let profile = local_profile(listener, profiles)?;
        let addr = listener.listen;
        let bind_err = |source| ProxyError::Bind {
            listener: listener.name.clone(),
            addr,
            source,
        };
        let key = listener_key(listener);
        if let Some(config) = quic_config(listener) {
            let quic_err = |err: midway_quic::QuicError| bind_err(std::io::Error::other(err));
            let socket = midway_quic::bind_udp(addr, true).map_err(quic_err)?;
            let endpoint =
                midway_quic::server_endpoint(socket, config.clone()).map_err(quic_err)?;
            let local = endpoint.local_addr().map_err(bind_err)?;
            tracing::info!(listener = %listener.name, mode = "peer", transport = "quic", addr = %local, "listening");
            return Ok(BoundListener {
                name: listener.name.clone(),
                key,
                listener: Listening::Quic(endpoint),
                addr: local,
            });
        }
        let taken = inherited.and_then(|inherited| inherited.take_listener(key));
        let took_over = taken.is_some();
        let sock = match taken {
            Some(fd) => Socket::from(fd),
            None => {
                let sock =
                    Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
                        .map_err(bind_err)?;
                sock.set_reuse_address(true).map_err(bind_err)?;
                if addr.is_ipv6() {
                    // The address family says which clients this listener takes: [::] is IPv6
                    // only, so an IPv4 listener on the same port can coexist.
                    sock.set_only_v6(true).map_err(bind_err)?;
                }
                if key.transparent {
                    set_transparent(&sock, addr.is_ipv6()).map_err(bind_err)?;
                }
                sock
            }
        };
        put_profile(listener, profile, &sock)?;
        sock.set_nonblocking(true).map_err(bind_err)?;
        if !took_over {
            sock.bind(&SockAddr::from(addr)).map_err(bind_err)?;
            sock.listen(LISTEN_BACKLOG).map_err(bind_err)?;
        }
        let std_listener: std::net::TcpListener = sock.into();
        let local = std_listener.local_addr().map_err(bind_err)?;
        let tokio_listener = TcpListener::from_std(std_listener).map_err(bind_err)?;
        tracing::info!(
            listener = %listener.name,
            mode = listener.intercept.mode_name(),
            http = listener.http.is_some(),
            addr = %local,
            taken_over = took_over,
            "listening"
        );
        Ok(BoundListener {
            name: listener.name.clone(),
            key,
            listener: Listening::Tcp(Arc::new(tokio_listener)),
            addr: local,
        })
    }
}

/// The profiles by name, route marks filled in, as a generation shares them.
type SharedProfiles = BTreeMap<String, Arc<TcpProfile>>;

/// `listener`'s local profile, which its listening socket carries.
fn local_profile<'p>(
    listener: &ListenerConfig,
    profiles: &'p SharedProfiles,
) -> Result<&'p TcpProfile, ProxyError> {
    profiles
        .get(&listener.local_profile)
        .map(|profile| profile.as_ref())
        .ok_or_else(|| ProxyError::UnknownProfile {
            listener: listener.name.clone(),
            profile: listener.local_profile.clone(),
        })
}

/// Puts `listener`'s local `profile` on its listening socket (TCP_NODELAY too unless the
/// profile decides, see [`default_nodelay`]), and asks it to keep the traffic
/// class its clients' packets carry when the listener carries DSCP (off again when a reload
/// turns that off): accepted sockets inherit the listener's options.
fn put_profile(
    listener: &ListenerConfig,
    profile: &TcpProfile,
    sock: &Socket,
) -> Result<(), ProxyError> {
    profile
        .apply_to_listener(sock)
        .map_err(|source| ProxyError::ListenerProfile {
            listener: listener.name.clone(),
            profile: profile.name.clone(),
            source: Box::new(source),
        })?;
    default_nodelay(sock.as_fd(), profile).map_err(|source| ProxyError::ListenerProfile {
        listener: listener.name.clone(),
        profile: profile.name.clone(),
        source: Box::new(KnobError::Set {
            profile: profile.name.clone(),
            knob: "nodelay",
            role: Role::Listener,
            source,
        }),
    })?;
    midway_sys::tos::set_keep_received_class(sock.as_fd(), listener.carry_dscp).map_err(|source| {
        ProxyError::KeepClientClass {
            listener: listener.name.clone(),
            source,
        }
    })
}

/// What every accept loop shares.
#[derive(Clone)]
pub(super) struct AcceptContext {
    pub(super) shared: Arc<Shared>,
    pub(super) generations: watch::Sender<Arc<Generation>>,
    pub(super) tracker: TaskTracker,
    /// Fires when the process stops taking new work (given to connections).
    pub(super) draining: CancellationToken,
    /// Cancels connections; fired only after the grace period.
    pub(super) connections_cancel: CancellationToken,
}

/// One accept loop per listener, each stoppable on its own (a reload that removes it).
pub(super) struct RunningListeners {
    listeners: BTreeMap<String, RunningListener>,
    accept_loops: JoinSet<()>,
    context: AcceptContext,
}

struct RunningListener {
    key: ListenerKey,
    listener: Listening,
    stop: CancellationToken,
}

impl RunningListeners {
    /// No listener accepting yet; each one [`RunningListeners::start`] starts shares `context`.
    pub(super) fn new(context: AcceptContext) -> RunningListeners {
        RunningListeners {
            listeners: BTreeMap::new(),
            accept_loops: JoinSet::new(),
            context,
        }
    }

    /// Starts `bound`'s accept loop (replacing a running listener of the same name).
    pub(super) fn start(&mut self, bound: BoundListener) {
        let stop = CancellationToken::new();
        let cx = self.context.clone();
        match &bound.listener {
            Listening::Tcp(listener) => {
                self.accept_loops.spawn(accept_loop(AcceptLoop {
                    shared: cx.shared,
                    name: bound.name.clone(),
                    listener: listener.clone(),
                    addr: bound.addr,
                    generations: cx.generations.subscribe(),
                    tracker: cx.tracker,
                    stop: stop.clone(),
                    draining: cx.draining,
                    connections_cancel: cx.connections_cancel,
                }));
                if bound.key.transparent {
                    self.context
                        .shared
                        .transparent_listeners()
                        .push(listener.clone());
                }
            }
            Listening::Quic(endpoint) => {
                self.accept_loops.spawn(quic_accept_loop(QuicAcceptLoop {
                    shared: cx.shared,
                    name: bound.name.clone(),
                    endpoint: endpoint.clone(),
                    addr: bound.addr,
                    generations: cx.generations.subscribe(),
                    tracker: cx.tracker,
                    stop: stop.clone(),
                    draining: cx.draining,
                    connections_cancel: cx.connections_cancel,
                }));
            }
        }
        if let Some(replaced) = self.listeners.insert(
            bound.name,
            RunningListener {
                key: bound.key,
                listener: bound.listener,
                stop,
            },
        ) {
            replaced.stop.cancel();
        }
    }

    /// Stops one listener's accept loop; its socket closes when the loop returns.
    pub(super) fn stop(&mut self, name: &str) {
        if let Some(listener) = self.listeners.remove(name) {
            listener.stop.cancel();
            if let Listening::Tcp(stopped) = &listener.listener {
                self.context
                    .shared
                    .transparent_listeners()
                    .retain(|l| !Arc::ptr_eq(l, stopped));
            }
        }
    }

    /// Stops every accept loop and waits until none accepts any more.
    pub(super) async fn stop_all(&mut self) {
        for (_, listener) in std::mem::take(&mut self.listeners) {
            listener.stop.cancel();
        }
        self.context.shared.transparent_listeners().clear();
        while self.accept_loops.join_next().await.is_some() {}
    }

    /// The names of the listeners accepting now.
    pub(super) fn names(&self) -> impl Iterator<Item = &String> + '_ {
        self.listeners.keys()
    }

    /// Keeps the running listener `listener` names if its socket is the one `listener` wants
    /// (same address, same kind), putting the new local profile (one of `profiles`) on it;
    /// `false` when it must be bound anew (new, or moved).
    pub(super) fn keep(
        &self,
        listener: &ListenerConfig,
        profiles: &SharedProfiles,
    ) -> Result<bool, ProxyError> {
        let profile = local_profile(listener, profiles)?;
        match self.listeners.get(&listener.name) {
            Some(current) if current.key == listener_key(listener) => {
                match &current.listener {
                    Listening::Tcp(socket) => {
                        // Accepted sockets inherit the listener's options: the new profile's.
                        let sock = socket2::SockRef::from(socket.as_ref());
                        put_profile(listener, profile, &sock)?;
                    }
                    Listening::Quic(endpoint) => {
                        // New tunnels check the new pins; tunnels up keep going.
                        endpoint.set_server_config(quic_config(listener).cloned());
                    }
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Every running TCP listener's name, identity and socket (what a handover offers).
    pub(super) fn sockets(&self) -> impl Iterator<Item = (&String, ListenerKey, &TcpListener)> {
        self.listeners
            .iter()
            .filter_map(|(name, l)| match &l.listener {
                Listening::Tcp(socket) => Some((name, l.key, socket.as_ref())),
                Listening::Quic(_) => None,
            })
    }
}
