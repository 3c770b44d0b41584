//! Putting a [`TcpProfile`] on sockets, and checking at start that the running kernel can.
//!
//! Three moments, because Linux takes some knobs only at one of them:
//! - [`TcpProfile::apply_to_listener`]: before `listen()`. Buffers must be set here: the window
//!   scale is chosen from the receive buffer at SYN time, and accepted sockets inherit buffers,
//!   MSS, mark and every other option below from the listener (the child is a clone of it).
//! - [`TcpProfile::apply_before_connect`]: the same set on an outgoing socket before `connect()`.
//! - [`TcpProfile::apply_established`]: on the accepted or connected socket. What it still
//!   has to set depends on where the socket came from ([`CarriedOptions`]): a connected socket
//!   and one accepted from a listener with the same profile carry every option already, so only
//!   the congestion control (which a route's `congctl` replaces at connect and accept) is put
//!   back; a socket accepted from a listener with another profile gets them all. Either way it
//!   arms `TCP_QUICKACK`, which does not stick.
//!
//! Every `setsockopt` that fails is an error naming the knob; nothing is skipped. Knobs that
//! Linux offers only per destination (initial window, duplicate-ACK threshold, RTO floor above
//! 200 ms, always-quickack) are carried by the routing table that [`crate::RouteKnobs`] installs
//! and selected with `SO_MARK` = [`TcpProfile::route_mark`].
//!
//! The pacing ceiling (`max_pacing_rate_bps`) is `SO_MAX_PACING_RATE`, per socket: the kernel's
//! pacing rate becomes `min(rate the congestion control wants, ceiling)`. The option takes bytes
//! per second, and the pacer charges TCP payload (not headers) against it, so a ceiling meant to
//! match a link must be the link's *payload* rate (for 1514-byte frames carrying 1448 bytes,
//! 0.956 x the frame rate). Since Linux 4.13 TCP paces by itself when no fq qdisc does, so the
//! ceiling holds for CUBIC and Reno as well as for BBR (which always paces).

use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::OnceLock;

use socket2::{Domain, Protocol, Socket, TcpKeepalive, Type};

use crate::profile::TcpProfile;

pub use midway_sys::sockopt::{get_int, get_max_pacing_rate, TCP_DELACK_MAX_US, TCP_RTO_MIN_US};
use midway_sys::sockopt::{set_congestion_control, set_int, set_max_pacing_rate};
/// Largest RTO floor `TCP_RTO_MIN_US` accepts; above it only the route metric works.
pub(crate) const SOCKET_RTO_MIN_MAX_MS: u32 = 200;
/// Smallest RTO floor midway accepts in config: two jiffies at HZ=250 (the kernel's
/// `TCP_TIMEOUT_MIN`); at a higher HZ the kernel would take less, but 8 ms is already far below
/// any access link's RTT.
pub(crate) const RTO_MIN_FLOOR_MS: u32 = 8;

/// Which socket a knob was being put on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A socket returned by `accept()` (the segment towards the client).
    Accepted,
    /// A socket midway connects (the segment towards the server).
    Outgoing,
    /// The listening socket, before `listen()`.
    Listener,
    /// The throwaway socket of [`TcpProfile::check_supported`].
    Probe,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Accepted => "accepted",
            Role::Outgoing => "outgoing",
            Role::Listener => "listening",
            Role::Probe => "probe",
        })
    }
}

/// Which of a profile's socket options an established socket already carries, for
/// [`TcpProfile::apply_established`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CarriedOptions {
    /// All of them: they were set on this socket before `connect()`
    /// ([`TcpProfile::apply_before_connect`]), or on the listener it was accepted from with
    /// this same profile ([`TcpProfile::apply_to_listener`]; Linux makes the accepted socket a
    /// copy of the listener).
    All,
    /// None to rely on: the listener it was accepted from carries another profile (a client
    /// prefix's own) or was set up elsewhere.
    None,
}

/// A knob of a profile that cannot be honoured.
#[derive(Debug, thiserror::Error)]
pub enum KnobError {
    /// The kernel refused the socket option that carries the knob.
    #[error("profile {profile:?}: cannot set {knob} on the {role} socket")]
    Set {
        /// Name of the profile the knob belongs to.
        profile: String,
        /// Name of the knob as written in the profile (e.g. `send_buffer`).
        knob: &'static str,
        /// Which socket of the connection the knob was applied to.
        role: Role,
        /// The `setsockopt` error.
        #[source]
        source: io::Error,
    },
    /// The knob was accepted but reads back with another value than the one set.
    #[error(
        "profile {profile:?}: {knob} on the {role} socket reads back as {got}, wanted {wanted}"
    )]
    ReadBack {
        /// Name of the profile the knob belongs to.
        profile: String,
        /// Name of the knob as written in the profile (e.g. `send_buffer`).
        knob: &'static str,
        /// Which socket of the connection the knob was applied to.
        role: Role,
        /// Value the profile asks for, in the knob's unit (bytes, microseconds, ...).
        wanted: u64,
        /// Value the kernel reports, in the same unit as `wanted`.
        got: u64,
    },
    /// The profile names one of midway's BPF congestion controls and it could not be
    /// registered (see `midway_bpf::RegisterError` for what the kernel or the process lacks).
    #[error("profile {profile:?}: congestion_control = {name:?} is midway's BPF congestion control {kernel_name}, which cannot be registered on this kernel")]
    BpfCongestionControl {
        /// Name of the profile the knob belongs to.
        profile: String,
        /// The profile's `congestion_control`.
        name: String,
        /// The name the kernel would know it by.
        kernel_name: &'static str,
        /// Why registering failed.
        source: midway_bpf::RegisterError,
    },
    /// The congestion control the profile names is not loaded in this kernel.
    #[error("profile {profile:?}: congestion_control {name:?} is not available in this kernel (available: {available}); load its module or pick one of those")]
    CongestionControlUnavailable {
        /// Name of the profile the knob belongs to.
        profile: String,
        /// Congestion control the profile asks for.
        name: String,
        /// The kernel's `tcp_available_congestion_control`, space-separated.
        available: String,
    },
    /// A buffer size above the sysctl limit, and no `CAP_NET_ADMIN` to force it.
    #[error("profile {profile:?}: {knob} = {requested} exceeds net.core.{sysctl} = {limit} and this process lacks CAP_NET_ADMIN to force it; raise the sysctl or run as root")]
    BufferOverLimit {
        /// Name of the profile the knob belongs to.
        profile: String,
        /// Name of the knob as written in the profile (e.g. `send_buffer`).
        knob: &'static str,
        /// Buffer size the profile asks for, bytes.
        requested: u32,
        /// The limiting sysctl under `net.core.` (`wmem_max` or `rmem_max`).
        sysctl: &'static str,
        /// That sysctl's value, bytes.
        limit: u64,
    },
    /// A route-metric knob, but the profile has no route mark to select its routing table.
    #[error("profile {profile:?}: {knob} is applied through the route metric table, but no route mark was set (install RouteKnobs and set TcpProfile::route_mark first)")]
    RouteMarkMissing {
        /// Name of the profile the knob belongs to.
        profile: String,
        /// Name of the knob as written in the profile (e.g. `send_buffer`).
        knob: &'static str,
    },
    /// A route-metric knob, and `SO_MARK` cannot be set on the socket.
    #[error("profile {profile:?}: {knob} is applied through a routing table selected by SO_MARK, and the socket mark cannot be set (needs CAP_NET_ADMIN)")]
    RouteMark {
        /// Name of the profile the knob belongs to.
        profile: String,
        /// Name of the knob as written in the profile (e.g. `send_buffer`).
        knob: &'static str,
        /// The `setsockopt(SO_MARK)` error.
        #[source]
        source: io::Error,
    },
    /// `dupack_threshold` needs the tcp_metrics cache, which this namespace disables.
    #[error("profile {profile:?}: dupack_threshold needs the tcp_metrics cache, but net.ipv4.tcp_no_metrics_save = 1 in this namespace; set it to 0 or drop the knob")]
    MetricsSaveDisabled {
        /// Name of the profile the knob belongs to.
        profile: String,
    },
    /// `fast_open`, but this namespace's `net.ipv4.tcp_fastopen` lacks the bit for the side
    /// the profile is used on.
    #[error("profile {profile:?}: fast_open on the {side} side needs net.ipv4.tcp_fastopen = {needed} in midway's network namespace (it is {current}); set it (sysctl -w net.ipv4.tcp_fastopen={needed}) or drop the knob")]
    FastOpenDisabled {
        /// Name of the profile the knob belongs to.
        profile: String,
        /// Which end of Fast Open the profile is used for.
        side: crate::FastOpenSide,
        /// The sysctl's value now.
        current: u32,
        /// The value it needs (its other bits kept).
        needed: u32,
    },
    /// Probing whether the kernel supports a knob failed.
    #[error("probing the kernel for {knob}")]
    Probe {
        /// Name of the knob probed.
        knob: &'static str,
        /// The error of the probe socket or option.
        #[source]
        source: io::Error,
    },
}

/// `SO_MAX_PACING_RATE` value (bytes per second) for a ceiling in bits per second.
pub(crate) fn pacing_bytes_per_second(bits_per_second: u64) -> u64 {
    bits_per_second / 8
}

/// Smallest delayed-ACK ceiling this kernel takes, as it stores it (two jiffies: 8000 us at
/// HZ=250; the option accepts 4001 and rounds up), found once by bisection on a throwaway socket. This is how midway turns delayed ACKs off per
/// socket: the delayed-ACK timer can then never wait longer than that.
pub fn delack_floor_us() -> io::Result<u32> {
    static FLOOR: OnceLock<Result<u32, io::ErrorKind>> = OnceLock::new();
    FLOOR
        .get_or_init(|| {
            let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
                .map_err(|e| e.kind())?;
            let accepts = |v: u32| {
                set_int(
                    sock.as_fd(),
                    libc::IPPROTO_TCP,
                    TCP_DELACK_MAX_US,
                    v as libc::c_int,
                )
                .is_ok()
            };
            let (mut lo, mut hi) = (1u32, 200_000u32);
            if !accepts(hi) {
                return Err(io::ErrorKind::Unsupported);
            }
            // Invariant: hi is accepted; values below lo are not known to be.
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if accepts(mid) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            // The kernel rounds up to whole jiffies; report what it really uses.
            set_int(
                sock.as_fd(),
                libc::IPPROTO_TCP,
                TCP_DELACK_MAX_US,
                hi as libc::c_int,
            )
            .map_err(|e| e.kind())?;
            get_int(sock.as_fd(), libc::IPPROTO_TCP, TCP_DELACK_MAX_US)
                .map(|v| v as u32)
                .map_err(|e| e.kind())
        })
        .map_err(io::Error::from)
}

impl TcpProfile {
    fn err(&self, knob: &'static str, role: Role) -> impl FnOnce(io::Error) -> KnobError + '_ {
        move |source| KnobError::Set {
            profile: self.name.clone(),
            knob,
            role,
            source,
        }
    }

    /// True if some knob of this profile can only be set through route metrics (see
    /// [`crate::RouteKnobs`]): initial window, duplicate-ACK threshold, an RTO floor above
    /// 200 ms, and delayed ACK off (route `quickack 1` is the only always-quickack).
    pub fn needs_route_knobs(&self) -> bool {
        self.initial_cwnd.is_some()
            || self.dupack_threshold.is_some()
            || self.rto_min_ms.is_some_and(|ms| ms > SOCKET_RTO_MIN_MAX_MS)
            || self.delayed_ack == Some(false)
    }

    /// Name of the first route-only knob, for messages.
    fn route_knob_name(&self) -> &'static str {
        if self.initial_cwnd.is_some() {
            "initial_cwnd"
        } else if self.dupack_threshold.is_some() {
            "dupack_threshold"
        } else if self.delayed_ack == Some(false) {
            "delayed_ack"
        } else {
            "rto_min_ms"
        }
    }

    fn set_mark(&self, fd: BorrowedFd<'_>) -> Result<(), KnobError> {
        // A mark is also set when RouteKnobs gave the profile a table for another reason (an
        // RTO floor on a host whose routes lock theirs).
        if !self.needs_route_knobs() && self.route_mark.is_none() {
            return Ok(());
        }
        let Some(mark) = self.route_mark else {
            return Err(KnobError::RouteMarkMissing {
                profile: self.name.clone(),
                knob: self.route_knob_name(),
            });
        };
        set_int(fd, libc::SOL_SOCKET, libc::SO_MARK, mark as libc::c_int).map_err(|source| {
            KnobError::RouteMark {
                profile: self.name.clone(),
                knob: self.route_knob_name(),
                source,
            }
        })
    }

    fn set_buffers(&self, sock: &Socket, role: Role) -> Result<(), KnobError> {
        let buffers = [
            (
                self.send_buffer,
                "send_buffer",
                libc::SO_SNDBUF,
                libc::SO_SNDBUFFORCE,
                "wmem_max",
            ),
            (
                self.recv_buffer,
                "recv_buffer",
                libc::SO_RCVBUF,
                libc::SO_RCVBUFFORCE,
                "rmem_max",
            ),
        ];
        for (bytes, knob, opt, force_opt, sysctl) in buffers {
            let Some(bytes) = bytes else { continue };
            let fd = sock.as_fd();
            set_int(fd, libc::SOL_SOCKET, opt, bytes as libc::c_int)
                .map_err(self.err(knob, role))?;
            // The kernel stores twice the request (half is bookkeeping). Less means it clamped
            // the request to net.core.*mem_max without saying so: force it, or fail.
            let got = get_int(fd, libc::SOL_SOCKET, opt).map_err(self.err(knob, role))? as u64;
            let wanted = 2 * u64::from(bytes);
            if got >= wanted {
                continue;
            }
            set_int(fd, libc::SOL_SOCKET, force_opt, bytes as libc::c_int).map_err(|e| {
                if e.raw_os_error() == Some(libc::EPERM) {
                    KnobError::BufferOverLimit {
                        profile: self.name.clone(),
                        knob,
                        requested: bytes,
                        sysctl,
                        limit: midway_sys::sysctl::read(&format!("net.core.{sysctl}"))
                            .ok()
                            .and_then(|s| s.parse().ok())
                            .unwrap_or(got / 2),
                    }
                } else {
                    self.err(knob, role)(e)
                }
            })?;
            let got = get_int(fd, libc::SOL_SOCKET, opt).map_err(self.err(knob, role))? as u64;
            if got < wanted {
                return Err(KnobError::ReadBack {
                    profile: self.name.clone(),
                    knob,
                    role,
                    wanted,
                    got,
                });
            }
        }
        Ok(())
    }

    fn set_mss(&self, fd: BorrowedFd<'_>, role: Role) -> Result<(), KnobError> {
        if let Some(mss) = self.mss {
            set_int(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG, mss as libc::c_int)
                .map_err(self.err("mss", role))?;
        }
        Ok(())
    }

    /// Options that any TCP socket takes at any time (listener, before connect, established).
    fn set_socket_options(&self, fd: BorrowedFd<'_>, role: Role) -> Result<(), KnobError> {
        let tcp = libc::IPPROTO_TCP;
        if let Some(cc) = self.kernel_congestion_control() {
            set_congestion_control(fd, cc).map_err(self.err("congestion_control", role))?;
        }
        if let Some(ms) = self.rto_min_ms.filter(|ms| *ms <= SOCKET_RTO_MIN_MAX_MS) {
            set_int(fd, tcp, TCP_RTO_MIN_US, (ms * 1000) as libc::c_int)
                .map_err(self.err("rto_min_ms", role))?;
        }
        if self.delayed_ack == Some(false) {
            let floor = delack_floor_us().map_err(self.err("delayed_ack", role))?;
            set_int(fd, tcp, TCP_DELACK_MAX_US, floor as libc::c_int)
                .map_err(self.err("delayed_ack", role))?;
        }
        if let Some(lowat) = self.notsent_lowat {
            set_int(fd, tcp, libc::TCP_NOTSENT_LOWAT, lowat as libc::c_int)
                .map_err(self.err("notsent_lowat", role))?;
        }
        if let Some(nodelay) = self.nodelay {
            set_int(fd, tcp, libc::TCP_NODELAY, nodelay.into())
                .map_err(self.err("nodelay", role))?;
        }
        if let Some(ka) = self.keepalive {
            let params = TcpKeepalive::new()
                .with_time(std::time::Duration::from_secs(ka.idle_s.into()))
                .with_interval(std::time::Duration::from_secs(ka.interval_s.into()))
                .with_retries(ka.count);
            socket2::SockRef::from(&fd)
                .set_tcp_keepalive(&params)
                .map_err(self.err("keepalive", role))?;
        }
        if let Some(ms) = self.user_timeout_ms {
            set_int(fd, tcp, libc::TCP_USER_TIMEOUT, ms as libc::c_int)
                .map_err(self.err("user_timeout_ms", role))?;
        }
        if let Some(bps) = self.max_pacing_rate_bps {
            // Also turns on the kernel's own TCP pacing for controls that do not pace by
            // themselves (CUBIC, Reno): since Linux 4.13 TCP paces without the fq qdisc.
            set_max_pacing_rate(fd, pacing_bytes_per_second(bps))
                .map_err(self.err("max_pacing_rate_bps", role))?;
        }
        Ok(())
    }

    /// Knobs that must be on the listening socket before `listen()`: buffers (window scaling),
    /// MSS, route mark, and every per-socket option (accepted sockets inherit them).
    pub fn apply_to_listener(&self, sock: &Socket) -> Result<(), KnobError> {
        let role = Role::Listener;
        self.set_mark(sock.as_fd())?;
        self.set_buffers(sock, role)?;
        self.set_mss(sock.as_fd(), role)?;
        if let Some(queue) = self.listener_fast_open_queue() {
            // 0 turns it off again on a listener a reload keeps.
            set_int(
                sock.as_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_FASTOPEN,
                queue as libc::c_int,
            )
            .map_err(self.err("fast_open", role))?;
        }
        self.set_socket_options(sock.as_fd(), role)
    }

    /// Knobs on an outgoing socket before `connect()`: buffers, MSS, route mark, congestion
    /// control, RTO floor, delayed-ACK ceiling, keepalive, user timeout, low-water mark, nodelay,
    /// pacing ceiling.
    pub fn apply_before_connect(&self, sock: &Socket) -> Result<(), KnobError> {
        let role = Role::Outgoing;
        self.set_mark(sock.as_fd())?;
        self.set_buffers(sock, role)?;
        self.set_mss(sock.as_fd(), role)?;
        if self.fast_open == Some(true) {
            // connect() then returns at once and the SYN waits for the first send: the
            // caller must send (data or nothing) for the handshake to start.
            set_int(
                sock.as_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_FASTOPEN_CONNECT,
                1,
            )
            .map_err(self.err("fast_open", role))?;
        }
        self.set_socket_options(sock.as_fd(), role)
    }

    /// Knobs on an accepted or connected socket that `carried` says it does not have yet:
    /// with [`CarriedOptions::None`] the route mark and every socket option (congestion
    /// control, RTO floor, delayed-ACK ceiling, keepalive, user timeout, not-sent low-water
    /// mark, nodelay, pacing ceiling); with [`CarriedOptions::All`] only the congestion
    /// control, which a route's `congctl` metric replaces at connect and accept (setting the
    /// one in use again is a no-op in the kernel). Then `TCP_QUICKACK` when the profile turns delayed ACKs off.
    /// Buffers and MSS are not touched: they were fixed at SYN time by the listener or by
    /// [`TcpProfile::apply_before_connect`], and a late `SO_RCVBUF` would only shrink the
    /// window without changing the scale.
    pub fn apply_established(
        &self,
        fd: BorrowedFd<'_>,
        role: Role,
        carried: CarriedOptions,
    ) -> Result<(), KnobError> {
        match carried {
            CarriedOptions::None => {
                // The mark first: a marked socket's next packet is routed again, through
                // the profile's route knobs.
                self.set_mark(fd)?;
                self.set_socket_options(fd, role)?;
            }
            CarriedOptions::All => {
                if let Some(cc) = self.kernel_congestion_control() {
                    set_congestion_control(fd, cc).map_err(self.err("congestion_control", role))?;
                }
            }
        }
        if self.delayed_ack == Some(false) {
            // Not sticky in the kernel; the route metric `quickack 1` and the delayed-ACK
            // ceiling keep ACKs prompt afterwards.
            set_int(fd, libc::IPPROTO_TCP, libc::TCP_QUICKACK, 1)
                .map_err(self.err("delayed_ack", role))?;
        }
        Ok(())
    }

    /// Probes the running kernel with a throwaway socket: every per-socket knob is set on it
    /// (so a missing congestion control, a refused value or a missing privilege shows up now,
    /// not on the first connection), and the prerequisites of route knobs are checked. The
    /// error names the knob and why it cannot be honoured.
    ///
    /// `dupack_threshold` passes with a warning: Linux applies the route metric `reordering`
    /// only through the tcp_metrics cache (see `routes` (module docs)), so it is not guaranteed for
    /// the first connection to a destination. It fails if `tcp_no_metrics_save = 1`, where it
    /// could never apply.
    pub fn check_supported(&self) -> Result<(), KnobError> {
        if let Some(cc) = self.kernel_congestion_control() {
            let available =
                midway_sys::sysctl::available_congestion_controls().map_err(|source| {
                    KnobError::Probe {
                        knob: "congestion_control",
                        source,
                    }
                })?;
            if !available.iter().any(|a| a == cc) {
                let name = match self.bpf_congestion_control() {
                    // Names the BPF program, so the message says what is missing.
                    Some(algorithm) => {
                        format!("{algorithm}, a BPF congestion control midway registers at start")
                    }
                    None => cc.to_owned(),
                };
                return Err(KnobError::CongestionControlUnavailable {
                    profile: self.name.clone(),
                    name,
                    available: available.join(" "),
                });
            }
        }
        let sock =
            Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).map_err(|source| {
                KnobError::Probe {
                    knob: "a probe socket",
                    source,
                }
            })?;
        let role = Role::Probe;
        if self.needs_route_knobs() {
            // Marking needs CAP_NET_ADMIN; try it on the probe socket (with a stand-in mark if
            // RouteKnobs is not installed yet).
            let probe = TcpProfile {
                route_mark: Some(self.route_mark.unwrap_or(1)),
                ..self.clone()
            };
            probe.set_mark(sock.as_fd())?;
        }
        self.set_buffers(&sock, role)?;
        self.set_mss(sock.as_fd(), role)?;
        self.set_socket_options(sock.as_fd(), role)?;
        if self.dupack_threshold.is_some() {
            let no_save =
                midway_sys::sysctl::read("net.ipv4.tcp_no_metrics_save").map_err(|source| {
                    KnobError::Probe {
                        knob: "dupack_threshold",
                        source,
                    }
                })?;
            if no_save != "0" {
                return Err(KnobError::MetricsSaveDisabled {
                    profile: self.name.clone(),
                });
            }
            tracing::warn!(
                profile = %self.name,
                "dupack_threshold is applied through the route metric `reordering`, which Linux \
                 reads from the tcp_metrics cache: the first connection to each destination keeps \
                 the namespace's net.ipv4.tcp_reordering; later ones get the profile's value"
            );
        }
        Ok(())
    }
}
