//! Builders for the configs programs write (the lab's cases, the benchmark): each starts from
//! what every config of its kind needs and adds what the writer chooses, and `build` gives the
//! file structs, which serialize to the TOML the proxy reads.

use std::fmt::Display;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::file::{
    FileConfig, FileControl, FileHttp, FileKey, FileListener, FileMetrics, FileNftables, FilePeer,
    FileProxy, FileSpool, ModeName, RelayName,
};
use crate::profile::ProfileSpec;

/// A whole config: `[proxy]` with the clients it serves, then metrics, spool, profiles and
/// listeners as added.
#[derive(Debug, Clone)]
pub struct ConfigBuilder {
    config: FileConfig,
}

impl ConfigBuilder {
    /// A config serving clients in `allowed_clients` (prefixes such as `10.0.1.0/24`): midway
    /// refuses to start without them.
    pub fn new<T: Display>(allowed_clients: impl IntoIterator<Item = T>) -> ConfigBuilder {
        ConfigBuilder {
            config: FileConfig {
                proxy: FileProxy {
                    allowed_clients: Some(
                        allowed_clients.into_iter().map(|c| c.to_string()).collect(),
                    ),
                    ..FileProxy::default()
                },
                ..FileConfig::default()
            },
        }
    }

    /// Connections in total, and from one client.
    pub fn max_connections(mut self, total: usize, per_client: usize) -> ConfigBuilder {
        self.config.proxy.max_connections = Some(total);
        self.config.proxy.max_connections_per_client = Some(per_client);
        self
    }

    /// Upstream connect timeout, idle timeout of a connection, and the drain on shutdown.
    pub fn timeouts(mut self, connect: Duration, idle: Duration, shutdown_grace: Duration) -> Self {
        self.config.proxy.connect_timeout = Some(connect);
        self.config.proxy.idle_timeout = Some(idle);
        self.config.proxy.shutdown_grace = Some(shutdown_grace);
        self
    }

    /// Threads that run the connections (unset: one per CPU).
    pub fn worker_threads(mut self, threads: usize) -> ConfigBuilder {
        self.config.proxy.worker_threads = Some(threads);
        self
    }

    /// The Prometheus endpoint.
    pub fn metrics(mut self, listen: SocketAddr) -> ConfigBuilder {
        self.config.metrics = Some(FileMetrics { listen });
        self
    }

    /// The control socket's path (`midway status`).
    pub fn control_socket(mut self, path: impl Into<PathBuf>) -> ConfigBuilder {
        self.config.control = Some(FileControl {
            enabled: None,
            socket: Some(path.into()),
        });
        self
    }

    /// Where spool relays put their files.
    pub fn spool_dir(mut self, dir: impl Into<PathBuf>) -> ConfigBuilder {
        self.config.spool = Some(FileSpool {
            dir: Some(dir.into()),
            max_total_bytes: None,
        });
        self
    }

    /// A named profile, `[profiles.NAME]`.
    pub fn profile(mut self, name: impl Into<String>, spec: ProfileSpec) -> ConfigBuilder {
        self.config.profiles.insert(name.into(), spec);
        self
    }

    /// A pre-shared key `[keys.NAME]` given inline as hexadecimal text.
    pub fn key(mut self, name: impl Into<String>, secret_hex: impl Into<String>) -> ConfigBuilder {
        self.config.keys.insert(
            name.into(),
            FileKey {
                secret: Some(secret_hex.into()),
                secret_file: None,
            },
        );
        self
    }

    /// One more `[[peers]]`.
    pub fn peer(mut self, peer: FilePeer) -> ConfigBuilder {
        self.config.peers.push(peer);
        self
    }

    /// One more `[[listeners]]`.
    pub fn listener(mut self, listener: FileListener) -> ConfigBuilder {
        self.config.listeners.push(listener);
        self
    }

    /// The config as file structs.
    pub fn build(self) -> FileConfig {
        self.config
    }
}

impl FileConfig {
    /// The TOML text the proxy reads.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        toml::to_string(self)
    }

    /// The config as a TOML table, for [`crate::overlay`] before it is written.
    pub fn to_table(&self) -> Result<toml::Table, toml::ser::Error> {
        toml::Table::try_from(self)
    }
}

/// One listener: its mode, name and address first, then what the writer sets.
#[derive(Debug, Clone)]
pub struct ListenerBuilder {
    listener: FileListener,
}

impl ListenerBuilder {
    /// A listener in `mode` named `name`, accepting on `listen`.
    pub fn new(mode: ModeName, name: impl Into<String>, listen: impl Display) -> ListenerBuilder {
        ListenerBuilder {
            listener: FileListener {
                name: Some(name.into()),
                mode: Some(mode),
                listen: Some(listen.to_string()),
                ..FileListener::default()
            },
        }
    }

    /// A forward listener: every connection goes to `target`.
    pub fn forward(name: impl Into<String>, listen: impl Display, target: impl Display) -> Self {
        let mut builder = ListenerBuilder::new(ModeName::Forward, name, listen);
        builder.listener.target = Some(target.to_string());
        builder
    }

    /// A transparent listener fed by the nftables rules midway installs for connections that
    /// arrive on `interfaces` towards `ports`.
    pub fn transparent(
        name: impl Into<String>,
        listen: impl Display,
        interfaces: impl IntoIterator<Item = String>,
        ports: impl IntoIterator<Item = u16>,
    ) -> ListenerBuilder {
        let mut builder = ListenerBuilder::new(ModeName::Transparent, name, listen);
        builder.listener.nftables = Some(FileNftables {
            manage: Some(true),
            interfaces: interfaces.into_iter().collect(),
            ports: ports.into_iter().collect(),
            ..FileNftables::default()
        });
        builder
    }

    /// The relay model.
    pub fn relay(mut self, relay: RelayName) -> ListenerBuilder {
        self.listener.relay = Some(relay);
        self
    }

    /// The profile of the client-facing segment.
    pub fn local_profile(mut self, profile: impl Into<String>) -> ListenerBuilder {
        self.listener.local_profile = Some(profile.into());
        self
    }

    /// The profile of the server-facing segment.
    pub fn remote_profile(mut self, profile: impl Into<String>) -> ListenerBuilder {
        self.listener.remote_profile = Some(profile.into());
        self
    }

    /// A peer listener: accepts connections from midways that authenticate with one of `keys`.
    pub fn peer(
        name: impl Into<String>,
        listen: impl Display,
        keys: impl IntoIterator<Item = String>,
    ) -> ListenerBuilder {
        let mut builder = ListenerBuilder::new(ModeName::Peer, name, listen);
        builder.listener.keys = Some(keys.into_iter().collect());
        builder
    }

    /// Sends connections through these `[[peers]]` (by name) where their destinations match.
    pub fn via(mut self, peers: impl IntoIterator<Item = String>) -> ListenerBuilder {
        self.listener.via = Some(peers.into_iter().collect());
        self
    }

    /// Connects the remote segment from the client's own address.
    pub fn spoof_client_address(mut self, spoof: bool) -> ListenerBuilder {
        self.listener.spoof_client_address = Some(spoof);
        self
    }

    /// Carries the DSCP marking across the split, both ways.
    pub fn carry_dscp(mut self, carry: bool) -> ListenerBuilder {
        self.listener.carry_dscp = Some(carry);
        self
    }

    /// The HTTP engine's settings (`mode = "http"`).
    pub fn http(mut self, http: FileHttp) -> ListenerBuilder {
        self.listener.http = Some(http);
        self
    }

    /// The listener as file structs.
    pub fn build(self) -> FileListener {
        self.listener
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_config_reads_back_as_itself() {
        let config = ConfigBuilder::new(["10.0.1.0/24"])
            .max_connections(100, 10)
            .timeouts(
                Duration::from_secs(5),
                Duration::from_secs(600),
                Duration::from_secs(2),
            )
            .metrics("127.0.0.1:9100".parse().unwrap())
            .profile(
                "c",
                ProfileSpec {
                    congestion_control: Some("cubic".into()),
                    ..ProfileSpec::default()
                },
            )
            .listener(
                ListenerBuilder::forward("p1", "10.0.1.2:5201", "10.0.2.2:5201")
                    .relay(RelayName::Buffer)
                    .local_profile("c")
                    .build(),
            )
            .listener(
                ListenerBuilder::transparent("t", "0.0.0.0:9000", ["eth0".to_string()], [80, 443])
                    .build(),
            )
            .build();
        let text = config.to_toml().unwrap();
        let back: FileConfig = toml::from_str(&text).unwrap();
        assert_eq!(back, config, "{text}");
        // Unset keys are not written.
        assert!(!text.contains("spool"), "{text}");
        assert!(text.contains("idle_timeout = \"10m\""), "{text}");
    }
}
