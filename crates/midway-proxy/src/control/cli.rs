//! `midway status` as the binary runs it: one request and its text, or the `--watch` loop
//! (a redraw per interval with an ANSI clear, until `stop` fires, `count` frames were drawn or
//! the proxy goes away). The text itself comes from `view.rs`.

use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::client::{request, ClientError};
use super::protocol::{ControlError, Request, ResponseBody, Status};
use super::view::{render_table, render_watch, Filter, SortKey};

/// Clear the screen and go home: each frame of `--watch` starts on an empty terminal.
const CLEAR: &str = "\x1b[H\x1b[2J";
/// Before a status is asked again (see [`fetch_status`]).
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Lines `--watch` fills when the terminal's height is not known.
const DEFAULT_HEIGHT: usize = 50;

/// What `midway status` shows and where it asks.
#[derive(Debug, Clone)]
pub struct StatusOptions {
    /// The control socket.
    pub socket: PathBuf,
    /// JSON (the status with the filter applied, one object per line) instead of a table.
    pub json: bool,
    /// Which connections.
    pub filter: Filter,
    /// In which order.
    pub sort: SortKey,
    /// Bound of each request.
    pub timeout: Duration,
}

/// Why `midway status` failed.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// No answer.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The proxy refused the request.
    #[error("midway refused: {0}")]
    Refused(ControlError),
    /// An answer of the wrong kind.
    #[error("midway answered {0} with something else than expected")]
    Unexpected(&'static str),
    /// The status could not be written as JSON.
    #[error("cannot write the status as JSON")]
    Json(#[source] serde_json::Error),
    /// Writing to the terminal failed.
    #[error("cannot write the view")]
    Output(#[source] std::io::Error),
}

/// The status. Asked a second time if the first connection closed unanswered: during a binary
/// upgrade the old process may exit between a client's connect and its request (a status
/// changes nothing, so asking again is safe).
pub fn fetch_status(options: &StatusOptions) -> Result<Status, StatusError> {
    let answer = match request(&options.socket, &Request::Status, options.timeout) {
        Err(ClientError::Io { .. } | ClientError::NoAnswer { .. }) => {
            std::thread::sleep(RETRY_PAUSE);
            request(&options.socket, &Request::Status, options.timeout)
        }
        answer => answer,
    };
    match answer?.body {
        ResponseBody::Status(status) => Ok(status),
        ResponseBody::Error(err) => Err(StatusError::Refused(err)),
        ResponseBody::Done { .. } => Err(StatusError::Unexpected("status")),
    }
}

/// The status with only the connections `filter` keeps, by id (for `--json`: scripts sort).
fn filtered(mut status: Status, options: &StatusOptions) -> Status {
    status.connections.retain(|c| options.filter.matches(c));
    status
}

/// `status` as one line of JSON.
fn json_line(status: &Status) -> Result<String, StatusError> {
    let mut line = serde_json::to_string(status).map_err(StatusError::Json)?;
    line.push('\n');
    Ok(line)
}

/// `midway status` without `--watch`: the table, or the JSON line.
pub fn status_text(options: &StatusOptions) -> Result<String, StatusError> {
    let status = fetch_status(options)?;
    Ok(if options.json {
        json_line(&filtered(status, options))?
    } else {
        render_table(&status, &options.filter, options.sort)
    })
}

/// drain, undrain or close: the proxy's message (or its answer line with `json`).
pub fn command_text(options: &StatusOptions, command: Request) -> Result<String, StatusError> {
    let name = command.command();
    let response = request(&options.socket, &command, options.timeout)?;
    if options.json {
        return Ok(response.to_line() + "\n");
    }
    match response.body {
        ResponseBody::Done { message } => Ok(message + "\n"),
        ResponseBody::Error(err) => Err(StatusError::Refused(err)),
        ResponseBody::Status(_) => Err(StatusError::Unexpected(name)),
    }
}

/// `--watch`: a frame every `interval` into `out` until `stop` fires or `count` frames (if
/// given) were drawn; an error when the proxy goes away (its socket gone or silent).
pub async fn watch(
    options: &StatusOptions,
    interval: Duration,
    count: Option<u64>,
    rows: Option<usize>,
    stop: impl Future<Output = ()>,
    out: &mut impl Write,
) -> Result<(), StatusError> {
    tokio::pin!(stop);
    // The last line stays free for the cursor.
    let height = rows.map_or(DEFAULT_HEIGHT, |r| r.saturating_sub(1));
    let mut previous: Option<(Status, Instant)> = None;
    let mut drawn = 0u64;
    loop {
        let status = {
            let options = options.clone();
            tokio::task::spawn_blocking(move || fetch_status(&options))
                .await
                .map_err(|_| StatusError::Unexpected("status"))??
        };
        let now = Instant::now();
        let frame = if options.json {
            json_line(&filtered(status.clone(), options))?
        } else {
            let (before, elapsed) = match &previous {
                Some((before, at)) => (Some(before), now.duration_since(*at)),
                None => (None, Duration::ZERO),
            };
            let view = render_watch(
                &status,
                before,
                elapsed,
                &options.filter,
                options.sort,
                height,
            );
            format!("{CLEAR}{view}")
        };
        out.write_all(frame.as_bytes())
            .and_then(|()| out.flush())
            .map_err(StatusError::Output)?;
        previous = Some((status, now));
        drawn += 1;
        if count.is_some_and(|count| drawn >= count) {
            return Ok(());
        }
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// The terminal's height in rows, if stdout is one.
pub fn terminal_rows() -> Option<usize> {
    // SAFETY: TIOCGWINSZ writes a `winsize` into the zeroed struct we pass, or fails.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    (rc == 0 && size.ws_row > 0).then_some(usize::from(size.ws_row))
}
