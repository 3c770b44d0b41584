//! Access control by client prefix and the per-client connection limit.
//!
//! The total limit is a tokio `Semaphore` held by the accept loop (a permit before `accept`);
//! this module holds the pieces that need the client's address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ipnet::IpNet;

/// Allowed client prefixes. An empty list allows nobody (config validation refuses it anyway).
#[derive(Debug, Clone)]
pub(crate) struct AccessList {
    prefixes: Vec<IpNet>,
}

impl AccessList {
    pub(crate) fn new(prefixes: Vec<IpNet>) -> AccessList {
        AccessList { prefixes }
    }

    /// True when `client` is inside an allowed prefix. IPv4-mapped IPv6 addresses
    /// (`::ffff:a.b.c.d`, seen on dual-stack sockets) are matched as the IPv4 address.
    pub(crate) fn allows(&self, client: IpAddr) -> bool {
        let client = client.to_canonical();
        self.prefixes.iter().any(|p| p.contains(&client))
    }
}

/// Counts connections per client address and hands out permits up to a cap.
#[derive(Debug)]
pub(crate) struct ClientLimits {
    /// Changed by a reload; connections holding more than a lowered limit keep their slots.
    per_client: AtomicUsize,
    counts: Mutex<HashMap<IpAddr, usize>>,
}

/// Held for the life of one connection; returns its slot on drop.
#[derive(Debug)]
pub(crate) struct ClientPermit {
    limits: Arc<ClientLimits>,
    client: IpAddr,
}

impl ClientLimits {
    pub(crate) fn new(per_client: usize) -> Arc<ClientLimits> {
        Arc::new(ClientLimits {
            per_client: AtomicUsize::new(per_client),
            counts: Mutex::new(HashMap::new()),
        })
    }

    /// The limit for connections accepted from now on.
    pub(crate) fn set_limit(&self, per_client: usize) {
        self.per_client.store(per_client, Ordering::Relaxed);
    }

    /// A permit, or `None` when `client` already holds `per_client` connections. An IPv4-mapped
    /// IPv6 address counts as the IPv4 address it carries.
    pub(crate) fn try_acquire(self: &Arc<Self>, client: IpAddr) -> Option<ClientPermit> {
        let client = client.to_canonical();
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let count = counts.entry(client).or_insert(0);
        if *count >= self.per_client.load(Ordering::Relaxed) {
            return None;
        }
        *count += 1;
        Some(ClientPermit {
            limits: self.clone(),
            client,
        })
    }

    /// Connections `client` holds now.
    #[cfg(test)]
    pub(crate) fn count(&self, client: IpAddr) -> usize {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(&client.to_canonical()).copied().unwrap_or(0)
    }

    /// Distinct clients holding a connection (the map never keeps zero entries).
    #[cfg(test)]
    pub(crate) fn clients(&self) -> usize {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Drop for ClientPermit {
    fn drop(&mut self) {
        let mut counts = self.limits.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = counts.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_mapped_addresses() {
        let acl = AccessList::new(vec![
            "10.1.0.0/24".parse().unwrap(),
            "fd00:1::/64".parse().unwrap(),
        ]);
        assert!(acl.allows("10.1.0.9".parse().unwrap()));
        assert!(acl.allows("::ffff:10.1.0.9".parse().unwrap()));
        assert!(acl.allows("fd00:1::5".parse().unwrap()));
        assert!(!acl.allows("10.1.1.9".parse().unwrap()));
        assert!(!acl.allows("fd00:2::5".parse().unwrap()));
        assert!(!AccessList::new(vec![]).allows("10.1.0.9".parse().unwrap()));
    }

    #[test]
    fn per_client_cap_and_release() {
        let limits = ClientLimits::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let p1 = limits.try_acquire(a).unwrap();
        let p2 = limits.try_acquire(a).unwrap();
        assert!(limits.try_acquire(a).is_none());
        let q = limits.try_acquire(b).unwrap();
        assert_eq!(limits.count(a), 2);
        drop(p1);
        assert_eq!(limits.count(a), 1);
        let p3 = limits.try_acquire(a).unwrap();
        drop((p2, p3, q));
        assert_eq!(limits.clients(), 0);
    }
}
