//! Human units of scenario files: durations ("10ms"), rates ("25Mbit"), sizes ("10KB", "8KiB"),
//! queue limits ("10KB", "20 packets", "unlimited") and loss models.
//!
//! Every type validates while it is deserialized, so a bad value is reported by `toml` with the
//! line and column of the value itself. Decimal prefixes are powers of 1000 (`KB`, `Mbit`), binary
//! ones powers of 1024 (`KiB`): the papers write "8KB" for an 8192-byte socket buffer, so scenario
//! files spell that `8KiB`.

use std::fmt;
use std::time::Duration;

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// A parse error of a unit-carrying value; `toml` places it at the value's line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnitError(String);

fn split_number(text: &str) -> Result<(f64, &str), UnitError> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+' || c == 'e'))
        .unwrap_or(text.len());
    // An exponent letter followed by a unit letter ("1e3bit" is fine, "10ms" must not eat the m).
    let (number, unit) = text.split_at(end);
    let value: f64 = number
        .parse()
        .map_err(|_| UnitError(format!("`{text}` does not start with a number")))?;
    if !value.is_finite() {
        return Err(UnitError(format!("`{text}` is not a finite number")));
    }
    if value < 0.0 {
        return Err(UnitError(format!("`{text}` is negative")));
    }
    Ok((value, unit.trim()))
}

/// A non-negative duration written with a unit: "0", "250us", "10ms", "1.5s".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    /// Parses a duration in `humantime`'s grammar, the one the proxy's configuration files use
    /// too: a number (decimals allowed) with a unit (ns, us, ms, s, min, h, ...), "1h 30min"; a
    /// bare "0" needs none.
    pub fn parse(text: &str) -> Result<Self, UnitError> {
        let text = text.trim();
        // humantime would say "expected number at 0"; a sign is the likelier slip, so name it.
        if text.starts_with('-') {
            return Err(UnitError(format!("`{text}` is negative")));
        }
        humantime::parse_duration(text)
            .map(Self)
            .map_err(|error| duration_error(text, &error))
    }
    /// The duration in milliseconds, with fractions.
    pub fn as_millis_f64(&self) -> f64 {
        self.0.as_secs_f64() * 1e3
    }
}

/// humantime's error, in the words the lab's other units use (and its bad-scenario fixtures
/// expect).
fn duration_error(text: &str, error: &humantime::DurationError) -> UnitError {
    use humantime::DurationError as E;
    const UNITS: &str = "ns, us, ms, s, min or h";
    UnitError(match error {
        E::Empty | E::NumberExpected(0) => format!("`{text}` does not start with a number"),
        E::UnknownUnit { unit, .. } if unit.is_empty() => {
            format!("`{text}` needs a unit: {UNITS}")
        }
        E::UnknownUnit { unit, .. } => {
            format!("unknown time unit `{unit}` in `{text}`; use {UNITS}")
        }
        other => format!("`{text}` is not a duration: {other}"),
    })
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = self.0.as_micros();
        if micros % 1000 == 0 {
            write!(f, "{}ms", micros / 1000)
        } else {
            write!(f, "{micros}us")
        }
    }
}

/// A cache lifetime: a duration ("1h", "30s") or "none" (no lifetime: the responses say
/// `no-cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MaxAge(pub Option<Duration>);

impl MaxAge {
    /// Parses "none" or a duration with a unit.
    pub fn parse(text: &str) -> Result<Self, UnitError> {
        if text.trim() == "none" {
            return Ok(Self(None));
        }
        HumanDuration::parse(text)
            .map(|d| Self(Some(d.0)))
            .map_err(|e| UnitError(format!("{e} (or \"none\" for no-cache responses)")))
    }
}

impl fmt::Display for MaxAge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("none"),
            Some(duration) => write!(f, "{}", HumanDuration(duration)),
        }
    }
}

/// A link rate in bit/s: "25Mbit", "3Mbit/s", "56kbit", "1Gbps", "1500000bit".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rate(pub u64);

impl Rate {
    /// Parses a rate with a unit (bit, kbit, Mbit, Gbit; "/s" or "ps" allowed); at least 1 bit/s.
    pub fn parse(text: &str) -> Result<Self, UnitError> {
        let (value, unit) = split_number(text)?;
        let unit = unit.trim_end_matches("/s").trim_end_matches("ps");
        let factor = match unit {
            "bit" | "b" => 1.0,
            "kbit" | "Kbit" | "kb" | "Kb" | "k" => 1e3,
            "Mbit" | "mbit" | "Mb" | "M" => 1e6,
            "Gbit" | "gbit" | "Gb" | "G" => 1e9,
            _ => {
                return Err(UnitError(format!(
                    "`{text}` is not a rate; write e.g. \"25Mbit\", \"56kbit\" or \"1Gbit\""
                )))
            }
        };
        let bps = (value * factor).round();
        if bps < 1.0 {
            return Err(UnitError(format!("rate `{text}` must be at least 1 bit/s")));
        }
        Ok(Self(bps as u64))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bps = self.0;
        if bps % 1_000_000 == 0 {
            write!(f, "{}Mbit", bps / 1_000_000)
        } else if bps % 1000 == 0 {
            write!(f, "{}kbit", bps / 1000)
        } else {
            write!(f, "{bps}bit")
        }
    }
}

/// A byte count: an integer, or a string "3MB", "300KB", "8KiB", "1460B".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parses a byte count: a number, or one with a unit (B, KB, MB, GB, KiB, MiB, GiB).
    pub fn parse(text: &str) -> Result<Self, UnitError> {
        let (value, unit) = split_number(text)?;
        let factor = match unit {
            "" | "B" => 1.0,
            "KB" | "kB" => 1e3,
            "MB" => 1e6,
            "GB" => 1e9,
            "KiB" => 1024.0,
            "MiB" => 1024.0 * 1024.0,
            "GiB" => 1024.0 * 1024.0 * 1024.0,
            _ => {
                return Err(UnitError(format!(
                    "`{text}` is not a size; write e.g. \"3MB\", \"10KB\" or \"8KiB\" (KB = 1000 B, KiB = 1024 B)"
                )))
            }
        };
        Ok(Self((value * factor).round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Drop-tail queue limit of one link direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueSpec {
    /// No limit ("unlimited").
    #[default]
    Unlimited,
    /// At most this many bytes of frames queued (> 0).
    Bytes(u64),
    /// At most this many frames queued (> 0).
    Packets(u64),
}

impl QueueSpec {
    /// Parses "unlimited", a packet count ("20 packets") or a byte size ("10KB").
    pub fn parse(text: &str) -> Result<Self, UnitError> {
        let trimmed = text.trim();
        if trimmed == "unlimited" {
            return Ok(Self::Unlimited);
        }
        for suffix in ["packets", "packet", "pkts", "p"] {
            if let Some(number) = trimmed.strip_suffix(suffix) {
                let count: u64 = number.trim().parse().map_err(|_| {
                    UnitError(format!("`{text}`: a packet count must be a whole number"))
                })?;
                return nonzero(count, text).map(Self::Packets);
            }
        }
        let bytes = ByteSize::parse(trimmed).map_err(|_| {
            UnitError(format!(
                "`{text}` is not a queue limit; write \"10KB\", \"20 packets\" or \"unlimited\""
            ))
        })?;
        nonzero(bytes.0, text).map(Self::Bytes)
    }
}

fn nonzero(value: u64, text: &str) -> Result<u64, UnitError> {
    if value == 0 {
        Err(UnitError(format!(
            "queue limit `{text}` is zero: nothing could pass"
        )))
    } else {
        Ok(value)
    }
}

impl fmt::Display for QueueSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unlimited => f.write_str("unlimited"),
            Self::Bytes(bytes) => write!(f, "{bytes}B"),
            Self::Packets(count) => write!(f, "{count} packets"),
        }
    }
}

macro_rules! string_unit_serde {
    ($type:ty, $expecting:literal) => {
        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct UnitVisitor;
                impl de::Visitor<'_> for UnitVisitor {
                    type Value = $type;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_str<E: de::Error>(self, text: &str) -> Result<$type, E> {
                        <$type>::parse(text).map_err(E::custom)
                    }
                    fn visit_i64<E: de::Error>(self, value: i64) -> Result<$type, E> {
                        <$type>::parse(&value.to_string()).map_err(E::custom)
                    }
                    fn visit_u64<E: de::Error>(self, value: u64) -> Result<$type, E> {
                        <$type>::parse(&value.to_string()).map_err(E::custom)
                    }
                }
                deserializer.deserialize_any(UnitVisitor)
            }
        }
        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }
    };
}

string_unit_serde!(HumanDuration, "a duration such as \"10ms\"");
string_unit_serde!(MaxAge, "a duration such as \"1h\", or \"none\"");
string_unit_serde!(Rate, "a rate such as \"25Mbit\"");
string_unit_serde!(ByteSize, "a size such as \"3MB\" or a number of bytes");
string_unit_serde!(
    QueueSpec,
    "a queue limit such as \"10KB\" or \"20 packets\""
);

/// Probability in [0, 1], checked while deserializing.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default, Serialize)]
pub struct Probability(pub f64);

impl<'de> Deserialize<'de> for Probability {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = f64::deserialize(deserializer)?;
        if !(0.0..=1.0).contains(&value) {
            return Err(de::Error::custom(format!(
                "probability {value} is outside [0, 1] (1 % is written 0.01)"
            )));
        }
        Ok(Self(value))
    }
}

/// A packet loss model: `"none"`, `{ bernoulli = 0.01 }` or
/// `{ gilbert_elliott = { p_good_to_bad = 0.01, p_bad_to_good = 0.3, loss_in_bad = 1.0 } }`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum LossSpec {
    /// No loss.
    #[default]
    None,
    /// Each packet is lost independently with this probability.
    Bernoulli(Probability),
    /// Bursts of loss from a two-state Markov chain.
    GilbertElliott(GilbertElliottSpec),
}

/// Two-state burst loss: the chain moves good->bad and bad->good with the given probabilities
/// per packet; a packet is lost with `loss_in_good` / `loss_in_bad` in that state.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GilbertElliottSpec {
    /// Probability, per packet, of moving from the good state to the bad one.
    pub p_good_to_bad: Probability,
    /// Probability, per packet, of moving from the bad state back to the good one.
    pub p_bad_to_good: Probability,
    /// Probability that a packet is lost in the good state (default 0).
    #[serde(default)]
    pub loss_in_good: Probability,
    /// Probability that a packet is lost in the bad state (default 1).
    #[serde(default = "certain")]
    pub loss_in_bad: Probability,
}

fn certain() -> Probability {
    Probability(1.0)
}

impl LossSpec {
    /// Mean loss rate (the stationary rate for Gilbert-Elliott), used as a plot coordinate.
    pub fn mean_rate(&self) -> f64 {
        match self {
            Self::None => 0.0,
            Self::Bernoulli(p) => p.0,
            Self::GilbertElliott(ge) => {
                let total = ge.p_good_to_bad.0 + ge.p_bad_to_good.0;
                if total == 0.0 {
                    return ge.loss_in_good.0;
                }
                let share_bad = ge.p_good_to_bad.0 / total;
                share_bad * ge.loss_in_bad.0 + (1.0 - share_bad) * ge.loss_in_good.0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_reject_negative_or_unitless() {
        assert_eq!(
            HumanDuration::parse("10ms").unwrap().0,
            Duration::from_millis(10)
        );
        assert_eq!(
            HumanDuration::parse("1.5s").unwrap().0,
            Duration::from_millis(1500)
        );
        assert_eq!(
            HumanDuration::parse("250us").unwrap().0,
            Duration::from_micros(250)
        );
        assert_eq!(HumanDuration::parse("0").unwrap().0, Duration::ZERO);
        assert!(HumanDuration::parse("-10ms")
            .unwrap_err()
            .to_string()
            .contains("negative"));
        assert!(HumanDuration::parse("10").is_err());
        assert!(HumanDuration::parse("10 parsecs").is_err());
        assert_eq!(HumanDuration::parse("20ms").unwrap().to_string(), "20ms");
        assert_eq!(
            HumanDuration::parse("1h").unwrap().0,
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn durations_take_decimals_exactly_and_name_a_wrong_unit() {
        // The decimal forms the shipped scenarios use.
        assert_eq!(
            HumanDuration::parse("0.5ms").unwrap().0,
            Duration::from_micros(500)
        );
        assert_eq!(
            HumanDuration::parse("7.17ms").unwrap().0,
            Duration::from_micros(7170)
        );
        assert_eq!(
            HumanDuration::parse("20.5ms").unwrap().0,
            Duration::from_micros(20_500)
        );
        assert_eq!(HumanDuration::parse("0s").unwrap().0, Duration::ZERO);
        let error = HumanDuration::parse("20 fortnights")
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown time unit `fortnights`"), "{error}");
        let error = HumanDuration::parse("10").unwrap_err().to_string();
        assert!(error.contains("needs a unit"), "{error}");
        let error = HumanDuration::parse("soon").unwrap_err().to_string();
        assert!(error.contains("does not start with a number"), "{error}");
    }

    #[test]
    fn max_age_is_a_duration_or_none() {
        assert_eq!(
            MaxAge::parse("1h").unwrap(),
            MaxAge(Some(Duration::from_secs(3600)))
        );
        assert_eq!(MaxAge::parse("none").unwrap(), MaxAge(None));
        assert_eq!(MaxAge::parse("none").unwrap().to_string(), "none");
        let error = MaxAge::parse("forever").unwrap_err().to_string();
        assert!(error.contains("none"), "{error}");
    }

    #[test]
    fn rates_and_sizes_use_decimal_and_binary_prefixes() {
        assert_eq!(Rate::parse("25Mbit").unwrap().0, 25_000_000);
        assert_eq!(Rate::parse("3Mbit/s").unwrap().0, 3_000_000);
        assert_eq!(Rate::parse("56kbit").unwrap().0, 56_000);
        assert_eq!(Rate::parse("1Gbps").unwrap().0, 1_000_000_000);
        assert!(Rate::parse("25MB").is_err());
        assert_eq!(ByteSize::parse("3MB").unwrap().0, 3_000_000);
        assert_eq!(ByteSize::parse("8KiB").unwrap().0, 8192);
        assert_eq!(ByteSize::parse("1460").unwrap().0, 1460);
        assert!(ByteSize::parse("3 furlongs").is_err());
    }

    #[test]
    fn queue_limits_in_bytes_packets_or_unlimited() {
        assert_eq!(QueueSpec::parse("10KB").unwrap(), QueueSpec::Bytes(10_000));
        assert_eq!(
            QueueSpec::parse("20 packets").unwrap(),
            QueueSpec::Packets(20)
        );
        assert_eq!(QueueSpec::parse("unlimited").unwrap(), QueueSpec::Unlimited);
        assert!(QueueSpec::parse("0").is_err());
    }

    #[test]
    fn loss_models_deserialize_and_reject_probabilities_above_one() {
        #[derive(Deserialize)]
        struct Holder {
            loss: LossSpec,
        }
        let held: Holder = toml::from_str("loss = { bernoulli = 0.01 }").unwrap();
        assert_eq!(held.loss, LossSpec::Bernoulli(Probability(0.01)));
        let held: Holder = toml::from_str("loss = \"none\"").unwrap();
        assert_eq!(held.loss, LossSpec::None);
        let held: Holder = toml::from_str(
            "loss = { gilbert_elliott = { p_good_to_bad = 0.01, p_bad_to_good = 0.09 } }",
        )
        .unwrap();
        assert!((held.loss.mean_rate() - 0.1).abs() < 1e-12);
        let error = toml::from_str::<Holder>("\n\nloss = { bernoulli = 1.5 }")
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("line 3"), "{error}");
        assert!(error.contains("outside [0, 1]"), "{error}");
    }
}
