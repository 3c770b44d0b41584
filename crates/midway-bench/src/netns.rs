//! The benchmark's network: client, router and server namespaces joined by plain veth pairs.
//!
//! Unlike the lab's topologies there is no emulated link here: the benchmark measures what the
//! proxy itself costs, so the only thing between the hosts is the kernel's veth, with its offloads
//! left on as an operator's gateway would have them.

use std::fs::File;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sched::{setns, CloneFlags};

/// Which of the three hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    Client,
    Router,
    Server,
}

/// Addresses are private to the namespaces this module creates; nothing leaves the machine.
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 2);
pub const ROUTER_CLIENT_SIDE: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 1);
pub const ROUTER_SERVER_SIDE: Ipv4Addr = Ipv4Addr::new(10, 201, 2, 1);
pub const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 201, 2, 2);
pub const CLIENT_PREFIX: &str = "10.201.1.0/24";
pub const SERVER_PREFIX: &str = "10.201.2.0/24";

/// Namespaces and child pids alive in this process, for the signal handler: Ctrl-C must not leave
/// namespaces or proxies behind.
static LIVE: std::sync::Mutex<(Vec<String>, Vec<u32>)> =
    std::sync::Mutex::new((Vec::new(), Vec::new()));

/// On SIGINT or SIGTERM: stop every child, delete every namespace, exit with 130.
pub fn install_cleanup_on_signal() -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let (namespaces, pids) = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
            for pid in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            for ns in namespaces {
                let _ = Command::new("ip").args(["netns", "delete", &ns]).status();
            }
            eprintln!("interrupted: benchmark network removed");
            std::process::exit(130);
        }
    });
    Ok(())
}

fn track(update: impl FnOnce(&mut (Vec<String>, Vec<u32>))) {
    if let Ok(mut live) = LIVE.lock() {
        update(&mut live);
    }
}

/// Three namespaces named after this process, removed on drop.
pub struct BenchNet {
    tag: String,
    children: Vec<Child>,
}

impl BenchNet {
    pub fn build() -> anyhow::Result<BenchNet> {
        let tag = format!("mwb{}", std::process::id());
        let net = BenchNet {
            tag,
            children: Vec::new(),
        };
        for host in [Host::Client, Host::Router, Host::Server] {
            ip(&["netns", "add", &net.ns(host)])?;
            let ns = net.ns(host);
            track(|live| live.0.push(ns));
            net.run(host, "ip", &["link", "set", "lo", "up"])?;
        }
        let (c0, r0, r1, s0) = (
            net.iface("c0"),
            net.iface("r0"),
            net.iface("r1"),
            net.iface("s0"),
        );
        ip(&[
            "link",
            "add",
            &c0,
            "netns",
            &net.ns(Host::Client),
            "type",
            "veth",
            "peer",
            "name",
            &r0,
            "netns",
            &net.ns(Host::Router),
        ])?;
        ip(&[
            "link",
            "add",
            &r1,
            "netns",
            &net.ns(Host::Router),
            "type",
            "veth",
            "peer",
            "name",
            &s0,
            "netns",
            &net.ns(Host::Server),
        ])?;
        let plan: [(Host, &str, String); 4] = [
            (Host::Client, &c0, format!("{CLIENT_ADDR}/24")),
            (Host::Router, &r0, format!("{ROUTER_CLIENT_SIDE}/24")),
            (Host::Router, &r1, format!("{ROUTER_SERVER_SIDE}/24")),
            (Host::Server, &s0, format!("{SERVER_ADDR}/24")),
        ];
        for (host, iface, addr) in &plan {
            net.run(*host, "ip", &["addr", "add", addr, "dev", iface])?;
            net.run(*host, "ip", &["link", "set", iface, "up"])?;
        }
        net.run(
            Host::Client,
            "ip",
            &[
                "route",
                "add",
                "default",
                "via",
                &ROUTER_CLIENT_SIDE.to_string(),
            ],
        )?;
        net.run(
            Host::Server,
            "ip",
            &[
                "route",
                "add",
                "default",
                "via",
                &ROUTER_SERVER_SIDE.to_string(),
            ],
        )?;
        net.run(Host::Router, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
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
    pub fn cap_client_send_buffers(&self, max: u32) -> anyhow::Result<()> {
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
    pub fn set_congestion_control(&self, host: Host, name: &str) -> anyhow::Result<()> {
        self.add_route_metric(host, "congctl", name)
    }

    /// Gives the router's routes to both subnets the `quickack` metric, so every socket in the
    /// router that follows the main table (HAProxy's; midway's profiles use tables of their
    /// own) ACKs each segment at once instead of delaying ACKs.
    pub fn router_quick_acks(&self) -> anyhow::Result<()> {
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
    pub fn congestion_control(&self, host: Host) -> anyhow::Result<String> {
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

    pub fn ns(&self, host: Host) -> String {
        let suffix = match host {
            Host::Client => "c",
            Host::Router => "r",
            Host::Server => "s",
        };
        format!("{}{suffix}", self.tag)
    }

    /// Interface names carry the tag too, so two benchmarks never collide.
    pub fn iface(&self, end: &str) -> String {
        format!("{}{end}", self.tag)
    }

    /// Runs a command inside a host and fails with its stderr when it fails.
    pub fn run(&self, host: Host, program: &str, args: &[&str]) -> anyhow::Result<String> {
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

    pub fn command(&self, host: Host, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(host), program])
            .args(args);
        cmd
    }

    /// Starts a long-running program in a host; it is killed when the network is dropped or when
    /// [`BenchNet::stop`] is called with its pid.
    pub fn spawn(
        &mut self,
        host: Host,
        program: &str,
        args: &[&str],
        log: Option<File>,
    ) -> anyhow::Result<u32> {
        let mut cmd = self.command(host, program, args);
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        match log {
            Some(file) => cmd.stderr(file),
            None => cmd.stderr(Stdio::null()),
        };
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {program}"))?;
        let pid = child.id();
        track(|live| live.1.push(pid));
        self.children.push(child);
        Ok(pid)
    }

    /// SIGTERM, then SIGKILL after a grace period.
    pub fn stop(&mut self, pid: u32) {
        if let Some(pos) = self.children.iter().position(|c| c.id() == pid) {
            let child = self.children.swap_remove(pos);
            terminate(child, Duration::from_secs(3));
        }
    }

    /// Runs `f` on a thread that has entered the host's namespace.
    pub fn in_host<T: Send + 'static>(
        &self,
        host: Host,
        f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
    ) -> std::thread::JoinHandle<anyhow::Result<T>> {
        let path = format!("/run/netns/{}", self.ns(host));
        std::thread::spawn(move || {
            let file = File::open(&path).with_context(|| format!("cannot open {path}"))?;
            setns(file.as_fd(), CloneFlags::CLONE_NEWNET).context("setns")?;
            f()
        })
    }
}

impl Drop for BenchNet {
    fn drop(&mut self) {
        for child in self.children.drain(..) {
            terminate(child, Duration::from_secs(3));
        }
        for host in [Host::Client, Host::Router, Host::Server] {
            // Deleting the namespace removes its veth ends too.
            let ns = self.ns(host);
            let _ = Command::new("ip")
                .args(["netns", "delete", &ns])
                .stderr(Stdio::null())
                .status();
            track(|live| live.0.retain(|n| *n != ns));
        }
    }
}

fn terminate(mut child: Child, grace: Duration) {
    let id = child.id();
    track(|live| live.1.retain(|p| *p != id));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
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

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run ip")?;
    if !output.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
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
