//! Real rustls handshakes over loopback TCP with tokio-rustls, each bounded by a timeout.
//!
//! The exchange lets the server speak first, so that a client whose certificate the server
//! refused has sent nothing after its handshake and reads the server's alert (not a reset).

use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::{ClientConfig, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::provider;
use crate::verify::PinnedPeers;
use crate::*;

/// Bound on each test's whole exchange.
const TEST_TIMEOUT: Duration = Duration::from_secs(20);

/// What each side got: the fingerprint of the peer's certificate, or its error.
struct Outcome {
    client: io::Result<Fingerprint>,
    server: io::Result<Fingerprint>,
}

/// The fingerprint of the peer certificate of a connection.
fn peer_fingerprint<D>(conn: &rustls::ConnectionCommon<D>) -> Fingerprint {
    let certs = conn.peer_certificates().unwrap();
    assert_eq!(certs.len(), 1);
    Fingerprint::of_certificate(&certs[0]).unwrap()
}

/// Runs a TLS server with `server` and a client with `client` over loopback: the server
/// writes "world", the client reads it and writes "hello", the server reads it, both close.
async fn exchange(client: Arc<ClientConfig>, server: Arc<ServerConfig>) -> Outcome {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server_side = async move {
        let (tcp, _) = listener.accept().await?;
        let mut tls = TlsAcceptor::from(server).accept(tcp).await?;
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(ALPN));
        let peer = peer_fingerprint(tls.get_ref().1);
        tls.write_all(b"world").await?;
        tls.flush().await?;
        let mut buf = [0u8; 5];
        tls.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"hello");
        tls.shutdown().await?;
        Ok(peer)
    };
    let client_side = async move {
        let tcp = TcpStream::connect(addr).await?;
        let mut tls = TlsConnector::from(client)
            .connect(server_name(), tcp)
            .await?;
        let peer = peer_fingerprint(tls.get_ref().1);
        let mut buf = [0u8; 5];
        tls.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"world");
        tls.write_all(b"hello").await?;
        tls.flush().await?;
        let mut rest = Vec::new();
        tls.read_to_end(&mut rest).await?;
        assert!(rest.is_empty());
        Ok(peer)
    };
    let (client, server) = tokio::time::timeout(TEST_TIMEOUT, async {
        tokio::join!(client_side, server_side)
    })
    .await
    .expect("the exchange timed out");
    Outcome { client, server }
}

/// A fresh identity valid for a day.
fn identity(name: &str) -> Identity {
    generate_identity(name, Duration::from_secs(86_400))
        .unwrap()
        .identity()
        .unwrap()
}

/// An identity whose certificate expired yesterday.
fn expired_identity(name: &str) -> Identity {
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let generated = generate_identity_with_validity(name, now - 10 * day, now - day).unwrap();
    assert!(matches!(
        generated.identity(),
        Err(TlsError::Expired { .. })
    ));
    Identity::from_pem_at(&generated.cert_pem, &generated.key_pem, now - 2 * day).unwrap()
}

/// The error a side got, with its refusal reason.
fn refused(side: &io::Result<Fingerprint>, which: &str) -> (&'static str, String) {
    match side {
        Ok(peer) => panic!("the {which} accepted peer {peer}"),
        Err(err) => (refusal_reason(err), err.to_string()),
    }
}

#[tokio::test]
async fn pinned_both_ways_handshake_and_data_flow() {
    let (edge, gateway) = (identity("edge"), identity("gateway"));
    let outcome = exchange(
        client_config(&edge, vec![gateway.fingerprint()]).unwrap(),
        server_config(
            &gateway,
            vec![identity("third").fingerprint(), edge.fingerprint()],
        )
        .unwrap(),
    )
    .await;
    assert_eq!(outcome.client.unwrap(), gateway.fingerprint());
    assert_eq!(outcome.server.unwrap(), edge.fingerprint());
}

#[tokio::test]
async fn client_refuses_unknown_server_key() {
    let (edge, gateway, other) = (identity("edge"), identity("gateway"), identity("other"));
    let outcome = exchange(
        client_config(&edge, vec![other.fingerprint()]).unwrap(),
        server_config(&gateway, vec![edge.fingerprint()]).unwrap(),
    )
    .await;
    let (reason, message) = refused(&outcome.client, "client");
    assert_eq!(reason, "unknown_peer", "{message}");
    assert!(
        message.contains(&gateway.fingerprint().to_string()),
        "{message}"
    );
    let err = outcome.client.as_ref().unwrap_err();
    assert_eq!(unknown_peer_fingerprint(err), Some(gateway.fingerprint()));
    let (reason, message) = refused(&outcome.server, "server");
    assert_eq!(reason, "rejected_by_peer", "{message}");
}

#[tokio::test]
async fn server_refuses_unknown_client_key() {
    let (edge, gateway, other) = (identity("edge"), identity("gateway"), identity("other"));
    let outcome = exchange(
        client_config(&edge, vec![gateway.fingerprint()]).unwrap(),
        server_config(&gateway, vec![other.fingerprint()]).unwrap(),
    )
    .await;
    let (reason, message) = refused(&outcome.server, "server");
    assert_eq!(reason, "unknown_peer", "{message}");
    assert_eq!(
        unknown_peer_fingerprint(outcome.server.as_ref().unwrap_err()),
        Some(edge.fingerprint())
    );
    // TLS 1.3: the client's handshake completed; the refusal shows at its first read.
    let (reason, message) = refused(&outcome.client, "client");
    assert_eq!(reason, "rejected_by_peer", "{message}");
}

#[tokio::test]
async fn expired_server_certificate_refused() {
    let (edge, gateway) = (identity("edge"), expired_identity("gateway"));
    let outcome = exchange(
        client_config(&edge, vec![gateway.fingerprint()]).unwrap(),
        server_config(&gateway, vec![edge.fingerprint()]).unwrap(),
    )
    .await;
    let (reason, message) = refused(&outcome.client, "client");
    assert_eq!(reason, "expired", "{message}");
    assert!(message.contains("expired"), "{message}");
    let (reason, message) = refused(&outcome.server, "server");
    assert_eq!(reason, "expired_at_peer", "{message}");
}

#[tokio::test]
async fn expired_client_certificate_refused() {
    let (edge, gateway) = (expired_identity("edge"), identity("gateway"));
    let outcome = exchange(
        client_config(&edge, vec![gateway.fingerprint()]).unwrap(),
        server_config(&gateway, vec![edge.fingerprint()]).unwrap(),
    )
    .await;
    let (reason, message) = refused(&outcome.server, "server");
    assert_eq!(reason, "expired", "{message}");
    let (reason, message) = refused(&outcome.client, "client");
    assert_eq!(reason, "expired_at_peer", "{message}");
}

#[tokio::test]
async fn client_without_certificate_refused() {
    let (edge, gateway) = (identity("edge"), identity("gateway"));
    let mut anonymous = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedPeers::new(
            vec![gateway.fingerprint()],
            provider(),
        )))
        .with_no_client_auth();
    anonymous.alpn_protocols = vec![ALPN.to_vec()];
    let outcome = exchange(
        Arc::new(anonymous),
        server_config(&gateway, vec![edge.fingerprint()]).unwrap(),
    )
    .await;
    let (reason, message) = refused(&outcome.server, "server");
    assert_eq!(reason, "no_certificate", "{message}");
    let (reason, message) = refused(&outcome.client, "client");
    assert_eq!(reason, "no_certificate", "{message}");
}

#[tokio::test]
async fn other_alpn_refused() {
    let (edge, gateway) = (identity("edge"), identity("gateway"));
    let mut client = (*client_config(&edge, vec![gateway.fingerprint()]).unwrap()).clone();
    client.alpn_protocols = vec![b"h2".to_vec()];
    let outcome = exchange(
        Arc::new(client),
        server_config(&gateway, vec![edge.fingerprint()]).unwrap(),
    )
    .await;
    let (reason, message) = refused(&outcome.server, "server");
    assert_eq!(reason, "alpn_mismatch", "{message}");
    let (reason, message) = refused(&outcome.client, "client");
    assert_eq!(reason, "alpn_mismatch", "{message}");
}

#[tokio::test]
async fn plain_tcp_client_refused_as_not_tls() {
    let (edge, gateway) = (identity("edge"), identity("gateway"));
    let acceptor = TlsAcceptor::from(server_config(&gateway, vec![edge.fingerprint()]).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let run = async move {
        let client = async move {
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            tcp.write_all(b"GET / HTTP/1.1\r\nHost: midway\r\n\r\n")
                .await
                .unwrap();
            let mut answer = Vec::new();
            let _ = tcp.read_to_end(&mut answer).await;
        };
        let server = async move {
            let (tcp, _) = listener.accept().await.unwrap();
            acceptor.accept(tcp).await
        };
        tokio::join!(client, server).1
    };
    let err = tokio::time::timeout(TEST_TIMEOUT, run)
        .await
        .expect("timed out")
        .unwrap_err();
    assert_eq!(refusal_reason(&err), "not_tls", "{err}");
}

#[test]
fn server_name_is_valid_and_configs_need_peers() {
    assert_eq!(server_name().to_str(), SERVER_NAME);
    let edge = identity("edge");
    assert!(matches!(
        client_config(&edge, Vec::new()),
        Err(TlsError::NoPeers)
    ));
    assert!(matches!(
        server_config(&edge, Vec::new()),
        Err(TlsError::NoPeers)
    ));
    let message = TlsError::NoPeers.to_string();
    assert!(message.contains("no peer fingerprints"), "{message}");
}
