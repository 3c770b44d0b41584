//! Stage 3 for `[listeners.http]`: the HTTP engine's client limits, upstream pool and cache.
//! Missing values come from midway-http's own defaults (`midway_http::config`).

use midway_http::config as http_defaults;
use midway_http::{
    CacheConfig, ClientLimits as HttpClientLimits, DiskCacheConfig, HttpProxyConfig,
    KeepaliveProbes, UpstreamPoolConfig,
};

use super::validate::{Section, Validator};
use super::{
    ConfigError, FileHttp, DEFAULT_HTTP_CACHE, DEFAULT_HTTP_UPSTREAM_KEEPALIVE,
    DEFAULT_HTTP_VIA_NAME, MAX_HTTP_HEADER_BYTES,
};

/// `[listeners.http]` -> the engine's config. `base` is the key path of the section.
pub(super) fn http_config(
    v: &Validator<'_>,
    base: &str,
    file: FileHttp,
) -> Result<HttpProxyConfig, ConfigError> {
    let section = Section::new(v, base.to_string());
    let client = client_limits(&section, &file)?;
    let upstream = upstream_pool(&section, &file)?;
    let cache = cache(&section, &file)?;
    let via_name = via_name(&section, file.via_name)?;
    let config = HttpProxyConfig {
        client,
        upstream,
        cache,
        via_name,
        ..HttpProxyConfig::default()
    };
    // Backstop: the engine's own checks (the ones above give the better messages).
    config
        .validate()
        .map_err(|err| v.invalid(base, err.to_string()))?;
    Ok(config)
}

/// What one client may ask of the engine: head size, pipelining, request rate, timeouts.
fn client_limits(section: &Section<'_>, file: &FileHttp) -> Result<HttpClientLimits, ConfigError> {
    let max_header_bytes = file
        .max_header_bytes
        .unwrap_or(http_defaults::DEFAULT_MAX_HEADER_BYTES);
    if !(256..=MAX_HTTP_HEADER_BYTES).contains(&max_header_bytes) {
        return Err(section.invalid(
            "max_header_bytes",
            format!("must be between 256 and {MAX_HTTP_HEADER_BYTES} (e.g. 32768)"),
        ));
    }
    let max_pipelined = section.positive(
        "max_pipelined",
        file.max_pipelined,
        http_defaults::DEFAULT_MAX_PIPELINED,
    )?;
    let requests_per_second = file
        .requests_per_second
        .unwrap_or(http_defaults::DEFAULT_REQUESTS_PER_SECOND);
    if !(requests_per_second.is_finite() && requests_per_second > 0.0) {
        return Err(section.invalid(
            "requests_per_second",
            "must be a positive number of requests per second, e.g. 200",
        ));
    }
    let request_burst = file
        .request_burst
        .unwrap_or(http_defaults::DEFAULT_REQUEST_BURST);
    if request_burst == 0 {
        return Err(section.invalid("request_burst", "must be at least 1, e.g. 100"));
    }
    Ok(HttpClientLimits {
        max_header_bytes,
        max_pipelined,
        requests_per_second,
        request_burst,
        idle_timeout: section.duration(
            "client_idle_timeout",
            file.client_idle_timeout,
            http_defaults::DEFAULT_CLIENT_IDLE_TIMEOUT,
        )?,
        head_read_timeout: section.duration(
            "head_read_timeout",
            file.head_read_timeout,
            http_defaults::DEFAULT_HEAD_READ_TIMEOUT,
        )?,
    })
}

/// The pool of upstream connections: idle ones kept per origin, keepalive probes, timeouts.
fn upstream_pool(
    section: &Section<'_>,
    file: &FileHttp,
) -> Result<UpstreamPoolConfig, ConfigError> {
    let keepalive = keepalive_probes(section, file)?;
    Ok(UpstreamPoolConfig {
        // 0 is allowed: no idle connection is kept (every request opens a new one).
        max_idle_per_origin: file
            .upstream_max_idle
            .unwrap_or(http_defaults::DEFAULT_MAX_IDLE_PER_ORIGIN),
        idle_keep: section.duration(
            "upstream_idle_keep",
            file.upstream_idle_keep,
            http_defaults::DEFAULT_UPSTREAM_IDLE_KEEP,
        )?,
        keepalive,
        response_timeout: section.duration(
            "upstream_response_timeout",
            file.upstream_response_timeout,
            http_defaults::DEFAULT_UPSTREAM_RESPONSE_TIMEOUT,
        )?,
    })
}

/// TCP keepalive probes on pooled upstream connections, unless `upstream_keepalive = false`
/// (then no probe setting may be given).
fn keepalive_probes(
    section: &Section<'_>,
    file: &FileHttp,
) -> Result<Option<KeepaliveProbes>, ConfigError> {
    let keepalive_on = file
        .upstream_keepalive
        .unwrap_or(DEFAULT_HTTP_UPSTREAM_KEEPALIVE);
    if !keepalive_on {
        section.refuse_set_keys(
            &[
                ("keepalive_idle", file.keepalive_idle.is_some()),
                ("keepalive_interval", file.keepalive_interval.is_some()),
                ("keepalive_retries", file.keepalive_retries.is_some()),
            ],
            "has no effect with upstream_keepalive = false; remove it or turn probes on",
        )?;
        return Ok(None);
    }
    let retries = file
        .keepalive_retries
        .unwrap_or(http_defaults::DEFAULT_KEEPALIVE_RETRIES);
    if retries == 0 {
        return Err(section.invalid(
            "keepalive_retries",
            "must be at least 1; to turn probes off write upstream_keepalive = false",
        ));
    }
    Ok(Some(KeepaliveProbes {
        idle: section.duration(
            "keepalive_idle",
            file.keepalive_idle,
            http_defaults::DEFAULT_KEEPALIVE_IDLE,
        )?,
        interval: section.duration(
            "keepalive_interval",
            file.keepalive_interval,
            http_defaults::DEFAULT_KEEPALIVE_INTERVAL,
        )?,
        retries,
    }))
}

/// The response cache: on or off, memory and object caps, and the optional disk tier.
fn cache(section: &Section<'_>, file: &FileHttp) -> Result<CacheConfig, ConfigError> {
    let enabled = file.cache.unwrap_or(DEFAULT_HTTP_CACHE);
    if !enabled {
        section.refuse_set_keys(
            &[
                ("cache_memory_bytes", file.cache_memory_bytes.is_some()),
                (
                    "cache_max_object_bytes",
                    file.cache_max_object_bytes.is_some(),
                ),
                ("cache_disk_dir", file.cache_disk_dir.is_some()),
                ("cache_disk_bytes", file.cache_disk_bytes.is_some()),
            ],
            "has no effect with cache = false; remove it or set cache = true",
        )?;
    }
    let memory_bytes = file
        .cache_memory_bytes
        .unwrap_or(http_defaults::DEFAULT_CACHE_MEMORY_BYTES);
    // With only a memory cap given, the object cap follows it down instead of failing.
    let max_object_bytes = file
        .cache_max_object_bytes
        .unwrap_or(http_defaults::DEFAULT_CACHE_MAX_OBJECT_BYTES.min(memory_bytes));
    if max_object_bytes > memory_bytes {
        return Err(section.invalid(
            "cache_max_object_bytes",
            format!(
                "{max_object_bytes} is more than cache_memory_bytes ({memory_bytes}); an object \
                 is stored in memory first, so lower it or raise cache_memory_bytes"
            ),
        ));
    }
    Ok(CacheConfig {
        enabled,
        memory_bytes,
        max_object_bytes,
        disk: disk_cache(section, file, max_object_bytes)?,
    })
}

/// The disk tier: an absolute directory of its own, large enough for one largest object.
fn disk_cache(
    section: &Section<'_>,
    file: &FileHttp,
    max_object_bytes: u64,
) -> Result<Option<DiskCacheConfig>, ConfigError> {
    match (&file.cache_disk_dir, file.cache_disk_bytes) {
        (None, Some(_)) => Err(section.invalid(
            "cache_disk_bytes",
            "needs cache_disk_dir = \"/var/cache/midway\" (a directory of its own); add it \
             or remove cache_disk_bytes",
        )),
        (None, None) => Ok(None),
        (Some(dir), bytes) => {
            if dir.as_os_str().is_empty() || dir.is_relative() {
                return Err(section.invalid(
                    "cache_disk_dir",
                    "must be an absolute path, e.g. \"/var/cache/midway\"",
                ));
            }
            let max_bytes = bytes.unwrap_or(http_defaults::DEFAULT_CACHE_DISK_BYTES);
            if max_bytes < max_object_bytes {
                return Err(section.invalid(
                    "cache_disk_bytes",
                    format!(
                        "{max_bytes} cannot hold one object of cache_max_object_bytes \
                         ({max_object_bytes}); raise it"
                    ),
                ));
            }
            Ok(Some(DiskCacheConfig {
                dir: dir.clone(),
                max_bytes,
            }))
        }
    }
}

/// The `Via` pseudonym: one token.
fn via_name(section: &Section<'_>, via_name: Option<String>) -> Result<String, ConfigError> {
    let via_name = via_name.unwrap_or_else(|| DEFAULT_HTTP_VIA_NAME.to_string());
    if via_name.is_empty() || !via_name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(section.invalid(
            "via_name",
            format!("{via_name:?} must be one token without spaces, e.g. \"midway\""),
        ));
    }
    Ok(via_name)
}
