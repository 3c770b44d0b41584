//! Workloads at the socket level, independent of namespaces: the runner calls these on threads
//! that live in a host's namespace, and the unit tests call them on loopback.
//!
//! Bulk: the server sends a [`BulkAmount`] (a number of bytes, or for a duration as `iperf -t`
//! does) as soon as a client connects (no request, as in the papers' FTP-like transfers), then
//! waits for the client to close; the client times from the start of `connect()` to the last
//! byte. Both read `tcp_info.tcpi_total_retrans` of their socket at the end.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::scenario::BulkAmount;

/// Size of the chunks the server writes and the client reads.
const CHUNK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub(crate) enum WorkloadError {
    #[error("cannot set up the {side} socket ({what})")]
    Setup {
        side: &'static str,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("cannot connect to {target}")]
    Connect {
        target: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("no client connected to the server within {0:?}")]
    AcceptTimeout(Duration),
    #[error("{side} transfer failed after {bytes} bytes")]
    Transfer {
        side: &'static str,
        bytes: u64,
        #[source]
        source: io::Error,
    },
    #[error("the connection closed after {got} of {expected} bytes")]
    Short { got: u64, expected: u64 },
    #[error("the connection closed before its first byte")]
    Empty,
}

fn setup(side: &'static str, what: &'static str) -> impl Fn(io::Error) -> WorkloadError {
    move |source| WorkloadError::Setup { side, what, source }
}

/// Socket options of one end of a bulk transfer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SocketOptions {
    pub send_buffer: Option<u64>,
    pub recv_buffer: Option<u64>,
    pub congestion_control: Option<String>,
}

fn apply(
    socket: &Socket,
    options: &SocketOptions,
    side: &'static str,
) -> Result<(), WorkloadError> {
    if let Some(size) = options.send_buffer {
        socket
            .set_send_buffer_size(usize::try_from(size).unwrap_or(usize::MAX))
            .map_err(setup(side, "SO_SNDBUF"))?;
    }
    if let Some(size) = options.recv_buffer {
        socket
            .set_recv_buffer_size(usize::try_from(size).unwrap_or(usize::MAX))
            .map_err(setup(side, "SO_RCVBUF"))?;
    }
    if let Some(cc) = &options.congestion_control {
        socket
            .set_tcp_congestion(cc.as_bytes())
            .map_err(setup(side, "TCP_CONGESTION"))?;
    }
    Ok(())
}

/// `tcpi_total_retrans` of a TCP socket.
pub(crate) fn total_retransmits(socket: &impl AsFd) -> io::Result<u64> {
    midway_sys::tcp_info::tcp_stats(socket.as_fd()).map(|stats| u64::from(stats.total_retrans))
}

/// A listening bulk server. Bind it first (the client may start once `bind` returned), then
/// call [`BulkServer::serve_one`].
pub(crate) struct BulkServer {
    listener: TcpListener,
}

impl BulkServer {
    /// Listens on `addr` (port 0 picks one) with the given options; accepted sockets inherit
    /// buffer sizes and congestion control from the listener.
    pub(crate) fn bind(addr: SocketAddr, options: &SocketOptions) -> Result<Self, WorkloadError> {
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
            .map_err(setup("server", "socket"))?;
        socket
            .set_reuse_address(true)
            .map_err(setup("server", "SO_REUSEADDR"))?;
        apply(&socket, options, "server")?;
        socket
            .bind(&SockAddr::from(addr))
            .map_err(setup("server", "bind"))?;
        // Room for every parallel client of `serve_many` at once (a refused SYN costs 1 s).
        socket.listen(128).map_err(setup("server", "listen"))?;
        Ok(Self {
            listener: socket.into(),
        })
    }

    /// The address the server listens on (only the unit tests ask, to learn their port).
    #[cfg(test)]
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts one client within `timeout`, sends `bytes`, closes its sending side, waits for the
    /// client to close (so every retransmission is counted), and returns the socket's total
    /// retransmissions and when its peer had acknowledged every byte.
    pub(crate) fn serve_one(
        &self,
        amount: BulkAmount,
        timeout: Duration,
    ) -> Result<ServerOutcome, WorkloadError> {
        let deadline = Instant::now() + timeout;
        let stream = self.accept(timeout)?;
        send_and_drain(stream, amount, deadline)
    }

    /// Accepts one client within `timeout`.
    fn accept(&self, timeout: Duration) -> Result<TcpStream, WorkloadError> {
        // SO_RCVTIMEO bounds accept() on Linux.
        let socket = socket2::SockRef::from(&self.listener);
        socket
            .set_read_timeout(Some(timeout))
            .map_err(setup("server", "SO_RCVTIMEO"))?;
        let (stream, _) = self.listener.accept().map_err(|e| {
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                WorkloadError::AcceptTimeout(timeout)
            } else {
                WorkloadError::Setup {
                    side: "server",
                    what: "accept",
                    source: e,
                }
            }
        })?;
        Ok(stream)
    }
}

/// Sends `amount` on an accepted stream, closes its sending side, waits for the client to close
/// (so every retransmission is counted), and returns the socket's total retransmissions and when
/// its peer had acknowledged every byte.
fn send_and_drain(
    mut stream: TcpStream,
    amount: BulkAmount,
    deadline: Instant,
) -> Result<ServerOutcome, WorkloadError> {
    let started = Instant::now();
    let remaining = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream
        .set_write_timeout(Some(remaining))
        .map_err(setup("server", "SO_SNDTIMEO"))?;
    stream
        .set_read_timeout(Some(remaining))
        .map_err(setup("server", "SO_RCVTIMEO"))?;
    let chunk = vec![0x5a_u8; CHUNK];
    let mut sent = 0u64;
    loop {
        let len = match amount {
            BulkAmount::Bytes(bytes) if sent < bytes => (bytes - sent).min(CHUNK as u64) as usize,
            // A duration is checked between writes: a blocked write lasts at most until the
            // receiver frees a chunk's room, which is short against the seconds measured.
            BulkAmount::For(duration) if started.elapsed() < duration => CHUNK,
            BulkAmount::Bytes(_) | BulkAmount::For(_) => break,
        };
        stream
            .write_all(&chunk[..len])
            .map_err(|source| WorkloadError::Transfer {
                side: "server",
                bytes: sent,
                source,
            })?;
        sent += len as u64;
    }
    stream
        .shutdown(std::net::Shutdown::Write)
        .map_err(|source| WorkloadError::Transfer {
            side: "server",
            bytes: sent,
            source,
        })?;
    let all_acked = wait_all_acked(&stream, deadline);
    // The client closes once it has everything; its FIN ends this read.
    let mut sink = [0u8; 1024];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // A reset after all data was sent (a proxy closing hard) still ends the run.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break,
            Err(source) => {
                return Err(WorkloadError::Transfer {
                    side: "server",
                    bytes: sent,
                    source,
                })
            }
        }
    }
    let retransmits = total_retransmits(&stream).map_err(setup("server", "TCP_INFO"))?;
    Ok(ServerOutcome {
        retransmits,
        all_acked,
    })
}

impl BulkServer {
    /// Serves `connections` clients at once (`workload.connections`): accepts each within what
    /// is left of `timeout` and sends it `bytes` on its own thread while the next is accepted.
    /// Retransmissions are summed; `all_acked` is the last connection's (`None` if any could
    /// not be observed). One connection is exactly [`BulkServer::serve_one`].
    pub(crate) fn serve_many(
        &self,
        connections: u32,
        amount: BulkAmount,
        timeout: Duration,
    ) -> Result<ServerOutcome, WorkloadError> {
        if connections <= 1 {
            return self.serve_one(amount, timeout);
        }
        let deadline = Instant::now() + timeout;
        std::thread::scope(|scope| {
            let mut senders = Vec::new();
            for _ in 0..connections {
                let remaining = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1));
                let stream = self.accept(remaining)?;
                senders.push(scope.spawn(move || send_and_drain(stream, amount, deadline)));
            }
            let mut total = ServerOutcome {
                retransmits: 0,
                all_acked: None,
            };
            let mut all_observed = true;
            for sender in senders {
                let outcome = sender.join().unwrap_or_else(|_| {
                    Err(WorkloadError::Transfer {
                        side: "server",
                        bytes: 0,
                        source: io::Error::other("a sending thread panicked"),
                    })
                })?;
                total.retransmits += outcome.retransmits;
                match outcome.all_acked {
                    Some(at) => total.all_acked = Some(total.all_acked.map_or(at, |t| t.max(at))),
                    None => all_observed = false,
                }
            }
            if !all_observed {
                total.all_acked = None;
            }
            Ok(total)
        })
    }
}

/// What the bulk server saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ServerOutcome {
    pub retransmits: u64,
    /// When the peer (the client, or the proxy's remote segment) had acknowledged every byte:
    /// the end of the remote segment's transfer. `None` if it could not be observed in time.
    pub all_acked: Option<Instant>,
}

/// Waits until the socket's send queue (unsent + unacknowledged bytes, `SIOCOUTQ`) is empty and
/// returns that instant. Polls every millisecond: the kernel offers no event for "all acked",
/// and a millisecond is small against the transfers measured (tens of ms and more).
fn wait_all_acked(stream: &TcpStream, deadline: Instant) -> Option<Instant> {
    loop {
        let queued = midway_sys::sockopt::queued_bytes(stream.as_fd()).ok()?;
        let now = Instant::now();
        if queued.unacked_out == 0 {
            return Some(now);
        }
        if now >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What the bulk client measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct BulkOutcome {
    pub bytes: u64,
    /// From the start of `connect()` to the last byte.
    pub seconds: f64,
    /// Seconds from the start of `connect()` until it completed.
    pub connect_seconds: f64,
    pub retransmits: u64,
    /// When `connect()` started: the common origin of the client's and the server's times.
    pub started: Instant,
}

/// Connects to `target`, reads what the server sends (`amount`: all its bytes, or until the
/// server closes after its duration), and times it.
pub(crate) fn bulk_client(
    target: SocketAddr,
    amount: BulkAmount,
    options: &SocketOptions,
    timeout: Duration,
) -> Result<BulkOutcome, WorkloadError> {
    let expected = match amount {
        BulkAmount::Bytes(bytes) => Some(bytes),
        BulkAmount::For(_) => None,
    };
    let socket = Socket::new(
        Domain::for_address(target),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map_err(setup("client", "socket"))?;
    apply(&socket, options, "client")?;
    let start = Instant::now();
    socket
        .connect_timeout(&SockAddr::from(target), timeout)
        .map_err(|source| WorkloadError::Connect { target, source })?;
    let connect_seconds = start.elapsed().as_secs_f64();
    let mut stream: TcpStream = socket.into();
    let remaining = timeout
        .saturating_sub(start.elapsed())
        .max(Duration::from_millis(1));
    stream
        .set_read_timeout(Some(remaining))
        .map_err(setup("client", "SO_RCVTIMEO"))?;
    let mut buffer = vec![0u8; CHUNK];
    let mut got = 0u64;
    let mut last_byte = start;
    while expected.is_none_or(|bytes| got < bytes) {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                got += n as u64;
                last_byte = Instant::now();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(WorkloadError::Transfer {
                    side: "client",
                    bytes: got,
                    source,
                })
            }
        }
    }
    if let Some(bytes) = expected.filter(|&bytes| got < bytes) {
        return Err(WorkloadError::Short {
            got,
            expected: bytes,
        });
    }
    if got == 0 {
        return Err(WorkloadError::Empty);
    }
    let retransmits = total_retransmits(&stream).map_err(setup("client", "TCP_INFO"))?;
    Ok(BulkOutcome {
        bytes: got,
        seconds: (last_byte - start).as_secs_f64(),
        connect_seconds,
        retransmits,
        started: start,
    })
}

/// Opens `connections` connections to `target` at once (each on its own thread, in the
/// caller's network namespace), each reading `amount`. The outcome covers them all: bytes and
/// retransmissions summed, `started` the earliest `connect()`, `seconds` until the last byte of
/// the last connection, `connect_seconds` the slowest handshake. The first error wins. One
/// connection is exactly [`bulk_client`].
pub(crate) fn bulk_clients(
    target: SocketAddr,
    connections: u32,
    amount: BulkAmount,
    options: &SocketOptions,
    timeout: Duration,
) -> Result<BulkOutcome, WorkloadError> {
    if connections <= 1 {
        return bulk_client(target, amount, options, timeout);
    }
    let outcomes: Vec<Result<BulkOutcome, WorkloadError>> = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..connections)
            .map(|_| scope.spawn(|| bulk_client(target, amount, options, timeout)))
            .collect();
        readers
            .into_iter()
            .map(|reader| {
                reader.join().unwrap_or_else(|_| {
                    Err(WorkloadError::Transfer {
                        side: "client",
                        bytes: 0,
                        source: io::Error::other("a receiving thread panicked"),
                    })
                })
            })
            .collect()
    });
    let outcomes = outcomes.into_iter().collect::<Result<Vec<_>, _>>()?;
    combine_outcomes(&outcomes).ok_or(WorkloadError::Empty)
}

/// One outcome for parallel connections (see [`bulk_clients`]); `None` for none.
pub(crate) fn combine_outcomes(outcomes: &[BulkOutcome]) -> Option<BulkOutcome> {
    let started = outcomes.iter().map(|o| o.started).min()?;
    let last_byte = outcomes
        .iter()
        .map(|o| o.started + Duration::from_secs_f64(o.seconds))
        .max()?;
    Some(BulkOutcome {
        bytes: outcomes.iter().map(|o| o.bytes).sum(),
        seconds: (last_byte - started).as_secs_f64(),
        connect_seconds: outcomes
            .iter()
            .map(|o| o.connect_seconds)
            .fold(0.0, f64::max),
        retransmits: outcomes.iter().map(|o| o.retransmits).sum(),
        started,
    })
}

/// Replaces `{name}` placeholders in a command's arguments.
pub(crate) fn expand_argv(argv: &[String], values: &BTreeMap<&str, String>) -> Vec<String> {
    argv.iter()
        .map(|arg| {
            let mut out = arg.clone();
            for (name, value) in values {
                out = out.replace(&format!("{{{name}}}"), value);
            }
            out
        })
        .collect()
}

/// Lines `MIDWAY_METRIC <name> <number>` of a command's stdout.
pub(crate) fn parse_metric_lines(stdout: &str) -> BTreeMap<String, f64> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            if words.next()? != "MIDWAY_METRIC" {
                return None;
            }
            let name = words.next()?;
            let value: f64 = words.next()?.parse().ok()?;
            value.is_finite().then(|| (name.to_string(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_transfer_on_loopback_moves_exactly_the_bytes() {
        let server = BulkServer::bind(
            "127.0.0.1:0".parse().unwrap(),
            &SocketOptions {
                send_buffer: Some(64 * 1024),
                ..SocketOptions::default()
            },
        )
        .unwrap();
        let target = server.local_addr().unwrap();
        let timeout = Duration::from_secs(30);
        let handle =
            std::thread::spawn(move || server.serve_one(BulkAmount::Bytes(1_000_003), timeout));
        let outcome = bulk_client(
            target,
            BulkAmount::Bytes(1_000_003),
            &SocketOptions {
                recv_buffer: Some(32 * 1024),
                ..SocketOptions::default()
            },
            timeout,
        )
        .unwrap();
        assert_eq!(outcome.bytes, 1_000_003);
        assert!(outcome.seconds >= outcome.connect_seconds);
        handle.join().unwrap().unwrap();
    }

    #[test]
    fn a_timed_transfer_runs_for_its_duration_and_ends_with_the_servers_close() {
        let server =
            BulkServer::bind("127.0.0.1:0".parse().unwrap(), &SocketOptions::default()).unwrap();
        let target = server.local_addr().unwrap();
        let duration = Duration::from_millis(300);
        let timeout = Duration::from_secs(30);
        let handle =
            std::thread::spawn(move || server.serve_one(BulkAmount::For(duration), timeout));
        let outcome = bulk_client(
            target,
            BulkAmount::For(duration),
            &SocketOptions::default(),
            timeout,
        )
        .unwrap();
        assert!(outcome.bytes > 0);
        assert!(
            outcome.seconds >= 0.25 && outcome.seconds < 5.0,
            "{}",
            outcome.seconds
        );
        handle.join().unwrap().unwrap();
    }

    #[test]
    fn parallel_connections_each_move_the_bytes_and_are_summed() {
        let server =
            BulkServer::bind("127.0.0.1:0".parse().unwrap(), &SocketOptions::default()).unwrap();
        let target = server.local_addr().unwrap();
        let timeout = Duration::from_secs(30);
        let handle =
            std::thread::spawn(move || server.serve_many(3, BulkAmount::Bytes(200_001), timeout));
        let outcome = bulk_clients(
            target,
            3,
            BulkAmount::Bytes(200_001),
            &SocketOptions::default(),
            timeout,
        )
        .unwrap();
        assert_eq!(outcome.bytes, 3 * 200_001);
        assert!(outcome.seconds >= outcome.connect_seconds);
        let served = handle.join().unwrap().unwrap();
        assert!(served.all_acked.is_some());
    }

    #[test]
    fn a_missing_parallel_client_makes_the_server_time_out() {
        let server =
            BulkServer::bind("127.0.0.1:0".parse().unwrap(), &SocketOptions::default()).unwrap();
        let target = server.local_addr().unwrap();
        let handle = std::thread::spawn(move || {
            server.serve_many(2, BulkAmount::Bytes(1000), Duration::from_millis(500))
        });
        // Only one of the two expected clients comes.
        bulk_client(
            target,
            BulkAmount::Bytes(1000),
            &SocketOptions::default(),
            Duration::from_secs(10),
        )
        .unwrap();
        let error = handle.join().unwrap().unwrap_err();
        assert!(matches!(error, WorkloadError::AcceptTimeout(_)), "{error}");
    }

    #[test]
    fn combined_outcome_spans_first_connect_to_last_byte() {
        let t0 = Instant::now();
        let outcome = |start_ms: u64, seconds: f64, retransmits: u64| BulkOutcome {
            bytes: 100,
            seconds,
            connect_seconds: seconds / 10.0,
            retransmits,
            started: t0 + Duration::from_millis(start_ms),
        };
        let combined =
            combine_outcomes(&[outcome(10, 1.0, 2), outcome(0, 0.5, 1), outcome(5, 2.0, 0)])
                .unwrap();
        assert_eq!(combined.bytes, 300);
        assert_eq!(combined.retransmits, 3);
        assert_eq!(combined.started, t0);
        // The last byte came at 5 ms + 2 s.
        assert!(
            (combined.seconds - 2.005).abs() < 1e-6,
            "{}",
            combined.seconds
        );
        assert!((combined.connect_seconds - 0.2).abs() < 1e-9);
        assert_eq!(combine_outcomes(&[]), None);
    }

    #[test]
    fn a_short_transfer_is_an_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = listener.local_addr().unwrap();
        let handle = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.write_all(&[1u8; 100]).unwrap();
        });
        let error = bulk_client(
            target,
            BulkAmount::Bytes(1000),
            &SocketOptions::default(),
            Duration::from_secs(10),
        )
        .unwrap_err();
        assert!(
            matches!(
                error,
                WorkloadError::Short {
                    got: 100,
                    expected: 1000
                }
            ),
            "{error}"
        );
        handle.join().unwrap();
    }

    #[test]
    fn an_unknown_congestion_control_is_refused() {
        let error = BulkServer::bind(
            "127.0.0.1:0".parse().unwrap(),
            &SocketOptions {
                congestion_control: Some("no-such-cc".into()),
                ..SocketOptions::default()
            },
        )
        .err()
        .unwrap();
        assert!(error.to_string().contains("TCP_CONGESTION"), "{error}");
    }

    #[test]
    fn accept_times_out_when_nobody_connects() {
        let server =
            BulkServer::bind("127.0.0.1:0".parse().unwrap(), &SocketOptions::default()).unwrap();
        let error = server
            .serve_one(BulkAmount::Bytes(10), Duration::from_millis(50))
            .unwrap_err();
        assert!(matches!(error, WorkloadError::AcceptTimeout(_)), "{error}");
    }

    #[test]
    fn placeholders_and_metric_lines() {
        let values = BTreeMap::from([("target", "10.0.1.2".to_string()), ("port", "5201".into())]);
        let argv = expand_argv(
            &[
                "iperf3".into(),
                "-c".into(),
                "{target}".into(),
                "-p{port}".into(),
            ],
            &values,
        );
        assert_eq!(argv, ["iperf3", "-c", "10.0.1.2", "-p5201"]);
        let metrics =
            parse_metric_lines("hello\nMIDWAY_METRIC page_load_s 1.5\nMIDWAY_METRIC bad x\n");
        assert_eq!(metrics, BTreeMap::from([("page_load_s".to_string(), 1.5)]));
    }
}
