//! Every shipped example loads; every bad fixture fails with its expected message.

use std::path::{Path, PathBuf};

use midway_proxy::config::Intercept;
use midway_proxy::load_config;

mod common;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn examples_load() {
    let dir = repo_root().join("examples");
    let mut modes = Vec::new();
    for name in ["forward.toml", "socks5.toml", "transparent.toml"] {
        let config = load_config(&dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {}", common::chain(&e)));
        assert!(!config.allowed_clients.is_empty());
        modes.extend(config.listeners.iter().map(|l| l.intercept.mode_name()));
    }
    assert_eq!(modes, ["forward", "socks5", "transparent"]);
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
                let message = common::chain(&err);
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
