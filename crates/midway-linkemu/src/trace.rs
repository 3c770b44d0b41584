//! Capacity traces in mahimahi's format.
//!
//! A trace file holds one integer millisecond timestamp per line; each line is one delivery
//! opportunity for a full-size packet, several lines may carry the same timestamp, and the file
//! repeats with a period equal to its last timestamp (as in mahimahi's `mm-link`, which also
//! requires that last timestamp to be positive). Here one opportunity carries
//! `TRACE_OPPORTUNITY_BYTES` (1514) bytes, one full-size Ethernet frame, and leftover bytes of an
//! opportunity can only serve frames already waiting at that instant.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Bytes delivered by one trace opportunity: one full-size Ethernet frame (1500-byte MTU + 14-byte
/// header), so that one line of the trace is one MTU-sized packet, as in mahimahi.
pub(crate) const TRACE_OPPORTUNITY_BYTES: u64 = 1514;

/// A parsed, validated capacity trace: non-decreasing millisecond timestamps, the last one > 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "TraceData", into = "TraceData")]
pub struct CapacityTrace {
    opportunities_ms: Vec<u64>,
}

/// The serialised form; deserialisation goes through [`CapacityTrace::from_opportunities`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceData {
    opportunities_ms: Vec<u64>,
}

impl TryFrom<TraceData> for CapacityTrace {
    type Error = TraceError;
    fn try_from(data: TraceData) -> Result<Self, TraceError> {
        CapacityTrace::from_opportunities(data.opportunities_ms)
    }
}

impl From<CapacityTrace> for TraceData {
    fn from(trace: CapacityTrace) -> Self {
        TraceData {
            opportunities_ms: trace.opportunities_ms,
        }
    }
}

/// Why a trace cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// The trace has no timestamps at all.
    #[error("the trace has no timestamps")]
    Empty,
    /// A line is not a non-negative integer.
    #[error("line {line}: {text:?} is not a non-negative integer millisecond timestamp")]
    NotATimestamp {
        /// The line number, from 1.
        line: usize,
        /// The line's text, trimmed and cut to 40 characters.
        text: String,
    },
    /// A timestamp is smaller than the one before it.
    #[error("line {line}: timestamp {value} ms is smaller than the one before it ({previous} ms)")]
    Decreasing {
        /// The line number, from 1 (or the 1-based position in a list of opportunities).
        line: usize,
        /// The timestamp on that line, in milliseconds.
        value: u64,
        /// The timestamp before it, in milliseconds.
        previous: u64,
    },
    /// The last timestamp is 0 ms, so the trace would repeat with a period of zero.
    #[error("the trace's last timestamp is 0 ms, so it would repeat with a period of zero")]
    ZeroPeriod,
    /// The trace file could not be read.
    #[error("cannot read trace file {path}: {kind}")]
    Read {
        /// The file that was read.
        path: PathBuf,
        /// The kind of I/O error.
        kind: std::io::ErrorKind,
    },
}

impl CapacityTrace {
    /// Parses the text of a mahimahi trace. Blank lines and surrounding whitespace are ignored.
    pub fn parse(text: &str) -> Result<CapacityTrace, TraceError> {
        let mut opportunities = Vec::new();
        let mut previous: Option<u64> = None;
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() {
                continue;
            }
            let value: u64 = trimmed.parse().map_err(|_| TraceError::NotATimestamp {
                line,
                text: trimmed.chars().take(40).collect(),
            })?;
            if let Some(previous) = previous {
                if value < previous {
                    return Err(TraceError::Decreasing {
                        line,
                        value,
                        previous,
                    });
                }
            }
            previous = Some(value);
            opportunities.push(value);
        }
        CapacityTrace::from_opportunities(opportunities)
    }

    /// Reads and parses a trace file.
    pub fn load(path: &Path) -> Result<CapacityTrace, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|error| TraceError::Read {
            path: path.to_owned(),
            kind: error.kind(),
        })?;
        CapacityTrace::parse(&text)
    }

    /// Builds a trace from timestamps already in memory.
    pub fn from_opportunities(opportunities_ms: Vec<u64>) -> Result<CapacityTrace, TraceError> {
        let trace = CapacityTrace { opportunities_ms };
        trace.validate()?;
        Ok(trace)
    }

    pub(crate) fn validate(&self) -> Result<(), TraceError> {
        let Some(&last) = self.opportunities_ms.last() else {
            return Err(TraceError::Empty);
        };
        for (index, pair) in self.opportunities_ms.windows(2).enumerate() {
            if pair[1] < pair[0] {
                return Err(TraceError::Decreasing {
                    line: index + 2,
                    value: pair[1],
                    previous: pair[0],
                });
            }
        }
        if last == 0 {
            return Err(TraceError::ZeroPeriod);
        }
        Ok(())
    }

    /// The timestamps, in milliseconds from the start of one period.
    pub fn opportunities_ms(&self) -> &[u64] {
        &self.opportunities_ms
    }

    /// Length of one repetition of the trace.
    #[allow(
        clippy::expect_used,
        reason = "every constructor runs `validate`, which refuses an empty trace"
    )]
    pub fn period_ms(&self) -> u64 {
        *self
            .opportunities_ms
            .last()
            .expect("validated trace is not empty")
    }

    /// Average capacity over one period, in bit/s.
    pub fn mean_rate_bps(&self) -> f64 {
        self.opportunities_ms.len() as f64 * TRACE_OPPORTUNITY_BYTES as f64 * 8.0 * 1000.0
            / self.period_ms() as f64
    }

    /// Time in ns of the opportunity with absolute index `index` (counting over repetitions).
    pub(crate) fn opportunity_time_ns(&self, index: u64) -> u64 {
        let count = self.opportunities_ms.len() as u64;
        let cycle = index / count;
        let within = self.opportunities_ms[(index % count) as usize];
        (cycle * self.period_ms() + within).saturating_mul(1_000_000)
    }

    /// Absolute index of the first opportunity at or after `time_ns`.
    pub(crate) fn first_opportunity_at_or_after(&self, time_ns: u64) -> u64 {
        let count = self.opportunities_ms.len() as u64;
        let period_ns = self.period_ms() * 1_000_000;
        let mut cycle = time_ns / period_ns;
        let mut offset_ns = time_ns - cycle * period_ns;
        // The last opportunity of a cycle lies exactly at the start of the next one, so a time
        // on a period boundary is first served by the previous cycle's last timestamp(s).
        if offset_ns == 0 && cycle > 0 {
            cycle -= 1;
            offset_ns = period_ns;
        }
        // First timestamp within this cycle whose time is >= offset; one exists because the last
        // timestamp equals the period.
        let within =
            self.opportunities_ms
                .partition_point(|&ms| ms.saturating_mul(1_000_000) < offset_ns) as u64;
        cycle * count + within
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mahimahi_text() {
        let trace = CapacityTrace::parse("0\n1\n1\n\n 4 \n").unwrap();
        assert_eq!(trace.opportunities_ms(), &[0, 1, 1, 4]);
        assert_eq!(trace.period_ms(), 4);
        // 4 opportunities of 1514 B per 4 ms = 1514 B/ms.
        assert!((trace.mean_rate_bps() - 1514.0 * 8.0 * 1000.0).abs() < 1e-6);
    }

    #[test]
    fn rejects_bad_traces() {
        assert_eq!(CapacityTrace::parse(""), Err(TraceError::Empty));
        assert_eq!(CapacityTrace::parse("\n \n"), Err(TraceError::Empty));
        assert_eq!(CapacityTrace::parse("0\n0\n"), Err(TraceError::ZeroPeriod));
        assert_eq!(
            CapacityTrace::parse("1\n5\n3\n"),
            Err(TraceError::Decreasing {
                line: 3,
                value: 3,
                previous: 5
            })
        );
        assert_eq!(
            CapacityTrace::parse("1\n-2\n"),
            Err(TraceError::NotATimestamp {
                line: 2,
                text: "-2".into()
            })
        );
        assert!(matches!(
            CapacityTrace::parse("1.5\n"),
            Err(TraceError::NotATimestamp { line: 1, .. })
        ));
        assert!(CapacityTrace::from_opportunities(vec![3, 2]).is_err());
        assert!(serde_json::from_str::<CapacityTrace>(r#"{"opportunities_ms":[]}"#).is_err());
    }

    #[test]
    fn load_reports_missing_file() {
        let error = CapacityTrace::load(Path::new("/nonexistent/trace.txt")).unwrap_err();
        assert!(matches!(
            error,
            TraceError::Read {
                kind: std::io::ErrorKind::NotFound,
                ..
            }
        ));
    }

    #[test]
    fn opportunities_repeat_with_the_period() {
        let trace = CapacityTrace::parse("2\n5\n10\n").unwrap();
        let times: Vec<u64> = (0..6).map(|i| trace.opportunity_time_ns(i)).collect();
        assert_eq!(
            times,
            [2, 5, 10, 12, 15, 20].map(|ms| ms * 1_000_000).to_vec()
        );
        assert_eq!(trace.first_opportunity_at_or_after(0), 0);
        assert_eq!(trace.first_opportunity_at_or_after(2_000_000), 0);
        assert_eq!(trace.first_opportunity_at_or_after(2_000_001), 1);
        assert_eq!(trace.first_opportunity_at_or_after(10_000_000), 2); // last of cycle 0
        assert_eq!(trace.first_opportunity_at_or_after(10_000_001), 3);
        assert_eq!(trace.first_opportunity_at_or_after(11_000_000), 3);
        assert_eq!(trace.first_opportunity_at_or_after(15_500_000), 5);
    }
}
