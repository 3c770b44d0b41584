//! What a scenario TOML contains: the serde structs of the file form. Values that carry a unit
//! are checked while parsing, so `toml` names their line; checks that need the whole file are in
//! `validate`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::impairments::{OutagesFile, UdpFile};
use crate::units::{ByteSize, HumanDuration, LossSpec, MaxAge, QueueSpec, Rate};

/// A scenario file as written. See `scenarios/hfc-demo.toml` for a commented example.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// Short name; goes into every result record.
    pub name: String,
    /// What the scenario measures, in a sentence or two.
    pub description: String,
    /// Paper and section the parameters come from.
    pub source: String,
    /// Base seed; each point's seed is derived from it (see `plan::point_seed`).
    #[serde(default)]
    pub seed: Option<u64>,
    /// The `[hosts.NAME]` tables, by host name.
    pub hosts: BTreeMap<String, HostFile>,
    /// The `[links.NAME]` tables, by link name.
    pub links: BTreeMap<String, LinkFile>,
    /// The `[roles]` table: which hosts are client, proxy and server.
    pub roles: RolesFile,
    /// The `[workload]` table.
    pub workload: WorkloadFile,
    /// The `[cases.NAME]` tables, by case name.
    pub cases: BTreeMap<String, CaseFile>,
    /// Overrides applied by `--quick` (smaller transfers); the sweep itself is cut to its first,
    /// middle and last value and to one repetition.
    #[serde(default)]
    pub quick: QuickFile,
    /// The `[[experiments]]` entries, in file order.
    pub experiments: Vec<ExperimentFile>,
    /// The subset `midway lab artifact` reruns (see `artifact`); absent: none.
    #[serde(default)]
    pub artifact: Option<super::artifact::ArtifactFile>,
}

/// A `[hosts.NAME]` table: one network namespace.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostFile {
    /// `modern` (Linux defaults) or `legacy` (as close to a 1990s stack as Linux allows).
    #[serde(default)]
    pub stack: midway_labnet::StackProfile,
}

/// A `[links.NAME]` table: an emulated link between hosts `a` and `b`, one config per direction.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkFile {
    /// Name of the host at end a.
    pub a: Spanned<String>,
    /// Name of the host at end b.
    pub b: Spanned<String>,
    /// Emulation of the traffic from a to b (default: a perfect link).
    #[serde(default)]
    pub a_to_b: DirectionFile,
    /// Emulation of the traffic from b to a (default: a perfect link).
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
    /// Scheduled blackouts (every frame dropped): `periodic = { period, duration, offset }`
    /// and/or `once = [{ start, duration }]`, times from the link's start; absent = none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outages: Option<OutagesFile>,
    /// UDP only, TCP untouched: `{ action = "drop" }` or `{ action = "rate_limit", rate =
    /// "1Mbit", burst = "15KB" }`, optionally for one `port`; absent = UDP like any traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<UdpFile>,
}

/// The `[roles]` table: which hosts run the client, the proxy and the server.
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

/// `workload.kind`: what the client and server do.
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

/// The `[workload]` table; which fields apply depends on `kind` (checked in `validate_workload`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    /// What the client and the server do: `bulk`, `command` or `web`.
    pub kind: Spanned<WorkloadKind>,
    /// Bulk: bytes the server sends (or `duration`). Command: bytes the command moves (for
    /// throughput), optional.
    #[serde(default)]
    pub bytes: Option<ByteSize>,
    /// Bulk: the server sends for this long instead of a number of bytes (as `iperf -t`).
    #[serde(default)]
    pub duration: Option<HumanDuration>,
    /// Bulk: an end-to-end transfer competing with the measured one for as long (needs
    /// `duration`), on another port so no proxy intercepts it.
    #[serde(default)]
    pub competing: Option<Spanned<CompetingFile>>,
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
    /// Bulk: `false` makes the client acknowledge every segment at once (route metric
    /// `quickack` on its routes), a receiver without delayed ACK; default true (the kernel's).
    #[serde(default)]
    pub client_delayed_ack: Option<bool>,
    /// Bulk: bytes of an unmeasured first transfer over the same path before the measured one,
    /// so the measured connection is a returning client's (Linux's tcp_metrics cache then holds
    /// the peer, and route-metric knobs such as `reordering` apply; see midway-tcp's README). The
    /// runner repeats it, three times at most, while the sender has cached nothing for the client.
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
    /// Web: parallel connections per host name (per proxy when proxied, unless
    /// `connection_limit` is "per-origin").
    #[serde(default)]
    pub connections_per_host: Option<Spanned<u32>>,
    /// Web, loader only: "per-server" (default: through a proxy the limit counts connections
    /// to the proxy, as RFC 2616-era browsers did) or "per-origin" (still per origin host
    /// through a proxy, as Chromium does).
    #[serde(default)]
    pub connection_limit: Option<Spanned<WebConnectionLimit>>,
    /// Web, loader only: "minimal" (default: about 70 bytes a request) or "chromium" (the
    /// header lines Chromium sends, about 380 bytes a request).
    #[serde(default)]
    pub request_headers: Option<Spanned<WebRequestHeaders>>,
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

/// `[workload.competing]`: the competing flow's settings; every field has a default.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompetingFile {
    /// TCP_CONGESTION of its sockets (default "reno", the overlay paper's competing flow).
    #[serde(default)]
    pub congestion_control: Option<String>,
    /// Port of its server (default: the workload's port + 1).
    #[serde(default)]
    pub port: Option<Spanned<u16>>,
    /// SO_RCVBUF of its client socket (default: the kernel's autotuning).
    #[serde(default)]
    pub client_recv_buffer: Option<ByteSize>,
    /// SO_SNDBUF of its server socket (default: the kernel's autotuning).
    #[serde(default)]
    pub server_send_buffer: Option<ByteSize>,
}

/// `workload.client`: a command table (command workloads) or a web client's name.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkloadClientFile {
    /// A command table: the timed program of a command workload.
    Command(CommandFile),
    /// The name of a web client: `"loader"` or `"chromium"`.
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

/// What the loader's `connections_per_host` counts through a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WebConnectionLimit {
    /// Connections to each server the client talks to (the proxy, when proxied).
    PerServer,
    /// Connections per origin host name, through a proxy too (Chromium's rule).
    PerOrigin,
}

/// The header lines of the loader's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WebRequestHeaders {
    /// Host, a short User-Agent and Accept.
    Minimal,
    /// The lines Chromium sends for an image.
    Chromium,
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
    /// Host the program runs in.
    pub host: Spanned<String>,
    /// Program and arguments, with placeholders not yet expanded.
    pub argv: Spanned<Vec<String>>,
    /// For a server: wait until this TCP port listens in its host before starting the client.
    #[serde(default)]
    pub listen_port: Option<u16>,
}

/// `kind` of a case: what, if anything, runs on the proxy host.
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
    /// midways on several hosts (`hosts`), each sending its connections through the next.
    Chain,
}

/// How the client's connections reach a midway case's proxy.
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

/// How a midway case relays data between its two segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RelayKind {
    /// Buffer-and-forward (bounded buffers, backpressure to the server).
    Buffer,
    /// Store-and-forward (memory, then disk spool).
    Spool,
}

/// A `[cases.NAME]` table: one way of carrying the workload (no proxy, midway, HAProxy, Squid).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseFile {
    /// What carries the workload: `direct`, `midway`, `haproxy`, `squid` or `chain`.
    pub kind: Spanned<CaseKind>,
    /// What the case stands for, for the report.
    #[serde(default)]
    pub description: Option<String>,
    /// Host the proxy runs on; default `roles.proxy`.
    #[serde(default)]
    pub host: Option<Spanned<String>>,
    /// chain: the midways' hosts, from the client side to the server side (two or more).
    #[serde(default)]
    pub hosts: Option<Spanned<Vec<Spanned<String>>>>,
    /// chain: profile of the segments between midways.
    #[serde(default)]
    pub peer_profile: Option<Spanned<String>>,
    /// chain: how the segments between midways are carried: `tcp` (default), `tls` or `quic`
    /// (a fresh key pair per midway and run).
    #[serde(default)]
    pub transport: Option<Spanned<midway_config::TransportName>>,
    /// chain with `transport = "quic"`: the tunnels' settings, as midway's `[peers.quic]`.
    #[serde(default)]
    pub quic: Option<toml::Table>,
    /// midway: `forward` (default) or `transparent`.
    #[serde(default)]
    pub intercept: Option<Spanned<Intercept>>,
    /// midway: `buffer` (default) or `spool`.
    #[serde(default)]
    pub relay: Option<Spanned<RelayKind>>,
    /// midway, chain: profile of the client-side segment (a preset or one from `profiles`).
    #[serde(default)]
    pub local_profile: Option<Spanned<String>>,
    /// midway, chain: profile of the server-side segment.
    #[serde(default)]
    pub remote_profile: Option<Spanned<String>>,
    /// midway, chain: `[profiles.NAME]` tables added to the generated configs, as midway reads them.
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
    /// Initial congestion window, in segments (`initcwnd`).
    #[serde(default)]
    pub initcwnd: Option<u32>,
    /// Initial receive window advertised, in segments (`initrwnd`).
    #[serde(default)]
    pub initrwnd: Option<u32>,
    /// Acknowledge at once instead of delaying ACKs (`quickack 1`).
    #[serde(default)]
    pub quickack: Option<bool>,
    /// Floor of the retransmission timeout (`rto_min`).
    #[serde(default)]
    pub rto_min: Option<HumanDuration>,
    /// Congestion control of the route's connections (`congctl`), e.g. "reno".
    #[serde(default)]
    pub congctl: Option<String>,
}

/// Overrides: dotted path -> value. Quote the keys (`"workload.bytes" = "300KB"`), or TOML makes
/// nested tables of them.
pub(crate) type OverridesFile = BTreeMap<Spanned<String>, Spanned<toml::Value>>;

/// The `[quick]` table: overrides applied by `--quick`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuickFile {
    /// Dotted path -> value, applied to every point under `--quick`.
    #[serde(default)]
    pub set: OverridesFile,
}

/// One `[[experiments]]` entry: cases, repetitions, fixed overrides and an optional sweep.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentFile {
    /// Name, e.g. "fig8"; results and plots are grouped by it.
    pub name: Spanned<String>,
    /// What the experiment shows, for the report.
    #[serde(default)]
    pub description: Option<String>,
    /// Figure or table of the paper this experiment rebuilds.
    #[serde(default)]
    pub source: Option<String>,
    /// Names of the cases measured at every point.
    pub cases: Vec<Spanned<String>>,
    /// Measurements of every point (default 1).
    #[serde(default = "one")]
    pub repetitions: Spanned<u32>,
    /// At most this many topologies are measured at once while a point of this experiment
    /// runs, whatever `--jobs` says: for experiments whose flows are fast enough that sharing
    /// the CPUs moves their results (`--check-concurrency` shows which). Recorded in each record.
    #[serde(default)]
    pub max_jobs: Option<Spanned<u32>>,
    /// Fixed overrides for this experiment.
    #[serde(default)]
    pub set: OverridesFile,
    /// `--quick` overrides of this experiment, replacing the file's `[quick]` for it (an
    /// experiment with a workload of its own may not take the file's quick settings).
    #[serde(default)]
    pub quick: Option<QuickFile>,
    /// The swept parameter, if any; without one the experiment is one point per case.
    #[serde(default)]
    pub sweep: Option<SweepFile>,
}

fn one() -> Spanned<u32> {
    Spanned::new(0..0, 1)
}

/// An experiment's `[experiments.sweep]`: one parameter (and its `also` paths) over a list of values.
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
    /// The values the parameter takes, one point each, written as in the file.
    pub values: Spanned<Vec<Spanned<toml::Value>>>,
    /// x coordinate of each value; default: derived (number, loss rate, ms, bytes, bit/s).
    #[serde(default)]
    pub axis: Option<Spanned<Vec<f64>>>,
}

/// The name of a case kind as written in a scenario file.
pub(crate) fn kind_name(kind: CaseKind) -> &'static str {
    match kind {
        CaseKind::Direct => "direct",
        CaseKind::Midway => "midway",
        CaseKind::Haproxy => "haproxy",
        CaseKind::Squid => "squid",
        CaseKind::Chain => "chain",
    }
}

impl fmt::Display for CaseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(kind_name(*self))
    }
}
