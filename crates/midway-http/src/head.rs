//! Request and response heads: parsing with `httparse`, framing rules, hop-by-hop handling.
//!
//! Parsing is pure (bytes in, typed head out) so it is unit-tested and fuzzed directly.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Uri};

use crate::framing::BodyKind;

/// Most header fields accepted in one head.
pub const MAX_HEADERS: usize = 128;

/// Why a head was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// The head did not end within `limit` bytes.
    #[error("head is larger than {limit} bytes")]
    TooLarge {
        /// The size cap that was exceeded, in bytes.
        limit: usize,
    },
    /// The head has more than [`MAX_HEADERS`] header fields.
    #[error("more than {MAX_HEADERS} header fields")]
    TooManyHeaders,
    /// `httparse` rejected the head; the source says where.
    #[error("malformed head")]
    Syntax(#[source] httparse::Error),
    /// The version is neither HTTP/1.0 nor HTTP/1.1.
    #[error("unsupported HTTP version")]
    Version,
    /// The request method is not a valid token.
    #[error("invalid method")]
    Method,
    /// The request target (or CONNECT authority) cannot be parsed.
    #[error("invalid request target")]
    Target,
    /// The absolute-form target has a scheme other than `http`.
    #[error("only http:// targets can be proxied (use CONNECT for TLS)")]
    UnsupportedScheme,
    /// Neither the target nor a Host header names the destination.
    #[error("request target has no host and there is no Host header")]
    MissingHost,
    /// A header name or value is not valid.
    #[error("invalid header field")]
    Header,
    /// Content-Length headers disagree or are not a number.
    #[error("conflicting or invalid Content-Length")]
    ContentLength,
    /// Transfer-Encoding is not text, or applies `chunked` twice or not last.
    #[error("unsupported Transfer-Encoding")]
    TransferEncoding,
    /// The response status code is not a valid three-digit code.
    #[error("invalid status code")]
    Status,
}

/// HTTP/1.0 or HTTP/1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpVersion {
    /// HTTP/1.0.
    Http10,
    /// HTTP/1.1.
    Http11,
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Host name or IP address (without brackets for IPv6).
    pub host: String,
    /// TCP port (80 when the request does not say).
    pub port: u16,
}

impl Origin {
    /// `host:port` as used for pool keys and for name resolution.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// A parsed client request head.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// The request method.
    pub method: Method,
    /// The HTTP version the client spoke.
    pub version: HttpVersion,
    /// Destination (from the absolute-form target, the CONNECT authority or the Host header).
    pub origin: Origin,
    /// Absolute `http://host:port/path?query` form, used as the cache key; for CONNECT the
    /// authority only.
    pub uri: Uri,
    /// Origin-form target sent upstream (`/path?query`).
    pub path_and_query: String,
    /// Header fields as received (hop-by-hop ones included).
    pub headers: HeaderMap,
    /// How the request body is framed.
    pub body: BodyKind,
    /// Whether the client wants the connection kept open after this exchange.
    pub keep_alive: bool,
}

impl RequestHead {
    /// Methods whose pipelined requests may be fetched upstream in parallel.
    pub fn is_idempotent(&self) -> bool {
        matches!(
            self.method,
            Method::GET
                | Method::HEAD
                | Method::OPTIONS
                | Method::TRACE
                | Method::PUT
                | Method::DELETE
        ) && self.body == BodyKind::Empty
    }
}

/// A parsed upstream response head.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    /// The response status code.
    pub status: StatusCode,
    /// The HTTP version the origin spoke.
    pub version: HttpVersion,
    /// The reason phrase (may be empty).
    pub reason: String,
    /// Header fields as received (hop-by-hop ones included).
    pub headers: HeaderMap,
}

impl ResponseHead {
    /// Whether the origin allows reusing the connection after this response.
    pub fn keep_alive(&self) -> bool {
        connection_keep_alive(self.version, &self.headers)
    }

    /// Body framing per RFC 9112 section 6.3, given the request method.
    pub fn body_kind(&self, request_method: &Method) -> Result<BodyKind, HeadError> {
        if request_method == Method::HEAD
            || self.status.is_informational()
            || self.status == StatusCode::NO_CONTENT
            || self.status == StatusCode::NOT_MODIFIED
        {
            return Ok(BodyKind::Empty);
        }
        match transfer_encoding_chunked(&self.headers)? {
            Some(true) => return Ok(BodyKind::Chunked),
            // A final coding other than chunked: the body runs until close.
            Some(false) => return Ok(BodyKind::CloseDelimited),
            None => {}
        }
        match content_length(&self.headers)? {
            Some(n) => Ok(BodyKind::Length(n)),
            None => Ok(BodyKind::CloseDelimited),
        }
    }
}

/// Outcome of trying to parse a head from the bytes read so far.
#[derive(Debug)]
pub enum Parsed<T> {
    /// The head and the number of bytes it occupied.
    Complete(T, usize),
    /// More bytes are needed.
    Partial,
}

fn version_of(minor: Option<u8>) -> Result<HttpVersion, HeadError> {
    match minor {
        Some(0) => Ok(HttpVersion::Http10),
        Some(1) => Ok(HttpVersion::Http11),
        _ => Err(HeadError::Version),
    }
}

fn header_map(raw: &[httparse::Header<'_>]) -> Result<HeaderMap, HeadError> {
    let mut map = HeaderMap::with_capacity(raw.len());
    for field in raw {
        let name = HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| HeadError::Header)?;
        let value = HeaderValue::from_bytes(field.value).map_err(|_| HeadError::Header)?;
        map.append(name, value);
    }
    Ok(map)
}

fn map_httparse(err: httparse::Error) -> HeadError {
    match err {
        httparse::Error::TooManyHeaders => HeadError::TooManyHeaders,
        httparse::Error::Version => HeadError::Version,
        other => HeadError::Syntax(other),
    }
}

/// `Some(true)` if Transfer-Encoding ends in chunked, `Some(false)` for other codings,
/// `None` without the header. Chunked applied twice or not last is rejected.
fn transfer_encoding_chunked(headers: &HeaderMap) -> Result<Option<bool>, HeadError> {
    let mut codings = Vec::new();
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        let text = value.to_str().map_err(|_| HeadError::TransferEncoding)?;
        codings.extend(
            text.split(',')
                .map(|c| c.trim().to_ascii_lowercase())
                .filter(|c| !c.is_empty()),
        );
    }
    if codings.is_empty() {
        return Ok(if headers.contains_key(header::TRANSFER_ENCODING) {
            Some(false)
        } else {
            None
        });
    }
    let chunked_count = codings.iter().filter(|c| *c == "chunked").count();
    let last_is_chunked = codings.last().is_some_and(|c| c == "chunked");
    if chunked_count > 1 || (chunked_count == 1 && !last_is_chunked) {
        return Err(HeadError::TransferEncoding);
    }
    Ok(Some(last_is_chunked))
}

/// All Content-Length values must agree (a list of equal values is allowed by RFC 9110).
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, HeadError> {
    let mut found: Option<u64> = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        let text = value.to_str().map_err(|_| HeadError::ContentLength)?;
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) || part.len() > 19 {
                return Err(HeadError::ContentLength);
            }
            let n: u64 = part.parse().map_err(|_| HeadError::ContentLength)?;
            if found.is_some_and(|f| f != n) {
                return Err(HeadError::ContentLength);
            }
            found = Some(n);
        }
    }
    Ok(found)
}

fn connection_has(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .chain(headers.get_all("proxy-connection").iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

fn connection_keep_alive(version: HttpVersion, headers: &HeaderMap) -> bool {
    match version {
        HttpVersion::Http11 => !connection_has(headers, "close"),
        HttpVersion::Http10 => connection_has(headers, "keep-alive"),
    }
}

fn split_host_port(authority: &str, default_port: u16) -> Result<Origin, HeadError> {
    let authority: http::uri::Authority = authority.parse().map_err(|_| HeadError::Target)?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host.is_empty() {
        return Err(HeadError::MissingHost);
    }
    Ok(Origin {
        host: host.to_ascii_lowercase(),
        port: authority.port_u16().unwrap_or(default_port),
    })
}

/// Length of a complete head, or `None` while more bytes may still complete it; a partial head
/// already longer than the limit is an error, so a client cannot grow the buffer without end.
fn head_length(
    status: httparse::Result<usize>,
    buffered: usize,
    max_header_bytes: usize,
) -> Result<Option<usize>, HeadError> {
    match status.map_err(map_httparse)? {
        httparse::Status::Complete(len) => Ok(Some(len)),
        httparse::Status::Partial if buffered > max_header_bytes => Err(HeadError::TooLarge {
            limit: max_header_bytes,
        }),
        httparse::Status::Partial => Ok(None),
    }
}

/// Parses one request head from the start of `buf`.
///
/// Accepts absolute-form (`GET http://host/path`), authority-form for CONNECT and origin-form
/// with a Host header (for transparent interception of port 80).
pub fn parse_request(
    buf: &[u8],
    max_header_bytes: usize,
) -> Result<Parsed<RequestHead>, HeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut fields);
    let Some(len) = head_length(request.parse(buf), buf.len(), max_header_bytes)? else {
        return Ok(Parsed::Partial);
    };
    if len > max_header_bytes {
        return Err(HeadError::TooLarge {
            limit: max_header_bytes,
        });
    }
    let version = version_of(request.version)?;
    let method = Method::from_bytes(request.method.unwrap_or_default().as_bytes())
        .map_err(|_| HeadError::Method)?;
    let target = request.path.unwrap_or_default();
    let headers = header_map(request.headers)?;

    if method == Method::CONNECT {
        let origin = split_host_port(target, 443)?;
        let uri: Uri = target.parse().map_err(|_| HeadError::Target)?;
        return Ok(Parsed::Complete(
            RequestHead {
                method,
                version,
                origin,
                uri,
                path_and_query: String::new(),
                keep_alive: false,
                headers,
                body: BodyKind::Empty,
            },
            len,
        ));
    }

    let (origin, path_and_query) = if target.starts_with('/') {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .ok_or(HeadError::MissingHost)?;
        (split_host_port(host, 80)?, target.to_string())
    } else {
        let uri: Uri = target.parse().map_err(|_| HeadError::Target)?;
        match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("http") => {}
            Some(_) => return Err(HeadError::UnsupportedScheme),
            None => return Err(HeadError::Target),
        }
        let authority = uri.authority().ok_or(HeadError::MissingHost)?;
        let origin = split_host_port(authority.as_str(), 80)?;
        let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let path = if path.is_empty() { "/" } else { path };
        (origin, path.to_string())
    };
    let uri: Uri = format!("http://{}{}", origin.authority(), path_and_query)
        .parse()
        .map_err(|_| HeadError::Target)?;

    let body = match transfer_encoding_chunked(&headers)? {
        Some(true) => {
            if headers.contains_key(header::CONTENT_LENGTH) {
                // Both framings at once is the classic request smuggling vector: refuse.
                return Err(HeadError::ContentLength);
            }
            BodyKind::Chunked
        }
        // A request body must be chunked-terminated if encoded at all (RFC 9112 6.3).
        Some(false) => return Err(HeadError::TransferEncoding),
        None => match content_length(&headers)? {
            Some(0) | None => BodyKind::Empty,
            Some(n) => BodyKind::Length(n),
        },
    };
    let keep_alive = connection_keep_alive(version, &headers);
    Ok(Parsed::Complete(
        RequestHead {
            method,
            version,
            origin,
            uri,
            path_and_query,
            headers,
            body,
            keep_alive,
        },
        len,
    ))
}

/// Parses one response head from the start of `buf`.
pub fn parse_response(
    buf: &[u8],
    max_header_bytes: usize,
) -> Result<Parsed<ResponseHead>, HeadError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut fields);
    let Some(len) = head_length(response.parse(buf), buf.len(), max_header_bytes)? else {
        return Ok(Parsed::Partial);
    };
    let version = version_of(response.version)?;
    let status =
        StatusCode::from_u16(response.code.unwrap_or_default()).map_err(|_| HeadError::Status)?;
    let headers = header_map(response.headers)?;
    let reason = response.reason.unwrap_or_default().to_string();
    Ok(Parsed::Complete(
        ResponseHead {
            status,
            version,
            reason,
            headers,
        },
        len,
    ))
}

/// Removes hop-by-hop fields (RFC 9110 section 7.6.1), including those named in `Connection`,
/// and the framing fields the proxy sets itself.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .chain(headers.get_all("proxy-connection").iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authorization",
        "proxy-authenticate",
    ] {
        headers.remove(name);
    }
}

/// Appends `1.1 <via_name>` to the `Via` field.
pub fn add_via(headers: &mut HeaderMap, via_name: &str) {
    let ours = format!("1.1 {via_name}");
    let combined = match headers.get(header::VIA).and_then(|v| v.to_str().ok()) {
        Some(existing) => format!("{existing}, {ours}"),
        None => ours,
    };
    if let Ok(value) = HeaderValue::from_str(&combined) {
        headers.insert(header::VIA, value);
    }
}

/// Serializes header fields as `Name: value\r\n` lines.
pub fn write_headers(out: &mut Vec<u8>, headers: &HeaderMap) {
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(buf: &[u8]) -> RequestHead {
        match parse_request(buf, 8192).unwrap() {
            Parsed::Complete(head, len) => {
                assert_eq!(len, buf.len());
                head
            }
            Parsed::Partial => panic!("partial"),
        }
    }

    #[test]
    fn absolute_form_request() {
        let head =
            complete(b"GET http://Example.com:8080/a/b?c=1 HTTP/1.1\r\nHost: example.com\r\n\r\n");
        assert_eq!(
            head.origin,
            Origin {
                host: "example.com".into(),
                port: 8080
            }
        );
        assert_eq!(head.path_and_query, "/a/b?c=1");
        assert_eq!(head.uri.to_string(), "http://example.com:8080/a/b?c=1");
        assert!(head.keep_alive);
        assert_eq!(head.body, BodyKind::Empty);
        let head = complete(b"GET http://example.com HTTP/1.0\r\n\r\n");
        assert_eq!(head.path_and_query, "/");
        assert_eq!(head.origin.port, 80);
        assert!(!head.keep_alive);
    }

    #[test]
    fn origin_form_needs_host() {
        let head = complete(b"GET /x HTTP/1.1\r\nHost: h.test:81\r\n\r\n");
        assert_eq!(
            head.origin,
            Origin {
                host: "h.test".into(),
                port: 81
            }
        );
        assert_eq!(
            parse_request(b"GET /x HTTP/1.1\r\n\r\n", 8192).unwrap_err(),
            HeadError::MissingHost
        );
    }

    #[test]
    fn connect_request() {
        let head = complete(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n");
        assert_eq!(head.method, Method::CONNECT);
        assert_eq!(
            head.origin,
            Origin {
                host: "example.com".into(),
                port: 443
            }
        );
    }

    #[test]
    fn framing_rules() {
        let head = complete(b"POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\n\r\n");
        assert_eq!(head.body, BodyKind::Length(5));
        assert!(!head.is_idempotent());
        let head = complete(b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert_eq!(head.body, BodyKind::Chunked);
        for bad in [
            &b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
                [..],
            b"POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST http://a/ HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        ] {
            assert!(
                parse_request(bad, 8192).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn rejects_garbage_and_oversize() {
        assert!(parse_request(b"\x00\x01garbage\r\n\r\n", 8192).is_err());
        assert!(matches!(
            parse_request(b"GET http://a/ HTTP/1.1\r\nX: ", 8192).unwrap(),
            Parsed::Partial
        ));
        let big = [b"GET http://a/ HTTP/1.1\r\nX: ".as_slice(), &[b'a'; 600]].concat();
        assert_eq!(
            parse_request(&big, 512).unwrap_err(),
            HeadError::TooLarge { limit: 512 }
        );
        assert_eq!(
            parse_request(b"GET https://a/ HTTP/1.1\r\n\r\n", 8192).unwrap_err(),
            HeadError::UnsupportedScheme
        );
        assert_eq!(
            parse_request(b"GET http://a/ HTTP/2.0\r\n\r\n", 8192).unwrap_err(),
            HeadError::Version
        );
    }

    #[test]
    fn response_framing() {
        let parse = |raw: &[u8]| match parse_response(raw, 8192).unwrap() {
            Parsed::Complete(head, _) => head,
            Parsed::Partial => panic!("partial"),
        };
        let head = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n");
        assert_eq!(head.body_kind(&Method::GET).unwrap(), BodyKind::Length(10));
        assert_eq!(head.body_kind(&Method::HEAD).unwrap(), BodyKind::Empty);
        assert!(head.keep_alive());
        let head = parse(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n");
        assert_eq!(head.body_kind(&Method::GET).unwrap(), BodyKind::Empty);
        let head = parse(b"HTTP/1.0 200 OK\r\n\r\n");
        assert_eq!(
            head.body_kind(&Method::GET).unwrap(),
            BodyKind::CloseDelimited
        );
        assert!(!head.keep_alive());
        let head =
            parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
        assert_eq!(head.body_kind(&Method::GET).unwrap(), BodyKind::Chunked);
        assert!(!head.keep_alive());
    }

    #[test]
    fn hop_by_hop_and_via() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("close, x-private"));
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("x-end", HeaderValue::from_static("2"));
        headers.insert("via", HeaderValue::from_static("1.0 other"));
        strip_hop_by_hop(&mut headers);
        add_via(&mut headers, "midway");
        assert!(!headers.contains_key("x-private"));
        assert!(!headers.contains_key("connection"));
        assert!(!headers.contains_key("keep-alive"));
        assert_eq!(headers["x-end"], "2");
        assert_eq!(headers["via"], "1.0 other, 1.1 midway");
    }
}
