//! The control socket: a Unix stream socket (mode 0600, and only root or this process's user
//! get an answer: `SO_PEERCRED`) that answers the control protocol (`crate::control`, one JSON
//! request per line, one JSON answer per line): `status`, `drain`, `undrain`, `close`.
//!
//! A fresh start replaces a stale socket (one nobody answers on) but leaves one a running
//! midway answers on alone; a take-over (`upgrade.rs`) replaces the old process's socket once
//! it has let go, so `midway status` then talks to the new process. At the end the socket is
//! removed only if it is still this process's (same inode).

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;

use super::error::ProxyError;
use super::generation::Generation;
use super::shared::Shared;
use crate::config::ControlConfig;
use crate::control::{
    parse_request, ControlError, ErrorReason, ListenerStatus, Request, Response, ResponseBody,
    Status, Totals, MAX_REQUEST_BYTES,
};

/// Clients served at once; more are closed at once (a script in a loop must not pile up
/// tasks in the proxy).
const MAX_CLIENTS: usize = 16;
/// A client that sends no request for this long is closed.
const REQUEST_WAIT: Duration = Duration::from_secs(30);
/// Writing one answer may take this long (a status of many connections to a slow reader).
const ANSWER_WRITE: Duration = Duration::from_secs(30);

/// The bound control socket; removed from the file system on drop if it is still ours.
pub(crate) struct ControlSocket {
    listener: UnixListener,
    path: PathBuf,
    inode: u64,
    /// The folder this process created for it, or the default one (removed with it when
    /// empty).
    created_dir: Option<PathBuf>,
}

impl ControlSocket {
    /// Opens the socket `config` names. A socket a running midway answers on is left alone
    /// unless that midway is `taking_over_from` (the process handing over: the listening
    /// socket's owner, by `SO_PEERCRED`). A configured path that cannot be opened fails the
    /// start; the default path is best effort (a warning), so a midway without a writable
    /// `/run/midway` still starts.
    pub(super) fn open(
        config: &ControlConfig,
        taking_over_from: Option<u32>,
    ) -> Result<Option<ControlSocket>, ProxyError> {
        let path = &config.socket;
        let answering = answering_pid(path);
        let ours = answering.is_some() && answering == taking_over_from.map(Some);
        let result = if answering.is_some() && !ours {
            Err(ProxyError::ControlSocket {
                path: path.clone(),
                problem: "another midway answers on it (give each midway its own [control] socket)",
                source: None,
            })
        } else {
            // The default folder outside systemd (`/run/midway`) is midway's own to remove
            // when it is left empty, whoever made it: a midway killed before its clean exit
            // leaves it, and the next one must not keep it forever on the host.
            ControlSocket::bind(
                path,
                !config.explicit && std::env::var_os("RUNTIME_DIRECTORY").is_none(),
            )
        };
        match result {
            Ok(socket) => {
                tracing::info!(path = %path.display(), "control socket open (midway status)");
                Ok(Some(socket))
            }
            Err(err) if config.explicit => Err(err),
            Err(err) => {
                tracing::warn!(error = %super::error::ErrorChain(&err), "no control socket: midway status cannot reach this midway");
                Ok(None)
            }
        }
    }

    /// `remove_dir`: remove the socket's folder with it when empty, even if it was there.
    fn bind(path: &Path, remove_dir: bool) -> Result<ControlSocket, ProxyError> {
        let fail = |problem, source| ProxyError::ControlSocket {
            path: path.to_path_buf(),
            problem,
            source: Some(source),
        };
        let dir = path.parent().unwrap_or(Path::new("/"));
        let created_dir = if dir.exists() {
            remove_dir.then(|| dir.to_path_buf())
        } else {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|e| fail("cannot create its folder", e))?;
            Some(dir.to_path_buf())
        };
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail("cannot remove the stale socket", e)),
        }
        let listener = UnixListener::bind(path).map_err(|e| fail("cannot bind", e))?;
        // Owner only; the peer credentials are checked at each accept as well, which also
        // covers the moment between bind and chmod.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| fail("cannot restrict its mode to 0600", e))?;
        let inode = std::fs::metadata(path)
            .map_err(|e| fail("cannot read it back", e))?
            .ino();
        Ok(ControlSocket {
            listener,
            path: path.to_path_buf(),
            inode,
            created_dir,
        })
    }
}

/// `Some(pid)` of the process listening at `path` if one answers there (`Some(None)` if its pid
/// cannot be read), `None` if none does.
fn answering_pid(path: &Path) -> Option<Option<u32>> {
    let stream = std::os::unix::net::UnixStream::connect(path).ok()?;
    let credentials =
        nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials).ok();
    Some(credentials.and_then(|c| u32::try_from(c.pid()).ok()))
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let ours = std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.inode);
        if ours {
            let _ = std::fs::remove_file(&self.path);
            if let Some(dir) = &self.created_dir {
                // Only if empty: another midway's socket may live there by now.
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

/// What the answers read.
#[derive(Clone)]
pub(super) struct ControlState {
    pub(super) shared: Arc<Shared>,
    pub(super) generations: watch::Receiver<Arc<Generation>>,
}

/// Answers on `socket` until `stop`.
pub(super) async fn serve(socket: ControlSocket, state: ControlState, stop: CancellationToken) {
    let clients = Arc::new(Semaphore::new(MAX_CLIENTS));
    let own_uid = nix::unistd::geteuid().as_raw();
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = socket.listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                tracing::warn!(error = %err, "control socket: accept failed");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
        };
        let allowed = stream
            .peer_cred()
            .is_ok_and(|cred| cred.uid() == 0 || cred.uid() == own_uid);
        if !allowed {
            state.shared.metrics.control.refused_peers.inc();
            tracing::warn!("control socket: connection from another user refused");
            continue;
        }
        let Ok(permit) = clients.clone().try_acquire_owned() else {
            tracing::debug!("control socket: too many clients at once; closed");
            continue;
        };
        let (state, stop) = (state.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = answer_client(stream, &state) => {}
            }
            drop(permit);
        });
    }
}

/// Answers one client's requests, one per line, until it closes, waits too long or sends
/// something that is not a line of the protocol.
async fn answer_client(stream: UnixStream, state: &ControlState) {
    let (read, mut write) = stream.into_split();
    // One byte more than a request may have, to tell a long one from one at the limit.
    let mut reader = BufReader::new(read.take(0));
    loop {
        let mut line = String::new();
        reader.get_mut().set_limit(MAX_REQUEST_BYTES as u64 + 1);
        let read = tokio::time::timeout(REQUEST_WAIT, reader.read_line(&mut line)).await;
        let (response, last) = match read {
            Err(_) | Ok(Ok(0)) => return,
            Ok(Err(err)) => {
                let message = format!("not a line of UTF-8 text: {err}");
                (error(ErrorReason::BadJson, message), true)
            }
            Ok(Ok(_)) if !line.ends_with('\n') => {
                let message = format!("a request is one line of at most {MAX_REQUEST_BYTES} bytes");
                (error(ErrorReason::TooLong, message), true)
            }
            Ok(Ok(_)) => (answer(line.trim_end(), state).await, false),
        };
        if let ResponseBody::Error(err) = &response.body {
            tracing::debug!(reason = err.reason.as_str(), message = %err.message, "control request refused");
        }
        let mut text = response.to_line();
        text.push('\n');
        let written = tokio::time::timeout(ANSWER_WRITE, write.write_all(text.as_bytes())).await;
        if last || !matches!(written, Ok(Ok(()))) {
            return;
        }
    }
}

fn error(reason: ErrorReason, message: String) -> Response {
    Response::new(ResponseBody::Error(ControlError::new(reason, message)))
}

/// The answer to one request line, counted by command and result.
async fn answer(line: &str, state: &ControlState) -> Response {
    let metrics = &state.shared.metrics.control;
    let request = match parse_request(line) {
        Ok(request) => request,
        Err(err) => {
            metrics.request("invalid", err.reason.as_str());
            return Response::new(ResponseBody::Error(err));
        }
    };
    let command = request.command();
    let body = match execute(request, state).await {
        Ok(body) => body,
        Err(err) => ResponseBody::Error(err),
    };
    let result = match &body {
        ResponseBody::Error(err) => err.reason.as_str(),
        _ => "ok",
    };
    metrics.request(command, result);
    Response::new(body)
}

async fn execute(request: Request, state: &ControlState) -> Result<ResponseBody, ControlError> {
    let registry = &state.shared.registry;
    match request {
        Request::Status => {
            let state = state.clone();
            // A status reads two sockets' tcp_info per connection: thousands of syscalls on a
            // busy gateway, kept off the runtime's worker threads.
            let status = tokio::task::spawn_blocking(move || status(&state))
                .await
                .unwrap_or_default();
            Ok(ResponseBody::Status(status))
        }
        Request::Drain { listener } | Request::Undrain { listener } if !known(state, &listener) => {
            Err(ControlError::new(
                ErrorReason::UnknownListener,
                format!("no listener {listener:?} in the running configuration"),
            ))
        }
        Request::Drain { listener } => {
            let was = registry.drain_flag(&listener).swap(true, Ordering::Relaxed);
            tracing::info!(listener = %listener, "control: listener drained (new connections closed, open ones go on)");
            Ok(done(if was {
                format!("listener {listener} was already drained")
            } else {
                format!("listener {listener} drained: new connections are closed, open ones go on")
            }))
        }
        Request::Undrain { listener } => {
            let was = registry
                .drain_flag(&listener)
                .swap(false, Ordering::Relaxed);
            tracing::info!(listener = %listener, "control: listener undrained");
            Ok(done(if was {
                format!("listener {listener} accepts again")
            } else {
                format!("listener {listener} was not drained")
            }))
        }
        Request::Close { id } => {
            if registry.close(id) {
                tracing::info!(id, "control: connection closed (reset toward both ends)");
                Ok(done(format!("connection {id} closed: both ends reset")))
            } else {
                Err(ControlError::new(
                    ErrorReason::UnknownConnection,
                    format!("no open connection {id} (it may have ended)"),
                ))
            }
        }
    }
}

fn done(message: String) -> ResponseBody {
    ResponseBody::Done { message }
}

fn known(state: &ControlState, listener: &str) -> bool {
    state.generations.borrow().listeners.contains_key(listener)
}

/// The status snapshot: the newest generation's listeners, every open split connection.
fn status(state: &ControlState) -> Status {
    let generation = state.generations.borrow().clone();
    let registry = &state.shared.registry;
    let open = registry.open_per_listener();
    let listeners = generation
        .config
        .listeners
        .iter()
        .map(|l| ListenerStatus {
            name: l.name.clone(),
            mode: l.intercept.mode_name().to_string(),
            drained: registry.is_drained(&l.name),
            open: open.get(&l.name).copied().unwrap_or(0),
        })
        .collect();
    let shared = &state.shared;
    Status {
        generation: generation.number,
        pid: std::process::id(),
        listeners,
        connections: registry.connections(),
        totals: Totals {
            open: shared.connections_open.load(Ordering::Relaxed),
            served: shared.served.load(Ordering::Relaxed),
            spool_bytes: shared.resources.spool_bytes_in_use(),
        },
    }
}
