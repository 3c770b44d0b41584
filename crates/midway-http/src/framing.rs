//! HTTP/1.x message body framing as a small pure state machine (RFC 9112 section 6-7).
//!
//! [`BodyDecoder`] is fed raw bytes as they arrive and reports, per step, how many input bytes
//! it consumed and which sub-range of them is payload. It never buffers: the caller keeps the
//! bytes, so memory stays bounded by the caller's read buffer. Chunk extensions and trailers
//! are accepted with length caps and dropped (the proxy re-frames every body it forwards).

use std::ops::Range;

/// Longest chunk-size line (size digits plus extensions) accepted.
pub const MAX_CHUNK_LINE_BYTES: usize = 4096;
/// Largest trailer section accepted after the last chunk.
pub const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// How the length of a message body is determined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// No body at all (HEAD responses, 1xx/204/304, requests without length headers).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Everything until the peer closes (responses only).
    CloseDelimited,
}

/// Body framing violations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// A chunk-size line is not hex digits optionally followed by an extension.
    #[error("invalid chunk size line")]
    BadChunkSize,
    /// A chunk-size line is longer than [`MAX_CHUNK_LINE_BYTES`].
    #[error("chunk size line longer than {MAX_CHUNK_LINE_BYTES} bytes")]
    ChunkLineTooLong,
    /// Chunk data is not followed by CRLF.
    #[error("missing CRLF after chunk data")]
    MissingChunkCrlf,
    /// The trailer section is longer than [`MAX_TRAILER_BYTES`].
    #[error("trailer section longer than {MAX_TRAILER_BYTES} bytes")]
    TrailersTooLong,
    /// The input ended (peer closed) before the body was complete.
    #[error("connection closed before the body was complete")]
    Truncated,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Reading hex digits of the size.
    Size { size: u64, digits: u8 },
    /// After the digits: optional whitespace / extension until CR.
    Extension,
    /// CR seen on the size line, expecting LF.
    SizeLf,
    /// Inside chunk data.
    Data { remaining: u64 },
    /// After chunk data, expecting CR.
    DataCr,
    /// After chunk data CR, expecting LF.
    DataLf,
    /// Start of a trailer line (or the final empty line).
    TrailerLineStart,
    /// Inside a non-empty trailer line.
    TrailerLine,
    /// CR seen inside a trailer line, expecting LF.
    TrailerLf,
    /// CR of the final empty line seen, expecting LF.
    FinalLf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Length {
        remaining: u64,
    },
    Chunked {
        state: ChunkState,
        /// Size of the chunk whose size line is being finished.
        pending_size: u64,
        line_bytes: usize,
        trailer_bytes: usize,
    },
    Close,
    Done,
}

/// One decoding step: `consumed` input bytes are used up; `payload` (a sub-range of them)
/// is body content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Input bytes used up by this step, counted from the start of the input given.
    pub consumed: usize,
    /// Byte range, within the input given, that is body content (possibly empty).
    pub payload: Range<usize>,
}

/// Incremental body decoder.
#[derive(Debug, Clone)]
pub struct BodyDecoder {
    state: State,
}

impl BodyDecoder {
    /// A decoder for a body framed as `kind`.
    pub fn new(kind: BodyKind) -> Self {
        let state = match kind {
            BodyKind::Empty | BodyKind::Length(0) => State::Done,
            BodyKind::Length(n) => State::Length { remaining: n },
            BodyKind::Chunked => State::Chunked {
                state: ChunkState::Size { size: 0, digits: 0 },
                pending_size: 0,
                line_bytes: 0,
                trailer_bytes: 0,
            },
            BodyKind::CloseDelimited => State::Close,
        };
        Self { state }
    }

    /// True once the whole body has been seen.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The peer closed its side: fine for close-delimited bodies, truncation otherwise.
    pub fn finish_on_eof(&mut self) -> Result<(), FramingError> {
        match self.state {
            State::Close | State::Done => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(FramingError::Truncated),
        }
    }

    /// Decodes as far as possible into `input`, stopping after the first payload range so
    /// the caller can hand it on. Returns `consumed == 0` only when more input is needed
    /// (or the body is done).
    pub fn step(&mut self, input: &[u8]) -> Result<Step, FramingError> {
        match &mut self.state {
            State::Done => Ok(Step {
                consumed: 0,
                payload: 0..0,
            }),
            State::Close => Ok(Step {
                consumed: input.len(),
                payload: 0..input.len(),
            }),
            State::Length { remaining } => {
                let take = (*remaining).min(input.len() as u64) as usize;
                *remaining -= take as u64;
                if *remaining == 0 {
                    self.state = State::Done;
                }
                Ok(Step {
                    consumed: take,
                    payload: 0..take,
                })
            }
            State::Chunked { .. } => self.step_chunked(input),
        }
    }

    fn step_chunked(&mut self, input: &[u8]) -> Result<Step, FramingError> {
        let State::Chunked {
            state,
            pending_size,
            line_bytes,
            trailer_bytes,
        } = &mut self.state
        else {
            unreachable!("step_chunked is only called in the chunked state");
        };
        let mut pos = 0;
        while pos < input.len() {
            let byte = input[pos];
            match *state {
                ChunkState::Data { remaining } => {
                    let take = remaining.min((input.len() - pos) as u64) as usize;
                    let left = remaining - take as u64;
                    *state = if left == 0 {
                        ChunkState::DataCr
                    } else {
                        ChunkState::Data { remaining: left }
                    };
                    return Ok(Step {
                        consumed: pos + take,
                        payload: pos..pos + take,
                    });
                }
                ChunkState::Size { size, digits } => {
                    *line_bytes += 1;
                    if let Some(value) = (byte as char).to_digit(16) {
                        if digits >= 16 {
                            return Err(FramingError::BadChunkSize);
                        }
                        *state = ChunkState::Size {
                            size: size * 16 + u64::from(value),
                            digits: digits + 1,
                        };
                    } else if digits == 0 {
                        return Err(FramingError::BadChunkSize);
                    } else {
                        *pending_size = size;
                        *state = match byte {
                            b'\r' => ChunkState::SizeLf,
                            b';' | b' ' | b'\t' => ChunkState::Extension,
                            _ => return Err(FramingError::BadChunkSize),
                        };
                    }
                }
                ChunkState::Extension => {
                    *line_bytes += 1;
                    match byte {
                        b'\r' => *state = ChunkState::SizeLf,
                        b'\n' => return Err(FramingError::BadChunkSize),
                        _ => {}
                    }
                }
                ChunkState::SizeLf => {
                    if byte != b'\n' {
                        return Err(FramingError::BadChunkSize);
                    }
                    *line_bytes = 0;
                    *state = if *pending_size == 0 {
                        ChunkState::TrailerLineStart
                    } else {
                        ChunkState::Data {
                            remaining: *pending_size,
                        }
                    };
                }
                ChunkState::DataCr => {
                    if byte != b'\r' {
                        return Err(FramingError::MissingChunkCrlf);
                    }
                    *state = ChunkState::DataLf;
                }
                ChunkState::DataLf => {
                    if byte != b'\n' {
                        return Err(FramingError::MissingChunkCrlf);
                    }
                    *state = ChunkState::Size { size: 0, digits: 0 };
                }
                ChunkState::TrailerLineStart => {
                    *trailer_bytes += 1;
                    *state = if byte == b'\r' {
                        ChunkState::FinalLf
                    } else {
                        ChunkState::TrailerLine
                    };
                }
                ChunkState::TrailerLine => {
                    *trailer_bytes += 1;
                    if byte == b'\r' {
                        *state = ChunkState::TrailerLf;
                    }
                }
                ChunkState::TrailerLf => {
                    *trailer_bytes += 1;
                    if byte != b'\n' {
                        return Err(FramingError::BadChunkSize);
                    }
                    *state = ChunkState::TrailerLineStart;
                }
                ChunkState::FinalLf => {
                    if byte != b'\n' {
                        return Err(FramingError::BadChunkSize);
                    }
                    self.state = State::Done;
                    return Ok(Step {
                        consumed: pos + 1,
                        payload: 0..0,
                    });
                }
            }
            if *line_bytes > MAX_CHUNK_LINE_BYTES {
                return Err(FramingError::ChunkLineTooLong);
            }
            if *trailer_bytes > MAX_TRAILER_BYTES {
                return Err(FramingError::TrailersTooLong);
            }
            pos += 1;
        }
        Ok(Step {
            consumed: pos,
            payload: 0..0,
        })
    }
}

/// Frames one piece of payload as an HTTP/1.1 chunk.
pub fn encode_chunk(payload: &[u8]) -> bytes::Bytes {
    let mut out = Vec::with_capacity(payload.len() + 20);
    out.extend_from_slice(format!("{:x}\r\n", payload.len()).as_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    out.into()
}

/// The last chunk with an empty trailer section.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` in pieces of `piece` bytes, returns payload and whether done.
    fn decode_all(
        kind: BodyKind,
        input: &[u8],
        piece: usize,
    ) -> Result<(Vec<u8>, bool, usize), FramingError> {
        let mut decoder = BodyDecoder::new(kind);
        let mut payload = Vec::new();
        let mut fed = 0;
        let mut buf: Vec<u8> = Vec::new();
        let mut used = 0;
        for _ in 0..input.len() * 4 + 10 {
            if decoder.is_done() {
                break;
            }
            let step = decoder.step(&buf)?;
            payload.extend_from_slice(&buf[step.payload.clone()]);
            buf.drain(..step.consumed);
            used += step.consumed;
            if step.consumed == 0 {
                if fed == input.len() {
                    break;
                }
                let end = (fed + piece).min(input.len());
                buf.extend_from_slice(&input[fed..end]);
                fed = end;
            }
        }
        Ok((payload, decoder.is_done(), used))
    }

    #[test]
    fn content_length_stops_at_length() {
        let (payload, done, used) = decode_all(BodyKind::Length(5), b"helloEXTRA", 3).unwrap();
        assert_eq!(payload, b"hello");
        assert!(done);
        assert_eq!(used, 5);
    }

    #[test]
    fn chunked_with_extensions_and_trailers_in_every_split() {
        let wire = b"5;name=val\r\nhello\r\nB\r\n world, big\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
        for piece in 1..wire.len() {
            let (payload, done, used) = decode_all(BodyKind::Chunked, wire, piece).unwrap();
            assert_eq!(payload, b"hello world, big", "piece {piece}");
            assert!(done);
            assert_eq!(used, wire.len() - 4, "must stop before the next message");
        }
    }

    #[test]
    fn chunked_errors() {
        assert_eq!(
            decode_all(BodyKind::Chunked, b"zz\r\n", 4).unwrap_err(),
            FramingError::BadChunkSize
        );
        assert_eq!(
            decode_all(BodyKind::Chunked, b"2\r\nabXY", 8).unwrap_err(),
            FramingError::MissingChunkCrlf
        );
        assert_eq!(
            decode_all(BodyKind::Chunked, b"11111111111111111\r\n", 32).unwrap_err(),
            FramingError::BadChunkSize
        );
        let long_ext = [b"1;".as_slice(), &vec![b'a'; MAX_CHUNK_LINE_BYTES + 10]].concat();
        assert_eq!(
            decode_all(BodyKind::Chunked, &long_ext, 64).unwrap_err(),
            FramingError::ChunkLineTooLong
        );
        let long_trailer = [b"0\r\n".as_slice(), &vec![b'a'; MAX_TRAILER_BYTES + 10]].concat();
        assert_eq!(
            decode_all(BodyKind::Chunked, &long_trailer, 64).unwrap_err(),
            FramingError::TrailersTooLong
        );
    }

    #[test]
    fn eof_handling() {
        let mut close = BodyDecoder::new(BodyKind::CloseDelimited);
        assert_eq!(
            close.step(b"abc").unwrap(),
            Step {
                consumed: 3,
                payload: 0..3
            }
        );
        close.finish_on_eof().unwrap();
        assert!(close.is_done());
        let mut length = BodyDecoder::new(BodyKind::Length(10));
        length.step(b"abc").unwrap();
        assert_eq!(length.finish_on_eof().unwrap_err(), FramingError::Truncated);
        assert!(BodyDecoder::new(BodyKind::Empty).is_done());
    }

    #[test]
    fn encoder_roundtrips_through_decoder() {
        let mut wire = Vec::new();
        for part in [b"abc".as_slice(), &[7u8; 300], b"z"] {
            wire.extend_from_slice(&encode_chunk(part));
        }
        wire.extend_from_slice(LAST_CHUNK);
        let (payload, done, _) = decode_all(BodyKind::Chunked, &wire, 7).unwrap();
        assert!(done);
        assert_eq!(payload.len(), 304);
    }
}
