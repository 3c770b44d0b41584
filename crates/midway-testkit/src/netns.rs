//! Network namespaces made by tests, and the names labnet gives its own: running `ip` and other
//! programs, a namespace deleted on drop, threads that enter one, and finding what a lab
//! process left behind.

use std::fs::File;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;

/// Runs `args[0]` with the rest as its arguments; panics with its stderr unless it succeeds.
pub fn run(args: &[&str]) {
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|error| panic!("cannot run {args:?}: {error}"));
    assert!(
        output.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// [`run`] with the command given as one whitespace-separated string.
pub fn run_words(command: &str) {
    run(&command.split_whitespace().collect::<Vec<_>>());
}

/// Runs `ip ARGS`; panics with its stderr unless it succeeds, returns its stdout.
pub fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace made by the test, deleted on drop (also when the test fails).
pub struct Netns {
    name: String,
}

impl Netns {
    /// Adds namespace `name` as it is (no loopback brought up).
    pub fn new(name: String) -> Netns {
        ip(&["netns", "add", &name]);
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
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `program ARGS` inside the namespace (`ip netns exec`) and returns its output.
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.name, program])
            .args(args)
            .output()
            .unwrap()
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
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
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
/// `ip netns list` shows them.
pub fn namespaces_tagged(tag: &str) -> Vec<String> {
    let (dash, dot) = (format!("mw{tag}-"), format!("mw{tag}."));
    output(&["ip", "netns", "list"])
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&dash) || n.starts_with(&dot))
        .map(str::to_owned)
        .collect()
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
        run_words(&format!(
            "ip -n {c} link add veth-c type veth peer name veth-rc netns {r}"
        ));
        run_words(&format!(
            "ip -n {s} link add veth-s type veth peer name veth-rs netns {r}"
        ));
        for (ns, dev, v4, v6) in [
            (c, "veth-c", "10.77.1.1/24", "fd77:1::1/64"),
            (r, "veth-rc", "10.77.1.2/24", "fd77:1::2/64"),
            (r, "veth-rs", "10.77.2.1/24", "fd77:2::1/64"),
            (s, "veth-s", "10.77.2.2/24", "fd77:2::2/64"),
        ] {
            run_words(&format!("ip -n {ns} addr add {v4} dev {dev}"));
            run_words(&format!("ip -n {ns} -6 addr add {v6} dev {dev} nodad"));
            run_words(&format!("ip -n {ns} link set {dev} up"));
        }
        run_words(&format!("ip -n {c} route add default via 10.77.1.2"));
        run_words(&format!("ip -n {s} route add default via 10.77.2.1"));
        run_words(&format!(
            "ip netns exec {r} sysctl -qw net.ipv4.ip_forward=1"
        ));
        run_words(&format!("ip -n {c} -6 route add default via fd77:1::2"));
        run_words(&format!("ip -n {s} -6 route add default via fd77:2::1"));
        run_words(&format!(
            "ip netns exec {r} sysctl -qw net.ipv6.conf.all.forwarding=1"
        ));
        // An interface's fe80::/64 route appears once the kernel sees its carrier, which a veth
        // reports up to a second after both ends are up (link events are batched); a proxy that
        // copies the router's routing table at start (route knobs) must find both.
        let mut netlink = midway_sys::netlink::Netlink::open_in_named(r).unwrap();
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
