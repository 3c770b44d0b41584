//! `midway-bench`: prints what midway costs on a gateway, beside routing alone and HAProxy;
//! `midway-bench tunnel`: what each peer transport (tcp, tls, quic) costs between two midways.
//! See the library's documentation for what is measured and how.

#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use midway_bench::{BenchOptions, Case, Transport, TunnelOptions};

#[derive(Parser)]
#[command(
    name = "midway-bench",
    about = "Throughput, CPU per GB, connection rate and idle memory of midway vs HAProxy (root)",
    args_conflicts_with_subcommands = true
)]
struct Args {
    /// Without a command: the gateway benchmark (the options below).
    #[command(subcommand)]
    command: Option<Command>,
    /// The midway binary to benchmark.
    #[arg(long, default_value = "target/release/midway")]
    midway: PathBuf,
    /// Stream counts for the throughput runs.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    streams: Vec<usize>,
    /// Seconds per throughput run.
    #[arg(long, default_value_t = 10)]
    seconds: u32,
    /// Repeat the throughput, connection-rate and idle-memory runs this many rounds (each round
    /// runs every case in turn, so cases are interleaved in time) and report medians with
    /// min-max and the median per-round ratio to direct. `--connections` runs in the first
    /// round only. --quick does not change it.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Idle split connections for the memory figure (0 to skip).
    #[arg(long, default_value_t = 8000)]
    idle: usize,
    /// Concurrent split connections to open and hold through each proxy case (0 to skip):
    /// open time, connect latency, memory and descriptors at N, and whether all still answer
    /// after --hold. Needs an open-file limit of 2 N + 1024 for the bench and the proxy, which
    /// the bench raises as root (see docs/results/bench/README.md).
    #[arg(long, default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=midway_bench::MAX_CONNECTIONS as u64))]
    connections: u64,
    /// Seconds the --connections are held (with a one-byte echo per connection every 10 s)
    /// before each must answer once more.
    #[arg(long, default_value_t = 60)]
    hold: u32,
    /// Of the --connections, how many are being opened at once at most. Their connect latency
    /// includes waiting behind the others: about this many over the opening rate.
    #[arg(long, default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..=midway_bench::MAX_IN_FLIGHT as u64))]
    connections_in_flight: u64,
    /// Seconds of the connection-rate run.
    #[arg(long, default_value_t = 5)]
    cps_seconds: u32,
    /// Cases to run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "direct,midway-forward,midway-transparent,haproxy,haproxy-splice"
    )]
    cases: Vec<Case>,
    /// A short run (1 and 100 streams, 3 s, 1000 idle connections), for CI.
    #[arg(long)]
    quick: bool,
    /// A TOML line for the `[proxy]` table of midway's config, e.g. "max_pipes = 0" (repeatable).
    #[arg(long)]
    midway_proxy_extra: Vec<String>,
    /// A TOML line for every midway listener, e.g. "buffer_bytes = 65536" (repeatable).
    #[arg(long)]
    midway_listener_extra: Vec<String>,
    /// Caps the load generator's send-buffer autotuning (`net.ipv4.tcp_wmem` max in the client
    /// namespace, bytes). The clients share this machine's TCP memory with the proxy, which a
    /// gateway's real clients do not; see docs/results/bench/README.md. Unset: kernel default.
    #[arg(long)]
    client_wmem_max: Option<u32>,
    /// Scheduling priority (nice value) of the proxy under test, midway or HAProxy alike. The
    /// default, -10, keeps the load generators sharing the proxy's cores from starving it: in
    /// `direct` the router's forwarding runs in softirq ahead of every process, and a gateway's
    /// proxy does not share its cores with the end hosts. 0 runs it like the load generators.
    #[arg(long, default_value_t = -10, allow_hyphen_values = true,
          value_parser = clap::value_parser!(i32).range(-20..=19))]
    proxy_nice: i32,
    /// Threads of the proxy under test: midway's `worker_threads` and HAProxy's `nbthread`.
    /// Unset: each proxy's default, one per CPU.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    proxy_threads: Option<u16>,
    /// TCP profile of both of midway's segments: a preset, or a profile defined with
    /// `--midway-proxy-extra '[profiles.NAME]'` and the lines after it. The default, `lan`
    /// (CUBIC, Nagle off), is the preset for a short clean link like the bench's veths; `default`
    /// runs midway with the kernel's settings, as HAProxy runs.
    #[arg(long, default_value = "lan")]
    midway_profile: String,
    /// Congestion control of the client's and server's sockets (e.g. `cubic`), given as a
    /// `congctl` metric on every route of their namespaces, so any congestion control the kernel
    /// has works on a fresh machine. Unset: the machine's default, which new namespaces
    /// inherit; the report's header names it.
    #[arg(long)]
    end_congestion_control: Option<String>,
    /// Congestion control of the router's sockets, as a `congctl` metric on its routes:
    /// HAProxy's sockets get it, and midway's when its profile leaves `congestion_control`
    /// unset. Unset: the machine's default.
    #[arg(long)]
    router_congestion_control: Option<String>,
    /// Adds `quickack 1` to the router namespace's routes, so HAProxy's sockets ACK every
    /// segment at once as midway's `lan` profile does: with `--router-congestion-control
    /// cubic`, HAProxy gets what `lan` sets, the way an operator would give it to HAProxy.
    #[arg(long)]
    router_quickack: bool,
    /// Folder for generated configs, logs and bench.json.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Throughput and CPU per GB of the peer segment over each transport (tcp, tls, quic).
    ///
    /// client -> edge midway -> gateway midway -> server, each in its own namespace, joined by
    /// plain veths; iperf3 through the edge's forward listeners, `via` the gateway. Per
    /// transport and stream count: throughput, both midways' CPU seconds per GB (user and
    /// system), and the ratio of their CPU-s/GB to the tcp transport's in the same round.
    /// Writes tunnel.json and tunnel.md to --out. Needs root.
    Tunnel(TunnelArgs),
}

#[derive(clap::Args)]
struct TunnelArgs {
    /// The midway binary (both the edge and the gateway).
    #[arg(long, default_value = "target/release/midway")]
    midway: PathBuf,
    /// Parallel iperf3 stream counts, one run each per transport and round.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000")]
    streams: Vec<usize>,
    /// Seconds per run.
    #[arg(long, default_value_t = 10)]
    seconds: u32,
    /// Repeat every run this many rounds (each round runs every transport in turn) and report
    /// medians with min-max, and the median per-round CPU ratio to tcp.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Peer transports to measure, in this order within a round (keep tcp for the ratios).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tcp,tls,quic"
    )]
    transports: Vec<Transport>,
    /// Nice value of both midways (as the gateway benchmark's --proxy-nice).
    #[arg(long, default_value_t = -10, allow_hyphen_values = true,
          value_parser = clap::value_parser!(i32).range(-20..=19))]
    proxy_nice: i32,
    /// `worker_threads` of each midway. Unset: one per CPU.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    proxy_threads: Option<u16>,
    /// QUIC connections the edge keeps to the gateway (`[peers.quic] connections`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    quic_connections: u32,
    /// TCP profile of every TCP segment (client to edge, the tcp and tls peer segments, gateway
    /// to server).
    #[arg(long, default_value = "lan")]
    midway_profile: String,
    /// Folder for keys, generated configs, logs, tunnel.json and tunnel.md.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

fn tunnel(args: TunnelArgs) -> anyhow::Result<()> {
    let midway_bin = std::fs::canonicalize(&args.midway)
        .map_err(|e| anyhow::anyhow!("midway binary {}: {e}", args.midway.display()))?;
    let options = TunnelOptions {
        midway_bin,
        streams: args.streams,
        seconds: args.seconds,
        rounds: args.rounds,
        transports: args.transports,
        work_dir: args.out.clone(),
        proxy_nice: args.proxy_nice,
        proxy_threads: args.proxy_threads,
        quic_connections: args.quic_connections,
        midway_profile: args.midway_profile,
    };
    let report = midway_bench::run_tunnel(&options)?;
    let markdown = midway_bench::render_tunnel_markdown(&report);
    println!("{markdown}");
    let json = args.out.join("tunnel.json");
    midway_bench::write_tunnel_json(&report, &json)?;
    std::fs::write(args.out.join("tunnel.md"), markdown)?;
    eprintln!("figures also in {}", json.display());
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if let Some(Command::Tunnel(tunnel_args)) = args.command.take() {
        return tunnel(tunnel_args);
    }
    // Only the midway cases need the binary: `--cases direct,haproxy` runs without one.
    let runs_midway = args.cases.iter().any(|case| case.is_midway());
    let midway_bin = if runs_midway {
        std::fs::canonicalize(&args.midway)
            .map_err(|e| anyhow::anyhow!("midway binary {}: {e}", args.midway.display()))?
    } else {
        args.midway.clone()
    };
    let mut options = BenchOptions {
        midway_bin,
        streams: args.streams,
        seconds: args.seconds,
        rounds: args.rounds,
        idle_connections: args.idle,
        cps_seconds: args.cps_seconds,
        connections: usize::try_from(args.connections)?,
        hold_seconds: args.hold,
        connections_in_flight: usize::try_from(args.connections_in_flight)?,
        cases: args.cases,
        work_dir: args.out.clone(),
        midway_proxy_extra: args.midway_proxy_extra,
        midway_listener_extra: args.midway_listener_extra,
        client_wmem_max: args.client_wmem_max,
        proxy_nice: args.proxy_nice,
        proxy_threads: args.proxy_threads,
        midway_profile: args.midway_profile,
        end_congestion_control: args.end_congestion_control,
        router_congestion_control: args.router_congestion_control,
        router_quickack: args.router_quickack,
    };
    if args.quick {
        options.streams = vec![1, 100];
        options.seconds = 3;
        options.idle_connections = 1000;
        options.cps_seconds = 2;
    }
    let report = midway_bench::run(&options)?;
    let markdown = midway_bench::render_markdown(&report);
    println!("{markdown}");
    let json = args.out.join("bench.json");
    midway_bench::write_json(&report, &json)?;
    std::fs::write(args.out.join("bench.md"), markdown)?;
    eprintln!("figures also in {}", json.display());
    Ok(())
}
