//! Stage 3 for two-ended operation: `[keys.NAME]` (read and checked at load, key files
//! included) and `[[peers]]`. Listeners' `via` and `keys` are checked against these in
//! `listener.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use midway_tls::Identity;

use midway_tcp::TcpProfile;

use super::transport::peer_transport;
use super::validate::{Section, Validator};
use super::{
    ConfigError, FileKey, FilePeer, PeerConfig, PeerKey, TargetAddr, ALL_DESTINATIONS,
    DEFAULT_PROFILE, DEFAULT_WARM_CONNECTIONS, DEFAULT_WARM_MAX_IDLE, MAX_WARM_CONNECTIONS,
};
use crate::peer::header::{valid_key_name, MAX_KEY_NAME_LEN, MIN_KEY_LEN};

/// Keys printed in midway's own files (examples, docs, older releases' examples): public, so a
/// midway refuses to start with one.
const PUBLISHED_KEYS: &[&[u8]] = &[b"midway example key - not a secret"];

/// Every `[keys.NAME]`: a name that can travel in a header, and one of `secret` (hex) or
/// `secret_file` (whose first line is hex) giving at least [`MIN_KEY_LEN`] bytes.
pub(super) fn keys(
    v: &Validator<'_>,
    files: BTreeMap<String, FileKey>,
) -> Result<BTreeMap<String, PeerKey>, ConfigError> {
    let mut keys = BTreeMap::new();
    for (name, file) in files {
        let base = format!("keys.{name}");
        if !valid_key_name(&name) {
            return Err(v.invalid(
                base,
                format!(
                    "a key name travels in the peer header: 1..{MAX_KEY_NAME_LEN} of letters, \
                     digits, '_', '-' or '.'"
                ),
            ));
        }
        let (key, text) = match (file.secret, file.secret_file) {
            (Some(secret), None) => (format!("{base}.secret"), secret),
            (None, Some(path)) => {
                let key = format!("{base}.secret_file");
                let text = read_key_file(&path).map_err(|problem| v.invalid(&key, problem))?;
                (key, text)
            }
            (Some(_), Some(_)) => {
                return Err(v.invalid(base, "set one of secret and secret_file, not both"))
            }
            (None, None) => {
                return Err(v.invalid(
                    base,
                    "needs secret = \"<hex>\" or secret_file = \"/path\"; make one with \
                     `openssl rand -hex 32`",
                ))
            }
        };
        let bytes = hex(text.trim()).ok_or_else(|| {
            v.invalid(
                &key,
                "is not hexadecimal text (an even number of 0-9, a-f); make one with \
                 `openssl rand -hex 32`",
            )
        })?;
        if PUBLISHED_KEYS.contains(&bytes.as_slice()) {
            return Err(v.invalid(
                &key,
                "is the example key published with midway: anyone who has read the README could \
                 sign headers with it and use this midway as a relay; make your own with \
                 `openssl rand -hex 32` and give both ends the same",
            ));
        }
        if bytes.len() < MIN_KEY_LEN {
            return Err(v.invalid(
                &key,
                format!(
                    "{} bytes is too short a key; use at least {MIN_KEY_LEN} bytes ({} hex \
                     digits), e.g. `openssl rand -hex 32`",
                    bytes.len(),
                    2 * MIN_KEY_LEN
                ),
            ));
        }
        keys.insert(name, PeerKey::new(bytes));
    }
    Ok(keys)
}

/// The first line of a key file. Only a regular file, and only its first 4 KiB: a typo naming
/// `/dev/urandom` or a huge file is an error, not a start that eats memory.
fn read_key_file(path: &Path) -> Result<String, String> {
    use std::io::Read as _;
    const MAX_KEY_FILE_BYTES: u64 = 4096;
    let cannot = |err: &dyn std::fmt::Display| format!("cannot read {}: {err}", path.display());
    let file = std::fs::File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "cannot read {0}: {e}; make the key once with `umask 077; openssl rand -hex 32 \
                 > {0}` and copy the file to the other midway",
                path.display()
            )
        } else {
            cannot(&e)
        }
    })?;
    let metadata = file.metadata().map_err(|e| cannot(&e))?;
    if !metadata.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let mut text = String::new();
    file.take(MAX_KEY_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| cannot(&e))?;
    Ok(text.lines().next().unwrap_or_default().to_string())
}

fn hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

/// Every `[[peers]]` table, with unique names, an address, a key and a profile that exist, and
/// the warm pool's settings.
pub(super) fn peers(
    v: &Validator<'_>,
    files: Vec<FilePeer>,
    keys: &BTreeMap<String, PeerKey>,
    profiles: &BTreeMap<String, TcpProfile>,
    identity: Option<&Arc<Identity>>,
) -> Result<Vec<PeerConfig>, ConfigError> {
    let mut names = BTreeSet::new();
    let mut peers = Vec::with_capacity(files.len());
    for (index, file) in files.into_iter().enumerate() {
        let section = Section::new(v, format!("peers[{index}]"));
        let name = match file.name {
            Some(name) if !name.trim().is_empty() => name,
            _ => {
                return Err(
                    section.invalid("name", "required: a short unique name, e.g. name = \"gw\"")
                )
            }
        };
        if !names.insert(name.clone()) {
            return Err(section.invalid(
                "name",
                format!("duplicate peer name {name:?}; give every peer its own name"),
            ));
        }
        let text = file.address.ok_or_else(|| {
            section.invalid(
                "address",
                "required: the peer's mode = \"peer\" listener, e.g. address = \"10.9.0.2:7400\"",
            )
        })?;
        let address = TargetAddr::parse(&text)
            .map_err(|problem| section.invalid("address", format!("{text:?}: {problem}")))?;
        let port = match &address {
            TargetAddr::Ip(addr) => addr.port(),
            TargetAddr::Domain(_, port) => *port,
        };
        if port == 0 {
            return Err(section.invalid("address", "port 0 cannot be connected to"));
        }
        let key = file.key.ok_or_else(|| {
            section.invalid(
                "key",
                "required: the name of the [keys.NAME] shared with this peer",
            )
        })?;
        if !keys.contains_key(&key) {
            let known: Vec<&str> = keys.keys().map(String::as_str).collect();
            return Err(section.invalid(
                "key",
                format!(
                    "unknown key {key:?}; define [keys.{key}] (known: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
        let profile = section.profile_name(
            "profile",
            file.profile.as_deref().unwrap_or(DEFAULT_PROFILE),
            profiles,
        )?;
        let destinations = match file.destinations {
            Some(list) if list.is_empty() => {
                return Err(section.invalid(
                    "destinations",
                    "an empty list sends nothing through this peer; leave it out for every \
                     destination or list prefixes",
                ))
            }
            Some(list) => list
                .iter()
                .enumerate()
                .map(|(i, text)| v.prefix(&section.key(&format!("destinations[{i}]")), text))
                .collect::<Result<Vec<_>, _>>()?,
            None => ALL_DESTINATIONS
                .iter()
                .filter_map(|text| text.parse().ok())
                .collect(),
        };
        let warm_connections = file.warm_connections.unwrap_or(DEFAULT_WARM_CONNECTIONS);
        if warm_connections > MAX_WARM_CONNECTIONS {
            return Err(section.invalid(
                "warm_connections",
                format!("{warm_connections} is more than {MAX_WARM_CONNECTIONS}"),
            ));
        }
        let warm_max_idle =
            section.duration("warm_max_idle", file.warm_max_idle, DEFAULT_WARM_MAX_IDLE)?;
        let transport = peer_transport(
            &section,
            file.transport,
            file.fingerprint,
            file.quic,
            identity,
        )?;
        peers.push(PeerConfig {
            name,
            address,
            key,
            profile,
            destinations,
            warm_connections,
            warm_max_idle,
            transport,
        });
    }
    Ok(peers)
}
