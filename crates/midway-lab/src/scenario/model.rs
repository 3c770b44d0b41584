//! The validated form a point runs ([`Scenario`]), and its conversion to `midway-labnet`'s
//! topology and `midway-linkemu`'s direction configs.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use super::{
    CaseKind, DirectionFile, HttpVersion, Intercept, RelayKind, RouteTuning, UpstreamPersistence,
    WebCache, WebClient, WebConnectionLimit, WebRequestHeaders,
};
use crate::units::{LossSpec, QueueSpec};

/// A validated scenario, with one point's overrides applied.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short name; goes into every result record and the default output folder's name.
    pub name: String,
    /// What the scenario measures, in a sentence or two.
    pub description: String,
    /// Paper and section the parameters come from.
    pub source: String,
    /// Base seed; each point's seed is derived from it.
    pub seed: u64,
    /// The hosts, each a network namespace with its TCP stack profile.
    pub hosts: Vec<midway_labnet::HostSpec>,
    /// The emulated links between hosts.
    pub links: Vec<Link>,
    /// Host that runs the workload's client.
    pub client: String,
    /// Host that runs the proxy of proxy cases (a case may name another).
    pub proxy: String,
    /// Host that runs the workload's server.
    pub server: String,
    /// What the client and the server do.
    pub workload: Workload,
    /// The cases (direct, a proxy and its settings) by name.
    pub cases: BTreeMap<String, Case>,
}

/// A validated link: named hosts and one emulator config per direction.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    /// The link's name (the key of its `[links.NAME]` table).
    pub name: String,
    /// Name of the host at end a.
    pub a: String,
    /// Name of the host at end b.
    pub b: String,
    /// Emulation of the traffic from a to b.
    pub a_to_b: DirectionFile,
    /// Emulation of the traffic from b to a.
    pub b_to_a: DirectionFile,
}

/// A validated workload, by kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    /// The server sends a number of bytes as soon as a client connects; timed from connect to
    /// last byte.
    Bulk(BulkWorkload),
    /// Commands of the scenario's choice run as client and (optionally) server.
    Command(CommandWorkload),
    /// Page loads: an origin on the server, a page loader or headless Chromium on the client.
    Web(WebWorkload),
}

impl Workload {
    /// The port the server side listens on.
    pub fn port(&self) -> u16 {
        match self {
            Workload::Bulk(bulk) => bulk.port,
            Workload::Command(command) => command.port,
            Workload::Web(web) => web.port,
        }
    }
}

/// Page loads (see [`WorkloadKind::Web`](super::WorkloadKind::Web)).
#[derive(Debug, Clone, PartialEq)]
pub struct WebWorkload {
    /// Host names the origin serves; all resolve to the server's address.
    pub hosts: Vec<String>,
    /// Distinct pages loaded one after the other per run.
    pub pages: u32,
    /// Bytes of one page, base document and objects together.
    pub page_bytes: u64,
    /// Embedded objects per page.
    pub objects: u32,
    /// Objects are spread over `hosts[1..=object_hosts]` (0 = all on `hosts[0]`).
    pub object_hosts: u32,
    /// HTTP version of the client: 1.0, 1.1 or 1.1 with pipelining.
    pub http: HttpVersion,
    /// Parallel connections per host name (per proxy when proxied, unless per origin).
    pub connections_per_host: u32,
    /// What `connections_per_host` counts through a proxy (the loader's; Chromium has its own).
    pub connection_limit: WebConnectionLimit,
    /// The header lines of the loader's requests (Chromium sends its own).
    pub request_headers: WebRequestHeaders,
    /// Who loads the pages: midway-web's loader or headless Chromium.
    pub client: WebClient,
    /// Cache behaviour of the loads: plain, forced misses, or hits after an unmeasured load.
    pub cache: WebCache,
    /// The origin's `max-age`; None = the origin sends no-cache.
    pub cache_max_age: Option<std::time::Duration>,
    /// The origin closes a persistent connection idle this long.
    pub keepalive_timeout: std::time::Duration,
    /// Pause between consecutive pages.
    pub think_time: std::time::Duration,
    /// TCP port of the origin.
    pub port: u16,
    /// Longest a run may take; a point that takes longer fails.
    pub timeout: std::time::Duration,
}

/// How much the bulk server sends on each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAmount {
    /// This many bytes (`workload.bytes`).
    Bytes(u64),
    /// As much as the path carries for this long (`workload.duration`, as `iperf -t`): the
    /// server stops writing and closes once it has written for the duration.
    For(std::time::Duration),
}

/// A bulk transfer beside the measured one, end to end between the same hosts through the same
/// bottleneck and never intercepted (its port is not the workload's), for as long as the measured
/// one (the overlay paper's fig. 11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompetingFlow {
    /// TCP_CONGESTION of both its sockets (per socket, never a namespace default).
    pub congestion_control: String,
    /// Port its server listens on in the server host.
    pub port: u16,
    /// SO_RCVBUF of its client socket; `None` leaves it to the kernel.
    pub client_recv_buffer: Option<u64>,
    /// SO_SNDBUF of its server socket; `None` leaves it to the kernel.
    pub server_send_buffer: Option<u64>,
}

/// Bulk transfers (see [`WorkloadKind::Bulk`](super::WorkloadKind::Bulk)).
#[derive(Debug, Clone, PartialEq)]
pub struct BulkWorkload {
    /// What the server sends on each connection: bytes, or for a duration.
    pub amount: BulkAmount,
    /// A competing end-to-end transfer during the measured one, if any (needs a duration).
    pub competing: Option<CompetingFlow>,
    /// SO_RCVBUF of the client socket, in bytes; `None` leaves it to the kernel.
    pub client_recv_buffer: Option<u64>,
    /// SO_SNDBUF of the server socket, in bytes; `None` leaves it to the kernel.
    pub server_send_buffer: Option<u64>,
    /// TCP_CONGESTION of the server socket ("cubic", "reno", "bbr"); `None` = the host's default.
    pub server_congestion_control: Option<String>,
    /// TCP_CONGESTION of the client socket; `None` = the host's default.
    pub client_congestion_control: Option<String>,
    /// Whether the client delays its ACKs (the kernel's default); `false` = it acknowledges
    /// every segment at once (hfc-tuning fig. 13).
    pub client_delayed_ack: bool,
    /// Bytes of an unmeasured first transfer over the same path, so the measured connection is
    /// a returning client's; `None` = no warm-up transfer.
    pub warmup_bytes: Option<u64>,
    /// Parallel connections, each moving `bytes` (>= 1).
    pub connections: u32,
    /// TCP port the bulk server listens on.
    pub port: u16,
    /// Longest a run may take; a point that takes longer fails.
    pub timeout: std::time::Duration,
}

/// External programs (see [`WorkloadKind::Command`](super::WorkloadKind::Command)).
#[derive(Debug, Clone, PartialEq)]
pub struct CommandWorkload {
    /// Bytes the command moves, to compute a throughput; `None` = no throughput.
    pub bytes: Option<u64>,
    /// The server's port, `{port}` in the commands.
    pub port: u16,
    /// Longest a run may take; a point that takes longer fails.
    pub timeout: std::time::Duration,
    /// Started first (in the background) in its host, killed after the client ends.
    pub server: Option<HostCommand>,
    /// The timed program.
    pub client: HostCommand,
}

/// A command of a command workload: its host, its argv (placeholders not yet expanded).
#[derive(Debug, Clone, PartialEq)]
pub struct HostCommand {
    /// Host the program runs in.
    pub host: String,
    /// Program and arguments, with placeholders not yet expanded.
    pub argv: Vec<String>,
    /// For a server: the client starts once this TCP port listens in the server's host.
    pub listen_port: Option<u16>,
}

/// A validated case; the settings of its kind are in `midway` or `squid`.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// The case's name (the key of its `[cases.NAME]` table).
    pub name: String,
    /// What carries the workload: direct, midway, HAProxy or Squid.
    pub kind: CaseKind,
    /// Host running the proxy (unused by `direct` except for route tuning).
    pub host: String,
    /// Settings of a `midway` case (`None` for other kinds).
    pub midway: Option<MidwayCase>,
    /// Settings of a `squid` case (`None` for other kinds).
    pub squid: Option<SquidCase>,
    /// Settings of a `chain` case (`None` for other kinds); `host` is then its first midway.
    pub chain: Option<ChainCase>,
    /// Route metrics set on the proxy host's route toward the client, if any.
    pub route_tuning: Option<RouteTuning>,
}

/// Settings of a `squid` case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SquidCase {
    /// Whether Squid's memory cache is on.
    pub cache: bool,
    /// How long Squid keeps idle upstream connections.
    pub upstream_persistence: UpstreamPersistence,
}

/// Settings of a `midway` case, turned into the proxy's config by `cases::midway_config`.
#[derive(Debug, Clone, PartialEq)]
pub struct MidwayCase {
    /// How connections reach midway: forward, transparent or HTTP.
    pub intercept: Intercept,
    /// How midway relays: buffer or store-and-forward spool.
    pub relay: RelayKind,
    /// Profile of the client-side segment (a preset or one of `profiles`); `None` = midway's
    /// default.
    pub local_profile: Option<String>,
    /// Profile of the server-side segment; `None` = midway's default.
    pub remote_profile: Option<String>,
    /// `[profiles.NAME]` tables added to the generated config.
    pub profiles: toml::Table,
    /// Extra keys of the generated listener.
    pub listener: toml::Table,
    /// Deep-merged into the generated config.
    pub config: toml::Table,
    /// Extra keys of `[listeners.http]` (intercept = "http" only).
    pub http: toml::Table,
}

/// Settings of a `chain` case: midways on several hosts of the path, each handing its
/// connections to the next over the peer segment; turned into one config per host by
/// `cases::chain_configs`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainCase {
    /// The midways' hosts, ordered from the client side to the server side (two or more).
    pub hosts: Vec<String>,
    /// Profile of every segment between two midways (its `congestion_control` is the peer
    /// segment's).
    pub peer_profile: Option<String>,
    /// Profile of the first midway's client-side segment.
    pub local_profile: Option<String>,
    /// Profile of the last midway's server-side segment.
    pub remote_profile: Option<String>,
    /// `[profiles.NAME]` tables added to every generated config.
    pub profiles: toml::Table,
    /// How the peer segments are carried: `tcp` (default), `tls` or `quic`.
    pub transport: midway_config::TransportName,
    /// `quic`: the tunnels' settings (midway's `[peers.quic]` keys), for both ends.
    pub quic: toml::Table,
}

impl Scenario {
    /// The link between hosts `x` and `y`, either way round.
    pub fn link_between(&self, x: &str, y: &str) -> Option<&Link> {
        self.links
            .iter()
            .find(|l| (l.a == x && l.b == y) || (l.a == y && l.b == x))
    }

    /// Hosts on the shortest path from `from` to `to`, both included (None if unreachable).
    pub fn path(&self, from: &str, to: &str) -> Option<Vec<String>> {
        let mut previous: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = VecDeque::from([from]);
        let mut seen = BTreeSet::from([from]);
        while let Some(host) = queue.pop_front() {
            if host == to {
                let mut path = vec![to.to_string()];
                let mut cursor = to;
                while let Some(prev) = previous.get(cursor) {
                    path.push(prev.to_string());
                    cursor = prev;
                }
                path.reverse();
                return Some(path);
            }
            for link in &self.links {
                let next = if link.a == host {
                    link.b.as_str()
                } else if link.b == host {
                    link.a.as_str()
                } else {
                    continue;
                };
                if seen.insert(next) {
                    previous.insert(next, host);
                    queue.push_back(next);
                }
            }
        }
        None
    }

    /// Topology for `midway-labnet`; `base_dir` resolves relative trace paths.
    pub fn topology_spec(
        &self,
        base_dir: &Path,
    ) -> Result<midway_labnet::TopologySpec, ConvertError> {
        let mut links = Vec::with_capacity(self.links.len());
        for link in &self.links {
            links.push(midway_labnet::LinkSpec {
                a: link.a.clone(),
                b: link.b.clone(),
                a_to_b: direction_config(&link.a_to_b, base_dir, &link.name, "a_to_b")?,
                b_to_a: direction_config(&link.b_to_a, base_dir, &link.name, "b_to_a")?,
            });
        }
        Ok(midway_labnet::TopologySpec {
            hosts: self.hosts.clone(),
            links,
        })
    }

    /// The effective parameters of this point, flattened to dotted keys (for result records).
    pub fn flat_params(&self) -> BTreeMap<String, serde_json::Value> {
        use serde_json::json;
        let mut params = BTreeMap::new();
        for link in &self.links {
            for (dir, d) in [("a_to_b", &link.a_to_b), ("b_to_a", &link.b_to_a)] {
                let key = |field: &str| format!("{}.{dir}.{field}", link.name);
                params.insert(key("delay_ms"), json!(d.delay.as_millis_f64()));
                if let Some(rate) = d.rate {
                    params.insert(key("rate_bps"), json!(rate.0));
                }
                // Defaults (no queue limit, no loss) are left out to keep reports short.
                if d.queue != QueueSpec::Unlimited {
                    params.insert(key("queue"), json!(d.queue.to_string()));
                }
                if d.data_loss != LossSpec::None {
                    params.insert(key("data_loss"), json!(d.data_loss.mean_rate()));
                }
                if d.ack_loss != LossSpec::None {
                    params.insert(key("ack_loss"), json!(d.ack_loss.mean_rate()));
                }
                if d.jitter.0 > std::time::Duration::ZERO {
                    params.insert(key("jitter_ms"), json!(d.jitter.as_millis_f64()));
                }
                if let Some(outages) = &d.outages {
                    params.insert(key("outages"), json!(outages.to_string()));
                }
                if let Some(udp) = &d.udp {
                    params.insert(key("udp"), json!(udp.to_string()));
                }
            }
        }
        for host in &self.hosts {
            params.insert(
                format!("{}.stack", host.name),
                json!(host.stack.to_string()),
            );
        }
        match &self.workload {
            Workload::Bulk(bulk) => {
                match bulk.amount {
                    BulkAmount::Bytes(bytes) => params.insert("bytes".into(), json!(bytes)),
                    BulkAmount::For(duration) => {
                        params.insert("duration_s".into(), json!(duration.as_secs_f64()))
                    }
                };
                if let Some(competing) = &bulk.competing {
                    params.insert(
                        "competing_congestion_control".into(),
                        json!(competing.congestion_control),
                    );
                }
                if let Some(b) = bulk.client_recv_buffer {
                    params.insert("client_recv_buffer".into(), json!(b));
                }
                if let Some(b) = bulk.server_send_buffer {
                    params.insert("server_send_buffer".into(), json!(b));
                }
                if let Some(cc) = &bulk.server_congestion_control {
                    params.insert("server_congestion_control".into(), json!(cc));
                }
                if let Some(b) = bulk.warmup_bytes {
                    params.insert("warmup_bytes".into(), json!(b));
                }
                if !bulk.client_delayed_ack {
                    params.insert("client_delayed_ack".into(), json!(false));
                }
                if bulk.connections > 1 {
                    params.insert("connections".into(), json!(bulk.connections));
                }
            }
            Workload::Command(command) => {
                if let Some(bytes) = command.bytes {
                    params.insert("bytes".into(), json!(bytes));
                }
                params.insert("client_argv".into(), json!(command.client.argv.join(" ")));
            }
            Workload::Web(web) => {
                params.insert("page_bytes".into(), json!(web.page_bytes));
                params.insert("pages".into(), json!(web.pages));
                params.insert("objects".into(), json!(web.objects));
                params.insert("object_hosts".into(), json!(web.object_hosts));
                params.insert("http".into(), json!(web.http));
                params.insert(
                    "connections_per_host".into(),
                    json!(web.connections_per_host),
                );
                // Only when not the default, so that records from before the setting existed
                // keep matching the same cells.
                if web.connection_limit != WebConnectionLimit::PerServer {
                    params.insert("connection_limit".into(), json!(web.connection_limit));
                }
                if web.request_headers != WebRequestHeaders::Minimal {
                    params.insert("request_headers".into(), json!(web.request_headers));
                }
                params.insert("web_client".into(), json!(web.client));
                params.insert("cache".into(), json!(web.cache));
                params.insert(
                    "cache_max_age_s".into(),
                    web.cache_max_age
                        .map_or(serde_json::Value::Null, |d| json!(d.as_secs_f64())),
                );
                params.insert(
                    "keepalive_timeout_s".into(),
                    json!(web.keepalive_timeout.as_secs_f64()),
                );
                if web.think_time > std::time::Duration::ZERO {
                    params.insert("think_time_s".into(), json!(web.think_time.as_secs_f64()));
                }
            }
        }
        params
    }
}

/// Why a validated direction cannot become an emulator config (e.g. a trace file is unreadable).
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// A capacity trace file could not be read.
    #[error("link {link}.{direction}: cannot read trace {path}")]
    TraceRead {
        /// The link's name.
        link: String,
        /// The direction: `a_to_b` or `b_to_a`.
        direction: &'static str,
        /// The trace file.
        path: PathBuf,
        /// The error from reading it.
        #[source]
        source: std::io::Error,
    },
    /// A capacity trace file is not a valid mahimahi trace.
    #[error("link {link}.{direction}: bad trace {path}")]
    Trace {
        /// The link's name.
        link: String,
        /// The direction: `a_to_b` or `b_to_a`.
        direction: &'static str,
        /// The trace file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: midway_linkemu::TraceError,
    },
    /// The emulator's own validation rejects the direction's configuration.
    #[error("link {link}.{direction}: the emulator refuses this configuration")]
    Config {
        /// The link's name.
        link: String,
        /// The direction: `a_to_b` or `b_to_a`.
        direction: &'static str,
        /// What the emulator objects to.
        #[source]
        source: midway_linkemu::ConfigError,
    },
}

fn loss_model(loss: &LossSpec) -> midway_linkemu::LossModel {
    match loss {
        LossSpec::None => midway_linkemu::LossModel::None,
        LossSpec::Bernoulli(p) => midway_linkemu::LossModel::Bernoulli { p: p.0 },
        LossSpec::GilbertElliott(ge) => midway_linkemu::LossModel::GilbertElliott {
            p_good_to_bad: ge.p_good_to_bad.0,
            p_bad_to_good: ge.p_bad_to_good.0,
            loss_in_good: ge.loss_in_good.0,
            loss_in_bad: ge.loss_in_bad.0,
        },
    }
}

/// Converts one direction to the emulator's config, reading its trace if any, and validates it.
pub(crate) fn direction_config(
    direction: &DirectionFile,
    base_dir: &Path,
    link: &str,
    name: &'static str,
) -> Result<midway_linkemu::DirectionConfig, ConvertError> {
    let trace = match &direction.trace {
        None => None,
        Some(path) => {
            let path = base_dir.join(path);
            let text =
                std::fs::read_to_string(&path).map_err(|source| ConvertError::TraceRead {
                    link: link.to_string(),
                    direction: name,
                    path: path.clone(),
                    source,
                })?;
            Some(
                midway_linkemu::CapacityTrace::parse(&text).map_err(|source| {
                    ConvertError::Trace {
                        link: link.to_string(),
                        direction: name,
                        path: path.clone(),
                        source,
                    }
                })?,
            )
        }
    };
    let config = midway_linkemu::DirectionConfig {
        delay: direction.delay.0,
        rate_bps: direction.rate.map(|r| r.0),
        queue: match direction.queue {
            QueueSpec::Unlimited => midway_linkemu::QueueLimit::Unlimited,
            QueueSpec::Bytes(b) => midway_linkemu::QueueLimit::Bytes(b),
            QueueSpec::Packets(p) => {
                midway_linkemu::QueueLimit::Packets(u32::try_from(p).unwrap_or(u32::MAX))
            }
        },
        data_loss: loss_model(&direction.data_loss),
        ack_loss: loss_model(&direction.ack_loss),
        jitter: (direction.jitter.0 > std::time::Duration::ZERO).then_some(direction.jitter.0),
        trace,
        outages: direction
            .outages
            .as_ref()
            .map(|outages| outages.to_emulator())
            .unwrap_or_default(),
        udp: direction.udp.as_ref().map(|udp| udp.to_emulator()),
    };
    config.validate().map_err(|source| ConvertError::Config {
        link: link.to_string(),
        direction: name,
        source,
    })?;
    Ok(config)
}
