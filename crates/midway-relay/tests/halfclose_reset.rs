// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! FIN and RST carried across, per direction, in both models.

use midway_relay::{DirectionEnd, RelayModel};
use midway_testkit::data::*;
use midway_testkit::relay::*;
use midway_testkit::wait::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn models() -> Vec<RelayModel> {
    vec![
        buffer_model(64 * 1024, true),
        buffer_model(64 * 1024, false),
        spool_model(64 * 1024, 1 << 30),
    ]
}

/// Client sends a request and FIN; only then does the server answer (1 MiB) and close.
#[tokio::test]
async fn client_half_close_then_server_answers() {
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
        // The server-to-client direction still flows after the client's FIN.
        let sent = within(TEST_TIMEOUT, send_pattern(&mut relayed.server, 1 << 20, 5))
            .await
            .unwrap();
        let received = within(TEST_TIMEOUT, receive_all(&mut relayed.client))
            .await
            .unwrap();
        assert_eq!(received, (1 << 20, sent), "{model:?}");
        let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
        assert_eq!(report.client_to_server_end, DirectionEnd::Fin);
        assert_eq!(report.server_to_client_end, DirectionEnd::Fin);
        assert_eq!(report.client_to_server_bytes, 7);
    }
}

/// Server sends a greeting and FIN first; the client keeps uploading afterwards.
#[tokio::test]
async fn server_half_close_then_client_uploads() {
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
        let sent = within(TEST_TIMEOUT, send_pattern(&mut relayed.client, 1 << 20, 6))
            .await
            .unwrap();
        let received = within(TEST_TIMEOUT, receive_all(&mut relayed.server))
            .await
            .unwrap();
        assert_eq!(received, (1 << 20, sent), "{model:?}");
        let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
        assert_eq!(report.client_to_server_end, DirectionEnd::Fin);
        assert_eq!(report.server_to_client_end, DirectionEnd::Fin);
        assert_eq!(report.server_to_client_bytes, 5);
    }
}

/// Closes `stream` with a RST (SO_LINGER {on, 0}).
fn reset(stream: tokio::net::TcpStream) {
    socket2::SockRef::from(&stream)
        .set_linger(Some(std::time::Duration::ZERO))
        .unwrap();
    drop(stream);
}

async fn expect_reset(stream: &mut tokio::net::TcpStream) {
    let mut buf = [0u8; 1024];
    // Bytes already in flight may arrive first; the connection must end in a reset, not EOF.
    for _ in 0..10_000 {
        match within(TEST_TIMEOUT, stream.read(&mut buf)).await {
            Ok(0) => panic!("got a clean EOF where a reset was expected"),
            Ok(_) => continue,
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
                return;
            }
        }
    }
    panic!("no reset after 10,000 reads");
}

#[tokio::test]
async fn client_reset_reaches_server() {
    for model in models() {
        let res = resources(1 << 30, 4);
        let mut relayed = relayed(model.clone(), &res.resources, None, None).await;
        // Traffic first, so the relay is mid-connection (buffers, maybe pipes) when it breaks.
        relayed.client.write_all(b"ping").await.unwrap();
        let mut ping = [0u8; 4];
        within(TEST_TIMEOUT, relayed.server.read_exact(&mut ping))
            .await
            .unwrap();
        reset(relayed.client);
        expect_reset(&mut relayed.server).await;
        let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
        assert_eq!(
            report.client_to_server_end,
            DirectionEnd::ResetByPeer,
            "{model:?}"
        );
        assert_eq!(
            report.server_to_client_end,
            DirectionEnd::ResetByPeer,
            "{model:?}"
        );
        assert_eq!(res.resources.pipes_in_use(), 0);
        assert_eq!(res.resources.user_buffer_bytes(), 0);
    }
}

#[tokio::test]
async fn server_reset_reaches_client() {
    for model in models() {
        let res = resources(1 << 30, 4);
        let mut relayed = relayed(model.clone(), &res.resources, None, None).await;
        relayed.server.write_all(b"pong").await.unwrap();
        let mut pong = [0u8; 4];
        within(TEST_TIMEOUT, relayed.client.read_exact(&mut pong))
            .await
            .unwrap();
        reset(relayed.server);
        expect_reset(&mut relayed.client).await;
        let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
        assert_eq!(
            report.server_to_client_end,
            DirectionEnd::ResetByPeer,
            "{model:?}"
        );
        assert_eq!(
            report.client_to_server_end,
            DirectionEnd::ResetByPeer,
            "{model:?}"
        );
    }
}

/// A reset after one direction already finished cleanly keeps that direction's FIN.
#[tokio::test]
async fn reset_after_half_close_keeps_the_finished_direction() {
    let res = resources(1 << 30, 4);
    let mut relayed = relayed(buffer_model(64 * 1024, true), &res.resources, None, None).await;
    relayed.client.shutdown().await.unwrap();
    let mut nothing = Vec::new();
    within(TEST_TIMEOUT, relayed.server.read_to_end(&mut nothing))
        .await
        .unwrap();
    reset(relayed.server);
    expect_reset(&mut relayed.client).await;
    let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
    assert_eq!(report.client_to_server_end, DirectionEnd::Fin);
    assert_eq!(report.server_to_client_end, DirectionEnd::ResetByPeer);
}

/// The client stopped reading and the relay is stalled writing to it: a reset from the server
/// must still reach the client (not wait for the client to drain). Both models.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_reset_reaches_a_stalled_client() {
    for model in models() {
        let res = resources(64 << 20, 4);
        // Spool with a small disk cap so the spool also stalls.
        let model = match model {
            midway_relay::RelayModel::Spool(mut config) => {
                config.max_spool_bytes = 1 << 20;
                midway_relay::RelayModel::Spool(config)
            }
            other => other,
        };
        let relayed = relayed(model.clone(), &res.resources, None, Some(64 * 1024)).await;
        let mut server = relayed.server;
        // Linger 0 now, so dropping the stream (aborting the writer) sends a RST.
        socket2::SockRef::from(&server)
            .set_linger(Some(std::time::Duration::ZERO))
            .unwrap();
        let writer = tokio::spawn(async move { send_pattern(&mut server, 64 << 20, 70).await });
        wait_until_server_to_client_settles(&relayed.counters, 25).await;
        assert!(
            !writer.is_finished(),
            "{model:?}: the server must be stalled"
        );
        writer.abort();
        assert!(writer.await.unwrap_err().is_cancelled());
        // The relay ends on its own, before the client read anything.
        let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
        assert_eq!(
            report.server_to_client_end,
            DirectionEnd::ResetByPeer,
            "{model:?}"
        );
        let mut client = relayed.client;
        expect_reset(&mut client).await;
    }
}
