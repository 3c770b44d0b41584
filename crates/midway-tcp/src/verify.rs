//! Reading a profile back from a live socket: what the kernel really applied.
//!
//! Used by the tests on both segments, and meant for midway's own start-up self-check and for
//! the lab (record what a case really ran with, not what it asked for).

use std::fmt;
use std::io;
use std::os::fd::BorrowedFd;

use crate::apply::{
    delack_floor_us, get_int, get_max_pacing_rate, pacing_bytes_per_second, SOCKET_RTO_MIN_MAX_MS,
    TCP_DELACK_MAX_US, TCP_RTO_MIN_US,
};
use crate::{congestion_control_of, tcp_stats, TcpProfile};

/// One knob whose live value differs from the profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// Name of the knob as written in the profile (e.g. `rto_min_ms`).
    pub knob: &'static str,
    /// The profile's value, formatted in the knob's unit.
    pub wanted: String,
    /// The live socket's value, formatted in the same unit.
    pub got: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: wanted {}, socket has {}",
            self.knob, self.wanted, self.got
        )
    }
}

/// When the socket is being read, which decides what can be checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadBackWhen {
    /// No data has moved yet: `snd_cwnd` still is the initial window.
    pub before_data: bool,
    /// An earlier connection to this peer has closed, so the tcp_metrics cache carries
    /// `reordering` (see the `dupack_threshold` caveat in `routes` (module docs)).
    pub metrics_cached: bool,
}

impl TcpProfile {
    /// Compares every knob of this profile with the live socket (getsockopt / tcp_info) and
    /// lists the differences; empty = all applied. Knobs the moment cannot show (initial
    /// window after data moved, duplicate-ACK threshold before the metrics cache has an entry)
    /// are skipped as `when` says.
    pub fn read_back(&self, fd: BorrowedFd<'_>, when: ReadBackWhen) -> io::Result<Vec<Mismatch>> {
        let mut out = Vec::new();
        let mut expect = |knob: &'static str, ok: bool, wanted: String, got: String| {
            if !ok {
                out.push(Mismatch { knob, wanted, got });
            }
        };
        let tcp = libc::IPPROTO_TCP;
        let stats = tcp_stats(fd)?;
        if let (Some(cc), Some(kernel_name)) =
            (&self.congestion_control, self.kernel_congestion_control())
        {
            // The kernel reports a BPF congestion control by its kernel name (`mw_highspeed`):
            // compare kernel names, report in the profile's terms.
            let got = congestion_control_of(fd)?;
            let ok = got == kernel_name;
            let got = match midway_bpf::Algorithm::from_name(&got) {
                Some(algorithm) => algorithm.profile_name().to_owned(),
                None => got,
            };
            expect("congestion_control", ok, cc.clone(), got);
        }
        if let (Some(n), true) = (self.initial_cwnd, when.before_data) {
            expect(
                "initial_cwnd",
                stats.snd_cwnd == n,
                n.to_string(),
                stats.snd_cwnd.to_string(),
            );
        }
        if let (Some(n), true) = (self.dupack_threshold, when.metrics_cached) {
            expect(
                "dupack_threshold",
                stats.reordering == n,
                n.to_string(),
                stats.reordering.to_string(),
            );
        }
        if let Some(ms) = self.rto_min_ms {
            if ms <= SOCKET_RTO_MIN_MAX_MS {
                let got = get_int(fd, tcp, TCP_RTO_MIN_US)?;
                expect(
                    "rto_min_ms",
                    got as u32 == ms * 1000,
                    format!("{}us", ms * 1000),
                    format!("{got}us"),
                );
            } else {
                // Only the route metric can raise the floor; the RTO in use shows it.
                expect(
                    "rto_min_ms",
                    stats.rto_us >= ms * 1000,
                    format!("rto >= {}us", ms * 1000),
                    format!("rto {}us", stats.rto_us),
                );
            }
        }
        if self.delayed_ack == Some(false) {
            let floor = delack_floor_us()?;
            let got = get_int(fd, tcp, TCP_DELACK_MAX_US)?;
            expect(
                "delayed_ack",
                got as u32 == floor,
                format!("delack max {floor}us"),
                format!("{got}us"),
            );
        }
        if let Some(mark) = self.route_mark {
            let got = get_int(fd, libc::SOL_SOCKET, libc::SO_MARK)? as u32;
            expect(
                "route mark",
                got == mark,
                format!("{mark:#x}"),
                format!("{got:#x}"),
            );
        }
        for (bytes, knob, opt) in [
            (self.send_buffer, "send_buffer", libc::SO_SNDBUF),
            (self.recv_buffer, "recv_buffer", libc::SO_RCVBUF),
        ] {
            if let Some(bytes) = bytes {
                // The kernel reports twice the request (bookkeeping included).
                let got = get_int(fd, libc::SOL_SOCKET, opt)? as u64;
                expect(
                    knob,
                    got == 2 * u64::from(bytes),
                    format!("{} (2 x {bytes})", 2 * u64::from(bytes)),
                    got.to_string(),
                );
            }
        }
        if let Some(mss) = self.mss {
            let got = get_int(fd, tcp, libc::TCP_MAXSEG)? as u32;
            expect("mss", got <= mss, format!("<= {mss}"), got.to_string());
        }
        if let Some(lowat) = self.notsent_lowat {
            let got = get_int(fd, tcp, libc::TCP_NOTSENT_LOWAT)? as u32;
            expect(
                "notsent_lowat",
                got == lowat,
                lowat.to_string(),
                got.to_string(),
            );
        }
        if let Some(nodelay) = self.nodelay {
            let got = get_int(fd, tcp, libc::TCP_NODELAY)? != 0;
            expect(
                "nodelay",
                got == nodelay,
                nodelay.to_string(),
                got.to_string(),
            );
        }
        if let Some(ka) = self.keepalive {
            let got = (
                get_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE)? != 0,
                get_int(fd, tcp, libc::TCP_KEEPIDLE)? as u32,
                get_int(fd, tcp, libc::TCP_KEEPINTVL)? as u32,
                get_int(fd, tcp, libc::TCP_KEEPCNT)? as u32,
            );
            let wanted = (true, ka.idle_s, ka.interval_s, ka.count);
            expect(
                "keepalive",
                got == wanted,
                format!("{wanted:?}"),
                format!("{got:?}"),
            );
        }
        if let Some(ms) = self.user_timeout_ms {
            let got = get_int(fd, tcp, libc::TCP_USER_TIMEOUT)? as u32;
            expect(
                "user_timeout_ms",
                got == ms,
                ms.to_string(),
                got.to_string(),
            );
        }
        if let Some(bps) = self.max_pacing_rate_bps {
            let wanted = pacing_bytes_per_second(bps);
            let got = get_max_pacing_rate(fd)?;
            expect(
                "max_pacing_rate_bps",
                got == wanted,
                format!("{wanted} B/s"),
                format!("{got} B/s"),
            );
        }
        Ok(out)
    }
}
