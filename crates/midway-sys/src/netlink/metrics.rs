//! A route's metrics (`RTA_METRICS`): the per-destination TCP settings Linux reads from the route
//! of a socket (initial windows, RTO floor, quick ACKs, congestion control, reordering, MTU
//! lock, ...), typed, with their locks, and in the words `ip route` uses for them.

use std::fmt;
use std::str::FromStr;

use netlink_packet_route::route::RouteMetric as NlMetric;

/// One kind of route metric (the kernel's `RTAX_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Metric {
    /// `mtu`: path MTU.
    Mtu,
    /// `window`: largest window advertised to the peer.
    Window,
    /// `rtt`: initial RTT estimate (kept in 1/8 ms, as the kernel does).
    Rtt,
    /// `rttvar`: initial RTT variance (kept in 1/4 ms).
    RttVar,
    /// `ssthresh`: initial slow-start threshold.
    Ssthresh,
    /// `cwnd`: congestion window clamp.
    Cwnd,
    /// `advmss`: MSS advertised to the peer.
    Advmss,
    /// `reordering`: initial duplicate-ACK threshold (read through the tcp_metrics cache).
    Reordering,
    /// `hoplimit`: IP TTL / hop limit.
    Hoplimit,
    /// `initcwnd`: initial congestion window.
    InitCwnd,
    /// `features`: feature bits (1 = ECN).
    Features,
    /// `rto_min`: RTO floor in ms (honoured only when locked).
    RtoMin,
    /// `initrwnd`: initial receive window.
    InitRwnd,
    /// `quickack`: 1 = acknowledge every segment at once.
    QuickAck,
    /// `congctl`: congestion control by name.
    CongCtl,
    /// `fastopen_no_cookie`: TCP Fast Open without a cookie.
    FastopenNoCookie,
}

const ALL: [Metric; 16] = [
    Metric::Mtu,
    Metric::Window,
    Metric::Rtt,
    Metric::RttVar,
    Metric::Ssthresh,
    Metric::Cwnd,
    Metric::Advmss,
    Metric::Reordering,
    Metric::Hoplimit,
    Metric::InitCwnd,
    Metric::Features,
    Metric::RtoMin,
    Metric::InitRwnd,
    Metric::QuickAck,
    Metric::CongCtl,
    Metric::FastopenNoCookie,
];

impl Metric {
    /// The word `ip route` uses for it.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Mtu => "mtu",
            Metric::Window => "window",
            Metric::Rtt => "rtt",
            Metric::RttVar => "rttvar",
            Metric::Ssthresh => "ssthresh",
            Metric::Cwnd => "cwnd",
            Metric::Advmss => "advmss",
            Metric::Reordering => "reordering",
            Metric::Hoplimit => "hoplimit",
            Metric::InitCwnd => "initcwnd",
            Metric::Features => "features",
            Metric::RtoMin => "rto_min",
            Metric::InitRwnd => "initrwnd",
            Metric::QuickAck => "quickack",
            Metric::CongCtl => "congctl",
            Metric::FastopenNoCookie => "fastopen_no_cookie",
        }
    }

    /// The metric `ip route` calls `name`.
    pub fn from_name(name: &str) -> Option<Metric> {
        ALL.into_iter().find(|m| m.name() == name)
    }

    /// The kernel's `RTAX_*` number, which is also its bit in the lock mask.
    fn rtax(self) -> u32 {
        match self {
            Metric::Mtu => 2,
            Metric::Window => 3,
            Metric::Rtt => 4,
            Metric::RttVar => 5,
            Metric::Ssthresh => 6,
            Metric::Cwnd => 7,
            Metric::Advmss => 8,
            Metric::Reordering => 9,
            Metric::Hoplimit => 10,
            Metric::InitCwnd => 11,
            Metric::Features => 12,
            Metric::RtoMin => 13,
            Metric::InitRwnd => 14,
            Metric::QuickAck => 15,
            Metric::CongCtl => 16,
            Metric::FastopenNoCookie => 17,
        }
    }

    /// Whether `ip route` takes `lock` before this metric's value. `rto_min` is always locked
    /// (the kernel reads only a locked one), the others have no lock.
    fn takes_lock_word(self) -> bool {
        !matches!(
            self,
            Metric::RtoMin | Metric::QuickAck | Metric::Features | Metric::FastopenNoCookie
        )
    }

    /// Units per millisecond of a time metric as the kernel keeps it (`None`: not a time).
    fn units_per_ms(self) -> Option<u32> {
        match self {
            Metric::Rtt => Some(8),
            Metric::RttVar => Some(4),
            Metric::RtoMin => Some(1),
            _ => None,
        }
    }
}

/// A metric's value: a number, or a name for `congctl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricValue {
    /// As the kernel keeps it (time metrics in their kernel units, see [`Metric`]).
    Number(u32),
    /// A congestion control's name.
    Name(String),
}

/// One metric of a route, with its lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteMetric {
    /// Which metric.
    pub metric: Metric,
    /// Its value.
    pub value: MetricValue,
    /// Locked: the kernel neither overrides it with what it measures nor, for `rto_min`,
    /// ignores it.
    pub locked: bool,
}

impl RouteMetric {
    /// An unlocked numeric metric (`initcwnd 10`, `quickack 1`).
    pub fn new(metric: Metric, value: u32) -> RouteMetric {
        RouteMetric {
            metric,
            value: MetricValue::Number(value),
            locked: false,
        }
    }

    /// A locked numeric metric (`reordering lock 3`, `mtu lock 576`).
    pub fn locked(metric: Metric, value: u32) -> RouteMetric {
        RouteMetric {
            locked: true,
            ..RouteMetric::new(metric, value)
        }
    }

    /// `rto_min MS`, locked as iproute2 always does: `tcp_rto_min()` honours only a locked
    /// floor.
    pub fn rto_min_ms(ms: u32) -> RouteMetric {
        RouteMetric::locked(Metric::RtoMin, ms)
    }

    /// `congctl NAME` (unlocked: sockets may still choose their own).
    pub fn congctl(name: impl Into<String>) -> RouteMetric {
        RouteMetric {
            metric: Metric::CongCtl,
            value: MetricValue::Name(name.into()),
            locked: false,
        }
    }

    /// The numeric value, if it is one.
    pub fn number(&self) -> Option<u32> {
        match self.value {
            MetricValue::Number(n) => Some(n),
            MetricValue::Name(_) => None,
        }
    }
}

impl fmt::Display for RouteMetric {
    /// As `ip route add` takes it: `reordering lock 3`, `rto_min 300ms`, `congctl reno`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.metric.name())?;
        if self.locked && self.metric.takes_lock_word() {
            write!(f, " lock")?;
        }
        match (&self.value, self.metric.units_per_ms()) {
            (MetricValue::Name(name), _) => write!(f, " {name}"),
            (MetricValue::Number(n), Some(units)) => write!(f, " {}ms", n / units),
            (MetricValue::Number(1), None) if self.metric == Metric::Features => write!(f, " ecn"),
            (MetricValue::Number(n), None) => write!(f, " {n}"),
        }
    }
}

/// A route's metrics, at most one per [`Metric`], in the order they were set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouteMetrics(Vec<RouteMetric>);

impl RouteMetrics {
    /// No metrics.
    pub fn new() -> RouteMetrics {
        RouteMetrics::default()
    }

    /// Sets `metric`, replacing an earlier value of the same metric in its place.
    pub fn set(&mut self, metric: RouteMetric) -> &mut RouteMetrics {
        match self.0.iter_mut().find(|m| m.metric == metric.metric) {
            Some(existing) => *existing = metric,
            None => self.0.push(metric),
        }
        self
    }

    /// [`RouteMetrics::set`] for building.
    pub fn with(mut self, metric: RouteMetric) -> RouteMetrics {
        self.set(metric);
        self
    }

    /// Removes `metric`; whether it was there.
    pub fn remove(&mut self, metric: Metric) -> bool {
        let before = self.0.len();
        self.0.retain(|m| m.metric != metric);
        self.0.len() != before
    }

    /// The value of `metric`, if set.
    pub fn get(&self, metric: Metric) -> Option<&RouteMetric> {
        self.0.iter().find(|m| m.metric == metric)
    }

    /// Every metric, in order.
    pub fn iter(&self) -> impl Iterator<Item = &RouteMetric> {
        self.0.iter()
    }

    /// Whether no metric is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// These metrics with `over`'s laid over them: the metrics `over` does not set stay, with
    /// their locks, then come `over`'s. A profile that only raises the initial window keeps the
    /// host's MTU lock, RTO floor and congestion control.
    pub fn overlaid(&self, over: &RouteMetrics) -> RouteMetrics {
        let mut merged: Vec<RouteMetric> = self
            .0
            .iter()
            .filter(|m| over.get(m.metric).is_none())
            .cloned()
            .collect();
        merged.extend(over.0.iter().cloned());
        RouteMetrics(merged)
    }

    /// The `RTA_METRICS` attributes: each value, then the lock mask if any metric is locked.
    pub(crate) fn to_netlink(&self) -> Vec<NlMetric> {
        let mut out: Vec<NlMetric> = self.0.iter().map(to_netlink).collect();
        let lock = self
            .0
            .iter()
            .filter(|m| m.locked)
            .fold(0u32, |mask, m| mask | (1 << m.metric.rtax()));
        if lock != 0 {
            out.insert(0, NlMetric::Lock(lock));
        }
        out
    }

    /// Metrics from the kernel's `RTA_METRICS`; kinds midway has no name for are left out.
    pub(crate) fn from_netlink(metrics: &[NlMetric]) -> RouteMetrics {
        let lock = metrics
            .iter()
            .find_map(|m| match m {
                NlMetric::Lock(mask) => Some(*mask),
                _ => None,
            })
            .unwrap_or(0);
        let mut out = RouteMetrics::new();
        for metric in metrics.iter().filter_map(from_netlink) {
            let locked = lock & (1 << metric.metric.rtax()) != 0;
            out.set(RouteMetric { locked, ..metric });
        }
        out
    }
}

fn to_netlink(m: &RouteMetric) -> NlMetric {
    let n = match &m.value {
        MetricValue::Name(name) => return NlMetric::CcAlgo(name.clone()),
        MetricValue::Number(n) => *n,
    };
    match m.metric {
        Metric::Mtu => NlMetric::Mtu(n),
        Metric::Window => NlMetric::Window(n),
        Metric::Rtt => NlMetric::Rtt(n),
        Metric::RttVar => NlMetric::RttVar(n),
        Metric::Ssthresh => NlMetric::SsThresh(n),
        Metric::Cwnd => NlMetric::Cwnd(n),
        Metric::Advmss => NlMetric::Advmss(n),
        Metric::Reordering => NlMetric::Reordering(n),
        Metric::Hoplimit => NlMetric::Hoplimit(n),
        Metric::InitCwnd => NlMetric::InitCwnd(n),
        Metric::Features => NlMetric::Features(n),
        Metric::RtoMin => NlMetric::RtoMin(n),
        Metric::InitRwnd => NlMetric::InitRwnd(n),
        Metric::QuickAck => NlMetric::QuickAck(n),
        // A number for congctl is not something the parser or the builders make.
        Metric::CongCtl => NlMetric::CcAlgo(n.to_string()),
        Metric::FastopenNoCookie => NlMetric::FastopenNoCookie(n),
    }
}

fn from_netlink(m: &NlMetric) -> Option<RouteMetric> {
    let (metric, n) = match m {
        NlMetric::CcAlgo(name) => return Some(RouteMetric::congctl(name.clone())),
        NlMetric::Mtu(n) => (Metric::Mtu, n),
        NlMetric::Window(n) => (Metric::Window, n),
        NlMetric::Rtt(n) => (Metric::Rtt, n),
        NlMetric::RttVar(n) => (Metric::RttVar, n),
        NlMetric::SsThresh(n) => (Metric::Ssthresh, n),
        NlMetric::Cwnd(n) => (Metric::Cwnd, n),
        NlMetric::Advmss(n) => (Metric::Advmss, n),
        NlMetric::Reordering(n) => (Metric::Reordering, n),
        NlMetric::Hoplimit(n) => (Metric::Hoplimit, n),
        NlMetric::InitCwnd(n) => (Metric::InitCwnd, n),
        NlMetric::Features(n) => (Metric::Features, n),
        NlMetric::RtoMin(n) => (Metric::RtoMin, n),
        NlMetric::InitRwnd(n) => (Metric::InitRwnd, n),
        NlMetric::QuickAck(n) => (Metric::QuickAck, n),
        NlMetric::FastopenNoCookie(n) => (Metric::FastopenNoCookie, n),
        _ => return None,
    };
    Some(RouteMetric::new(metric, *n))
}

impl fmt::Display for RouteMetrics {
    /// As `ip route add` takes them, separated by spaces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, metric) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{metric}")?;
        }
        Ok(())
    }
}

/// A metric spec in `ip route`'s words that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetricParseError {
    /// A word that is not a metric's name.
    #[error("{0:?} is not a route metric")]
    UnknownMetric(String),
    /// A metric without its value.
    #[error("route metric {0} has no value")]
    MissingValue(&'static str),
    /// A value that does not fit the metric.
    #[error("{value:?} is not a value for route metric {metric}")]
    BadValue {
        /// The metric.
        metric: &'static str,
        /// The value given.
        value: String,
    },
}

impl FromStr for RouteMetrics {
    type Err = MetricParseError;

    /// Parses `ip route`'s metric words: `initcwnd 10 reordering lock 3 rto_min 300ms congctl
    /// reno mtu lock 576 quickack 1 features ecn`. `rto_min` is locked whether or not `lock`
    /// is written (as iproute2 does); times take `ms` (the default) or `s`.
    fn from_str(spec: &str) -> Result<RouteMetrics, MetricParseError> {
        let mut words = spec.split_whitespace().peekable();
        let mut metrics = RouteMetrics::new();
        while let Some(word) = words.next() {
            let metric = Metric::from_name(word)
                .ok_or_else(|| MetricParseError::UnknownMetric(word.to_owned()))?;
            let mut locked = metric == Metric::RtoMin;
            if words.peek() == Some(&"lock") {
                words.next();
                locked = true;
            }
            let value = words
                .next()
                .ok_or(MetricParseError::MissingValue(metric.name()))?;
            let bad = || MetricParseError::BadValue {
                metric: metric.name(),
                value: value.to_owned(),
            };
            let value = match (metric, metric.units_per_ms()) {
                (Metric::CongCtl, _) => MetricValue::Name(value.to_owned()),
                (Metric::Features, _) if value == "ecn" => MetricValue::Number(1),
                (_, Some(units)) => MetricValue::Number(
                    parse_ms(value)
                        .and_then(|ms| ms.checked_mul(units))
                        .ok_or_else(bad)?,
                ),
                (_, None) => MetricValue::Number(value.parse().map_err(|_| bad())?),
            };
            metrics.set(RouteMetric {
                metric,
                value,
                locked,
            });
        }
        Ok(metrics)
    }
}

/// `300ms`, `300`, `1s`, `1.5s` in whole milliseconds.
fn parse_ms(text: &str) -> Option<u32> {
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1000.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number.parse().ok()?;
    let ms = (value * scale).round();
    (ms.is_finite() && (0.0..=f64::from(u32::MAX)).contains(&ms)).then_some(ms as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_words_parse_with_locks_and_units() {
        let metrics: RouteMetrics =
            "initcwnd 10 reordering lock 3 rto_min 1s congctl reno mtu lock 576 quickack 1 features ecn rtt 100ms"
                .parse()
                .unwrap();
        assert_eq!(
            metrics.get(Metric::InitCwnd),
            Some(&RouteMetric::new(Metric::InitCwnd, 10))
        );
        assert_eq!(
            metrics.get(Metric::Reordering),
            Some(&RouteMetric::locked(Metric::Reordering, 3))
        );
        assert_eq!(
            metrics.get(Metric::RtoMin),
            Some(&RouteMetric::rto_min_ms(1000))
        );
        assert_eq!(
            metrics.get(Metric::CongCtl),
            Some(&RouteMetric::congctl("reno"))
        );
        assert!(metrics.get(Metric::Mtu).unwrap().locked);
        assert_eq!(metrics.get(Metric::Features).unwrap().number(), Some(1));
        assert_eq!(metrics.get(Metric::Rtt).unwrap().number(), Some(800));
        assert_eq!(
            metrics.to_string(),
            "initcwnd 10 reordering lock 3 rto_min 1000ms congctl reno mtu lock 576 quickack 1 features ecn rtt 100ms"
        );
        assert_eq!(
            metrics.to_string().parse::<RouteMetrics>().unwrap(),
            metrics
        );
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        assert_eq!(
            "initcwnd".parse::<RouteMetrics>(),
            Err(MetricParseError::MissingValue("initcwnd"))
        );
        assert_eq!(
            "via 10.0.0.1".parse::<RouteMetrics>(),
            Err(MetricParseError::UnknownMetric("via".into()))
        );
        assert!(matches!(
            "rto_min soon".parse::<RouteMetrics>(),
            Err(MetricParseError::BadValue {
                metric: "rto_min",
                ..
            })
        ));
        assert!("".parse::<RouteMetrics>().unwrap().is_empty());
    }

    #[test]
    fn netlink_form_carries_the_lock_mask() {
        let metrics = RouteMetrics::new()
            .with(RouteMetric::new(Metric::InitCwnd, 7))
            .with(RouteMetric::locked(Metric::Reordering, 5))
            .with(RouteMetric::rto_min_ms(300));
        let netlink = metrics.to_netlink();
        assert_eq!(netlink[0], NlMetric::Lock((1 << 9) | (1 << 13)));
        assert!(netlink.contains(&NlMetric::InitCwnd(7)));
        assert_eq!(RouteMetrics::from_netlink(&netlink), metrics);
    }

    #[test]
    fn overlay_keeps_the_hosts_other_metrics_and_their_locks() {
        let host: RouteMetrics = "mtu lock 576 advmss 536 initcwnd 2 rto_min 1s congctl reno"
            .parse()
            .unwrap();
        let profile: RouteMetrics = "initcwnd 10 reordering lock 1 quickack 1".parse().unwrap();
        assert_eq!(
            host.overlaid(&profile).to_string(),
            "mtu lock 576 advmss 536 rto_min 1000ms congctl reno initcwnd 10 reordering lock 1 quickack 1"
        );
        let mut replaced = host.clone();
        replaced.set(RouteMetric::new(Metric::InitCwnd, 4));
        assert!(replaced
            .to_string()
            .contains("advmss 536 initcwnd 4 rto_min"));
        assert!(replaced.remove(Metric::Mtu) && !replaced.remove(Metric::Mtu));
    }
}
