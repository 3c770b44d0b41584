//! The IP traffic class of a TCP socket: the byte it sends with (`IP_TOS` / `IPV6_TCLASS`) and
//! the one its peer's packets carried (`IP_PKTOPTIONS` / `IPV6_2292PKTOPTIONS`, after
//! `IP_RECVTOS` / `IPV6_RECVTCLASS`). Which byte to carry where is the caller's decision.
//!
//! What the kernel (6.x) keeps for the received class, read back as control messages:
//! - IPv4: the TOS of the packet that completed the handshake, on *accepted* sockets only
//!   (`tcp_v4_syn_recv_sock` stores it); a connecting socket always reads 0 (`tos_filter`
//!   records it for those).
//! - IPv6: the traffic class of the last in-order segment received, on any socket.
//!
//! The option that asks for it is inherited by accepted sockets from their listener.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::sockopt::{get_int, set_int};

/// `IPV6_2292PKTOPTIONS`: the IPv6 counterpart of `IP_PKTOPTIONS` (not in the libc crate).
const IPV6_2292PKTOPTIONS: libc::c_int = 6;

/// The address family of a socket, which decides the option level.
fn is_ipv6(fd: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(get_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN)? == libc::AF_INET6)
}

/// Asks the kernel to keep the traffic class of received packets (`IP_RECVTOS` or
/// `IPV6_RECVTCLASS`, by the socket's family). Set on a listener, accepted sockets inherit it.
pub fn set_keep_received_class(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    let on = libc::c_int::from(on);
    if is_ipv6(fd)? {
        set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, on)
    } else {
        set_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, on)
    }
}

/// Whether the socket keeps the received traffic class (see [`set_keep_received_class`]).
pub fn keeps_received_class(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let value = if is_ipv6(fd)? {
        get_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS)?
    } else {
        get_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS)?
    };
    Ok(value != 0)
}

/// Sets the traffic class byte the socket sends with (`IP_TOS` or `IPV6_TCLASS`). For TCP the
/// kernel keeps the ECN bits its own.
pub fn set_class(fd: BorrowedFd<'_>, class: u8) -> io::Result<()> {
    let class = libc::c_int::from(class);
    if is_ipv6(fd)? {
        set_int(fd, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, class)
    } else {
        set_int(fd, libc::IPPROTO_IP, libc::IP_TOS, class)
    }
}

/// The traffic class byte the socket sends with.
pub fn class(fd: BorrowedFd<'_>) -> io::Result<u8> {
    let value = if is_ipv6(fd)? {
        get_int(fd, libc::IPPROTO_IPV6, libc::IPV6_TCLASS)?
    } else {
        get_int(fd, libc::IPPROTO_IP, libc::IP_TOS)?
    };
    // IPV6_TCLASS reads -1 when never set: the kernel's default, 0.
    Ok(u8::try_from(value).unwrap_or(0))
}

/// The traffic class the kernel kept from the peer's packets (see the module doc for which
/// packet), or `None` when it kept none (the option was off, or nothing arrived yet).
pub fn received_class(fd: BorrowedFd<'_>) -> io::Result<Option<u8>> {
    let v6 = is_ipv6(fd)?;
    let (level, opt) = if v6 {
        (libc::IPPROTO_IPV6, IPV6_2292PKTOPTIONS)
    } else {
        (libc::IPPROTO_IP, libc::IP_PKTOPTIONS)
    };
    // Room for every control message these options return (a few of 16-24 bytes each).
    let mut buf = [0u8; 256];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: valid fd, pointer to a live buffer and its length; the kernel writes at most len.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = (len as usize).min(buf.len());
    Ok(class_in_control_messages(&buf[..len], v6))
}

/// The traffic class in a control message buffer as `IP_PKTOPTIONS` / `IPV6_2292PKTOPTIONS`
/// return it: `struct cmsghdr` (length, level, type) then the data, each aligned to the size
/// of a `long`. IPv4's `IP_TOS` carries one byte, IPv6's `IPV6_TCLASS` an `int`.
pub fn class_in_control_messages(buf: &[u8], v6: bool) -> Option<u8> {
    let (level, kind) = if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
    } else {
        (libc::IPPROTO_IP, libc::IP_TOS)
    };
    let align = std::mem::size_of::<libc::c_long>();
    let header = std::mem::size_of::<libc::cmsghdr>();
    let mut at = 0usize;
    // Each message takes at least a header, so this ends within buf.len() / header rounds.
    while at + header <= buf.len() {
        let word = |offset: usize, size: usize| -> Option<u64> {
            let bytes = buf.get(at + offset..at + offset + size)?;
            Some(match size {
                8 => u64::from_ne_bytes(bytes.try_into().ok()?),
                _ => u64::from(u32::from_ne_bytes(bytes.try_into().ok()?)),
            })
        };
        let len_size = std::mem::size_of::<libc::size_t>();
        let cmsg_len = usize::try_from(word(0, len_size)?).ok()?;
        let cmsg_level = word(len_size, 4)? as libc::c_int;
        let cmsg_type = word(len_size + 4, 4)? as libc::c_int;
        if cmsg_len < header {
            return None;
        }
        if cmsg_level == level && cmsg_type == kind {
            return buf.get(at + header).copied();
        }
        at += cmsg_len.div_ceil(align) * align;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One control message as the kernel writes it on a 64-bit target.
    fn message(level: libc::c_int, kind: libc::c_int, data: &[u8]) -> Vec<u8> {
        let header = std::mem::size_of::<libc::cmsghdr>();
        let len = header + data.len();
        let mut out = Vec::new();
        out.extend_from_slice(&(len as libc::size_t).to_ne_bytes());
        out.extend_from_slice(&level.to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(data);
        let align = std::mem::size_of::<libc::c_long>();
        out.resize(len.div_ceil(align) * align, 0);
        out
    }

    #[test]
    fn finds_the_ipv4_tos_byte() {
        let buf = message(libc::IPPROTO_IP, libc::IP_TOS, &[0xb8]);
        assert_eq!(class_in_control_messages(&buf, false), Some(0xb8));
        assert_eq!(class_in_control_messages(&buf, true), None);
    }

    #[test]
    fn finds_the_ipv6_class_after_other_messages() {
        let mut buf = message(
            libc::IPPROTO_IPV6,
            libc::IPV6_HOPLIMIT,
            &64i32.to_ne_bytes(),
        );
        buf.extend(message(
            libc::IPPROTO_IPV6,
            libc::IPV6_TCLASS,
            &0x28i32.to_ne_bytes(),
        ));
        assert_eq!(class_in_control_messages(&buf, true), Some(0x28));
    }

    #[test]
    fn nothing_kept_and_garbage_read_as_none() {
        assert_eq!(class_in_control_messages(&[], false), None);
        // A length shorter than its own header must not loop.
        let mut buf = message(libc::IPPROTO_IP, libc::IP_TTL, &[64]);
        buf[..std::mem::size_of::<libc::size_t>()].fill(0);
        assert_eq!(class_in_control_messages(&buf, false), None);
    }

    #[test]
    fn an_accepted_socket_reads_the_class_its_client_sent() {
        use std::net::{TcpListener, TcpStream};
        use std::os::fd::AsFd;
        // Loopback exists in every namespace; nothing leaves the host.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        set_keep_received_class(listener.as_fd(), true).unwrap();
        let client = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .unwrap();
        set_class(client.as_fd(), 0xb8).unwrap();
        assert_eq!(class(client.as_fd()).unwrap(), 0xb8);
        client
            .connect(&listener.local_addr().unwrap().into())
            .unwrap();
        let _client: TcpStream = client.into();
        let (accepted, _) = listener.accept().unwrap();
        assert!(keeps_received_class(accepted.as_fd()).unwrap());
        assert_eq!(received_class(accepted.as_fd()).unwrap(), Some(0xb8));
    }
}
