//! The bytes the proxy writes itself rather than relays: its own short responses, the request
//! head sent upstream (origin-form, our framing fields) and the response head sent to the
//! client with the framing and closing it implies. Pure functions, kept apart from the I/O.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};

use crate::framing::BodyKind;
use crate::head::{add_via, strip_hop_by_hop, write_headers, HttpVersion, RequestHead};

/// How the body goes to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClientFraming {
    None,
    Length,
    Chunked,
    Close,
}

fn reason(status: StatusCode) -> &'static str {
    status.canonical_reason().unwrap_or("")
}

/// A complete short response produced by the proxy itself.
pub(super) fn simple_response(status: StatusCode, via_name: &str, close: bool) -> Bytes {
    let body = format!("{} {}\n", status.as_str(), reason(status));
    let connection = if close { "close" } else { "keep-alive" };
    format!(
        "HTTP/1.1 {} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nVia: 1.1 {via_name}\r\nConnection: {connection}\r\n\r\n{body}",
        status.as_str(),
        reason(status),
        body.len()
    )
    .into()
}

fn host_header(head: &RequestHead) -> String {
    let host = if head.origin.host.contains(':') {
        format!("[{}]", head.origin.host)
    } else {
        head.origin.host.clone()
    };
    if head.origin.port == 80 {
        host
    } else {
        format!("{host}:{}", head.origin.port)
    }
}

/// Serializes the request as sent upstream (origin-form, HTTP/1.1, our framing fields).
pub(super) fn upstream_request_bytes(
    method: &Method,
    head: &RequestHead,
    headers: &HeaderMap,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(
        format!(
            "{} {} HTTP/1.1\r\nHost: {}\r\n",
            method,
            head.path_and_query,
            host_header(head)
        )
        .as_bytes(),
    );
    let mut headers = headers.clone();
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    write_headers(&mut out, &headers);
    match head.body {
        BodyKind::Length(n) => out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes()),
        BodyKind::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        BodyKind::Empty | BodyKind::CloseDelimited => {}
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Builds the response head for the client and decides framing and closing.
pub(super) fn client_response_head(
    status: StatusCode,
    mut headers: HeaderMap,
    upstream_body: BodyKind,
    client: &RequestHead,
    via_name: &str,
) -> (Bytes, ClientFraming, bool) {
    strip_hop_by_hop(&mut headers);
    add_via(&mut headers, via_name);
    let framing = match upstream_body {
        BodyKind::Empty => {
            // HEAD and 304 keep Content-Length as metadata; 1xx/204 must not carry it.
            if status == StatusCode::NO_CONTENT || status.is_informational() {
                headers.remove(header::CONTENT_LENGTH);
            }
            ClientFraming::None
        }
        BodyKind::Length(n) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            ClientFraming::Length
        }
        BodyKind::Chunked | BodyKind::CloseDelimited => {
            headers.remove(header::CONTENT_LENGTH);
            if client.version == HttpVersion::Http11 {
                headers.insert(
                    header::TRANSFER_ENCODING,
                    HeaderValue::from_static("chunked"),
                );
                ClientFraming::Chunked
            } else {
                ClientFraming::Close
            }
        }
    };
    let close = !client.keep_alive || framing == ClientFraming::Close;
    if close {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    } else if client.version == HttpVersion::Http10 {
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
    }
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(
        format!("HTTP/1.1 {} {}\r\n", status.as_str(), reason(status)).as_bytes(),
    );
    write_headers(&mut out, &headers);
    out.extend_from_slice(b"\r\n");
    (out.into(), framing, close)
}
