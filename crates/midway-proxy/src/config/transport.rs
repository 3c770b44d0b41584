//! Stage 3 for the peer segment's transport: `[tls]` (this midway's key pair, read and checked
//! at load), a `[[peers]]` entry's `transport` and `fingerprint`, and a peer listener's
//! `transport` and `peer_fingerprints`.

use std::collections::BTreeSet;
use std::sync::Arc;

use midway_tls::{Fingerprint, Identity};

use super::validate::{Section, Validator};
use super::{ConfigError, FileQuic, FileTls, ListenerTransport, PeerTransport, TransportName};

/// `[tls]`: both files named, both readable, the key the certificate's, the certificate in
/// date. `None` without the table.
pub(super) fn identity(
    v: &Validator<'_>,
    file: Option<FileTls>,
) -> Result<Option<Arc<Identity>>, ConfigError> {
    let Some(file) = file else {
        return Ok(None);
    };
    let make_one = "make a key pair with `midway peer keygen --out /etc/midway/tls`";
    let cert = file.cert.ok_or_else(|| {
        v.invalid(
            "tls.cert",
            format!("required: the certificate file (peer.crt); {make_one}"),
        )
    })?;
    let key = file.key.ok_or_else(|| {
        v.invalid(
            "tls.key",
            format!("required: the private key file (peer.key); {make_one}"),
        )
    })?;
    let identity = Identity::load(&cert, &key).map_err(|err| v.invalid("tls", err.to_string()))?;
    Ok(Some(Arc::new(identity)))
}

/// A `[[peers]]` entry's transport: `tls` and `quic` need `[tls]` and the peer's fingerprint;
/// `[peers.quic]` only goes with `quic`.
pub(super) fn peer_transport(
    section: &Section<'_>,
    transport: Option<TransportName>,
    fingerprint: Option<String>,
    quic: Option<FileQuic>,
    identity: Option<&Arc<Identity>>,
) -> Result<PeerTransport, ConfigError> {
    let transport = transport.unwrap_or(TransportName::Tcp);
    if transport != TransportName::Quic && quic.is_some() {
        return Err(only_with_quic(section));
    }
    if transport == TransportName::Tcp {
        if fingerprint.is_some() {
            return Err(section.invalid(
                "fingerprint",
                "only a peer with transport = \"tls\" or \"quic\" is authenticated by its key; \
                 remove it or set the transport",
            ));
        }
        return Ok(PeerTransport::Tcp);
    }
    let identity = needs_identity(section, identity)?;
    let text = fingerprint.ok_or_else(|| {
        section.invalid(
            "fingerprint",
            "required with transport = \"tls\" or \"quic\": the fingerprint the peer's \
             `midway peer keygen` printed (sha256:...)",
        )
    })?;
    let pinned = parse_fingerprint(section, "fingerprint", &text)?;
    let client = midway_tls::client_config(identity, vec![pinned])
        .map_err(|err| section.invalid("transport", err.to_string()))?;
    if transport == TransportName::Tls {
        return Ok(PeerTransport::Tls { client, pinned });
    }
    let (settings, edge) = super::quic::tunnel_settings(section, quic, true)?;
    let tunnel = midway_quic::client_config(client.clone(), &settings)
        .map_err(|err| section.invalid("transport", err.to_string()))?;
    Ok(PeerTransport::Quic {
        client,
        tunnel: Box::new(tunnel),
        pinned,
        settings: Box::new(settings),
        fallback: edge.fallback,
        connections: edge.connections,
    })
}

/// A peer listener's transport: `tls` and `quic` need `[tls]` and at least one allowed
/// fingerprint; `[listeners.quic]` only goes with `quic`.
pub(super) fn listener_transport(
    section: &Section<'_>,
    transport: Option<TransportName>,
    fingerprints: Option<Vec<String>>,
    quic: Option<FileQuic>,
    identity: Option<&Arc<Identity>>,
) -> Result<ListenerTransport, ConfigError> {
    let transport = transport.unwrap_or(TransportName::Tcp);
    if transport != TransportName::Quic && quic.is_some() {
        return Err(only_with_quic(section));
    }
    if transport == TransportName::Tcp {
        if fingerprints.is_some() {
            return Err(section.invalid(
                "peer_fingerprints",
                "only a peer listener with transport = \"tls\" or \"quic\" checks keys; \
                 remove it or set the transport",
            ));
        }
        return Ok(ListenerTransport::Tcp);
    }
    let identity = needs_identity(section, identity)?;
    let texts = fingerprints.unwrap_or_default();
    if texts.is_empty() {
        return Err(section.invalid(
            "peer_fingerprints",
            "required with transport = \"tls\" or \"quic\", never empty: the fingerprints of \
             the midways allowed to connect (each printed by their `midway peer keygen`)",
        ));
    }
    let mut allowed = Vec::with_capacity(texts.len());
    let mut seen = BTreeSet::new();
    for (i, text) in texts.iter().enumerate() {
        let key = format!("peer_fingerprints[{i}]");
        let fingerprint = parse_fingerprint(section, &key, text)?;
        if !seen.insert(fingerprint.to_string()) {
            return Err(section.invalid(&key, "listed twice"));
        }
        allowed.push(fingerprint);
    }
    let server = midway_tls::server_config(identity, allowed.clone())
        .map_err(|err| section.invalid("transport", err.to_string()))?;
    if transport == TransportName::Tls {
        return Ok(ListenerTransport::Tls { server, allowed });
    }
    let (settings, _) = super::quic::tunnel_settings(section, quic, false)?;
    let tunnel = midway_quic::server_config(server, &settings)
        .map_err(|err| section.invalid("transport", err.to_string()))?;
    Ok(ListenerTransport::Quic {
        tunnel: Box::new(tunnel),
        allowed,
        settings: Box::new(settings),
    })
}

fn only_with_quic(section: &Section<'_>) -> ConfigError {
    section.invalid(
        "quic",
        "only goes with transport = \"quic\"; remove it or set the transport",
    )
}

fn needs_identity<'a>(
    section: &Section<'_>,
    identity: Option<&'a Arc<Identity>>,
) -> Result<&'a Arc<Identity>, ConfigError> {
    identity.ok_or_else(|| {
        section.invalid(
            "transport",
            "\"tls\" needs this midway's key pair: add [tls] with cert and key (make them with \
             `midway peer keygen --out /etc/midway/tls`)",
        )
    })
}

fn parse_fingerprint(
    section: &Section<'_>,
    key: &str,
    text: &str,
) -> Result<Fingerprint, ConfigError> {
    text.parse()
        .map_err(|err| section.invalid(key, format!("{text:?}: {err}")))
}

#[cfg(test)]
mod tests {
    use super::super::{parse_config, Intercept, ListenerTransport, PeerTransport};

    /// A config with an edge's `[[peers]]` entry and a gateway's peer listener, both written
    /// by `peer` and `listener` (their transport keys), and `[tls]` when `tls` is set.
    fn config(dir: &std::path::Path, tls: bool, peer: &str, listener: &str) -> String {
        let tls = if tls {
            format!(
                "[tls]\ncert = \"{0}/peer.crt\"\nkey = \"{0}/peer.key\"\n",
                dir.display()
            )
        } else {
            String::new()
        };
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.1\"]\n{tls}\
             [keys.k]\nsecret = \"00112233445566778899aabbccddeeff\"\n\
             [[peers]]\nname = \"gw\"\naddress = \"127.0.0.1:7400\"\nkey = \"k\"\n{peer}\n\
             [[listeners]]\nname = \"socks\"\nmode = \"socks5\"\nlisten = \"127.0.0.1:0\"\n\
             via = [\"gw\"]\n\
             [[listeners]]\nname = \"from-edges\"\nmode = \"peer\"\nlisten = \"127.0.0.1:0\"\n\
             keys = [\"k\"]\n{listener}\n"
        )
    }

    fn problem(text: &str) -> String {
        parse_config(text, "<test>").unwrap_err().to_string()
    }

    #[test]
    fn tls_and_quic_need_a_key_pair_and_pins() {
        let dir = tempfile::tempdir().unwrap();
        let identity =
            midway_tls::generate_identity("test", std::time::Duration::from_secs(3600)).unwrap();
        midway_tls::write_identity(dir.path(), &identity).unwrap();
        let pin = format!("fingerprint = \"{}\"", identity.fingerprint);
        let allowed = format!("peer_fingerprints = [\"{}\"]", identity.fingerprint);
        let tls_peer = format!("transport = \"tls\"\n{pin}");
        let tls_listener = format!("transport = \"tls\"\n{allowed}");

        let loaded = parse_config(
            &config(dir.path(), true, &tls_peer, &tls_listener),
            "<test>",
        )
        .unwrap();
        assert!(
            matches!(&loaded.peers[0].transport, PeerTransport::Tls { pinned, .. } if *pinned == identity.fingerprint)
        );
        assert!(matches!(
            &loaded.listeners[1].intercept,
            Intercept::Peer { transport: ListenerTransport::Tls { allowed, .. }, .. } if allowed.len() == 1
        ));
        // Plain TCP stays the default.
        let plain = parse_config(&config(dir.path(), false, "", ""), "<test>").unwrap();
        assert!(matches!(plain.peers[0].transport, PeerTransport::Tcp));

        let cases = [
            (
                config(dir.path(), false, &tls_peer, ""),
                "peers[0].transport",
                "[tls]",
            ),
            (
                config(dir.path(), true, "transport = \"tls\"", ""),
                "peers[0].fingerprint",
                "required",
            ),
            (
                config(dir.path(), true, &pin, ""),
                "peers[0].fingerprint",
                "only a peer with transport",
            ),
            (
                config(
                    dir.path(),
                    true,
                    "transport = \"tls\"\nfingerprint = \"sha1:00\"",
                    "",
                ),
                "peers[0].fingerprint",
                "sha1:00",
            ),
            (
                config(dir.path(), true, "", "transport = \"tls\""),
                "listeners[1].peer_fingerprints",
                "never empty",
            ),
            (
                config(
                    dir.path(),
                    true,
                    "",
                    &format!("transport = \"tls\"\n{allowed}\n")
                        .replace(']', &format!(", \"{}\"]", identity.fingerprint)),
                ),
                "listeners[1].peer_fingerprints[1]",
                "listed twice",
            ),
            (
                config(dir.path(), true, "transport = \"quic\"", ""),
                "peers[0].fingerprint",
                "required",
            ),
            (
                config(dir.path(), true, "", "transport = \"quic\""),
                "listeners[1].peer_fingerprints",
                "never empty",
            ),
            (
                config(
                    dir.path(),
                    true,
                    &format!("transport = \"quic\"\n{pin}\n[peers.quic]\nconnections = 0"),
                    "",
                ),
                "peers[0].quic.connections",
                "use 1 to 16",
            ),
            (
                config(
                    dir.path(),
                    true,
                    "",
                    &format!("transport = \"quic\"\n{allowed}\n[listeners.quic]\nconnections = 2"),
                ),
                "listeners[1].quic.connections",
                "only an edge",
            ),
        ];
        for (text, key, words) in cases {
            let message = problem(&text);
            assert!(
                message.contains(key) && message.contains(words),
                "{key}: {message}"
            );
        }
        let two = parse_config(
            &config(
                dir.path(),
                true,
                &format!("transport = \"quic\"\n{pin}\n[peers.quic]\nconnections = 2"),
                "",
            ),
            "<test>",
        )
        .unwrap();
        assert!(matches!(
            two.peers[0].transport,
            PeerTransport::Quic { connections: 2, .. }
        ));
        // A missing key file is named.
        let gone = config(dir.path(), true, "", "").replace("peer.key", "missing.key");
        assert!(problem(&gone).contains("missing.key"), "{}", problem(&gone));
        // transport on a listener of another mode is refused like any mode key.
        let on_socks = config(dir.path(), true, "", "")
            .replace("via = [\"gw\"]", "via = [\"gw\"]\ntransport = \"tls\"");
        assert!(
            problem(&on_socks).contains("transport"),
            "{}",
            problem(&on_socks)
        );
    }

    #[test]
    fn an_encrypted_listener_may_relay_on_through_an_encrypted_peer() {
        let dir = tempfile::tempdir().unwrap();
        let identity =
            midway_tls::generate_identity("test", std::time::Duration::from_secs(3600)).unwrap();
        midway_tls::write_identity(dir.path(), &identity).unwrap();
        let text = config(
            dir.path(),
            true,
            &format!(
                "transport = \"tls\"\nfingerprint = \"{}\"",
                identity.fingerprint
            ),
            &format!(
                "transport = \"tls\"\npeer_fingerprints = [\"{}\"]\nvia = [\"gw\"]",
                identity.fingerprint
            ),
        );
        // The middle midway of an encrypted chain: TLS in, QUIC or TLS out.
        for out in ["tls", "quic"] {
            let loaded = parse_config(
                &text.replacen("transport = \"tls\"", &format!("transport = \"{out}\""), 1),
                "<test>",
            )
            .unwrap();
            assert_eq!(loaded.peers[0].transport.name(), out);
            assert_eq!(loaded.listeners[1].via, [0]);
        }
    }
}
