//! The TOS of the packets an IPv4 *connecting* TCP socket receives, which the kernel keeps
//! nowhere a process can read (`IP_PKTOPTIONS` answers only for accepted sockets, see `tos`):
//! a small BPF socket filter, attached to the socket, stores the TOS byte of each packet it
//! lets through in a map keyed by the socket's cookie. The owner reads it once and detaches
//! the filter, so it runs only until then.
//!
//! The program (hand-assembled; loading it needs `CAP_BPF` or root) always accepts the whole
//! packet; it never drops or trims one:
//!
//! ```text
//! r6 = r1                          ; the skb, as LD_ABS wants it
//! r0 = *(u8 *)(network header + 1) ; LD_ABS: the IPv4 TOS byte
//! r7 = r0
//! r1 = r6
//! call get_socket_cookie
//! *(u64 *)(r10 - 16) = r0          ; key
//! *(u32 *)(r10 - 4) = r7           ; value
//! r1 = map; r2 = r10 - 16; r3 = r10 - 4; r4 = BPF_ANY
//! call map_update_elem
//! r0 = 0xffffffff                  ; keep the whole packet
//! exit
//! ```

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::sockopt::set_int;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
const BPF_FUNC_MAP_UPDATE_ELEM: i32 = 2;
const BPF_FUNC_GET_SOCKET_COOKIE: i32 = 46;
const BPF_PSEUDO_MAP_FD: u8 = 1;
/// `SKF_NET_OFF`: LD_ABS offsets from the network header start here.
const SKF_NET_OFF: i32 = -0x100000;
const SO_ATTACH_BPF: libc::c_int = 50;
const SO_DETACH_BPF: libc::c_int = 27;
const SO_COOKIE: libc::c_int = 57;

/// Sockets whose TOS the map holds at once; the least recently written go first, so a socket
/// closed before it was read never needs cleaning up.
const MAP_ENTRIES: u32 = 16_384;

/// One BPF instruction as the kernel reads it (`struct bpf_insn`).
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | (u64::from(dst & 0xf) << 8)
        | (u64::from(src & 0xf) << 12)
        | (u64::from(off as u16) << 16)
        | (u64::from(imm as u32) << 32)
}

/// The filter program with `map_fd` built in.
fn program(map_fd: i32) -> Vec<u64> {
    const MOV64_X: u8 = 0xbf;
    const MOV64_K: u8 = 0xb7;
    const ADD64_K: u8 = 0x07;
    const LD_ABS_B: u8 = 0x30;
    const CALL: u8 = 0x85;
    const STX_DW: u8 = 0x7b;
    const STX_W: u8 = 0x63;
    const LD_IMM64: u8 = 0x18;
    const EXIT: u8 = 0x95;
    vec![
        insn(MOV64_X, 6, 1, 0, 0),
        insn(LD_ABS_B, 0, 0, 0, SKF_NET_OFF + 1),
        insn(MOV64_X, 7, 0, 0, 0),
        insn(MOV64_X, 1, 6, 0, 0),
        insn(CALL, 0, 0, 0, BPF_FUNC_GET_SOCKET_COOKIE),
        insn(STX_DW, 10, 0, -16, 0),
        insn(STX_W, 10, 7, -4, 0),
        insn(LD_IMM64, 1, BPF_PSEUDO_MAP_FD, 0, map_fd),
        insn(0, 0, 0, 0, 0),
        insn(MOV64_X, 2, 10, 0, 0),
        insn(ADD64_K, 2, 0, 0, -16),
        insn(MOV64_X, 3, 10, 0, 0),
        insn(ADD64_K, 3, 0, 0, -4),
        insn(MOV64_K, 4, 0, 0, 0),
        insn(CALL, 0, 0, 0, BPF_FUNC_MAP_UPDATE_ELEM),
        insn(MOV64_K, 0, 0, 0, -1),
        insn(EXIT, 0, 0, 0, 0),
    ]
}

/// `bpf(cmd, attr)`; the new fd for the commands that make one.
fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> io::Result<libc::c_long> {
    // SAFETY: attr is a zeroed, 128-byte `union bpf_attr` with the command's fields set; the
    // pointers in it point at live buffers for the duration of the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr),
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// The loaded filter and its map; shared by every socket it is attached to.
#[derive(Debug)]
pub struct ReceivedTosFilter {
    map: OwnedFd,
    program: OwnedFd,
}

impl ReceivedTosFilter {
    /// Creates the map and loads the program (needs `CAP_BPF` or root).
    pub fn load() -> io::Result<ReceivedTosFilter> {
        let mut attr = [0u64; 16];
        // map_type, key_size | value_size, max_entries.
        attr[0] = u64::from(BPF_MAP_TYPE_LRU_HASH) | (8u64 << 32);
        attr[1] = 4 | (u64::from(MAP_ENTRIES) << 32);
        let map = owned(bpf(BPF_MAP_CREATE, &mut attr)?);
        let insns = program(map.as_raw_fd());
        let license = b"GPL\0";
        let mut attr = [0u64; 16];
        // prog_type | insn_cnt, insns, license.
        attr[0] = u64::from(BPF_PROG_TYPE_SOCKET_FILTER) | ((insns.len() as u64) << 32);
        attr[1] = insns.as_ptr() as u64;
        attr[2] = license.as_ptr() as u64;
        let program = owned(bpf(BPF_PROG_LOAD, &mut attr)?);
        Ok(ReceivedTosFilter { map, program })
    }

    /// Attaches the filter to `fd` (an IPv4 TCP socket, best before it connects).
    pub fn attach(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        set_int(
            fd,
            libc::SOL_SOCKET,
            SO_ATTACH_BPF,
            self.program.as_raw_fd(),
        )
    }

    /// The TOS of the last packet `fd` received while the filter was attached (`None`: none
    /// yet), left in place.
    pub fn latest(&self, fd: BorrowedFd<'_>) -> io::Result<Option<u8>> {
        self.lookup(socket_cookie(fd)?)
    }

    fn lookup(&self, cookie: u64) -> io::Result<Option<u8>> {
        let mut value = 0u32;
        let mut attr = [0u64; 16];
        attr[0] = self.map.as_raw_fd() as u64;
        attr[1] = &cookie as *const u64 as u64;
        attr[2] = &mut value as *mut u32 as u64;
        match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
            Ok(_) => Ok(Some(value as u8)),
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// The TOS of the last packet `fd` received (`None`: none yet), taken out of the map, and
    /// the filter detached from `fd`.
    pub fn take(&self, fd: BorrowedFd<'_>) -> io::Result<Option<u8>> {
        let cookie = socket_cookie(fd)?;
        let found = self.lookup(cookie)?;
        if found.is_some() {
            let mut attr = [0u64; 16];
            attr[0] = self.map.as_raw_fd() as u64;
            attr[1] = &cookie as *const u64 as u64;
            // Gone already (evicted) is as good as deleted.
            let _ = bpf(BPF_MAP_DELETE_ELEM, &mut attr);
        }
        match set_int(fd, libc::SOL_SOCKET, SO_DETACH_BPF, 0) {
            // ENOENT: no filter attached (taken before).
            Err(err) if err.raw_os_error() != Some(libc::ENOENT) => Err(err),
            _ => Ok(found),
        }
    }
}

/// `SO_COOKIE`: the socket's number for BPF, stable for its life.
fn socket_cookie(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: valid fd, pointer to a live u64 and its length.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(cookie)
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_are_encoded_as_the_kernel_reads_them() {
        // r6 = r1: opcode 0xbf, dst 6 in the low nibble, src 1 in the high one.
        assert_eq!(insn(0xbf, 6, 1, 0, 0), 0x16bf);
        // *(u64 *)(r10 - 16) = r0
        assert_eq!(insn(0x7b, 10, 0, -16, 0), 0xfff0_0a7b);
        // r0 = -1 (imm sign bits in the top word)
        assert_eq!(insn(0xb7, 0, 0, 0, -1), 0xffff_ffff_0000_00b7);
    }

    #[test]
    fn a_connecting_socket_learns_the_tos_of_its_peers_packets() {
        use std::io::{Read, Write};
        use std::net::{TcpListener, TcpStream};
        use std::os::fd::AsFd;
        let Ok(filter) = ReceivedTosFilter::load() else {
            eprintln!("skipped: loading a BPF program needs CAP_BPF");
            return;
        };
        // Loopback exists in every namespace; nothing leaves the host.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .unwrap();
        filter.attach(socket.as_fd()).unwrap();
        socket
            .connect(&listener.local_addr().unwrap().into())
            .unwrap();
        let mut client: TcpStream = socket.into();
        let (mut server, _) = listener.accept().unwrap();
        crate::tos::set_class(server.as_fd(), 0x28).unwrap();
        server.write_all(b"x").unwrap();
        let mut byte = [0u8; 1];
        client.read_exact(&mut byte).unwrap();
        assert_eq!(filter.take(client.as_fd()).unwrap(), Some(0x28));
        // Detached and removed: nothing more is recorded.
        server.write_all(b"y").unwrap();
        client.read_exact(&mut byte).unwrap();
        assert_eq!(filter.take(client.as_fd()).unwrap(), None);
    }
}
