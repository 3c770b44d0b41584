//! midway-sys: the one place where midway's crates talk to the kernel about things that are not
//! sockets' data: socket options as the kernel takes them, reading `tcp_info` back from a live
//! socket, the `/proc` files the proxy, the lab and the benchmark read (CPU time, resident
//! memory, TCP memory), the open-file limit, sysctls, network namespaces (creating, entering, removing), routes,
//! rules, links and addresses over rtnetlink (so no iproute2 is needed), the one runner for
//! programs that stay programs, and the registry of what a signal must not leave behind. No
//! policy lives here; every function is a thin, documented reader or wrapper with its parsing
//! and message building tested without the kernel.

pub mod cleanup;
pub mod command;
pub mod fd_limit;
pub mod netlink;
pub mod netns;
pub mod procfs;
pub mod sockopt;
pub mod sysctl;
pub mod tcp_info;
pub mod tos;
pub mod tos_filter;
