//! The web workload of a point: midway-web's origin in the server host, the page loader (threads
//! in the client host) or headless Chromium (spawned in the client host), and what a run records.
//!
//! Pure parts (the descriptions handed to midway-web, the record's numbers) are functions of the
//! validated workload and the point's addresses; the rest runs inside the topology.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use midway_labnet::{SpawnOptions, Topology};
use midway_web::{
    BrowserSpec, CacheMode, ConnectionLimit, HttpMode, LoadResult, LoadSpec, Origin, OriginStats,
    RequestHeaders, SiteSpec,
};

use crate::scenario::{HttpVersion, WebCache, WebConnectionLimit, WebRequestHeaders, WebWorkload};

/// What the origin serves for `web`.
pub(crate) fn site_spec(web: &WebWorkload) -> SiteSpec {
    SiteSpec {
        hosts: web.hosts.clone(),
        pages: web.pages,
        page_bytes: web.page_bytes,
        objects: web.objects,
        object_hosts: web.object_hosts,
        cache_max_age: web
            .cache_max_age
            .map(|age| u32::try_from(age.as_secs()).unwrap_or(u32::MAX)),
        keepalive_timeout: web.keepalive_timeout,
        // Apache's MaxKeepAliveRequests default: the scenario has no key for it.
        max_keepalive_requests: midway_web::APACHE_MAX_KEEPALIVE_REQUESTS,
    }
}

/// Every host name of the site mapped to `address`.
pub(crate) fn resolve_all(web: &WebWorkload, address: IpAddr) -> BTreeMap<String, IpAddr> {
    web.hosts
        .iter()
        .map(|name| (name.clone(), address))
        .collect()
}

/// Where the web client sends its requests in one case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientRoute {
    /// Where the client connects when it talks to origins itself: the server (direct,
    /// transparent) or a forward listener.
    pub target: SocketAddr,
    /// An explicit HTTP proxy (Squid, midway `intercept = "http"`).
    pub proxy: Option<SocketAddr>,
    /// The origin's own address on the client-side path (what the hosts file says).
    pub server: SocketAddr,
}

/// The loader's description of a run.
pub(crate) fn load_spec(web: &WebWorkload, route: &ClientRoute) -> LoadSpec {
    // Through an explicit proxy the names matter only to the proxy (it resolves them with the
    // hosts file); otherwise every name leads to where this case's client must connect.
    let (resolve, port) = match route.proxy {
        Some(_) => (resolve_all(web, route.server.ip()), web.port),
        None => (resolve_all(web, route.target.ip()), route.target.port()),
    };
    LoadSpec {
        site: site_spec(web),
        resolve,
        port,
        proxy: route.proxy,
        mode: match web.http {
            HttpVersion::Http10 => HttpMode::Http10,
            HttpVersion::KeepAlive => HttpMode::KeepAlive,
            HttpVersion::Pipelining => HttpMode::Pipelining,
        },
        max_connections_per_host: web.connections_per_host,
        connection_limit: match web.connection_limit {
            WebConnectionLimit::PerServer => ConnectionLimit::PerServer,
            WebConnectionLimit::PerOrigin => ConnectionLimit::PerOrigin,
        },
        request_headers: match web.request_headers {
            WebRequestHeaders::Minimal => RequestHeaders::Minimal,
            WebRequestHeaders::Chromium => RequestHeaders::Chromium,
        },
        cache: match web.cache {
            WebCache::Plain => CacheMode::Plain,
            WebCache::Miss => CacheMode::ForceMiss,
            WebCache::Hit => CacheMode::WarmHit,
        },
        think_time: web.think_time,
        timeout: web.timeout,
    }
}

/// URL of page `page` (on `hosts[0]`, the port written only when it is not 80).
pub(crate) fn page_url(web: &WebWorkload, page: u32) -> String {
    let authority = if web.port == 80 {
        web.hosts[0].clone()
    } else {
        format!("{}:{}", web.hosts[0], web.port)
    };
    format!("http://{authority}{}", SiteSpec::page_path(page))
}

/// The record of one web run: body bytes and summed load time of the measured pages, and the
/// web extras (`page_load_seconds` = mean page load time, the experiment's primary metric).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WebOutcome {
    pub bytes: u64,
    pub seconds: f64,
    pub extra: BTreeMap<String, f64>,
}

/// Page load times (seconds) and body bytes of the measured pages -> the run's numbers.
/// `connections_opened` is left out when unknown (Chromium). None when no page was measured.
pub(crate) fn web_outcome(
    page_seconds: &[f64],
    bytes: u64,
    objects: u64,
    connections_opened: Option<u32>,
) -> Option<WebOutcome> {
    if page_seconds.is_empty() {
        return None;
    }
    let seconds: f64 = page_seconds.iter().sum();
    let max = page_seconds.iter().copied().fold(f64::NAN, f64::max);
    let mut extra = BTreeMap::new();
    extra.insert(
        "page_load_seconds".to_string(),
        seconds / page_seconds.len() as f64,
    );
    extra.insert("page_load_max_seconds".to_string(), max);
    extra.insert("pages".to_string(), page_seconds.len() as f64);
    extra.insert("objects".to_string(), objects as f64);
    if let Some(count) = connections_opened {
        extra.insert("connections_opened".to_string(), f64::from(count));
    }
    Some(WebOutcome {
        bytes,
        seconds,
        extra,
    })
}

/// The loader's result -> the run's numbers.
pub(crate) fn loader_outcome(result: &LoadResult) -> Option<WebOutcome> {
    let seconds: Vec<f64> = result.pages.iter().map(|p| p.seconds).collect();
    let bytes = result.pages.iter().map(|p| p.bytes).sum();
    let objects = result.pages.iter().map(|p| u64::from(p.objects)).sum();
    web_outcome(&seconds, bytes, objects, Some(result.connections_opened))
}

/// The origin running in the server host; stopped when dropped.
pub(crate) struct RunningOrigin {
    origin: Origin,
}

impl RunningOrigin {
    /// Starts the origin on `web.port` (all addresses) inside `server_host`.
    pub(crate) fn start(
        topology: &Topology,
        server_host: &str,
        web: &WebWorkload,
    ) -> anyhow::Result<Self> {
        let listen = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), web.port);
        let site = site_spec(web);
        // The origin binds on this thread (inside the server's namespace); its serving thread,
        // spawned from here, stays in that namespace.
        let origin = topology
            .try_in_host(server_host, move || Origin::start(listen, site))?
            .context("cannot start the web origin")?;
        Ok(Self { origin })
    }

    pub(crate) fn stats(&self) -> OriginStats {
        self.origin.stats()
    }
}

/// Runs midway-web's page loader on a thread inside `client_host`.
pub(crate) fn run_loader(
    topology: &Topology,
    client_host: &str,
    web: &WebWorkload,
    route: &ClientRoute,
) -> anyhow::Result<WebOutcome> {
    let spec = load_spec(web, route);
    let result = topology
        .try_in_host(client_host, move || midway_web::load_pages(&spec))?
        .context("page load")?;
    loader_outcome(&result).ok_or_else(|| anyhow!("the loader measured no page"))
}

/// Loads every page with a fresh headless Chromium each (its own empty profile in the point's
/// folder, so no browser cache or connection carries over between pages), timed by the browser
/// (navigationStart to loadEventEnd). With `cache = "hit"` every page is loaded once unmeasured
/// first, through the same case, to fill the proxy's cache.
pub(crate) fn run_chromium(
    topology: &Topology,
    client_host: &str,
    web: &WebWorkload,
    route: &ClientRoute,
    hosts_file: &Path,
    point_dir: &Path,
) -> anyhow::Result<WebOutcome> {
    let resolve = match route.proxy {
        Some(_) => resolve_all(web, route.server.ip()),
        None => resolve_all(web, route.target.ip()),
    };
    let mut run = 0u32;
    let mut load = |page: u32| -> anyhow::Result<f64> {
        let dir = point_dir.join(format!("chromium-{run}"));
        run += 1;
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let spec = BrowserSpec {
            url: page_url(web, page),
            proxy: route.proxy,
            resolve: resolve.clone(),
            user_data_dir: dir.join("profile"),
            timeout: web.timeout,
        };
        browser_load(topology, client_host, &spec, hosts_file, &dir)
    };
    if web.cache == WebCache::Hit {
        for page in 0..web.pages {
            load(page).with_context(|| format!("warm-up load of page {page}"))?;
        }
    }
    let mut seconds = Vec::with_capacity(web.pages as usize);
    for page in 0..web.pages {
        seconds.push(load(page).with_context(|| format!("page {page}"))?);
    }
    let bytes = web.page_bytes * u64::from(web.pages);
    let objects = u64::from(web.objects) * u64::from(web.pages);
    web_outcome(&seconds, bytes, objects, None).ok_or_else(|| anyhow!("no page was measured"))
}

/// One Chromium run in `client_host`: stdout/stderr in `dir`, killed (its whole process group)
/// when it exceeds the timeout.
fn browser_load(
    topology: &Topology,
    client_host: &str,
    spec: &BrowserSpec,
    hosts_file: &Path,
    dir: &Path,
) -> anyhow::Result<f64> {
    let out_path = dir.join("stdout.txt");
    let err_path = dir.join("stderr.txt");
    let mut command = midway_web::chromium_command(spec);
    command
        .stdin(Stdio::null())
        .stdout(
            File::create(&out_path)
                .with_context(|| format!("cannot create {}", out_path.display()))?,
        )
        .stderr(
            File::create(&err_path)
                .with_context(|| format!("cannot create {}", err_path.display()))?,
        );
    let options = SpawnOptions {
        hosts_file: Some(hosts_file.to_path_buf()),
    };
    let mut child = topology
        .spawn_with(client_host, command, &options)
        .context("cannot start chromium")?;
    // A little beyond the page's own limit: the browser needs a moment to start and to exit.
    let limit = spec.timeout + CHROMIUM_START_ALLOWANCE;
    let status = child
        .wait_timeout(limit)
        .context("cannot wait for chromium")?;
    let Some(status) = status else {
        let _ = child.stop();
        bail!(
            "chromium did not finish within {limit:?} (stderr in {})",
            err_path.display()
        );
    };
    let stdout = fs::read_to_string(&out_path).unwrap_or_default();
    match midway_web::parse_chromium_output(&stdout) {
        Ok(seconds) => Ok(seconds),
        Err(error) => Err(anyhow::Error::new(error).context(format!(
            "chromium ({status}) gave no page load time; stderr ends with:\n{}",
            tail(&err_path)
        ))),
    }
}

/// Time Chromium may take beyond the page's timeout to start and exit.
const CHROMIUM_START_ALLOWANCE: Duration = Duration::from_secs(30);

fn tail(path: &Path) -> String {
    let text = fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(1500);
    String::from_utf8_lossy(&text[start..]).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::WebClient;

    fn web() -> WebWorkload {
        WebWorkload {
            hosts: vec!["www.lab".into(), "s1.lab".into()],
            pages: 2,
            page_bytes: 65_000,
            objects: 19,
            object_hosts: 1,
            http: HttpVersion::Pipelining,
            connections_per_host: 4,
            connection_limit: WebConnectionLimit::PerOrigin,
            request_headers: WebRequestHeaders::Chromium,
            client: WebClient::Loader,
            cache: WebCache::Hit,
            cache_max_age: Some(Duration::from_secs(3600)),
            keepalive_timeout: Duration::from_secs(15),
            think_time: Duration::from_secs(1),
            port: 80,
            timeout: Duration::from_secs(60),
        }
    }

    fn route(proxy: Option<&str>, target: &str) -> ClientRoute {
        ClientRoute {
            target: target.parse().unwrap(),
            proxy: proxy.map(|p| p.parse().unwrap()),
            server: "10.0.2.2:80".parse().unwrap(),
        }
    }

    #[test]
    fn the_site_is_the_workload_and_its_layout_is_valid() {
        let site = site_spec(&web());
        assert_eq!(site.hosts, ["www.lab", "s1.lab"]);
        assert_eq!(site.cache_max_age, Some(3600));
        assert_eq!(site.max_keepalive_requests, 100);
        let layout = site.layout().unwrap();
        assert_eq!(layout.base_bytes + 19 * layout.object_bytes, 65_000);
        let mut none = web();
        none.cache_max_age = None;
        assert_eq!(site_spec(&none).cache_max_age, None);
    }

    #[test]
    fn without_a_proxy_names_lead_to_the_target_and_with_one_to_the_server() {
        let spec = load_spec(&web(), &route(None, "10.0.1.2:8080"));
        assert_eq!(spec.proxy, None);
        assert_eq!(spec.port, 8080);
        assert_eq!(
            spec.resolve["s1.lab"],
            "10.0.1.2".parse::<IpAddr>().unwrap()
        );
        assert!(matches!(spec.mode, HttpMode::Pipelining));
        assert!(matches!(spec.cache, CacheMode::WarmHit));
        assert_eq!(spec.max_connections_per_host, 4);
        assert_eq!(spec.connection_limit, ConnectionLimit::PerOrigin);
        assert_eq!(spec.request_headers, RequestHeaders::Chromium);

        let spec = load_spec(&web(), &route(Some("10.0.1.2:8080"), "10.0.1.2:8080"));
        assert_eq!(spec.proxy, Some("10.0.1.2:8080".parse().unwrap()));
        assert_eq!(spec.port, 80);
        assert_eq!(
            spec.resolve["www.lab"],
            "10.0.2.2".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn page_urls_name_the_first_host_and_a_port_other_than_80() {
        assert_eq!(page_url(&web(), 1), "http://www.lab/page/1.html");
        let mut other = web();
        other.port = 8000;
        assert_eq!(page_url(&other, 0), "http://www.lab:8000/page/0.html");
    }

    #[test]
    fn the_outcome_is_mean_max_and_sum_of_the_pages() {
        let outcome = web_outcome(&[1.0, 3.0], 130_000, 38, Some(7)).unwrap();
        assert_eq!(outcome.seconds, 4.0);
        assert_eq!(outcome.bytes, 130_000);
        assert_eq!(outcome.extra["page_load_seconds"], 2.0);
        assert_eq!(outcome.extra["page_load_max_seconds"], 3.0);
        assert_eq!(outcome.extra["pages"], 2.0);
        assert_eq!(outcome.extra["objects"], 38.0);
        assert_eq!(outcome.extra["connections_opened"], 7.0);
        let chromium = web_outcome(&[0.5], 65_000, 19, None).unwrap();
        assert!(!chromium.extra.contains_key("connections_opened"));
        assert!(web_outcome(&[], 0, 0, None).is_none());
    }
}
