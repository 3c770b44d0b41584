// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Out of file descriptors under churn, the real binary logs a few lines, not one per refused
//! connection or per accept that failed and recovered (issue 17, defect 8: 2,704 lines in 20 s).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use midway_testkit::host::{listening_addr, Launch, Place};
use midway_testkit::wait::wait_exit;

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(20);
/// Descriptors midway may open: a few for itself, then two per split connection.
const MIDWAY_FD_LIMIT: u64 = 48;
/// Connections held open to use up midway's descriptors.
const HELD: usize = 30;
const CHURN: Duration = Duration::from_secs(4);
const CHURN_THREADS: usize = 4;

/// An echo server: a thread per connection (at most a few hundred in this test).
fn echo_server(stop: Arc<AtomicBool>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(LIMIT));
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// One short exchange through midway; false if it failed (reset, refused, timed out).
fn exchange(addr: std::net::SocketAddr) -> bool {
    let attempt = || -> std::io::Result<()> {
        let mut conn = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
        conn.set_read_timeout(Some(Duration::from_millis(500)))?;
        conn.write_all(b"x")?;
        let mut byte = [0u8; 1];
        conn.read_exact(&mut byte)?;
        Ok(())
    };
    attempt().is_ok()
}

#[test]
fn out_of_descriptors_under_churn_logs_a_few_lines() {
    let stop = Arc::new(AtomicBool::new(false));
    let echo = echo_server(stop.clone());
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("forward.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\nworker_threads = 1\n\
             [spool]\ndir = \"{}\"\n\n\
             [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"127.0.0.1:0\"\n\
             target = \"{echo}\"\nrelay = \"buffer\"\nsplice = false\n",
            dir.path().join("spool").display()
        ),
    )
    .unwrap();
    let (log_tx, log_rx) = mpsc::channel();
    let mut child = Launch::midway(MIDWAY, &config)
        .json_log()
        .log_lines(log_tx)
        .stop_grace(Duration::from_secs(10))
        .spawn(Place::Here)
        .unwrap();
    let addr = listening_addr(&mut child, LIMIT);
    // Lowered once it runs: at start midway raises its own limit and refuses a max_connections
    // the limit has no room for, so only a limit taken away afterwards makes it run out.
    midway_sys::fd_limit::set_open_file_limit_of(child.id(), MIDWAY_FD_LIMIT).unwrap();

    // Use up midway's descriptors with connections that stay open.
    let mut held = Vec::new();
    for _ in 0..HELD {
        if let Ok(conn) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            held.push(conn);
        }
    }
    // Churn: clients that connect, exchange a byte and leave, while a few held ones close and
    // reopen, so accept keeps failing and recovering.
    let failures = Arc::new(AtomicU64::new(0));
    let successes = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + CHURN;
    let churners: Vec<_> = (0..CHURN_THREADS)
        .map(|_| {
            let (failures, successes) = (failures.clone(), successes.clone());
            std::thread::spawn(move || {
                for _ in 0..10_000 {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let counter = if exchange(addr) {
                        &successes
                    } else {
                        &failures
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for round in 0..40 {
        if Instant::now() >= deadline {
            break;
        }
        if !held.is_empty() {
            held.swap_remove(round % held.len());
        }
        std::thread::sleep(Duration::from_millis(50));
        if let Ok(conn) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            held.push(conn);
        }
    }
    for churner in churners {
        churner.join().unwrap();
    }
    drop(held);
    let failures = failures.load(Ordering::Relaxed);
    // The check below means something only if midway really ran out of descriptors.
    assert!(
        failures >= 20,
        "midway never ran out of descriptors ({failures} failed exchanges, {} succeeded)",
        successes.load(Ordering::Relaxed)
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    wait_exit(child.child_mut(), LIMIT, "midway did not exit");
    stop.store(true, Ordering::Relaxed);
    let log: Vec<String> = log_rx.try_iter().collect();
    let flood_lines: Vec<&String> = log
        .iter()
        .filter(|l| {
            l.contains("out of resources")
                || l.contains("accept recovered")
                || l.contains("connection not relayed")
        })
        .collect();
    // 4 s of flood at one line per 10 s: the first line, and not one per event.
    assert!(
        !flood_lines.is_empty() && flood_lines.len() <= 3,
        "{} flood lines for {failures} failed exchanges: {flood_lines:#?}",
        flood_lines.len()
    );
}
