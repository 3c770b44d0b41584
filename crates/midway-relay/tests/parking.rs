// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A quiet connection parks (`RelayOptions::park_after`: the relay's state freed, a small wait
//! on the two sockets left) and behaves exactly as before when it wakes: bytes both ways and
//! counted once, a FIN or a reset carried, the idle timeout (a reset) and cancellation kept.

use std::sync::atomic::Ordering;
use std::time::Duration;

use midway_relay::DirectionEnd;
use midway_testkit::relay::*;
use midway_testkit::wait::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PARK_AFTER: Duration = Duration::from_millis(50);
/// Long enough past `PARK_AFTER` that the relay has parked.
const PARKED: Duration = Duration::from_millis(300);

/// A spliced buffer relay that parks after `PARK_AFTER`, without an idle timeout.
async fn parking(res: &TestResources) -> Relayed {
    relayed_parking(
        buffer_model(16 * 1024, true),
        &res.resources,
        None,
        PARK_AFTER,
    )
    .await
}

async fn exchange(relayed: &mut Relayed, size: usize) {
    let sent = vec![7u8; size];
    relayed.client.write_all(&sent).await.unwrap();
    let mut got = vec![0u8; size];
    within(TEST_TIMEOUT, relayed.server.read_exact(&mut got))
        .await
        .unwrap();
    assert_eq!(got, sent);
    relayed.server.write_all(&sent).await.unwrap();
    within(TEST_TIMEOUT, relayed.client.read_exact(&mut got))
        .await
        .unwrap();
    assert_eq!(got, sent);
}

#[tokio::test]
async fn a_parked_connection_wakes_for_bytes_either_way_and_counts_them_once() {
    for splice in [true, false] {
        let res = resources(1 << 30, 4);
        let mut relayed = relayed_parking(
            buffer_model(16 * 1024, splice),
            &res.resources,
            None,
            PARK_AFTER,
        )
        .await;
        exchange(&mut relayed, 1000).await;
        tokio::time::sleep(PARKED).await;
        exchange(&mut relayed, 100_000).await;
        tokio::time::sleep(PARKED).await;
        // Woken by the server this time.
        relayed.server.write_all(b"late").await.unwrap();
        let mut late = [0u8; 4];
        within(TEST_TIMEOUT, relayed.client.read_exact(&mut late))
            .await
            .unwrap();
        tokio::time::sleep(PARKED).await;
        relayed.client.shutdown().await.unwrap();
        let mut rest = Vec::new();
        within(TEST_TIMEOUT, relayed.server.read_to_end(&mut rest))
            .await
            .unwrap();
        relayed.server.shutdown().await.unwrap();
        within(TEST_TIMEOUT, relayed.client.read_to_end(&mut rest))
            .await
            .unwrap();
        let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
        assert_eq!(
            (report.client_to_server_bytes, report.server_to_client_bytes),
            (101_000, 101_004)
        );
        assert_eq!(report.client_to_server_end, DirectionEnd::Fin);
        assert_eq!(report.server_to_client_end, DirectionEnd::Fin);
        assert_eq!(relayed.counters.parks.load(Ordering::Relaxed), 3);
    }
}

#[tokio::test]
async fn the_idle_timeout_ends_a_parked_connection_with_resets() {
    let res = resources(1 << 30, 4);
    let mut relayed = relayed_parking(
        buffer_model(16 * 1024, true),
        &res.resources,
        Some(Duration::from_millis(400)),
        PARK_AFTER,
    )
    .await;
    exchange(&mut relayed, 10).await;
    let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
    assert_eq!(relayed.counters.parks.load(Ordering::Relaxed), 1);
    assert_eq!(report.client_to_server_end, DirectionEnd::IdleTimeout);
    assert_eq!(
        (report.client_to_server_bytes, report.server_to_client_bytes),
        (10, 10)
    );
    assert_both_ends_reset(&mut relayed.client, &mut relayed.server).await;
}

#[tokio::test]
async fn cancelling_a_parked_connection_resets_both_ends() {
    let res = resources(1 << 30, 4);
    let mut relayed = parking(&res).await;
    exchange(&mut relayed, 10).await;
    tokio::time::sleep(PARKED).await;
    assert_eq!(relayed.counters.parks.load(Ordering::Relaxed), 1);
    relayed.cancel.cancel();
    let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
    assert_eq!(report.client_to_server_end, DirectionEnd::Cancelled);
    for stream in [&mut relayed.client, &mut relayed.server] {
        let mut rest = Vec::new();
        let ended = within(TEST_TIMEOUT, stream.read_to_end(&mut rest)).await;
        assert_eq!(
            ended.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::ConnectionReset)
        );
    }
}

#[tokio::test]
async fn a_reset_reaching_a_parked_connection_is_carried_across() {
    for reset_by_client in [true, false] {
        let res = resources(1 << 30, 4);
        let mut relayed = parking(&res).await;
        exchange(&mut relayed, 10).await;
        tokio::time::sleep(PARKED).await;
        assert_eq!(relayed.counters.parks.load(Ordering::Relaxed), 1);
        let (resetting, mut other) = if reset_by_client {
            (relayed.client, relayed.server)
        } else {
            (relayed.server, relayed.client)
        };
        socket2::SockRef::from(&resetting)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(resetting);
        let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
        assert_eq!(report.client_to_server_end, DirectionEnd::ResetByPeer);
        assert_eq!(
            (report.client_to_server_bytes, report.server_to_client_bytes),
            (10, 10)
        );
        let mut rest = Vec::new();
        let ended = within(TEST_TIMEOUT, other.read_to_end(&mut rest)).await;
        assert_eq!(
            ended.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::ConnectionReset)
        );
    }
}

/// Parked, a connection holds neither its relay state nor a buffer or pipe: what is left is
/// the wait on its sockets, far smaller than the running relay.
#[tokio::test]
async fn a_parked_connection_holds_no_buffer_or_pipe() {
    let res = resources(1 << 30, 4);
    let mut relayed = parking(&res).await;
    exchange(&mut relayed, 50_000).await;
    tokio::time::sleep(PARKED).await;
    assert_eq!(relayed.counters.parks.load(Ordering::Relaxed), 1);
    assert_eq!(res.resources.pipes_in_use(), 0);
    assert_eq!(res.resources.user_buffer_bytes(), 0);
    relayed.cancel.cancel();
    within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
}

/// A parking relay starts parked (a connection that never carries a byte never allocates the
/// running relay): the first byte may come from either side, as with a server that speaks
/// first.
#[tokio::test]
async fn a_fresh_connection_starts_parked_and_the_server_may_speak_first() {
    let res = resources(1 << 30, 4);
    let mut relayed = parking(&res).await;
    // Nothing has run that could park.
    tokio::time::sleep(PARKED).await;
    assert_eq!(relayed.counters.parks.load(Ordering::Relaxed), 0);
    relayed.server.write_all(b"220 ready").await.unwrap();
    let mut banner = [0u8; 9];
    within(TEST_TIMEOUT, relayed.client.read_exact(&mut banner))
        .await
        .unwrap();
    assert_eq!(&banner, b"220 ready");
    exchange(&mut relayed, 10).await;
    relayed.cancel.cancel();
    within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
}

/// While parked the counters say so, and only a wake-up notifies `resumed`: what lets the
/// proxy's `tcp_info` sampler sleep through a park instead of waking on its timer.
#[tokio::test]
async fn the_counters_show_a_park_and_notify_its_end() {
    let res = resources(1 << 30, 4);
    let mut relayed = parking(&res).await;
    exchange(&mut relayed, 10).await;
    tokio::time::sleep(PARKED).await;
    assert!(relayed.counters.parked.load(Ordering::Acquire));
    // The first wake-up (the relay starts parked) left its notification unclaimed: take it.
    let _ = tokio::time::timeout(
        Duration::from_millis(20),
        relayed.counters.resumed.notified(),
    )
    .await;
    let counters = relayed.counters.clone();
    let woken = tokio::spawn(async move { counters.resumed.notified().await });
    tokio::time::sleep(PARKED).await;
    assert!(!woken.is_finished(), "notified while still parked");
    exchange(&mut relayed, 10).await;
    within(TEST_TIMEOUT, woken).await.unwrap();
}
