// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A client that stops reading: buffer mode pushes back on the server with bounded memory;
//! spool mode lets the server finish and holds the bytes (memory + disk) within its caps.

use std::sync::atomic::Ordering;

use midway_relay::DirectionEnd;
use midway_testkit::data::*;
use midway_testkit::relay::*;
use midway_testkit::wait::*;

/// Socket buffers of 64 KiB on every socket: the kernel can absorb well under 1 MiB in total.
const SMALL_SOCKET_BUFFER: usize = 64 * 1024;
const PAUSED_TRANSFER: u64 = 32 << 20;

async fn buffer_mode_paused_client(splice: bool) {
    const CAP: usize = 64 * 1024;
    let res = resources(1 << 30, 4);
    let relayed = relayed(
        buffer_model(CAP, splice),
        &res.resources,
        None,
        Some(SMALL_SOCKET_BUFFER),
    )
    .await;
    let mut server = relayed.server;
    let mut client = relayed.client;
    let writer = tokio::spawn(async move {
        let sum = send_pattern(&mut server, PAUSED_TRANSFER, 21).await;
        (server, sum)
    });
    let counters = relayed.counters.clone();
    let resources = res.resources.clone();
    let mut peak_user_memory = 0;
    // Wait until the forwarded count stops moving: the client's receive buffer is full.
    let forwarded = wait_until_stable(
        TEST_TIMEOUT,
        || {
            peak_user_memory = peak_user_memory.max(resources.user_buffer_bytes());
            counters.server_to_client.load(Ordering::Relaxed)
        },
        25,
    )
    .await;
    assert!(forwarded > 0, "some bytes must have been forwarded");
    assert!(
        forwarded < PAUSED_TRANSFER / 4,
        "a paused client cannot absorb {forwarded} bytes"
    );
    assert!(!writer.is_finished(), "the server must be held back");
    let held = counters.held_server_to_client.load(Ordering::Relaxed);
    let peak_held = counters.peak_held.load(Ordering::Relaxed);
    assert!(
        held <= CAP as u64 && peak_held <= CAP as u64,
        "held {held}, peak {peak_held}"
    );
    assert!(peak_held > 0, "the relay held bytes at some point");
    // The client->server direction never allocated (nothing to read); server->client at most CAP.
    assert!(
        peak_user_memory <= CAP as u64,
        "user memory {peak_user_memory}"
    );
    if splice {
        assert_eq!(
            peak_user_memory, 0,
            "splice path holds bytes in the pipe only"
        );
        assert_eq!(res.resources.pipes_in_use(), 1);
    }

    let received = within(TEST_TIMEOUT, receive_all(&mut client))
        .await
        .unwrap();
    let (_server, sent) = within(TEST_TIMEOUT, writer).await.unwrap();
    assert_eq!(received, (PAUSED_TRANSFER, sent.unwrap()));
    client.shutdown_std();
    let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
    assert_eq!(report.server_to_client_end, DirectionEnd::Fin);
    assert!(counters.peak_held.load(Ordering::Relaxed) <= CAP as u64);
}

trait ShutdownStd {
    fn shutdown_std(&self);
}

impl ShutdownStd for tokio::net::TcpStream {
    fn shutdown_std(&self) {
        socket2::SockRef::from(self)
            .shutdown(std::net::Shutdown::Write)
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffer_mode_copy_bounds_memory_for_paused_client() {
    buffer_mode_paused_client(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffer_mode_splice_bounds_memory_for_paused_client() {
    buffer_mode_paused_client(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spool_mode_server_finishes_while_client_paused() {
    const MEMORY: usize = 1 << 20;
    let res = resources(1 << 30, 4);
    let relayed = relayed(
        spool_model(MEMORY, 1 << 30),
        &res.resources,
        None,
        Some(SMALL_SOCKET_BUFFER),
    )
    .await;
    let mut server = relayed.server;
    let mut client = relayed.client;
    // The server's writes complete although the client has not read a byte.
    let sent = within(TEST_TIMEOUT, send_pattern(&mut server, PAUSED_TRANSFER, 22))
        .await
        .unwrap();
    let counters = relayed.counters.clone();
    wait_for(
        TEST_TIMEOUT,
        || {
            res.resources.spool_bytes_in_use() > 0
                && counters.spooled_now.load(Ordering::Relaxed) > 0
        },
        "bytes on the spool disk",
    )
    .await;
    assert!(
        counters.server_to_client.load(Ordering::Relaxed) < PAUSED_TRANSFER / 4,
        "the client is paused, so most bytes must be in the spool"
    );
    assert_eq!(res.resources.spool_files_open(), 1);
    wait_for(
        TEST_TIMEOUT,
        || counters.remote_finished.load(Ordering::Relaxed),
        "the relay to read the server's FIN",
    )
    .await;
    assert_eq!(
        std::fs::read_dir(res.resources.spool_dir())
            .unwrap()
            .count(),
        0,
        "spool files are anonymous: nothing to leave behind after a crash"
    );

    let received = within(TEST_TIMEOUT, receive_all(&mut client))
        .await
        .unwrap();
    assert_eq!(received, (PAUSED_TRANSFER, sent));
    client.shutdown_std();
    let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
    let finished = report.remote_finished_at.expect("server side fully read");
    assert!(
        report.peak_spool_bytes > MEMORY as u64,
        "peak {}",
        report.peak_spool_bytes
    );
    assert!(report.peak_spool_bytes <= PAUSED_TRANSFER);
    assert!(finished > std::time::Duration::ZERO);
    assert_eq!(report.server_to_client_end, DirectionEnd::Fin);
    assert_eq!(res.resources.spool_bytes_in_use(), 0);
    assert_eq!(res.resources.spool_files_open(), 0);
    assert_eq!(res.resources.user_buffer_bytes(), 0);
}

/// Two paused connections share a global disk cap: usage never exceeds it, the servers are
/// held back once it is reached, and every byte still arrives in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spool_global_cap_turns_into_backpressure() {
    const GLOBAL_CAP: u64 = 4 << 20;
    const MEMORY: usize = 256 * 1024;
    const TRANSFER: u64 = 16 << 20;
    let res = resources(GLOBAL_CAP, 4);
    let mut connections = Vec::new();
    for seed in 0..2u64 {
        let relayed = relayed(
            spool_model(MEMORY, 1 << 30),
            &res.resources,
            None,
            Some(SMALL_SOCKET_BUFFER),
        )
        .await;
        let mut server = relayed.server;
        let writer =
            tokio::spawn(async move { send_pattern(&mut server, TRANSFER, 30 + seed).await });
        connections.push((relayed.client, writer, relayed.relay, relayed.counters));
    }
    let resources = res.resources.clone();
    let mut peak_disk = 0;
    let disk = wait_until_stable(
        TEST_TIMEOUT,
        || {
            let used = resources.spool_bytes_in_use();
            peak_disk = peak_disk.max(used);
            used
        },
        25,
    )
    .await;
    assert!(peak_disk <= GLOBAL_CAP, "disk peak {peak_disk}");
    assert!(disk > GLOBAL_CAP / 2, "the cap was used: {disk}");
    for (_, writer, _, _) in &connections {
        assert!(!writer.is_finished(), "servers are held back at the cap");
    }
    for (mut client, writer, relay, _) in connections {
        let received = within(TEST_TIMEOUT, receive_all(&mut client))
            .await
            .unwrap();
        let sent = within(TEST_TIMEOUT, writer).await.unwrap().unwrap();
        assert_eq!(received, (TRANSFER, sent));
        client.shutdown_std();
        let report = within(TEST_TIMEOUT, relay).await.unwrap().unwrap();
        assert!(report.remote_finished_at.is_some());
    }
    assert!(peak_disk <= GLOBAL_CAP);
    assert_eq!(res.resources.spool_bytes_in_use(), 0);
}

/// The per-connection disk cap holds even with an unlimited global budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spool_per_connection_cap_turns_into_backpressure() {
    const PER_CONNECTION: u64 = 2 << 20;
    let res = resources(1 << 40, 4);
    let relayed = relayed(
        spool_model(64 * 1024, PER_CONNECTION),
        &res.resources,
        None,
        Some(SMALL_SOCKET_BUFFER),
    )
    .await;
    let mut server = relayed.server;
    let mut client = relayed.client;
    let writer = tokio::spawn(async move { send_pattern(&mut server, 16 << 20, 40).await });
    let resources = res.resources.clone();
    let mut peak_disk = 0;
    wait_until_stable(
        TEST_TIMEOUT,
        || {
            peak_disk = peak_disk.max(resources.spool_bytes_in_use());
            resources.spool_bytes_in_use()
        },
        25,
    )
    .await;
    assert!(
        peak_disk <= PER_CONNECTION && peak_disk > PER_CONNECTION / 2,
        "{peak_disk}"
    );
    assert!(!writer.is_finished());
    let received = within(TEST_TIMEOUT, receive_all(&mut client))
        .await
        .unwrap();
    assert_eq!(
        received,
        (
            16 << 20,
            within(TEST_TIMEOUT, writer).await.unwrap().unwrap()
        )
    );
    client.shutdown_std();
    within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
}
