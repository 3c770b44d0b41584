//! The async side of the relay: one future per direction, polled in the caller's task, plus
//! the idle watchdog and cancellation around them.
//!
//! This file is the connection: validating the model, running both directions with the idle
//! watchdog and cancellation, carrying a FIN or an abort across, and the report. The rest is split
//! by what a direction does: `forward.rs` is the buffer-and-forward loop of one direction, over a
//! carrier (`carrier.rs`: a spliced pipe or a copy buffer); `spool_direction.rs` is the
//! server-to-client direction in spool mode, over a spool file (`spool_file.rs`); `fair.rs` is the
//! turn-taking every busy loop shares. Each file holds one mechanism, so a reader of one need not
//! hold the others in mind.

mod carrier;
mod fair;
mod forward;
mod spool_direction;
mod spool_file;

use std::io;
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use socket2::SockRef;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::error::{RelayError, Side};
use crate::resources::RelayResources;
pub(crate) use crate::traffic::Direction;
use crate::traffic::{take_socket_error, Traffic};
use crate::window::Gate;
use crate::{DirectionEnd, RelayModel, RelayOptions, RelayReport};
use forward::forward;
use spool_direction::{spool_server_to_client, SpoolShared};

/// Smallest accepted buffer: below a page, syscalls per byte explode for no benefit.
const MIN_BUFFER_BYTES: usize = 4096;
/// `remote_finished_ns` until the server's FIN is read (0 ns after the start is a real time).
const NOT_YET: u64 = u64::MAX;

/// Why a direction stopped early.
#[derive(Debug)]
struct PumpError {
    side: Side,
    operation: &'static str,
    /// Bytes had been read from one side and were not delivered.
    data_lost: bool,
    source: io::Error,
}

impl PumpError {
    fn new(side: Side, operation: &'static str, data_lost: bool, source: io::Error) -> Self {
        PumpError {
            side,
            operation,
            data_lost,
            source,
        }
    }

    /// A reset (or the broken pipe that follows one) is a normal way for a connection to end
    /// and is carried across rather than reported as an error.
    fn is_reset(&self) -> bool {
        self.side != Side::SpoolDisk && is_reset(&self.source)
    }
}

/// State shared by the directions of one connection. Atomics (not Cells) because the relay
/// future must be `Send`.
struct Ctx<'a> {
    /// Bytes, live counters and the activity clock (shared with the stream relay).
    traffic: Traffic<'a>,
    remote_finished_ns: AtomicU64,
    /// Directions that have read their source's EOF and are done.
    directions_finished: AtomicU8,
    /// The last direction to finish left its FIN to the client socket's close.
    last_fin_to_client: AtomicBool,
    resources: &'a Arc<RelayResources>,
    /// The window the server-to-client direction's writes share with other connections.
    to_client: Gate<'a>,
}

impl<'a> std::ops::Deref for Ctx<'a> {
    type Target = Traffic<'a>;

    fn deref(&self) -> &Traffic<'a> {
        &self.traffic
    }
}

pub(crate) fn validate(model: &RelayModel) -> Result<(), RelayError> {
    let buffer = match model {
        RelayModel::Buffer(config) => config.buffer_bytes,
        RelayModel::Spool(config) => {
            if config.memory_bytes < MIN_BUFFER_BYTES {
                return Err(RelayError::InvalidConfig(
                    "spool memory_bytes must be at least 4096",
                ));
            }
            config.buffer_bytes
        }
    };
    if buffer < MIN_BUFFER_BYTES {
        return Err(RelayError::InvalidConfig(
            "relay buffer_bytes must be at least 4096",
        ));
    }
    Ok(())
}

/// Writes `prefix` (client bytes the caller read before the relay started) to the server, held
/// and counted like the client-to-server direction's own bytes.
async fn deliver_prefix(server: &TcpStream, prefix: &[u8], ctx: &Ctx<'_>) -> Result<(), PumpError> {
    let mut sent = 0;
    while sent < prefix.len() {
        ctx.held(Direction::ClientToServer, prefix.len() - sent);
        server
            .writable()
            .await
            .map_err(|e| PumpError::new(Side::Server, "waiting to write", true, e))?;
        match server.try_write(&prefix[sent..]) {
            Ok(n) => {
                sent += n;
                ctx.touch();
                ctx.delivered(Direction::ClientToServer, n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(PumpError::new(Side::Server, "writing", true, e)),
        }
    }
    ctx.held(Direction::ClientToServer, 0);
    Ok(())
}

fn is_reset(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ECONNRESET | libc::EPIPE | libc::ECONNABORTED | libc::ENOTCONN)
    )
}

/// A parked connection whose socket on `side` failed (a reset, taken by the parked wait's
/// check): nothing is held, and the reset is carried to the other end as a running relay
/// carries one (both sockets close with SO_LINGER {on, 0}, still armed).
pub(crate) fn failed_while_parked(
    client: TcpStream,
    server: TcpStream,
    options: &RelayOptions,
    moved: (u64, u64),
    side: Side,
    error: io::Error,
) -> Result<RelayReport, RelayError> {
    if let Some(on_close) = &options.on_close {
        on_close.closing(client.as_fd(), server.as_fd());
    }
    drop(client);
    drop(server);
    if !is_reset(&error) {
        return Err(RelayError::Io {
            side,
            operation: "waiting to read",
            data_lost: false,
            source: error,
        });
    }
    Ok(RelayReport {
        client_to_server_bytes: moved.0,
        server_to_client_bytes: moved.1,
        client_to_server_end: DirectionEnd::ResetByPeer,
        server_to_client_end: DirectionEnd::ResetByPeer,
        peak_spool_bytes: 0,
        remote_finished_at: None,
    })
}

/// How the select loop in [`run`] stopped.
enum Stop {
    BothDone,
    Cancelled,
    Idle,
    /// Quiet for `park_after` with nothing held and both directions open.
    Park,
    Failed(Direction, PumpError),
}

/// How one [`run`] ended: the connection is over, or it is parked (see `crate::park`).
pub(crate) enum Run {
    Ended(RelayReport),
    Parked(Parked),
}

/// A parked connection: its sockets (SO_LINGER still armed for a reset if the process dies)
/// and what the run that parked it moved.
pub(crate) struct Parked {
    pub(crate) client: TcpStream,
    pub(crate) server: TcpStream,
    pub(crate) client_to_server_bytes: u64,
    pub(crate) server_to_client_bytes: u64,
    /// How long no byte had moved when it parked.
    pub(crate) idle_for: Duration,
}

pub(crate) async fn run(
    client: TcpStream,
    server: TcpStream,
    model: &RelayModel,
    resources: &Arc<RelayResources>,
    options: RelayOptions,
    cancel: CancellationToken,
) -> Result<Run, RelayError> {
    // Validated, and SO_LINGER {on, 0} armed on both sockets, by the caller (`crate::relay`).
    let ctx = Ctx {
        traffic: Traffic::new(&options.counters),
        remote_finished_ns: AtomicU64::new(NOT_YET),
        directions_finished: AtomicU8::new(0),
        last_fin_to_client: AtomicBool::new(false),
        resources,
        to_client: Gate(options.client_window.as_deref()),
    };
    let spool = match model {
        RelayModel::Spool(config) => Some(SpoolShared::new(
            config.memory_bytes,
            config.max_spool_bytes,
            resources,
        )),
        RelayModel::Buffer(_) => None,
    };
    let mut c2s_end: Option<DirectionEnd> = None;
    let mut s2c_end: Option<DirectionEnd> = None;

    let stop = {
        let (buffer_bytes, use_splice) = match model {
            RelayModel::Buffer(config) => (config.buffer_bytes, config.splice),
            RelayModel::Spool(config) => (config.buffer_bytes, true),
        };
        let c2s = async {
            deliver_prefix(&server, &options.client_prefix, &ctx).await?;
            forward(
                &client,
                &server,
                Direction::ClientToServer,
                buffer_bytes,
                use_splice,
                &ctx,
            )
            .await
        };
        let s2c = async {
            match &spool {
                Some(spool) => spool_server_to_client(&server, &client, spool, &ctx).await,
                None => {
                    forward(
                        &server,
                        &client,
                        Direction::ServerToClient,
                        buffer_bytes,
                        use_splice,
                        &ctx,
                    )
                    .await
                }
            }
        };
        let idle = ctx.idle_expired(options.idle_timeout);
        let park = async {
            let Some(after) = options.park_after else {
                return std::future::pending().await;
            };
            loop {
                ctx.idle_expired(Some(after)).await;
                if options.counters.held_now() == 0 {
                    return;
                }
                // Quiet but holding bytes (a destination that stopped reading): look again later.
                tokio::time::sleep(after).await;
            }
        };
        tokio::pin!(c2s, s2c, idle, park);
        loop {
            tokio::select! {
                result = &mut c2s, if c2s_end.is_none() => match result {
                    Ok(()) => c2s_end = Some(DirectionEnd::Fin),
                    Err(e) => break Stop::Failed(Direction::ClientToServer, e),
                },
                result = &mut s2c, if s2c_end.is_none() => match result {
                    Ok(()) => s2c_end = Some(DirectionEnd::Fin),
                    Err(e) => break Stop::Failed(Direction::ServerToClient, e),
                },
                // Once a side has sent its FIN, its direction is no longer read, so nothing
                // else would notice that side resetting while the other side stays silent: the
                // connection (and its descriptors) would wait for the idle timeout and the
                // silent side would never be told.
                result = client.ready(Interest::ERROR), if c2s_end.is_some() && s2c_end.is_none() => {
                    if let Err(e) = watch_error(result, &client, Side::Client) {
                        break Stop::Failed(Direction::ServerToClient, e);
                    }
                }
                result = server.ready(Interest::ERROR), if s2c_end.is_some() && c2s_end.is_none() => {
                    if let Err(e) = watch_error(result, &server, Side::Server) {
                        break Stop::Failed(Direction::ClientToServer, e);
                    }
                }
                () = cancel.cancelled() => break Stop::Cancelled,
                () = &mut idle => break Stop::Idle,
                () = &mut park, if c2s_end.is_none() && s2c_end.is_none() => break Stop::Park,
            }
            if c2s_end.is_some() && s2c_end.is_some() {
                break Stop::BothDone;
            }
        }
    };
    if matches!(stop, Stop::Park) {
        // The direction futures are gone, each waiting for its source with nothing held.
        return Ok(Run::Parked(Parked {
            client_to_server_bytes: ctx.client_to_server.load(Ordering::Relaxed),
            server_to_client_bytes: ctx.server_to_client.load(Ordering::Relaxed),
            idle_for: ctx.idle_for(),
            client,
            server,
        }));
    }
    // The direction futures are gone: leased pipes still holding bytes were closed, buffers freed.
    options
        .counters
        .held_client_to_server
        .store(0, Ordering::Relaxed);
    options
        .counters
        .held_server_to_client
        .store(0, Ordering::Relaxed);
    options.counters.spooled_now.store(0, Ordering::Relaxed);

    let unfinished = match &stop {
        Stop::BothDone | Stop::Park => DirectionEnd::Fin,
        Stop::Cancelled => DirectionEnd::Cancelled,
        Stop::Idle => DirectionEnd::IdleTimeout,
        Stop::Failed(_, e) if e.is_reset() => DirectionEnd::ResetByPeer,
        Stop::Failed(..) => DirectionEnd::Error,
    };
    // Closing with SO_LINGER {on, 0} (armed at the start) sends a RST instead of a FIN, so each
    // end learns the connection broke rather than ended, and never takes a truncated stream
    // for a whole one. A clean end disarms it: the close then sends the last FIN after the
    // bytes still queued.
    if !ends_with_reset(&stop) {
        for stream in [&client, &server] {
            let _ = SockRef::from(stream).set_linger(None);
        }
    }
    if let Stop::Failed(direction, e) = &stop {
        let failed_end = if e.is_reset() {
            DirectionEnd::ResetByPeer
        } else {
            DirectionEnd::Error
        };
        match direction {
            Direction::ClientToServer => c2s_end = Some(failed_end),
            Direction::ServerToClient => s2c_end = Some(failed_end),
        }
    }
    if let Some(on_close) = &options.on_close {
        on_close.closing(client.as_fd(), server.as_fd());
    }
    // After a clean end one of these closes also sends the last direction's FIN
    // (`finish_direction`). Close the other socket first, so that by the time the peer sees
    // that FIN both descriptors are gone.
    if ctx.last_fin_to_client.load(Ordering::Acquire) {
        drop(server);
        drop(client);
    } else {
        drop(client);
        drop(server);
    }

    let remote_ns = ctx.remote_finished_ns.load(Ordering::Relaxed);
    let report = RelayReport {
        client_to_server_bytes: ctx.client_to_server.load(Ordering::Relaxed),
        server_to_client_bytes: ctx.server_to_client.load(Ordering::Relaxed),
        client_to_server_end: c2s_end.unwrap_or(unfinished),
        server_to_client_end: s2c_end.unwrap_or(unfinished),
        peak_spool_bytes: spool.as_ref().map_or(0, SpoolShared::peak),
        remote_finished_at: (remote_ns != NOT_YET).then(|| Duration::from_nanos(remote_ns)),
    };
    match stop {
        Stop::Failed(_, e) if !e.is_reset() => {
            tracing::debug!(?report, "relay aborted by an I/O error");
            Err(RelayError::Io {
                side: e.side,
                operation: e.operation,
                data_lost: e.data_lost,
                source: e.source,
            })
        }
        _ => Ok(Run::Ended(report)),
    }
}

/// The close rule (RFC 3135 §4: a PEP that acknowledged bytes owes their delivery): a
/// connection the relay ends before both directions have carried their source's FIN ends with
/// a reset toward both ends; only a connection whose two directions ended cleanly closes with
/// FINs.
///
/// - A failed direction (reset carried across, I/O error) always resets.
/// - A cancellation (shutdown after the grace period) always resets: a direction still open
///   has not seen its source's end, so a FIN would pass a truncated stream off as complete.
/// - An idle timeout always resets, for the same reason. Nothing held in the relay or in a
///   socket's queues does not make a FIN safe: an end may have sent bytes that never reached
///   midway (a dark link, retransmissions backing off past the timeout), and a FIN would end
///   the other end's stream short of them. The fault campaign caught exactly that (a client's
///   upload lost to a link outage longer than the idle timeout; both ends took a clean end).
///   The stream relay resets on an idle timeout too: one rule for both.
fn ends_with_reset(stop: &Stop) -> bool {
    match stop {
        Stop::BothDone | Stop::Park => false,
        Stop::Failed(..) | Stop::Cancelled | Stop::Idle => true,
    }
}

/// One wake-up of the error watch on a side whose direction has finished reading.
fn watch_error(
    readiness: io::Result<tokio::io::Ready>,
    stream: &TcpStream,
    side: Side,
) -> Result<(), PumpError> {
    readiness.map_err(|e| PumpError::new(side, "waiting for an error", false, e))?;
    check_socket_error(stream, side)
}

/// Carries the FIN across once a direction has delivered everything up to its source's EOF.
///
/// The first direction to finish sends it with `shutdown(SHUT_WR)` (half-close: the other
/// direction keeps flowing). The last one leaves it to the `close` that follows at once in
/// [`run`]: both sockets have then read their peer's FIN and hold nothing unread, so `close`
/// sends exactly that FIN, and the peer sees the end only after the relay has let go of both
/// sockets (it can count on the descriptors being free, and one syscall is saved).
fn finish_direction(dst: &TcpStream, dst_side: Side, ctx: &Ctx<'_>) -> Result<(), PumpError> {
    let finished_before = ctx.directions_finished.fetch_add(1, Ordering::AcqRel);
    if finished_before >= 1 {
        ctx.last_fin_to_client
            .store(dst_side == Side::Client, Ordering::Release);
        return Ok(());
    }
    SockRef::from(dst)
        .shutdown(Shutdown::Write)
        .map_err(|e| PumpError::new(dst_side, "sending FIN", false, e))
}

/// Returns the pending socket error (SO_ERROR, e.g. ECONNRESET after a RST) as a pump error;
/// without one, clears the ERROR readiness so the caller does not wake again for nothing.
fn check_socket_error(stream: &TcpStream, side: Side) -> Result<(), PumpError> {
    take_socket_error(stream).map_err(|e| PumpError::new(side, "reading", true, e))
}
