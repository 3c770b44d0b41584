//! The request/answer loop every netlink socket here runs, whatever the protocol (rtnetlink for
//! routes and links, generic netlink for the TCP metrics cache) and message type.

use std::fmt::Debug;
use std::io;

use netlink_packet_core::{
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
    NLM_F_REQUEST,
};
use netlink_sys::{Socket, SocketAddr};

use super::{NetlinkError, REPLY_TIMEOUT};

/// A connected netlink socket of one protocol, with the sequence number of its last request.
#[derive(Debug)]
pub(super) struct Channel {
    socket: Socket,
    sequence: u32,
}

impl Channel {
    /// A socket of `protocol` in the calling thread's network namespace; every wait for an
    /// answer ends after [`REPLY_TIMEOUT`].
    pub(super) fn open(protocol: isize) -> Result<Channel, NetlinkError> {
        let mut socket = Socket::new(protocol).map_err(NetlinkError::Open)?;
        socket.bind_auto().map_err(NetlinkError::Open)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(NetlinkError::Open)?;
        // Errors carry the offending attribute's message (extended ACK) where the protocol
        // gives one; a kernel without it still answers, so a refusal is not an error.
        let _ = socket.set_ext_ack(true);
        nix::sys::socket::setsockopt(
            &socket,
            nix::sys::socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(REPLY_TIMEOUT.as_secs() as i64, 0),
        )
        .map_err(|e| NetlinkError::Open(e.into()))?;
        Ok(Channel {
            socket,
            sequence: 0,
        })
    }

    /// Sends `message` with `flags` (besides `NLM_F_REQUEST`) and collects the messages of the
    /// answer up to the end of a dump or the acknowledgement; a refusal is
    /// [`NetlinkError::Kernel`] naming `request`. Answers to earlier, abandoned requests are
    /// skipped.
    pub(super) fn exchange<M>(
        &mut self,
        message: M,
        flags: u16,
        request: &str,
    ) -> Result<Vec<M>, NetlinkError>
    where
        M: NetlinkSerializable + NetlinkDeserializable + Debug,
    {
        self.sequence = self.sequence.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = self.sequence;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
        packet.finalize();
        let mut buffer = vec![0; packet.buffer_len()];
        packet.serialize(&mut buffer);
        self.socket
            .send(&buffer, 0)
            .map_err(|source| io_error(request, source))?;
        let mut answer = Vec::new();
        loop {
            let (datagram, _) = self
                .socket
                .recv_from_full()
                .map_err(|source| io_error(request, source))?;
            let mut offset = 0;
            while offset < datagram.len() {
                let reply = NetlinkMessage::<M>::deserialize(&datagram[offset..]).map_err(|e| {
                    NetlinkError::Decode {
                        request: request.to_owned(),
                        message: e.to_string(),
                    }
                })?;
                let length = reply.header.length as usize;
                if length == 0 {
                    break;
                }
                offset += (length + 3) & !3;
                if reply.header.sequence_number != self.sequence {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::InnerMessage(inner) => answer.push(inner),
                    NetlinkPayload::Done(_) => return Ok(answer),
                    NetlinkPayload::Error(error) => {
                        return match error.code {
                            None => Ok(answer),
                            Some(_) => Err(NetlinkError::Kernel {
                                request: request.to_owned(),
                                source: error.to_io(),
                            }),
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

fn io_error(request: &str, source: io::Error) -> NetlinkError {
    NetlinkError::Io {
        request: request.to_owned(),
        source,
    }
}
