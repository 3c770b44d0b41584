//! A `chain` case's configs: midways on several hosts of the path, each handing its connections
//! to the next over the peer segment (`tcp`, `tls` or `quic`), with fresh pre-shared keys and,
//! for the encrypted transports, a fresh key pair per midway.

use std::net::SocketAddr;
use std::path::PathBuf;

use midway_config::{ConfigBuilder, FilePeer, FileQuic, FileTls, ListenerBuilder, TransportName};

use super::{add_profiles, metrics_listen, ConfigGenError, Placement, LISTENER_NAME, PROXY_PORT};
use crate::scenario::ChainCase;

/// Idle connections each midway of a chain keeps open to the next, so a client's connection
/// pays no handshake and no slow start on the peer segment (issue 16: the warm pool). Eight: a
/// browser opens six connections to a host and a preconnect at once (the page loads of
/// scenarios/peer-transports-web.toml), and a pool that runs dry makes the rest pay a TCP (and
/// TLS) handshake across the long link, as a gateway in service with many subscribers would not.
pub(crate) const CHAIN_WARM_CONNECTIONS: usize = 8;
/// Bytes of a chain's pre-shared keys (midway asks for at least 16).
pub(crate) const CHAIN_KEY_BYTES: usize = 32;

/// Name of the pre-shared key between the chain's midways on `from` and `to`.
pub(crate) fn chain_key_name(from: &str, to: &str) -> String {
    format!("lab-{from}-{to}")
}

/// A fresh random pre-shared key as hexadecimal text, one per pair of neighbouring midways of a
/// run (never written anywhere but the point's configs).
pub(crate) fn random_key_hex() -> String {
    let bytes: [u8; CHAIN_KEY_BYTES] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A chain midway's key pair for the encrypted transports (written by the runner into the
/// point's folder) and its fingerprint, which its neighbours pin.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChainIdentity {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    pub(crate) fingerprint: String,
}

/// Name of the TLS fallback listener a `quic` chain's midways have beside their QUIC one (same
/// port, TCP).
pub(crate) const FALLBACK_LISTENER_NAME: &str = "lab-tls";

/// Keys of `[peers.quic]` only the connecting side sets.
const EDGE_ONLY_QUIC_KEYS: [&str; 2] = ["handshake_timeout", "fallback"];

/// The configs of a chain's midways, in the order of `chain.hosts`. `placements[i]` is host i's
/// place on the path (its address and interface toward the client side); `keys[i]` the hex key
/// shared by hosts i and i + 1; `identities[i]` host i's key pair (one per host for `tls` and
/// `quic`, none for `tcp`).
///
/// With `transport = "quic"` every accepting midway has a QUIC peer listener and, at the same
/// port, a TLS one for the fallback; the case's `quic` table goes to both ends (`[peers.quic]`
/// and `[listeners.quic]`, the edge-only keys to the connecting end only).
///
/// The first midway intercepts the client's connections transparently (as a transparent `midway`
/// case) and sends them through the next; every other one has a peer listener that accepts the
/// previous midway's connections with their key and either sends them on through the next or,
/// the last one, connects to the server. The peer segment's profile is set at both of its ends:
/// as the sending midway's `[[peers]]` profile and as the accepting midway's local profile (the
/// accepting end sends the server's data back, so its congestion control is the one that moves
/// a download).
pub(crate) fn chain_configs(
    chain: &ChainCase,
    placements: &[Placement],
    keys: &[String],
    identities: &[ChainIdentity],
) -> Result<Vec<String>, ConfigGenError> {
    let hosts = &chain.hosts;
    assert_eq!(placements.len(), hosts.len(), "one placement per midway");
    assert_eq!(keys.len() + 1, hosts.len(), "one key per peer segment");
    let encrypted = chain.transport != TransportName::Tcp;
    assert_eq!(
        identities.len(),
        if encrypted { hosts.len() } else { 0 },
        "one key pair per midway of an encrypted chain"
    );
    let quic = chain.transport == TransportName::Quic;
    let (peer_quic, listener_quic) = quic_tables(chain)?;
    let listen = format!("0.0.0.0:{PROXY_PORT}");
    let mut configs = Vec::with_capacity(hosts.len());
    for (index, placement) in placements.iter().enumerate() {
        let first = index == 0;
        let last = index + 1 == hosts.len();
        // A peer listener checks the client named in the peer header as well as the connecting
        // midway, so both prefixes are allowed.
        let mut allowed = vec![placement.client_prefix.clone()];
        if !first {
            allowed.push(placement.route_prefix.clone());
        }
        let mut builder = ConfigBuilder::new(allowed)
            .metrics(metrics_listen())
            .spool_dir(&placement.spool_dir);
        let mut fallback = None;
        let mut listener = if first {
            let mut listener = ListenerBuilder::transparent(
                LISTENER_NAME,
                &listen,
                [placement.client_iface.clone()],
                [placement.server.port()],
            );
            if let Some(profile) = &chain.local_profile {
                listener = listener.local_profile(profile);
            }
            listener
        } else {
            let key_name = chain_key_name(&hosts[index - 1], &hosts[index]);
            builder = builder.key(&key_name, &keys[index - 1]);
            let mut listener = ListenerBuilder::peer(LISTENER_NAME, &listen, [key_name.clone()]);
            if let Some(profile) = &chain.peer_profile {
                listener = listener.local_profile(profile);
            }
            if quic {
                let mut tls = ListenerBuilder::peer(FALLBACK_LISTENER_NAME, &listen, [key_name]);
                if let Some(profile) = &chain.peer_profile {
                    tls = tls.local_profile(profile);
                }
                fallback = Some(tls);
            }
            listener
        };
        if last {
            if let Some(profile) = &chain.remote_profile {
                listener = listener.remote_profile(profile);
                fallback = fallback.map(|tls| tls.remote_profile(profile));
            }
        } else {
            let next = &hosts[index + 1];
            let key_name = chain_key_name(&hosts[index], next);
            builder = builder.key(&key_name, &keys[index]).peer(FilePeer {
                name: Some(next.clone()),
                address: Some(
                    SocketAddr::new(placements[index + 1].proxy_addr, PROXY_PORT).to_string(),
                ),
                key: Some(key_name),
                profile: chain.peer_profile.clone(),
                destinations: None,
                warm_connections: Some(CHAIN_WARM_CONNECTIONS),
                warm_max_idle: None,
                transport: encrypted.then_some(chain.transport),
                fingerprint: identities.get(index + 1).map(|i| i.fingerprint.clone()),
                quic: quic.then(|| peer_quic.clone()),
            });
            listener = listener.via([next.clone()]);
            fallback = fallback.map(|tls| tls.via([next.clone()]));
        }
        let mut file = builder.listener(listener.build()).build();
        if encrypted {
            let me = &identities[index];
            file.tls = Some(FileTls {
                cert: Some(me.cert.clone()),
                key: Some(me.key.clone()),
            });
            if !first {
                let previous = vec![identities[index - 1].fingerprint.clone()];
                let accepting = &mut file.listeners[0];
                accepting.transport = Some(chain.transport);
                accepting.peer_fingerprints = Some(previous.clone());
                accepting.quic = quic.then(|| listener_quic.clone());
                if let Some(tls) = fallback {
                    let mut tls = tls.build();
                    tls.transport = Some(TransportName::Tls);
                    tls.peer_fingerprints = Some(previous);
                    file.listeners.push(tls);
                }
            }
        }
        let mut config = file.to_table().map_err(ConfigGenError::Serialize)?;
        add_profiles(&mut config, &chain.profiles)?;
        configs.push(toml::to_string(&config).map_err(ConfigGenError::Serialize)?);
    }
    Ok(configs)
}

/// The case's `quic` table as the connecting end's `[peers.quic]` and the accepting end's
/// `[listeners.quic]` (without the edge-only keys).
fn quic_tables(chain: &ChainCase) -> Result<(FileQuic, FileQuic), ConfigGenError> {
    let parse = |table: toml::Table| {
        table
            .try_into::<FileQuic>()
            .map_err(|e| ConfigGenError::Quic(e.to_string()))
    };
    let mut listener = chain.quic.clone();
    for key in EDGE_ONLY_QUIC_KEYS {
        listener.remove(key);
    }
    Ok((parse(chain.quic.clone())?, parse(listener)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host i's place on a chain client - m0 - m1 - m2 - server: address 10.0.(i+1).2 on its
    /// link toward the client side.
    fn chain_placements(hosts: usize) -> Vec<Placement> {
        (0..hosts)
            .map(|i| Placement {
                server: "10.0.9.2:5001".parse().unwrap(),
                proxy_addr: format!("10.0.{}.2", i + 1).parse().unwrap(),
                client_prefix: "10.0.1.0/24".into(),
                route_prefix: format!("10.0.{}.0/24", i + 1),
                client_iface: format!("e-toward-{i}"),
                spool_dir: format!("/tmp/spool-{i}").into(),
            })
            .collect()
    }

    fn chain(hosts: &[&str]) -> ChainCase {
        ChainCase {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            peer_profile: Some("peer".into()),
            local_profile: Some("end".into()),
            remote_profile: Some("end".into()),
            profiles: toml::from_str(
                "[peer]\ninherits = \"wan\"\ncongestion_control = \"highspeed\"\n\
                 [end]\ninherits = \"lan\"\ncongestion_control = \"reno\"",
            )
            .unwrap(),
            transport: TransportName::Tcp,
            quic: toml::Table::new(),
        }
    }

    #[test]
    fn chain_configs_read_back_through_midway_config_with_via_keys_and_peer_listeners() {
        use midway_config::{FileConfig, ModeName};
        let keys = ["ab".repeat(32), "cd".repeat(32)];
        let configs = chain_configs(
            &chain(&["edge", "middle", "gateway"]),
            &chain_placements(3),
            &keys,
            &[],
        )
        .unwrap();
        assert_eq!(configs.len(), 3);
        let parsed: Vec<FileConfig> = configs
            .iter()
            .map(|text| toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}")))
            .collect();
        let (edge, middle, gateway) = (&parsed[0], &parsed[1], &parsed[2]);
        let secret = |config: &FileConfig, name: &str| {
            config.keys[name].secret.clone().expect("an inline key")
        };

        // The edge: transparent on the client's interface and the workload's port, via middle.
        let listener = &edge.listeners[0];
        assert_eq!(listener.mode, Some(ModeName::Transparent));
        let nftables = listener.nftables.as_ref().unwrap();
        assert_eq!(nftables.interfaces, ["e-toward-0"]);
        assert_eq!(nftables.ports, [5001]);
        assert_eq!(listener.via.as_deref(), Some(&["middle".to_string()][..]));
        assert_eq!(listener.local_profile.as_deref(), Some("end"));
        assert_eq!(listener.remote_profile, None);
        assert_eq!(edge.peers.len(), 1);
        let peer = &edge.peers[0];
        assert_eq!(peer.name.as_deref(), Some("middle"));
        assert_eq!(peer.address.as_deref(), Some("10.0.2.2:8080"));
        assert_eq!(peer.key.as_deref(), Some("lab-edge-middle"));
        assert_eq!(peer.profile.as_deref(), Some("peer"));
        assert_eq!(peer.warm_connections, Some(CHAIN_WARM_CONNECTIONS));
        assert_eq!(secret(edge, "lab-edge-middle"), keys[0]);
        assert_eq!(edge.keys.len(), 1);
        assert_eq!(
            edge.proxy.allowed_clients.as_deref(),
            Some(&["10.0.1.0/24".to_string()][..])
        );
        assert_eq!(
            edge.profiles["peer"].congestion_control.as_deref(),
            Some("highspeed")
        );

        // The middle: a peer listener taking the edge's key, sending on to the gateway.
        let listener = &middle.listeners[0];
        assert_eq!(listener.mode, Some(ModeName::Peer));
        assert_eq!(
            listener.keys.as_deref(),
            Some(&["lab-edge-middle".to_string()][..])
        );
        assert_eq!(listener.via.as_deref(), Some(&["gateway".to_string()][..]));
        assert_eq!(listener.local_profile.as_deref(), Some("peer"));
        assert!(listener.nftables.is_none());
        assert_eq!(secret(middle, "lab-edge-middle"), keys[0]);
        assert_eq!(secret(middle, "lab-middle-gateway"), keys[1]);
        assert_eq!(middle.peers[0].address.as_deref(), Some("10.0.3.2:8080"));
        assert_eq!(
            middle.proxy.allowed_clients.as_deref(),
            Some(&["10.0.1.0/24".to_string(), "10.0.2.0/24".to_string()][..])
        );

        // The gateway: a peer listener connecting to the server, no peers of its own.
        let listener = &gateway.listeners[0];
        assert_eq!(listener.mode, Some(ModeName::Peer));
        assert_eq!(
            listener.keys.as_deref(),
            Some(&["lab-middle-gateway".to_string()][..])
        );
        assert_eq!(listener.via, None);
        assert_eq!(listener.remote_profile.as_deref(), Some("end"));
        assert!(gateway.peers.is_empty());
        assert_eq!(gateway.keys.len(), 1);
        assert_eq!(secret(gateway, "lab-middle-gateway"), keys[1]);
        for config in &parsed {
            assert_eq!(config.listeners.len(), 1);
            assert!(config.metrics.is_some());
        }
        // midway's own parser takes the edge's config as it is today.
        midway_proxy::config::parse_config(&configs[0], "generated").unwrap();
    }

    #[test]
    fn every_chain_config_is_accepted_by_midway() {
        let configs = chain_configs(
            &chain(&["edge", "middle", "gateway"]),
            &chain_placements(3),
            &["ab".repeat(32), "cd".repeat(32)],
            &[],
        )
        .unwrap();
        for text in &configs {
            midway_proxy::config::parse_config(text, "generated")
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
        }
    }

    #[test]
    fn chain_keys_are_fresh_hex_of_the_length_midway_wants() {
        let (a, b) = (random_key_hex(), random_key_hex());
        assert_eq!(a.len(), 2 * CHAIN_KEY_BYTES);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
        // A two-midway chain has one peer segment, so one key, in both configs.
        let configs = chain_configs(
            &chain(&["edge", "gateway"]),
            &chain_placements(2),
            std::slice::from_ref(&a),
            &[],
        )
        .unwrap();
        assert!(configs.iter().all(|text| text.contains(&a)));
    }

    /// A two-midway QUIC chain: each side pins the other's key, the gateway has a QUIC peer
    /// listener and a TLS fallback listener at the same port, the case's `quic` table reaches
    /// both ends (the edge-only keys the edge only), and midway accepts both configs with key
    /// files from `midway_tls`.
    #[test]
    fn a_quic_chain_pins_keys_and_gives_the_gateway_a_tls_fallback() {
        use midway_config::FileConfig;
        let dir = tempfile::tempdir().unwrap();
        let identities: Vec<ChainIdentity> = ["edge", "gateway"]
            .iter()
            .map(|host| {
                let generated =
                    midway_tls::generate_identity(host, std::time::Duration::from_secs(3600))
                        .unwrap();
                let host_dir = dir.path().join(host);
                midway_tls::write_identity(&host_dir, &generated).unwrap();
                ChainIdentity {
                    cert: host_dir.join(midway_tls::CERT_FILE),
                    key: host_dir.join(midway_tls::KEY_FILE),
                    fingerprint: generated.fingerprint.to_string(),
                }
            })
            .collect();
        let mut case = chain(&["edge", "gateway"]);
        case.transport = TransportName::Quic;
        case.quic = toml::from_str(
            "congestion_control = \"bbr\"\npath_rtt = \"600ms\"\nhandshake_timeout = \"2s\"",
        )
        .unwrap();
        let configs =
            chain_configs(&case, &chain_placements(2), &["ab".repeat(32)], &identities).unwrap();
        let parsed: Vec<FileConfig> = configs
            .iter()
            .map(|text| toml::from_str(text).unwrap())
            .collect();
        let (edge, gateway) = (&parsed[0], &parsed[1]);
        let peer = &edge.peers[0];
        assert_eq!(peer.transport, Some(TransportName::Quic));
        assert_eq!(peer.fingerprint.as_ref(), Some(&identities[1].fingerprint));
        let quic = peer.quic.as_ref().unwrap();
        assert_eq!(quic.congestion_control.as_deref(), Some("bbr"));
        assert!(quic.handshake_timeout.is_some());
        assert_eq!(
            edge.tls.as_ref().unwrap().cert.as_ref(),
            Some(&identities[0].cert)
        );
        assert_eq!(gateway.listeners.len(), 2);
        let (tunnels, tls) = (&gateway.listeners[0], &gateway.listeners[1]);
        assert_eq!(tunnels.transport, Some(TransportName::Quic));
        assert_eq!(tls.transport, Some(TransportName::Tls));
        assert_eq!(tunnels.listen, tls.listen);
        for listener in [tunnels, tls] {
            assert_eq!(
                listener.peer_fingerprints.as_deref(),
                Some(&[identities[0].fingerprint.clone()][..])
            );
            assert_eq!(listener.remote_profile.as_deref(), Some("end"));
        }
        let listener_quic = tunnels.quic.as_ref().unwrap();
        assert_eq!(listener_quic.congestion_control.as_deref(), Some("bbr"));
        assert!(listener_quic.handshake_timeout.is_none());
        for text in &configs {
            midway_proxy::config::parse_config(text, "generated")
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
        }
    }
}
