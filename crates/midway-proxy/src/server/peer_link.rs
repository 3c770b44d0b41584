//! One segment's stream: a plain TCP socket, TLS 1.3 over one (`transport = "tls"` between two
//! midways), or a stream of a QUIC tunnel (`transport = "quic"`). Everything that needs the
//! socket itself (profiles, tcp_info, the memory guard, the warm pool's liveness check) reaches
//! the TCP socket under the first two; a QUIC stream has none (its tunnel's figures are the
//! peer's metrics). The relay picks the splice relay for two plain sockets and the stream relay
//! when one side is TLS or QUIC.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use midway_quic::QuicPeer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

/// A segment's stream.
pub(super) enum PeerLink {
    /// A plain TCP connection.
    Tcp(TcpStream),
    /// TLS 1.3 over a TCP connection (boxed: a TLS session is some kilobytes).
    Tls(Box<TlsStream<TcpStream>>),
    /// A stream of a QUIC tunnel.
    Quic(QuicPeer),
}

impl PeerLink {
    /// The TCP socket underneath (none under a QUIC stream).
    pub(super) fn tcp(&self) -> Option<&TcpStream> {
        match self {
            PeerLink::Tcp(stream) => Some(stream),
            PeerLink::Tls(stream) => Some(stream.get_ref().0),
            PeerLink::Quic(_) => None,
        }
    }

    /// The TCP socket when the segment is plain TCP (its bytes are the client's own).
    pub(super) fn tcp_plain(&self) -> Option<&TcpStream> {
        match self {
            PeerLink::Tcp(stream) => Some(stream),
            _ => None,
        }
    }

    /// Closes at once with a reset (SO_LINGER {on, 0} on the TCP socket; RESET_STREAM and
    /// STOP_SENDING on a QUIC stream): the other end sees a refusal, never a clean end.
    pub(super) fn reset(self) {
        match self {
            PeerLink::Quic(mut stream) => stream.reset(),
            other => {
                if let Some(tcp) = other.tcp() {
                    let _ = socket2::SockRef::from(tcp).set_linger(Some(Duration::ZERO));
                }
            }
        }
    }

    /// The transport, for logs and the control socket's status.
    pub(super) fn transport(&self) -> Transport {
        match self {
            PeerLink::Tcp(_) => Transport::Tcp,
            PeerLink::Tls(_) => Transport::Tls,
            PeerLink::Quic(_) => Transport::Quic,
        }
    }
}

/// A segment's transport: a byte where its name would be 16 (every idle connection keeps its
/// two segments' transports, for the end-of-connection log and the control socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Transport {
    Tcp,
    Tls,
    Quic,
}

impl Transport {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
            Transport::Quic => "quic",
        }
    }
}

impl From<TcpStream> for PeerLink {
    fn from(stream: TcpStream) -> PeerLink {
        PeerLink::Tcp(stream)
    }
}

/// The edge's side of a TLS peer connection: the handshake on `stream`, within `timeout`. The
/// peer's key is checked against the pin in `config` (midway-tls).
pub(super) async fn connect_tls(
    stream: TcpStream,
    config: &Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> io::Result<PeerLink> {
    let name = rustls::pki_types::ServerName::try_from(midway_tls::SERVER_NAME)
        .map_err(io::Error::other)?;
    let connect = TlsConnector::from(config.clone()).connect(name, stream);
    let stream = tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
    Ok(PeerLink::Tls(Box::new(TlsStream::Client(stream))))
}

/// The gateway's side: the handshake on an accepted `stream`, within `timeout`; a connecting
/// midway whose key `config` does not list is refused here.
pub(super) async fn accept_tls(
    stream: TcpStream,
    config: &Arc<rustls::ServerConfig>,
    timeout: Duration,
) -> io::Result<PeerLink> {
    let accept = TlsAcceptor::from(config.clone()).accept(stream);
    let stream = tokio::time::timeout(timeout, accept)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
    Ok(PeerLink::Tls(Box::new(TlsStream::Server(stream))))
}

/// A segment as midway-relay's stream relay takes it: aborting resets it (a TCP reset under
/// TLS, so the other midway sees a reset and not a clean end: a TLS close_notify is only ever
/// sent by a clean half-close; RESET_STREAM and STOP_SENDING on a QUIC stream), and the TCP
/// socket underneath, where there is one, gets its final tcp_info read at close.
impl midway_relay::PeerStream for PeerLink {
    fn abort(self) {
        self.reset();
    }

    fn socket(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.tcp().map(|tcp| tcp.as_fd())
    }
}

impl AsyncRead for PeerLink {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerLink::Tcp(stream) => Pin::new(stream).poll_read(cx, buf),
            PeerLink::Tls(stream) => Pin::new(&mut **stream).poll_read(cx, buf),
            PeerLink::Quic(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for PeerLink {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            PeerLink::Tcp(stream) => Pin::new(stream).poll_write(cx, buf),
            PeerLink::Tls(stream) => Pin::new(&mut **stream).poll_write(cx, buf),
            PeerLink::Quic(stream) => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerLink::Tcp(stream) => Pin::new(stream).poll_flush(cx),
            PeerLink::Tls(stream) => Pin::new(&mut **stream).poll_flush(cx),
            PeerLink::Quic(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            PeerLink::Tcp(stream) => Pin::new(stream).poll_shutdown(cx),
            PeerLink::Tls(stream) => Pin::new(&mut **stream).poll_shutdown(cx),
            PeerLink::Quic(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }
}
