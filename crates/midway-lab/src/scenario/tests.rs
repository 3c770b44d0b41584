//! Tests of scenario parsing, validation and overrides.

use super::*;

#[test]
fn set_path_requires_existing_parents_and_replaces_the_leaf() {
    let mut doc: toml::Table = toml::from_str("[links.access.b_to_a]\ndelay = \"10ms\"").unwrap();
    set_path(&mut doc, "links.access.b_to_a.delay", "20ms".into()).unwrap();
    set_path(&mut doc, "links.access.b_to_a.rate", "1Mbit".into()).unwrap();
    set_path(&mut doc, "links.access.a_to_b.delay", "5ms".into()).unwrap();
    assert_eq!(
        doc["links"]["access"]["a_to_b"]["delay"].as_str(),
        Some("5ms")
    );
    assert!(set_path(&mut doc, "nosuch.x", "1ms".into()).is_err());
    assert_eq!(
        doc["links"]["access"]["b_to_a"]["delay"].as_str(),
        Some("20ms")
    );
    assert_eq!(
        doc["links"]["access"]["b_to_a"]["rate"].as_str(),
        Some("1Mbit")
    );
    let error = set_path(&mut doc, "links.acess.b_to_a.delay", "1ms".into()).unwrap_err();
    assert!(error.contains("`links.acess` does not exist"), "{error}");
    let error = set_path(&mut doc, "links.access.b_to_a.delay.x", "1ms".into()).unwrap_err();
    assert!(error.contains("is a value"), "{error}");
    assert!(set_path(&mut doc, "links..x", "1ms".into()).is_err());
}

#[test]
fn axis_values_are_derived_from_units() {
    assert_eq!(derived_axis_value(&"100ms".into()), Some(100.0));
    assert_eq!(derived_axis_value(&"3MB".into()), Some(3e6));
    assert_eq!(derived_axis_value(&toml::Value::Integer(5)), Some(5.0));
    let loss: toml::Value =
        toml::from_str::<toml::Table>("x = { bernoulli = 0.03 }").unwrap()["x"].clone();
    assert_eq!(derived_axis_value(&loss), Some(0.03));
    assert_eq!(derived_axis_value(&"modern".into()), None);
}

#[test]
fn bulk_connections_default_to_one_and_go_into_the_params() {
    let text = |extra: &str| {
        format!(
            "name = \"c\"\ndescription = \"d\"\nsource = \"s\"\n[hosts.client]\n[hosts.server]\n[roles]\nclient = \"client\"\n\
             proxy = \"server\"\nserver = \"server\"\n[links.l]\na = \"client\"\n\
             b = \"server\"\n[workload]\nkind = \"bulk\"\nbytes = \"300KB\"\n{extra}\
             [cases.direct]\nkind = \"direct\"\n[[experiments]]\nname = \"e\"\n\
             cases = [\"direct\"]\n"
        )
    };
    let connections = |extra: &str| {
        let loaded = LoadedScenario::from_text(Path::new("c.toml"), text(extra)).unwrap();
        match &loaded.base.workload {
            Workload::Bulk(bulk) => bulk.connections,
            other => panic!("not bulk: {other:?}"),
        }
    };
    assert_eq!(connections(""), 1);
    assert_eq!(connections("connections = 3\n"), 3);
    let params = |extra: &str| {
        LoadedScenario::from_text(Path::new("c.toml"), text(extra))
            .unwrap()
            .base
            .flat_params()
    };
    assert_eq!(params("connections = 3\n")["connections"], 3);
    assert!(!params("").contains_key("connections"));
    let error = LoadedScenario::from_text(Path::new("c.toml"), text("connections = 65\n"))
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("between 1 and 64 (got 65)"), "{error}");
}

const WEB: &str = r#"
name = "web"
description = "d"
source = "s"
[hosts.client]
[hosts.proxy]
[hosts.server]
[roles]
client = "client"
proxy = "proxy"
server = "server"
[links.access]
a = "client"
b = "proxy"
[links.internet]
a = "proxy"
b = "server"
[workload]
kind = "web"
page_bytes = "65KB"
objects = 19
[cases.direct]
kind = "direct"
[cases.squid]
kind = "squid"
upstream_persistence = "long"
[cases.midway-http]
kind = "midway"
intercept = "http"
http = { cache = false }
[quick]
set = { "workload.pages" = 1 }
[[experiments]]
name = "modes"
cases = ["direct", "squid", "midway-http"]
set = { "workload.pages" = 3 }
[experiments.sweep]
param = "workload.http"
label = "http"
values = ["1.0", "1.1", "pipelining"]
"#;

fn web_of(scenario: &Scenario) -> &WebWorkload {
    match &scenario.workload {
        Workload::Web(web) => web,
        other => panic!("not web: {other:?}"),
    }
}

#[test]
fn web_defaults_follow_the_interface() {
    let loaded = LoadedScenario::from_text(Path::new("web.toml"), WEB.into()).unwrap();
    let web = web_of(&loaded.base);
    assert_eq!(web.hosts, ["www.lab"]);
    assert_eq!(web.pages, 1);
    // A single host: the objects can only be on it.
    assert_eq!(web.object_hosts, 0);
    assert_eq!(web.http, HttpVersion::KeepAlive);
    assert_eq!(web.connections_per_host, 6);
    assert_eq!(web.client, WebClient::Loader);
    assert_eq!(web.cache, WebCache::Plain);
    assert_eq!(
        web.cache_max_age,
        Some(std::time::Duration::from_secs(3600))
    );
    assert_eq!(web.keepalive_timeout, std::time::Duration::from_secs(15));
    assert_eq!(web.think_time, std::time::Duration::ZERO);
    assert_eq!(web.port, 80);
    let squid = loaded.base.cases["squid"].squid.unwrap();
    assert!(squid.cache);
    assert_eq!(squid.upstream_persistence, UpstreamPersistence::Long);
    let http = loaded.base.cases["midway-http"].midway.as_ref().unwrap();
    assert_eq!(http.intercept, Intercept::Http);
    assert_eq!(http.http["cache"].as_bool(), Some(false));
}

#[test]
fn web_values_are_swept_set_and_quick_overridden_by_dotted_path() {
    let loaded = LoadedScenario::from_text(Path::new("web.toml"), WEB.into()).unwrap();
    let experiment = &loaded.file.experiments[0];
    let sweep = experiment.sweep.as_ref().unwrap();
    let modes: Vec<(HttpVersion, u32)> = (0..3)
        .map(|index| {
            let mut all = loaded.fixed_overrides(experiment, false);
            all.extend(loaded.sweep_overrides(sweep, index));
            let scenario = loaded.point_scenario(&all).unwrap();
            let web = web_of(&scenario);
            (web.http, web.pages)
        })
        .collect();
    assert_eq!(
        modes,
        [
            (HttpVersion::Http10, 3),
            (HttpVersion::KeepAlive, 3),
            (HttpVersion::Pipelining, 3)
        ]
    );
    let quick = loaded
        .point_scenario(&loaded.fixed_overrides(experiment, true))
        .unwrap();
    assert_eq!(web_of(&quick).pages, 1);
    // A swept value is checked like a written one.
    let bad = Override {
        path: "workload.cache_max_age".into(),
        value: "forever".into(),
        path_span: 0..0,
        value_span: 0..0,
    };
    assert!(loaded.point_scenario(&[bad]).is_err());
    let chromium = Override {
        path: "workload.client".into(),
        value: "chromium".into(),
        path_span: 0..0,
        value_span: 0..0,
    };
    assert_eq!(
        web_of(&loaded.point_scenario(&[chromium]).unwrap()).client,
        WebClient::Chromium
    );
}

#[test]
fn the_loaders_connection_limit_and_headers_are_set_by_name_and_refused_for_chromium() {
    let loaded = LoadedScenario::from_text(Path::new("web.toml"), WEB.into()).unwrap();
    let set = |path: &str, value: &str| Override {
        path: path.into(),
        value: value.into(),
        path_span: 0..0,
        value_span: 0..0,
    };
    let plain = loaded.point_scenario(&[]).unwrap();
    assert_eq!(
        web_of(&plain).connection_limit,
        WebConnectionLimit::PerServer
    );
    let per_origin = set("workload.connection_limit", "per-origin");
    let chosen = loaded
        .point_scenario(std::slice::from_ref(&per_origin))
        .unwrap();
    assert_eq!(
        web_of(&chosen).connection_limit,
        WebConnectionLimit::PerOrigin
    );
    assert!(loaded
        .point_scenario(&[set("workload.connection_limit", "per-browser")])
        .is_err());
    let chromium = set("workload.client", "chromium");
    let error = loaded
        .point_scenario(&[chromium.clone(), per_origin])
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("connection_limit is the loader's"),
        "{error}"
    );
    // Its request headers likewise.
    assert_eq!(web_of(&plain).request_headers, WebRequestHeaders::Minimal);
    let headers = set("workload.request_headers", "chromium");
    let chosen = loaded
        .point_scenario(std::slice::from_ref(&headers))
        .unwrap();
    assert_eq!(web_of(&chosen).request_headers, WebRequestHeaders::Chromium);
    let error = loaded
        .point_scenario(&[chromium, headers])
        .unwrap_err()
        .to_string();
    assert!(error.contains("request_headers is the loader's"), "{error}");
}

#[test]
fn an_experiment_may_bring_its_own_workload_and_quick_settings() {
    // A bulk experiment in a web scenario: its HTTP proxies are simply not among its cases, and
    // the file's [quick] (page settings) gives way to the experiment's own.
    let bulk = "[[experiments]]\nname = \"bulk\"\ncases = [\"direct\"]\n\
                set = { workload = { kind = \"bulk\", bytes = \"1MB\" } }\n\
                quick = { set = { \"workload.bytes\" = \"100KB\" } }\n";
    let loaded = LoadedScenario::from_text(Path::new("web.toml"), format!("{WEB}{bulk}")).unwrap();
    let experiment = &loaded.file.experiments[1];
    let quick = loaded
        .point_scenario(&loaded.fixed_overrides(experiment, true))
        .unwrap();
    match &quick.workload {
        Workload::Bulk(bulk) => assert_eq!(bulk.amount, BulkAmount::Bytes(100_000)),
        other => panic!("not bulk: {other:?}"),
    }
    // The same experiment asking for Squid is refused, naming the case: a proxy that answers
    // HTTP needs requests.
    let error = LoadedScenario::from_text(
        Path::new("web.toml"),
        format!(
            "{WEB}{}",
            bulk.replace("[\"direct\"]", "[\"direct\", \"squid\"]")
        ),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("case `squid` is an HTTP proxy"), "{error}");
}

#[test]
fn web_and_command_clients_do_not_mix_and_bad_values_are_named() {
    let with = |from: &str, to: &str| {
        assert!(WEB.contains(from), "{from}");
        LoadedScenario::from_text(Path::new("web.toml"), WEB.replace(from, to))
    };
    let error = with(
        "objects = 19\n",
        "objects = 19\n[workload.client]\nhost = \"client\"\nargv = [\"true\"]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("not a command"), "{error}");
    let error = with(
        "upstream_persistence = \"long\"",
        "upstream_persistence = \"forever\"",
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("unknown variant `forever`"), "{error}");
    let error = with(
        "kind = \"direct\"",
        "kind = \"direct\"\nupstream_persistence = \"long\"",
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("applies only to `squid` cases"), "{error}");
    let error = with(
        "http = { cache = false }",
        "intercept = \"forward\"\nhttp = {}",
    )
    .unwrap_err()
    .to_string();
    // TOML itself refuses the second `intercept`; a forward case with `http` is refused by us.
    assert!(error.contains("intercept"), "{error}");
    let error = with(
        "intercept = \"http\"\nhttp = { cache = false }",
        "http = { cache = false }",
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("only with intercept = \"http\""), "{error}");
    // The command workload still takes its client table (spans kept for its errors).
    let command = with(
        "kind = \"web\"\npage_bytes = \"65KB\"\nobjects = 19",
        "kind = \"command\"\n[workload.client]\nhost = \"nohost\"\nargv = [\"curl\"]",
    )
    .unwrap_err()
    .to_string();
    assert!(command.contains("web.toml:21:8"), "{command}");
    assert!(command.contains("`nohost`"), "{command}");
}

#[test]
fn a_forward_case_is_refused_only_in_experiments_that_run_chromium() {
    let text = WEB.replace("[quick]", "[cases.haproxy]\nkind = \"haproxy\"\n[quick]");
    let browser = |cases: &str| {
        format!(
            "{text}[[experiments]]\nname = \"browser\"\ncases = {cases}\n\
             set = {{ \"workload.client\" = \"chromium\" }}\n"
        )
    };
    LoadedScenario::from_text(Path::new("web.toml"), browser("[\"direct\", \"squid\"]")).unwrap();
    let error =
        LoadedScenario::from_text(Path::new("web.toml"), browser("[\"direct\", \"haproxy\"]"))
            .unwrap_err()
            .to_string();
    assert!(
        error.contains("experiment `browser`: case `haproxy`"),
        "{error}"
    );
}

#[test]
fn locations_are_one_based_lines_and_columns() {
    let text = "a = 1\nbb = 2\n";
    assert_eq!(location(Path::new("f.toml"), text, &(9..10)), "f.toml:2:4");
    assert_eq!(location(Path::new("f.toml"), text, &(0..1)), "f.toml:1:1");
}

/// A four-host path client - edge - middle - gateway - server... with `workload` and `cases`
/// tables appended: the frame of the chain and competing-flow tests.
fn chain_scenario(workload: &str, cases: &str) -> Result<LoadedScenario, ScenarioError> {
    let text = format!(
        "name = \"chain\"\ndescription = \"d\"\nsource = \"s\"\n\
         [hosts.client]\n[hosts.edge]\n[hosts.middle]\n[hosts.gateway]\n[hosts.server]\n[hosts.aside]\n\
         [roles]\nclient = \"client\"\nproxy = \"edge\"\nserver = \"server\"\n\
         [links.l1]\na = \"client\"\nb = \"edge\"\n[links.l2]\na = \"edge\"\nb = \"middle\"\n\
         [links.l3]\na = \"middle\"\nb = \"gateway\"\n[links.l4]\na = \"gateway\"\nb = \"server\"\n\
         [links.l5]\na = \"gateway\"\nb = \"aside\"\n\
         [workload]\nkind = \"bulk\"\n{workload}\n\
         [cases.direct]\nkind = \"direct\"\n{cases}\n\
         [[experiments]]\nname = \"e\"\ncases = [\"direct\"]\n"
    );
    LoadedScenario::from_text(Path::new("chain.toml"), text)
}

fn chain_error(cases: &str) -> String {
    chain_scenario("bytes = \"1MB\"", cases)
        .err()
        .unwrap_or_else(|| panic!("accepted:\n{cases}"))
        .to_string()
}

#[test]
fn a_chain_case_lists_its_midways_in_path_order() {
    let loaded = chain_scenario(
        "bytes = \"1MB\"",
        "[cases.three]\nkind = \"chain\"\nhosts = [\"edge\", \"middle\", \"gateway\"]\n\
         peer_profile = \"peer\"\nlocal_profile = \"lan\"\nremote_profile = \"wan\"\n\
         [cases.three.profiles.peer]\ninherits = \"wan\"\ncongestion_control = \"reno\"\n",
    )
    .unwrap();
    let case = &loaded.base.cases["three"];
    assert_eq!(case.kind, CaseKind::Chain);
    assert_eq!(case.host, "edge", "a chain's own host is its first midway");
    let chain = case.chain.as_ref().unwrap();
    assert_eq!(chain.hosts, ["edge", "middle", "gateway"]);
    assert_eq!(chain.peer_profile.as_deref(), Some("peer"));
    assert_eq!(chain.local_profile.as_deref(), Some("lan"));
    assert_eq!(chain.remote_profile.as_deref(), Some("wan"));
    assert_eq!(
        chain.profiles["peer"]["congestion_control"].as_str(),
        Some("reno")
    );
    assert!(case.midway.is_none());
}

#[test]
fn a_bad_chain_is_refused_naming_the_key() {
    let cases = [
        (
            "[cases.c]\nkind = \"chain\"\nhosts = [\"edge\", \"nowhere\"]\n",
            "case `c`.hosts names host `nowhere`, which is not in [hosts]",
        ),
        (
            "[cases.c]\nkind = \"chain\"\nhosts = [\"edge\"]\n",
            "`hosts` of a chain names at least 2 midways",
        ),
        (
            "[cases.c]\nkind = \"chain\"\n",
            "case `c` is a `chain` and needs `hosts`",
        ),
        (
            "[cases.c]\nkind = \"chain\"\nhosts = [\"gateway\", \"edge\"]\n",
            "case `c`.hosts: `edge` comes before the host named ahead of it",
        ),
        (
            "[cases.c]\nkind = \"chain\"\nhosts = [\"edge\", \"edge\"]\n",
            "case `c`.hosts: `edge` comes before the host named ahead of it",
        ),
        (
            "[cases.c]\nkind = \"chain\"\nhosts = [\"edge\", \"aside\"]\n",
            "case `c`.hosts: `aside` is not on the path client -> server",
        ),
        (
            "[cases.c]\nkind = \"chain\"\nhosts = [\"client\", \"edge\"]\n",
            "a midway cannot run on the client or server host `client`",
        ),
        (
            "[cases.c]\nkind = \"chain\"\nhost = \"edge\"\nhosts = [\"edge\", \"gateway\"]\n",
            "name its midways' hosts in `hosts`, not `host`",
        ),
        (
            "[cases.c]\nkind = \"chain\"\nhosts = [\"edge\", \"gateway\"]\nintercept = \"forward\"\n",
            "`intercept` applies only to `midway` cases",
        ),
        (
            "[cases.c]\nkind = \"midway\"\npeer_profile = \"wan\"\n",
            "`peer_profile` applies only to `chain` cases",
        ),
        (
            "[cases.c]\nkind = \"direct\"\nhosts = [\"edge\", \"gateway\"]\n",
            "`hosts` applies only to `chain` cases",
        ),
    ];
    for (case, expected) in cases {
        let error = chain_error(case);
        assert!(error.contains(expected), "{case}\n=> {error}");
        assert!(error.starts_with("chain.toml:"), "{error}");
    }
}

#[test]
fn a_bulk_workload_runs_for_bytes_or_a_duration() {
    let amount = |workload: &str| match chain_scenario(workload, "").unwrap().base.workload {
        Workload::Bulk(bulk) => bulk.amount,
        other => panic!("not bulk: {other:?}"),
    };
    assert_eq!(amount("bytes = \"1MB\""), BulkAmount::Bytes(1_000_000));
    assert_eq!(
        amount("duration = \"120s\""),
        BulkAmount::For(std::time::Duration::from_secs(120))
    );
    let params = chain_scenario("duration = \"2s\"", "")
        .unwrap()
        .base
        .flat_params();
    assert_eq!(params["duration_s"], 2.0);
    assert!(!params.contains_key("bytes"));
    for (workload, expected) in [
        (
            "bytes = \"1MB\"\nduration = \"2s\"",
            "either `bytes` or for a `duration`",
        ),
        ("", "needs `bytes`"),
        ("duration = \"0s\"", "workload.duration must be more than 0"),
        (
            "duration = \"400s\"",
            "must be shorter than workload.timeout",
        ),
    ] {
        let error = chain_scenario(workload, "").err().unwrap().to_string();
        assert!(error.contains(expected), "{workload}\n=> {error}");
    }
}

#[test]
fn a_competing_flow_needs_a_duration_and_a_port_of_its_own() {
    let competing = |workload: &str| match chain_scenario(workload, "").unwrap().base.workload {
        Workload::Bulk(bulk) => bulk.competing,
        other => panic!("not bulk: {other:?}"),
    };
    let flow = competing("duration = \"2s\"\n[workload.competing]\n").unwrap();
    assert_eq!(
        flow.congestion_control, "reno",
        "the paper's competing flow"
    );
    assert_eq!(flow.port, DEFAULT_SERVER_PORT + 1);
    assert_eq!(flow.client_recv_buffer, None);
    let flow = competing(
        "duration = \"2s\"\n[workload.competing]\ncongestion_control = \"cubic\"\nport = 6000\n\
         client_recv_buffer = \"1MiB\"\n",
    )
    .unwrap();
    assert_eq!(
        (flow.congestion_control.as_str(), flow.port),
        ("cubic", 6000)
    );
    assert_eq!(flow.client_recv_buffer, Some(1 << 20));
    assert_eq!(competing("duration = \"2s\""), None);
    let params = chain_scenario("duration = \"2s\"\n[workload.competing]\n", "")
        .unwrap()
        .base
        .flat_params();
    assert_eq!(params["competing_congestion_control"], "reno");
    for (workload, expected) in [
        (
            "bytes = \"1MB\"\n[workload.competing]\n",
            "workload.competing runs for as long as the measured transfer",
        ),
        (
            "duration = \"2s\"\n[workload.competing]\nport = 5001\n",
            "workload.competing.port must be neither 0 nor the workload's port 5001",
        ),
        (
            "duration = \"2s\"\n[workload.competing]\nbogus = 1\n",
            "unknown field `bogus`",
        ),
    ] {
        let error = chain_scenario(workload, "").err().unwrap().to_string();
        assert!(error.contains(expected), "{workload}\n=> {error}");
    }
    let error = LoadedScenario::from_text(
        Path::new("c.toml"),
        "name = \"c\"\ndescription = \"d\"\nsource = \"s\"\n[hosts.client]\n[hosts.server]\n\
         [roles]\nclient = \"client\"\nproxy = \"server\"\nserver = \"server\"\n[links.l]\n\
         a = \"client\"\nb = \"server\"\n[workload]\nkind = \"command\"\nduration = \"2s\"\n\
         [workload.client]\nhost = \"client\"\nargv = [\"true\"]\n[cases.direct]\n\
         kind = \"direct\"\n[[experiments]]\nname = \"e\"\ncases = [\"direct\"]\n"
            .to_string(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        error.contains("workload.duration does not apply to a `command` workload"),
        "{error}"
    );
}

#[test]
fn an_experiments_own_limit_is_read_and_zero_is_refused() {
    let limited = "[[experiments]]\nname = \"alone\"\ncases = [\"direct\"]\nmax_jobs = 2\n";
    let loaded =
        LoadedScenario::from_text(Path::new("web.toml"), format!("{WEB}{limited}")).unwrap();
    let max_jobs = loaded.file.experiments[1].max_jobs.as_ref().unwrap();
    assert_eq!(*max_jobs.get_ref(), 2);
    let error = LoadedScenario::from_text(
        Path::new("web.toml"),
        format!("{WEB}{}", limited.replace("= 2", "= 0")),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("max_jobs must be at least 1"), "{error}");
}

/// The README's outage and UDP example, on the internet link of a minimal scenario; `sweep` is
/// added to its experiment.
fn impairment_scenario(sweep: &str) -> Result<LoadedScenario, ScenarioError> {
    let readme_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/README.md");
    let readme = std::fs::read_to_string(readme_path).unwrap();
    let section = &readme[readme
        .find("### Link outages and UDP impairment")
        .expect("the outage section")..];
    let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let end = start + section[start..].find("```").expect("closed block");
    let text = format!(
        "name = \"impaired\"\ndescription = \"d\"\nsource = \"s\"\n[hosts.client]\n\
         [hosts.server]\n[roles]\nclient = \"client\"\nproxy = \"server\"\n\
         server = \"server\"\n[links.internet]\na = \"client\"\nb = \"server\"\n{}\
         [workload]\nkind = \"bulk\"\nbytes = \"300KB\"\n[cases.direct]\nkind = \"direct\"\n\
         [[experiments]]\nname = \"e\"\ncases = [\"direct\"]\n{sweep}",
        &section[start..end]
    );
    LoadedScenario::from_text(Path::new("impaired.toml"), text)
}

#[test]
fn outages_and_udp_impairments_reach_the_emulator_and_the_records() {
    let loaded = impairment_scenario("").unwrap_or_else(|e| panic!("{e}"));
    let spec = loaded.base.topology_spec(Path::new(".")).unwrap();
    let a_to_b = &spec.links[0].a_to_b;
    let periodic = a_to_b.outages.periodic.unwrap();
    assert_eq!(
        (periodic.period, periodic.duration, periodic.offset),
        (
            std::time::Duration::from_secs(15),
            std::time::Duration::from_millis(200),
            std::time::Duration::from_secs(5)
        )
    );
    assert_eq!(a_to_b.outages.once.len(), 1);
    assert_eq!(
        a_to_b.udp,
        Some(midway_linkemu::UdpImpairment {
            port: Some(443),
            action: midway_linkemu::UdpAction::RateLimit {
                rate_bps: 1_000_000,
                burst_bytes: 15_000
            }
        })
    );
    // The other direction stays a perfect link.
    assert_eq!(
        spec.links[0].b_to_a,
        midway_linkemu::DirectionConfig::default()
    );
    let params = loaded.base.flat_params();
    assert_eq!(
        params["internet.a_to_b.outages"],
        "200ms every 15000ms from 5000ms; 5000ms at 20000ms"
    );
    assert_eq!(params["internet.a_to_b.udp"], "1Mbit burst 15000B port 443");
    assert!(!params.contains_key("internet.b_to_a.udp"));
}

#[test]
fn a_swept_outage_is_checked_like_one_written_in_the_file() {
    let sweep =
        "[experiments.sweep]\nparam = \"links.internet.a_to_b.outages.periodic.duration\"\n\
                 label = \"outage\"\nvalues = [\"100ms\", \"20s\"]\n";
    let error = impairment_scenario(sweep).err().unwrap().to_string();
    assert!(error.contains("not shorter than its period"), "{error}");
    let sweep = "[experiments.sweep]\nparam = \"links.internet.a_to_b.udp.rate\"\n\
                 label = \"udp rate\"\nvalues = [\"500kbit\", \"2Mbit\"]\n";
    let loaded = impairment_scenario(sweep).unwrap_or_else(|e| panic!("{e}"));
    let experiment = &loaded.file.experiments[0];
    let overrides = loaded.sweep_overrides(experiment.sweep.as_ref().unwrap(), 1);
    let point = loaded.point_scenario(&overrides).unwrap();
    assert_eq!(
        point.flat_params()["internet.a_to_b.udp"],
        "2Mbit burst 15000B port 443"
    );
}
