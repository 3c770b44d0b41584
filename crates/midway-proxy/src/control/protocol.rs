//! The control protocol's messages (version 1). A request is one JSON object on one line:
//! `{"version": 1, "command": "status"}`, `"drain"` / `"undrain"` with `"listener"`, `"close"`
//! with `"id"`. The answer is one JSON object on one line with the same `"version"` and a
//! `"result"`: `"status"` (the snapshot), `"done"` (a message) or `"error"` (a typed reason
//! and a message). See `docs/control-protocol.md`.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// The protocol version this midway speaks; a request with another is refused
/// ([`ErrorReason::UnsupportedVersion`]).
pub const PROTOCOL_VERSION: u32 = 1;
/// A request line longer than this is refused (requests are a few dozen bytes).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// A command to the running proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Every open split connection, the listeners and the configuration's generation.
    Status,
    /// The listener refuses new connections (closed at once); open ones go on.
    Drain {
        /// The listener's name.
        listener: String,
    },
    /// The listener accepts again.
    Undrain {
        /// The listener's name.
        listener: String,
    },
    /// Ends one connection with a reset toward both ends.
    Close {
        /// The connection's id (`status` lists it).
        id: u64,
    },
}

/// A request as it travels: the version beside the command.
#[derive(Serialize)]
struct Envelope<'a> {
    version: u32,
    #[serde(flatten)]
    request: &'a Request,
}

impl Request {
    /// The request line (without its newline) in this midway's protocol version.
    pub fn to_line(&self) -> String {
        // Strings and numbers only: serializing cannot fail (an empty line would be answered
        // with `bad_json`).
        serde_json::to_string(&Envelope {
            version: PROTOCOL_VERSION,
            request: self,
        })
        .unwrap_or_default()
    }

    /// The command's name (the metrics label).
    pub fn command(&self) -> &'static str {
        match self {
            Request::Status => "status",
            Request::Drain { .. } => "drain",
            Request::Undrain { .. } => "undrain",
            Request::Close { .. } => "close",
        }
    }
}

/// Why a request was refused; the wire form is the snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorReason {
    /// Not a JSON object.
    BadJson,
    /// `"version"` missing or not one this midway speaks.
    UnsupportedVersion,
    /// `"command"` missing or not one of this version's.
    UnknownCommand,
    /// A known command with missing, extra or mistyped fields.
    BadRequest,
    /// Longer than [`MAX_REQUEST_BYTES`].
    TooLong,
    /// No listener of that name in the running configuration.
    UnknownListener,
    /// No open connection with that id (it may have ended).
    UnknownConnection,
}

impl ErrorReason {
    /// The wire name (also the metrics label).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorReason::BadJson => "bad_json",
            ErrorReason::UnsupportedVersion => "unsupported_version",
            ErrorReason::UnknownCommand => "unknown_command",
            ErrorReason::BadRequest => "bad_request",
            ErrorReason::TooLong => "too_long",
            ErrorReason::UnknownListener => "unknown_listener",
            ErrorReason::UnknownConnection => "unknown_connection",
        }
    }
}

/// A refused request: the reason for scripts, the message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message} ({})", reason.as_str())]
pub struct ControlError {
    /// What kind of refusal, for scripts.
    pub reason: ErrorReason,
    /// What was wrong, for people.
    pub message: String,
}

impl ControlError {
    /// A refusal for `reason`, saying `message`.
    pub fn new(reason: ErrorReason, message: impl Into<String>) -> ControlError {
        ControlError {
            reason,
            message: message.into(),
        }
    }
}

/// Parses one request line. Errors are typed: the version is checked before the command, so
/// a client of a later version learns that first.
pub fn parse_request(line: &str) -> Result<Request, ControlError> {
    if line.len() > MAX_REQUEST_BYTES {
        return Err(ControlError::new(
            ErrorReason::TooLong,
            format!("a request is at most {MAX_REQUEST_BYTES} bytes"),
        ));
    }
    let value: serde_json::Value = serde_json::from_str(line)
        .map_err(|err| ControlError::new(ErrorReason::BadJson, format!("not JSON: {err}")))?;
    let serde_json::Value::Object(mut object) = value else {
        return Err(ControlError::new(
            ErrorReason::BadJson,
            "a request is a JSON object",
        ));
    };
    match object.remove("version") {
        Some(v) if v.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => {}
        Some(v) => {
            return Err(ControlError::new(
                ErrorReason::UnsupportedVersion,
                format!(
                    "version {v} is not spoken here; this midway speaks version {PROTOCOL_VERSION}"
                ),
            ))
        }
        None => {
            return Err(ControlError::new(
                ErrorReason::UnsupportedVersion,
                format!("\"version\" is missing; this midway speaks version {PROTOCOL_VERSION}"),
            ))
        }
    }
    let known = ["status", "drain", "undrain", "close"];
    match object.get("command").and_then(|c| c.as_str()) {
        Some(command) if known.contains(&command) => {}
        Some(command) => {
            return Err(ControlError::new(
                ErrorReason::UnknownCommand,
                format!("unknown command {command:?}; version {PROTOCOL_VERSION} has {known:?}"),
            ))
        }
        None => {
            return Err(ControlError::new(
                ErrorReason::UnknownCommand,
                format!("\"command\" is missing; one of {known:?}"),
            ))
        }
    }
    let keys: Vec<String> = object.keys().cloned().collect();
    let request: Request = serde_json::from_value(serde_json::Value::Object(object))
        .map_err(|err| ControlError::new(ErrorReason::BadRequest, err.to_string()))?;
    // serde ignores extra fields of a command without fields (`status`); a mistyped field
    // name must not be ignored silently, so every field given must be one the command has.
    let request_keys = match serde_json::to_value(&request) {
        Ok(serde_json::Value::Object(known)) => known,
        _ => serde_json::Map::new(),
    };
    if let Some(extra) = keys.iter().find(|k| !request_keys.contains_key(*k)) {
        return Err(ControlError::new(
            ErrorReason::BadRequest,
            format!("unknown field {extra:?} for {}", request.command()),
        ));
    }
    Ok(request)
}

/// An answer as it travels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The protocol version of the answer (the one this midway speaks).
    pub version: u32,
    /// What it says.
    #[serde(flatten)]
    pub body: ResponseBody,
}

/// What an answer says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum ResponseBody {
    /// The answer to `status`.
    Status(Status),
    /// drain, undrain and close: what was done.
    Done {
        /// What was done, for people.
        message: String,
    },
    /// The request was refused.
    Error(ControlError),
}

impl Response {
    /// An answer in this midway's protocol version.
    pub fn new(body: ResponseBody) -> Response {
        Response {
            version: PROTOCOL_VERSION,
            body,
        }
    }

    /// The answer line (without its newline).
    pub fn to_line(&self) -> String {
        // Strings, numbers and lists only: serializing cannot fail; should it, the client still
        // gets an answer of the protocol.
        serde_json::to_string(self).unwrap_or_else(|err| {
            format!(
                r#"{{"version":{PROTOCOL_VERSION},"result":"error","reason":"bad_request","message":{:?}}}"#,
                err.to_string()
            )
        })
    }
}

/// The status snapshot: read when asked, nothing of it is kept per connection.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The running configuration's generation: 1 at start, one more per reload.
    pub generation: u64,
    /// The proxy's process id.
    pub pid: u32,
    /// The running configuration's listeners, in file order.
    pub listeners: Vec<ListenerStatus>,
    /// Open split connections, by id.
    pub connections: Vec<ConnectionStatus>,
    /// The whole proxy's figures.
    pub totals: Totals,
}

/// One listener of the running configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListenerStatus {
    /// Its name in the configuration.
    pub name: String,
    /// forward, socks5, transparent, http or peer.
    pub mode: String,
    /// Refusing new connections (`drain`).
    pub drained: bool,
    /// Split connections open now.
    pub open: usize,
}

/// The whole proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Connections being served now (split and HTTP).
    pub open: usize,
    /// Connections accepted and allowed since the start.
    pub served: u64,
    /// Bytes the spool holds now, all connections together.
    pub spool_bytes: u64,
}

/// One open split connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectionStatus {
    /// The id `close` takes; unique for the process's life.
    pub id: u64,
    /// The listener that accepted it.
    pub listener: String,
    /// The client's address (for a peer listener: the midway that sent the connection).
    pub client: SocketAddr,
    /// Where the connection goes (the destination, also through a peer).
    pub target: Option<SocketAddr>,
    /// Time since the client was accepted, milliseconds.
    pub age_ms: u64,
    /// Bytes delivered to the server side.
    pub bytes_up: u64,
    /// Bytes delivered to the client side.
    pub bytes_down: u64,
    /// buffer or spool.
    pub relay: String,
    /// Bytes the spool holds for this connection now.
    pub spool_bytes: u64,
    /// The peer midway it goes through, if any.
    pub peer: Option<String>,
    /// The accepted segment first, the onward one second.
    pub segments: Vec<SegmentStatus>,
}

/// One segment of a connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentStatus {
    /// local, remote or peer.
    pub role: String,
    /// tcp, tls or quic.
    pub transport: String,
    /// The kernel's view of the socket; absent for a QUIC stream (no socket of its own) or a
    /// socket that closed while the snapshot was read.
    pub tcp: Option<TcpInfoStatus>,
}

/// What `tcp_info` says of one segment's socket at the time of the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TcpInfoStatus {
    /// Smoothed round-trip time, microseconds.
    pub srtt_us: u32,
    /// Its variation, microseconds.
    pub rttvar_us: u32,
    /// Congestion window, segments.
    pub cwnd: u32,
    /// Segment size used for sending, bytes.
    pub mss: u32,
    /// Segments retransmitted over the socket's life.
    pub retransmits: u32,
    /// Latest delivery-rate sample, bits per second.
    pub delivery_rate_bps: u64,
    /// The congestion control in force on the socket.
    pub congestion_control: Option<String>,
    /// Segments sent and not yet acknowledged.
    pub unacked: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(line: &str) -> ErrorReason {
        parse_request(line).unwrap_err().reason
    }

    #[test]
    fn requests_round_trip() {
        for request in [
            Request::Status,
            Request::Drain {
                listener: "fwd".into(),
            },
            Request::Undrain {
                listener: "fwd".into(),
            },
            Request::Close { id: 42 },
        ] {
            let line = request.to_line();
            assert!(line.contains("\"version\":1"), "{line}");
            assert_eq!(parse_request(&line).unwrap(), request);
        }
        assert_eq!(
            parse_request(r#"{"command":"close","id":7,"version":1}"#).unwrap(),
            Request::Close { id: 7 }
        );
    }

    #[test]
    fn bad_requests_get_typed_reasons() {
        assert_eq!(reason("status"), ErrorReason::BadJson);
        assert_eq!(reason("[1]"), ErrorReason::BadJson);
        assert_eq!(
            reason(r#"{"command":"status"}"#),
            ErrorReason::UnsupportedVersion
        );
        assert_eq!(
            reason(r#"{"version":2,"command":"status"}"#),
            ErrorReason::UnsupportedVersion
        );
        assert_eq!(
            reason(r#"{"version":"1","command":"status"}"#),
            ErrorReason::UnsupportedVersion
        );
        assert_eq!(reason(r#"{"version":1}"#), ErrorReason::UnknownCommand);
        assert_eq!(
            reason(r#"{"version":1,"command":"reboot"}"#),
            ErrorReason::UnknownCommand
        );
        assert_eq!(
            reason(r#"{"version":1,"command":"drain"}"#),
            ErrorReason::BadRequest
        );
        assert_eq!(
            reason(r#"{"version":1,"command":"close","id":"x"}"#),
            ErrorReason::BadRequest
        );
        assert_eq!(
            reason(r#"{"version":1,"command":"status","extra":1}"#),
            ErrorReason::BadRequest
        );
        assert_eq!(
            reason(&" ".repeat(MAX_REQUEST_BYTES + 1)),
            ErrorReason::TooLong
        );
    }

    #[test]
    fn responses_round_trip_with_their_result() {
        let error = Response::new(ResponseBody::Error(ControlError::new(
            ErrorReason::UnknownListener,
            "no listener x",
        )));
        let line = error.to_line();
        assert!(line.contains("\"result\":\"error\""), "{line}");
        assert!(line.contains("\"reason\":\"unknown_listener\""), "{line}");
        assert_eq!(serde_json::from_str::<Response>(&line).unwrap(), error);
        let status = Response::new(ResponseBody::Status(Status {
            generation: 3,
            ..Status::default()
        }));
        let line = status.to_line();
        assert!(line.contains("\"result\":\"status\""), "{line}");
        assert!(line.contains("\"version\":1"), "{line}");
        assert_eq!(serde_json::from_str::<Response>(&line).unwrap(), status);
    }
}
