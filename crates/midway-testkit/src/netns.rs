//! Network namespaces made by tests, and the names labnet gives its own: a namespace deleted on
//! drop, wired through the same kernel layer as the lab (`midway_sys::netns`, `netlink`,
//! `sysctl`), programs run in it, threads that enter one, and finding what a lab process left
//! behind.

use std::fs::File;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;

use ipnet::IpNet;
use midway_sys::command::{spawn_in_namespace, Program};
use midway_sys::netlink::{AddressSpec, Netlink, Route, VethEnd};

/// Runs `args[0]` with the rest as its arguments; panics with its stderr unless it succeeds.
pub fn run(args: &[&str]) {
    Program::new(args[0])
        .args(&args[1..])
        .run()
        .unwrap_or_else(|error| panic!("{error}"));
}

/// [`run`] with the command given as one whitespace-separated string.
pub fn run_words(command: &str) {
    run(&command.split_whitespace().collect::<Vec<_>>());
}

/// A netlink socket in the named namespace; panics if it cannot be opened.
pub fn netlink_in(name: &str) -> Netlink {
    Netlink::open_in_named(name).unwrap_or_else(|error| panic!("{error}"))
}

/// A network namespace made by the test, deleted on drop (also when the test fails).
pub struct Netns {
    name: String,
}

impl Netns {
    /// Adds namespace `name` as it is (no loopback brought up).
    pub fn new(name: String) -> Netns {
        midway_sys::netns::create(&name)
            .unwrap_or_else(|error| panic!("cannot add namespace {name}: {error}"));
        Netns { name }
    }

    /// Adds a namespace named `PREFIX-PID-N` (N counts up in this process) with its loopback
    /// up.
    pub fn unique(prefix: &str) -> Netns {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let ns = Netns::new(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        netlink_in(&ns.name)
            .set_link_up("lo")
            .unwrap_or_else(|error| panic!("{error}"));
        ns
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `program ARGS` inside the namespace and returns its output, whatever its status
    /// (as `Command::output`: stdin closed, stdout and stderr captured).
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        spawn_in_namespace(&midway_sys::netns::netns_path(&self.name), command)
            .and_then(|child| {
                child.wait_with_output().map_err(|source| {
                    midway_sys::command::CommandError::Spawn {
                        command: program.to_owned(),
                        source,
                    }
                })
            })
            .unwrap_or_else(|error| panic!("{error}"))
    }

    /// Writes sysctls of this namespace (`net.ipv4.ip_forward`, `1`); panics if one fails.
    pub fn set_sysctls(&self, values: &[(&str, &str)]) {
        let values: Vec<(String, String)> = values
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        midway_sys::netns::run_in(&midway_sys::netns::netns_path(&self.name), move || {
            values
                .iter()
                .try_for_each(|(key, value)| midway_sys::sysctl::write(key, value))
        })
        .and_then(|written| written)
        .unwrap_or_else(|error| panic!("{error}"));
    }

    /// Runs `f` on a fresh thread that has entered this namespace (sockets it creates belong to
    /// it; child processes such as `ip` run in it) and returns its result.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    enter_netns(&self.name);
                    f()
                })
                .join()
                .expect("netns thread panicked")
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = midway_sys::netns::delete(&self.name);
    }
}

/// Moves the calling thread (one started for this) into the named network namespace.
fn enter_netns(name: &str) {
    let file = File::open(midway_sys::netns::netns_path(name)).expect("open netns");
    midway_sys::netns::enter(&file).expect("setns");
}

/// Runs `f` on a new thread that has joined the named network namespace.
pub fn in_netns<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let name = name.to_owned();
    std::thread::spawn(move || {
        enter_netns(&name);
        f()
    })
}

/// `n` in base 36, as labnet writes process ids into namespace tags.
pub fn base36(n: u32) -> String {
    midway_labnet::tag_prefix_of_process(n)
}

/// Names in `dir` that process `pid` made with labnet's tag scheme: `PREFIX`, the pid in base
/// 36, one counter character, then one of `separators` and more (the tests make few enough
/// topologies for the counter to be one character).
pub fn entries_of_pid(dir: &Path, prefix: &str, pid: u32, separators: &[u8]) -> Vec<String> {
    let prefix = format!("{prefix}{}", base36(pid));
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| {
                    name.strip_prefix(&prefix).is_some_and(|rest| {
                        let rest = rest.as_bytes();
                        rest.len() > 2 && separators.contains(&rest[1])
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Network namespaces made by process `pid` (labnet names them `mw<tag>-host` or
/// `mw<tag>.host`).
pub fn namespaces_of_pid(pid: u32) -> Vec<String> {
    entries_of_pid(Path::new("/run/netns"), "mw", pid, b"-.")
}

/// The stdout of `args[0]` run with the rest as its arguments, whether it succeeded or not
/// (`ip route show table N` fails once the table is gone).
pub fn output(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|error| panic!("cannot run {args:?}: {error}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Network namespaces of labnet topology `tag` (named `mw<tag>-host` or `mw<tag>.host`), as
/// `/run/netns` lists them.
pub fn namespaces_tagged(tag: &str) -> Vec<String> {
    let (dash, dot) = (format!("mw{tag}-"), format!("mw{tag}."));
    midway_sys::netns::list()
        .into_iter()
        .filter(|n| n.starts_with(&dash) || n.starts_with(&dot))
        .collect()
}

/// A failed netlink request of a test's set-up: the test fails with the request and the errno.
fn failed<T>(error: midway_sys::netlink::NetlinkError) -> T {
    panic!("{error}")
}

/// Three namespaces wired client -- router -- server (IPv4 and IPv6), the layout of a
/// transparent proxy's tests; each deleted on drop, also when building the rest fails.
pub struct Routed {
    /// The client host: 10.77.1.1, fd77:1::1, default route via the router.
    pub client: Netns,
    /// The router between them (IP forwarding on): 10.77.1.2 / 10.77.2.1, fd77:1::2 / fd77:2::1.
    pub router: Netns,
    /// The server host: 10.77.2.2, fd77:2::2, default route via the router.
    pub server: Netns,
}

impl Routed {
    /// Builds the three namespaces and their links and routes.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Routed {
        let topo = Routed {
            client: Netns::unique("mwt-c"),
            router: Netns::unique("mwt-r"),
            server: Netns::unique("mwt-s"),
        };
        let (c, r, s) = (topo.client.name(), topo.router.name(), topo.server.name());
        // veth pairs created directly inside the namespaces: no names in the root namespace.
        let mut sockets = [netlink_in(c), netlink_in(r), netlink_in(s)];
        for (socket, end, peer) in [(0, "veth-c", "veth-rc"), (2, "veth-s", "veth-rs")] {
            sockets[socket]
                .add_veth(
                    &VethEnd::named(end),
                    &VethEnd::named(peer).in_named_namespace(r),
                )
                .unwrap_or_else(failed);
        }
        for (socket, dev, v4, v6) in [
            (0, "veth-c", "10.77.1.1/24", "fd77:1::1/64"),
            (1, "veth-rc", "10.77.1.2/24", "fd77:1::2/64"),
            (1, "veth-rs", "10.77.2.1/24", "fd77:2::1/64"),
            (2, "veth-s", "10.77.2.2/24", "fd77:2::2/64"),
        ] {
            let netlink = &mut sockets[socket];
            let device = netlink.link_index(dev).unwrap_or_else(failed);
            for (address, nodad) in [(v4, false), (v6, true)] {
                let address: IpNet = address.parse().unwrap_or_else(|e| panic!("{e}"));
                netlink
                    .add_address(&AddressSpec {
                        address,
                        device,
                        nodad,
                    })
                    .unwrap_or_else(failed);
            }
            netlink.set_link_up(dev).unwrap_or_else(failed);
        }
        for (socket, gateway) in [
            (0, "10.77.1.2"),
            (2, "10.77.2.1"),
            (0, "fd77:1::2"),
            (2, "fd77:2::1"),
        ] {
            let gateway: IpAddr = gateway.parse().unwrap_or_else(|e| panic!("{e}"));
            let route = Route {
                gateway: Some(gateway),
                ..Route::to(midway_sys::netlink::Family::of(gateway).any())
            };
            sockets[socket].add_route(&route).unwrap_or_else(failed);
        }
        topo.router.set_sysctls(&[
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
        ]);
        // An interface's fe80::/64 route appears once the kernel sees its carrier, which a veth
        // reports up to a second after both ends are up (link events are batched); a proxy that
        // copies the router's routing table at start (route knobs) must find both.
        let [_, mut netlink, _] = sockets;
        let link_local: ipnet::IpNet = "fe80::/64".parse().unwrap();
        crate::wait::wait_until(
            std::time::Duration::from_secs(5),
            || {
                let routes = netlink
                    .routes(
                        midway_sys::netlink::Family::V6,
                        midway_sys::netlink::TABLE_MAIN,
                    )
                    .unwrap();
                routes
                    .iter()
                    .filter(|r| r.destination == link_local)
                    .count()
                    >= 2
            },
            "the router's link-local routes never appeared",
        );
        topo
    }
}
