//! Stage 3 for one `[[listeners]]` table: its identity, the keys its mode allows, the
//! intercept, the HTTP engine or byte relay, and its profiles. Checks run in this order and
//! the first problem is the one reported.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use midway_relay::{BufferConfig, RelayModel, SpoolConfig};
use midway_tcp::TcpProfile;

use super::http::http_config;
use super::validate::{Section, Validator};
use super::{
    ApplicationName, AuthName, ClientProfileOverride, ConfigError, FileClientProfile, FileListener,
    FileNftables, FileUser, Intercept, ListenerConfig, ModeName, NftConfig, PeerConfig, PeerKey,
    RelayName, Socks5Auth, TargetAddr, DEFAULT_BUFFER_BYTES, DEFAULT_NFT_MARK,
    DEFAULT_NFT_ROUTE_TABLE, DEFAULT_NFT_TABLE, DEFAULT_PROFILE, DEFAULT_SPOOL_MAX_BYTES,
    DEFAULT_SPOOL_MEMORY_BYTES,
};

/// The peers and keys a listener's `via` and `keys` may name.
pub(super) struct PeerNames<'a> {
    pub(super) peers: &'a [PeerConfig],
    pub(super) keys: &'a BTreeMap<String, PeerKey>,
    /// `[tls]`, which a peer listener with `transport = "tls"` needs.
    pub(super) identity: Option<&'a std::sync::Arc<midway_tls::Identity>>,
}

/// `listeners[index]` -> [`ListenerConfig`], with `profiles` the names it may use.
pub(super) fn validate_listener(
    v: &Validator<'_>,
    index: usize,
    mut file: FileListener,
    profiles: &BTreeMap<String, TcpProfile>,
    names: &PeerNames<'_>,
) -> Result<ListenerConfig, ConfigError> {
    let section = Section::new(v, format!("listeners[{index}]"));
    let name = required_name(&section, file.name.as_deref())?;
    let mode = file.mode.ok_or_else(|| {
        section.invalid(
            "mode",
            "required: \"forward\", \"socks5\", \"transparent\", \"http\" or \"peer\"",
        )
    })?;
    let listen = listen_address(&section, file.listen.as_deref())?;
    check_mode_keys(&section, mode, &file)?;
    let speaks_http = mode == ModeName::Http || file.application == Some(ApplicationName::Http);
    check_http_keys(&section, speaks_http, &file)?;

    let intercept = match mode {
        ModeName::Forward => forward_intercept(&section, file.target.take())?,
        ModeName::Socks5 => socks5_intercept(&section, file.auth, file.users.take())?,
        ModeName::Transparent => transparent_intercept(
            &section,
            file.nftables.take(),
            file.spoof_client_address,
            listen,
        )?,
        ModeName::Http => Intercept::Http,
        ModeName::Peer => {
            let transport = super::transport::listener_transport(
                &section,
                file.transport,
                file.peer_fingerprints.take(),
                file.quic.take(),
                names.identity,
            )?;
            peer_intercept(
                &section,
                file.keys.take(),
                file.spoof_client_address,
                transport,
                names,
            )?
        }
    };
    let via = via(&section, speaks_http, file.via.take(), names)?;
    let http = if speaks_http {
        Some(http_config(
            v,
            &section.key("http"),
            file.http.take().unwrap_or_default(),
        )?)
    } else {
        None
    };
    let relay = relay_model(&section, &file)?;
    let proxy_protocol =
        super::proxy_protocol::proxy_protocol_settings(&section, mode, speaks_http, &file)?;

    let local_profile = section.profile_name(
        "local_profile",
        file.local_profile.as_deref().unwrap_or(DEFAULT_PROFILE),
        profiles,
    )?;
    let remote_profile = section.profile_name(
        "remote_profile",
        file.remote_profile.as_deref().unwrap_or(DEFAULT_PROFILE),
        profiles,
    )?;
    let client_profiles = client_profiles(&section, file.client_profiles, profiles)?;

    Ok(ListenerConfig {
        name,
        listen,
        intercept,
        relay,
        http,
        local_profile,
        remote_profile,
        client_profiles,
        via,
        carry_dscp: file.carry_dscp.unwrap_or(false),
        proxy_protocol,
    })
}

/// A peer listener: at least one key, each defined. Without a key it would be an open proxy
/// for anyone who can reach it, so it refuses to start.
fn peer_intercept(
    section: &Section<'_>,
    keys: Option<Vec<String>>,
    spoof_client_address: Option<bool>,
    transport: super::ListenerTransport,
    names: &PeerNames<'_>,
) -> Result<Intercept, ConfigError> {
    let keys = keys.unwrap_or_default();
    if keys.is_empty() {
        return Err(section.invalid(
            "keys",
            "a peer listener without a key refuses to start (it would relay for anyone):              name the [keys.NAME] connecting midways sign with, e.g. keys = [\"edge-a\"]",
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, key) in keys.iter().enumerate() {
        if !names.keys.contains_key(key) {
            return Err(section.invalid(
                &format!("keys[{i}]"),
                format!("unknown key {key:?}; define [keys.{key}]"),
            ));
        }
        if !seen.insert(key) {
            return Err(section.invalid(&format!("keys[{i}]"), format!("{key:?} is listed twice")));
        }
    }
    Ok(Intercept::Peer {
        keys,
        spoof_client_address: spoof_client_address.unwrap_or(false),
        transport,
    })
}

/// `via`: peers (by name) that exist, on a listener that relays bytes. HTTP-speaking listeners
/// pool their upstream connections per origin and are not wired to peers yet.
fn via(
    section: &Section<'_>,
    speaks_http: bool,
    via: Option<Vec<String>>,
    names: &PeerNames<'_>,
) -> Result<Vec<usize>, ConfigError> {
    let Some(via) = via else {
        return Ok(Vec::new());
    };
    if speaks_http {
        return Err(section.invalid(
            "via",
            "listeners that speak HTTP (mode = \"http\", application = \"http\") cannot send \
             their upstream connections through peers yet; use a socks5, forward or \
             transparent listener with via, or remove it",
        ));
    }
    if via.is_empty() {
        return Err(section.invalid(
            "via",
            "an empty list sends nothing through a peer; remove it or name [[peers]]",
        ));
    }
    let mut indices = Vec::with_capacity(via.len());
    for (i, name) in via.iter().enumerate() {
        let Some(index) = names.peers.iter().position(|p| &p.name == name) else {
            let known: Vec<&str> = names.peers.iter().map(|p| p.name.as_str()).collect();
            return Err(section.invalid(
                &format!("via[{i}]"),
                format!(
                    "unknown peer {name:?}; define a [[peers]] table with name = {name:?} \
                     (known: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        };
        if indices.contains(&index) {
            return Err(section.invalid(&format!("via[{i}]"), format!("{name:?} is listed twice")));
        }
        indices.push(index);
    }
    Ok(indices)
}

fn required_name(section: &Section<'_>, name: Option<&str>) -> Result<String, ConfigError> {
    match name {
        Some(name) if !name.trim().is_empty() => Ok(name.to_string()),
        _ => Err(section.invalid("name", "required: a short unique name, e.g. name = \"fwd\"")),
    }
}

fn listen_address(section: &Section<'_>, text: Option<&str>) -> Result<SocketAddr, ConfigError> {
    let text =
        text.ok_or_else(|| section.invalid("listen", "required: e.g. listen = \"0.0.0.0:9000\""))?;
    text.parse().map_err(|_| {
        section.invalid(
            "listen",
            format!("{text:?} is not ip:port; write e.g. \"0.0.0.0:9000\" or \"[::]:9000\""),
        )
    })
}

fn mode_str(mode: ModeName) -> &'static str {
    match mode {
        ModeName::Forward => "forward",
        ModeName::Socks5 => "socks5",
        ModeName::Transparent => "transparent",
        ModeName::Http => "http",
        ModeName::Peer => "peer",
    }
}

/// Refuses keys that belong to another mode than the listener's.
fn check_mode_keys(
    section: &Section<'_>,
    mode: ModeName,
    file: &FileListener,
) -> Result<(), ConfigError> {
    let mode_keys = [
        ("target", file.target.is_some(), ModeName::Forward),
        ("auth", file.auth.is_some(), ModeName::Socks5),
        ("users", file.users.is_some(), ModeName::Socks5),
        ("nftables", file.nftables.is_some(), ModeName::Transparent),
        ("keys", file.keys.is_some(), ModeName::Peer),
        ("transport", file.transport.is_some(), ModeName::Peer),
        (
            "peer_fingerprints",
            file.peer_fingerprints.is_some(),
            ModeName::Peer,
        ),
        ("quic", file.quic.is_some(), ModeName::Peer),
    ];
    for (field, set, wanted) in mode_keys {
        if set && mode != wanted {
            return Err(section.invalid(
                field,
                format!(
                    "only allowed when mode = \"{}\" (this listener has mode = \"{}\"); remove it",
                    mode_str(wanted),
                    mode_str(mode)
                ),
            ));
        }
    }
    if file.spoof_client_address.is_some()
        && !matches!(mode, ModeName::Transparent | ModeName::Peer)
    {
        return Err(section.invalid(
            "spoof_client_address",
            format!(
                "only allowed when mode = \"transparent\" or \"peer\" (this listener has \
                 mode = \"{}\"); remove it",
                mode_str(mode)
            ),
        ));
    }
    if mode != ModeName::Transparent && file.application.is_some() {
        return Err(section.invalid(
            "application",
            format!(
                "only allowed when mode = \"transparent\" (this listener has mode = \"{}\"); \
                 for an explicit HTTP proxy write mode = \"http\" instead",
                mode_str(mode)
            ),
        ));
    }
    Ok(())
}

/// `[listeners.http]` only on a listener that speaks HTTP; on one that does, no byte-relay
/// key and nothing a pooled upstream connection cannot honour.
fn check_http_keys(
    section: &Section<'_>,
    speaks_http: bool,
    file: &FileListener,
) -> Result<(), ConfigError> {
    if !speaks_http {
        if file.http.is_some() {
            return Err(section.invalid(
                "http",
                "[listeners.http] only applies to mode = \"http\" or to a transparent listener \
                 with application = \"http\"; remove it or set one of those",
            ));
        }
        return Ok(());
    }
    // The HTTP engine answers requests itself (CONNECT tunnels included): no byte relay.
    section.refuse_set_keys(
        &[
            ("relay", file.relay.is_some()),
            ("buffer_bytes", file.buffer_bytes.is_some()),
            ("splice", file.splice.is_some()),
            ("spool_memory_bytes", file.spool_memory_bytes.is_some()),
            ("spool_max_bytes", file.spool_max_bytes.is_some()),
        ],
        "an HTTP listener does not relay bytes, so relay settings do not apply; remove it \
         (HTTP settings go in [listeners.http])",
    )?;
    if file.carry_dscp == Some(true) {
        return Err(section.invalid(
            "carry_dscp",
            "cannot be used with a listener that speaks HTTP: pooled upstream connections are \
             shared by all clients, so they cannot carry one client's marking; set it to false \
             or use a forward, socks5 or transparent listener",
        ));
    }
    if file.spoof_client_address == Some(true) {
        return Err(section.invalid(
            "spoof_client_address",
            "cannot be used with application = \"http\": pooled upstream connections are \
             shared by all clients, so they cannot carry one client's address; set it to \
             false or use application = \"tcp\"",
        ));
    }
    if let Some(i) = file
        .client_profiles
        .iter()
        .position(|o| o.remote_profile.is_some())
    {
        return Err(section.invalid(
            &format!("client_profiles[{i}].remote_profile"),
            "an HTTP listener pools upstream connections across clients, so the upstream \
             segment has one profile: set the listener's remote_profile instead",
        ));
    }
    Ok(())
}

fn forward_intercept(
    section: &Section<'_>,
    target: Option<String>,
) -> Result<Intercept, ConfigError> {
    let text = target.ok_or_else(|| {
        section.invalid(
            "target",
            "is required when mode = \"forward\"; e.g. target = \"10.2.0.2:5201\"",
        )
    })?;
    let target = TargetAddr::parse(&text)
        .map_err(|problem| section.invalid("target", format!("{text:?}: {problem}")))?;
    Ok(Intercept::Forward { target })
}

fn socks5_intercept(
    section: &Section<'_>,
    auth: Option<AuthName>,
    users: Option<Vec<FileUser>>,
) -> Result<Intercept, ConfigError> {
    let auth = match (auth.unwrap_or(AuthName::None), users) {
        (AuthName::None, None) => Socks5Auth::None,
        (AuthName::None, Some(_)) => {
            return Err(section.invalid(
                "users",
                "users need auth = \"password\"; set it or remove users",
            ))
        }
        (AuthName::Password, None) => {
            return Err(section.invalid(
                "users",
                "auth = \"password\" requires users = [{ name = \"...\", password = \"...\" }]",
            ))
        }
        (AuthName::Password, Some(users)) => Socks5Auth::Password(password_users(section, users)?),
    };
    Ok(Intercept::Socks5 { auth })
}

/// SOCKS5 users as (name, password) pairs: at least one, unique names, RFC 1929 lengths.
fn password_users(
    section: &Section<'_>,
    users: Vec<FileUser>,
) -> Result<Vec<(String, String)>, ConfigError> {
    if users.is_empty() {
        return Err(section.invalid("users", "auth = \"password\" requires at least one user"));
    }
    let mut seen = BTreeSet::new();
    let mut pairs = Vec::with_capacity(users.len());
    for (i, user) in users.into_iter().enumerate() {
        // RFC 1929 carries each field in 1..=255 bytes.
        if user.name.is_empty() || user.name.len() > 255 {
            return Err(section.invalid(&format!("users[{i}].name"), "must be 1..255 bytes"));
        }
        if user.password.is_empty() || user.password.len() > 255 {
            return Err(section.invalid(&format!("users[{i}].password"), "must be 1..255 bytes"));
        }
        if !seen.insert(user.name.clone()) {
            return Err(section.invalid(
                &format!("users[{i}].name"),
                format!("duplicate user {:?}", user.name),
            ));
        }
        pairs.push((user.name, user.password));
    }
    Ok(pairs)
}

fn transparent_intercept(
    section: &Section<'_>,
    nftables: Option<FileNftables>,
    spoof_client_address: Option<bool>,
    listen: SocketAddr,
) -> Result<Intercept, ConfigError> {
    let nft = nftables.unwrap_or(FileNftables {
        manage: None,
        table: None,
        interfaces: Vec::new(),
        ports: Vec::new(),
        mark: None,
        route_table: None,
    });
    let table = nft.table.unwrap_or_else(|| DEFAULT_NFT_TABLE.to_string());
    if table.is_empty()
        || !table
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(section.invalid(
            "nftables.table",
            format!("{table:?} is not a valid table name; use letters, digits, '_' or '-'"),
        ));
    }
    for (i, iface) in nft.interfaces.iter().enumerate() {
        // IFNAMSIZ is 16 including the terminating NUL.
        if iface.is_empty()
            || iface.len() > 15
            || !iface
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.@".contains(c))
        {
            return Err(section.invalid(
                &format!("nftables.interfaces[{i}]"),
                format!("{iface:?} is not an interface name (1..15 of letters, digits, '_-.@')"),
            ));
        }
    }
    if nft.ports.contains(&0) {
        return Err(section.invalid(
            "nftables.ports",
            "port 0 cannot be intercepted; use 1..65535",
        ));
    }
    let mark = nft.mark.unwrap_or(DEFAULT_NFT_MARK);
    if mark == 0 {
        return Err(section.invalid("nftables.mark", "must not be 0 (0 means unmarked)"));
    }
    let route_table = nft.route_table.unwrap_or(DEFAULT_NFT_ROUTE_TABLE);
    // 253..255 are the kernel's default/main/local tables.
    if route_table == 0 || (253..=255).contains(&route_table) {
        return Err(section.invalid(
            "nftables.route_table",
            "must be a table of its own (1..252 or above 255), not default/main/local",
        ));
    }
    if listen.port() == 0 {
        return Err(section.invalid(
            "listen",
            "a transparent listener needs a fixed port for the tproxy rule",
        ));
    }
    Ok(Intercept::Transparent {
        spoof_client_address: spoof_client_address.unwrap_or(false),
        nftables: NftConfig {
            manage: nft.manage.unwrap_or(true),
            table,
            interfaces: nft.interfaces,
            ports: nft.ports,
            mark,
            route_table,
        },
    })
}

/// The byte relay of split connections: buffer (optionally spliced) or spool.
fn relay_model(section: &Section<'_>, file: &FileListener) -> Result<RelayModel, ConfigError> {
    let relay_name = file.relay.unwrap_or(RelayName::Buffer);
    let buffer_bytes = file.buffer_bytes.unwrap_or(DEFAULT_BUFFER_BYTES);
    if buffer_bytes < 4096 {
        return Err(section.invalid("buffer_bytes", "must be at least 4096"));
    }
    if relay_name == RelayName::Buffer
        && (file.spool_memory_bytes.is_some() || file.spool_max_bytes.is_some())
    {
        let field = if file.spool_memory_bytes.is_some() {
            "spool_memory_bytes"
        } else {
            "spool_max_bytes"
        };
        return Err(section.invalid(
            field,
            "spool_memory_bytes / spool_max_bytes only apply with relay = \"spool\"",
        ));
    }
    if relay_name == RelayName::Spool && file.splice.is_some() {
        return Err(section.invalid("splice", "only applies with relay = \"buffer\""));
    }
    Ok(match relay_name {
        RelayName::Buffer => RelayModel::Buffer(BufferConfig {
            buffer_bytes,
            splice: file.splice.unwrap_or(true),
        }),
        RelayName::Spool => {
            let memory_bytes = file
                .spool_memory_bytes
                .unwrap_or(DEFAULT_SPOOL_MEMORY_BYTES);
            if memory_bytes < 4096 {
                return Err(section.invalid("spool_memory_bytes", "must be at least 4096"));
            }
            RelayModel::Spool(SpoolConfig {
                memory_bytes,
                max_spool_bytes: file.spool_max_bytes.unwrap_or(DEFAULT_SPOOL_MAX_BYTES),
                buffer_bytes,
            })
        }
    })
}

/// Per-client profile overrides, longest prefix first.
fn client_profiles(
    section: &Section<'_>,
    overrides: Vec<FileClientProfile>,
    profiles: &BTreeMap<String, TcpProfile>,
) -> Result<Vec<ClientProfileOverride>, ConfigError> {
    let mut client_profiles = Vec::with_capacity(overrides.len());
    for (i, over) in overrides.into_iter().enumerate() {
        let base = format!("client_profiles[{i}]");
        let prefix = section
            .v
            .prefix(&section.key(&format!("{base}.prefix")), &over.prefix)?;
        if over.local_profile.is_none() && over.remote_profile.is_none() {
            return Err(section.invalid(
                &base,
                "names neither local_profile nor remote_profile; add one or remove it",
            ));
        }
        let local_profile = over
            .local_profile
            .map(|n| section.profile_name(&format!("{base}.local_profile"), &n, profiles))
            .transpose()?;
        let remote_profile = over
            .remote_profile
            .map(|n| section.profile_name(&format!("{base}.remote_profile"), &n, profiles))
            .transpose()?;
        client_profiles.push(ClientProfileOverride {
            prefix,
            local_profile,
            remote_profile,
        });
    }
    // Longest prefix first; stable sort keeps file order among equal lengths.
    client_profiles.sort_by_key(|o| std::cmp::Reverse(o.prefix.prefix_len()));
    Ok(client_profiles)
}
