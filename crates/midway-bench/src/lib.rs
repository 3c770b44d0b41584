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
//! It prints figures; it asserts nothing. Every number comes from this run.

pub mod netns;
pub mod procstat;
pub mod workloads;

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use midway_proxy::sockmem::{machine_tcp_memory_bytes, KernelMemoryLimits};
use serde::Serialize;

use netns::{BenchNet, Host, CLIENT_PREFIX, ROUTER_CLIENT_SIDE, SERVER_ADDR};

/// iperf3 runs at most 128 streams per process, so larger counts are spread over several
/// client/server pairs on consecutive ports.
const IPERF_BASE_PORT: u16 = 5201;
const IPERF_MAX_STREAMS_PER_PROCESS: usize = 125;
const IPERF_PROCESSES: usize = 8;
const IDLE_PORT: u16 = 6000;
const CPS_PORT: u16 = 6001;
const TRANSPARENT_PORT: u16 = 7000;
const METRICS_ADDR: &str = "127.0.0.1:9464";

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub midway_bin: PathBuf,
    pub streams: Vec<usize>,
    pub seconds: u32,
    pub idle_connections: usize,
    pub cps_seconds: u32,
    pub cases: Vec<Case>,
    pub work_dir: PathBuf,
    /// TOML lines added to the `[proxy]` table of midway's generated config (e.g. `max_pipes = 0`).
    pub midway_proxy_extra: Vec<String>,
    /// TOML lines added to every `[[listeners]]` table of midway's generated config (e.g.
    /// `buffer_bytes = 65536`), to compare settings in one command.
    pub midway_listener_extra: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Case {
    Direct,
    MidwayForward,
    MidwayTransparent,
    Haproxy,
    HaproxySplice,
}

impl Case {
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

#[derive(Debug, Serialize)]
pub struct ThroughputRow {
    pub case: &'static str,
    pub streams: usize,
    pub bits_per_second: f64,
    pub ratio_to_direct: Option<f64>,
    pub bytes: u64,
    pub proxy_cpu_seconds: Option<f64>,
    pub proxy_cpu_seconds_per_gb: Option<f64>,
    /// Busy CPU time of the whole machine (client, server, router and proxy) per GB moved: with
    /// every CPU saturated, throughput is the CPU count divided by this.
    pub machine_cpu_seconds_per_gb: Option<f64>,
    pub peak_tcp_memory_bytes: u64,
    pub tcp_memory_pressure_bytes: u64,
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ConnectionRateRow {
    pub case: &'static str,
    pub connections_per_second: f64,
    pub failures: u64,
}

#[derive(Debug, Serialize)]
pub struct IdleMemoryRow {
    pub case: &'static str,
    pub connections: usize,
    pub proxy_rss_before_bytes: u64,
    pub proxy_rss_after_bytes: u64,
    pub user_bytes_per_connection: f64,
    pub kernel_tcp_bytes_per_connection: f64,
}

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub kernel: String,
    pub cpus: usize,
    pub seconds_per_run: u32,
    pub throughput: Vec<ThroughputRow>,
    pub connection_rate: Vec<ConnectionRateRow>,
    pub idle_memory: Vec<IdleMemoryRow>,
}

/// A proxy running in the router for one case, stopped when dropped out of the net.
struct RunningProxy {
    pid: u32,
}

pub fn run(options: &BenchOptions) -> anyhow::Result<BenchReport> {
    if !nix::unistd::Uid::effective().is_root() {
        bail!("midway-bench needs root: it creates network namespaces");
    }
    raise_fd_limit()?;
    netns::install_cleanup_on_signal()?;
    std::fs::create_dir_all(&options.work_dir)?;
    let mut net = BenchNet::build().context("cannot build the benchmark network")?;
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
        throughput: Vec::new(),
        connection_rate: Vec::new(),
        idle_memory: Vec::new(),
    };

    for &case in &options.cases {
        eprintln!("== {}", case.name());
        let proxy = match start_proxy(&mut net, case, options) {
            Ok(proxy) => proxy,
            Err(error) => {
                eprintln!("   cannot start: {error:#}");
                for &streams in &options.streams {
                    report.throughput.push(failed_row(case, streams, &error));
                }
                continue;
            }
        };
        for &streams in &options.streams {
            eprintln!("   {streams} stream(s)");
            let row = measure_throughput(&net, case, proxy.as_ref(), streams, options.seconds)
                .unwrap_or_else(|error| failed_row(case, streams, &error));
            report.throughput.push(row);
        }
        match workloads::connection_rate(
            &net,
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
        if let Some(proxy) = &proxy {
            if options.idle_connections > 0 {
                match measure_idle(&net, case, proxy, options.idle_connections) {
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
    cps_server.stop();
    fill_ratios(&mut report.throughput);
    Ok(report)
}

fn failed_row(case: Case, streams: usize, error: &anyhow::Error) -> ThroughputRow {
    ThroughputRow {
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

fn fill_ratios(rows: &mut [ThroughputRow]) {
    let direct: Vec<(usize, f64)> = rows
        .iter()
        .filter(|r| r.case == Case::Direct.name() && r.error.is_none())
        .map(|r| (r.streams, r.bits_per_second))
        .collect();
    for row in rows.iter_mut() {
        if row.error.is_some() {
            continue;
        }
        if let Some((_, base)) = direct.iter().find(|(s, _)| *s == row.streams) {
            if *base > 0.0 {
                row.ratio_to_direct = Some(row.bits_per_second / base);
            }
        }
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
            std::fs::write(&path, midway_config(case, &net.iface("r0"), options))?;
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
            std::fs::write(&path, haproxy_config(case == Case::HaproxySplice))?;
            (
                "haproxy".into(),
                vec!["-db".into(), "-f".into(), path.display().to_string()],
                path,
            )
        }
    };
    let log = std::fs::File::create(config_path.with_extension("log"))?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let pid = net.spawn(Host::Router, &program, &args, Some(log))?;
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

fn midway_config(case: Case, client_iface: &str, options: &BenchOptions) -> String {
    let proxy_extra = lines(&options.midway_proxy_extra);
    let listener_extra = lines(&options.midway_listener_extra);
    let mut config = format!(
        "[proxy]\nallowed_clients = [\"{CLIENT_PREFIX}\"]\nmax_connections = 19000\n\
         max_connections_per_client = 19000\nconnect_timeout = \"5s\"\nidle_timeout = \"600s\"\n\
         shutdown_grace = \"2s\"\n{proxy_extra}\n[metrics]\nlisten = \"{METRICS_ADDR}\"\n\n"
    );
    match case {
        Case::MidwayForward => {
            for port in all_ports() {
                let _ = write!(
                    config,
                    "[[listeners]]\nname = \"p{port}\"\nmode = \"forward\"\n\
                     listen = \"{ROUTER_CLIENT_SIDE}:{port}\"\ntarget = \"{SERVER_ADDR}:{port}\"\n\
                     relay = \"buffer\"\n{listener_extra}\n"
                );
            }
        }
        Case::MidwayTransparent => {
            let ports = all_ports()
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let _ = write!(
                config,
                "[[listeners]]\nname = \"tproxy\"\nmode = \"transparent\"\n\
                 listen = \"0.0.0.0:{TRANSPARENT_PORT}\"\nrelay = \"buffer\"\n{listener_extra}\n\
                 [listeners.nftables]\nmanage = true\ninterfaces = [\"{client_iface}\"]\n\
                 ports = [{ports}]\n"
            );
        }
        _ => unreachable!("only midway cases have a midway config"),
    }
    config
}

/// One TOML line per entry, each ending in a newline.
fn lines(entries: &[String]) -> String {
    entries.iter().map(|e| format!("{e}\n")).collect()
}

fn haproxy_config(splice: bool) -> String {
    // maxconn and maxpipes leave room under the 20000 open-file limit: two descriptors per proxied
    // connection and two per splice pipe.
    let mut config = String::from(
        "global\n    maxconn 9000\n    maxpipes 512\n\ndefaults\n    mode tcp\n    timeout connect 5s\n    \
         timeout client 600s\n    timeout server 600s\n",
    );
    // A frontend accepts 2000 connections unless told otherwise; the idle test needs more.
    config.push_str("    maxconn 9000\n");
    if splice {
        config.push_str("    option splice-request\n    option splice-response\n");
    }
    for port in all_ports() {
        let _ = write!(
            config,
            "\nlisten p{port}\n    bind {ROUTER_CLIENT_SIDE}:{port}\n    server s {SERVER_ADDR}:{port}\n"
        );
    }
    config
}

fn measure_throughput(
    net: &BenchNet,
    case: Case,
    proxy: Option<&RunningProxy>,
    streams: usize,
    seconds: u32,
) -> anyhow::Result<ThroughputRow> {
    let processes = streams
        .div_ceil(IPERF_MAX_STREAMS_PER_PROCESS)
        .clamp(1, IPERF_PROCESSES);
    let cpu_before = proxy.map(|p| procstat::cpu_seconds(p.pid)).transpose()?;
    let sampler = workloads::TcpMemorySampler::start(Duration::from_millis(250));
    let machine_before = procstat::machine_busy_seconds()?;
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
    let machine_cpu = procstat::machine_busy_seconds()? - machine_before;
    let peak_tcp_bytes = sampler.stop();
    let cpu = match (proxy, cpu_before) {
        (Some(p), Some(before)) => Some(procstat::cpu_seconds(p.pid)? - before),
        _ => None,
    };
    let pressure_bytes = KernelMemoryLimits::read()?.pressure_bytes;
    eprintln!(
        "      {:.2} Gbit/s in {:.1} s",
        bits_per_second / 1e9,
        started.elapsed().as_secs_f64()
    );
    Ok(ThroughputRow {
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
    let rss_before = procstat::rss_bytes(proxy.pid)?;
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
    let rss_after = procstat::rss_bytes(proxy.pid)?;
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
    let _ = writeln!(
        out,
        "kernel {}, {} CPUs, {} s per throughput run\n",
        report.kernel, report.cpus, report.seconds_per_run
    );
    let _ = writeln!(out, "| case | streams | Gbit/s | ratio to direct | proxy CPU-s/GB | machine CPU-s/GB | peak TCP mem (MiB) / pressure (MiB) |");
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    for r in &report.throughput {
        if let Some(error) = &r.error {
            let _ = writeln!(
                out,
                "| {} | {} | failed: {} | | | | |",
                r.case,
                r.streams,
                error.replace('\n', " ")
            );
            continue;
        }
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {} | {} | {} | {:.0} / {:.0} |",
            r.case,
            r.streams,
            r.bits_per_second / 1e9,
            r.ratio_to_direct.map_or("-".into(), |v| format!("{v:.2}")),
            r.proxy_cpu_seconds_per_gb
                .map_or("-".into(), |v| format!("{v:.2}")),
            r.machine_cpu_seconds_per_gb
                .map_or("-".into(), |v| format!("{v:.2}")),
            r.peak_tcp_memory_bytes as f64 / 1048576.0,
            r.tcp_memory_pressure_bytes as f64 / 1048576.0,
        );
    }
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

pub fn write_json(report: &BenchReport, path: &Path) -> anyhow::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(report)?)?;
    Ok(())
}
