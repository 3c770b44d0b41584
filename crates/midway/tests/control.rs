// Tests: an unwrap or expect that fails is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The control socket through a real `midway proxy` and the real `midway status`: two open
//! connections read back with both segments' tcp_info (`--json` parsed), a drained listener
//! refusing new connections while the open ones relay, undrain, and `close` resetting both
//! ends of one connection (an HTTP listener's client connection too); bad requests get typed
//! errors; the socket is the owner's only and goes away with the proxy.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use midway_proxy::control::{ConnectionStatus, Status};
use midway_testkit::host::{listening_addr, spawn_midway, Place};
use midway_testkit::wait::{poll_until, wait_exit};

const MIDWAY: &str = env!("CARGO_BIN_EXE_midway");
const LIMIT: Duration = Duration::from_secs(20);
const CHUNK: usize = 64 * 1024;

/// How a stream's read side ended: `Ok(())` for a clean end of stream, else the error's kind.
type End = Result<(), std::io::ErrorKind>;

/// An echo server on loopback; each connection's thread reports, with its index in accept
/// order, how its read side ended.
fn echo_server() -> (SocketAddr, mpsc::Receiver<(usize, End)>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for (index, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                stream.set_read_timeout(Some(LIMIT * 2)).unwrap();
                let mut buf = vec![0u8; CHUNK];
                let ended = loop {
                    match stream.read(&mut buf) {
                        Ok(0) => break Ok(()),
                        Ok(n) => {
                            if let Err(e) = stream.write_all(&buf[..n]) {
                                break Err(e.kind());
                            }
                        }
                        Err(e) => break Err(e.kind()),
                    }
                };
                let _ = tx.send((index, ended));
            });
        }
    });
    (addr, rx)
}

/// Sends a chunk and reads its echo back (bounded by the stream's timeouts).
fn echo_chunk(stream: &mut TcpStream, byte: u8) {
    let chunk = vec![byte; CHUNK];
    stream.write_all(&chunk).unwrap();
    let mut back = vec![0u8; CHUNK];
    stream.read_exact(&mut back).unwrap();
    assert_eq!(back, chunk);
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    stream.set_write_timeout(Some(LIMIT)).unwrap();
    stream
}

/// `midway status ARGS --socket SOCKET`; its stdout, or a panic with its stderr.
fn midway_status(socket: &Path, args: &[&str]) -> String {
    let out = Command::new(MIDWAY)
        .arg("status")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "midway status {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn status_json(socket: &Path) -> Status {
    let text = midway_status(socket, &["--json"]);
    serde_json::from_str(text.trim_end()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The status, or `None` if `midway status` failed (while a take-over swaps the processes).
fn try_status(socket: &Path) -> Option<Status> {
    let out = Command::new(MIDWAY)
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

fn connection_of<'a>(status: &'a Status, client: &TcpStream) -> &'a ConnectionStatus {
    let addr = client.local_addr().unwrap();
    status
        .connections
        .iter()
        .find(|c| c.client == addr)
        .unwrap_or_else(|| panic!("{addr} not listed: {status:#?}"))
}

/// One raw request line on the socket; the answer as JSON.
fn raw_request(socket: &Path, line: &str) -> serde_json::Value {
    let mut stream = UnixStream::connect(socket).unwrap();
    stream.set_read_timeout(Some(LIMIT)).unwrap();
    stream.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).unwrap();
    serde_json::from_str(&answer).unwrap()
}

/// How a client's read side ends: the first error's kind, or `Ok(())` at a clean EOF.
fn read_end(stream: &mut TcpStream) -> End {
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => continue,
            Err(e) => return Err(e.kind()),
        }
    }
}

#[test]
fn status_drain_and_close_through_the_control_socket() {
    let (echo, ended) = echo_server();
    let dir = tempfile::tempdir().unwrap();
    // In a folder that does not exist yet: the proxy creates it.
    let socket = dir.path().join("run").join("control.sock");
    let config = dir.path().join("control.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\nshutdown_grace = \"2s\"\n\
             [metrics]\nlisten = \"127.0.0.1:0\"\n\
             [spool]\ndir = \"{}\"\n\
             [control]\nsocket = \"{}\"\n\n\
             [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"127.0.0.1:0\"\n\
             target = \"{echo}\"\nrelay = \"buffer\"\n",
            dir.path().join("spool").display(),
            socket.display()
        ),
    )
    .unwrap();
    let (mut midway, log) = spawn_midway(MIDWAY, Place::Here, &config, &[]);
    let addr = listening_addr(&mut midway, LIMIT);
    assert!(
        poll_until(LIMIT, || UnixStream::connect(&socket).is_ok()),
        "the control socket never answered"
    );
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the socket is its owner's only");

    // Two connections, each with bytes moved both ways (so both segments have an RTT sample).
    // The first is echoed before the second connects: the server accepts it first (index 0).
    let mut first = connect(addr);
    echo_chunk(&mut first, 1);
    let mut second = connect(addr);
    echo_chunk(&mut second, 2);

    let status = status_json(&socket);
    assert_eq!(status.generation, 1);
    assert_eq!(status.connections.len(), 2, "{status:#?}");
    assert_eq!(status.listeners.len(), 1);
    assert_eq!(status.listeners[0].name, "fwd");
    assert_eq!(status.listeners[0].open, 2);
    assert!(!status.listeners[0].drained);
    for client in [&first, &second] {
        let c = connection_of(&status, client);
        assert_eq!(c.listener, "fwd");
        assert_eq!(c.target, Some(echo));
        assert_eq!(c.relay, "buffer");
        assert!(
            c.bytes_up >= CHUNK as u64 && c.bytes_down >= CHUNK as u64,
            "{c:#?}"
        );
        let roles: Vec<&str> = c.segments.iter().map(|s| s.role.as_str()).collect();
        assert_eq!(roles, ["local", "remote"]);
        for segment in &c.segments {
            assert_eq!(segment.transport, "tcp");
            let tcp = segment.tcp.as_ref().expect("tcp_info of a live segment");
            assert!(tcp.srtt_us > 0, "{c:#?}");
            assert!(tcp.cwnd > 0, "{c:#?}");
            assert!(
                tcp.congestion_control
                    .as_ref()
                    .is_some_and(|cc| !cc.is_empty()),
                "{c:#?}"
            );
        }
    }
    // The table: one line per connection, both clients named.
    let table = midway_status(&socket, &["--sort", "age"]);
    for client in [&first, &second] {
        let addr = client.local_addr().unwrap().to_string();
        assert!(table.contains(&addr), "{addr} not in\n{table}");
    }
    check_filters(&socket);

    // Drain: a new connection is closed at once, the open ones still relay.
    let drained = midway_status(&socket, &["drain", "fwd"]);
    assert!(drained.contains("drained"), "{drained}");
    assert!(status_json(&socket).listeners[0].drained);
    let mut refused = connect(addr);
    // The write may or may not land before the reset; what matters is that no echo comes.
    let _ = refused.write_all(b"hello");
    let end = read_end(&mut refused);
    assert!(
        matches!(end, Ok(()) | Err(std::io::ErrorKind::ConnectionReset)),
        "a connection to a drained listener was served: {end:?}"
    );
    echo_chunk(&mut first, 3);
    echo_chunk(&mut second, 4);
    assert_eq!(status_json(&socket).connections.len(), 2);

    // Undrain: served again.
    midway_status(&socket, &["undrain", "fwd"]);
    let mut third = connect(addr);
    echo_chunk(&mut third, 5);
    drop(third);

    // Close the first: both its client and its server see a reset, not a clean end.
    let id = connection_of(&status_json(&socket), &first).id;
    let closed = midway_status(&socket, &["close", &id.to_string()]);
    assert!(closed.contains("closed"), "{closed}");
    assert_eq!(
        read_end(&mut first),
        Err(std::io::ErrorKind::ConnectionReset),
        "the client of a closed connection got a clean end of stream"
    );
    let server_end = loop {
        let (index, end) = ended.recv_timeout(LIMIT).expect("the server saw the close");
        if index == 0 {
            break end;
        }
    };
    assert_eq!(
        server_end,
        Err(std::io::ErrorKind::ConnectionReset),
        "the server of a closed connection got a clean end of stream"
    );
    // The other connection is untouched.
    echo_chunk(&mut second, 6);
    let after = status_json(&socket);
    assert_eq!(after.connections.len(), 1, "{after:#?}");

    // Typed errors from the real server.
    let answer = raw_request(&socket, r#"{"version":2,"command":"status"}"#);
    assert_eq!(answer["version"], 1);
    assert_eq!(answer["result"], "error");
    assert_eq!(answer["reason"], "unsupported_version");
    let answer = raw_request(&socket, r#"{"version":1,"command":"close","id":999999}"#);
    assert_eq!(answer["reason"], "unknown_connection");
    let answer = raw_request(
        &socket,
        r#"{"version":1,"command":"drain","listener":"nope"}"#,
    );
    assert_eq!(answer["reason"], "unknown_listener");
    let answer = raw_request(&socket, "not json");
    assert_eq!(answer["reason"], "bad_json");
    let out = Command::new(MIDWAY)
        .args(["status", "--socket"])
        .arg(&socket)
        .args(["close", "999999"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown_connection"));

    // --watch draws bounded frames.
    let frames = midway_status(&socket, &["--watch", "--interval", "0.2", "--count", "2"]);
    assert_eq!(frames.matches("\x1b[H\x1b[2J").count(), 2, "{frames}");
    assert!(frames.contains("listener fwd"), "{frames}");

    // Counted: control requests by command and result, connections refused while drained.
    let metrics = scrape(&log);
    for line in [
        "midway_control_requests_total{command=\"drain\",result=\"ok\"} 1",
        "midway_control_requests_total{command=\"close\",result=\"unknown_connection\"} 2",
        "midway_control_requests_total{command=\"invalid\",result=\"unsupported_version\"} 1",
        "midway_connections_refused_total{listener=\"fwd\",reason=\"drained\"} 1",
    ] {
        assert!(metrics.contains(line), "no {line} in\n{metrics}");
    }

    // A live view running when the proxy stops ends by itself, saying why.
    let mut watcher = Command::new(MIDWAY)
        .args(["status", "--watch", "--interval", "0.2", "--socket"])
        .arg(&socket)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(second);
    midway.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    let exit = wait_exit(midway.child_mut(), LIMIT, "midway did not stop");
    assert!(exit.success(), "{exit}");
    assert!(!socket.exists(), "the control socket outlived the proxy");
    let watched = wait_exit(
        &mut watcher,
        LIMIT,
        "--watch went on after the proxy stopped",
    );
    assert!(!watched.success());
    let mut why = String::new();
    watcher
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut why)
        .unwrap();
    assert!(why.contains("control socket"), "{why}");
}

/// The proxy's `/metrics` text; its address from the log line that names it.
fn scrape(log: &mpsc::Receiver<String>) -> String {
    let addr = log
        .try_iter()
        .find_map(|line| {
            let value: serde_json::Value = serde_json::from_str(&line).ok()?;
            let message = value["fields"]["message"].as_str()?;
            message.starts_with("metrics at").then(|| {
                value["fields"]["addr"]
                    .as_str()
                    .and_then(|a| a.parse::<SocketAddr>().ok())
            })?
        })
        .expect("a log line names the metrics endpoint");
    midway_testkit::metrics::scrape_blocking(addr)
}

/// `--client` and `--listener` keep what they name in `--json` too.
fn check_filters(socket: &Path) {
    let count = |args: &[&str]| {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let text = midway_status(socket, &all);
        serde_json::from_str::<Status>(text.trim_end())
            .unwrap()
            .connections
            .len()
    };
    // Both clients are 127.0.0.1.
    assert_eq!(count(&["--client", "127.0.0.1"]), 2);
    assert_eq!(count(&["--client", "127.0.0.0/8"]), 2);
    assert_eq!(count(&["--client", "10.0.0.0/8"]), 0);
    assert_eq!(count(&["--listener", "fwd"]), 2);
    assert_eq!(count(&["--listener", "other"]), 0);
    assert_eq!(count(&["--peer", "gw"]), 0);
}

/// A reload keeps a listener drained and counts the generation; a binary upgrade leaves the
/// new process answering on the socket (the old one's is replaced, not removed by its exit),
/// with the listener still drained.
#[test]
fn reload_keeps_drain_and_an_upgrade_hands_the_socket_over() {
    let (echo, _ended) = echo_server();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("control.sock");
    // A take-over finds its listeners by address: a port known in advance.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("control.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\nshutdown_grace = \"2s\"\n\
             [spool]\ndir = \"{}\"\n\
             [control]\nsocket = \"{}\"\n\n\
             [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"127.0.0.1:{port}\"\n\
             target = \"{echo}\"\nrelay = \"buffer\"\n",
            dir.path().join("spool").display(),
            socket.display()
        ),
    )
    .unwrap();
    let (mut old, _old_log) = spawn_midway(MIDWAY, Place::Here, &config, &[]);
    listening_addr(&mut old, LIMIT);
    assert!(
        poll_until(LIMIT, || UnixStream::connect(&socket).is_ok()),
        "the control socket never answered"
    );
    midway_status(&socket, &["drain", "fwd"]);
    old.reload().unwrap();
    assert!(
        poll_until(LIMIT, || status_json(&socket).generation == 2),
        "the reload never showed as generation 2"
    );
    assert!(
        status_json(&socket).listeners[0].drained,
        "a reload undrained the listener"
    );

    let (mut new, _new_log) = spawn_midway(MIDWAY, Place::Here, &config, &["--take-over"]);
    assert!(
        poll_until(LIMIT, || try_status(&socket)
            .is_some_and(|s| s.pid == new.id())),
        "the new process never answered on the control socket"
    );
    // The old process, with no connection open, ends by itself; its socket's path stays the
    // new process's.
    let exit = wait_exit(old.child_mut(), LIMIT, "the old midway did not stop");
    assert!(exit.success(), "{exit}");
    let status = status_json(&socket);
    assert_eq!(status.pid, new.id());
    // The drained listener stays drained in the new process.
    assert!(
        status.listeners[0].drained,
        "the upgrade undrained the listener"
    );
    let mut refused = connect(SocketAddr::from(([127, 0, 0, 1], port)));
    let _ = refused.write_all(b"hello");
    let end = read_end(&mut refused);
    assert!(
        matches!(end, Ok(()) | Err(std::io::ErrorKind::ConnectionReset)),
        "the new process served a drained listener: {end:?}"
    );
    new.signal(nix::sys::signal::Signal::SIGTERM).unwrap();
    let exit = wait_exit(new.child_mut(), LIMIT, "the new midway did not stop");
    assert!(exit.success(), "{exit}");
    assert!(!socket.exists(), "the control socket outlived the proxy");
}

/// Only root and midway's own user get an answer: another user who can reach the socket (its
/// mode opened up here on purpose) is closed without one. Skipped unless run as root (another
/// user is needed).
#[test]
fn another_user_gets_no_answer() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to run a client as another user");
        return;
    }
    let (echo, _ended) = echo_server();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("control.sock");
    let config = dir.path().join("control.toml");
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\n\
             [spool]\ndir = \"{}\"\n\
             [control]\nsocket = \"{}\"\n\n\
             [[listeners]]\nname = \"fwd\"\nmode = \"forward\"\nlisten = \"127.0.0.1:0\"\n\
             target = \"{echo}\"\n",
            dir.path().join("spool").display(),
            socket.display()
        ),
    )
    .unwrap();
    let (mut midway, _log) = spawn_midway(MIDWAY, Place::Here, &config, &[]);
    listening_addr(&mut midway, LIMIT);
    assert!(
        poll_until(LIMIT, || UnixStream::connect(&socket).is_ok()),
        "the control socket never answered"
    );
    // What the file mode would stop, opened up: the peer credentials must refuse it anyway.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let nobody = 65534;
    let out = Command::new(MIDWAY)
        .args(["status", "--socket"])
        .arg(&socket)
        .uid(nobody)
        .gid(nobody)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "another user got an answer");
    // Connected, then closed unanswered: at the write (a broken pipe), at the read (a reset,
    // its request never read) or a clean end, as the timing falls.
    assert!(
        stderr.contains("control socket") && !stderr.contains("cannot connect"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    // Root still gets one.
    assert_eq!(status_json(&socket).listeners[0].name, "fwd");
}

/// A port free right now on loopback (a peer's address is written in the other's config).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes `body` with a `[proxy]` table, a spool and a control socket in `dir` under `name`;
/// starts midway on it and waits for its listener. Returns it and its control socket.
fn start_named(
    dir: &Path,
    name: &str,
    body: &str,
) -> (
    midway_testkit::host::Running,
    std::path::PathBuf,
    SocketAddr,
) {
    let socket = dir.join(format!("{name}.sock"));
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "[proxy]\nallowed_clients = [\"127.0.0.0/8\"]\ndenied_destinations = []\n\
             [spool]\ndir = \"{}\"\n[control]\nsocket = \"{}\"\n\n{body}",
            dir.join(format!("{name}-spool")).display(),
            socket.display()
        ),
    )
    .unwrap();
    let (mut midway, _log) = spawn_midway(MIDWAY, Place::Here, &config, &[]);
    let addr = listening_addr(&mut midway, LIMIT);
    assert!(
        poll_until(LIMIT, || UnixStream::connect(&socket).is_ok()),
        "{name}'s control socket never answered"
    );
    (midway, socket, addr)
}

/// Through a peer: the edge shows the peer's name and its peer segment, the gateway the
/// connection's third segment (its peer segment and the remote one to the destination).
#[test]
fn a_connection_through_a_peer_shows_its_peer_and_segments_on_both_midways() {
    let (echo, _ended) = echo_server();
    let dir = tempfile::tempdir().unwrap();
    let key =
        "[keys.k]\nsecret = \"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"\n";
    let gateway_port = free_port();
    let (_gateway, gateway_socket, _) = start_named(
        dir.path(),
        "gateway",
        &format!(
            "{key}\n[[listeners]]\nname = \"from-edge\"\nmode = \"peer\"\n\
             listen = \"127.0.0.1:{gateway_port}\"\nkeys = [\"k\"]\n"
        ),
    );
    let (_edge, edge_socket, edge_addr) = start_named(
        dir.path(),
        "edge",
        &format!(
            "{key}\n[[peers]]\nname = \"gw\"\naddress = \"127.0.0.1:{gateway_port}\"\nkey = \"k\"\n\
             destinations = [\"127.0.0.0/8\"]\nwarm_connections = 0\n\n\
             [[listeners]]\nname = \"edge\"\nmode = \"forward\"\nlisten = \"127.0.0.1:0\"\n\
             target = \"{echo}\"\nvia = [\"gw\"]\n"
        ),
    );
    let mut client = connect(edge_addr);
    echo_chunk(&mut client, 7);

    let edge = status_json(&edge_socket);
    let c = connection_of(&edge, &client);
    assert_eq!(c.peer.as_deref(), Some("gw"), "{c:#?}");
    assert_eq!(c.target, Some(echo));
    let roles: Vec<&str> = c.segments.iter().map(|s| s.role.as_str()).collect();
    assert_eq!(roles, ["local", "peer"]);
    assert!(c.segments.iter().all(|s| s.tcp.is_some()), "{c:#?}");
    let through = midway_status(&edge_socket, &["--json", "--peer", "gw"]);
    let through: Status = serde_json::from_str(through.trim_end()).unwrap();
    assert_eq!(through.connections.len(), 1);

    let gateway = status_json(&gateway_socket);
    assert_eq!(gateway.connections.len(), 1, "{gateway:#?}");
    let g = &gateway.connections[0];
    assert_eq!(g.listener, "from-edge");
    assert_eq!(g.target, Some(echo));
    let roles: Vec<&str> = g.segments.iter().map(|s| s.role.as_str()).collect();
    assert_eq!(roles, ["peer", "remote"]);
    assert!(g.segments.iter().all(|s| s.tcp.is_some()), "{g:#?}");
}

/// An origin that answers every request on a connection with `hello` (keep-alive), until the
/// connection ends.
fn http_origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || {
                stream.set_read_timeout(Some(LIMIT * 2)).unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                let mut line = String::new();
                for _ in 0..100 {
                    // A head: lines up to the empty one.
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let answer = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
                    if writer.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// An HTTP listener's client connection is listed too (relay `http`, its bytes, the client
/// segment's tcp_info; its upstreams are pooled, so no remote socket), and `close` resets it.
#[test]
fn an_http_client_connection_is_listed_and_close_resets_it() {
    let origin = http_origin();
    let dir = tempfile::tempdir().unwrap();
    let (_midway, socket, addr) = start_named(
        dir.path(),
        "http",
        "[[listeners]]\nname = \"web\"\nmode = \"http\"\nlisten = \"127.0.0.1:0\"\n",
    );
    let mut client = connect(addr);
    let request = format!("GET http://{origin}/ HTTP/1.1\r\nHost: {origin}\r\n\r\n");
    client.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    while !answer.ends_with(b"hello") {
        let mut buf = [0u8; 512];
        let read = client.read(&mut buf).unwrap();
        assert!(read > 0 && answer.len() < 4096, "{answer:?}");
        answer.extend_from_slice(&buf[..read]);
    }

    let status = status_json(&socket);
    let c = connection_of(&status, &client);
    assert_eq!(c.listener, "web");
    assert_eq!(c.relay, "http");
    assert_eq!(c.bytes_up, request.len() as u64, "{c:#?}");
    assert_eq!(c.bytes_down, answer.len() as u64, "{c:#?}");
    let roles: Vec<&str> = c.segments.iter().map(|s| s.role.as_str()).collect();
    assert_eq!(roles, ["local", "remote"]);
    let local = c.segments[0]
        .tcp
        .as_ref()
        .expect("the client socket's tcp_info");
    assert!(local.srtt_us > 0, "{c:#?}");
    assert!(c.segments[1].tcp.is_none(), "pooled upstreams: {c:#?}");
    assert_eq!(status.listeners[0].open, 1, "{status:#?}");

    let closed = midway_status(&socket, &["close", &c.id.to_string()]);
    assert!(closed.contains("closed"), "{closed}");
    assert_eq!(
        read_end(&mut client),
        Err(std::io::ErrorKind::ConnectionReset),
        "the client of a closed HTTP connection got a clean end of stream"
    );
    assert!(
        poll_until(LIMIT, || status_json(&socket).connections.is_empty()),
        "the closed connection is still listed"
    );
}
