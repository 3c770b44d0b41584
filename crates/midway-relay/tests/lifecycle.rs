// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Idle timeout, cancellation, idle connections holding nothing, pipe pool exhaustion, spool
//! directory cleanup, disk failure fallback, bad configuration.

use std::sync::atomic::Ordering;
use std::time::Duration;

use midway_relay::{
    clean_spool_dir, relay, DirectionEnd, RelayError, RelayOptions, SPOOL_FILE_PREFIX,
};
use midway_testkit::data::*;
use midway_testkit::relay::*;
use midway_testkit::wait::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn ping_pong(relayed: &mut Relayed) {
    relayed.client.write_all(b"x").await.unwrap();
    let mut byte = [0u8; 1];
    within(TEST_TIMEOUT, relayed.server.read_exact(&mut byte))
        .await
        .unwrap();
    relayed.server.write_all(b"y").await.unwrap();
    within(TEST_TIMEOUT, relayed.client.read_exact(&mut byte))
        .await
        .unwrap();
}

/// Quiet past the idle timeout with nothing held anywhere: both ends still get a reset, not a
/// FIN. midway cannot know whether an end sent bytes that never reached it (a link dark for
/// longer than the timeout): the fault campaign found a FIN here ending a client's upload and
/// its download short, cleanly, at both ends.
#[tokio::test]
async fn idle_timeout_resets_both_sides_even_with_nothing_held() {
    for model in [
        buffer_model(16 * 1024, true),
        spool_model(16 * 1024, 1 << 20),
    ] {
        let res = resources(1 << 30, 4);
        let mut relayed = relayed(
            model,
            &res.resources,
            Some(Duration::from_millis(300)),
            None,
        )
        .await;
        ping_pong(&mut relayed).await;
        let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
        assert_eq!(report.client_to_server_end, DirectionEnd::IdleTimeout);
        assert_eq!(report.server_to_client_end, DirectionEnd::IdleTimeout);
        assert_eq!(
            (report.client_to_server_bytes, report.server_to_client_bytes),
            (1, 1)
        );
        assert_both_ends_reset(&mut relayed.client, &mut relayed.server).await;
    }
}

#[tokio::test]
async fn idle_timeout_does_not_cut_a_flowing_transfer() {
    let res = resources(1 << 30, 4);
    let relayed = relayed(
        buffer_model(16 * 1024, false),
        &res.resources,
        Some(Duration::from_millis(500)),
        None,
    )
    .await;
    let mut client = relayed.client;
    let mut server = relayed.server;
    // Trickle for ~1.5 s, longer than the idle timeout, one byte every 100 ms.
    let trickle = async {
        for _ in 0..15 {
            client.write_all(b"t").await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        client.shutdown().await
    };
    let mut received = Vec::new();
    let (sent, read) = within(TEST_TIMEOUT, async {
        tokio::join!(trickle, server.read_to_end(&mut received))
    })
    .await;
    sent.unwrap();
    read.unwrap();
    assert_eq!(received.len(), 15);
    server.shutdown().await.unwrap();
    let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
    assert_eq!(report.client_to_server_end, DirectionEnd::Fin);
}

#[tokio::test]
async fn cancel_closes_both_sides() {
    let res = resources(1 << 30, 4);
    let mut relayed = relayed(buffer_model(16 * 1024, true), &res.resources, None, None).await;
    ping_pong(&mut relayed).await;
    relayed.cancel.cancel();
    let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
    assert_eq!(report.client_to_server_end, DirectionEnd::Cancelled);
    assert_eq!(report.server_to_client_end, DirectionEnd::Cancelled);
    // Neither direction had ended, so a FIN would claim an end the server never sent: both
    // ends get a reset (tests/close_rule.rs has the same with a transfer running).
    for stream in [&mut relayed.client, &mut relayed.server] {
        let mut rest = Vec::new();
        let ended = within(TEST_TIMEOUT, stream.read_to_end(&mut rest)).await;
        assert_eq!(
            ended.map_err(|e| e.kind()),
            Err(std::io::ErrorKind::ConnectionReset)
        );
    }
}

/// Idle split connections hold no buffer, no pipe and no spool file.
#[tokio::test]
async fn idle_connections_hold_no_buffers_or_pipes() {
    const CONNECTIONS: usize = 200;
    let res = resources(1 << 30, 16);
    let mut connections = Vec::new();
    for i in 0..CONNECTIONS {
        let model = match i % 3 {
            0 => buffer_model(256 * 1024, true),
            1 => buffer_model(256 * 1024, false),
            _ => spool_model(256 * 1024, 1 << 20),
        };
        let mut relayed = relayed(model, &res.resources, None, None).await;
        ping_pong(&mut relayed).await;
        connections.push(relayed);
    }
    assert_eq!(connections.len(), CONNECTIONS);
    let resources = res.resources.clone();
    // The relay frees after its write returns, which may be just after the peer saw the byte.
    wait_for(
        TEST_TIMEOUT,
        || resources.user_buffer_bytes() == 0 && resources.pipes_in_use() == 0,
        "idle connections to release buffers and pipes",
    )
    .await;
    assert_eq!(res.resources.spool_files_open(), 0);
    assert!(res.resources.pipes_open() <= 16);
    for relayed in &connections {
        assert_eq!(relayed.counters.client_to_server.load(Ordering::Relaxed), 1);
        assert_eq!(relayed.counters.server_to_client.load(Ordering::Relaxed), 1);
    }
    for relayed in connections {
        relayed.cancel.cancel();
        within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
    }
}

/// `connections` splicing relays at once, each moving `transfer` bytes both ways (checked
/// intact); returns their reports. Pattern seeds start at `seed`.
async fn splicing_burst(
    resources: &std::sync::Arc<midway_relay::RelayResources>,
    connections: u64,
    transfer: u64,
    seed: u64,
) -> Vec<midway_relay::RelayReport> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..connections {
        let relayed = relayed(buffer_model(64 * 1024, true), resources, None, None).await;
        tasks.spawn(async move {
            let (mut client_read, mut client_write) = relayed.client.into_split();
            let (mut server_read, mut server_write) = relayed.server.into_split();
            let (up, got_up, down, got_down) = tokio::try_join!(
                send_pattern(&mut client_write, transfer, seed + 2 * i),
                receive_all(&mut server_read),
                send_pattern(&mut server_write, transfer, seed + 1 + 2 * i),
                receive_all(&mut client_read),
            )
            .unwrap();
            assert_eq!(got_up, (transfer, up));
            assert_eq!(got_down, (transfer, down));
            relayed.relay.await.unwrap().unwrap()
        });
    }
    let mut reports = Vec::new();
    within(TEST_TIMEOUT, async {
        while let Some(report) = tasks.join_next().await {
            reports.push(report.unwrap());
        }
    })
    .await;
    reports
}

/// One pipe for many splicing connections: the rest copy, and every byte still arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_pipe_pool_falls_back_to_copy() {
    const CONNECTIONS: u64 = 6;
    const TRANSFER: u64 = 8 << 20;
    let res = resources(1 << 30, 1);
    let reports = splicing_burst(&res.resources, CONNECTIONS, TRANSFER, 50).await;
    for report in &reports {
        assert_eq!(report.client_to_server_bytes, TRANSFER);
    }
    let reports = reports.len() as u64;
    assert_eq!(reports, CONNECTIONS);
    assert_eq!(res.resources.pipes_open(), 1, "the one pipe was used");
    assert_eq!(res.resources.pipes_in_use(), 0);
    assert!(
        res.resources.splice_fallbacks() > 0,
        "some directions had to copy"
    );
    assert_eq!(res.resources.user_buffer_bytes(), 0);
}

#[test]
fn clean_spool_dir_removes_only_midway_files() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        format!("{SPOOL_FILE_PREFIX}abc"),
        format!("{SPOOL_FILE_PREFIX}def"),
        "unrelated.txt".to_string(),
    ] {
        std::fs::write(dir.path().join(name), b"left over").unwrap();
    }
    std::fs::create_dir(dir.path().join(format!("{SPOOL_FILE_PREFIX}dir"))).unwrap();
    assert_eq!(clean_spool_dir(dir.path()).unwrap(), 2);
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            format!("{SPOOL_FILE_PREFIX}dir"),
            "unrelated.txt".to_string()
        ]
    );
    assert_eq!(clean_spool_dir(dir.path()).unwrap(), 0);
    assert_eq!(clean_spool_dir(&dir.path().join("missing")).unwrap(), 0);
}

#[tokio::test]
async fn invalid_config_is_a_typed_error() {
    let res = resources(1 << 30, 4);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (b, _) = listener.accept().await.unwrap();
    let result = relay(
        a,
        b,
        &buffer_model(0, true),
        &res.resources,
        RelayOptions::default(),
        tokio_util::sync::CancellationToken::new(),
    )
    .await;
    assert!(
        matches!(result, Err(RelayError::InvalidConfig(_))),
        "{result:?}"
    );
}

/// A tmpfs mounted for this test; unmounted on drop even if the test fails.
struct TinyTmpfs {
    dir: tempfile::TempDir,
}

impl TinyTmpfs {
    fn mount(size: &str) -> Option<TinyTmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let options = format!("size={size}");
        match nix::mount::mount(
            Some("tmpfs"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(options.as_str()),
        ) {
            Ok(()) => Some(TinyTmpfs { dir }),
            Err(e) => {
                eprintln!("cannot mount a tmpfs ({e}); needs root");
                None
            }
        }
    }
}

impl Drop for TinyTmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The spool disk fills up (ENOSPC): the connection keeps its bytes in memory, stops reading
/// from the server (backpressure), and still delivers everything in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spool_disk_full_falls_back_to_memory() {
    const TRANSFER: u64 = 8 << 20;
    const MEMORY: usize = 64 * 1024;
    let Some(tmpfs) = TinyTmpfs::mount("512k") else {
        assert_ne!(
            nix::unistd::geteuid().as_raw(),
            0,
            "root must be able to mount"
        );
        return;
    };
    let resources =
        midway_relay::RelayResources::new(tmpfs.dir.path().join("spool"), 1 << 30, 4).unwrap();
    let relayed = relayed(
        spool_model(MEMORY, 1 << 30),
        &resources,
        None,
        Some(64 * 1024),
    )
    .await;
    let mut server = relayed.server;
    let mut client = relayed.client;
    let writer = tokio::spawn(async move { send_pattern(&mut server, TRANSFER, 60).await });
    let counters = relayed.counters.clone();
    let spooled = wait_until_stable(
        TEST_TIMEOUT,
        || counters.spooled_now.load(Ordering::Relaxed),
        25,
    )
    .await;
    assert!(
        spooled > 0 && spooled <= (512 + 64 + 64) * 1024,
        "spooled {spooled}"
    );
    assert!(!writer.is_finished(), "a full disk turns into backpressure");
    let received = within(TEST_TIMEOUT, receive_all(&mut client))
        .await
        .unwrap();
    assert_eq!(
        received,
        (
            TRANSFER,
            within(TEST_TIMEOUT, writer).await.unwrap().unwrap()
        )
    );
    socket2::SockRef::from(&client)
        .shutdown(std::net::Shutdown::Write)
        .unwrap();
    let report = within(TEST_TIMEOUT, relayed.relay).await.unwrap().unwrap();
    assert_eq!(report.server_to_client_end, DirectionEnd::Fin);
    assert_eq!(resources.spool_bytes_in_use(), 0);
    drop(resources);
    drop(tmpfs);
}

/// The per-connection state of an idle (parked) relay is this future (plus the two sockets);
/// the running relay is boxed inside it and freed while parked. It was 1,008 bytes when parking
/// came (the arguments stored twice by an async fn), 840 since.
#[tokio::test]
async fn relay_future_is_small() {
    let res = resources(1 << 30, 4);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (b, _) = listener.accept().await.unwrap();
    let model = spool_model(64 * 1024, 1 << 20);
    let future = relay(
        a,
        b,
        &model,
        &res.resources,
        RelayOptions::default(),
        tokio_util::sync::CancellationToken::new(),
    );
    let size = std::mem::size_of_val(&future);
    eprintln!("relay future: {size} bytes");
    assert!(size <= 1024, "relay future is {size} bytes");
}

/// `on_close` runs once, after the bytes moved, with the relay's own two sockets still open
/// (client segment first), so the caller can take their final `tcp_info`.
#[tokio::test]
async fn on_close_sees_both_open_sockets_once() {
    use std::os::fd::BorrowedFd;
    use std::sync::{Arc, Mutex};

    // TCP state of tcp_info; None if getsockopt fails (fd closed).
    fn tcp_state(fd: BorrowedFd<'_>) -> Option<u8> {
        midway_sys::tcp_info::tcp_stats(fd)
            .ok()
            .map(|info| info.state)
    }

    let res = resources(1 << 30, 4);
    let front = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let back = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = tokio::net::TcpStream::connect(front.local_addr().unwrap())
        .await
        .unwrap();
    let (proxy_client_side, _) = front.accept().await.unwrap();
    let proxy_server_side = tokio::net::TcpStream::connect(back.local_addr().unwrap())
        .await
        .unwrap();
    let (mut server, _) = back.accept().await.unwrap();
    let expected = (
        proxy_client_side.local_addr().unwrap(),
        proxy_server_side.local_addr().unwrap(),
    );

    type Seen = Vec<(
        std::net::SocketAddr,
        std::net::SocketAddr,
        Option<u8>,
        Option<u8>,
    )>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let sink = seen.clone();
    let options = RelayOptions {
        on_close: Some(Arc::new(move |c: BorrowedFd<'_>, s: BorrowedFd<'_>| {
            let addr = |fd: BorrowedFd<'_>| {
                socket2::SockRef::from(&fd)
                    .local_addr()
                    .unwrap()
                    .as_socket()
                    .unwrap()
            };
            sink.lock()
                .unwrap()
                .push((addr(c), addr(s), tcp_state(c), tcp_state(s)));
        })),
        ..RelayOptions::default()
    };
    let relay_task = tokio::spawn({
        let resources = res.resources.clone();
        async move {
            relay(
                proxy_client_side,
                proxy_server_side,
                &buffer_model(16 * 1024, true),
                &resources,
                options,
                tokio_util::sync::CancellationToken::new(),
            )
            .await
        }
    });
    client.write_all(b"hello").await.unwrap();
    client.shutdown().await.unwrap();
    let mut got = Vec::new();
    within(TEST_TIMEOUT, server.read_to_end(&mut got))
        .await
        .unwrap();
    assert_eq!(got, b"hello");
    server.write_all(b"bye").await.unwrap();
    server.shutdown().await.unwrap();
    let mut back_bytes = Vec::new();
    within(TEST_TIMEOUT, client.read_to_end(&mut back_bytes))
        .await
        .unwrap();
    assert_eq!(back_bytes, b"bye");
    let report = within(TEST_TIMEOUT, relay_task).await.unwrap().unwrap();
    assert_eq!(report.client_to_server_bytes, 5);

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "on_close must run exactly once");
    let (c, s, c_state, s_state) = seen[0];
    assert_eq!((c, s), expected, "sockets passed in the wrong order");
    // Still open file descriptors when called: tcp_info readable. (The TCP state itself may
    // already be CLOSE once both FINs were acknowledged; the counters are final then.)
    assert!(c_state.is_some(), "client socket's tcp_info unreadable");
    assert!(s_state.is_some(), "server socket's tcp_info unreadable");
}

/// After a burst, the pipes it opened are closed once they have sat idle long enough, instead
/// of staying open (two fds each) for the life of the process (issue 17, defect 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipes_left_by_a_burst_are_closed_when_idle() {
    const CONNECTIONS: u64 = 8;
    const TRANSFER: u64 = 4 << 20;
    const MAX_IDLE: Duration = Duration::from_secs(10);
    let res = resources(1 << 30, 64);
    splicing_burst(&res.resources, CONNECTIONS, TRANSFER, 80).await;
    let left = res.resources.pipes_open();
    assert!(left > 0, "the burst spliced through pooled pipes");
    assert_eq!(res.resources.pipes_in_use(), 0);
    let now = std::time::Instant::now();
    // Not yet idle long enough: nothing closed.
    assert_eq!(res.resources.close_idle_pipes(now, MAX_IDLE), 0);
    assert_eq!(res.resources.pipes_open(), left);
    // Later, every one of them has been idle for MAX_IDLE.
    assert_eq!(
        res.resources.close_idle_pipes(now + MAX_IDLE, MAX_IDLE),
        left
    );
    assert_eq!(res.resources.pipes_open(), 0);
    // The pool still works afterwards.
    let mut relayed = relayed(buffer_model(64 * 1024, true), &res.resources, None, None).await;
    ping_pong(&mut relayed).await;
    relayed.cancel.cancel();
    let _ = within(TEST_TIMEOUT, relayed.relay).await.unwrap();
}
