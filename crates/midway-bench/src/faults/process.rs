//! What goes wrong outside the transfers: the links (random loss and outages, through an
//! nftables table in the router's own namespace) and the midway processes (SIGHUP reloads,
//! binary upgrades with `--take-over`, `kill -9` and a restart), at random moments from the
//! campaign's seed. midway is started, waited for and stopped through `midway-launch`.
//!
//! Two schedules run side by side: the router midway's (every path's first midway, the edge of
//! the two-midway paths) with outages of the client link, and the gateway midway's with
//! outages of the peer segment only (the edge-gateway traffic on the router-server link, by
//! the gateway's ports, so the single-midway paths' server segment stays as it was).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use midway_launch::{Launch, Running};

use super::peers::GATEWAY_FIRST_PORT;
use super::plan::Rng;
use super::CampaignOptions;
use crate::netns::{BenchNet, Host};

/// How long a midway may take to say it is ready (or took over).
const START_LIMIT: Duration = Duration::from_secs(30);
/// How long a stopped midway gets to drain before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// The set of the client link's outages (its element: the router's client-side interface).
const CLIENT_OUTAGE_SET: &str = "outage";
/// The set of the peer segment's outages (its element: the router's server-side interface).
const PEER_OUTAGE_SET: &str = "peer_outage";

/// The nftables table of the campaign's link faults, in the router's namespace only: random
/// loss of packets on the client-side interface and an outage set; the same for the peer
/// segment, the packets on the server-side interface (`peer_iface`) to and from the gateway's
/// peer ports (TCP and UDP).
fn link_faults_table(client_iface: &str, peer_iface: &str, loss_per_mille: u32) -> String {
    let ports = format!("{}-{}", GATEWAY_FIRST_PORT, GATEWAY_FIRST_PORT + 2);
    format!(
        "table inet mwfaults {{\n\
         \x20 set {CLIENT_OUTAGE_SET} {{ type ifname; }}\n\
         \x20 set {PEER_OUTAGE_SET} {{ type ifname; }}\n\
         \x20 chain in {{ type filter hook prerouting priority -350; policy accept;\n\
         \x20   iifname @{CLIENT_OUTAGE_SET} drop\n\
         \x20   iifname \"{client_iface}\" numgen random mod 1000 < {loss_per_mille} drop\n\
         \x20   iifname @{PEER_OUTAGE_SET} meta l4proto {{ tcp, udp }} th sport {ports} drop\n\
         \x20   iifname \"{peer_iface}\" meta l4proto {{ tcp, udp }} th sport {ports} \
                 numgen random mod 1000 < {loss_per_mille} drop\n\
         \x20 }}\n\
         \x20 chain out {{ type filter hook postrouting priority 350; policy accept;\n\
         \x20   oifname @{CLIENT_OUTAGE_SET} drop\n\
         \x20   oifname \"{client_iface}\" numgen random mod 1000 < {loss_per_mille} drop\n\
         \x20   oifname @{PEER_OUTAGE_SET} meta l4proto {{ tcp, udp }} th dport {ports} drop\n\
         \x20   oifname \"{peer_iface}\" meta l4proto {{ tcp, udp }} th dport {ports} \
                 numgen random mod 1000 < {loss_per_mille} drop\n\
         \x20 }}\n\
         }}\n"
    )
}

/// Installs the link-fault table in the router.
pub(super) fn install_link_faults(
    net: &BenchNet,
    client_iface: &str,
    peer_iface: &str,
    loss_per_mille: u32,
) -> anyhow::Result<()> {
    net.run_with_stdin(
        Host::Router,
        "nft",
        &["-f", "-"],
        &link_faults_table(client_iface, peer_iface, loss_per_mille),
    )
    .context("cannot install the link-fault table")?;
    Ok(())
}

/// One midway's running processes, newest last (an upgrade leaves the old one draining).
pub(super) struct Midways {
    name: &'static str,
    host: Host,
    binary: PathBuf,
    config: PathBuf,
    logs: PathBuf,
    running: Vec<Running>,
    started: u32,
}

impl Midways {
    /// None running yet: `binary` on `config` in `host`, logging into `logs` (one file per
    /// start, `NAME-N.log`).
    pub(super) fn new(
        name: &'static str,
        host: Host,
        binary: PathBuf,
        config: PathBuf,
        logs: PathBuf,
    ) -> Midways {
        Midways {
            name,
            host,
            binary,
            config,
            logs,
            running: Vec::new(),
            started: 0,
        }
    }

    /// The newest midway.
    pub(super) fn current(&self) -> anyhow::Result<&Running> {
        self.running.last().context("no midway runs")
    }

    /// Starts midway (taking over from the current one with `take_over`) and waits until its
    /// log says it is ready (and, taking over, that it took over).
    pub(super) fn start(&mut self, net: &BenchNet, take_over: bool) -> anyhow::Result<()> {
        self.started += 1;
        let mut launch = Launch::midway(&self.binary, &self.config)
            .json_log()
            .log_file(
                self.logs
                    .join(format!("{}-{}.log", self.name, self.started)),
            )
            .stop_grace(STOP_GRACE);
        if take_over {
            launch = launch.take_over();
        }
        let mut midway = launch.spawn(net.place(self.host))?;
        let ready = if take_over {
            midway.wait_took_over(START_LIMIT)
        } else {
            midway.wait_ready(START_LIMIT)
        };
        ready.with_context(|| format!("the {} midway did not get ready", self.name))?;
        self.running.push(midway);
        Ok(())
    }

    /// `kill -9` of every midway (those still draining after an upgrade too, like a host
    /// crash), then a fresh start.
    fn crash_and_restart(&mut self, net: &BenchNet) -> anyhow::Result<()> {
        for mut midway in std::mem::take(&mut self.running).into_iter().rev() {
            let _ = midway.kill();
            // Reaps it; a dead process needs no grace.
            let _ = midway.stop();
        }
        self.start(net, false)
    }

    /// Stops every midway (SIGTERM, SIGKILL after the grace period).
    pub(super) fn stop_all(&mut self) {
        for midway in std::mem::take(&mut self.running) {
            let _ = midway.stop();
        }
    }
}

/// How many of each fault a schedule made.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct FaultCounts {
    /// SIGHUP reloads.
    pub(super) reloads: u64,
    /// Binary upgrades.
    pub(super) upgrades: u64,
    /// `kill -9` and restart.
    pub(super) kills: u64,
    /// Outages of the schedule's link.
    pub(super) outages: u64,
}

/// The schedule of process and link faults of one midway: at random intervals around its
/// mean, the four kinds in turn from a random first one, so even a short campaign has each.
pub(super) struct FaultSchedule {
    rng: Rng,
    every: Duration,
    next_fault: Instant,
    first_kind: u64,
    done: u64,
    outage_set: &'static str,
    outage_iface: String,
    config: PathBuf,
    /// What it did so far.
    pub(super) counts: FaultCounts,
}

impl FaultSchedule {
    /// The router midway's schedule (every [`CampaignOptions::process_fault_every`]): its
    /// config is `config`, its link outages those of the client link (the router's
    /// `client_iface`).
    pub(super) fn new(options: &CampaignOptions, client_iface: String, config: PathBuf) -> Self {
        FaultSchedule::with(
            Rng::new(options.seed ^ 0xfa17),
            options.process_fault_every,
            CLIENT_OUTAGE_SET,
            client_iface,
            config,
        )
    }

    /// The gateway midway's schedule (as frequent as the router's, from a generator of its own): its
    /// config is `config`, its link outages those of the peer segment (the router's
    /// `peer_iface`, by the gateway's ports).
    pub(super) fn gateway(options: &CampaignOptions, peer_iface: String, config: PathBuf) -> Self {
        FaultSchedule::with(
            Rng::new(options.seed ^ 0x9a7e_fa17),
            options.process_fault_every,
            PEER_OUTAGE_SET,
            peer_iface,
            config,
        )
    }

    fn with(
        mut rng: Rng,
        every: Duration,
        outage_set: &'static str,
        outage_iface: String,
        config: PathBuf,
    ) -> FaultSchedule {
        let first_kind = rng.below(4);
        FaultSchedule {
            rng,
            every,
            next_fault: Instant::now() + every,
            first_kind,
            done: 0,
            outage_set,
            outage_iface,
            config,
            counts: FaultCounts::default(),
        }
    }

    /// Makes the next fault if its moment has come.
    pub(super) fn tick(&mut self, net: &BenchNet, midways: &mut Midways) -> anyhow::Result<()> {
        if Instant::now() < self.next_fault {
            return Ok(());
        }
        let spread = self.every.as_millis() as u64;
        self.next_fault =
            Instant::now() + Duration::from_millis(spread / 2 + self.rng.below(spread + 1));
        self.done += 1;
        match (self.first_kind + self.done) % 4 {
            0 => {
                // A reload that changes a limit, alternately.
                let text = std::fs::read_to_string(&self.config)?;
                let changed = if text.contains("max_connections = 4000") {
                    text.replace("max_connections = 4000", "max_connections = 3999")
                } else {
                    text.replace("max_connections = 3999", "max_connections = 4000")
                };
                std::fs::write(&self.config, changed)?;
                // A midway that died on its own shows in the transfers, not here.
                let _ = midways.current()?.reload();
                self.counts.reloads += 1;
            }
            1 => {
                midways.start(net, true)?;
                self.counts.upgrades += 1;
            }
            2 => {
                midways.crash_and_restart(net)?;
                self.counts.kills += 1;
            }
            _ => {
                let set = format!("{{ \"{}\" }}", self.outage_iface);
                let outage = self.outage_set;
                net.run(
                    Host::Router,
                    "nft",
                    &["add", "element", "inet", "mwfaults", outage, &set],
                )?;
                std::thread::sleep(Duration::from_millis(100 + self.rng.below(700)));
                net.run(
                    Host::Router,
                    "nft",
                    &["delete", "element", "inet", "mwfaults", outage, &set],
                )?;
                self.counts.outages += 1;
            }
        }
        Ok(())
    }
}
