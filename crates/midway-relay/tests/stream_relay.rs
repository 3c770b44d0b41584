// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `relay_peer_stream`: a TCP socket relayed to a peer stream (here a plain TCP connection
//! standing in for a TLS session or a QUIC stream), under the close rule.

use std::io::ErrorKind;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use midway_relay::{
    relay_peer_stream, DirectionEnd, PeerSide, PeerStream, RelayCounters, RelayError, RelayOptions,
    RelayReport,
};
use midway_testkit::data::*;
use midway_testkit::wait::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Limit of every test step: loopback transfers of a few MiB take milliseconds.
const STEP: Duration = Duration::from_secs(5);
const BUFFER_BYTES: usize = 64 * 1024;
const SIDES: [PeerSide; 2] = [PeerSide::Server, PeerSide::Client];

/// A peer stream over plain TCP. With `eof_is_truncation`, a TCP FIN reads as `UnexpectedEof`,
/// as a TLS session reports a FIN that came without close_notify.
struct TcpPeer {
    stream: TcpStream,
    eof_is_truncation: bool,
}

impl AsyncRead for TcpPeer {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let truncation = self.eof_is_truncation;
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if truncation && buf.filled().len() == before => {
                Poll::Ready(Err(ErrorKind::UnexpectedEof.into()))
            }
            other => other,
        }
    }
}

impl AsyncWrite for TcpPeer {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

impl PeerStream for TcpPeer {
    fn abort(self) {
        reset(self.stream);
    }

    fn socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        Some(self.stream.as_fd())
    }
}

/// Closes `stream` with a RST (SO_LINGER {on, 0}).
fn reset(stream: TcpStream) {
    socket2::SockRef::from(&stream)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(stream);
}

/// A connected pair on loopback: (the test's end, the relay's end).
async fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let far = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (near, _) = listener.accept().await.unwrap();
    (far, near)
}

/// The relay, running in its own task.
type RelayTask = JoinHandle<Result<RelayReport, RelayError>>;

/// One relayed connection: the test's client and server ends (one of them behind the peer
/// stream, per `side`) and the relay task between them.
struct Relayed {
    client: TcpStream,
    server: TcpStream,
    side: PeerSide,
    relay: RelayTask,
    counters: Arc<RelayCounters>,
    cancel: CancellationToken,
}

impl Relayed {
    /// The test's end behind the peer stream, the one behind the TCP socket, and the relay.
    fn by_transport(self) -> (TcpStream, TcpStream, RelayTask) {
        match self.side {
            PeerSide::Server => (self.server, self.client, self.relay),
            PeerSide::Client => (self.client, self.server, self.relay),
        }
    }

    async fn report(self) -> RelayReport {
        report_of(self.relay).await
    }
}

/// How to set a relayed connection up: `Setup::new(side)`, fields changed as a test needs.
struct Setup {
    side: PeerSide,
    idle_timeout: Option<Duration>,
    client_prefix: Vec<u8>,
    eof_is_truncation: bool,
    buffer_bytes: usize,
    on_close: Option<midway_relay::OnClose>,
}

impl Setup {
    fn new(side: PeerSide) -> Self {
        Setup {
            side,
            idle_timeout: None,
            client_prefix: Vec::new(),
            eof_is_truncation: false,
            buffer_bytes: BUFFER_BYTES,
            on_close: None,
        }
    }

    async fn start(self) -> Relayed {
        let (tcp_far, tcp) = pair().await;
        let (peer_far, peer_near) = pair().await;
        let peer = TcpPeer {
            stream: peer_near,
            eof_is_truncation: self.eof_is_truncation,
        };
        let (client, server) = match self.side {
            PeerSide::Server => (tcp_far, peer_far),
            PeerSide::Client => (peer_far, tcp_far),
        };
        let counters = Arc::new(RelayCounters::default());
        let cancel = CancellationToken::new();
        let options = RelayOptions {
            idle_timeout: self.idle_timeout,
            counters: Arc::clone(&counters),
            client_prefix: self.client_prefix,
            on_close: self.on_close,
            park_after: None,
            client_window: None,
        };
        let (side, buffer_bytes, token) = (self.side, self.buffer_bytes, cancel.clone());
        let relay = tokio::spawn(async move {
            relay_peer_stream(tcp, peer, side, buffer_bytes, options, token).await
        });
        Relayed {
            client,
            server,
            side: self.side,
            relay,
            counters,
            cancel,
        }
    }
}

/// Reads until the stream ends and requires that end to be a reset, not a clean EOF (bytes
/// already in flight may arrive first).
async fn expect_reset(stream: &mut TcpStream, context: &str) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match within(STEP, stream.read(&mut buf)).await {
            Ok(0) => panic!("{context}: a clean EOF where a reset was expected"),
            Ok(_) => continue,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{context}: {e}");
                return;
            }
        }
    }
}

/// Whether a reset reached `stream` (SO_ERROR), for a socket that already read its peer's FIN
/// and so would read a clean 0. The kernel records it as ECONNRESET, or EPIPE after a FIN.
async fn got_reset(stream: &TcpStream) -> bool {
    eventually(STEP, || {
        matches!(stream.take_error(), Ok(Some(e))
            if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_flow_both_ways_with_the_peer_stream_on_either_side() {
    const LEN: u64 = 4 << 20;
    for side in SIDES {
        let relayed = Setup::new(side).start().await;
        let (mut client_read, mut client_write) = relayed.client.into_split();
        let (mut server_read, mut server_write) = relayed.server.into_split();
        let (sent_up, received_up, sent_down, received_down) = within(STEP, async {
            tokio::try_join!(
                send_pattern(&mut client_write, LEN, 1),
                receive_all(&mut server_read),
                send_pattern(&mut server_write, LEN, 2),
                receive_all(&mut client_read),
            )
        })
        .await
        .unwrap();
        assert_eq!(received_up, (LEN, sent_up), "{side:?}");
        assert_eq!(received_down, (LEN, sent_down), "{side:?}");
        let counters = Arc::clone(&relayed.counters);
        let report = within(STEP, relayed.relay).await.unwrap().unwrap();
        assert_eq!(report.client_to_server_bytes, LEN, "{side:?}");
        assert_eq!(report.server_to_client_bytes, LEN, "{side:?}");
        assert_eq!(report.client_to_server_end, DirectionEnd::Fin, "{side:?}");
        assert_eq!(report.server_to_client_end, DirectionEnd::Fin, "{side:?}");
        assert_eq!(counters.client_to_server.load(Relaxed), LEN);
        assert_eq!(counters.server_to_client.load(Relaxed), LEN);
        assert_eq!(counters.held_client_to_server.load(Relaxed), 0);
        assert_eq!(counters.held_server_to_client.load(Relaxed), 0);
        let peak = counters.peak_held.load(Relaxed);
        assert!(
            peak > 0 && peak <= BUFFER_BYTES as u64,
            "{side:?}: peak {peak}"
        );
    }
}

/// The client sends its request and FIN; only then does the server answer and close.
#[tokio::test]
async fn client_half_close_still_gets_the_reply() {
    for side in SIDES {
        let mut relayed = Setup::new(side).start().await;
        relayed.client.write_all(b"request").await.unwrap();
        relayed.client.shutdown().await.unwrap();
        let mut request = Vec::new();
        within(STEP, relayed.server.read_to_end(&mut request))
            .await
            .unwrap();
        assert_eq!(request, b"request", "{side:?}");
        let sent = within(STEP, send_pattern(&mut relayed.server, 1 << 20, 3))
            .await
            .unwrap();
        let received = within(STEP, receive_all(&mut relayed.client))
            .await
            .unwrap();
        assert_eq!(received, (1 << 20, sent), "{side:?}");
        let report = relayed.report().await;
        assert_eq!(report.client_to_server_end, DirectionEnd::Fin, "{side:?}");
        assert_eq!(report.server_to_client_end, DirectionEnd::Fin, "{side:?}");
        assert_eq!(report.client_to_server_bytes, 7, "{side:?}");
        assert_eq!(report.server_to_client_bytes, 1 << 20, "{side:?}");
    }
}

#[tokio::test]
async fn client_prefix_reaches_the_server_first() {
    for side in SIDES {
        let mut setup = Setup::new(side);
        setup.client_prefix = b"prefix:".to_vec();
        let mut relayed = setup.start().await;
        relayed.client.write_all(b"rest").await.unwrap();
        relayed.client.shutdown().await.unwrap();
        let mut request = Vec::new();
        within(STEP, relayed.server.read_to_end(&mut request))
            .await
            .unwrap();
        assert_eq!(request, b"prefix:rest", "{side:?}");
        relayed.server.shutdown().await.unwrap();
        let report = relayed.report().await;
        assert_eq!(report.client_to_server_bytes, 11, "{side:?}");
        assert_eq!(report.server_to_client_end, DirectionEnd::Fin, "{side:?}");
    }
}

/// Runs the relay task to its report.
async fn report_of(relay: RelayTask) -> RelayReport {
    within(STEP, relay).await.unwrap().unwrap()
}

fn assert_ends(report: &RelayReport, c2s: DirectionEnd, s2c: DirectionEnd, side: PeerSide) {
    assert_eq!(report.client_to_server_end, c2s, "{side:?}");
    assert_eq!(report.server_to_client_end, s2c, "{side:?}");
}

#[tokio::test]
async fn a_reset_from_the_peer_stream_reaches_the_tcp_end_as_a_reset() {
    for side in SIDES {
        let (mut peer_end, mut tcp_end, relay) = Setup::new(side).start().await.by_transport();
        // Bytes delivered (and more sent, maybe unread) before the break.
        peer_end.write_all(b"ping").await.unwrap();
        let mut ping = [0u8; 4];
        within(STEP, tcp_end.read_exact(&mut ping)).await.unwrap();
        peer_end.write_all(b"unread").await.unwrap();
        reset(peer_end);
        expect_reset(&mut tcp_end, &format!("{side:?}")).await;
        let report = report_of(relay).await;
        use DirectionEnd::ResetByPeer;
        assert_ends(&report, ResetByPeer, ResetByPeer, side);
    }
}

#[tokio::test]
async fn a_reset_from_the_tcp_side_reaches_the_peer_end_as_a_reset() {
    for side in SIDES {
        let (mut peer_end, mut tcp_end, relay) = Setup::new(side).start().await.by_transport();
        tcp_end.write_all(b"ping").await.unwrap();
        let mut ping = [0u8; 4];
        within(STEP, peer_end.read_exact(&mut ping)).await.unwrap();
        tcp_end.write_all(b"unread").await.unwrap();
        reset(tcp_end);
        expect_reset(&mut peer_end, &format!("{side:?}")).await;
        let report = report_of(relay).await;
        use DirectionEnd::ResetByPeer;
        assert_ends(&report, ResetByPeer, ResetByPeer, side);
    }
}

/// The TCP side half-closes, then resets, while the peer stays silent: nothing reads or writes
/// the TCP socket any more, and the reset must still reach the peer at once.
#[tokio::test]
async fn a_tcp_reset_after_its_half_close_reaches_the_silent_peer() {
    for side in SIDES {
        let (mut peer_end, mut tcp_end, relay) = Setup::new(side).start().await.by_transport();
        tcp_end.write_all(b"bye").await.unwrap();
        tcp_end.shutdown().await.unwrap();
        let mut bye = Vec::new();
        within(STEP, peer_end.read_to_end(&mut bye)).await.unwrap();
        assert_eq!(bye, b"bye", "{side:?}");
        reset(tcp_end);
        let report = report_of(relay).await;
        assert!(
            got_reset(&peer_end).await,
            "{side:?}: the peer was never told"
        );
        let (c2s, s2c) = match side {
            PeerSide::Server => (DirectionEnd::Fin, DirectionEnd::ResetByPeer),
            PeerSide::Client => (DirectionEnd::ResetByPeer, DirectionEnd::Fin),
        };
        assert_ends(&report, c2s, s2c, side);
    }
}

/// A peer stream that ends without its clean end (a TLS session whose TCP connection got a FIN
/// before close_notify) is a truncated stream: the TCP end gets a reset, never a FIN.
#[tokio::test]
async fn a_truncated_peer_stream_resets_the_tcp_end() {
    for side in SIDES {
        let mut setup = Setup::new(side);
        setup.eof_is_truncation = true;
        let (mut peer_end, mut tcp_end, relay) = setup.start().await.by_transport();
        peer_end.write_all(b"partial").await.unwrap();
        peer_end.shutdown().await.unwrap();
        expect_reset(&mut tcp_end, &format!("{side:?}")).await;
        let report = report_of(relay).await;
        use DirectionEnd::ResetByPeer;
        assert_ends(&report, ResetByPeer, ResetByPeer, side);
        assert!(
            got_reset(&peer_end).await,
            "{side:?}: the peer was never told"
        );
    }
}

#[tokio::test]
async fn cancellation_resets_both_ends() {
    for side in SIDES {
        let mut relayed = Setup::new(side).start().await;
        relayed.client.write_all(b"ping").await.unwrap();
        let mut ping = [0u8; 4];
        within(STEP, relayed.server.read_exact(&mut ping))
            .await
            .unwrap();
        relayed.cancel.cancel();
        let (mut client, mut server) = (relayed.client, relayed.server);
        let report = report_of(relayed.relay).await;
        use DirectionEnd::Cancelled;
        assert_ends(&report, Cancelled, Cancelled, side);
        assert_eq!(report.client_to_server_bytes, 4, "{side:?}");
        expect_reset(&mut client, &format!("{side:?} client")).await;
        expect_reset(&mut server, &format!("{side:?} server")).await;
    }
}

/// The client half-closed, the server stays silent: the idle timeout ends the open direction
/// with a reset toward both ends (the finished direction keeps its FIN in the report).
#[tokio::test]
async fn idle_timeout_with_an_open_direction_resets_both_ends() {
    const IDLE: Duration = Duration::from_millis(300);
    for side in SIDES {
        let mut setup = Setup::new(side);
        setup.idle_timeout = Some(IDLE);
        let mut relayed = setup.start().await;
        relayed.client.shutdown().await.unwrap();
        let mut nothing = Vec::new();
        within(STEP, relayed.server.read_to_end(&mut nothing))
            .await
            .unwrap();
        let (mut client, server) = (relayed.client, relayed.server);
        let report = report_of(relayed.relay).await;
        assert_ends(&report, DirectionEnd::Fin, DirectionEnd::IdleTimeout, side);
        expect_reset(&mut client, &format!("{side:?} client")).await;
        assert!(
            got_reset(&server).await,
            "{side:?}: the server was never told"
        );
    }
}

/// A rejected buffer size ends the connection before any byte moved: with a reset toward both
/// ends, since a FIN would tell each end the other had nothing to send.
#[tokio::test]
async fn a_buffer_below_4096_is_rejected_with_a_reset() {
    for side in SIDES {
        let mut setup = Setup::new(side);
        setup.buffer_bytes = 0;
        let relayed = setup.start().await;
        let (mut client, mut server) = (relayed.client, relayed.server);
        let result = within(STEP, relayed.relay).await.unwrap();
        assert!(
            matches!(result, Err(RelayError::InvalidConfig(_))),
            "{side:?}: {result:?}"
        );
        expect_reset(&mut client, &format!("{side:?} client")).await;
        expect_reset(&mut server, &format!("{side:?} server")).await;
    }
}

#[tokio::test]
async fn on_close_gets_the_client_and_server_sockets_in_order() {
    for side in SIDES {
        // Each socket's own address, as on_close saw it: the client's socket is the one the
        // test's client end is connected to, the server's the one its server end is.
        let seen: Arc<std::sync::Mutex<Option<(String, String)>>> = Arc::default();
        let slot = Arc::clone(&seen);
        let mut setup = Setup::new(side);
        setup.on_close = Some(Arc::new(
            move |client: std::os::fd::BorrowedFd<'_>, server: std::os::fd::BorrowedFd<'_>| {
                let peer = |fd| {
                    socket2::SockRef::from(&fd)
                        .local_addr()
                        .ok()
                        .and_then(|a| a.as_socket())
                        .map(|a| a.to_string())
                        .unwrap_or_default()
                };
                *slot.lock().unwrap() = Some((peer(client), peer(server)));
            },
        ));
        let relayed = setup.start().await;
        let ends = (
            relayed.client.peer_addr().unwrap().to_string(),
            relayed.server.peer_addr().unwrap().to_string(),
        );
        let (mut client, mut server) = (relayed.client, relayed.server);
        client.shutdown().await.unwrap();
        server.shutdown().await.unwrap();
        let relay = relayed.relay;
        let report = report_of(relay).await;
        assert_ends(&report, DirectionEnd::Fin, DirectionEnd::Fin, side);
        assert_eq!(seen.lock().unwrap().clone(), Some(ends), "{side:?}");
    }
}
