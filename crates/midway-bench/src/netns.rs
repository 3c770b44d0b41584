//! The benchmark's network: client, router and server namespaces joined by plain veth pairs.
//!
//! The hosts are a midway-labnet topology built with [`LinkMode::Plain`]: no emulated link, since
//! the benchmark measures what the proxy itself costs, so the only thing between the hosts is the
//! kernel's veth, with its offloads left on as an operator's gateway would have them. Naming,
//! addressing, the children's process groups and the cleanup on signals are the lab's.
//!
//! The tunnel benchmark ([`BenchNet::build_tunnel`]) adds a fourth host, the gateway, between the
//! router (there the edge midway) and the server, so that each midway has a namespace of its own
//! and the peer segment crosses a veth of its own.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread::JoinHandle;

use anyhow::{bail, Context};
use midway_labnet::{
    DirectionConfig, HostChild, HostSpec, LinkMode, LinkSpec, StackProfile, Topology, TopologySpec,
};
use midway_sys::command::Program;
use midway_sys::netlink::{
    AddressSpec, Family, Metric, MetricValue, Netlink, RouteMetric, TABLE_MAIN,
};
use midway_sys::sysctl;

/// Which of the hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Host {
    Client,
    /// The gateway of [`BenchNet::build`]; the edge midway's host in [`BenchNet::build_tunnel`].
    Router,
    Server,
    /// Only in [`BenchNet::build_tunnel`]: the gateway midway's host, between router and server.
    Gateway,
}

impl Host {
    /// The host's name in the lab topology.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Host::Client => "client",
            Host::Router => "router",
            Host::Server => "server",
            Host::Gateway => "gateway",
        }
    }
}

/// The addresses midway-labnet gives the topology below (link 1 client-router is 10.0.1.0/24,
/// link 2 router-server 10.0.2.0/24, end a .1 and end b .2). Private to the namespaces; nothing
/// leaves the machine. [`BenchNet::build`] checks them against the built topology.
pub(crate) const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 1);
pub(crate) const ROUTER_CLIENT_SIDE: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 2);
pub(crate) const ROUTER_SERVER_SIDE: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 1);
pub(crate) const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
pub(crate) const CLIENT_PREFIX: &str = "10.0.1.0/24";
/// In [`BenchNet::build_tunnel`], link 2 joins gateway and server (so the server keeps
/// [`SERVER_ADDR`]) and link 3 router and gateway.
pub(crate) const GATEWAY_SERVER_SIDE: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 1);
pub(crate) const ROUTER_GATEWAY_SIDE: Ipv4Addr = Ipv4Addr::new(10, 0, 3, 1);
pub(crate) const GATEWAY_ROUTER_SIDE: Ipv4Addr = Ipv4Addr::new(10, 0, 3, 2);
pub(crate) const ROUTER_GATEWAY_PREFIX: &str = "10.0.3.0/24";

/// SIGINT or SIGTERM stop every child and remove every namespace (midway-labnet's cleanup),
/// then exit with 130.
pub(crate) fn install_cleanup_on_signal() -> anyhow::Result<()> {
    midway_labnet::install_cleanup_on_signal().context("cannot install the signal cleanup")
}

/// Client, router and server as a midway-labnet topology whose links are plain veth pairs (no
/// emulator), removed on drop.
pub(crate) struct BenchNet {
    topology: Topology,
    children: Vec<HostChild>,
}

/// A thread running inside one of the hosts; [`InHost::join`] gives its result.
pub(crate) enum InHost<T> {
    Running(JoinHandle<std::io::Result<anyhow::Result<T>>>),
    /// The namespace could not be entered; the closure never ran.
    Failed(std::io::Error),
}

impl<T> InHost<T> {
    /// Waits for the thread; `Err` only if it panicked.
    pub(crate) fn join(self) -> std::thread::Result<anyhow::Result<T>> {
        match self {
            InHost::Running(handle) => handle.join().map(|entered| entered?),
            InHost::Failed(error) => Ok(Err(error.into())),
        }
    }

    /// Whether the thread has ended (a thread that never started has).
    pub(crate) fn is_finished(&self) -> bool {
        match self {
            InHost::Running(handle) => handle.is_finished(),
            InHost::Failed(_) => true,
        }
    }
}

impl BenchNet {
    /// Client, router and server in a chain.
    pub(crate) fn build() -> anyhow::Result<BenchNet> {
        BenchNet::build_from(
            &[Host::Client, Host::Router, Host::Server],
            &[(Host::Client, Host::Router), (Host::Router, Host::Server)],
            &[
                (Host::Client, Host::Router, CLIENT_ADDR),
                (Host::Router, Host::Client, ROUTER_CLIENT_SIDE),
                (Host::Router, Host::Server, ROUTER_SERVER_SIDE),
                (Host::Server, Host::Router, SERVER_ADDR),
            ],
        )
    }

    /// Client, router (the edge midway), gateway and server in a chain, each joined to the
    /// next by a plain veth; the links are listed so that client, router's client side and
    /// server keep the addresses of [`BenchNet::build`].
    pub(crate) fn build_tunnel() -> anyhow::Result<BenchNet> {
        BenchNet::build_from(
            &[Host::Client, Host::Router, Host::Gateway, Host::Server],
            &[
                (Host::Client, Host::Router),
                (Host::Gateway, Host::Server),
                (Host::Router, Host::Gateway),
            ],
            &[
                (Host::Client, Host::Router, CLIENT_ADDR),
                (Host::Router, Host::Client, ROUTER_CLIENT_SIDE),
                (Host::Router, Host::Gateway, ROUTER_GATEWAY_SIDE),
                (Host::Gateway, Host::Router, GATEWAY_ROUTER_SIDE),
                (Host::Gateway, Host::Server, GATEWAY_SERVER_SIDE),
                (Host::Server, Host::Gateway, SERVER_ADDR),
            ],
        )
    }

    /// The hosts joined by `links` (in that order, which fixes the subnets), checked against
    /// the addresses the bench expects (host, neighbour, address).
    fn build_from(
        hosts: &[Host],
        links: &[(Host, Host)],
        expected: &[(Host, Host, Ipv4Addr)],
    ) -> anyhow::Result<BenchNet> {
        let host = |name: &str| HostSpec {
            name: name.into(),
            stack: StackProfile::Modern,
        };
        let link = |a: &str, b: &str| LinkSpec {
            a: a.into(),
            b: b.into(),
            a_to_b: DirectionConfig::default(),
            b_to_a: DirectionConfig::default(),
        };
        let spec = TopologySpec {
            hosts: hosts.iter().map(|h| host(h.name())).collect(),
            links: links
                .iter()
                .map(|(a, b)| link(a.name(), b.name()))
                .collect(),
        };
        let topology =
            Topology::build_with(&spec, &midway_labnet::fresh_tag(), 0, LinkMode::Plain)?;
        let net = BenchNet {
            topology,
            children: Vec::new(),
        };
        for &(host, neighbour, expected) in expected {
            let addr = net.topology.try_addr(host.name(), neighbour.name())?;
            if addr != IpAddr::V4(expected) {
                bail!("the lab gave {host:?} {addr} towards {neighbour:?}, the bench expects {expected}");
            }
        }
        // Thousands of short connections per second would run out of ephemeral ports otherwise.
        // The range starts above every port the bench listens on (all below 10000): with 1024 a
        // proxy's outgoing socket could take the next case's listening port and hold it in
        // TIME_WAIT, and that case's bind then failed ("Address already in use").
        for host in [Host::Client, Host::Router, Host::Gateway] {
            if !hosts.contains(&host) {
                continue;
            }
            net.write_sysctl(host, "net.ipv4.ip_local_port_range", "10000 65000")?;
            net.write_sysctl(host, "net.ipv4.tcp_tw_reuse", "1")?;
        }
        Ok(net)
    }

    /// Sets the sysctl `key` of the host's namespace to `value`.
    fn write_sysctl(&self, host: Host, key: &str, value: &str) -> anyhow::Result<()> {
        sysctl::write_in(&self.netns_path(host), key, value)
            .with_context(|| format!("cannot set {key} in {host:?}"))
    }

    /// The sysctl `key` of the host's namespace.
    fn read_sysctl(&self, host: Host, key: &str) -> anyhow::Result<String> {
        sysctl::read_in(&self.netns_path(host), key)
            .with_context(|| format!("cannot read {key} in {host:?}"))
    }

    /// The path of the host's network namespace (to enter from a thread of one's own).
    pub(crate) fn netns_path(&self, host: Host) -> PathBuf {
        self.topology.netns_path(host.name())
    }

    /// A netlink socket in the host's namespace.
    fn netlink(&self, host: Host) -> anyhow::Result<Netlink> {
        Netlink::open_in(&self.netns_path(host))
            .with_context(|| format!("cannot open netlink in {host:?}"))
    }

    /// Caps the client namespace's send-buffer autotuning at `max` bytes (`tcp_wmem`, whose
    /// first two fields stay the kernel's defaults).
    pub(crate) fn cap_client_send_buffers(&self, max: u32) -> anyhow::Result<()> {
        let current = self.read_sysctl(Host::Client, "net.ipv4.tcp_wmem")?;
        let fields: Vec<&str> = current.split_whitespace().collect();
        let [min, default, _] = fields[..] else {
            bail!("unexpected net.ipv4.tcp_wmem: {current:?}");
        };
        self.write_sysctl(
            Host::Client,
            "net.ipv4.tcp_wmem",
            &format!("{min} {default} {max}"),
        )
    }

    /// Adds `addresses` (in the client's /24) to the client's interface towards the router, so
    /// that a load generator can spread its connections over several source addresses, each
    /// with its own ephemeral ports. They go with the namespace.
    pub(crate) fn add_client_addresses(&self, addresses: &[Ipv4Addr]) -> anyhow::Result<()> {
        let iface = self.iface(Host::Client, Host::Router).to_string();
        let mut netlink = self.netlink(Host::Client)?;
        let device = netlink
            .link_index(&iface)
            .with_context(|| format!("no interface {iface} in the client"))?;
        for &address in addresses {
            let spec = AddressSpec {
                address: ipnet::IpNet::new(IpAddr::V4(address), 24)?,
                device,
                nodad: false,
            };
            match netlink.add_address(&spec) {
                Ok(()) => {}
                Err(error) if error.is_exists() => {}
                Err(error) => {
                    return Err(error).with_context(|| format!("cannot add {address} to {iface}"))
                }
            }
        }
        Ok(())
    }

    /// Sets the SYN queue of the router's and the server's namespaces (`tcp_max_syn_backlog`)
    /// to `depth`: a burst of handshakes that overflows it is dropped, and the client's 1 s SYN
    /// retransmit would show up as connect latency the proxy did not cause.
    pub(crate) fn deepen_syn_queues(&self, depth: u32) -> anyhow::Result<()> {
        for host in [Host::Router, Host::Server] {
            self.write_sysctl(host, "net.ipv4.tcp_max_syn_backlog", &depth.to_string())?;
        }
        Ok(())
    }

    /// Gives every route of a host's main table the `congctl NAME` metric, so every TCP socket
    /// there that follows those routes and does not pick its own congestion control (with
    /// `TCP_CONGESTION`) starts with `name`: connected and accepted sockets alike.
    ///
    /// A route metric, not the namespace's `net.ipv4.tcp_congestion_control`: a child namespace
    /// may make only a congestion control in the host's `tcp_allowed_congestion_control` its
    /// default (on a fresh machine `reno bbr`), and widening that list would change the host.
    /// A route's `congctl` is the namespace's own and needs no such permission.
    pub(crate) fn set_congestion_control(&self, host: Host, name: &str) -> anyhow::Result<()> {
        self.add_route_metric(host, &RouteMetric::congctl(name))
    }

    /// Gives the router's routes to both subnets the `quickack` metric, so every socket in the
    /// router that follows the main table (HAProxy's; midway's profiles use tables of their
    /// own) ACKs each segment at once instead of delaying ACKs.
    pub(crate) fn router_quick_acks(&self) -> anyhow::Result<()> {
        self.add_route_metric(Host::Router, &RouteMetric::new(Metric::QuickAck, 1))
    }

    /// Rewrites each IPv4 route of the host's main table with `metric` (replacing an earlier
    /// value of the same metric, keeping the others).
    fn add_route_metric(&self, host: Host, metric: &RouteMetric) -> anyhow::Result<()> {
        self.netlink(host)?
            .set_metric_on_routes(Family::V4, TABLE_MAIN, metric)
            .with_context(|| format!("cannot set {metric} on the routes of {host:?}"))?;
        Ok(())
    }

    /// The congestion control a new socket of this host starts with: the `congctl` of its
    /// routes when they all carry the same one, else the namespace's default.
    pub(crate) fn congestion_control(&self, host: Host) -> anyhow::Result<String> {
        let routes = self
            .netlink(host)?
            .routes(Family::V4, TABLE_MAIN)
            .with_context(|| format!("cannot list the routes of {host:?}"))?;
        let per_route: Vec<Option<&str>> = routes
            .iter()
            .map(|route| match route.metrics.get(Metric::CongCtl) {
                Some(RouteMetric {
                    value: MetricValue::Name(name),
                    ..
                }) => Some(name.as_str()),
                _ => None,
            })
            .collect();
        if let Some(Some(first)) = per_route.first() {
            if per_route.iter().all(|cc| cc == &Some(*first)) {
                return Ok((*first).to_string());
            }
        }
        self.read_sysctl(host, "net.ipv4.tcp_congestion_control")
    }

    /// Where a process started with `midway-launch` runs to be in `host` (its own process
    /// group, stopped by the signal cleanup like [`BenchNet::spawn`]'s children).
    pub(crate) fn place(&self, host: Host) -> midway_launch::Place<'_> {
        midway_launch::Place::Host {
            topology: &self.topology,
            host: host.name(),
        }
    }

    /// The interface of `host` that faces `neighbour`.
    pub(crate) fn iface(&self, host: Host, neighbour: Host) -> &str {
        self.topology.iface(host.name(), neighbour.name())
    }

    /// Runs a program inside a host to completion; its standard output, or an error with the
    /// command line and its stderr.
    pub(crate) fn run(&self, host: Host, program: &str, args: &[&str]) -> anyhow::Result<String> {
        Ok(Program::new(program)
            .args(args)
            .in_namespace(self.netns_path(host))
            .output()?)
    }

    /// Runs `program` in a host with `input` on its standard input, to completion.
    pub(crate) fn run_with_stdin(
        &self,
        host: Host,
        program: &str,
        args: &[&str],
        input: &str,
    ) -> anyhow::Result<()> {
        Ok(Program::new(program)
            .args(args)
            .stdin(input)
            .in_namespace(self.netns_path(host))
            .run()?)
    }

    /// Starts `program` in a host with its standard output and error piped, for the caller to
    /// wait for (several at once): it is forked from a thread inside the host's namespace, so
    /// it runs there without `ip netns exec`.
    pub(crate) fn start_piped(
        &self,
        host: Host,
        program: &str,
        args: &[&str],
    ) -> anyhow::Result<std::process::Child> {
        let mut command = Program::new(program).args(args).to_command();
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        midway_sys::netns::run_in(&self.netns_path(host), move || command.spawn())?
            .with_context(|| format!("cannot start {program} in {host:?}"))
    }

    /// Starts a long-running program in a host; it is stopped when the network is dropped, and
    /// killed by the signal cleanup.
    pub(crate) fn spawn(
        &mut self,
        host: Host,
        program: &str,
        args: &[&str],
        log: Option<File>,
    ) -> anyhow::Result<u32> {
        let mut cmd = Command::new(program);
        cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null());
        match log {
            Some(file) => cmd.stderr(file),
            None => cmd.stderr(Stdio::null()),
        };
        let child = self
            .topology
            .spawn(host.name(), cmd)
            .with_context(|| format!("cannot start {program}"))?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }

    /// Runs `f` on a thread that has entered the host's namespace.
    pub(crate) fn in_host<T: Send + 'static>(
        &self,
        host: Host,
        f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
    ) -> InHost<T> {
        match midway_sys::netns::spawn_in(&self.netns_path(host), f) {
            Ok(handle) => InHost::Running(handle),
            Err(error) => InHost::Failed(error),
        }
    }
}

impl Drop for BenchNet {
    fn drop(&mut self) {
        // Children first (each handle stops its process group), then the topology's own drop
        // removes the namespaces and with them the veths.
        self.children.clear();
    }
}
