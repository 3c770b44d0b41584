// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Sanity run of the web workload on an emulated GEO satellite link (run as root):
//! client <-> server, forward 400 kbit/s, return 56 kbit/s, 250 ms one way each, no proxy.
//! Prints page load time and connections for each HTTP mode, so a change of the loader's
//! behaviour shows up at a glance (HTTP/1.0 slowest, pipelining fastest once a page has
//! several objects).
//!
//! `cargo run --release -p midway-web --example geo_sanity`

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use midway_labnet::{
    fresh_tag, install_cleanup_on_signal, DirectionConfig, HostSpec, LinkSpec, QueueLimit,
    StackProfile, Topology, TopologySpec,
};
use midway_web::{load_pages, CacheMode, HttpMode, LoadSpec, Origin, SiteSpec};

fn direction(rate_bps: u64) -> DirectionConfig {
    DirectionConfig {
        delay: Duration::from_millis(250),
        rate_bps: Some(rate_bps),
        queue: QueueLimit::Packets(200),
        ..DirectionConfig::default()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    install_cleanup_on_signal()?;
    let spec = TopologySpec {
        hosts: vec![
            HostSpec {
                name: "client".into(),
                stack: StackProfile::Modern,
            },
            HostSpec {
                name: "server".into(),
                stack: StackProfile::Modern,
            },
        ],
        links: vec![LinkSpec {
            a: "client".into(),
            b: "server".into(),
            a_to_b: direction(56_000),
            b_to_a: direction(400_000),
        }],
    };
    let topology = Topology::build(&spec, &fresh_tag(), 1)?;
    let server = topology.addr("server", "client");
    // The first packet to a neighbour waits for ARP across the emulated link (one round trip
    // of 0.5 s); a discarded connection first keeps that out of the first measurement.
    topology
        .in_host("client", move || {
            std::net::TcpStream::connect_timeout(
                &SocketAddr::new(server, 9),
                Duration::from_secs(5),
            )
        })
        .ok();
    for objects in [0, 7, 19] {
        let site = SiteSpec {
            hosts: vec!["www.lab".into(), "s1.lab".into()],
            pages: 1,
            page_bytes: 65_000,
            objects,
            object_hosts: 1,
            cache_max_age: Some(3600),
            keepalive_timeout: Duration::from_secs(15),
            max_keepalive_requests: 100,
        };
        let origin_site = site.clone();
        let origin = topology.in_host("server", move || {
            Origin::start(SocketAddr::new(server, 80), origin_site)
        })?;
        for mode in [HttpMode::Http10, HttpMode::KeepAlive, HttpMode::Pipelining] {
            let load = LoadSpec {
                site: site.clone(),
                resolve: BTreeMap::from([("www.lab".into(), server), ("s1.lab".into(), server)]),
                port: 80,
                proxy: None,
                mode,
                max_connections_per_host: 6,
                connection_limit: midway_web::ConnectionLimit::PerServer,
                request_headers: midway_web::RequestHeaders::Minimal,
                cache: CacheMode::Plain,
                think_time: Duration::ZERO,
                timeout: Duration::from_secs(300),
            };
            let result = topology.in_host("client", move || load_pages(&load))?;
            println!(
                "65 KB, {objects:2} objects, {:10}: {:6.2} s, {:2} connections",
                mode.as_str(),
                result.pages[0].seconds,
                result.connections_opened
            );
        }
        drop(origin);
    }
    Ok(())
}
