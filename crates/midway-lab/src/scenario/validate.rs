//! Checks that need the whole file (host names a link refers to, cases an experiment lists,
//! which fields apply to which case kind), turning a [`ScenarioFile`] into a [`Scenario`]. Errors
//! carry the span of the offending field. The workload's checks are in `validate_workload`.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use toml::Spanned;

use super::validate_workload::validate_workload;
use super::{
    kind_name, BulkAmount, BulkWorkload, Case, CaseFile, CaseKind, ChainCase, Intercept, Link,
    MidwayCase, RelayKind, Scenario, ScenarioFile, SquidCase, UpstreamPersistence, WebClient,
    Workload, DEFAULT_SEED,
};

/// An error message and the span of the text it blames.
pub(super) type Blame = (Range<usize>, String);
/// Resolves a host reference (`what` names the referring field in the message).
pub(super) type HostCheck<'a> = &'a dyn Fn(&Spanned<String>, &str) -> Result<String, Blame>;

/// Cross-field checks of a parsed file; errors carry the span of the offending field.
pub(super) fn validate(file: &ScenarioFile) -> Result<Scenario, Blame> {
    let host_exists = |name: &Spanned<String>, what: &str| -> Result<String, Blame> {
        if file.hosts.contains_key(name.get_ref()) {
            Ok(name.get_ref().clone())
        } else {
            let known: Vec<_> = file.hosts.keys().cloned().collect();
            Err((
                name.span(),
                format!(
                    "{what} names host `{}`, which is not in [hosts] ({})",
                    name.get_ref(),
                    known.join(", ")
                ),
            ))
        }
    };
    let hosts: Vec<_> = file
        .hosts
        .iter()
        .map(|(name, host)| midway_labnet::HostSpec {
            name: name.clone(),
            stack: host.stack,
        })
        .collect();
    let mut links = Vec::new();
    for (name, link) in &file.links {
        let a = host_exists(&link.a, &format!("link `{name}`"))?;
        let b = host_exists(&link.b, &format!("link `{name}`"))?;
        if a == b {
            return Err((
                link.b.span(),
                format!("link `{name}` connects `{a}` to itself"),
            ));
        }
        links.push(Link {
            name: name.clone(),
            a,
            b,
            a_to_b: link.a_to_b.clone(),
            b_to_a: link.b_to_a.clone(),
        });
    }
    let spec = midway_labnet::TopologySpec {
        hosts: hosts.clone(),
        links: links
            .iter()
            .map(|l| midway_labnet::LinkSpec {
                a: l.a.clone(),
                b: l.b.clone(),
                a_to_b: Default::default(),
                b_to_a: Default::default(),
            })
            .collect(),
    };
    midway_labnet::validate(&spec).map_err(|e| (0..0, e.to_string()))?;

    let client = host_exists(&file.roles.client, "roles.client")?;
    let proxy = host_exists(&file.roles.proxy, "roles.proxy")?;
    let server = host_exists(&file.roles.server, "roles.server")?;
    let mut scenario = Scenario {
        name: file.name.clone(),
        description: file.description.clone(),
        source: file.source.clone(),
        seed: file.seed.unwrap_or(DEFAULT_SEED),
        hosts,
        links,
        client,
        proxy,
        server,
        workload: Workload::Bulk(BulkWorkload {
            amount: BulkAmount::Bytes(0),
            competing: None,
            client_recv_buffer: None,
            server_send_buffer: None,
            server_congestion_control: None,
            client_congestion_control: None,
            client_delayed_ack: true,
            warmup_bytes: None,
            connections: 1,
            port: 0,
            timeout: std::time::Duration::ZERO,
        }),
        cases: BTreeMap::new(),
    };
    if scenario.path(&scenario.client, &scenario.server).is_none() {
        return Err((
            file.roles.server.span(),
            format!(
                "no chain of links leads from client `{}` to server `{}`",
                scenario.client, scenario.server
            ),
        ));
    }
    scenario.workload = validate_workload(&file.workload, &host_exists)?;
    for (name, case) in &file.cases {
        let validated = validate_case(name, case, &scenario, &host_exists)?;
        scenario.cases.insert(name.clone(), validated);
    }
    Ok(scenario)
}

fn validate_case(
    name: &str,
    case: &CaseFile,
    scenario: &Scenario,
    host_exists: HostCheck<'_>,
) -> Result<Case, Blame> {
    let kind = *case.kind.get_ref();
    let path = scenario
        .path(&scenario.client, &scenario.server)
        .unwrap_or_default();
    let chain = if kind == CaseKind::Chain {
        Some(chain_case(name, case, scenario, &path, host_exists)?)
    } else {
        let chain_only = [
            ("hosts", case.hosts.as_ref().map(|h| h.span())),
            ("peer_profile", case.peer_profile.as_ref().map(|p| p.span())),
            ("transport", case.transport.as_ref().map(|t| t.span())),
            ("quic", case.quic.as_ref().map(|_| case.kind.span())),
        ];
        if let Some((field, Some(span))) = chain_only.iter().find(|(_, s)| s.is_some()) {
            return Err((
                span.clone(),
                format!(
                    "case `{name}` is `{}`; `{field}` applies only to `chain` cases",
                    kind_name(kind)
                ),
            ));
        }
        None
    };
    let host = match (&chain, &case.host) {
        // A chain's own host is its first midway (the one the client's connections reach).
        (Some(chain), _) => chain.hosts[0].clone(),
        (None, Some(host)) => host_exists(host, &format!("case `{name}`"))?,
        (None, None) => scenario.proxy.clone(),
    };
    if kind != CaseKind::Direct && !path.contains(&host) {
        let span = case.host.as_ref().map_or(case.kind.span(), |h| h.span());
        return Err((
            span,
            format!(
                "case `{name}` runs its proxy on `{host}`, which is not on the path client -> server ({})",
                path.join(" -> ")
            ),
        ));
    }
    if case.route_tuning.is_some() && scenario.link_between(&host, &scenario.client).is_none() {
        return Err((
            case.kind.span(),
            format!(
                "case `{name}`: route_tuning applies to `{host}`'s route toward the client, \
                 but `{host}` has no link to `{}`",
                scenario.client
            ),
        ));
    }
    let midway_only: [(&str, Option<Range<usize>>); 8] = [
        ("intercept", case.intercept.as_ref().map(|s| s.span())),
        ("relay", case.relay.as_ref().map(|s| s.span())),
        (
            "local_profile",
            case.local_profile.as_ref().map(|s| s.span()),
        ),
        (
            "remote_profile",
            case.remote_profile.as_ref().map(|s| s.span()),
        ),
        ("profiles", case.profiles.as_ref().map(|_| case.kind.span())),
        ("listener", case.listener.as_ref().map(|_| case.kind.span())),
        ("config", case.config.as_ref().map(|_| case.kind.span())),
        ("http", case.http.as_ref().map(|_| case.kind.span())),
    ];
    let squid_only: [(&str, Option<Range<usize>>); 2] = [
        ("cache", case.cache.as_ref().map(|s| s.span())),
        (
            "upstream_persistence",
            case.upstream_persistence.as_ref().map(|s| s.span()),
        ),
    ];
    let refuse = |field: &str, span: Range<usize>, owner: &str| -> Blame {
        (
            span,
            format!(
                "case `{name}` is `{}`; `{field}` applies only to `{owner}` cases",
                kind_name(kind)
            ),
        )
    };
    if kind != CaseKind::Squid {
        if let Some((field, Some(span))) = squid_only.iter().find(|(_, s)| s.is_some()) {
            return Err(refuse(field, span.clone(), "squid"));
        }
    }
    let midway = if kind == CaseKind::Midway {
        refuse_proxy_on_endpoint(name, case, &host, scenario)?;
        Some(midway_case(name, case)?)
    } else {
        // A chain has profiles of its own segments; the rest is the chain's to generate.
        let chain_fields = ["local_profile", "remote_profile", "profiles"];
        for (field, span) in midway_only {
            if kind == CaseKind::Chain && chain_fields.contains(&field) {
                continue;
            }
            if let Some(span) = span {
                return Err(refuse(field, span, "midway"));
            }
        }
        None
    };
    let squid = if kind == CaseKind::Squid {
        Some(squid_case(case))
    } else {
        None
    };
    if matches!(kind, CaseKind::Haproxy | CaseKind::Squid) {
        refuse_proxy_on_endpoint(name, case, &host, scenario)?;
    }
    Ok(Case {
        name: name.to_string(),
        kind,
        host,
        midway,
        squid,
        chain,
        route_tuning: case.route_tuning.clone(),
    })
}

/// The settings of a `chain` case: two or more distinct hosts, every one on the path from the
/// client to the server (neither of them), in the path's order.
fn chain_case(
    name: &str,
    case: &CaseFile,
    scenario: &Scenario,
    path: &[String],
    host_exists: HostCheck<'_>,
) -> Result<ChainCase, Blame> {
    if let Some(host) = &case.host {
        return Err((
            host.span(),
            format!("case `{name}` is a `chain`: name its midways' hosts in `hosts`, not `host`"),
        ));
    }
    let Some(hosts) = &case.hosts else {
        return Err((
            case.kind.span(),
            format!(
                "case `{name}` is a `chain` and needs `hosts`, its midways from the client side \
                 to the server side (e.g. hosts = [\"edge\", \"gateway\"])"
            ),
        ));
    };
    if hosts.get_ref().len() < 2 {
        return Err((
            hosts.span(),
            format!(
                "case `{name}`: `hosts` of a chain names at least 2 midways (one is a `midway` case)"
            ),
        ));
    }
    let mut names = Vec::with_capacity(hosts.get_ref().len());
    let mut previous_position = None;
    for host in hosts.get_ref() {
        let resolved = host_exists(host, &format!("case `{name}`.hosts"))?;
        if resolved == scenario.client || resolved == scenario.server {
            return Err((
                host.span(),
                format!(
                    "case `{name}`.hosts: a midway cannot run on the client or server host \
                     `{resolved}`"
                ),
            ));
        }
        let Some(position) = path.iter().position(|h| *h == resolved) else {
            return Err((
                host.span(),
                format!(
                    "case `{name}`.hosts: `{resolved}` is not on the path client -> server ({})",
                    path.join(" -> ")
                ),
            ));
        };
        if previous_position.is_some_and(|p| position <= p) {
            return Err((
                host.span(),
                format!(
                    "case `{name}`.hosts: `{resolved}` comes before the host named ahead of it \
                     on the path client -> server ({}); list the midways in that order, once each",
                    path.join(" -> ")
                ),
            ));
        }
        previous_position = Some(position);
        names.push(resolved);
    }
    let transport = case
        .transport
        .as_ref()
        .map_or(midway_config::TransportName::Tcp, |t| *t.get_ref());
    let quic = case.quic.clone().unwrap_or_default();
    if !quic.is_empty() {
        if transport != midway_config::TransportName::Quic {
            return Err((
                case.kind.span(),
                format!("case `{name}`: `quic` goes only with transport = \"quic\""),
            ));
        }
        // Checked here, with the message midway's config would give, not at the first run.
        quic.clone()
            .try_into::<midway_config::FileQuic>()
            .map_err(|e| (case.kind.span(), format!("case `{name}`: `quic`: {e}")))?;
    }
    Ok(ChainCase {
        hosts: names,
        peer_profile: case.peer_profile.as_ref().map(|p| p.get_ref().clone()),
        local_profile: case.local_profile.as_ref().map(|p| p.get_ref().clone()),
        remote_profile: case.remote_profile.as_ref().map(|p| p.get_ref().clone()),
        profiles: case.profiles.clone().unwrap_or_default(),
        transport,
        quic,
    })
}

/// A proxy case's host must be neither the client nor the server.
fn refuse_proxy_on_endpoint(
    name: &str,
    case: &CaseFile,
    host: &str,
    scenario: &Scenario,
) -> Result<(), Blame> {
    if host == scenario.client || host == scenario.server {
        return Err((
            case.kind.span(),
            format!("case `{name}`: the proxy cannot run on the client or server host"),
        ));
    }
    Ok(())
}

/// The settings of a `midway` case, checked against its intercept mode and the workload.
fn midway_case(name: &str, case: &CaseFile) -> Result<MidwayCase, Blame> {
    let intercept = case
        .intercept
        .as_ref()
        .map_or(Intercept::Forward, |s| *s.get_ref());
    if let Some(relay) = case.relay.as_ref().filter(|_| intercept == Intercept::Http) {
        return Err((
            relay.span(),
            format!(
                "case `{name}`: an HTTP proxy answers requests itself; `relay` applies to \
                 forward and transparent cases"
            ),
        ));
    }
    if case.http.is_some() && intercept != Intercept::Http {
        return Err((
            case.kind.span(),
            format!("case `{name}`: `http` applies only with intercept = \"http\""),
        ));
    }
    Ok(MidwayCase {
        intercept,
        relay: case
            .relay
            .as_ref()
            .map_or(RelayKind::Buffer, |s| *s.get_ref()),
        local_profile: case.local_profile.as_ref().map(|s| s.get_ref().clone()),
        remote_profile: case.remote_profile.as_ref().map(|s| s.get_ref().clone()),
        profiles: case.profiles.clone().unwrap_or_default(),
        listener: case.listener.clone().unwrap_or_default(),
        config: case.config.clone().unwrap_or_default(),
        http: case.http.clone().unwrap_or_default(),
    })
}

/// The settings of a `squid` case.
fn squid_case(case: &CaseFile) -> SquidCase {
    SquidCase {
        cache: case.cache.as_ref().is_none_or(|c| *c.get_ref()),
        upstream_persistence: case
            .upstream_persistence
            .as_ref()
            .map_or(UpstreamPersistence::Default, |u| *u.get_ref()),
    }
}

/// Why a point cannot run `case` with its workload, for combinations that depend on both (a case
/// may be fine for one experiment's workload and not for another's).
pub(crate) fn case_workload_conflict(scenario: &Scenario, case: &Case) -> Option<String> {
    let answers_http = match case.kind {
        CaseKind::Squid => true,
        CaseKind::Midway => case.midway.as_ref().map(|m| m.intercept) == Some(Intercept::Http),
        CaseKind::Direct | CaseKind::Haproxy | CaseKind::Chain => false,
    };
    if answers_http && matches!(scenario.workload, Workload::Bulk(_)) {
        return Some(format!(
            "case `{}` is an HTTP proxy, which needs HTTP requests; a bulk workload sends none \
             (use a web or command workload, or leave the case out of this experiment)",
            case.name
        ));
    }
    let chromium =
        matches!(&scenario.workload, Workload::Web(w) if w.client == WebClient::Chromium);
    let forward = match case.kind {
        CaseKind::Haproxy => true,
        CaseKind::Midway => case.midway.as_ref().map(|m| m.intercept) == Some(Intercept::Forward),
        CaseKind::Direct | CaseKind::Squid | CaseKind::Chain => false,
    };
    (chromium && forward).then(|| {
        format!(
            "case `{}` forwards the proxy's port to a fixed target, which Chromium (loading from \
             the origin's names and port) cannot use; give it intercept = \"transparent\" or \
             \"http\", or run it with client = \"loader\"",
            case.name
        )
    })
}

/// Checks of the `[[experiments]]` against the validated base scenario: unique names, at least
/// one repetition, known cases, sweeps with values and a matching axis.
pub(super) fn validate_experiments(file: &ScenarioFile, base: &Scenario) -> Result<(), Blame> {
    let mut names = BTreeSet::new();
    if file.experiments.is_empty() {
        return Err((
            (0..0),
            "the scenario has no [[experiments]]; add at least one".into(),
        ));
    }
    for experiment in &file.experiments {
        if !names.insert(experiment.name.get_ref().clone()) {
            return Err((
                experiment.name.span(),
                format!(
                    "experiment `{}` is defined twice",
                    experiment.name.get_ref()
                ),
            ));
        }
        if *experiment.repetitions.get_ref() == 0 {
            return Err((
                experiment.repetitions.span(),
                "repetitions must be at least 1".into(),
            ));
        }
        if let Some(max_jobs) = experiment.max_jobs.as_ref().filter(|m| *m.get_ref() == 0) {
            return Err((max_jobs.span(), "max_jobs must be at least 1".into()));
        }
        if experiment.cases.is_empty() {
            return Err((
                experiment.name.span(),
                format!("experiment `{}` lists no cases", experiment.name.get_ref()),
            ));
        }
        for case in &experiment.cases {
            if !base.cases.contains_key(case.get_ref()) {
                let known: Vec<_> = base.cases.keys().cloned().collect();
                return Err((
                    case.span(),
                    format!(
                        "unknown case `{}`; the [cases] of this file are: {}",
                        case.get_ref(),
                        known.join(", ")
                    ),
                ));
            }
        }
        if let Some(sweep) = &experiment.sweep {
            if sweep.values.get_ref().is_empty() {
                return Err((sweep.values.span(), "the sweep has no values".into()));
            }
            if let Some(axis) = &sweep.axis {
                if axis.get_ref().len() != sweep.values.get_ref().len() {
                    return Err((
                        axis.span(),
                        format!(
                            "`axis` has {} entries but `values` has {}",
                            axis.get_ref().len(),
                            sweep.values.get_ref().len()
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}
