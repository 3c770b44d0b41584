//! Every shipped example loads; every bad fixture fails with its expected message.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use midway_testkit::host::repo_root;

use midway_proxy::config::Intercept;
use midway_proxy::load_config;

/// The pre-shared key file the two-ended examples name.
const EXAMPLE_KEY_FILE: &str = "/etc/midway/edge-a.key";

/// Example `name`, with the key file it names (if any) made in `dir` and its path rewritten;
/// the path of the copy in `dir`.
fn example_with_key(name: &str, dir: &Path) -> PathBuf {
    let key = dir.join("edge-a.key");
    std::fs::write(&key, "00112233445566778899aabbccddeeff00\n").unwrap();
    let text = std::fs::read_to_string(repo_root().join("examples").join(name)).unwrap();
    let copy = dir.join(name);
    std::fs::write(
        &copy,
        text.replace(EXAMPLE_KEY_FILE, &key.display().to_string()),
    )
    .unwrap();
    copy
}

#[test]
fn examples_load() {
    let dir = repo_root().join("examples");
    let keys = tempfile::tempdir().unwrap();
    let mut modes = Vec::new();
    for name in [
        "forward.toml",
        "socks5.toml",
        "transparent.toml",
        "http.toml",
        "edge.toml",
        "gateway.toml",
        "proxy-protocol.toml",
    ] {
        let config = load_config(&example_with_key(name, keys.path()))
            .unwrap_or_else(|e| panic!("{name}: {}", midway_testkit::chain(&e)));
        assert!(!config.allowed_clients.is_empty());
        modes.extend(config.listeners.iter().map(|l| l.intercept.mode_name()));
    }
    assert_eq!(
        modes,
        [
            "forward",
            "socks5",
            "transparent",
            "http",
            "transparent",
            "socks5",
            "peer",
            "forward"
        ]
    );
    // A test loads every file in examples/: a new one must join the list above.
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    on_disk.sort();
    assert_eq!(
        on_disk,
        [
            "edge.toml",
            "forward.toml",
            "gateway.toml",
            "http.toml",
            "proxy-protocol.toml",
            "quic-edge.toml",
            "quic-gateway.toml",
            "socks5.toml",
            "transparent.toml"
        ]
    );
}

/// The PROXY protocol example accepts headers from its balancers only, and sends one.
#[test]
fn proxy_protocol_example_accepts_from_its_balancers_and_sends() {
    let config = load_config(&repo_root().join("examples/proxy-protocol.toml")).unwrap();
    let settings = &config.listeners[0].proxy_protocol;
    assert!(settings.send);
    assert!(settings.expects_header_from("10.0.0.5".parse().unwrap()));
    assert!(!settings.expects_header_from("10.1.0.7".parse().unwrap()));
}

/// The published example key is refused, wherever it is written.
#[test]
fn the_published_example_key_is_refused() {
    let keys = tempfile::tempdir().unwrap();
    let path = example_with_key("gateway.toml", keys.path());
    let published = "6d6964776179206578616d706c65206b6579202d206e6f74206120736563726574";
    std::fs::write(keys.path().join("edge-a.key"), format!("{published}\n")).unwrap();
    let message = midway_testkit::chain(&load_config(&path).unwrap_err());
    assert!(
        message.contains("keys.edge-a.secret_file") && message.contains("example key published"),
        "{message}"
    );
}

/// The QUIC examples name key files under /etc/midway/tls: loaded with a key pair from
/// `midway_tls` put in their place (the paths rewritten), they give a QUIC peer with the
/// example's tunnel settings and a QUIC peer listener beside its TLS fallback listener.
#[test]
fn quic_examples_load_with_a_key_pair() {
    use midway_proxy::config::{ListenerTransport, PeerTransport};
    let keys = tempfile::tempdir().unwrap();
    let identity =
        midway_tls::generate_identity("example", std::time::Duration::from_secs(3600)).unwrap();
    midway_tls::write_identity(keys.path(), &identity).unwrap();
    let load = |name: &str| {
        let path = example_with_key(name, keys.path());
        let text = std::fs::read_to_string(&path).unwrap();
        let text = text.replace("/etc/midway/tls", &keys.path().display().to_string());
        std::fs::write(&path, text).unwrap();
        load_config(&path).unwrap_or_else(|e| panic!("{name}: {}", midway_testkit::chain(&e)))
    };
    let edge = load("quic-edge.toml");
    let PeerTransport::Quic {
        settings, fallback, ..
    } = &edge.peers[0].transport
    else {
        panic!("{:?}", edge.peers[0].transport)
    };
    assert!(*fallback);
    assert_eq!(settings.stream_window, 6_000_000, "4 x 20 Mbit/s x 600 ms");
    assert_eq!(
        settings.handshake_timeout,
        std::time::Duration::from_secs(5)
    );
    let gateway = load("quic-gateway.toml");
    let transports: Vec<_> = gateway
        .listeners
        .iter()
        .map(|l| match &l.intercept {
            Intercept::Peer { transport, .. } => transport.name(),
            _ => "not a peer listener",
        })
        .collect();
    assert_eq!(transports, ["quic", "tls"]);
    assert_eq!(gateway.listeners[0].listen, gateway.listeners[1].listen);
    assert!(matches!(
        &gateway.listeners[0].intercept,
        Intercept::Peer { transport: ListenerTransport::Quic { allowed, .. }, .. } if allowed.len() == 1
    ));
}

#[test]
fn edge_and_gateway_examples_map_onto_peers() {
    let keys = tempfile::tempdir().unwrap();
    let edge = load_config(&example_with_key("edge.toml", keys.path())).unwrap();
    assert_eq!(edge.peers.len(), 1);
    let peer = &edge.peers[0];
    assert_eq!(peer.name, "gateway");
    assert_eq!(peer.profile, "long-path");
    assert_eq!(peer.warm_connections, 4);
    assert_eq!(peer.destinations[0].to_string(), "10.2.0.0/16");
    assert_eq!(edge.listeners[0].via, [0]);
    assert_eq!(edge.keys["edge-a"].bytes().len(), 17);
    let gateway = load_config(&example_with_key("gateway.toml", keys.path())).unwrap();
    assert!(matches!(
        &gateway.listeners[0].intercept,
        Intercept::Peer { keys, spoof_client_address: false, .. } if keys == &["edge-a"]
    ));
    assert_eq!(gateway.max_hops, 8);
}

#[test]
fn http_example_maps_onto_the_engine_config() {
    let config = load_config(&repo_root().join("examples/http.toml")).unwrap();
    let web = &config.listeners[0];
    assert!(matches!(web.intercept, Intercept::Http));
    let http = web.http.as_ref().expect("mode = http has an engine config");
    assert_eq!(http.client.max_pipelined, 16);
    assert_eq!(http.upstream.idle_keep, std::time::Duration::from_secs(600));
    assert_eq!(http.upstream.keepalive.map(|k| k.retries), Some(5));
    assert!(http.cache.enabled);
    let disk = http.cache.disk.as_ref().expect("disk tier");
    assert_eq!(disk.dir, Path::new("/var/cache/midway/web"));
    assert_eq!(disk.max_bytes, 1 << 30);
    assert_eq!(web.remote_profile, "wan");

    // The transparent one serves HTTP with defaults and intercepts port 80.
    let intercept = &config.listeners[1];
    assert!(matches!(intercept.intercept, Intercept::Transparent { .. }));
    let http = intercept.http.as_ref().expect("application = http");
    assert!(http.cache.disk.is_none());
    let rules = midway_proxy::nft_ruleset(&config);
    assert!(
        rules.contains("tcp dport { 80 } tproxy ip to :7080"),
        "{rules}"
    );
}

#[test]
fn transparent_example_prints_its_rules() {
    let config = load_config(&repo_root().join("examples/transparent.toml")).unwrap();
    assert!(matches!(
        config.listeners[0].intercept,
        Intercept::Transparent {
            spoof_client_address: true,
            ..
        }
    ));
    let rules = midway_proxy::nft_ruleset(&config);
    assert!(
        rules.contains(
            "iifname { \"veth-client\" } meta l4proto tcp tcp dport { 80, 443 } tproxy ip to :7000"
        ),
        "{rules}"
    );
    assert!(
        rules.contains("# ip -4 rule add fwmark 1 lookup 100"),
        "{rules}"
    );
}

#[test]
fn bad_configs_fail_with_their_message() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad-config");
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    fixtures.sort();
    assert!(
        fixtures.len() >= 15,
        "fixture list is too short: {fixtures:?}"
    );
    let mut failures = Vec::new();
    for path in &fixtures {
        let expect_path = path.with_extension("expect");
        let expected = std::fs::read_to_string(&expect_path)
            .unwrap_or_else(|e| panic!("{} needs a sibling .expect file: {e}", path.display()));
        let expected = expected.trim_end_matches('\n');
        assert!(!expected.is_empty(), "{} is empty", expect_path.display());
        match load_config(path) {
            Ok(_) => failures.push(format!("{}: loaded, but must fail", path.display())),
            Err(err) => {
                let message = midway_testkit::chain(&err);
                // The message names the file it came from.
                if !message.contains(path.file_name().unwrap().to_str().unwrap())
                    || !message.contains(expected)
                {
                    failures.push(format!(
                        "{}:\n  expected: {expected}\n  got:      {message}",
                        path.display()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
