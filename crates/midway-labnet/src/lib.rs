//! midway-labnet: the lab's networks.
//!
//! A [`Topology`] is a set of hosts, each a Linux network namespace, joined by point-to-point links
//! that midway's own emulator ([`midway_linkemu`]) shapes per direction (delay, rate, queue, loss).
//! Wiring of one link a—b:
//!
//! ```text
//!  ns "mw<tag>-a"            ns "mw<tag>.l<n>" (no IP, no IPv6)          ns "mw<tag>-b"
//!  [to-b 10.0.n.1] ==veth== [pa] <- emulator thread pair -> [pb] ==veth== [to-a 10.0.n.2]
//! ```
//!
//! Every link has its own 10.0.n.0/24 and fd00:0:n::/64 (n = link number from 1); routes follow
//! shortest paths; hosts with more than one link forward. Offloads are off on all four veth ends
//! so each packet is one frame. Hosts get a TCP [`StackProfile`] (`modern` or `legacy`).
//!
//! Nothing must outlive a run: `Drop` of a topology tears it down, [`install_cleanup_on_signal`]
//! covers Ctrl-C and SIGTERM, and [`clean_leftovers`] removes what a killed run left (owner pids
//! are recorded per tag in `/run/midway-lab/<tag>.pid`).
//!
//! Programs spawned in a host ([`Topology::spawn_with`]) may get a hosts file of their own as
//! `/etc/hosts` ([`SpawnOptions`], [`hosts_file_text`]), so lab names resolve without a resolver.
//!
//! [`Topology::build_with`] and [`LinkMode::Plain`] make the same hosts, addresses and routes with
//! each link a plain veth pair from host to host and no emulator: the proxy benchmark's network.
//!
//! [`selftest`] checks the emulated links against their configuration with real traffic.
#![forbid(unsafe_code)]

mod cleanup;
mod error;
mod hosts;
mod probe;
pub mod selftest;
mod spec;
mod stack;
mod sys;
mod topology;

pub use cleanup::{clean_leftovers, install_cleanup_on_signal, require_root, PID_DIR};
pub use error::LabNetError;
pub use hosts::{hosts_file_text, is_valid_host_name, BadHostName};
pub use midway_linkemu::{
    DirectionConfig, DirectionStats, LossModel, Outage, OutageSchedule, PeriodicOutage, QueueLimit,
    UdpAction, UdpImpairment,
};
pub use spec::{
    host_netns_name, link_netns_name, validate, HostSpec, LinkSpec, StackProfile, TopologySpec,
    MAX_TAG,
};
pub use topology::{fresh_tag, tag_prefix_of_process, HostChild, LinkMode, SpawnOptions, Topology};
