//! The fault campaign (issue 17): many transfers through every intercept mode and both relay
//! models, and through two midways over each peer transport, while things go wrong on purpose,
//! each checked end to end, and one number that must be 0: transfers one end saw end cleanly
//! (a FIN) although it had not received everything, or received bytes that differ from those
//! sent.
//!
//! The network is the bench's (client, router with midway, server; plain veths). The
//! two-midway paths ([`peers`]) start at the router's midway, the edge, which relays over the
//! router-server link (the peer segment) to a gateway midway in the server host, which
//! connects to the server there. What goes wrong:
//!
//! - per transfer (drawn from a seeded generator): random sizes up and down, the client or the
//!   server resetting at a random offset, slow readers, readers that stall past midway's idle
//!   timeout;
//! - on the link: random loss of the client's packets (an nftables rule in the router's own
//!   namespace, `numgen random`) and outages (the router's client-side interface down for a
//!   moment);
//! - to the process: SIGHUP reloads, binary upgrades (`--take-over`) and `kill -9` followed by
//!   a restart, at random moments.
//!
//! The two-midway paths get all of these: the router midway's faults are the edge's; the
//! gateway midway gets its own reloads, upgrades and `kill -9`, and the peer segment its own
//! loss (the same rate, on the packets to and from the gateway's ports) and outages. Only the
//! link between the gateway and the server is spared: the server lives in the gateway's host,
//! so that segment is the host's own loopback path, with no interface of its own to fault.
//!
//! Each transfer: the client sends a header (sizes, seed, where the server is to reset) and
//! `up` bytes of a stream derived from the seed, then half-closes; the server checks them and
//! sends `down` bytes, then half-closes. Each end records how its reading ended. How the two
//! records combine into an outcome is [`classify`] (pure, unit-tested).
//!
//! By job: [`plan`] (the paths, midway's config, each transfer's draw), [`peers`] (the
//! two-midway paths: keys, the edge's peers, the gateway's config), [`transfers`] (the ends),
//! [`process`] (link and process faults, midways' starts and stops) and [`tally`] (outcomes and
//! the report).

mod peers;
mod plan;
mod process;
mod tally;
mod transfers;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::netns::{BenchNet, Host};
use peers::PeerKeys;
use process::{FaultSchedule, Midways};
pub use tally::{classify, CampaignReport, EndResult, Outcome};

/// The port the server listens on for forward, SOCKS5 and HTTP CONNECT (each transparent
/// listener intercepts a port of its own, see [`plan`]).
const SERVER_PORT: u16 = 5300;
/// midway's idle timeout in the campaign: stalled readers outlast it.
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
/// No read or write of a transfer waits longer than this (a stalled reader's pause included):
/// the end of a connection whose reset the link's loss dropped (an end with nothing more to
/// send never learns of it), counted as broken. Far above anything midway leaves a live
/// connection waiting (its idle timeout, 5 s connects, the QUIC tunnel's 3 s idle timeout);
/// it was 60 s, which made one lost reset a minute of the quick campaign.
const TRANSFER_LIMIT: Duration = Duration::from_secs(20);

/// What to run.
#[derive(Debug, Clone)]
pub struct CampaignOptions {
    /// The midway binary.
    pub midway: PathBuf,
    /// Transfers through the single-midway paths (intercept modes and relays).
    pub transfers: u64,
    /// Transfers through the two-midway paths (edge and gateway, one per peer transport), on
    /// top of `transfers` and spread among them.
    pub peer_transfers: u64,
    /// Transfers running at once.
    pub concurrency: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Largest download of one transfer (bytes); sizes are log-uniform below it.
    pub max_down: u64,
    /// Largest upload.
    pub max_up: u64,
    /// Mean time between process faults (reload, upgrade, kill -9).
    pub process_fault_every: Duration,
    /// Per-mille of the client's packets the router drops (and of the peer segment's).
    pub loss_per_mille: u32,
    /// Keep the midways' configs and logs afterwards (a campaign with bad transfers always
    /// does).
    pub keep_logs: bool,
}

impl CampaignOptions {
    /// The full campaign: 100,000 transfers through one midway, 30,000 through two.
    pub fn full(midway: PathBuf) -> CampaignOptions {
        CampaignOptions {
            midway,
            transfers: 100_000,
            peer_transfers: 30_000,
            concurrency: 48,
            seed: 17,
            max_down: 4 << 20,
            max_up: 256 << 10,
            process_fault_every: Duration::from_secs(5),
            loss_per_mille: 5,
            keep_logs: false,
        }
    }

    /// The quick form for CI: 2,000 transfers through one midway, 900 through two.
    pub fn quick(midway: PathBuf) -> CampaignOptions {
        CampaignOptions {
            transfers: 2_000,
            peer_transfers: 900,
            concurrency: 32,
            max_down: 1 << 20,
            process_fault_every: Duration::from_millis(700),
            ..CampaignOptions::full(midway)
        }
    }

    /// Transfers in all, through one midway and through two.
    pub fn total_transfers(&self) -> u64 {
        self.transfers + self.peer_transfers
    }
}

/// Runs the campaign. Needs root (namespaces).
pub fn run_campaign(options: &CampaignOptions) -> anyhow::Result<CampaignReport> {
    midway_labnet::require_root().context("the fault campaign builds namespaces")?;
    let started = Instant::now();
    let net = BenchNet::build()?;
    let client_iface = net.iface(Host::Router, Host::Client).to_string();
    let peer_iface = net.iface(Host::Router, Host::Server).to_string();
    let work = tempfile_dir()?;
    let spool = work.join("spool");
    let keys = PeerKeys::generate(&options.midway, &work)?;
    let config = work.join("midway.toml");
    std::fs::write(&config, plan::midway_config(&client_iface, &spool, &keys)?)?;
    let gateway_config = work.join("gateway.toml");
    std::fs::write(&gateway_config, peers::gateway_config(&keys)?)?;
    process::install_link_faults(&net, &client_iface, &peer_iface, options.loss_per_mille)?;

    let checked = Arc::new(AtomicU64::new(0));
    let servers = transfers::Servers::start(&net, &checked);
    let binary = options.midway.clone();
    let mut gateway = Midways::new(
        "gateway",
        Host::Server,
        binary.clone(),
        gateway_config.clone(),
        work.clone(),
    );
    gateway.start(&net, false)?;
    let mut midways = Midways::new("midway", Host::Router, binary, config.clone(), work.clone());
    midways.start(&net, false)?;
    let (clients, results_rx) = transfers::start_clients(&net, options, &checked);

    // Process and link faults until the clients are done.
    let mut faults = FaultSchedule::new(options, client_iface, config);
    let mut gateway_faults = FaultSchedule::gateway(options, peer_iface, gateway_config);
    let mut client_results = Vec::new();
    let total = options.total_transfers();
    loop {
        match results_rx.recv_timeout(Duration::from_millis(50)) {
            Ok(result) => {
                client_results.push(result);
                let done = client_results.len() as u64;
                if total >= 10 && done % (total / 10) == 0 {
                    eprintln!(
                        "midway-faults: {done} of {total} transfers after {:.0} s",
                        started.elapsed().as_secs_f64()
                    );
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        faults.tick(&net, &mut midways)?;
        gateway_faults.tick(&net, &mut gateway)?;
    }
    for client in clients {
        client
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
    }
    // The servers record a broken transfer a moment after the client saw it break.
    std::thread::sleep(Duration::from_secs(3));

    // What the midways hold once everything is over, before they stop.
    let (fds_after, rss_kib_after) = holdings(midways.current()?.id());
    let (gateway_fds_after, gateway_rss_kib_after) = holdings(gateway.current()?.id());
    let spool_files_after = std::fs::read_dir(&spool).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("midway-spool-"))
            .count()
    });
    midways.stop_all();
    gateway.stop_all();
    let server_results = servers.stop()?;

    let counts = faults.counts;
    let gateway_counts = gateway_faults.counts;
    let mut report = CampaignReport {
        transfers: client_results.len() as u64,
        reloads: counts.reloads,
        upgrades: counts.upgrades,
        kills: counts.kills,
        outages: counts.outages,
        gateway_reloads: gateway_counts.reloads,
        gateway_upgrades: gateway_counts.upgrades,
        gateway_kills: gateway_counts.kills,
        peer_outages: gateway_counts.outages,
        bytes_checked: checked.load(Ordering::Relaxed),
        fds_after,
        rss_kib_after,
        spool_files_after,
        gateway_fds_after,
        gateway_rss_kib_after,
        ..CampaignReport::default()
    };
    tally::count_outcomes(&mut report, client_results, server_results);
    report.seconds = started.elapsed().as_secs_f64();
    drop(net);
    if report.truncated_or_corrupted == 0 && !options.keep_logs {
        let _ = std::fs::remove_dir_all(&work);
    } else {
        // The midways' logs (one per start) are the evidence: the bad examples name the
        // client ports to look for.
        report.logs_kept = Some(work.display().to_string());
    }
    Ok(report)
}

/// A process's open descriptors and resident memory (KiB); 0 where /proc does not say.
fn holdings(pid: u32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let rss_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0);
    (fds, rss_kib)
}

/// A fresh working directory for the campaign's config, spool and logs.
fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("midway-faults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}
