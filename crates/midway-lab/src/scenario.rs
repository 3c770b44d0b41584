//! Scenario files: the lab's user interface.
//!
//! Stages, as for every config in midway: TOML text -> [`ScenarioFile`] (serde, unknown keys
//! rejected, unit-carrying values checked while parsing so `toml` names their line) -> checks that
//! need the whole file (host names a link refers to, cases an experiment lists, sweep paths), which
//! keep the spans of the fields they check -> [`Scenario`], the validated, typed form a point runs.
//!
//! A sweep addresses any parameter by a dotted path into the document ("links.access.b_to_a.delay").
//! The overrides of a point are applied to the parsed TOML tree, and the result goes through the
//! same stages again, so a swept value is exactly as well checked as a value written in the file.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::units::{ByteSize, HumanDuration, LossSpec, MaxAge, QueueSpec, Rate};

/// Default TCP port of the bulk server and of commands' `{port}`.
pub const DEFAULT_SERVER_PORT: u16 = 5001;
/// Most parallel connections of one bulk run (`workload.connections`).
pub const MAX_BULK_CONNECTIONS: u32 = 64;
/// Default port of the web workload's origin.
pub const DEFAULT_WEB_PORT: u16 = 80;
/// Web workload defaults (see `scenarios/README.md`).
pub const DEFAULT_WEB_HOST: &str = "www.lab";
pub const DEFAULT_CONNECTIONS_PER_HOST: u32 = 6;
/// Origin's `Cache-Control: max-age` (1 h).
pub const DEFAULT_CACHE_MAX_AGE_SECS: u64 = 3600;
/// Origin's idle keep-alive limit: Apache's default.
pub const DEFAULT_KEEPALIVE_TIMEOUT_SECS: u64 = 15;
/// Bounds that keep a web workload's description sane (a typo, not an experiment, beyond them).
pub const MAX_WEB_HOSTS: usize = 64;
pub const MAX_WEB_PAGES: u32 = 10_000;
pub const MAX_WEB_OBJECTS: u32 = 10_000;
pub const MAX_CONNECTIONS_PER_HOST: u32 = 256;
/// Default limit on one workload run; a point that takes longer fails with a timeout.
pub const DEFAULT_WORKLOAD_TIMEOUT_SECS: u64 = 300;
/// Default base seed when the file gives none.
pub const DEFAULT_SEED: u64 = 1;

/// Why a scenario file cannot be used. `location` is "FILE:LINE:COLUMN".
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("cannot read scenario file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Syntax, unknown keys, missing keys and bad values: toml's message names line and column.
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{location}: {message}")]
    Invalid { location: String, message: String },
}

/// Where in the text a span starts, as "FILE:LINE:COLUMN" (1-based).
fn location(path: &Path, text: &str, span: &Range<usize>) -> String {
    let start = span.start.min(text.len());
    let before = &text[..start];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("{}:{line}:{column}", path.display())
}

// ---------------------------------------------------------------------------------------------
// File form
// ---------------------------------------------------------------------------------------------

/// A scenario file as written. See `scenarios/hfc-demo.toml` for a commented example.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// Short name; goes into every result record.
    pub name: String,
    pub description: String,
    /// Paper and section the parameters come from.
    pub source: String,
    /// Base seed; each point's seed is derived from it (see `plan::point_seed`).
    #[serde(default)]
    pub seed: Option<u64>,
    pub hosts: BTreeMap<String, HostFile>,
    pub links: BTreeMap<String, LinkFile>,
    pub roles: RolesFile,
    pub workload: WorkloadFile,
    pub cases: BTreeMap<String, CaseFile>,
    /// Overrides applied by `--quick` (smaller transfers); the sweep itself is cut to its first,
    /// middle and last value and to one repetition.
    #[serde(default)]
    pub quick: QuickFile,
    pub experiments: Vec<ExperimentFile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostFile {
    /// `modern` (Linux defaults) or `legacy` (as close to a 1990s stack as Linux allows).
    #[serde(default)]
    pub stack: midway_labnet::StackProfile,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkFile {
    pub a: Spanned<String>,
    pub b: Spanned<String>,
    #[serde(default)]
    pub a_to_b: DirectionFile,
    #[serde(default)]
    pub b_to_a: DirectionFile,
}

/// One direction of a link; every field has a "perfect link" default.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DirectionFile {
    /// One-way delay, "10ms".
    #[serde(default)]
    pub delay: HumanDuration,
    /// Serialisation rate, "25Mbit"; absent = unlimited.
    #[serde(default)]
    pub rate: Option<Rate>,
    /// Drop-tail queue: "10KB", "20 packets", "unlimited" (default).
    #[serde(default)]
    pub queue: QueueSpec,
    /// Loss of data frames (anything but pure TCP ACKs).
    #[serde(default)]
    pub data_loss: LossSpec,
    /// Loss of pure TCP ACKs.
    #[serde(default)]
    pub ack_loss: LossSpec,
    /// Extra uniform delay 0..jitter, never reordering.
    #[serde(default)]
    pub jitter: HumanDuration,
    /// A mahimahi capacity trace (path relative to the scenario file); replaces `rate`.
    #[serde(default)]
    pub trace: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolesFile {
    /// Host that runs the workload's client.
    pub client: Spanned<String>,
    /// Host that runs the proxy of proxy cases (a case may name another with `host`).
    pub proxy: Spanned<String>,
    /// Host that runs the workload's server.
    pub server: Spanned<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    /// The server sends `bytes` as soon as a client connects; timed from connect to last byte.
    Bulk,
    /// External programs (iperf3, curl, ...) run in hosts; timed from start to exit.
    Command,
    /// Page loads: an origin serving pages with embedded objects on the server, a page loader
    /// (or headless Chromium) on the client; timed per page, first connect to last byte.
    Web,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    pub kind: Spanned<WorkloadKind>,
    /// Bulk: bytes the server sends. Command: bytes the command moves (for throughput), optional.
    #[serde(default)]
    pub bytes: Option<ByteSize>,
    /// Bulk: SO_RCVBUF of the client socket (Linux doubles it and advertises part of it);
    /// 0 leaves it to the kernel.
    #[serde(default)]
    pub client_recv_buffer: Option<ByteSize>,
    /// Bulk: SO_SNDBUF of the server socket; 0 leaves it to the kernel.
    #[serde(default)]
    pub server_send_buffer: Option<ByteSize>,
    /// Bulk: TCP_CONGESTION of the server socket ("cubic", "reno", "bbr").
    #[serde(default)]
    pub server_congestion_control: Option<String>,
    /// Bulk: TCP_CONGESTION of the client socket.
    #[serde(default)]
    pub client_congestion_control: Option<String>,
    /// Bulk: bytes of an unmeasured first transfer over the same path before the measured one,
    /// so the measured connection is a returning client's (Linux's tcp_metrics cache then holds
    /// the peer, and route-metric knobs such as `reordering` apply; see midway-tcp's README).
    #[serde(default)]
    pub warmup_bytes: Option<ByteSize>,
    /// Bulk: parallel connections the client opens at once (default 1), each downloading
    /// `bytes` (hfc-tuning fig. 10: several connections share one cable modem). The record's
    /// bytes are the sum, its time runs until the last connection finished.
    #[serde(default)]
    pub connections: Option<u32>,
    /// Port the server listens on (bulk server, or `{port}` in commands).
    #[serde(default)]
    pub port: Option<u16>,
    /// Longest a run may take.
    #[serde(default)]
    pub timeout: Option<HumanDuration>,
    /// Command: started first (in the background) in its host, killed after the client ends.
    #[serde(default)]
    pub server: Option<CommandFile>,
    /// Command: the timed program (a table). Web: `"loader"` or `"chromium"`.
    #[serde(default)]
    pub client: Option<Spanned<WorkloadClientFile>>,
    /// Web: host names the origin serves; all resolve to the server's address.
    #[serde(default)]
    pub hosts: Option<Spanned<Vec<String>>>,
    /// Web: distinct pages loaded one after the other per run.
    #[serde(default)]
    pub pages: Option<Spanned<u32>>,
    /// Web: bytes of one page, base document and objects together.
    #[serde(default)]
    pub page_bytes: Option<Spanned<ByteSize>>,
    /// Web: embedded objects per page.
    #[serde(default)]
    pub objects: Option<Spanned<u32>>,
    /// Web: objects are spread over hosts[1..=object_hosts] (0 = all on hosts[0]).
    #[serde(default)]
    pub object_hosts: Option<Spanned<u32>>,
    /// Web: "1.0", "1.1" or "pipelining".
    #[serde(default)]
    pub http: Option<Spanned<HttpVersion>>,
    /// Web: parallel connections per host name (per proxy when proxied).
    #[serde(default)]
    pub connections_per_host: Option<Spanned<u32>>,
    /// Web: "plain", "miss" (no-cache request headers) or "hit" (an unmeasured load first).
    #[serde(default)]
    pub cache: Option<Spanned<WebCache>>,
    /// Web: the origin's `max-age`, or "none" (no-cache responses).
    #[serde(default)]
    pub cache_max_age: Option<MaxAge>,
    /// Web: the origin closes a persistent connection idle this long.
    #[serde(default)]
    pub keepalive_timeout: Option<HumanDuration>,
    /// Web: pause between consecutive pages.
    #[serde(default)]
    pub think_time: Option<HumanDuration>,
}

/// `workload.client`: a command table (command workloads) or a web client's name.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkloadClientFile {
    Command(CommandFile),
    Web(WebClient),
}

impl<'de> Deserialize<'de> for WorkloadClientFile {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ClientVisitor;
        impl<'de> serde::de::Visitor<'de> for ClientVisitor {
            type Value = WorkloadClientFile;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"loader\" or \"chromium\" (web), or a table { host, argv } (command)")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
                match text {
                    "loader" => Ok(WorkloadClientFile::Web(WebClient::Loader)),
                    "chromium" => Ok(WorkloadClientFile::Web(WebClient::Chromium)),
                    other => Err(E::unknown_variant(other, &["loader", "chromium"])),
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                // The map access stays toml's, so the command's spanned fields keep their spans.
                CommandFile::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(WorkloadClientFile::Command)
            }
        }
        deserializer.deserialize_any(ClientVisitor)
    }
}

/// HTTP behaviour of the page loader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum HttpVersion {
    /// HTTP/1.0: one connection per object.
    #[serde(rename = "1.0")]
    Http10,
    /// HTTP/1.1 keep-alive, one outstanding request per connection.
    #[serde(rename = "1.1")]
    KeepAlive,
    /// HTTP/1.1 with every request of a connection written at once.
    #[serde(rename = "pipelining")]
    Pipelining,
}

/// Cache situation of a web run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WebCache {
    /// Ordinary requests.
    Plain,
    /// Requests say `Pragma: no-cache` / `Cache-Control: no-cache`: every cache forwards them.
    Miss,
    /// One unmeasured load of every page first (fills a proxy's cache), then the measured one.
    Hit,
}

/// Who loads the pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WebClient {
    /// midway-web's page loader (threads in the client host).
    Loader,
    /// Headless Chromium (`/usr/bin/chromium`) spawned in the client host.
    Chromium,
}

/// How long Squid keeps idle upstream connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamPersistence {
    /// Squid's own default (`server_idle_pconn_timeout` 1 minute).
    Default,
    /// Ten minutes, as midway's HTTP mode keeps them.
    Long,
}

/// A program run in a host. `argv` may use `{target}` (address the client must connect to in
/// this case), `{target_port}`, `{server}` (the server's own address), `{port}`, `{bytes}`.
/// Lines `MIDWAY_METRIC <name> <number>` on its stdout become extra measurements.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CommandFile {
    pub host: Spanned<String>,
    pub argv: Spanned<Vec<String>>,
    /// For a server: wait until this TCP port listens in its host before starting the client.
    #[serde(default)]
    pub listen_port: Option<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CaseKind {
    /// No proxy: the proxy host only routes.
    Direct,
    /// The real midway binary on the proxy host.
    Midway,
    /// HAProxy in TCP mode on the proxy host (Debian's package).
    Haproxy,
    /// Squid (Debian's package) as an explicit HTTP proxy on the proxy host.
    Squid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Intercept {
    /// The client connects to the proxy's address; the proxy connects to a fixed target.
    Forward,
    /// nftables TPROXY on the proxy host; the client connects to the server's address.
    Transparent,
    /// An explicit HTTP proxy (midway's `mode = "http"`): the web client is configured with it.
    Http,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RelayKind {
    /// Buffer-and-forward (bounded buffers, backpressure to the server).
    Buffer,
    /// Store-and-forward (memory, then disk spool).
    Spool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseFile {
    pub kind: Spanned<CaseKind>,
    #[serde(default)]
    pub description: Option<String>,
    /// Host the proxy runs on; default `roles.proxy`.
    #[serde(default)]
    pub host: Option<Spanned<String>>,
    /// midway: `forward` (default) or `transparent`.
    #[serde(default)]
    pub intercept: Option<Spanned<Intercept>>,
    /// midway: `buffer` (default) or `spool`.
    #[serde(default)]
    pub relay: Option<Spanned<RelayKind>>,
    /// midway: profile of the client-side segment (a preset or one from `profiles`).
    #[serde(default)]
    pub local_profile: Option<Spanned<String>>,
    /// midway: profile of the server-side segment.
    #[serde(default)]
    pub remote_profile: Option<Spanned<String>>,
    /// midway: `[profiles.NAME]` tables added to the generated config, as midway reads them.
    #[serde(default)]
    pub profiles: Option<toml::Table>,
    /// midway: extra keys of the generated listener (`buffer_bytes`, `spoof_client_address`...).
    #[serde(default)]
    pub listener: Option<toml::Table>,
    /// midway: deep-merged into the generated config (for anything else midway accepts).
    #[serde(default)]
    pub config: Option<toml::Table>,
    /// midway with `intercept = "http"`: merged into the listener's `[listeners.http]`.
    #[serde(default)]
    pub http: Option<toml::Table>,
    /// squid: memory cache on (default) or off.
    #[serde(default)]
    pub cache: Option<Spanned<bool>>,
    /// squid: `default` or `long` (idle upstream connections kept 10 min).
    #[serde(default)]
    pub upstream_persistence: Option<Spanned<UpstreamPersistence>>,
    /// Any case: route metrics set on the proxy host's route toward the client (the best an
    /// operator gets without midway: `initcwnd`, `quickack`, `rto_min`, `congctl`).
    #[serde(default)]
    pub route_tuning: Option<RouteTuning>,
}

/// Per-route metrics (`ip route ... initcwnd N quickack 1 rto_min T congctl NAME`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteTuning {
    #[serde(default)]
    pub initcwnd: Option<u32>,
    #[serde(default)]
    pub initrwnd: Option<u32>,
    #[serde(default)]
    pub quickack: Option<bool>,
    #[serde(default)]
    pub rto_min: Option<HumanDuration>,
    #[serde(default)]
    pub congctl: Option<String>,
}

/// Overrides: dotted path -> value. Quote the keys (`"workload.bytes" = "300KB"`), or TOML makes
/// nested tables of them.
pub type OverridesFile = BTreeMap<Spanned<String>, Spanned<toml::Value>>;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuickFile {
    #[serde(default)]
    pub set: OverridesFile,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentFile {
    /// Name, e.g. "fig8"; results and plots are grouped by it.
    pub name: Spanned<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// Figure or table of the paper this experiment rebuilds.
    #[serde(default)]
    pub source: Option<String>,
    pub cases: Vec<Spanned<String>>,
    #[serde(default = "one")]
    pub repetitions: Spanned<u32>,
    /// Fixed overrides for this experiment.
    #[serde(default)]
    pub set: OverridesFile,
    #[serde(default)]
    pub sweep: Option<SweepFile>,
}

fn one() -> Spanned<u32> {
    Spanned::new(0..0, 1)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepFile {
    /// Dotted path of the swept parameter.
    pub param: Spanned<String>,
    /// Further paths that receive the same value (both directions' delay for an RTT sweep).
    #[serde(default)]
    pub also: Vec<Spanned<String>>,
    /// Short axis label, e.g. "local loss (%)"; the key of the x value in every record.
    pub label: String,
    pub values: Spanned<Vec<Spanned<toml::Value>>>,
    /// x coordinate of each value; default: derived (number, loss rate, ms, bytes, bit/s).
    #[serde(default)]
    pub axis: Option<Spanned<Vec<f64>>>,
}

// ---------------------------------------------------------------------------------------------
// Validated form
// ---------------------------------------------------------------------------------------------

/// A validated scenario, with one point's overrides applied.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub source: String,
    pub seed: u64,
    pub hosts: Vec<midway_labnet::HostSpec>,
    pub links: Vec<Link>,
    pub client: String,
    pub proxy: String,
    pub server: String,
    pub workload: Workload,
    pub cases: BTreeMap<String, Case>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    pub name: String,
    pub a: String,
    pub b: String,
    pub a_to_b: DirectionFile,
    pub b_to_a: DirectionFile,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    Bulk(BulkWorkload),
    Command(CommandWorkload),
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

/// Page loads (see [`WorkloadKind::Web`]).
#[derive(Debug, Clone, PartialEq)]
pub struct WebWorkload {
    pub hosts: Vec<String>,
    pub pages: u32,
    pub page_bytes: u64,
    pub objects: u32,
    pub object_hosts: u32,
    pub http: HttpVersion,
    pub connections_per_host: u32,
    pub client: WebClient,
    pub cache: WebCache,
    /// None = the origin sends no-cache.
    pub cache_max_age: Option<std::time::Duration>,
    pub keepalive_timeout: std::time::Duration,
    pub think_time: std::time::Duration,
    pub port: u16,
    pub timeout: std::time::Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BulkWorkload {
    pub bytes: u64,
    pub client_recv_buffer: Option<u64>,
    pub server_send_buffer: Option<u64>,
    pub server_congestion_control: Option<String>,
    pub client_congestion_control: Option<String>,
    pub warmup_bytes: Option<u64>,
    /// Parallel connections, each moving `bytes` (>= 1).
    pub connections: u32,
    pub port: u16,
    pub timeout: std::time::Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CommandWorkload {
    pub bytes: Option<u64>,
    pub port: u16,
    pub timeout: std::time::Duration,
    pub server: Option<HostCommand>,
    pub client: HostCommand,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HostCommand {
    pub host: String,
    pub argv: Vec<String>,
    pub listen_port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub name: String,
    pub kind: CaseKind,
    /// Host running the proxy (unused by `direct` except for route tuning).
    pub host: String,
    pub midway: Option<MidwayCase>,
    pub squid: Option<SquidCase>,
    pub route_tuning: Option<RouteTuning>,
}

/// Settings of a `squid` case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SquidCase {
    pub cache: bool,
    pub upstream_persistence: UpstreamPersistence,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MidwayCase {
    pub intercept: Intercept,
    pub relay: RelayKind,
    pub local_profile: Option<String>,
    pub remote_profile: Option<String>,
    pub profiles: toml::Table,
    pub listener: toml::Table,
    pub config: toml::Table,
    /// Extra keys of `[listeners.http]` (intercept = "http" only).
    pub http: toml::Table,
}

impl Scenario {
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
                params.insert("bytes".into(), json!(bulk.bytes));
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
    #[error("link {link}.{direction}: cannot read trace {path}")]
    TraceRead {
        link: String,
        direction: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("link {link}.{direction}: bad trace {path}")]
    Trace {
        link: String,
        direction: &'static str,
        path: PathBuf,
        #[source]
        source: midway_linkemu::TraceError,
    },
    #[error("link {link}.{direction}: the emulator refuses this configuration")]
    Config {
        link: String,
        direction: &'static str,
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
pub fn direction_config(
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
    };
    config.validate().map_err(|source| ConvertError::Config {
        link: link.to_string(),
        direction: name,
        source,
    })?;
    Ok(config)
}

// ---------------------------------------------------------------------------------------------
// Loading and checking
// ---------------------------------------------------------------------------------------------

/// A scenario file read from disk: its text, its TOML tree (for overrides) and its base form.
#[derive(Debug, Clone)]
pub struct LoadedScenario {
    pub path: PathBuf,
    pub text: String,
    pub document: toml::Table,
    pub file: ScenarioFile,
    pub base: Scenario,
}

/// One override of a point: dotted path and value, with the span of the text that asked for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    pub path: String,
    pub value: toml::Value,
    /// Where the path is written (blamed when the path is wrong).
    pub path_span: Range<usize>,
    /// Where the value is written (blamed when the value is wrong).
    pub value_span: Range<usize>,
}

impl LoadedScenario {
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_text(path, text)
    }

    pub fn from_text(path: &Path, text: String) -> Result<Self, ScenarioError> {
        let parse_error = |e: toml::de::Error| ScenarioError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        };
        let document: toml::Table = toml::from_str(&text).map_err(parse_error)?;
        let file: ScenarioFile = toml::from_str(&text).map_err(parse_error)?;
        let here = |span: &Range<usize>, message: String| ScenarioError::Invalid {
            location: location(path, &text, span),
            message,
        };
        let base = validate(&file).map_err(|(span, message)| here(&span, message))?;
        // Checks that concern the experiments, and every point's overrides.
        let mut names = BTreeSet::new();
        if file.experiments.is_empty() {
            return Err(here(
                &(0..0),
                "the scenario has no [[experiments]]; add at least one".into(),
            ));
        }
        for experiment in &file.experiments {
            if !names.insert(experiment.name.get_ref().clone()) {
                return Err(here(
                    &experiment.name.span(),
                    format!(
                        "experiment `{}` is defined twice",
                        experiment.name.get_ref()
                    ),
                ));
            }
            if *experiment.repetitions.get_ref() == 0 {
                return Err(here(
                    &experiment.repetitions.span(),
                    "repetitions must be at least 1".into(),
                ));
            }
            if experiment.cases.is_empty() {
                return Err(here(
                    &experiment.name.span(),
                    format!("experiment `{}` lists no cases", experiment.name.get_ref()),
                ));
            }
            for case in &experiment.cases {
                if !base.cases.contains_key(case.get_ref()) {
                    let known: Vec<_> = base.cases.keys().cloned().collect();
                    return Err(here(
                        &case.span(),
                        format!(
                            "unknown case `{}`; the [cases] of this file are: {}",
                            case.get_ref(),
                            known.join(", ")
                        ),
                    ));
                }
            }
            if let Some(sweep) = &experiment.sweep {
                if sweep.values.get_ref().is_empty() {
                    return Err(here(&sweep.values.span(), "the sweep has no values".into()));
                }
                if let Some(axis) = &sweep.axis {
                    if axis.get_ref().len() != sweep.values.get_ref().len() {
                        return Err(here(
                            &axis.span(),
                            format!(
                                "`axis` has {} entries but `values` has {}",
                                axis.get_ref().len(),
                                sweep.values.get_ref().len()
                            ),
                        ));
                    }
                }
            }
        }
        let loaded = LoadedScenario {
            path: path.to_path_buf(),
            text,
            document,
            file,
            base,
        };
        // Every override of every point must give a valid scenario, in which every case of the
        // experiment can run: fail now, not mid-run.
        for experiment in &loaded.file.experiments {
            let check_cases = |scenario: &Scenario| -> Result<(), ScenarioError> {
                for case in &experiment.cases {
                    if let Some(message) =
                        case_workload_conflict(scenario, &scenario.cases[case.get_ref()])
                    {
                        return Err(loaded.error_at(
                            &case.span(),
                            format!("experiment `{}`: {message}", experiment.name.get_ref()),
                        ));
                    }
                }
                Ok(())
            };
            for quick in [false, true] {
                let fixed = loaded.fixed_overrides(experiment, quick);
                match &experiment.sweep {
                    None => {
                        check_cases(&loaded.point_scenario(&fixed)?)?;
                    }
                    Some(sweep) => {
                        for index in 0..sweep.values.get_ref().len() {
                            let mut all = fixed.clone();
                            all.extend(loaded.sweep_overrides(sweep, index));
                            check_cases(&loaded.point_scenario(&all)?)?;
                        }
                    }
                }
            }
        }
        Ok(loaded)
    }

    fn error_at(&self, span: &Range<usize>, message: String) -> ScenarioError {
        ScenarioError::Invalid {
            location: location(&self.path, &self.text, span),
            message,
        }
    }

    /// Fixed overrides of an experiment: its `set`, then (with `quick`) the file's `[quick] set`.
    pub fn fixed_overrides(&self, experiment: &ExperimentFile, quick: bool) -> Vec<Override> {
        let mut out: Vec<Override> = experiment.set.iter().map(to_override).collect();
        if quick {
            out.extend(self.file.quick.set.iter().map(to_override));
        }
        out
    }

    /// The overrides a sweep value sets (its `param` and every `also` path).
    pub fn sweep_overrides(&self, sweep: &SweepFile, index: usize) -> Vec<Override> {
        let value = &sweep.values.get_ref()[index];
        std::iter::once(&sweep.param)
            .chain(sweep.also.iter())
            .map(|path| Override {
                path: path.get_ref().clone(),
                value: value.get_ref().clone(),
                path_span: path.span(),
                value_span: value.span(),
            })
            .collect()
    }

    /// The scenario with `overrides` applied (later ones win), fully validated.
    pub fn point_scenario(&self, overrides: &[Override]) -> Result<Scenario, ScenarioError> {
        if overrides.is_empty() {
            return Ok(self.base.clone());
        }
        let mut document = self.document.clone();
        for item in overrides {
            set_path(&mut document, &item.path, item.value.clone())
                .map_err(|message| self.error_at(&item.path_span, message))?;
        }
        let blame = |message: String| {
            let paths: Vec<_> = overrides.iter().map(|o| o.path.as_str()).collect();
            let span = overrides
                .last()
                .map(|o| o.value_span.clone())
                .unwrap_or(0..0);
            self.error_at(
                &span,
                format!(
                    "with the overrides of this point ({}): {message}",
                    paths.join(", ")
                ),
            )
        };
        let text = toml::to_string(&document).map_err(|e| blame(e.to_string()))?;
        let file: ScenarioFile =
            toml::from_str(&text).map_err(|e| blame(e.message().to_string()))?;
        validate(&file).map_err(|(_, message)| blame(message))
    }
}

fn to_override((path, value): (&Spanned<String>, &Spanned<toml::Value>)) -> Override {
    Override {
        path: path.get_ref().clone(),
        value: value.get_ref().clone(),
        path_span: path.span(),
        value_span: value.span(),
    }
}

/// Top-level tables whose keys are names the user chose.
const USER_NAMED_MAPS: [&str; 3] = ["hosts", "links", "cases"];

/// Sets `path` (dotted) in a TOML tree. Top-level tables and the named entries of `hosts`,
/// `links` and `cases` must exist (so a typo in a link or case name is an error); deeper tables
/// and the last key may be new (a misspelt field is then rejected as an unknown key).
pub fn set_path(root: &mut toml::Table, path: &str, value: toml::Value) -> Result<(), String> {
    let keys: Vec<&str> = path.split('.').collect();
    if keys.iter().any(|k| k.is_empty()) {
        return Err(format!(
            "`{path}` is not a dotted path such as \"links.access.b_to_a.delay\""
        ));
    }
    let (last, parents) = keys.split_last().expect("split yields at least one key");
    let mut table = root;
    let mut walked = Vec::new();
    for key in parents {
        walked.push(*key);
        // Entries of the maps named by the user (a link, a host, a case) must exist, so a typo
        // in their name is reported as such; optional tables below them (a link direction left
        // at its defaults) are created.
        let user_named = walked.len() == 2 && USER_NAMED_MAPS.contains(&walked[0]);
        if !table.contains_key(*key) && !user_named && walked.len() > 1 {
            table.insert(key.to_string(), toml::Value::Table(toml::Table::new()));
        }
        if !table.contains_key(*key) {
            let known: Vec<_> = table.keys().cloned().collect();
            return Err(format!(
                "path `{path}`: `{}` does not exist in the scenario (there: {})",
                walked.join("."),
                known.join(", ")
            ));
        }
        table = match table.get_mut(*key) {
            Some(toml::Value::Table(inner)) => inner,
            _ => {
                return Err(format!(
                    "`{}` in path `{path}` is a value, not a table",
                    walked.join(".")
                ))
            }
        };
    }
    table.insert(last.to_string(), value);
    Ok(())
}

type Blame = (Range<usize>, String);
/// Resolves a host reference (`what` names the referring field in the message).
type HostCheck<'a> = &'a dyn Fn(&Spanned<String>, &str) -> Result<String, Blame>;

/// Cross-field checks of a parsed file; errors carry the span of the offending field.
fn validate(file: &ScenarioFile) -> Result<Scenario, Blame> {
    let host_exists = |name: &Spanned<String>, what: &str| -> Result<String, Blame> {
        if file.hosts.contains_key(name.get_ref()) {
            Ok(name.get_ref().clone())
        } else {
            let known: Vec<_> = file.hosts.keys().cloned().collect();
            Err((
                name.span(),
                format!(
                    "{what} names host `{}`, which is not in [hosts] ({})",
                    name.get_ref(),
                    known.join(", ")
                ),
            ))
        }
    };
    let hosts: Vec<_> = file
        .hosts
        .iter()
        .map(|(name, host)| midway_labnet::HostSpec {
            name: name.clone(),
            stack: host.stack,
        })
        .collect();
    let mut links = Vec::new();
    for (name, link) in &file.links {
        let a = host_exists(&link.a, &format!("link `{name}`"))?;
        let b = host_exists(&link.b, &format!("link `{name}`"))?;
        if a == b {
            return Err((
                link.b.span(),
                format!("link `{name}` connects `{a}` to itself"),
            ));
        }
        links.push(Link {
            name: name.clone(),
            a,
            b,
            a_to_b: link.a_to_b.clone(),
            b_to_a: link.b_to_a.clone(),
        });
    }
    let spec = midway_labnet::TopologySpec {
        hosts: hosts.clone(),
        links: links
            .iter()
            .map(|l| midway_labnet::LinkSpec {
                a: l.a.clone(),
                b: l.b.clone(),
                a_to_b: Default::default(),
                b_to_a: Default::default(),
            })
            .collect(),
    };
    midway_labnet::validate(&spec).map_err(|e| (0..0, e.to_string()))?;

    let client = host_exists(&file.roles.client, "roles.client")?;
    let proxy = host_exists(&file.roles.proxy, "roles.proxy")?;
    let server = host_exists(&file.roles.server, "roles.server")?;
    let mut scenario = Scenario {
        name: file.name.clone(),
        description: file.description.clone(),
        source: file.source.clone(),
        seed: file.seed.unwrap_or(DEFAULT_SEED),
        hosts,
        links,
        client,
        proxy,
        server,
        workload: Workload::Bulk(BulkWorkload {
            bytes: 0,
            client_recv_buffer: None,
            server_send_buffer: None,
            server_congestion_control: None,
            client_congestion_control: None,
            warmup_bytes: None,
            connections: 1,
            port: 0,
            timeout: std::time::Duration::ZERO,
        }),
        cases: BTreeMap::new(),
    };
    if scenario.path(&scenario.client, &scenario.server).is_none() {
        return Err((
            file.roles.server.span(),
            format!(
                "no chain of links leads from client `{}` to server `{}`",
                scenario.client, scenario.server
            ),
        ));
    }
    scenario.workload = validate_workload(&file.workload, &host_exists)?;
    for (name, case) in &file.cases {
        let validated = validate_case(name, case, &scenario, &host_exists)?;
        scenario.cases.insert(name.clone(), validated);
    }
    Ok(scenario)
}

fn validate_workload(
    workload: &WorkloadFile,
    host_exists: HostCheck<'_>,
) -> Result<Workload, Blame> {
    let kind_span = workload.kind.span();
    let kind = *workload.kind.get_ref();
    let timeout = workload
        .timeout
        .map(|t| t.0)
        .unwrap_or(std::time::Duration::from_secs(
            DEFAULT_WORKLOAD_TIMEOUT_SECS,
        ));
    let port = workload.port.unwrap_or(if kind == WorkloadKind::Web {
        DEFAULT_WEB_PORT
    } else {
        DEFAULT_SERVER_PORT
    });
    if port == 0 {
        return Err((kind_span, "workload.port must not be 0".into()));
    }
    let kind_text = match kind {
        WorkloadKind::Bulk => "bulk",
        WorkloadKind::Command => "command",
        WorkloadKind::Web => "web",
    };
    let not_for = |present: bool, field: &str, kind: &str| -> Result<(), Blame> {
        if present {
            Err((
                kind_span.clone(),
                format!("workload.{field} does not apply to a `{kind}` workload"),
            ))
        } else {
            Ok(())
        }
    };
    if kind != WorkloadKind::Web {
        let web_only = [
            (workload.hosts.is_some(), "hosts"),
            (workload.pages.is_some(), "pages"),
            (workload.page_bytes.is_some(), "page_bytes"),
            (workload.objects.is_some(), "objects"),
            (workload.object_hosts.is_some(), "object_hosts"),
            (workload.http.is_some(), "http"),
            (
                workload.connections_per_host.is_some(),
                "connections_per_host",
            ),
            (workload.cache.is_some(), "cache"),
            (workload.cache_max_age.is_some(), "cache_max_age"),
            (workload.keepalive_timeout.is_some(), "keepalive_timeout"),
            (workload.think_time.is_some(), "think_time"),
        ];
        for (present, field) in web_only {
            not_for(present, field, kind_text)?;
        }
    }
    if kind != WorkloadKind::Bulk {
        not_for(workload.warmup_bytes.is_some(), "warmup_bytes", kind_text)?;
        not_for(workload.connections.is_some(), "connections", kind_text)?;
        not_for(
            workload.client_recv_buffer.is_some(),
            "client_recv_buffer",
            kind_text,
        )?;
        not_for(
            workload.server_send_buffer.is_some(),
            "server_send_buffer",
            kind_text,
        )?;
        not_for(
            workload.server_congestion_control.is_some()
                || workload.client_congestion_control.is_some(),
            "*_congestion_control",
            kind_text,
        )?;
    }
    match kind {
        WorkloadKind::Bulk => {
            not_for(workload.server.is_some(), "server", "bulk")?;
            not_for(workload.client.is_some(), "client", "bulk")?;
            let bytes = workload.bytes.ok_or_else(|| {
                (
                    kind_span.clone(),
                    "a bulk workload needs `bytes` (e.g. bytes = \"3MB\")".to_string(),
                )
            })?;
            if bytes.0 == 0 {
                return Err((kind_span, "workload.bytes must be at least 1".into()));
            }
            let connections = workload.connections.unwrap_or(1);
            if !(1..=MAX_BULK_CONNECTIONS).contains(&connections) {
                return Err((
                    kind_span,
                    format!(
                        "workload.connections must be between 1 and {MAX_BULK_CONNECTIONS} (got {connections})"
                    ),
                ));
            }
            Ok(Workload::Bulk(BulkWorkload {
                bytes: bytes.0,
                // 0 = left to the kernel's autotuning, so an experiment can lift a file-wide
                // buffer limit through `set` (an absent key cannot be written there).
                client_recv_buffer: workload.client_recv_buffer.map(|b| b.0).filter(|&b| b > 0),
                server_send_buffer: workload.server_send_buffer.map(|b| b.0).filter(|&b| b > 0),
                server_congestion_control: workload.server_congestion_control.clone(),
                client_congestion_control: workload.client_congestion_control.clone(),
                warmup_bytes: workload.warmup_bytes.map(|b| b.0).filter(|&b| b > 0),
                connections,
                port,
                timeout,
            }))
        }
        WorkloadKind::Command => {
            let command = |file: &CommandFile, what: &str| -> Result<HostCommand, Blame> {
                let host = host_exists(&file.host, what)?;
                if file.argv.get_ref().is_empty() {
                    return Err((file.argv.span(), format!("{what}.argv is empty")));
                }
                Ok(HostCommand {
                    host,
                    argv: file.argv.get_ref().clone(),
                    listen_port: file.listen_port,
                })
            };
            let client = match workload.client.as_ref().map(|c| (c.span(), c.get_ref())) {
                Some((_, WorkloadClientFile::Command(client))) => client,
                Some((span, WorkloadClientFile::Web(_))) => {
                    return Err((
                        span,
                        "a command workload's client is a table { host, argv }; \
                         \"loader\" and \"chromium\" are web clients"
                            .to_string(),
                    ))
                }
                None => {
                    return Err((
                        kind_span,
                        "a command workload needs [workload.client] with host and argv".to_string(),
                    ))
                }
            };
            Ok(Workload::Command(CommandWorkload {
                bytes: workload.bytes.map(|b| b.0),
                port,
                timeout,
                server: workload
                    .server
                    .as_ref()
                    .map(|s| command(s, "workload.server"))
                    .transpose()?,
                client: command(client, "workload.client")?,
            }))
        }
        WorkloadKind::Web => validate_web(workload, port, timeout),
    }
}

fn validate_web(
    workload: &WorkloadFile,
    port: u16,
    timeout: std::time::Duration,
) -> Result<Workload, Blame> {
    let kind_span = workload.kind.span();
    let not_for_web = |present: bool, field: &str| -> Result<(), Blame> {
        if present {
            Err((
                kind_span.clone(),
                format!("workload.{field} does not apply to a `web` workload"),
            ))
        } else {
            Ok(())
        }
    };
    not_for_web(workload.bytes.is_some(), "bytes (use page_bytes)")?;
    not_for_web(workload.server.is_some(), "server")?;
    let client = match workload.client.as_ref().map(|c| (c.span(), c.get_ref())) {
        None => WebClient::Loader,
        Some((_, WorkloadClientFile::Web(client))) => *client,
        Some((span, WorkloadClientFile::Command(_))) => {
            return Err((
                span,
                "a web workload's client is \"loader\" or \"chromium\", not a command".into(),
            ))
        }
    };
    let hosts = match &workload.hosts {
        None => vec![DEFAULT_WEB_HOST.to_string()],
        Some(hosts) => {
            let list = hosts.get_ref();
            if list.is_empty() || list.len() > MAX_WEB_HOSTS {
                return Err((
                    hosts.span(),
                    format!("workload.hosts needs 1 to {MAX_WEB_HOSTS} names"),
                ));
            }
            let mut seen = BTreeSet::new();
            for name in list {
                if !midway_labnet::is_valid_host_name(name) {
                    return Err((
                        hosts.span(),
                        format!(
                            "workload.hosts: {}",
                            midway_labnet::BadHostName { name: name.clone() }
                        ),
                    ));
                }
                if !seen.insert(name.to_ascii_lowercase()) {
                    return Err((hosts.span(), format!("workload.hosts names `{name}` twice")));
                }
            }
            list.clone()
        }
    };
    let pages = workload.pages.as_ref().map_or(1, |p| *p.get_ref());
    if !(1..=MAX_WEB_PAGES).contains(&pages) {
        let span = workload
            .pages
            .as_ref()
            .map_or(kind_span.clone(), |p| p.span());
        return Err((span, format!("workload.pages must be 1 to {MAX_WEB_PAGES}")));
    }
    let objects = workload.objects.as_ref().map_or(0, |o| *o.get_ref());
    if objects > MAX_WEB_OBJECTS {
        let span = workload
            .objects
            .as_ref()
            .map_or(kind_span.clone(), |o| o.span());
        return Err((
            span,
            format!("workload.objects must be at most {MAX_WEB_OBJECTS}"),
        ));
    }
    let page_bytes = workload.page_bytes.as_ref().ok_or_else(|| {
        (
            kind_span.clone(),
            "a web workload needs `page_bytes` (base document and objects of one page, \
             e.g. page_bytes = \"65KB\")"
                .to_string(),
        )
    })?;
    // Objects go to hosts[1..=object_hosts]; with a single host they can only be on hosts[0].
    let extra_hosts = u32::try_from(hosts.len() - 1).unwrap_or(u32::MAX);
    let object_hosts = match &workload.object_hosts {
        None => extra_hosts.min(1),
        Some(count) => {
            if *count.get_ref() > extra_hosts {
                return Err((
                    count.span(),
                    format!(
                        "workload.object_hosts = {} but hosts has only {extra_hosts} name{} \
                         after the first (objects go to hosts[1..=object_hosts]; 0 = hosts[0])",
                        count.get_ref(),
                        if extra_hosts == 1 { "" } else { "s" }
                    ),
                ));
            }
            *count.get_ref()
        }
    };
    let connections_per_host = workload
        .connections_per_host
        .as_ref()
        .map_or(DEFAULT_CONNECTIONS_PER_HOST, |c| *c.get_ref());
    if !(1..=MAX_CONNECTIONS_PER_HOST).contains(&connections_per_host) {
        let span = workload
            .connections_per_host
            .as_ref()
            .map_or(kind_span.clone(), |c| c.span());
        return Err((
            span,
            format!("workload.connections_per_host must be 1 to {MAX_CONNECTIONS_PER_HOST}"),
        ));
    }
    let http = workload
        .http
        .as_ref()
        .map_or(HttpVersion::KeepAlive, |h| *h.get_ref());
    let cache = workload
        .cache
        .as_ref()
        .map_or(WebCache::Plain, |c| *c.get_ref());
    if client == WebClient::Chromium {
        // The browser speaks HTTP/1.1 with its own 6 connections per host, and sends no
        // no-cache headers on an ordinary load.
        if let Some(h) = workload
            .http
            .as_ref()
            .filter(|h| *h.get_ref() != HttpVersion::KeepAlive)
        {
            return Err((
                h.span(),
                "workload.http: Chromium speaks HTTP/1.1 keep-alive only (\"1.1\")".into(),
            ));
        }
        if let Some(c) = workload
            .connections_per_host
            .as_ref()
            .filter(|c| *c.get_ref() != DEFAULT_CONNECTIONS_PER_HOST)
        {
            return Err((
                c.span(),
                format!(
                    "workload.connections_per_host: Chromium opens its own \
                     {DEFAULT_CONNECTIONS_PER_HOST} per host"
                ),
            ));
        }
        if let Some(c) = workload
            .cache
            .as_ref()
            .filter(|c| *c.get_ref() == WebCache::Miss)
        {
            return Err((
                c.span(),
                "workload.cache = \"miss\" needs the loader (Chromium sends no no-cache \
                 headers on a load)"
                    .into(),
            ));
        }
    }
    let web = WebWorkload {
        hosts,
        pages,
        page_bytes: page_bytes.get_ref().0,
        objects,
        object_hosts,
        http,
        connections_per_host,
        client,
        cache,
        cache_max_age: workload.cache_max_age.map_or(
            Some(std::time::Duration::from_secs(DEFAULT_CACHE_MAX_AGE_SECS)),
            |m| m.0,
        ),
        keepalive_timeout: workload.keepalive_timeout.map_or(
            std::time::Duration::from_secs(DEFAULT_KEEPALIVE_TIMEOUT_SECS),
            |d| d.0,
        ),
        think_time: workload
            .think_time
            .map_or(std::time::Duration::ZERO, |d| d.0),
        port,
        timeout,
    };
    // The origin's own check of the page layout (its HTML needs room for the object tags).
    if let Err(error) = crate::web::site_spec(&web).layout() {
        return Err((page_bytes.span(), format!("workload: {error}")));
    }
    Ok(Workload::Web(web))
}

fn validate_case(
    name: &str,
    case: &CaseFile,
    scenario: &Scenario,
    host_exists: HostCheck<'_>,
) -> Result<Case, Blame> {
    let kind = *case.kind.get_ref();
    let host = match &case.host {
        Some(host) => host_exists(host, &format!("case `{name}`"))?,
        None => scenario.proxy.clone(),
    };
    let path = scenario
        .path(&scenario.client, &scenario.server)
        .unwrap_or_default();
    if kind != CaseKind::Direct && !path.contains(&host) {
        let span = case.host.as_ref().map_or(case.kind.span(), |h| h.span());
        return Err((
            span,
            format!(
                "case `{name}` runs its proxy on `{host}`, which is not on the path client -> server ({})",
                path.join(" -> ")
            ),
        ));
    }
    if case.route_tuning.is_some() && scenario.link_between(&host, &scenario.client).is_none() {
        return Err((
            case.kind.span(),
            format!(
                "case `{name}`: route_tuning applies to `{host}`'s route toward the client, \
                 but `{host}` has no link to `{}`",
                scenario.client
            ),
        ));
    }
    let midway_only: [(&str, Option<Range<usize>>); 8] = [
        ("intercept", case.intercept.as_ref().map(|s| s.span())),
        ("relay", case.relay.as_ref().map(|s| s.span())),
        (
            "local_profile",
            case.local_profile.as_ref().map(|s| s.span()),
        ),
        (
            "remote_profile",
            case.remote_profile.as_ref().map(|s| s.span()),
        ),
        ("profiles", case.profiles.as_ref().map(|_| case.kind.span())),
        ("listener", case.listener.as_ref().map(|_| case.kind.span())),
        ("config", case.config.as_ref().map(|_| case.kind.span())),
        ("http", case.http.as_ref().map(|_| case.kind.span())),
    ];
    let squid_only: [(&str, Option<Range<usize>>); 2] = [
        ("cache", case.cache.as_ref().map(|s| s.span())),
        (
            "upstream_persistence",
            case.upstream_persistence.as_ref().map(|s| s.span()),
        ),
    ];
    let refuse = |field: &str, span: Range<usize>, owner: &str| -> Blame {
        (
            span,
            format!(
                "case `{name}` is `{}`; `{field}` applies only to `{owner}` cases",
                kind_name(kind)
            ),
        )
    };
    if kind != CaseKind::Squid {
        if let Some((field, Some(span))) = squid_only.iter().find(|(_, s)| s.is_some()) {
            return Err(refuse(field, span.clone(), "squid"));
        }
    }
    let midway = if kind == CaseKind::Midway {
        if host == scenario.client || host == scenario.server {
            return Err((
                case.kind.span(),
                format!("case `{name}`: the proxy cannot run on the client or server host"),
            ));
        }
        let intercept = case
            .intercept
            .as_ref()
            .map_or(Intercept::Forward, |s| *s.get_ref());
        if let Some(relay) = case.relay.as_ref().filter(|_| intercept == Intercept::Http) {
            return Err((
                relay.span(),
                format!(
                    "case `{name}`: an HTTP proxy answers requests itself; `relay` applies to \
                     forward and transparent cases"
                ),
            ));
        }
        if case.http.is_some() && intercept != Intercept::Http {
            return Err((
                case.kind.span(),
                format!("case `{name}`: `http` applies only with intercept = \"http\""),
            ));
        }
        if intercept == Intercept::Http && matches!(scenario.workload, Workload::Bulk(_)) {
            let span = case
                .intercept
                .as_ref()
                .map_or(case.kind.span(), |s| s.span());
            return Err((
                span,
                format!(
                    "case `{name}`: an HTTP proxy needs HTTP requests; a bulk workload sends \
                     none (use a web or command workload)"
                ),
            ));
        }
        Some(MidwayCase {
            intercept,
            relay: case
                .relay
                .as_ref()
                .map_or(RelayKind::Buffer, |s| *s.get_ref()),
            local_profile: case.local_profile.as_ref().map(|s| s.get_ref().clone()),
            remote_profile: case.remote_profile.as_ref().map(|s| s.get_ref().clone()),
            profiles: case.profiles.clone().unwrap_or_default(),
            listener: case.listener.clone().unwrap_or_default(),
            config: case.config.clone().unwrap_or_default(),
            http: case.http.clone().unwrap_or_default(),
        })
    } else {
        for (field, span) in midway_only {
            if let Some(span) = span {
                return Err(refuse(field, span, "midway"));
            }
        }
        None
    };
    let squid = if kind == CaseKind::Squid {
        if matches!(scenario.workload, Workload::Bulk(_)) {
            return Err((
                case.kind.span(),
                format!(
                    "case `{name}`: Squid needs HTTP requests; a bulk workload sends none \
                     (use a web or command workload)"
                ),
            ));
        }
        Some(SquidCase {
            cache: case.cache.as_ref().is_none_or(|c| *c.get_ref()),
            upstream_persistence: case
                .upstream_persistence
                .as_ref()
                .map_or(UpstreamPersistence::Default, |u| *u.get_ref()),
        })
    } else {
        None
    };
    if matches!(kind, CaseKind::Haproxy | CaseKind::Squid)
        && (host == scenario.client || host == scenario.server)
    {
        return Err((
            case.kind.span(),
            format!("case `{name}`: the proxy cannot run on the client or server host"),
        ));
    }
    Ok(Case {
        name: name.to_string(),
        kind,
        host,
        midway,
        squid,
        route_tuning: case.route_tuning.clone(),
    })
}

/// Why a point cannot run `case` with its workload, for combinations that depend on both (a case
/// may be fine for one experiment's workload and not for another's).
pub fn case_workload_conflict(scenario: &Scenario, case: &Case) -> Option<String> {
    let chromium =
        matches!(&scenario.workload, Workload::Web(w) if w.client == WebClient::Chromium);
    let forward = match case.kind {
        CaseKind::Haproxy => true,
        CaseKind::Midway => case.midway.as_ref().map(|m| m.intercept) == Some(Intercept::Forward),
        CaseKind::Direct | CaseKind::Squid => false,
    };
    (chromium && forward).then(|| {
        format!(
            "case `{}` forwards the proxy's port to a fixed target, which Chromium (loading from \
             the origin's names and port) cannot use; give it intercept = \"transparent\" or \
             \"http\", or run it with client = \"loader\"",
            case.name
        )
    })
}

pub fn kind_name(kind: CaseKind) -> &'static str {
    match kind {
        CaseKind::Direct => "direct",
        CaseKind::Midway => "midway",
        CaseKind::Haproxy => "haproxy",
        CaseKind::Squid => "squid",
    }
}

impl fmt::Display for CaseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(kind_name(*self))
    }
}

/// The x coordinate of a sweep value: a number as is, a loss model's mean rate, a duration in
/// ms, a size in bytes, a rate in bit/s. None when it has no natural number.
pub fn derived_axis_value(value: &toml::Value) -> Option<f64> {
    match value {
        toml::Value::Integer(i) => Some(*i as f64),
        toml::Value::Float(f) => Some(*f),
        toml::Value::String(text) => HumanDuration::parse(text)
            .map(|d| d.as_millis_f64())
            .or_else(|_| ByteSize::parse(text).map(|b| b.0 as f64))
            .or_else(|_| Rate::parse(text).map(|r| r.0 as f64))
            .ok(),
        toml::Value::Table(_) => value
            .clone()
            .try_into::<LossSpec>()
            .ok()
            .map(|l| l.mean_rate()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_path_requires_existing_parents_and_replaces_the_leaf() {
        let mut doc: toml::Table =
            toml::from_str("[links.access.b_to_a]\ndelay = \"10ms\"").unwrap();
        set_path(&mut doc, "links.access.b_to_a.delay", "20ms".into()).unwrap();
        set_path(&mut doc, "links.access.b_to_a.rate", "1Mbit".into()).unwrap();
        set_path(&mut doc, "links.access.a_to_b.delay", "5ms".into()).unwrap();
        assert_eq!(
            doc["links"]["access"]["a_to_b"]["delay"].as_str(),
            Some("5ms")
        );
        assert!(set_path(&mut doc, "nosuch.x", "1ms".into()).is_err());
        assert_eq!(
            doc["links"]["access"]["b_to_a"]["delay"].as_str(),
            Some("20ms")
        );
        assert_eq!(
            doc["links"]["access"]["b_to_a"]["rate"].as_str(),
            Some("1Mbit")
        );
        let error = set_path(&mut doc, "links.acess.b_to_a.delay", "1ms".into()).unwrap_err();
        assert!(error.contains("`links.acess` does not exist"), "{error}");
        let error = set_path(&mut doc, "links.access.b_to_a.delay.x", "1ms".into()).unwrap_err();
        assert!(error.contains("is a value"), "{error}");
        assert!(set_path(&mut doc, "links..x", "1ms".into()).is_err());
    }

    #[test]
    fn axis_values_are_derived_from_units() {
        assert_eq!(derived_axis_value(&"100ms".into()), Some(100.0));
        assert_eq!(derived_axis_value(&"3MB".into()), Some(3e6));
        assert_eq!(derived_axis_value(&toml::Value::Integer(5)), Some(5.0));
        let loss: toml::Value =
            toml::from_str::<toml::Table>("x = { bernoulli = 0.03 }").unwrap()["x"].clone();
        assert_eq!(derived_axis_value(&loss), Some(0.03));
        assert_eq!(derived_axis_value(&"modern".into()), None);
    }

    #[test]
    fn bulk_connections_default_to_one_and_go_into_the_params() {
        let text = |extra: &str| {
            format!(
                "name = \"c\"\ndescription = \"d\"\nsource = \"s\"\n[hosts.client]\n[hosts.server]\n[roles]\nclient = \"client\"\n\
                 proxy = \"server\"\nserver = \"server\"\n[links.l]\na = \"client\"\n\
                 b = \"server\"\n[workload]\nkind = \"bulk\"\nbytes = \"300KB\"\n{extra}\
                 [cases.direct]\nkind = \"direct\"\n[[experiments]]\nname = \"e\"\n\
                 cases = [\"direct\"]\n"
            )
        };
        let connections = |extra: &str| {
            let loaded = LoadedScenario::from_text(Path::new("c.toml"), text(extra)).unwrap();
            match &loaded.base.workload {
                Workload::Bulk(bulk) => bulk.connections,
                other => panic!("not bulk: {other:?}"),
            }
        };
        assert_eq!(connections(""), 1);
        assert_eq!(connections("connections = 3\n"), 3);
        let params = |extra: &str| {
            LoadedScenario::from_text(Path::new("c.toml"), text(extra))
                .unwrap()
                .base
                .flat_params()
        };
        assert_eq!(params("connections = 3\n")["connections"], 3);
        assert!(!params("").contains_key("connections"));
        let error = LoadedScenario::from_text(Path::new("c.toml"), text("connections = 65\n"))
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("between 1 and 64 (got 65)"), "{error}");
    }

    const WEB: &str = r#"
name = "web"
description = "d"
source = "s"
[hosts.client]
[hosts.proxy]
[hosts.server]
[roles]
client = "client"
proxy = "proxy"
server = "server"
[links.access]
a = "client"
b = "proxy"
[links.internet]
a = "proxy"
b = "server"
[workload]
kind = "web"
page_bytes = "65KB"
objects = 19
[cases.direct]
kind = "direct"
[cases.squid]
kind = "squid"
upstream_persistence = "long"
[cases.midway-http]
kind = "midway"
intercept = "http"
http = { cache = false }
[quick]
set = { "workload.pages" = 1 }
[[experiments]]
name = "modes"
cases = ["direct", "squid", "midway-http"]
set = { "workload.pages" = 3 }
[experiments.sweep]
param = "workload.http"
label = "http"
values = ["1.0", "1.1", "pipelining"]
"#;

    fn web_of(scenario: &Scenario) -> &WebWorkload {
        match &scenario.workload {
            Workload::Web(web) => web,
            other => panic!("not web: {other:?}"),
        }
    }

    #[test]
    fn web_defaults_follow_the_interface() {
        let loaded = LoadedScenario::from_text(Path::new("web.toml"), WEB.into()).unwrap();
        let web = web_of(&loaded.base);
        assert_eq!(web.hosts, ["www.lab"]);
        assert_eq!(web.pages, 1);
        // A single host: the objects can only be on it.
        assert_eq!(web.object_hosts, 0);
        assert_eq!(web.http, HttpVersion::KeepAlive);
        assert_eq!(web.connections_per_host, 6);
        assert_eq!(web.client, WebClient::Loader);
        assert_eq!(web.cache, WebCache::Plain);
        assert_eq!(
            web.cache_max_age,
            Some(std::time::Duration::from_secs(3600))
        );
        assert_eq!(web.keepalive_timeout, std::time::Duration::from_secs(15));
        assert_eq!(web.think_time, std::time::Duration::ZERO);
        assert_eq!(web.port, 80);
        let squid = loaded.base.cases["squid"].squid.unwrap();
        assert!(squid.cache);
        assert_eq!(squid.upstream_persistence, UpstreamPersistence::Long);
        let http = loaded.base.cases["midway-http"].midway.as_ref().unwrap();
        assert_eq!(http.intercept, Intercept::Http);
        assert_eq!(http.http["cache"].as_bool(), Some(false));
    }

    #[test]
    fn web_values_are_swept_set_and_quick_overridden_by_dotted_path() {
        let loaded = LoadedScenario::from_text(Path::new("web.toml"), WEB.into()).unwrap();
        let experiment = &loaded.file.experiments[0];
        let sweep = experiment.sweep.as_ref().unwrap();
        let modes: Vec<(HttpVersion, u32)> = (0..3)
            .map(|index| {
                let mut all = loaded.fixed_overrides(experiment, false);
                all.extend(loaded.sweep_overrides(sweep, index));
                let scenario = loaded.point_scenario(&all).unwrap();
                let web = web_of(&scenario);
                (web.http, web.pages)
            })
            .collect();
        assert_eq!(
            modes,
            [
                (HttpVersion::Http10, 3),
                (HttpVersion::KeepAlive, 3),
                (HttpVersion::Pipelining, 3)
            ]
        );
        let quick = loaded
            .point_scenario(&loaded.fixed_overrides(experiment, true))
            .unwrap();
        assert_eq!(web_of(&quick).pages, 1);
        // A swept value is checked like a written one.
        let bad = Override {
            path: "workload.cache_max_age".into(),
            value: "forever".into(),
            path_span: 0..0,
            value_span: 0..0,
        };
        assert!(loaded.point_scenario(&[bad]).is_err());
        let chromium = Override {
            path: "workload.client".into(),
            value: "chromium".into(),
            path_span: 0..0,
            value_span: 0..0,
        };
        assert_eq!(
            web_of(&loaded.point_scenario(&[chromium]).unwrap()).client,
            WebClient::Chromium
        );
    }

    #[test]
    fn web_and_command_clients_do_not_mix_and_proxy_kinds_need_requests() {
        let with = |from: &str, to: &str| {
            assert!(WEB.contains(from), "{from}");
            LoadedScenario::from_text(Path::new("web.toml"), WEB.replace(from, to))
        };
        let error = with(
            "objects = 19\n",
            "objects = 19\n[workload.client]\nhost = \"client\"\nargv = [\"true\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("not a command"), "{error}");
        let error = with(
            "kind = \"web\"\npage_bytes = \"65KB\"\nobjects = 19",
            "kind = \"bulk\"\nbytes = \"1MB\"",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("needs HTTP requests"), "{error}");
        let error = with(
            "upstream_persistence = \"long\"",
            "upstream_persistence = \"forever\"",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("unknown variant `forever`"), "{error}");
        let error = with(
            "kind = \"direct\"",
            "kind = \"direct\"\nupstream_persistence = \"long\"",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("applies only to `squid` cases"), "{error}");
        let error = with(
            "http = { cache = false }",
            "intercept = \"forward\"\nhttp = {}",
        )
        .unwrap_err()
        .to_string();
        // TOML itself refuses the second `intercept`; a forward case with `http` is refused by us.
        assert!(error.contains("intercept"), "{error}");
        let error = with(
            "intercept = \"http\"\nhttp = { cache = false }",
            "http = { cache = false }",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("only with intercept = \"http\""), "{error}");
        // The command workload still takes its client table (spans kept for its errors).
        let command = with(
            "kind = \"web\"\npage_bytes = \"65KB\"\nobjects = 19",
            "kind = \"command\"\n[workload.client]\nhost = \"nohost\"\nargv = [\"curl\"]",
        )
        .unwrap_err()
        .to_string();
        assert!(command.contains("web.toml:21:8"), "{command}");
        assert!(command.contains("`nohost`"), "{command}");
    }

    #[test]
    fn a_forward_case_is_refused_only_in_experiments_that_run_chromium() {
        let text = WEB.replace("[quick]", "[cases.haproxy]\nkind = \"haproxy\"\n[quick]");
        let browser = |cases: &str| {
            format!(
                "{text}[[experiments]]\nname = \"browser\"\ncases = {cases}\n\
                 set = {{ \"workload.client\" = \"chromium\" }}\n"
            )
        };
        LoadedScenario::from_text(Path::new("web.toml"), browser("[\"direct\", \"squid\"]"))
            .unwrap();
        let error =
            LoadedScenario::from_text(Path::new("web.toml"), browser("[\"direct\", \"haproxy\"]"))
                .unwrap_err()
                .to_string();
        assert!(
            error.contains("experiment `browser`: case `haproxy`"),
            "{error}"
        );
    }

    #[test]
    fn locations_are_one_based_lines_and_columns() {
        let text = "a = 1\nbb = 2\n";
        assert_eq!(location(Path::new("f.toml"), text, &(9..10)), "f.toml:2:4");
        assert_eq!(location(Path::new("f.toml"), text, &(0..1)), "f.toml:1:1");
    }
}
