//! The flows of the ECMP run: a server that answers each connection with a short burst or a
//! paced stream and remembers from which address each flow id connected, and clients that bind
//! one of several client addresses and read to the end, recording how each flow ended.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use midway_labnet::Topology;
use socket2::{Domain, Socket, Type};

/// The server's port (the port the gateways intercept).
pub(crate) const PORT: u16 = 5001;
/// A short flow: this many bytes at once.
pub(crate) const SHORT_BYTES: u64 = 200_000;
/// A long flow: `LONG_CHUNKS` chunks of `LONG_CHUNK` bytes, one every `LONG_INTERVAL` (6 s).
const LONG_CHUNK: usize = 8192;
const LONG_CHUNKS: u64 = 120;
const LONG_INTERVAL: Duration = Duration::from_millis(50);
pub(crate) const LONG_BYTES: u64 = LONG_CHUNK as u64 * LONG_CHUNKS;
/// A flow that receives nothing for this long has stalled.
const READ_TIMEOUT: Duration = Duration::from_secs(4);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(4);
/// The server's own bound on a write (a flow whose client is gone).
const SERVER_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the server's accept loop checks whether it should stop.
const ACCEPT_POLL: Duration = Duration::from_millis(5);

/// What a flow asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    Short,
    Long,
}

impl Shape {
    pub(crate) fn bytes(self) -> u64 {
        match self {
            Shape::Short => SHORT_BYTES,
            Shape::Long => LONG_BYTES,
        }
    }
}

/// How a flow ended, seen by its client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Complete,
    /// Reset by a peer (or by a gateway that did not know the flow).
    Reset,
    /// Ended with a FIN before all its bytes.
    Short,
    /// Nothing arrived for `READ_TIMEOUT`.
    Stalled,
    /// The connection could not be opened.
    NotConnected(String),
    Other(String),
}

impl Outcome {
    pub(crate) fn label(&self) -> String {
        match self {
            Outcome::Complete => "complete".into(),
            Outcome::Reset => "reset".into(),
            Outcome::Short => "ended short".into(),
            Outcome::Stalled => "stalled".into(),
            Outcome::NotConnected(e) => format!("not connected ({e})"),
            Outcome::Other(e) => format!("failed ({e})"),
        }
    }
}

/// One flow as its client saw it.
#[derive(Clone, Debug)]
pub(crate) struct FlowResult {
    pub id: u32,
    pub client: SocketAddrV4,
    pub outcome: Outcome,
    pub bytes: u64,
}

/// The server: the address each flow id connected from.
pub(crate) struct Server {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<BTreeMap<u32, IpAddr>>>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// Listens on [`PORT`] in `host`.
    pub(crate) fn start(topology: &Topology, host: &str) -> anyhow::Result<Server> {
        let listener = topology
            .in_host(host, || TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT)))
            .context("the server cannot listen")?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let (stop2, seen2) = (stop.clone(), seen.clone());
        let accept = std::thread::spawn(move || {
            let mut handlers = Vec::new();
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, peer)) => {
                        let seen = seen2.clone();
                        handlers.push(std::thread::spawn(move || serve(stream, peer, &seen)));
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(ACCEPT_POLL)
                    }
                    Err(_) => std::thread::sleep(ACCEPT_POLL),
                }
                handlers.retain(|h: &JoinHandle<()>| !h.is_finished());
            }
            // Each handler ends within its timeouts.
            handlers.into_iter().for_each(|h| drop(h.join()));
        });
        Ok(Server {
            stop,
            seen,
            accept: Some(accept),
        })
    }

    /// The peer address each flow id connected from, so far.
    pub(crate) fn seen(&self) -> BTreeMap<u32, IpAddr> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accept) = self.accept.take() {
            drop(accept.join());
        }
    }
}

/// One server connection: 8 bytes of request (shape, id), then the answer.
fn serve(mut stream: TcpStream, peer: SocketAddr, seen: &Mutex<BTreeMap<u32, IpAddr>>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let _ = stream.set_write_timeout(Some(SERVER_WRITE_TIMEOUT));
    let mut request = [0u8; 8];
    if stream.read_exact(&mut request).is_err() {
        return;
    }
    let id = u32::from_be_bytes([request[4], request[5], request[6], request[7]]);
    if let Ok(mut seen) = seen.lock() {
        seen.insert(id, peer.ip());
    }
    let chunk = vec![0x5au8; LONG_CHUNK];
    if request[0] == 0 {
        let mut left = SHORT_BYTES as usize;
        while left > 0 {
            let n = left.min(chunk.len());
            if stream.write_all(&chunk[..n]).is_err() {
                return;
            }
            left -= n;
        }
    } else {
        let start = Instant::now();
        for i in 0..LONG_CHUNKS {
            let due = start + LONG_INTERVAL * i as u32;
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if stream.write_all(&chunk).is_err() {
                return;
            }
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
    // Wait for the client's FIN, so the close is orderly.
    let _ = stream.read(&mut request);
}

/// Starts one flow from `client` (bound in `host`) to `server`, on its own thread.
pub(crate) fn start_flow(
    topology: &Topology,
    host: &str,
    client: Ipv4Addr,
    server: Ipv4Addr,
    id: u32,
    shape: Shape,
) -> anyhow::Result<JoinHandle<FlowResult>> {
    let socket = topology
        .in_host(host, move || -> io::Result<Socket> {
            let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
            socket.bind(&SocketAddr::from((client, 0)).into())?;
            Ok(socket)
        })
        .context("cannot make a client socket")?;
    let local = socket
        .local_addr()?
        .as_socket_ipv4()
        .context("client socket without an IPv4 address")?;
    Ok(std::thread::spawn(move || {
        let (outcome, bytes) = run_flow(socket, server, id, shape);
        FlowResult {
            id,
            client: local,
            outcome,
            bytes,
        }
    }))
}

fn run_flow(socket: Socket, server: Ipv4Addr, id: u32, shape: Shape) -> (Outcome, u64) {
    let target = SocketAddr::from((server, PORT));
    if let Err(e) = socket.connect_timeout(&target.into(), CONNECT_TIMEOUT) {
        return (Outcome::NotConnected(e.kind().to_string()), 0);
    }
    let mut stream: TcpStream = socket.into();
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let mut request = [0u8; 8];
    request[0] = u8::from(shape == Shape::Long);
    request[4..].copy_from_slice(&id.to_be_bytes());
    if let Err(e) = stream.write_all(&request) {
        return (classify(&e), 0);
    }
    let mut buffer = vec![0u8; 65536];
    let mut bytes = 0u64;
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => bytes += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return (classify(&e), bytes),
        }
    }
    let outcome = if bytes == shape.bytes() {
        Outcome::Complete
    } else {
        Outcome::Short
    };
    (outcome, bytes)
}

fn classify(error: &io::Error) -> Outcome {
    match error.kind() {
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => Outcome::Reset,
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Outcome::Stalled,
        kind => Outcome::Other(kind.to_string()),
    }
}

/// Joins flows; a flow thread that panicked is recorded as failed.
pub(crate) fn join(handles: Vec<(u32, JoinHandle<FlowResult>)>) -> Vec<FlowResult> {
    handles
        .into_iter()
        .map(|(id, handle)| {
            handle.join().unwrap_or(FlowResult {
                id,
                client: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
                outcome: Outcome::Other("client thread panicked".into()),
                bytes: 0,
            })
        })
        .collect()
}
