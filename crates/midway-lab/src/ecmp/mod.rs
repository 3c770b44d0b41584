//! Several gateways behind ECMP (issue 32), as one lab run: two gateways, each with a transparent
//! midway, between a clients' router and a servers' router that both spread flows over them
//! with an L4 hash. Phases, on one topology per way of spreading (a multipath route, a resilient
//! nexthop group):
//!
//! 1. spread: short flows from several client addresses; each flow's two directions are counted
//!    per gateway (nftables), and the server sees which midway split it;
//! 2. fail open: gw2's midway is killed, the gateway still routes: its flows pass unsplit;
//! 3. midway returns: gw2's midway starts again while flows pass it unsplit;
//! 4. gateway dies: gw2 (midway and links) dies while flows run;
//! 5. survivor: new flows while gw2 is gone;
//! 6. gateway returns: gw2 comes back while flows run through gw1;
//! 7. spread again: new flows once it is back.
//!
//! Every phase states the design's prediction as claims that can fail ([`report::claims`]); the
//! run writes `report.md` with them and every flow's evidence. Design: docs/ecmp.md.

mod flows;
mod net;
mod report;

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use midway_config::{ConfigBuilder, ListenerBuilder, RelayName};
use midway_labnet::Topology;
use midway_launch::{Launch, Place, Running};

use flows::{Shape, PORT};
use net::{Spreading, CLIENT, CORE, EDGE, GATEWAYS, SERVER};
use report::{Expect, PhaseData};

/// Where to find midway and where to write.
#[derive(Clone, Debug)]
pub struct EcmpOptions {
    /// The midway binary the gateways run.
    pub midway: PathBuf,
    /// The run's folder: `report.md`, midway's configs and logs.
    pub out: PathBuf,
}

/// Client addresses besides the client's own: flows come from `CLIENT_ADDRS` addresses.
const CLIENT_ADDRS: u8 = 4;
/// Flows of a phase of short flows, and of one of long flows.
const SHORT_FLOWS: u32 = 40;
const LONG_FLOWS: u32 = 16;
/// Short flows run this many at a time.
const SHORT_PARALLEL: usize = 8;
/// When the phase's event happens after its long flows started.
const EVENT_AT: Duration = Duration::from_millis(1500);
/// How long a midway gets to say it is ready.
const READY_LIMIT: Duration = Duration::from_secs(15);
/// The port midway's transparent listener takes the diverted connections on.
const LISTEN_PORT: u16 = 8080;
/// A seed for the links (they have no loss; it only names the topology's emulators).
const SEED: u64 = 32;

/// Runs every phase for both ways of spreading and writes `report.md`; returns its path and
/// whether every claim held.
pub fn run_ecmp(options: &EcmpOptions) -> anyhow::Result<(PathBuf, bool)> {
    midway_labnet::require_root()?;
    midway_labnet::install_cleanup_on_signal()?;
    if !options.midway.is_file() {
        bail!(
            "no midway binary at {} (cargo build --locked --release -p midway)",
            options.midway.display()
        );
    }
    std::fs::create_dir_all(&options.out)
        .with_context(|| format!("cannot create {}", options.out.display()))?;
    let mut phases = Vec::new();
    for spreading in [
        Spreading::Multipath,
        Spreading::Resilient { objects: 1 },
        Spreading::Resilient { objects: 2 },
    ] {
        phases.extend(run_variant(options, spreading)?);
    }
    let (text, all_hold) = report_text(&phases);
    let path = options.out.join("report.md");
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok((path, all_hold))
}

/// One topology: the gateways, their midways, the server and the clients' addresses.
struct Lab<'a> {
    options: &'a EcmpOptions,
    dir: PathBuf,
    topology: Topology,
    spreading: Spreading,
    midways: Vec<Option<Running>>,
    clients: Vec<Ipv4Addr>,
    server: Ipv4Addr,
    next_id: u32,
    /// What the phase's event found (the buckets the kernel saw busy), for its report.
    notes: Vec<String>,
}

fn v4(ip: IpAddr) -> anyhow::Result<Ipv4Addr> {
    match ip {
        IpAddr::V4(ip) => Ok(ip),
        IpAddr::V6(_) => bail!("expected an IPv4 address, got {ip}"),
    }
}

impl Lab<'_> {
    fn client_prefix(&self) -> String {
        self.topology.link_prefix(CLIENT, EDGE).to_string()
    }

    fn server_prefix(&self) -> String {
        self.topology.link_prefix(CORE, SERVER).to_string()
    }

    /// Both routers' ECMP routes, with the next hops in `alive` only.
    fn route(&self, alive: &[bool]) -> anyhow::Result<()> {
        for (router, prefix) in [(EDGE, self.server_prefix()), (CORE, self.client_prefix())] {
            let hops = net::next_hops(&self.topology, router);
            net::apply(
                &self.topology,
                router,
                &net::ecmp_commands(self.spreading, &prefix, &hops, alive),
            )?;
        }
        Ok(())
    }

    /// Puts gateway `g`'s next hop back on both routers (what a health check does when it sees
    /// the gateway again). The nexthop objects of the other gateways are left as they are: a
    /// resilient group keeps their buckets.
    fn route_return(&mut self, g: usize) -> anyhow::Result<()> {
        let returning: Vec<String> = match self.spreading {
            Spreading::Multipath => Vec::new(),
            Spreading::Resilient { objects } => (0..objects)
                .map(|k| format!(" id {} ", net::nexthop_id(g, k)))
                .collect(),
        };
        for (router, prefix) in [(EDGE, self.server_prefix()), (CORE, self.client_prefix())] {
            let hops = net::next_hops(&self.topology, router);
            let commands: Vec<Vec<String>> =
                net::ecmp_commands(self.spreading, &prefix, &hops, &[true, true])
                    .into_iter()
                    .filter(|argv| {
                        let line = format!("{} ", argv.join(" "));
                        !line.starts_with("ip nexthop replace id ")
                            || returning.iter().any(|id| line.contains(id))
                            || line.contains(" group ")
                    })
                    .collect();
            if matches!(self.spreading, Spreading::Resilient { .. }) {
                let (busy, buckets) = net::busy_buckets(&self.topology, router)?;
                self.notes.push(format!(
                    "Just before the return, {router} saw {busy} of its {buckets} buckets busy (a packet within the last {} s).",
                    net::RESILIENT_IDLE_SECS
                ));
            }
            net::apply(&self.topology, router, &commands)?;
        }
        Ok(())
    }

    /// Starts (or restarts, after a crash: midway removes what its record lists) gateway `g`'s
    /// midway and waits until its interception is installed.
    fn start_midway(&mut self, g: usize) -> anyhow::Result<()> {
        let gw = GATEWAYS[g];
        let spool = self.dir.join(format!("{gw}-spool"));
        std::fs::create_dir_all(&spool)?;
        let listener = ListenerBuilder::transparent(
            "ecmp",
            format!("0.0.0.0:{LISTEN_PORT}"),
            [self.topology.iface(gw, EDGE).to_owned()],
            [PORT],
        )
        .relay(RelayName::Buffer)
        .spoof_client_address(false)
        .build();
        let config = ConfigBuilder::new([self.client_prefix()])
            .timeouts(
                Duration::from_secs(2),
                Duration::from_secs(30),
                Duration::from_secs(1),
            )
            .spool_dir(&spool)
            .listener(listener)
            .build()
            .to_toml()?;
        let config_path = self.dir.join(format!("midway-{gw}.toml"));
        std::fs::write(&config_path, config)?;
        let log = self.dir.join(format!("midway-{gw}.log"));
        let mut running = Launch::midway(&self.options.midway, &config_path)
            .env("MIDWAY_LOG", "info")
            .log_file(log)
            .stop_grace(Duration::from_secs(2))
            .spawn(Place::Host {
                topology: &self.topology,
                host: gw,
            })
            .with_context(|| format!("cannot start midway on {gw}"))?;
        running
            .wait_ready(READY_LIMIT)
            .with_context(|| format!("midway on {gw} did not get ready"))?;
        self.midways[g] = Some(running);
        Ok(())
    }

    /// SIGKILL of gateway `g`'s midway: a crash; its nftables table stays behind.
    fn kill_midway(&mut self, g: usize) -> anyhow::Result<()> {
        if let Some(mut running) = self.midways[g].take() {
            running.kill()?;
            // Reaps it.
            drop(running.stop());
        }
        Ok(())
    }

    /// Starts the phase's flows, runs `during` after [`EVENT_AT`] (long flows), and records.
    fn phase(
        &mut self,
        name: &str,
        what: &str,
        expect: Expect,
        shape: Shape,
        during: impl FnOnce(&mut Self) -> anyhow::Result<()>,
    ) -> anyhow::Result<PhaseData> {
        for g in GATEWAYS {
            net::reset_watch(&self.topology, g)?;
        }
        let server = flows::Server::start(&self.topology, SERVER)?;
        let count = match shape {
            Shape::Short => SHORT_FLOWS,
            Shape::Long => LONG_FLOWS,
        };
        let mut results = Vec::new();
        let mut pending = Vec::new();
        let mut during = Some(during);
        for i in 0..count {
            let id = self.next_id;
            self.next_id += 1;
            let client = self.clients[i as usize % self.clients.len()];
            let handle = flows::start_flow(&self.topology, CLIENT, client, self.server, id, shape)?;
            pending.push((id, handle));
            if shape == Shape::Short && pending.len() == SHORT_PARALLEL {
                results.extend(flows::join(std::mem::take(&mut pending)));
            }
        }
        if shape == Shape::Long {
            std::thread::sleep(EVENT_AT);
            if let Some(during) = during.take() {
                during(self)?;
            }
        }
        results.extend(flows::join(pending));
        let server_seen = server.seen();
        drop(server);
        let counters = GATEWAYS
            .iter()
            .map(|g| net::read_watch(&self.topology, g))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let gateway_addrs = GATEWAYS
            .iter()
            .map(|g| self.topology.addr(g, CORE))
            .collect();
        Ok(PhaseData {
            variant: self.spreading.name().into(),
            name: name.into(),
            what: what.into(),
            expect,
            flows: results,
            counters,
            server_seen,
            gateway_addrs,
            routes: net::routes_text(&self.topology, EDGE),
            notes: std::mem::take(&mut self.notes),
        })
    }
}

/// Builds the topology for `spreading` and runs the phases on it.
fn run_variant(options: &EcmpOptions, spreading: Spreading) -> anyhow::Result<Vec<PhaseData>> {
    let dir = options.out.join(match spreading {
        Spreading::Multipath => "multipath",
        Spreading::Resilient { objects: 1 } => "resilient",
        Spreading::Resilient { .. } => "resilient-paired",
    });
    std::fs::create_dir_all(&dir)?;
    let tag = midway_labnet::fresh_tag();
    let topology =
        Topology::build(&net::topology_spec(), &tag, SEED).context("cannot build the topology")?;
    // The clients' link's IPv4 prefix ("10.0.1.0/24"): the extra client addresses go in it.
    let client_net = topology.link_prefix(CLIENT, EDGE).to_string();
    let (network, len) = client_net
        .split_once('/')
        .and_then(|(a, l)| Some((a.parse::<Ipv4Addr>().ok()?, l.parse::<u8>().ok()?)))
        .with_context(|| format!("the clients' link has no IPv4 prefix ({client_net})"))?;
    let mut clients = Vec::new();
    for i in 0..CLIENT_ADDRS {
        let addr = Ipv4Addr::from(u32::from(network) + 101 + u32::from(i));
        let argv: Vec<String> = [
            "ip",
            "addr",
            "add",
            &format!("{addr}/{len}"),
            "dev",
            topology.iface(CLIENT, EDGE),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        net::run_in(&topology, CLIENT, &argv)?;
        clients.push(addr);
    }
    let server = v4(topology.addr(SERVER, CORE))?;
    let mut lab = Lab {
        options,
        dir,
        topology,
        spreading,
        midways: vec![None, None],
        clients,
        server,
        next_id: 1,
        notes: Vec::new(),
    };
    let result = run_phases(&mut lab);
    // Stop the midways before the topology goes.
    for g in 0..GATEWAYS.len() {
        if let Some(running) = lab.midways[g].take() {
            drop(running.stop());
        }
    }
    result
}

fn run_phases(lab: &mut Lab<'_>) -> anyhow::Result<Vec<PhaseData>> {
    // A resilient group keeps a busy bucket where it is, but the kernel only marks buckets
    // busy while it hashes, which it does with more than one member in the group.
    let keeps_running_flows =
        matches!(lab.spreading, Spreading::Resilient { objects } if objects > 1);
    lab.route(&[true, true])?;
    for (g, gateway) in GATEWAYS.iter().enumerate() {
        net::install_watch(&lab.topology, gateway, PORT)?;
        lab.start_midway(g)?;
    }
    let mut phases = Vec::new();
    phases.push(lab.phase(
        "spread",
        "Both gateways and their midways up. 40 short flows (200 kB each, 8 at a time) from 4 client addresses.",
        Expect::Spread,
        Shape::Short,
        |_| Ok(()),
    )?);
    lab.kill_midway(1)?;
    phases.push(lab.phase(
        "fail open",
        "gw2's midway killed (SIGKILL); gw2 still routes and both routers still send it flows. 40 new short flows.",
        Expect::FailOpen { gw: 1 },
        Shape::Short,
        |_| Ok(()),
    )?);
    phases.push(lab.phase(
        "midway returns",
        "gw2's midway still dead. 16 long flows (983 kB paced over 6 s each); 1.5 s in, gw2's midway starts again.",
        Expect::MidwayReturns { gw: 1 },
        Shape::Long,
        |lab| lab.start_midway(1),
    )?);
    phases.push(lab.phase(
        "gateway dies",
        "Both gateways up. 16 long flows; 1.5 s in, gw2 dies: both routers' links to it go down (what a router sees when a cabled neighbour loses power) and its midway is killed.",
        Expect::GatewayDies { gw: 1 },
        Shape::Long,
        |lab| {
            net::set_gateway_links(&lab.topology, GATEWAYS[1], false)?;
            lab.kill_midway(1)
        },
    )?);
    phases.push(lab.phase(
        "survivor",
        "gw2 gone. 40 new short flows.",
        Expect::Survivor { alive: 0 },
        Shape::Short,
        |_| Ok(()),
    )?);
    phases.push(lab.phase(
        "gateway returns",
        "gw2 gone. 16 long flows, all through gw1; 1.5 s in, gw2 comes back: its midway starts, then the routers' links to it come up and its next hop is put back on both routers (as a health check would).",
        Expect::GatewayReturns {
            gw: 1,
            keeps_running_flows,
        },
        Shape::Long,
        |lab| {
            lab.start_midway(1)?;
            net::set_gateway_links(&lab.topology, GATEWAYS[1], true)?;
            lab.route_return(1)
        },
    )?);
    // A resilient group moves idle buckets to the returned next hop after its idle timer.
    std::thread::sleep(Duration::from_secs(u64::from(net::RESILIENT_IDLE_SECS) + 2));
    phases.push(lab.phase(
        "spread again",
        "gw2 back. 40 new short flows.",
        Expect::Spread,
        Shape::Short,
        |_| Ok(()),
    )?);
    Ok(phases)
}

/// The whole report and whether every claim held.
fn report_text(phases: &[PhaseData]) -> (String, bool) {
    let mut md = String::new();
    let mut sections = String::new();
    let mut summary =
        String::from("| spreading | phase | claim | measured | verdict |\n|---|---|---|---|---|\n");
    let mut all_hold = true;
    for phase in phases {
        let claims = report::claims(phase);
        for claim in &claims {
            all_hold &= claim.holds;
            let _ = writeln!(
                summary,
                "| {} | {} | {} | {} | {} |",
                phase.variant,
                phase.name,
                claim.text,
                claim.measured,
                if claim.holds { "holds" } else { "**fails**" }
            );
        }
        sections.push_str(&report::phase_markdown(phase, &claims));
    }
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let tree = crate::provenance::SourceTree::of(std::path::Path::new("."));
    let state = match tree.state.as_deref() {
        Some(midway_report::TREE_CLEAN) => "clean".to_string(),
        Some(other) => format!("with uncommitted changes ({other})"),
        None => "tree state not recorded".to_string(),
    };
    let _ = writeln!(md, "# Several gateways behind ECMP\n");
    let _ = writeln!(
        md,
        "Written by `cargo run --locked --release -p midway-lab --example ecmp` (crates/midway-lab/src/ecmp). Design: docs/ecmp.md. Kernel {}.\n",
        kernel.trim(),
    );
    let _ = writeln!(
        md,
        "- Source trees: `{}` {state}: {} phases\n",
        tree.commit,
        phases.len()
    );
    let _ = writeln!(md, "```\n                 +-- gw1 (midway) --+\nclient -- edge --+                  +-- core -- server\n (4 addresses)   +-- gw2 (midway) --+\n```\n");
    let _ = writeln!(md, "`edge` spreads client-to-server flows over gw1 and gw2, `core` server-to-client packets, both with `net.ipv4.fib_multipath_hash_policy=1` (L4 hash). Each midway intercepts transparently on its interface toward `edge` and connects to the server from its own address (`spoof_client_address = false`). Each gateway counts every flow's packets per direction in its own nftables table (`up`: arriving from `edge`; `down`: leaving toward `edge`, forwarded or sent by midway), and the server records from which address each flow came: a gateway's (split there) or the client's (routed unsplit). Links: 1 ms one way, 10 ms to the server, no loss, no rate limit.\n");
    let _ = writeln!(
        md,
        "Verdict: **{}**.\n\n## All claims\n\n{summary}\n## Phases\n\n{sections}",
        if all_hold {
            "every claim holds"
        } else {
            "some claims fail"
        }
    );
    (md, all_hold)
}
