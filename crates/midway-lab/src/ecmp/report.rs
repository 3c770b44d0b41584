//! The ECMP run's verdicts and its markdown report, from what the phases recorded: how each flow
//! ended (client), which gateways counted its packets in each direction (nftables on each
//! gateway), and from which address the server saw it (a gateway's: split there; the client's:
//! routed unsplit). Pure: unit-tested without a network.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use super::flows::{FlowResult, Outcome};
use super::net::{Counters, FlowCount};

/// What a phase is expected to show: the design's prediction, judged by [`claims`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    /// Both midways up: flows spread, each crosses one gateway both ways and is split there.
    Spread,
    /// Gateway `gw`'s midway is dead, the gateway still routes: its flows pass unsplit.
    FailOpen { gw: usize },
    /// Gateway `gw`'s midway starts again while flows pass it unsplit.
    MidwayReturns { gw: usize },
    /// Gateway `gw` dies (midway and links) while flows run.
    GatewayDies { gw: usize },
    /// Only gateway `alive` is there: new flows go through it, split.
    Survivor { alive: usize },
    /// Gateway `gw` comes back while flows run through the others.
    GatewayReturns {
        gw: usize,
        keeps_running_flows: bool,
    },
}

/// One phase as recorded.
#[derive(Clone, Debug)]
pub(crate) struct PhaseData {
    pub variant: String,
    pub name: String,
    pub what: String,
    pub expect: Expect,
    pub flows: Vec<FlowResult>,
    /// Per gateway, in the gateways' order.
    pub counters: Vec<Counters>,
    pub server_seen: BTreeMap<u32, IpAddr>,
    /// Each gateway's address toward the server (the source of its remote segments).
    pub gateway_addrs: Vec<IpAddr>,
    /// The clients' router's routes and nexthops at the end of the phase.
    pub routes: String,
    /// What the phase's event found.
    pub notes: Vec<String>,
}

/// Who the server saw a flow come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SplitBy {
    Gateway(usize),
    Unsplit,
    Unknown,
    NotSeen,
}

/// One flow with its evidence.
struct FlowView<'a> {
    flow: &'a FlowResult,
    counts: Vec<FlowCount>,
    split: SplitBy,
}

impl FlowView<'_> {
    /// The gateway that saw the flow's SYN, if exactly one did.
    fn syn_at(&self) -> Option<usize> {
        let at: Vec<usize> = (0..self.counts.len())
            .filter(|&g| self.counts[g].syn > 0)
            .collect();
        (at.len() == 1).then(|| at[0])
    }

    /// Gateways that counted any packet of the flow.
    fn touched(&self) -> Vec<usize> {
        (0..self.counts.len())
            .filter(|&g| self.counts[g].up > 0 || self.counts[g].down > 0)
            .collect()
    }

    /// Both directions crossed exactly one gateway.
    fn one_gateway_both_ways(&self) -> bool {
        let touched = self.touched();
        touched.len() == 1 && self.counts[touched[0]].up > 0 && self.counts[touched[0]].down > 0
    }

    fn complete(&self) -> bool {
        self.flow.outcome == Outcome::Complete
    }
}

fn views(phase: &PhaseData) -> Vec<FlowView<'_>> {
    phase
        .flows
        .iter()
        .map(|flow| {
            let counts = phase
                .counters
                .iter()
                .map(|c| c.get(&flow.client).copied().unwrap_or_default())
                .collect();
            let split = match phase.server_seen.get(&flow.id) {
                None => SplitBy::NotSeen,
                Some(ip) if *ip == IpAddr::V4(*flow.client.ip()) => SplitBy::Unsplit,
                Some(ip) => phase
                    .gateway_addrs
                    .iter()
                    .position(|g| g == ip)
                    .map_or(SplitBy::Unknown, SplitBy::Gateway),
            };
            FlowView {
                flow,
                counts,
                split,
            }
        })
        .collect()
}

/// A prediction and what was measured; `holds` is the verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    pub text: String,
    pub measured: String,
    pub holds: bool,
}

fn gw_name(g: usize) -> String {
    format!("gw{}", g + 1)
}

/// `count of total` with the condition, true when every one of at least one meets it.
fn all_of(views: &[&FlowView<'_>], text: String, test: impl Fn(&FlowView<'_>) -> bool) -> Claim {
    let meet = views.iter().filter(|v| test(v)).count();
    Claim {
        text,
        measured: format!("{meet} of {}", views.len()),
        holds: !views.is_empty() && meet == views.len(),
    }
}

fn none_of(views: &[&FlowView<'_>], text: String, test: impl Fn(&FlowView<'_>) -> bool) -> Claim {
    let meet = views.iter().filter(|v| test(v)).count();
    Claim {
        text,
        measured: format!("{meet} of {}", views.len()),
        holds: !views.is_empty() && meet == 0,
    }
}

/// The phase's claims (each can fail; one over an empty set of flows fails).
pub(crate) fn claims(phase: &PhaseData) -> Vec<Claim> {
    let views = views(phase);
    let all: Vec<&FlowView<'_>> = views.iter().collect();
    let gateways = phase.counters.len();
    let on = |g: usize| -> Vec<&FlowView<'_>> {
        views.iter().filter(|v| v.syn_at() == Some(g)).collect()
    };
    let not_on = |g: usize| -> Vec<&FlowView<'_>> {
        views
            .iter()
            .filter(|v| v.syn_at().is_some_and(|s| s != g))
            .collect()
    };
    let complete = |v: &FlowView<'_>| v.complete();
    let split_where_syn =
        |v: &FlowView<'_>| v.syn_at().is_some_and(|g| v.split == SplitBy::Gateway(g));
    let mut claims = Vec::new();
    match phase.expect {
        Expect::Spread => {
            claims.push(all_of(&all, "every flow completes".into(), complete));
            let shares: Vec<usize> = (0..gateways).map(|g| on(g).len()).collect();
            let quarter = views.len().div_ceil(4);
            claims.push(Claim {
                text: format!(
                    "flows spread: every gateway gets at least a quarter ({quarter}) of the SYNs"
                ),
                measured: shares
                    .iter()
                    .enumerate()
                    .map(|(g, n)| format!("{}: {n}", gw_name(g)))
                    .collect::<Vec<_>>()
                    .join(", "),
                holds: shares.iter().all(|&n| n >= quarter),
            });
            claims.push(all_of(
                &all,
                "both directions of every flow cross one gateway, the same".into(),
                |v| v.one_gateway_both_ways(),
            ));
            claims.push(all_of(
                &all,
                "every flow is split by the midway of the gateway that got its SYN (the server sees that gateway's address)".into(),
                split_where_syn,
            ));
        }
        Expect::FailOpen { gw } => {
            claims.push(all_of(&all, "every flow completes".into(), complete));
            claims.push(all_of(
                &on(gw),
                format!("flows hashed to {} (midway dead) pass unsplit: the server sees the client's address", gw_name(gw)),
                |v| v.split == SplitBy::Unsplit,
            ));
            claims.push(all_of(
                &not_on(gw),
                "flows hashed to the other gateways are split there".into(),
                split_where_syn,
            ));
            claims.push(all_of(
                &all,
                "both directions of every flow, split or not, cross one gateway".into(),
                |v| v.one_gateway_both_ways(),
            ));
        }
        Expect::MidwayReturns { gw } => {
            claims.push(none_of(
                &on(gw),
                format!(
                    "unsplit flows through {} do not survive its midway's start (its divert rule sends their next packet to the listener, which resets it)",
                    gw_name(gw)
                ),
                complete,
            ));
            claims.push(all_of(
                &not_on(gw),
                "flows through the other gateways complete".into(),
                complete,
            ));
        }
        Expect::GatewayDies { gw } => {
            claims.push(none_of(
                &on(gw),
                format!("the split flows of {} are lost with it", gw_name(gw)),
                complete,
            ));
            claims.push(all_of(
                &not_on(gw),
                "flows through the survivor complete, undisturbed".into(),
                complete,
            ));
        }
        Expect::Survivor { alive } => {
            claims.push(all_of(&all, "every new flow completes".into(), complete));
            claims.push(all_of(
                &all,
                format!(
                    "every new flow goes through {} and is split there",
                    gw_name(alive)
                ),
                |v| v.syn_at() == Some(alive) && v.split == SplitBy::Gateway(alive),
            ));
        }
        Expect::GatewayReturns {
            gw,
            keeps_running_flows,
        } => {
            let moved = |v: &FlowView<'_>| v.counts.get(gw).is_some_and(|c| c.up > 0);
            let stayers: Vec<&FlowView<'_>> =
                not_on(gw).into_iter().filter(|v| !moved(v)).collect();
            let movers: Vec<&FlowView<'_>> = not_on(gw).into_iter().filter(|v| moved(v)).collect();
            if keeps_running_flows {
                claims.push(none_of(
                    &not_on(gw),
                    format!(
                        "no running flow is moved to {} (its buckets are busy)",
                        gw_name(gw)
                    ),
                    moved,
                ));
                claims.push(all_of(
                    &all,
                    "every running flow completes".into(),
                    complete,
                ));
            } else {
                claims.push(Claim {
                    text: format!(
                        "some running flows are moved to {} when it returns",
                        gw_name(gw)
                    ),
                    measured: format!("{} of {}", movers.len(), not_on(gw).len()),
                    holds: !movers.is_empty(),
                });
                claims.push(none_of(
                    &movers,
                    format!(
                        "a moved flow does not survive: {}'s midway does not know it and resets it",
                        gw_name(gw)
                    ),
                    complete,
                ));
                claims.push(all_of(
                    &stayers,
                    "flows left in place complete".into(),
                    complete,
                ));
            }
        }
    }
    claims
}

fn split_label(split: SplitBy) -> String {
    match split {
        SplitBy::Gateway(g) => format!("{} (split)", gw_name(g)),
        SplitBy::Unsplit => "client (unsplit)".into(),
        SplitBy::Unknown => "another address".into(),
        SplitBy::NotSeen => "-".into(),
    }
}

/// The phase's section: what happened, its claims, every flow's evidence, the router's routes.
pub(crate) fn phase_markdown(phase: &PhaseData, claims: &[Claim]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "### {}: {}\n", phase.variant, phase.name);
    let _ = writeln!(md, "{}\n", phase.what);
    for note in &phase.notes {
        let _ = writeln!(md, "{note}\n");
    }
    let _ = writeln!(md, "| claim | measured | verdict |\n|---|---|---|");
    for claim in claims {
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            claim.text,
            claim.measured,
            if claim.holds { "holds" } else { "**fails**" }
        );
    }
    let gateways = phase.counters.len();
    let _ = write!(
        md,
        "\n<details><summary>{} flows</summary>\n\n| flow | client | SYN at |",
        phase.flows.len()
    );
    for g in 0..gateways {
        let _ = write!(md, " {} up / down |", gw_name(g));
    }
    let _ = writeln!(md, " server saw | outcome | bytes |");
    let _ = writeln!(md, "|{}", "---|".repeat(gateways + 6));
    for v in views(phase) {
        let syn = v.syn_at().map_or("-".to_owned(), gw_name);
        let _ = write!(md, "| {} | {} | {syn} |", v.flow.id, v.flow.client);
        for c in &v.counts {
            let _ = write!(md, " {} / {} |", c.up, c.down);
        }
        let _ = writeln!(
            md,
            " {} | {} | {} |",
            split_label(v.split),
            v.flow.outcome.label(),
            v.flow.bytes
        );
    }
    let _ = writeln!(
        md,
        "\nThe clients' router at the end of the phase:\n\n```\n{}```\n\n</details>\n",
        phase.routes
    );
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};

    fn flow(id: u32, port: u16, outcome: Outcome) -> FlowResult {
        FlowResult {
            id,
            client: SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 101), port),
            outcome,
            bytes: 0,
        }
    }

    /// Two flows: 1 through gw1 both ways (split there), 2 through gw2 both ways.
    fn phase(expect: Expect) -> PhaseData {
        let gw = [IpAddr::from([10, 0, 4, 1]), IpAddr::from([10, 0, 5, 1])];
        let count = |syn, up, down| FlowCount { syn, up, down };
        let c1: Counters = [(flow(1, 1000, Outcome::Complete).client, count(1, 9, 9))].into();
        let c2: Counters = [(flow(2, 2000, Outcome::Complete).client, count(1, 8, 8))].into();
        PhaseData {
            variant: "v".into(),
            name: "p".into(),
            what: "w".into(),
            expect,
            flows: vec![
                flow(1, 1000, Outcome::Complete),
                flow(2, 2000, Outcome::Complete),
            ],
            counters: vec![c1, c2],
            server_seen: [(1, gw[0]), (2, gw[1])].into(),
            gateway_addrs: gw.to_vec(),
            routes: String::new(),
            notes: Vec::new(),
        }
    }

    #[test]
    fn a_clean_spread_holds_and_a_flow_seen_at_both_gateways_fails_it() {
        let mut p = phase(Expect::Spread);
        assert!(claims(&p).iter().all(|c| c.holds), "{:?}", claims(&p));
        // Flow 1's replies come back through gw2: asymmetric.
        p.counters[1].insert(
            p.flows[0].client,
            FlowCount {
                syn: 0,
                up: 0,
                down: 3,
            },
        );
        let c = claims(&p);
        assert!(!c[2].holds);
        assert_eq!(c[2].measured, "1 of 2");
    }

    #[test]
    fn a_spread_over_one_gateway_fails() {
        let mut p = phase(Expect::Spread);
        p.counters[1].clear();
        p.counters[0].insert(
            p.flows[1].client,
            FlowCount {
                syn: 1,
                up: 8,
                down: 8,
            },
        );
        p.server_seen.insert(2, p.gateway_addrs[0]);
        assert!(!claims(&p)[1].holds);
    }

    #[test]
    fn a_dead_gateway_whose_flow_completed_fails_the_claim_and_empty_sets_fail_too() {
        let p = phase(Expect::GatewayDies { gw: 1 });
        let c = claims(&p);
        assert!(!c[0].holds, "flow 2 through gw2 completed");
        assert!(c[1].holds);
        let mut lost = p.clone();
        lost.flows[1].outcome = Outcome::Reset;
        assert!(claims(&lost).iter().all(|c| c.holds));
        let mut none = lost;
        none.counters[1].clear();
        assert!(!claims(&none)[0].holds, "no flow at gw2: nothing shown");
    }

    #[test]
    fn fail_open_wants_the_client_address_at_the_server() {
        let mut p = phase(Expect::FailOpen { gw: 1 });
        assert!(!claims(&p)[1].holds);
        p.server_seen.insert(2, IpAddr::from([10, 0, 1, 101]));
        assert!(claims(&p).iter().all(|c| c.holds));
    }

    #[test]
    fn a_return_judges_moved_flows_apart_from_the_others() {
        let mut p = phase(Expect::GatewayReturns {
            gw: 1,
            keeps_running_flows: false,
        });
        // Both flows started on gw1; flow 2 moved to gw2 and was reset.
        p.counters[0].insert(
            p.flows[1].client,
            FlowCount {
                syn: 1,
                up: 5,
                down: 5,
            },
        );
        p.counters[1].insert(
            p.flows[1].client,
            FlowCount {
                syn: 0,
                up: 1,
                down: 1,
            },
        );
        p.flows[1].outcome = Outcome::Reset;
        assert!(claims(&p).iter().all(|c| c.holds), "{:?}", claims(&p));
        p.expect = Expect::GatewayReturns {
            gw: 1,
            keeps_running_flows: true,
        };
        let c = claims(&p);
        assert!(!c[0].holds && !c[1].holds);
    }
}
