//! Frame classification: is an Ethernet frame a pure TCP ACK, a handshake segment, UDP?
//!
//! A pure ACK is a TCP segment over IPv4 or IPv6 with no payload, the ACK flag set and none of SYN,
//! FIN or RST (those carry connection state and are treated as data). A handshake segment has SYN
//! set (a SYN or a SYN-ACK): losing one costs a whole initial retransmission timeout (1 s). One 802.1Q tag is skipped;
//! IPv6 hop-by-hop, routing, destination-options and fragment headers are walked; IPv4 fragments
//! and IPv6 fragment headers are never pure ACKs. Truncated or malformed frames are "not a pure
//! ACK" and not UDP.
//!
//! A UDP frame is an IPv4 or IPv6 packet whose transport protocol is UDP (17), fragments
//! included; its ports are known when it carries the UDP header (unfragmented, or the first
//! fragment), for the `udp` impairment.

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPV6_HOP_BY_HOP: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_FRAGMENT: u8 = 44;
const IPV6_DESTINATION_OPTIONS: u8 = 60;
const ETHERNET_HEADER_LEN: usize = 14;
const IPV6_HEADER_LEN: usize = 40;
const IPV6_FRAGMENT_HEADER_LEN: usize = 8;
const TCP_MIN_HEADER_LEN: usize = 20;
const UDP_HEADER_LEN: usize = 8;
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

/// A UDP frame's ports, as far as they can be known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UdpInfo {
    /// `(source, destination)`; `None` for a fragment that does not carry the UDP header.
    pub(crate) ports: Option<(u16, u16)>,
}

/// Everything the engine needs to know about a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameClass {
    /// TCP pure ACK, handshake, or other.
    pub(crate) kind: FrameKind,
    /// `Some` if the frame is a UDP datagram or a fragment of one.
    pub(crate) udp: Option<UdpInfo>,
}

/// The kind of `frame` (starting at the Ethernet destination address).
#[cfg(test)]
pub(crate) fn frame_kind(frame: &[u8]) -> FrameKind {
    frame_class(frame).kind
}

/// The class of `frame` (starting at the Ethernet destination address).
pub(crate) fn frame_class(frame: &[u8]) -> FrameClass {
    let Some(transport) = transport(frame) else {
        return FrameClass {
            kind: FrameKind::Other,
            udp: None,
        };
    };
    let kind = if transport.protocol == IPPROTO_TCP && !transport.fragment {
        tcp(transport.segment).unwrap_or(FrameKind::Other)
    } else {
        FrameKind::Other
    };
    let udp = (transport.protocol == IPPROTO_UDP).then(|| UdpInfo {
        ports: if transport.first_fragment {
            udp_ports(transport.segment)
        } else {
            None
        },
    });
    FrameClass { kind, udp }
}

/// The transport layer of an IP packet.
struct Transport<'a> {
    /// IP protocol number / IPv6 next header after the extension headers.
    protocol: u8,
    /// Transport header and payload (of this fragment), without link padding.
    segment: &'a [u8],
    /// Part of a fragmented packet (IPv4 MF or offset, or an IPv6 fragment header).
    fragment: bool,
    /// Offset 0: `segment` starts with the transport header.
    first_fragment: bool,
}

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

fn transport(frame: &[u8]) -> Option<Transport<'_>> {
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
        _ => None,
    }
}

fn ipv4(packet: &[u8]) -> Option<Transport<'_>> {
    let version_ihl = *packet.first()?;
    if version_ihl >> 4 != 4 {
        return None;
    }
    let header_len = usize::from(version_ihl & 0x0f) * 4;
    let total_len = usize::from(be16(packet, 2)?);
    let flags_fragment = be16(packet, 6)?;
    let more_fragments = flags_fragment & 0x2000 != 0;
    let fragment_offset = flags_fragment & 0x1fff;
    let protocol = *packet.get(9)?;
    if header_len < 20 || total_len < header_len || total_len > packet.len() {
        return None;
    }
    Some(Transport {
        protocol,
        segment: &packet[header_len..total_len],
        fragment: more_fragments || fragment_offset != 0,
        first_fragment: fragment_offset == 0,
    })
}

fn ipv6(packet: &[u8]) -> Option<Transport<'_>> {
    if packet.first()? >> 4 != 6 {
        return None;
    }
    let payload_len = usize::from(be16(packet, 4)?);
    let end = IPV6_HEADER_LEN.checked_add(payload_len)?;
    if end > packet.len() {
        return None;
    }
    let mut next_header = *packet.get(6)?;
    let mut offset = IPV6_HEADER_LEN;
    let mut fragment = false;
    let mut first_fragment = true;
    // Bounded: each extension header is at least 8 bytes and the packet is finite.
    while matches!(
        next_header,
        IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DESTINATION_OPTIONS | IPV6_FRAGMENT
    ) {
        let extension_len = if next_header == IPV6_FRAGMENT {
            fragment = true;
            first_fragment &= be16(packet, offset + 2)? >> 3 == 0;
            IPV6_FRAGMENT_HEADER_LEN
        } else {
            (usize::from(*packet.get(offset + 1)?) + 1) * 8
        };
        next_header = *packet.get(offset)?;
        offset += extension_len;
        if offset > end {
            return None;
        }
    }
    Some(Transport {
        protocol: next_header,
        segment: &packet[offset..end],
        fragment,
        first_fragment,
    })
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

/// `(source, destination)` of a segment that starts with a UDP header.
fn udp_ports(segment: &[u8]) -> Option<(u16, u16)> {
    if segment.len() < UDP_HEADER_LEN {
        return None;
    }
    Some((be16(segment, 0)?, be16(segment, 2)?))
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

    // Frames as a capture shows them (checksums correct): QUIC-like UDP both ways over IPv4 and
    // IPv6, a TCP SYN with the usual options, an IPv6 pure ACK and an IPv4 data segment.
    const UDP4: &str = concat!(
        "02000000000b02000000000a08004500003112344000401113c00a6300010a63",
        "00029c4001bb001d3d66515549432d697368207061796c6f61642030313233",
    );
    const UDP6: &str = concat!(
        "02000000000b02000000000a86dd60000000001d1140fd000000000000000000",
        "000000000001fd00000000000000000000000000000201bb9c40001d582a5155",
        "49432d697368207061796c6f61642030313233",
    );
    const TCP4_SYN: &str = concat!(
        "02000000000b02000000000a08004500003c12344000400613c00a6300010a63",
        "00029c4001bb000003e800000000a002faf096620000020405b40402080a0000",
        "00010000000001030307",
    );
    const TCP6_ACK: &str = concat!(
        "02000000000b02000000000a86dd6000000000200640fd000000000000000000",
        "000000000002fd00000000000000000000000000000101bb9c40000013880000",
        "03e98010faf0cc5800000101080a0000000200000001",
    );
    const TCP4_DATA: &str = concat!(
        "02000000000b02000000000a08004500004612344000400613b60a6300010a63",
        "00029c4001bb000003e9000013888018faf0d2d900000101080a000000020000",
        "0001474554202f20485454502f312e310d0a0d0a",
    );

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    fn udp(ports: Option<(u16, u16)>) -> FrameClass {
        FrameClass {
            kind: FrameKind::Other,
            udp: Some(UdpInfo { ports }),
        }
    }

    fn not_udp(kind: FrameKind) -> FrameClass {
        FrameClass { kind, udp: None }
    }

    #[test]
    fn real_udp_and_tcp_frames_are_told_apart() {
        assert_eq!(frame_class(&hex(UDP4)), udp(Some((40000, 443))));
        assert_eq!(frame_class(&hex(UDP6)), udp(Some((443, 40000))));
        assert_eq!(frame_class(&hex(TCP4_SYN)), not_udp(FrameKind::Handshake));
        assert_eq!(frame_class(&hex(TCP6_ACK)), not_udp(FrameKind::PureAck));
        assert_eq!(frame_class(&hex(TCP4_DATA)), not_udp(FrameKind::Other));
        // Ethernet padding and a VLAN tag change nothing.
        let mut padded = hex(UDP4);
        padded.resize(64, 0);
        assert_eq!(frame_class(&padded), udp(Some((40000, 443))));
        let plain = hex(UDP6);
        let mut tagged = plain[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        tagged.extend_from_slice(&plain[12..]);
        assert_eq!(frame_class(&tagged), udp(Some((443, 40000))));
        // Truncated UDP frames are not UDP (the IP length no longer fits) and do not panic.
        for frame in [hex(UDP4), hex(UDP6)] {
            for len in 0..frame.len() {
                assert_eq!(frame_class(&frame[..len]).udp, None, "len {len}");
            }
        }
    }

    #[test]
    fn udp_fragments_are_udp_and_only_the_first_has_ports() {
        // IPv4: the first fragment (MF set) carries the header, a later one (offset 185 x 8) not.
        let mut first = hex(UDP4);
        first[14 + 6] = 0x20;
        assert_eq!(frame_class(&first), udp(Some((40000, 443))));
        let mut later = hex(UDP4);
        later[14 + 6..14 + 8].copy_from_slice(&185u16.to_be_bytes());
        assert_eq!(frame_class(&later), udp(None));
        // IPv6: a fragment header in front of the UDP header, offset 0 then 185.
        for (offset, ports) in [(0u16, Some((443, 40000))), (185, None)] {
            let plain = hex(UDP6);
            let mut frame = plain[..14 + IPV6_HEADER_LEN].to_vec();
            frame[14 + 6] = IPV6_FRAGMENT;
            let payload_len = u16::from_be_bytes([frame[18], frame[19]]) + 8;
            frame[18..20].copy_from_slice(&payload_len.to_be_bytes());
            let offset_flags = (offset << 3) | 1;
            frame.extend_from_slice(&[IPPROTO_UDP, 0]);
            frame.extend_from_slice(&offset_flags.to_be_bytes());
            frame.extend_from_slice(&[0, 0, 0, 7]);
            frame.extend_from_slice(&plain[14 + IPV6_HEADER_LEN..]);
            assert_eq!(frame_class(&frame), udp(ports), "offset {offset}");
        }
        // A TCP segment behind a fragment header is never a pure ACK.
        let plain = tcp_frame(true, TCP_ACK, 0, 0);
        let mut frame = plain[..14 + IPV6_HEADER_LEN].to_vec();
        frame[14 + 6] = IPV6_FRAGMENT;
        let payload_len = u16::from_be_bytes([frame[18], frame[19]]) + 8;
        frame[18..20].copy_from_slice(&payload_len.to_be_bytes());
        frame.extend_from_slice(&[IPPROTO_TCP, 0, 0, 0, 0, 0, 0, 7]);
        frame.extend_from_slice(&plain[14 + IPV6_HEADER_LEN..]);
        assert_eq!(frame_class(&frame), not_udp(FrameKind::Other));
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
