//! midway-proxy's integration tests: an in-process proxy over real sockets and namespaces, one
//! module per file. One test binary, not a binary per file: each binary compiled and optimised
//! its own copy of tokio's, hyper's and rustls's generic code, which made a large part of CI's
//! build. Three files stay binaries of their own (Cargo.toml says why): `fd_exhaustion`,
//! `socket_memory` and `access_link_netns`. `cargo test -p midway-proxy --test integration
//! forward::` runs one file's tests.

mod access_links;
mod bpf_congestion;
mod config_files;
mod connect_backup;
mod dscp_netns;
mod fast_open_netns;
mod final_tcp_info;
mod forward;
mod http;
mod http_reload;
mod profiles;
mod proxy_protocol;
mod socks5;
mod transparent;
