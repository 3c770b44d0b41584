//! Chromium's net log (`profile/netlog.json` in a point's folder, kept with `--keep-point-dirs`)
//! as per-connection and per-request timelines: `midway lab timeline NETLOG`. It answers what
//! issue 34 asked of the browser's side: how many connections Chromium opened, to what, when,
//! and when each one's bytes came in.
//!
//! The net log's events carry a numeric type and phase, named in its `constants` table, a
//! source (the socket or request they belong to) and a time in milliseconds as a string. Times
//! here count from the start of the page's own request (the first whose URL holds `/page/`, the
//! lab's page path), so background requests before it show negative times.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

/// One TCP connection Chromium opened.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SocketTimeline {
    /// The net log's source id of the socket.
    pub(crate) id: u64,
    /// Where it connected (the proxy, or an origin).
    pub(crate) remote: String,
    /// When the connect began, and when it completed (None: never).
    pub(crate) connect_ms: f64,
    pub(crate) connected_ms: Option<f64>,
    /// First and last bytes received (None: nothing received).
    pub(crate) first_byte_ms: Option<f64>,
    pub(crate) last_byte_ms: Option<f64>,
    pub(crate) bytes_received: u64,
    pub(crate) bytes_sent: u64,
    /// Times it was handed to a request (its uses, keep-alive reuse included).
    pub(crate) uses: u32,
}

/// One URL request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RequestTimeline {
    pub(crate) url: String,
    pub(crate) start_ms: f64,
    pub(crate) end_ms: Option<f64>,
    /// The net error it ended with (e.g. -105, name not resolved), if any.
    pub(crate) net_error: Option<i64>,
}

/// A page load as Chromium's net log saw it.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Timeline {
    pub(crate) sockets: Vec<SocketTimeline>,
    pub(crate) requests: Vec<RequestTimeline>,
}

/// Reads a net log's text into its timelines.
pub(crate) fn parse_netlog(text: &str) -> anyhow::Result<Timeline> {
    let log: Value = serde_json::from_str(text)?;
    let constants = &log["constants"];
    let event_type = |name: &str| constants["logEventTypes"][name].as_u64();
    let source_type = |name: &str| constants["logSourceType"][name].as_u64();
    let (Some(tcp_connect), Some(bytes_received), Some(bytes_sent), Some(in_use)) = (
        event_type("TCP_CONNECT"),
        event_type("SOCKET_BYTES_RECEIVED"),
        event_type("SOCKET_BYTES_SENT"),
        event_type("SOCKET_IN_USE"),
    ) else {
        anyhow::bail!("not a Chromium net log: its constants lack the socket event types");
    };
    let request_alive = event_type("REQUEST_ALIVE");
    let socket_source = source_type("SOCKET");
    let events = log["events"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("not a Chromium net log: no events"))?;

    let mut sockets: BTreeMap<u64, SocketTimeline> = BTreeMap::new();
    let mut requests: BTreeMap<u64, RequestTimeline> = BTreeMap::new();
    for event in events {
        let (Some(kind), Some(time), Some(id)) = (
            event["type"].as_u64(),
            event["time"].as_str().and_then(|t| t.parse::<f64>().ok()),
            event["source"]["id"].as_u64(),
        ) else {
            continue;
        };
        let phase = event["phase"].as_u64().unwrap_or(0);
        let params = &event["params"];
        let is_socket = event["source"]["type"].as_u64() == socket_source;
        if is_socket && kind == tcp_connect && phase == 1 {
            sockets.insert(
                id,
                SocketTimeline {
                    id,
                    remote: params["address_list"][0]
                        .as_str()
                        .unwrap_or("?")
                        .to_string(),
                    connect_ms: time,
                    connected_ms: None,
                    first_byte_ms: None,
                    last_byte_ms: None,
                    bytes_received: 0,
                    bytes_sent: 0,
                    uses: 0,
                },
            );
            continue;
        }
        if let Some(socket) = sockets.get_mut(&id).filter(|_| is_socket) {
            if kind == tcp_connect && phase == 2 && params["net_error"].is_null() {
                socket.connected_ms = Some(time);
                if let Some(remote) = params["remote_address"].as_str() {
                    socket.remote = remote.to_string();
                }
            } else if kind == bytes_received {
                socket.first_byte_ms.get_or_insert(time);
                socket.last_byte_ms = Some(time);
                socket.bytes_received += params["byte_count"].as_u64().unwrap_or(0);
            } else if kind == bytes_sent {
                socket.bytes_sent += params["byte_count"].as_u64().unwrap_or(0);
            } else if kind == in_use && phase == 1 {
                socket.uses += 1;
            }
        } else if Some(kind) == request_alive {
            if phase == 1 {
                if let Some(url) = params["url"].as_str() {
                    requests.insert(
                        id,
                        RequestTimeline {
                            url: url.to_string(),
                            start_ms: time,
                            end_ms: None,
                            net_error: None,
                        },
                    );
                }
            } else if let Some(request) = requests.get_mut(&id) {
                request.end_ms = Some(time);
                request.net_error = params["net_error"].as_i64();
            }
        }
    }
    let mut timeline = Timeline {
        sockets: sockets.into_values().collect(),
        requests: requests.into_values().collect(),
    };
    let origin = timeline
        .requests
        .iter()
        .filter(|request| request.url.contains("/page/"))
        .map(|request| request.start_ms)
        .reduce(f64::min)
        .or_else(|| {
            timeline
                .requests
                .iter()
                .map(|r| r.start_ms)
                .reduce(f64::min)
        })
        .unwrap_or(0.0);
    for socket in &mut timeline.sockets {
        socket.connect_ms -= origin;
        for time in [
            &mut socket.connected_ms,
            &mut socket.first_byte_ms,
            &mut socket.last_byte_ms,
        ]
        .into_iter()
        .flatten()
        {
            *time -= origin;
        }
    }
    for request in &mut timeline.requests {
        request.start_ms -= origin;
        if let Some(end) = &mut request.end_ms {
            *end -= origin;
        }
    }
    timeline
        .sockets
        .sort_by(|a, b| a.connect_ms.total_cmp(&b.connect_ms));
    timeline
        .requests
        .sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
    Ok(timeline)
}

/// The timelines as two text tables (milliseconds from the page's request).
pub(crate) fn render(timeline: &Timeline) -> String {
    let ms = |time: Option<f64>| time.map_or("-".to_string(), |t| format!("{t:.0}"));
    let mut out = format!(
        "{} connections (times in ms from the page's request)\n\
         {:>6} {:<22} {:>8} {:>9} {:>10} {:>9} {:>9} {:>7} {:>4}\n",
        timeline.sockets.len(),
        "socket",
        "remote",
        "connect",
        "connected",
        "first byte",
        "last byte",
        "received",
        "sent",
        "uses"
    );
    for s in &timeline.sockets {
        let _ = writeln!(
            out,
            "{:>6} {:<22} {:>8.0} {:>9} {:>10} {:>9} {:>9} {:>7} {:>4}",
            s.id,
            s.remote,
            s.connect_ms,
            ms(s.connected_ms),
            ms(s.first_byte_ms),
            ms(s.last_byte_ms),
            s.bytes_received,
            s.bytes_sent,
            s.uses
        );
    }
    let _ = writeln!(out, "\n{} requests", timeline.requests.len());
    let _ = writeln!(out, "{:>8} {:>8} {:>6}  url", "start", "end", "error");
    for r in &timeline.requests {
        let url: String = r.url.chars().take(100).collect();
        let error = r.net_error.map_or(String::new(), |e| e.to_string());
        let _ = writeln!(
            out,
            "{:>8.0} {:>8} {:>6}  {url}",
            r.start_ms,
            ms(r.end_ms),
            error
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A net log cut down to what the parser reads: a background request that fails to
    /// resolve, the page's request, and one socket used twice.
    const LOG: &str = r#"{
      "constants": {
        "logEventTypes": {"TCP_CONNECT": 51, "SOCKET_BYTES_RECEIVED": 86, "SOCKET_BYTES_SENT": 84,
                          "SOCKET_IN_USE": 60, "REQUEST_ALIVE": 2},
        "logSourceType": {"SOCKET": 10, "URL_REQUEST": 1}
      },
      "events": [
        {"type": 2, "phase": 1, "time": "900", "source": {"id": 8, "type": 1},
         "params": {"url": "http://clients2.google.com/time"}},
        {"type": 2, "phase": 2, "time": "950", "source": {"id": 8, "type": 1},
         "params": {"net_error": -105}},
        {"type": 2, "phase": 1, "time": "1000", "source": {"id": 9, "type": 1},
         "params": {"url": "http://www.lab/page/0.html"}},
        {"type": 51, "phase": 1, "time": "1002", "source": {"id": 35, "type": 10},
         "params": {"address_list": ["10.0.1.2:80"]}},
        {"type": 51, "phase": 2, "time": "1200", "source": {"id": 35, "type": 10},
         "params": {"local_address": "10.0.2.1:5000", "remote_address": "10.0.1.2:80"}},
        {"type": 60, "phase": 1, "time": "1200", "source": {"id": 35, "type": 10}},
        {"type": 84, "phase": 0, "time": "1201", "source": {"id": 35, "type": 10},
         "params": {"byte_count": 400}},
        {"type": 86, "phase": 0, "time": "1500", "source": {"id": 35, "type": 10},
         "params": {"byte_count": 1448}},
        {"type": 86, "phase": 0, "time": "1700", "source": {"id": 35, "type": 10},
         "params": {"byte_count": 552}},
        {"type": 60, "phase": 1, "time": "1800", "source": {"id": 35, "type": 10}},
        {"type": 2, "phase": 2, "time": "1750", "source": {"id": 9, "type": 1}, "params": {}}
      ]
    }"#;

    #[test]
    fn sockets_and_requests_are_timed_from_the_page_request() {
        let timeline = parse_netlog(LOG).unwrap();
        assert_eq!(
            timeline.sockets,
            [SocketTimeline {
                id: 35,
                remote: "10.0.1.2:80".into(),
                connect_ms: 2.0,
                connected_ms: Some(200.0),
                first_byte_ms: Some(500.0),
                last_byte_ms: Some(700.0),
                bytes_received: 2000,
                bytes_sent: 400,
                uses: 2,
            }]
        );
        assert_eq!(timeline.requests.len(), 2);
        assert_eq!(timeline.requests[0].start_ms, -100.0);
        assert_eq!(timeline.requests[0].net_error, Some(-105));
        assert_eq!(timeline.requests[1].end_ms, Some(750.0));
        let text = render(&timeline);
        assert!(text.starts_with("1 connections"), "{text}");
        assert!(text.contains("http://www.lab/page/0.html"), "{text}");
    }

    #[test]
    fn a_file_that_is_not_a_net_log_is_refused() {
        assert!(parse_netlog("{}").is_err());
        assert!(parse_netlog("not json").is_err());
    }
}
