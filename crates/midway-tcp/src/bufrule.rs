//! The hfc-tuning buffer rule (seed 001, section 5.2).
//!
//! A cable modem (or any access device) with a buffer of `C` packets is fed at `r_in` and drained
//! at `r_out`. While a window of `B` packets arrives back to back, the queue grows by
//! `(1 - r_out / r_in)` packets per packet received after the first. Allowing at most one drop per
//! window (the paper's relaxed condition, which avoids the timeouts that collapse throughput), `n`
//! connections sharing the device stay safe while
//!
//! ```text
//! C >= n (B - 1) (1 - r_out / r_in)
//! ```
//!
//! so the largest window is `B = 1 + C / (n (1 - r_out / r_in))`. The paper's example: a 10 KB
//! modem buffer holds 7 packets of 1460 B, 25 Mbit/s in, 10 Mbit/s out, one connection:
//! `B = 1 + 7 / 0.6 = 12.67` packets, about 18.5 KB (the paper rounds to 19 KB).
//!
//! All functions are pure.

use midway_config::AutoBuffer;

/// Buffer returned when the device never queues (`r_out >= r_in`): the rule then puts no bound on
/// the window, so the size is left to what a long fat segment needs. 4 MiB covers 320 Mbit/s at
/// 100 ms RTT and is Linux's default `tcp_wmem` maximum.
pub(crate) const UNBOUNDED_BUFFER_CAP_BYTES: u32 = 4 * 1024 * 1024;

/// Why the rule's inputs make no sense.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BufRuleError {
    /// A rate is not a finite number above zero.
    #[error(
        "rate_in_bps and rate_out_bps must be finite and > 0 (got in {rate_in}, out {rate_out})"
    )]
    BadRate {
        /// `rate_in_bps` as written, bits per second.
        rate_in: f64,
        /// `rate_out_bps` as written, bits per second.
        rate_out: f64,
    },
    /// `connections_per_device` is 0.
    #[error("connections_per_device must be >= 1")]
    NoConnections,
    /// `mss` (the field, bytes) is outside what TCP over IPv4 allows.
    #[error("mss must be between 88 and 65495 bytes (got {0})")]
    BadMss(u32),
    /// The device buffer cannot hold even one packet.
    #[error("device_buffer_bytes ({device}) holds no full packet of mss {mss} bytes")]
    DeviceBufferTooSmall {
        /// `device_buffer_bytes` as written, bytes.
        device: u32,
        /// `mss` as written, bytes.
        mss: u32,
    },
}

/// Largest window `B` in packets for a device buffer of `c_packets` shared by `n` connections,
/// or `None` when `r_out >= r_in` (the device never queues, no bound).
pub(crate) fn max_window_packets(
    c_packets: f64,
    n: u32,
    rate_in: f64,
    rate_out: f64,
) -> Option<f64> {
    if rate_out >= rate_in {
        return None;
    }
    let growth_per_packet = 1.0 - rate_out / rate_in;
    Some(1.0 + c_packets / (f64::from(n.max(1)) * growth_per_packet))
}

/// Socket buffer in bytes from the rule: `floor(B * mss)`, with `C` counted in whole packets
/// (a partial packet cannot be queued). Capped at [`UNBOUNDED_BUFFER_CAP_BYTES`].
pub(crate) fn auto_buffer_bytes(auto: &AutoBuffer) -> Result<u32, BufRuleError> {
    let rates_ok = |r: f64| r.is_finite() && r > 0.0;
    if !rates_ok(auto.rate_in_bps) || !rates_ok(auto.rate_out_bps) {
        return Err(BufRuleError::BadRate {
            rate_in: auto.rate_in_bps,
            rate_out: auto.rate_out_bps,
        });
    }
    if auto.connections_per_device == 0 {
        return Err(BufRuleError::NoConnections);
    }
    if !(88..=65495).contains(&auto.mss) {
        return Err(BufRuleError::BadMss(auto.mss));
    }
    let c_packets = auto.device_buffer_bytes / auto.mss;
    if c_packets == 0 {
        return Err(BufRuleError::DeviceBufferTooSmall {
            device: auto.device_buffer_bytes,
            mss: auto.mss,
        });
    }
    let Some(window) = max_window_packets(
        f64::from(c_packets),
        auto.connections_per_device,
        auto.rate_in_bps,
        auto.rate_out_bps,
    ) else {
        return Ok(UNBOUNDED_BUFFER_CAP_BYTES);
    };
    let bytes = (window * f64::from(auto.mss)).floor();
    Ok(bytes.min(f64::from(UNBOUNDED_BUFFER_CAP_BYTES)) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hfc(n: u32) -> AutoBuffer {
        AutoBuffer {
            device_buffer_bytes: 10 * 1024,
            rate_in_bps: 25e6,
            rate_out_bps: 10e6,
            connections_per_device: n,
            mss: 1460,
        }
    }

    #[test]
    fn paper_example_gives_about_19_kb() {
        let w = max_window_packets(7.0, 1, 25e6, 10e6).unwrap();
        assert!((w - (1.0 + 7.0 / 0.6)).abs() < 1e-9);
        let bytes = auto_buffer_bytes(&hfc(1)).unwrap();
        assert_eq!(bytes, ((1.0 + 7.0 / 0.6) * 1460.0f64).floor() as u32);
        assert!((18_000..=19_500).contains(&bytes), "{bytes}");
        // The paper's figure: 16 KB works, 24 KB collapses.
        assert!(bytes > 16 * 1024 && bytes < 24 * 1024);
    }

    #[test]
    fn more_connections_shrink_the_window() {
        let one = auto_buffer_bytes(&hfc(1)).unwrap();
        let four = auto_buffer_bytes(&hfc(4)).unwrap();
        assert!(four < one);
        assert_eq!(four, ((1.0 + 7.0 / (4.0 * 0.6)) * 1460.0f64).floor() as u32);
    }

    #[test]
    fn device_that_never_queues_gets_the_cap() {
        let mut a = hfc(1);
        a.rate_out_bps = 25e6;
        assert_eq!(max_window_packets(7.0, 1, 25e6, 25e6), None);
        assert_eq!(auto_buffer_bytes(&a).unwrap(), UNBOUNDED_BUFFER_CAP_BYTES);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let mut a = hfc(0);
        assert_eq!(auto_buffer_bytes(&a), Err(BufRuleError::NoConnections));
        a = hfc(1);
        a.rate_in_bps = f64::NAN;
        assert!(matches!(
            auto_buffer_bytes(&a),
            Err(BufRuleError::BadRate { .. })
        ));
        a = hfc(1);
        a.device_buffer_bytes = 1000;
        assert!(matches!(
            auto_buffer_bytes(&a),
            Err(BufRuleError::DeviceBufferTooSmall { .. })
        ));
        a = hfc(1);
        a.mss = 10;
        assert_eq!(auto_buffer_bytes(&a), Err(BufRuleError::BadMss(10)));
    }
}
