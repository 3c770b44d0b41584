//! The control socket's metrics: requests by command and result.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ControlLabels {
    /// status, drain, undrain, close, or `invalid` for a request that did not parse.
    pub command: &'static str,
    /// ok, or the error's reason (unknown_listener, bad_json, ...).
    pub result: &'static str,
}

#[derive(Clone, Default)]
pub(crate) struct ControlMetrics {
    pub requests: Family<ControlLabels, Counter>,
    /// Connections to the control socket from a user other than root or midway's, closed.
    pub refused_peers: Counter,
}

impl ControlMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "midway_control_requests",
            "Requests on the control socket, by command and result (ok or the error's reason)",
            self.requests.clone(),
        );
        registry.register(
            "midway_control_refused_peers",
            "Connections to the control socket refused because they came from another user",
            self.refused_peers.clone(),
        );
    }

    pub(crate) fn request(&self, command: &'static str, result: &'static str) {
        self.requests
            .get_or_create(&ControlLabels { command, result })
            .inc();
    }
}
