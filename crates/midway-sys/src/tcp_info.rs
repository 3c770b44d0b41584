//! Reading `struct tcp_info` back from a live socket.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `struct tcp_info` of include/uapi/linux/tcp.h up to `tcpi_total_rto_time` (kernel 6.7+).
/// Older kernels fill a prefix; [`tcp_stats`] reports the fields they lack as `None`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct RawTcpInfo {
    state: u8,
    ca_state: u8,
    retransmits: u8,
    probes: u8,
    backoff: u8,
    options: u8,
    wscale: u8,
    flags: u8,
    rto: u32,
    ato: u32,
    snd_mss: u32,
    rcv_mss: u32,
    unacked: u32,
    sacked: u32,
    lost: u32,
    retrans: u32,
    fackets: u32,
    last_data_sent: u32,
    last_ack_sent: u32,
    last_data_recv: u32,
    last_ack_recv: u32,
    pmtu: u32,
    rcv_ssthresh: u32,
    rtt: u32,
    rttvar: u32,
    snd_ssthresh: u32,
    snd_cwnd: u32,
    advmss: u32,
    reordering: u32,
    rcv_rtt: u32,
    rcv_space: u32,
    total_retrans: u32,
    pacing_rate: u64,
    max_pacing_rate: u64,
    bytes_acked: u64,
    bytes_received: u64,
    segs_out: u32,
    segs_in: u32,
    notsent_bytes: u32,
    min_rtt: u32,
    data_segs_in: u32,
    data_segs_out: u32,
    delivery_rate: u64,
    busy_time: u64,
    rwnd_limited: u64,
    sndbuf_limited: u64,
    delivered: u32,
    delivered_ce: u32,
    bytes_sent: u64,
    bytes_retrans: u64,
    dsack_dups: u32,
    reord_seen: u32,
    rcv_ooopack: u32,
    snd_wnd: u32,
    rcv_wnd: u32,
    rehash: u32,
    total_rto: u16,
    total_rto_recoveries: u16,
    total_rto_time: u32,
}

/// Snapshot of a socket's `tcp_info`. Times in microseconds; rates in **bits** per second
/// (the kernel reports bytes per second; converted here so `_bps` means what it says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpStats {
    /// TCP state (1 = ESTABLISHED, see `netinet/tcp.h`).
    pub state: u8,
    /// Congestion-avoidance state (0 open, 1 disorder, 2 CWR, 3 recovery, 4 loss).
    pub ca_state: u8,
    /// `TCPI_OPT_*` bits: 1 timestamps, 2 SACK, 4 window scaling, 8 ECN.
    pub options: u8,
    /// Window-scale shift the peer announced, applied to its advertised window (0..=14).
    pub snd_wscale: u8,
    /// Window-scale shift we announced, applied to our advertised window (0..=14).
    pub rcv_wscale: u8,
    /// Smoothed round-trip time (`srtt`), microseconds.
    pub rtt_us: u32,
    /// Round-trip time variation (`rttvar`), microseconds.
    pub rttvar_us: u32,
    /// Lowest round-trip time seen over the recent window, microseconds.
    pub min_rtt_us: u32,
    /// Current retransmission timeout, microseconds.
    pub rto_us: u32,
    /// Delayed-ACK timeout currently in use, microseconds.
    pub ato_us: u32,
    /// Congestion window, in segments (multiply by `snd_mss` for bytes).
    pub snd_cwnd: u32,
    /// Slow-start threshold, in segments (a huge value means still in initial slow start).
    pub snd_ssthresh: u32,
    /// Maximum segment size used for sending, bytes.
    pub snd_mss: u32,
    /// Estimate of the peer's segment size as seen on receive, bytes.
    pub rcv_mss: u32,
    /// Maximum segment size we advertised to the peer, bytes.
    pub advmss: u32,
    /// Path MTU the socket currently uses, bytes.
    pub pmtu: u32,
    /// Duplicate-ACK threshold in use (`tp->reordering`).
    pub reordering: u32,
    /// Retransmissions of the current timeout episode.
    pub retransmits: u8,
    /// Segments retransmitted over the connection's whole life.
    pub total_retrans: u32,
    /// Segments sent and not yet acknowledged by the peer (`packets_out`).
    pub unacked: u32,
    /// Segments currently considered lost by the sender.
    pub lost: u32,
    /// Bytes of payload the peer has acknowledged (RFC 4898 `HCThruOctetsAcked`).
    pub bytes_acked: u64,
    /// Bytes of payload received in order (RFC 4898 `HCThruOctetsReceived`).
    pub bytes_received: u64,
    /// Bytes of payload sent, retransmissions included.
    pub bytes_sent: u64,
    /// Bytes of payload retransmitted.
    pub bytes_retrans: u64,
    /// Segments sent, retransmissions and pure ACKs included.
    pub segs_out: u32,
    /// Segments received, pure ACKs included.
    pub segs_in: u32,
    /// Bytes written by the application still waiting in the send queue, not yet sent.
    pub notsent_bytes: u32,
    /// Most recent delivery-rate sample, bits per second.
    pub delivery_rate_bps: u64,
    /// Current pacing rate, bits per second.
    pub pacing_rate_bps: u64,
    /// Receive-buffer autotuning's estimate of the bytes the peer sends per round trip, bytes.
    pub rcv_space: u32,
    /// Current receive-window clamp (slow-start threshold of the advertised window), bytes.
    pub rcv_ssthresh: u32,
    /// Peer's advertised window after scaling (kernel 5.19+).
    pub snd_wnd: Option<u32>,
    /// Our advertised window after scaling (kernel 6.2+).
    pub rcv_wnd: Option<u32>,
    /// RTO expirations incl. SYN retries (kernel 6.7+).
    pub total_rto: Option<u16>,
}

/// `TCPI_OPT_SYN_DATA` in [`TcpStats::options`]: data went in the SYN (TCP Fast Open).
pub const TCPI_OPT_SYN_DATA: u8 = 32;

impl TcpStats {
    /// Whether the handshake carried data with Fast Open: on a connecting socket, data in its
    /// SYN that the server acknowledged; on an accepted one, data in the client's SYN.
    pub fn syn_data(&self) -> bool {
        self.options & TCPI_OPT_SYN_DATA != 0
    }
}

/// `TCP_INFO` of `fd` as the kernel filled it, with how many bytes it filled.
fn raw_tcp_info(fd: BorrowedFd<'_>) -> io::Result<(RawTcpInfo, usize)> {
    let mut raw = RawTcpInfo::default();
    let mut len = std::mem::size_of::<RawTcpInfo>() as libc::socklen_t;
    // SAFETY: valid fd; the kernel writes at most `len` bytes into `raw`, a plain-data struct.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut raw as *mut RawTcpInfo).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((raw, len as usize))
}

/// A listening socket's accept queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptQueue {
    /// Connections whose handshake completed and that `accept` has not taken yet.
    pub queued: u32,
    /// The most the kernel queues (the listen backlog, capped by `net.core.somaxconn`).
    pub limit: u32,
}

/// The accept queue of a listening TCP socket: for a socket in LISTEN state the kernel reports
/// its length in `tcpi_unacked` and its limit in `tcpi_sacked`.
pub fn accept_queue(fd: BorrowedFd<'_>) -> io::Result<AcceptQueue> {
    let (raw, _) = raw_tcp_info(fd)?;
    Ok(AcceptQueue {
        queued: raw.unacked,
        limit: raw.sacked,
    })
}

/// Reads `tcp_info` with `getsockopt(TCP_INFO)`.
pub fn tcp_stats(fd: BorrowedFd<'_>) -> io::Result<TcpStats> {
    let (raw, filled) = raw_tcp_info(fd)?;
    let has = |end: usize| filled >= end;
    let snd_wnd_end = std::mem::offset_of!(RawTcpInfo, snd_wnd) + 4;
    let rcv_wnd_end = std::mem::offset_of!(RawTcpInfo, rcv_wnd) + 4;
    let total_rto_end = std::mem::offset_of!(RawTcpInfo, total_rto) + 2;
    Ok(TcpStats {
        state: raw.state,
        ca_state: raw.ca_state,
        options: raw.options,
        snd_wscale: raw.wscale & 0x0f,
        rcv_wscale: raw.wscale >> 4,
        rtt_us: raw.rtt,
        rttvar_us: raw.rttvar,
        min_rtt_us: raw.min_rtt,
        rto_us: raw.rto,
        ato_us: raw.ato,
        snd_cwnd: raw.snd_cwnd,
        snd_ssthresh: raw.snd_ssthresh,
        snd_mss: raw.snd_mss,
        rcv_mss: raw.rcv_mss,
        advmss: raw.advmss,
        pmtu: raw.pmtu,
        reordering: raw.reordering,
        retransmits: raw.retransmits,
        total_retrans: raw.total_retrans,
        unacked: raw.unacked,
        lost: raw.lost,
        bytes_acked: raw.bytes_acked,
        bytes_received: raw.bytes_received,
        bytes_sent: raw.bytes_sent,
        bytes_retrans: raw.bytes_retrans,
        segs_out: raw.segs_out,
        segs_in: raw.segs_in,
        notsent_bytes: raw.notsent_bytes,
        delivery_rate_bps: raw.delivery_rate.saturating_mul(8),
        pacing_rate_bps: raw.pacing_rate.saturating_mul(8),
        rcv_space: raw.rcv_space,
        rcv_ssthresh: raw.rcv_ssthresh,
        snd_wnd: has(snd_wnd_end).then_some(raw.snd_wnd),
        rcv_wnd: has(rcv_wnd_end).then_some(raw.rcv_wnd),
        total_rto: has(total_rto_end).then_some(raw.total_rto),
    })
}

/// Name of the congestion control in use (`getsockopt(TCP_CONGESTION)`).
pub fn congestion_control_of(fd: BorrowedFd<'_>) -> io::Result<String> {
    let mut buf = [0u8; 16];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: valid fd; the kernel writes at most `len` bytes into `buf`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let bytes = &buf[..(len as usize).min(buf.len())];
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}
