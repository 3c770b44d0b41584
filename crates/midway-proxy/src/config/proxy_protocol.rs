//! Stage 3 for a listener's PROXY protocol keys: `proxy_protocol` (send a header on the remote
//! segment) and `accept_proxy_protocol` (the load balancers allowed to send one).
//!
//! Where each is refused, and why:
//! - `proxy_protocol` on a listener that speaks HTTP (`mode = "http"`, `application =
//!   "http"`): its upstream connections are pooled and shared by clients, so a header naming
//!   one client does not fit them (CONNECT tunnels included: they go through the same pool's
//!   connector).
//! - `accept_proxy_protocol` on a transparent listener (its clients' packets arrive as they
//!   are, intercepted; the original destination is the real one) and on a peer listener (the
//!   authenticated peer header already names the client).

use std::net::IpAddr;

use ipnet::IpNet;

use super::validate::Section;
use super::{ConfigError, FileListener, ModeName, ProxyProtocolVersion};

/// A listener's PROXY protocol settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyProtocolSettings {
    /// Start every remote segment connected straight to its destination with a v2 header (a
    /// segment to another midway never: the peer header carries the client there).
    pub send: bool,
    /// Sources whose connections must start with a header naming the client; empty: the
    /// listener accepts none and takes every connection's own source as its client.
    pub accept_from: Vec<IpNet>,
}

impl ProxyProtocolSettings {
    /// Whether a connection from `source` must start with a PROXY header: it comes from one
    /// of the listed load balancers. Only then is a header read; from any other source the
    /// bytes are the client's own and never interpreted.
    pub fn expects_header_from(&self, source: IpAddr) -> bool {
        let source = source.to_canonical();
        self.accept_from.iter().any(|net| net.contains(&source))
    }
}

/// The listener's `proxy_protocol` and `accept_proxy_protocol`, checked against its mode.
pub(super) fn proxy_protocol_settings(
    section: &Section<'_>,
    mode: ModeName,
    speaks_http: bool,
    file: &FileListener,
) -> Result<ProxyProtocolSettings, ConfigError> {
    let send = match file.proxy_protocol {
        None => false,
        Some(ProxyProtocolVersion::V2) if speaks_http => {
            return Err(section.invalid(
                "proxy_protocol",
                "cannot be used on a listener that speaks HTTP (mode = \"http\" or \
                 application = \"http\"): its upstream connections are pooled and shared by \
                 clients, so a header naming one client does not fit them; remove it, or \
                 use a forward, socks5 or transparent listener",
            ));
        }
        Some(ProxyProtocolVersion::V2) => true,
    };
    let Some(sources) = &file.accept_proxy_protocol else {
        return Ok(ProxyProtocolSettings {
            send,
            accept_from: Vec::new(),
        });
    };
    match mode {
        ModeName::Transparent => {
            return Err(section.invalid(
                "accept_proxy_protocol",
                "cannot be used on a transparent listener: intercepted connections come \
                 straight from their clients, with their real destination; remove it, or \
                 put the load balancer in front of a forward or socks5 listener",
            ))
        }
        ModeName::Peer => {
            return Err(section.invalid(
                "accept_proxy_protocol",
                "cannot be used on a peer listener: the peer header already names the \
                 client; remove it",
            ))
        }
        ModeName::Forward | ModeName::Socks5 | ModeName::Http => {}
    }
    if sources.is_empty() {
        return Err(section.invalid(
            "accept_proxy_protocol",
            "an empty list accepts the header from nobody; list the load balancers' \
             addresses, e.g. accept_proxy_protocol = [\"10.0.0.5/32\"], or remove it",
        ));
    }
    let accept_from = sources
        .iter()
        .enumerate()
        .map(|(i, text)| {
            section
                .v
                .prefix(&section.key(&format!("accept_proxy_protocol[{i}]")), text)
        })
        .collect::<Result<Vec<IpNet>, ConfigError>>()?;
    Ok(ProxyProtocolSettings { send, accept_from })
}

#[cfg(test)]
mod tests {
    use crate::config::{parse_config, ConfigError};

    fn listener(mode_keys: &str) -> String {
        format!(
            "[proxy]\nallowed_clients = [\"10.0.0.0/8\"]\n[[listeners]]\nname = \"l\"\n\
             listen = \"127.0.0.1:0\"\n{mode_keys}\n"
        )
    }

    fn refused(text: &str) -> String {
        match parse_config(text, "<test>") {
            Err(ConfigError::Invalid { key, problem, .. }) => format!("{key}: {problem}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn send_and_accept_on_a_forward_listener() {
        let config = parse_config(
            &listener(
                "mode = \"forward\"\ntarget = \"10.2.0.2:80\"\nproxy_protocol = \"v2\"\n\
                 accept_proxy_protocol = [\"10.0.0.5\", \"::1/128\", \"192.168.7.9/24\"]",
            ),
            "<test>",
        )
        .unwrap();
        let settings = &config.listeners[0].proxy_protocol;
        assert!(settings.send);
        assert!(settings.expects_header_from("10.0.0.5".parse().unwrap()));
        assert!(settings.expects_header_from("::ffff:10.0.0.5".parse().unwrap()));
        assert!(settings.expects_header_from("::1".parse().unwrap()));
        // Host bits are cleared: the whole /24 is listed.
        assert!(settings.expects_header_from("192.168.7.200".parse().unwrap()));
        assert!(!settings.expects_header_from("10.0.0.6".parse().unwrap()));
    }

    #[test]
    fn absent_keys_send_nothing_and_accept_nothing() {
        let config = parse_config(&listener("mode = \"socks5\""), "<test>").unwrap();
        let settings = &config.listeners[0].proxy_protocol;
        assert!(!settings.send);
        assert!(!settings.expects_header_from("10.0.0.5".parse().unwrap()));
    }

    #[test]
    fn sending_on_http_listeners_is_refused() {
        let problem = refused(&listener("mode = \"http\"\nproxy_protocol = \"v2\""));
        assert!(
            problem.starts_with("listeners[0].proxy_protocol: "),
            "{problem}"
        );
        assert!(problem.contains("pooled"), "{problem}");
        let problem = refused(
            "[proxy]\nallowed_clients = [\"10.0.0.0/8\"]\n[[listeners]]\nname = \"t\"\n\
             mode = \"transparent\"\nlisten = \"127.0.0.1:7000\"\napplication = \"http\"\n\
             proxy_protocol = \"v2\"\n",
        );
        assert!(
            problem.starts_with("listeners[0].proxy_protocol: "),
            "{problem}"
        );
    }

    #[test]
    fn unknown_versions_are_refused_by_the_file_stage() {
        let text = listener("mode = \"socks5\"\nproxy_protocol = \"v1\"");
        assert!(matches!(
            parse_config(&text, "<test>"),
            Err(ConfigError::Syntax { .. })
        ));
    }

    #[test]
    fn accepting_is_refused_where_it_cannot_be_meant() {
        let problem = refused(&listener("mode = \"socks5\"\naccept_proxy_protocol = []"));
        assert!(problem.contains("empty list"), "{problem}");
        let problem = refused(&listener(
            "mode = \"socks5\"\naccept_proxy_protocol = [\"lb.example\"]",
        ));
        assert!(
            problem.starts_with("listeners[0].accept_proxy_protocol[0]: "),
            "{problem}"
        );
        let problem = refused(
            "[proxy]\nallowed_clients = [\"10.0.0.0/8\"]\n[[listeners]]\nname = \"t\"\n\
             mode = \"transparent\"\nlisten = \"127.0.0.1:7000\"\n\
             accept_proxy_protocol = [\"10.0.0.5\"]\n",
        );
        assert!(problem.contains("transparent"), "{problem}");
    }
}
