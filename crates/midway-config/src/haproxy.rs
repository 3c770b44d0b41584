//! HAProxy's configuration in TCP mode, as the lab and the benchmark run it beside midway: one
//! `listen` section per forwarded port, timeouts, connection limits, and optionally splice. A
//! type, not text, so both writers say the same things the same way; `Display` gives the file.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// One HAProxy instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaproxyConfig {
    /// A `#` line at the top saying who wrote the file.
    pub comment: Option<String>,
    /// `global maxconn`: connections the process accepts in all.
    pub max_connections: u32,
    /// `nbthread` (unset: HAProxy's default, one per CPU).
    pub threads: Option<u16>,
    /// `maxpipes`: splice pipes HAProxy may hold (unset: its default).
    pub max_pipes: Option<u32>,
    /// `maxconn` in `defaults`: what each `listen` section accepts (unset: HAProxy's 2000).
    pub max_connections_per_section: Option<u32>,
    /// `timeout connect` to the server.
    pub connect_timeout: Duration,
    /// `timeout client` and `timeout server`: how long either side may stay silent.
    pub idle_timeout: Duration,
    /// `option splice-request` and `option splice-response`.
    pub splice: bool,
    /// The forwarded ports.
    pub sections: Vec<ListenSection>,
}

/// A `listen` section: connections accepted on `bind` go to `server`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenSection {
    /// The section's name.
    pub name: String,
    /// Where HAProxy accepts.
    pub bind: SocketAddr,
    /// The server's name in HAProxy's logs and statistics.
    pub server_name: String,
    /// Where it connects.
    pub server: SocketAddr,
}

impl HaproxyConfig {
    /// TCP mode with the given timeouts and limit, no splice, no sections yet.
    pub fn tcp(max_connections: u32, connect_timeout: Duration, idle_timeout: Duration) -> Self {
        HaproxyConfig {
            comment: None,
            max_connections,
            threads: None,
            max_pipes: None,
            max_connections_per_section: None,
            connect_timeout,
            idle_timeout,
            splice: false,
            sections: Vec::new(),
        }
    }
}

/// HAProxy's time format: whole milliseconds, or whole seconds when exact.
struct HaproxyTime(Duration);

impl fmt::Display for HaproxyTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_millis();
        if millis % 1000 == 0 {
            write!(f, "{}s", millis / 1000)
        } else {
            write!(f, "{millis}ms")
        }
    }
}

impl fmt::Display for HaproxyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(comment) = &self.comment {
            writeln!(f, "# {comment}")?;
        }
        writeln!(f, "global")?;
        if let Some(threads) = self.threads {
            writeln!(f, "    nbthread {threads}")?;
        }
        writeln!(f, "    maxconn {}", self.max_connections)?;
        if let Some(pipes) = self.max_pipes {
            writeln!(f, "    maxpipes {pipes}")?;
        }
        writeln!(f)?;
        writeln!(f, "defaults")?;
        writeln!(f, "    mode tcp")?;
        writeln!(
            f,
            "    timeout connect {}",
            HaproxyTime(self.connect_timeout)
        )?;
        writeln!(f, "    timeout client {}", HaproxyTime(self.idle_timeout))?;
        writeln!(f, "    timeout server {}", HaproxyTime(self.idle_timeout))?;
        if let Some(maxconn) = self.max_connections_per_section {
            writeln!(f, "    maxconn {maxconn}")?;
        }
        if self.splice {
            writeln!(f, "    option splice-request")?;
            writeln!(f, "    option splice-response")?;
        }
        for section in &self.sections {
            writeln!(f)?;
            writeln!(f, "listen {}", section.name)?;
            writeln!(f, "    bind {}", section.bind)?;
            writeln!(f, "    server {} {}", section.server_name, section.server)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_has_each_setting_once_in_its_section() {
        let mut config = HaproxyConfig::tcp(9000, Duration::from_secs(5), Duration::from_secs(600));
        config.threads = Some(2);
        config.max_pipes = Some(512);
        config.splice = true;
        config.sections.push(ListenSection {
            name: "p5201".into(),
            bind: "10.0.1.2:5201".parse().unwrap(),
            server_name: "s".into(),
            server: "10.0.2.2:5201".parse().unwrap(),
        });
        let text = config.to_string();
        assert_eq!(
            text,
            "global\n    nbthread 2\n    maxconn 9000\n    maxpipes 512\n\n\
             defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 600s\n    \
             timeout server 600s\n    option splice-request\n    option splice-response\n\n\
             listen p5201\n    bind 10.0.1.2:5201\n    server s 10.0.2.2:5201\n"
        );
        assert_eq!(
            HaproxyTime(Duration::from_millis(1500)).to_string(),
            "1500ms"
        );
    }
}
