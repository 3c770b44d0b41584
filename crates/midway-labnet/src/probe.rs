//! Small measurement tools on real sockets created inside hosts: sockets keep the namespace they
//! were created in, so they are made on a thread inside the host and then used from anywhere.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsFd;

use midway_sys::tcp_info::tcp_stats;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::error::LabNetError;
use crate::topology::Topology;

fn measure_err(host: &str) -> impl Fn(std::io::Error) -> LabNetError + '_ {
    move |source| LabNetError::Measure {
        host: host.to_owned(),
        source,
    }
}

/// A TCP listener bound to `addr` (port 0 for any) inside `host`.
pub(crate) fn tcp_listener_in(
    topology: &Topology,
    host: &str,
    addr: SocketAddr,
) -> Result<TcpListener, LabNetError> {
    topology
        .try_in_host(host, move || TcpListener::bind(addr))?
        .map_err(measure_err(host))
}

/// A TCP stream from `host` connected to `to`, with a connect timeout.
pub(crate) fn tcp_connect_from(
    topology: &Topology,
    host: &str,
    to: SocketAddr,
    timeout: Duration,
) -> Result<TcpStream, LabNetError> {
    let socket = topology
        .try_in_host(host, move || {
            Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))
        })?
        .map_err(measure_err(host))?;
    socket
        .connect_timeout(&to.into(), timeout)
        .map_err(measure_err(host))?;
    Ok(socket.into())
}

/// A UDP socket bound to `addr` inside `host`.
pub(crate) fn udp_socket_in(
    topology: &Topology,
    host: &str,
    addr: SocketAddr,
) -> Result<UdpSocket, LabNetError> {
    topology
        .try_in_host(host, move || UdpSocket::bind(addr))?
        .map_err(measure_err(host))
}

/// See [`Topology::advertised_window`].
pub(crate) fn advertised_window(
    topology: &Topology,
    host: &str,
    neighbour: &str,
) -> Result<u32, LabNetError> {
    let addr = SocketAddr::new(topology.try_addr(host, neighbour)?, 0);
    let listener = tcp_listener_in(topology, host, addr)?;
    let to = listener.local_addr().map_err(measure_err(host))?;
    let mut sender = tcp_connect_from(topology, neighbour, to, Duration::from_secs(5))?;
    let (mut receiver, _) = listener.accept().map_err(measure_err(host))?;
    let reader = std::thread::spawn(move || -> std::io::Result<u64> {
        receiver.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut buf = [0u8; 4096];
        let mut total = 0u64;
        loop {
            match receiver.read(&mut buf)? {
                0 => return Ok(total),
                n => total += n as u64,
            }
        }
    });
    let chunk = [0u8; 1024];
    let mut widest = 0u32;
    let deadline = Instant::now() + Duration::from_secs(10);
    for _ in 0..64 {
        if Instant::now() > deadline {
            break;
        }
        sender.write_all(&chunk).map_err(measure_err(neighbour))?;
        let info = tcp_stats(sender.as_fd()).map_err(measure_err(neighbour))?;
        widest = widest.max(info.snd_wnd.unwrap_or(0));
    }
    sender
        .shutdown(std::net::Shutdown::Write)
        .map_err(measure_err(neighbour))?;
    let received = reader
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
        .map_err(measure_err(host))?;
    let info = tcp_stats(sender.as_fd()).map_err(measure_err(neighbour))?;
    widest = widest.max(info.snd_wnd.unwrap_or(0));
    if received != 64 * 1024 || widest == 0 {
        return Err(LabNetError::Selftest(format!(
            "window probe: received {received} of {} bytes, window seen {widest} (kernel without tcpi_snd_wnd?)",
            64 * 1024
        )));
    }
    Ok(widest)
}
