//! The spool's ordering and accounting, without I/O: a FIFO of segments that live either in
//! memory or in a region of the spool file. Bytes leave in exactly the order they arrived,
//! whatever mix of memory and disk held them, so switching between the two (memory full, disk
//! cap reached, disk failed) can never reorder or drop data.
//!
//! The async driver in `pump` reads the server socket, asks [`SpoolQueue::read_allowance`] how
//! much it may take, places each chunk with [`SpoolQueue::plan`], and the client-side writer
//! drains from the front.

use std::collections::VecDeque;

use bytes::Bytes;

/// Where the next chunk read from the server goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpoolPlan {
    /// Keep it in memory.
    Memory,
    /// Append it to the spool file.
    File {
        /// Byte offset in the spool file where the chunk is written.
        offset: u64,
    },
}

/// The front of the queue, as the client-side writer sees it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SpoolFront {
    /// A chunk to write to the client; it stays counted as memory until `delivered`.
    Memory(Bytes),
    /// The next bytes are in the spool file: read up to `len` at `offset`, then call
    /// [`SpoolQueue::file_read_back`].
    File { offset: u64, len: u64 },
}

#[derive(Debug)]
enum Segment {
    Memory(Bytes),
    File { offset: u64, len: u64 },
}

/// FIFO of spooled bytes for one connection (server-to-client direction).
#[derive(Debug)]
pub(crate) struct SpoolQueue {
    segments: VecDeque<Segment>,
    memory_cap: usize,
    file_cap: u64,
    /// Bytes in memory segments plus the chunk the writer is sending.
    memory_used: usize,
    /// Bytes in file segments not yet read back.
    file_live: u64,
    /// Next append offset; back to 0 whenever the file drains completely (then truncated).
    file_end: u64,
    disk_usable: bool,
    peak_held: u64,
}

impl SpoolQueue {
    /// `memory_cap` bytes in memory before using disk; at most `file_cap` bytes live in the file.
    pub(crate) fn new(memory_cap: usize, file_cap: u64) -> Self {
        SpoolQueue {
            segments: VecDeque::new(),
            memory_cap,
            file_cap,
            memory_used: 0,
            file_live: 0,
            file_end: 0,
            disk_usable: file_cap > 0,
            peak_held: 0,
        }
    }

    /// How many bytes the reader may take from the server now (0 = stop reading: backpressure).
    /// `global_disk_room` is what the process-wide disk cap still allows.
    pub(crate) fn read_allowance(&self, global_disk_room: u64, chunk: usize) -> usize {
        let memory_room = self.memory_cap.saturating_sub(self.memory_used) as u64;
        let room = memory_room.max(self.disk_room(global_disk_room));
        usize::try_from(room).unwrap_or(usize::MAX).min(chunk)
    }

    fn disk_room(&self, global_disk_room: u64) -> u64 {
        if self.disk_usable {
            self.file_cap
                .saturating_sub(self.file_live)
                .min(global_disk_room)
        } else {
            0
        }
    }

    /// Where `len` freshly read bytes go: memory while it has room, else the file if both caps
    /// allow, else memory anyway (only reachable when another connection took the global disk
    /// room between `read_allowance` and now; the overshoot is at most one chunk).
    pub(crate) fn plan(&self, len: usize, global_disk_room: u64) -> SpoolPlan {
        if self.memory_used + len <= self.memory_cap {
            SpoolPlan::Memory
        } else if len as u64 <= self.disk_room(global_disk_room) {
            SpoolPlan::File {
                offset: self.file_end,
            }
        } else {
            SpoolPlan::Memory
        }
    }

    /// Appends a chunk that [`Self::plan`] placed in memory (an empty chunk is ignored).
    pub(crate) fn push_memory(&mut self, chunk: Bytes) {
        if chunk.is_empty() {
            return;
        }
        self.memory_used += chunk.len();
        self.segments.push_back(Segment::Memory(chunk));
        self.note_peak();
    }

    /// Records that `len` bytes were written at the offset [`Self::plan`] returned.
    pub(crate) fn push_file(&mut self, len: u64) {
        if len == 0 {
            return;
        }
        let offset = self.file_end;
        self.file_end += len;
        self.file_live += len;
        match self.segments.back_mut() {
            Some(Segment::File {
                offset: back_offset,
                len: back_len,
            }) if *back_offset + *back_len == offset => *back_len += len,
            _ => self.segments.push_back(Segment::File { offset, len }),
        }
        self.note_peak();
    }

    /// A disk write failed: never use the file again for new data (what is already in it is
    /// still read back in order).
    pub(crate) fn disable_disk(&mut self) {
        self.disk_usable = false;
    }

    /// Takes the front memory chunk, or describes the front file region (left in place).
    pub(crate) fn front(&mut self) -> Option<SpoolFront> {
        match self.segments.front()? {
            Segment::File { offset, len } => Some(SpoolFront::File {
                offset: *offset,
                len: *len,
            }),
            Segment::Memory(_) => match self.segments.pop_front() {
                Some(Segment::Memory(chunk)) => Some(SpoolFront::Memory(chunk)),
                _ => None,
            },
        }
    }

    /// The writer read `len` bytes from the front file region into memory. Returns true when
    /// the file no longer holds any live byte, so the caller can truncate it (offsets restart at 0).
    pub(crate) fn file_read_back(&mut self, len: u64) -> bool {
        if let Some(Segment::File {
            offset,
            len: seg_len,
        }) = self.segments.front_mut()
        {
            let taken = len.min(*seg_len);
            *offset += taken;
            *seg_len -= taken;
            self.file_live -= taken;
            self.memory_used += taken as usize;
            if *seg_len == 0 {
                self.segments.pop_front();
            }
        }
        if self.file_live == 0 {
            self.file_end = 0;
            true
        } else {
            false
        }
    }

    /// The writer delivered `len` bytes of the chunk it was holding to the client.
    pub(crate) fn delivered(&mut self, len: usize) {
        self.memory_used = self.memory_used.saturating_sub(len);
    }

    #[cfg(test)]
    /// Whether no spooled byte is waiting for the client (memory or file).
    pub(crate) fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Bytes held now (memory, including the writer's chunk, plus file).
    pub(crate) fn held(&self) -> u64 {
        self.memory_used as u64 + self.file_live
    }

    /// Bytes held in memory now, including the chunk the writer is delivering.
    pub(crate) fn memory_used(&self) -> usize {
        self.memory_used
    }

    #[cfg(test)]
    /// Bytes in the spool file not yet read back.
    pub(crate) fn file_live(&self) -> u64 {
        self.file_live
    }

    /// The most bytes ever held at once (memory plus file).
    pub(crate) fn peak_held(&self) -> u64 {
        self.peak_held
    }

    fn note_peak(&mut self) {
        self.peak_held = self.peak_held.max(self.held());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drains the queue the way the writer does, reading file regions from `file`.
    fn drain(queue: &mut SpoolQueue, file: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..10_000 {
            match queue.front() {
                None => return out,
                Some(SpoolFront::Memory(chunk)) => {
                    out.extend_from_slice(&chunk);
                    queue.delivered(chunk.len());
                }
                Some(SpoolFront::File { offset, len }) => {
                    let take = len.min(3);
                    let start = offset as usize;
                    out.extend_from_slice(&file[start..start + take as usize]);
                    queue.file_read_back(take);
                    queue.delivered(take as usize);
                }
            }
        }
        panic!("queue did not drain");
    }

    #[test]
    fn memory_then_file_keeps_order_and_caps() {
        let mut queue = SpoolQueue::new(4, 100);
        let mut file = Vec::new();
        let mut expected = Vec::new();
        for i in 0u8..20 {
            let chunk = vec![i; 2];
            expected.extend_from_slice(&chunk);
            assert!(queue.read_allowance(u64::MAX, 64) >= 2);
            match queue.plan(2, u64::MAX) {
                SpoolPlan::Memory => queue.push_memory(Bytes::from(chunk)),
                SpoolPlan::File { offset } => {
                    assert_eq!(offset as usize, file.len());
                    file.extend_from_slice(&chunk);
                    queue.push_file(2);
                }
            }
        }
        assert_eq!(queue.memory_used(), 4, "memory fills first, up to its cap");
        assert_eq!(queue.file_live(), 36);
        assert_eq!(queue.peak_held(), 40);
        assert_eq!(drain(&mut queue, &file), expected);
        assert_eq!(queue.held(), 0);
    }

    #[test]
    fn caps_turn_into_backpressure() {
        let queue_full = {
            let mut queue = SpoolQueue::new(4, 6);
            queue.push_memory(Bytes::from_static(b"abcd"));
            queue.push_file(6);
            queue
        };
        assert_eq!(queue_full.read_allowance(u64::MAX, 64), 0);
        let mut queue = SpoolQueue::new(4, 100);
        queue.push_memory(Bytes::from_static(b"abcd"));
        assert_eq!(queue.read_allowance(5, 64), 5, "global disk room limits");
        assert_eq!(queue.read_allowance(0, 64), 0);
        assert_eq!(queue.plan(2, 0), SpoolPlan::Memory, "overshoot, never drop");
    }

    #[test]
    fn disk_failure_falls_back_to_memory_in_order() {
        let mut queue = SpoolQueue::new(2, 100);
        let file = b"cdef".to_vec();
        queue.push_memory(Bytes::from_static(b"ab"));
        assert_eq!(queue.plan(4, u64::MAX), SpoolPlan::File { offset: 0 });
        queue.push_file(4);
        queue.disable_disk();
        assert_eq!(
            queue.read_allowance(u64::MAX, 64),
            0,
            "memory full, disk gone"
        );
        assert_eq!(queue.plan(2, u64::MAX), SpoolPlan::Memory);
        queue.push_memory(Bytes::from_static(b"gh"));
        assert_eq!(drain(&mut queue, &file), b"abcdefgh");
    }

    #[test]
    fn drained_file_restarts_at_offset_zero() {
        let mut queue = SpoolQueue::new(0, 100);
        assert_eq!(queue.plan(3, u64::MAX), SpoolPlan::File { offset: 0 });
        queue.push_file(3);
        assert!(!queue.file_read_back(2));
        assert!(queue.file_read_back(1));
        assert_eq!(queue.plan(3, u64::MAX), SpoolPlan::File { offset: 0 });
        assert!(queue.is_empty());
    }

    /// Seeded random interleavings of reads, partial writes, file read-backs and a disk
    /// failure: the output is always exactly the input, and the caps always hold.
    #[test]
    fn random_interleavings_never_reorder_or_exceed_caps() {
        use rand::{Rng, SeedableRng};
        for seed in 0..200u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let memory_cap = rng.gen_range(1..64);
            let file_cap = rng.gen_range(0..256);
            let mut queue = SpoolQueue::new(memory_cap, file_cap);
            let mut file = vec![0u8; 4096];
            let (mut input, mut output) = (Vec::new(), Vec::new());
            let mut in_flight: Option<Bytes> = None;
            let mut next_byte = 0u8;
            for step in 0..2_000 {
                if step == 1_000 && rng.gen_bool(0.5) {
                    queue.disable_disk();
                }
                if rng.gen_bool(0.5) {
                    let allowance = queue.read_allowance(u64::MAX, 16);
                    if allowance > 0 {
                        let len = rng.gen_range(1..=allowance);
                        let chunk: Vec<u8> = (0..len)
                            .map(|_| {
                                next_byte = next_byte.wrapping_add(1);
                                next_byte
                            })
                            .collect();
                        input.extend_from_slice(&chunk);
                        match queue.plan(len, u64::MAX) {
                            SpoolPlan::Memory => queue.push_memory(Bytes::from(chunk)),
                            SpoolPlan::File { offset } => {
                                let start = offset as usize;
                                file[start..start + len].copy_from_slice(&chunk);
                                queue.push_file(len as u64);
                            }
                        }
                    }
                } else {
                    if in_flight.is_none() {
                        in_flight = match queue.front() {
                            Some(SpoolFront::Memory(chunk)) => Some(chunk),
                            Some(SpoolFront::File { offset, len }) => {
                                let take = len.min(rng.gen_range(1..8));
                                let start = offset as usize;
                                let chunk =
                                    Bytes::copy_from_slice(&file[start..start + take as usize]);
                                queue.file_read_back(take);
                                Some(chunk)
                            }
                            None => None,
                        };
                    }
                    if let Some(chunk) = in_flight.as_mut() {
                        let written = rng.gen_range(0..=chunk.len());
                        output.extend_from_slice(&chunk.split_to(written));
                        queue.delivered(written);
                        if chunk.is_empty() {
                            in_flight = None;
                        }
                    }
                }
                assert!(queue.memory_used() <= memory_cap + 8, "seed {seed}");
                assert!(queue.file_live() <= file_cap, "seed {seed}");
                assert_eq!(
                    queue.held(),
                    (input.len() - output.len()) as u64,
                    "seed {seed}: held bytes are exactly those not yet delivered"
                );
            }
            // Drain the rest.
            for _ in 0..100_000 {
                if let Some(chunk) = in_flight.take() {
                    output.extend_from_slice(&chunk);
                    queue.delivered(chunk.len());
                }
                match queue.front() {
                    Some(SpoolFront::Memory(chunk)) => in_flight = Some(chunk),
                    Some(SpoolFront::File { offset, len }) => {
                        let start = offset as usize;
                        in_flight =
                            Some(Bytes::copy_from_slice(&file[start..start + len as usize]));
                        queue.file_read_back(len);
                    }
                    None => break,
                }
            }
            if let Some(chunk) = in_flight.take() {
                output.extend_from_slice(&chunk);
                queue.delivered(chunk.len());
            }
            assert!(!input.is_empty(), "seed {seed}: the run moved bytes");
            assert_eq!(output, input, "seed {seed}");
            assert_eq!(queue.held(), 0);
        }
    }
}
