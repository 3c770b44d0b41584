//! `[[access_links]]`: the subscribers' access links, checked (see `crate::access_link`).

use midway_config::FileAccessLink;

use super::validate::Validator;
use super::ConfigError;
use crate::access_link::{AccessLink, DEFAULT_SUBSCRIBER_PREFIX_V4, DEFAULT_SUBSCRIBER_PREFIX_V6};

/// Slowest access link midway paces for: below this one full-size segment takes longer than
/// a second, and Linux's pacing is no better than a retransmission timer.
pub const MIN_ACCESS_RATE_BPS: u64 = 16_000;

/// Smallest queue in front of a subscriber: one full-size packet.
const MIN_ACCESS_QUEUE_BYTES: u64 = 1500;

pub(super) fn access_links(
    v: &Validator<'_>,
    links: Vec<FileAccessLink>,
) -> Result<Vec<AccessLink>, ConfigError> {
    links
        .into_iter()
        .enumerate()
        .map(|(i, link)| access_link(v, &format!("access_links[{i}]"), link))
        .collect()
}

fn access_link(
    v: &Validator<'_>,
    key: &str,
    link: FileAccessLink,
) -> Result<AccessLink, ConfigError> {
    let clients =
        match link.clients {
            Some(list) if !list.is_empty() => list,
            _ => return Err(v.invalid(
                format!("{key}.clients"),
                "required and must not be empty: the client prefixes behind this kind of link, \
                 e.g. clients = [\"10.64.0.0/10\"]",
            )),
        };
    let clients = clients
        .iter()
        .enumerate()
        .map(|(i, text)| v.prefix(&format!("{key}.clients[{i}]"), text))
        .collect::<Result<Vec<_>, _>>()?;
    let rate_bps =
        match link.rate_bps {
            Some(rate) if rate >= MIN_ACCESS_RATE_BPS => rate,
            Some(rate) => {
                return Err(v.invalid(
                    format!("{key}.rate_bps"),
                    format!(
                "{rate} bit/s is below the smallest rate midway paces for, {MIN_ACCESS_RATE_BPS}"
            ),
                ))
            }
            None => return Err(v.invalid(
                format!("{key}.rate_bps"),
                "required: the link's rate toward one subscriber in bits per second, e.g. 384e3",
            )),
        };
    let prefix = |field: &str, value: Option<u8>, default: u8, max: u8| match value {
        None => Ok(default),
        Some(len) if len <= max => Ok(len),
        Some(len) => Err(v.invalid(
            format!("{key}.{field}"),
            format!("{len} is longer than an address ({max} bits)"),
        )),
    };
    let queue_bytes = match link.queue_bytes {
        None => None,
        Some(bytes) if bytes >= MIN_ACCESS_QUEUE_BYTES => Some(bytes),
        Some(bytes) => {
            return Err(v.invalid(
                format!("{key}.queue_bytes"),
                format!(
                    "{bytes} bytes is less than one full-size packet ({MIN_ACCESS_QUEUE_BYTES}); \
                     give the queue in front of one subscriber, e.g. 30000"
                ),
            ))
        }
    };
    Ok(AccessLink {
        clients,
        rate_bps,
        queue_bytes,
        subscriber_prefix_v4: prefix(
            "subscriber_prefix_v4",
            link.subscriber_prefix_v4,
            DEFAULT_SUBSCRIBER_PREFIX_V4,
            32,
        )?,
        subscriber_prefix_v6: prefix(
            "subscriber_prefix_v6",
            link.subscriber_prefix_v6,
            DEFAULT_SUBSCRIBER_PREFIX_V6,
            128,
        )?,
    })
}
