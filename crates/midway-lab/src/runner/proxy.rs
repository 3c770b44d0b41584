//! The case's proxy of a point: its config and command, start-up until it listens, and its
//! counters when it stops.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use midway_labnet::{SpawnOptions, Topology};
use midway_launch::metrics::{self, metric_sum};
use midway_launch::{Launch, LaunchError, Place, Running};
use midway_sys::command::Program;

use super::{listening_ports, log_tail, Measurement, RunContext};
use super::{READY_POLL_INTERVAL, READY_POLL_TRIES};
use crate::cases::{self, Placement, PROXY_PORT};
use crate::scenario::{Case, CaseKind, Intercept};

/// Squid's folder inside a point's folder (owned by Squid's user).
const SQUID_DIR: &str = "squid";

/// A proxy process of a point and the host it runs in.
pub(super) struct RunningProxy {
    host: String,
    process: Running,
}

/// How long a stopping proxy gets after SIGTERM before SIGKILL (labnet's own bound).
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Starts the case's proxies (none for `direct`, one per host for a `chain`, else one) and waits
/// until each accepts. A chain's midways start from the server side, so each finds the next one
/// listening when it opens its warm connections. Returned in the order of the path.
pub(super) fn start_proxies(
    context: &RunContext,
    topology: &Topology,
    case: &Case,
    placements: &[Placement],
    point_dir: &Path,
    spawn_options: &SpawnOptions,
) -> anyhow::Result<Vec<RunningProxy>> {
    let launches = proxy_commands(context, topology, case, placements, point_dir)?;
    let mut running = Vec::with_capacity(launches.len());
    for launch in launches.into_iter().rev() {
        let ProxyLaunch {
            host,
            launch,
            transparent,
            log_path,
            own_log,
        } = launch;
        let process = launch
            .log_file(&log_path)
            .stop_grace(STOP_GRACE)
            .spawn_options(spawn_options.clone())
            .spawn(Place::Host {
                topology,
                host: &host,
            })
            .with_context(|| format!("cannot start the {} proxy in {host}", case.kind))?;
        let logs = || {
            let mut text = log_tail(&log_path);
            if let Some(own) = &own_log {
                text.push_str(&format!("\n{}:\n{}", own.display(), log_tail(own)));
            }
            text
        };
        let process = wait_until_ready(topology, &host, case.kind, process, transparent, logs)?;
        running.push(RunningProxy { host, process });
    }
    running.reverse();
    Ok(running)
}

/// One proxy process to start: its host and command line, before its output is sent to its log.
struct ProxyLaunch {
    host: String,
    launch: Launch,
    /// midway intercepting with nftables TPROXY: ready only once its table is installed.
    transparent: bool,
    /// Where its stdout and stderr go.
    log_path: PathBuf,
    /// A log of the proxy's own beside its log file, quoted when it fails to start.
    own_log: Option<PathBuf>,
}

/// Variable that sets the lab's midways' log filter (`MIDWAY_LOG`'s syntax), for a look inside
/// a run: `info` logs a line per connection into each point's `proxy-HOST.log`. Unset: `warn`.
const PROXY_LOG_VAR: &str = "MIDWAY_LAB_PROXY_LOG";

/// The midway command reading `config_path`.
fn midway_command(context: &RunContext, config_path: &Path) -> Launch {
    let filter = std::env::var(PROXY_LOG_VAR).unwrap_or_else(|_| "warn".to_owned());
    Launch::midway(&context.midway_bin, config_path).env("MIDWAY_LOG", filter)
}

/// Writes `text` to `path`.
fn write_config(path: &Path, text: &str) -> anyhow::Result<()> {
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes the case's proxy configs into `point_dir` and builds their commands, in the order of
/// the path; none for `direct`. `placements` holds the case's hosts' places (one per chain host).
fn proxy_commands(
    context: &RunContext,
    topology: &Topology,
    case: &Case,
    placements: &[Placement],
    point_dir: &Path,
) -> anyhow::Result<Vec<ProxyLaunch>> {
    let single = |launch: Launch, transparent: bool, own_log: Option<PathBuf>| {
        vec![ProxyLaunch {
            host: case.host.clone(),
            launch,
            transparent,
            log_path: point_dir.join("proxy.log"),
            own_log,
        }]
    };
    let Some(placement) = placements.first() else {
        return Ok(Vec::new());
    };
    Ok(match case.kind {
        CaseKind::Direct => Vec::new(),
        CaseKind::Midway => {
            let midway = case
                .midway
                .as_ref()
                .context("midway case without settings")?;
            fs::create_dir_all(&placement.spool_dir)
                .with_context(|| format!("cannot create {}", placement.spool_dir.display()))?;
            let config_path = point_dir.join("midway.toml");
            write_config(&config_path, &cases::midway_config(midway, placement)?)?;
            single(
                midway_command(context, &config_path),
                midway.intercept == Intercept::Transparent,
                None,
            )
        }
        CaseKind::Chain => {
            let chain = case.chain.as_ref().context("chain case without settings")?;
            // A fresh key per peer segment and run: nothing outside the point's folder knows it.
            let keys: Vec<String> = (1..chain.hosts.len())
                .map(|_| cases::random_key_hex())
                .collect();
            let identities = chain_identities(chain, point_dir)?;
            let configs = cases::chain_configs(chain, placements, &keys, &identities)?;
            let mut launches = Vec::with_capacity(configs.len());
            for (index, ((host, placement), config)) in
                chain.hosts.iter().zip(placements).zip(configs).enumerate()
            {
                fs::create_dir_all(&placement.spool_dir)
                    .with_context(|| format!("cannot create {}", placement.spool_dir.display()))?;
                let config_path = point_dir.join(format!("midway-{host}.toml"));
                write_config(&config_path, &config)?;
                launches.push(ProxyLaunch {
                    host: host.clone(),
                    launch: midway_command(context, &config_path),
                    transparent: index == 0,
                    log_path: point_dir.join(format!("proxy-{host}.log")),
                    own_log: None,
                });
            }
            launches
        }
        CaseKind::Haproxy => {
            let config_path = point_dir.join("haproxy.cfg");
            write_config(&config_path, &cases::haproxy_config(placement))?;
            let launch = Launch::program("haproxy")
                .arg("-f")
                .arg(&config_path)
                .arg("-db");
            single(launch, false, None)
        }
        CaseKind::Squid => {
            let squid = case.squid.context("squid case without settings")?;
            let dir = point_dir.join(SQUID_DIR);
            prepare_squid_dir(&dir)?;
            let config_path = point_dir.join("squid.conf");
            write_config(&config_path, &cases::squid_config(&squid, placement, &dir))?;
            // -N: foreground, no daemon; runs as root until it has bound its port, then as
            // cache_effective_user. -n: a service name of this topology, which names Squid's
            // shared-memory segments, so Squids of parallel points do not share them.
            let launch = Launch::program("squid")
                .arg("-N")
                .arg("-n")
                .arg(cases::squid_service_name(topology.tag()))
                .arg("-f")
                .arg(&config_path);
            single(launch, false, Some(dir.join("cache.log")))
        }
    })
}

/// Polls (bounded) until the proxy listens on its port (and midway on its metrics port and, when
/// transparent, has its nftables table); fails with the proxy's log if it exits or never does.
/// (midway runs with `MIDWAY_LOG=warn` by default, so its ready line is not in the log: the ports are.)
fn wait_until_ready(
    topology: &Topology,
    host: &str,
    kind: CaseKind,
    mut process: Running,
    transparent: bool,
    logs: impl Fn() -> String,
) -> anyhow::Result<Running> {
    let mut wanted = vec![PROXY_PORT];
    if matches!(kind, CaseKind::Midway | CaseKind::Chain) {
        wanted.push(cases::metrics_listen().port());
    }
    let limit = READY_POLL_INTERVAL * READY_POLL_TRIES;
    let ready = process.wait_until(limit, READY_POLL_INTERVAL, "listening ports", || {
        let listening = listening_ports(topology, host)?;
        let mut ready = wanted.iter().all(|p| listening.contains(p));
        if ready && transparent {
            // midway installs its nftables table after binding; wait for it too.
            ready = Program::new("nft")
                .args(["list", "table", "inet", "midway"])
                .in_namespace(topology.netns_path(host))
                .run()
                .is_ok();
        }
        Ok::<_, anyhow::Error>(ready)
    });
    match ready {
        Ok(()) => {
            tracing::debug!(host, "proxy ready");
            Ok(process)
        }
        Err(LaunchError::Exited { status, .. }) => bail!(
            "the {kind} proxy in {host} exited during start-up ({status}); its log ends \
             with:\n{}",
            logs()
        ),
        Err(LaunchError::NotReady { .. }) => bail!(
            "the {kind} proxy in {host} did not listen on port {PROXY_PORT} within {limit:?}; its \
             log ends with:\n{}",
            logs()
        ),
        Err(other) => Err(other).context("cannot poll the proxy"),
    }
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
pub(super) fn remove_squid_segments(service: &str) {
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

/// Stops the case's proxies and adds what they counted to `measurement`: midway's metrics
/// (retransmits per segment, HTTP counters), Squid's access log. Fails when the client's traffic
/// did not pass through a proxy.
pub(super) fn stop_proxies(
    topology: &Topology,
    case: &Case,
    proxies: Vec<RunningProxy>,
    point_dir: &Path,
    point_index: usize,
    measurement: &mut Measurement,
) -> anyhow::Result<()> {
    for RunningProxy { host, process } in proxies {
        match case.kind {
            CaseKind::Midway => add_midway_metrics(
                topology,
                &host,
                MetricsLabels::single(),
                point_dir,
                point_index,
                measurement,
            )?,
            CaseKind::Chain => add_midway_metrics(
                topology,
                &host,
                MetricsLabels::chain_member(&host),
                point_dir,
                point_index,
                measurement,
            )?,
            CaseKind::Direct | CaseKind::Haproxy | CaseKind::Squid => {}
        }
        let status = process.stop().context("cannot stop the proxy")?;
        tracing::debug!(?status, host, "proxy stopped");
    }
    if case.kind == CaseKind::Squid {
        add_squid_counts(point_dir, measurement)?;
    }
    Ok(())
}

/// Where one midway's metrics go in a record: a lone midway's as `proxy-<segment>` and
/// `metrics.prom`; a chain member's under its host's name, so the midways of a chain stay apart.
struct MetricsLabels {
    retransmits_prefix: String,
    metrics_file: String,
    /// The HTTP engine's counters (a lone midway only: a chain relays TCP).
    http_counters: bool,
}

impl MetricsLabels {
    fn single() -> Self {
        MetricsLabels {
            retransmits_prefix: "proxy".into(),
            metrics_file: "metrics.prom".into(),
            http_counters: true,
        }
    }

    fn chain_member(host: &str) -> Self {
        MetricsLabels {
            retransmits_prefix: host.into(),
            metrics_file: format!("metrics-{host}.prom"),
            http_counters: false,
        }
    }
}

/// Adds a midway's retransmits per segment and HTTP counters (its metrics once its connections
/// ended) to `measurement`; fails if that midway accepted no connection.
fn add_midway_metrics(
    topology: &Topology,
    host: &str,
    labels: MetricsLabels,
    point_dir: &Path,
    point_index: usize,
    measurement: &mut Measurement,
) -> anyhow::Result<()> {
    match settled_metrics(topology, host) {
        Ok(text) => {
            // Kept with the point's folder (--keep-point-dirs) for a closer look.
            let _ = fs::write(point_dir.join(&labels.metrics_file), &text);
            // A transparent listener that intercepted nothing would measure `direct`.
            if metric_sum(&text, "connections_accepted_total") == Some(0.0) {
                bail!(
                    "the client's connection did not pass through midway in {host} (it accepted \
                     none)"
                );
            }
            for (segment, count) in cases::parse_segment_retransmits(&text) {
                measurement
                    .retransmits
                    .insert(format!("{}-{segment}", labels.retransmits_prefix), count);
            }
            if labels.http_counters {
                for (metric, key) in [
                    ("http_requests_total", "proxy_requests"),
                    ("http_cache_hits_total", "cache_hits"),
                    ("http_upstream_connects_total", "proxy_upstream_connects"),
                    ("http_upstream_reuses_total", "proxy_upstream_reuses"),
                ] {
                    if let Some(value) = metric_sum(&text, metric) {
                        measurement.extra.insert(key.into(), value);
                    }
                }
            }
        }
        Err(error) => tracing::warn!("point {point_index}: no metrics of {host}: {error:#}"),
    }
    Ok(())
}

/// Adds the requests and cache hits of Squid's access log (complete once Squid exited) to
/// `measurement`; fails if no request passed through Squid.
fn add_squid_counts(point_dir: &Path, measurement: &mut Measurement) -> anyhow::Result<()> {
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
    Ok(())
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
    let addr = cases::metrics_listen();
    Ok(topology.try_in_host(host, move || metrics::scrape(addr))??)
}

/// For an encrypted chain (`tls`, `quic`), a fresh key pair per midway, written into the point's
/// folder (`tls-HOST/peer.crt`, `peer.key`); none for `tcp`.
fn chain_identities(
    chain: &crate::scenario::ChainCase,
    point_dir: &Path,
) -> anyhow::Result<Vec<cases::ChainIdentity>> {
    if chain.transport == midway_config::TransportName::Tcp {
        return Ok(Vec::new());
    }
    chain
        .hosts
        .iter()
        .map(|host| {
            let dir = point_dir.join(format!("tls-{host}"));
            let identity = midway_tls::generate_identity(host, Duration::from_secs(7 * 86_400))
                .with_context(|| format!("key pair for {host}"))?;
            midway_tls::write_identity(&dir, &identity)
                .with_context(|| format!("cannot write {}", dir.display()))?;
            Ok(cases::ChainIdentity {
                cert: dir.join(midway_tls::CERT_FILE),
                key: dir.join(midway_tls::KEY_FILE),
                fingerprint: identity.fingerprint.to_string(),
            })
        })
        .collect()
}
