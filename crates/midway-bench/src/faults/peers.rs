//! The two-midway paths: the client connects to an edge (the router's midway, a forward
//! listener with `via` one of three `[[peers]]`), the edge relays over the peer segment (the
//! router-server link) to a gateway midway in the server host, which connects to the server
//! there. One peer and one gateway listener per transport: plain TCP, TLS 1.3 over each TCP
//! connection, and a QUIC tunnel (a UDP listener, with a TLS listener at the same port for the
//! edge's fallback). Both midways' key pairs come from the real `midway peer keygen`; each pins
//! the other's fingerprint.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use midway_config::{
    ConfigBuilder, FileConfig, FilePeer, FileQuic, FileTls, ListenerBuilder, TransportName,
};

use super::plan::{Route, PEER_PATHS};
use super::{IDLE_TIMEOUT, SERVER_PORT};
use crate::netns::{CLIENT_PREFIX, SERVER_ADDR};

/// The key both midways sign their peer headers with (the campaign's own, never a secret).
const KEY_NAME: &str = "faults";
const KEY_HEX: &str = "6d6964776179206661756c742063616d706169676e206b6579202d207075626c";
/// The gateway's peer listeners: the first port of three, one per transport in
/// [`PEER_PATHS`] order. The QUIC one is a UDP socket, with the TLS fallback listener on the
/// same TCP port.
pub(super) const GATEWAY_FIRST_PORT: u16 = 7400;
/// The prefix the gateway takes connections from: the edge's address on the router-server
/// link.
const EDGE_PREFIX: &str = "10.0.2.0/24";
/// A warm connection unused this long is replaced: below the gateway's idle timeout, which
/// closes a warm connection whose header does not come.
const WARM_MAX_IDLE: Duration = Duration::from_secs(1);
/// The QUIC tunnel's idle timeout on both ends: a peer-link outage (under a second) loses no
/// connection; a tunnel whose gateway was killed is given up after this long.
const QUIC_IDLE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the edge waits for a tunnel's handshake before it falls back to TLS.
const QUIC_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);

/// The transport of a two-midway path's peer segment, as the labels and configs name it.
pub(super) fn transport_name(transport: TransportName) -> &'static str {
    match transport {
        TransportName::Tcp => "tcp",
        TransportName::Tls => "tls",
        TransportName::Quic => "quic",
    }
}

/// The gateway's peer listener port for `transport`.
pub(super) fn gateway_port(transport: TransportName) -> u16 {
    match transport {
        TransportName::Tcp => GATEWAY_FIRST_PORT,
        TransportName::Tls => GATEWAY_FIRST_PORT + 1,
        TransportName::Quic => GATEWAY_FIRST_PORT + 2,
    }
}

/// Both midways' key pairs (`peer.crt`, `peer.key` in a folder each) and fingerprints.
pub(super) struct PeerKeys {
    edge_dir: PathBuf,
    edge_fingerprint: String,
    gateway_dir: PathBuf,
    gateway_fingerprint: String,
}

impl PeerKeys {
    /// Makes both key pairs under `work` with `midway peer keygen`.
    pub(super) fn generate(midway: &Path, work: &Path) -> anyhow::Result<PeerKeys> {
        let (edge_dir, gateway_dir) = (work.join("edge-tls"), work.join("gateway-tls"));
        Ok(PeerKeys {
            edge_fingerprint: keygen(midway, &edge_dir)?,
            edge_dir,
            gateway_fingerprint: keygen(midway, &gateway_dir)?,
            gateway_dir,
        })
    }
}

/// Runs `midway peer keygen --out DIR`; the fingerprint it printed.
fn keygen(midway: &Path, dir: &Path) -> anyhow::Result<String> {
    let output = Command::new(midway)
        .args(["peer", "keygen", "--out"])
        .arg(dir)
        .output()
        .with_context(|| format!("cannot run {} peer keygen", midway.display()))?;
    if !output.status.success() {
        bail!(
            "midway peer keygen --out {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    match stdout
        .lines()
        .find_map(|line| line.strip_prefix("fingerprint: "))
    {
        Some(fingerprint) if fingerprint.starts_with("sha256:") => Ok(fingerprint.to_string()),
        _ => bail!("midway peer keygen printed no fingerprint: {stdout}"),
    }
}

fn tls(dir: &Path) -> FileTls {
    FileTls {
        cert: Some(dir.join("peer.crt")),
        key: Some(dir.join("peer.key")),
    }
}

/// The name of the edge's `[[peers]]` entry for `transport`.
fn peer_name(transport: TransportName) -> String {
    format!("gateway-{}", transport_name(transport))
}

/// Adds the edge's side to the router midway's config: its key pair, the key, one peer per
/// transport (pinning the gateway's fingerprint where encrypted) and a forward listener per
/// two-midway path, towards the server `via` that path's peer.
pub(super) fn add_edge(
    config: ConfigBuilder,
    keys: &PeerKeys,
    listen: impl Fn(u16) -> SocketAddr,
) -> anyhow::Result<FileConfig> {
    let mut config = config.key(KEY_NAME, KEY_HEX);
    let server = SocketAddr::from((SERVER_ADDR, SERVER_PORT));
    for path in PEER_PATHS {
        let Route::Edge(transport) = path else {
            bail!("{} is not a two-midway path", path.label());
        };
        let quic = transport == TransportName::Quic;
        config = config
            .peer(FilePeer {
                name: Some(peer_name(transport)),
                address: Some(SocketAddr::from((SERVER_ADDR, gateway_port(transport))).to_string()),
                key: Some(KEY_NAME.into()),
                warm_max_idle: (!quic).then_some(WARM_MAX_IDLE),
                transport: Some(transport),
                fingerprint: (transport != TransportName::Tcp)
                    .then(|| keys.gateway_fingerprint.clone()),
                quic: quic.then(|| FileQuic {
                    idle_timeout: Some(QUIC_IDLE_TIMEOUT),
                    handshake_timeout: Some(QUIC_HANDSHAKE_TIMEOUT),
                    ..FileQuic::default()
                }),
                ..FilePeer::default()
            })
            .listener(
                ListenerBuilder::forward(path.listener_name(), listen(path.port()), server)
                    .via([peer_name(transport)])
                    .build(),
            );
    }
    let mut config = config.build();
    config.tls = Some(tls(&keys.edge_dir));
    Ok(config)
}

/// The gateway midway's config: the server host's midway, taking the edge's connections on
/// one peer listener per transport (and the QUIC listener's TLS fallback) and connecting to
/// the server on its own host, with the same limits, timeouts and reloads as the edge.
pub(super) fn gateway_config(keys: &PeerKeys) -> anyhow::Result<String> {
    let listen = |port: u16| SocketAddr::from((SERVER_ADDR, port));
    let edge_pin = || Some(vec![keys.edge_fingerprint.clone()]);
    // The edge connects from the router; the headers name the clients.
    let mut config = ConfigBuilder::new([EDGE_PREFIX, CLIENT_PREFIX])
        .max_connections(4000, 4000)
        .timeouts(Duration::from_secs(5), IDLE_TIMEOUT, Duration::from_secs(2))
        .key(KEY_NAME, KEY_HEX);
    for transport in [TransportName::Tcp, TransportName::Tls, TransportName::Quic] {
        let name = format!("from-edge-{}", transport_name(transport));
        let mut listener = ListenerBuilder::peer(
            name,
            listen(gateway_port(transport)),
            [KEY_NAME.to_string()],
        )
        .build();
        listener.transport = Some(transport);
        if transport != TransportName::Tcp {
            listener.peer_fingerprints = edge_pin();
        }
        if transport == TransportName::Quic {
            listener.quic = Some(FileQuic {
                idle_timeout: Some(QUIC_IDLE_TIMEOUT),
                ..FileQuic::default()
            });
        }
        config = config.listener(listener);
    }
    // The QUIC listener's fallback: TLS over TCP at the same port.
    let mut fallback = ListenerBuilder::peer(
        "from-edge-quic-fallback",
        listen(gateway_port(TransportName::Quic)),
        [KEY_NAME.to_string()],
    )
    .build();
    fallback.transport = Some(TransportName::Tls);
    fallback.peer_fingerprints = edge_pin();
    let mut config = config.listener(fallback).build();
    config.tls = Some(tls(&keys.gateway_dir));
    // The server is on the gateway's own host, which the default list denies ("self").
    config.proxy.denied_destinations = Some(Vec::new());
    let mut text = config
        .to_toml()
        .context("cannot write the gateway's config")?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn each_transport_has_an_edge_peer_and_a_gateway_listener_that_pin_each_other() {
        let keys = PeerKeys {
            edge_dir: PathBuf::from("/keys/edge"),
            edge_fingerprint: "sha256:ed".into(),
            gateway_dir: PathBuf::from("/keys/gateway"),
            gateway_fingerprint: "sha256:9a".into(),
        };
        let edge = add_edge(ConfigBuilder::new([CLIENT_PREFIX]), &keys, |port| {
            SocketAddr::from((Ipv4Addr::LOCALHOST, port))
        })
        .unwrap();
        let gateway: FileConfig = toml::from_str(&gateway_config(&keys).unwrap()).unwrap();
        assert_eq!(edge.peers.len(), PEER_PATHS.len());
        assert_eq!(
            edge.tls.unwrap().cert.unwrap(),
            keys.edge_dir.join("peer.crt")
        );
        assert_eq!(
            gateway.tls.unwrap().key.unwrap(),
            keys.gateway_dir.join("peer.key")
        );
        assert_eq!(gateway.proxy.denied_destinations, Some(Vec::new()));
        for (peer, listener) in edge.peers.iter().zip(&edge.listeners) {
            assert_eq!(listener.via, Some(vec![peer.name.clone().unwrap()]));
            let transport = peer.transport.unwrap();
            let encrypted = transport != TransportName::Tcp;
            assert_eq!(peer.fingerprint.is_some(), encrypted);
            let served = gateway
                .listeners
                .iter()
                .find(|l| l.listen == peer.address && l.transport == Some(transport))
                .unwrap_or_else(|| panic!("no gateway listener for {peer:?}"));
            let pins = served.peer_fingerprints.clone();
            assert_eq!(pins, encrypted.then(|| vec![keys.edge_fingerprint.clone()]));
        }
        // The QUIC tunnel's fallback: TLS at the same port.
        let quic = SocketAddr::from((SERVER_ADDR, gateway_port(TransportName::Quic))).to_string();
        assert!(
            gateway
                .listeners
                .iter()
                .any(|l| l.listen.as_deref() == Some(&quic)
                    && l.transport == Some(TransportName::Tls))
        );
    }
}
