//! The campaign's tally: how each end's reading ended, what the two ends' results make of a
//! transfer ([`classify`], pure), and the report with its table.

use std::collections::HashMap;
use std::time::Duration;

use super::plan::{ClientBehaviour, Plan, Route, PATHS, PEER_PATHS};

/// A transfer that took this long is listed in the report (it held a client for that long;
/// one that waited out the read limit took at least 20 s).
const SLOW: Duration = Duration::from_secs(15);

/// How one end's part of a transfer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndResult {
    /// Everything expected arrived, intact, then the peer's FIN.
    Complete,
    /// The connection broke (a reset, an error, a timeout) before that.
    Broken,
    /// This end reset the connection on purpose.
    ResetOnPurpose,
    /// A FIN came before everything expected had arrived.
    CleanButShort,
    /// Bytes arrived that were not those sent.
    Corrupted,
    /// The connection never got anywhere (refused, or reset before the header got across).
    NotConnected,
}

/// A transfer's outcome from both ends' results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Both ends complete.
    Intact,
    /// Ended by a reset (on purpose or not), seen as a break, with no end fooled.
    Reset,
    /// Never connected (midway down or refusing): the client knew at once.
    Refused,
    /// An end saw a clean end of a short stream, or wrong bytes: the number that must be 0.
    TruncatedOrCorrupted,
}

/// Combines the client's result with the server's (`None`: the server never saw the transfer's
/// header).
pub fn classify(client: EndResult, server: Option<EndResult>) -> Outcome {
    use EndResult::*;
    let fooled = |r: EndResult| matches!(r, CleanButShort | Corrupted);
    if fooled(client) || server.is_some_and(fooled) {
        return Outcome::TruncatedOrCorrupted;
    }
    match (client, server) {
        (Complete, Some(Complete)) => Outcome::Intact,
        (NotConnected, None) => Outcome::Refused,
        // The client finished although the server never saw it: impossible unless bytes came
        // from somewhere else.
        (Complete, None) => Outcome::TruncatedOrCorrupted,
        _ => Outcome::Reset,
    }
}

/// What the campaign found.
#[derive(Debug, Clone, Default)]
pub struct CampaignReport {
    /// Transfers run.
    pub transfers: u64,
    /// Both ends complete and byte-identical.
    pub intact: u64,
    /// Ended by a reset, seen as a break by the ends that had not finished.
    pub reset: u64,
    /// Refused at connect (midway down, between a kill and its restart).
    pub refused: u64,
    /// Ended cleanly but truncated, or corrupted: must be 0.
    pub truncated_or_corrupted: u64,
    /// Per path (intercept mode and relay, or edge, gateway and transport): transfers, intact,
    /// reset, refused, bad.
    pub per_path: Vec<(String, [u64; 5])>,
    /// SIGHUP reloads sent to the router midway (every path's first midway).
    pub reloads: u64,
    /// Binary upgrades (`--take-over`) of the router midway.
    pub upgrades: u64,
    /// `kill -9` and restart of the router midway.
    pub kills: u64,
    /// Outages of the client-side link.
    pub outages: u64,
    /// SIGHUP reloads sent to the gateway midway (the two-midway paths' second).
    pub gateway_reloads: u64,
    /// Binary upgrades of the gateway midway.
    pub gateway_upgrades: u64,
    /// `kill -9` and restart of the gateway midway.
    pub gateway_kills: u64,
    /// Outages of the peer segment (edge to gateway).
    pub peer_outages: u64,
    /// Bytes compared with what was sent, both directions.
    pub bytes_checked: u64,
    /// How long the campaign took.
    pub seconds: f64,
    /// After the last transfer: midway's open descriptors, resident memory, spool files.
    pub fds_after: usize,
    /// Resident memory of midway after the last transfer.
    pub rss_kib_after: u64,
    /// Spool files left in the spool directory after the last transfer.
    pub spool_files_after: usize,
    /// The gateway midway's open descriptors after the last transfer.
    pub gateway_fds_after: usize,
    /// The gateway midway's resident memory after the last transfer.
    pub gateway_rss_kib_after: u64,
    /// Where the midways' logs were kept (a campaign with bad transfers keeps them).
    pub logs_kept: Option<String>,
    /// Examples of bad transfers (path, sizes, results), at most 10.
    pub bad_examples: Vec<String>,
    /// Transfers that took 15 s or more (a stall is 3 s, a slow reader's few seconds at most).
    pub slow_transfers: u64,
    /// The slowest of them (path, sizes, results, duration), at most 10.
    pub slowest: Vec<String>,
}

impl CampaignReport {
    /// A plain-text table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "midway fault campaign: {} transfers in {:.0} s, {:.2} GB checked",
            self.transfers,
            self.seconds,
            self.bytes_checked as f64 / 1e9
        );
        let _ = writeln!(
            out,
            "process faults: {} reloads, {} binary upgrades, {} kill -9 restarts; {} link outages",
            self.reloads, self.upgrades, self.kills, self.outages
        );
        let _ = writeln!(
            out,
            "gateway midway (edge+gateway paths): {} reloads, {} binary upgrades, {} kill -9 restarts; {} peer-link outages",
            self.gateway_reloads, self.gateway_upgrades, self.gateway_kills, self.peer_outages
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "| path | transfers | intact | ended by a reset | refused at connect | clean but truncated or corrupted |");
        let _ = writeln!(out, "|---|---|---|---|---|---|");
        for (path, [n, intact, reset, refused, bad]) in &self.per_path {
            let _ = writeln!(
                out,
                "| {path} | {n} | {intact} | {reset} | {refused} | {bad} |"
            );
        }
        let _ = writeln!(
            out,
            "| **all** | {} | {} | {} | {} | **{}** |",
            self.transfers, self.intact, self.reset, self.refused, self.truncated_or_corrupted
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "after: midway holds {} descriptors, {} KiB resident, {} spool files",
            self.fds_after, self.rss_kib_after, self.spool_files_after
        );
        let _ = writeln!(
            out,
            "after: the gateway midway holds {} descriptors, {} KiB resident",
            self.gateway_fds_after, self.gateway_rss_kib_after
        );
        for example in &self.bad_examples {
            let _ = writeln!(out, "bad: {example}");
        }
        if self.slow_transfers > 0 {
            let _ = writeln!(
                out,
                "{} transfers took {} s or more; the slowest:",
                self.slow_transfers,
                SLOW.as_secs()
            );
        }
        for example in &self.slowest {
            let _ = writeln!(out, "slow: {example}");
        }
        if let Some(logs) = &self.logs_kept {
            let _ = writeln!(out, "midway's logs kept in {logs}");
        }
        out
    }
}

/// A finished transfer as its client saw it.
#[derive(Debug, Clone, Copy)]
pub(super) struct ClientRecord {
    pub(super) id: u64,
    pub(super) path: Route,
    pub(super) plan: Plan,
    pub(super) behaviour: ClientBehaviour,
    pub(super) result: EndResult,
    /// The client's port (to find the transfer in midway's logs), if it connected.
    pub(super) port: Option<u16>,
    /// From the connect to the end.
    pub(super) took: Duration,
}

impl ClientRecord {
    /// The transfer in one line: id, path, client port, sizes, resets, behaviour, duration.
    fn describe(&self) -> String {
        format!(
            "#{} {} (client port {:?}): up {} down {} server reset at {:?}, client {:?}, {:.1} s",
            self.id,
            self.path.label(),
            self.port,
            self.plan.up,
            self.plan.down,
            (self.plan.server_reset_at != u64::MAX).then_some(self.plan.server_reset_at),
            self.behaviour,
            self.took.as_secs_f64(),
        )
    }
}

/// Fills `report`'s outcome counts, per-path table and bad examples from the clients' records
/// and the servers' (by transfer id).
pub(super) fn count_outcomes(
    report: &mut CampaignReport,
    client_results: Vec<ClientRecord>,
    server_results: Vec<(u64, EndResult)>,
) {
    let by_id: HashMap<u64, EndResult> = server_results.into_iter().collect();
    let mut per_path: Vec<(String, [u64; 5])> = PATHS
        .iter()
        .chain(&PEER_PATHS)
        .map(|p| (p.label(), [0; 5]))
        .collect();
    let mut slowest: Vec<(Duration, String)> = Vec::new();
    for record in client_results {
        let ClientRecord {
            id,
            path,
            result: client,
            ..
        } = record;
        let server = by_id.get(&id).copied();
        let outcome = classify(client, server);
        match outcome {
            Outcome::Intact => report.intact += 1,
            Outcome::Reset => report.reset += 1,
            Outcome::Refused => report.refused += 1,
            Outcome::TruncatedOrCorrupted => {
                report.truncated_or_corrupted += 1;
                if report.bad_examples.len() < 10 {
                    report.bad_examples.push(format!(
                        "{}: client {client:?}, server {server:?}",
                        record.describe()
                    ));
                }
            }
        }
        if let Some((_, counts)) = per_path
            .iter_mut()
            .find(|(label, _)| *label == path.label())
        {
            tally(counts, outcome);
        }
        if record.took >= SLOW {
            slowest.push((
                record.took,
                format!(
                    "{}: client {client:?}, server {server:?}",
                    record.describe()
                ),
            ));
        }
    }
    slowest.sort_by_key(|s| std::cmp::Reverse(s.0));
    report.slow_transfers = slowest.len() as u64;
    report.slowest = slowest.into_iter().take(10).map(|(_, s)| s).collect();
    report.per_path = per_path;
}

/// Counts of one path's outcomes: transfers, intact, reset, refused, bad.
fn tally(counts: &mut [u64; 5], outcome: Outcome) {
    counts[0] += 1;
    let index = match outcome {
        Outcome::Intact => 1,
        Outcome::Reset => 2,
        Outcome::Refused => 3,
        Outcome::TruncatedOrCorrupted => 4,
    };
    counts[index] += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_fooled_end_counts_as_truncated() {
        use EndResult::*;
        assert_eq!(classify(Complete, Some(Complete)), Outcome::Intact);
        assert_eq!(classify(Broken, Some(ResetOnPurpose)), Outcome::Reset);
        assert_eq!(classify(ResetOnPurpose, Some(Complete)), Outcome::Reset);
        assert_eq!(classify(Broken, None), Outcome::Reset);
        assert_eq!(classify(NotConnected, None), Outcome::Refused);
        assert_eq!(
            classify(CleanButShort, Some(Complete)),
            Outcome::TruncatedOrCorrupted
        );
        assert_eq!(
            classify(Complete, Some(CleanButShort)),
            Outcome::TruncatedOrCorrupted
        );
        assert_eq!(
            classify(Corrupted, Some(Broken)),
            Outcome::TruncatedOrCorrupted
        );
        assert_eq!(classify(Complete, None), Outcome::TruncatedOrCorrupted);
    }
}
