//! Checks of the `[workload]` table: which fields apply to which kind, defaults, and bounds.

use std::collections::BTreeSet;
use std::ops::Range;

use super::validate::{Blame, HostCheck};
use toml::Spanned;

use super::{
    BulkAmount, BulkWorkload, CommandFile, CommandWorkload, CompetingFile, CompetingFlow,
    HostCommand, HttpVersion, WebCache, WebClient, WebConnectionLimit, WebRequestHeaders,
    WebWorkload, Workload, WorkloadClientFile, WorkloadFile, WorkloadKind,
    DEFAULT_CACHE_MAX_AGE_SECS, DEFAULT_COMPETING_CONGESTION_CONTROL, DEFAULT_CONNECTIONS_PER_HOST,
    DEFAULT_KEEPALIVE_TIMEOUT_SECS, DEFAULT_SERVER_PORT, DEFAULT_WEB_HOST, DEFAULT_WEB_PORT,
    DEFAULT_WORKLOAD_TIMEOUT_SECS, MAX_BULK_CONNECTIONS, MAX_CONNECTIONS_PER_HOST, MAX_WEB_HOSTS,
    MAX_WEB_OBJECTS, MAX_WEB_PAGES,
};

/// The validated `[workload]`; `host_exists` resolves the hosts of a command workload.
pub(super) fn validate_workload(
    workload: &WorkloadFile,
    host_exists: HostCheck<'_>,
) -> Result<Workload, Blame> {
    let kind_span = workload.kind.span();
    let kind = *workload.kind.get_ref();
    let timeout = workload
        .timeout
        .map(|t| t.0)
        .unwrap_or(std::time::Duration::from_secs(
            DEFAULT_WORKLOAD_TIMEOUT_SECS,
        ));
    let port = workload.port.unwrap_or(if kind == WorkloadKind::Web {
        DEFAULT_WEB_PORT
    } else {
        DEFAULT_SERVER_PORT
    });
    if port == 0 {
        return Err((kind_span, "workload.port must not be 0".into()));
    }
    refuse_fields_of_other_kinds(workload)?;
    match kind {
        WorkloadKind::Bulk => validate_bulk(workload, port, timeout),
        WorkloadKind::Command => validate_command(workload, host_exists, port, timeout),
        WorkloadKind::Web => validate_web(workload, port, timeout),
    }
}

/// Fails, blaming the workload's `kind`, when `field` is present though a `kind` workload does
/// not use it.
fn refuse_if(
    kind_span: &Range<usize>,
    present: bool,
    field: &str,
    kind: &str,
) -> Result<(), Blame> {
    if present {
        Err((
            kind_span.clone(),
            format!("workload.{field} does not apply to a `{kind}` workload"),
        ))
    } else {
        Ok(())
    }
}

/// Refuses the fields of the web and bulk kinds in a workload of another kind.
fn refuse_fields_of_other_kinds(workload: &WorkloadFile) -> Result<(), Blame> {
    let kind_span = workload.kind.span();
    let kind = *workload.kind.get_ref();
    let kind_text = match kind {
        WorkloadKind::Bulk => "bulk",
        WorkloadKind::Command => "command",
        WorkloadKind::Web => "web",
    };
    if kind != WorkloadKind::Web {
        let web_only = [
            (workload.hosts.is_some(), "hosts"),
            (workload.pages.is_some(), "pages"),
            (workload.page_bytes.is_some(), "page_bytes"),
            (workload.objects.is_some(), "objects"),
            (workload.object_hosts.is_some(), "object_hosts"),
            (workload.http.is_some(), "http"),
            (
                workload.connections_per_host.is_some(),
                "connections_per_host",
            ),
            (workload.connection_limit.is_some(), "connection_limit"),
            (workload.request_headers.is_some(), "request_headers"),
            (workload.cache.is_some(), "cache"),
            (workload.cache_max_age.is_some(), "cache_max_age"),
            (workload.keepalive_timeout.is_some(), "keepalive_timeout"),
            (workload.think_time.is_some(), "think_time"),
        ];
        for (present, field) in web_only {
            refuse_if(&kind_span, present, field, kind_text)?;
        }
    }
    if kind != WorkloadKind::Bulk {
        refuse_if(
            &kind_span,
            workload.warmup_bytes.is_some(),
            "warmup_bytes",
            kind_text,
        )?;
        refuse_if(
            &kind_span,
            workload.duration.is_some(),
            "duration",
            kind_text,
        )?;
        refuse_if(
            &kind_span,
            workload.competing.is_some(),
            "competing",
            kind_text,
        )?;
        refuse_if(
            &kind_span,
            workload.connections.is_some(),
            "connections",
            kind_text,
        )?;
        refuse_if(
            &kind_span,
            workload.client_recv_buffer.is_some(),
            "client_recv_buffer",
            kind_text,
        )?;
        refuse_if(
            &kind_span,
            workload.client_delayed_ack.is_some(),
            "client_delayed_ack",
            kind_text,
        )?;
        refuse_if(
            &kind_span,
            workload.server_send_buffer.is_some(),
            "server_send_buffer",
            kind_text,
        )?;
        refuse_if(
            &kind_span,
            workload.server_congestion_control.is_some()
                || workload.client_congestion_control.is_some(),
            "*_congestion_control",
            kind_text,
        )?;
    }
    Ok(())
}

fn validate_bulk(
    workload: &WorkloadFile,
    port: u16,
    timeout: std::time::Duration,
) -> Result<Workload, Blame> {
    let kind_span = workload.kind.span();
    refuse_if(&kind_span, workload.server.is_some(), "server", "bulk")?;
    refuse_if(&kind_span, workload.client.is_some(), "client", "bulk")?;
    let amount = match (workload.bytes, workload.duration) {
        (Some(bytes), None) if bytes.0 == 0 => {
            return Err((kind_span, "workload.bytes must be at least 1".into()))
        }
        (Some(bytes), None) => BulkAmount::Bytes(bytes.0),
        (None, Some(duration)) if duration.0.is_zero() => {
            return Err((kind_span, "workload.duration must be more than 0".into()))
        }
        (None, Some(duration)) if duration.0 >= timeout => {
            return Err((
                kind_span,
                format!(
                    "workload.duration ({duration}) must be shorter than workload.timeout ({:?}), \
                     which bounds the whole run",
                    timeout
                ),
            ))
        }
        (None, Some(duration)) => BulkAmount::For(duration.0),
        (Some(_), Some(_)) => {
            return Err((
                kind_span,
                "a bulk workload sends either `bytes` or for a `duration`, not both".into(),
            ))
        }
        (None, None) => {
            return Err((
                kind_span,
                "a bulk workload needs `bytes` (e.g. bytes = \"3MB\") or `duration` \
                 (e.g. duration = \"120s\")"
                    .into(),
            ))
        }
    };
    let competing = match &workload.competing {
        None => None,
        Some(competing) => Some(competing_flow(competing, amount, port)?),
    };
    let connections = workload.connections.unwrap_or(1);
    if !(1..=MAX_BULK_CONNECTIONS).contains(&connections) {
        return Err((
            kind_span,
            format!(
                "workload.connections must be between 1 and {MAX_BULK_CONNECTIONS} (got {connections})"
            ),
        ));
    }
    Ok(Workload::Bulk(BulkWorkload {
        amount,
        competing,
        // 0 = left to the kernel's autotuning, so an experiment can lift a file-wide
        // buffer limit through `set` (an absent key cannot be written there).
        client_recv_buffer: workload.client_recv_buffer.map(|b| b.0).filter(|&b| b > 0),
        server_send_buffer: workload.server_send_buffer.map(|b| b.0).filter(|&b| b > 0),
        server_congestion_control: workload.server_congestion_control.clone(),
        client_congestion_control: workload.client_congestion_control.clone(),
        client_delayed_ack: workload.client_delayed_ack.unwrap_or(true),
        warmup_bytes: workload.warmup_bytes.map(|b| b.0).filter(|&b| b > 0),
        connections,
        port,
        timeout,
    }))
}

/// The competing flow of a bulk workload: it runs as long as the measured transfer, so the
/// workload must be timed by a duration, and on its own port, so no proxy intercepts it.
fn competing_flow(
    competing: &Spanned<CompetingFile>,
    amount: BulkAmount,
    port: u16,
) -> Result<CompetingFlow, Blame> {
    let span = competing.span();
    let competing = competing.get_ref();
    if !matches!(amount, BulkAmount::For(_)) {
        return Err((
            span,
            "workload.competing runs for as long as the measured transfer: give the workload a \
             `duration` instead of `bytes`"
                .into(),
        ));
    }
    let competing_port = match &competing.port {
        Some(p) if *p.get_ref() == 0 || *p.get_ref() == port => {
            return Err((
                p.span(),
                format!(
                    "workload.competing.port must be neither 0 nor the workload's port {port} \
                     (a proxy would intercept the competing flow there)"
                ),
            ))
        }
        Some(p) => *p.get_ref(),
        None => port.checked_add(1).ok_or_else(|| {
            (
                span.clone(),
                "workload.competing.port: the workload's port is 65535; name another".to_string(),
            )
        })?,
    };
    Ok(CompetingFlow {
        congestion_control: competing
            .congestion_control
            .clone()
            .unwrap_or_else(|| DEFAULT_COMPETING_CONGESTION_CONTROL.to_string()),
        port: competing_port,
        client_recv_buffer: competing.client_recv_buffer.map(|b| b.0).filter(|&b| b > 0),
        server_send_buffer: competing.server_send_buffer.map(|b| b.0).filter(|&b| b > 0),
    })
}

fn validate_command(
    workload: &WorkloadFile,
    host_exists: HostCheck<'_>,
    port: u16,
    timeout: std::time::Duration,
) -> Result<Workload, Blame> {
    let kind_span = workload.kind.span();
    let command = |file: &CommandFile, what: &str| -> Result<HostCommand, Blame> {
        let host = host_exists(&file.host, what)?;
        if file.argv.get_ref().is_empty() {
            return Err((file.argv.span(), format!("{what}.argv is empty")));
        }
        Ok(HostCommand {
            host,
            argv: file.argv.get_ref().clone(),
            listen_port: file.listen_port,
        })
    };
    let client = match workload.client.as_ref().map(|c| (c.span(), c.get_ref())) {
        Some((_, WorkloadClientFile::Command(client))) => client,
        Some((span, WorkloadClientFile::Web(_))) => {
            return Err((
                span,
                "a command workload's client is a table { host, argv }; \
                 \"loader\" and \"chromium\" are web clients"
                    .to_string(),
            ))
        }
        None => {
            return Err((
                kind_span,
                "a command workload needs [workload.client] with host and argv".to_string(),
            ))
        }
    };
    Ok(Workload::Command(CommandWorkload {
        bytes: workload.bytes.map(|b| b.0),
        port,
        timeout,
        server: workload
            .server
            .as_ref()
            .map(|s| command(s, "workload.server"))
            .transpose()?,
        client: command(client, "workload.client")?,
    }))
}

fn validate_web(
    workload: &WorkloadFile,
    port: u16,
    timeout: std::time::Duration,
) -> Result<Workload, Blame> {
    let kind_span = workload.kind.span();
    refuse_if(
        &kind_span,
        workload.bytes.is_some(),
        "bytes (use page_bytes)",
        "web",
    )?;
    refuse_if(&kind_span, workload.server.is_some(), "server", "web")?;
    let client = web_client(workload)?;
    let hosts = web_hosts(workload)?;
    let pages = workload.pages.as_ref().map_or(1, |p| *p.get_ref());
    if !(1..=MAX_WEB_PAGES).contains(&pages) {
        let span = workload
            .pages
            .as_ref()
            .map_or(kind_span.clone(), |p| p.span());
        return Err((span, format!("workload.pages must be 1 to {MAX_WEB_PAGES}")));
    }
    let objects = workload.objects.as_ref().map_or(0, |o| *o.get_ref());
    if objects > MAX_WEB_OBJECTS {
        let span = workload
            .objects
            .as_ref()
            .map_or(kind_span.clone(), |o| o.span());
        return Err((
            span,
            format!("workload.objects must be at most {MAX_WEB_OBJECTS}"),
        ));
    }
    let page_bytes = workload.page_bytes.as_ref().ok_or_else(|| {
        (
            kind_span.clone(),
            "a web workload needs `page_bytes` (base document and objects of one page, \
             e.g. page_bytes = \"65KB\")"
                .to_string(),
        )
    })?;
    // Objects go to hosts[1..=object_hosts]; with a single host they can only be on hosts[0].
    let extra_hosts = u32::try_from(hosts.len() - 1).unwrap_or(u32::MAX);
    let object_hosts = match &workload.object_hosts {
        None => extra_hosts.min(1),
        Some(count) => {
            if *count.get_ref() > extra_hosts {
                return Err((
                    count.span(),
                    format!(
                        "workload.object_hosts = {} but hosts has only {extra_hosts} name{} \
                         after the first (objects go to hosts[1..=object_hosts]; 0 = hosts[0])",
                        count.get_ref(),
                        if extra_hosts == 1 { "" } else { "s" }
                    ),
                ));
            }
            *count.get_ref()
        }
    };
    let connections_per_host = workload
        .connections_per_host
        .as_ref()
        .map_or(DEFAULT_CONNECTIONS_PER_HOST, |c| *c.get_ref());
    if !(1..=MAX_CONNECTIONS_PER_HOST).contains(&connections_per_host) {
        let span = workload
            .connections_per_host
            .as_ref()
            .map_or(kind_span.clone(), |c| c.span());
        return Err((
            span,
            format!("workload.connections_per_host must be 1 to {MAX_CONNECTIONS_PER_HOST}"),
        ));
    }
    let http = workload
        .http
        .as_ref()
        .map_or(HttpVersion::KeepAlive, |h| *h.get_ref());
    let cache = workload
        .cache
        .as_ref()
        .map_or(WebCache::Plain, |c| *c.get_ref());
    if client == WebClient::Chromium {
        check_chromium_limits(workload)?;
    }
    let web = WebWorkload {
        hosts,
        pages,
        page_bytes: page_bytes.get_ref().0,
        objects,
        object_hosts,
        http,
        connections_per_host,
        connection_limit: workload
            .connection_limit
            .as_ref()
            .map_or(WebConnectionLimit::PerServer, |c| *c.get_ref()),
        request_headers: workload
            .request_headers
            .as_ref()
            .map_or(WebRequestHeaders::Minimal, |h| *h.get_ref()),
        client,
        cache,
        cache_max_age: workload.cache_max_age.map_or(
            Some(std::time::Duration::from_secs(DEFAULT_CACHE_MAX_AGE_SECS)),
            |m| m.0,
        ),
        keepalive_timeout: workload.keepalive_timeout.map_or(
            std::time::Duration::from_secs(DEFAULT_KEEPALIVE_TIMEOUT_SECS),
            |d| d.0,
        ),
        think_time: workload
            .think_time
            .map_or(std::time::Duration::ZERO, |d| d.0),
        port,
        timeout,
    };
    // The origin's own check of the page layout (its HTML needs room for the object tags).
    if let Err(error) = crate::web::site_spec(&web).layout() {
        return Err((page_bytes.span(), format!("workload: {error}")));
    }
    Ok(Workload::Web(web))
}

/// The web client: the loader unless `workload.client` names Chromium.
fn web_client(workload: &WorkloadFile) -> Result<WebClient, Blame> {
    Ok(
        match workload.client.as_ref().map(|c| (c.span(), c.get_ref())) {
            None => WebClient::Loader,
            Some((_, WorkloadClientFile::Web(client))) => *client,
            Some((span, WorkloadClientFile::Command(_))) => {
                return Err((
                    span,
                    "a web workload's client is \"loader\" or \"chromium\", not a command".into(),
                ))
            }
        },
    )
}

/// `workload.hosts`: 1 to [`MAX_WEB_HOSTS`] distinct valid names, default one.
fn web_hosts(workload: &WorkloadFile) -> Result<Vec<String>, Blame> {
    Ok(match &workload.hosts {
        None => vec![DEFAULT_WEB_HOST.to_string()],
        Some(hosts) => {
            let list = hosts.get_ref();
            if list.is_empty() || list.len() > MAX_WEB_HOSTS {
                return Err((
                    hosts.span(),
                    format!("workload.hosts needs 1 to {MAX_WEB_HOSTS} names"),
                ));
            }
            let mut seen = BTreeSet::new();
            for name in list {
                if !midway_labnet::is_valid_host_name(name) {
                    return Err((
                        hosts.span(),
                        format!(
                            "workload.hosts: {}",
                            midway_labnet::BadHostName { name: name.clone() }
                        ),
                    ));
                }
                if !seen.insert(name.to_ascii_lowercase()) {
                    return Err((hosts.span(), format!("workload.hosts names `{name}` twice")));
                }
            }
            list.clone()
        }
    })
}

/// Settings the browser does not let the lab choose.
fn check_chromium_limits(workload: &WorkloadFile) -> Result<(), Blame> {
    // The browser speaks HTTP/1.1 with its own 6 connections per host, and sends no
    // no-cache headers on an ordinary load.
    if let Some(h) = workload
        .http
        .as_ref()
        .filter(|h| *h.get_ref() != HttpVersion::KeepAlive)
    {
        return Err((
            h.span(),
            "workload.http: Chromium speaks HTTP/1.1 keep-alive only (\"1.1\")".into(),
        ));
    }
    if let Some(c) = workload
        .connections_per_host
        .as_ref()
        .filter(|c| *c.get_ref() != DEFAULT_CONNECTIONS_PER_HOST)
    {
        return Err((
            c.span(),
            format!(
                "workload.connections_per_host: Chromium opens its own \
                 {DEFAULT_CONNECTIONS_PER_HOST} per host"
            ),
        ));
    }
    if let Some(h) = &workload.request_headers {
        return Err((
            h.span(),
            "workload.request_headers is the loader's; Chromium sends its own".into(),
        ));
    }
    if let Some(c) = &workload.connection_limit {
        return Err((
            c.span(),
            "workload.connection_limit is the loader's; Chromium counts per origin host \
             (6 each, 32 per proxy) by itself"
                .into(),
        ));
    }
    if let Some(c) = workload
        .cache
        .as_ref()
        .filter(|c| *c.get_ref() == WebCache::Miss)
    {
        return Err((
            c.span(),
            "workload.cache = \"miss\" needs the loader (Chromium sends no no-cache \
             headers on a load)"
                .into(),
        ));
    }
    Ok(())
}
