//! Frame classification: is an Ethernet frame a pure TCP ACK, or a handshake segment?
//!
//! A pure ACK is a TCP segment over IPv4 or IPv6 with no payload, the ACK flag set and none of SYN,
//! FIN or RST (those carry connection state and are treated as data). A handshake segment has SYN
//! set (a SYN or a SYN-ACK): losing one costs a whole initial retransmission timeout (1 s). One 802.1Q tag is skipped;
//! IPv6 hop-by-hop, routing and destination-options headers are walked; IPv4 fragments and IPv6
//! fragment headers are never pure ACKs. Truncated or malformed frames are "not a pure ACK".

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const IPPROTO_TCP: u8 = 6;
const IPV6_HOP_BY_HOP: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_DESTINATION_OPTIONS: u8 = 60;
const ETHERNET_HEADER_LEN: usize = 14;
const IPV6_HEADER_LEN: usize = 40;
const TCP_MIN_HEADER_LEN: usize = 20;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

/// What a frame carries, as far as the emulator's counters care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// A TCP segment with only an acknowledgement.
    PureAck,
    /// A TCP segment with SYN set: a SYN or a SYN-ACK.
    Handshake,
    /// Anything else: data, FIN, RST, other protocols, frames that do not parse.
    Other,
}

/// The kind of `frame` (starting at the Ethernet destination address).
pub(crate) fn frame_kind(frame: &[u8]) -> FrameKind {
    classify(frame).unwrap_or(FrameKind::Other)
}

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

fn classify(frame: &[u8]) -> Option<FrameKind> {
    let mut offset = ETHERNET_HEADER_LEN;
    let mut ethertype = be16(frame, 12)?;
    if ethertype == ETHERTYPE_VLAN {
        ethertype = be16(frame, 16)?;
        offset += 4;
    }
    let packet = frame.get(offset..)?;
    match ethertype {
        ETHERTYPE_IPV4 => ipv4(packet),
        ETHERTYPE_IPV6 => ipv6(packet),
        _ => Some(FrameKind::Other),
    }
}

fn ipv4(packet: &[u8]) -> Option<FrameKind> {
    let version_ihl = *packet.first()?;
    if version_ihl >> 4 != 4 {
        return Some(FrameKind::Other);
    }
    let header_len = usize::from(version_ihl & 0x0f) * 4;
    let total_len = usize::from(be16(packet, 2)?);
    let flags_fragment = be16(packet, 6)?;
    let more_fragments = flags_fragment & 0x2000 != 0;
    let fragment_offset = flags_fragment & 0x1fff;
    if packet.get(9)? != &IPPROTO_TCP || more_fragments || fragment_offset != 0 {
        return Some(FrameKind::Other);
    }
    if header_len < 20 || total_len < header_len || total_len > packet.len() {
        return None;
    }
    tcp(&packet[header_len..total_len])
}

fn ipv6(packet: &[u8]) -> Option<FrameKind> {
    if packet.first()? >> 4 != 6 {
        return Some(FrameKind::Other);
    }
    let payload_len = usize::from(be16(packet, 4)?);
    let end = IPV6_HEADER_LEN.checked_add(payload_len)?;
    if end > packet.len() {
        return None;
    }
    let mut next_header = *packet.get(6)?;
    let mut offset = IPV6_HEADER_LEN;
    // Bounded: each extension header is at least 8 bytes and the packet is finite.
    while matches!(
        next_header,
        IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DESTINATION_OPTIONS
    ) {
        next_header = *packet.get(offset)?;
        let extension_len = (usize::from(*packet.get(offset + 1)?) + 1) * 8;
        offset += extension_len;
        if offset > end {
            return None;
        }
    }
    if next_header != IPPROTO_TCP {
        return Some(FrameKind::Other);
    }
    tcp(&packet[offset..end])
}

/// `segment` is exactly the TCP header plus payload.
fn tcp(segment: &[u8]) -> Option<FrameKind> {
    let data_offset = usize::from(segment.get(12)? >> 4) * 4;
    let flags = *segment.get(13)?;
    if data_offset < TCP_MIN_HEADER_LEN || data_offset > segment.len() {
        return None;
    }
    let has_payload = segment.len() > data_offset;
    let ack = flags & TCP_ACK != 0;
    let control = flags & (TCP_SYN | TCP_FIN | TCP_RST) != 0;
    Some(if flags & TCP_SYN != 0 {
        FrameKind::Handshake
    } else if ack && !control && !has_payload {
        FrameKind::PureAck
    } else {
        FrameKind::Other
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn is_pure_tcp_ack(frame: &[u8]) -> bool {
        frame_kind(frame) == FrameKind::PureAck
    }

    /// Builds an Ethernet frame with a TCP segment; `tcp_options` pads the TCP header.
    pub(crate) fn tcp_frame(ipv6: bool, flags: u8, tcp_options: usize, payload: usize) -> Vec<u8> {
        let tcp_header_len = TCP_MIN_HEADER_LEN + tcp_options;
        let mut tcp = vec![0u8; tcp_header_len + payload];
        tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
        tcp[12] = ((tcp_header_len / 4) as u8) << 4;
        tcp[13] = flags;
        let mut frame = vec![0u8; 12];
        if ipv6 {
            frame.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
            let mut ip = vec![0u8; IPV6_HEADER_LEN];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(tcp.len() as u16).to_be_bytes());
            ip[6] = IPPROTO_TCP;
            ip[7] = 64;
            frame.extend_from_slice(&ip);
        } else {
            frame.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
            let mut ip = vec![0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + tcp.len()) as u16).to_be_bytes());
            ip[6] = 0x40; // don't fragment
            ip[8] = 64;
            ip[9] = IPPROTO_TCP;
            frame.extend_from_slice(&ip);
        }
        frame.extend_from_slice(&tcp);
        frame
    }

    #[test]
    fn syns_and_syn_acks_are_handshake_segments() {
        for ipv6 in [false, true] {
            assert_eq!(
                frame_kind(&tcp_frame(ipv6, TCP_SYN, 20, 0)),
                FrameKind::Handshake
            );
            let syn_ack = tcp_frame(ipv6, TCP_SYN | TCP_ACK, 20, 0);
            assert_eq!(frame_kind(&syn_ack), FrameKind::Handshake);
            assert_eq!(
                frame_kind(&tcp_frame(ipv6, TCP_ACK, 12, 100)),
                FrameKind::Other
            );
            assert_eq!(
                frame_kind(&tcp_frame(ipv6, TCP_ACK, 12, 0)),
                FrameKind::PureAck
            );
        }
        assert_eq!(frame_kind(&[0u8; 10]), FrameKind::Other);
    }

    #[test]
    fn pure_acks_are_recognised() {
        for ipv6 in [false, true] {
            assert!(is_pure_tcp_ack(&tcp_frame(ipv6, TCP_ACK, 0, 0)));
            // Timestamps option (12 bytes) and PSH do not matter.
            assert!(is_pure_tcp_ack(&tcp_frame(ipv6, TCP_ACK | 0x08, 12, 0)));
        }
    }

    #[test]
    fn data_and_control_segments_are_not_pure_acks() {
        for ipv6 in [false, true] {
            assert!(!is_pure_tcp_ack(&tcp_frame(ipv6, TCP_ACK, 12, 1)));
            assert!(!is_pure_tcp_ack(&tcp_frame(ipv6, TCP_ACK, 12, 1448)));
            assert!(!is_pure_tcp_ack(&tcp_frame(ipv6, TCP_SYN | TCP_ACK, 0, 0)));
            assert!(!is_pure_tcp_ack(&tcp_frame(ipv6, TCP_FIN | TCP_ACK, 0, 0)));
            assert!(!is_pure_tcp_ack(&tcp_frame(ipv6, TCP_RST | TCP_ACK, 0, 0)));
            assert!(!is_pure_tcp_ack(&tcp_frame(ipv6, TCP_SYN, 0, 0)));
            assert!(!is_pure_tcp_ack(&tcp_frame(ipv6, 0, 0, 0)));
        }
    }

    #[test]
    fn ethernet_padding_is_not_payload() {
        // A 54-byte IPv4 ACK is padded to the 60-byte Ethernet minimum; IP total length rules.
        let mut frame = tcp_frame(false, TCP_ACK, 0, 0);
        assert_eq!(frame.len(), 54);
        frame.resize(60, 0);
        assert!(is_pure_tcp_ack(&frame));
    }

    #[test]
    fn vlan_tag_is_skipped() {
        let plain = tcp_frame(false, TCP_ACK, 0, 0);
        let mut tagged = plain[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        tagged.extend_from_slice(&plain[12..]);
        assert!(is_pure_tcp_ack(&tagged));
    }

    #[test]
    fn ipv6_extension_headers_are_walked() {
        let plain = tcp_frame(true, TCP_ACK, 0, 0);
        let mut frame = plain[..14 + IPV6_HEADER_LEN].to_vec();
        frame[14 + 6] = IPV6_HOP_BY_HOP;
        let payload_len = u16::from_be_bytes([frame[18], frame[19]]) + 8;
        frame[18..20].copy_from_slice(&payload_len.to_be_bytes());
        frame.extend_from_slice(&[IPPROTO_TCP, 0, 0, 0, 0, 0, 0, 0]);
        frame.extend_from_slice(&plain[14 + IPV6_HEADER_LEN..]);
        assert!(is_pure_tcp_ack(&frame));
    }

    #[test]
    fn fragments_and_other_protocols_are_not_pure_acks() {
        let mut fragment = tcp_frame(false, TCP_ACK, 0, 0);
        fragment[14 + 6] = 0x20; // more fragments
        assert!(!is_pure_tcp_ack(&fragment));
        let mut udp = tcp_frame(false, TCP_ACK, 0, 0);
        udp[14 + 9] = 17;
        assert!(!is_pure_tcp_ack(&udp));
        let mut arp = tcp_frame(false, TCP_ACK, 0, 0);
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert!(!is_pure_tcp_ack(&arp));
    }

    #[test]
    fn truncated_frames_are_not_pure_acks_and_do_not_panic() {
        for ipv6 in [false, true] {
            let frame = tcp_frame(ipv6, TCP_ACK, 12, 0);
            for len in 0..frame.len() {
                assert!(!is_pure_tcp_ack(&frame[..len]), "len {len}");
            }
        }
        // Garbage header lengths.
        let mut bad_ihl = tcp_frame(false, TCP_ACK, 0, 0);
        bad_ihl[14] = 0x41;
        assert!(!is_pure_tcp_ack(&bad_ihl));
        let mut bad_offset = tcp_frame(false, TCP_ACK, 0, 0);
        bad_offset[14 + 20 + 12] = 0xf0;
        assert!(!is_pure_tcp_ack(&bad_offset));
    }
}
