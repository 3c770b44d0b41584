//! The transfers: the server's accept loops and its side of each transfer, the clients and
//! theirs, each end checking every byte it reads against the stream the plan's seed makes.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use midway_config::RelayName;

use super::plan::{
    draw, slot_id, ByteStream, ClientBehaviour, Plan, Route, HEADER_LEN, TRANSPARENT_SPLICE_PORT,
    TRANSPARENT_SPOOL_PORT,
};
use super::tally::{ClientRecord, EndResult};
use super::{CampaignOptions, IDLE_TIMEOUT, SERVER_PORT, TRANSFER_LIMIT};
use crate::netns::{BenchNet, Host, InHost, ROUTER_CLIENT_SIDE, SERVER_ADDR};

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
            .unwrap_or_else(PoisonError::into_inner)
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

/// Connects to the server through `path`; `None` if midway (or the network) refused. A
/// two-midway path starts at the edge's forward listener, like a forward path: the edge and
/// the gateway find the server.
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

/// The client's side of one transfer: how it ended, and the client's port (to find the
/// transfer in midway's logs) if it connected.
fn client_transfer(
    path: Route,
    plan: Plan,
    behaviour: ClientBehaviour,
    checked: &AtomicU64,
) -> (EndResult, Option<u16>) {
    let Some(mut stream) = connect(path) else {
        return (EndResult::NotConnected, None);
    };
    let port = stream.local_addr().ok().map(|a| a.port());
    (client_steps(&mut stream, plan, behaviour, checked), port)
}

/// The client's steps once connected: the header, the upload, the half-close, the download.
fn client_steps(
    stream: &mut TcpStream,
    plan: Plan,
    behaviour: ClientBehaviour,
    checked: &AtomicU64,
) -> EndResult {
    if stream.write_all(&plan.encode()).is_err() {
        return EndResult::Broken;
    }
    if let Err(result) = write_stream(stream, plan.up, ByteStream::new(plan.seed ^ UP), None) {
        return result;
    }
    if stream.shutdown(Shutdown::Write).is_err() {
        return EndResult::Broken;
    }
    read_checked(
        stream,
        plan.down,
        ByteStream::new(plan.seed ^ DOWN),
        behaviour,
        checked,
    )
}

/// The campaign's server: one accept loop per port in the server host, a thread per connection,
/// each recording its result by transfer id.
pub(super) struct Servers {
    results: Arc<Mutex<Vec<(u64, EndResult)>>>,
    stop: Arc<AtomicBool>,
    loops: Vec<InHost<()>>,
}

impl Servers {
    /// Starts the accept loops; `checked` counts the bytes they compared.
    pub(super) fn start(net: &BenchNet, checked: &Arc<AtomicU64>) -> Servers {
        let results: Arc<Mutex<Vec<(u64, EndResult)>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let mut loops = Vec::new();
        for port in [SERVER_PORT, TRANSPARENT_SPLICE_PORT, TRANSPARENT_SPOOL_PORT] {
            let (results, checked, stop) = (results.clone(), checked.clone(), stop.clone());
            loops.push(net.in_host(Host::Server, move || {
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
        Servers {
            results,
            stop,
            loops,
        }
    }

    /// Stops the accept loops and returns what the server recorded (transfer id, result).
    pub(super) fn stop(self) -> anyhow::Result<Vec<(u64, EndResult)>> {
        self.stop.store(true, Ordering::Relaxed);
        for accept_loop in self.loops {
            accept_loop
                .join()
                .map_err(|_| anyhow::anyhow!("a server thread panicked"))??;
        }
        let mut results = self.results.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(std::mem::take(&mut *results))
    }
}

/// Starts `options.concurrency` client threads in the client host, which take transfers in
/// turn ([`slot_id`]) until all are done and send each finished transfer to the returned
/// receiver (closed when the last thread ends).
pub(super) fn start_clients(
    net: &BenchNet,
    options: &CampaignOptions,
    checked: &Arc<AtomicU64>,
) -> (Vec<InHost<()>>, mpsc::Receiver<ClientRecord>) {
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
            let slot = next.fetch_add(1, Ordering::Relaxed);
            if slot >= options.total_transfers() {
                return Ok(());
            }
            let id = slot_id(&options, slot);
            let (path, plan, behaviour) = draw(&options, id);
            let start = Instant::now();
            let (result, port) = client_transfer(path, plan, behaviour, &checked);
            let _ = tx.send(ClientRecord {
                id,
                path,
                plan,
                behaviour,
                result,
                port,
                took: start.elapsed(),
            });
        }));
    }
    (clients, results_rx)
}
