//! The `outages` and `udp` keys of a link direction: scheduled blackouts, and an ISP that blocks
//! or throttles UDP but not TCP. Both are checked while parsing (with the emulator's own
//! validation), so `toml` names the line of a bad table.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, HumanDuration, Rate};

/// `outages`: when the direction drops every frame. Times count from the link's start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "OutagesTable")]
pub struct OutagesFile {
    /// `periodic = { period = "15s", duration = "200ms", offset = "5s" }`: an outage of
    /// `duration` every `period`, the first at `offset` (default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub periodic: Option<PeriodicOutageFile>,
    /// `once = [{ start = "20s", duration = "5s" }]`: one-off outages.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub once: Vec<OneOutageFile>,
}

/// `outages.periodic`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PeriodicOutageFile {
    /// From one outage's start to the next one's; longer than `duration`.
    pub period: HumanDuration,
    /// How long each outage lasts.
    pub duration: HumanDuration,
    /// When the first outage starts (default "0").
    #[serde(default)]
    pub offset: HumanDuration,
}

/// One entry of `outages.once`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OneOutageFile {
    /// When the outage starts.
    pub start: HumanDuration,
    /// How long it lasts.
    pub duration: HumanDuration,
}

/// The `outages` table as written, before its values are checked together.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutagesTable {
    #[serde(default)]
    periodic: Option<PeriodicOutageFile>,
    #[serde(default)]
    once: Vec<OneOutageFile>,
}

impl TryFrom<OutagesTable> for OutagesFile {
    type Error = String;

    fn try_from(table: OutagesTable) -> Result<Self, String> {
        let file = OutagesFile {
            periodic: table.periodic,
            once: table.once,
        };
        file.to_emulator()
            .validate()
            .map_err(|error| error.to_string())?;
        Ok(file)
    }
}

impl OutagesFile {
    /// The emulator's form.
    pub fn to_emulator(&self) -> midway_linkemu::OutageSchedule {
        midway_linkemu::OutageSchedule {
            periodic: self
                .periodic
                .map(|periodic| midway_linkemu::PeriodicOutage {
                    period: periodic.period.0,
                    duration: periodic.duration.0,
                    offset: periodic.offset.0,
                }),
            once: self
                .once
                .iter()
                .map(|outage| midway_linkemu::Outage {
                    start: outage.start.0,
                    duration: outage.duration.0,
                })
                .collect(),
        }
    }
}

impl fmt::Display for OutagesFile {
    /// Short form for result records: "200ms every 15000ms from 5000ms; 5000ms at 20000ms".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(periodic) = &self.periodic {
            parts.push(format!(
                "{} every {} from {}",
                periodic.duration, periodic.period, periodic.offset
            ));
        }
        for outage in &self.once {
            parts.push(format!("{} at {}", outage.duration, outage.start));
        }
        f.write_str(&parts.join("; "))
    }
}

/// `udp.action`: what happens to the selected UDP datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UdpActionName {
    /// Every one is dropped.
    Drop,
    /// A token bucket lets `rate` through (after a burst of `burst`); the rest is dropped.
    RateLimit,
}

/// `udp = { action = "drop" | "rate_limit", rate = "1Mbit", burst = "15KB", port = 443 }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "UdpTable")]
pub struct UdpFile {
    /// `drop` or `rate_limit`.
    pub action: UdpActionName,
    /// `rate_limit` only (and required there): the rate let through, in Ethernet frames.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// `rate_limit` only: the token bucket's depth (default: ten 1514-byte frames).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<ByteSize>,
    /// Only datagrams from or to this port (default: all UDP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

/// The `udp` table as written, before its values are checked together.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UdpTable {
    action: UdpActionName,
    #[serde(default)]
    rate: Option<Rate>,
    #[serde(default)]
    burst: Option<ByteSize>,
    #[serde(default)]
    port: Option<u16>,
}

impl TryFrom<UdpTable> for UdpFile {
    type Error = String;

    fn try_from(table: UdpTable) -> Result<Self, String> {
        let file = UdpFile {
            action: table.action,
            rate: table.rate,
            burst: table.burst,
            port: table.port,
        };
        match file.action {
            UdpActionName::Drop if file.rate.is_some() || file.burst.is_some() => {
                return Err(
                    "udp: `rate` and `burst` belong to action = \"rate_limit\"; \"drop\" drops \
                     every datagram"
                        .to_owned(),
                )
            }
            UdpActionName::RateLimit if file.rate.is_none() => {
                return Err(
                    "udp: action = \"rate_limit\" needs a `rate`, e.g. rate = \"1Mbit\"".to_owned(),
                )
            }
            _ => {}
        }
        file.to_emulator()
            .validate()
            .map_err(|error| error.to_string())?;
        Ok(file)
    }
}

impl UdpFile {
    /// The emulator's form.
    pub fn to_emulator(self) -> midway_linkemu::UdpImpairment {
        let action = match self.action {
            UdpActionName::Drop => midway_linkemu::UdpAction::Drop,
            UdpActionName::RateLimit => midway_linkemu::UdpAction::RateLimit {
                // A rate_limit without a rate does not get past parsing.
                rate_bps: self.rate.map_or(0, |rate| rate.0),
                burst_bytes: self
                    .burst
                    .map_or(midway_linkemu::DEFAULT_UDP_BURST_BYTES, |burst| burst.0),
            },
        };
        midway_linkemu::UdpImpairment {
            port: self.port,
            action,
        }
    }
}

impl fmt::Display for UdpFile {
    /// Short form for result records: "drop", "drop port 443", "1Mbit burst 15140B".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_emulator().action {
            midway_linkemu::UdpAction::Drop => f.write_str("drop")?,
            midway_linkemu::UdpAction::RateLimit {
                rate_bps,
                burst_bytes,
            } => write!(f, "{} burst {burst_bytes}B", Rate(rate_bps))?,
        }
        match self.port {
            Some(port) => write!(f, " port {port}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::DirectionFile;

    fn direction(text: &str) -> Result<DirectionFile, String> {
        toml::from_str(text).map_err(|error| error.to_string())
    }

    #[test]
    fn old_directions_parse_with_both_off() {
        let old = direction("delay = \"10ms\"\nrate = \"25Mbit\"\nqueue = \"10KB\"\n").unwrap();
        assert_eq!((&old.outages, &old.udp), (&None, &None));
        // And they are not written back.
        let text = toml::to_string(&old).unwrap();
        assert!(!text.contains("outages") && !text.contains("udp"), "{text}");
    }

    #[test]
    fn outages_parse_with_units_and_defaults() {
        let parsed = direction(
            "[outages]\nperiodic = { period = \"15s\", duration = \"200ms\" }\n\
             once = [{ start = \"20s\", duration = \"5s\" }, { start = \"1min\", duration = \"1.5s\" }]\n",
        )
        .unwrap();
        let outages = parsed.outages.clone().unwrap();
        let emulator = outages.to_emulator();
        let periodic = emulator.periodic.unwrap();
        assert_eq!(periodic.period, Duration::from_secs(15));
        assert_eq!(periodic.duration, Duration::from_millis(200));
        assert_eq!(periodic.offset, Duration::ZERO);
        assert_eq!(emulator.once.len(), 2);
        assert_eq!(emulator.once[1].start, Duration::from_secs(60));
        assert_eq!(emulator.once[1].duration, Duration::from_millis(1500));
        assert_eq!(
            outages.to_string(),
            "200ms every 15000ms from 0ms; 5000ms at 20000ms; 1500ms at 60000ms"
        );
        // Written back, it parses to the same thing.
        let text = toml::to_string(&parsed).unwrap();
        assert_eq!(direction(&text).unwrap(), parsed);
        let only_once = direction("outages = { once = [{ start = \"20s\", duration = \"5s\" }] }")
            .unwrap()
            .outages
            .unwrap();
        assert_eq!(only_once.periodic, None);
    }

    #[test]
    fn nonsense_outages_are_rejected_with_a_reason() {
        for (text, expected) in [
            (
                "outages = { periodic = { period = \"1s\", duration = \"2s\" } }",
                "not shorter than its period",
            ),
            (
                "outages = { periodic = { period = \"1s\", duration = \"1s\" } }",
                "not shorter than its period",
            ),
            (
                "outages = { periodic = { period = \"0\", duration = \"1s\" } }",
                "outages.periodic.period is 0",
            ),
            (
                "outages = { once = [{ start = \"1s\", duration = \"0\" }] }",
                "outages.once[0].duration is 0",
            ),
            (
                "outages = { periodic = { period = \"1s\" } }",
                "missing field `duration`",
            ),
            ("outages = { every = \"1s\" }", "unknown field `every`"),
            (
                "outages = { once = [{ start = \"-1s\", duration = \"1s\" }] }",
                "negative",
            ),
        ] {
            let error = direction(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
            // toml points at the line.
            assert!(error.contains("line 1"), "{text}: {error}");
        }
    }

    #[test]
    fn udp_parses_drop_and_rate_limit() {
        let drop = direction("udp = { action = \"drop\" }")
            .unwrap()
            .udp
            .unwrap();
        assert_eq!(
            drop.to_emulator(),
            midway_linkemu::UdpImpairment {
                port: None,
                action: midway_linkemu::UdpAction::Drop
            }
        );
        assert_eq!(drop.to_string(), "drop");
        let quic = direction("[udp]\naction = \"drop\"\nport = 443\n")
            .unwrap()
            .udp
            .unwrap();
        assert_eq!(quic.to_emulator().port, Some(443));
        assert_eq!(quic.to_string(), "drop port 443");
        let limited = direction("udp = { action = \"rate_limit\", rate = \"2Mbit\" }")
            .unwrap()
            .udp
            .unwrap();
        assert_eq!(
            limited.to_emulator().action,
            midway_linkemu::UdpAction::RateLimit {
                rate_bps: 2_000_000,
                burst_bytes: midway_linkemu::DEFAULT_UDP_BURST_BYTES
            }
        );
        assert_eq!(limited.to_string(), "2Mbit burst 15140B");
        let burst =
            direction("udp = { action = \"rate_limit\", rate = \"56kbit\", burst = \"3KB\" }")
                .unwrap();
        assert_eq!(
            burst.udp.unwrap().to_emulator().action,
            midway_linkemu::UdpAction::RateLimit {
                rate_bps: 56_000,
                burst_bytes: 3000
            }
        );
        let text = toml::to_string(&burst).unwrap();
        assert_eq!(direction(&text).unwrap(), burst);
    }

    #[test]
    fn nonsense_udp_tables_are_rejected_with_a_reason() {
        for (text, expected) in [
            ("udp = { action = \"rate_limit\" }", "needs a `rate`"),
            (
                "udp = { action = \"drop\", rate = \"1Mbit\" }",
                "belong to action = \"rate_limit\"",
            ),
            (
                "udp = { action = \"rate_limit\", rate = \"1Mbit\", burst = \"1KB\" }",
                "less than one full-size frame",
            ),
            ("udp = { action = \"drop\", port = 0 }", "port = 0"),
            ("udp = { action = \"drop\", port = 70000 }", "70000"),
            ("udp = { action = \"block\" }", "unknown variant `block`"),
            (
                "udp = { action = \"drop\", ports = [443] }",
                "unknown field `ports`",
            ),
            ("udp = { rate = \"1Mbit\" }", "missing field `action`"),
        ] {
            let error = direction(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
