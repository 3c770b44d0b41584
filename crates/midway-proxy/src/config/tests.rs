//! Unit tests of loading and validation.

use std::net::IpAddr;

use midway_http::HttpProxyConfig;
use midway_relay::RelayModel;

use super::*;

const MINIMAL: &str = r#"
[proxy]
allowed_clients = ["10.1.0.7/24", "fd00:1::/64", "127.0.0.1"]
[[listeners]]
name = "fwd"
mode = "forward"
listen = "127.0.0.1:0"
target = "127.0.0.1:5201"
"#;

#[test]
fn minimal_config_gets_defaults() {
    let config = parse_config(MINIMAL, "<test>").unwrap();
    assert_eq!(config.allowed_clients[0].to_string(), "10.1.0.0/24");
    assert_eq!(config.allowed_clients[2].to_string(), "127.0.0.1/32");
    assert_eq!(config.max_connections, DEFAULT_MAX_CONNECTIONS);
    assert_eq!(config.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
    let listener = &config.listeners[0];
    assert_eq!(listener.local_profile, "default");
    assert!(matches!(listener.relay, RelayModel::Buffer(_)));
    assert!(matches!(
        &listener.intercept,
        Intercept::Forward { target: TargetAddr::Ip(a) } if a.port() == 5201
    ));
}

#[test]
fn carry_dscp_is_off_unless_asked_and_refused_where_upstreams_are_pooled() {
    let config = parse_config(MINIMAL, "<test>").unwrap();
    assert!(!config.listeners[0].carry_dscp);
    let carrying = format!("{MINIMAL}carry_dscp = true\n");
    assert!(parse_config(&carrying, "<test>").unwrap().listeners[0].carry_dscp);
    let http = r#"
[proxy]
allowed_clients = ["127.0.0.1"]
[[listeners]]
name = "web"
mode = "http"
listen = "127.0.0.1:0"
carry_dscp = true
"#;
    let err = parse_config(http, "<test>").unwrap_err().to_string();
    assert!(err.contains("carry_dscp"), "{err}");
}

#[test]
fn denied_destinations_default_to_the_gateway_itself() {
    let config = parse_config(MINIMAL, "<test>").unwrap();
    for denied in [
        "127.0.0.1",
        "127.9.9.9",
        "0.0.0.0",
        "169.254.169.254",
        "::1",
        "::",
    ] {
        let addr: IpAddr = denied.parse().unwrap();
        assert!(config.is_denied_destination(addr), "{denied}");
    }
    for mapped in ["::ffff:127.0.0.1", "::ffff:169.254.1.1"] {
        let addr: IpAddr = mapped.parse().unwrap();
        assert!(config.is_denied_destination(addr), "{mapped}");
    }
    for allowed in ["10.2.0.2", "192.0.2.1", "2001:db8::1", "::ffff:10.2.0.2"] {
        let addr: IpAddr = allowed.parse().unwrap();
        assert!(!config.is_denied_destination(addr), "{allowed}");
    }
    let open = MINIMAL.replace("[proxy]\n", "[proxy]\ndenied_destinations = []\n");
    let config = parse_config(&open, "<test>").unwrap();
    assert!(!config.is_denied_destination("127.0.0.1".parse().unwrap()));
    let own = MINIMAL.replace(
        "[proxy]\n",
        "[proxy]\ndenied_destinations = [\"10.9.0.0/16\"]\n",
    );
    let config = parse_config(&own, "<test>").unwrap();
    assert!(config.is_denied_destination("10.9.1.1".parse().unwrap()));
    assert!(
        !config.is_denied_destination("127.0.0.1".parse().unwrap()),
        "an explicit list replaces the default"
    );
}

#[test]
fn unknown_key_names_key_and_line() {
    let text = MINIMAL.replace("target = ", "tagret = ");
    let err = parse_config(&text, "x.toml").unwrap_err().to_string();
    assert!(err.contains("tagret"), "{err}");
    assert!(err.starts_with("x.toml:8:"), "{err}");
}

#[test]
fn longest_client_prefix_wins_per_segment() {
    let text = format!(
        "{MINIMAL}\n[[listeners.client_profiles]]\nprefix = \"10.0.0.0/8\"\nlocal_profile = \"wan\"\nremote_profile = \"wan\"\n\
         [[listeners.client_profiles]]\nprefix = \"10.1.0.128/25\"\nlocal_profile = \"satellite-local\"\n"
    );
    let config = parse_config(&text, "<test>").unwrap();
    let l = &config.listeners[0];
    assert_eq!(
        l.profiles_for("10.1.0.200".parse().unwrap()),
        ("satellite-local", "wan")
    );
    assert_eq!(l.profiles_for("10.1.0.2".parse().unwrap()), ("wan", "wan"));
    assert_eq!(
        l.profiles_for("192.0.2.1".parse().unwrap()),
        ("default", "default")
    );
}

#[test]
fn target_parsing() {
    assert_eq!(
        TargetAddr::parse("[::1]:80").unwrap(),
        TargetAddr::Ip("[::1]:80".parse().unwrap())
    );
    assert_eq!(
        TargetAddr::parse("example.org:443").unwrap(),
        TargetAddr::Domain("example.org".into(), 443)
    );
    assert!(TargetAddr::parse("example.org").is_err());
    assert!(TargetAddr::parse("::1:80").is_err());
    assert!(TargetAddr::parse("host:99999").is_err());
    // Mistyped addresses are not host names.
    for bad in [
        "10.2.0.300:5201",
        "10.2.0:80",
        "1.2.3.4.5:80",
        "bad host:80",
        "-a.org:80",
    ] {
        assert!(TargetAddr::parse(bad).is_err(), "{bad}");
    }
    assert!(TargetAddr::parse("10.2.0.300:5201")
        .unwrap_err()
        .contains("neither an IPv4 address"));
    for good in [
        "localhost:80",
        "my_host.lan:80",
        "a-b.example.org.:443",
        "x1.2b:80",
    ] {
        assert!(TargetAddr::parse(good).is_ok(), "{good}");
    }
}

#[test]
fn passwords_not_in_debug() {
    let text = r#"
[proxy]
allowed_clients = ["127.0.0.1"]
[[listeners]]
name = "s"
mode = "socks5"
listen = "127.0.0.1:0"
auth = "password"
users = [{ name = "alice", password = "sekrit-pw" }]
"#;
    let config = parse_config(text, "<test>").unwrap();
    let dbg = format!("{config:?}");
    assert!(dbg.contains("alice"));
    assert!(!dbg.contains("sekrit-pw"));
}

const HTTP: &str = r#"
[proxy]
allowed_clients = ["127.0.0.1"]
[[listeners]]
name = "web"
mode = "http"
listen = "127.0.0.1:0"
remote_profile = "wan"
"#;

#[test]
fn http_listener_without_section_gets_engine_defaults() {
    let config = parse_config(HTTP, "<test>").unwrap();
    let listener = &config.listeners[0];
    assert!(matches!(listener.intercept, Intercept::Http));
    let http = listener.http.as_ref().unwrap();
    let defaults = HttpProxyConfig::default();
    assert_eq!(http.client.max_pipelined, defaults.client.max_pipelined);
    assert_eq!(http.upstream.idle_keep, defaults.upstream.idle_keep);
    assert_eq!(http.cache.memory_bytes, defaults.cache.memory_bytes);
    assert!(http.cache.enabled && http.cache.disk.is_none());
    assert_eq!(http.via_name, DEFAULT_HTTP_VIA_NAME);
    // Split-connection listeners have no engine.
    assert!(parse_config(MINIMAL, "<test>").unwrap().listeners[0]
        .http
        .is_none());
}

#[test]
fn http_section_maps_keys_and_small_memory_lowers_object_cap() {
    let text = format!(
        "{HTTP}[listeners.http]\nupstream_keepalive = false\nupstream_max_idle = 0\n\
         cache_memory_bytes = 100000\nclient_idle_timeout = \"7s\"\n"
    );
    let config = parse_config(&text, "<test>").unwrap();
    let http = config.listeners[0].http.as_ref().unwrap();
    assert!(http.upstream.keepalive.is_none());
    assert_eq!(http.upstream.max_idle_per_origin, 0);
    assert_eq!(http.cache.memory_bytes, 100_000);
    assert_eq!(http.cache.max_object_bytes, 100_000);
    assert_eq!(http.client.idle_timeout, Duration::from_secs(7));
}

#[test]
fn transparent_http_application_and_shared_cache_dir() {
    let transparent = |name: &str, port: u16, dir: &str| {
        format!(
            "[[listeners]]\nname = \"{name}\"\nmode = \"transparent\"\n\
             application = \"http\"\nlisten = \"0.0.0.0:{port}\"\n\
             [listeners.http]\ncache_disk_dir = \"{dir}\"\n"
        )
    };
    let base = "[proxy]\nallowed_clients = [\"10.0.0.0/8\"]\n";
    let one = format!("{base}{}", transparent("a", 7080, "/var/cache/m/a"));
    let config = parse_config(&one, "<test>").unwrap();
    assert!(matches!(
        config.listeners[0].intercept,
        Intercept::Transparent { .. }
    ));
    assert!(config.listeners[0].http.is_some());
    let two = format!("{one}{}", transparent("b", 7081, "/var/cache/m/a"));
    let err = parse_config(&two, "<test>").unwrap_err().to_string();
    assert!(err.contains("listeners[1].http.cache_disk_dir"), "{err}");
    assert!(
        err.contains("already the cache directory of listener \"a\""),
        "{err}"
    );
}

#[test]
fn line_column_counts_from_one() {
    assert_eq!(line_column("ab\ncd", 0), (1, 1));
    assert_eq!(line_column("ab\ncd", 4), (2, 2));
}

const TWO_ENDED: &str = r#"
[proxy]
allowed_clients = ["10.1.0.0/24"]
[keys.k]
secret = "00112233445566778899aabbccddeeff"
[[peers]]
name = "wide"
address = "10.9.0.2:7400"
key = "k"
[[peers]]
name = "narrow"
address = "gw.example:7400"
key = "k"
destinations = ["10.2.0.0/16"]
warm_connections = 0
warm_max_idle = "10s"
[[listeners]]
name = "socks"
mode = "socks5"
listen = "127.0.0.1:0"
via = ["wide", "narrow"]
[[listeners]]
name = "gw"
mode = "peer"
listen = "127.0.0.1:0"
keys = ["k"]
spoof_client_address = true
"#;

#[test]
fn peers_get_defaults_and_the_most_specific_one_wins() {
    let config = parse_config(TWO_ENDED, "<test>").unwrap();
    assert_eq!(config.max_hops, DEFAULT_MAX_HOPS);
    assert_eq!(config.peer_header_window, DEFAULT_PEER_HEADER_WINDOW);
    let wide = &config.peers[0];
    assert_eq!(wide.warm_connections, DEFAULT_WARM_CONNECTIONS);
    assert_eq!(wide.warm_max_idle, DEFAULT_WARM_MAX_IDLE);
    assert_eq!(wide.destinations.len(), 2, "every destination, v4 and v6");
    assert_eq!(wide.profile, DEFAULT_PROFILE);
    assert_eq!(config.peers[1].warm_connections, 0);
    let via = &config.listeners[0].via;
    let pick = |addr: &str| peer_for(&config.peers, via, addr.parse().unwrap()).copied();
    assert_eq!(pick("10.2.3.4"), Some(1));
    assert_eq!(pick("::ffff:10.2.3.4"), Some(1));
    assert_eq!(pick("192.0.2.1"), Some(0));
    assert_eq!(pick("2001:db8::1"), Some(0));
    assert!(peer_for(&config.peers, &[1], "192.0.2.1".parse().unwrap()).is_none());
    assert!(matches!(
        &config.listeners[1].intercept,
        Intercept::Peer { keys, spoof_client_address: true, .. } if keys == &["k"]
    ));
    assert!(
        !format!("{:?}", config.keys).contains("0011"),
        "keys stay out of Debug"
    );
}

#[test]
fn keys_come_from_files_and_one_source_only() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("k.key");
    std::fs::write(&file, "ffeeddccbbaa99887766554433221100\n").unwrap();
    let with_file = TWO_ENDED.replace(
        "secret = \"00112233445566778899aabbccddeeff\"",
        &format!("secret_file = \"{}\"", file.display()),
    );
    let config = parse_config(&with_file, "<test>").unwrap();
    assert_eq!(config.keys["k"].bytes()[0], 0xff);

    let both = TWO_ENDED.replace(
        "secret = \"00112233445566778899aabbccddeeff\"",
        &format!(
            "secret = \"00112233445566778899aabbccddeeff\"\nsecret_file = \"{}\"",
            file.display()
        ),
    );
    let err = parse_config(&both, "<test>").unwrap_err().to_string();
    assert!(
        err.contains("keys.k: set one of secret and secret_file"),
        "{err}"
    );
    let missing = with_file.replace("k.key", "absent.key");
    let err = parse_config(&missing, "<test>").unwrap_err().to_string();
    assert!(err.contains("keys.k.secret_file: cannot read"), "{err}");
    // A device (a typo for a key file) is refused, not read without end.
    let device = with_file.replace(&file.display().to_string(), "/dev/zero");
    let err = parse_config(&device, "<test>").unwrap_err().to_string();
    assert!(err.contains("is not a regular file"), "{err}");
    let not_hex = TWO_ENDED.replace("00112233445566778899aabbccddeeff", "zz");
    let err = parse_config(&not_hex, "<test>").unwrap_err().to_string();
    assert!(err.contains("keys.k.secret: is not hexadecimal"), "{err}");
    let err = parse_config(&TWO_ENDED.replace("[keys.k]", "[keys.\"a b\"]"), "<test>")
        .unwrap_err()
        .to_string();
    assert!(err.contains("keys.a b: a key name travels"), "{err}");
}

#[test]
fn peer_tables_name_what_is_wrong() {
    for (from, to, expected) in [
        (
            "name = \"narrow\"",
            "name = \"wide\"",
            "peers[1].name: duplicate peer name",
        ),
        (
            "address = \"10.9.0.2:7400\"",
            "address = \"10.9.0.2\"",
            "peers[0].address",
        ),
        (
            "destinations = [\"10.2.0.0/16\"]",
            "destinations = []",
            "peers[1].destinations",
        ),
        (
            "destinations = [\"10.2.0.0/16\"]",
            "destinations = [\"x\"]",
            "peers[1].destinations[0]",
        ),
        (
            "warm_max_idle = \"10s\"",
            "profile = \"nope\"",
            "peers[1].profile: unknown profile",
        ),
        (
            "via = [\"wide\", \"narrow\"]",
            "via = [\"wide\", \"wide\"]",
            "listeners[0].via[1]",
        ),
        (
            "keys = [\"k\"]",
            "keys = [\"k\", \"other\"]",
            "listeners[1].keys[1]: unknown key",
        ),
        (
            "name = \"gw\"\nmode = \"peer\"",
            "name = \"gw\"\nmode = \"forward\"\ntarget = \"10.2.0.2:1\"",
            "listeners[1].keys: only allowed when mode = \"peer\"",
        ),
    ] {
        assert!(TWO_ENDED.contains(from), "{from}");
        let err = parse_config(&TWO_ENDED.replace(from, to), "<test>")
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{expected}: {err}");
    }
}

#[test]
fn access_links_take_prefixes_a_rate_and_subscriber_lengths() {
    let text = format!(
        "{MINIMAL}\n[[access_links]]\nclients = [\"10.64.0.0/10\", \"fd00:2::/48\"]\nrate_bps = 384e3\n\
         [[access_links]]\nclients = [\"10.128.0.0/16\"]\nrate_bps = 2000000\nsubscriber_prefix_v4 = 30\nqueue_bytes = 30000\n"
    );
    let config = parse_config(&text, "<test>").unwrap();
    let [cellular, cable] = &config.access_links[..] else {
        panic!("two access links: {:?}", config.access_links);
    };
    assert_eq!(cellular.rate_bps, 384_000);
    assert_eq!(cellular.subscriber_prefix_v4, 32);
    assert_eq!(cellular.subscriber_prefix_v6, 64);
    assert_eq!(cable.subscriber_prefix_v4, 30);
    assert_eq!(cellular.queue_bytes, None);
    assert_eq!(cable.queue_bytes, Some(30_000));
    assert!(parse_config(MINIMAL, "<test>")
        .unwrap()
        .access_links
        .is_empty());

    for (entry, key, problem) in [
        ("rate_bps = 384000", "access_links[0].clients", "required"),
        (
            "clients = []\nrate_bps = 384000",
            "access_links[0].clients",
            "required",
        ),
        (
            "clients = [\"10.0.0.0/8\"]",
            "access_links[0].rate_bps",
            "required",
        ),
        (
            "clients = [\"10.0.0.0/8\"]\nrate_bps = 8000",
            "access_links[0].rate_bps",
            "below",
        ),
        (
            "clients = [\"ten\"]\nrate_bps = 384000",
            "access_links[0].clients[0]",
            "not an IP prefix",
        ),
        (
            "clients = [\"10.0.0.0/8\"]\nrate_bps = 384000\nsubscriber_prefix_v4 = 33",
            "access_links[0].subscriber_prefix_v4",
            "longer than an address",
        ),
        (
            "clients = [\"10.0.0.0/8\"]\nrate_bps = 384000\nqueue_bytes = 1000",
            "access_links[0].queue_bytes",
            "less than one full-size packet",
        ),
    ] {
        let text = format!("{MINIMAL}\n[[access_links]]\n{entry}\n");
        let err = parse_config(&text, "<test>").unwrap_err().to_string();
        assert!(
            err.contains(key) && err.contains(problem),
            "{entry:?}: {err}"
        );
    }
    let typo = format!("{MINIMAL}\n[[access_links]]\nclients = [\"10.0.0.0/8\"]\nrate = 1\n");
    assert!(
        parse_config(&typo, "<test>").is_err(),
        "unknown keys are refused"
    );
}
