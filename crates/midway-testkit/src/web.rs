//! The harness of midway-web's tests (feature `web`): sites, a raw HTTP client, a recording relay
//! "proxy" and tiny misbehaving servers, all on loopback with ports chosen by the kernel.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use midway_web::{CacheMode, HttpMode, LoadSpec, Origin, SiteSpec};

/// Where every peer of these tests listens.
pub const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// Upper bound for any single blocking step of a test.
pub const STEP: Duration = Duration::from_secs(20);

/// A site on the hosts www.lab, s1.lab and s2.lab, cacheable for an hour.
pub fn site(pages: u32, page_bytes: u64, objects: u32, object_hosts: u32) -> SiteSpec {
    SiteSpec {
        hosts: vec!["www.lab".into(), "s1.lab".into(), "s2.lab".into()],
        pages,
        page_bytes,
        objects,
        object_hosts,
        cache_max_age: Some(3600),
        keepalive_timeout: Duration::from_secs(15),
        max_keepalive_requests: 100,
    }
}

/// The origin serving `site` on loopback, on a kernel-chosen port.
pub fn start_origin(site: SiteSpec) -> Origin {
    Origin::start(SocketAddr::new(LOOPBACK, 0), site).expect("origin starts on loopback")
}

/// Every host of `site` resolved to loopback.
pub fn resolve_all(site: &SiteSpec) -> BTreeMap<String, IpAddr> {
    site.hosts.iter().map(|h| (h.clone(), LOOPBACK)).collect()
}

/// A direct, uncached page load of `site` from the origin on `port`.
pub fn load_spec(site: SiteSpec, port: u16, mode: HttpMode, per_host: u32) -> LoadSpec {
    LoadSpec {
        resolve: resolve_all(&site),
        site,
        port,
        proxy: None,
        mode,
        max_connections_per_host: per_host,
        connection_limit: midway_web::ConnectionLimit::PerServer,
        request_headers: midway_web::RequestHeaders::Minimal,
        cache: CacheMode::Plain,
        think_time: Duration::ZERO,
        timeout: STEP,
    }
}

/// A response read by the raw client.
#[derive(Debug)]
pub struct RawResponse {
    /// Status code.
    pub status: u16,
    /// Headers as (name, value), in the order received.
    pub headers: Vec<(String, String)>,
    /// The body as received.
    pub body: Vec<u8>,
}

impl RawResponse {
    /// Value of header `name` (case-insensitive), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A blocking connection to `addr`, its reads bounded by [`STEP`].
pub fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect to loopback");
    stream.set_read_timeout(Some(STEP)).unwrap();
    stream
}

/// Reads one response from `stream`; `buf` keeps bytes of the following ones. `no_body` for
/// answers to HEAD. `None` at a clean end of stream before any byte.
pub fn read_response(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    no_body: bool,
) -> Option<RawResponse> {
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Response::new(&mut headers);
        if let httparse::Status::Complete(head_len) = parsed.parse(buf).expect("valid response") {
            let status = parsed.code.unwrap();
            let headers: Vec<(String, String)> = parsed
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            let length: usize = headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                .map(|(_, v)| v.parse().unwrap())
                .unwrap_or(0);
            let length = if no_body || status == 304 { 0 } else { length };
            buf.drain(..head_len);
            while buf.len() < length {
                assert!(fill(stream, buf) > 0, "connection closed inside a body");
            }
            let body = buf.drain(..length).collect();
            return Some(RawResponse {
                status,
                headers,
                body,
            });
        }
        if fill(stream, buf) == 0 {
            assert!(buf.is_empty(), "connection closed inside a response head");
            return None;
        }
    }
}

fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> usize {
    let mut chunk = [0u8; 16 * 1024];
    let n = stream.read(&mut chunk).expect("read within the step time");
    buf.extend_from_slice(&chunk[..n]);
    n
}

/// Whether the peer closed the connection (reads end of stream within the step time).
pub fn reads_eof(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(stream.read(&mut byte), Ok(0))
}

/// A GET request for `path` on `host` (origin form) with `extra` header lines.
pub fn get(path: &str, host: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n")
}

/// A relay standing in for an explicit HTTP proxy: every client connection gets its own
/// upstream connection to `upstream`, bytes are copied both ways unchanged (the origin routes
/// absolute-form requests itself). Records what clients sent.
pub struct RelayProxy {
    /// Address clients connect to (loopback, a free port).
    pub addr: SocketAddr,
    /// Client connections accepted so far.
    pub accepted: Arc<AtomicU64>,
    /// Everything clients sent, per connection.
    pub sent: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RelayProxy {
    /// Starts relaying to `upstream` on a free loopback port.
    pub fn start(upstream: SocketAddr) -> RelayProxy {
        let listener = TcpListener::bind((LOOPBACK, 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicU64::new(0));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_accepted, thread_sent, thread_stop) =
            (accepted.clone(), sent.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !thread_stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let index = {
                            let mut sent = thread_sent.lock().unwrap();
                            sent.push(Vec::new());
                            sent.len() - 1
                        };
                        thread_accepted.fetch_add(1, Ordering::Relaxed);
                        relay(client, upstream, thread_sent.clone(), index);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => panic!("relay accept failed: {e}"),
                }
            }
        });
        RelayProxy {
            addr,
            accepted,
            sent,
            stop,
            thread: Some(thread),
        }
    }

    /// What clients sent, one string per connection (invalid UTF-8 replaced).
    pub fn sent_text(&self) -> Vec<String> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect()
    }
}

impl Drop for RelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn relay(client: TcpStream, upstream: SocketAddr, sent: Arc<Mutex<Vec<Vec<u8>>>>, index: usize) {
    let server = TcpStream::connect(upstream).unwrap();
    let (mut client_read, mut server_write) =
        (client.try_clone().unwrap(), server.try_clone().unwrap());
    let (mut server_read, mut client_write) = (server, client);
    for s in [&client_read, &server_read] {
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    }
    std::thread::spawn(move || {
        let mut chunk = [0u8; 16 * 1024];
        while let Ok(n) = client_read.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sent.lock().unwrap()[index].extend_from_slice(&chunk[..n]);
            if server_write.write_all(&chunk[..n]).is_err() {
                break;
            }
        }
        let _ = server_write.shutdown(Shutdown::Write);
    });
    std::thread::spawn(move || {
        let mut chunk = [0u8; 16 * 1024];
        while let Ok(n) = server_read.read(&mut chunk) {
            if n == 0 || client_write.write_all(&chunk[..n]).is_err() {
                break;
            }
        }
        let _ = client_write.shutdown(Shutdown::Write);
    });
}

/// A one-shot bad server: accepts one connection (within the step time), reads one request
/// head, then does `answer` with the stream. Returns its address and the thread.
pub fn bad_server<F>(answer: F) -> (SocketAddr, JoinHandle<()>)
where
    F: FnOnce(&mut TcpStream) + Send + 'static,
{
    let listener = TcpListener::bind((LOOPBACK, 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let thread = std::thread::spawn(move || {
        let deadline = Instant::now() + STEP;
        let mut stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => panic!("bad server got no connection: {e}"),
            }
        };
        stream.set_nonblocking(false).unwrap();
        stream.set_read_timeout(Some(STEP)).unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => return,
            }
        }
        answer(&mut stream);
    });
    (addr, thread)
}
