//! Route tuning: the proxy host's connected route toward the client, replaced by one that
//! carries the case's TCP metrics. Built here without I/O; the runner sends it over netlink.

use std::net::IpAddr;

use midway_sys::netlink::{Metric, RouteMetric, RouteMetrics};

use crate::cases::Placement;
use crate::scenario::RouteTuning;

/// The route route tuning installs on the proxy host: its connected route toward the client,
/// replaced by one that carries the tuning's metrics, as `ip route replace PREFIX dev IF proto
/// kernel scope link src ADDR METRICS` would (the runner sends it over netlink).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TunedRoute {
    /// Prefix of the proxy host's link toward the client (`10.0.1.0/24`).
    pub prefix: String,
    /// The proxy host's interface toward the client.
    pub device: String,
    /// The proxy host's address on that link (`src`).
    pub source: IpAddr,
    /// The tuning's metrics, in the order `ip`'s arguments listed them.
    pub metrics: RouteMetrics,
}

impl std::fmt::Display for TunedRoute {
    /// In `ip`'s words: `-4 route replace 10.0.1.0/24 dev e-client proto kernel scope link src
    /// 10.0.1.2 initcwnd 10 quickack 1 rto_min 20ms congctl bbr`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let family = if self.source.is_ipv6() { "-6" } else { "-4" };
        write!(
            f,
            "{family} route replace {} dev {} proto kernel scope link src {} {}",
            self.prefix, self.device, self.source, self.metrics
        )
    }
}

/// The route that replaces the proxy host's connected route toward the client with one that
/// carries the tuning metrics. `None` when the tuning sets nothing.
pub(crate) fn tuned_route(tuning: &RouteTuning, placement: &Placement) -> Option<TunedRoute> {
    let mut metrics = RouteMetrics::new();
    if let Some(n) = tuning.initcwnd {
        metrics.set(RouteMetric::new(Metric::InitCwnd, n));
    }
    if let Some(n) = tuning.initrwnd {
        metrics.set(RouteMetric::new(Metric::InitRwnd, n));
    }
    if let Some(quickack) = tuning.quickack {
        metrics.set(RouteMetric::new(Metric::QuickAck, u32::from(quickack)));
    }
    if let Some(rto) = tuning.rto_min {
        // Whole milliseconds, as `ip`'s `rto_min Nms` took them; locked, as `ip` locks it.
        let ms = u32::try_from(rto.0.as_millis()).unwrap_or(u32::MAX);
        metrics.set(RouteMetric::rto_min_ms(ms));
    }
    if let Some(cc) = &tuning.congctl {
        metrics.set(RouteMetric::congctl(cc.clone()));
    }
    if metrics.is_empty() {
        return None;
    }
    Some(TunedRoute {
        prefix: placement.route_prefix.clone(),
        device: placement.client_iface.clone(),
        source: placement.proxy_addr,
        metrics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::tests::placement;

    #[test]
    fn route_tuning_replaces_the_connected_route_with_metrics() {
        let tuning = RouteTuning {
            initcwnd: Some(10),
            quickack: Some(true),
            rto_min: Some(crate::units::HumanDuration::parse("20ms").unwrap()),
            congctl: Some("bbr".into()),
            ..RouteTuning::default()
        };
        let args = tuned_route(&tuning, &placement()).unwrap().to_string();
        assert_eq!(
            args,
            "-4 route replace 10.0.1.0/24 dev e-client proto kernel scope link src 10.0.1.2 \
             initcwnd 10 quickack 1 rto_min 20ms congctl bbr"
        );
        assert!(tuned_route(&RouteTuning::default(), &placement()).is_none());
    }

    #[test]
    fn tuned_routes_carry_the_metrics_ip_was_given() {
        // The metric words the lab passed to `ip route replace` before it used netlink, read
        // as iproute2 reads them (rto_min locked), against the typed route's metrics.
        let ms = |text: &str| Some(crate::units::HumanDuration::parse(text).unwrap());
        let profiles = [
            (
                RouteTuning {
                    initcwnd: Some(10),
                    quickack: Some(true),
                    rto_min: ms("20ms"),
                    congctl: Some("bbr".into()),
                    ..RouteTuning::default()
                },
                "initcwnd 10 quickack 1 rto_min 20ms congctl bbr",
            ),
            (
                RouteTuning {
                    initcwnd: Some(40),
                    initrwnd: Some(60),
                    quickack: Some(false),
                    ..RouteTuning::default()
                },
                "initcwnd 40 initrwnd 60 quickack 0",
            ),
            (
                RouteTuning {
                    rto_min: ms("1s"),
                    congctl: Some("reno".into()),
                    ..RouteTuning::default()
                },
                "rto_min 1000ms congctl reno",
            ),
        ];
        for (tuning, old_words) in profiles {
            let route = tuned_route(&tuning, &placement()).unwrap();
            assert_eq!(route.metrics.to_string(), old_words);
            assert_eq!(route.metrics, old_words.parse::<RouteMetrics>().unwrap());
        }
    }
}
