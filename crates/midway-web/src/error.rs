//! Typed errors of the web workload.
//!
//! Errors name the URL or address they concern, so a failed lab run says which object of which
//! page broke and whether the origin, the proxy in between, or the local setup is to blame.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

/// Everything that can go wrong while serving or loading pages.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    /// The site description cannot be served; the message names the field and the fix.
    #[error("invalid web site description: `{field}` {problem}")]
    InvalidSite {
        /// Name of the offending `SiteSpec` field.
        field: &'static str,
        /// What is wrong with its value and how to fix it.
        problem: String,
    },
    /// The load description cannot be run; the message names the field and the fix.
    #[error("invalid page load description: `{field}` {problem}")]
    InvalidLoad {
        /// Name of the offending `LoadSpec` field.
        field: &'static str,
        /// What is wrong with its value and how to fix it.
        problem: String,
    },
    /// The origin could not listen on its address.
    #[error("origin cannot listen on {addr}")]
    Bind {
        /// The address the origin tried to listen on.
        addr: SocketAddr,
        /// The error from `bind`/`listen`.
        #[source]
        source: io::Error,
    },
    /// The tokio runtime or the origin's thread could not be created.
    #[error("cannot start the web runtime")]
    Runtime(
        /// The error from creating the runtime or spawning the thread.
        #[source]
        io::Error,
    ),
    /// A blocking entry point was called from inside a tokio runtime (it builds its own).
    #[error("called from inside a tokio runtime; call it from a plain thread")]
    InsideRuntime,
    /// A host name of the page has no address in `LoadSpec::resolve`.
    #[error("host `{host}` has no address in the resolve map")]
    Unresolved {
        /// The host name that has no address.
        host: String,
    },
    /// Opening a TCP connection failed.
    #[error("cannot connect to {addr}")]
    Connect {
        /// The address the connection was opened to (origin or proxy).
        addr: SocketAddr,
        /// The error from `connect`.
        #[source]
        source: io::Error,
    },
    /// Reading or writing a connection failed while fetching `url`.
    #[error("connection I/O failed while fetching {url}")]
    Io {
        /// The URL being fetched when the connection failed.
        url: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Connections kept closing before answering `url`, more often than a browser would retry.
    #[error("connections closed {attempts} times before answering {url}")]
    ConnectionClosed {
        /// The URL that never got an answer.
        url: String,
        /// How many connections in a row closed before answering it.
        attempts: u32,
    },
    /// The response to `url` is not valid HTTP/1.x.
    #[error("bad response to {url}: {problem}")]
    BadResponse {
        /// The URL whose response is malformed.
        url: String,
        /// What is wrong with the response.
        problem: &'static str,
    },
    /// The response to `url` has an unexpected status.
    #[error("response to {url} has status {status}, expected 200")]
    Status {
        /// The URL that was requested.
        url: String,
        /// The HTTP status code received instead of 200.
        status: u16,
    },
    /// The body of `url` is shorter or longer than the site description says.
    #[error("body of {url} has {got} bytes, expected {expected}")]
    BodyLength {
        /// The URL whose body has the wrong length.
        url: String,
        /// Body length the site description gives, in bytes.
        expected: u64,
        /// Body length received, in bytes.
        got: u64,
    },
    /// The body of `url` has the right length but the wrong bytes.
    #[error("body of {url} is corrupt (checksum {got:016x}, expected {expected:016x})")]
    BodyChecksum {
        /// The URL whose body is corrupt.
        url: String,
        /// FNV-1a checksum of the body the site description gives.
        expected: u64,
        /// FNV-1a checksum of the body received.
        got: u64,
    },
    /// A base document links something the site description does not contain.
    #[error("page {page} links {url}, which the site does not serve")]
    UnexpectedLink {
        /// Index of the page (0-based, `/page/{i}.html`) whose base document holds the link.
        page: u32,
        /// The linked URL the site does not serve.
        url: String,
    },
    /// A base document links a different number of objects than the site description says.
    #[error("page {page} links {found} objects, expected {expected}")]
    ObjectCount {
        /// Index of the page (0-based, `/page/{i}.html`) whose base document was parsed.
        page: u32,
        /// Objects linked by the base document.
        found: u32,
        /// Objects the site description gives for the page.
        expected: u32,
    },
    /// The whole load did not finish within `LoadSpec::timeout`.
    #[error("page load did not finish within {timeout:?}")]
    Timeout {
        /// The time limit that passed (`LoadSpec::timeout`).
        timeout: Duration,
    },
    /// Chromium's output carries no page load time (the page's load event never ran).
    #[error("chromium output has no `midway-plt:` page load time (did the page finish loading?)")]
    ChromiumNoTiming,
    /// Chromium's output carries a page load time that is not a non-negative number.
    #[error("chromium reported an unreadable page load time `{text}`")]
    ChromiumBadTiming {
        /// The page load time text as Chromium printed it.
        text: String,
    },
}
