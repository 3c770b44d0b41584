//! `midway-bench`: what the proxy costs on a plain gateway, against routing alone and HAProxy.
//!
//! Client, router and server are network namespaces joined by veth (no emulated link). For each
//! case — `direct` (the router only routes), midway in the router (forward and transparent modes),
//! HAProxy in the router (default and with splice) — it measures:
//! - bulk throughput with iperf3 at several stream counts, as a ratio to `direct`;
//! - CPU seconds the proxy process spent per GB moved;
//! - peak kernel TCP memory during the run against the pressure threshold;
//! - connections per second (connect, one byte, close);
//! - user-space memory of the proxy per idle split connection, and kernel TCP memory.
//!
//! Throughput varies by about ±10 % from one run to the next on a small VM, so one run cannot
//! rank two proxies whose figures are close. `--rounds N` ([`BenchOptions::rounds`]) repeats the
//! throughput part N times; each round goes through every case in order (start the proxy, run
//! every stream count, stop it), so the cases are interleaved in time and slow drift of the
//! machine hits them alike. The connection rate and idle memory are measured in the first round
//! only. Every run is kept in `bench.json` (`runs`, with its round); the summary (`throughput`,
//! and the markdown table) gives per case and stream count the median throughput with its range,
//! the median of the per-round ratio to `direct` (both from the same round), the median CPU
//! seconds per GB and the highest peak of TCP memory (see the `summary` module).
//!
//! It prints figures; it asserts nothing. Every number comes from this run.

mod netns;
mod summary;
mod workloads;

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use midway_config::haproxy::{HaproxyConfig, ListenSection};
use midway_config::{overlay, ConfigBuilder, ListenerBuilder, RelayName};
use midway_sys::procfs::{self, machine_tcp_memory_bytes, KernelMemoryLimits};
use serde::Serialize;

use netns::{BenchNet, Host, CLIENT_PREFIX, ROUTER_CLIENT_SIDE, SERVER_ADDR};
pub use summary::{Spread, ThroughputSummary};

/// iperf3 runs at most 128 streams per process, so larger counts are spread over several
/// client/server pairs on consecutive ports.
const IPERF_BASE_PORT: u16 = 5201;
const IPERF_MAX_STREAMS_PER_PROCESS: usize = 125;
const IPERF_PROCESSES: usize = 8;
const IDLE_PORT: u16 = 6000;
const CPS_PORT: u16 = 6001;
const TRANSPARENT_PORT: u16 = 7000;
const METRICS_ADDR: &str = "127.0.0.1:9464";

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

/// Connection rate of one case (connect, one byte, close), first round only.
#[derive(Debug, Serialize)]
pub struct ConnectionRateRow {
    /// Name of the case ([`Case::name`]).
    pub case: &'static str,
    /// Connections completed per second.
    pub connections_per_second: f64,
    /// Connections that failed during the run.
    pub failures: u64,
}

/// Memory one idle split connection costs in one case, first round only.
#[derive(Debug, Serialize)]
pub struct IdleMemoryRow {
    /// Name of the case ([`Case::name`]).
    pub case: &'static str,
    /// Idle split connections held open for the measurement.
    pub connections: usize,
    /// Resident memory of the proxy process before they were opened, bytes.
    pub proxy_rss_before_bytes: u64,
    /// Resident memory of the proxy process with them open, bytes.
    pub proxy_rss_after_bytes: u64,
    /// Growth of the proxy's resident memory per connection, bytes.
    pub user_bytes_per_connection: f64,
    /// Growth of the machine's kernel TCP memory per connection, bytes.
    pub kernel_tcp_bytes_per_connection: f64,
}

/// Everything one benchmark run measured, as written to `bench.json`.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    /// Kernel release the benchmark ran on (`/proc/sys/kernel/osrelease`).
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
    /// Connection rate per case.
    pub connection_rate: Vec<ConnectionRateRow>,
    /// Memory per idle connection per case.
    pub idle_memory: Vec<IdleMemoryRow>,
}

/// A proxy running in the router for one case, stopped when dropped out of the net.
struct RunningProxy {
    pid: u32,
}

/// Runs the benchmark: builds the namespaces, measures every case, removes them. Needs root.
pub fn run(options: &BenchOptions) -> anyhow::Result<BenchReport> {
    if options.rounds == 0 {
        bail!("rounds must be at least 1");
    }
    if !nix::unistd::Uid::effective().is_root() {
        bail!("midway-bench needs root: it creates network namespaces");
    }
    raise_fd_limit()?;
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
    start_iperf_servers(&mut net)?;
    let cps_server =
        workloads::start_close_server(&net, SocketAddr::from((SERVER_ADDR, CPS_PORT)))?;

    let mut report = BenchReport {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
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
        idle_memory: Vec::new(),
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
    Ok(report)
}

/// One case in one round: start its proxy, run every stream count, and in the first round also
/// the connection rate and idle memory, then stop the proxy. Failures are recorded, not returned,
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
    if first_round {
        match workloads::connection_rate(
            net,
            SocketAddr::from((case.connect_addr(), CPS_PORT)),
            Duration::from_secs(options.cps_seconds.into()),
        ) {
            Ok((rate, failures)) => report.connection_rate.push(ConnectionRateRow {
                case: case.name(),
                connections_per_second: rate,
                failures,
            }),
            Err(error) => eprintln!("   connection rate failed: {error:#}"),
        }
    }
    if let Some(proxy) = &proxy {
        if first_round && options.idle_connections > 0 {
            match measure_idle(net, case, proxy, options.idle_connections) {
                Ok(row) => report.idle_memory.push(row),
                Err(error) => eprintln!("   idle memory failed: {error:#}"),
            }
        }
        net.stop(proxy.pid);
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

fn raise_fd_limit() -> anyhow::Result<()> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
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
    ports
}

fn start_proxy(
    net: &mut BenchNet,
    case: Case,
    options: &BenchOptions,
) -> anyhow::Result<Option<RunningProxy>> {
    let (program, args, config_path): (String, Vec<String>, PathBuf) = match case {
        Case::Direct => return Ok(None),
        Case::MidwayForward | Case::MidwayTransparent => {
            let path = options.work_dir.join(format!("{}.toml", case.name()));
            std::fs::write(
                &path,
                midway_config(case, net.iface(Host::Router, Host::Client), options)?,
            )?;
            (
                options.midway_bin.display().to_string(),
                vec![
                    "proxy".into(),
                    "--config".into(),
                    path.display().to_string(),
                ],
                path,
            )
        }
        Case::Haproxy | Case::HaproxySplice => {
            let path = options.work_dir.join(format!("{}.cfg", case.name()));
            std::fs::write(
                &path,
                haproxy_config(case == Case::HaproxySplice, options.proxy_threads),
            )?;
            (
                "haproxy".into(),
                vec!["-db".into(), "-f".into(), path.display().to_string()],
                path,
            )
        }
    };
    // Through nice(1), which execs the proxy: its pid stays the one we are given, and every
    // thread it starts inherits the priority.
    let nice = options.proxy_nice.to_string();
    let args: Vec<&str> = ["-n", nice.as_str(), program.as_str()]
        .into_iter()
        .chain(args.iter().map(String::as_str))
        .collect();
    let log = std::fs::File::create(config_path.with_extension("log"))?;
    let pid = net.spawn(Host::Router, "nice", &args, Some(log))?;
    let probe = SocketAddr::from((case.connect_addr(), CPS_PORT));
    // In transparent mode the probe's address answers even before midway is up (the router just
    // routes), so wait for midway's nftables table first; a connection that started before the
    // table existed would later be diverted mid-stream and reset.
    let ready = if case == Case::MidwayTransparent {
        wait_for_nft_table(net, Duration::from_secs(10))
    } else {
        Ok(())
    };
    if let Err(error) =
        ready.and_then(|()| workloads::wait_until_accepting(net, probe, Duration::from_secs(10)))
    {
        net.stop(pid);
        let log = std::fs::read_to_string(config_path.with_extension("log")).unwrap_or_default();
        bail!("{} did not come up: {error:#}\n{log}", case.name());
    }
    Ok(Some(RunningProxy { pid }))
}

fn wait_for_nft_table(net: &BenchNet, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while net
        .run(Host::Router, "nft", &["list", "table", "inet", "midway"])
        .is_err()
    {
        if Instant::now() > deadline {
            bail!("midway's nftables table did not appear within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// midway's config for a case: one forward listener per port, or one transparent listener for
/// all of them, with the profile under test on both segments; then the `--midway-proxy-extra`
/// lines (TOML in the `[proxy]` table, where a table header may open another table such as
/// `[profiles.NAME]`) and the `--midway-listener-extra` lines (TOML in each listener) on top.
fn midway_config(case: Case, client_iface: &str, options: &BenchOptions) -> anyhow::Result<String> {
    let profile = options.midway_profile.as_str();
    let with_profile = |listener: ListenerBuilder| {
        listener
            .relay(RelayName::Buffer)
            .local_profile(profile)
            .remote_profile(profile)
            .build()
    };
    let mut config = ConfigBuilder::new([CLIENT_PREFIX])
        .max_connections(19000, 19000)
        .timeouts(
            Duration::from_secs(5),
            Duration::from_secs(600),
            Duration::from_secs(2),
        )
        .metrics(METRICS_ADDR.parse().expect("a valid socket address"));
    if let Some(threads) = options.proxy_threads {
        config = config.worker_threads(usize::from(threads));
    }
    match case {
        Case::MidwayForward => {
            for port in all_ports() {
                config = config.listener(with_profile(ListenerBuilder::forward(
                    format!("p{port}"),
                    SocketAddr::from((ROUTER_CLIENT_SIDE, port)),
                    SocketAddr::from((SERVER_ADDR, port)),
                )));
            }
        }
        Case::MidwayTransparent => {
            config = config.listener(with_profile(ListenerBuilder::transparent(
                "tproxy",
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, TRANSPARENT_PORT)),
                [client_iface.to_string()],
                all_ports(),
            )));
        }
        _ => bail!("only midway cases have a midway config"),
    }
    let mut table = config.build().to_table()?;
    let proxy_extra: toml::Table = format!("[proxy]\n{}", options.midway_proxy_extra.join("\n"))
        .parse()
        .context("--midway-proxy-extra is not TOML")?;
    overlay(&mut table, &proxy_extra, "")?;
    let listener_extra: toml::Table = options
        .midway_listener_extra
        .join("\n")
        .parse()
        .context("--midway-listener-extra is not TOML")?;
    if let Some(toml::Value::Array(listeners)) = table.get_mut("listeners") {
        for listener in listeners.iter_mut() {
            if let toml::Value::Table(listener) = listener {
                overlay(listener, &listener_extra, "listeners")?;
            }
        }
    }
    Ok(toml::to_string(&table)?)
}

/// HAProxy in TCP mode with one `listen` section per port. maxconn and maxpipes leave room under
/// the 20000 open-file limit: two descriptors per proxied connection and two per splice pipe; a
/// section accepts 2000 connections unless told otherwise, and the idle test needs more.
fn haproxy_config(splice: bool, threads: Option<u16>) -> String {
    let mut config = HaproxyConfig::tcp(9000, Duration::from_secs(5), Duration::from_secs(600));
    config.threads = threads;
    config.max_pipes = Some(512);
    config.max_connections_per_section = Some(9000);
    config.splice = splice;
    config.sections = all_ports()
        .into_iter()
        .map(|port| ListenSection {
            name: format!("p{port}"),
            bind: SocketAddr::from((ROUTER_CLIENT_SIDE, port)),
            server_name: "s".into(),
            server: SocketAddr::from((SERVER_ADDR, port)),
        })
        .collect();
    config.to_string()
}

fn measure_throughput(
    net: &BenchNet,
    case: Case,
    proxy: Option<&RunningProxy>,
    round: u32,
    streams: usize,
    seconds: u32,
) -> anyhow::Result<ThroughputRun> {
    let processes = streams
        .div_ceil(IPERF_MAX_STREAMS_PER_PROCESS)
        .clamp(1, IPERF_PROCESSES);
    let cpu_before = proxy.map(|p| procfs::cpu_seconds(p.pid)).transpose()?;
    let sampler = workloads::TcpMemorySampler::start(Duration::from_millis(250));
    let machine_before = procfs::machine_busy_seconds()?;
    let started = Instant::now();
    let mut children = Vec::new();
    for i in 0..processes {
        let share = streams / processes + usize::from(i < streams % processes);
        let port = (IPERF_BASE_PORT + i as u16).to_string();
        let args = [
            "-c".to_string(),
            case.connect_addr().to_string(),
            "-p".into(),
            port,
            "-P".into(),
            share.to_string(),
            "-t".into(),
            seconds.to_string(),
            "-J".into(),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = net
            .command(Host::Client, "iperf3", &args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("cannot start iperf3")?;
        children.push(child);
    }
    let mut bits_per_second = 0.0;
    let mut bytes = 0;
    for child in children {
        let output = child.wait_with_output()?;
        let (bps, b) = workloads::parse_iperf_json(&output.stdout)
            .with_context(|| String::from_utf8_lossy(&output.stderr).into_owned())?;
        bits_per_second += bps;
        bytes += b;
    }
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

fn measure_idle(
    net: &BenchNet,
    case: Case,
    proxy: &RunningProxy,
    count: usize,
) -> anyhow::Result<IdleMemoryRow> {
    let rss_before = procfs::rss_bytes(proxy.pid)?;
    let tcp_before = machine_tcp_memory_bytes()?;
    let holder = workloads::hold_idle_connections(
        net,
        SocketAddr::from((SERVER_ADDR, IDLE_PORT)),
        SocketAddr::from((case.connect_addr(), IDLE_PORT)),
        count,
        Duration::from_secs(60),
    )?;
    // Let the proxy's allocator settle after the burst of accepts before reading its size.
    std::thread::sleep(Duration::from_millis(500));
    let rss_after = procfs::rss_bytes(proxy.pid)?;
    let tcp_after = machine_tcp_memory_bytes()?;
    drop(holder);
    Ok(IdleMemoryRow {
        case: case.name(),
        connections: count,
        proxy_rss_before_bytes: rss_before,
        proxy_rss_after_bytes: rss_after,
        user_bytes_per_connection: rss_after.saturating_sub(rss_before) as f64 / count as f64,
        kernel_tcp_bytes_per_connection: tcp_after.saturating_sub(tcp_before) as f64 / count as f64,
    })
}

/// The report as markdown tables.
pub fn render_markdown(report: &BenchReport) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "kernel {}, {} CPUs, {} s per throughput run, proxy at nice {}, midway's profile `{}` \
         on both segments, congestion control {} on the end hosts and {} for the router's \
         other sockets (HAProxy's)",
        report.kernel,
        report.cpus,
        report.seconds_per_run,
        report.proxy_nice,
        report.midway_profile,
        report.end_congestion_control,
        report.router_congestion_control
    );
    if report.router_quickack {
        let _ = write!(out, ", the router's routes with `quickack 1`");
    }
    if let Some(threads) = report.proxy_threads {
        let _ = write!(out, ", {threads} proxy thread(s)");
    }
    if let Some(max) = report.client_wmem_max {
        let _ = write!(out, ", clients' tcp_wmem max {max} bytes");
    }
    if report.rounds > 1 {
        let _ = write!(
            out,
            ", {} rounds: medians over the rounds, throughput as median (min-max), ratio to \
             direct paired within each round, peak TCP memory the highest; connection rate and \
             idle memory from the first round",
            report.rounds
        );
    }
    let _ = writeln!(out, "\n");
    out.push_str(&render_throughput_table(&report.throughput));
    let _ = writeln!(
        out,
        "\n| case | connections/s | failures |\n|---|---:|---:|"
    );
    for r in &report.connection_rate {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {} |",
            r.case, r.connections_per_second, r.failures
        );
    }
    let _ = writeln!(
        out,
        "\n| case | idle connections | proxy user-space KiB/conn | kernel TCP KiB/conn (machine-wide, all 4 sockets' share) |\n|---|---:|---:|---:|"
    );
    for r in &report.idle_memory {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} |",
            r.case,
            r.connections,
            r.user_bytes_per_connection / 1024.0,
            r.kernel_tcp_bytes_per_connection / 1024.0
        );
    }
    out
}

/// The throughput table, one line per case and stream count, then the failed runs if any.
pub fn render_throughput_table(summaries: &[ThroughputSummary]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| case | streams | rounds | Gbit/s | ratio to direct | proxy CPU-s/GB | machine CPU-s/GB | peak TCP mem (MiB) / pressure (MiB) |");
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let optional = |value: Option<f64>| value.map_or("-".into(), |v| format!("{v:.2}"));
    for s in summaries {
        let total = s.rounds_ok + s.rounds_failed;
        let rounds = if s.rounds_failed == 0 {
            total.to_string()
        } else {
            format!("{} of {total}", s.rounds_ok)
        };
        let Some(throughput) = s.bits_per_second else {
            let error = s.errors.first().map_or("", String::as_str);
            let _ = writeln!(
                out,
                "| {} | {} | {rounds} | failed: {} | | | | |",
                s.case,
                s.streams,
                error.replace('\n', " ")
            );
            continue;
        };
        let gbit = if s.rounds_ok > 1 {
            format!(
                "{:.2} ({:.2}-{:.2})",
                throughput.median / 1e9,
                throughput.min / 1e9,
                throughput.max / 1e9
            )
        } else {
            format!("{:.2}", throughput.median / 1e9)
        };
        let _ = writeln!(
            out,
            "| {} | {} | {rounds} | {gbit} | {} | {} | {} | {:.0} / {:.0} |",
            s.case,
            s.streams,
            optional(s.ratio_to_direct_median),
            optional(s.proxy_cpu_seconds_per_gb_median),
            optional(s.machine_cpu_seconds_per_gb_median),
            s.peak_tcp_memory_bytes_max.unwrap_or(0) as f64 / 1048576.0,
            s.tcp_memory_pressure_bytes.unwrap_or(0) as f64 / 1048576.0,
        );
    }
    let failures: Vec<String> = summaries
        .iter()
        .filter(|s| s.rounds_ok > 0)
        .flat_map(|s| {
            s.errors.iter().map(move |e| {
                format!(
                    "- {} {} streams, {}",
                    s.case,
                    s.streams,
                    e.replace('\n', " ")
                )
            })
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(out, "\nFailed runs (left out of the figures above):");
        for line in failures {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// Writes the report as pretty-printed JSON to `path`.
pub fn write_json(report: &BenchReport, path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(report)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(case: Case, round: u32, gbit: f64) -> ThroughputRun {
        ThroughputRun {
            round,
            case: case.name(),
            streams: 100,
            bits_per_second: gbit * 1e9,
            ratio_to_direct: None,
            bytes: 1_000_000_000,
            proxy_cpu_seconds: Some(0.3),
            proxy_cpu_seconds_per_gb: Some(0.3),
            machine_cpu_seconds_per_gb: Some(1.1),
            peak_tcp_memory_bytes: 10 * 1048576,
            tcp_memory_pressure_bytes: 1499 * 1048576,
            error: None,
        }
    }

    fn table(runs: &mut [ThroughputRun]) -> String {
        summary::fill_ratios_within_rounds(runs);
        render_throughput_table(&summary::summarize(runs))
    }

    #[test]
    fn one_round_shows_plain_figures() {
        let out = table(&mut [
            run(Case::Direct, 1, 20.0),
            run(Case::MidwayForward, 1, 12.81),
        ]);
        assert!(
            out.contains("| midway-forward | 100 | 1 | 12.81 | 0.64 | 0.30 | 1.10 | 10 / 1499 |"),
            "{out}"
        );
        assert!(!out.contains("Failed runs"), "{out}");
    }

    #[test]
    fn several_rounds_show_the_range_and_failures() {
        let mut failed = run(Case::MidwayForward, 3, 0.0);
        failed.error = Some("iperf3\nexited".into());
        let out = table(&mut [
            run(Case::Direct, 1, 20.0),
            run(Case::MidwayForward, 1, 11.2),
            run(Case::Direct, 2, 20.0),
            run(Case::MidwayForward, 2, 13.2),
            run(Case::Direct, 3, 20.0),
            failed,
        ]);
        assert!(
            out.contains("| direct | 100 | 3 | 20.00 (20.00-20.00) | 1.00 |"),
            "{out}"
        );
        assert!(
            out.contains("| midway-forward | 100 | 2 of 3 | 12.20 (11.20-13.20) | 0.61 |"),
            "{out}"
        );
        assert!(
            out.contains("- midway-forward 100 streams, round 3: iperf3 exited"),
            "{out}"
        );
    }

    #[test]
    fn a_case_that_never_ran_shows_its_first_error() {
        let mut failed = run(Case::Haproxy, 1, 0.0);
        failed.error = Some("haproxy did not come up".into());
        let out = table(&mut [failed]);
        assert!(
            out.contains(
                "| haproxy | 100 | 0 of 1 | failed: round 1: haproxy did not come up | | | | |"
            ),
            "{out}"
        );
    }

    fn options(
        threads: Option<u16>,
        proxy_extra: &[&str],
        listener_extra: &[&str],
    ) -> BenchOptions {
        BenchOptions {
            midway_bin: PathBuf::from("midway"),
            streams: vec![1],
            seconds: 1,
            rounds: 1,
            idle_connections: 0,
            cps_seconds: 0,
            cases: vec![Case::MidwayForward],
            work_dir: PathBuf::from("bench-results"),
            midway_proxy_extra: proxy_extra.iter().map(|s| s.to_string()).collect(),
            midway_listener_extra: listener_extra.iter().map(|s| s.to_string()).collect(),
            client_wmem_max: None,
            proxy_nice: -10,
            proxy_threads: threads,
            midway_profile: "lan".to_string(),
            end_congestion_control: None,
            router_congestion_control: None,
            router_quickack: false,
        }
    }

    #[test]
    fn midway_configs_pass_midways_own_validation_with_threads_and_extras() {
        for case in [Case::MidwayForward, Case::MidwayTransparent] {
            let opts = options(
                Some(1),
                &["socket_memory = \"off\""],
                &["buffer_bytes = 65536"],
            );
            let text = midway_config(case, "mwb0r0", &opts).unwrap();
            let config = midway_proxy::parse_config(&text, "bench")
                .unwrap_or_else(|e| panic!("{case:?}: {e}\n{text}"));
            assert_eq!(config.worker_threads, Some(1), "{case:?}");
            assert_eq!(config.socket_memory, midway_proxy::SocketMemorySetting::Off);
            assert!(
                config
                    .listeners
                    .iter()
                    .all(|l| format!("{:?}", l.relay).contains("buffer_bytes: 65536")),
                "{case:?}: {:?}",
                config.listeners
            );
            assert!(
                config
                    .listeners
                    .iter()
                    .all(|l| l.local_profile == "lan" && l.remote_profile == "lan"),
                "{case:?}: {:?}",
                config.listeners
            );
            let default = midway_proxy::parse_config(
                &midway_config(case, "mwb0r0", &options(None, &[], &[])).unwrap(),
                "bench",
            )
            .unwrap();
            assert_eq!(default.worker_threads, None, "{case:?}");
        }
    }

    #[test]
    fn haproxy_gets_the_same_thread_count() {
        let config = haproxy_config(true, Some(1));
        assert!(config.starts_with("global\n    nbthread 1\n"), "{config}");
        assert!(config.contains("option splice-response"), "{config}");
        assert!(!haproxy_config(false, None).contains("nbthread"));
    }
}
