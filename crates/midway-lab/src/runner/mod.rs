//! Runs a plan: each point builds a fresh topology with a unique tag, starts its case's proxy,
//! runs the workload, writes one [`RunRecord`] line (flushed), and tears everything down. Several
//! points run at once (`jobs`, and an experiment's own `max_jobs`, see `admission`); a failed
//! point is recorded with `ok = false` and the run goes on.
//!
//! The case's proxy is in `proxy`; each workload kind's run is one impl in `workloads`.

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use midway_labnet::Topology;
use midway_report::RunRecord;
use midway_sys::netlink::{Netlink, PermanentNeighbour, Route, RouteProtocol, RouteScope};

use crate::cases::{self, Placement};
use crate::plan::{skeleton_record, Point};
use crate::scenario::{Case, CaseKind, RouteTuning, Scenario};

mod admission;
mod proxy;
mod route_tuning;
mod workloads;

use admission::Admission;
use proxy::{remove_squid_segments, start_proxies, stop_proxies};
use workloads::{measured, PointContext, WorkloadOutcome};

/// How often and how long to poll for a proxy's listener (bounded; no blind sleeps).
const READY_POLL_INTERVAL: Duration = Duration::from_millis(20);
const READY_POLL_TRIES: u32 = 500;
/// Last bytes of a proxy's log quoted in an error.
const LOG_TAIL_BYTES: usize = 1500;

/// Everything a point needs besides the point itself.
#[derive(Debug, Clone)]
pub(crate) struct RunContext {
    /// The output folder (results.jsonl, points/...).
    pub out_dir: PathBuf,
    /// Folder of the scenario file (for relative trace paths).
    pub scenario_dir: PathBuf,
    /// Scenario path as given on the command line, recorded in every line.
    pub scenario_file: String,
    pub commit: String,
    /// The source tree's state ("clean" or "dirty:<hash>"), recorded in every record.
    pub tree: Option<String>,
    /// Whether this is the short form of the scenario (`--quick`), recorded in every record.
    pub quick: bool,
    /// Topologies measured at once (`--jobs`), recorded in every record as its load policy.
    pub jobs: usize,
    /// The midway binary run as the proxy of `midway` cases.
    pub midway_bin: PathBuf,
    /// Keep each point's folder (configs, proxy logs) even when the point succeeded.
    pub keep_point_dirs: bool,
}

/// Runs `points` with `jobs` workers, appending to `results` as each finishes. `on_record` sees
/// every record (for a progress bar). Returns the records written.
pub(crate) fn run_points(
    context: &RunContext,
    points: &[Point],
    jobs: usize,
    results: &Path,
    mut on_record: impl FnMut(&RunRecord),
) -> anyhow::Result<Vec<RunRecord>> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(results)
        .with_context(|| format!("cannot open {}", results.display()))?;
    let _held = hold_bpf_congestion_controls(points);
    let queue = PointQueue {
        state: Mutex::new((0, Admission::new(jobs))),
        changed: Condvar::new(),
    };
    let (sender, receiver) = mpsc::channel::<RunRecord>();
    let mut written = Vec::with_capacity(points.len());
    std::thread::scope(|scope| -> anyhow::Result<()> {
        for worker in 0..jobs.max(1).min(points.len().max(1)) {
            let sender = sender.clone();
            let queue = &queue;
            std::thread::Builder::new()
                .name(format!("lab-worker-{worker}"))
                .spawn_scoped(scope, move || {
                    while let Some(point) = queue.next_point(points) {
                        let record = run_point(context, point);
                        queue.finished(point);
                        if sender.send(record).is_err() {
                            break;
                        }
                    }
                })
                .context("cannot start a worker thread")?;
        }
        drop(sender);
        for record in receiver {
            let line = serde_json::to_string(&record).context("cannot encode a record")?;
            writeln!(file, "{line}")
                .and_then(|_| file.flush())
                .with_context(|| format!("cannot append to {}", results.display()))?;
            on_record(&record);
            written.push(record);
        }
        Ok(())
    })?;
    Ok(written)
}

/// The points not started yet (an index into the plan) and the ones running, shared by the
/// workers: a worker waits until the next point may start ([`Admission`]).
struct PointQueue {
    state: Mutex<(usize, Admission)>,
    changed: Condvar,
}

impl PointQueue {
    fn lock(&self) -> MutexGuard<'_, (usize, Admission)> {
        // A worker that panicked left the counts as they were; the rest go on with them.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next point in plan order once it may start, or `None` when every point has started.
    /// Each wait ends when a running point finishes, and points are finite, so this returns.
    fn next_point<'p>(&self, points: &'p [Point]) -> Option<&'p Point> {
        let mut state = self.lock();
        loop {
            let (next, admission) = &mut *state;
            let point = points.get(*next)?;
            if admission.can_start(point.max_jobs) {
                admission.start(point.max_jobs);
                *next += 1;
                return Some(point);
            }
            state = self.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn finished(&self, point: &Point) {
        self.lock().1.finish(point.max_jobs);
        self.changed.notify_all();
    }
}

/// Registers midway's BPF congestion controls that the points' profiles name, for the whole
/// run. Each midway registers them when it starts, but the registration is kernel-wide and
/// belongs to the process that made it: with points in parallel, one point's midway may find
/// the names registered by another point's, which then exits and takes them along while the
/// first is still setting up its sockets. Held here, they outlive every point. `None` when no
/// profile names one, or when registering fails (each midway then reports it at its start).
fn hold_bpf_congestion_controls(points: &[Point]) -> Option<midway_bpf::Registration> {
    let mut named = Vec::new();
    for point in points {
        let Some(case) = point.scenario.cases.get(&point.case) else {
            continue;
        };
        let profiles = [
            case.midway.as_ref().map(|m| &m.profiles),
            case.chain.as_ref().map(|c| &c.profiles),
        ];
        for table in profiles.into_iter().flatten() {
            for profile in table.values() {
                let algorithm = profile
                    .get("congestion_control")
                    .and_then(toml::Value::as_str)
                    .and_then(midway_bpf::Algorithm::from_name);
                if let Some(algorithm) = algorithm {
                    if !named.contains(&algorithm) {
                        named.push(algorithm);
                    }
                }
            }
        }
    }
    if named.is_empty() {
        return None;
    }
    match midway_bpf::register(&named) {
        Ok(registration) => Some(registration),
        Err(err) => {
            tracing::warn!(error = %err, "cannot hold midway's BPF congestion controls for the run");
            None
        }
    }
}

/// The load `point` is measured under in a run of `jobs` at once: the run's `--jobs` and the
/// limit its experiment sets (`max_jobs`), with this machine's CPUs; the load average is left
/// for the run to read when it starts. A resumed run compares it with the records it continues.
pub(crate) fn load_policy(jobs: usize, point: &Point) -> midway_report::RunLoad {
    let as_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    midway_report::RunLoad {
        jobs: as_u32(jobs),
        cpus: std::thread::available_parallelism().map_or(0, |n| as_u32(n.get())),
        loadavg_1m: None,
        max_jobs: point
            .max_jobs
            .map(|_| as_u32(admission::limit_under(jobs, point.max_jobs))),
    }
}

/// Measures one point; never panics on a measurement failure, which becomes `ok = false`.
pub(crate) fn run_point(context: &RunContext, point: &Point) -> RunRecord {
    let started_at = crate::time::rfc3339_now();
    let mut record = skeleton_record(point, &context.scenario_file, &context.commit, &started_at);
    record.tree = context.tree.clone();
    record.quick = Some(context.quick);
    record.load = Some(midway_report::RunLoad {
        loadavg_1m: one_minute_load(),
        ..load_policy(context.jobs, point)
    });
    let point_dir = context.out_dir.join("points").join(format!(
        "{:05}-{}-{}-r{}",
        point.index, point.experiment, point.case, point.repetition
    ));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        measure(context, point, &point_dir)
    }))
    .unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        Err(anyhow!("internal error (panic): {text}"))
    });
    match outcome {
        Ok(measurement) => {
            record.ok = true;
            record.bytes = measurement.bytes;
            record.seconds = measurement.seconds;
            record.throughput_bps = if measurement.seconds > 0.0 {
                measurement.bytes as f64 * 8.0 / measurement.seconds
            } else {
                0.0
            };
            record.retransmits = measurement.retransmits;
            record.extra = measurement.extra;
            if !context.keep_point_dirs {
                let _ = fs::remove_dir_all(&point_dir);
            }
        }
        Err(error) => {
            record.error = Some(format!("{error:#}"));
        }
    }
    record
}

/// What a point measured; goes into its record.
#[derive(Debug, Default)]
struct Measurement {
    bytes: u64,
    seconds: f64,
    retransmits: BTreeMap<String, u64>,
    extra: BTreeMap<String, f64>,
}

/// Addresses of one point, from the built topology.
struct Addresses {
    /// Server address on its link toward the client side.
    server: SocketAddr,
    /// Client address on its link toward the server side (what the first hop's peer sees).
    client: IpAddr,
    /// The place of every host of the case's proxies on the path, in the path's order: one per
    /// chain host, else the case's host's (empty when that host is not on the path).
    placements: Vec<Placement>,
}

fn addresses(
    scenario: &Scenario,
    topology: &Topology,
    case: &Case,
    port: u16,
    point_dir: &Path,
) -> anyhow::Result<Addresses> {
    let path = scenario
        .path(&scenario.client, &scenario.server)
        .context("no path from client to server")?;
    let server_neighbour = &path[path.len() - 2];
    let server_ip = topology.try_addr(&scenario.server, server_neighbour)?;
    let server = SocketAddr::new(server_ip, port);
    let client = topology.try_addr(&path[0], &path[1])?;
    let placement_of = |host: &str, spool_dir: PathBuf| -> anyhow::Result<Option<Placement>> {
        let Some(position) = path.iter().position(|h| h == host).filter(|&p| p > 0) else {
            return Ok(None);
        };
        let toward_client = &path[position - 1];
        Ok(Some(Placement {
            server,
            proxy_addr: topology.try_addr(host, toward_client)?,
            client_prefix: topology.link_prefix(&path[0], &path[1]).to_string(),
            route_prefix: topology.link_prefix(host, toward_client).to_string(),
            client_iface: topology.iface(host, toward_client).to_string(),
            spool_dir,
        }))
    };
    let placements = match &case.chain {
        Some(chain) => {
            let mut placements = Vec::with_capacity(chain.hosts.len());
            for host in &chain.hosts {
                placements.push(
                    placement_of(host, point_dir.join(format!("spool-{host}")))?
                        .with_context(|| format!("chain host {host} is not on the path"))?,
                );
            }
            placements
        }
        None => placement_of(&case.host, point_dir.join("spool"))?
            .into_iter()
            .collect(),
    };
    Ok(Addresses {
        server,
        client,
        placements,
    })
}

fn measure(context: &RunContext, point: &Point, point_dir: &Path) -> anyhow::Result<Measurement> {
    let scenario = &point.scenario;
    if !scenario.cases.contains_key(&point.case) {
        bail!("unknown case {}", point.case);
    }
    let spec = scenario.topology_spec(&context.scenario_dir)?;
    fs::create_dir_all(point_dir)
        .with_context(|| format!("cannot create {}", point_dir.display()))?;
    let tag = midway_labnet::fresh_tag();
    let topology = Topology::build(&spec, &tag, point.seed).context("cannot build the topology")?;
    let result = measure_in(context, point, point_dir, &topology);
    if scenario.cases[&point.case].kind == CaseKind::Squid {
        // Squid (stopped by now) leaves its shared-memory segments behind.
        remove_squid_segments(&cases::squid_service_name(&tag));
    }
    let teardown = topology.teardown();
    let measurement = result?;
    teardown.context("the topology was measured but not removed cleanly")?;
    Ok(measurement)
}

/// The steps of one point on its built topology: static neighbours, the workload's spawn
/// options, route tuning, the proxy, the workload itself, then the proxy's and the hosts' counters.
fn measure_in(
    context: &RunContext,
    point: &Point,
    point_dir: &Path,
    topology: &Topology,
) -> anyhow::Result<Measurement> {
    let scenario = &point.scenario;
    let case = &scenario.cases[&point.case];
    let workload = measured(&scenario.workload);
    pin_neighbours(scenario, topology)?;
    let addresses = addresses(
        scenario,
        topology,
        case,
        scenario.workload.port(),
        point_dir,
    )?;
    let spawn_options = workload.spawn_options(addresses.server, point_dir)?;
    let placement = required_placement(case, &addresses)?;
    if let (Some(tuning), Some(placement)) = (&case.route_tuning, &placement) {
        apply_route_tuning(topology, case, tuning, placement)?;
    }
    let proxies = start_proxies(
        context,
        topology,
        case,
        &addresses.placements,
        point_dir,
        &spawn_options,
    )?;
    let target = match &placement {
        Some(p) => cases::connect_target(case, p),
        None => addresses.server,
    };
    let WorkloadOutcome {
        mut measurement,
        netstat_before,
    } = workload.measure(&PointContext {
        topology,
        scenario,
        case,
        placement: placement.as_ref(),
        target,
        server: addresses.server,
        client: addresses.client,
        point_dir,
        spawn_options: &spawn_options,
    })?;
    stop_proxies(
        topology,
        case,
        proxies,
        point_dir,
        point.index,
        &mut measurement,
    )?;
    add_netstat_deltas(topology, &netstat_before, &mut measurement);
    add_link_drops(scenario, topology, &mut measurement);
    Ok(measurement)
}

/// The place on the path of the case's host (a chain's first midway), which every case but an
/// untuned `direct` needs.
fn required_placement(case: &Case, addresses: &Addresses) -> anyhow::Result<Option<Placement>> {
    let needs_placement = case.kind != CaseKind::Direct || case.route_tuning.is_some();
    Ok(match (addresses.placements.first(), needs_placement) {
        (Some(p), _) => Some(p.clone()),
        (None, false) => None,
        (None, true) => bail!(
            "case {} needs host {} on the path from client to server",
            case.name,
            case.host
        ),
    })
}

/// Sets the case's route metrics on its host's route toward the client.
fn apply_route_tuning(
    topology: &Topology,
    case: &Case,
    tuning: &RouteTuning,
    placement: &Placement,
) -> anyhow::Result<()> {
    let Some(tuned) = route_tuning::tuned_route(tuning, placement) else {
        return Ok(());
    };
    let what = || format!("cannot tune the route in {}: `ip {tuned}`", case.host);
    let mut netlink = host_netlink(topology, &case.host)?;
    let mut route = Route::to(tuned.prefix.parse().with_context(what)?);
    route.device = Some(netlink.link_index(&tuned.device).with_context(what)?);
    route.protocol = RouteProtocol::Kernel;
    route.scope = Some(RouteScope::Link);
    route.preferred_source = Some(tuned.source);
    route.metrics = tuned.metrics.clone();
    netlink.replace_route(&route).with_context(what)
}

/// A netlink socket in `host`'s namespace.
pub(super) fn host_netlink(topology: &Topology, host: &str) -> anyhow::Result<Netlink> {
    Netlink::open_in(&topology.netns_path(host))
        .with_context(|| format!("cannot open netlink in {host}"))
}

/// Adds every host's loss-recovery counters to `measurement`.
fn add_netstat_deltas(
    topology: &Topology,
    netstat_before: &NetstatCounters,
    measurement: &mut Measurement,
) {
    // Loss-recovery counters of every host's namespace (fresh per point): on the proxy host they
    // are the proxy's two segments, and show whether a tuning such as the duplicate-ACK
    // threshold changed fast retransmits and timeouts.
    // With a warm-up transfer, only what the measured connection did (after minus before).
    for (host, counters) in netstat_all(topology) {
        for name in crate::netstat::RECORDED {
            if let Some(value) = counters.get(name) {
                let before = netstat_before
                    .get(&host)
                    .and_then(|c| c.get(name))
                    .copied()
                    .unwrap_or(0);
                measurement.extra.insert(
                    format!("{host}.{name}"),
                    value.saturating_sub(before) as f64,
                );
            }
        }
    }
}

/// Adds each link direction's dropped frames to `measurement`: all of them (`drops`), those the
/// drop-tail queue dropped (`queue_drops`; of them pure ACKs and SYNs / SYN-ACKs) and the longest
/// the queue was (`max_queue_frames`).
fn add_link_drops(scenario: &Scenario, topology: &Topology, measurement: &mut Measurement) {
    // labnet names links "a-b"; records use the scenario's link names.
    for (labnet_name, ab, ba) in topology.link_stats() {
        let name = scenario
            .links
            .iter()
            .find(|l| format!("{}-{}", l.a, l.b) == labnet_name)
            .map_or(labnet_name.clone(), |l| l.name.clone());
        for (dir, stats) in [("a_to_b", ab), ("b_to_a", ba)] {
            let drops = stats.dropped_loss_frames + stats.dropped_queue_frames;
            for (what, value) in [
                ("drops", drops),
                ("queue_drops", stats.dropped_queue_frames),
                ("queue_drops_acks", stats.dropped_queue_ack_frames),
                (
                    "queue_drops_handshakes",
                    stats.dropped_queue_handshake_frames,
                ),
                ("max_queue_frames", stats.max_queue_frames),
                // The scheduled blackouts' and the UDP impairment's drops, apart from `drops`
                // (loss and queue).
                ("outage_drops", stats.outage_drops),
                ("udp_drops", stats.udp_drops),
            ] {
                measurement
                    .extra
                    .insert(format!("{name}.{dir}.{what}"), value as f64);
            }
        }
    }
}

/// Makes every host's ARP entry for its link neighbours permanent. Without this the first packet
/// on each hop waits for ARP, which costs one extra round trip per link on the first connection:
/// 0.5 s on a GEO hop, more than a small transfer itself.
fn pin_neighbours(scenario: &Scenario, topology: &Topology) -> anyhow::Result<()> {
    for link in &scenario.links {
        for (host, neighbour) in [(&link.a, &link.b), (&link.b, &link.a)] {
            let neighbour_iface = topology.iface(neighbour, host);
            let link_address = host_netlink(topology, neighbour)?
                .link(neighbour_iface)
                .with_context(|| format!("no interface {neighbour_iface} in {neighbour}"))?
                .address
                .with_context(|| format!("no MAC address on {neighbour_iface} in {neighbour}"))?;
            let address = topology.try_addr(neighbour, host)?;
            let iface = topology.iface(host, neighbour);
            let mut netlink = host_netlink(topology, host)?;
            let pinned = PermanentNeighbour {
                address,
                link_address,
                device: netlink.link_index(iface)?,
            };
            netlink
                .replace_neighbour(&pinned)
                .with_context(|| format!("cannot pin {neighbour}'s address in {host}"))?;
        }
    }
    Ok(())
}

/// The last bytes of a log file, for error messages.
fn log_tail(path: &Path) -> String {
    let text = fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(LOG_TAIL_BYTES);
    String::from_utf8_lossy(&text[start..]).trim().to_string()
}

/// TCP ports listening in `host` (IPv4 and IPv6).
fn listening_ports(
    topology: &Topology,
    host: &str,
) -> anyhow::Result<std::collections::BTreeSet<u16>> {
    let text = topology.try_in_host(host, || {
        // /proc/thread-self/net follows this thread's namespace (/proc/self/net would follow
        // the main thread's).
        let v4 = fs::read_to_string("/proc/thread-self/net/tcp").unwrap_or_default();
        let v6 = fs::read_to_string("/proc/thread-self/net/tcp6").unwrap_or_default();
        (v4, v6)
    })?;
    let mut ports = cases::listening_ports(&text.0);
    ports.extend(cases::listening_ports(&text.1));
    Ok(ports)
}

/// `TcpExt` counters by host, then by counter name.
type NetstatCounters = BTreeMap<String, BTreeMap<String, u64>>;

/// `TcpExt` counters of every host's namespace; a host that cannot be read is left out (logged).
fn netstat_all(topology: &Topology) -> NetstatCounters {
    let mut all = BTreeMap::new();
    for host in topology.hosts().map(str::to_owned).collect::<Vec<_>>() {
        match topology.try_in_host(&host, crate::netstat::read_tcp_counters) {
            Ok(Ok(counters)) => {
                all.insert(host, counters);
            }
            Ok(Err(error)) => tracing::warn!("no netstat of {host}: {error}"),
            Err(error) => tracing::warn!("no netstat of {host}: {error}"),
        }
    }
    all
}

/// The 1-minute load average (`/proc/loadavg`), recorded with each run.
fn one_minute_load() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
