//! Runs a plan: each point builds a fresh topology with a unique tag, starts its case's proxy,
//! runs the workload, writes one [`RunRecord`] line (flushed), and tears everything down. Several
//! points run at once (`jobs`); a failed point is recorded with `ok = false` and the run goes on.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use midway_labnet::{HostChild, SpawnOptions, Topology};
use midway_report::RunRecord;

use crate::cases::{self, Placement, METRICS_LISTEN, PROXY_PORT};
use crate::plan::{skeleton_record, Point};
use crate::scenario::{CaseKind, Intercept, Scenario, WebClient, Workload};
use crate::workload::{self, BulkServer, SocketOptions};

/// How often and how long to poll for a proxy's listener (bounded; no blind sleeps).
const READY_POLL_INTERVAL: Duration = Duration::from_millis(20);
const READY_POLL_TRIES: u32 = 500;
/// Last bytes of a proxy's log quoted in an error.
const LOG_TAIL_BYTES: usize = 1500;
/// Squid's folder inside a point's folder (owned by Squid's user).
const SQUID_DIR: &str = "squid";

/// Everything a point needs besides the point itself.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// The output folder (results.jsonl, points/...).
    pub out_dir: PathBuf,
    /// Folder of the scenario file (for relative trace paths).
    pub scenario_dir: PathBuf,
    /// Scenario path as given on the command line, recorded in every line.
    pub scenario_file: String,
    pub commit: String,
    /// The midway binary run as the proxy of `midway` cases.
    pub midway_bin: PathBuf,
    /// Keep each point's folder (configs, proxy logs) even when the point succeeded.
    pub keep_point_dirs: bool,
}

/// Runs `points` with `jobs` workers, appending to `results` as each finishes. `on_record` sees
/// every record (for a progress bar). Returns the records written.
pub fn run_points(
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
    let next = AtomicUsize::new(0);
    let (sender, receiver) = mpsc::channel::<RunRecord>();
    let mut written = Vec::with_capacity(points.len());
    std::thread::scope(|scope| -> anyhow::Result<()> {
        for worker in 0..jobs.max(1).min(points.len().max(1)) {
            let sender = sender.clone();
            let next = &next;
            std::thread::Builder::new()
                .name(format!("lab-worker-{worker}"))
                .spawn_scoped(scope, move || loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(point) = points.get(index) else {
                        break;
                    };
                    if sender.send(run_point(context, point)).is_err() {
                        break;
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

/// Measures one point; never panics on a measurement failure, which becomes `ok = false`.
pub fn run_point(context: &RunContext, point: &Point) -> RunRecord {
    let started_at = crate::time::rfc3339_now();
    let mut record = skeleton_record(point, &context.scenario_file, &context.commit, &started_at);
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
    placement: Option<Placement>,
}

fn addresses(
    scenario: &Scenario,
    topology: &Topology,
    proxy_host: &str,
    port: u16,
    point_dir: &Path,
) -> anyhow::Result<Addresses> {
    let path = scenario
        .path(&scenario.client, &scenario.server)
        .context("no path from client to server")?;
    let server_neighbour = &path[path.len() - 2];
    let server_ip = topology.try_addr(&scenario.server, server_neighbour)?;
    let server = SocketAddr::new(server_ip, port);
    let placement = match path.iter().position(|h| h == proxy_host) {
        Some(position) if position > 0 => {
            let toward_client = &path[position - 1];
            Some(Placement {
                server,
                proxy_addr: topology.try_addr(proxy_host, toward_client)?,
                client_prefix: topology.link_prefix(&path[0], &path[1]).to_string(),
                route_prefix: topology.link_prefix(proxy_host, toward_client).to_string(),
                client_iface: topology.iface(proxy_host, toward_client).to_string(),
                spool_dir: point_dir.join("spool"),
            })
        }
        _ => None,
    };
    Ok(Addresses { server, placement })
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

fn measure_in(
    context: &RunContext,
    point: &Point,
    point_dir: &Path,
    topology: &Topology,
) -> anyhow::Result<Measurement> {
    let scenario = &point.scenario;
    let case = &scenario.cases[&point.case];
    let port = scenario.workload.port();
    pin_neighbours(scenario, topology)?;
    let addresses = addresses(scenario, topology, &case.host, port, point_dir)?;
    // Web: every program the lab spawns (proxy, browser) resolves the site's names to the
    // server's address on the client-side path, through a hosts file of this point.
    let spawn_options = match &scenario.workload {
        Workload::Web(web) => {
            let names = crate::web::resolve_all(web, addresses.server.ip());
            let text = midway_labnet::hosts_file_text(&names)?;
            let path = point_dir.join("hosts");
            fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
            SpawnOptions {
                hosts_file: Some(path),
            }
        }
        Workload::Bulk(_) | Workload::Command(_) => SpawnOptions::default(),
    };
    let needs_placement = case.kind != CaseKind::Direct || case.route_tuning.is_some();
    let placement = match (&addresses.placement, needs_placement) {
        (Some(p), _) => Some(p.clone()),
        (None, false) => None,
        (None, true) => bail!(
            "case {} needs host {} on the path from client to server",
            case.name,
            case.host
        ),
    };

    if let (Some(tuning), Some(placement)) = (&case.route_tuning, &placement) {
        if let Some(args) = cases::route_tuning_args(tuning, placement) {
            let output = topology
                .command(&case.host, "ip")
                .args(&args)
                .output()
                .context("cannot run ip route")?;
            if !output.status.success() {
                bail!(
                    "ip {} failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&output.stderr).trim()
                );
            }
        }
    }

    let mut proxy = start_proxy(
        context,
        topology,
        case,
        placement.as_ref(),
        point_dir,
        &spawn_options,
    )?;
    let target = match &placement {
        Some(p) => cases::connect_target(case, p),
        None => addresses.server,
    };

    let mut netstat_before: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut warmup_cached: Option<bool> = None;
    let mut warmup_reordering: Option<u32> = None;
    let mut measurement = match &scenario.workload {
        Workload::Bulk(bulk) => {
            let server_options = SocketOptions {
                send_buffer: bulk.server_send_buffer,
                recv_buffer: None,
                congestion_control: bulk.server_congestion_control.clone(),
            };
            let client_options = SocketOptions {
                send_buffer: None,
                recv_buffer: bulk.client_recv_buffer,
                congestion_control: bulk.client_congestion_control.clone(),
            };
            let bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), bulk.port);
            let server = topology
                .try_in_host(&scenario.server, move || {
                    BulkServer::bind(bind, &server_options)
                })?
                .context("bulk server")?;
            let (bytes, timeout) = (bulk.bytes, bulk.timeout);
            let connections = bulk.connections;
            let warmup = bulk.warmup_bytes;
            let (warm_tx, warm_rx) = std::sync::mpsc::channel();
            let server_thread = std::thread::spawn(move || {
                if let Some(warmup) = warmup {
                    let outcome = server.serve_one(warmup, timeout).map(|_| ());
                    let failed = outcome.is_err();
                    // The warm-up's error goes to the client side, which stops there.
                    let _ = warm_tx.send(outcome);
                    if failed {
                        return Ok(None);
                    }
                }
                server.serve_many(connections, bytes, timeout).map(Some)
            });
            if let Some(warmup) = warmup {
                let client_options = client_options.clone();
                topology
                    .try_in_host(&scenario.client, move || {
                        workload::bulk_client(target, warmup, &client_options, timeout)
                    })?
                    .context("warm-up transfer (client)")?;
                warm_rx
                    .recv()
                    .map_err(|_| anyhow!("the bulk server thread ended during the warm-up"))?
                    .context("warm-up transfer (server)")?;
                // The sender of the local segment (the proxy, or the server when direct) must
                // have cached the client before the measured connection starts.
                let sender = if case.kind == CaseKind::Direct {
                    scenario.server.clone()
                } else {
                    case.host.clone()
                };
                let cached = wait_tcp_metrics(topology, &sender, Duration::from_secs(3));
                warmup_cached = Some(cached.is_some());
                warmup_reordering = cached
                    .as_deref()
                    .and_then(crate::netstat::cached_reordering);
                netstat_before = netstat_all(topology);
            }
            let client = topology
                .try_in_host(&scenario.client, move || {
                    workload::bulk_clients(target, connections, bytes, &client_options, timeout)
                })?
                .context("bulk client");
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
            if let Some(cached) = warmup_cached {
                m.extra
                    .insert("warmup_metrics_cached".into(), f64::from(u8::from(cached)));
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
            m
        }
        Workload::Command(command) => {
            run_command_workload(topology, command, target, addresses.server, point_dir)?
        }
        Workload::Web(web) => {
            let route = crate::web::ClientRoute {
                target,
                proxy: placement
                    .as_ref()
                    .and_then(|p| cases::explicit_proxy(case, p)),
                server: addresses.server,
            };
            let origin = crate::web::RunningOrigin::start(topology, &scenario.server, web)?;
            let outcome = match web.client {
                WebClient::Loader => {
                    crate::web::run_loader(topology, &scenario.client, web, &route)?
                }
                WebClient::Chromium => crate::web::run_chromium(
                    topology,
                    &scenario.client,
                    web,
                    &route,
                    spawn_options
                        .hosts_file
                        .as_deref()
                        .context("web point without a hosts file")?,
                    point_dir,
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
            m
        }
    };

    if let Some(child) = proxy.take() {
        if case.kind == CaseKind::Midway {
            match settled_metrics(topology, &case.host) {
                Ok(text) => {
                    // Kept with the point's folder (--keep-point-dirs) for a closer look.
                    let _ = fs::write(point_dir.join("metrics.prom"), &text);
                    // A transparent listener that intercepted nothing would measure `direct`.
                    if cases::metric_sum(&text, "connections_accepted_total") == Some(0.0) {
                        bail!("the client's connection did not pass through midway (it accepted none)");
                    }
                    for (segment, count) in cases::parse_segment_retransmits(&text) {
                        measurement
                            .retransmits
                            .insert(format!("proxy-{segment}"), count);
                    }
                    // The HTTP engine's counters (absent for a TCP listener).
                    for (metric, key) in [
                        ("http_requests_total", "proxy_requests"),
                        ("http_cache_hits_total", "cache_hits"),
                        ("http_upstream_connects_total", "proxy_upstream_connects"),
                        ("http_upstream_reuses_total", "proxy_upstream_reuses"),
                    ] {
                        if let Some(value) = cases::metric_sum(&text, metric) {
                            measurement.extra.insert(key.into(), value);
                        }
                    }
                }
                Err(error) => tracing::warn!("point {}: no proxy metrics: {error:#}", point.index),
            }
        }
        let status = child.stop().context("cannot stop the proxy")?;
        tracing::debug!(?status, "proxy stopped");
        if case.kind == CaseKind::Squid {
            // Squid has written its access log by the time it exits.
            let log = cases::squid_access_log(&point_dir.join(SQUID_DIR));
            let text = fs::read_to_string(&log)
                .with_context(|| format!("cannot read Squid's access log {}", log.display()))?;
            let summary = cases::parse_squid_access_log(&text);
            if summary.requests == 0 {
                bail!("the client's requests did not pass through Squid (its access log is empty)");
            }
            measurement
                .extra
                .insert("proxy_requests".into(), summary.requests as f64);
            measurement
                .extra
                .insert("cache_hits".into(), summary.cache_hits as f64);
        }
    }

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

    // labnet names links "a-b"; records use the scenario's link names.
    for (labnet_name, ab, ba) in topology.link_stats() {
        let name = scenario
            .links
            .iter()
            .find(|l| format!("{}-{}", l.a, l.b) == labnet_name)
            .map_or(labnet_name.clone(), |l| l.name.clone());
        for (dir, stats) in [("a_to_b", ab), ("b_to_a", ba)] {
            let drops = stats.dropped_loss_frames + stats.dropped_queue_frames;
            measurement
                .extra
                .insert(format!("{name}.{dir}.drops"), drops as f64);
        }
    }
    Ok(measurement)
}

/// Makes every host's ARP entry for its link neighbours permanent. Without this the first packet
/// on each hop waits for ARP, which costs one extra round trip per link on the first connection:
/// 0.5 s on a GEO hop, more than a small transfer itself.
fn pin_neighbours(scenario: &Scenario, topology: &Topology) -> anyhow::Result<()> {
    let run = |host: &str, args: &[&str]| -> anyhow::Result<String> {
        let output = topology
            .command(host, "ip")
            .args(args)
            .output()
            .context("cannot run ip")?;
        if !output.status.success() {
            bail!(
                "ip {} in {host} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    };
    for link in &scenario.links {
        for (host, neighbour) in [(&link.a, &link.b), (&link.b, &link.a)] {
            let neighbour_iface = topology.iface(neighbour, host).to_string();
            let shown = run(neighbour, &["-o", "link", "show", "dev", &neighbour_iface])?;
            let mac = shown
                .split_whitespace()
                .skip_while(|word| *word != "link/ether")
                .nth(1)
                .with_context(|| format!("no MAC address in `{}`", shown.trim()))?
                .to_string();
            let address = topology.try_addr(neighbour, host)?.to_string();
            let iface = topology.iface(host, neighbour).to_string();
            run(
                host,
                &[
                    "neigh",
                    "replace",
                    &address,
                    "lladdr",
                    &mac,
                    "dev",
                    &iface,
                    "nud",
                    "permanent",
                ],
            )?;
        }
    }
    Ok(())
}

/// Starts the case's proxy and waits until it accepts; None for `direct`.
fn start_proxy(
    context: &RunContext,
    topology: &Topology,
    case: &crate::scenario::Case,
    placement: Option<&Placement>,
    point_dir: &Path,
    spawn_options: &SpawnOptions,
) -> anyhow::Result<Option<HostChild>> {
    let Some(placement) = placement else {
        return Ok(None);
    };
    let log_path = point_dir.join("proxy.log");
    let log =
        File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
    // A log of the proxy's own beside proxy.log, quoted when it fails to start.
    let mut own_log: Option<PathBuf> = None;
    let (mut command, transparent) = match case.kind {
        CaseKind::Direct => return Ok(None),
        CaseKind::Midway => {
            let midway = case
                .midway
                .as_ref()
                .context("midway case without settings")?;
            fs::create_dir_all(&placement.spool_dir)
                .with_context(|| format!("cannot create {}", placement.spool_dir.display()))?;
            let config = cases::midway_config(midway, placement)?;
            let config_path = point_dir.join("midway.toml");
            fs::write(&config_path, config)
                .with_context(|| format!("cannot write {}", config_path.display()))?;
            let mut command = Command::new(&context.midway_bin);
            command
                .args(["proxy", "--config"])
                .arg(&config_path)
                .env("MIDWAY_LOG", "warn");
            (command, midway.intercept == Intercept::Transparent)
        }
        CaseKind::Haproxy => {
            let config_path = point_dir.join("haproxy.cfg");
            fs::write(&config_path, cases::haproxy_config(placement))
                .with_context(|| format!("cannot write {}", config_path.display()))?;
            let mut command = Command::new("haproxy");
            command.arg("-f").arg(&config_path).arg("-db");
            (command, false)
        }
        CaseKind::Squid => {
            let squid = case.squid.context("squid case without settings")?;
            let dir = point_dir.join(SQUID_DIR);
            prepare_squid_dir(&dir)?;
            let config_path = point_dir.join("squid.conf");
            fs::write(&config_path, cases::squid_config(&squid, placement, &dir))
                .with_context(|| format!("cannot write {}", config_path.display()))?;
            own_log = Some(dir.join("cache.log"));
            let mut command = Command::new("squid");
            // -N: foreground, no daemon; runs as root until it has bound its port, then as
            // cache_effective_user. -n: a service name of this topology, which names Squid's
            // shared-memory segments, so Squids of parallel points do not share them.
            command
                .arg("-N")
                .arg("-n")
                .arg(cases::squid_service_name(topology.tag()))
                .arg("-f")
                .arg(&config_path);
            (command, false)
        }
    };
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("cannot duplicate the log file")?)
        .stderr(log);
    let mut child = topology
        .spawn_with(&case.host, command, spawn_options)
        .with_context(|| format!("cannot start the {} proxy", case.kind))?;
    let logs = || {
        let mut text = log_tail(&log_path);
        if let Some(own) = &own_log {
            text.push_str(&format!("\n{}:\n{}", own.display(), log_tail(own)));
        }
        text
    };
    let mut wanted = vec![PROXY_PORT];
    if case.kind == CaseKind::Midway {
        let metrics_port: SocketAddr = METRICS_LISTEN.parse().expect("constant address");
        wanted.push(metrics_port.port());
    }
    for attempt in 0..READY_POLL_TRIES {
        if let Some(status) = child.try_wait().context("cannot poll the proxy")? {
            bail!(
                "the {} proxy exited during start-up ({status}); its log ends with:\n{}",
                case.kind,
                logs()
            );
        }
        let listening = listening_ports(topology, &case.host)?;
        let mut ready = wanted.iter().all(|p| listening.contains(p));
        if ready && transparent {
            // midway installs its nftables table after binding; wait for it too.
            ready = topology
                .command(&case.host, "nft")
                .args(["list", "table", "inet", "midway"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
        }
        if ready {
            tracing::debug!(attempt, "proxy ready");
            return Ok(Some(child));
        }
        std::thread::sleep(READY_POLL_INTERVAL);
    }
    bail!(
        "the {} proxy did not listen on port {PROXY_PORT} within {:?}; its log ends with:\n{}",
        case.kind,
        READY_POLL_INTERVAL * READY_POLL_TRIES,
        logs()
    )
}

/// Makes Squid's folder, owned by its user, and checks that the user can reach it (Squid drops
/// to that user before it opens its logs).
fn prepare_squid_dir(dir: &Path) -> anyhow::Result<()> {
    let user = nix::unistd::User::from_name(cases::SQUID_USER)
        .context("cannot look up Squid's user")?
        .with_context(|| {
            format!(
                "no user `{}` (Debian's squid package creates it: apt-get install squid)",
                cases::SQUID_USER
            )
        })?;
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    nix::unistd::chown(dir, Some(user.uid), Some(user.gid))
        .with_context(|| format!("cannot give {} to {}", dir.display(), cases::SQUID_USER))?;
    if let Some(blocked) = untraversable_ancestor(dir, user.uid.as_raw(), user.gid.as_raw()) {
        bail!(
            "Squid runs as user `{}`, which cannot enter {} (mode {:o}); use an --out folder \
             that others may traverse (chmod o+x)",
            cases::SQUID_USER,
            blocked.0.display(),
            blocked.1
        );
    }
    Ok(())
}

/// Removes `/dev/shm/<service>-*` (Squid's segments of one point; the name is unique to it).
fn remove_squid_segments(service: &str) {
    let prefix = format!("{service}-");
    let Ok(entries) = fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            if let Err(error) = fs::remove_file(entry.path()) {
                tracing::warn!("cannot remove {}: {error}", entry.path().display());
            }
        }
    }
}

/// The first folder on the way to `dir` (from `/`) that `uid`/`gid` may not enter, with its mode.
fn untraversable_ancestor(dir: &Path, uid: u32, gid: u32) -> Option<(PathBuf, u32)> {
    use std::os::unix::fs::MetadataExt;
    let absolute = std::path::absolute(dir).ok()?;
    let mut walked = PathBuf::new();
    for part in absolute.components() {
        walked.push(part);
        let metadata = fs::metadata(&walked).ok()?;
        if !cases::may_traverse(metadata.mode(), metadata.uid(), metadata.gid(), uid, gid) {
            return Some((walked, metadata.mode() & 0o7777));
        }
    }
    None
}

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

/// midway's metrics once its connections have ended (it records a connection's retransmits when
/// the connection closes, which may be a moment after the client saw the last byte).
fn settled_metrics(topology: &Topology, host: &str) -> anyhow::Result<String> {
    let mut text = scrape_metrics(topology, host)?;
    for _ in 0..READY_POLL_TRIES {
        if cases::active_connections(&text).is_none_or(|active| active == 0.0) {
            return Ok(text);
        }
        std::thread::sleep(READY_POLL_INTERVAL);
        text = scrape_metrics(topology, host)?;
    }
    bail!("midway still reports active connections after the transfer ended")
}

/// GET /metrics from midway's endpoint inside `host`.
fn scrape_metrics(topology: &Topology, host: &str) -> anyhow::Result<String> {
    let text = topology.try_in_host(host, || -> io::Result<String> {
        let addr: SocketAddr = METRICS_LISTEN.parse().expect("constant address");
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    })??;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1).is_none_or(|c| c != "200") {
        bail!(
            "metrics endpoint answered: {}",
            head.lines().next().unwrap_or("")
        );
    }
    Ok(body.to_string())
}

fn run_command_workload(
    topology: &Topology,
    command: &crate::scenario::CommandWorkload,
    target: SocketAddr,
    server: SocketAddr,
    point_dir: &Path,
) -> anyhow::Result<Measurement> {
    let values = BTreeMap::from([
        ("target", target.ip().to_string()),
        ("target_port", target.port().to_string()),
        ("server", server.ip().to_string()),
        ("port", command.port.to_string()),
        ("bytes", command.bytes.unwrap_or(0).to_string()),
    ]);
    let build = |argv: &[String], log: &Path| -> anyhow::Result<Command> {
        let argv = workload::expand_argv(argv, &values);
        let file = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(File::create(log.with_extension("err"))?);
        Ok(cmd)
    };
    let server_child = match &command.server {
        None => None,
        Some(server_cmd) => {
            let cmd = build(&server_cmd.argv, &point_dir.join("server.out"))?;
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
            Some(child)
        }
    };
    let out_path = point_dir.join("client.out");
    let cmd = build(&command.client.argv, &out_path)?;
    let start = Instant::now();
    let mut child = topology
        .spawn(&command.client.host, cmd)
        .with_context(|| format!("cannot start `{}`", command.client.argv[0]))?;
    let status = child.wait_timeout(command.timeout)?;
    let seconds = start.elapsed().as_secs_f64();
    let Some(status) = status else {
        let _ = child.stop();
        bail!("client command did not finish within {:?}", command.timeout);
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
        bytes: command.bytes.unwrap_or(0),
        seconds,
        retransmits: BTreeMap::new(),
        extra: workload::parse_metric_lines(&stdout),
    })
}

/// `TcpExt` counters of every host's namespace; a host that cannot be read is left out (logged).
fn netstat_all(topology: &Topology) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut all = BTreeMap::new();
    for host in topology.hosts().map(str::to_owned).collect::<Vec<_>>() {
        match topology.try_in_host(&host, crate::netstat::read_tcp_ext) {
            Ok(Ok(counters)) => {
                all.insert(host, counters);
            }
            Ok(Err(error)) => tracing::warn!("no netstat of {host}: {error}"),
            Err(error) => tracing::warn!("no netstat of {host}: {error}"),
        }
    }
    all
}

/// Waits (bounded) until `host`'s tcp_metrics cache holds an entry, which Linux writes when a
/// connection closes; true if it appeared. A proxy closes its sockets shortly after the client.
fn wait_tcp_metrics(topology: &Topology, host: &str, limit: Duration) -> Option<String> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let listed = topology
            .command(host, "ip")
            .args(["tcp_metrics", "show"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|text| !text.is_empty());
        if listed.is_some() {
            return listed;
        }
        if std::time::Instant::now() >= deadline {
            tracing::warn!("no tcp_metrics entry in {host} after the warm-up");
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
