//! The file form of a TCP profile, as written under `[profiles.NAME]`: every knob optional
//! (`None` inherits, or at the root leaves the kernel's default). midway-tcp resolves presets and
//! inheritance and applies the result to sockets; this is only the data.

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_with::skip_serializing_none;

/// File form of one profile, as written under `[profiles.NAME]` in midway's TOML config.
/// Every field is optional: `None` means "inherit" (or, at the root, "kernel default").
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSpec {
    /// A preset or another profile name; the fields below override it.
    pub inherits: Option<String>,
    /// Name of a congestion control registered in the kernel (`reno`, `cubic`, `bbr`, ...).
    pub congestion_control: Option<String>,
    /// Initial congestion window in segments (route metric `initcwnd`).
    pub initial_cwnd: Option<u32>,
    /// `false` = acknowledge every segment at once.
    pub delayed_ack: Option<bool>,
    /// Duplicate ACKs that trigger fast retransmit (route metric `reordering`, see caveat).
    pub dupack_threshold: Option<u32>,
    /// Floor of the retransmission timeout in milliseconds.
    pub rto_min_ms: Option<u32>,
    /// Send buffer: bytes, or `{ auto = { ... } }` from the hfc-tuning rule.
    pub send_buffer: Option<BufferSize>,
    /// Receive buffer: bytes, or `{ auto = { ... } }` from the hfc-tuning rule.
    pub recv_buffer: Option<BufferSize>,
    /// Maximum segment size in bytes (`TCP_MAXSEG`).
    pub mss: Option<u32>,
    /// Unsent bytes the socket may hold before it stops being writable (`TCP_NOTSENT_LOWAT`).
    pub notsent_lowat: Option<u32>,
    /// `true` = disable Nagle (`TCP_NODELAY`).
    pub nodelay: Option<bool>,
    /// Keepalive probes; absent = off (kernel default).
    pub keepalive: Option<Keepalive>,
    /// `TCP_USER_TIMEOUT` in milliseconds (0 = kernel default behaviour).
    pub user_timeout_ms: Option<u32>,
    /// A connect still unanswered after this many milliseconds gets a second attempt beside
    /// it (a new SYN on a new socket); the first to complete is used. Remote segments only.
    pub connect_backup_ms: Option<u32>,
    /// Ceiling of the socket's pacing rate in bits per second of TCP payload
    /// (`SO_MAX_PACING_RATE`, which takes bytes per second). An integer or a whole float
    /// (`24e6`), like `rate_in_bps` of the buffer rule.
    #[serde(default, deserialize_with = "deserialize_bits_per_second")]
    pub max_pacing_rate_bps: Option<u64>,
    /// TCP Fast Open: a listener accepts data in the SYN (`TCP_FASTOPEN` with a queue), an
    /// outgoing socket sends it with a cookie it got earlier (`TCP_FASTOPEN_CONNECT`).
    pub fast_open: Option<bool>,
    /// With `fast_open` on a listener: Fast Open requests it keeps pending at once.
    pub fast_open_queue: Option<u32>,
}

/// Reads a rate in bits per second written as an integer or as a whole, non-negative float
/// (`24e6`), so that rates can be written the same way as the buffer rule's `rate_in_bps`.
pub(crate) fn deserialize_bits_per_second<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u64>, D::Error> {
    struct RateVisitor;
    impl Visitor<'_> for RateVisitor {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(
                "a rate in bits per second: a non-negative whole number such as 24000000 or 24e6",
            )
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
            // 2^64 is exact as f64; anything at or above it does not fit a u64.
            if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 18_446_744_073_709_551_616.0 {
                Ok(v as u64)
            } else {
                Err(E::invalid_value(de::Unexpected::Float(v), &self))
            }
        }
    }
    deserializer.deserialize_any(RateVisitor).map(Some)
}

/// A buffer size: fixed bytes, or derived from the access device with the hfc-tuning rule.
#[derive(Debug, Clone, PartialEq)]
pub enum BufferSize {
    /// A fixed size in bytes, set with `SO_SNDBUF`/`SO_RCVBUF`.
    Bytes(u32),
    /// Derived from the access device with the hfc-tuning rule (`midway_tcp::bufrule`).
    Auto(AutoBuffer),
}

impl<'de> Deserialize<'de> for BufferSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BufferVisitor;
        impl<'de> Visitor<'de> for BufferVisitor {
            type Value = BufferSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a buffer size in bytes, or { auto = { device_buffer_bytes, rate_in_bps, rate_out_bps, connections_per_device, mss } }")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<BufferSize, E> {
                u32::try_from(v)
                    .map(BufferSize::Bytes)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<BufferSize, E> {
                u32::try_from(v)
                    .map(BufferSize::Bytes)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BufferSize, A::Error> {
                let key: String = map
                    .next_key()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                if key != "auto" {
                    return Err(de::Error::unknown_field(&key, &["auto"]));
                }
                let auto: AutoBuffer = map.next_value()?;
                if let Some(extra) = map.next_key::<String>()? {
                    return Err(de::Error::unknown_field(&extra, &["auto"]));
                }
                Ok(BufferSize::Auto(auto))
            }
        }
        deserializer.deserialize_any(BufferVisitor)
    }
}

impl Serialize for BufferSize {
    /// The forms the file accepts: a number of bytes, or `{ auto = { ... } }`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            BufferSize::Bytes(bytes) => serializer.serialize_u32(*bytes),
            BufferSize::Auto(auto) => {
                let mut map = serializer.serialize_map(Some(1))?;
                map.serialize_entry("auto", auto)?;
                map.end()
            }
        }
    }
}

/// Keepalive settings (`SO_KEEPALIVE` + `TCP_KEEPIDLE`/`TCP_KEEPINTVL`/`TCP_KEEPCNT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Keepalive {
    /// Idle time before the first probe, seconds (`TCP_KEEPIDLE`).
    pub idle_s: u32,
    /// Time between unanswered probes, seconds (`TCP_KEEPINTVL`).
    pub interval_s: u32,
    /// Unanswered probes after which the connection is dropped (`TCP_KEEPCNT`).
    pub count: u32,
}

/// Inputs of the hfc-tuning buffer rule (`midway_tcp::bufrule`), as written in config under
/// `send_buffer = { auto = { ... } }`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AutoBuffer {
    /// Buffer of the access device (cable modem) in bytes.
    pub device_buffer_bytes: u32,
    /// Rate into the device (e.g. HFC downstream), bits per second.
    pub rate_in_bps: f64,
    /// Rate out of the device (e.g. the 10BaseT link to the PC), bits per second.
    pub rate_out_bps: f64,
    /// Connections expected to share one device at once.
    #[serde(default = "default_connections")]
    pub connections_per_device: u32,
    /// Packet payload size in bytes; the paper uses 1460.
    #[serde(default = "default_mss")]
    pub mss: u32,
}

fn default_connections() -> u32 {
    1
}
fn default_mss() -> u32 {
    1460
}
