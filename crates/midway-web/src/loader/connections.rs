//! Spreading requests over connections: at most `max_connections_per_host` per key (origin
//! host, or the proxy), each taking batches from a shared queue (one request, or up to
//! [`super::PIPELINE_DEPTH`] when pipelining); idle connections are pooled across pages, and
//! requests a closing connection left unanswered go back to the front of the queue.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::AsFd;

use futures::future::try_join_all;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::page::{Fetch, Fetched, Loader};
use super::response::{read_response, READ_CHUNK};
use super::{lookup, CacheMode, HttpMode, RequestHeaders, MAX_ATTEMPTS, PIPELINE_DEPTH};
use crate::error::WebError;

/// Connections are shared per origin host and port (direct, or through a proxy that counts per
/// origin), or all go to the one proxy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum ConnKey {
    Origin { host: String, port: u16 },
    Proxy,
}

pub(super) struct Conn {
    pub(super) stream: TcpStream,
    /// Bytes read but not yet consumed.
    pub(super) buf: Vec<u8>,
}

/// What one batch on one connection achieved.
struct Exchange {
    /// Requests of the batch answered (a prefix).
    answered: usize,
    /// Whether the connection may carry more requests.
    keep_alive: bool,
}

impl Loader<'_> {
    /// Fetches `fetches` over up to `max_connections_per_host` connections of `key`.
    pub(super) async fn fetch_all(
        &self,
        key: ConnKey,
        fetches: Vec<Fetch>,
    ) -> Result<Vec<Fetched>, WebError> {
        let total = fetches.len();
        if total == 0 {
            return Ok(Vec::new());
        }
        let workers = total.min(self.spec.max_connections_per_host as usize);
        let batch = match self.spec.mode {
            HttpMode::Pipelining => total.div_ceil(workers).min(PIPELINE_DEPTH),
            HttpMode::Http10 | HttpMode::KeepAlive => 1,
        };
        let queue = RefCell::new(VecDeque::from(fetches));
        let done = RefCell::new(Vec::with_capacity(total));
        try_join_all((0..workers).map(|_| self.worker(&key, &queue, batch, &done))).await?;
        Ok(done.into_inner())
    }

    /// One connection's worth of work: takes batches from the queue until it is empty.
    async fn worker(
        &self,
        key: &ConnKey,
        queue: &RefCell<VecDeque<Fetch>>,
        batch_size: usize,
        done: &RefCell<Vec<Fetched>>,
    ) -> Result<(), WebError> {
        let mut kept: Option<Conn> = None;
        loop {
            let batch: Vec<Fetch> = {
                let mut queue = queue.borrow_mut();
                let n = batch_size.min(queue.len());
                queue.drain(..n).collect()
            };
            let Some(first) = batch.first() else {
                break;
            };
            let mut conn = match kept.take() {
                Some(conn) => conn,
                None => self.checkout(key, first).await?,
            };
            let exchange = self.exchange(&mut conn, &batch, done).await?;
            if exchange.answered < batch.len() {
                let unanswered = &batch[exchange.answered..];
                requeue(queue, unanswered, exchange.answered == 0)?;
            } else if exchange.keep_alive && self.spec.mode.reuses_connections() {
                kept = Some(conn);
            }
        }
        if let Some(conn) = kept {
            self.pool
                .borrow_mut()
                .entry(key.clone())
                .or_default()
                .push(conn);
        }
        Ok(())
    }

    /// An idle connection of `key` that still looks open, or a new one.
    async fn checkout(&self, key: &ConnKey, first: &Fetch) -> Result<Conn, WebError> {
        if self.spec.mode.reuses_connections() {
            loop {
                let idle = self.pool.borrow_mut().get_mut(key).and_then(Vec::pop);
                let Some(conn) = idle else { break };
                if looks_open(&conn) {
                    return Ok(conn);
                }
            }
        }
        let addr = match self.spec.proxy {
            Some(proxy) => proxy,
            None => SocketAddr::new(lookup(&self.spec.resolve, &first.host)?, first.port),
        };
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| WebError::Connect { addr, source })?;
        self.connections_opened
            .set(self.connections_opened.get() + 1);
        // Browsers disable Nagle: a request must not wait for the previous one's ACK.
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(%addr, error = %err, "cannot set TCP_NODELAY");
        }
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(READ_CHUNK),
        })
    }

    fn request_bytes(&self, fetch: &Fetch) -> Vec<u8> {
        let authority = fetch.authority();
        let target = match self.spec.proxy {
            Some(_) => fetch.url(),
            None => fetch.path.clone(),
        };
        let version = match self.spec.mode {
            HttpMode::Http10 => "HTTP/1.0",
            HttpMode::KeepAlive | HttpMode::Pipelining => "HTTP/1.1",
        };
        let mut request = match self.spec.request_headers {
            RequestHeaders::Minimal => format!(
                "GET {target} {version}\r\nHost: {authority}\r\nUser-Agent: midway-web\r\n\
                 Accept: */*\r\n"
            ),
            // Chromium 156's lines for an image of the page (its net log), in its order; the
            // page's own request differs in its Accept only, which changes no size that matters.
            RequestHeaders::Chromium => {
                let referer = self.site.spec.hosts[0].to_ascii_lowercase();
                let connection = match self.spec.proxy {
                    Some(_) => "Proxy-Connection: keep-alive",
                    None => "Connection: keep-alive",
                };
                format!(
                    "GET {target} {version}\r\nHost: {authority}\r\n{connection}\r\n\
                     User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, \
                     like Gecko) HeadlessChrome/156.0.0.0 Safari/537.36\r\n\
                     Accept: image/avif,image/webp,image/apng,image/svg+xml,image/*,*/*;q=0.8\r\n\
                     Referer: http://{referer}/\r\n\
                     Accept-Encoding: gzip, deflate\r\n\
                     Accept-Language: en-US,en;q=0.9\r\n"
                )
            }
        };
        if self.spec.cache == CacheMode::ForceMiss {
            request.push_str("Pragma: no-cache\r\nCache-Control: no-cache\r\n");
        }
        request.push_str("\r\n");
        request.into_bytes()
    }

    /// Writes every request of `batch` at once, then reads the answers in order.
    async fn exchange(
        &self,
        conn: &mut Conn,
        batch: &[Fetch],
        done: &RefCell<Vec<Fetched>>,
    ) -> Result<Exchange, WebError> {
        let requests: Vec<u8> = batch.iter().flat_map(|f| self.request_bytes(f)).collect();
        if conn.stream.write_all(&requests).await.is_err() {
            // The connection died before taking the requests (an idle one the server closed):
            // nothing was answered, so the requests go to another connection.
            return Ok(Exchange {
                answered: 0,
                keep_alive: false,
            });
        }
        for (index, fetch) in batch.iter().enumerate() {
            let Some(response) = read_response(conn, fetch, self.expected_len(fetch)).await? else {
                return Ok(Exchange {
                    answered: index,
                    keep_alive: false,
                });
            };
            let keep_alive = response.keep_alive;
            done.borrow_mut().push(self.verify(fetch, response)?);
            if !keep_alive {
                return Ok(Exchange {
                    answered: index + 1,
                    keep_alive: false,
                });
            }
        }
        Ok(Exchange {
            answered: batch.len(),
            keep_alive: true,
        })
    }
}

/// Puts unanswered requests back at the front of the queue, in order. `no_progress` says the
/// connection answered nothing at all, which counts against the requests' attempts.
fn requeue(
    queue: &RefCell<VecDeque<Fetch>>,
    unanswered: &[Fetch],
    no_progress: bool,
) -> Result<(), WebError> {
    let mut queue = queue.borrow_mut();
    for fetch in unanswered.iter().rev() {
        let mut fetch = fetch.clone();
        if no_progress {
            fetch.failed_attempts += 1;
            if fetch.failed_attempts >= MAX_ATTEMPTS {
                return Err(WebError::ConnectionClosed {
                    url: fetch.url(),
                    attempts: fetch.failed_attempts,
                });
            }
        }
        queue.push_front(fetch);
    }
    Ok(())
}

/// Whether an idle connection still looks usable: nothing to read (no EOF, no stray bytes).
/// A close that arrives after this check is caught by the retry in `worker`.
fn looks_open(conn: &Conn) -> bool {
    if !conn.buf.is_empty() {
        return false;
    }
    midway_sys::sockopt::idle_and_open(conn.stream.as_fd())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::site::Resource;
    #[test]
    fn requeue_keeps_order_and_bounds_attempts() {
        let fetch = |path: &str| Fetch {
            host: "www.lab".into(),
            port: 80,
            path: path.into(),
            resource: Resource::Base { page: 0 },
            failed_attempts: 0,
        };
        let queue = RefCell::new(VecDeque::from([fetch("/c")]));
        requeue(&queue, &[fetch("/a"), fetch("/b")], false).unwrap();
        let order: Vec<String> = queue.borrow().iter().map(|f| f.path.clone()).collect();
        assert_eq!(order, ["/a", "/b", "/c"]);
        assert_eq!(queue.borrow()[0].failed_attempts, 0);

        let queue = RefCell::new(VecDeque::new());
        let mut current = vec![fetch("/a")];
        for attempt in 1..MAX_ATTEMPTS {
            requeue(&queue, &current, true).unwrap();
            current = queue.borrow_mut().drain(..).collect();
            assert_eq!(current[0].failed_attempts, attempt);
        }
        assert!(matches!(
            requeue(&queue, &current, true),
            Err(WebError::ConnectionClosed { .. })
        ));
    }
}
