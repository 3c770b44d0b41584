// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Bulk and many-small transfers through both relay models, checked with SHA-256.

use midway_relay::{DirectionEnd, RelayModel};
use midway_testkit::data::*;
use midway_testkit::relay::*;
use midway_testkit::wait::*;
use rand::{Rng, SeedableRng};

/// Sends `c2s` bytes client->server and `s2c` bytes server->client at the same time and checks
/// both arrive intact, with the byte counts and FIN ends in the report.
async fn bidirectional(model: RelayModel, max_pipes: usize, c2s: u64, s2c: u64, seed: u64) {
    let res = resources(1 << 40, max_pipes);
    let relayed = relayed(model, &res.resources, None, None).await;
    let (mut client_read, mut client_write) = relayed.client.into_split();
    let (mut server_read, mut server_write) = relayed.server.into_split();
    let (sent_up, received_up, sent_down, received_down) = within(TEST_TIMEOUT, async {
        tokio::try_join!(
            send_pattern(&mut client_write, c2s, seed),
            receive_all(&mut server_read),
            send_pattern(&mut server_write, s2c, seed + 1),
            receive_all(&mut client_read),
        )
    })
    .await
    .unwrap();
    assert_eq!(received_up, (c2s, sent_up));
    assert_eq!(received_down, (s2c, sent_down));
    let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
    assert_eq!(report.client_to_server_bytes, c2s);
    assert_eq!(report.server_to_client_bytes, s2c);
    assert_eq!(report.client_to_server_end, DirectionEnd::Fin);
    assert_eq!(report.server_to_client_end, DirectionEnd::Fin);
    assert_eq!(res.resources.pipes_in_use(), 0);
    assert_eq!(res.resources.user_buffer_bytes(), 0);
    assert_eq!(res.resources.spool_bytes_in_use(), 0);
    assert_eq!(res.resources.spool_files_open(), 0);
}

const DEFAULT_BULK: u64 = 256 << 20;
const FULL_BULK: u64 = 1 << 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_buffer_splice() {
    bidirectional(
        buffer_model(256 * 1024, true),
        16,
        DEFAULT_BULK,
        DEFAULT_BULK,
        1,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_buffer_copy() {
    bidirectional(
        buffer_model(256 * 1024, false),
        16,
        DEFAULT_BULK,
        DEFAULT_BULK,
        2,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_spool() {
    // Small memory so a good part goes through the spool file when the reader lags.
    bidirectional(
        spool_model(256 * 1024, 1 << 30),
        16,
        DEFAULT_BULK,
        DEFAULT_BULK,
        3,
    )
    .await;
}

/// 1 GiB each way (release builds only: `cargo test --release -p midway-relay`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    debug_assertions,
    ignore = "1 GiB is too slow in debug builds; scripts/test runs it in release"
)]
async fn bulk_1gib_all_models() {
    bidirectional(buffer_model(1 << 20, true), 16, FULL_BULK, FULL_BULK, 11).await;
    bidirectional(buffer_model(1 << 20, false), 16, FULL_BULK, FULL_BULK, 12).await;
    bidirectional(spool_model(1 << 20, 4 << 30), 16, FULL_BULK, FULL_BULK, 13).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_transfers_all_models() {
    const CONNECTIONS: usize = 500;
    const CONCURRENCY: usize = 32;
    // A pool much smaller than the concurrency: some splice, some copy.
    let res = resources(1 << 30, 8);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let plans: Vec<(RelayModel, u64, u64)> = (0..CONNECTIONS)
        .map(|i| {
            let model = match i % 3 {
                0 => buffer_model(16 * 1024, true),
                1 => buffer_model(16 * 1024, false),
                _ => spool_model(16 * 1024, 1 << 20),
            };
            (
                model,
                rng.gen_range(0..64 * 1024),
                rng.gen_range(0..64 * 1024),
            )
        })
        .collect();
    assert_eq!(plans.len(), CONNECTIONS);
    let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (model, c2s, s2c)) in plans.into_iter().enumerate() {
        let permit = semaphore.clone().acquire_owned().await.unwrap();
        let resources = res.resources.clone();
        tasks.spawn(async move {
            let relayed = relayed(model, &resources, None, None).await;
            let (mut client_read, mut client_write) = relayed.client.into_split();
            let (mut server_read, mut server_write) = relayed.server.into_split();
            let seed = 1000 + 2 * i as u64;
            let (sent_up, received_up, sent_down, received_down) = tokio::try_join!(
                send_pattern(&mut client_write, c2s, seed),
                receive_all(&mut server_read),
                send_pattern(&mut server_write, s2c, seed + 1),
                receive_all(&mut client_read),
            )
            .unwrap();
            assert_eq!(received_up, (c2s, sent_up), "connection {i} client->server");
            assert_eq!(
                received_down,
                (s2c, sent_down),
                "connection {i} server->client"
            );
            let report = relayed.relay.await.unwrap().unwrap();
            assert_eq!(report.client_to_server_bytes, c2s);
            assert_eq!(report.server_to_client_bytes, s2c);
            drop(permit);
        });
    }
    let mut done = 0;
    within(TEST_TIMEOUT, async {
        while let Some(result) = tasks.join_next().await {
            result.unwrap();
            done += 1;
        }
    })
    .await;
    assert_eq!(done, CONNECTIONS);
    assert_eq!(res.resources.pipes_in_use(), 0);
    assert!(res.resources.pipes_open() <= 8);
    assert_eq!(res.resources.user_buffer_bytes(), 0);
}
