//! One client connection: a reader that parses (possibly pipelined) requests and dispatches a
//! fetch task per request, and a writer that sends the responses back in request order.
//!
//! ```text
//! client --> reader --(slot per request, bounded)--> writer --> client
//!               \--spawn--> fetch task --(bounded body pieces)--/
//! ```
//! Each slot carries a bounded channel of response pieces, so at most `max_pipelined`
//! responses are buffered, each with at most `response_buffer_chunks` pieces.
//!
//! The files follow that picture: `reader.rs` is the client-to-proxy side, `writer.rs` the
//! proxy-to-client side, `fetch.rs` the task that answers one request (cache, upstream exchange,
//! relay), and `wire.rs` the bytes the proxy writes itself (its own short responses, the request
//! sent upstream, the response head for the client). This file holds what they share: the
//! connection's state and the messages between the sides.

mod fetch;
mod reader;
mod wire;
mod writer;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use midway_relay::{ClientWindow, RelayCounters};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info_span, Instrument};

use crate::error::HttpError;
use crate::head::RequestHead;
use crate::{ConnectUpstream, HttpProxy};
use reader::RequestReader;
use writer::ResponseWriter;

/// What happened on one client connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientReport {
    /// Request heads parsed.
    pub requests: u64,
    /// Requests refused by the proxy itself (400/429/431).
    pub rejected: u64,
    /// CONNECT tunnels established.
    pub tunnels: u64,
    /// Bytes written to the client (heads and bodies, tunnel bytes included).
    pub bytes_to_client: u64,
    /// Bytes read from the client (request heads and bodies, tunnel bytes included; the
    /// discarded rest of a rejected request is not counted).
    pub bytes_from_client: u64,
}

struct Counters {
    requests: AtomicU64,
    rejected: AtomicU64,
    tunnels: AtomicU64,
    /// Bytes to and from the client, shared with the caller, who may read them while the
    /// connection is served (`client_to_server`: read from the client; `server_to_client`:
    /// written to it).
    bytes: Arc<RelayCounters>,
}

/// A piece of one response on its way to the writer.
enum Part {
    Data(Bytes),
    /// The response is complete; close the connection after it if `close`.
    End {
        close: bool,
    },
}

/// A piece of a request body on its way to the fetch task.
enum BodyPiece {
    Data(Bytes),
    End,
}

/// One request's place in the response order.
enum Slot {
    Response {
        parts: mpsc::Receiver<Part>,
        done: oneshot::Sender<()>,
    },
    Tunnel {
        head: Box<RequestHead>,
        read_half: OwnedReadHalf,
        leftover: BytesMut,
    },
}

/// Sends response pieces to the writer; remembers whether the head went out.
struct ClientSink {
    tx: mpsc::Sender<Part>,
    head_sent: bool,
}

impl ClientSink {
    async fn send(&mut self, data: Bytes) -> Result<(), HttpError> {
        self.tx
            .send(Part::Data(data))
            .await
            .map_err(|_| HttpError::ClientGone)
    }

    async fn send_head(&mut self, data: Bytes) -> Result<(), HttpError> {
        self.head_sent = true;
        self.send(data).await
    }

    async fn end(&mut self, close: bool) -> Result<(), HttpError> {
        self.tx
            .send(Part::End { close })
            .await
            .map_err(|_| HttpError::ClientGone)
    }
}

impl HttpProxy {
    /// Serves one accepted client connection until it closes (keep-alive, pipelining, CONNECT),
    /// counting the bytes to and from the client into `bytes` as they move. Cancelling
    /// `cancel` cuts it: the client reads a reset, never a clean end after a partial response.
    /// Responses (and a CONNECT tunnel's bytes) go out as far as `window` grants, when the
    /// client's connections share one (a subscriber's access link).
    pub async fn serve_client(
        self: &Arc<Self>,
        client: TcpStream,
        peer: SocketAddr,
        connect_upstream: ConnectUpstream,
        cancel: CancellationToken,
        bytes: Arc<RelayCounters>,
        window: Option<Arc<dyn ClientWindow>>,
    ) -> Result<ClientReport, HttpError> {
        let span = info_span!("http_client", %peer);
        async move {
            let (read_half, write_half) = client.into_split();
            let (slot_tx, slot_rx) = mpsc::channel(self.config.client.max_pipelined);
            let conn = ClientConn {
                proxy: self.clone(),
                connect: connect_upstream,
                counters: Counters {
                    requests: AtomicU64::new(0),
                    rejected: AtomicU64::new(0),
                    tunnels: AtomicU64::new(0),
                    bytes,
                },
                outstanding: AtomicUsize::new(0),
                stop: cancel.child_token(),
                cut: cancel,
                fetches: TaskTracker::new(),
                window,
            };
            let reader = RequestReader {
                conn: &conn,
                read_half,
                buf: BytesMut::with_capacity(self.config.chunk_bytes),
                slot_tx,
            };
            let writer = ResponseWriter {
                conn: &conn,
                write_half,
                slot_rx,
            };
            let (read_result, write_result) = tokio::join!(reader.run(), async {
                let result = writer.run().await;
                // The writer is done (close requested, client gone or error): stop reading too.
                conn.stop.cancel();
                result
            });
            // Fetch tasks end with their response or when `stop` fires; none outlives the client.
            conn.fetches.close();
            conn.fetches.wait().await;
            read_result?;
            write_result?;
            Ok(conn.counters.report())
        }
        .instrument(span)
        .await
    }
}

impl Counters {
    fn report(&self) -> ClientReport {
        ClientReport {
            requests: self.requests.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            tunnels: self.tunnels.load(Ordering::Relaxed),
            bytes_to_client: self.bytes.server_to_client.load(Ordering::Relaxed),
            bytes_from_client: self.bytes.client_to_server.load(Ordering::Relaxed),
        }
    }
}

/// What one client connection carries through its life, shared by its two sides (the
/// [`RequestReader`] and the [`ResponseWriter`], which run concurrently in the connection's
/// task and its span) and handed, by clone, to the fetch tasks.
struct ClientConn {
    /// Config, upstream pool, cache and metrics.
    proxy: Arc<HttpProxy>,
    connect: ConnectUpstream,
    counters: Counters,
    /// Responses queued but not fully written (the idle timeout pauses while any are).
    outstanding: AtomicUsize,
    /// Fires when the connection ends (writer done or the server stopping).
    stop: CancellationToken,
    /// The caller's token, `stop`'s parent: when it fires the connection is cut (closed by the
    /// operator, or still open when shutdown's grace ran out) and the client gets a reset.
    cut: CancellationToken,
    fetches: TaskTracker,
    /// The window the bytes toward the client share with the client's other connections.
    window: Option<Arc<dyn ClientWindow>>,
}
