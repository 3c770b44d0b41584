//! A tunnel on loopback, both ends real quinn endpoints with midway-tls's pinned configs: bytes
//! both ways, FIN per direction, a reset carried, a dropped stream read as a reset, an unknown
//! key refused at the handshake with the right reason on both sides, many streams on one
//! connection, and a new connection after the first one closed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use midway_quic::{
    accept_handshake, bind_udp, client_config, server_config, server_endpoint, Endpoint, QuicError,
    QuicPeer, Tunnel, TunnelSettings,
};
use midway_relay::PeerStream;
use midway_tls::{generate_identity, GeneratedIdentity};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TIMEOUT: Duration = Duration::from_secs(10);

fn identity(name: &str) -> GeneratedIdentity {
    generate_identity(name, Duration::from_secs(3600)).unwrap()
}

/// A gateway endpoint on loopback accepting `allowed`, handing every accepted stream to
/// `serve`.
fn gateway<F, Fut>(me: &GeneratedIdentity, allowed: &GeneratedIdentity, serve: F) -> SocketAddr
where
    F: Fn(QuicPeer) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let tls =
        midway_tls::server_config(&me.identity().unwrap(), vec![allowed.fingerprint]).unwrap();
    let config = server_config(tls, &TunnelSettings::default()).unwrap();
    let endpoint = server_endpoint(
        bind_udp("127.0.0.1:0".parse().unwrap(), false).unwrap(),
        config,
    )
    .unwrap();
    let addr = endpoint.local_addr().unwrap();
    let serve = Arc::new(serve);
    tokio::spawn(accept_all(endpoint, serve));
    addr
}

async fn accept_all<F, Fut>(endpoint: Endpoint, serve: Arc<F>)
where
    F: Fn(QuicPeer) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    while let Some(incoming) = endpoint.accept().await {
        let serve = serve.clone();
        tokio::spawn(async move {
            let Ok(connection) = accept_handshake(incoming, TIMEOUT).await else {
                return;
            };
            while let Ok((send, recv)) = connection.accept_bi().await {
                tokio::spawn(serve(QuicPeer::new(send, recv)));
            }
        });
    }
}

fn tunnel(me: &GeneratedIdentity, pinned: &GeneratedIdentity, addr: SocketAddr) -> Tunnel {
    let tls = midway_tls::client_config(&me.identity().unwrap(), vec![pinned.fingerprint]).unwrap();
    let config = client_config(tls, &TunnelSettings::default()).unwrap();
    Tunnel::new(addr.to_string(), config, Duration::from_secs(3))
}

/// Echoes everything, then ends its direction after the client ended its own.
async fn echo(mut stream: QuicPeer) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                if stream.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            Err(_) => return,
        }
    }
    let _ = stream.shutdown().await;
    // Keep the stream until the client has read the FIN (dropping after shutdown is clean).
}

#[tokio::test]
async fn bytes_both_ways_and_fin_per_direction() {
    let (edge, gw) = (identity("edge"), identity("gateway"));
    let addr = gateway(&gw, &edge, echo);
    let tunnel = tunnel(&edge, &gw, addr);
    let mut stream = tunnel.open().await.unwrap();
    let data: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let (mut read_half, mut write_half) = tokio::io::split(stream);
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        write_half.write_all(&sent).await.unwrap();
        write_half.shutdown().await.unwrap();
        write_half
    });
    let mut back = Vec::new();
    tokio::time::timeout(TIMEOUT, read_half.read_to_end(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data, "echoed bytes differ");
    stream = read_half.unsplit(writer.await.unwrap());
    drop(stream);
    let stats = tunnel.stats();
    assert!(stats.up);
    assert_eq!(stats.connections, 1);
    assert_eq!(stats.streams_open, 0);
    assert!(stats.cwnd > 0 && stats.rtt > Duration::ZERO);
}

#[tokio::test]
async fn abort_is_a_reset_at_the_other_end_and_drop_without_shutdown_too() {
    let (edge, gw) = (identity("edge"), identity("gateway"));
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let addr = gateway(&gw, &edge, move |mut stream: QuicPeer| {
        let seen = seen_tx.clone();
        async move {
            let mut buf = vec![0; 1024];
            let mut total = 0;
            let end = loop {
                match stream.read(&mut buf).await {
                    Ok(0) => break Ok(total),
                    Ok(n) => total += n,
                    Err(err) => break Err(err.kind()),
                }
            };
            seen.send(end).unwrap();
        }
    });
    let tunnel = tunnel(&edge, &gw, addr);

    let mut aborted = tunnel.open().await.unwrap();
    aborted.write_all(b"some bytes").await.unwrap();
    aborted.abort();
    let end = tokio::time::timeout(TIMEOUT, seen_rx.recv()).await.unwrap();
    assert_eq!(end, Some(Err(ErrorKind::ConnectionReset)));

    // quinn would finish a dropped send stream; QuicPeer resets it instead.
    let mut dropped = tunnel.open().await.unwrap();
    dropped.write_all(b"more bytes").await.unwrap();
    drop(dropped);
    let end = tokio::time::timeout(TIMEOUT, seen_rx.recv()).await.unwrap();
    assert_eq!(end, Some(Err(ErrorKind::ConnectionReset)));

    let mut clean = tunnel.open().await.unwrap();
    clean.write_all(b"twelve bytes").await.unwrap();
    clean.shutdown().await.unwrap();
    let end = tokio::time::timeout(TIMEOUT, seen_rx.recv()).await.unwrap();
    assert_eq!(end, Some(Ok(12)));
    assert_eq!(tunnel.stats().connections, 1, "all on one connection");
}

#[tokio::test]
async fn a_thousand_streams_share_one_connection() {
    let (edge, gw) = (identity("edge"), identity("gateway"));
    let addr = gateway(&gw, &edge, echo);
    let tunnel = Arc::new(tunnel(&edge, &gw, addr));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000u32 {
        let tunnel = tunnel.clone();
        tasks.spawn(async move {
            let mut stream = tunnel.open().await.unwrap();
            let message = i.to_be_bytes();
            stream.write_all(&message).await.unwrap();
            stream.shutdown().await.unwrap();
            let mut back = Vec::new();
            stream.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, message);
        });
    }
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
    })
    .await
    .unwrap();
    assert_eq!(tunnel.stats().connections, 1);
}

#[tokio::test]
async fn unknown_keys_are_refused_at_the_handshake_on_both_sides() {
    let (edge, gw, stranger) = (identity("edge"), identity("gateway"), identity("stranger"));
    let addr = gateway(&gw, &edge, echo);

    // The gateway does not know the stranger's key: the stranger learns it was rejected.
    let refused = tunnel(&stranger, &gw, addr).open().await.err().unwrap();
    assert!(
        matches!(refused, QuicError::Handshake { .. }),
        "{refused:?}"
    );
    assert_eq!(refused.reason(), "rejected_by_peer", "{refused}");
    assert!(!refused.is_unreachable());

    // The edge pins a key the gateway does not have: refused here.
    let wrong_pin = tunnel(&edge, &stranger, addr).open().await.err().unwrap();
    assert_eq!(wrong_pin.reason(), "unknown_peer", "{wrong_pin}");
}

#[tokio::test]
async fn silence_is_a_handshake_timeout_and_unreachable() {
    let (edge, gw) = (identity("edge"), identity("gateway"));
    // A bound UDP socket that never answers.
    let silent = bind_udp("127.0.0.1:0".parse().unwrap(), false).unwrap();
    let addr = silent.local_addr().unwrap();
    let started = std::time::Instant::now();
    let err = tunnel(&edge, &gw, addr).open().await.err().unwrap();
    assert!(matches!(err, QuicError::HandshakeTimeout { .. }), "{err:?}");
    assert!(err.is_unreachable());
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_closed_connection_is_replaced_on_the_next_open() {
    let (edge, gw) = (identity("edge"), identity("gateway"));
    let addr = gateway(&gw, &edge, echo);
    let tunnel = tunnel(&edge, &gw, addr);
    let first = tunnel.connection().await.unwrap();
    first.close(midway_quic::CLOSED_BY_MIDWAY, b"test");
    let mut stream = tunnel.open().await.unwrap();
    stream.write_all(b"x").await.unwrap();
    stream.shutdown().await.unwrap();
    let mut back = Vec::new();
    tokio::time::timeout(TIMEOUT, stream.read_to_end(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, b"x");
    assert_eq!(tunnel.stats().connections, 2);
}

/// A tunnel that lives long opens many more streams than its stream limit over its life: quinn
/// gives credit back as streams close, so stream ids never run out.
#[tokio::test]
async fn streams_far_past_the_stream_limit_over_one_tunnel() {
    let (edge, gw) = (identity("edge"), identity("gateway"));
    let settings = TunnelSettings {
        max_streams: 8,
        ..TunnelSettings::default()
    };
    let tls = midway_tls::server_config(&gw.identity().unwrap(), vec![edge.fingerprint]).unwrap();
    let endpoint = server_endpoint(
        bind_udp("127.0.0.1:0".parse().unwrap(), false).unwrap(),
        server_config(tls, &settings).unwrap(),
    )
    .unwrap();
    let addr = endpoint.local_addr().unwrap();
    tokio::spawn(accept_all(endpoint, Arc::new(echo)));
    let tunnel = tunnel(&edge, &gw, addr);
    tokio::time::timeout(Duration::from_secs(60), async {
        for i in 0..2_000u32 {
            let mut stream = tunnel.open().await.unwrap();
            stream.write_all(&i.to_be_bytes()).await.unwrap();
            stream.shutdown().await.unwrap();
            let mut back = Vec::new();
            stream.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, i.to_be_bytes());
        }
    })
    .await
    .unwrap();
    let stats = tunnel.stats();
    assert_eq!(stats.connections, 1);
    assert_eq!(stats.streams_open, 0);
}
