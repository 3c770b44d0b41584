//! The workloads a point measures, one [`MeasuredWorkload`] impl per kind of
//! [`scenario::Workload`](crate::scenario::Workload): adding a workload is adding an impl here and
//! its arm in [`measured`].

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use midway_labnet::{HostChild, SpawnOptions, Topology};
use midway_report::WARMUP_CACHED_METRIC;
use midway_sys::netlink::{
    Family, Metric, RouteMetric, TcpMetricsCache, TcpMetricsEntry, TABLE_MAIN,
};

use super::{listening_ports, log_tail, netstat_all, Measurement, NetstatCounters};
use super::{READY_POLL_INTERVAL, READY_POLL_TRIES};
use crate::cases::{self, Placement};
use crate::scenario::{
    BulkAmount, BulkWorkload, Case, CaseKind, CommandWorkload, CompetingFlow, Scenario, WebClient,
    WebWorkload, Workload,
};
use crate::workload::{self, BulkServer, SocketOptions, WorkloadError};

/// The `extra` measurement of a competing flow's throughput, in Mbit/s.
pub(crate) const COMPETING_THROUGHPUT_METRIC: &str = "competing_throughput_mbps";

/// What a workload needs of its point once the topology is built and the case's proxy runs.
pub(super) struct PointContext<'a> {
    pub topology: &'a Topology,
    pub scenario: &'a Scenario,
    pub case: &'a Case,
    /// Where the case's proxy sits (None for `direct` without route tuning).
    pub placement: Option<&'a Placement>,
    /// Address the client connects to in this case (the proxy's, or the server's).
    pub target: SocketAddr,
    /// The server's own address on its link toward the client side.
    pub server: SocketAddr,
    /// The client's own address on its link toward the server side.
    pub client: IpAddr,
    pub point_dir: &'a Path,
    /// Options every program of the point is spawned with (see [`MeasuredWorkload::spawn_options`]).
    pub spawn_options: &'a SpawnOptions,
}

/// What a workload measured.
pub(super) struct WorkloadOutcome {
    pub measurement: Measurement,
    /// Every host's counters before the measured transfer, when an unmeasured one came first;
    /// the point records only what the measured one added. Empty = count from zero.
    pub netstat_before: NetstatCounters,
}

impl From<Measurement> for WorkloadOutcome {
    fn from(measurement: Measurement) -> Self {
        WorkloadOutcome {
            measurement,
            netstat_before: NetstatCounters::new(),
        }
    }
}

/// Makes `host` acknowledge every segment at once: the route metric `quickack 1` on each of its
/// IPv4 routes (the bulk transfer is IPv4). A per-socket TCP_QUICKACK would not do: the kernel
/// clears it again, so it holds only until the next delayed ACK.
fn acknowledge_every_segment(topology: &Topology, host: &str) -> anyhow::Result<()> {
    let quickack = RouteMetric::new(Metric::QuickAck, 1);
    let changed = super::host_netlink(topology, host)?
        .set_metric_on_routes(Family::V4, TABLE_MAIN, &quickack)
        .with_context(|| format!("cannot set `quickack 1` on the routes of {host}"))?;
    if changed == 0 {
        bail!("{host} has no IPv4 route to set `quickack` on");
    }
    Ok(())
}

/// One kind of workload: how a point runs and times it.
pub(super) trait MeasuredWorkload {
    /// Options for every program the point spawns (proxy, browser), prepared in `point_dir`
    /// before the proxy starts; `server` is the server's address on the client-side path.
    fn spawn_options(
        &self,
        _server: SocketAddr,
        _point_dir: &Path,
    ) -> anyhow::Result<SpawnOptions> {
        Ok(SpawnOptions::default())
    }

    /// Runs the workload between the point's client and server and times it.
    fn measure(&self, point: &PointContext<'_>) -> anyhow::Result<WorkloadOutcome>;
}

/// The runner's view of a scenario's workload.
pub(super) fn measured(workload: &Workload) -> &dyn MeasuredWorkload {
    match workload {
        Workload::Bulk(bulk) => bulk,
        Workload::Command(command) => command,
        Workload::Web(web) => web,
    }
}

impl MeasuredWorkload for BulkWorkload {
    fn measure(&self, point: &PointContext<'_>) -> anyhow::Result<WorkloadOutcome> {
        let (topology, scenario, target) = (point.topology, point.scenario, point.target);
        if !self.client_delayed_ack {
            acknowledge_every_segment(topology, &scenario.client)?;
        }
        let server_options = SocketOptions {
            send_buffer: self.server_send_buffer,
            recv_buffer: None,
            congestion_control: self.server_congestion_control.clone(),
        };
        let client_options = SocketOptions {
            send_buffer: None,
            recv_buffer: self.client_recv_buffer,
            congestion_control: self.client_congestion_control.clone(),
        };
        let bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), self.port);
        let server = topology
            .try_in_host(&scenario.server, move || {
                BulkServer::bind(bind, &server_options)
            })?
            .context("bulk server")?;
        let (amount, timeout) = (self.amount, self.timeout);
        let connections = self.connections;
        let warmup = self.warmup_bytes;
        let (warm_tx, warm_rx) = mpsc::channel();
        // What the server serves next: `Some(bytes)` a warm-up, `None` the measured transfers.
        let (step_tx, step_rx) = mpsc::channel::<Option<u64>>();
        let server_thread = std::thread::spawn(move || {
            loop {
                match step_rx.recv() {
                    Ok(Some(bytes)) => {
                        let outcome = server
                            .serve_one(BulkAmount::Bytes(bytes), timeout)
                            .map(|_| ());
                        let failed = outcome.is_err();
                        // The warm-up's error goes to the client side, which stops there.
                        let _ = warm_tx.send(outcome);
                        if failed {
                            return Ok(None);
                        }
                    }
                    Ok(None) => break,
                    // The client side gave up before the measured transfers.
                    Err(_) => return Ok(None),
                }
            }
            server.serve_many(connections, amount, timeout).map(Some)
        });
        let (warmup_cached, warmup_reordering, warmups, netstat_before) = match warmup {
            Some(bytes) => {
                let mut tries = 0;
                let warmed = loop {
                    tries += 1;
                    let _ = step_tx.send(Some(bytes));
                    let warmed = warm_up(point, bytes, &client_options, timeout, &warm_rx)?;
                    if warmed.cached || tries >= MAX_WARMUPS {
                        break warmed;
                    }
                };
                (
                    Some(warmed.cached),
                    warmed.reordering,
                    Some(tries),
                    warmed.netstat_before,
                )
            }
            None => (None, None, None, NetstatCounters::new()),
        };
        let _ = step_tx.send(None);
        let competing = match &self.competing {
            Some(flow) => Some(CompetingRun::start(point, flow, amount, timeout)?),
            None => None,
        };
        // The competing flow's client starts with the measured one and runs beside it.
        let (client, competing) = std::thread::scope(|scope| {
            let competing = competing.map(|run| scope.spawn(|| run.finish(point)));
            let client = topology
                .try_in_host(&scenario.client, move || {
                    workload::bulk_clients(target, connections, amount, &client_options, timeout)
                })
                .map_err(anyhow::Error::from)
                .and_then(|outcome| outcome.context("bulk client"));
            let competing = competing.map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err(anyhow!("the competing flow's thread panicked")))
            });
            (client, competing.transpose())
        });
        let client = match client {
            Ok(client) => client,
            Err(error) => {
                // The server thread ends at its own timeout; its result no longer matters.
                drop(server_thread);
                return Err(error);
            }
        };
        let server_outcome = server_thread
            .join()
            .map_err(|_| anyhow!("the bulk server thread panicked"))?
            .context("bulk server")?
            .context("the bulk server stopped after its warm-up")?;
        let mut m = Measurement {
            bytes: client.bytes,
            seconds: client.seconds,
            ..Measurement::default()
        };
        m.retransmits.insert("client".into(), client.retransmits);
        m.retransmits
            .insert("server".into(), server_outcome.retransmits);
        m.extra
            .insert("connect_seconds".into(), client.connect_seconds);
        if let Some(competing) = competing.context("competing flow")? {
            competing.record(&mut m);
        }
        if let Some(cached) = warmup_cached {
            m.extra
                .insert(WARMUP_CACHED_METRIC.into(), f64::from(u8::from(cached)));
        }
        if let Some(warmups) = warmups {
            m.extra.insert("warmups".into(), f64::from(warmups));
        }
        // Evidence that a dupack_threshold reached the measured connection: the cached
        // `reordering` of the client at the local segment's sender.
        if let Some(reordering) = warmup_reordering {
            m.extra
                .insert("cached_reordering".into(), f64::from(reordering));
        }
        // Segment completions (hfc-proxy fig. 11), both from the client's connect: local =
        // the client's last byte; remote = the server's last byte acknowledged by its peer
        // (the proxy's remote segment; the client when direct), so it includes that ACK's
        // trip back to the server.
        m.extra
            .insert("local_segment_seconds".into(), client.seconds);
        if let Some(acked) = server_outcome.all_acked {
            m.extra.insert(
                "remote_segment_seconds".into(),
                acked
                    .saturating_duration_since(client.started)
                    .as_secs_f64(),
            );
        }
        Ok(WorkloadOutcome {
            measurement: m,
            netstat_before,
        })
    }
}

/// A competing flow of a point (see [`CompetingFlow`]): its server, bound and serving one
/// connection on its own thread, and what its client needs.
struct CompetingRun {
    server_thread: std::thread::JoinHandle<Result<workload::ServerOutcome, WorkloadError>>,
    target: SocketAddr,
    client_options: SocketOptions,
    amount: BulkAmount,
    timeout: Duration,
}

/// What a competing flow moved.
struct CompetingOutcome {
    client: workload::BulkOutcome,
    server_retransmits: u64,
}

impl CompetingRun {
    /// Binds the competing flow's server in the server host and serves one connection: `amount`
    /// (the measured transfer's duration) with the flow's own congestion control, set on the
    /// socket (never as a namespace's default).
    fn start(
        point: &PointContext<'_>,
        flow: &CompetingFlow,
        amount: BulkAmount,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let server_options = SocketOptions {
            send_buffer: flow.server_send_buffer,
            recv_buffer: None,
            congestion_control: Some(flow.congestion_control.clone()),
        };
        let bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), flow.port);
        let server = point
            .topology
            .try_in_host(&point.scenario.server, move || {
                BulkServer::bind(bind, &server_options)
            })?
            .context("competing flow's server")?;
        Ok(CompetingRun {
            server_thread: std::thread::spawn(move || server.serve_one(amount, timeout)),
            // The server's own address on a port no proxy intercepts: end to end.
            target: SocketAddr::new(point.server.ip(), flow.port),
            client_options: SocketOptions {
                send_buffer: None,
                recv_buffer: flow.client_recv_buffer,
                congestion_control: Some(flow.congestion_control.clone()),
            },
            amount,
            timeout,
        })
    }

    /// Runs the competing flow's client in the client host until the server closes.
    fn finish(self, point: &PointContext<'_>) -> anyhow::Result<CompetingOutcome> {
        let CompetingRun {
            server_thread,
            target,
            client_options,
            amount,
            timeout,
        } = self;
        let client = point
            .topology
            .try_in_host(&point.scenario.client, move || {
                workload::bulk_client(target, amount, &client_options, timeout)
            })?
            .context("competing flow's client")?;
        let server = server_thread
            .join()
            .map_err(|_| anyhow!("the competing flow's server thread panicked"))?
            .context("competing flow's server")?;
        Ok(CompetingOutcome {
            client,
            server_retransmits: server.retransmits,
        })
    }
}

impl CompetingOutcome {
    /// Adds the competing flow's throughput (Mbit/s, the unit the report plots the measured
    /// throughput in, so both share a plot) and retransmissions to `measurement`.
    fn record(&self, measurement: &mut Measurement) {
        let mbps = if self.client.seconds > 0.0 {
            self.client.bytes as f64 * 8.0 / self.client.seconds / 1e6
        } else {
            0.0
        };
        measurement
            .extra
            .insert(COMPETING_THROUGHPUT_METRIC.into(), mbps);
        measurement
            .retransmits
            .insert("competing-client".into(), self.client.retransmits);
        measurement
            .retransmits
            .insert("competing-server".into(), self.server_retransmits);
    }
}

/// Warm-up transfers at most before the measured one. Another is run while the local segment's
/// sender has no tcp_metrics entry for the client: Linux does not cache a connection that closes
/// in retransmission backoff (`tcp_update_metrics`), and the measured connection would start as
/// a first one. With 100 KB warm-ups at 5-10 % loss on legacy hosts about a quarter of the runs
/// need a second warm-up (`extra.warmups`; hfc-tuning's fig. 18 experiments, pinned cases:
/// `midway lab run scenarios/repro/hfc-tuning.toml --experiment fig18-10pct-legacy --experiment
/// fig18-5pct-legacy --case both-pinned --case untuned-pinned`).
const MAX_WARMUPS: u32 = 3;

/// What an unmeasured warm-up transfer left for the measured one.
struct Warmup {
    /// The local segment's sender cached the client in its tcp_metrics.
    cached: bool,
    /// The cached `reordering` of the client there, if any.
    reordering: Option<u32>,
    /// Every host's counters after the warm-up.
    netstat_before: NetstatCounters,
}

/// Runs a bulk warm-up of `bytes` (the server side already serves it and reports on
/// `server_done`), then waits until the local segment's sender cached the client.
fn warm_up(
    point: &PointContext<'_>,
    bytes: u64,
    client_options: &SocketOptions,
    timeout: Duration,
    server_done: &mpsc::Receiver<Result<(), WorkloadError>>,
) -> anyhow::Result<Warmup> {
    let (topology, scenario, target) = (point.topology, point.scenario, point.target);
    let client_options = client_options.clone();
    topology
        .try_in_host(&scenario.client, move || {
            workload::bulk_client(target, BulkAmount::Bytes(bytes), &client_options, timeout)
        })?
        .context("warm-up transfer (client)")?;
    server_done
        .recv()
        .map_err(|_| anyhow!("the bulk server thread ended during the warm-up"))?
        .context("warm-up transfer (server)")?;
    // The sender of the local segment (the proxy, or the server when direct) must
    // have cached the client before the measured connection starts.
    let sender = if point.case.kind == CaseKind::Direct {
        scenario.server.clone()
    } else {
        point.case.host.clone()
    };
    let cached = wait_tcp_metrics(topology, &sender, point.client, Duration::from_secs(3));
    Ok(Warmup {
        cached: cached.is_some(),
        reordering: cached
            .as_deref()
            .and_then(crate::netstat::cached_reordering),
        netstat_before: netstat_all(topology),
    })
}

/// Waits (bounded) until `host`'s tcp_metrics cache holds an entry for `peer`, which Linux writes
/// when a connection to it closes, and returns its entries. Only `peer`'s: a proxy also caches
/// the server when its remote segment closes, usually first, and an entry for any address would
/// let the measured connection start before the client's entry exists (and read the server's).
fn wait_tcp_metrics(
    topology: &Topology,
    host: &str,
    peer: IpAddr,
    limit: Duration,
) -> Option<Vec<TcpMetricsEntry>> {
    let deadline = std::time::Instant::now() + limit;
    let mut cache = match TcpMetricsCache::open_in(&topology.netns_path(host)) {
        Ok(cache) => cache,
        Err(error) => {
            tracing::warn!("cannot read the tcp_metrics cache of {host}: {error}");
            return None;
        }
    };
    loop {
        match cache.entries_for(peer) {
            Ok(entries) if !entries.is_empty() => return Some(entries),
            Ok(_) => {}
            Err(error) => tracing::debug!("tcp_metrics of {host}: {error}"),
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!("no tcp_metrics entry for {peer} in {host} after the warm-up");
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl MeasuredWorkload for CommandWorkload {
    fn measure(&self, point: &PointContext<'_>) -> anyhow::Result<WorkloadOutcome> {
        let values = BTreeMap::from([
            ("target", point.target.ip().to_string()),
            ("target_port", point.target.port().to_string()),
            ("server", point.server.ip().to_string()),
            ("port", self.port.to_string()),
            ("bytes", self.bytes.unwrap_or(0).to_string()),
        ]);
        let build = |argv: &[String], log: &Path| -> anyhow::Result<Command> {
            let argv = workload::expand_argv(argv, &values);
            let file =
                File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
            let mut cmd = Command::new(&argv[0]);
            cmd.args(&argv[1..])
                .stdin(Stdio::null())
                .stdout(file)
                .stderr(File::create(log.with_extension("err"))?);
            Ok(cmd)
        };
        let server_child = match &self.server {
            None => None,
            Some(server_cmd) => {
                let cmd = build(&server_cmd.argv, &point.point_dir.join("server.out"))?;
                Some(start_server_command(point.topology, server_cmd, cmd)?)
            }
        };
        let out_path = point.point_dir.join("client.out");
        let cmd = build(&self.client.argv, &out_path)?;
        let start = Instant::now();
        let mut child = point
            .topology
            .spawn(&self.client.host, cmd)
            .with_context(|| format!("cannot start `{}`", self.client.argv[0]))?;
        let status = child.wait_timeout(self.timeout)?;
        let seconds = start.elapsed().as_secs_f64();
        let Some(status) = status else {
            let _ = child.stop();
            bail!("client command did not finish within {:?}", self.timeout);
        };
        drop(server_child);
        if !status.success() {
            bail!(
                "client command failed ({status}); stderr ends with:\n{}",
                log_tail(&out_path.with_extension("err"))
            );
        }
        let stdout = fs::read_to_string(&out_path).unwrap_or_default();
        Ok(Measurement {
            bytes: self.bytes.unwrap_or(0),
            seconds,
            retransmits: BTreeMap::new(),
            extra: workload::parse_metric_lines(&stdout),
        }
        .into())
    }
}

/// Spawns a command workload's server in its host and, if it names a `listen_port`, waits
/// (bounded) until that port listens.
fn start_server_command(
    topology: &Topology,
    server_cmd: &crate::scenario::HostCommand,
    cmd: Command,
) -> anyhow::Result<HostChild> {
    let mut child = topology
        .spawn(&server_cmd.host, cmd)
        .with_context(|| format!("cannot start `{}`", server_cmd.argv[0]))?;
    if let Some(port) = server_cmd.listen_port {
        let mut ready = false;
        for _ in 0..READY_POLL_TRIES {
            if let Some(status) = child.try_wait()? {
                bail!("server command exited early ({status})");
            }
            if listening_ports(topology, &server_cmd.host)?.contains(&port) {
                ready = true;
                break;
            }
            std::thread::sleep(READY_POLL_INTERVAL);
        }
        if !ready {
            bail!("server command did not listen on port {port}");
        }
    }
    Ok(child)
}

impl MeasuredWorkload for WebWorkload {
    /// Every program the lab spawns (proxy, browser) resolves the site's names to the server's
    /// address on the client-side path, through a hosts file of this point.
    fn spawn_options(&self, server: SocketAddr, point_dir: &Path) -> anyhow::Result<SpawnOptions> {
        let names = crate::web::resolve_all(self, server.ip());
        let text = midway_labnet::hosts_file_text(&names)?;
        let path = point_dir.join("hosts");
        fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(SpawnOptions {
            hosts_file: Some(path),
        })
    }

    fn measure(&self, point: &PointContext<'_>) -> anyhow::Result<WorkloadOutcome> {
        let (topology, scenario) = (point.topology, point.scenario);
        let route = crate::web::ClientRoute {
            target: point.target,
            proxy: point
                .placement
                .and_then(|p| cases::explicit_proxy(point.case, p)),
            server: point.server,
        };
        let origin = crate::web::RunningOrigin::start(topology, &scenario.server, self)?;
        let outcome = match self.client {
            WebClient::Loader => crate::web::run_loader(topology, &scenario.client, self, &route)?,
            WebClient::Chromium => crate::web::run_chromium(
                topology,
                &scenario.client,
                self,
                &route,
                point
                    .spawn_options
                    .hosts_file
                    .as_deref()
                    .context("web point without a hosts file")?,
                point.point_dir,
            )?,
        };
        let stats = origin.stats();
        drop(origin);
        let mut m = Measurement {
            bytes: outcome.bytes,
            seconds: outcome.seconds,
            extra: outcome.extra,
            ..Measurement::default()
        };
        // What reached the origin: fewer requests than objects = a cache answered.
        m.extra.insert(
            "origin_connections".into(),
            stats.connections_accepted as f64,
        );
        m.extra
            .insert("origin_requests".into(), stats.requests_served as f64);
        Ok(m.into())
    }
}
