//! The case's proxy of a point: its config and command, start-up until it listens, and its
//! counters when it stops.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use midway_labnet::{HostChild, SpawnOptions, Topology};

use super::{listening_ports, log_tail, Measurement, RunContext};
use super::{READY_POLL_INTERVAL, READY_POLL_TRIES};
use crate::cases::{self, Placement, METRICS_LISTEN, PROXY_PORT};
use crate::scenario::{Case, CaseKind, Intercept};

/// Squid's folder inside a point's folder (owned by Squid's user).
const SQUID_DIR: &str = "squid";

/// Starts the case's proxy and waits until it accepts; None for `direct`.
pub(super) fn start_proxy(
    context: &RunContext,
    topology: &Topology,
    case: &Case,
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
    let Some(ProxyCommand {
        mut command,
        transparent,
        own_log,
    }) = proxy_command(context, topology, case, placement, point_dir)?
    else {
        return Ok(None);
    };
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("cannot duplicate the log file")?)
        .stderr(log);
    let child = topology
        .spawn_with(&case.host, command, spawn_options)
        .with_context(|| format!("cannot start the {} proxy", case.kind))?;
    let logs = || {
        let mut text = log_tail(&log_path);
        if let Some(own) = &own_log {
            text.push_str(&format!("\n{}:\n{}", own.display(), log_tail(own)));
        }
        text
    };
    wait_until_ready(topology, case, child, transparent, logs)
}

/// A proxy's command line, before its output is sent to the point's proxy.log.
struct ProxyCommand {
    command: Command,
    /// midway intercepting with nftables TPROXY: ready only once its table is installed.
    transparent: bool,
    /// A log of the proxy's own beside proxy.log, quoted when it fails to start.
    own_log: Option<PathBuf>,
}

/// Writes the case's proxy config into `point_dir` and builds its command; None for `direct`.
fn proxy_command(
    context: &RunContext,
    topology: &Topology,
    case: &Case,
    placement: &Placement,
    point_dir: &Path,
) -> anyhow::Result<Option<ProxyCommand>> {
    let mut own_log: Option<PathBuf> = None;
    let (command, transparent) = match case.kind {
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
    Ok(Some(ProxyCommand {
        command,
        transparent,
        own_log,
    }))
}

/// Polls (bounded) until the proxy listens on its port (and midway on its metrics port and, when
/// transparent, has its nftables table); fails with the proxy's log if it exits or never does.
fn wait_until_ready(
    topology: &Topology,
    case: &Case,
    mut child: HostChild,
    transparent: bool,
    logs: impl Fn() -> String,
) -> anyhow::Result<Option<HostChild>> {
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

/// Stops the case's proxy and adds what it counted to `measurement`: midway's metrics
/// (retransmits per segment, HTTP counters), Squid's access log. Fails when the client's traffic
/// did not pass through the proxy.
pub(super) fn stop_proxy(
    topology: &Topology,
    case: &Case,
    child: HostChild,
    point_dir: &Path,
    point_index: usize,
    measurement: &mut Measurement,
) -> anyhow::Result<()> {
    if case.kind == CaseKind::Midway {
        add_midway_metrics(topology, &case.host, point_dir, point_index, measurement)?;
    }
    let status = child.stop().context("cannot stop the proxy")?;
    tracing::debug!(?status, "proxy stopped");
    if case.kind == CaseKind::Squid {
        add_squid_counts(point_dir, measurement)?;
    }
    Ok(())
}

/// Adds midway's retransmits per segment and HTTP counters (its metrics once its connections
/// ended) to `measurement`; fails if midway accepted no connection.
fn add_midway_metrics(
    topology: &Topology,
    host: &str,
    point_dir: &Path,
    point_index: usize,
    measurement: &mut Measurement,
) -> anyhow::Result<()> {
    match settled_metrics(topology, host) {
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
        Err(error) => tracing::warn!("point {}: no proxy metrics: {error:#}", point_index),
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
