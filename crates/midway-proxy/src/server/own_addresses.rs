//! This host's own interface addresses, for `denied_destinations = ["self", ...]`: a client of
//! a SOCKS5 or HTTP listener (or a peer header) must not reach services that listen only on the
//! gateway, whichever of its addresses it names. Read from the interfaces (getifaddrs) and kept
//! for a second, so a flood of connections costs one netlink dump a second, and an address that
//! appears (DHCP, failover) is refused within a second.

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::{self, DeniedDestinations};

/// How long one reading of the interfaces is used.
const REFRESH: Duration = Duration::from_secs(1);

static CACHE: Mutex<Option<(Instant, Vec<IpAddr>)>> = Mutex::new(None);

/// Whether `addr` is one of this host's (this network namespace's) interface addresses. When
/// the interfaces cannot be read, every address counts as the host's own: a refused connection
/// is better than a gateway service reached.
fn is_own_address(addr: IpAddr) -> bool {
    let addr = addr.to_canonical();
    let Ok(mut cache) = CACHE.lock() else {
        return true;
    };
    let now = Instant::now();
    let fresh = cache
        .as_ref()
        .is_some_and(|(read_at, _)| now.duration_since(*read_at) < REFRESH);
    if !fresh {
        match read_interface_addresses() {
            Ok(addresses) => *cache = Some((now, addresses)),
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the interface addresses; refusing");
                return true;
            }
        }
    }
    cache
        .as_ref()
        .is_some_and(|(_, addresses)| addresses.contains(&addr))
}

fn read_interface_addresses() -> nix::Result<Vec<IpAddr>> {
    let mut addresses = Vec::new();
    for interface in nix::ifaddrs::getifaddrs()? {
        let Some(address) = interface.address else {
            continue;
        };
        if let Some(v4) = address.as_sockaddr_in() {
            addresses.push(IpAddr::V4(v4.ip()));
        } else if let Some(v6) = address.as_sockaddr_in6() {
            addresses.push(IpAddr::V6(v6.ip()).to_canonical());
        }
    }
    Ok(addresses)
}

/// Whether a client-chosen target at `addr` is refused; `None` refuses nothing (a target the
/// operator configured, or an intercepted connection's original destination).
pub(super) fn is_denied(denied: Option<&DeniedDestinations>, addr: IpAddr) -> bool {
    denied.is_some_and(|denied| {
        config::denied(&denied.prefixes, addr) || (denied.own_addresses && is_own_address(addr))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_own_addresses_are_denied_when_asked() {
        let own = read_interface_addresses().unwrap();
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(own.contains(&loopback), "{own:?}");
        let with_self = DeniedDestinations {
            prefixes: Vec::new(),
            own_addresses: true,
        };
        let without = DeniedDestinations::default();
        for addr in &own {
            assert!(is_denied(Some(&with_self), *addr), "{addr}");
            assert!(!is_denied(Some(&without), *addr), "{addr}");
            assert!(!is_denied(None, *addr), "{addr}");
        }
        // TEST-NET-3 is never an interface address here.
        let elsewhere: IpAddr = "203.0.113.9".parse().unwrap();
        assert!(!is_denied(Some(&with_self), elsewhere));
    }
}
