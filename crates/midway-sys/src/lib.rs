//! midway-sys: the one place where midway's crates talk to the kernel about things that are not
//! sockets' data: socket options as the kernel takes them, reading `tcp_info` back from a live
//! socket, the `/proc` files the proxy, the lab and the benchmark read (CPU time, resident
//! memory, TCP memory), running code inside a network namespace and removing namespaces, and the
//! registry of what a signal must not leave behind. No policy lives here; every function is a thin, documented reader or
//! wrapper with its parsing tested on fixed text.

pub mod cleanup;
pub mod netns;
pub mod procfs;
pub mod sockopt;
pub mod tcp_info;
