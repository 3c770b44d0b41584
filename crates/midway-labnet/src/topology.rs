//! Building and removing a topology: namespaces, veth pairs, addresses, routes, stack profiles and
//! one emulator per link; running code and processes inside its hosts.

use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use midway_linkemu::DirectionStats;
use midway_linkemu::{spawn_link, LinkHandle};
use midway_sys::command::Program;
use midway_sys::netlink::{AddressSpec, Netlink, Route, RouteProtocol, RouteScope, VethEnd};
use nix::sched::CloneFlags;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;

use crate::cleanup;
use crate::error::LabNetError;
use crate::spec::{self, Plan, StackProfile, TopologySpec, LINK_PEER_A, LINK_PEER_B};
use crate::stack;
use crate::sys;

/// Every host and link interface uses this MTU.
pub(crate) const MTU: u32 = 1500;

/// How a topology's links are made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LinkMode {
    /// Each link is a namespace of its own between the two hosts, where midway's emulator shapes
    /// the traffic per direction as the link's configuration says; offloads are off, so every
    /// packet is one frame. The lab's experiments.
    #[default]
    Emulated,
    /// Each link is one veth pair straight from host to host, offloads left on as a gateway's
    /// interfaces have them, and the links' direction configurations are not used: what lies
    /// between the hosts is only the kernel. The proxy benchmark, which measures the proxy.
    Plain,
}

/// A live topology. Dropping it tears everything down (emulator threads, processes left in its
/// hosts, namespaces and with them the veth pairs); [`Topology::teardown`] does the same and
/// reports errors.
pub struct Topology {
    id: u64,
    tag: String,
    mode: LinkMode,
    plan: Plan,
    link_seeds: Vec<u64>,
    emulators: Vec<Option<LinkHandle>>,
    /// One netlink socket per host, in plan order, opened in its namespace during the build and
    /// used for every request about that host; empty once torn down (a socket would keep its
    /// namespace, and the veths in it, alive).
    netlinks: Vec<Mutex<Netlink>>,
    torn_down: bool,
}

impl std::fmt::Debug for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("tag", &self.tag)
            .field(
                "hosts",
                &self.plan.hosts.iter().map(|h| &h.netns).collect::<Vec<_>>(),
            )
            .field("link_seeds", &self.link_seeds)
            .finish()
    }
}

/// Seed of link `index`'s emulator, derived from the topology's seed (the first output of a
/// SplitMix64 started `index` steps along from `seed`), so links of one topology get independent
/// loss patterns and a run is repeatable from one seed.
pub(crate) fn link_seed(seed: u64, index: usize) -> u64 {
    const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
    SplitMix64::seed_from_u64(seed.wrapping_add(GOLDEN_GAMMA.wrapping_mul(index as u64))).next_u64()
}

/// A tag for a new topology: this process's pid in base 36, then a per-process counter in base 36.
/// The concatenation can repeat another live process's tag (pid "ab" with counter "10" and pid
/// "ab1" with counter "0"), so tags whose pid file exists are skipped; `build` still refuses a tag
/// that another live process owns.
pub fn fresh_tag() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let pid = tag_prefix_of_process(std::process::id());
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{pid}{}", base36(n));
        let pid_file = std::path::Path::new(cleanup::PID_DIR).join(format!("{tag}.pid"));
        if !pid_file.exists() || tag.len() >= crate::spec::MAX_TAG {
            return tag;
        }
    }
}

/// The namespaces a topology is made of: one per host, and with emulated links one per link.
fn namespaces_of(plan: &Plan, mode: LinkMode) -> Vec<String> {
    let links = plan
        .links
        .iter()
        .filter(|_| mode == LinkMode::Emulated)
        .map(|l| l.netns.clone());
    plan.hosts
        .iter()
        .map(|h| h.netns.clone())
        .chain(links)
        .collect()
}

/// The sysctls of a host's namespace at build time: addresses usable at once (no duplicate
/// address detection) and no router solicitations, so the only frames on a link are the ones the
/// experiment sends; forwarding on a host with several links; then its stack profile's.
fn host_sysctls(
    forwards: bool,
    profile: StackProfile,
) -> Result<Vec<(String, String)>, LabNetError> {
    let mut values = Vec::new();
    for scope in ["all", "default"] {
        for key in [
            "accept_dad",
            "dad_transmits",
            "router_solicitations",
            "accept_ra",
        ] {
            values.push((format!("net.ipv6.conf.{scope}.{key}"), "0".to_owned()));
        }
    }
    if forwards {
        values.push(("net.ipv4.ip_forward".to_owned(), "1".to_owned()));
        values.push(("net.ipv6.conf.all.forwarding".to_owned(), "1".to_owned()));
    }
    values.extend(
        stack::sysctls(profile)?
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value)),
    );
    Ok(values)
}

/// Offloads off on both ends of every emulated link, every `ethtool` at once.
fn offloads_off_everywhere(plan: &Plan) -> Result<(), LabNetError> {
    let mut interfaces = Vec::new();
    for link in &plan.links {
        interfaces.push((link.netns.as_str(), LINK_PEER_A));
        interfaces.push((link.netns.as_str(), LINK_PEER_B));
        interfaces.push((
            plan.hosts[link.a.host].netns.as_str(),
            link.a.iface.as_str(),
        ));
        interfaces.push((
            plan.hosts[link.b.host].netns.as_str(),
            link.b.iface.as_str(),
        ));
    }
    std::thread::scope(|scope| {
        let runs: Vec<_> = interfaces
            .iter()
            .map(|&(netns, iface)| scope.spawn(move || sys::offloads_off(netns, iface)))
            .collect();
        let results: Vec<_> = runs
            .into_iter()
            .map(|run| {
                run.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect();
        results.into_iter().collect()
    })
}

/// A prefix length out of range (the plan's are fixed, /24 and /64: never).
fn prefix_error(error: ipnet::PrefixLenError) -> midway_sys::netlink::NetlinkError {
    midway_sys::netlink::NetlinkError::Decode {
        request: "addr add".to_owned(),
        message: error.to_string(),
    }
}

/// The start of every tag [`fresh_tag`] makes in process `pid`, so a test can find the namespaces
/// a process it ran left behind (`mw` + this prefix + more tag characters).
pub fn tag_prefix_of_process(pid: u32) -> String {
    base36(pid)
}

fn base36(mut n: u32) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut reversed = Vec::new();
    loop {
        reversed.push(char::from(digits[(n % 36) as usize]));
        n /= 36;
        if n == 0 {
            break;
        }
    }
    reversed.into_iter().rev().collect()
}

impl Topology {
    /// Validates `spec` (unknown host in a link, duplicate names, ...) before creating anything,
    /// then builds it. Leftovers of a dead run with the same tag are removed first; names of a
    /// live topology give `NameTaken`. `tag` (a-z, 0-9, at most 12 characters) goes into every name so topologies
    /// run side by side; `seed` is the source of every link's emulator seed.
    pub fn build(spec: &TopologySpec, tag: &str, seed: u64) -> Result<Topology, LabNetError> {
        Self::build_with(spec, tag, seed, LinkMode::Emulated)
    }

    /// [`Topology::build`] with the links made as `mode` says.
    pub fn build_with(
        spec: &TopologySpec,
        tag: &str,
        seed: u64,
        mode: LinkMode,
    ) -> Result<Topology, LabNetError> {
        let plan = spec::plan(spec, tag)?;
        cleanup::require_root()?;
        let names = namespaces_of(&plan, mode);
        let taken = |names: &[String]| names.iter().find(|n| sys::netns_path(n).exists()).cloned();
        if let Some(name) = taken(&names) {
            // A crashed run with the same tag (pids are reused) is cleaned up; a live one is not.
            if !cleanup::reclaim_abandoned_tag(tag)? {
                return Err(LabNetError::NameTaken(name));
            }
            if let Some(name) = taken(&names) {
                return Err(LabNetError::NameTaken(name));
            }
        }
        cleanup::claim_tag(tag)?;
        // Registered before anything exists, so a signal during the build removes partial state.
        let id = match cleanup::register_topology(tag, names) {
            Ok(id) => id,
            Err(e @ LabNetError::ShuttingDown) => {
                cleanup::release_tag(tag);
                return Err(e);
            }
            // The tag belongs to a live topology of this process, which keeps its pid file.
            Err(e) => return Err(e),
        };
        let mut topology = Topology {
            id,
            tag: tag.to_owned(),
            mode,
            link_seeds: (0..plan.links.len()).map(|i| link_seed(seed, i)).collect(),
            emulators: Vec::new(),
            netlinks: Vec::new(),
            plan,
            torn_down: false,
        };
        // On error, dropping `topology` removes whatever was made.
        topology.create(spec)?;
        Ok(topology)
    }

    fn create(&mut self, spec: &TopologySpec) -> Result<(), LabNetError> {
        let started = Instant::now();
        for name in namespaces_of(&self.plan, self.mode) {
            midway_sys::netns::create(&name).map_err(|e| {
                LabNetError::io("cannot create network namespace", sys::netns_path(&name), e)
            })?;
        }
        let plan = &self.plan;
        let emulated = self.mode == LinkMode::Emulated;
        let mut settings = Vec::new();
        for host in &plan.hosts {
            let profile = spec
                .hosts
                .iter()
                .find(|h| h.name == host.name)
                .map_or(StackProfile::default(), |h| h.stack);
            settings.push((
                host.netns.clone(),
                host_sysctls(host.links.len() > 1, profile)?,
            ));
        }
        for link in plan.links.iter().filter(|_| emulated) {
            // No IPv6 on the emulator's interfaces: nothing but forwarded frames must cross them.
            let values = ["all", "default"].map(|scope| {
                (
                    format!("net.ipv6.conf.{scope}.disable_ipv6"),
                    "1".to_owned(),
                )
            });
            settings.push((link.netns.clone(), values.to_vec()));
        }
        let mut sockets = sys::configure_namespaces(settings)?;
        let mut link_sockets = sockets.split_off(plan.hosts.len());
        let mut host_sockets = sockets;
        for link in &plan.links {
            let (a, b) = (&plan.hosts[link.a.host], &plan.hosts[link.b.host]);
            let end = |name: &str| VethEnd::named(name).with_mtu(MTU);
            if emulated {
                for (host_end, host, peer) in [(&link.a, a, LINK_PEER_A), (&link.b, b, LINK_PEER_B)]
                {
                    host_sockets[host_end.host]
                        .add_veth(
                            &end(&host_end.iface),
                            &end(peer).in_named_namespace(&link.netns),
                        )
                        .map_err(sys::netlink_error(&host.netns))?;
                }
            } else {
                host_sockets[link.a.host]
                    .add_veth(
                        &end(&link.a.iface),
                        &end(&link.b.iface).in_named_namespace(&b.netns),
                    )
                    .map_err(sys::netlink_error(&a.netns))?;
            }
        }
        if emulated {
            offloads_off_everywhere(plan)?;
        }
        for (link, socket) in plan.links.iter().zip(&mut link_sockets) {
            for peer in [LINK_PEER_A, LINK_PEER_B] {
                socket
                    .set_link_up(peer)
                    .map_err(sys::netlink_error(&link.netns))?;
            }
        }
        drop(link_sockets);
        for (h, (host, socket)) in plan.hosts.iter().zip(&mut host_sockets).enumerate() {
            let failed = sys::netlink_error(&host.netns);
            socket.set_link_up("lo").map_err(failed)?;
            for &l in &host.links {
                let link = &plan.links[l];
                let end = if link.a.host == h { &link.a } else { &link.b };
                let failed = sys::netlink_error(&host.netns);
                let added = (|| {
                    socket.set_link_up(&end.iface)?;
                    let device = socket.link_index(&end.iface)?;
                    socket.add_address(&AddressSpec {
                        address: IpNet::V4(Ipv4Net::new(end.v4, 24).map_err(prefix_error)?),
                        device,
                        nodad: false,
                    })?;
                    socket.add_address(&AddressSpec {
                        address: IpNet::V6(Ipv6Net::new(end.v6, 64).map_err(prefix_error)?),
                        device,
                        nodad: true,
                    })
                })();
                added.map_err(failed)?;
            }
        }
        self.netlinks = host_sockets.into_iter().map(Mutex::new).collect();
        for host in &spec.hosts {
            self.apply_routes(self.host_index(&host.name)?, host.stack)?;
        }
        let links_to_emulate = if emulated { self.plan.links.len() } else { 0 };
        for (l, (link, link_spec)) in self
            .plan
            .links
            .iter()
            .zip(&spec.links)
            .enumerate()
            .take(links_to_emulate)
        {
            let handle = spawn_link(
                &sys::netns_path(&link.netns),
                LINK_PEER_A,
                LINK_PEER_B,
                link_spec.a_to_b.clone(),
                link_spec.b_to_a.clone(),
                self.link_seeds[l],
            )
            .map_err(|source| LabNetError::LinkEmulator {
                a: link_spec.a.clone(),
                b: link_spec.b.clone(),
                source,
            })?;
            self.emulators.push(Some(handle));
        }
        tracing::debug!(tag = %self.tag, elapsed = ?started.elapsed(), "topology built");
        Ok(())
    }

    /// Applies a stack profile to a host: its namespace's TCP sysctls, and metrics on all its
    /// routes (connected ones included). Can be called again to switch profiles.
    pub fn apply_stack(&self, host: &str, profile: StackProfile) -> Result<(), LabNetError> {
        let h = self.host_index(host)?;
        let values = stack::sysctls(profile)?;
        sys::in_netns(&sys::netns_path(&self.plan.hosts[h].netns), move || {
            sys::write_sysctls(&values)
        })??;
        self.apply_routes(h, profile)
    }

    /// Host `h`'s routes with the metrics of `profile`: its connected prefixes replaced as the
    /// kernel adds them (protocol kernel; IPv4 scope link with the address as source, IPv6
    /// metric 256), then its routes through neighbours.
    fn apply_routes(&self, h: usize, profile: StackProfile) -> Result<(), LabNetError> {
        let plan = &self.plan;
        let hp = &plan.hosts[h];
        let Some(socket) = self.netlinks.get(h) else {
            return Err(LabNetError::Teardown(format!(
                "host {} has been torn down",
                hp.name
            )));
        };
        let mut socket = socket.lock().unwrap_or_else(PoisonError::into_inner);
        let end_host = hp.links.len() <= 1;
        let m4 = stack::route_metrics(profile, false, end_host);
        let m6 = stack::route_metrics(profile, true, end_host);
        let mut routes = Vec::new();
        for &l in &hp.links {
            let link = &plan.links[l];
            let end = if link.a.host == h { &link.a } else { &link.b };
            let device = Some(
                socket
                    .link_index(&end.iface)
                    .map_err(sys::netlink_error(&hp.netns))?,
            );
            routes.push(Route {
                device,
                protocol: RouteProtocol::Kernel,
                scope: Some(RouteScope::Link),
                preferred_source: Some(IpAddr::V4(end.v4)),
                metrics: m4.clone(),
                ..Route::to(IpNet::V4(link.v4_prefix))
            });
            routes.push(Route {
                device,
                protocol: RouteProtocol::Kernel,
                priority: Some(256),
                metrics: m6.clone(),
                ..Route::to(IpNet::V6(link.v6_prefix))
            });
        }
        for route in &hp.routes {
            let metrics = if route.prefix.addr().is_ipv4() {
                &m4
            } else {
                &m6
            };
            let device = socket
                .link_index(&route.dev)
                .map_err(sys::netlink_error(&hp.netns))?;
            routes.push(Route {
                gateway: Some(route.via),
                device: Some(device),
                metrics: metrics.clone(),
                ..Route::to(route.prefix)
            });
        }
        routes.iter().try_for_each(|route| {
            socket
                .replace_route(route)
                .map_err(sys::netlink_error(&hp.netns))
        })
    }

    fn host_index(&self, host: &str) -> Result<usize, LabNetError> {
        self.plan
            .host_index(host)
            .ok_or_else(|| LabNetError::NoSuchHost(host.to_owned()))
    }

    fn end(&self, host: &str, neighbour: &str) -> Result<&spec::HostEnd, LabNetError> {
        let h = self.host_index(host)?;
        let n = self.host_index(neighbour)?;
        self.plan
            .end(h, n)
            .ok_or_else(|| LabNetError::NotNeighbours {
                a: host.to_owned(),
                b: neighbour.to_owned(),
            })
    }

    /// The panicking accessors' one way to fail: the error's text as the panic message.
    fn or_panic<T>(result: Result<T, LabNetError>) -> T {
        result.unwrap_or_else(|e| panic!("{e}"))
    }

    /// The tag this topology was built with.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Names of the hosts, in spec order.
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.plan.hosts.iter().map(|h| h.name.as_str())
    }

    /// Emulator seed of each link, in spec order (record them to repeat a run).
    pub fn link_seeds(&self) -> &[u64] {
        &self.link_seeds
    }

    /// Namespace name of `host`. Panics if there is no such host (a programming error).
    pub fn netns_name(&self, host: &str) -> &str {
        &self.plan.hosts[Self::or_panic(self.host_index(host))].netns
    }

    /// `/run/netns/NAME` of `host`. Panics if there is no such host.
    pub fn netns_path(&self, host: &str) -> PathBuf {
        sys::netns_path(self.netns_name(host))
    }

    /// IPv4 address of `host` on its link toward `neighbour`.
    pub fn try_addr(&self, host: &str, neighbour: &str) -> Result<IpAddr, LabNetError> {
        Ok(IpAddr::V4(self.end(host, neighbour)?.v4))
    }

    /// IPv4 address of `host` on its link toward `neighbour`. Panics if they are not neighbours.
    pub fn addr(&self, host: &str, neighbour: &str) -> IpAddr {
        Self::or_panic(self.try_addr(host, neighbour))
    }

    /// IPv6 address of `host` on its link toward `neighbour`.
    pub fn try_addr6(&self, host: &str, neighbour: &str) -> Result<IpAddr, LabNetError> {
        Ok(IpAddr::V6(self.end(host, neighbour)?.v6))
    }

    /// IPv6 address of `host` on its link toward `neighbour`. Panics if they are not neighbours.
    pub fn addr6(&self, host: &str, neighbour: &str) -> IpAddr {
        Self::or_panic(self.try_addr6(host, neighbour))
    }

    /// Interface of `host` on its link toward `neighbour`. Panics if they are not neighbours.
    pub fn iface(&self, host: &str, neighbour: &str) -> &str {
        &Self::or_panic(self.end(host, neighbour)).iface
    }

    /// IPv4 prefix of the link between `a` and `b`. Panics if they are not neighbours.
    pub fn link_prefix(&self, a: &str, b: &str) -> IpNet {
        IpNet::V4(self.plan.links[self.link_index(a, b)].v4_prefix)
    }

    /// IPv6 prefix of the link between `a` and `b`. Panics if they are not neighbours.
    pub fn link_prefix6(&self, a: &str, b: &str) -> IpNet {
        IpNet::V6(self.plan.links[self.link_index(a, b)].v6_prefix)
    }

    /// Index of the link between hosts `a` and `b`. Panics if they are not neighbours.
    fn link_index(&self, a: &str, b: &str) -> usize {
        let (h, n) = (
            Self::or_panic(self.host_index(a)),
            Self::or_panic(self.host_index(b)),
        );
        let (l, _) = self.plan.link_between(h, n).unwrap_or_else(|| {
            panic!(
                "{}",
                LabNetError::NotNeighbours {
                    a: a.into(),
                    b: b.into()
                }
            )
        });
        l
    }

    /// Runs `f` on a fresh thread inside `host`'s namespace and returns its result.
    pub fn try_in_host<T: Send + 'static>(
        &self,
        host: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, LabNetError> {
        let path = sys::netns_path(&self.plan.hosts[self.host_index(host)?].netns);
        sys::in_netns(&path, f)
    }

    /// Runs `f` on a fresh thread that has entered `host`'s namespace; returns f's result. A panic
    /// in `f` continues in the caller (and the topology is still torn down when dropped). Panics
    /// if there is no such host or its namespace cannot be entered.
    pub fn in_host<T: Send + 'static>(
        &self,
        host: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        Self::or_panic(self.try_in_host(host, f))
    }

    /// `program` to be run to completion inside `host` ([`Program::run`], [`Program::output`]);
    /// add arguments and standard input as usual. Panics if there is no such host.
    pub fn program(&self, host: &str, program: &str) -> Program {
        Program::new(program).in_named_namespace(self.netns_name(host))
    }

    /// Spawns a long-running child inside `host`. `cmd` is a plain command: it is started from a thread
    /// that joined the host's namespace. It runs in its own process group, which is stopped (SIGTERM, SIGKILL after 2 s) when
    /// the returned handle is dropped, and killed by the signal cleanup.
    pub fn spawn(&self, host: &str, cmd: Command) -> Result<HostChild, LabNetError> {
        self.spawn_with(host, cmd, &SpawnOptions::default())
    }

    /// [`Topology::spawn`] with options, e.g. a hosts file the child sees as `/etc/hosts`.
    pub fn spawn_with(
        &self,
        host: &str,
        mut cmd: Command,
        options: &SpawnOptions,
    ) -> Result<HostChild, LabNetError> {
        let path = sys::netns_path(&self.plan.hosts[self.host_index(host)?].netns);
        let hosts_file = match &options.hosts_file {
            None => None,
            Some(file) => {
                let metadata = std::fs::metadata(file)
                    .map_err(|e| LabNetError::io("cannot use hosts file", file, e))?;
                if !metadata.is_file() {
                    return Err(LabNetError::io(
                        "hosts file is not a regular file",
                        file,
                        std::io::Error::from(std::io::ErrorKind::InvalidInput),
                    ));
                }
                Some(file.clone())
            }
        };
        cmd.process_group(0);
        let child = midway_sys::command::spawn_in_namespace_with(&path, cmd, move || {
            hosts_file.map_or(Ok(()), |file| mount_hosts_file(&file))
        })
        .map_err(LabNetError::Program)?;
        let pgid = child.id() as i32;
        cleanup::register_child(pgid);
        Ok(HostChild {
            child,
            pgid,
            host: host.to_owned(),
            stopped: false,
        })
    }

    /// Counters of every link's emulator: (name "a-b", a->b stats, b->a stats), in spec order.
    pub fn link_stats(&self) -> Vec<(String, DirectionStats, DirectionStats)> {
        self.plan
            .links
            .iter()
            .zip(&self.emulators)
            .filter_map(|(link, handle)| {
                let (ab, ba) = handle.as_ref()?.stats();
                let name = format!(
                    "{}-{}",
                    self.plan.hosts[link.a.host].name, self.plan.hosts[link.b.host].name
                );
                Some((name, ab, ba))
            })
            .collect()
    }

    /// Measures the receive window `host` really advertises to `neighbour` after 64 KB of data:
    /// a listener in `host`, a sender in `neighbour` reading tcpi_snd_wnd. For reports of legacy
    /// hosts, whose configured 8 KB buffer Linux does not advertise in full.
    pub fn advertised_window(&self, host: &str, neighbour: &str) -> Result<u32, LabNetError> {
        crate::probe::advertised_window(self, host, neighbour)
    }

    /// Removes everything and reports what could not be removed.
    pub fn teardown(mut self) -> Result<(), LabNetError> {
        self.teardown_inner()
    }

    fn teardown_inner(&mut self) -> Result<(), LabNetError> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        // Emulator threads hold sockets in the link namespaces: stop them first.
        for handle in self.emulators.iter_mut().filter_map(Option::take) {
            handle.stop();
        }
        // Sockets hold their namespaces (and the veths in them) alive: close them first.
        self.netlinks.clear();
        let names = namespaces_of(&self.plan, self.mode);
        let result = cleanup::remove_namespaces(&names, Duration::from_secs(2));
        cleanup::unregister_topology(self.id);
        cleanup::release_tag(&self.tag);
        result?;
        let left: Vec<&String> = names
            .iter()
            .filter(|n| sys::netns_path(n).exists())
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(LabNetError::Teardown(format!(
                "namespaces still present: {left:?}"
            )))
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        if let Err(e) = self.teardown_inner() {
            tracing::error!(tag = %self.tag, error = %e, "topology teardown failed");
        }
    }
}

/// Opt-in settings of [`Topology::spawn_with`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpawnOptions {
    /// A file the child (and its descendants) see as `/etc/hosts`: the child gets a mount
    /// namespace of its own with private propagation, and the file is bind-mounted over
    /// `/etc/hosts` there, so the host system and other children are not affected. Make it with
    /// [`crate::hosts_file_text`]. The file must exist when spawning.
    pub hosts_file: Option<PathBuf>,
}

/// Gives the calling thread (the one about to start a child in a host) a mount namespace of its
/// own in which `file` is bind-mounted over `/etc/hosts`; the child inherits it. Private
/// propagation first, or the bind mount would appear in the process's mount namespace too (/ is
/// usually a shared mount). `unshare(CLONE_NEWNS)` moves this thread only (it gets a copy of the
/// file-system attributes it shared with the process's other threads).
fn mount_hosts_file(file: &std::path::Path) -> std::io::Result<()> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(CloneFlags::CLONE_NEWNS)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    mount(
        Some(file),
        "/etc/hosts",
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )?;
    Ok(())
}

/// A child process running inside a host; stopped when dropped.
#[derive(Debug)]
pub struct HostChild {
    child: Child,
    pgid: i32,
    host: String,
    /// Set by the first stop, so neither a second one nor `drop` signals a reused pid.
    stopped: bool,
}

impl HostChild {
    /// Process id (also the process group id).
    pub fn id(&self) -> u32 {
        self.pgid as u32
    }

    /// The host it runs in.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The underlying child, e.g. to take its stdout.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Whether it has exited, without waiting.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child_mut().try_wait()
    }

    /// Waits up to `timeout` for it to exit on its own.
    pub fn wait_timeout(&mut self, timeout: Duration) -> std::io::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGTERM to its process group, SIGKILL after 2 s; returns how it ended.
    pub fn stop(mut self) -> std::io::Result<ExitStatus> {
        self.stop_in_place()
    }

    /// [`HostChild::stop`] for a holder that keeps the handle (a launcher's process); a second
    /// call fails, and dropping the handle afterwards does nothing more.
    pub fn stop_in_place(&mut self) -> std::io::Result<ExitStatus> {
        if self.stopped {
            return Err(std::io::Error::other("the child was already stopped"));
        }
        self.stopped = true;
        let child = &mut self.child;
        let result = (|| {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Some(status) = child.try_wait()? {
                    return Ok(status);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
            child.wait()
        })();
        // Others in the group may outlive the leader's SIGTERM; make sure none stays.
        let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGKILL);
        cleanup::unregister_child(self.pgid);
        result
    }
}

impl Drop for HostChild {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.stop_in_place();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{base36, link_seed};

    /// The splitmix64 written out by hand that link seeds came from before (pinned so a seed
    /// recorded by an earlier run still gives the same links).
    fn hand_written_link_seed(seed: u64, index: usize) -> u64 {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(index as u64 + 1));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[test]
    fn link_seeds_are_the_ones_earlier_runs_recorded() {
        for seed in [0, 1, 42, 0xDEAD_BEEF, u64::MAX] {
            for index in [0, 1, 2, 7, 1000] {
                assert_eq!(link_seed(seed, index), hand_written_link_seed(seed, index));
            }
        }
        assert_eq!(link_seed(0, 0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(link_seed(42, 1), hand_written_link_seed(42, 1));
    }

    #[test]
    fn base36_writes_the_most_significant_digit_first() {
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
        assert_eq!(base36(1295), "zz");
        assert_eq!(base36(u32::MAX), "1z141z3");
    }
}
