//! `midway-bench`: what the proxy costs on a plain gateway, against routing alone and HAProxy.
//!
//! Client, router and server are network namespaces joined by veth (no emulated link). For each
//! case — `direct` (the router only routes), midway in the router (forward and transparent modes),
//! HAProxy in the router (default and with splice) — it measures:
//! - bulk throughput with iperf3 at several stream counts, as a ratio to `direct`;
//! - CPU seconds the proxy process spent per GB moved;
//! - peak kernel TCP memory during the run against the pressure threshold;
//! - connections per second (connect, one byte, close);
//! - memory per idle split connection: the proxy's user space, the kernel's socket buffers and
//!   slab objects (machine-wide; `direct` gives the end hosts' part, so the proxy's kernel share
//!   is its row minus direct's);
//! - with `--connections N`, whether the proxy holds N concurrent split connections: how fast
//!   they open, what they cost in memory and descriptors, whether all still answer after
//!   `--hold` seconds (see the `connections` module).
//!
//! Throughput varies by about ±10 % from one run to the next on a small VM, so one run cannot
//! rank two proxies whose figures are close. `--rounds N` ([`BenchOptions::rounds`]) repeats the
//! throughput part, the connection rate and the idle memory N times; each round goes through
//! every case in order (start the proxy, run every stream count, the connection rate and the
//! idle connections, stop it), so the cases are interleaved in time and slow drift of the
//! machine hits them alike. `--connections` runs in the first round only (it holds its
//! connections for minutes). Every run is kept in `bench.json` (`runs`, `connection_rate` and
//! `idle_memory`, each with its round; `connection_rate_summary` and `idle_memory_summary` give
//! the median and range per case); the summary (`throughput`,
//! and the markdown table) gives per case and stream count the median throughput with its range,
//! the median of the per-round ratio to `direct` (both from the same round), the median CPU
//! seconds per GB and the highest peak of TCP memory (see the `summary` module).
//!
//! It prints figures; it asserts nothing. Every number comes from this run.
//!
//! `midway-bench tunnel` ([`run_tunnel`]) is a second benchmark: the peer segment between two
//! midways (an edge and a gateway, each in a namespace of its own) over each peer transport
//! (`tcp`, `tls`, `quic`), with its throughput at several stream counts, both midways' CPU
//! seconds per GB split into user and system time, and the ratio of their CPU-s/GB to the `tcp`
//! transport's (see the `tunnel` module).

#![forbid(unsafe_code)]

mod configs;
mod connections;
pub mod faults;
mod netns;
mod report;
mod summary;
mod tunnel;
mod workloads;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use midway_launch::{Launch, Running};
use midway_sys::procfs::{self, machine_tcp_memory_bytes, KernelMemoryLimits};
use serde::Serialize;

use configs::{haproxy_config, midway_config};
pub use connections::{ConnectionsRow, MAX_CONNECTIONS, MAX_IN_FLIGHT};
use netns::{BenchNet, Host, ROUTER_CLIENT_SIDE, SERVER_ADDR};
pub use report::{render_markdown, render_throughput_table, write_json};
pub use summary::{Spread, ThroughputSummary};
pub use tunnel::{
    render_tunnel_markdown, run_tunnel, write_tunnel_json, MidwayCpu, Transport, TunnelOptions,
    TunnelReport, TunnelRun, TunnelSummary,
};

/// iperf3 runs at most 128 streams per process, so larger counts are spread over several
/// client/server pairs on consecutive ports.
const IPERF_BASE_PORT: u16 = 5201;
const IPERF_MAX_STREAMS_PER_PROCESS: usize = 125;
const IPERF_PROCESSES: usize = 8;
const IDLE_PORT: u16 = 6000;
const CPS_PORT: u16 = 6001;
const TRANSPARENT_PORT: u16 = 7000;
pub(crate) const METRICS_ADDR: &str = "127.0.0.1:9464";

/// What one benchmark run measures and how (the command line, parsed).
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The midway binary to benchmark (only the midway cases need it).
    pub midway_bin: PathBuf,
    /// Parallel stream counts of the throughput runs, one run per count and case.
    pub streams: Vec<usize>,
    /// Length of each throughput run, seconds.
    pub seconds: u32,
    /// How many times the throughput part runs (at least 1); see the module documentation.
    pub rounds: u32,
    /// Idle split connections opened for the memory figure (0 skips it).
    pub idle_connections: usize,
    /// Length of the connection-rate run, seconds.
    pub cps_seconds: u32,
    /// Concurrent split connections opened and held through each proxy (0 skips it); at most
    /// [`MAX_CONNECTIONS`].
    pub connections: usize,
    /// How long those connections are held before each must answer once more, seconds.
    pub hold_seconds: u32,
    /// Of those, how many are being opened at once at most (1 to [`MAX_IN_FLIGHT`]).
    pub connections_in_flight: usize,
    /// Cases to measure, in the order they run within a round.
    pub cases: Vec<Case>,
    /// Folder for generated configs, logs and `bench.json`.
    pub work_dir: PathBuf,
    /// TOML lines added to the `[proxy]` table of midway's generated config (e.g. `max_pipes = 0`).
    pub midway_proxy_extra: Vec<String>,
    /// TOML lines added to every `[[listeners]]` table of midway's generated config (e.g.
    /// `buffer_bytes = 65536`), to compare settings in one command.
    pub midway_listener_extra: Vec<String>,
    /// Largest send buffer the clients' autotuning may grow to (`tcp_wmem` max in the client
    /// namespace); `None` leaves the kernel's default.
    pub client_wmem_max: Option<u32>,
    /// Nice value the proxy under test starts with (all its threads inherit it).
    pub proxy_nice: i32,
    /// Threads of the proxy under test (midway `worker_threads`, HAProxy `nbthread`); `None`:
    /// their defaults.
    pub proxy_threads: Option<u16>,
    /// TCP profile of both segments of every midway listener (a preset or a profile defined
    /// with `midway_proxy_extra`).
    pub midway_profile: String,
    /// Congestion control of the client's and server's sockets (a `congctl` route metric in
    /// their namespaces); `None` keeps the machine's (new namespaces inherit it).
    pub end_congestion_control: Option<String>,
    /// Congestion control of the router's sockets (a `congctl` route metric), which every proxy
    /// socket whose configuration does not choose one gets (HAProxy's always); `None` keeps the
    /// machine's.
    pub router_congestion_control: Option<String>,
    /// Give the router's own routes the `quickack` metric (HAProxy's sockets then ACK at once).
    pub router_quickack: bool,
}

/// What sits in the router during a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Case {
    /// No proxy: the router only routes (the baseline).
    Direct,
    /// midway in the router, clients connecting to a forward listener.
    MidwayForward,
    /// midway in the router intercepting routed connections (nftables TPROXY).
    MidwayTransparent,
    /// HAProxy in the router in TCP mode, default settings.
    Haproxy,
    /// HAProxy in the router in TCP mode with kernel splicing on.
    HaproxySplice,
}

impl Case {
    /// The case's name on the command line and in reports (`midway-forward`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Case::Direct => "direct",
            Case::MidwayForward => "midway-forward",
            Case::MidwayTransparent => "midway-transparent",
            Case::Haproxy => "haproxy",
            Case::HaproxySplice => "haproxy-splice",
        }
    }

    /// Whether the proxy under test is midway.
    pub fn is_midway(self) -> bool {
        matches!(self, Case::MidwayForward | Case::MidwayTransparent)
    }

    /// Where a client connects to reach `port` on the server in this case.
    fn connect_addr(self) -> Ipv4Addr {
        match self {
            Case::Direct | Case::MidwayTransparent => SERVER_ADDR,
            Case::MidwayForward | Case::Haproxy | Case::HaproxySplice => ROUTER_CLIENT_SIDE,
        }
    }
}

/// One throughput run: one case at one stream count in one round.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThroughputRun {
    /// 1 for the first round.
    pub round: u32,
    /// Name of the case ([`Case::name`]).
    pub case: &'static str,
    /// Parallel iperf3 streams.
    pub streams: usize,
    /// Throughput of all streams together as iperf3 reports it, bits per second.
    pub bits_per_second: f64,
    /// Against `direct` at the same stream count in the same round.
    pub ratio_to_direct: Option<f64>,
    /// Bytes all streams moved.
    pub bytes: u64,
    /// CPU seconds (user + system) the proxy process spent during the run; `None` for `direct`.
    pub proxy_cpu_seconds: Option<f64>,
    /// `proxy_cpu_seconds` per 10^9 bytes moved.
    pub proxy_cpu_seconds_per_gb: Option<f64>,
    /// Busy CPU time of the whole machine (client, server, router and proxy) per GB moved: with
    /// every CPU saturated, throughput is the CPU count divided by this.
    pub machine_cpu_seconds_per_gb: Option<f64>,
    /// Highest kernel TCP memory (all sockets of the machine) sampled during the run, bytes.
    pub peak_tcp_memory_bytes: u64,
    /// The kernel's TCP memory pressure threshold (`tcp_mem[1]`), bytes.
    pub tcp_memory_pressure_bytes: u64,
    /// Why the run failed, if it did (its figures are then zero or `None`).
    pub error: Option<String>,
}

/// Connection rate of one case (connect, one byte, close) in one round.
#[derive(Debug, Serialize)]
pub struct ConnectionRateRow {
    /// Name of the case ([`Case::name`]).
    pub case: &'static str,
    /// 1 for the first round.
    pub round: u32,
    /// Connections completed per second.
    pub connections_per_second: f64,
    /// Connections that failed during the run.
    pub failures: u64,
    /// The proxy's CPU time (user and system, its own threads) per completed connection, in
    /// microseconds; `None` without a proxy. On a machine whose cores the client, the server
    /// and the proxy share, a proxy that spends more per connection leaves less for the others,
    /// so this says why one rate is below another.
    pub proxy_cpu_us_per_connection: Option<f64>,
    /// The whole machine's busy time (every process and the kernel's network processing) per
    /// completed connection, in microseconds.
    pub machine_cpu_us_per_connection: f64,
}

/// Memory one idle split connection costs in one case in one round (`direct`: the end hosts'
/// kernel memory alone, the baseline a proxy's kernel share is read against).
#[derive(Debug, Serialize)]
pub struct IdleMemoryRow {
    /// Name of the case ([`Case::name`]).
    pub case: &'static str,
    /// 1 for the first round.
    pub round: u32,
    /// Idle split connections held open for the measurement.
    pub connections: usize,
    /// Resident memory of the proxy process before they were opened, bytes (`None`: direct).
    pub proxy_rss_before_bytes: Option<u64>,
    /// Resident memory of the proxy process with them open, bytes.
    pub proxy_rss_after_bytes: Option<u64>,
    /// Growth of the proxy's resident memory per connection, bytes.
    pub user_bytes_per_connection: Option<f64>,
    /// Growth of the machine's kernel TCP memory (socket buffers) per connection, bytes.
    pub kernel_tcp_bytes_per_connection: f64,
    /// Growth of the kernel's slab objects in use per connection, machine-wide (the structures
    /// of every socket of the connection, the proxy's and the end hosts', with their files and
    /// epoll registrations; without the /proc inodes and dentries that something listing the
    /// processes' descriptors makes, [`procfs::SlabUsage::without_proc_lookups`]), bytes;
    /// `None` where `/proc/slabinfo` cannot be read.
    pub kernel_slab_bytes_per_connection: Option<f64>,
    /// The slab caches that grew most, per connection, /proc's own included: where those bytes
    /// went.
    pub kernel_slab_caches: Vec<SlabGrowth>,
}

/// One slab cache's growth per connection.
#[derive(Debug, Clone, Serialize)]
pub struct SlabGrowth {
    /// The cache's name in `/proc/slabinfo`.
    pub cache: String,
    /// Bytes per connection.
    pub bytes_per_connection: f64,
}

/// The caches an idle row lists: the largest growths, down to a few bytes per connection.
const SLAB_CACHES_LISTED: usize = 8;

/// Each cache's growth per connection from `before` to `after`, largest first, the first
/// [`SLAB_CACHES_LISTED`] that grew by at least 8 bytes per connection.
fn slab_growth(
    before: &procfs::SlabUsage,
    after: &procfs::SlabUsage,
    count: usize,
) -> Vec<SlabGrowth> {
    after
        .growth_since(before)
        .into_iter()
        .map(|(cache, bytes)| SlabGrowth {
            cache,
            bytes_per_connection: bytes as f64 / count as f64,
        })
        .filter(|growth| growth.bytes_per_connection >= 8.0)
        .take(SLAB_CACHES_LISTED)
        .collect()
}

/// Everything one benchmark run measured, as written to `bench.json`.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    /// Kernel release the benchmark ran on (the sysctl `kernel.osrelease`).
    pub kernel: String,
    /// CPUs available to the benchmark.
    pub cpus: usize,
    /// Length of each throughput run, seconds.
    pub seconds_per_run: u32,
    /// Rounds of the throughput part.
    pub rounds: u32,
    /// Nice value of the proxy under test.
    pub proxy_nice: i32,
    /// `tcp_wmem` max of the clients, when capped.
    pub client_wmem_max: Option<u32>,
    /// Threads of the proxy under test, when set.
    pub proxy_threads: Option<u16>,
    /// midway's TCP profile on both segments.
    pub midway_profile: String,
    /// Congestion control the end hosts' sockets start with (client and server namespaces).
    pub end_congestion_control: String,
    /// Congestion control the router's sockets start with (HAProxy's get it).
    pub router_congestion_control: String,
    /// The router's routes carry `quickack 1`.
    pub router_quickack: bool,
    /// Per case and stream count, over all rounds.
    pub throughput: Vec<ThroughputSummary>,
    /// Every throughput run, in the order they ran.
    pub runs: Vec<ThroughputRun>,
    /// Connection rate per case and round.
    pub connection_rate: Vec<ConnectionRateRow>,
    /// Connections per second per case over the rounds.
    pub connection_rate_summary: Vec<summary::CaseSpread>,
    /// Memory per idle connection per case and round.
    pub idle_memory: Vec<IdleMemoryRow>,
    /// Proxy user-space bytes per idle connection per case over the rounds.
    pub idle_memory_summary: Vec<summary::CaseSpread>,
    /// Many concurrent connections per proxy case (`--connections`).
    pub connections: Vec<ConnectionsRow>,
}

/// A proxy running in the router for one case; stopped when dropped.
struct RunningProxy {
    pid: u32,
    process: Running,
}

/// How long a stopping proxy gets to drain after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// How long a proxy may take to come up.
const START_LIMIT: Duration = Duration::from_secs(10);

/// Runs the benchmark: builds the namespaces, measures every case, removes them. Needs root.
pub fn run(options: &BenchOptions) -> anyhow::Result<BenchReport> {
    if options.rounds == 0 {
        bail!("rounds must be at least 1");
    }
    if !nix::unistd::Uid::effective().is_root() {
        bail!("midway-bench needs root: it creates network namespaces");
    }
    if options.connections > MAX_CONNECTIONS {
        bail!(
            "--connections takes at most {MAX_CONNECTIONS}, not {}",
            options.connections
        );
    }
    raise_fd_limit(connections::files_needed(options.connections))?;
    netns::install_cleanup_on_signal()?;
    std::fs::create_dir_all(&options.work_dir)?;
    let mut net = BenchNet::build().context("cannot build the benchmark network")?;
    if let Some(max) = options.client_wmem_max {
        net.cap_client_send_buffers(max)?;
    }
    if let Some(name) = &options.end_congestion_control {
        net.set_congestion_control(Host::Client, name)?;
        net.set_congestion_control(Host::Server, name)?;
    }
    if let Some(name) = &options.router_congestion_control {
        net.set_congestion_control(Host::Router, name)?;
    }
    if options.router_quickack {
        net.router_quick_acks()?;
    }
    if options.connections > 0 {
        connections::prepare(&net)?;
    }
    start_iperf_servers(&mut net)?;
    let cps_server =
        workloads::start_close_server(&net, SocketAddr::from((SERVER_ADDR, CPS_PORT)))?;

    let mut report = BenchReport {
        kernel: midway_sys::sysctl::read("kernel.osrelease").unwrap_or_default(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        seconds_per_run: options.seconds,
        rounds: options.rounds,
        proxy_nice: options.proxy_nice,
        client_wmem_max: options.client_wmem_max,
        proxy_threads: options.proxy_threads,
        midway_profile: options.midway_profile.clone(),
        end_congestion_control: net.congestion_control(Host::Client)?,
        router_congestion_control: net.congestion_control(Host::Router)?,
        router_quickack: options.router_quickack,
        throughput: Vec::new(),
        runs: Vec::new(),
        connection_rate: Vec::new(),
        connection_rate_summary: Vec::new(),
        idle_memory: Vec::new(),
        idle_memory_summary: Vec::new(),
        connections: Vec::new(),
    };

    for round in 1..=options.rounds {
        let first_round = round == 1;
        for &case in &options.cases {
            if options.rounds > 1 {
                eprintln!("== round {round}/{}: {}", options.rounds, case.name());
            } else {
                eprintln!("== {}", case.name());
            }
            run_case(&mut net, case, round, first_round, options, &mut report);
        }
    }
    cps_server.stop();
    summary::fill_ratios_within_rounds(&mut report.runs);
    report.throughput = summary::summarize(&report.runs);
    report.connection_rate_summary = summary::spread_by_case(
        &report.connection_rate,
        |r| r.case,
        |r| Some(r.connections_per_second),
    );
    report.idle_memory_summary = summary::spread_by_case(
        &report.idle_memory,
        |r| r.case,
        |r| r.user_bytes_per_connection,
    );
    Ok(report)
}

/// One case in one round: start its proxy, run every stream count, the connection rate and idle
/// memory, in the first round also `--connections`, then stop the proxy. Failures are recorded, not returned,
/// so one broken case does not end the bench.
fn run_case(
    net: &mut BenchNet,
    case: Case,
    round: u32,
    first_round: bool,
    options: &BenchOptions,
    report: &mut BenchReport,
) {
    let proxy = match start_proxy(net, case, options) {
        Ok(proxy) => proxy,
        Err(error) => {
            eprintln!("   cannot start: {error:#}");
            for &streams in &options.streams {
                report.runs.push(failed_run(round, case, streams, &error));
            }
            return;
        }
    };
    for &streams in &options.streams {
        eprintln!("   {streams} stream(s)");
        let run = measure_throughput(net, case, proxy.as_ref(), round, streams, options.seconds)
            .unwrap_or_else(|error| failed_run(round, case, streams, &error));
        report.runs.push(run);
    }
    match measure_connection_rate(net, case, proxy.as_ref(), round, options.cps_seconds) {
        Ok(row) => report.connection_rate.push(row),
        Err(error) => eprintln!("   connection rate failed: {error:#}"),
    }
    if options.idle_connections > 0 {
        match measure_idle(net, case, proxy.as_ref(), round, options.idle_connections) {
            Ok(row) => report.idle_memory.push(row),
            Err(error) => eprintln!("   idle memory failed: {error:#}"),
        }
    }
    if let Some(proxy) = proxy {
        if first_round && options.connections > 0 {
            eprintln!(
                "   {} connections, held {} s",
                options.connections, options.hold_seconds
            );
            match connections::measure(net, case, proxy.pid, options) {
                Ok(row) => report.connections.push(row),
                Err(error) => eprintln!("   connections failed: {error:#}"),
            }
        }
        // However it ended, it is gone; the nftables check below says whether it cleaned up.
        let _ = proxy.process.stop();
    }
    if case == Case::MidwayTransparent {
        // midway removes its nftables table when it stops; make sure before the next case.
        let tables = net
            .run(Host::Router, "nft", &["list", "tables"])
            .unwrap_or_default();
        if tables.contains("midway") {
            eprintln!("   warning: midway's nftables table is still present after stop");
        }
    }
}

fn failed_run(round: u32, case: Case, streams: usize, error: &anyhow::Error) -> ThroughputRun {
    ThroughputRun {
        round,
        case: case.name(),
        streams,
        bits_per_second: 0.0,
        ratio_to_direct: None,
        bytes: 0,
        proxy_cpu_seconds: None,
        proxy_cpu_seconds_per_gb: None,
        machine_cpu_seconds_per_gb: None,
        peak_tcp_memory_bytes: 0,
        tcp_memory_pressure_bytes: 0,
        error: Some(format!("{error:#}")),
    }
}

/// Raises the bench's open-file limit (which the proxies and iperf3 inherit) as far as the host
/// allows (midway-sys: the hard limit, or `fs.nr_open` with CAP_SYS_RESOURCE), and says so when
/// that is below what `needed` asks for.
fn raise_fd_limit(needed: u64) -> anyhow::Result<()> {
    let limit = midway_sys::fd_limit::raise_open_file_limit()?;
    if limit.soft < needed {
        bail!(
            "--connections needs {needed} open files in the bench and in the proxy (two per \
             connection and a reserve); the limit could be raised to {} only (hard limit {}; \
             no CAP_SYS_RESOURCE?)",
            limit.soft,
            limit.hard
        );
    }
    Ok(())
}

fn start_iperf_servers(net: &mut BenchNet) -> anyhow::Result<()> {
    for i in 0..IPERF_PROCESSES {
        let port = (IPERF_BASE_PORT + i as u16).to_string();
        net.spawn(Host::Server, "iperf3", &["-s", "-p", &port], None)?;
    }
    // Ready when every port accepts.
    for i in 0..IPERF_PROCESSES {
        workloads::wait_until_accepting(
            net,
            SocketAddr::from((SERVER_ADDR, IPERF_BASE_PORT + i as u16)),
            Duration::from_secs(5),
        )?;
    }
    Ok(())
}

fn all_ports() -> Vec<u16> {
    let mut ports: Vec<u16> = (0..IPERF_PROCESSES)
        .map(|i| IPERF_BASE_PORT + i as u16)
        .collect();
    ports.extend([IDLE_PORT, CPS_PORT]);
    ports.extend(connections::CONNECTION_PORTS);
    ports
}

fn start_proxy(
    net: &mut BenchNet,
    case: Case,
    options: &BenchOptions,
) -> anyhow::Result<Option<RunningProxy>> {
    let (launch, config_path) = match case {
        Case::Direct => return Ok(None),
        Case::MidwayForward | Case::MidwayTransparent => {
            let path = options.work_dir.join(format!("{}.toml", case.name()));
            std::fs::write(
                &path,
                midway_config(case, net.iface(Host::Router, Host::Client), options)?,
            )?;
            (Launch::midway(&options.midway_bin, &path), path)
        }
        Case::Haproxy | Case::HaproxySplice => {
            let path = options.work_dir.join(format!("{}.cfg", case.name()));
            std::fs::write(
                &path,
                haproxy_config(
                    case == Case::HaproxySplice,
                    options.proxy_threads,
                    options.connections,
                ),
            )?;
            let launch = Launch::program("haproxy").args(["-db", "-f"]).arg(&path);
            (launch, path)
        }
    };
    let mut process = launch
        .nice(options.proxy_nice)
        .log_file(config_path.with_extension("log"))
        .stop_grace(STOP_GRACE)
        .spawn(net.place(Host::Router))?;
    let probe = SocketAddr::from((case.connect_addr(), CPS_PORT));
    // In transparent mode the probe's address answers even before midway is up (the router just
    // routes), so wait for midway's nftables table first; a connection that started before the
    // table existed would later be diverted mid-stream and reset.
    let ready = if case == Case::MidwayTransparent {
        process
            .wait_until(
                START_LIMIT,
                Duration::from_millis(50),
                "nftables table",
                || {
                    Ok::<_, anyhow::Error>(
                        net.run(Host::Router, "nft", &["list", "table", "inet", "midway"])
                            .is_ok(),
                    )
                },
            )
            .map_err(anyhow::Error::from)
    } else {
        Ok(())
    };
    if let Err(error) =
        ready.and_then(|()| workloads::wait_until_accepting(net, probe, START_LIMIT))
    {
        let log = process.log_tail();
        drop(process);
        bail!("{} did not come up: {error:#}\n{log}", case.name());
    }
    Ok(Some(RunningProxy {
        pid: process.id(),
        process,
    }))
}

/// The connection rate through `case` for `seconds`, with the CPU time each connection cost.
fn measure_connection_rate(
    net: &BenchNet,
    case: Case,
    proxy: Option<&RunningProxy>,
    round: u32,
    seconds: u32,
) -> anyhow::Result<ConnectionRateRow> {
    let cpu_before = proxy.map(|p| procfs::cpu_seconds(p.pid)).transpose()?;
    let machine_before = procfs::machine_busy_seconds()?;
    let run = workloads::connection_rate(
        net,
        SocketAddr::from((case.connect_addr(), CPS_PORT)),
        Duration::from_secs(seconds.into()),
    )?;
    let machine_cpu = procfs::machine_busy_seconds()? - machine_before;
    let proxy_cpu = match (proxy, cpu_before) {
        (Some(p), Some(before)) => Some(procfs::cpu_seconds(p.pid)? - before),
        _ => None,
    };
    let per_connection = |cpu: f64| cpu * 1e6 / (run.completed.max(1) as f64);
    Ok(ConnectionRateRow {
        case: case.name(),
        round,
        connections_per_second: run.completed as f64 / run.seconds,
        failures: run.failed,
        proxy_cpu_us_per_connection: proxy_cpu.map(per_connection),
        machine_cpu_us_per_connection: per_connection(machine_cpu),
    })
}

fn measure_throughput(
    net: &BenchNet,
    case: Case,
    proxy: Option<&RunningProxy>,
    round: u32,
    streams: usize,
    seconds: u32,
) -> anyhow::Result<ThroughputRun> {
    let cpu_before = proxy.map(|p| procfs::cpu_seconds(p.pid)).transpose()?;
    let sampler = workloads::TcpMemorySampler::start(Duration::from_millis(250));
    let machine_before = procfs::machine_busy_seconds()?;
    let started = Instant::now();
    let (bits_per_second, bytes) = iperf_load(net, case.connect_addr(), streams, seconds)?;
    let machine_cpu = procfs::machine_busy_seconds()? - machine_before;
    let peak_tcp_bytes = sampler.stop();
    let cpu = match (proxy, cpu_before) {
        (Some(p), Some(before)) => Some(procfs::cpu_seconds(p.pid)? - before),
        _ => None,
    };
    let pressure_bytes = KernelMemoryLimits::read()?.pressure_bytes;
    eprintln!(
        "      {:.2} Gbit/s in {:.1} s",
        bits_per_second / 1e9,
        started.elapsed().as_secs_f64()
    );
    Ok(ThroughputRun {
        round,
        case: case.name(),
        streams,
        bits_per_second,
        ratio_to_direct: None,
        bytes,
        proxy_cpu_seconds: cpu,
        proxy_cpu_seconds_per_gb: cpu.map(|c| c / (bytes as f64 / 1e9).max(1e-9)),
        machine_cpu_seconds_per_gb: Some(machine_cpu / (bytes as f64 / 1e9).max(1e-9)),
        peak_tcp_memory_bytes: peak_tcp_bytes,
        tcp_memory_pressure_bytes: pressure_bytes,
        error: None,
    })
}

/// Runs iperf3 clients in the client host towards `addr` (ports from [`IPERF_BASE_PORT`]) with
/// `streams` parallel streams in all for `seconds`, spread over as many processes as
/// [`IPERF_MAX_STREAMS_PER_PROCESS`] needs; the throughput of all streams together as the
/// servers received it (bit/s) and the bytes they received.
fn iperf_load(
    net: &BenchNet,
    addr: Ipv4Addr,
    streams: usize,
    seconds: u32,
) -> anyhow::Result<(f64, u64)> {
    let processes = streams
        .div_ceil(IPERF_MAX_STREAMS_PER_PROCESS)
        .clamp(1, IPERF_PROCESSES);
    let mut children = Vec::new();
    for i in 0..processes {
        let share = streams / processes + usize::from(i < streams % processes);
        let port = (IPERF_BASE_PORT + i as u16).to_string();
        let args = [
            "-c".to_string(),
            addr.to_string(),
            "-p".into(),
            port,
            "-P".into(),
            share.to_string(),
            "-t".into(),
            seconds.to_string(),
            "-J".into(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = net.start_piped(Host::Client, "iperf3", &args)?;
        children.push(child);
    }
    let mut bits_per_second = 0.0;
    let mut bytes = 0;
    for child in children {
        let output = child.wait_with_output()?;
        let (bps, b) = workloads::parse_iperf_json(&output.stdout).with_context(|| {
            let stderr = String::from_utf8_lossy(&output.stderr);
            format!(
                "iperf3 client to {addr} ({}): {}",
                output.status,
                stderr.trim()
            )
        })?;
        bits_per_second += bps;
        bytes += b;
    }
    Ok((bits_per_second, bytes))
}

/// How long the idle connections stay quiet before the proxy's size is read.
const IDLE_SETTLE: Duration = Duration::from_secs(2);

fn measure_idle(
    net: &BenchNet,
    case: Case,
    proxy: Option<&RunningProxy>,
    round: u32,
    count: usize,
) -> anyhow::Result<IdleMemoryRow> {
    let rss = || proxy.map(|p| procfs::rss_bytes(p.pid)).transpose();
    let rss_before = rss()?;
    let tcp_before = machine_tcp_memory_bytes()?;
    let slab_before = procfs::slab_in_use().ok();
    let holder = workloads::hold_idle_connections(
        net,
        SocketAddr::from((SERVER_ADDR, IDLE_PORT)),
        SocketAddr::from((case.connect_addr(), IDLE_PORT)),
        count,
        Duration::from_secs(60),
    )?;
    // Idle means quiet for a while, not just opened: midway frees a connection's relay state
    // after a second without a byte (its `PARK_AFTER`), HAProxy needs no time. 2 s after the
    // last connection reached the server every connection has been quiet that long; the
    // allocator has settled after the burst of accepts too.
    std::thread::sleep(IDLE_SETTLE);
    let rss_after = rss()?;
    let tcp_after = machine_tcp_memory_bytes()?;
    let slab_after = procfs::slab_in_use().ok();
    drop(holder);
    let per_connection = |grew: f64| grew / count as f64;
    let slab = slab_before.zip(slab_after);
    Ok(IdleMemoryRow {
        case: case.name(),
        round,
        connections: count,
        proxy_rss_before_bytes: rss_before,
        proxy_rss_after_bytes: rss_after,
        user_bytes_per_connection: rss_before
            .zip(rss_after)
            .map(|(before, after)| per_connection(after.saturating_sub(before) as f64)),
        kernel_tcp_bytes_per_connection: per_connection(tcp_after.saturating_sub(tcp_before) as f64),
        kernel_slab_bytes_per_connection: slab.as_ref().map(|(before, after)| {
            per_connection(
                after.without_proc_lookups() as f64 - before.without_proc_lookups() as f64,
            )
        }),
        kernel_slab_caches: slab.map_or_else(Vec::new, |(before, after)| {
            slab_growth(&before, &after, count)
        }),
    })
}
