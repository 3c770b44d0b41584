//! Stage 3 for a QUIC tunnel's settings: `[peers.quic]` on an edge, `[listeners.quic]` on a
//! QUIC peer listener (midway-quic's `TunnelSettings`).

use std::time::Duration;

use midway_quic::cc::CongestionControl;
use midway_quic::settings::{
    keep_alive_for, TunnelSettings, DEFAULT_PATH_RATE_BPS, DEFAULT_PATH_RTT, MAX_WINDOW,
    MIN_STREAM_WINDOW,
};

use super::validate::Section;
use super::{ConfigError, FileQuic};

/// Most QUIC connections one edge keeps to one peer (`connections`): more threads than a
/// gateway box has cores gain nothing, and each connection is a congestion controller of its own
/// on the shared path.
pub(super) const MAX_TUNNEL_CONNECTIONS: u32 = 16;

/// What only the connecting side (an edge's `[peers.quic]`) decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct EdgeTunnel {
    /// While the tunnel cannot be set up, new connections go over TLS to the same address.
    pub fallback: bool,
    /// QUIC connections kept to the peer.
    pub connections: usize,
}

/// The tunnel settings and (edge only) how the edge uses the tunnel. A listener
/// (`edge = false`) refuses the edge-only keys.
pub(super) fn tunnel_settings(
    section: &Section<'_>,
    file: Option<FileQuic>,
    edge: bool,
) -> Result<(TunnelSettings, EdgeTunnel), ConfigError> {
    let file = file.unwrap_or_default();
    let key = |field: &str| format!("quic.{field}");
    if !edge {
        for (field, set) in [
            ("handshake_timeout", file.handshake_timeout.is_some()),
            ("fallback", file.fallback.is_some()),
            ("connections", file.connections.is_some()),
        ] {
            if set {
                return Err(section.invalid(
                    &key(field),
                    "only an edge's [peers.quic] sets it (the connecting side); remove it",
                ));
            }
        }
    }
    let rate = file.path_rate_bps.unwrap_or(DEFAULT_PATH_RATE_BPS);
    if rate == 0 {
        return Err(section.invalid(&key("path_rate_bps"), "must be positive"));
    }
    let rtt = section.duration(&key("path_rtt"), file.path_rtt, DEFAULT_PATH_RTT)?;
    let mut settings = TunnelSettings::for_path(rate, rtt);
    if let Some(name) = file.congestion_control {
        settings.congestion_control = name
            .parse::<CongestionControl>()
            .map_err(|err| section.invalid(&key("congestion_control"), err.to_string()))?;
    }
    if let Some(window) = file.stream_window {
        settings.stream_window = window_in_range(section, &key("stream_window"), window)?;
        settings.connection_window = window.saturating_mul(2).min(MAX_WINDOW);
    }
    if let Some(window) = file.connection_window {
        settings.connection_window = window_in_range(section, &key("connection_window"), window)?;
    }
    if settings.connection_window < settings.stream_window {
        return Err(section.invalid(
            &key("connection_window"),
            format!(
                "{} is less than the stream window ({}): one stream could never use its own",
                settings.connection_window, settings.stream_window
            ),
        ));
    }
    if let Some(streams) = file.max_streams {
        if streams == 0 {
            return Err(section.invalid(&key("max_streams"), "must be positive"));
        }
        settings.max_streams = streams;
    }
    if let Some(idle) = file.idle_timeout {
        if idle.is_zero() {
            return Err(section.invalid(
                &key("idle_timeout"),
                "must be positive (a tunnel without one would never notice a dead peer)",
            ));
        }
        settings.idle_timeout = idle;
        settings.keep_alive = Some(keep_alive_for(idle));
    }
    match file.keep_alive {
        Some(interval) if interval.is_zero() => settings.keep_alive = None,
        Some(interval) if interval >= settings.idle_timeout => {
            return Err(section.invalid(
                &key("keep_alive"),
                format!(
                    "{interval:?} does not keep a tunnel with idle_timeout {:?} alive; use less \
                     than a third of it, or \"0s\" for none",
                    settings.idle_timeout
                ),
            ))
        }
        Some(interval) => settings.keep_alive = Some(interval),
        None => {}
    }
    if let Some(every) = file.ack_every {
        if every == 0 {
            return Err(section.invalid(&key("ack_every"), "must be positive"));
        }
        settings.ack_every = Some(every);
    }
    settings.handshake_timeout = file.handshake_timeout.unwrap_or(settings.handshake_timeout);
    if settings.handshake_timeout < Duration::from_millis(100) {
        return Err(section.invalid(
            &key("handshake_timeout"),
            "is shorter than any long path's round trip; use at least 100ms",
        ));
    }
    let fallback = match file.fallback.as_deref() {
        None | Some("tls") => true,
        Some("none") => false,
        Some(other) => {
            return Err(section.invalid(
                &key("fallback"),
                format!("{other:?}: use \"tls\" (the default) or \"none\""),
            ))
        }
    };
    let connections = file.connections.unwrap_or(1);
    if !(1..=MAX_TUNNEL_CONNECTIONS).contains(&connections) {
        return Err(section.invalid(
            &key("connections"),
            format!("{connections}: use 1 to {MAX_TUNNEL_CONNECTIONS}"),
        ));
    }
    let uses = EdgeTunnel {
        fallback,
        connections: connections as usize,
    };
    Ok((settings, uses))
}

fn window_in_range(section: &Section<'_>, key: &str, window: u64) -> Result<u64, ConfigError> {
    if (MIN_STREAM_WINDOW..=MAX_WINDOW).contains(&window) {
        Ok(window)
    } else {
        Err(section.invalid(
            key,
            format!("{window} bytes: use {MIN_STREAM_WINDOW} to {MAX_WINDOW}"),
        ))
    }
}
