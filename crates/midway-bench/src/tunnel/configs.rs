//! The two midways of the tunnel benchmark: the edge in the router (one forward listener per
//! port, towards the server, `via` the gateway) and the gateway (one peer listener), for each
//! transport; and their key pairs from `midway peer keygen`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use midway_config::{
    ConfigBuilder, FileConfig, FilePeer, FileQuic, FileTls, ListenerBuilder, RelayName,
    TransportName,
};

use super::Transport;
use crate::all_ports;
use crate::netns::{
    CLIENT_PREFIX, GATEWAY_ROUTER_SIDE, ROUTER_CLIENT_SIDE, ROUTER_GATEWAY_PREFIX, SERVER_ADDR,
};

/// The gateway's peer listener: a TCP port for `tcp` and `tls`, a UDP port for `quic`.
pub(crate) const PEER_PORT: u16 = 7400;
/// The peer's name in the edge's `[[peers]]`, and the pre-shared key's.
const PEER_NAME: &str = "gateway";
const KEY_NAME: &str = "bench";
/// Give up on the QUIC tunnel's handshake after this long.
const QUIC_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The edge's connect timeout, which through a peer covers the header and the gateway's answer.
/// Longer than the main benchmark's 5 s: with 1000 new streams on a saturated QUIC tunnel (2
/// cores), some headers took longer than that and their iperf3 runs failed ("did not answer the
/// header in time"); the benchmark measures throughput once the connections are up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// What both midways' configs share: the key pairs, the pre-shared key, and where each keeps
/// its spool (the record of what it installed, which two midways on one machine may not share).
#[derive(Debug, Clone)]
pub(crate) struct Identities {
    /// Folder of the edge's `peer.crt` and `peer.key`.
    pub(crate) edge_dir: PathBuf,
    /// The edge's key fingerprint (`sha256:...`), which the gateway lists.
    pub(crate) edge_fingerprint: String,
    /// Folder of the gateway's `peer.crt` and `peer.key`.
    pub(crate) gateway_dir: PathBuf,
    /// The gateway's key fingerprint, which the edge pins.
    pub(crate) gateway_fingerprint: String,
    /// The pre-shared key of the peer headers, hexadecimal.
    pub(crate) secret_hex: String,
    /// The edge's spool directory.
    pub(crate) edge_spool: PathBuf,
    /// The gateway's spool directory.
    pub(crate) gateway_spool: PathBuf,
}

impl Identities {
    /// New key pairs for both midways under `dir` (replacing earlier ones: `midway peer keygen`
    /// never overwrites a key), a fresh random pre-shared key, and spool directories there.
    pub(crate) fn generate(midway_bin: &Path, dir: &Path) -> anyhow::Result<Identities> {
        let edge_dir = dir.join("edge");
        let gateway_dir = dir.join("gateway");
        Ok(Identities {
            edge_spool: dir.join("spool-edge"),
            gateway_spool: dir.join("spool-gateway"),
            edge_fingerprint: keygen(midway_bin, &edge_dir)?,
            gateway_fingerprint: keygen(midway_bin, &gateway_dir)?,
            edge_dir,
            gateway_dir,
            secret_hex: random_hex(32)?,
        })
    }
}

/// `midway peer keygen --out DIR` into an emptied `dir`; the fingerprint it printed.
fn keygen(midway_bin: &Path, dir: &Path) -> anyhow::Result<String> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    let output = Command::new(midway_bin)
        .args(["peer", "keygen", "--out"])
        .arg(dir)
        .output()
        .with_context(|| format!("cannot run {} peer keygen", midway_bin.display()))?;
    if !output.status.success() {
        bail!(
            "midway peer keygen failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("fingerprint: "))
        .map(|f| f.trim().to_string())
        .with_context(|| format!("midway peer keygen printed no fingerprint: {stdout}"))
}

fn random_hex(bytes: usize) -> anyhow::Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// What both configs share: the connection limits and idle timeout of the main benchmark, a
/// longer connect timeout ([`CONNECT_TIMEOUT`]), the pre-shared key, the threads and a spool
/// directory of its own.
fn base(
    allowed_clients: &[&str],
    threads: Option<u16>,
    secret_hex: &str,
    spool: &Path,
) -> ConfigBuilder {
    let mut config = ConfigBuilder::new(allowed_clients.iter().copied())
        .spool_dir(spool)
        // Two open files a connection, within a hard limit of 20,000 (see `configs.rs`).
        .max_connections(8000, 8000)
        .timeouts(
            CONNECT_TIMEOUT,
            Duration::from_secs(600),
            Duration::from_secs(2),
        )
        .key(KEY_NAME, secret_hex);
    if let Some(threads) = threads {
        config = config.worker_threads(usize::from(threads));
    }
    config
}

fn transport_name(transport: Transport) -> TransportName {
    match transport {
        Transport::Tcp => TransportName::Tcp,
        Transport::Tls => TransportName::Tls,
        Transport::Quic => TransportName::Quic,
    }
}

fn tls_of(dir: &Path) -> FileTls {
    FileTls {
        cert: Some(dir.join("peer.crt")),
        key: Some(dir.join("peer.key")),
    }
}

/// The edge: a forward listener per benchmark port on the router's client side, each towards
/// the same port of the server, all `via` the gateway over `transport`. The QUIC tunnel has no
/// TLS fallback, so a tunnel that cannot be set up fails the case instead of measuring TLS.
pub(crate) fn edge_config(
    transport: Transport,
    ids: &Identities,
    profile: &str,
    threads: Option<u16>,
    quic_connections: u32,
) -> anyhow::Result<String> {
    let mut config =
        base(&[CLIENT_PREFIX], threads, &ids.secret_hex, &ids.edge_spool).peer(FilePeer {
            name: Some(PEER_NAME.into()),
            address: Some(SocketAddr::from((GATEWAY_ROUTER_SIDE, PEER_PORT)).to_string()),
            key: Some(KEY_NAME.into()),
            profile: Some(profile.into()),
            transport: Some(transport_name(transport)),
            fingerprint: (transport != Transport::Tcp).then(|| ids.gateway_fingerprint.clone()),
            quic: (transport == Transport::Quic).then(|| FileQuic {
                handshake_timeout: Some(QUIC_HANDSHAKE_TIMEOUT),
                fallback: Some("none".into()),
                connections: Some(quic_connections),
                ..FileQuic::default()
            }),
            ..FilePeer::default()
        });
    for port in all_ports() {
        config = config.listener(
            ListenerBuilder::forward(
                format!("p{port}"),
                SocketAddr::from((ROUTER_CLIENT_SIDE, port)),
                SocketAddr::from((SERVER_ADDR, port)),
            )
            .relay(RelayName::Buffer)
            .local_profile(profile)
            .remote_profile(profile)
            .via([PEER_NAME.to_string()])
            .build(),
        );
    }
    finish(config.build(), transport, &ids.edge_dir)
}

/// The gateway: one peer listener for `transport` on its router side, accepting the edge (its
/// address, the clients its headers name, its key fingerprint).
pub(crate) fn gateway_config(
    transport: Transport,
    ids: &Identities,
    profile: &str,
    threads: Option<u16>,
) -> anyhow::Result<String> {
    let mut listener = ListenerBuilder::peer(
        "from-edge",
        SocketAddr::from((GATEWAY_ROUTER_SIDE, PEER_PORT)),
        [KEY_NAME.to_string()],
    )
    .relay(RelayName::Buffer)
    .local_profile(profile)
    .remote_profile(profile)
    .build();
    listener.transport = Some(transport_name(transport));
    if transport != Transport::Tcp {
        listener.peer_fingerprints = Some(vec![ids.edge_fingerprint.clone()]);
    }
    let config = base(
        &[ROUTER_GATEWAY_PREFIX, CLIENT_PREFIX],
        threads,
        &ids.secret_hex,
        &ids.gateway_spool,
    )
    .listener(listener);
    finish(config.build(), transport, &ids.gateway_dir)
}

/// `[tls]` for the encrypted transports, then the TOML text.
fn finish(mut config: FileConfig, transport: Transport, dir: &Path) -> anyhow::Result<String> {
    if transport != Transport::Tcp {
        config.tls = Some(tls_of(dir));
    }
    Ok(config.to_toml()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> Identities {
        Identities {
            edge_dir: PathBuf::from("/keys/edge"),
            edge_fingerprint: format!("sha256:{}", "1".repeat(64)),
            gateway_dir: PathBuf::from("/keys/gateway"),
            gateway_fingerprint: format!("sha256:{}", "2".repeat(64)),
            secret_hex: "ab".repeat(32),
            edge_spool: PathBuf::from("/spool/edge"),
            gateway_spool: PathBuf::from("/spool/gateway"),
        }
    }

    /// Real key pairs in `dir`, which midway's parser reads.
    fn real_ids(dir: &Path) -> Identities {
        let mut ids = ids();
        for (name, path, fingerprint) in [
            ("edge", &mut ids.edge_dir, &mut ids.edge_fingerprint),
            (
                "gateway",
                &mut ids.gateway_dir,
                &mut ids.gateway_fingerprint,
            ),
        ] {
            let identity = midway_tls::generate_identity(name, Duration::from_secs(3600)).unwrap();
            *path = dir.join(name);
            midway_tls::write_identity(&*path, &identity).unwrap();
            *fingerprint = identity.fingerprint.to_string();
        }
        ids
    }

    #[test]
    fn every_transport_gives_configs_midway_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let ids = real_ids(dir.path());
        for transport in [Transport::Tcp, Transport::Tls, Transport::Quic] {
            let edge = edge_config(transport, &ids, "lan", Some(1), 1).unwrap();
            let parsed = midway_proxy::parse_config(&edge, "edge")
                .unwrap_or_else(|e| panic!("{transport:?}: {e}\n{edge}"));
            assert_eq!(parsed.listeners.len(), all_ports().len(), "{transport:?}");
            assert_eq!(parsed.worker_threads, Some(1));
            let gateway = gateway_config(transport, &ids, "lan", None).unwrap();
            let parsed = midway_proxy::parse_config(&gateway, "gateway")
                .unwrap_or_else(|e| panic!("{transport:?}: {e}\n{gateway}"));
            assert_eq!(parsed.listeners.len(), 1, "{transport:?}");
        }
    }

    #[test]
    fn encrypted_transports_pin_each_others_keys_and_quic_never_falls_back() {
        let tcp = edge_config(Transport::Tcp, &ids(), "lan", None, 1).unwrap();
        assert!(
            !tcp.contains("fingerprint") && !tcp.contains("[tls]"),
            "{tcp}"
        );
        let quic = edge_config(Transport::Quic, &ids(), "lan", None, 1).unwrap();
        assert!(quic.contains(&ids().gateway_fingerprint), "{quic}");
        assert!(quic.contains("fallback = \"none\""), "{quic}");
        assert!(quic.contains("/keys/edge/peer.key"), "{quic}");
        let tls = gateway_config(Transport::Tls, &ids(), "lan", None).unwrap();
        assert!(tls.contains(&ids().edge_fingerprint), "{tls}");
        assert!(tls.contains("transport = \"tls\""), "{tls}");
        assert!(tls.contains("/keys/gateway/peer.crt"), "{tls}");
    }
}
