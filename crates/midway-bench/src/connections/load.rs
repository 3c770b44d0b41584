//! The traffic of `--connections`: an echo server in the server host that holds every
//! connection, and a generator in the client host that opens them with a bounded number in
//! flight, keeps each alive with a one-byte echo, at the end of the hold asks each once more,
//! and then, while the proxy is told to stop, watches how each connection ends at both ends.
//!
//! Each side is one task per connection on a single-threaded tokio runtime of its own, on a
//! thread that entered its host's namespace (sockets belong to the namespace they were made
//! in): 100,000 idle tasks cost little, and the two threads leave the proxy its share of a
//! small machine's cores.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use crate::netns::{BenchNet, Host, InHost};
use crate::workloads::listen_with_backlog;

/// The byte every echo carries.
const PING: u8 = b'k';

/// How a connection's socket ended, seen from one end: a reset, a clean end of stream (a FIN),
/// or another error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Reset,
    Clean,
    Other,
}

impl End {
    fn of_error(error: &std::io::Error) -> End {
        match error.kind() {
            std::io::ErrorKind::ConnectionReset => End::Reset,
            _ => End::Other,
        }
    }
}

/// Ends counted at one side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ends {
    pub(crate) resets: u64,
    pub(crate) clean: u64,
    pub(crate) other: u64,
}

impl Ends {
    fn count(&mut self, end: End) {
        match end {
            End::Reset => self.resets += 1,
            End::Clean => self.clean += 1,
            End::Other => self.other += 1,
        }
    }

    pub(crate) fn total(&self) -> u64 {
        self.resets + self.clean + self.other
    }
}

/// What the echo server saw, shared with its tasks.
#[derive(Default)]
pub(crate) struct EchoTally {
    accepted: AtomicU64,
    ends: std::sync::Mutex<Ends>,
}

impl EchoTally {
    fn count(&self, end: End) {
        self.ends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .count(end);
    }

    /// Connections accepted in all.
    pub(crate) fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// How the connections that ended so far ended.
    pub(crate) fn ends(&self) -> Ends {
        *self
            .ends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The echo server, stopped (and every connection it holds closed) by [`EchoServer::stop`].
pub(crate) struct EchoServer {
    stop: oneshot::Sender<()>,
    thread: InHost<()>,
    tally: Arc<EchoTally>,
}

/// Starts an echo server on every address of `addrs` in the server host; returns once all of
/// them listen.
pub(crate) fn start_echo_server(
    net: &BenchNet,
    addrs: Vec<SocketAddr>,
) -> anyhow::Result<EchoServer> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let tally = Arc::new(EchoTally::default());
    let tasks_tally = tally.clone();
    let thread = net.in_host(Host::Server, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // Dropping the runtime at the end of this closure cancels every echo task and closes
        // its socket.
        runtime.block_on(async move {
            for addr in addrs {
                let listener = TcpListener::from_std(listen_with_backlog(addr)?)?;
                tokio::spawn(accept_and_echo(listener, tasks_tally.clone()));
            }
            let _ = ready_tx.send(());
            let _ = stopped.await;
            Ok(())
        })
    });
    if ready_rx.recv_timeout(Duration::from_secs(5)).is_err() {
        let error = match thread.join() {
            Ok(Err(error)) => error,
            _ => anyhow::anyhow!("did not start within 5 s"),
        };
        return Err(error.context("the echo server"));
    }
    Ok(EchoServer {
        stop,
        thread,
        tally,
    })
}

impl EchoServer {
    /// What it saw so far, live.
    pub(crate) fn tally(&self) -> Arc<EchoTally> {
        self.tally.clone()
    }

    /// Stops it; how many connections it accepted in all.
    pub(crate) fn stop(self) -> anyhow::Result<u64> {
        let _ = self.stop.send(());
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the echo server panicked"))??;
        Ok(self.tally.accepted())
    }
}

async fn accept_and_echo(listener: TcpListener, tally: Arc<EchoTally>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tally.accepted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(echo_until_closed(stream, tally.clone()));
            }
            // Out of descriptors or memory: the connection waits in the accept queue, and the
            // generator counts it if it never gets an answer.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// Echoes until the connection ends, and counts how it ended (the server end of what a
/// stopping proxy does to its connections).
async fn echo_until_closed(mut stream: TcpStream, tally: Arc<EchoTally>) {
    let mut buf = [0u8; 64];
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) => return tally.count(End::Clean),
            Ok(n) => n,
            Err(error) => return tally.count(End::of_error(&error)),
        };
        if let Err(error) = stream.write_all(&buf[..n]).await {
            return tally.count(End::of_error(&error));
        }
    }
}

/// What the generator does.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Where the connections go, taken in turn.
    pub(crate) targets: Vec<SocketAddr>,
    /// Source addresses the connections are bound to, taken in turn.
    pub(crate) sources: Vec<Ipv4Addr>,
    /// Connections to open.
    pub(crate) count: usize,
    /// Connections being opened at once at most (connect and first echo).
    pub(crate) in_flight: usize,
    /// How long one connection may take to connect and answer its first echo.
    pub(crate) open_limit: Duration,
    /// How often each open connection echoes a byte while held.
    pub(crate) keepalive_every: Duration,
    /// How long the connections are held after the last one opened.
    pub(crate) hold: Duration,
    /// How long each connection may take to answer the echo at the end of the hold.
    pub(crate) answer_limit: Duration,
    /// After the final check, how long each connection waits for its end (the proxy stopping).
    pub(crate) end_limit: Duration,
}

/// How the opening went.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Opening {
    /// Connect plus first echo of every connection that opened, sorted.
    pub(crate) latencies: Vec<Duration>,
    /// Connections whose client socket had retransmitted (a SYN, or the first byte) by the time
    /// the first echo came back.
    pub(crate) retransmitted: usize,
    /// Connections that did not open (refused, reset, no answer within the limit).
    pub(crate) failures: usize,
    /// The first failure's reason.
    pub(crate) first_error: Option<String>,
    /// From the first connect to the last connection opened or failed.
    pub(crate) elapsed: Duration,
}

/// How the hold went.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Holding {
    /// Keep-alive echoes answered during the hold.
    pub(crate) keepalive_echoes: u64,
    /// Connections that stopped answering (or were closed) during the hold.
    pub(crate) keepalive_failures: u64,
    /// Connections that answered the echo at the end of the hold.
    pub(crate) answered: u64,
    /// From asking every connection to the last answer (or give-up).
    pub(crate) final_check: Duration,
}

/// How the connections that answered the final check ended at the client while the proxy
/// stopped.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Ending {
    pub(crate) ends: Ends,
    /// Connections that saw no end within the limit.
    pub(crate) no_end: u64,
}

/// Where each connection task is: holding with keep-alives, asked for the final echo, waiting
/// for its end while the proxy stops, or told to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Hold,
    FinalCheck,
    WatchEnd,
    Close,
}

#[derive(Default)]
struct Tally {
    keepalive_echoes: AtomicU64,
    keepalive_failures: AtomicU64,
}

/// What the generator found: the opening, the hold, and the ends while the proxy stopped,
/// with what the two hooks measured.
pub(crate) struct Generated<M, S> {
    pub(crate) opening: Opening,
    pub(crate) at_n: M,
    pub(crate) holding: Holding,
    pub(crate) at_stop: S,
    pub(crate) ending: Ending,
}

/// Runs the generator in the client host: opens `plan.count` connections, runs `at_n` on a
/// thread of its own while all of them are open (the measurements at N), holds them for
/// `plan.hold`, asks each for a last echo, then runs `at_stop` (which stops the proxy) on a
/// thread of its own while each connection that answered waits for its end, and closes them.
pub(crate) fn run_generator<M: Send + 'static, S: Send + 'static>(
    net: &BenchNet,
    plan: Plan,
    at_n: impl FnOnce() -> anyhow::Result<M> + Send + 'static,
    at_stop: impl FnOnce() -> anyhow::Result<S> + Send + 'static,
) -> anyhow::Result<Generated<M, S>> {
    net.in_host(Host::Client, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(generate(plan, at_n, at_stop))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the connection generator panicked"))?
}

async fn generate<M: Send + 'static, S: Send + 'static>(
    plan: Plan,
    at_n: impl FnOnce() -> anyhow::Result<M> + Send + 'static,
    at_stop: impl FnOnce() -> anyhow::Result<S> + Send + 'static,
) -> anyhow::Result<Generated<M, S>> {
    anyhow::ensure!(
        !plan.targets.is_empty() && !plan.sources.is_empty(),
        "the generator needs targets and sources"
    );
    let plan = Arc::new(plan);
    let tally = Arc::new(Tally::default());
    let permits = Arc::new(Semaphore::new(plan.in_flight.max(1)));
    let (phase_tx, phase_rx) = watch::channel(Phase::Hold);
    let (opened_tx, mut opened_rx) = mpsc::unbounded_channel();
    let (answer_tx, mut answer_rx) = mpsc::unbounded_channel();
    let (end_tx, mut end_rx) = mpsc::unbounded_channel();
    let started = Instant::now();
    for index in 0..plan.count {
        tokio::spawn(connection(
            index,
            plan.clone(),
            permits.clone(),
            phase_rx.clone(),
            Reports {
                opened: opened_tx.clone(),
                answers: answer_tx.clone(),
                ends: end_tx.clone(),
            },
            tally.clone(),
        ));
    }
    drop((opened_tx, answer_tx, end_tx, phase_rx));

    let mut opening = Opening::default();
    while let Some(outcome) = opened_rx.recv().await {
        match outcome {
            Ok((latency, retransmitted)) => {
                opening.latencies.push(latency);
                opening.retransmitted += usize::from(retransmitted);
            }
            Err(error) => {
                opening.failures += 1;
                opening.first_error.get_or_insert(error);
            }
        }
    }
    opening.elapsed = started.elapsed();
    opening.latencies.sort_unstable();

    let at_n = tokio::task::spawn_blocking(at_n)
        .await
        .context("the measurement at N panicked")?;
    tokio::time::sleep(plan.hold).await;

    let asked = Instant::now();
    let _ = phase_tx.send(Phase::FinalCheck);
    let mut holding = Holding::default();
    // Every task still open sends one answer and drops its sender; the others dropped it when
    // they ended. The limit is a backstop for a task that neither answers nor ends.
    let _ = tokio::time::timeout(plan.answer_limit + Duration::from_secs(5), async {
        while let Some(answered) = answer_rx.recv().await {
            holding.answered += u64::from(answered);
        }
    })
    .await;
    holding.final_check = asked.elapsed();
    holding.keepalive_echoes = tally.keepalive_echoes.load(Ordering::Relaxed);
    holding.keepalive_failures = tally.keepalive_failures.load(Ordering::Relaxed);

    // Each connection that answered now waits for its end; the proxy is told to stop.
    let _ = phase_tx.send(Phase::WatchEnd);
    let at_stop = tokio::task::spawn_blocking(at_stop);
    let mut ending = Ending::default();
    let _ = tokio::time::timeout(plan.end_limit + Duration::from_secs(5), async {
        while let Some(end) = end_rx.recv().await {
            match end {
                Some(end) => ending.ends.count(end),
                None => ending.no_end += 1,
            }
        }
    })
    .await;
    let at_stop = at_stop.await.context("the stop's measurement panicked")?;
    let _ = phase_tx.send(Phase::Close);
    Ok(Generated {
        opening,
        at_n: at_n?,
        holding,
        at_stop: at_stop?,
        ending,
    })
}

/// Where a connection task reports each step.
struct Reports {
    opened: mpsc::UnboundedSender<Result<(Duration, bool), String>>,
    answers: mpsc::UnboundedSender<bool>,
    /// How the connection ended while the proxy stopped; `None`: no end within the limit.
    ends: mpsc::UnboundedSender<Option<End>>,
}

/// One connection's life: open it (within the in-flight bound), report how long that took,
/// echo a byte every `keepalive_every` (the first at a point spread over the period, so the
/// echoes of connections opened together do not come together), answer the final check,
/// wait for its end while the proxy stops, close when told.
async fn connection(
    index: usize,
    plan: Arc<Plan>,
    permits: Arc<Semaphore>,
    mut phase: watch::Receiver<Phase>,
    reports: Reports,
    tally: Arc<Tally>,
) {
    let Reports {
        opened,
        answers,
        ends,
    } = reports;
    let source = plan.sources[index % plan.sources.len()];
    let target = plan.targets[(index / plan.sources.len()) % plan.targets.len()];
    let Ok(permit) = permits.acquire().await else {
        return;
    };
    let started = Instant::now();
    let outcome = match tokio::time::timeout(plan.open_limit, open(source, target)).await {
        Ok(Ok(opened)) => Ok(opened),
        Ok(Err(error)) => Err(format!("{source} to {target}: {error}")),
        Err(_) => Err(format!(
            "{source} to {target}: no connection and echo within {:?}",
            plan.open_limit
        )),
    };
    drop(permit);
    let mut stream = match outcome {
        Ok((stream, retransmitted)) => {
            let _ = opened.send(Ok((started.elapsed(), retransmitted)));
            stream
        }
        Err(error) => {
            let _ = opened.send(Err(error));
            return;
        }
    };
    drop(opened);

    let spread = plan
        .keepalive_every
        .mul_f64((index as f64 * GOLDEN_FRACTION).fract());
    let mut next = tokio::time::Instant::now() + spread;
    loop {
        // The watch's guard is not Send: dropped inside the select, before any await.
        let hold_over = tokio::select! {
            _ = tokio::time::sleep_until(next) => false,
            _ = phase.wait_for(|p| *p != Phase::Hold) => true,
        };
        if hold_over {
            break;
        }
        if echo(&mut stream, plan.open_limit).await.is_err() {
            tally.keepalive_failures.fetch_add(1, Ordering::Relaxed);
            return;
        }
        tally.keepalive_echoes.fetch_add(1, Ordering::Relaxed);
        next += plan.keepalive_every;
    }
    let answered = echo(&mut stream, plan.answer_limit).await.is_ok();
    let _ = answers.send(answered);
    drop(answers);
    if !answered {
        return;
    }
    if phase.wait_for(|p| *p != Phase::FinalCheck).await.is_err() {
        return;
    }
    let mut byte = [0u8; 1];
    let end = match tokio::time::timeout(plan.end_limit, stream.read(&mut byte)).await {
        Err(_) => None,
        Ok(Ok(0)) => Some(End::Clean),
        // A byte nobody asked for is not how a connection should end either.
        Ok(Ok(_)) => Some(End::Other),
        Ok(Err(error)) => Some(End::of_error(&error)),
    };
    let _ = ends.send(end);
    drop(ends);
    let _ = phase.wait_for(|p| *p == Phase::Close).await;
}

/// The fractional part of the golden ratio: index × it, modulo 1, spreads consecutive indexes
/// evenly over [0, 1) whatever their count.
const GOLDEN_FRACTION: f64 = 0.618_033_988_749_895;

/// Connects from `source` (any port) to `target` and echoes one byte; the stream, and whether
/// the client socket retransmitted anything on the way.
async fn open(source: Ipv4Addr, target: SocketAddr) -> std::io::Result<(TcpStream, bool)> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((source, 0)))?;
    let mut stream = socket.connect(target).await?;
    stream.set_nodelay(true)?;
    echo_once(&mut stream).await?;
    let retransmitted = midway_sys::tcp_info::tcp_stats(stream.as_fd())
        .map(|stats| stats.total_retrans > 0)
        .unwrap_or(false);
    Ok((stream, retransmitted))
}

/// One echo within `limit`.
async fn echo(stream: &mut TcpStream, limit: Duration) -> std::io::Result<()> {
    tokio::time::timeout(limit, echo_once(stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no echo in time"))?
}

async fn echo_once(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(&[PING]).await?;
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).await?;
    if answer[0] != PING {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the echo came back different",
        ));
    }
    Ok(())
}
