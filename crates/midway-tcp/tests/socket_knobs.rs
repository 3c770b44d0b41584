//! Every per-socket knob, applied to a listener + accepted socket and to an outgoing socket on
//! loopback, then read back from the live sockets (getsockopt / tcp_info).

// Tests: an unwrap that fails is the test failing.
#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};

use midway_sys::sysctl;
use midway_tcp::{
    congestion_control_of, delack_floor_us, get_int, get_max_pacing_rate, tcp_stats,
    CarriedOptions, Keepalive, KnobError, ReadBackWhen, Role, TcpProfile, TCP_DELACK_MAX_US,
    TCP_RTO_MIN_US,
};
use socket2::{Domain, Protocol, Socket, Type};

/// Accepted and outgoing socket of one loopback connection, both under `profile`.
struct Pair {
    /// Accepted from the listener with the profile, then `apply_established` with
    /// [`CarriedOptions::All`].
    accepted: Socket,
    /// `apply_before_connect`, connect, `apply_established` with [`CarriedOptions::All`].
    outgoing: Socket,
    /// Values read from the accepted socket before `apply_established`: what the listener
    /// passed on by itself. Peer of `outgoing`.
    inherited_accepted: Socket,
    /// Accepted from a listener without the profile, then `apply_established` with
    /// [`CarriedOptions::None`]: every option set on the accepted socket itself.
    set_on_accept: Socket,
    _peers: [Socket; 2],
    _listeners: [Socket; 2],
}

fn connect_pair(profile: &TcpProfile) -> Pair {
    let listen = |profile: Option<&TcpProfile>| {
        let listener = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        if let Some(profile) = profile {
            profile.apply_to_listener(&listener).unwrap();
        }
        listener
            .bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
            .unwrap();
        listener.listen(16).unwrap();
        listener
    };
    let connect = |listener: &Socket| {
        let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        profile.apply_before_connect(&sock).unwrap();
        sock.connect(&listener.local_addr().unwrap()).unwrap();
        profile
            .apply_established(sock.as_fd(), Role::Outgoing, CarriedOptions::All)
            .unwrap();
        sock
    };
    let listener = listen(Some(profile));
    let outgoing = connect(&listener);
    let (inherited_accepted, _) = listener.accept().unwrap();
    let second = connect(&listener);
    let (accepted, _) = listener.accept().unwrap();
    profile
        .apply_established(accepted.as_fd(), Role::Accepted, CarriedOptions::All)
        .unwrap();
    let plain_listener = listen(None);
    let third = connect(&plain_listener);
    let (set_on_accept, _) = plain_listener.accept().unwrap();
    profile
        .apply_established(set_on_accept.as_fd(), Role::Accepted, CarriedOptions::None)
        .unwrap();
    Pair {
        accepted,
        outgoing,
        inherited_accepted,
        set_on_accept,
        _peers: [second, third],
        _listeners: [listener, plain_listener],
    }
}

/// The sockets that carry the whole profile, buffers and MSS included.
fn each_socket(pair: &Pair, mut check: impl FnMut(&str, BorrowedFd<'_>)) {
    check("outgoing", pair.outgoing.as_fd());
    check(
        "accepted (inherited from listener)",
        pair.inherited_accepted.as_fd(),
    );
    check("accepted (after apply_established)", pair.accepted.as_fd());
}

/// [`each_socket`], and the socket accepted from a listener without the profile, which
/// `apply_established` gives the options it takes after the handshake (not buffers or MSS).
fn each_socket_with_options(pair: &Pair, mut check: impl FnMut(&str, BorrowedFd<'_>)) {
    each_socket(pair, &mut check);
    check(
        "accepted from a listener without the profile (options set on it)",
        pair.set_on_accept.as_fd(),
    );
}

fn profile(name: &str) -> TcpProfile {
    TcpProfile::kernel_default(name)
}

fn tcp_opt(fd: BorrowedFd<'_>, opt: libc::c_int) -> i32 {
    get_int(fd, libc::IPPROTO_TCP, opt).unwrap()
}

#[test]
fn congestion_control_reads_back() {
    let default_cc = sysctl::read("net.ipv4.tcp_congestion_control").unwrap();
    // Pick a control that is not the default, so the read-back cannot pass by accident.
    let cc = if default_cc.trim() == "reno" {
        "cubic"
    } else {
        "reno"
    };
    let mut p = profile("cc");
    p.congestion_control = Some(cc.to_owned());
    p.check_supported().unwrap();
    let pair = connect_pair(&p);
    each_socket_with_options(&pair, |who, fd| {
        assert_eq!(congestion_control_of(fd).unwrap(), cc, "{who}")
    });
}

#[test]
fn unknown_congestion_control_fails_the_check() {
    let mut p = profile("vegas");
    p.congestion_control = Some("vegas".to_owned());
    let err = p.check_supported().unwrap_err();
    assert!(
        matches!(err, KnobError::CongestionControlUnavailable { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("vegas"), "{err}");
}

#[test]
fn rto_min_reads_back_and_bounds_the_rto() {
    let mut p = profile("rto");
    p.rto_min_ms = Some(40);
    p.check_supported().unwrap();
    let pair = connect_pair(&p);
    each_socket_with_options(&pair, |who, fd| {
        assert_eq!(tcp_opt(fd, TCP_RTO_MIN_US), 40_000, "{who}");
    });
    // On loopback srtt is ~0, so the RTO is the floor plus a few ticks, far below the kernel
    // default of 200 ms. (A floor set after the handshake bounds the RTO from the next RTT
    // sample on, so the socket that got it only then is not checked here.)
    each_socket(&pair, |who, fd| {
        let rto = tcp_stats(fd).unwrap().rto_us;
        assert!((40_000..100_000).contains(&rto), "{who}: rto {rto}");
    });
}

#[test]
fn delayed_ack_off_sets_the_smallest_delack_ceiling() {
    let floor = delack_floor_us().unwrap();
    assert!(floor > 0 && floor < 40_000, "floor {floor}");
    let mut p = profile("quick");
    p.delayed_ack = Some(false);
    // Needs a route mark (route `quickack 1`); on loopback any mark is harmless.
    let err = p
        .apply_before_connect(&Socket::new(Domain::IPV4, Type::STREAM, None).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            KnobError::RouteMarkMissing {
                knob: "delayed_ack",
                ..
            }
        ),
        "{err}"
    );
    p.route_mark = Some(0x4d7);
    p.check_supported().unwrap();
    let pair = connect_pair(&p);
    each_socket_with_options(&pair, |who, fd| {
        assert_eq!(tcp_opt(fd, TCP_DELACK_MAX_US) as u32, floor, "{who}");
        assert_eq!(
            get_int(fd, libc::SOL_SOCKET, libc::SO_MARK).unwrap(),
            0x4d7,
            "{who}"
        );
    });
    let default_pair = connect_pair(&profile("plain"));
    assert!(tcp_opt(default_pair.outgoing.as_fd(), TCP_DELACK_MAX_US) as u32 > floor);
}

#[test]
fn buffers_read_back_doubled_also_above_mem_max() {
    let wmem_max: u32 = sysctl::read_u64("net.core.wmem_max")
        .unwrap()
        .try_into()
        .unwrap();
    let rmem_max: u32 = sysctl::read_u64("net.core.rmem_max")
        .unwrap()
        .try_into()
        .unwrap();
    for (snd, rcv) in [(96 * 1024, 48 * 1024), (wmem_max + 4096, rmem_max + 8192)] {
        let mut p = profile("buf");
        p.send_buffer = Some(snd);
        p.recv_buffer = Some(rcv);
        p.check_supported().unwrap();
        let pair = connect_pair(&p);
        each_socket(&pair, |who, fd| {
            assert_eq!(
                get_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF).unwrap() as u32,
                2 * snd,
                "{who}"
            );
            assert_eq!(
                get_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF).unwrap() as u32,
                2 * rcv,
                "{who}"
            );
        });
    }
}

#[test]
fn mss_reads_back_in_tcp_info() {
    let mut p = profile("mss");
    p.mss = Some(1000);
    p.check_supported().unwrap();
    let pair = connect_pair(&p);
    each_socket(&pair, |who, fd| {
        let stats = tcp_stats(fd).unwrap();
        assert!(
            stats.snd_mss <= 1000 && stats.snd_mss >= 900,
            "{who}: snd_mss {}",
            stats.snd_mss
        );
        assert!(tcp_opt(fd, libc::TCP_MAXSEG) <= 1000, "{who}");
    });
    // Loopback's default MSS is ~65 KB, so the value above did come from the profile.
    let plain = connect_pair(&profile("plain"));
    assert!(tcp_stats(plain.outgoing.as_fd()).unwrap().snd_mss > 10_000);
}

#[test]
fn notsent_lowat_nodelay_keepalive_user_timeout_read_back() {
    let mut p = profile("misc");
    p.notsent_lowat = Some(12345);
    p.nodelay = Some(true);
    p.keepalive = Some(Keepalive {
        idle_s: 31,
        interval_s: 7,
        count: 4,
    });
    p.user_timeout_ms = Some(23456);
    p.check_supported().unwrap();
    let pair = connect_pair(&p);
    each_socket_with_options(&pair, |who, fd| {
        assert_eq!(tcp_opt(fd, libc::TCP_NOTSENT_LOWAT), 12345, "{who}");
        assert_eq!(tcp_opt(fd, libc::TCP_NODELAY), 1, "{who}");
        assert_eq!(
            get_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE).unwrap(),
            1,
            "{who}"
        );
        assert_eq!(tcp_opt(fd, libc::TCP_KEEPIDLE), 31, "{who}");
        assert_eq!(tcp_opt(fd, libc::TCP_KEEPINTVL), 7, "{who}");
        assert_eq!(tcp_opt(fd, libc::TCP_KEEPCNT), 4, "{who}");
        assert_eq!(tcp_opt(fd, libc::TCP_USER_TIMEOUT), 23456, "{who}");
    });
    // And the defaults differ, so the checks above can fail.
    let plain = connect_pair(&profile("plain"));
    let fd = plain.outgoing.as_fd();
    assert_eq!(tcp_opt(fd, libc::TCP_NODELAY), 0);
    assert_eq!(
        get_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE).unwrap(),
        0
    );
    assert_eq!(tcp_opt(fd, libc::TCP_USER_TIMEOUT), 0);
}

/// Sends `bytes` from `from` and reads them at `to` (both blocking sockets of one connection).
fn move_bytes(from: &Socket, to: &Socket, bytes: usize) {
    let mut sender = TcpStream::from(from.try_clone().unwrap());
    let mut receiver = TcpStream::from(to.try_clone().unwrap());
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; bytes];
        std::io::Read::read_exact(&mut receiver, &mut buf).unwrap();
    });
    std::io::Write::write_all(&mut sender, &vec![3u8; bytes]).unwrap();
    reader.join().unwrap();
}

#[test]
fn max_pacing_rate_reads_back_and_caps_the_pacing_rate() {
    const CAP_BPS: u64 = 24_000_000;
    let mut p = profile("paced");
    p.max_pacing_rate_bps = Some(CAP_BPS);
    p.check_supported().unwrap();
    let pair = connect_pair(&p);
    let when = ReadBackWhen {
        before_data: true,
        metrics_cached: false,
    };
    each_socket_with_options(&pair, |who, fd| {
        assert_eq!(get_max_pacing_rate(fd).unwrap(), CAP_BPS / 8, "{who}");
        assert_eq!(p.read_back(fd, when).unwrap(), [], "{who}");
    });
    // The kernel's own pacing (no fq qdisc on loopback, whatever the congestion control) uses
    // the capped rate: after data has moved, tcp_info's pacing rate is at most the cap.
    move_bytes(&pair.outgoing, &pair.inherited_accepted, 64 * 1024);
    let paced = tcp_stats(pair.outgoing.as_fd()).unwrap();
    assert!(
        paced.pacing_rate_bps > 0 && paced.pacing_rate_bps <= CAP_BPS,
        "pacing rate {} bit/s",
        paced.pacing_rate_bps
    );
    // Control: without the knob the cap reads as "none" and loopback's pacing rate is far
    // above 24 Mbit/s, so the checks above can fail.
    let plain = connect_pair(&profile("plain"));
    assert!(get_max_pacing_rate(plain.outgoing.as_fd()).unwrap() > CAP_BPS);
    move_bytes(&plain.outgoing, &plain.inherited_accepted, 64 * 1024);
    let unpaced = tcp_stats(plain.outgoing.as_fd()).unwrap();
    assert!(
        unpaced.pacing_rate_bps > CAP_BPS,
        "plain pacing rate {} bit/s",
        unpaced.pacing_rate_bps
    );
}

#[test]
fn tcp_stats_of_an_established_socket() {
    let pair = connect_pair(&profile("plain"));
    let mut stream = TcpStream::from(pair.outgoing.try_clone().unwrap());
    std::io::Write::write_all(&mut stream, &[7u8; 5000]).unwrap();
    let mut buf = vec![0u8; 5000];
    let mut peer = TcpStream::from(pair.inherited_accepted.try_clone().unwrap());
    std::io::Read::read_exact(&mut peer, &mut buf).unwrap();
    let out = tcp_stats(pair.outgoing.as_fd()).unwrap();
    let acc = tcp_stats(pair.inherited_accepted.as_fd()).unwrap();
    assert_eq!(out.state, 1);
    assert_eq!(acc.bytes_received, 5000);
    assert!(out.bytes_sent >= 5000);
    // Not exactly 3: in the shared root namespace the tcp_metrics cache may carry a learnt
    // value for 127.0.0.1 (see midway_tcp::routes); the exact value is tested in a namespace.
    assert!(out.reordering >= 1);
    assert!(out.snd_cwnd >= 10, "{out:?}");
    assert!(out.snd_wnd.is_some() && out.rcv_wnd.is_some());
}

#[test]
fn presets_pass_the_kernel_check_where_they_need_no_route_table() {
    let presets = midway_tcp::resolve_profiles(&Default::default()).unwrap();
    for p in presets.values() {
        let mut p = p.clone();
        if p.needs_route_knobs() {
            p.route_mark = Some(0x4d8);
        }
        p.check_supported()
            .unwrap_or_else(|e| panic!("{}: {e}", p.name));
    }
}

/// Drops CAP_NET_ADMIN and CAP_NET_RAW from the effective set of the calling thread only
/// (Linux capabilities are per thread), as for a midway started without privileges.
fn drop_net_caps_of_this_thread() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_NET_RAW: u32 = 13;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: header and a two-element data array, as capget/capset v3 expect.
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()),
            0
        );
        data[0].effective &= !((1 << CAP_NET_ADMIN) | (1 << CAP_NET_RAW));
        assert_eq!(
            libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()),
            0
        );
    }
}

#[test]
fn without_privilege_the_check_names_the_knob_and_why() {
    let wmem_max: u32 = sysctl::read_u64("net.core.wmem_max")
        .unwrap()
        .try_into()
        .unwrap();
    std::thread::spawn(move || {
        drop_net_caps_of_this_thread();
        let mut big = profile("big");
        big.send_buffer = Some(wmem_max + 4096);
        let err = big.check_supported().unwrap_err();
        assert!(
            matches!(
                err,
                KnobError::BufferOverLimit {
                    knob: "send_buffer",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("wmem_max"), "{err}");

        let mut routed = profile("routed");
        routed.initial_cwnd = Some(4);
        let err = routed.check_supported().unwrap_err();
        match &err {
            KnobError::RouteMark { knob, source, .. } => {
                assert_eq!(*knob, "initial_cwnd");
                assert_eq!(source.raw_os_error(), Some(libc::EPERM));
            }
            other => panic!("{other}"),
        }
        // What needs no privilege still passes.
        let mut fine = profile("fine");
        fine.send_buffer = Some(64 * 1024);
        fine.rto_min_ms = Some(50);
        fine.check_supported().unwrap();
    })
    .join()
    .unwrap();
}
