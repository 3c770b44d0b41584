//! PROXY protocol v2 on loopback, against HAProxy in both directions and against a server that
//! parses the header itself (with `ppp`):
//! - midway sends: a forward listener with `proxy_protocol = "v2"` → a server that reads the
//!   header; and → HAProxy (`accept-proxy`) → HAProxy's `send-proxy-v2` → that server, which
//!   then sees the client and destination midway named.
//! - midway accepts: HAProxy (`send-proxy-v2`) → a listener with `accept_proxy_protocol` →
//!   the header-reading server: the header's client is the client (`allowed_clients` applies
//!   to it, and it is the one midway names onward); unlisted sources' bytes are not read as a
//!   header; a listed source's garbage or truncated header is reset and counted.
//! - the other listeners: SOCKS5 names the requested destination, a transparent listener (in
//!   namespaces, as root) the client and the original destination, an HTTP listener judges the
//!   header's client, and through an edge and a gateway only the gateway sends the header.
//!
//! Clients connect from distinct loopback addresses (127.0.0.2, .3, .4) so that each has an
//! identity of its own.

// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;

use midway_testkit::host::on_path;
use midway_testkit::metrics::*;
use midway_testkit::net::WAIT;
use midway_testkit::proxy::*;
use midway_testkit::wait::{eventually_async, within};

/// What the header-reading server saw on one connection.
#[derive(Debug)]
struct SeenHeader {
    /// The header's source and destination (`None`: a LOCAL or UNSPEC header).
    addresses: Option<(SocketAddr, SocketAddr)>,
    /// The connection's real source (midway's or HAProxy's socket).
    from: SocketAddr,
}

/// A server whose every connection must start with a PROXY v2 header: it reports the header and
/// then echoes what follows (a connection without a valid header is closed).
async fn header_server() -> (SocketAddr, mpsc::UnboundedReceiver<SeenHeader>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, receiver) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, from)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let Some(addresses) = read_v2_header(&mut stream).await else {
                    return;
                };
                let _ = seen.send(SeenHeader { addresses, from });
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    (addr, receiver)
}

/// Reads one v2 header with `ppp`: `Some(None)` for a header without addresses.
async fn read_v2_header(stream: &mut TcpStream) -> Option<Option<(SocketAddr, SocketAddr)>> {
    let mut bytes = vec![0; 16];
    stream.read_exact(&mut bytes).await.ok()?;
    let len = usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
    bytes.resize(16 + len, 0);
    stream.read_exact(&mut bytes[16..]).await.ok()?;
    let header = ppp::v2::Header::try_from(bytes.as_slice()).ok()?;
    Some(match header.addresses {
        ppp::v2::Addresses::IPv4(a) => Some((
            SocketAddr::from((a.source_address, a.source_port)),
            SocketAddr::from((a.destination_address, a.destination_port)),
        )),
        ppp::v2::Addresses::IPv6(a) => Some((
            SocketAddr::from((a.source_address, a.source_port)),
            SocketAddr::from((a.destination_address, a.destination_port)),
        )),
        _ => None,
    })
}

/// A client connected to `to` from the loopback address `from` (any port).
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    within(WAIT, socket.connect(to)).await.unwrap()
}

/// Sends `message` and expects it back.
async fn echoes(stream: &mut TcpStream, message: &[u8]) {
    stream.write_all(message).await.unwrap();
    let mut back = vec![0; message.len()];
    within(WAIT, stream.read_exact(&mut back)).await.unwrap();
    assert_eq!(back, message);
}

/// True when the other end closes or resets without sending anything.
async fn closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0; 64];
    !matches!(within(WAIT, stream.read(&mut buf)).await, Ok(n) if n > 0)
}

async fn next_header(headers: &mut mpsc::UnboundedReceiver<SeenHeader>) -> SeenHeader {
    within(WAIT, headers.recv()).await.expect("server running")
}

/// HAProxy in the foreground with `config`, killed when dropped.
struct Haproxy {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port free now (HAProxy's `bind` takes a number; the short window in which
/// another process could take it is harmless on a test machine).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether something listens on 127.0.0.1:`port` (read from /proc, so that checking does not
/// open a connection that HAProxy would pass on).
fn listening(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!("0100007F:{port:04X}");
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A")
    })
}

/// Starts HAProxy in TCP mode: a frontend on a free loopback port (`bind_options` after it)
/// whose one server line is `server`. Returns it and the frontend's address.
async fn haproxy(bind_options: &str, server: &str) -> (Haproxy, SocketAddr) {
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    // `retries 0`: midway resets a refused client's connection right after reading its
    // header, and HAProxy may take that reset for a failed connect and try again, which would
    // count one refusal twice.
    let config = format!(
        "defaults\n  mode tcp\n  retries 0\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\n\
         frontend front\n  bind 127.0.0.1:{port} {bind_options}\n  default_backend back\n\
         backend back\n  {server}\n"
    );
    let path = dir.path().join("haproxy.cfg");
    std::fs::write(&path, config).unwrap();
    let child = Command::new("haproxy")
        .args(["-db", "-f"])
        .arg(Path::new(&path))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("haproxy starts");
    let mut haproxy = Haproxy { child, _dir: dir };
    let up = eventually_async(WAIT, || async { listening(port) }).await;
    if !up {
        let status = haproxy.child.try_wait().unwrap();
        panic!("haproxy did not listen on port {port} (exited: {status:?})");
    }
    (haproxy, SocketAddr::from(([127, 0, 0, 1], port)))
}

fn have_haproxy() -> bool {
    if on_path("haproxy") {
        return true;
    }
    eprintln!("skipped: haproxy is not installed (scripts/install-deps)");
    false
}

fn forward_config(name: &str, target: SocketAddr, allowed: &str, listener_extra: &str) -> String {
    format!(
        r#"
[proxy]
allowed_clients = [{allowed}]
connect_timeout = "5s"
handshake_timeout = "10s"
shutdown_grace = "1s"
[metrics]
listen = "127.0.0.1:0"
[spool]
dir = "SPOOL_DIR"
[[listeners]]
name = "{name}"
mode = "forward"
listen = "127.0.0.1:0"
target = "{target}"
proxy_protocol = "v2"
{listener_extra}
"#
    )
}

/// Polls the metrics until `series` reaches `want`.
async fn metric_reaches(metrics: SocketAddr, series: &str, want: f64) {
    let reached = eventually_async(WAIT, || async move {
        metric(&scrape(metrics).await, series) == Some(want)
    })
    .await;
    assert!(
        reached,
        "{series} never reached {want}:\n{}",
        scrape(metrics).await
    );
}

#[tokio::test]
async fn midway_sends_v2_to_a_server_that_reads_it() {
    let (server, mut headers) = header_server().await;
    let proxy = start(&forward_config("pp", server, "\"127.0.0.0/8\"", "")).await;
    let mut client = connect_from("127.0.0.2", proxy.addr("pp")).await;
    echoes(&mut client, b"hello through midway").await;
    let seen = next_header(&mut headers).await;
    // The client as midway saw it, and the destination midway connected to.
    assert_eq!(
        seen.addresses,
        Some((client.local_addr().unwrap(), server)),
        "header from {}",
        seen.from
    );
    drop(client);
    proxy.stop().await;
}

#[tokio::test]
async fn midway_sends_v2_that_haproxy_accepts_and_passes_on() {
    if !have_haproxy() {
        return;
    }
    let (server, mut headers) = header_server().await;
    let (_haproxy, front) =
        haproxy("accept-proxy", &format!("server s {server} send-proxy-v2")).await;
    let proxy = start(&forward_config("pp", front, "\"127.0.0.0/8\"", "")).await;
    let mut client = connect_from("127.0.0.2", proxy.addr("pp")).await;
    echoes(&mut client, b"hello through midway and haproxy").await;
    let seen = next_header(&mut headers).await;
    // HAProxy took the client and the destination from midway's header: its own header
    // names them, not midway's socket.
    assert_eq!(seen.addresses, Some((client.local_addr().unwrap(), front)));
    assert_ne!(seen.from, client.local_addr().unwrap());
    drop(client);
    proxy.stop().await;
}

#[tokio::test]
async fn midway_behind_haproxy_takes_the_client_from_its_header() {
    if !have_haproxy() {
        return;
    }
    let (server, mut headers) = header_server().await;
    // The load balancer is 127.0.0.1; clients .2 (and the balancer itself, for LOCAL headers)
    // are allowed, .3 and .4 are not.
    let config = forward_config(
        "lb",
        server,
        "\"127.0.0.1/32\", \"127.0.0.2/32\"",
        "accept_proxy_protocol = [\"127.0.0.1/32\"]",
    );
    let proxy = start(&config).await;
    let metrics = proxy.metrics.unwrap();
    let midway = proxy.addr("lb");
    let (_haproxy, front) = haproxy("", &format!("server s {midway} send-proxy-v2")).await;

    // An allowed client through HAProxy: midway names it onward, with the address it connected
    // to at HAProxy (the original destination, carried).
    let mut client = connect_from("127.0.0.2", front).await;
    echoes(&mut client, b"hello from behind the balancer").await;
    let seen = next_header(&mut headers).await;
    assert_eq!(seen.addresses, Some((client.local_addr().unwrap(), front)));
    drop(client);

    // A client the header names but allowed_clients does not: refused like one that connects.
    let mut refused = connect_from("127.0.0.3", front).await;
    let _ = refused.write_all(b"let me in").await;
    assert!(
        closed(&mut refused).await,
        "a client outside allowed_clients was relayed"
    );
    let not_allowed = "midway_connections_refused_total{listener=\"lb\",reason=\"not_allowed\"}";
    metric_reaches(metrics, not_allowed, 1.0).await;

    // An unlisted source is an ordinary client: a header it sends naming an allowed client
    // makes it nothing (.4 is refused at accept) ...
    let forged = v2_header("127.0.0.2:1000", "127.0.0.1:80");
    let mut forger = connect_from("127.0.0.4", midway).await;
    let _ = forger.write_all(&forged).await;
    assert!(closed(&mut forger).await, "a forged header let a client in");
    metric_reaches(metrics, not_allowed, 2.0).await;
    // ... and from an allowed unlisted source it is data, relayed as sent.
    let mut direct = connect_from("127.0.0.2", midway).await;
    echoes(&mut direct, &forged).await;
    let seen = next_header(&mut headers).await;
    assert_eq!(seen.addresses, Some((direct.local_addr().unwrap(), server)));
    drop(direct);

    // The listed source: a LOCAL header (a health check) keeps the real addresses.
    let mut local = connect_from("127.0.0.1", midway).await;
    let mut header = ppp::v2::PROTOCOL_PREFIX.to_vec();
    header.extend_from_slice(&[0x20, 0x00, 0, 0]);
    local.write_all(&header).await.unwrap();
    echoes(&mut local, b"health check").await;
    let seen = next_header(&mut headers).await;
    assert_eq!(seen.addresses, Some((local.local_addr().unwrap(), server)));
    drop(local);

    // Garbage and a truncated header from the listed source: reset, counted by reason.
    let mut garbage = connect_from("127.0.0.1", midway).await;
    garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    assert!(closed(&mut garbage).await);
    metric_reaches(
        metrics,
        "midway_connections_refused_total{listener=\"lb\",reason=\"proxy_header_malformed\"}",
        1.0,
    )
    .await;
    let mut truncated = connect_from("127.0.0.1", midway).await;
    truncated.write_all(&forged[..20]).await.unwrap();
    truncated.shutdown().await.unwrap();
    assert!(closed(&mut truncated).await);
    metric_reaches(
        metrics,
        "midway_connections_refused_total{listener=\"lb\",reason=\"proxy_header_truncated\"}",
        1.0,
    )
    .await;
    // Nothing of the refused connections reached the server.
    assert!(headers.try_recv().is_err());
    proxy.stop().await;
}

/// A v2 PROXY header naming `client` and `destination` (the test's own, built with `ppp`).
fn v2_header(client: &str, destination: &str) -> Vec<u8> {
    let client: SocketAddr = client.parse().unwrap();
    let destination: SocketAddr = destination.parse().unwrap();
    ppp::v2::Builder::with_addresses(
        ppp::v2::Version::Two | ppp::v2::Command::Proxy,
        ppp::v2::Protocol::Stream,
        (client, destination),
    )
    .build()
    .unwrap()
}

#[tokio::test]
async fn a_socks5_listener_names_the_requested_destination() {
    let (server, mut headers) = header_server().await;
    let config = r#"
[proxy]
allowed_clients = ["127.0.0.0/8"]
denied_destinations = []
shutdown_grace = "1s"
[spool]
dir = "SPOOL_DIR"
[[listeners]]
name = "socks"
mode = "socks5"
listen = "127.0.0.1:0"
proxy_protocol = "v2"
"#;
    let proxy = start(config).await;
    let mut client = connect_from("127.0.0.2", proxy.addr("socks")).await;
    client.write_all(&[5, 1, 0]).await.unwrap();
    let mut method = [0; 2];
    within(WAIT, client.read_exact(&mut method)).await.unwrap();
    assert_eq!(method, [5, 0]);
    let SocketAddr::V4(v4) = server else {
        unreachable!("the server listens on 127.0.0.1")
    };
    let mut request = vec![5, 1, 0, 1];
    request.extend_from_slice(&v4.ip().octets());
    request.extend_from_slice(&v4.port().to_be_bytes());
    client.write_all(&request).await.unwrap();
    // Succeeded, with an IPv4 bound address: 10 bytes.
    let mut reply = [0; 10];
    within(WAIT, client.read_exact(&mut reply)).await.unwrap();
    assert_eq!(reply[1], 0, "SOCKS5 reply {reply:?}");
    echoes(&mut client, b"hello through socks").await;
    let seen = next_header(&mut headers).await;
    assert_eq!(seen.addresses, Some((client.local_addr().unwrap(), server)));
    drop(client);
    proxy.stop().await;
}

/// An edge sending through a gateway: the edge writes no PROXY header toward the gateway (the
/// peer header carries the client; a PROXY header there would be refused as a bad peer
/// header), and the gateway's peer listener names the edge's client to the server.
#[tokio::test]
async fn through_a_gateway_only_the_gateway_sends_the_header() {
    const KEY_HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    let (server, mut headers) = header_server().await;
    let common = format!(
        "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\ndenied_destinations = []\n\
         shutdown_grace = \"1s\"\n[spool]\ndir = \"SPOOL_DIR\"\n[keys.k]\nsecret = \"{KEY_HEX}\"\n"
    );
    let gateway = start(&format!(
        "{common}[[listeners]]\nname = \"gw\"\nmode = \"peer\"\nlisten = \"127.0.0.1:0\"\n\
         keys = [\"k\"]\nproxy_protocol = \"v2\"\n"
    ))
    .await;
    let edge = start(&format!(
        "{common}[[peers]]\nname = \"gw\"\naddress = \"{}\"\nkey = \"k\"\nwarm_connections = 0\n\
         [[listeners]]\nname = \"edge\"\nmode = \"forward\"\nlisten = \"127.0.0.1:0\"\n\
         target = \"{server}\"\nvia = [\"gw\"]\nproxy_protocol = \"v2\"\n",
        gateway.addr("gw")
    ))
    .await;
    let mut client = connect_from("127.0.0.2", edge.addr("edge")).await;
    echoes(&mut client, b"hello through two midways").await;
    let seen = next_header(&mut headers).await;
    assert_eq!(seen.addresses, Some((client.local_addr().unwrap(), server)));
    drop(client);
    edge.stop().await;
    gateway.stop().await;
}

/// An HTTP listener behind a balancer: the header's client is the one `allowed_clients` judges
/// (the balancer itself is not allowed here).
#[tokio::test]
async fn an_http_listener_takes_the_client_from_the_header() {
    let origin = midway_testkit::net::PageOrigin::serve(
        std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_string(),
        WAIT,
    );
    let origin_addr = origin.addr;
    let config = r#"
[proxy]
allowed_clients = ["127.0.0.2/32"]
denied_destinations = []
shutdown_grace = "1s"
[spool]
dir = "SPOOL_DIR"
[[listeners]]
name = "web"
mode = "http"
listen = "127.0.0.1:0"
accept_proxy_protocol = ["127.0.0.1/32"]
"#;
    let proxy = start(config).await;
    let request = format!("GET http://{origin_addr}/ HTTP/1.1\r\nhost: {origin_addr}\r\n\r\n");

    let mut allowed = connect_from("127.0.0.1", proxy.addr("web")).await;
    allowed
        .write_all(&v2_header("127.0.0.2:4000", "127.0.0.1:80"))
        .await
        .unwrap();
    allowed.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let mut buf = [0; 1024];
    let complete = |response: &[u8]| response.ends_with(b"ok");
    // Bounded: a response of a few hundred bytes, each read at least one.
    for _ in 0..1024 {
        if complete(&response) {
            break;
        }
        let n = within(WAIT, allowed.read(&mut buf)).await.unwrap();
        assert!(n > 0, "closed before the response: {response:?}");
        response.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");

    let mut refused = connect_from("127.0.0.1", proxy.addr("web")).await;
    refused
        .write_all(&v2_header("127.0.0.3:4000", "127.0.0.1:80"))
        .await
        .unwrap();
    let _ = refused.write_all(request.as_bytes()).await;
    assert!(
        closed(&mut refused).await,
        "a client outside allowed_clients was served"
    );
    drop(allowed);
    proxy.stop().await;
}

/// HAProxy's text header (`send-proxy`, v1) is accepted as well.
#[tokio::test]
async fn midway_behind_haproxy_sending_v1() {
    if !have_haproxy() {
        return;
    }
    let (server, mut headers) = header_server().await;
    let config = forward_config(
        "lb",
        server,
        "\"127.0.0.2/32\"",
        "accept_proxy_protocol = [\"127.0.0.1/32\"]",
    );
    let proxy = start(&config).await;
    let midway = proxy.addr("lb");
    let (_haproxy, front) = haproxy("", &format!("server s {midway} send-proxy")).await;
    let mut client = connect_from("127.0.0.2", front).await;
    echoes(&mut client, b"hello over a v1 header").await;
    let seen = next_header(&mut headers).await;
    assert_eq!(seen.addresses, Some((client.local_addr().unwrap(), front)));
    drop(client);
    proxy.stop().await;
}

/// A blocking server in namespace `ns` on `addrs`, one connection each (in order): reports the
/// header's addresses, then echoes.
fn header_server_in(
    ns: &str,
    addrs: Vec<SocketAddr>,
) -> (
    std::sync::mpsc::Receiver<Option<(SocketAddr, SocketAddr)>>,
    std::thread::JoinHandle<()>,
) {
    use std::io::{Read, Write};
    let (seen, receiver) = std::sync::mpsc::channel();
    let (ready, is_ready) = std::sync::mpsc::channel();
    let handle = midway_testkit::netns::in_netns(ns, move || {
        let listeners: Vec<std::net::TcpListener> = addrs
            .iter()
            .map(|addr| std::net::TcpListener::bind(addr).unwrap())
            .collect();
        ready.send(()).unwrap();
        for listener in listeners {
            let (mut stream, _) = listener.accept().unwrap();
            stream.set_read_timeout(Some(WAIT)).unwrap();
            let mut bytes = vec![0; 16];
            stream.read_exact(&mut bytes).unwrap();
            let len = usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
            bytes.resize(16 + len, 0);
            stream.read_exact(&mut bytes[16..]).unwrap();
            let header = ppp::v2::Header::try_from(bytes.as_slice()).unwrap();
            let addresses = match header.addresses {
                ppp::v2::Addresses::IPv4(a) => Some((
                    SocketAddr::from((a.source_address, a.source_port)),
                    SocketAddr::from((a.destination_address, a.destination_port)),
                )),
                ppp::v2::Addresses::IPv6(a) => Some((
                    SocketAddr::from((a.source_address, a.source_port)),
                    SocketAddr::from((a.destination_address, a.destination_port)),
                )),
                _ => None,
            };
            seen.send(addresses).unwrap();
            let mut message = [0; 5];
            stream.read_exact(&mut message).unwrap();
            stream.write_all(&message).unwrap();
        }
    });
    is_ready.recv_timeout(WAIT).expect("server ready");
    (receiver, handle)
}

/// Transparent mode in namespaces (client -- router running midway -- server): the header names
/// the client and the destination it connected to, IPv4 and IPv6. Needs root and nftables.
#[test]
fn a_transparent_listener_names_the_client_and_the_original_destination() {
    use std::io::{Read, Write};
    if !midway_testkit::host::is_root() || !on_path("nft") {
        eprintln!("skipped: transparent mode needs root and nft");
        return;
    }
    let topo = midway_testkit::netns::Routed::new();
    let targets: Vec<SocketAddr> = vec![
        "10.77.2.2:5201".parse().unwrap(),
        "[fd77:2::2]:5201".parse().unwrap(),
    ];
    let (seen, server) = header_server_in(topo.server.name(), targets.clone());
    let spool = tempfile::tempdir().unwrap();
    let mut config = format!(
        "[proxy]\nallowed_clients = [\"10.77.1.0/24\", \"fd77:1::/64\"]\nshutdown_grace = \"1s\"\n\
         [spool]\ndir = \"{}\"\n",
        spool.path().display()
    );
    for (name, listen) in [("tp4", "0.0.0.0:7000"), ("tp6", "[::]:7001")] {
        config.push_str(&format!(
            "[[listeners]]\nname = \"{name}\"\nmode = \"transparent\"\nlisten = \"{listen}\"\n\
             proxy_protocol = \"v2\"\n[listeners.nftables]\ninterfaces = [\"veth-rc\"]\n\
             ports = [5201]\n"
        ));
    }
    let proxy = midway_testkit::proxy::start_in_netns(topo.router.name(), config);
    for target in targets {
        let client = midway_testkit::netns::in_netns(topo.client.name(), move || {
            let mut stream = std::net::TcpStream::connect_timeout(&target, WAIT).unwrap();
            stream.set_read_timeout(Some(WAIT)).unwrap();
            stream.write_all(b"hello").unwrap();
            let mut back = [0; 5];
            stream.read_exact(&mut back).unwrap();
            assert_eq!(&back, b"hello");
            stream.local_addr().unwrap()
        })
        .join()
        .unwrap();
        let addresses = seen.recv_timeout(WAIT).expect("the server saw a header");
        assert_eq!(addresses, Some((client, target)));
    }
    proxy.stop();
    server.join().unwrap();
}
