//! nftables TPROXY rules and the policy routing transparent listeners need.
//!
//! For each table named by a transparent listener midway writes one `inet` table with a
//! `prerouting` chain at mangle priority:
//!
//! - `tcp flags & (syn | ack) != syn socket transparent 1 meta mark set M accept`: packets of
//!   sockets midway already owns (the accepted side of an intercepted connection, and with
//!   spoofing the return traffic of the remote segment, whose destination is the client's
//!   address) are marked for local delivery. No port or interface filter: spoofed return
//!   traffic arrives from the server side. A new connection's SYN is left to the listener rules:
//!   when a client reuses the 4-tuple of a connection midway closed first, the socket lookup
//!   finds midway's TIME_WAIT socket, which is transparent too; delivered to it, the SYN finds
//!   no listener on the server's address and is dropped, and the client waits a second to send
//!   it again (15 % of the SYNs in the connection-rate benchmark, a third of the forward mode's
//!   rate). The `tproxy` statement instead hands such a SYN to the listener.
//! - per listener: `[iifname {..}] meta l4proto tcp [tcp dport {..}] tproxy ip|ip6 to ADDR:PORT
//!   meta mark set M accept`: new connections are diverted to the listener.
//!
//! Routing the operator provides: clients must reach the servers *through* this host (it is
//! their gateway, or a policy route sends their traffic here), and with `spoof_client_address`
//! the servers' replies to client addresses must come back through this host too (true when it
//! is the only path between the two networks; otherwise route the client prefixes back to it on
//! the server side). IP forwarding is not needed for intercepted ports, only for everything else.
//!
//! The mark `M` leads to local delivery through `ip rule add fwmark M lookup T` and
//! `ip route add local 0.0.0.0/0 dev lo table T` (and the IPv6 twins). midway removes exactly what
//! it added: the table by name, and the rules / routes whose `add` succeeded.
//!
//! After a crash (`kill -9`, a panic with abort, power loss of a container) nothing ran the
//! removal, so every step that installs something is first written to an install record
//! (`midway-installed.toml` in the spool directory, with the installer's pid and process start
//! time). The next start finds the record of a process that is gone, removes exactly what it
//! lists, and only then installs its own: no second fwmark rule per crash, no routes mistaken
//! for someone else's, and never anything midway did not add. A record whose process still
//! runs belongs to another live midway sharing the spool directory: a start that would install
//! interception refuses, naming it. While midway is dead, intercepted ports fail open: with no
//! TPROXY listener, nothing diverts new connections, which are routed to the server unsplit.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use midway_tcp::{InstalledKnob, RouteKnobs};
use serde::{Deserialize, Serialize};

use crate::config::{Intercept, NftConfig, RuntimeConfig};

/// One `ip` command pair: the arguments after `ip`, for add and for delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteCommand {
    pub add: Vec<String>,
    pub delete: Vec<String>,
}

impl RouteCommand {
    fn new(args_add: &[&str], args_del: &[&str]) -> RouteCommand {
        RouteCommand {
            add: args_add.iter().map(|s| s.to_string()).collect(),
            delete: args_del.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// What transparent interception installs: nft scripts per table and policy routing commands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct InterceptPlan {
    /// (table name, `nft -f` script creating it from scratch, managed?)
    pub tables: Vec<(String, String, bool)>,
    /// Policy routing commands, per (mark, route table) and address family.
    pub routes: Vec<(RouteCommand, bool)>,
}

impl InterceptPlan {
    /// Whether midway installs any of it itself (`nftables.manage`).
    fn manages_anything(&self) -> bool {
        self.tables.iter().any(|(_, _, manage)| *manage) || self.routes.iter().any(|(_, m)| *m)
    }
}

fn tproxy_target(listen: SocketAddr) -> String {
    match listen {
        SocketAddr::V4(a) if a.ip().is_unspecified() => format!("tproxy ip to :{}", a.port()),
        SocketAddr::V4(a) => format!("tproxy ip to {}:{}", a.ip(), a.port()),
        SocketAddr::V6(a) if a.ip().is_unspecified() => format!("tproxy ip6 to :{}", a.port()),
        SocketAddr::V6(a) => format!("tproxy ip6 to [{}]:{}", a.ip(), a.port()),
    }
}

fn set_of<T: ToString>(items: &[T], quote: bool) -> String {
    let parts: Vec<String> = items
        .iter()
        .map(|i| {
            if quote {
                format!("\"{}\"", i.to_string())
            } else {
                i.to_string()
            }
        })
        .collect();
    format!("{{ {} }}", parts.join(", "))
}

/// The set that, while it holds `tcp`, makes new connections bypass midway (overload).
pub(crate) const OVERLOAD_SET: &str = "overload";
/// A bypassed flow is forgotten after this long without a packet.
const BYPASS_TIMEOUT: &str = "2h";
/// Bypassed flows remembered at once per family; when full, new connections are split again.
const BYPASS_SET_SIZE: u32 = 65536;
const BYPASSED_KEY_V4: &str = "ip saddr . tcp sport . ip daddr . tcp dport";
const BYPASSED_KEY_V6: &str = "ip6 saddr . tcp sport . ip6 daddr . tcp dport";
const BYPASSED_FLOW_V4: &str = "@bypassed4 { ip saddr . tcp sport . ip daddr . tcp dport }";
const BYPASSED_FLOW_V6: &str = "@bypassed6 { ip6 saddr . tcp sport . ip6 daddr . tcp dport }";

/// The per-listener rules of one table, by chain.
#[derive(Debug, Default)]
struct ListenerRules {
    /// raw prerouting: no connection tracking for what the listener intercepts.
    notrack: Vec<String>,
    /// mangle prerouting, first: while overloaded, a new connection is remembered as bypassed
    /// and routed unsplit.
    bypass: Vec<String>,
    /// mangle prerouting, then: divert to the listener.
    divert: Vec<String>,
}

/// Builds the plan for every transparent listener (managed and not).
pub(crate) fn plan(config: &RuntimeConfig) -> InterceptPlan {
    // table -> (managed, marks, rules)
    let mut tables: BTreeMap<&str, (bool, BTreeSet<u32>, ListenerRules)> = BTreeMap::new();
    let mut routes: BTreeMap<(u32, u32), (bool, bool, bool)> = BTreeMap::new();
    for listener in &config.listeners {
        let Intercept::Transparent { nftables, .. } = &listener.intercept else {
            continue;
        };
        let NftConfig {
            manage,
            table,
            interfaces,
            ports,
            mark,
            route_table,
        } = nftables;
        let entry = tables
            .entry(table.as_str())
            .or_insert_with(|| (*manage, BTreeSet::new(), ListenerRules::default()));
        entry.1.insert(*mark);
        // What the listener intercepts: its interfaces and destination ports.
        let mut matches = String::new();
        if !interfaces.is_empty() {
            let _ = write!(matches, "iifname {} ", set_of(interfaces, true));
        }
        matches.push_str("meta l4proto tcp ");
        if !ports.is_empty() {
            let _ = write!(matches, "tcp dport {} ", set_of(ports, false));
        }
        let comment = format!("comment \"listener {}\"", listener.name.replace('"', "'"));
        let flow = if listener.listen.is_ipv4() {
            BYPASSED_FLOW_V4
        } else {
            BYPASSED_FLOW_V6
        };
        entry.2.notrack.push(format!("{matches}notrack {comment}"));
        entry.2.bypass.push(format!(
            "{matches}tcp flags & (syn | ack) == syn meta l4proto @{OVERLOAD_SET} add {flow} accept {comment}"
        ));
        entry.2.divert.push(format!(
            "{matches}{} meta mark set {mark:#x} accept {comment}",
            tproxy_target(listener.listen),
        ));
        // Policy routing only for the address families that have a listener: an IPv4-only
        // host (IPv6 disabled) must not need IPv6 routes.
        let (managed, v4, v6) = routes
            .entry((*mark, *route_table))
            .or_insert((false, false, false));
        *managed |= *manage;
        *v4 |= listener.listen.is_ipv4();
        *v6 |= listener.listen.is_ipv6();
    }

    let tables = tables
        .into_iter()
        .map(|(name, (manage, marks, rules))| {
            let mut script = String::new();
            // Declaring then deleting makes the script replace a leftover table from a crash.
            let _ = writeln!(script, "table inet {name}");
            let _ = writeln!(script, "delete table inet {name}");
            let _ = writeln!(script, "table inet {name} {{");
            let _ = writeln!(script, "  set {OVERLOAD_SET} {{ type inet_proto; }}");
            for (set, key) in [
                ("bypassed4", "ipv4_addr . inet_service . ipv4_addr . inet_service"),
                ("bypassed6", "ipv6_addr . inet_service . ipv6_addr . inet_service"),
            ] {
                let _ = writeln!(
                    script,
                    "  set {set} {{ type {key}; flags dynamic, timeout; timeout {BYPASS_TIMEOUT}; size {BYPASS_SET_SIZE}; }}"
                );
            }
            // Before connection tracking (priority raw): diverted flows end in midway's
            // sockets, so tracking them would only fill the conntrack table.
            let _ = writeln!(script, "  chain raw_prerouting {{");
            let _ = writeln!(
                script,
                "    type filter hook prerouting priority raw; policy accept;"
            );
            let _ = writeln!(
                script,
                "    meta l4proto tcp socket transparent 1 notrack"
            );
            for rule in &rules.notrack {
                let _ = writeln!(script, "    {rule}");
            }
            let _ = writeln!(script, "  }}");
            let _ = writeln!(script, "  chain raw_output {{");
            let _ = writeln!(
                script,
                "    type filter hook output priority raw; policy accept;"
            );
            let _ = writeln!(
                script,
                "    meta l4proto tcp socket transparent 1 notrack"
            );
            let _ = writeln!(script, "  }}");
            let _ = writeln!(script, "  chain prerouting {{");
            let _ = writeln!(
                script,
                "    type filter hook prerouting priority mangle; policy accept;"
            );
            for mark in marks {
                let _ = writeln!(
                    script,
                    "    meta l4proto tcp tcp flags & (syn | ack) != syn socket transparent 1 meta mark set {mark:#x} accept"
                );
            }
            // Flows that started while midway was overloaded stay unsplit to their end.
            let _ = writeln!(
                script,
                "    {} @bypassed4 update {BYPASSED_FLOW_V4} accept",
                BYPASSED_KEY_V4
            );
            let _ = writeln!(
                script,
                "    {} @bypassed6 update {BYPASSED_FLOW_V6} accept",
                BYPASSED_KEY_V6
            );
            for rule in rules.bypass.iter().chain(&rules.divert) {
                let _ = writeln!(script, "    {rule}");
            }
            let _ = writeln!(script, "  }}");
            let _ = writeln!(script, "}}");
            (name.to_string(), script, manage)
        })
        .collect();

    let mut route_cmds = Vec::new();
    for ((mark, table), (manage, v4, v6)) in routes {
        let mark = mark.to_string();
        let table = table.to_string();
        let families = [(v4, "-4", "0.0.0.0/0"), (v6, "-6", "::/0")];
        for (_, fam, default) in families.into_iter().filter(|f| f.0) {
            route_cmds.push((
                RouteCommand::new(
                    &[fam, "rule", "add", "fwmark", &mark, "lookup", &table],
                    &[fam, "rule", "del", "fwmark", &mark, "lookup", &table],
                ),
                manage,
            ));
            route_cmds.push((
                RouteCommand::new(
                    &[
                        fam, "route", "add", "local", default, "dev", "lo", "table", &table,
                    ],
                    &[
                        fam, "route", "del", "local", default, "dev", "lo", "table", &table,
                    ],
                ),
                manage,
            ));
        }
    }
    InterceptPlan {
        tables,
        routes: route_cmds,
    }
}

/// Text for `midway proxy --print-nft`: every table as an `nft -f` script, then the policy routing
/// as comments. Empty when no listener is transparent.
pub fn nft_ruleset(config: &RuntimeConfig) -> String {
    let plan = plan(config);
    let mut out = String::new();
    for (name, script, manage) in &plan.tables {
        let _ = writeln!(
            out,
            "# table {name}: {}",
            if *manage {
                "installed by midway at start, removed at stop"
            } else {
                "manage = false: install it yourself with `nft -f`"
            }
        );
        out.push_str(script);
    }
    if !plan.routes.is_empty() {
        out.push_str("# policy routing for marked packets (local delivery):\n");
        for (cmd, _) in &plan.routes {
            let _ = writeln!(out, "# ip {}", cmd.add.join(" "));
        }
    }
    out
}

/// Why installing or removing interception failed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("cannot run `{program}` (is it installed and are we root / CAP_NET_ADMIN?)")]
    Spawn {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed: {stderr}")]
    Failed { command: String, stderr: String },
    #[error("install record {path}: {message}")]
    Record { path: PathBuf, message: String },
    #[error("interception is installed by another running midway (pid {pid}, record {path}); give each midway its own spool directory")]
    OwnedByRunning { pid: u32, path: PathBuf },
}

/// File name of the install record, in the spool directory.
pub(crate) const INSTALL_RECORD: &str = "midway-installed.toml";

/// What one midway process installed, written as it goes so that a later start can remove it
/// after a crash. Routes are kept as their delete commands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct InstallRecord {
    pid: u32,
    /// The process's start time (clock ticks after boot), so a reused pid is not taken for it.
    start_time: u64,
    tables: Vec<String>,
    route_deletes: Vec<Vec<String>>,
    /// Route-knob tables and rules (`midway_tcp::RouteKnobs`), recorded as soon as installed.
    #[serde(default)]
    route_knobs: Vec<InstalledKnob>,
}

impl InstallRecord {
    fn for_this_process() -> InstallRecord {
        let pid = std::process::id();
        InstallRecord {
            pid,
            start_time: midway_sys::procfs::process_start_time(pid as i32).unwrap_or(0),
            ..InstallRecord::default()
        }
    }

    /// Whether the process that wrote the record still runs.
    fn owner_alive(&self) -> bool {
        midway_sys::procfs::process_start_time(self.pid as i32)
            .is_some_and(|start| start == self.start_time)
    }

    fn read(path: &Path) -> Result<Option<InstallRecord>, NftError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(record_error(path, e)),
        };
        toml::from_str(&text)
            .map(Some)
            .map_err(|e| record_error(path, e))
    }

    /// Replaces the file at once (write to a temporary name, rename), so a crash leaves the old
    /// record or the new one, never half of one.
    fn write(&self, path: &Path) -> Result<(), NftError> {
        let text = toml::to_string(self).map_err(|e| record_error(path, e))?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| record_error(path, e))?;
        }
        let temporary = path.with_extension("toml.new");
        std::fs::write(&temporary, text)
            .and_then(|()| std::fs::rename(&temporary, path))
            .map_err(|e| record_error(path, e))
    }
}

fn record_error(path: &Path, err: impl std::fmt::Display) -> NftError {
    NftError::Record {
        path: path.to_path_buf(),
        message: err.to_string(),
    }
}

/// Removes what the record at `path` lists if the midway that wrote it is gone. Returns whether
/// a live midway owns it (then nothing was touched).
fn recover(path: &Path) -> Result<bool, NftError> {
    let Some(record) = InstallRecord::read(path)? else {
        return Ok(false);
    };
    // Our own pid counts as alive: another proxy in this process (tests run several) owns it.
    if record.owner_alive() {
        return Ok(true);
    }
    let mut left = Installed {
        route_knobs: Vec::new(),
        blocked_by: None,
        tables: record.tables.clone(),
        routes: record
            .route_deletes
            .iter()
            .map(|delete| RouteCommand {
                add: Vec::new(),
                delete: delete.clone(),
            })
            .collect(),
        record: None,
    };
    tracing::warn!(
        pid = record.pid,
        tables = ?record.tables,
        rules_and_routes = record.route_deletes.len(),
        route_knob_tables = record.route_knobs.len(),
        "removing the interception a midway that did not stop cleanly left behind"
    );
    left.remove_quietly();
    if let Err(err) = RouteKnobs::remove_leftovers(&record.route_knobs) {
        tracing::warn!(error = %err, "could not remove all route-knob tables and rules left behind");
    }
    std::fs::remove_file(path).map_err(|e| record_error(path, e))?;
    Ok(false)
}

fn run(program: &'static str, args: &[String], stdin: Option<&str>) -> Result<(), NftError> {
    use std::io::Write as _;
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| NftError::Spawn { program, source })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|source| NftError::Spawn { program, source })?;
    }
    let output = child
        .wait_with_output()
        .map_err(|source| NftError::Spawn { program, source })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(NftError::Failed {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// Makes new connections of `tables` bypass midway (`bypass`) or be diverted again, through
/// the overload set the rules read.
pub(crate) fn set_overload_bypass(tables: &[String], bypass: bool) -> Result<(), NftError> {
    let verb = if bypass { "add" } else { "delete" };
    for table in tables {
        let args = [verb, "element", "inet", table, OVERLOAD_SET, "{ tcp }"].map(String::from);
        run("nft", &args, None)?;
    }
    Ok(())
}

/// What midway installed and must remove at stop.
#[derive(Debug, Default)]
pub(crate) struct Installed {
    tables: Vec<String>,
    routes: Vec<RouteCommand>,
    /// Route-knob tables and rules, recorded here; `RouteKnobs` installs and removes them.
    route_knobs: Vec<InstalledKnob>,
    /// A live midway (this pid) owns the record in this directory: nothing may be installed.
    blocked_by: Option<u32>,
    /// Where the install record is kept (None: nothing recorded, e.g. a crash's leftovers
    /// being removed).
    record: Option<(PathBuf, InstallRecord)>,
}

impl Installed {
    /// The start of a proxy's interception, before anything is installed: removes what a
    /// crashed midway recorded in `record_dir`, and keeps the record path for every later step.
    ///
    /// With `take_over_from` (a binary upgrade, the pid of the running midway that handed its
    /// listeners over), what that midway's record lists becomes this process's instead; the
    /// first [`Installed::update`] then replaces each table in one `nft` transaction and keeps
    /// the routes already there, so interception never pauses.
    pub(crate) fn begin(
        record_dir: &Path,
        take_over_from: Option<u32>,
    ) -> Result<Installed, NftError> {
        let record_path = record_dir.join(INSTALL_RECORD);
        if let Some(pid) = take_over_from {
            return Installed::adopt(&record_path, pid);
        }
        let blocked_by = if recover(&record_path)? {
            Some(InstallRecord::read(&record_path)?.map_or(0, |r| r.pid))
        } else {
            None
        };
        Ok(Installed {
            tables: Vec::new(),
            routes: Vec::new(),
            route_knobs: Vec::new(),
            blocked_by,
            record: Some((record_path, InstallRecord::for_this_process())),
        })
    }

    /// Records the route-knob tables and rules just installed, before anything else happens.
    pub(crate) fn record_route_knobs(&mut self, knobs: Vec<InstalledKnob>) -> Result<(), NftError> {
        self.check_not_blocked()?;
        self.route_knobs = knobs;
        self.write_record()
    }

    fn check_not_blocked(&self) -> Result<(), NftError> {
        match (self.blocked_by, &self.record) {
            (Some(pid), Some((path, _))) => Err(NftError::OwnedByRunning {
                pid,
                path: path.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// What the running midway `pid` recorded in `record_path`, now owned (and recorded) by
    /// this process. No record: that midway had installed nothing.
    fn adopt(record_path: &Path, pid: u32) -> Result<Installed, NftError> {
        let mut installed = Installed {
            tables: Vec::new(),
            routes: Vec::new(),
            route_knobs: Vec::new(),
            blocked_by: None,
            record: Some((record_path.to_path_buf(), InstallRecord::for_this_process())),
        };
        if let Some(record) = InstallRecord::read(record_path)? {
            if record.pid != pid {
                return Err(record_error(
                    record_path,
                    format!(
                        "written by pid {}, not by the midway handing over (pid {pid})",
                        record.pid
                    ),
                ));
            }
            installed.tables = record.tables;
            installed.routes = record
                .route_deletes
                .into_iter()
                .map(|delete| RouteCommand {
                    add: Vec::new(),
                    delete,
                })
                .collect();
        }
        Ok(installed)
    }

    /// Makes what is installed match `plan` (a start, a reload, a take-over): every managed
    /// table is (re)written in one transaction each, tables and routes the plan no longer has
    /// are removed, missing routes are added. The record follows each step.
    pub(crate) fn update(&mut self, plan: &InterceptPlan) -> Result<(), NftError> {
        if plan.manages_anything() {
            self.check_not_blocked()?;
        }
        let planned_tables: Vec<&String> = plan
            .tables
            .iter()
            .filter(|(_, _, manage)| *manage)
            .map(|(name, _, _)| name)
            .collect();
        for (name, script, manage) in &plan.tables {
            if !manage {
                continue;
            }
            run("nft", &["-f".to_string(), "-".to_string()], Some(script))?;
            if !self.tables.contains(name) {
                self.tables.push(name.clone());
                self.write_record()?;
            }
        }
        let stale: Vec<String> = self
            .tables
            .iter()
            .filter(|name| !planned_tables.contains(name))
            .cloned()
            .collect();
        for table in stale {
            let args = ["delete", "table", "inet", table.as_str()].map(String::from);
            run("nft", &args, None)?;
            self.tables.retain(|t| *t != table);
            self.write_record()?;
        }

        let planned_routes: Vec<&RouteCommand> = plan
            .routes
            .iter()
            .filter(|(_, manage)| *manage)
            .map(|(cmd, _)| cmd)
            .collect();
        for cmd in &planned_routes {
            if self.routes.iter().any(|owned| owned.delete == cmd.delete) {
                continue;
            }
            match run("ip", &cmd.add, None) {
                Ok(()) => {
                    self.routes.push((*cmd).clone());
                    self.write_record()?;
                }
                // Someone else's identical rule or route: use it, and leave it in place at stop.
                Err(NftError::Failed { stderr, .. }) if stderr.contains("File exists") => {
                    tracing::info!(command = %cmd.add.join(" "), "policy routing already present; not owned by midway");
                }
                Err(err) => return Err(err),
            }
        }
        let stale: Vec<RouteCommand> = self
            .routes
            .iter()
            .filter(|owned| !planned_routes.iter().any(|cmd| cmd.delete == owned.delete))
            .cloned()
            .collect();
        for cmd in stale {
            run("ip", &cmd.delete, None)?;
            self.routes.retain(|owned| owned.delete != cmd.delete);
            self.write_record()?;
        }
        // A take-over that changed nothing still has to put this process's pid in the record.
        if self.is_empty() && self.route_knobs.is_empty() {
            if let Some((path, _)) = &self.record {
                match std::fs::remove_file(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(record_error(path, e)),
                }
            }
            Ok(())
        } else {
            self.write_record()
        }
    }

    /// Forgets what is installed without removing it: another midway owns it now (this one
    /// handed over), or still does (a take-over that failed).
    pub(crate) fn disown(&mut self) {
        self.tables.clear();
        self.routes.clear();
        self.route_knobs.clear();
        self.record = None;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.tables.is_empty() && self.routes.is_empty()
    }

    /// The nftables tables midway installed.
    pub(crate) fn tables(&self) -> &[String] {
        &self.tables
    }

    /// Writes what is installed so far to the install record, before anything else happens.
    fn write_record(&mut self) -> Result<(), NftError> {
        let Some((path, record)) = &mut self.record else {
            return Ok(());
        };
        record.tables = self.tables.clone();
        record.route_deletes = self.routes.iter().map(|r| r.delete.clone()).collect();
        record.route_knobs = self.route_knobs.clone();
        record.write(path)
    }

    /// Removes what was installed, then the install record; failures are logged (this runs
    /// during shutdown).
    pub(crate) fn remove(&mut self) {
        self.remove_with(|what, err| tracing::warn!(error = %err, "could not remove {what}"));
        if let Some((path, _)) = self.record.take() {
            if let Err(err) = std::fs::remove_file(&path) {
                tracing::warn!(error = %err, path = %path.display(), "could not remove the install record");
            }
        }
    }

    /// Removes a crash's leftovers: some may already be gone (removed by hand, or the crash came
    /// between an add and its record), which is not worth a warning each.
    fn remove_quietly(&mut self) {
        self.remove_with(|what, err| tracing::debug!(error = %err, "{what} already gone"));
    }

    fn remove_with(&mut self, on_error: impl Fn(&str, NftError)) {
        for cmd in self.routes.drain(..).rev() {
            if let Err(err) = run("ip", &cmd.delete, None) {
                on_error("policy routing", err);
            }
        }
        for table in self.tables.drain(..).rev() {
            let args = ["delete", "table", "inet", table.as_str()].map(String::from);
            if let Err(err) = run("nft", &args, None) {
                on_error("nftables table", err);
            }
        }
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if !self.is_empty() {
            self.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse_config;

    use super::*;

    const TWO: &str = r#"
[proxy]
allowed_clients = ["10.1.0.0/24"]
[[listeners]]
name = "tp4"
mode = "transparent"
listen = "0.0.0.0:7000"
[listeners.nftables]
interfaces = ["veth-c"]
ports = [80, 443]
[[listeners]]
name = "tp6"
mode = "transparent"
listen = "[::1]:7001"
"#;

    #[test]
    fn ruleset_has_both_families_one_table() {
        let config = parse_config(TWO, "<test>").unwrap();
        let plan = plan(&config);
        assert_eq!(plan.tables.len(), 1);
        let script = &plan.tables[0].1;
        assert!(script.contains(
            "iifname { \"veth-c\" } meta l4proto tcp tcp dport { 80, 443 } tproxy ip to :7000 meta mark set 0x1 accept"
        ), "{script}");
        assert!(
            script.contains("meta l4proto tcp tproxy ip6 to [::1]:7001 meta mark set 0x1"),
            "{script}"
        );
        // Marked for local delivery once; exempt from connection tracking both ways.
        assert_eq!(
            script
                .matches("socket transparent 1 meta mark set 0x1")
                .count(),
            1
        );
        assert_eq!(script.matches("socket transparent 1 notrack").count(), 2);
        assert!(
            script
                .contains("iifname { \"veth-c\" } meta l4proto tcp tcp dport { 80, 443 } notrack"),
            "{script}"
        );
        // While overloaded, new connections are remembered and routed unsplit, before the
        // divert rules.
        let bypass = script
            .find("meta l4proto @overload add @bypassed4")
            .unwrap();
        let divert = script.find("tproxy ip to :7000").unwrap();
        assert!(bypass < divert, "{script}");
        assert!(
            script.contains("meta l4proto @overload add @bypassed6"),
            "{script}"
        );
        // New connections' SYNs skip the shortcut (a TIME_WAIT socket would swallow them).
        assert!(
            script.contains("tcp flags & (syn | ack) != syn socket transparent 1"),
            "{script}"
        );
        // IPv4 and IPv6: a rule and a route each.
        assert_eq!(plan.routes.len(), 4);
        assert_eq!(
            plan.routes[0].0.add.join(" "),
            "-4 rule add fwmark 1 lookup 100"
        );
        assert_eq!(
            plan.routes[1].0.delete.join(" "),
            "-4 route del local 0.0.0.0/0 dev lo table 100"
        );
        let printed = nft_ruleset(&config);
        assert!(printed.contains("# ip -6 route add local ::/0 dev lo table 100"));
    }

    #[test]
    fn no_transparent_listener_no_rules() {
        let text = r#"
[proxy]
allowed_clients = ["10.1.0.0/24"]
[[listeners]]
name = "f"
mode = "forward"
listen = "127.0.0.1:0"
target = "127.0.0.1:1"
"#;
        let config = parse_config(text, "<test>").unwrap();
        assert_eq!(plan(&config), InterceptPlan::default());
        assert_eq!(nft_ruleset(&config), "");
    }
}
