//! nftables TPROXY rules and the policy routing transparent listeners need.
//!
//! For each table named by a transparent listener midway writes one `inet` table with a
//! `prerouting` chain at mangle priority:
//!
//! - `tcp flags & (syn | ack) != syn socket transparent 1 meta mark set M accept`: packets of
//!   sockets midway already owns (the accepted side of an intercepted connection, and with
//!   spoofing the return traffic of the remote segment, whose destination is the client's
//!   address) are marked for local delivery. No port or interface filter: spoofed return
//!   traffic arrives from the server side. A new connection's SYN is left to the listener rules:
//!   when a client reuses the 4-tuple of a connection midway closed first, the socket lookup
//!   finds midway's TIME_WAIT socket, which is transparent too; delivered to it, the SYN finds
//!   no listener on the server's address and is dropped, and the client waits a second to send
//!   it again (15 % of the SYNs in the connection-rate benchmark, a third of the forward mode's
//!   rate). The `tproxy` statement instead hands such a SYN to the listener.
//! - per listener: `[iifname {..}] meta l4proto tcp [tcp dport {..}] tproxy ip|ip6 to ADDR:PORT
//!   meta mark set M accept`: new connections are diverted to the listener.
//!
//! Routing the operator provides: clients must reach the servers *through* this host (it is
//! their gateway, or a policy route sends their traffic here), and with `spoof_client_address`
//! the servers' replies to client addresses must come back through this host too (true when it
//! is the only path between the two networks; otherwise route the client prefixes back to it on
//! the server side). IP forwarding is not needed for intercepted ports, only for everything else.
//!
//! The mark `M` leads to local delivery through the equivalent of `ip rule add fwmark M lookup T`
//! and `ip route add local 0.0.0.0/0 dev lo table T` (and the IPv6 twins), set over rtnetlink
//! ([`midway_sys::netlink`]: no iproute2 on the gateway). midway removes exactly what it added:
//! the table by name, and the rules / routes whose `add` succeeded.
//!
//! After a crash (`kill -9`, a panic with abort, power loss of a container) nothing ran the
//! removal, so every step that installs something is first written to an install record
//! (`midway-installed.toml` in the spool directory, with the installer's pid and process start
//! time). The next start finds the record of a process that is gone, removes exactly what it
//! lists, and only then installs its own: no second fwmark rule per crash, no routes mistaken
//! for someone else's, and never anything midway did not add. A record whose process still
//! runs belongs to another live midway sharing the spool directory: a start that would install
//! interception refuses, naming it. While midway is dead, intercepted ports fail open: with no
//! TPROXY listener, nothing diverts new connections, which are routed to the server unsplit.

mod install;
mod routes;
mod ruleset;

use std::path::PathBuf;

use midway_sys::command::{CommandError, Program};
use midway_sys::netlink::NetlinkError;

pub(crate) use install::Installed;
pub use ruleset::nft_ruleset;
pub(crate) use ruleset::{plan, OVERLOAD_SET};

/// Why installing or removing interception failed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// `nft` could not be run (not installed, no CAP_NET_ADMIN) or refused the change.
    #[error(transparent)]
    Nft(#[from] CommandError),
    /// A fwmark rule or local route could not be added or removed.
    #[error(transparent)]
    PolicyRouting(#[from] NetlinkError),
    #[error("install record {path}: {message}")]
    Record { path: PathBuf, message: String },
    #[error("interception is installed by another running midway (pid {pid}, record {path}); give each midway its own spool directory")]
    OwnedByRunning { pid: u32, path: PathBuf },
}

/// Creates (or replaces) one table from its `nft -f` script, in one transaction: the rules
/// never show half a table.
///
/// The script goes to the `nft` program rather than through the `nftables` crate: that crate
/// runs the same `nft` binary underneath (so no program would go away), and it would bring a
/// second form of the ruleset (JSON) beside the text `midway proxy --print-nft` shows operators.
fn apply_table(script: &str) -> Result<(), NftError> {
    Program::new("nft").args(["-f", "-"]).stdin(script).run()?;
    Ok(())
}

/// Deletes one of midway's tables.
fn delete_table(table: &str) -> Result<(), NftError> {
    Program::new("nft")
        .args(["delete", "table", "inet", table])
        .run()?;
    Ok(())
}

/// Makes new connections of `tables` bypass midway (`bypass`) or be diverted again, through
/// the overload set the rules read.
pub(crate) fn set_overload_bypass(tables: &[String], bypass: bool) -> Result<(), NftError> {
    let verb = if bypass { "add" } else { "delete" };
    for table in tables {
        Program::new("nft")
            .args([verb, "element", "inet", table, OVERLOAD_SET, "{ tcp }"])
            .run()?;
    }
    Ok(())
}
