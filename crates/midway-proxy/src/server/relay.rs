//! Relay supervision and per-connection telemetry: runs midway-relay on the two segments,
//! follows the memory guard's caps, samples tcp_info while bytes move, and at the end logs
//! the connection and feeds the byte counters and histograms with final values.

use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use midway_relay::{
    CloseHook, OnClose, PeerSide, RelayCounters, RelayModel, RelayOptions, RelayReport,
};
use midway_tcp::TcpStats;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tracing::Span;

use super::access_links::SharedLink;
use super::dscp::ServerClassCarrier;
use super::error::ErrorChain;
use super::memory::MemoryCaps;
use super::peer_link::{PeerLink, Transport};
use super::pool::WarmPool;
use super::registry::Entry;
use super::shared::Shared;
use super::socket_id::SocketId;
use crate::config::ListenerConfig;
use crate::metrics::{CongestionLabels, DirectionLabels, Metrics, SegmentLabels};
use crate::sockmem::Adjustable;

/// tcp_info of live connections is sampled this often (metrics, and the values logged at end).
const TCP_INFO_SAMPLE_INTERVAL: Duration = Duration::from_secs(2);
/// A buffer-relayed connection quiet this long frees the relay's running state until a byte
/// comes (midway-relay's `park_after`): an idle connection then costs its sockets and the
/// task around them. Long enough that a request-response exchange does not park between its
/// turns; resuming costs an allocation and two socket options.
const PARK_AFTER: Duration = Duration::from_secs(1);

/// A split connection with both segments connected, ready to relay.
pub(super) struct Split {
    pub(super) client: PeerLink,
    pub(super) server: PeerLink,
    /// When the client was accepted.
    pub(super) started: Instant,
    /// Which buffers of each segment's socket the memory guard may cap.
    pub(super) adjustable: (Adjustable, Adjustable),
    /// Each segment's label: local or peer, remote or peer.
    pub(super) segments: (&'static str, &'static str),
    /// The address that connected, or the client a load balancer's PROXY header named (whose
    /// access link paces the connection).
    pub(super) client_addr: SocketAddr,
    /// The destination, if known.
    pub(super) target: Option<SocketAddr>,
    /// The peer the connection goes through, if any.
    pub(super) peer: Option<Arc<WarmPool>>,
    /// Client bytes already sent to the server in a Fast Open SYN (counted here, not by the
    /// relay, which starts after them).
    pub(super) sent_at_connect: u64,
}

/// Relays `split` with `listener`'s relay settings until both directions end, `idle_timeout`
/// passes without a byte, or `cancel` fires; then logs the connection and counts it.
///
/// The set-up (registrations, the first samples, the boxed relay) runs when this is called,
/// outside the returned future: a value an async block takes in keeps its slot in the future
/// for the connection's whole life even after it is moved on (the two segments, 160 bytes,
/// were stored so in every idle connection's task). The future holds only what the relay's
/// life and its end need.
///
/// Everything runs in the connection's span, which `make_span` makes: now, and again whenever
/// the relay runs after a park; the span is dropped while the relay is parked.
pub(super) fn relay<'a, S>(
    split: Split,
    listener: &'a Arc<ListenerConfig>,
    shared: &'a Shared,
    idle_timeout: Duration,
    cancel: CancellationToken,
    make_span: S,
) -> impl Future<Output = ()> + 'a
where
    S: Fn() -> Span + Send + 'a,
{
    let mut span = Some(make_span());
    let entered = span.as_ref().map(Span::enter);
    let name = &listener.name;
    let metrics = &shared.metrics;
    // Each socket's id once (an fstat each), copied to every holder below.
    let ids = [
        SocketId::of(split.client.tcp()),
        SocketId::of(split.server.tcp()),
    ];
    // A QUIC stream has no socket of its own to cap.
    let sockets: Vec<_> = [
        ("local", split.client.tcp(), ids[0], split.adjustable.0),
        ("remote", split.server.tcp(), ids[1], split.adjustable.1),
    ]
    .into_iter()
    .filter_map(|(side, socket, id, adjustable)| socket.map(|_| (side, id, adjustable)))
    .collect();
    let mut memory = MemoryCaps::register(shared.socket_memory.as_ref(), &sockets);
    // Paced at its share of the subscriber's access link while it lives (when one covers the
    // client); the share follows the socket by its inode after the relay took it.
    let access_share = shared
        .access_links
        .as_ref()
        .and_then(|links| links.join(split.client_addr.ip(), split.client.tcp()?));
    let transports = (split.client.transport(), split.server.transport());
    let counters = Arc::new(RelayCounters::default());
    // Listed by the control socket until the relay ends; `cancel` is this connection's own.
    let registered = shared.registry.register(Entry {
        listener: listener.clone(),
        client: split.client_addr,
        target: split.target,
        started: split.started,
        counters: counters.clone(),
        sockets: ids,
        segments: [
            (split.segments.0, transports.0),
            (split.segments.1, transports.1),
        ],
        peer: split.peer,
        cancel: cancel.clone(),
    });
    counters
        .client_to_server
        .fetch_add(split.sent_at_connect, Ordering::Relaxed);
    // The relay owns and closes both sockets; it hands them to this callback just before,
    // so the end-of-connection log and histograms get final values, not a stale sample.
    // Boxed when set: two `tcp_info`s (320 bytes) are not held through the connection's
    // life for its last moment.
    let final_stats = Arc::new(FinalStatsSlot::default());
    let on_close: OnClose = final_stats.clone();
    let options = RelayOptions {
        idle_timeout: Some(idle_timeout),
        counters: counters.clone(),
        on_close: Some(on_close),
        client_prefix: Vec::new(),
        park_after: Some(PARK_AFTER),
        client_window: access_share.as_ref().and_then(SharedLink::window),
    };
    let mut sampler = SegmentSampler::new((ids[0], split.segments.0), (ids[1], split.segments.1));
    // The sockets are still this task's here: read them directly, no inode check.
    let congestion_controls =
        sampler.congestion_controls(metrics, name, (split.client.tcp(), split.server.tcp()));
    let mut bytes = ByteReporter::default();
    // Boxed, and only where DSCP is carried: most connections never run it.
    let server_class = listener
        .carry_dscp
        .then(|| ServerClassCarrier::new(split.server.tcp(), split.client.tcp()))
        .flatten()
        .map(|carrier| Box::pin(carrier.run(counters.clone())));

    // On the heap, once: a future moved into another async block is stored again in each
    // enclosing future (rustc does not overlap a moved-from value's slot), which tripled the
    // relay's few kilobytes in every connection's task. Boxed, each copy is a pointer.
    let mut relay = relay_segments(
        split.client,
        split.server,
        listener,
        shared,
        options,
        cancel,
    );
    let (started, sent_at_connect) = (split.started, split.sent_at_connect);
    drop(entered);
    async move {
        let metrics = &shared.metrics;
        // Taken in, so held to the end: the control socket's entry, the access link's
        // membership (moved into a local, each would be stored twice).
        let _ = (&registered, &access_share);
        let result = {
            let sampled_relay = std::pin::pin!(async {
                let mut carry_server_class = server_class;
                // While the relay is parked nothing moves: the sampler sleeps until it wakes
                // rather than waking every interval (50,000 task wake-ups a second at 100,000
                // idle connections), and holds no timer (an idle connection's heap).
                let mut tick = None;
                // Polled once first: a parking relay parks at once, so a connection that
                // carries nothing never starts the sampler's timer.
                if let Poll::Ready(result) =
                    std::future::poll_fn(|cx| Poll::Ready(relay.as_mut().poll(cx))).await
                {
                    return result;
                }
                loop {
                    if let Some(memory) = memory.as_mut() {
                        memory.follow();
                    }
                    if tick.is_none() && !counters.parked.load(Ordering::Acquire) {
                        tick = Some(tokio::time::interval_at(
                            tokio::time::Instant::now() + TCP_INFO_SAMPLE_INTERVAL,
                            TCP_INFO_SAMPLE_INTERVAL,
                        ));
                    }
                    tokio::select! {
                        result = &mut relay => break result,
                        () = async {
                            if let Some(carrier) = carry_server_class.as_mut() {
                                carrier.as_mut().await;
                            }
                        }, if carry_server_class.is_some() => carry_server_class = None,
                        // A resumed relay, or the memory guard's new caps (`Registry::wake_all`).
                        () = counters.resumed.notified() => {}
                        () = next_tick(&mut tick), if tick.is_some() => {
                            let moved = (
                                counters.client_to_server.load(Ordering::Relaxed),
                                counters.server_to_client.load(Ordering::Relaxed),
                            );
                            // An idle connection's tcp_info does not change: skip the syscalls,
                            // which matters with thousands of idle connections.
                            if moved != bytes.reported {
                                // The relay future owns both sockets and is alive here, so their
                                // fds are open (and SocketId checks the inode anyway).
                                sampler.sample_live(metrics, name);
                                bytes.report(metrics, name, moved.0, moved.1);
                            }
                            // The bytes before the park (a second quiet at least) are in
                            // `moved`, reported above.
                            if counters.parked.load(Ordering::Acquire) {
                                tick = None;
                            }
                        }
                    }
                }
            });
            in_span_while_running(sampled_relay, &make_span, &mut span, &counters.parked).await
        }
        .map(|mut report| {
            report.client_to_server_bytes += sent_at_connect;
            report
        });
        span.get_or_insert_with(&make_span).in_scope(|| {
            let duration = started.elapsed();
            if let Some(last) = final_stats.0.get() {
                let (local, remote) = &**last;
                sampler.record_final(metrics, name, local.clone(), remote.clone());
            }
            sampler.finish(metrics, name);
            let (local, remote) = (&sampler.local.last, &sampler.remote.last);
            match result {
                Ok(report) => {
                    bytes.report(
                        metrics,
                        name,
                        report.client_to_server_bytes,
                        report.server_to_client_bytes,
                    );
                    log_end(
                        &report,
                        duration,
                        (local.as_ref(), remote.as_ref()),
                        (sampler.local.segment, sampler.remote.segment),
                        transports,
                        &congestion_controls,
                        sampler.last_sample_age(),
                    );
                }
                Err(err) => {
                    bytes.report(
                        metrics,
                        name,
                        counters.client_to_server.load(Ordering::Relaxed),
                        counters.server_to_client.load(Ordering::Relaxed),
                    );
                    metrics
                        .relay_errors
                        .get_or_create(&Metrics::listener(name))
                        .inc();
                    tracing::warn!(
                        error = %ErrorChain(&err),
                        bytes_client_to_server = counters.client_to_server.load(Ordering::Relaxed),
                        bytes_server_to_client = counters.server_to_client.load(Ordering::Relaxed),
                        duration_ms = duration.as_millis() as u64,
                        "relay failed"
                    );
                }
            }
        });
    }
}

/// Polls `work` in the connection's span (`span`, made by `make_span` when it is `None`),
/// which it drops while the relay is parked (`parked`) and leaves in `span` at the end. Not an
/// async fn: that would keep a second copy of its arguments in every connection's task.
fn in_span_while_running<'w, F: Future, S: Fn() -> Span>(
    mut work: Pin<&'w mut F>,
    make_span: &'w S,
    span: &'w mut Option<Span>,
    parked: &'w std::sync::atomic::AtomicBool,
) -> impl Future<Output = F::Output> + 'w {
    std::future::poll_fn(move |cx| {
        let poll = span
            .get_or_insert_with(make_span)
            .in_scope(|| work.as_mut().poll(cx));
        if poll.is_pending() && parked.load(Ordering::Acquire) {
            *span = None;
        }
        poll
    })
}

/// The sampler's next tick; never, without a timer.
async fn next_tick(tick: &mut Option<tokio::time::Interval>) {
    match tick {
        Some(tick) => {
            tick.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The relay of one connection, on the heap: it lives as long as the connection, so it is the
/// chosen relay's future alone, with no wrapper of its own.
type SegmentsRelay<'a> =
    Pin<Box<dyn Future<Output = Result<RelayReport, midway_relay::RelayError>> + Send + 'a>>;

/// Two plain sockets: midway-relay's splice or spool relay with the listener's model. A TLS or
/// QUIC peer segment: the stream relay (copies through the library, so no splice, and no
/// spool: the listener's buffer size per direction), against a plain socket or, in the middle
/// midway of an encrypted chain, against another peer stream.
fn relay_segments<'a>(
    client: PeerLink,
    server: PeerLink,
    listener: &'a ListenerConfig,
    shared: &'a Shared,
    options: RelayOptions,
    cancel: CancellationToken,
) -> SegmentsRelay<'a> {
    let buffer_bytes = match &listener.relay {
        RelayModel::Buffer(buffer) => buffer.buffer_bytes,
        RelayModel::Spool(spool) => spool.buffer_bytes,
    };
    match (client, server) {
        (PeerLink::Tcp(client), PeerLink::Tcp(server)) => Box::pin(midway_relay::relay(
            client,
            server,
            &listener.relay,
            &shared.resources,
            options,
            cancel,
        )),
        (PeerLink::Tcp(client), server) => Box::pin(midway_relay::relay_peer_stream(
            client,
            server,
            PeerSide::Server,
            buffer_bytes,
            options,
            cancel,
        )),
        (client, PeerLink::Tcp(server)) => Box::pin(midway_relay::relay_peer_stream(
            server,
            client,
            PeerSide::Client,
            buffer_bytes,
            options,
            cancel,
        )),
        // The middle midway of an encrypted chain.
        (client, server) => Box::pin(midway_relay::relay_peer_streams(
            client,
            server,
            buffer_bytes,
            options,
            cancel,
        )),
    }
}

fn log_end(
    report: &RelayReport,
    duration: Duration,
    (local, remote): (Option<&LastSample>, Option<&LastSample>),
    segments: (&str, &str),
    transports: (Transport, Transport),
    congestion_controls: &(Option<CongestionName>, Option<CongestionName>),
    sample_age: Duration,
) {
    let get = |s: Option<&LastSample>, f: fn(&LastSample) -> u64| s.map(f);
    tracing::info!(
        // What each side is: local or peer, remote or peer (the segment label of the metrics).
        local_segment = segments.0,
        remote_segment = segments.1,
        // tcp, or tls for a peer segment encrypted with `transport = "tls"`.
        local_transport = transports.0.as_str(),
        remote_transport = transports.1.as_str(),
        local_congestion_control = congestion_controls.0.map(CongestionName::as_str),
        remote_congestion_control = congestion_controls.1.map(CongestionName::as_str),
        bytes_client_to_server = report.client_to_server_bytes,
        bytes_server_to_client = report.server_to_client_bytes,
        client_to_server_end = ?report.client_to_server_end,
        server_to_client_end = ?report.server_to_client_end,
        duration_ms = duration.as_millis() as u64,
        peak_spool_bytes = report.peak_spool_bytes,
        // TCP state when the relay closed the socket (1 = established, 7 = closed, 8 =
        // close-wait, 9 = last-ack, ...): shows the values below are final, not a sample.
        local_state = get(local, |s| s.state.into()),
        remote_state = get(remote, |s| s.state.into()),
        local_bytes_received = get(local, |s| s.bytes_received),
        remote_bytes_received = get(remote, |s| s.bytes_received),
        local_srtt_us = get(local, |s| s.rtt_us.into()),
        local_cwnd = get(local, |s| s.snd_cwnd.into()),
        local_total_retrans = get(local, |s| s.total_retrans.into()),
        local_reordering = get(local, |s| s.reordering.into()),
        remote_srtt_us = get(remote, |s| s.rtt_us.into()),
        remote_cwnd = get(remote, |s| s.snd_cwnd.into()),
        remote_total_retrans = get(remote, |s| s.total_retrans.into()),
        remote_reordering = get(remote, |s| s.reordering.into()),
        // TCP Fast Open: the handshake carried data (the client's SYN on the local segment,
        // midway's, acknowledged, on the remote one).
        local_syn_data = local.map(|s| s.syn_data),
        remote_syn_data = remote.map(|s| s.syn_data),
        tcp_info_age_ms = sample_age.as_millis() as u64,
        "connection closed"
    );
}

/// Final tcp_info of the (local, remote) segment, read by the relay's close callback.
type FinalStats = (Option<TcpStats>, Option<TcpStats>);

/// Where the relay's close hook leaves [`FinalStats`]: the hook and the slot are one value.
#[derive(Default)]
struct FinalStatsSlot(OnceLock<Box<FinalStats>>);

impl CloseHook for FinalStatsSlot {
    fn closing(&self, client: BorrowedFd<'_>, server: BorrowedFd<'_>) {
        let _ = self.0.set(Box::new((
            midway_tcp::tcp_stats(client).ok(),
            midway_tcp::tcp_stats(server).ok(),
        )));
    }
}

/// Adds only what is new since the last report to the byte counters. Holds no labels: they
/// are made when there is something to add (every idle connection holds a reporter).
#[derive(Default)]
pub(super) struct ByteReporter {
    reported: (u64, u64),
}

impl ByteReporter {
    /// Takes the running totals `c2s` and `s2c` of a connection of `listener`; counts what
    /// they add.
    pub(super) fn report(&mut self, metrics: &Metrics, listener: &str, c2s: u64, s2c: u64) {
        add_new(
            metrics,
            (listener, "client_to_server"),
            &mut self.reported.0,
            c2s,
        );
        add_new(
            metrics,
            (listener, "server_to_client"),
            &mut self.reported.1,
            s2c,
        );
    }
}

/// Adds to the byte counter of `(listener, direction)` what `total` has beyond `reported`.
fn add_new(
    metrics: &Metrics,
    (listener, direction): (&str, &'static str),
    reported: &mut u64,
    total: u64,
) {
    if total > *reported {
        let labels = DirectionLabels {
            listener: listener.to_string(),
            direction,
        };
        metrics
            .bytes
            .get_or_create(&labels)
            .inc_by(total - *reported);
        *reported = total;
    }
}

/// What a segment keeps of its latest tcp_info: the fields the end-of-connection log and the
/// srtt / cwnd histograms read. 32 bytes where the whole `TcpStats` is 160: every idle
/// connection's task holds two.
#[derive(Clone, Copy, Debug)]
struct LastSample {
    bytes_received: u64,
    rtt_us: u32,
    snd_cwnd: u32,
    total_retrans: u32,
    reordering: u32,
    state: u8,
    syn_data: bool,
}

impl From<&TcpStats> for LastSample {
    fn from(stats: &TcpStats) -> LastSample {
        LastSample {
            bytes_received: stats.bytes_received,
            rtt_us: stats.rtt_us,
            snd_cwnd: stats.snd_cwnd,
            total_retrans: stats.total_retrans,
            reordering: stats.reordering,
            state: stats.state,
            syn_data: stats.syn_data(),
        }
    }
}

/// tcp_info of one segment's socket (owned by the relay, known by [`SocketId`]). Its metric
/// labels are made when a value is counted: every idle connection holds two segments.
struct Segment {
    socket: SocketId,
    /// The segment's label: local or peer, remote or peer.
    segment: &'static str,
    last: Option<LastSample>,
    retrans_reported: u32,
}

impl Segment {
    fn new((socket, segment): (SocketId, &'static str)) -> Segment {
        Segment {
            socket,
            segment,
            last: None,
            retrans_reported: 0,
        }
    }

    fn labels(&self, listener: &str) -> SegmentLabels {
        SegmentLabels {
            listener: listener.to_string(),
            segment: self.segment,
        }
    }

    fn sample(&mut self, metrics: &Metrics, listener: &str) -> bool {
        let stats = match self.socket.borrow() {
            Some(fd) => midway_tcp::tcp_stats(fd),
            None => return false,
        };
        self.take(metrics, listener, stats)
    }

    fn take<E>(&mut self, metrics: &Metrics, listener: &str, stats: Result<TcpStats, E>) -> bool {
        match stats {
            Ok(stats) => {
                self.record(metrics, listener, stats);
                true
            }
            Err(_) => false,
        }
    }

    /// Takes `stats` as the latest values; the retransmit counter gets what is new.
    fn record(&mut self, metrics: &Metrics, listener: &str, stats: TcpStats) {
        if stats.total_retrans > self.retrans_reported {
            metrics
                .retransmits
                .get_or_create(&self.labels(listener))
                .inc_by(u64::from(stats.total_retrans - self.retrans_reported));
            self.retrans_reported = stats.total_retrans;
        }
        self.last = Some(LastSample::from(&stats));
    }

    fn observe(&self, metrics: &Metrics, listener: &str) {
        if let Some(stats) = &self.last {
            let labels = self.labels(listener);
            if stats.rtt_us > 0 {
                metrics
                    .srtt
                    .get_or_create(&labels)
                    .observe(f64::from(stats.rtt_us) / 1e6);
            }
            metrics
                .cwnd
                .get_or_create(&labels)
                .observe(f64::from(stats.snd_cwnd));
        }
    }
}

/// Samples both segments every few seconds while bytes move, and takes the final values the
/// relay's close hook read. The
/// listener's name, for the metric labels, is passed in rather than kept.
struct SegmentSampler {
    local: Segment,
    remote: Segment,
    last_sample: Instant,
    /// The current `last` values are already in the histograms.
    last_observed: bool,
}

impl SegmentSampler {
    /// `client` and `server` with their segment labels (local or peer, remote or peer).
    fn new(client: (SocketId, &'static str), server: (SocketId, &'static str)) -> SegmentSampler {
        SegmentSampler {
            local: Segment::new(client),
            remote: Segment::new(server),
            last_sample: Instant::now(),
            last_observed: false,
        }
    }

    /// Counts both segments by the congestion control in force on them (read from the sockets
    /// themselves, still the caller's: a route's `congctl` can override the profile's) and
    /// returns their names. No tcp_info is read here: the relay's close hook reads the final
    /// values, and two system calls fewer per connection count at thousands a second.
    fn congestion_controls(
        &self,
        metrics: &Metrics,
        listener: &str,
        (client, server): (Option<&TcpStream>, Option<&TcpStream>),
    ) -> (Option<CongestionName>, Option<CongestionName>) {
        let count = |segment: &Segment, stream: Option<&TcpStream>| {
            let name = midway_sys::tcp_info::congestion_control_of(stream?.as_fd()).ok()?;
            metrics
                .segment_congestion_control
                .get_or_create(&CongestionLabels {
                    listener: listener.to_string(),
                    segment: segment.segment,
                    congestion_control: name.clone(),
                })
                .inc();
            CongestionName::of(name)
        };
        (count(&self.local, client), count(&self.remote, server))
    }

    /// Reads both sockets' tcp_info (retransmit counter updated at once).
    fn sample(&mut self, metrics: &Metrics, listener: &str) {
        let a = self.local.sample(metrics, listener);
        let b = self.remote.sample(metrics, listener);
        if a || b {
            self.last_sample = Instant::now();
            self.last_observed = false;
        }
    }

    /// A periodic sample of a live connection: also goes into the srtt / cwnd histograms.
    fn sample_live(&mut self, metrics: &Metrics, listener: &str) {
        self.sample(metrics, listener);
        self.observe_once(metrics, listener);
    }

    /// Puts the current values into the histograms unless they are there already.
    fn observe_once(&mut self, metrics: &Metrics, listener: &str) {
        if !self.last_observed {
            self.local.observe(metrics, listener);
            self.remote.observe(metrics, listener);
            self.last_observed = true;
        }
    }

    /// The values the relay's close callback read just before closing the sockets.
    fn record_final(
        &mut self,
        metrics: &Metrics,
        listener: &str,
        local: Option<TcpStats>,
        remote: Option<TcpStats>,
    ) {
        let mut any = false;
        for (segment, stats) in [(&mut self.local, local), (&mut self.remote, remote)] {
            if let Some(stats) = stats {
                segment.record(metrics, listener, stats);
                any = true;
            }
        }
        if any {
            self.last_sample = Instant::now();
            self.last_observed = false;
        }
    }

    /// The last sample stands for the end — normally the final one from the relay's close
    /// callback (then `tcp_info_age_ms` is about 0); it is observed unless a live sample already
    /// put these very values into the histograms.
    fn finish(&mut self, metrics: &Metrics, listener: &str) {
        self.observe_once(metrics, listener);
    }

    fn last_sample_age(&self) -> Duration {
        self.last_sample.elapsed()
    }
}

/// A congestion control's name, kept for the end-of-connection log as its place in a table
/// of the names seen: one byte where a `String` was a heap block and 24 bytes, and a
/// `&'static str` 16, in every idle connection's task (twice). Each name is stored once for
/// the process's life; the kernel knows a handful (those built in or loaded as modules).
#[derive(Clone, Copy, Debug)]
struct CongestionName(u8);

static CONGESTION_NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

impl CongestionName {
    /// `None` past 256 different names (not logged then; the metric still counts them).
    fn of(name: String) -> Option<CongestionName> {
        let mut names = CONGESTION_NAMES
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let index = match names.iter().position(|known| **known == name) {
            Some(index) => index,
            None => {
                names.push(Box::leak(name.into_boxed_str()));
                names.len() - 1
            }
        };
        u8::try_from(index).ok().map(CongestionName)
    }

    fn as_str(self) -> &'static str {
        CONGESTION_NAMES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(usize::from(self.0))
            .copied()
            .unwrap_or("?")
    }
}
