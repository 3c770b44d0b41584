//! Binary upgrade without dropping a connection: a new midway process takes over the running
//! one's listening sockets and its kernel-wide state, then the old one drains.
//!
//! The running midway listens on a Unix socket in its spool directory ([`UPGRADE_SOCKET`],
//! mode 0600, and only root or midway's own user may talk to it: it hands out listening
//! sockets). `midway proxy --config FILE --take-over` connects there and:
//!
//! 1. asks (`midway-handover 1`);
//! 2. receives an [`Offer`] and, in the same message (`SCM_RIGHTS`), a copy of every listening
//!    socket, of the metrics socket and of the link of each BPF congestion control the old
//!    process registered;
//! 3. starts with them: a listener whose address and kind match an offered socket uses it
//!    instead of binding (the kernel's accept queue is shared, so no connection is refused);
//!    the nftables tables and policy routing the old process recorded become its own, each table
//!    rewritten in one transaction; the BPF links keep the congestion controls registered;
//! 4. sends `commit`; the old process stops accepting, gives up the interception, the route
//!    knobs and the links without removing them, answers `released`, and drains its open
//!    connections to their natural end (a SIGTERM then cuts the drain to its grace period).
//!
//! If the new process fails before `commit` (a bad config, a bind error) it closes the socket
//! and the old one simply goes on. The protocol is local and versioned by its first line; a
//! peer speaking anything else is dropped.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use midway_bpf::Algorithm;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};

/// File name of the upgrade socket, in the spool directory.
const UPGRADE_SOCKET: &str = "midway-upgrade.sock";
/// First line of every exchange.
const HELLO: &str = "midway-handover 1\n";
const COMMIT: &str = "commit\n";
const RELEASED: &str = "released\n";
/// Longest offer accepted (its JSON).
const MAX_OFFER_BYTES: usize = 1 << 20;
/// Most descriptors in one offer (the kernel's `SCM_MAX_FD` is 253).
const MAX_FDS: usize = 250;
/// How long each side waits for the other's next step. The new process's start (binding,
/// nftables, BPF) lies between the offer and the commit.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// A listening socket's identity across processes: the configured address and whether it is
/// transparent. (A listener configured with port 0 is never taken over: its port is not known
/// in advance.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ListenerKey {
    pub(crate) listen: SocketAddr,
    pub(crate) transparent: bool,
    /// A QUIC peer listener's UDP socket (never handed over: see `listeners.rs`); absent in
    /// an older midway's offer, whose listeners are all TCP.
    #[serde(default)]
    pub(crate) udp: bool,
}

/// What the running midway hands over; the descriptors follow in this order: listeners, the
/// metrics socket (if any), the congestion controls' links.
#[derive(Debug, Serialize, Deserialize)]
struct Offer {
    pid: u32,
    listeners: Vec<(String, ListenerKey)>,
    metrics: Option<SocketAddr>,
    congestion_controls: Vec<String>,
    /// Where its nftables install record is (its spool directory).
    record_dir: PathBuf,
    /// Why the running midway cannot hand over (no descriptors come then).
    refusal: Option<String>,
    /// Listeners drained through the control socket: they stay drained in the new process.
    /// Absent in an older midway's offer.
    #[serde(default)]
    drained: Vec<String>,
}

/// Why a handover failed.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// Nothing answers on the upgrade socket (no midway runs with this spool directory).
    #[error("cannot reach the running midway's upgrade socket {path}")]
    Connect {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing the upgrade socket failed (or timed out).
    #[error("upgrade socket: {0}")]
    Io(#[from] std::io::Error),
    /// Passing the descriptors failed.
    #[error("upgrade socket: {0}")]
    Message(#[from] nix::Error),
    /// The other side said something unexpected, or closed.
    #[error("upgrade socket: {0}")]
    Protocol(String),
    /// The running midway cannot hand over, and says why.
    #[error("the running midway cannot hand over: {0}")]
    Refused(String),
}

fn protocol(message: impl Into<String>) -> HandoverError {
    HandoverError::Protocol(message.into())
}

/// What a process taking over received.
pub(crate) struct Inherited {
    /// The process handing over (its install record must name it).
    pub(crate) from_pid: u32,
    pub(crate) record_dir: PathBuf,
    listeners: Vec<(ListenerKey, OwnedFd)>,
    metrics: Option<(SocketAddr, OwnedFd)>,
    pub(crate) congestion_controls: Vec<(Algorithm, OwnedFd)>,
    /// The listeners the old process had drained.
    pub(crate) drained: Vec<String>,
    stream: UnixStream,
}

impl Inherited {
    /// The offered socket for a listener of this identity, if any (once).
    pub(crate) fn take_listener(&mut self, key: ListenerKey) -> Option<OwnedFd> {
        if key.listen.port() == 0 {
            return None;
        }
        let index = self.listeners.iter().position(|(k, _)| *k == key)?;
        Some(self.listeners.swap_remove(index).1)
    }

    /// The offered metrics socket if it is bound to `addr`.
    pub(crate) fn take_metrics(&mut self, addr: SocketAddr) -> Option<OwnedFd> {
        match &self.metrics {
            Some((offered, _)) if *offered == addr && addr.port() != 0 => {
                self.metrics.take().map(|(_, fd)| fd)
            }
            _ => None,
        }
    }

    /// Tells the old process to stop accepting and give up what this one took over; returns
    /// once it has. Offered sockets this process did not use are closed here.
    pub(crate) fn commit(mut self) -> Result<(), HandoverError> {
        self.stream.write_all(COMMIT.as_bytes())?;
        let answer = read_line(&mut self.stream)?;
        if answer != RELEASED {
            return Err(protocol(format!("expected {RELEASED:?}, got {answer:?}")));
        }
        Ok(())
    }
}

/// The new process's side: asks the midway whose upgrade socket is in `dir` (its spool
/// directory) for its sockets. Blocking.
pub(crate) fn request(dir: &Path) -> Result<Inherited, HandoverError> {
    let path = dir.join(UPGRADE_SOCKET);
    let mut stream = UnixStream::connect(&path).map_err(|source| HandoverError::Connect {
        path: path.clone(),
        source,
    })?;
    stream.set_read_timeout(Some(STEP_TIMEOUT))?;
    stream.set_write_timeout(Some(STEP_TIMEOUT))?;
    stream.write_all(HELLO.as_bytes())?;

    let mut buffer = vec![0u8; MAX_OFFER_BYTES + 4];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (received, fds) = {
        let mut iov = [IoSliceMut::new(&mut buffer)];
        let message = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let mut fds = Vec::new();
        for cmsg in message.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                // SAFETY: the kernel just installed these descriptors in this process for
                // us; nothing else owns them.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        (message.bytes, fds)
    };
    if received == 0 {
        return Err(protocol(
            "the running midway closed the upgrade socket (see its log)",
        ));
    }
    let mut filled = received;
    while filled < 4 {
        filled += read_some(&mut stream, &mut buffer[filled..])?;
    }
    let len = u32::from_be_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]) as usize;
    if len > MAX_OFFER_BYTES {
        return Err(protocol(format!("offer of {len} bytes")));
    }
    while filled < 4 + len {
        filled += read_some(&mut stream, &mut buffer[filled..4 + len])?;
    }
    let offer: Offer =
        serde_json::from_slice(&buffer[4..4 + len]).map_err(|e| protocol(format!("offer: {e}")))?;
    if let Some(refusal) = offer.refusal {
        return Err(HandoverError::Refused(refusal));
    }
    let expected = offer.listeners.len()
        + usize::from(offer.metrics.is_some())
        + offer.congestion_controls.len();
    if fds.len() != expected {
        return Err(protocol(format!(
            "offer lists {expected} descriptors, {} came",
            fds.len()
        )));
    }
    // In the offer's order; counted above, so `next_fd` never runs short.
    let mut fds = fds.into_iter();
    let mut next_fd = || {
        fds.next()
            .ok_or_else(|| protocol("fewer descriptors came than the offer lists"))
    };
    let listeners = offer
        .listeners
        .iter()
        .map(|(_, key)| Ok((*key, next_fd()?)))
        .collect::<Result<_, HandoverError>>()?;
    let metrics = match offer.metrics {
        Some(addr) => Some((addr, next_fd()?)),
        None => None,
    };
    let congestion_controls = offer
        .congestion_controls
        .iter()
        .map(|name| {
            let algorithm = Algorithm::from_name(name)
                .ok_or_else(|| protocol(format!("unknown congestion control {name:?}")))?;
            Ok((algorithm, next_fd()?))
        })
        .collect::<Result<_, HandoverError>>()?;
    Ok(Inherited {
        from_pid: offer.pid,
        record_dir: offer.record_dir,
        listeners,
        metrics,
        congestion_controls,
        drained: offer.drained,
        stream,
    })
}

/// What the running midway offers: its listening sockets, metrics socket and BPF links.
pub(crate) struct Offering<'a> {
    pub(crate) listeners: Vec<(String, ListenerKey, BorrowedFd<'a>)>,
    pub(crate) metrics: Option<(SocketAddr, BorrowedFd<'a>)>,
    pub(crate) congestion_controls: Vec<(Algorithm, BorrowedFd<'a>)>,
    pub(crate) record_dir: PathBuf,
    /// Set when this process cannot hand over; the new process is told why.
    pub(crate) refusal: Option<String>,
    /// The listeners drained here (the new process keeps them drained).
    pub(crate) drained: Vec<String>,
}

/// The running midway's side, after a connection on the upgrade socket: sends the offer and
/// waits for `commit`. Returns the stream to answer `released` on once this process has let
/// go, or an error (the take-over was abandoned; this process goes on). Blocking.
pub(crate) fn offer(
    mut stream: UnixStream,
    offering: Offering<'_>,
) -> Result<UnixStream, HandoverError> {
    stream.set_read_timeout(Some(STEP_TIMEOUT))?;
    stream.set_write_timeout(Some(STEP_TIMEOUT))?;
    let hello = read_line(&mut stream)?;
    if hello != HELLO {
        return Err(protocol(format!("unexpected greeting {hello:?}")));
    }
    let offer = Offer {
        pid: std::process::id(),
        listeners: offering
            .listeners
            .iter()
            .map(|(name, key, _)| (name.clone(), *key))
            .collect(),
        metrics: offering.metrics.as_ref().map(|(addr, _)| *addr),
        congestion_controls: offering
            .congestion_controls
            .iter()
            .map(|(algorithm, _)| algorithm.profile_name().to_string())
            .collect(),
        record_dir: offering.record_dir.clone(),
        refusal: offering.refusal.clone(),
        drained: offering.drained.clone(),
    };
    let mut fds: Vec<RawFd> = Vec::new();
    // A refusal hands nothing over; the new process reports why and exits.
    if offering.refusal.is_none() {
        fds.extend(offering.listeners.iter().map(|(_, _, fd)| fd.as_raw_fd()));
        fds.extend(offering.metrics.iter().map(|(_, fd)| fd.as_raw_fd()));
        fds.extend(
            offering
                .congestion_controls
                .iter()
                .map(|(_, fd)| fd.as_raw_fd()),
        );
    }
    if fds.len() > MAX_FDS {
        return Err(protocol(format!(
            "{} descriptors to hand over, at most {MAX_FDS} fit",
            fds.len()
        )));
    }
    let json = serde_json::to_vec(&offer).map_err(|e| protocol(e.to_string()))?;
    let mut message = (json.len() as u32).to_be_bytes().to_vec();
    message.extend_from_slice(&json);
    let iov = [IoSlice::new(&message)];
    let rights = [ControlMessage::ScmRights(&fds)];
    let control: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
    let sent = sendmsg::<()>(stream.as_raw_fd(), &iov, control, MsgFlags::empty(), None)?;
    stream.write_all(&message[sent..])?;
    if let Some(refusal) = offering.refusal {
        return Err(HandoverError::Refused(refusal));
    }
    let answer = read_line(&mut stream)?;
    if answer != COMMIT {
        return Err(protocol(format!(
            "the new process did not commit ({answer:?}); going on"
        )));
    }
    Ok(stream)
}

/// Tells the new process that this one has stopped accepting and let go.
pub(crate) fn released(mut stream: UnixStream) -> Result<(), HandoverError> {
    stream.write_all(RELEASED.as_bytes())?;
    Ok(())
}

fn read_some(stream: &mut UnixStream, buffer: &mut [u8]) -> Result<usize, HandoverError> {
    match stream.read(buffer)? {
        0 => Err(protocol("the other midway closed the upgrade socket")),
        n => Ok(n),
    }
}

/// One line (at most 64 bytes, newline included); an empty string at EOF.
fn read_line(stream: &mut UnixStream) -> Result<String, HandoverError> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < 64 {
        match stream.read(&mut byte)? {
            0 => break,
            _ => {
                line.push(byte[0]);
                if byte[0] == b'\n' {
                    break;
                }
            }
        }
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// The running midway's upgrade socket. Removed at drop, unless a process that took over has
/// put its own at the path since.
pub(crate) struct UpgradeSocket {
    listener: tokio::net::UnixListener,
    path: PathBuf,
    inode: u64,
}

impl UpgradeSocket {
    /// Binds `dir/UPGRADE_SOCKET`, replacing what is there: a stale socket of a midway that
    /// died, or (when this process took over) the old process's, which keeps serving its
    /// accepted connection through the descriptor it has.
    fn bind(dir: &Path) -> std::io::Result<UpgradeSocket> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(UPGRADE_SOCKET);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = tokio::net::UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        let inode = std::fs::metadata(&path)?.ino();
        Ok(UpgradeSocket {
            listener,
            path,
            inode,
        })
    }

    /// The upgrade socket in `dir`, unless another midway (not the one being taken over)
    /// already answers there. A binary upgrade is optional: a socket that cannot be bound (e.g.
    /// a spool path longer than the 107 bytes a Unix socket's path may have) costs only the
    /// upgrade, with a warning, never the start, and never a take-over that has already
    /// happened.
    pub(crate) fn open(dir: &Path, taking_over: bool) -> Option<UpgradeSocket> {
        if !taking_over && UpgradeSocket::in_use(dir) {
            tracing::warn!(dir = %dir.display(), "another midway answers on this spool directory's upgrade socket; this one offers no binary upgrade (give each midway its own spool directory)");
            return None;
        }
        match UpgradeSocket::bind(dir) {
            Ok(socket) => Some(socket),
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot open the upgrade socket in the spool directory; this midway offers no binary upgrade");
                None
            }
        }
    }

    /// Whether a midway listens on `dir`'s upgrade socket now (a start without `--take-over`
    /// must not replace it).
    fn in_use(dir: &Path) -> bool {
        UnixStream::connect(dir.join(UPGRADE_SOCKET)).is_ok()
    }

    /// The next connection from root or from this process's user; others are closed.
    pub(crate) async fn accept(&self) -> std::io::Result<UnixStream> {
        loop {
            let (stream, _) = self.listener.accept().await?;
            let allowed = stream
                .peer_cred()
                .is_ok_and(|cred| cred.uid() == 0 || cred.uid() == nix::unistd::geteuid().as_raw());
            if !allowed {
                tracing::warn!("upgrade socket: connection from another user refused");
                continue;
            }
            let stream = stream.into_std()?;
            stream.set_nonblocking(false)?;
            return Ok(stream);
        }
    }
}

impl Drop for UpgradeSocket {
    fn drop(&mut self) {
        let ours = std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.inode);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
