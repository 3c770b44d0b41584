//! Subscribers' access links over emulated links in network namespaces (root only; skipped
//! with a message otherwise). The loopback test (`access_links.rs`) shows the ceilings; this one
//! shows what they are for: the queue in front of a narrow link.
//!
//! A labnet topology: `sub1` and `sub2` behind identical access links (4 Mbit/s down into a
//! 45 KB drop-tail queue, 50 ms each way), `gw` running midway in-process (forward mode,
//! `cellular-local` locally) and `server`, which sends 256 KiB on every connection. Only `sub1`
//! is under an `[[access_links]]` entry, at its link's rate. Each subscriber opens six
//! connections through midway at once and reads them to the end. Checked, and how each fails:
//! - every connection brings its 256 KiB intact: fails if a relay loses, cuts or reorders data;
//! - the ceilings of `sub1`'s six local sockets add up to at most its payload budget (85 % of
//!   the rate) once the sampler has seen them: fails if the subscriber is not recognised or the
//!   ceilings are not set or not split; `sub2`'s sockets carry none: fails if it is paced;
//! - `sub1`'s downlink (the emulator's counters) runs at most at 95 % of the link's rate while
//!   the middle half of its bytes crosses (paced: 89 %, the budget with the headers): fails if
//!   the connections together exceed the budget by more than 7 %;
//! - `sub1`'s downlink queue drops no frame: fails if the connections overrun it, by bursts or
//!   by a sustained excess over the link (3 % more fills it within the transfer);
//! - the control: `sub2`'s six identical downloads, unpaced, overflow the same queue; without
//!   it a clean queue could mean a queue too large to matter.
//!
//! A second test gives `sub1`'s link its queue (`queue_bytes`, the shared window) and `sub2`'s
//! its rate alone, and follows what midway's local sockets toward each hold unacknowledged
//! (`SIOCOUTQ`, summed over the subscriber's sockets every 5 ms):
//! - `sub1`'s sum never exceeds its window (the link's bandwidth-delay product over at most
//!   120 ms and half its queue): fails if a relay writes past the window, or a grant is not
//!   counted until the sockets' own counts take it over;
//! - `sub1`'s downloads all arrive intact: fails if a full window ever stops waking the relays
//!   (a connection waiting for room it never gets would time the download out);
//! - `sub1`'s queue drops no frame: the window keeps the queue at most half full;
//! - the control: `sub2`'s sockets, paced but without a window, together hold more than the
//!   same bound (the relay fills their send buffers), so a low sum is the window's doing.
//!
//! Pacing cannot cover the start: Linux never paces a connection's first 10 segments, and
//! `cellular-local`'s window of 1 only spreads them over four round trips, the last beside
//! paced segments at 89 % of the link. Six starts took 11-19 frames of queue in our runs, so it
//! holds 30 (a 30 KB queue, 20 frames, was nearly full at times); with 20 ms each way the
//! rounds overlap and the start alone took 26. Durations are printed, not asserted: the link's
//! own rate bounds both subscribers.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::BorrowedFd;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use midway_labnet::{
    fresh_tag, DirectionConfig, DirectionStats, HostSpec, LinkSpec, QueueLimit, StackProfile,
    Topology, TopologySpec,
};
use midway_proxy::access_link::{link_payload_capacity, payload_bytes_per_second, shared_window};
use midway_testkit::host::is_root;
use midway_testkit::net::{sockets_where, WAIT};
use midway_testkit::netns::in_netns;
use midway_testkit::proxy::start_in_netns;
use midway_testkit::wait::poll_until;

const RATE_BPS: u64 = 4_000_000;
const QUEUE_BYTES: u64 = 45_000;
const ACCESS_ONE_WAY: Duration = Duration::from_millis(50);
const CONNECTIONS: usize = 6;
const PER_CONNECTION: usize = 256 * 1024;
const LISTEN_PORT: u16 = 7000;
/// The second test's listener: the tests run at once in one process, and the sockets are found
/// by port and client address (the same in both topologies).
const WINDOW_LISTEN_PORT: u16 = 7001;
const SOURCE_PORT: u16 = 5201;

/// The source's byte at offset `i` of a connection.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

fn topology_spec() -> TopologySpec {
    let delay = |delay| DirectionConfig {
        delay,
        ..DirectionConfig::default()
    };
    // The subscribers' narrow downlinks (gw to subscriber); uplinks with the delay only.
    let down = DirectionConfig {
        rate_bps: Some(RATE_BPS),
        queue: QueueLimit::Bytes(QUEUE_BYTES),
        ..delay(ACCESS_ONE_WAY)
    };
    let internet = delay(Duration::from_millis(10));
    let link = |a: &str, b: &str, a_to_b, b_to_a| LinkSpec {
        a: a.into(),
        b: b.into(),
        a_to_b,
        b_to_a,
    };
    TopologySpec {
        hosts: ["sub1", "sub2", "gw", "server"]
            .map(|name| HostSpec {
                name: name.into(),
                stack: StackProfile::Modern,
            })
            .to_vec(),
        links: vec![
            link("sub1", "gw", delay(ACCESS_ONE_WAY), down.clone()),
            link("sub2", "gw", delay(ACCESS_ONE_WAY), down),
            link("gw", "server", internet.clone(), internet),
        ],
    }
}

/// The source in `ns`: `PER_CONNECTION` bytes of the pattern on each of `connections`
/// connections, then their ends; the number it served. Stops accepting after `WAIT`.
fn start_source(ns: &str, addr: SocketAddr, connections: usize) -> JoinHandle<usize> {
    let listener = in_netns(ns, move || TcpListener::bind(addr).unwrap())
        .join()
        .unwrap();
    std::thread::spawn(move || {
        listener.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + WAIT;
        let mut writers = Vec::new();
        while writers.len() < connections && Instant::now() < deadline {
            let Ok((mut stream, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            writers.push(std::thread::spawn(move || {
                stream.set_nonblocking(false).unwrap();
                stream.set_write_timeout(Some(WAIT)).unwrap();
                let block: Vec<u8> = (0..PER_CONNECTION).map(pattern).collect();
                let _ = stream.write_all(&block);
                let _ = stream.shutdown(Shutdown::Write);
            }));
        }
        let served = writers.len();
        writers.into_iter().for_each(|w| w.join().unwrap());
        served
    })
}

/// One download from namespace `ns` through midway at `proxy`: (bytes, whether they are the
/// source's pattern, when it ended). Bounded by `2 * WAIT`.
fn download(ns: &str, proxy: SocketAddr) -> JoinHandle<(usize, bool, Instant)> {
    in_netns(ns, move || {
        let mut stream = TcpStream::connect_timeout(&proxy, WAIT).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        let deadline = Instant::now() + WAIT * 2;
        let (mut got, mut intact, mut buf) = (0, true, vec![0u8; 65536]);
        while Instant::now() < deadline {
            let n = stream.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            intact &= buf[..n]
                .iter()
                .enumerate()
                .all(|(i, &b)| b == pattern(got + i));
            got += n;
        }
        (got, intact, Instant::now())
    })
}

/// A socket option of each of midway's local sockets on `port` from `client`, in this process.
fn local_sockets<T>(
    port: u16,
    client: IpAddr,
    read: impl Fn(BorrowedFd<'_>) -> std::io::Result<T>,
) -> Vec<T> {
    sockets_where(|local, peer| local.port() == port && peer.ip() == client)
        .into_iter()
        .filter_map(|fd| {
            // SAFETY: the fd was listed in /proc/self/fd a moment ago and its connection is open
            // until its download ends; a reused fd would only misread (and fail the check).
            read(unsafe { BorrowedFd::borrow_raw(fd) }).ok()
        })
        .collect()
}

/// The pacing ceilings (bytes/s) of midway's local sockets from `client`.
fn ceilings_of(client: IpAddr) -> Vec<u64> {
    local_sockets(
        LISTEN_PORT,
        client,
        midway_sys::sockopt::get_max_pacing_rate,
    )
}

/// What midway's local sockets toward `client` hold unacknowledged together (bytes).
fn outstanding_of(client: IpAddr) -> u64 {
    local_sockets(
        WINDOW_LISTEN_PORT,
        client,
        midway_sys::sockopt::queued_bytes,
    )
    .iter()
    .map(|queued| queued.unacked_out)
    .sum()
}

/// The downlink (gw to subscriber) counters of `subscriber`'s access link.
fn downlink(topology: &Topology, subscriber: &str) -> DirectionStats {
    let name = format!("{subscriber}-gw");
    let mut links = topology.link_stats().into_iter();
    links.find(|(n, _, _)| *n == name).unwrap().2
}

/// Each subscriber's downlink wire rate (bytes/s) while it carried the middle half of `total`
/// (from a quarter to three quarters), sampled every 5 ms; bounded by `2 * WAIT`.
fn middle_rates(topology: &Topology, subscribers: [&str; 2], total: u64) -> [f64; 2] {
    let mut marks = [[None; 2]; 2];
    let deadline = Instant::now() + WAIT * 2;
    while marks.iter().any(|m| m[1].is_none()) && Instant::now() < deadline {
        for (marks, subscriber) in marks.iter_mut().zip(subscribers) {
            let (sent, now) = (downlink(topology, subscriber).sent_bytes, Instant::now());
            for (mark, at) in marks.iter_mut().zip([total / 4, total * 3 / 4]) {
                if sent >= at && mark.is_none() {
                    *mark = Some((now, sent));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    marks.map(|[from, to]| {
        let ((t0, s0), (t1, s1)) = (from.expect("a quarter sent"), to.expect("3/4 sent"));
        (s1 - s0) as f64 / (t1 - t0).as_secs_f64()
    })
}

type Download = JoinHandle<(usize, bool, Instant)>;

/// One test's network and midway: `sub1` and `sub2` behind their access links, the source in
/// `server`, and midway in `gw` forwarding `port` to it with `access_links` (TOML entries for
/// the two subscribers' addresses).
struct Setup {
    topology: Topology,
    port: u16,
    source_thread: JoinHandle<usize>,
    proxy: midway_testkit::proxy::InNetns,
    _spool: tempfile::TempDir,
}

impl Setup {
    fn new(seed: u64, port: u16, access_links: impl FnOnce(IpAddr, IpAddr) -> String) -> Setup {
        let topology =
            Topology::build(&topology_spec(), &fresh_tag(), seed).expect("topology builds");
        let (sub1, sub2) = (topology.addr("sub1", "gw"), topology.addr("sub2", "gw"));
        let source = SocketAddr::new(topology.addr("server", "gw"), SOURCE_PORT);
        let source_thread = start_source(topology.netns_name("server"), source, 2 * CONNECTIONS);
        let spool = tempfile::tempdir().unwrap();
        let config = format!(
            r#"
[proxy]
allowed_clients = ["10.0.0.0/16"]
shutdown_grace = "1s"
[spool]
dir = "{}"
{}
[[listeners]]
name = "fwd"
mode = "forward"
listen = "0.0.0.0:{port}"
target = "{source}"
local_profile = "cellular-local"
"#,
            spool.path().display(),
            access_links(sub1, sub2)
        );
        let proxy = start_in_netns(topology.netns_name("gw"), config);
        Setup {
            topology,
            port,
            source_thread,
            proxy,
            _spool: spool,
        }
    }

    fn addr(&self, subscriber: &str) -> IpAddr {
        self.topology.addr(subscriber, "gw")
    }

    /// Each subscriber's `CONNECTIONS` downloads through midway, started at once.
    fn start_downloads(&self) -> (Instant, [Vec<Download>; 2]) {
        let started = Instant::now();
        let mut downloads = [Vec::new(), Vec::new()];
        for _ in 0..CONNECTIONS {
            for (downloads, sub) in downloads.iter_mut().zip(["sub1", "sub2"]) {
                let proxy = SocketAddr::new(self.topology.addr("gw", sub), self.port);
                downloads.push(download(self.topology.netns_name(sub), proxy));
            }
        }
        (started, downloads)
    }

    /// Joins the downloads (every byte arrives, intact), stops midway (every connection
    /// served) and the source; how long each subscriber's downloads took, and the topology.
    fn finish(self, started: Instant, downloads: [Vec<Download>; 2]) -> ([Duration; 2], Topology) {
        let took = downloads
            .into_iter()
            .zip(["sub1", "sub2"])
            .map(|(downloads, who)| {
                let mut ended = started;
                for download in downloads {
                    let (bytes, intact, at) = download.join().unwrap();
                    assert_eq!(bytes, PER_CONNECTION, "{who}: every byte arrives");
                    assert!(intact, "{who}: the bytes are the source's");
                    ended = ended.max(at);
                }
                ended - started
            })
            .collect::<Vec<_>>();
        let summary = self.proxy.stop();
        assert_eq!(summary.connections_served, 2 * CONNECTIONS as u64);
        assert_eq!(self.source_thread.join().unwrap(), 2 * CONNECTIONS);
        ([took[0], took[1]], self.topology)
    }
}

#[test]
fn a_subscribers_connections_keep_within_its_link_and_another_is_not_paced() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let setup = Setup::new(7, LISTEN_PORT, |sub1, _| {
        format!("[[access_links]]\nclients = [\"{sub1}/32\"]\nrate_bps = {RATE_BPS}")
    });
    let (sub1, sub2) = (setup.addr("sub1"), setup.addr("sub2"));
    let budget = payload_bytes_per_second(RATE_BPS);

    let (started, downloads) = setup.start_downloads();
    // While the downloads run. Joining, each newcomer starts at its share among those before
    // it, and a socket is unset (u64::MAX) until its relay joins: hence the wait.
    let shared = poll_until(WAIT, || {
        let ceilings = ceilings_of(sub1);
        let sum = ceilings.iter().fold(0u64, |sum, c| sum.saturating_add(*c));
        ceilings.len() == CONNECTIONS && sum <= budget
    });
    let ceilings = ceilings_of(sub1);
    assert!(shared, "sub1's ceilings exceed {budget} B/s: {ceilings:?}");
    let all_seen = poll_until(WAIT, || ceilings_of(sub2).len() == CONNECTIONS);
    let unpaced = ceilings_of(sub2);
    assert!(all_seen, "sub2's sockets: {unpaced:?}");
    let unset = u128::from(libc::c_ulong::MAX);
    assert!(
        unpaced.iter().all(|&c| u128::from(c) == unset),
        "another subscriber is paced: {unpaced:?}"
    );

    let total = (CONNECTIONS * PER_CONNECTION) as u64;
    let [rate1, rate2] = middle_rates(&setup.topology, ["sub1", "sub2"], total);
    let ([shaped_took, unshaped_took], topology) = setup.finish(started, downloads);

    let (down1, down2) = (downlink(&topology, "sub1"), downlink(&topology, "sub2"));
    let link = RATE_BPS as f64 / 8.0;
    let show = |s: &DirectionStats, rate: f64| {
        format!(
            "{rate:.0} B/s ({:.1} % of the link) in the middle half; {} queue drops, queue \
             max {} B / {} frames, {} late sends",
            100.0 * rate / link,
            s.dropped_queue_frames,
            s.max_queue_bytes,
            s.max_queue_frames,
            s.late_sends
        )
    };
    let (report1, report2) = (show(&down1, rate1), show(&down2, rate2));
    println!("sub1, paced at {ceilings:?} of {budget} B/s: {shaped_took:?}; {report1}");
    println!("sub2, not paced: {unshaped_took:?}; {report2}");
    let sent = down1.sent_bytes;
    assert!(sent >= total, "sub1's link carried {sent} B, not its bytes");
    assert!(
        rate1 <= 0.95 * link,
        "sub1's connections together ran faster than its budget: {report1}"
    );
    assert_eq!(
        down1.dropped_queue_frames, 0,
        "sub1's connections overflowed its access queue: {report1}"
    );
    assert!(
        down2.dropped_queue_frames > 0,
        "control: six unpaced downloads did not overflow the same queue, so the test cannot \
         tell pacing from a queue too large to matter: {report2}"
    );
}

#[test]
fn a_subscribers_connections_hold_at_most_its_shared_window_together() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let setup = Setup::new(8, WINDOW_LISTEN_PORT, |sub1, sub2| {
        format!(
            "[[access_links]]\nclients = [\"{sub1}/32\"]\nrate_bps = {RATE_BPS}\n\
             queue_bytes = {QUEUE_BYTES}\n\
             [[access_links]]\nclients = [\"{sub2}/32\"]\nrate_bps = {RATE_BPS}"
        )
    });
    let (sub1, sub2) = (setup.addr("sub1"), setup.addr("sub2"));
    // The window midway computes from the handshake's round trip (100 ms here), bounded above
    // with 20 ms to spare for the emulator's and the stacks' own delay.
    let bound = shared_window(
        link_payload_capacity(RATE_BPS),
        2 * ACCESS_ONE_WAY + Duration::from_millis(20),
        QUEUE_BYTES,
    );

    let (started, downloads) = setup.start_downloads();
    let (mut most1, mut most2) = (0, 0);
    let deadline = Instant::now() + WAIT * 2;
    while !downloads.iter().flatten().all(JoinHandle::is_finished) && Instant::now() < deadline {
        most1 = most1.max(outstanding_of(sub1));
        most2 = most2.max(outstanding_of(sub2));
        std::thread::sleep(Duration::from_millis(5));
    }
    let ([windowed_took, paced_took], topology) = setup.finish(started, downloads);

    let (down1, down2) = (downlink(&topology, "sub1"), downlink(&topology, "sub2"));
    let show = |s: &DirectionStats, most: u64| {
        format!(
            "at most {most} B unacknowledged together; {} queue drops, queue max {} B / {} \
             frames",
            s.dropped_queue_frames, s.max_queue_bytes, s.max_queue_frames
        )
    };
    let (report1, report2) = (show(&down1, most1), show(&down2, most2));
    println!("window bound {bound} B");
    println!("sub1, shared window: {windowed_took:?}; {report1}");
    println!("sub2, paced only: {paced_took:?}; {report2}");
    assert!(
        most1 <= bound,
        "sub1's connections held more than its window ({bound} B): {report1}"
    );
    assert_eq!(
        down1.dropped_queue_frames, 0,
        "sub1's connections overflowed its access queue: {report1}"
    );
    assert!(
        most2 > bound,
        "control: six paced downloads without a window never held more than {bound} B \
         together, so the test cannot tell the window from a transfer too small to matter: \
         {report2}"
    );
}
