//! The fault campaign (issue 17): many transfers through every intercept mode and both relay
//! models while things go wrong on purpose, each checked end to end, and one number that must
//! be 0: transfers one end saw end cleanly (a FIN) although it had not received everything, or
//! received bytes that differ from those sent.
//!
//! The network is the bench's (client, router with midway, server; plain veths). What goes
//! wrong:
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
//! Each transfer: the client sends a header (sizes, seed, where the server is to reset) and
//! `up` bytes of a stream derived from the seed, then half-closes; the server checks them and
//! sends `down` bytes, then half-closes. Each end records how its reading ended. How the two
//! records combine into an outcome is [`classify`] (pure, unit-tested).
//!
//! By job: [`plan`] (the paths, midway's config, each transfer's draw), [`transfers`] (the
//! ends), [`process`] (link and process faults, midway's starts and stops) and [`tally`]
//! (outcomes and the report).

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
use process::{FaultSchedule, Midways};
pub use tally::{classify, CampaignReport, EndResult, Outcome};

/// The port the server listens on for forward, SOCKS5 and HTTP CONNECT (each transparent
/// listener intercepts a port of its own, see [`plan`]).
const SERVER_PORT: u16 = 5300;
/// midway's idle timeout in the campaign: stalled readers outlast it.
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
/// No transfer may take longer than this (a stalled one included).
const TRANSFER_LIMIT: Duration = Duration::from_secs(60);

/// What to run.
#[derive(Debug, Clone)]
pub struct CampaignOptions {
    /// The midway binary.
    pub midway: PathBuf,
    /// Transfers in all.
    pub transfers: u64,
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
    /// Per-mille of the client's packets the router drops.
    pub loss_per_mille: u32,
}

impl CampaignOptions {
    /// The full campaign: 100,000 transfers.
    pub fn full(midway: PathBuf) -> CampaignOptions {
        CampaignOptions {
            midway,
            transfers: 100_000,
            concurrency: 48,
            seed: 17,
            max_down: 4 << 20,
            max_up: 256 << 10,
            process_fault_every: Duration::from_secs(5),
            loss_per_mille: 5,
        }
    }

    /// The quick form for CI: about 2,000 transfers.
    pub fn quick(midway: PathBuf) -> CampaignOptions {
        CampaignOptions {
            transfers: 2_000,
            concurrency: 32,
            max_down: 1 << 20,
            process_fault_every: Duration::from_millis(700),
            ..CampaignOptions::full(midway)
        }
    }
}

/// Runs the campaign. Needs root (namespaces).
pub fn run_campaign(options: &CampaignOptions) -> anyhow::Result<CampaignReport> {
    midway_labnet::require_root().context("the fault campaign builds namespaces")?;
    let started = Instant::now();
    let net = BenchNet::build()?;
    let client_iface = net.iface(Host::Router, Host::Client).to_string();
    let work = tempfile_dir()?;
    let spool = work.join("spool");
    let config = work.join("midway.toml");
    std::fs::write(&config, plan::midway_config(&client_iface, &spool)?)?;
    process::install_link_faults(&net, &client_iface, options.loss_per_mille)?;

    let checked = Arc::new(AtomicU64::new(0));
    let servers = transfers::Servers::start(&net, &checked);
    let mut midways = Midways::new(options.midway.clone(), config.clone(), work.clone());
    midways.start(&net, false)?;
    let (clients, results_rx) = transfers::start_clients(&net, options, &checked);

    // Process and link faults until the clients are done.
    let mut faults = FaultSchedule::new(options, client_iface, config);
    let mut client_results = Vec::new();
    loop {
        match results_rx.recv_timeout(Duration::from_millis(50)) {
            Ok(result) => {
                client_results.push(result);
                let done = client_results.len() as u64;
                if options.transfers >= 10 && done % (options.transfers / 10) == 0 {
                    eprintln!(
                        "midway-faults: {done} of {} transfers after {:.0} s",
                        options.transfers,
                        started.elapsed().as_secs_f64()
                    );
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        faults.tick(&net, &mut midways)?;
    }
    for client in clients {
        client
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
    }
    // The servers record a broken transfer a moment after the client saw it break.
    std::thread::sleep(Duration::from_secs(3));

    // What midway holds once everything is over, before it stops.
    let pid = midways.current()?.id();
    let fds_after = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let rss_kib_after = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0);
    let spool_files_after = std::fs::read_dir(&spool).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("midway-spool-"))
            .count()
    });
    midways.stop_all();
    let server_results = servers.stop()?;

    let counts = faults.counts;
    let mut report = CampaignReport {
        transfers: client_results.len() as u64,
        reloads: counts.reloads,
        upgrades: counts.upgrades,
        kills: counts.kills,
        outages: counts.outages,
        bytes_checked: checked.load(Ordering::Relaxed),
        fds_after,
        rss_kib_after,
        spool_files_after,
        ..CampaignReport::default()
    };
    tally::count_outcomes(&mut report, client_results, server_results);
    report.seconds = started.elapsed().as_secs_f64();
    drop(net);
    let _ = std::fs::remove_dir_all(&work);
    Ok(report)
}

/// A fresh working directory for the campaign's config, spool and logs.
fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("midway-faults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}
