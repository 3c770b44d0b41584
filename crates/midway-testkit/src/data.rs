//! Checksummed test data: deterministic byte patterns, their SHA-256, and the size of the bulk
//! transfers.

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes for a large checksum transfer: `$MIDWAY_TEST_BYTES` (scripts/test sets 1 GiB for the
/// release acceptance run), else `default`.
pub fn bulk_bytes(default: usize) -> usize {
    std::env::var("MIDWAY_TEST_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// SHA-256 of `data`.
pub fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Deterministic pseudo-random bytes (xorshift64*), cheap enough for hundreds of MiB in debug.
pub struct Pattern {
    state: u64,
}

impl Pattern {
    /// The stream of bytes for `seed`.
    pub fn new(seed: u64) -> Self {
        Pattern {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    /// Fills `buf` with the next bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.state ^= self.state >> 12;
            self.state ^= self.state << 25;
            self.state ^= self.state >> 27;
            let word = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// Writes `len` pattern bytes, then shuts the write side down (FIN). Returns their SHA-256.
pub async fn send_pattern<W: AsyncWriteExt + Unpin>(
    writer: &mut W,
    len: u64,
    seed: u64,
) -> std::io::Result<[u8; 32]> {
    let mut pattern = Pattern::new(seed);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        pattern.fill(&mut buf[..n]);
        hasher.update(&buf[..n]);
        writer.write_all(&buf[..n]).await?;
        left -= n as u64;
    }
    writer.shutdown().await?;
    Ok(hasher.finalize().into())
}

/// Reads to EOF; returns (bytes, SHA-256).
pub async fn receive_all<R: AsyncReadExt + Unpin>(
    reader: &mut R,
) -> std::io::Result<(u64, [u8; 32])> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            return Ok((total, hasher.finalize().into()));
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
}
