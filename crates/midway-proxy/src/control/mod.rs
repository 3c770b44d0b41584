//! The control protocol, both ends' shared part: `midway status` (the client) and the proxy's
//! control socket (the server, `server/control.rs`) speak it. Newline-delimited JSON over a
//! Unix stream socket, each request and response carrying `"version"`; the wire format is
//! documented in `docs/control-protocol.md`.
//!
//! - `protocol.rs`: requests, responses, the status snapshot, typed errors (pure);
//! - `view.rs`: filters, sorting and the table / live view text (pure);
//! - `client.rs`: one request over the socket, bounded in time;
//! - `cli.rs`: `midway status` as the binary runs it (one answer, or the `--watch` loop).

mod cli;
mod client;
mod protocol;
mod view;

pub use cli::{
    command_text, fetch_status, status_text, terminal_rows, watch, StatusError, StatusOptions,
};
pub use client::{request, ClientError};
pub use protocol::{
    parse_request, ConnectionStatus, ControlError, ErrorReason, ListenerStatus, Request, Response,
    ResponseBody, SegmentStatus, Status, TcpInfoStatus, Totals, MAX_REQUEST_BYTES,
    PROTOCOL_VERSION,
};
pub use view::{render_table, render_watch, ClientFilter, Filter, FilterError, SortKey};
