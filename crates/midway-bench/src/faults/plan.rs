//! What the campaign runs: the paths through midway, midway's config with one listener per
//! path, and each transfer's plan (sizes, seed, who resets where), drawn from the campaign's
//! seed alone, and the byte streams the ends check.
//!
//! The two-midway paths ([`PEER_PATHS`]: an edge and a gateway, see [`super::peers`]) draw
//! their transfers from a stream of their own, interleaved with the single-midway paths'
//! ([`slot_id`]): a seed draws the same single-midway transfers whether or not they run.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use midway_config::{ConfigBuilder, ListenerBuilder, ModeName, RelayName, TransportName};
use rand_xoshiro::rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;

use super::peers::{self, PeerKeys};
use super::{CampaignOptions, IDLE_TIMEOUT, SERVER_PORT};
use crate::netns::{CLIENT_PREFIX, ROUTER_CLIENT_SIDE, SERVER_ADDR};

/// The server port each transparent listener intercepts (the other paths reach
/// [`SERVER_PORT`]).
pub(super) const TRANSPARENT_SPLICE_PORT: u16 = 5301;
pub(super) const TRANSPARENT_SPOOL_PORT: u16 = 5302;
/// Length of a transfer's header.
pub(super) const HEADER_LEN: usize = 48;
const MAGIC: u32 = 0x4d57_4643; // "MWFC"
/// Salt of the two-midway paths' draws.
const PEER_SALT: u64 = 0x7065_6572; // "peer"

/// How a client reaches the server through midway: an intercept mode and a relay model, or an
/// edge and a gateway midway and the transport between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    Forward(RelayName),
    Socks5(RelayName),
    Transparent(RelayName),
    HttpConnect,
    /// A forward listener of the router's midway (the edge, buffer relay) `via` the gateway
    /// midway in the server host, over this transport.
    Edge(TransportName),
}

pub(super) const PATHS: [Route; 7] = [
    Route::Forward(RelayName::Buffer),
    Route::Forward(RelayName::Spool),
    Route::Socks5(RelayName::Buffer),
    Route::Socks5(RelayName::Spool),
    Route::Transparent(RelayName::Buffer),
    Route::Transparent(RelayName::Spool),
    Route::HttpConnect,
];

/// The two-midway paths, one per peer transport.
pub(super) const PEER_PATHS: [Route; 3] = [
    Route::Edge(TransportName::Tcp),
    Route::Edge(TransportName::Tls),
    Route::Edge(TransportName::Quic),
];

fn relay_name(relay: RelayName) -> &'static str {
    match relay {
        RelayName::Buffer => "buffer",
        RelayName::Spool => "spool",
    }
}

impl Route {
    pub(super) fn label(self) -> String {
        match self {
            Route::Forward(r) => format!("forward, {}", relay_name(r)),
            Route::Socks5(r) => format!("socks5, {}", relay_name(r)),
            Route::Transparent(r) => format!("transparent, {}", relay_name(r)),
            Route::HttpConnect => "http CONNECT".into(),
            Route::Edge(t) => format!("edge+gateway, {}", peers::transport_name(t)),
        }
    }

    /// The name of the router midway's listener for this path.
    pub(super) fn listener_name(self) -> String {
        self.label().replace([',', ' ', '+'], "-")
    }

    /// The port midway listens on for this path (transparent: the server port intercepted).
    pub(super) fn port(self) -> u16 {
        match self {
            Route::Forward(RelayName::Buffer) => 7101,
            Route::Forward(RelayName::Spool) => 7102,
            Route::Socks5(RelayName::Buffer) => 7103,
            Route::Socks5(RelayName::Spool) => 7104,
            Route::Transparent(RelayName::Buffer) => 7105,
            Route::Transparent(RelayName::Spool) => 7106,
            Route::HttpConnect => 7107,
            Route::Edge(TransportName::Tcp) => 7108,
            Route::Edge(TransportName::Tls) => 7109,
            Route::Edge(TransportName::Quic) => 7110,
        }
    }
}

/// The router midway's config for the campaign: one listener per path (for the two-midway
/// paths, the edge's).
pub(super) fn midway_config(
    client_iface: &str,
    spool: &Path,
    keys: &PeerKeys,
) -> anyhow::Result<String> {
    let listen = |port: u16| SocketAddr::from((ROUTER_CLIENT_SIDE, port));
    let server = SocketAddr::from((SERVER_ADDR, SERVER_PORT));
    let mut config = ConfigBuilder::new([CLIENT_PREFIX])
        .max_connections(4000, 4000)
        .timeouts(Duration::from_secs(5), IDLE_TIMEOUT, Duration::from_secs(2))
        .spool_dir(spool);
    for path in PATHS {
        let name = path.listener_name();
        let listener = match path {
            Route::Forward(relay) => {
                ListenerBuilder::forward(name, listen(path.port()), server).relay(relay)
            }
            Route::Socks5(relay) => {
                ListenerBuilder::new(ModeName::Socks5, name, listen(path.port())).relay(relay)
            }
            Route::Transparent(relay) => {
                let intercepted = match relay {
                    RelayName::Buffer => TRANSPARENT_SPLICE_PORT,
                    RelayName::Spool => TRANSPARENT_SPOOL_PORT,
                };
                ListenerBuilder::transparent(
                    name,
                    SocketAddr::from((Ipv4Addr::UNSPECIFIED, path.port())),
                    [client_iface.to_string()],
                    [intercepted],
                )
                .relay(relay)
            }
            Route::HttpConnect => ListenerBuilder::new(ModeName::Http, name, listen(path.port())),
            Route::Edge(_) => anyhow::bail!("{} is not a single-midway path", path.label()),
        };
        config = config.listener(listener.build());
    }
    let mut text = peers::add_edge(config, keys, listen)?
        .to_toml()
        .context("cannot write midway's config")?;
    // CONNECT to a port other than 443 is the campaign's server; the HTTP engine allows what
    // the config allows.
    text.push('\n');
    Ok(text)
}

/// The campaign's seeded generator: splitmix64 (rand_xoshiro's, the one the lab's seeds and the
/// web origin's bodies come from too), so a seed draws the same transfers, faults and bytes as
/// the campaigns run before this generator was shared.
#[derive(Debug, Clone)]
pub(super) struct Rng(SplitMix64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(SplitMix64::seed_from_u64(seed))
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform-ish in 0..n (the modulo of a draw: the campaign's recorded draws depend on it).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// Log-uniform in 0..=max (small transfers as common as big ones).
    fn size(&mut self, max: u64) -> u64 {
        let bits = 64 - max.leading_zeros() as u64;
        let scale = self.below(bits + 1);
        if scale == 0 {
            0
        } else {
            self.below((1u64 << scale).min(max + 1))
        }
    }
}

/// The bytes of one direction of one transfer: the same whatever the sizes of the reads and
/// writes that cut it.
#[derive(Debug, Clone)]
pub(super) struct ByteStream {
    rng: Rng,
    word: [u8; 8],
    used: usize,
}

impl ByteStream {
    pub(super) fn new(seed: u64) -> ByteStream {
        ByteStream {
            rng: Rng::new(seed),
            word: [0; 8],
            used: 8,
        }
    }

    pub(super) fn fill(&mut self, buf: &mut [u8]) {
        for byte in buf {
            if self.used == 8 {
                self.word = self.rng.next().to_le_bytes();
                self.used = 0;
            }
            *byte = self.word[self.used];
            self.used += 1;
        }
    }
}

/// One transfer's plan, sent to the server in the header.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub(super) id: u64,
    pub(super) up: u64,
    pub(super) down: u64,
    pub(super) seed: u64,
    /// Offset in the download where the server resets (`u64::MAX`: never).
    pub(super) server_reset_at: u64,
}

impl Plan {
    pub(super) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut header = [0u8; HEADER_LEN];
        header[..4].copy_from_slice(&MAGIC.to_be_bytes());
        for (i, value) in [self.id, self.up, self.down, self.seed, self.server_reset_at]
            .into_iter()
            .enumerate()
        {
            header[8 + 8 * i..16 + 8 * i].copy_from_slice(&value.to_be_bytes());
        }
        header
    }

    pub(super) fn decode(header: &[u8; HEADER_LEN]) -> Option<Plan> {
        if header[..4] != MAGIC.to_be_bytes() {
            return None;
        }
        let word = |i: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&header[8 + 8 * i..16 + 8 * i]);
            u64::from_be_bytes(bytes)
        };
        Some(Plan {
            id: word(0),
            up: word(1),
            down: word(2),
            seed: word(3),
            server_reset_at: word(4),
        })
    }
}

/// How the client misbehaves in one transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClientBehaviour {
    Normal,
    /// Resets after reading this many bytes of the download.
    ResetAt(u64),
    /// Reads in small pieces with pauses.
    Slow,
    /// Stops reading for longer than midway's idle timeout after this many bytes.
    StallAt(u64),
}

/// The transfer the campaign's `slot`-th start runs: the single-midway transfers (ids below
/// `options.transfers`) and the two-midway ones (the ids after) spread evenly among each other.
pub(super) fn slot_id(options: &CampaignOptions, slot: u64) -> u64 {
    let (single, peer) = (options.transfers, options.peer_transfers);
    let total = u128::from(single + peer);
    // Two-midway transfers among the first `s` slots.
    let peer_before = |s: u64| (u128::from(s) * u128::from(peer) / total.max(1)) as u64;
    if peer_before(slot + 1) > peer_before(slot) {
        single + peer_before(slot)
    } else {
        slot - peer_before(slot)
    }
}

/// Transfer `id`'s path, plan and client behaviour, from the campaign's seed alone: ids below
/// `options.transfers` through [`PATHS`], the others through [`PEER_PATHS`] from a stream of
/// their own.
pub(super) fn draw(options: &CampaignOptions, id: u64) -> (Route, Plan, ClientBehaviour) {
    let (seed, index, paths): (u64, u64, &[Route]) = match id.checked_sub(options.transfers) {
        None => (options.seed, id, &PATHS),
        Some(k) => (options.seed ^ PEER_SALT, k, &PEER_PATHS),
    };
    let mut rng = Rng::new(seed ^ index.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let path = paths[rng.below(paths.len() as u64) as usize];
    let up = rng.size(options.max_up);
    let down = rng.size(options.max_down);
    let seed = rng.next();
    let roll = rng.below(100);
    let server_reset_at = if (70..78).contains(&roll) {
        rng.below(down + 1)
    } else {
        u64::MAX
    };
    let behaviour = match roll {
        78..=85 => ClientBehaviour::ResetAt(rng.below(down + 1)),
        86..=91 => ClientBehaviour::Slow,
        92..=94 => ClientBehaviour::StallAt(rng.below(down + 1)),
        _ => ClientBehaviour::Normal,
    };
    // Slow readers read 4 KiB per 2 ms: keep them under a few seconds.
    let down = if behaviour == ClientBehaviour::Slow {
        down.min(1 << 20)
    } else {
        down
    };
    (
        path,
        Plan {
            id,
            up,
            down,
            seed,
            server_reset_at,
        },
        behaviour,
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn a_stream_is_the_same_however_it_is_cut() {
        let mut whole = vec![0u8; 1000];
        ByteStream::new(9).fill(&mut whole);
        let mut pieces = vec![0u8; 1000];
        let mut stream = ByteStream::new(9);
        for chunk in pieces.chunks_mut(7) {
            stream.fill(chunk);
        }
        assert_eq!(whole, pieces);
    }

    #[test]
    fn the_header_round_trips() {
        let plan = Plan {
            id: 3,
            up: 4,
            down: 5,
            seed: 6,
            server_reset_at: u64::MAX,
        };
        let back = Plan::decode(&plan.encode()).unwrap();
        assert_eq!(
            (back.id, back.up, back.down, back.seed, back.server_reset_at),
            (3, 4, 5, 6, u64::MAX)
        );
        let mut wrong = plan.encode();
        wrong[0] ^= 1;
        assert!(Plan::decode(&wrong).is_none());
    }

    #[test]
    fn draws_depend_on_the_seed_and_the_id_only() {
        let options = CampaignOptions::quick(PathBuf::from("midway"));
        let a = draw(&options, 42);
        let b = draw(&options, 42);
        assert_eq!(
            (a.0, a.1.down, a.1.seed, a.2),
            (b.0, b.1.down, b.1.seed, b.2)
        );
        assert!((0..200).all(|id| draw(&options, id).1.down <= options.max_down));
    }

    #[test]
    fn slots_run_every_transfer_once_with_the_two_midway_ones_spread_out() {
        for (single, peer) in [(2000, 600), (7, 3), (10, 0), (0, 5), (1, 1)] {
            let options = CampaignOptions {
                transfers: single,
                peer_transfers: peer,
                ..CampaignOptions::quick(PathBuf::from("midway"))
            };
            let ids: Vec<u64> = (0..single + peer).map(|s| slot_id(&options, s)).collect();
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..single + peer).collect::<Vec<_>>());
            // Each kind in its own order.
            assert!(ids.iter().filter(|&&id| id < single).is_sorted());
            assert!(ids.iter().filter(|&&id| id >= single).is_sorted());
            if single > 0 && peer > 0 {
                // The first tenth of the slots holds about a tenth of the two-midway transfers.
                let tenth = (single + peer) / 10;
                let early = ids[..tenth as usize].iter().filter(|&&id| id >= single);
                assert!(early.count() as u64 <= peer / 10 + 1);
            }
        }
        let options = CampaignOptions::quick(PathBuf::from("midway"));
        let total = options.transfers + options.peer_transfers;
        let paths: Vec<Route> = (0..total)
            .map(|s| draw(&options, slot_id(&options, s)).0)
            .collect();
        assert!(!paths.is_empty());
        for path in PATHS.iter().chain(&PEER_PATHS) {
            assert!(paths.contains(path), "{} gets no transfer", path.label());
        }
        assert_eq!(
            paths.iter().filter(|p| PEER_PATHS.contains(p)).count() as u64,
            options.peer_transfers
        );
    }

    /// Draws, fault choices and bytes of the generator the campaign had before it used
    /// rand_xoshiro's splitmix64: a seed still reproduces the runs it made (the README's).
    #[test]
    fn a_seed_draws_what_it_drew_before_the_generator_was_shared() {
        let options = CampaignOptions::quick(PathBuf::from("midway"));
        let seen: Vec<_> = [0u64, 1, 7, 1999]
            .into_iter()
            .map(|id| {
                let (path, plan, behaviour) = draw(&options, id);
                (
                    path,
                    plan.up,
                    plan.down,
                    plan.seed,
                    plan.server_reset_at,
                    behaviour,
                )
            })
            .collect();
        use ClientBehaviour::Normal;
        assert_eq!(
            seen,
            [
                (
                    Route::HttpConnect,
                    7052,
                    94,
                    1502954475416400618,
                    u64::MAX,
                    Normal
                ),
                (
                    Route::Socks5(RelayName::Spool),
                    1538,
                    952312,
                    4120436777273641723,
                    u64::MAX,
                    Normal
                ),
                (
                    Route::Transparent(RelayName::Buffer),
                    246886,
                    492079,
                    11719126032880141418,
                    u64::MAX,
                    Normal
                ),
                (
                    Route::Transparent(RelayName::Spool),
                    1,
                    494236,
                    17478183317243722759,
                    u64::MAX,
                    Normal
                ),
            ]
        );
        let mut faults = Rng::new(17 ^ 0xfa17);
        assert_eq!(
            (faults.below(4), faults.below(1000), faults.next()),
            (3, 487, 13205470262487582704)
        );
        let mut bytes = [0u8; 12];
        ByteStream::new(5).fill(&mut bytes);
        assert_eq!(bytes, [90, 195, 137, 163, 12, 59, 3, 99, 248, 54, 151, 147]);
    }
}
