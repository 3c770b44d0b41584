//! Typed errors of the HTTP proxy mode.
//!
//! Errors say which side they came from (client, upstream, cache store, configuration) so the
//! caller can tell a misbehaving peer from a local fault.

use std::io;

use crate::framing::FramingError;
use crate::head::HeadError;

/// Everything that can go wrong in the HTTP proxy mode.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// A configuration value is out of range; the message names the field and the fix.
    #[error("invalid http proxy config: `{field}` {problem}")]
    Config {
        /// Name of the offending config field.
        field: &'static str,
        /// What is wrong with its value and how to fix it.
        problem: &'static str,
    },
    /// The disk cache directory could not be prepared.
    #[error("cannot prepare the disk cache directory")]
    CacheDir(#[source] io::Error),
    /// Reading from or writing to the client failed.
    #[error("client connection I/O failed")]
    ClientIo(#[source] io::Error),
    /// The client sent a body that violates its framing.
    #[error("bad request body framing from the client")]
    ClientBody(#[source] FramingError),
    /// Connecting to or talking with the origin server failed.
    #[error("upstream I/O failed")]
    UpstreamIo(#[source] io::Error),
    /// The origin server sent a response head that cannot be parsed.
    #[error("bad response head from the upstream server")]
    UpstreamHead(#[source] HeadError),
    /// The origin server sent a body that violates its framing.
    #[error("bad response body framing from the upstream server")]
    UpstreamBody(#[source] FramingError),
    /// The origin server did not answer in time.
    #[error("upstream server did not answer within the timeout")]
    UpstreamTimeout,
    /// The client went away while a response was being produced.
    #[error("client went away before the response was delivered")]
    ClientGone,
}

impl HttpError {
    /// Whether the failure happened before anything reached the origin, so an idempotent
    /// request may be retried on a fresh connection (a pooled connection closed by the origin).
    pub fn is_retryable_upstream(&self) -> bool {
        matches!(self, HttpError::UpstreamIo(_)) && !self.is_denied_destination()
    }

    /// Whether the connector refused the origin by policy (the proxy's `denied_destinations`):
    /// it reports that as an I/O error of kind `PermissionDenied`, answered with 403.
    pub fn is_denied_destination(&self) -> bool {
        matches!(self, HttpError::UpstreamIo(e) if e.kind() == io::ErrorKind::PermissionDenied)
    }
}
