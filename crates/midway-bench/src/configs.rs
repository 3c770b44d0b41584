//! The configs of the proxies under test: midway's (through midway-config's builders, with the
//! command line's extra TOML on top) and HAProxy's (midway-config's `HaproxyConfig`), both
//! listening on the router's client-side address for every port the bench uses.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{bail, Context};
use midway_config::haproxy::{HaproxyConfig, ListenSection};
use midway_config::{overlay, ConfigBuilder, ListenerBuilder, RelayName};

use crate::connections::proxy_max_connections;
use crate::netns::{CLIENT_PREFIX, ROUTER_CLIENT_SIDE, SERVER_ADDR};
use crate::{all_ports, BenchOptions, Case, METRICS_ADDR, TRANSPARENT_PORT};

/// midway's `shutdown_grace` in the bench: what is still open this long after SIGTERM is reset.
pub(crate) const MIDWAY_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// midway's config for a case: one forward listener per port, or one transparent listener for
/// all of them, with the profile under test on both segments; then the `--midway-proxy-extra`
/// lines (TOML in the `[proxy]` table, where a table header may open another table such as
/// `[profiles.NAME]`) and the `--midway-listener-extra` lines (TOML in each listener) on top.
pub(crate) fn midway_config(
    case: Case,
    client_iface: &str,
    options: &BenchOptions,
) -> anyhow::Result<String> {
    let profile = options.midway_profile.as_str();
    let with_profile = |listener: ListenerBuilder| {
        listener
            .relay(RelayName::Buffer)
            .local_profile(profile)
            .remote_profile(profile)
            .build()
    };
    // Two open files a connection: 8,500 (the idle measurement's 8,000 and room to spare) fit
    // a hard limit of 20,000, which midway cannot pass without CAP_SYS_RESOURCE; the
    // connections test asks for what it opens (it needs a higher limit). Per client as many as
    // in all: the connections test's clients are 16 addresses.
    let max_connections = proxy_max_connections(options.connections, 8500);
    let mut config = ConfigBuilder::new([CLIENT_PREFIX])
        .max_connections(max_connections, max_connections)
        .timeouts(
            Duration::from_secs(5),
            Duration::from_secs(600),
            MIDWAY_SHUTDOWN_GRACE,
        )
        .metrics(
            METRICS_ADDR
                .parse()
                .context("METRICS_ADDR is not a socket address")?,
        );
    if let Some(threads) = options.proxy_threads {
        config = config.worker_threads(usize::from(threads));
    }
    match case {
        Case::MidwayForward => {
            for port in all_ports() {
                config = config.listener(with_profile(ListenerBuilder::forward(
                    format!("p{port}"),
                    SocketAddr::from((ROUTER_CLIENT_SIDE, port)),
                    SocketAddr::from((SERVER_ADDR, port)),
                )));
            }
        }
        Case::MidwayTransparent => {
            config = config.listener(with_profile(ListenerBuilder::transparent(
                "tproxy",
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, TRANSPARENT_PORT)),
                [client_iface.to_string()],
                all_ports(),
            )));
        }
        _ => bail!("only midway cases have a midway config"),
    }
    let mut table = config.build().to_table()?;
    let proxy_extra: toml::Table = format!("[proxy]\n{}", options.midway_proxy_extra.join("\n"))
        .parse()
        .context("--midway-proxy-extra is not TOML")?;
    overlay(&mut table, &proxy_extra, "")?;
    let listener_extra: toml::Table = options
        .midway_listener_extra
        .join("\n")
        .parse()
        .context("--midway-listener-extra is not TOML")?;
    if let Some(toml::Value::Array(listeners)) = table.get_mut("listeners") {
        for listener in listeners.iter_mut() {
            if let toml::Value::Table(listener) = listener {
                overlay(listener, &listener_extra, "listeners")?;
            }
        }
    }
    Ok(toml::to_string(&table)?)
}

/// HAProxy in TCP mode with one `listen` section per port. maxconn and maxpipes leave room under
/// a 20000 open-file limit: two descriptors per proxied connection and two per splice pipe; a
/// section accepts 2000 connections unless told otherwise, and the idle test needs more. With
/// `connections` (the `--connections` test) above that, maxconn follows it, and HAProxy sizes
/// its descriptor table and limit from it (the bench has raised the limit it inherits).
pub(crate) fn haproxy_config(splice: bool, threads: Option<u16>, connections: usize) -> String {
    let max_connections = proxy_max_connections(connections, 9000);
    let mut config = HaproxyConfig::tcp(
        u32::try_from(max_connections).unwrap_or(u32::MAX),
        Duration::from_secs(5),
        Duration::from_secs(600),
    );
    config.threads = threads;
    config.max_pipes = Some(512);
    config.max_connections_per_section = Some(config.max_connections);
    config.splice = splice;
    config.sections = all_ports()
        .into_iter()
        .map(|port| ListenSection {
            name: format!("p{port}"),
            bind: SocketAddr::from((ROUTER_CLIENT_SIDE, port)),
            server_name: "s".into(),
            server: SocketAddr::from((SERVER_ADDR, port)),
        })
        .collect();
    config.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn options(
        threads: Option<u16>,
        proxy_extra: &[&str],
        listener_extra: &[&str],
    ) -> BenchOptions {
        BenchOptions {
            midway_bin: PathBuf::from("midway"),
            streams: vec![1],
            seconds: 1,
            rounds: 1,
            idle_connections: 0,
            cps_seconds: 0,
            connections: 0,
            hold_seconds: 0,
            connections_in_flight: 1,
            cases: vec![Case::MidwayForward],
            work_dir: PathBuf::from("bench-results"),
            midway_proxy_extra: proxy_extra.iter().map(|s| s.to_string()).collect(),
            midway_listener_extra: listener_extra.iter().map(|s| s.to_string()).collect(),
            client_wmem_max: None,
            proxy_nice: -10,
            proxy_threads: threads,
            midway_profile: "lan".to_string(),
            end_congestion_control: None,
            router_congestion_control: None,
            router_quickack: false,
        }
    }

    #[test]
    fn midway_configs_pass_midways_own_validation_with_threads_and_extras() {
        for case in [Case::MidwayForward, Case::MidwayTransparent] {
            let opts = options(
                Some(1),
                &["socket_memory = \"off\""],
                &["buffer_bytes = 65536"],
            );
            let text = midway_config(case, "mwb0r0", &opts).unwrap();
            let config = midway_proxy::parse_config(&text, "bench")
                .unwrap_or_else(|e| panic!("{case:?}: {e}\n{text}"));
            assert_eq!(config.worker_threads, Some(1), "{case:?}");
            assert_eq!(config.socket_memory, midway_proxy::SocketMemorySetting::Off);
            assert!(
                config
                    .listeners
                    .iter()
                    .all(|l| format!("{:?}", l.relay).contains("buffer_bytes: 65536")),
                "{case:?}: {:?}",
                config.listeners
            );
            assert!(
                config
                    .listeners
                    .iter()
                    .all(|l| l.local_profile == "lan" && l.remote_profile == "lan"),
                "{case:?}: {:?}",
                config.listeners
            );
            let default = midway_proxy::parse_config(
                &midway_config(case, "mwb0r0", &options(None, &[], &[])).unwrap(),
                "bench",
            )
            .unwrap();
            assert_eq!(default.worker_threads, None, "{case:?}");
        }
    }

    #[test]
    fn many_connections_raise_both_proxies_limits() {
        let mut opts = options(None, &[], &[]);
        opts.connections = 100_000;
        for case in [Case::MidwayForward, Case::MidwayTransparent] {
            let config =
                midway_proxy::parse_config(&midway_config(case, "mwb0r0", &opts).unwrap(), "bench")
                    .unwrap();
            assert_eq!(config.max_connections, 102_100, "{case:?}");
            assert_eq!(config.max_connections_per_client, 102_100, "{case:?}");
        }
        let haproxy = haproxy_config(false, None, 100_000);
        // The process's and each section's.
        assert_eq!(haproxy.matches("maxconn 102100\n").count(), 2, "{haproxy}");
        assert!(haproxy.contains("listen p6103\n"), "{haproxy}");
        assert!(haproxy_config(false, None, 0).contains("maxconn 9000\n"));
    }

    #[test]
    fn haproxy_gets_the_same_thread_count() {
        let config = haproxy_config(true, Some(1), 0);
        assert!(config.starts_with("global\n    nbthread 1\n"), "{config}");
        assert!(config.contains("option splice-response"), "{config}");
        assert!(!haproxy_config(false, None, 0).contains("nbthread"));
    }
}
