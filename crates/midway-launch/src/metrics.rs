//! Reading a running midway's `/metrics` endpoint from outside: one blocking, bounded
//! `GET /metrics`, and the samples of a metric in the Prometheus text it answers. The lab reads
//! a case's counters this way and the benchmark checks the gauges at N connections.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long connecting to the endpoint may take.
const CONNECT_LIMIT: Duration = Duration::from_secs(2);
/// How long the answer may take.
const READ_LIMIT: Duration = Duration::from_secs(5);

/// `GET /metrics` from `addr` (in the caller's network namespace); the body of a 200 answer, an
/// error for anything else.
pub fn scrape(addr: SocketAddr) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_LIMIT)?;
    stream.set_read_timeout(Some(READ_LIMIT))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1) != Some("200") {
        return Err(io::Error::other(format!(
            "metrics endpoint {addr} answered: {}",
            head.lines().next().unwrap_or("")
        )));
    }
    Ok(body.to_string())
}

/// Samples of metric family `name` (matched by suffix, so a registry prefix does not matter):
/// (labels text, value).
pub fn samples<'a>(
    exposition: &'a str,
    name: &'a str,
) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    exposition.lines().filter_map(move |line| {
        if line.starts_with('#') {
            return None;
        }
        let (metric, rest) = line.split_once(' ')?;
        let (metric_name, labels) = match metric.split_once('{') {
            Some((metric_name, _)) => {
                let (labels, _) = line.split_once('{')?.1.split_once('}')?;
                (metric_name, labels)
            }
            None => (metric, ""),
        };
        if !(metric_name == name || metric_name.ends_with(&format!("_{name}"))) {
            return None;
        }
        let value_text = if labels.is_empty() {
            rest
        } else {
            line.rsplit_once('}')?.1
        };
        let value = value_text.split_whitespace().next()?.parse().ok()?;
        Some((labels, value))
    })
}

/// Sum of every sample of metric `name` (None when midway does not export it).
pub fn metric_sum(exposition: &str, name: &str) -> Option<f64> {
    let mut found = false;
    let total = samples(exposition, name)
        .map(|(_, value)| {
            found = true;
            value
        })
        .sum();
    found.then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_found_by_name_with_or_without_a_prefix() {
        let text = "# HELP midway_connections_active x\n\
            midway_connections_active{listener=\"a\"} 2\n\
            midway_connections_active{listener=\"b\"} 3\n\
            midway_midway_shutdown_resets 7\n\
            midway_bytes_total{listener=\"a\",direction=\"in\"} 99\n";
        assert_eq!(metric_sum(text, "connections_active"), Some(5.0));
        assert_eq!(metric_sum(text, "shutdown_resets"), Some(7.0));
        assert_eq!(metric_sum(text, "bytes_total"), Some(99.0));
        assert_eq!(metric_sum(text, "absent"), None);
        let labels: Vec<&str> = samples(text, "bytes_total").map(|(l, _)| l).collect();
        assert_eq!(labels, ["listener=\"a\",direction=\"in\""]);
    }

    #[test]
    fn an_endpoint_that_is_not_there_is_an_error() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = free.local_addr().unwrap();
        drop(free);
        assert!(scrape(addr).is_err());
    }
}
