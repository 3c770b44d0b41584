// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The close rule: a connection the relay ends while it holds bytes one end has not received
//! ends with a reset toward both ends, never with a FIN after a truncated stream (issue 17,
//! defects 1, 2 and 6).

use std::io::ErrorKind;
use std::time::Duration;

use midway_relay::{DirectionEnd, RelayModel};
use midway_testkit::data::*;
use midway_testkit::relay::*;
use midway_testkit::wait::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a test waits for a reset to arrive once the relay has ended.
const RESET_WAIT: Duration = Duration::from_secs(10);

fn models() -> Vec<RelayModel> {
    vec![
        buffer_model(64 * 1024, true),
        buffer_model(64 * 1024, false),
        spool_model(64 * 1024, 1 << 30),
    ]
}

/// Reads what arrives until the stream ends; returns how it ended: `Ok(bytes)` for a clean end
/// of stream, the error kind for a reset.
async fn read_until_end(stream: &mut TcpStream) -> Result<u64, ErrorKind> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => return Ok(total),
            Ok(n) => total += n as u64,
            Err(e) => return Err(e.kind()),
        }
    }
}

/// Whether the peer's reset has reached `stream` (SO_ERROR), polled for a bounded time. Used
/// where a read would return a clean 0 because the stream's FIN came first. The kernel records
/// a reset as ECONNRESET, or as EPIPE on a socket that had already read its peer's FIN.
async fn got_reset(stream: &TcpStream) -> bool {
    let deadline = tokio::time::Instant::now() + RESET_WAIT;
    while tokio::time::Instant::now() < deadline {
        if let Ok(Some(e)) = stream.take_error() {
            return matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The server sends more than every buffer on the way can hold while the client reads nothing;
/// the relay then ends (idle timeout or cancellation, by `end`). Both ends must see a reset.
async fn ends_holding_bytes(end: DirectionEnd) {
    for model in models() {
        let res = resources(1 << 30, 4);
        let idle = (end == DirectionEnd::IdleTimeout).then_some(Duration::from_millis(700));
        let relayed = relayed(model.clone(), &res.resources, idle, Some(64 * 1024)).await;
        let mut client = relayed.client;
        let mut server = relayed.server;
        let writer = tokio::spawn(async move {
            let sent = send_pattern(&mut server, 16 << 20, 17).await;
            (server, sent)
        });
        // Bytes are parked in midway (pipe, buffer or spool) and the writer is stalled or done.
        wait_until_server_to_client_settles(&relayed.counters, 10).await;
        if end == DirectionEnd::Cancelled {
            relayed.cancel.cancel();
        }
        let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
        assert_eq!(report.server_to_client_end, end, "{model:?}");
        assert!(
            report.server_to_client_bytes < 16 << 20,
            "{model:?}: the client read nothing, so not everything can have been delivered"
        );
        // The client reads what reached its socket, then must see the reset, not an end of
        // stream: a clean FIN here would pass a truncated stream off as complete.
        let ended = within(RESET_WAIT, read_until_end(&mut client)).await;
        assert_eq!(
            ended,
            Err(ErrorKind::ConnectionReset),
            "{model:?}: the client got a clean end of stream after a truncated transfer"
        );
        // The server learns too: a stalled writer fails; one that finished (the spool took
        // everything) sees the reset on its socket.
        let (server, sent) = within(RESET_WAIT, writer).await.unwrap();
        if sent.is_ok() {
            assert!(
                got_reset(&server).await,
                "{model:?}: the server was never told"
            );
        }
    }
}

#[tokio::test]
async fn idle_timeout_while_holding_bytes_resets_both_ends() {
    ends_holding_bytes(DirectionEnd::IdleTimeout).await;
}

#[tokio::test]
async fn cancellation_during_a_transfer_resets_both_ends() {
    ends_holding_bytes(DirectionEnd::Cancelled).await;
}

/// The client half-closes, then resets, while the server stays silent: the reset must reach
/// the server at once, not when the server next writes or the idle timeout fires.
#[tokio::test]
async fn a_reset_after_a_half_close_reaches_the_silent_server() {
    for model in models() {
        let res = resources(1 << 30, 4);
        let mut relayed = relayed(model.clone(), &res.resources, None, None).await;
        relayed.client.write_all(b"request").await.unwrap();
        relayed.client.shutdown().await.unwrap();
        let mut request = Vec::new();
        within(TEST_TIMEOUT, relayed.server.read_to_end(&mut request))
            .await
            .unwrap();
        assert_eq!(request, b"request", "{model:?}");
        socket2::SockRef::from(&relayed.client)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(relayed.client);
        let report = within(RESET_WAIT, relayed.relay).await.unwrap().unwrap();
        assert_eq!(report.client_to_server_end, DirectionEnd::Fin, "{model:?}");
        assert_eq!(
            report.server_to_client_end,
            DirectionEnd::ResetByPeer,
            "{model:?}"
        );
        assert!(
            got_reset(&relayed.server).await,
            "{model:?}: the server was never told"
        );
    }
}

/// The server half-closes, then resets, while the client stays silent: the same, the other way.
#[tokio::test]
async fn a_reset_after_a_half_close_reaches_the_silent_client() {
    for model in models() {
        let res = resources(1 << 30, 4);
        let mut relayed = relayed(model.clone(), &res.resources, None, None).await;
        relayed.server.write_all(b"hello").await.unwrap();
        relayed.server.shutdown().await.unwrap();
        let mut greeting = Vec::new();
        within(TEST_TIMEOUT, relayed.client.read_to_end(&mut greeting))
            .await
            .unwrap();
        assert_eq!(greeting, b"hello", "{model:?}");
        socket2::SockRef::from(&relayed.server)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(relayed.server);
        let report = within(RESET_WAIT, relayed.relay).await.unwrap().unwrap();
        assert_eq!(report.server_to_client_end, DirectionEnd::Fin, "{model:?}");
        assert_eq!(
            report.client_to_server_end,
            DirectionEnd::ResetByPeer,
            "{model:?}"
        );
        assert!(
            got_reset(&relayed.client).await,
            "{model:?}: the client was never told"
        );
    }
}
