//! The client's side: one request over the control socket and its answer, each step bounded
//! in time (a proxy that stops answering must not hang `midway status`).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::protocol::{Request, Response};

/// An answer of a status with many thousands of connections is a few MiB; more is not an
/// answer of this protocol.
const MAX_RESPONSE_BYTES: u64 = 256 << 20;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody answers at the path (or the caller may not connect).
    #[error("cannot connect to the control socket {path} (is midway running, with [control] there, and are you root or its user?)")]
    Connect {
        /// The socket's path.
        path: PathBuf,
        /// Why connecting failed.
        #[source]
        source: std::io::Error,
    },
    #[error("control socket {path}: {what}")]
    /// Sending or reading failed (a timeout included).
    Io {
        /// The socket's path.
        path: PathBuf,
        /// The step that failed.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The connection closed before an answer.
    #[error("control socket {path}: the proxy closed the connection without an answer")]
    NoAnswer {
        /// The socket's path.
        path: PathBuf,
    },
    #[error("control socket {path}: the answer is not the control protocol")]
    /// The answer did not parse.
    BadAnswer {
        /// The socket's path.
        path: PathBuf,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
}

/// Sends `request` to the proxy at `path` and reads its answer; each of connect, write and
/// read gives up after `timeout`.
pub fn request(path: &Path, request: &Request, timeout: Duration) -> Result<Response, ClientError> {
    let io = |what: &'static str| {
        move |source| ClientError::Io {
            path: path.to_path_buf(),
            what,
            source,
        }
    };
    let mut stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(io("setting the timeout"))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(io("setting the timeout"))?;
    let mut line = request.to_line();
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .map_err(io("sending the request"))?;
    let mut answer = String::new();
    let mut reader = BufReader::new(std::io::Read::take(&stream, MAX_RESPONSE_BYTES));
    let read = reader
        .read_line(&mut answer)
        .map_err(io("reading the answer"))?;
    if read == 0 {
        return Err(ClientError::NoAnswer {
            path: path.to_path_buf(),
        });
    }
    serde_json::from_str(answer.trim_end()).map_err(|source| ClientError::BadAnswer {
        path: path.to_path_buf(),
        source,
    })
}
