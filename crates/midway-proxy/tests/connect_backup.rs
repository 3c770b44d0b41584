//! `connect_backup_ms` on a live proxy (root only; skipped with a message otherwise): in a
//! network namespace of its own, nftables drops the first SYN that heads for the echo server,
//! as a lossy Internet path may. midway's forward listener connects its remote segment there.
//! - With `connect_backup_ms = 100`, a second attempt's SYN goes out after 100 ms and
//!   connects; the first socket is dropped before the kernel's one-second SYN timeout, so the
//!   namespace counts no timeout. Fails if the backup attempt is not made (the kernel's
//!   retransmission would count one) or if its connection is not the one relayed (no echo).
//! - Without it (the control), the same drop costs the kernel's SYN retransmission, counted
//!   as a timeout: without the control a zero could mean the SYN was never dropped.
//!
//! The drop rule's counter must show the one drop in both cases.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use midway_testkit::host::is_root;
use midway_testkit::netns::Netns;
use midway_testkit::proxy::start;

const ECHO_PORT: u16 = 5311;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

fn config(remote_profile: &str, target: SocketAddr) -> String {
    format!(
        r#"
[proxy]
allowed_clients = ["127.0.0.0/8"]
connect_timeout = "8s"
shutdown_grace = "2s"
[spool]
dir = "SPOOL_DIR"
[profiles.rp]
{remote_profile}
[[listeners]]
name = "fwd"
mode = "forward"
listen = "127.0.0.1:0"
target = "{target}"
remote_profile = "rp"
"#
    )
}

/// `TCPTimeouts` of the calling thread's namespace.
fn tcp_timeouts() -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/net/netstat").unwrap();
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let index = names
            .split_whitespace()
            .position(|name| name == "TCPTimeouts")
            .unwrap();
        return values
            .split_whitespace()
            .nth(index)
            .unwrap()
            .parse()
            .unwrap();
    }
    panic!("no TcpExt counters");
}

/// Relays one echo through a forward listener whose remote profile is `remote_profile`, in a
/// fresh namespace whose first SYN to the echo port is dropped. Returns the namespace's
/// timeouts during the exchange and the drop rule's packet count.
fn echo_with_first_syn_dropped(remote_profile: &str) -> (u64, u64) {
    let ns = Netns::unique("mwcb");
    for rule in [
        "add table inet mwcb",
        "add chain inet mwcb out { type filter hook output priority 0 ; }",
        // `numgen inc` counts the SYNs that reach it from 0: only the first is dropped.
        &format!(
            "add rule inet mwcb out tcp dport {ECHO_PORT} tcp flags & (syn | ack) == syn \
             numgen inc mod 1000 == 0 counter drop"
        ),
    ] {
        let words: Vec<&str> = rule.split(' ').collect();
        let out = ns.exec("nft", &words);
        assert!(out.status.success(), "nft {rule}: {out:?}");
    }
    let timeouts = ns.enter(|| {
        let echo = TcpListener::bind(("127.0.0.1", ECHO_PORT)).unwrap();
        let target = echo.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = echo.accept().unwrap();
            stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
            let mut buf = [0u8; 5];
            stream.read_exact(&mut buf).unwrap();
            stream.write_all(&buf).unwrap();
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let before = tcp_timeouts();
        runtime.block_on(async {
            let proxy = start(&config(remote_profile, target)).await;
            let addr = proxy.addr("fwd");
            let exchange = tokio::task::spawn_blocking(move || {
                let mut client = TcpStream::connect(addr).unwrap();
                client.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                client.write_all(b"hello").unwrap();
                let mut buf = [0u8; 5];
                client.read_exact(&mut buf).unwrap();
                assert_eq!(&buf, b"hello");
            });
            exchange.await.unwrap();
            proxy.shutdown.cancel();
            let _ = proxy.task.await;
        });
        server.join().unwrap();
        tcp_timeouts() - before
    });
    let listing = ns.exec("nft", &["list", "chain", "inet", "mwcb", "out"]);
    let text = String::from_utf8_lossy(&listing.stdout).into_owned();
    let drops = text
        .split("counter packets ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counter in {text}"));
    (timeouts, drops)
}

#[test]
fn a_backup_connect_replaces_a_lost_syn_before_the_kernel_retransmits_it() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespace, nftables)");
        return;
    }
    let (timeouts, drops) = echo_with_first_syn_dropped("connect_backup_ms = 100");
    assert_eq!(drops, 1, "the first SYN must have been dropped");
    assert_eq!(
        timeouts, 0,
        "the backup attempt connects before any SYN timeout"
    );

    let (timeouts, drops) = echo_with_first_syn_dropped("nodelay = true");
    assert_eq!(drops, 1, "the first SYN must have been dropped");
    assert!(
        timeouts >= 1,
        "without a backup the kernel retransmits the SYN after its timeout"
    );
}
