//! Profiles: the file form ([`ProfileSpec`]), the named presets, inheritance and validation into
//! the resolved form ([`TcpProfile`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

pub use midway_config::{AutoBuffer, BufferSize, Keepalive, ProfileSpec};
use serde::Serialize;

use crate::bufrule::{auto_buffer_bytes, BufRuleError};
use crate::presets::{preset_spec, PRESET_NAMES};

/// Validated, resolved profile: no `inherits`, buffers in bytes. `None` = kernel default.
/// Serializes (e.g. into lab results) with unset knobs left out; `Display` gives one log line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TcpProfile {
    /// The profile's name: a preset's or a key of `[profiles.*]`.
    pub name: String,
    /// Congestion control set with `TCP_CONGESTION` (`cubic`, `bbr`, ...). `highspeed` and
    /// `gentle-highspeed` are midway's own BPF congestion controls (`midway-bpf`), which the
    /// kernel knows as `mw_highspeed` and `mw_gentle_hs` (see
    /// [`TcpProfile::kernel_congestion_control`]); they name midway's, never the kernel's
    /// `tcp_highspeed` module.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub congestion_control: Option<String>,
    /// Initial congestion window in segments (route metric `initcwnd`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_cwnd: Option<u32>,
    /// `Some(false)`: acknowledge every segment at once (route metric `quickack`, `TCP_QUICKACK`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delayed_ack: Option<bool>,
    /// Duplicate ACKs that trigger fast retransmit (route metric `reordering`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dupack_threshold: Option<u32>,
    /// Floor of the retransmission timeout, milliseconds (`TCP_RTO_MIN_US` or route metric `rto_min`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rto_min_ms: Option<u32>,
    /// Bytes asked of `SO_SNDBUF` (the kernel reports twice this, for its bookkeeping).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub send_buffer: Option<u32>,
    /// Bytes asked of `SO_RCVBUF` (the kernel reports twice this, for its bookkeeping).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recv_buffer: Option<u32>,
    /// Maximum segment size, bytes (`TCP_MAXSEG`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mss: Option<u32>,
    /// Unsent bytes the socket may hold before it stops being writable (`TCP_NOTSENT_LOWAT`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notsent_lowat: Option<u32>,
    /// `Some(true)`: Nagle's algorithm off (`TCP_NODELAY`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodelay: Option<bool>,
    /// Keepalive probe timing; `None`: keepalive off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keepalive: Option<Keepalive>,
    /// Time unacknowledged data may stay in flight before the connection is dropped,
    /// milliseconds (`TCP_USER_TIMEOUT`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_timeout_ms: Option<u32>,
    /// A connect still unanswered after this long gets a second attempt beside it (a new SYN
    /// on a new socket), milliseconds; the first to complete wins. For remote segments: a lost
    /// SYN otherwise costs the kernel's initial retransmission timeout, one second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_backup_ms: Option<u32>,
    /// Pacing ceiling in bits per second of TCP payload; applied as `SO_MAX_PACING_RATE` =
    /// this / 8 bytes per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_pacing_rate_bps: Option<u64>,
    /// `Some(true)`: TCP Fast Open (listener: `TCP_FASTOPEN` with [`Self::fast_open_queue`];
    /// outgoing: `TCP_FASTOPEN_CONNECT`). Needs bits of `net.ipv4.tcp_fastopen`, see
    /// [`TcpProfile::check_fast_open`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fast_open: Option<bool>,
    /// Pending Fast Open requests a listener keeps; `None` with `fast_open`:
    /// [`crate::DEFAULT_FAST_OPEN_QUEUE`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fast_open_queue: Option<u32>,
    /// `SO_MARK` that selects this profile's routing table (route-metric knobs). Filled by the
    /// caller from [`crate::RouteKnobs::mark_for`] after [`crate::RouteKnobs::install`]; the
    /// `apply_*` functions refuse a profile that needs route knobs while this is `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route_mark: Option<u32>,
}

impl TcpProfile {
    /// A profile that sets nothing (the `default` preset under another name).
    pub fn kernel_default(name: &str) -> TcpProfile {
        TcpProfile {
            name: name.to_owned(),
            congestion_control: None,
            initial_cwnd: None,
            delayed_ack: None,
            dupack_threshold: None,
            rto_min_ms: None,
            send_buffer: None,
            recv_buffer: None,
            mss: None,
            notsent_lowat: None,
            nodelay: None,
            keepalive: None,
            user_timeout_ms: None,
            connect_backup_ms: None,
            max_pacing_rate_bps: None,
            fast_open: None,
            fast_open_queue: None,
            route_mark: None,
        }
    }

    /// The BPF congestion control this profile names, if any: it must be registered
    /// (`midway_bpf::register`) before a socket can take it.
    pub fn bpf_congestion_control(&self) -> Option<midway_bpf::Algorithm> {
        self.congestion_control
            .as_deref()
            .and_then(midway_bpf::Algorithm::from_name)
    }

    /// The congestion control's name as the kernel knows it (`TCP_CONGESTION`, the available
    /// list): the profile's name, except for midway's BPF ones (`highspeed` is `mw_highspeed`,
    /// `gentle-highspeed` is `mw_gentle_hs`).
    pub fn kernel_congestion_control(&self) -> Option<&str> {
        match self.bpf_congestion_control() {
            Some(algorithm) => Some(algorithm.kernel_name()),
            None => self.congestion_control.as_deref(),
        }
    }
}

impl fmt::Display for TcpProfile {
    /// `name: knob=value ...` with only the knobs that are set, for start-up logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.name)?;
        let mut any = false;
        let mut knob = |f: &mut fmt::Formatter<'_>, name: &str, value: Option<String>| {
            if let Some(v) = value {
                any = true;
                write!(f, " {name}={v}")
            } else {
                Ok(())
            }
        };
        knob(f, "congestion_control", self.congestion_control.clone())?;
        knob(f, "initial_cwnd", self.initial_cwnd.map(|v| v.to_string()))?;
        knob(f, "delayed_ack", self.delayed_ack.map(|v| v.to_string()))?;
        knob(
            f,
            "dupack_threshold",
            self.dupack_threshold.map(|v| v.to_string()),
        )?;
        knob(f, "rto_min_ms", self.rto_min_ms.map(|v| v.to_string()))?;
        knob(f, "send_buffer", self.send_buffer.map(|v| v.to_string()))?;
        knob(f, "recv_buffer", self.recv_buffer.map(|v| v.to_string()))?;
        knob(f, "mss", self.mss.map(|v| v.to_string()))?;
        knob(
            f,
            "notsent_lowat",
            self.notsent_lowat.map(|v| v.to_string()),
        )?;
        knob(f, "nodelay", self.nodelay.map(|v| v.to_string()))?;
        knob(
            f,
            "keepalive",
            self.keepalive
                .map(|k| format!("{}s/{}s/{}", k.idle_s, k.interval_s, k.count)),
        )?;
        knob(
            f,
            "user_timeout_ms",
            self.user_timeout_ms.map(|v| v.to_string()),
        )?;
        knob(
            f,
            "connect_backup_ms",
            self.connect_backup_ms.map(|v| v.to_string()),
        )?;
        knob(
            f,
            "max_pacing_rate_bps",
            self.max_pacing_rate_bps.map(|v| v.to_string()),
        )?;
        knob(f, "fast_open", self.fast_open.map(|v| v.to_string()))?;
        knob(
            f,
            "fast_open_queue",
            self.fast_open_queue.map(|v| v.to_string()),
        )?;
        knob(f, "route_mark", self.route_mark.map(|v| format!("{v:#x}")))?;
        if !any {
            f.write_str(" kernel defaults")?;
        }
        Ok(())
    }
}

/// Why the profiles in the config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// A profile name with characters or a length the config does not allow.
    #[error("profile name {name:?} is invalid: use 1-32 characters a-z, 0-9, '-' or '_'")]
    BadName {
        /// The name as written.
        name: String,
    },
    /// A profile in the config has the name of a preset.
    #[error("profile {name:?} has the name of a preset; pick another name and write `inherits = \"{name}\"` to start from the preset")]
    ShadowsPreset {
        /// The profile's name, which is also a preset's.
        name: String,
    },
    /// `inherits` names neither a preset nor a profile of the config.
    #[error("profile {profile:?} inherits {parent:?}, which is neither a preset ({presets}) nor a profile in the config", presets = PRESET_NAMES.join(", "))]
    UnknownParent {
        /// Name of the profile, as written under `[profiles.NAME]`.
        profile: String,
        /// The name its `inherits` gives.
        parent: String,
    },
    /// Profiles inherit from each other in a loop.
    #[error("profiles inherit from each other in a cycle: {}", chain.join(" -> "))]
    InheritanceCycle {
        /// Profile names along the loop, the first repeated at the end.
        chain: Vec<String>,
    },
    /// A knob's value is outside the range midway accepts for it.
    #[error("profile {profile:?}: {knob} = {value} is out of range, allowed {min}..={max}")]
    OutOfRange {
        /// Name of the profile, as written under `[profiles.NAME]`.
        profile: String,
        /// Name of the knob as written in the profile.
        knob: &'static str,
        /// The value written, in the knob's unit (bytes, milliseconds, segments, bits per second).
        value: u64,
        /// Smallest value allowed, same unit.
        min: u64,
        /// Largest value allowed, same unit.
        max: u64,
    },
    /// A `congestion_control` that cannot be a kernel congestion control's name.
    #[error("profile {profile:?}: congestion_control {name:?} is not a valid name (1-15 characters a-z, 0-9, '_', '-')")]
    BadCongestionControlName {
        /// Name of the profile, as written under `[profiles.NAME]`.
        profile: String,
        /// The name as written.
        name: String,
    },
    /// A buffer given as `{ auto = { ... } }` whose inputs make no sense.
    #[error("profile {profile:?}: {knob} = auto cannot be computed")]
    AutoBuffer {
        /// Name of the profile, as written under `[profiles.NAME]`.
        profile: String,
        /// `send_buffer` or `recv_buffer`.
        knob: &'static str,
        /// What is wrong with the rule's inputs.
        #[source]
        source: BufRuleError,
    },
}

fn valid_profile_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn valid_cc_name(name: &str) -> bool {
    // midway's BPF congestion controls: `gentle-highspeed` is longer than a kernel name may be,
    // and is applied as its kernel name.
    if midway_bpf::Algorithm::from_name(name).is_some() {
        return true;
    }
    // TCP_CA_NAME_MAX is 16 including the NUL.
    (1..=15).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Field by field: the child's value wins over the parent's.
fn merge(parent: ProfileSpec, child: &ProfileSpec) -> ProfileSpec {
    fn pick<T: Clone>(child: &Option<T>, parent: Option<T>) -> Option<T> {
        child.clone().or(parent)
    }
    ProfileSpec {
        inherits: None,
        congestion_control: pick(&child.congestion_control, parent.congestion_control),
        initial_cwnd: pick(&child.initial_cwnd, parent.initial_cwnd),
        delayed_ack: pick(&child.delayed_ack, parent.delayed_ack),
        dupack_threshold: pick(&child.dupack_threshold, parent.dupack_threshold),
        rto_min_ms: pick(&child.rto_min_ms, parent.rto_min_ms),
        send_buffer: pick(&child.send_buffer, parent.send_buffer),
        recv_buffer: pick(&child.recv_buffer, parent.recv_buffer),
        mss: pick(&child.mss, parent.mss),
        notsent_lowat: pick(&child.notsent_lowat, parent.notsent_lowat),
        nodelay: pick(&child.nodelay, parent.nodelay),
        keepalive: pick(&child.keepalive, parent.keepalive),
        user_timeout_ms: pick(&child.user_timeout_ms, parent.user_timeout_ms),
        connect_backup_ms: pick(&child.connect_backup_ms, parent.connect_backup_ms),
        max_pacing_rate_bps: pick(&child.max_pacing_rate_bps, parent.max_pacing_rate_bps),
        fast_open: pick(&child.fast_open, parent.fast_open),
        fast_open_queue: pick(&child.fast_open_queue, parent.fast_open_queue),
    }
}

/// Follow `inherits` from `name` to a root, merging on the way back.
fn flatten(
    name: &str,
    specs: &BTreeMap<String, ProfileSpec>,
    chain: &mut Vec<String>,
) -> Result<ProfileSpec, ProfileError> {
    if chain.iter().any(|seen| seen == name) {
        chain.push(name.to_owned());
        return Err(ProfileError::InheritanceCycle {
            chain: chain.clone(),
        });
    }
    chain.push(name.to_owned());
    let spec = match specs.get(name) {
        Some(spec) => spec.clone(),
        None => {
            // Presets have no parent.
            return preset_spec(name).ok_or_else(|| ProfileError::UnknownParent {
                profile: chain[chain.len().saturating_sub(2)].clone(),
                parent: name.to_owned(),
            });
        }
    };
    let parent = match &spec.inherits {
        Some(parent) => flatten(parent, specs, chain)?,
        None => ProfileSpec::default(),
    };
    Ok(merge(parent, &spec))
}

fn check_range(
    profile: &str,
    knob: &'static str,
    value: Option<u32>,
    min: u32,
    max: u32,
) -> Result<(), ProfileError> {
    check_range_u64(profile, knob, value.map(u64::from), min.into(), max.into())
}

fn check_range_u64(
    profile: &str,
    knob: &'static str,
    value: Option<u64>,
    min: u64,
    max: u64,
) -> Result<(), ProfileError> {
    match value {
        Some(v) if !(min..=max).contains(&v) => Err(ProfileError::OutOfRange {
            profile: profile.to_owned(),
            knob,
            value: v,
            min,
            max,
        }),
        _ => Ok(()),
    }
}

/// Range of `max_pacing_rate_bps`. 0 is refused: a ceiling of nothing is a mistake, not a
/// setting (the kernel takes it, and its pacers treat it differently). The floor, 8 kbit/s, is
/// one full-size segment per 1.5 s: below that a segment waits for its pacing slot longer than
/// the initial RTO (1 s). The ceiling,
/// 1 Tbit/s, is above any NIC; a larger number is a typo (bytes for bits, an extra zero), and
/// "no cap" is written by leaving the knob out.
pub(crate) const PACING_RATE_RANGE_BPS: (u64, u64) = (8_000, 1_000_000_000_000);

/// Smallest and largest buffer midway accepts; the kernel doubles the value into an `int`.
pub(crate) const BUFFER_RANGE: (u32, u32) = (2048, 1 << 30);

fn resolve_buffer(
    profile: &str,
    knob: &'static str,
    size: Option<BufferSize>,
) -> Result<Option<u32>, ProfileError> {
    let bytes = match size {
        None => return Ok(None),
        Some(BufferSize::Bytes(b)) => b,
        Some(BufferSize::Auto(auto)) => {
            auto_buffer_bytes(&auto).map_err(|source| ProfileError::AutoBuffer {
                profile: profile.to_owned(),
                knob,
                source,
            })?
        }
    };
    check_range(profile, knob, Some(bytes), BUFFER_RANGE.0, BUFFER_RANGE.1)?;
    Ok(Some(bytes))
}

fn validate(name: &str, spec: ProfileSpec) -> Result<TcpProfile, ProfileError> {
    if let Some(cc) = &spec.congestion_control {
        if !valid_cc_name(cc) {
            return Err(ProfileError::BadCongestionControlName {
                profile: name.to_owned(),
                name: cc.clone(),
            });
        }
    }
    // Ranges are the kernel's own limits (tcp.h / route metrics), so a value that passes here
    // is one the kernel can take.
    check_range(name, "initial_cwnd", spec.initial_cwnd, 1, 1000)?;
    check_range(name, "dupack_threshold", spec.dupack_threshold, 1, 300)?;
    check_range(
        name,
        "rto_min_ms",
        spec.rto_min_ms,
        crate::apply::RTO_MIN_FLOOR_MS,
        120_000,
    )?;
    check_range(name, "mss", spec.mss, 88, 32767)?;
    check_range(
        name,
        "notsent_lowat",
        spec.notsent_lowat,
        1,
        i32::MAX as u32,
    )?;
    check_range(
        name,
        "user_timeout_ms",
        spec.user_timeout_ms,
        0,
        i32::MAX as u32,
    )?;
    // At least 10 ms: an earlier second SYN would race the first on any real path.
    check_range(
        name,
        "connect_backup_ms",
        spec.connect_backup_ms,
        10,
        60_000,
    )?;
    check_range_u64(
        name,
        "max_pacing_rate_bps",
        spec.max_pacing_rate_bps,
        PACING_RATE_RANGE_BPS.0,
        PACING_RATE_RANGE_BPS.1,
    )?;
    // The kernel caps a listener's Fast Open queue at its backlog limit (somaxconn).
    check_range(name, "fast_open_queue", spec.fast_open_queue, 1, 65_535)?;
    if let Some(ka) = spec.keepalive {
        check_range(name, "keepalive.idle_s", Some(ka.idle_s), 1, 32767)?;
        check_range(name, "keepalive.interval_s", Some(ka.interval_s), 1, 32767)?;
        check_range(name, "keepalive.count", Some(ka.count), 1, 127)?;
    }
    Ok(TcpProfile {
        name: name.to_owned(),
        send_buffer: resolve_buffer(name, "send_buffer", spec.send_buffer)?,
        recv_buffer: resolve_buffer(name, "recv_buffer", spec.recv_buffer)?,
        congestion_control: spec.congestion_control,
        initial_cwnd: spec.initial_cwnd,
        delayed_ack: spec.delayed_ack,
        dupack_threshold: spec.dupack_threshold,
        rto_min_ms: spec.rto_min_ms,
        mss: spec.mss,
        notsent_lowat: spec.notsent_lowat,
        nodelay: spec.nodelay,
        keepalive: spec.keepalive,
        user_timeout_ms: spec.user_timeout_ms,
        connect_backup_ms: spec.connect_backup_ms,
        max_pacing_rate_bps: spec.max_pacing_rate_bps,
        fast_open: spec.fast_open,
        fast_open_queue: spec.fast_open_queue,
        route_mark: None,
    })
}

/// Presets plus user profiles (user names may not shadow presets), inheritance resolved, values
/// validated. Whether the running kernel can honour a profile is checked later by
/// [`TcpProfile::check_supported`].
pub fn resolve_profiles(
    specs: &BTreeMap<String, ProfileSpec>,
) -> Result<BTreeMap<String, TcpProfile>, ProfileError> {
    for name in specs.keys() {
        if preset_spec(name).is_some() {
            return Err(ProfileError::ShadowsPreset { name: name.clone() });
        }
        if !valid_profile_name(name) {
            return Err(ProfileError::BadName { name: name.clone() });
        }
    }
    let names: BTreeSet<&str> = PRESET_NAMES
        .iter()
        .copied()
        .chain(specs.keys().map(String::as_str))
        .collect();
    let mut out = BTreeMap::new();
    for name in names {
        let flat = flatten(name, specs, &mut Vec::new())?;
        out.insert(name.to_owned(), validate(name, flat)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::{preset_names, HFC_MODEM};
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        profiles: BTreeMap<String, ProfileSpec>,
    }

    fn parse(text: &str) -> Result<BTreeMap<String, ProfileSpec>, toml::de::Error> {
        toml::from_str::<File>(text).map(|f| f.profiles)
    }

    #[test]
    fn parses_every_knob() {
        let specs = parse(
            r#"
            [profiles.edge]
            inherits = "hfc-local"
            congestion_control = "reno"
            initial_cwnd = 4
            delayed_ack = false
            dupack_threshold = 2
            rto_min_ms = 100
            send_buffer = 65536
            recv_buffer = { auto = { device_buffer_bytes = 10240, rate_in_bps = 25e6, rate_out_bps = 10e6, connections_per_device = 2, mss = 1460 } }
            mss = 1400
            notsent_lowat = 16384
            nodelay = true
            keepalive = { idle_s = 30, interval_s = 5, count = 3 }
            user_timeout_ms = 20000
            max_pacing_rate_bps = 24e6
            "#,
        )
        .unwrap();
        let edge = &specs["edge"];
        assert_eq!(edge.send_buffer, Some(BufferSize::Bytes(65536)));
        assert!(
            matches!(&edge.recv_buffer, Some(BufferSize::Auto(a)) if a.connections_per_device == 2)
        );
        assert_eq!(
            edge.keepalive,
            Some(Keepalive {
                idle_s: 30,
                interval_s: 5,
                count: 3
            })
        );
        let resolved = resolve_profiles(&specs).unwrap();
        let p = &resolved["edge"];
        assert_eq!(p.congestion_control.as_deref(), Some("reno"));
        assert_eq!(
            p.recv_buffer,
            Some(((1.0 + 7.0 / (2.0 * 0.6)) * 1460.0f64).floor() as u32)
        );
        assert_eq!(p.user_timeout_ms, Some(20000));
        assert_eq!(p.max_pacing_rate_bps, Some(24_000_000));
        assert!(
            p.to_string().contains("max_pacing_rate_bps=24000000"),
            "{p}"
        );
    }

    #[test]
    fn pacing_rate_takes_integers_and_whole_floats_only() {
        for (text, bps) in [
            ("23000000", 23_000_000),
            ("23e6", 23_000_000),
            ("23.5e6", 23_500_000),
        ] {
            let specs = parse(&format!("[profiles.p]\nmax_pacing_rate_bps = {text}\n")).unwrap();
            assert_eq!(specs["p"].max_pacing_rate_bps, Some(bps), "{text}");
        }
        assert_eq!(
            parse("[profiles.p]\n").unwrap()["p"].max_pacing_rate_bps,
            None
        );
        for text in ["-1", "1.5", "-2e6", "1e30", "nan", "inf", "\"24Mbit\""] {
            let err = parse(&format!("[profiles.p]\nmax_pacing_rate_bps = {text}\n")).unwrap_err();
            assert!(err.to_string().contains("bits per second"), "{text}: {err}");
        }
    }

    #[test]
    fn auto_buffer_takes_integer_rates_and_defaults() {
        let specs = parse("[profiles.a]\nsend_buffer = { auto = { device_buffer_bytes = 10240, rate_in_bps = 25000000, rate_out_bps = 10000000 } }\n").unwrap();
        let p = &resolve_profiles(&specs).unwrap()["a"];
        assert_eq!(p.send_buffer, auto_buffer_bytes(&HFC_MODEM).ok());
    }

    #[test]
    fn display_and_json_show_only_set_knobs() {
        let r = resolve_profiles(&BTreeMap::new()).unwrap();
        assert_eq!(r["default"].to_string(), "default: kernel defaults");
        let wan = r["wan"].to_string();
        assert!(wan.starts_with("wan: congestion_control=bbr"), "{wan}");
        assert!(wan.contains("keepalive=60s/10s/6"), "{wan}");
        let json = serde_json::to_value(&r["wan"]).unwrap();
        assert_eq!(json["send_buffer"], 4 * 1024 * 1024);
        assert!(json.get("mss").is_none());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = parse("[profiles.a]\ncongestion = \"bbr\"\n").unwrap_err();
        assert!(err.to_string().contains("congestion"), "{err}");
        let err =
            parse("[profiles.a]\nkeepalive = { idle_s = 1, interval_s = 1, count = 1, x = 2 }\n")
                .unwrap_err();
        assert!(err.to_string().contains('x'), "{err}");
        let err = parse("[profiles.a]\nsend_buffer = { automatic = {} }\n").unwrap_err();
        assert!(err.to_string().contains("automatic"), "{err}");
        let err = parse("[profiles.a]\nsend_buffer = { auto = { device_buffer_bytes = 1, rate_in_bps = 1, rate_out_bps = 1, speed = 3 } }\n").unwrap_err();
        assert!(err.to_string().contains("speed"), "{err}");
        assert!(parse("[profiles.a]\nsend_buffer = -5\n").is_err());
        assert!(parse("[profiles.a]\nsend_buffer = \"auto\"\n").is_err());
    }

    #[test]
    fn presets_resolve_and_cannot_be_shadowed() {
        let resolved = resolve_profiles(&BTreeMap::new()).unwrap();
        assert_eq!(
            resolved.keys().map(String::as_str).collect::<Vec<_>>(),
            preset_names()
        );
        assert_eq!(resolved["default"], TcpProfile::kernel_default("default"));
        let hfc = &resolved["hfc-local"];
        assert_eq!(hfc.delayed_ack, Some(false));
        assert_eq!(hfc.dupack_threshold, Some(1));
        assert!(hfc.initial_cwnd.unwrap() >= 2);
        assert_eq!(hfc.congestion_control.as_deref(), Some("bbr"));
        assert_eq!(
            hfc.send_buffer, None,
            "buffers are left to autotuning, see the preset"
        );
        assert_eq!(
            resolved["satellite-local"].congestion_control.as_deref(),
            Some("bbr")
        );
        assert!(resolved["wan"].send_buffer.unwrap() >= 1 << 20);
        let lan = &resolved["lan"];
        assert_eq!(lan.congestion_control.as_deref(), Some("cubic"));
        assert_eq!(lan.delayed_ack, Some(false));
        assert_eq!(lan.nodelay, Some(true));

        let specs = parse("[profiles.wan]\nmss = 1000\n").unwrap();
        assert!(
            matches!(resolve_profiles(&specs), Err(ProfileError::ShadowsPreset { name }) if name == "wan")
        );
    }

    #[test]
    fn inheritance_chains_override_field_by_field() {
        let specs = parse(
            r#"
            [profiles.a]
            inherits = "wan"
            mss = 1200
            [profiles.b]
            inherits = "a"
            congestion_control = "cubic"
            "#,
        )
        .unwrap();
        let r = resolve_profiles(&specs).unwrap();
        let b = &r["b"];
        assert_eq!(b.congestion_control.as_deref(), Some("cubic"));
        assert_eq!(b.mss, Some(1200));
        assert_eq!(b.send_buffer, Some(4 * 1024 * 1024));
        assert_eq!(b.name, "b");
    }

    #[test]
    fn cycles_and_unknown_parents_are_rejected() {
        let specs = parse("[profiles.a]\ninherits = \"b\"\n[profiles.b]\ninherits = \"c\"\n[profiles.c]\ninherits = \"a\"\n").unwrap();
        match resolve_profiles(&specs) {
            Err(ProfileError::InheritanceCycle { chain }) => {
                assert_eq!(chain, ["a", "b", "c", "a"])
            }
            other => panic!("{other:?}"),
        }
        let specs = parse("[profiles.a]\ninherits = \"a\"\n").unwrap();
        assert!(matches!(
            resolve_profiles(&specs),
            Err(ProfileError::InheritanceCycle { .. })
        ));
        let specs = parse("[profiles.a]\ninherits = \"nope\"\n").unwrap();
        match resolve_profiles(&specs) {
            Err(e @ ProfileError::UnknownParent { .. }) => {
                assert!(e.to_string().contains("\"a\" inherits \"nope\""), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn values_are_validated() {
        for (text, knob) in [
            ("mss = 20", "mss"),
            ("initial_cwnd = 0", "initial_cwnd"),
            ("dupack_threshold = 0", "dupack_threshold"),
            ("rto_min_ms = 1", "rto_min_ms"),
            ("send_buffer = 10", "send_buffer"),
            ("max_pacing_rate_bps = 0", "max_pacing_rate_bps"),
            ("max_pacing_rate_bps = 7999", "max_pacing_rate_bps"),
            ("max_pacing_rate_bps = 24e12", "max_pacing_rate_bps"),
            (
                "keepalive = { idle_s = 0, interval_s = 1, count = 1 }",
                "keepalive.idle_s",
            ),
            (
                "keepalive = { idle_s = 1, interval_s = 1, count = 500 }",
                "keepalive.count",
            ),
        ] {
            let specs = parse(&format!("[profiles.x]\n{text}\n")).unwrap();
            match resolve_profiles(&specs) {
                Err(ProfileError::OutOfRange { knob: k, .. }) => assert_eq!(k, knob, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let specs = parse("[profiles.x]\ncongestion_control = \"gentle-highspeed-x\"\n").unwrap();
        assert!(matches!(
            resolve_profiles(&specs),
            Err(ProfileError::BadCongestionControlName { .. })
        ));
        let specs = parse("[profiles.x]\ncongestion_control = \"Not A CC!\"\n").unwrap();
        assert!(matches!(
            resolve_profiles(&specs),
            Err(ProfileError::BadCongestionControlName { .. })
        ));
        let specs = parse("[profiles.x]\nsend_buffer = { auto = { device_buffer_bytes = 100, rate_in_bps = 1e6, rate_out_bps = 1e5 } }\n").unwrap();
        assert!(matches!(
            resolve_profiles(&specs),
            Err(ProfileError::AutoBuffer {
                knob: "send_buffer",
                ..
            })
        ));
        let specs = parse("[profiles.\"Bad Name\"]\n").unwrap();
        assert!(matches!(
            resolve_profiles(&specs),
            Err(ProfileError::BadName { .. })
        ));
    }

    #[test]
    fn midways_bpf_congestion_controls_are_named_by_profile_and_applied_by_kernel_name() {
        let specs = parse(
            "[profiles.hs]\ncongestion_control = \"highspeed\"\n\
             [profiles.ghs]\ncongestion_control = \"gentle-highspeed\"\n\
             [profiles.k]\ncongestion_control = \"mw_gentle_hs\"\n\
             [profiles.c]\ncongestion_control = \"cubic\"\n",
        )
        .unwrap();
        let resolved = resolve_profiles(&specs).unwrap();
        let hs = &resolved["hs"];
        assert_eq!(hs.congestion_control.as_deref(), Some("highspeed"));
        assert_eq!(hs.kernel_congestion_control(), Some("mw_highspeed"));
        assert_eq!(
            hs.bpf_congestion_control(),
            Some(midway_bpf::Algorithm::HighSpeed)
        );
        // 16 characters: longer than a kernel name, accepted because it is midway's own.
        let ghs = &resolved["ghs"];
        assert_eq!(ghs.congestion_control.as_deref(), Some("gentle-highspeed"));
        assert_eq!(ghs.kernel_congestion_control(), Some("mw_gentle_hs"));
        assert_eq!(
            resolved["k"].bpf_congestion_control(),
            Some(midway_bpf::Algorithm::GentleHighSpeed)
        );
        assert_eq!(resolved["c"].kernel_congestion_control(), Some("cubic"));
        assert_eq!(resolved["c"].bpf_congestion_control(), None);
    }
}
