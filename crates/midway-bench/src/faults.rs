//! The fault campaign (issue 17): many transfers through every intercept mode and both relay
//! models while things go wrong on purpose, each checked end to end, and one number that must
//! be 0: transfers one end saw end cleanly (a FIN) although it had not received everything, or
//! received bytes that differ from those sent.
//!
//! The network is the bench's (client, router with midway, server; plain veths). What goes
//! wrong:
//!
//! - per transfer (drawn from a seeded generator): random sizes up and down, the client or the
//!   server resetting at a random offset, slow readers, readers that stall past midway's idle
//!   timeout;
//! - on the link: random loss of the client's packets (an nftables rule in the router's own
//!   namespace, `numgen random`) and outages (the router's client-side interface down for a
//!   moment);
//! - to the process: SIGHUP reloads, binary upgrades (`--take-over`) and `kill -9` followed by
//!   a restart, at random moments.
//!
//! Each transfer: the client sends a header (sizes, seed, where the server is to reset) and
//! `up` bytes of a stream derived from the seed, then half-closes; the server checks them and
//! sends `down` bytes, then half-closes. Each end records how its reading ended. How the two
//! records combine into an outcome is [`classify`] (pure, unit-tested).

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use midway_config::{ConfigBuilder, ListenerBuilder, ModeName, RelayName};

use crate::netns::{BenchNet, Host, CLIENT_PREFIX, ROUTER_CLIENT_SIDE, SERVER_ADDR};

/// Ports the server listens on: one reached through forward, SOCKS5 and HTTP CONNECT, and one
/// per transparent listener (each intercepts one destination port).
const SERVER_PORT: u16 = 5300;
const TRANSPARENT_SPLICE_PORT: u16 = 5301;
const TRANSPARENT_SPOOL_PORT: u16 = 5302;
/// midway's idle timeout in the campaign: stalled readers outlast it.
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
const HEADER_LEN: usize = 48;
const MAGIC: u32 = 0x4d57_4643; // "MWFC"
/// No transfer may take longer than this (a stalled one included).
const TRANSFER_LIMIT: Duration = Duration::from_secs(60);

/// What to run.
#[derive(Debug, Clone)]
pub struct CampaignOptions {
    /// The midway binary.
    pub midway: PathBuf,
    /// Transfers in all.
    pub transfers: u64,
    /// Transfers running at once.
    pub concurrency: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Largest download of one transfer (bytes); sizes are log-uniform below it.
    pub max_down: u64,
    /// Largest upload.
    pub max_up: u64,
    /// Mean time between process faults (reload, upgrade, kill -9).
    pub process_fault_every: Duration,
    /// Per-mille of the client's packets the router drops.
    pub loss_per_mille: u32,
}

impl CampaignOptions {
    /// The full campaign: 100,000 transfers.
    pub fn full(midway: PathBuf) -> CampaignOptions {
        CampaignOptions {
            midway,
            transfers: 100_000,
            concurrency: 48,
            seed: 17,
            max_down: 4 << 20,
            max_up: 256 << 10,
            process_fault_every: Duration::from_secs(5),
            loss_per_mille: 5,
        }
    }

    /// The quick form for CI: about 2,000 transfers.
    pub fn quick(midway: PathBuf) -> CampaignOptions {
        CampaignOptions {
            transfers: 2_000,
            concurrency: 32,
            max_down: 1 << 20,
            process_fault_every: Duration::from_millis(700),
            ..CampaignOptions::full(midway)
        }
    }
}

/// How one end's part of a transfer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndResult {
    /// Everything expected arrived, intact, then the peer's FIN.
    Complete,
    /// The connection broke (a reset, an error, a timeout) before that.
    Broken,
    /// This end reset the connection on purpose.
    ResetOnPurpose,
    /// A FIN came before everything expected had arrived.
    CleanButShort,
    /// Bytes arrived that were not those sent.
    Corrupted,
    /// The connection never got anywhere (refused, or reset before the header got across).
    NotConnected,
}

/// A transfer's outcome from both ends' results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Both ends complete.
    Intact,
    /// Ended by a reset (on purpose or not), seen as a break, with no end fooled.
    Reset,
    /// Never connected (midway down or refusing): the client knew at once.
    Refused,
    /// An end saw a clean end of a short stream, or wrong bytes: the number that must be 0.
    TruncatedOrCorrupted,
}

/// Combines the client's result with the server's (`None`: the server never saw the transfer's
/// header).
pub fn classify(client: EndResult, server: Option<EndResult>) -> Outcome {
    use EndResult::*;
    let fooled = |r: EndResult| matches!(r, CleanButShort | Corrupted);
    if fooled(client) || server.is_some_and(fooled) {
        return Outcome::TruncatedOrCorrupted;
    }
    match (client, server) {
        (Complete, Some(Complete)) => Outcome::Intact,
        (NotConnected, None) => Outcome::Refused,
        // The client finished although the server never saw it: impossible unless bytes came
        // from somewhere else.
        (Complete, None) => Outcome::TruncatedOrCorrupted,
        _ => Outcome::Reset,
    }
}

/// What the campaign found.
#[derive(Debug, Clone, Default)]
pub struct CampaignReport {
    /// Transfers run.
    pub transfers: u64,
    /// Both ends complete and byte-identical.
    pub intact: u64,
    /// Ended by a reset, seen as a break by the ends that had not finished.
    pub reset: u64,
    /// Refused at connect (midway down, between a kill and its restart).
    pub refused: u64,
    /// Ended cleanly but truncated, or corrupted: must be 0.
    pub truncated_or_corrupted: u64,
    /// Per path (intercept mode and relay): transfers, intact, reset, refused, bad.
    pub per_path: Vec<(String, [u64; 5])>,
    /// SIGHUP reloads sent.
    pub reloads: u64,
    /// Binary upgrades (`--take-over`).
    pub upgrades: u64,
    /// `kill -9` and restart.
    pub kills: u64,
    /// Outages of the client-side link.
    pub outages: u64,
    /// Bytes compared with what was sent, both directions.
    pub bytes_checked: u64,
    /// How long the campaign took.
    pub seconds: f64,
    /// After the last transfer: midway's open descriptors, resident memory, spool files.
    pub fds_after: usize,
    /// Resident memory of midway after the last transfer.
    pub rss_kib_after: u64,
    /// Spool files left in the spool directory after the last transfer.
    pub spool_files_after: usize,
    /// Examples of bad transfers (path, sizes, results), at most 10.
    pub bad_examples: Vec<String>,
}

impl CampaignReport {
    /// A plain-text table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        use std::fmt::Write as _;
        let _ = writeln!(
            out,
            "midway fault campaign: {} transfers in {:.0} s, {:.2} GB checked",
            self.transfers,
            self.seconds,
            self.bytes_checked as f64 / 1e9
        );
        let _ = writeln!(
            out,
            "process faults: {} reloads, {} binary upgrades, {} kill -9 restarts; {} link outages",
            self.reloads, self.upgrades, self.kills, self.outages
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "| path | transfers | intact | ended by a reset | refused at connect | clean but truncated or corrupted |");
        let _ = writeln!(out, "|---|---|---|---|---|---|");
        for (path, [n, intact, reset, refused, bad]) in &self.per_path {
            let _ = writeln!(
                out,
                "| {path} | {n} | {intact} | {reset} | {refused} | {bad} |"
            );
        }
        let _ = writeln!(
            out,
            "| **all** | {} | {} | {} | {} | **{}** |",
            self.transfers, self.intact, self.reset, self.refused, self.truncated_or_corrupted
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "after: midway holds {} descriptors, {} KiB resident, {} spool files",
            self.fds_after, self.rss_kib_after, self.spool_files_after
        );
        for example in &self.bad_examples {
            let _ = writeln!(out, "bad: {example}");
        }
        out
    }
}

/// How a client reaches the server through midway: an intercept mode and a relay model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Forward(RelayName),
    Socks5(RelayName),
    Transparent(RelayName),
    HttpConnect,
}

const PATHS: [Route; 7] = [
    Route::Forward(RelayName::Buffer),
    Route::Forward(RelayName::Spool),
    Route::Socks5(RelayName::Buffer),
    Route::Socks5(RelayName::Spool),
    Route::Transparent(RelayName::Buffer),
    Route::Transparent(RelayName::Spool),
    Route::HttpConnect,
];

fn relay_name(relay: RelayName) -> &'static str {
    match relay {
        RelayName::Buffer => "buffer",
        RelayName::Spool => "spool",
    }
}

impl Route {
    fn label(self) -> String {
        match self {
            Route::Forward(r) => format!("forward, {}", relay_name(r)),
            Route::Socks5(r) => format!("socks5, {}", relay_name(r)),
            Route::Transparent(r) => format!("transparent, {}", relay_name(r)),
            Route::HttpConnect => "http CONNECT".into(),
        }
    }

    /// The port midway listens on for this path (transparent: the server port intercepted).
    fn port(self) -> u16 {
        match self {
            Route::Forward(RelayName::Buffer) => 7101,
            Route::Forward(RelayName::Spool) => 7102,
            Route::Socks5(RelayName::Buffer) => 7103,
            Route::Socks5(RelayName::Spool) => 7104,
            Route::Transparent(RelayName::Buffer) => 7105,
            Route::Transparent(RelayName::Spool) => 7106,
            Route::HttpConnect => 7107,
        }
    }
}

/// midway's config for the campaign: one listener per path.
fn midway_config(client_iface: &str, spool: &Path) -> anyhow::Result<String> {
    let listen = |port: u16| SocketAddr::from((ROUTER_CLIENT_SIDE, port));
    let server = SocketAddr::from((SERVER_ADDR, SERVER_PORT));
    let mut config = ConfigBuilder::new([CLIENT_PREFIX])
        .max_connections(4000, 4000)
        .timeouts(Duration::from_secs(5), IDLE_TIMEOUT, Duration::from_secs(2))
        .spool_dir(spool);
    for path in PATHS {
        let name = path.label().replace([',', ' '], "-");
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
        };
        config = config.listener(listener.build());
    }
    let mut text = config
        .build()
        .to_toml()
        .context("cannot write midway's config")?;
    // CONNECT to a port other than 443 is the campaign's server; the HTTP engine allows what
    // the config allows.
    text.push('\n');
    Ok(text)
}

/// A small deterministic generator (splitmix64): the campaign's choices and the byte streams.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
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
struct ByteStream {
    rng: Rng,
    word: [u8; 8],
    used: usize,
}

impl ByteStream {
    fn new(seed: u64) -> ByteStream {
        ByteStream {
            rng: Rng(seed),
            word: [0; 8],
            used: 8,
        }
    }

    fn fill(&mut self, buf: &mut [u8]) {
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
struct Plan {
    id: u64,
    up: u64,
    down: u64,
    seed: u64,
    /// Offset in the download where the server resets (`u64::MAX`: never).
    server_reset_at: u64,
}

impl Plan {
    fn encode(&self) -> [u8; HEADER_LEN] {
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

    fn decode(header: &[u8; HEADER_LEN]) -> Option<Plan> {
        if header[..4] != MAGIC.to_be_bytes() {
            return None;
        }
        let word = |i: usize| {
            u64::from_be_bytes(header[8 + 8 * i..16 + 8 * i].try_into().expect("8 bytes"))
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
enum ClientBehaviour {
    Normal,
    /// Resets after reading this many bytes of the download.
    ResetAt(u64),
    /// Reads in small pieces with pauses.
    Slow,
    /// Stops reading for longer than midway's idle timeout after this many bytes.
    StallAt(u64),
}

/// Salts of the two directions' streams.
const UP: u64 = 0x5550;
const DOWN: u64 = 0x444f_574e;

/// Reads `expected` bytes of `stream` and checks them against `bytes`, then expects the FIN.
/// The client's `behaviour` applies while it reads (the server reads as `Normal`).
fn read_checked(
    stream: &mut TcpStream,
    expected: u64,
    mut bytes: ByteStream,
    behaviour: ClientBehaviour,
    checked: &AtomicU64,
) -> EndResult {
    let mut got: u64 = 0;
    let mut buf = vec![0u8; 64 << 10];
    let mut want = vec![0u8; 64 << 10];
    let mut stalled = false;
    loop {
        match behaviour {
            ClientBehaviour::ResetAt(at) if got >= at => {
                reset(stream);
                return EndResult::ResetOnPurpose;
            }
            ClientBehaviour::StallAt(at) if got >= at && !stalled => {
                stalled = true;
                std::thread::sleep(IDLE_TIMEOUT * 3 / 2);
            }
            _ => {}
        }
        let piece = if behaviour == ClientBehaviour::Slow {
            4096
        } else {
            buf.len()
        };
        match stream.read(&mut buf[..piece]) {
            Ok(0) if got == expected => return EndResult::Complete,
            Ok(0) => return EndResult::CleanButShort,
            Ok(n) => {
                if got + n as u64 > expected {
                    return EndResult::Corrupted;
                }
                bytes.fill(&mut want[..n]);
                if buf[..n] != want[..n] {
                    return EndResult::Corrupted;
                }
                got += n as u64;
                checked.fetch_add(n as u64, Ordering::Relaxed);
                if behaviour == ClientBehaviour::Slow {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return EndResult::Broken,
        }
    }
}

/// Writes `len` bytes of `bytes`; with `reset_at`, resets there instead of finishing.
fn write_stream(
    stream: &mut TcpStream,
    len: u64,
    mut bytes: ByteStream,
    reset_at: Option<u64>,
) -> Result<(), EndResult> {
    let mut buf = vec![0u8; 64 << 10];
    let mut sent = 0u64;
    while sent < len {
        if reset_at.is_some_and(|at| sent >= at) {
            reset(stream);
            return Err(EndResult::ResetOnPurpose);
        }
        let n = (len - sent).min(buf.len() as u64) as usize;
        bytes.fill(&mut buf[..n]);
        stream.write_all(&buf[..n]).map_err(|_| EndResult::Broken)?;
        sent += n as u64;
    }
    Ok(())
}

/// Makes the connection's close a reset: SO_LINGER 0, then the caller's drop sends the RST.
fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// The server's side of one connection; records its result under the transfer's id.
fn serve_transfer(
    mut stream: TcpStream,
    results: &Mutex<Vec<(u64, EndResult)>>,
    checked: &AtomicU64,
) {
    let _ = stream.set_read_timeout(Some(TRANSFER_LIMIT));
    let _ = stream.set_write_timeout(Some(TRANSFER_LIMIT));
    let mut header = [0u8; HEADER_LEN];
    if stream.read_exact(&mut header).is_err() {
        return;
    }
    let Some(plan) = Plan::decode(&header) else {
        return;
    };
    let record = |result| {
        results
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((plan.id, result))
    };
    let upload = read_checked(
        &mut stream,
        plan.up,
        ByteStream::new(plan.seed ^ UP),
        ClientBehaviour::Normal,
        checked,
    );
    if upload != EndResult::Complete {
        record(upload);
        return;
    }
    let reset_at = (plan.server_reset_at != u64::MAX).then_some(plan.server_reset_at);
    match write_stream(
        &mut stream,
        plan.down,
        ByteStream::new(plan.seed ^ DOWN),
        reset_at,
    ) {
        Ok(()) => {
            let _ = stream.shutdown(Shutdown::Write);
            record(EndResult::Complete);
        }
        Err(result) => record(result),
    }
}

/// Connects to the server through `path`; `None` if midway (or the network) refused.
fn connect(path: Route) -> Option<TcpStream> {
    let router = |port| SocketAddr::from((ROUTER_CLIENT_SIDE, port));
    let target = SocketAddrV4::new(SERVER_ADDR, SERVER_PORT);
    let timeout = Duration::from_secs(10);
    let mut stream = match path {
        Route::Transparent(RelayName::Buffer) => TcpStream::connect_timeout(
            &SocketAddr::from((SERVER_ADDR, TRANSPARENT_SPLICE_PORT)),
            timeout,
        ),
        Route::Transparent(RelayName::Spool) => TcpStream::connect_timeout(
            &SocketAddr::from((SERVER_ADDR, TRANSPARENT_SPOOL_PORT)),
            timeout,
        ),
        _ => TcpStream::connect_timeout(&router(path.port()), timeout),
    }
    .ok()?;
    stream.set_read_timeout(Some(TRANSFER_LIMIT)).ok()?;
    stream.set_write_timeout(Some(TRANSFER_LIMIT)).ok()?;
    match path {
        Route::Socks5(_) => {
            stream.write_all(&[5, 1, 0]).ok()?;
            let mut choice = [0u8; 2];
            stream.read_exact(&mut choice).ok()?;
            let mut request = vec![5, 1, 0, 1];
            request.extend_from_slice(&target.ip().octets());
            request.extend_from_slice(&target.port().to_be_bytes());
            stream.write_all(&request).ok()?;
            let mut reply = [0u8; 10];
            stream.read_exact(&mut reply).ok()?;
            (choice == [5, 0] && reply[1] == 0).then_some(stream)
        }
        Route::HttpConnect => {
            let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
            stream.write_all(request.as_bytes()).ok()?;
            // The response head, byte by byte: the tunnel's bytes follow it at once.
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
                stream.read_exact(&mut byte).ok()?;
                head.push(byte[0]);
            }
            head.starts_with(b"HTTP/1.1 200").then_some(stream)
        }
        _ => Some(stream),
    }
}

/// The client's side of one transfer.
fn client_transfer(
    path: Route,
    plan: Plan,
    behaviour: ClientBehaviour,
    checked: &AtomicU64,
) -> EndResult {
    let Some(mut stream) = connect(path) else {
        return EndResult::NotConnected;
    };
    if stream.write_all(&plan.encode()).is_err() {
        return EndResult::Broken;
    }
    if let Err(result) = write_stream(&mut stream, plan.up, ByteStream::new(plan.seed ^ UP), None) {
        return result;
    }
    if stream.shutdown(Shutdown::Write).is_err() {
        return EndResult::Broken;
    }
    read_checked(
        &mut stream,
        plan.down,
        ByteStream::new(plan.seed ^ DOWN),
        behaviour,
        checked,
    )
}

/// Transfer `id`'s path, plan and client behaviour, from the campaign's seed alone.
fn draw(options: &CampaignOptions, id: u64) -> (Route, Plan, ClientBehaviour) {
    let mut rng = Rng(options.seed ^ id.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let path = PATHS[rng.below(PATHS.len() as u64) as usize];
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

/// The running midway processes, newest last.
struct Midways {
    config: PathBuf,
    logs: PathBuf,
    pids: Vec<u32>,
    started: u32,
}

impl Midways {
    fn current(&self) -> u32 {
        *self.pids.last().expect("midway runs")
    }

    /// Starts midway (taking over from the current one with `take_over`) and waits until its
    /// log says it is ready (and, taking over, that it took over).
    fn start(&mut self, net: &mut BenchNet, midway: &Path, take_over: bool) -> anyhow::Result<()> {
        self.started += 1;
        let log_path = self.logs.join(format!("midway-{}.log", self.started));
        let log = std::fs::File::create(&log_path).context("cannot create a midway log")?;
        let config = self.config.to_string_lossy().into_owned();
        let mut args = vec!["--log-format", "json", "proxy", "--config", config.as_str()];
        if take_over {
            args.push("--take-over");
        }
        let pid = net.spawn(Host::Router, &midway.to_string_lossy(), &args, Some(log))?;
        let wanted = if take_over {
            "took over"
        } else {
            "interception installed"
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            if text.contains(wanted) {
                break;
            }
            if Instant::now() > deadline {
                bail!("midway did not get ready; its log:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.pids.push(pid);
        Ok(())
    }
}

/// Counts of one path's outcomes: transfers, intact, reset, refused, bad.
fn tally(counts: &mut [u64; 5], outcome: Outcome) {
    counts[0] += 1;
    let index = match outcome {
        Outcome::Intact => 1,
        Outcome::Reset => 2,
        Outcome::Refused => 3,
        Outcome::TruncatedOrCorrupted => 4,
    };
    counts[index] += 1;
}

/// The nftables table of the campaign's link faults, in the router's namespace only: random
/// loss of packets on the client-side interface and an outage set.
fn link_faults_table(iface: &str, loss_per_mille: u32) -> String {
    format!(
        "table inet mwfaults {{\n\
         \x20 set outage {{ type ifname; }}\n\
         \x20 chain in {{ type filter hook prerouting priority -350; policy accept;\n\
         \x20   iifname @outage drop\n\
         \x20   iifname \"{iface}\" numgen random mod 1000 < {loss_per_mille} drop\n\
         \x20 }}\n\
         \x20 chain out {{ type filter hook postrouting priority 350; policy accept;\n\
         \x20   oifname @outage drop\n\
         \x20   oifname \"{iface}\" numgen random mod 1000 < {loss_per_mille} drop\n\
         \x20 }}\n\
         }}\n"
    )
}

/// Runs the campaign. Needs root (namespaces).
pub fn run_campaign(options: &CampaignOptions) -> anyhow::Result<CampaignReport> {
    midway_labnet::require_root().context("the fault campaign builds namespaces")?;
    let started = Instant::now();
    let mut net = BenchNet::build()?;
    let client_iface = net.iface(Host::Router, Host::Client).to_string();
    let work = tempfile_dir()?;
    let spool = work.join("spool");
    let config = work.join("midway.toml");
    std::fs::write(&config, midway_config(&client_iface, &spool)?)?;
    let mut nft = net.command(Host::Router, "nft", &["-f", "-"]);
    {
        use std::process::Stdio;
        let mut child = nft
            .stdin(Stdio::piped())
            .spawn()
            .context("cannot run nft")?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(link_faults_table(&client_iface, options.loss_per_mille).as_bytes())?;
        if !child.wait()?.success() {
            bail!("cannot install the link-fault table");
        }
    }

    // The server: one accept loop per port, a thread per connection.
    let server_results: Arc<Mutex<Vec<(u64, EndResult)>>> = Arc::default();
    let checked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut servers = Vec::new();
    for port in [SERVER_PORT, TRANSPARENT_SPLICE_PORT, TRANSPARENT_SPOOL_PORT] {
        let (results, checked, stop) = (server_results.clone(), checked.clone(), stop.clone());
        servers.push(net.in_host(Host::Server, move || {
            let listener = TcpListener::bind((SERVER_ADDR, port))?;
            listener.set_nonblocking(true)?;
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false)?;
                        let (results, checked) = (results.clone(), checked.clone());
                        std::thread::spawn(move || serve_transfer(stream, &results, &checked));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(())
        }));
    }

    let mut midways = Midways {
        config: config.clone(),
        logs: work.clone(),
        pids: Vec::new(),
        started: 0,
    };
    midways.start(&mut net, &options.midway, false)?;

    // The clients.
    let next = Arc::new(AtomicU64::new(0));
    let (results_tx, results_rx) = mpsc::channel();
    let mut clients = Vec::new();
    for _ in 0..options.concurrency {
        let (next, checked, tx, options) = (
            next.clone(),
            checked.clone(),
            results_tx.clone(),
            options.clone(),
        );
        clients.push(net.in_host(Host::Client, move || loop {
            let id = next.fetch_add(1, Ordering::Relaxed);
            if id >= options.transfers {
                return Ok(());
            }
            let (path, plan, behaviour) = draw(&options, id);
            let result = client_transfer(path, plan, behaviour, &checked);
            let _ = tx.send((id, path, plan, behaviour, result));
        }));
    }
    drop(results_tx);

    // Process and link faults until the clients are done.
    let mut rng = Rng(options.seed ^ 0xfa17);
    let (mut reloads, mut upgrades, mut kills, mut outages) = (0u64, 0u64, 0u64, 0u64);
    let mut client_results = Vec::new();
    let mut next_fault = Instant::now() + options.process_fault_every;
    let (first_kind, mut faults_done) = (rng.below(4), 0u64);
    loop {
        match results_rx.recv_timeout(Duration::from_millis(50)) {
            Ok(result) => {
                client_results.push(result);
                let done = client_results.len() as u64;
                if options.transfers >= 10 && done % (options.transfers / 10) == 0 {
                    eprintln!(
                        "midway-faults: {done} of {} transfers after {:.0} s",
                        options.transfers,
                        started.elapsed().as_secs_f64()
                    );
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() < next_fault {
            continue;
        }
        let spread = options.process_fault_every.as_millis() as u64;
        next_fault = Instant::now() + Duration::from_millis(spread / 2 + rng.below(spread + 1));
        // The kinds take turns (from a random first one), so even a short campaign has each.
        faults_done += 1;
        match (first_kind + faults_done) % 4 {
            0 => {
                // A reload that changes a limit, alternately.
                let text = std::fs::read_to_string(&config)?;
                let changed = if text.contains("max_connections = 4000") {
                    text.replace("max_connections = 4000", "max_connections = 3999")
                } else {
                    text.replace("max_connections = 3999", "max_connections = 4000")
                };
                std::fs::write(&config, changed)?;
                signal(midways.current(), nix::sys::signal::Signal::SIGHUP);
                reloads += 1;
            }
            1 => {
                midways.start(&mut net, &options.midway, true)?;
                upgrades += 1;
            }
            2 => {
                let pid = midways.current();
                signal(pid, nix::sys::signal::Signal::SIGKILL);
                net.stop(pid);
                midways.pids.pop();
                // Processes still draining after an upgrade are gone too, like a host crash.
                for pid in std::mem::take(&mut midways.pids) {
                    signal(pid, nix::sys::signal::Signal::SIGKILL);
                    net.stop(pid);
                }
                midways.start(&mut net, &options.midway, false)?;
                kills += 1;
            }
            _ => {
                let set = format!("{{ \"{client_iface}\" }}");
                net.run(
                    Host::Router,
                    "nft",
                    &["add", "element", "inet", "mwfaults", "outage", &set],
                )?;
                std::thread::sleep(Duration::from_millis(100 + rng.below(700)));
                net.run(
                    Host::Router,
                    "nft",
                    &["delete", "element", "inet", "mwfaults", "outage", &set],
                )?;
                outages += 1;
            }
        }
    }
    for client in clients {
        client
            .join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
    }
    // The servers record a broken transfer a moment after the client saw it break.
    std::thread::sleep(Duration::from_secs(3));

    // What midway holds once everything is over, before it stops.
    let pid = midways.current();
    let fds_after = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let rss_kib_after = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0);
    let spool_files_after = std::fs::read_dir(&spool).map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("midway-spool-"))
            .count()
    });
    for pid in std::mem::take(&mut midways.pids) {
        net.stop(pid);
    }
    stop.store(true, Ordering::Relaxed);
    for server in servers {
        server
            .join()
            .map_err(|_| anyhow::anyhow!("a server thread panicked"))??;
    }

    let server_results =
        std::mem::take(&mut *server_results.lock().unwrap_or_else(|p| p.into_inner()));
    let mut by_id = std::collections::HashMap::new();
    for (id, result) in server_results {
        by_id.insert(id, result);
    }
    let mut report = CampaignReport {
        transfers: client_results.len() as u64,
        reloads,
        upgrades,
        kills,
        outages,
        bytes_checked: checked.load(Ordering::Relaxed),
        fds_after,
        rss_kib_after,
        spool_files_after,
        ..CampaignReport::default()
    };
    let mut per_path: Vec<(String, [u64; 5])> = PATHS.iter().map(|p| (p.label(), [0; 5])).collect();
    for (id, path, plan, behaviour, client) in client_results {
        let server = by_id.get(&id).copied();
        let outcome = classify(client, server);
        match outcome {
            Outcome::Intact => report.intact += 1,
            Outcome::Reset => report.reset += 1,
            Outcome::Refused => report.refused += 1,
            Outcome::TruncatedOrCorrupted => {
                report.truncated_or_corrupted += 1;
                if report.bad_examples.len() < 10 {
                    report.bad_examples.push(format!(
                        "#{id} {}: up {} down {} server reset at {:?}, client {behaviour:?}: client {client:?}, server {server:?}",
                        path.label(),
                        plan.up,
                        plan.down,
                        (plan.server_reset_at != u64::MAX).then_some(plan.server_reset_at),
                    ));
                }
            }
        }
        if let Some((_, counts)) = per_path
            .iter_mut()
            .find(|(label, _)| *label == path.label())
        {
            tally(counts, outcome);
        }
    }
    report.per_path = per_path;
    report.seconds = started.elapsed().as_secs_f64();
    drop(net);
    let _ = std::fs::remove_dir_all(&work);
    Ok(report)
}

fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
}

/// A fresh working directory for the campaign's config, spool and logs.
fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("midway-faults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_fooled_end_counts_as_truncated() {
        use EndResult::*;
        assert_eq!(classify(Complete, Some(Complete)), Outcome::Intact);
        assert_eq!(classify(Broken, Some(ResetOnPurpose)), Outcome::Reset);
        assert_eq!(classify(ResetOnPurpose, Some(Complete)), Outcome::Reset);
        assert_eq!(classify(Broken, None), Outcome::Reset);
        assert_eq!(classify(NotConnected, None), Outcome::Refused);
        assert_eq!(
            classify(CleanButShort, Some(Complete)),
            Outcome::TruncatedOrCorrupted
        );
        assert_eq!(
            classify(Complete, Some(CleanButShort)),
            Outcome::TruncatedOrCorrupted
        );
        assert_eq!(
            classify(Corrupted, Some(Broken)),
            Outcome::TruncatedOrCorrupted
        );
        assert_eq!(classify(Complete, None), Outcome::TruncatedOrCorrupted);
    }

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
}
