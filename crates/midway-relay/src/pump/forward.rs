//! Buffer-and-forward for one direction (either way in buffer mode, client-to-server in spool
//! mode): read into a carrier, write out of it, hold at most the configured bytes, give the
//! carrier back while idle, and carry the source's EOF as a FIN.

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::carrier::{try_drain, try_fill, Carrier, CopyBuffer, Fill};
use super::fair::FairTurn;
use super::{check_socket_error, finish_direction, Ctx, Direction, PumpError};
use crate::error::Side;
use crate::window::Gate;

fn side_of(direction: Direction) -> (Side, Side) {
    match direction {
        Direction::ClientToServer => (Side::Client, Side::Server),
        Direction::ServerToClient => (Side::Server, Side::Client),
    }
}

/// Buffer-and-forward for one direction: holds at most `capacity` bytes, carries EOF as a FIN.
pub(super) async fn forward(
    src: &TcpStream,
    dst: &TcpStream,
    direction: Direction,
    capacity: usize,
    use_splice: bool,
    ctx: &Ctx<'_>,
) -> Result<(), PumpError> {
    let (src_side, dst_side) = side_of(direction);
    let mut carrier: Option<Carrier<'_>> = None;
    let mut eof = false;
    // The last read found the source empty (EAGAIN). Until then a drained carrier is kept and
    // the next read tried at once: a busy direction keeps its pipe (or buffer) instead of
    // handing it back and taking it again for every chunk, and waits for readiness only when
    // the kernel said there is nothing to read.
    let mut source_empty = true;
    let mut turn = FairTurn::default();
    let gate = match direction {
        Direction::ServerToClient => ctx.to_client,
        Direction::ClientToServer => Gate(None),
    };
    loop {
        let held = carrier.as_ref().map_or(0, Carrier::held);
        ctx.held(direction, held);
        if held == 0 && eof {
            drop(carrier.take());
            return finish_direction(dst, dst_side, ctx);
        }
        if held == 0 && (source_empty || carrier.is_none()) {
            // Drained and nothing to read: give the pipe back / free the buffer before
            // waiting, so an idle direction holds nothing.
            drop(carrier.take());
            src.readable()
                .await
                .map_err(|e| PumpError::new(src_side, "waiting to read", false, e))?;
            let lease = if use_splice {
                ctx.resources.take_pipe(capacity)
            } else {
                None
            };
            carrier = Some(match lease {
                Some(lease) => Carrier::Pipe(lease),
                None => Carrier::Copy(CopyBuffer::new(capacity, ctx.resources)),
            });
        }
        let Some(active) = carrier.as_mut() else {
            continue;
        };
        // Fill.
        let carrier_capacity = active.capacity(capacity);
        let mut read_blocked = eof || active.held() >= carrier_capacity;
        if !read_blocked {
            match try_fill(src, active, capacity) {
                Ok(Fill::Read(n)) => {
                    source_empty = false;
                    if n > 0 {
                        ctx.touch();
                    }
                }
                Ok(Fill::Eof) => eof = true,
                Ok(Fill::Blocked) => {
                    source_empty = true;
                    read_blocked = true;
                }
                Err(e) => return Err(PumpError::new(src_side, "reading", active.held() > 0, e)),
            }
        }
        // Drain, toward the client only as far as a shared window grants.
        let mut write_blocked = true;
        let mut window_closed = false;
        if active.held() > 0 {
            let granted = gate.grant(active.held());
            window_closed = granted == 0;
            if !window_closed {
                let drained = try_drain(dst, active, granted);
                gate.settle(
                    granted,
                    match drained {
                        Ok(Some(n)) => n,
                        _ => 0,
                    },
                );
                match drained {
                    Ok(Some(n)) => {
                        write_blocked = false;
                        turn.moved(n);
                        ctx.delivered(direction, n);
                    }
                    Ok(None) => {}
                    Err(e) => return Err(PumpError::new(dst_side, "writing", true, e)),
                }
            }
        }
        let held = active.held();
        ctx.held(direction, held);
        if held > 0 && read_blocked && write_blocked {
            // Only a pipe that is empty reports "socket empty" reliably; with bytes in the pipe
            // wait for the destination alone (its progress lets us retry the read).
            let wait_for_read = !eof && held < capacity && matches!(active, Carrier::Copy(_));
            tokio::select! {
                result = src.readable(), if wait_for_read => result
                    .map_err(|e| PumpError::new(src_side, "waiting to read", true, e))?,
                result = dst.writable(), if !window_closed => result
                    .map_err(|e| PumpError::new(dst_side, "waiting to write", true, e))?,
                () = gate.opened(), if window_closed => {}
                // A reset from the source while we cannot read it (destination stalled) must
                // still reach the destination, not wait until the destination drains.
                result = src.ready(Interest::ERROR), if !eof => {
                    result.map_err(|e| PumpError::new(src_side, "waiting to read", true, e))?;
                    check_socket_error(src, src_side)?;
                }
            }
        } else {
            turn.pause(ctx.resources).await;
        }
    }
}
