//! Reading one response off a connection: the head (status, framing, persistence, checksum
//! header), then the body by its framing (length, chunked, or up to the close). Bounded by the
//! expected length, so a misbehaving server cannot make the loader read without end.

use std::io;

use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use super::connections::Conn;
use super::page::Fetch;
use crate::error::WebError;
use crate::site::SUM_HEADER;

/// Largest response head accepted.
const MAX_RESPONSE_HEAD_BYTES: usize = 64 * 1024;
/// Read granularity.
pub(super) const READ_CHUNK: usize = 16 * 1024;

/// A response as received, before verification.
pub(super) struct Response {
    pub(super) status: u16,
    pub(super) body: Vec<u8>,
    pub(super) sum_header: Option<String>,
    pub(super) keep_alive: bool,
    pub(super) finished: Instant,
}

/// The parts of a response head the loader uses.
#[derive(Debug, PartialEq, Eq)]
struct ResponseHead {
    status: u16,
    minor_version: u8,
    head_len: usize,
    content_length: Option<u64>,
    chunked: bool,
    connection_close: bool,
    connection_keep_alive: bool,
    sum_header: Option<String>,
}

enum HeadParse {
    Complete(ResponseHead),
    Partial,
    Invalid(&'static str),
}

fn parse_response_head(buf: &[u8]) -> HeadParse {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut raw = httparse::Response::new(&mut headers);
    let head_len = match raw.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return HeadParse::Partial,
        Err(_) => return HeadParse::Invalid("unparseable status line or header"),
    };
    let mut head = ResponseHead {
        status: raw.code.unwrap_or(0),
        minor_version: raw.version.unwrap_or(0),
        head_len,
        content_length: None,
        chunked: false,
        connection_close: false,
        connection_keep_alive: false,
        sum_header: None,
    };
    for header in raw.headers.iter() {
        let value = String::from_utf8_lossy(header.value);
        let value = value.trim();
        let name = header.name;
        if name.eq_ignore_ascii_case("content-length") {
            match value.parse::<u64>() {
                Ok(n) if head.content_length.is_none_or(|m| m == n) => {
                    head.content_length = Some(n)
                }
                _ => return HeadParse::Invalid("bad or conflicting Content-Length"),
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            head.chunked |= value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        } else if name.eq_ignore_ascii_case("connection")
            || name.eq_ignore_ascii_case("proxy-connection")
        {
            for token in value.split(',').map(str::trim) {
                head.connection_close |= token.eq_ignore_ascii_case("close");
                head.connection_keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        } else if name.eq_ignore_ascii_case(SUM_HEADER) {
            head.sum_header = Some(value.to_string());
        }
    }
    HeadParse::Complete(head)
}

/// Reads more bytes into the connection's buffer; `Ok(0)` at end of stream.
async fn fill(conn: &mut Conn) -> io::Result<usize> {
    conn.buf.reserve(READ_CHUNK);
    conn.stream.read_buf(&mut conn.buf).await
}

/// Reads one response. `None` when the connection ended (or was reset) before a single byte
/// of it arrived: the request was not answered and may go to another connection. `limit` is
/// the expected body length; a body longer than that is not read further.
pub(super) async fn read_response(
    conn: &mut Conn,
    fetch: &Fetch,
    limit: u64,
) -> Result<Option<Response>, WebError> {
    let io_err = |source| WebError::Io {
        url: fetch.url(),
        source,
    };
    let bad = |problem| WebError::BadResponse {
        url: fetch.url(),
        problem,
    };
    loop {
        let head = loop {
            match parse_response_head(&conn.buf) {
                HeadParse::Complete(head) => break head,
                HeadParse::Invalid(problem) => return Err(bad(problem)),
                HeadParse::Partial if conn.buf.len() > MAX_RESPONSE_HEAD_BYTES => {
                    return Err(bad("response head too large"))
                }
                HeadParse::Partial => {}
            }
            match fill(conn).await {
                Ok(0) | Err(_) if conn.buf.is_empty() => return Ok(None),
                Ok(0) => return Err(bad("connection closed inside the response head")),
                Ok(_) => {}
                Err(source) => return Err(io_err(source)),
            }
        };
        conn.buf.drain(..head.head_len);
        if (100..200).contains(&head.status) {
            continue; // interim response (100 Continue); the real one follows
        }
        let delimited = head.chunked || head.content_length.is_some();
        let body = if head.status == 204 || head.status == 304 {
            Vec::new()
        } else if head.chunked {
            read_chunked(conn, limit).await.map_err(|e| match e {
                BodyError::Io(source) => io_err(source),
                BodyError::Bad(problem) => bad(problem),
            })?
        } else if let Some(length) = head.content_length {
            if length != limit && head.status == 200 {
                return Err(WebError::BodyLength {
                    url: fetch.url(),
                    expected: limit,
                    got: length,
                });
            }
            read_exact_body(conn, length, fetch).await?
        } else {
            read_to_end(conn, limit).await.map_err(io_err)?
        };
        let keep_alive = delimited
            && if head.minor_version == 0 {
                head.connection_keep_alive && !head.connection_close
            } else {
                !head.connection_close
            };
        return Ok(Some(Response {
            status: head.status,
            body,
            sum_header: head.sum_header,
            keep_alive,
            finished: Instant::now(),
        }));
    }
}

async fn read_exact_body(conn: &mut Conn, length: u64, fetch: &Fetch) -> Result<Vec<u8>, WebError> {
    let length = length as usize;
    while conn.buf.len() < length {
        match fill(conn).await {
            Ok(0) => {
                return Err(WebError::BodyLength {
                    url: fetch.url(),
                    expected: length as u64,
                    got: conn.buf.len() as u64,
                })
            }
            Ok(_) => {}
            Err(source) => {
                return Err(WebError::Io {
                    url: fetch.url(),
                    source,
                })
            }
        }
    }
    Ok(conn.buf.drain(..length).collect())
}

/// A body delimited by the end of the connection; reading stops one byte past `limit` (which
/// is then reported as a length error).
async fn read_to_end(conn: &mut Conn, limit: u64) -> io::Result<Vec<u8>> {
    while (conn.buf.len() as u64) <= limit {
        if fill(conn).await? == 0 {
            break;
        }
    }
    Ok(std::mem::take(&mut conn.buf))
}

enum BodyError {
    Io(io::Error),
    Bad(&'static str),
}

/// A chunked body; stops with an error once it exceeds `limit` by more than a chunk.
async fn read_chunked(conn: &mut Conn, limit: u64) -> Result<Vec<u8>, BodyError> {
    let mut body = Vec::new();
    loop {
        let line = read_line(conn).await?;
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size =
            usize::from_str_radix(size_text, 16).map_err(|_| BodyError::Bad("bad chunk size"))?;
        if size == 0 {
            // Trailer section: header lines until an empty one.
            while !read_line(conn).await?.is_empty() {}
            return Ok(body);
        }
        if (body.len() + size) as u64 > limit.saturating_add(READ_CHUNK as u64) {
            return Err(BodyError::Bad("chunked body far longer than expected"));
        }
        while conn.buf.len() < size + 2 {
            if fill(conn).await.map_err(BodyError::Io)? == 0 {
                return Err(BodyError::Bad("connection closed inside a chunk"));
            }
        }
        if &conn.buf[size..size + 2] != b"\r\n" {
            return Err(BodyError::Bad("chunk not followed by CRLF"));
        }
        body.extend(conn.buf.drain(..size));
        conn.buf.drain(..2);
    }
}

/// One CRLF-terminated line (without the CRLF).
async fn read_line(conn: &mut Conn) -> Result<String, BodyError> {
    loop {
        if let Some(end) = conn.buf.windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&conn.buf[..end]).into_owned();
            conn.buf.drain(..end + 2);
            return Ok(line);
        }
        if conn.buf.len() > MAX_RESPONSE_HEAD_BYTES {
            return Err(BodyError::Bad("chunk line too long"));
        }
        if fill(conn).await.map_err(BodyError::Io)? == 0 {
            return Err(BodyError::Bad("connection closed inside chunk framing"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn response_heads_give_framing_and_persistence() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nx-midway-sum: 00ff\r\n\r\nbody";
        let HeadParse::Complete(parsed) = parse_response_head(head) else {
            panic!("complete head expected");
        };
        assert_eq!(parsed.status, 200);
        assert_eq!(parsed.content_length, Some(12));
        assert_eq!(parsed.head_len, head.len() - 4);
        assert_eq!(parsed.sum_header.as_deref(), Some("00ff"));
        assert!(!parsed.connection_close);

        let head = b"HTTP/1.0 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nConnection: Keep-Alive\r\n\r\n";
        let HeadParse::Complete(parsed) = parse_response_head(head) else {
            panic!("complete head expected");
        };
        assert!(parsed.chunked && parsed.connection_keep_alive);
        assert_eq!(parsed.minor_version, 0);

        let conflicting = b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert!(matches!(
            parse_response_head(conflicting),
            HeadParse::Invalid(_)
        ));
        assert!(matches!(
            parse_response_head(b"HTTP/1.1 200 OK\r\nA"),
            HeadParse::Partial
        ));
        assert!(matches!(
            parse_response_head(b"HTTX 200\r\n\r\n"),
            HeadParse::Invalid(_)
        ));
    }
}
