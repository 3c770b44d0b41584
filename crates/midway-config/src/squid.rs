//! Squid's configuration as the lab runs it beside midway in the web experiments: a forward
//! proxy for the lab's clients only, with its files in the run's folder, Debian's refresh
//! patterns, and the two settings a case chooses (cache on or off, how long idle upstream
//! connections are kept). A type, so the lab states choices, not text; `Display` gives the file.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

/// One Squid instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SquidConfig {
    /// A `#` line at the top saying who wrote the file.
    pub comment: Option<String>,
    /// `http_port`: where Squid accepts its clients.
    pub listen: SocketAddr,
    /// The only clients Squid serves (a prefix such as `10.0.1.0/24`); everyone else is denied.
    pub allowed_clients: String,
    /// Folder of the pid file, the logs and core dumps.
    pub run_dir: PathBuf,
    /// `cache_effective_user`: the user Squid drops to after binding its port.
    pub user: String,
    /// `visible_hostname`, as Squid names itself in errors and `Via`.
    pub visible_hostname: String,
    /// `false`: nothing is stored or served from the cache (`cache deny all`).
    pub cache: bool,
    /// `server_idle_pconn_timeout` (Squid's time syntax, e.g. `10 minutes`); unset keeps
    /// Squid's default.
    pub idle_upstream_keep: Option<String>,
}

impl fmt::Display for SquidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dir = self.run_dir.display();
        if let Some(comment) = &self.comment {
            writeln!(f, "# {comment}")?;
        }
        writeln!(f, "http_port {}", self.listen)?;
        writeln!(f, "acl lab_clients src {}", self.allowed_clients)?;
        writeln!(f, "http_access allow lab_clients")?;
        writeln!(f, "http_access deny all")?;
        writeln!(
            f,
            "# Debian's refresh patterns (used only when a response has no freshness of its own)."
        )?;
        writeln!(f, "refresh_pattern ^ftp: 1440 20% 10080")?;
        writeln!(f, "refresh_pattern ^gopher: 1440 0% 1440")?;
        writeln!(f, "refresh_pattern -i (/cgi-bin/|\\?) 0 0% 0")?;
        writeln!(f, "refresh_pattern . 0 20% 4320")?;
        writeln!(
            f,
            "# Files of this run; the names come from the lab's hosts file (/etc/hosts)."
        )?;
        writeln!(f, "pid_filename {dir}/squid.pid")?;
        writeln!(f, "access_log stdio:{dir}/access.log squid")?;
        writeln!(f, "cache_log {dir}/cache.log")?;
        writeln!(f, "cache_store_log none")?;
        writeln!(f, "coredump_dir {dir}")?;
        writeln!(f, "logfile_rotate 0")?;
        writeln!(f, "cache_effective_user {}", self.user)?;
        writeln!(f, "visible_hostname {}", self.visible_hostname)?;
        writeln!(
            f,
            "# No ICMP helper process: nothing here uses network measurements."
        )?;
        writeln!(f, "pinger_enable off")?;
        writeln!(
            f,
            "# Stop within a second when the run ends (default: 30 s of grace for clients)."
        )?;
        writeln!(f, "shutdown_lifetime 1 second")?;
        if !self.cache {
            writeln!(
                f,
                "# cache = false: nothing is stored or served from the cache."
            )?;
            writeln!(f, "cache deny all")?;
        }
        if let Some(keep) = &self.idle_upstream_keep {
            // pconn_lifetime stays at its default (0 = no limit on a connection's age).
            writeln!(f, "# idle upstream connections kept like midway's.")?;
            writeln!(f, "server_idle_pconn_timeout {keep}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_choice_adds_its_lines_and_nothing_else() {
        let mut config = SquidConfig {
            comment: None,
            listen: "10.0.1.2:8080".parse().unwrap(),
            allowed_clients: "10.0.1.0/24".into(),
            run_dir: "/run/x".into(),
            user: "proxy".into(),
            visible_hostname: "lab".into(),
            cache: true,
            idle_upstream_keep: None,
        };
        let plain = config.to_string();
        assert!(plain.starts_with("http_port 10.0.1.2:8080\nacl lab_clients src 10.0.1.0/24\n"));
        assert!(plain.contains("pid_filename /run/x/squid.pid\n"));
        assert!(!plain.contains("cache deny all") && !plain.contains("server_idle_pconn"));
        config.cache = false;
        config.idle_upstream_keep = Some("10 minutes".into());
        let chosen = config.to_string();
        assert!(chosen.contains("\ncache deny all\n"));
        assert!(chosen.ends_with("server_idle_pconn_timeout 10 minutes\n"));
    }
}
