//! `--connections N`: can the proxy hold N concurrent split connections, and what does it cost
//! (issue 32's target: 100,000 held for 60 s, all answering at the end).
//!
//! For each proxy case, after the other measurements and on the same proxy: the client host
//! opens N connections through the proxy to an echo server in the server host, at most
//! `--connections-in-flight` at a time, from [`CLIENT_SOURCES`] addresses to [`CONNECTION_PORTS`] (see the
//! constants for why several of each). It reports:
//! - how long opening all of them took, and the p50 / p99 / max of connect plus first echo;
//! - the proxy's RSS and its growth per connection, the machine's kernel TCP memory
//!   (`/proc/net/sockstat` "TCP: mem", machine-wide: all four sockets of a split connection and
//!   the bench's own), the kernel's slab objects (the sockets' structures, files and epoll
//!   registrations, machine-wide too) and the drop of MemAvailable per connection (everything: the kernel's
//!   socket structures too, and the generator's and echo server's memory);
//! - the headroom at N: the proxy's open descriptors against its RLIMIT_NOFILE, MemAvailable;
//! - after `--hold` seconds of one-byte keep-alive echoes (every [`KEEPALIVE_EVERY`] per
//!   connection, spread over the period), how many connections answered a last echo;
//! - then the proxy's stop with all of them open (SIGTERM, as a service manager stops it): how
//!   long until it exited, and how each connection ended at the client and at the server. A
//!   connection a proxy cannot finish should end with a reset at both ends, never with a clean
//!   end of stream that the client cannot tell from a complete answer (midway resets what is
//!   still open when its `shutdown_grace`, [`crate::configs::MIDWAY_SHUTDOWN_GRACE`] in the
//!   bench, runs out).
//!
//! The bench holds a client and a server socket per connection and the proxy two, so both need
//! an open-file limit above 2 N: [`files_needed`].

mod load;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use midway_sys::procfs;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;

use crate::netns::{BenchNet, Host, SERVER_ADDR};
use crate::{BenchOptions, Case, METRICS_ADDR};
use load::{EchoTally, Ends, Generated};

/// The ports the connections go to, in turn. Several, because the proxy connects to the server
/// from one address (the router's), and one (source, destination) pair has only the router's
/// ~64,000 ephemeral ports: each port here carries at most [`MAX_PER_PORT`] connections.
pub(crate) const CONNECTION_PORTS: [u16; 4] = [6100, 6101, 6102, 6103];
/// Connections per port at most, under the 63,977 ports of the namespaces' range (1024-65000).
const MAX_PER_PORT: usize = 50_000;
/// The most connections `--connections` takes.
pub const MAX_CONNECTIONS: usize = CONNECTION_PORTS.len() * MAX_PER_PORT;
/// Client addresses the connections are bound to, in turn (10.0.1.101 and up, added to the
/// client's interface): a socket bound to an address and port 0 takes a port of that address
/// for itself whatever the destination, so one address would stop near 64,000.
const CLIENT_SOURCES: u8 = 16;
const FIRST_CLIENT_SOURCE: u8 = 101;
// The ephemeral range of the namespaces (1024-65000) has room for each port's connections to
// the server and for each client address's bound ports.
const _: () = assert!(MAX_PER_PORT < 65000 - 1024);
const _: () = assert!(MAX_CONNECTIONS / (CLIENT_SOURCES as usize) < 65000 - 1024);
/// The most connections being opened at once `--connections-in-flight` takes: below the accept
/// backlogs (midway 4096, HAProxy and the echo server capped at `somaxconn`, 4096 in a new
/// namespace) and the SYN queues ([`SYN_QUEUE`]), so no handshake is dropped and retried a
/// second later.
pub const MAX_IN_FLIGHT: usize = 4000;
/// `tcp_max_syn_backlog` of the router's and the server's namespaces during the bench.
pub(crate) const SYN_QUEUE: u32 = 8192;
/// Each held connection echoes one byte this often: 10,000 echoes a second at 100,000.
const KEEPALIVE_EVERY: Duration = Duration::from_secs(10);
/// How long one connection may take to connect and answer its first echo, and each keep-alive.
const OPEN_LIMIT: Duration = Duration::from_secs(10);
/// How long each connection may take to answer the last echo (all of them asked at once).
const ANSWER_LIMIT: Duration = Duration::from_secs(30);
/// Descriptors beyond two per connection: iperf3's and the proxy's own, listeners, logs.
const FD_RESERVE: u64 = 1024;
/// How long the proxy may take to exit after SIGTERM with every connection open.
pub(crate) const STOP_LIMIT: Duration = Duration::from_secs(60);
/// How long each client connection waits for its end once the stop begins: the proxy's limit
/// and a margin.
const END_LIMIT: Duration = Duration::from_secs(70);
/// After the proxy exited, how long the echo server gets to see every connection's end.
const SERVER_END_LIMIT: Duration = Duration::from_secs(10);

/// Open files the bench and the proxy each need for `connections` held connections.
pub(crate) fn files_needed(connections: usize) -> u64 {
    2 * connections as u64 + FD_RESERVE
}

/// `max_connections` (midway) and `maxconn` (HAProxy) for a run with `connections`: at least
/// `floor` (what the other measurements use), and enough above `connections` that midway's
/// transparent listener does not start bypassing (at 99 %).
pub(crate) fn proxy_max_connections(connections: usize, floor: usize) -> usize {
    floor.max(connections + connections / 50 + 100)
}

/// The client addresses the generator binds to.
fn client_sources() -> Vec<Ipv4Addr> {
    (0..CLIENT_SOURCES)
        .map(|i| Ipv4Addr::new(10, 0, 1, FIRST_CLIENT_SOURCE + i))
        .collect()
}

/// Readies the network for `--connections`: the client's extra addresses, deeper SYN queues.
pub(crate) fn prepare(net: &BenchNet) -> anyhow::Result<()> {
    net.add_client_addresses(&client_sources())?;
    net.deepen_syn_queues(SYN_QUEUE)
}

/// The many-connections figures of one case, first round only.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConnectionsRow {
    /// Name of the case ([`Case::name`]).
    pub case: &'static str,
    /// Connections asked for.
    pub connections: usize,
    /// Connections being opened at once at most. The opening's latency includes the wait
    /// behind the others in flight: about this many over the opening rate.
    pub in_flight: usize,
    /// Connections that opened (connected and answered a first echo).
    pub opened: usize,
    /// Connections that did not open.
    pub failed_to_open: usize,
    /// Why the first of them failed.
    pub first_open_error: Option<String>,
    /// From the first connect until every connection had opened or failed, seconds.
    pub open_seconds: f64,
    /// Connect plus first echo, median over the opened connections, milliseconds.
    pub open_latency_p50_ms: Option<f64>,
    /// Connect plus first echo, 99th percentile, milliseconds.
    pub open_latency_p99_ms: Option<f64>,
    /// Connect plus first echo, the slowest, milliseconds.
    pub open_latency_max_ms: Option<f64>,
    /// Opened connections whose client socket retransmitted (a SYN or the first byte) before
    /// the first echo came back: each is a second or more of latency the proxy may not have
    /// caused.
    pub retransmitted_opens: usize,
    /// The proxy's resident memory before the connections opened, bytes.
    pub proxy_rss_before_bytes: u64,
    /// The proxy's resident memory with all of them open, bytes.
    pub proxy_rss_at_n_bytes: u64,
    /// Growth of the proxy's resident memory per opened connection, bytes.
    pub user_bytes_per_connection: f64,
    /// The machine's kernel TCP memory with all of them open (`/proc/net/sockstat` "TCP: mem",
    /// machine-wide), bytes.
    pub kernel_tcp_at_n_bytes: u64,
    /// Its growth per opened connection (all four sockets' buffers), bytes.
    pub kernel_tcp_bytes_per_connection: f64,
    /// The growth of the kernel's slab objects in use per opened connection, machine-wide (the
    /// structures of all four sockets, their files and epoll registrations; /proc's own left
    /// out, as for the idle figure), bytes.
    pub kernel_slab_bytes_per_connection: Option<f64>,
    /// The drop of the machine's MemAvailable per opened connection, bytes: the proxy, the
    /// kernel's socket structures, the generator and the echo server together.
    pub machine_bytes_per_connection: f64,
    /// MemAvailable with all of them open, bytes.
    pub mem_available_at_n_bytes: u64,
    /// The proxy's open descriptors with all of them open.
    pub proxy_open_fds: u64,
    /// The proxy's RLIMIT_NOFILE (soft).
    pub proxy_fd_limit: u64,
    /// TCP sockets in use in the router's namespace with all of them open (two per connection,
    /// and the listeners).
    pub router_tcp_sockets: u64,
    /// The bench's own resident memory with all of them open (generator and echo server), bytes.
    pub bench_rss_at_n_bytes: u64,
    /// Connections the echo server accepted in all.
    pub server_accepted: u64,
    /// How long the connections were held after opening, seconds.
    pub hold_seconds: u32,
    /// Keep-alive echoes answered during the hold.
    pub keepalive_echoes: u64,
    /// Connections that stopped answering a keep-alive during the hold.
    pub keepalive_failures: u64,
    /// midway's own count of the connections it serves (`midway_connections_active`, from its
    /// metrics endpoint) with all of them open; `None` for HAProxy.
    pub proxy_counted_at_n: Option<u64>,
    /// Connections that answered the last echo, after the hold.
    pub answered_at_end: u64,
    /// From asking all of them for the last echo to the last answer, seconds.
    pub final_check_seconds: f64,
    /// From SIGTERM to the proxy's exit with the connections open, seconds; `None` if it had
    /// not exited within `STOP_LIMIT` (60 s).
    pub stop_seconds: Option<f64>,
    /// Connections that answered the last echo and then, while the proxy stopped, ended at the
    /// client with a reset.
    pub client_resets: u64,
    /// ... with a clean end of stream (a FIN): a client cannot tell it from a complete answer.
    pub client_clean_ends: u64,
    /// ... with another error.
    pub client_other_ends: u64,
    /// ... with no end within `END_LIMIT` (70 s).
    pub client_no_end: u64,
    /// The proxy's connections to the echo server (every one it accepted) that ended there
    /// with a reset.
    pub server_resets: u64,
    /// ... with a clean end of stream.
    pub server_clean_ends: u64,
    /// ... with another error.
    pub server_other_ends: u64,
    /// ... not at all within `SERVER_END_LIMIT` (10 s) of the proxy's exit.
    pub server_no_end: u64,
}

/// What the proxy's stop looked like from outside: when it exited, and how the echo server's
/// connections ended.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Stopping {
    pub(crate) exit: Option<Duration>,
    pub(crate) server_ends: Ends,
    pub(crate) server_no_end: u64,
}

/// Sends SIGTERM to the proxy `pid`, waits (at most [`STOP_LIMIT`]) until it has exited, then
/// (at most [`SERVER_END_LIMIT`]) until the echo server has seen an end of every connection.
fn stop_proxy(pid: u32, server: &EchoTally) -> anyhow::Result<Stopping> {
    let pid_arg = i32::try_from(pid).context("the proxy's pid")?;
    let asked = Instant::now();
    kill(Pid::from_raw(pid_arg), Signal::SIGTERM).context("SIGTERM to the proxy")?;
    let mut exit = None;
    while asked.elapsed() < STOP_LIMIT {
        // Exited: gone, or a zombie until the bench reaps it.
        if matches!(procfs::process_state(pid), None | Some('Z')) {
            exit = Some(asked.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let exited = Instant::now();
    while server.ends().total() < server.accepted() && exited.elapsed() < SERVER_END_LIMIT {
        std::thread::sleep(Duration::from_millis(10));
    }
    let server_ends = server.ends();
    Ok(Stopping {
        exit,
        server_ends,
        server_no_end: server.accepted().saturating_sub(server_ends.total()),
    })
}

/// What the bench reads about the proxy and the machine, before and at N.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Snapshot {
    /// midway's `midway_connections_active` (`None`: not midway, or unreadable).
    pub(crate) proxy_counted: Option<u64>,
    pub(crate) proxy_rss: u64,
    pub(crate) machine_tcp: u64,
    /// The kernel's slab objects in use, without /proc's own (`None`: `/proc/slabinfo`
    /// unreadable).
    pub(crate) machine_slab: Option<u64>,
    pub(crate) mem_available: u64,
    pub(crate) proxy_fds: u64,
    pub(crate) proxy_fd_limit: u64,
    pub(crate) router_tcp_sockets: u64,
    pub(crate) bench_rss: u64,
}

impl Snapshot {
    /// The figures of the proxy `proxy_pid`; midway's count from its metrics endpoint when
    /// `metrics` gives the router's namespace and the endpoint's address.
    fn take(proxy_pid: u32, metrics: Option<&(PathBuf, SocketAddr)>) -> anyhow::Result<Snapshot> {
        let proxy_counted = match metrics {
            Some((netns, addr)) => {
                let addr = *addr;
                let text =
                    midway_sys::netns::run_in(netns, move || midway_launch::metrics::scrape(addr))
                        .and_then(|scraped| scraped)
                        .context("midway's metrics endpoint")?;
                midway_launch::metrics::metric_sum(&text, "connections_active").map(|n| n as u64)
            }
            None => None,
        };
        Ok(Snapshot {
            proxy_counted,
            proxy_rss: procfs::rss_bytes(proxy_pid)?,
            machine_tcp: procfs::machine_tcp_memory_bytes()?,
            machine_slab: procfs::slab_in_use()
                .ok()
                .map(|slab| slab.without_proc_lookups()),
            mem_available: procfs::mem_available_bytes()?,
            proxy_fds: procfs::open_fd_count(proxy_pid)?,
            proxy_fd_limit: procfs::open_file_limit(proxy_pid)?.0,
            router_tcp_sockets: procfs::tcp_sockets_in_use(proxy_pid)?,
            bench_rss: procfs::rss_bytes(std::process::id())?,
        })
    }
}

/// Opens `options.connections` connections through the proxy of `case` (pid `proxy_pid`),
/// holds them for `options.hold_seconds`, and gives the figures.
pub(crate) fn measure(
    net: &BenchNet,
    case: Case,
    proxy_pid: u32,
    options: &BenchOptions,
) -> anyhow::Result<ConnectionsRow> {
    let count = options.connections;
    let hold = Duration::from_secs(options.hold_seconds.into());
    let in_flight = options.connections_in_flight.clamp(1, MAX_IN_FLIGHT);
    if count > MAX_CONNECTIONS {
        bail!("--connections takes at most {MAX_CONNECTIONS}, not {count}");
    }
    let echo = load::start_echo_server(
        net,
        CONNECTION_PORTS
            .iter()
            .map(|&port| SocketAddr::from((SERVER_ADDR, port)))
            .collect(),
    )?;
    // Let the proxy's allocator settle after the earlier measurements' connections closed.
    std::thread::sleep(Duration::from_millis(500));
    let metrics = case
        .is_midway()
        .then(|| -> anyhow::Result<_> {
            let addr = METRICS_ADDR
                .parse()
                .context("METRICS_ADDR is not a socket address")?;
            Ok((net.netns_path(Host::Router), addr))
        })
        .transpose()?;
    let before = Snapshot::take(proxy_pid, metrics.as_ref()).context("before opening")?;
    let plan = load::Plan {
        targets: CONNECTION_PORTS
            .iter()
            .map(|&port| SocketAddr::from((case.connect_addr(), port)))
            .collect(),
        sources: client_sources(),
        count,
        in_flight,
        open_limit: OPEN_LIMIT,
        keepalive_every: KEEPALIVE_EVERY,
        hold,
        answer_limit: ANSWER_LIMIT,
        end_limit: END_LIMIT,
    };
    let server = echo.tally();
    let generated = load::run_generator(
        net,
        plan,
        move || {
            // As in the idle measurement: the allocator settles after the burst of accepts.
            std::thread::sleep(Duration::from_millis(500));
            Snapshot::take(proxy_pid, metrics.as_ref()).context("with the connections open")
        },
        move || stop_proxy(proxy_pid, &server),
    );
    let server_accepted = echo.stop()?;
    Ok(row(
        case,
        (count, in_flight),
        hold,
        &before,
        &generated?,
        server_accepted,
    ))
}

/// The figures from what was measured. Pure.
fn row(
    case: Case,
    (count, in_flight): (usize, usize),
    hold: Duration,
    before: &Snapshot,
    generated: &Generated<Snapshot, Stopping>,
    server_accepted: u64,
) -> ConnectionsRow {
    let Generated {
        opening,
        at_n,
        holding,
        at_stop: stopping,
        ending,
    } = generated;
    let opened = opening.latencies.len();
    let per_connection = |grown: u64| grown as f64 / opened.max(1) as f64;
    let ms = |p: f64| percentile(&opening.latencies, p).map(|d| d.as_secs_f64() * 1e3);
    ConnectionsRow {
        case: case.name(),
        connections: count,
        in_flight,
        opened,
        failed_to_open: opening.failures,
        first_open_error: opening.first_error.clone(),
        open_seconds: opening.elapsed.as_secs_f64(),
        open_latency_p50_ms: ms(50.0),
        open_latency_p99_ms: ms(99.0),
        open_latency_max_ms: ms(100.0),
        retransmitted_opens: opening.retransmitted,
        proxy_rss_before_bytes: before.proxy_rss,
        proxy_rss_at_n_bytes: at_n.proxy_rss,
        user_bytes_per_connection: per_connection(at_n.proxy_rss.saturating_sub(before.proxy_rss)),
        kernel_tcp_at_n_bytes: at_n.machine_tcp,
        kernel_tcp_bytes_per_connection: per_connection(
            at_n.machine_tcp.saturating_sub(before.machine_tcp),
        ),
        kernel_slab_bytes_per_connection: before
            .machine_slab
            .zip(at_n.machine_slab)
            .map(|(before, at_n)| (at_n as f64 - before as f64) / opened.max(1) as f64),
        machine_bytes_per_connection: per_connection(
            before.mem_available.saturating_sub(at_n.mem_available),
        ),
        mem_available_at_n_bytes: at_n.mem_available,
        proxy_open_fds: at_n.proxy_fds,
        proxy_fd_limit: at_n.proxy_fd_limit,
        router_tcp_sockets: at_n.router_tcp_sockets,
        bench_rss_at_n_bytes: at_n.bench_rss,
        server_accepted,
        hold_seconds: u32::try_from(hold.as_secs()).unwrap_or(u32::MAX),
        keepalive_echoes: holding.keepalive_echoes,
        keepalive_failures: holding.keepalive_failures,
        proxy_counted_at_n: at_n.proxy_counted,
        answered_at_end: holding.answered,
        final_check_seconds: holding.final_check.as_secs_f64(),
        stop_seconds: stopping.exit.map(|d| d.as_secs_f64()),
        client_resets: ending.ends.resets,
        client_clean_ends: ending.ends.clean,
        client_other_ends: ending.ends.other,
        client_no_end: ending.no_end,
        server_resets: stopping.server_ends.resets,
        server_clean_ends: stopping.server_ends.clean,
        server_other_ends: stopping.server_ends.other,
        server_no_end: stopping.server_no_end,
    }
}

/// The nearest-rank `p`th percentile of sorted `values` (100: the largest); `None` for none.
fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::load::{Ending, Holding, Opening};
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|&v| Duration::from_millis(v)).collect()
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted = ms(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&sorted, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&sorted, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&sorted, 100.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&ms(&[7]), 99.0), Some(Duration::from_millis(7)));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn figures_are_per_opened_connection() {
        let opening = Opening {
            latencies: ms(&[1, 2, 3, 4]),
            retransmitted: 1,
            failures: 1,
            first_error: Some("refused".into()),
            elapsed: Duration::from_secs(2),
        };
        let before = Snapshot {
            proxy_rss: 10_000,
            machine_tcp: 4096,
            machine_slab: Some(100_000),
            mem_available: 1_000_000,
            ..Snapshot::default()
        };
        let at_n = Snapshot {
            proxy_counted: Some(4),
            proxy_rss: 50_000,
            machine_tcp: 4096 * 3,
            machine_slab: Some(140_000),
            mem_available: 900_000,
            proxy_fds: 20,
            proxy_fd_limit: 1000,
            router_tcp_sockets: 9,
            bench_rss: 5,
        };
        let holding = Holding {
            keepalive_echoes: 8,
            keepalive_failures: 0,
            answered: 4,
            final_check: Duration::from_millis(30),
        };
        let generated = Generated {
            opening,
            at_n,
            holding,
            at_stop: Stopping {
                exit: Some(Duration::from_millis(2500)),
                server_ends: Ends {
                    resets: 3,
                    clean: 1,
                    other: 0,
                },
                server_no_end: 0,
            },
            ending: Ending {
                ends: Ends {
                    resets: 4,
                    clean: 0,
                    other: 0,
                },
                no_end: 0,
            },
        };
        let row = row(
            Case::MidwayForward,
            (5, 2),
            Duration::from_secs(60),
            &before,
            &generated,
            4,
        );
        assert_eq!((row.opened, row.failed_to_open), (4, 1));
        assert_eq!(row.user_bytes_per_connection, 10_000.0);
        assert_eq!(row.kernel_tcp_bytes_per_connection, 2048.0);
        assert_eq!(row.kernel_slab_bytes_per_connection, Some(10_000.0));
        assert_eq!(row.machine_bytes_per_connection, 25_000.0);
        assert_eq!(row.open_latency_p50_ms, Some(2.0));
        assert_eq!(row.open_latency_max_ms, Some(4.0));
        assert_eq!((row.answered_at_end, row.hold_seconds), (4, 60));
        assert_eq!(row.stop_seconds, Some(2.5));
        assert_eq!(row.proxy_counted_at_n, Some(4));
        assert_eq!((row.client_resets, row.client_clean_ends), (4, 0));
        assert_eq!((row.server_resets, row.server_clean_ends), (3, 1));
    }

    #[test]
    fn there_is_room_for_the_most_connections() {
        assert_eq!(client_sources().len(), usize::from(CLIENT_SOURCES));
        assert_eq!(proxy_max_connections(100_000, 19000), 102_100);
        assert_eq!(proxy_max_connections(1000, 19000), 19000);
    }
}
