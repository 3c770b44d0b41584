//! The congestion controls in a real kernel (root only): registered, listed, selectable per
//! socket in a network namespace this test creates, carrying data intact, and gone after the
//! registration is dropped.
//!
//! `tcp_available_congestion_control` is host-wide, so the whole life cycle is one test function
//! (register, check, drop, check): no other test of this binary registers, and another process
//! holding the names (a lab, another test run) turns the registration into a shared one, for
//! which the disappearance is not checked.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::Duration;

use midway_bpf::{register, Algorithm, Ownership};
use midway_testkit::netns::Netns;

/// Moves `bytes` over loopback from a socket set to `kernel_name` and returns what the sender
/// read back as its congestion control and the largest cwnd it saw.
fn transfer(kernel_name: &str, bytes: usize) -> (String, u32) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let payload: Vec<u8> = (0..bytes).map(|i| (i * 31 + i / 4096) as u8).collect();
    let expected = midway_testkit::data::sha256(&payload);
    let receiver = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut received = Vec::new();
        stream.read_to_end(&mut received).unwrap();
        received
    });
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    midway_sys::sockopt::set_congestion_control(socket.as_fd(), kernel_name).unwrap();
    socket.connect(&addr.into()).unwrap();
    let mut stream: TcpStream = socket.into();
    stream
        .set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let name = midway_sys::tcp_info::congestion_control_of(stream.as_fd()).unwrap();
    let mut max_cwnd = 0;
    for chunk in payload.chunks(256 * 1024) {
        stream.write_all(chunk).unwrap();
        let stats = midway_sys::tcp_info::tcp_stats(stream.as_fd()).unwrap();
        max_cwnd = max_cwnd.max(stats.snd_cwnd);
    }
    drop(stream);
    let received = receiver.join().unwrap();
    assert_eq!(received.len(), bytes, "{kernel_name}: bytes received");
    assert_eq!(
        midway_testkit::data::sha256(&received),
        expected,
        "{kernel_name}: data"
    );
    (name, max_cwnd)
}

#[test]
fn registered_selectable_carrying_data_and_gone_after_drop() {
    if !midway_testkit::host::is_root() {
        eprintln!("skipped: registering BPF congestion controls needs root");
        return;
    }
    let registration = register(&Algorithm::ALL).unwrap();
    eprintln!("registration: {registration:?}");
    for algorithm in Algorithm::ALL {
        assert!(
            midway_bpf::is_available(algorithm.kernel_name()),
            "{algorithm} not in {}: {:?}",
            midway_bpf::AVAILABLE_CONGESTION_CONTROL,
            midway_bpf::available_congestion_controls()
        );
    }

    // A second registration while the first holds the names (another midway on this kernel,
    // as in the lab): shared, not an error, and dropping it leaves the names registered.
    let second = register(&Algorithm::ALL).unwrap();
    for algorithm in Algorithm::ALL {
        assert_eq!(
            second.ownership(algorithm),
            Some(Ownership::Shared),
            "{algorithm}"
        );
    }
    drop(second);
    for algorithm in Algorithm::ALL {
        assert!(
            midway_bpf::is_available(algorithm.kernel_name()),
            "{algorithm}"
        );
    }

    let netns = Netns::unique("mwbpf");
    for algorithm in Algorithm::ALL {
        let (name, max_cwnd) = netns.enter(|| transfer(algorithm.kernel_name(), 8 << 20));
        assert_eq!(name, algorithm.kernel_name());
        eprintln!("{algorithm}: 8 MiB intact, largest cwnd seen {max_cwnd}");
        assert!(max_cwnd >= 10, "{algorithm}: cwnd {max_cwnd}");
    }
    drop(netns);

    let owned: Vec<Algorithm> = registration
        .algorithms()
        .filter(|(_, ownership)| *ownership == Ownership::Owned)
        .map(|(algorithm, _)| algorithm)
        .collect();
    drop(registration);
    // The links are closed at once; the kernel unregisters the names as it releases them.
    for algorithm in owned {
        midway_testkit::wait::wait_until(
            Duration::from_secs(10),
            || !midway_bpf::is_available(algorithm.kernel_name()),
            &format!("{algorithm} still listed 10 s after the registration was dropped"),
        );
    }
}

#[test]
fn an_unknown_name_is_refused_per_socket() {
    // Not a registration: only shows what a socket gets for a name nobody registered.
    if !midway_testkit::host::is_root() {
        eprintln!("skipped: network namespaces need root");
        return;
    }
    let netns = Netns::unique("mwbpf-none");
    let error = netns.enter(|| {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        midway_sys::sockopt::set_congestion_control(socket.as_fd(), "mw_no_such_cc").unwrap_err()
    });
    assert_eq!(error.raw_os_error(), Some(libc::ENOENT), "{error}");
}
