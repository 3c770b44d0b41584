//! How many connections the open-file limit lets this midway serve, and the check that
//! `max_connections` fits: at start (after raising the limit as far as the host allows) and at
//! every reload. A midway that accepted more connections than it has descriptors for would fail
//! accepts and connects at random under load; refusing the configuration says so up front.

use midway_relay::RelayModel;
use midway_sys::fd_limit::OpenFileLimit;

use super::error::ProxyError;
use crate::config::RuntimeConfig;

/// Descriptors the process holds whatever it serves: the runtime (epoll, eventfds, signal
/// pipe), standard streams, logs, the metrics and control endpoints, the upgrade socket, BPF
/// maps and links, nftables and netlink sockets, with room to spare.
const FIXED_RESERVE: u64 = 256;

/// Descriptors of one split connection, and those held apart from connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DescriptorBudget {
    /// Most descriptors one connection may hold at once.
    pub(crate) per_connection: u64,
    /// Descriptors held apart from the connections: see [`DescriptorBudget::of`].
    pub(crate) reserved: u64,
}

impl DescriptorBudget {
    /// The budget of `config`. A connection holds its two sockets; a spool relay may also hold
    /// a spool file per direction; an HTTP connection may leave one idle upstream in the pool
    /// when it ends. Apart from connections: [`FIXED_RESERVE`], one per listener, the splice
    /// pipes (two each, lent only while bytes move but counted at their most), the warm
    /// connections to peers, and one per QUIC tunnel.
    pub(crate) fn of(config: &RuntimeConfig) -> DescriptorBudget {
        let most_per_listener = config.listeners.iter().map(|listener| {
            if listener.http.is_some() {
                3
            } else if matches!(listener.relay, RelayModel::Spool(_)) {
                4
            } else {
                2
            }
        });
        let per_connection = most_per_listener.max().unwrap_or(2);
        let peers: u64 = config
            .peers
            .iter()
            .map(|peer| peer.warm_connections as u64 + 1)
            .sum();
        DescriptorBudget {
            per_connection,
            reserved: FIXED_RESERVE
                + config.listeners.len() as u64
                + 2 * config.max_pipes as u64
                + peers,
        }
    }

    /// Connections a process with `limit` open files can serve.
    pub(crate) fn connections_within(&self, limit: u64) -> u64 {
        limit.saturating_sub(self.reserved) / self.per_connection
    }

    /// Open files `max_connections` connections need.
    pub(crate) fn needed(&self, max_connections: usize) -> u64 {
        self.reserved + self.per_connection * max_connections as u64
    }
}

/// Raises the open-file limit as far as the host allows, says how many connections it allows,
/// and refuses a `max_connections` beyond that.
pub(super) fn raise_and_check(config: &RuntimeConfig) -> Result<OpenFileLimit, ProxyError> {
    let limit = midway_sys::fd_limit::raise_open_file_limit().map_err(ProxyError::OpenFileLimit)?;
    let budget = DescriptorBudget::of(config);
    tracing::info!(
        limit = limit.soft,
        raised_from = limit.before,
        connections = budget.connections_within(limit.soft),
        per_connection = budget.per_connection,
        reserved = budget.reserved,
        "open-file limit: room for this many connections"
    );
    check(config, &limit, &budget)?;
    Ok(limit)
}

/// At a reload: the new configuration against the limit this process has (raised at start).
pub(super) fn check_current(config: &RuntimeConfig) -> Result<(), ProxyError> {
    let limit = midway_sys::fd_limit::open_file_limit().map_err(ProxyError::OpenFileLimit)?;
    check(config, &limit, &DescriptorBudget::of(config))
}

fn check(
    config: &RuntimeConfig,
    limit: &OpenFileLimit,
    budget: &DescriptorBudget,
) -> Result<(), ProxyError> {
    let allowed = budget.connections_within(limit.soft);
    if config.max_connections as u64 > allowed {
        return Err(ProxyError::TooFewOpenFiles {
            max_connections: config.max_connections,
            needed: budget.needed(config.max_connections),
            limit: limit.soft,
            hard: limit.hard,
            allowed,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_config;

    fn config(extra_proxy: &str, listeners: &str) -> RuntimeConfig {
        parse_config(
            &format!(
                "[proxy]\nallowed_clients = [\"10.0.0.0/8\"]\nmax_pipes = 100\n{extra_proxy}\n\
                 [spool]\ndir = \"/tmp/midway-test-spool\"\n{listeners}"
            ),
            "test",
        )
        .unwrap()
    }

    const FORWARD: &str = "[[listeners]]\nname = \"fwd\"\nmode = \"forward\"\n\
                           listen = \"127.0.0.1:9000\"\ntarget = \"10.1.0.1:80\"\n";

    #[test]
    fn a_buffer_relay_connection_holds_two_descriptors() {
        let budget = DescriptorBudget::of(&config("", FORWARD));
        assert_eq!(budget.per_connection, 2);
        // The fixed reserve, one listener, 100 pipes of two.
        assert_eq!(budget.reserved, FIXED_RESERVE + 1 + 200);
        assert_eq!(
            budget.connections_within(budget.reserved + 2 * 1000 + 1),
            1000
        );
        assert_eq!(budget.connections_within(10), 0);
        assert_eq!(budget.needed(1000), budget.reserved + 2000);
    }

    #[test]
    fn spool_and_http_listeners_hold_more() {
        let spool = format!("{FORWARD}relay = \"spool\"\n");
        assert_eq!(DescriptorBudget::of(&config("", &spool)).per_connection, 4);
        let http = "[[listeners]]\nname = \"web\"\nmode = \"http\"\nlisten = \"127.0.0.1:3128\"\n";
        assert_eq!(
            DescriptorBudget::of(&config("", &format!("{FORWARD}{http}"))).per_connection,
            3
        );
    }

    #[test]
    fn max_connections_beyond_the_limit_is_refused_with_the_numbers() {
        let config = config("max_connections = 100000", FORWARD);
        let budget = DescriptorBudget::of(&config);
        let limit = OpenFileLimit {
            before: 1024,
            soft: 20_000,
            hard: 20_000,
        };
        let err = check(&config, &limit, &budget).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("100000"), "{message}");
        assert!(message.contains("20000"), "{message}");
        let enough = OpenFileLimit {
            soft: budget.needed(100_000),
            ..limit
        };
        check(&config, &enough, &budget).unwrap();
    }
}
