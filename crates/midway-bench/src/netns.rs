//! The benchmark's network: client, router and server namespaces joined by plain veth pairs.
//!
//! The hosts are a midway-labnet topology built with [`LinkMode::Plain`]: no emulated link, since
//! the benchmark measures what the proxy itself costs, so the only thing between the hosts is the
//! kernel's veth, with its offloads left on as an operator's gateway would have them. Naming,
//! addressing, the children's process groups and the cleanup on signals are the lab's.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;

use anyhow::{bail, Context};
use midway_labnet::{
    DirectionConfig, HostChild, HostSpec, LinkMode, LinkSpec, StackProfile, Topology, TopologySpec,
};

/// Which of the three hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Host {
    Client,
    Router,
    Server,
}

impl Host {
    /// The host's name in the lab topology.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Host::Client => "client",
            Host::Router => "router",
            Host::Server => "server",
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
    pub(crate) fn build() -> anyhow::Result<BenchNet> {
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
            hosts: vec![host("client"), host("router"), host("server")],
            links: vec![link("client", "router"), link("router", "server")],
        };
        let topology =
            Topology::build_with(&spec, &midway_labnet::fresh_tag(), 0, LinkMode::Plain)?;
        let net = BenchNet {
            topology,
            children: Vec::new(),
        };
        for (host, neighbour, expected) in [
            (Host::Client, Host::Router, CLIENT_ADDR),
            (Host::Router, Host::Client, ROUTER_CLIENT_SIDE),
            (Host::Router, Host::Server, ROUTER_SERVER_SIDE),
            (Host::Server, Host::Router, SERVER_ADDR),
        ] {
            let addr = net.topology.try_addr(host.name(), neighbour.name())?;
            if addr != IpAddr::V4(expected) {
                bail!("the lab gave {host:?} {addr} towards {neighbour:?}, the bench expects {expected}");
            }
        }
        // Thousands of short connections per second would run out of ephemeral ports otherwise.
        for host in [Host::Client, Host::Router] {
            net.run(
                host,
                "sysctl",
                &["-qw", "net.ipv4.ip_local_port_range=1024 65000"],
            )?;
            net.run(host, "sysctl", &["-qw", "net.ipv4.tcp_tw_reuse=1"])?;
        }
        Ok(net)
    }

    /// Caps the client namespace's send-buffer autotuning at `max` bytes (`tcp_wmem`, whose
    /// first two fields stay the kernel's defaults).
    pub(crate) fn cap_client_send_buffers(&self, max: u32) -> anyhow::Result<()> {
        let current = self.run(Host::Client, "sysctl", &["-n", "net.ipv4.tcp_wmem"])?;
        let fields: Vec<&str> = current.split_whitespace().collect();
        let [min, default, _] = fields[..] else {
            bail!("unexpected net.ipv4.tcp_wmem: {current:?}");
        };
        let value = format!("net.ipv4.tcp_wmem={min} {default} {max}");
        self.run(Host::Client, "sysctl", &["-qw", &value])?;
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
        self.add_route_metric(host, "congctl", name)
    }

    /// Gives the router's routes to both subnets the `quickack` metric, so every socket in the
    /// router that follows the main table (HAProxy's; midway's profiles use tables of their
    /// own) ACKs each segment at once instead of delaying ACKs.
    pub(crate) fn router_quick_acks(&self) -> anyhow::Result<()> {
        self.add_route_metric(Host::Router, "quickack", "1")
    }

    /// Rewrites each route of the host's main table with `metric value` (replacing an earlier
    /// value of the same metric, keeping the others).
    fn add_route_metric(&self, host: Host, metric: &str, value: &str) -> anyhow::Result<()> {
        let routes = self.run(host, "ip", &["-o", "route", "show", "table", "main"])?;
        for route in routes.lines().filter(|l| !l.trim().is_empty()) {
            let mut args = without_metric(route, metric);
            args.extend([metric.to_string(), value.to_string()]);
            let mut command: Vec<&str> = vec!["route", "replace"];
            command.extend(args.iter().map(String::as_str));
            self.run(host, "ip", &command)?;
        }
        Ok(())
    }

    /// The congestion control a new socket of this host starts with: the `congctl` of its
    /// routes when they all carry the same one, else the namespace's default.
    pub(crate) fn congestion_control(&self, host: Host) -> anyhow::Result<String> {
        let routes = self.run(host, "ip", &["-o", "route", "show", "table", "main"])?;
        let per_route: Vec<Option<String>> = routes
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|route| route_metric(route, "congctl"))
            .collect();
        if let Some(Some(first)) = per_route.first() {
            if per_route.iter().all(|cc| cc.as_ref() == Some(first)) {
                return Ok(first.clone());
            }
        }
        let name = self.run(host, "sysctl", &["-n", "net.ipv4.tcp_congestion_control"])?;
        Ok(name.trim().to_string())
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

    /// Runs a command inside a host and fails with its stderr when it fails.
    pub(crate) fn run(&self, host: Host, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let output = self
            .command(host, program, args)
            .output()
            .with_context(|| format!("cannot run {program}"))?;
        if !output.status.success() {
            bail!(
                "{program} {} failed in {:?}: {}",
                args.join(" "),
                host,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    pub(crate) fn command(&self, host: Host, program: &str, args: &[&str]) -> Command {
        let mut cmd = self.topology.command(host.name(), program);
        cmd.args(args);
        cmd
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
        let path = self.topology.netns_path(host.name());
        match midway_sys::netns::spawn_in(&path, f) {
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

/// The words of a route as `ip -o route show` prints it, less one metric and its value (and
/// iproute2's `lock` before it, if any).
fn without_metric(route: &str, metric: &str) -> Vec<String> {
    let words: Vec<&str> = route.split_whitespace().collect();
    let mut kept = Vec::with_capacity(words.len());
    let mut i = 0;
    while i < words.len() {
        if words[i] == metric {
            i += 2;
            if words.get(i - 1) == Some(&"lock") {
                i += 1;
            }
            continue;
        }
        kept.push(words[i].to_string());
        i += 1;
    }
    kept
}

/// A metric's value in a route line, if the route carries it.
fn route_metric(route: &str, metric: &str) -> Option<String> {
    let mut words = route
        .split_whitespace()
        .skip_while(|w| *w != metric)
        .skip(1);
    match words.next()? {
        "lock" => words.next().map(str::to_string),
        value => Some(value.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_replaced_and_the_others_kept() {
        let route = "10.201.1.0/24 dev mwb1r0 proto kernel scope link src 10.201.1.1 quickack 1 congctl bbr";
        assert_eq!(
            without_metric(route, "congctl").join(" "),
            "10.201.1.0/24 dev mwb1r0 proto kernel scope link src 10.201.1.1 quickack 1"
        );
        assert_eq!(
            without_metric("default via 10.201.1.1 dev c0 congctl lock reno", "congctl").join(" "),
            "default via 10.201.1.1 dev c0"
        );
        assert_eq!(route_metric(route, "congctl").as_deref(), Some("bbr"));
        assert_eq!(route_metric(route, "quickack").as_deref(), Some("1"));
        assert_eq!(
            route_metric("default via 1.2.3.4 dev x congctl lock reno", "congctl").as_deref(),
            Some("reno")
        );
        assert_eq!(route_metric("default via 1.2.3.4 dev x", "congctl"), None);
    }
}
