//! The benchmark's own traffic: readiness probes, a connect/close loop, idle connections, and the
//! parsing of iperf3's JSON.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use midway_sys::procfs::machine_tcp_memory_bytes;

use crate::netns::{BenchNet, Host, InHost};

/// Connect from the client host until `addr` accepts, or fail after `limit`.
pub(crate) fn wait_until_accepting(
    net: &BenchNet,
    addr: SocketAddr,
    limit: Duration,
) -> anyhow::Result<()> {
    net.in_host(Host::Client, move || {
        let deadline = Instant::now() + limit;
        loop {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                Ok(_) => return Ok(()),
                Err(error) if Instant::now() >= deadline => {
                    bail!("{addr} still not accepting after {limit:?}: {error}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    })
    .join()
    .map_err(|_| anyhow::anyhow!("readiness probe panicked"))?
}

/// A non-blocking listener with a deep accept queue: std's default backlog of 128 overflows when
/// thousands of connections arrive at once, and the dropped handshakes would be counted against
/// the proxy.
pub(crate) fn listen_with_backlog(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// A server that writes one byte to every connection and closes it: the far end of the
/// connection-rate test.
pub(crate) struct CloseServer {
    stop: Arc<AtomicBool>,
    thread: InHost<()>,
}

pub(crate) fn start_close_server(net: &BenchNet, addr: SocketAddr) -> anyhow::Result<CloseServer> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread = net.in_host(Host::Server, move || {
        let listener = listen_with_backlog(addr)?;
        let _ = ready_tx.send(());
        while !flag.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    stream.set_nonblocking(false)?;
                    let _ = stream.write_all(b"x");
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        Ok(())
    });
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .context("close server did not start")?;
    Ok(CloseServer { stop, thread })
}

impl CloseServer {
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// What one connection-rate run did: connections completed and failed, in `seconds`.
pub(crate) struct RateRun {
    pub(crate) completed: u64,
    pub(crate) failed: u64,
    pub(crate) seconds: f64,
}

/// Connections from the client host to `addr` for `duration`: several threads each connect, read
/// the server's byte until EOF, and close.
pub(crate) fn connection_rate(
    net: &BenchNet,
    addr: SocketAddr,
    duration: Duration,
) -> anyhow::Result<RateRun> {
    const THREADS: usize = 8;
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (done, failed) = (done.clone(), failed.clone());
            net.in_host(Host::Client, move || {
                let deadline = Instant::now() + duration;
                let mut buf = [0u8; 16];
                while Instant::now() < deadline {
                    let ok = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).and_then(
                        |mut s| {
                            s.set_read_timeout(Some(Duration::from_secs(2)))?;
                            let mut total = 0;
                            loop {
                                match s.read(&mut buf)? {
                                    0 => break,
                                    n => total += n,
                                }
                            }
                            Ok(total)
                        },
                    );
                    match ok {
                        Ok(1) => done.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker
            .join()
            .map_err(|_| anyhow::anyhow!("connection-rate worker panicked"))??;
    }
    Ok(RateRun {
        completed: done.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Samples the machine's TCP memory in the background and keeps the peak.
pub(crate) struct TcpMemorySampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl TcpMemorySampler {
    pub(crate) fn start(every: Duration) -> TcpMemorySampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                if let Ok(bytes) = machine_tcp_memory_bytes() {
                    peak = peak.max(bytes);
                }
                std::thread::sleep(every);
            }
            peak
        });
        TcpMemorySampler { stop, thread }
    }

    /// Peak machine TCP memory seen, in bytes.
    pub(crate) fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// Total received bits per second and bytes from `iperf3 -J` output.
pub(crate) fn parse_iperf_json(stdout: &[u8]) -> anyhow::Result<(f64, u64)> {
    let value: serde_json::Value =
        serde_json::from_slice(stdout).context("iperf3 printed no JSON")?;
    if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
        bail!("iperf3: {error}");
    }
    let received = value
        .pointer("/end/sum_received")
        .context("iperf3 JSON has no end.sum_received")?;
    let bps = received
        .get("bits_per_second")
        .and_then(|v| v.as_f64())
        .context("no bits_per_second")?;
    let bytes = received
        .get("bytes")
        .and_then(|v| v.as_u64())
        .context("no bytes")?;
    Ok((bps, bytes))
}

/// Idle split connections held open until dropped.
pub(crate) struct IdleConnections {
    release: Arc<AtomicBool>,
    threads: Vec<InHost<usize>>,
}

impl Drop for IdleConnections {
    fn drop(&mut self) {
        self.release.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Opens `count` connections from the client host to `connect_to`, which leads (directly or through
/// the proxy) to `server_addr`, and returns once the server holds all of them.
pub(crate) fn hold_idle_connections(
    net: &BenchNet,
    server_addr: SocketAddr,
    connect_to: SocketAddr,
    count: usize,
    limit: Duration,
) -> anyhow::Result<IdleConnections> {
    let release = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = {
        let (release, accepted) = (release.clone(), accepted.clone());
        net.in_host(Host::Server, move || {
            let listener = listen_with_backlog(server_addr)?;
            let _ = ready_tx.send(());
            let mut held = Vec::with_capacity(count);
            while !release.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        held.push(stream);
                        accepted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
            Ok(held.len())
        })
    };
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .context("idle server did not start")?;
    let client = {
        let release = release.clone();
        net.in_host(Host::Client, move || {
            let mut held = Vec::with_capacity(count);
            for _ in 0..count {
                if release.load(Ordering::Relaxed) {
                    break;
                }
                held.push(TcpStream::connect_timeout(
                    &connect_to,
                    Duration::from_secs(5),
                )?);
            }
            while !release.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(held.len())
        })
    };
    let holder = IdleConnections {
        release,
        threads: vec![server, client],
    };
    let deadline = Instant::now() + limit;
    while (accepted.load(Ordering::Relaxed) as usize) < count {
        if Instant::now() > deadline {
            bail!(
                "only {} of {count} idle connections reached the server in {limit:?}",
                accepted.load(Ordering::Relaxed)
            );
        }
        if holder.threads[1].is_finished() {
            bail!("the idle client stopped early (connect failed?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(holder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_iperf_sum_received() {
        let json = br#"{"end":{"sum_received":{"bits_per_second":9.5e9,"bytes":11875000000}}}"#;
        assert_eq!(parse_iperf_json(json).unwrap(), (9.5e9, 11_875_000_000));
    }

    #[test]
    fn reports_iperf_error() {
        let json = br#"{"error":"unable to connect to server"}"#;
        let error = parse_iperf_json(json).unwrap_err().to_string();
        assert!(error.contains("unable to connect"), "{error}");
    }
}
