//! The tunnel benchmark (`midway-bench tunnel`): what each peer transport costs between two
//! midways, against the plain TCP transport.
//!
//! Four namespaces in a chain, joined by plain veths (no emulated link): client — router (the
//! edge midway) — gateway (the gateway midway) — server. iperf3 clients in the client connect
//! to the edge's forward listeners (one per iperf3 port, each towards the same port of the
//! server, `via` the gateway); the edge carries every connection to the gateway's peer listener
//! over the transport under test, and the gateway connects to the server. So the bytes cross
//! the peer segment once, from edge to gateway (iperf3's direction, client to server).
//!
//! Transports: `tcp` (one TCP connection per proxied connection), `tls` (TLS 1.3 over each of
//! them, keys pinned) and `quic` (one QUIC tunnel, one stream per proxied connection, no TLS
//! fallback so that a tunnel that cannot be set up fails the case instead of measuring TLS).
//! Keys come from `midway peer keygen`; the QUIC tunnel's settings are midway's defaults.
//!
//! For each transport and stream count it measures the throughput of all streams together, and
//! the CPU time each midway spent during the run (user and system time from /proc/PID/stat,
//! every thread) per 10^9 bytes moved, and the whole machine's busy time per GB for context.
//! Network processing the kernel does in softirq context is charged to whichever process it
//! interrupted (or to ksoftirqd), so a midway's system time includes some of the veths' work
//! and the machine figure is the one that misses nothing. Each total CPU-s/GB is compared with
//! the `tcp` transport's of the same round and stream count, and the median of those ratios is
//! reported.
//!
//! Rounds interleave the transports as the main benchmark interleaves its cases: each round
//! starts both midways for a transport, runs every stream count, stops them, and goes on to the
//! next transport. It prints figures and asserts nothing; `tunnel.json` keeps every run.

mod configs;
mod summary;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use midway_launch::{Launch, Running};
use midway_sys::procfs;
use serde::Serialize;

use crate::netns::{BenchNet, Host, ROUTER_CLIENT_SIDE, SERVER_ADDR};
use crate::{iperf_load, workloads, CPS_PORT, START_LIMIT, STOP_GRACE};
use configs::Identities;
pub use summary::{render_tunnel_markdown, TunnelSummary};

/// How the peer segment between the two midways is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// One plain TCP connection per proxied connection (the baseline).
    Tcp,
    /// TLS 1.3 over each peer TCP connection.
    Tls,
    /// One QUIC tunnel carrying every proxied connection as a stream.
    Quic,
}

impl Transport {
    /// The transport's name in midway's config, on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Quic => "quic",
        }
    }
}

/// What one tunnel benchmark measures and how (the `tunnel` command line, parsed).
#[derive(Debug, Clone)]
pub struct TunnelOptions {
    /// The midway binary (both ends).
    pub midway_bin: PathBuf,
    /// Parallel stream counts, one run per count and transport in each round.
    pub streams: Vec<usize>,
    /// Length of each run, seconds.
    pub seconds: u32,
    /// How many times every run is repeated (at least 1), transports interleaved.
    pub rounds: u32,
    /// Transports to measure, in the order they run within a round.
    pub transports: Vec<Transport>,
    /// Folder for keys, generated configs, logs and `tunnel.json`.
    pub work_dir: PathBuf,
    /// Nice value both midways start with.
    pub proxy_nice: i32,
    /// `worker_threads` of each midway; `None`: one per CPU.
    pub proxy_threads: Option<u16>,
    /// QUIC connections the edge keeps to the gateway.
    pub quic_connections: u32,
    /// TCP profile of every TCP segment (client to edge, the peer segment over `tcp` and `tls`,
    /// gateway to server).
    pub midway_profile: String,
}

/// CPU time one midway spent during a run, and per GB moved.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MidwayCpu {
    /// User time, seconds (all threads).
    pub user_seconds: f64,
    /// System time, seconds (all threads).
    pub system_seconds: f64,
    /// User time per 10^9 bytes moved.
    pub user_seconds_per_gb: f64,
    /// System time per 10^9 bytes moved.
    pub system_seconds_per_gb: f64,
    /// User + system time per 10^9 bytes moved.
    pub cpu_seconds_per_gb: f64,
}

/// One run: one transport at one stream count in one round.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TunnelRun {
    /// 1 for the first round.
    pub round: u32,
    /// Name of the transport ([`Transport::name`]).
    pub transport: &'static str,
    /// Parallel iperf3 streams.
    pub streams: usize,
    /// Throughput of all streams together as the iperf3 servers received it, bit/s.
    pub bits_per_second: f64,
    /// Bytes all streams moved.
    pub bytes: u64,
    /// The edge midway's CPU time.
    pub edge_cpu: Option<MidwayCpu>,
    /// The gateway midway's CPU time.
    pub gateway_cpu: Option<MidwayCpu>,
    /// Both midways' CPU seconds per 10^9 bytes moved.
    pub total_cpu_seconds_per_gb: Option<f64>,
    /// `total_cpu_seconds_per_gb` over the `tcp` transport's at the same round and stream count.
    pub ratio_to_tcp: Option<f64>,
    /// Busy CPU time of the whole machine (load generators, both midways, the kernel) per GB.
    pub machine_cpu_seconds_per_gb: Option<f64>,
    /// Why the run failed, if it did (its figures are then zero or `None`).
    pub error: Option<String>,
}

/// Everything one tunnel benchmark measured, as written to `tunnel.json`.
#[derive(Debug, Serialize)]
pub struct TunnelReport {
    /// Kernel release (the sysctl `kernel.osrelease`).
    pub kernel: String,
    /// CPUs available to the benchmark.
    pub cpus: usize,
    /// Length of each run, seconds.
    pub seconds_per_run: u32,
    /// Rounds.
    pub rounds: u32,
    /// Nice value of both midways.
    pub proxy_nice: i32,
    /// `worker_threads` of each midway, when set.
    pub proxy_threads: Option<u16>,
    /// QUIC connections the edge keeps to the gateway.
    pub quic_connections: u32,
    /// TCP profile of every TCP segment.
    pub midway_profile: String,
    /// Per transport and stream count, over all rounds.
    pub summary: Vec<TunnelSummary>,
    /// Every run, in the order they ran.
    pub runs: Vec<TunnelRun>,
}

/// Runs the tunnel benchmark: builds the four namespaces, measures every transport, removes
/// them. Needs root.
pub fn run_tunnel(options: &TunnelOptions) -> anyhow::Result<TunnelReport> {
    if options.rounds == 0 {
        bail!("rounds must be at least 1");
    }
    if options.transports.is_empty() || options.streams.is_empty() {
        bail!("give at least one transport and one stream count");
    }
    if !nix::unistd::Uid::effective().is_root() {
        bail!("midway-bench needs root: it creates network namespaces");
    }
    crate::raise_fd_limit(0)?;
    crate::netns::install_cleanup_on_signal()?;
    std::fs::create_dir_all(&options.work_dir)?;
    let ids = Identities::generate(&options.midway_bin, &options.work_dir.join("tunnel-keys"))?;
    let mut net = BenchNet::build_tunnel().context("cannot build the tunnel network")?;
    crate::start_iperf_servers(&mut net)?;
    let probe_server =
        workloads::start_close_server(&net, SocketAddr::from((SERVER_ADDR, CPS_PORT)))?;
    let mut report = TunnelReport {
        kernel: midway_sys::sysctl::read("kernel.osrelease").unwrap_or_default(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        seconds_per_run: options.seconds,
        rounds: options.rounds,
        proxy_nice: options.proxy_nice,
        proxy_threads: options.proxy_threads,
        quic_connections: options.quic_connections,
        midway_profile: options.midway_profile.clone(),
        summary: Vec::new(),
        runs: Vec::new(),
    };
    for round in 1..=options.rounds {
        for &transport in &options.transports {
            eprintln!(
                "== round {round}/{}: {} transport",
                options.rounds,
                transport.name()
            );
            run_transport(&net, transport, round, &ids, options, &mut report.runs);
        }
    }
    probe_server.stop();
    summary::fill_ratios_to_tcp(&mut report.runs);
    report.summary = summary::summarize(&report.runs);
    Ok(report)
}

/// Both midways of one transport.
struct Pair {
    edge: Running,
    gateway: Running,
}

/// One transport in one round: start both midways, run every stream count, stop them. Failures
/// are recorded as failed runs, not returned.
fn run_transport(
    net: &BenchNet,
    transport: Transport,
    round: u32,
    ids: &Identities,
    options: &TunnelOptions,
    runs: &mut Vec<TunnelRun>,
) {
    let pair = match start_pair(net, transport, ids, options) {
        Ok(pair) => pair,
        Err(error) => {
            eprintln!("   cannot start: {error:#}");
            for &streams in &options.streams {
                runs.push(failed_run(round, transport, streams, &error));
            }
            return;
        }
    };
    for &streams in &options.streams {
        eprintln!("   {streams} stream(s)");
        let run = measure_when_idle(net, &pair, transport, round, streams, options.seconds)
            .unwrap_or_else(|error| {
                eprintln!("      failed: {error:#}");
                failed_run(round, transport, streams, &error)
            });
        runs.push(run);
    }
    // However they end, they are gone before the next transport starts.
    let _ = pair.edge.stop();
    let _ = pair.gateway.stop();
}

fn failed_run(
    round: u32,
    transport: Transport,
    streams: usize,
    error: &anyhow::Error,
) -> TunnelRun {
    TunnelRun {
        round,
        transport: transport.name(),
        streams,
        bits_per_second: 0.0,
        bytes: 0,
        edge_cpu: None,
        gateway_cpu: None,
        total_cpu_seconds_per_gb: None,
        ratio_to_tcp: None,
        machine_cpu_seconds_per_gb: None,
        error: Some(format!("{error:#}")),
    }
}

/// Writes both configs, starts the gateway and then the edge, and waits until a connection
/// through the edge reaches the server and back (which also sets up the QUIC tunnel).
fn start_pair(
    net: &BenchNet,
    transport: Transport,
    ids: &Identities,
    options: &TunnelOptions,
) -> anyhow::Result<Pair> {
    let profile = options.midway_profile.as_str();
    let gateway = start_midway(
        net,
        Host::Gateway,
        &options
            .work_dir
            .join(format!("tunnel-{}-gateway.toml", transport.name())),
        &configs::gateway_config(transport, ids, profile, options.proxy_threads)?,
        options,
    )?;
    let edge = start_midway(
        net,
        Host::Router,
        &options
            .work_dir
            .join(format!("tunnel-{}-edge.toml", transport.name())),
        &configs::edge_config(
            transport,
            ids,
            profile,
            options.proxy_threads,
            options.quic_connections,
        )?,
        options,
    )?;
    let mut pair = Pair { edge, gateway };
    let probe = SocketAddr::from((ROUTER_CLIENT_SIDE, CPS_PORT));
    if let Err(error) = probe_end_to_end(net, probe, START_LIMIT) {
        bail!(
            "no connection through the {} tunnel: {error:#}\nedge:\n{}\ngateway:\n{}",
            transport.name(),
            pair.edge.log_tail(),
            pair.gateway.log_tail()
        );
    }
    if let Ok(Some(status)) = pair.gateway.try_wait() {
        bail!("the gateway exited: {status}");
    }
    Ok(pair)
}

fn start_midway(
    net: &BenchNet,
    host: Host,
    config_path: &Path,
    config: &str,
    options: &TunnelOptions,
) -> anyhow::Result<Running> {
    std::fs::write(config_path, config)
        .with_context(|| format!("cannot write {}", config_path.display()))?;
    let mut process = Launch::midway(&options.midway_bin, config_path)
        .nice(options.proxy_nice)
        .log_file(config_path.with_extension("log"))
        .stop_grace(STOP_GRACE)
        .spawn(net.place(host))?;
    if let Err(error) = process.wait_ready(START_LIMIT) {
        // The error quotes the end of the log.
        drop(process);
        bail!("the {} midway did not come up: {error}", host.name());
    }
    Ok(process)
}

/// From the client, connect to `addr` (the edge's listener for the server's close server) and
/// read until the server's one byte and close arrive, until that works or `limit` passes.
fn probe_end_to_end(net: &BenchNet, addr: SocketAddr, limit: Duration) -> anyhow::Result<()> {
    net.in_host(Host::Client, move || {
        let deadline = Instant::now() + limit;
        loop {
            let attempt =
                TcpStream::connect_timeout(&addr, Duration::from_secs(1)).and_then(|mut stream| {
                    stream.set_read_timeout(Some(Duration::from_secs(6)))?;
                    let mut got = Vec::new();
                    stream.read_to_end(&mut got)?;
                    Ok(got)
                });
            match attempt {
                Ok(got) if got == b"x" => return Ok(()),
                _ if Instant::now() >= deadline => {
                    bail!("{addr} gave no end-to-end answer within {limit:?}: {attempt:?}")
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    })
    .join()
    .map_err(|_| anyhow::anyhow!("end-to-end probe panicked"))?
}

/// User and system CPU seconds of a process (all its threads), from /proc/PID/stat.
fn user_system_seconds(pid: u32) -> anyhow::Result<(f64, f64)> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let (user, system) =
        parse_user_system_ticks(&stat).with_context(|| format!("unexpected format of {path}"))?;
    let hz = clock_ticks_per_second();
    Ok((user as f64 / hz, system as f64 / hz))
}

/// utime and stime of a /proc/PID/stat line, counted from the last ')' since the command name
/// may hold spaces and parentheses.
fn parse_user_system_ticks(stat: &str) -> Option<(u64, u64)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')' come state(3) ... utime(14) stime(15): indices 11 and 12 here.
    Some((fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?))
}

fn clock_ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |hz| hz as f64)
}

fn midway_cpu(before: (f64, f64), after: (f64, f64), bytes: u64) -> MidwayCpu {
    let gb = (bytes as f64 / 1e9).max(1e-9);
    let user = after.0 - before.0;
    let system = after.1 - before.1;
    MidwayCpu {
        user_seconds: user,
        system_seconds: system,
        user_seconds_per_gb: user / gb,
        system_seconds_per_gb: system / gb,
        cpu_seconds_per_gb: (user + system) / gb,
    }
}

/// Times an iperf3 server that is still busy with the previous run (its control connection
/// not yet closed through both midways) is given to finish, [`BUSY_PAUSE`] apart.
const BUSY_RETRIES: u32 = 5;
const BUSY_PAUSE: Duration = Duration::from_secs(2);

/// [`measure`], started again (figures from scratch) while iperf3 says a server is still busy
/// with the previous run.
fn measure_when_idle(
    net: &BenchNet,
    pair: &Pair,
    transport: Transport,
    round: u32,
    streams: usize,
    seconds: u32,
) -> anyhow::Result<TunnelRun> {
    let mut retries = 0;
    loop {
        match measure(net, pair, transport, round, streams, seconds) {
            Err(error) if retries < BUSY_RETRIES && format!("{error:#}").contains("busy") => {
                retries += 1;
                eprintln!("      an iperf3 server is still busy; again in {BUSY_PAUSE:?}");
                std::thread::sleep(BUSY_PAUSE);
            }
            outcome => return outcome,
        }
    }
}

fn measure(
    net: &BenchNet,
    pair: &Pair,
    transport: Transport,
    round: u32,
    streams: usize,
    seconds: u32,
) -> anyhow::Result<TunnelRun> {
    let (edge_pid, gateway_pid) = (pair.edge.id(), pair.gateway.id());
    let edge_before = user_system_seconds(edge_pid)?;
    let gateway_before = user_system_seconds(gateway_pid)?;
    let machine_before = procfs::machine_busy_seconds()?;
    let started = Instant::now();
    let (bits_per_second, bytes) = iperf_load(net, ROUTER_CLIENT_SIDE, streams, seconds)?;
    let machine = procfs::machine_busy_seconds()? - machine_before;
    let edge = midway_cpu(edge_before, user_system_seconds(edge_pid)?, bytes);
    let gateway = midway_cpu(gateway_before, user_system_seconds(gateway_pid)?, bytes);
    if bytes == 0 {
        bail!("iperf3 moved no bytes");
    }
    let gb = bytes as f64 / 1e9;
    eprintln!(
        "      {:.2} Gbit/s in {:.1} s, CPU-s/GB edge {:.2} gateway {:.2}",
        bits_per_second / 1e9,
        started.elapsed().as_secs_f64(),
        edge.cpu_seconds_per_gb,
        gateway.cpu_seconds_per_gb
    );
    Ok(TunnelRun {
        round,
        transport: transport.name(),
        streams,
        bits_per_second,
        bytes,
        edge_cpu: Some(edge),
        gateway_cpu: Some(gateway),
        total_cpu_seconds_per_gb: Some(edge.cpu_seconds_per_gb + gateway.cpu_seconds_per_gb),
        ratio_to_tcp: None,
        machine_cpu_seconds_per_gb: Some(machine / gb),
        error: None,
    })
}

/// Writes the report as pretty-printed JSON to `path`.
pub fn write_tunnel_json(report: &TunnelReport, path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(report)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_and_system_ticks_come_after_the_command_name() {
        let stat = "1234 (mid way) (x) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3";
        assert_eq!(parse_user_system_ticks(stat), Some((250, 75)));
        assert_eq!(parse_user_system_ticks("garbage"), None);
    }

    #[test]
    fn cpu_per_gb_splits_user_and_system() {
        let cpu = midway_cpu((1.0, 2.0), (2.5, 3.0), 3_000_000_000);
        assert!((cpu.user_seconds - 1.5).abs() < 1e-12);
        assert!((cpu.system_seconds_per_gb - 1.0 / 3.0).abs() < 1e-12);
        assert!((cpu.cpu_seconds_per_gb - 2.5 / 3.0).abs() < 1e-12);
    }
}
