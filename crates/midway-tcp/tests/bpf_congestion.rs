//! midway's BPF congestion controls as profile knobs: `highspeed` and `gentle-highspeed` pass
//! the kernel check once registered, are applied by their kernel names and read back in the
//! profile's terms. Root only (registering BPF); each socket lives in a namespace of its own.

// Tests: an unwrap that fails is the test failing.
#![allow(clippy::unwrap_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;

use midway_bpf::Algorithm;
use midway_tcp::{
    congestion_control_of, CarriedOptions, KnobError, ReadBackWhen, Role, TcpProfile,
};
use midway_testkit::netns::Netns;
use socket2::{Domain, Protocol, Socket, Type};

fn profile(cc: &str) -> TcpProfile {
    let mut profile = TcpProfile::kernel_default(cc);
    profile.congestion_control = Some(cc.to_owned());
    profile
}

/// What `read_back` says about `congestion_control` for each socket of a loopback connection
/// made under `applied` and read with `expected`, and the outgoing socket's kernel name.
fn read_back(applied: &TcpProfile, expected: &TcpProfile) -> (String, Vec<(String, String)>) {
    let listener = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
    applied.apply_to_listener(&listener).unwrap();
    listener
        .bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
        .unwrap();
    listener.listen(4).unwrap();
    let outgoing = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
    applied.apply_before_connect(&outgoing).unwrap();
    outgoing.connect(&listener.local_addr().unwrap()).unwrap();
    applied
        .apply_established(outgoing.as_fd(), Role::Outgoing, CarriedOptions::All)
        .unwrap();
    let (accepted, _) = listener.accept().unwrap();
    applied
        .apply_established(accepted.as_fd(), Role::Accepted, CarriedOptions::All)
        .unwrap();
    let when = ReadBackWhen {
        before_data: true,
        metrics_cached: false,
    };
    let mut mismatches = Vec::new();
    for fd in [outgoing.as_fd(), accepted.as_fd()] {
        for mismatch in expected.read_back(fd, when).unwrap() {
            assert_eq!(mismatch.knob, "congestion_control");
            mismatches.push((mismatch.wanted, mismatch.got));
        }
    }
    (congestion_control_of(outgoing.as_fd()).unwrap(), mismatches)
}

#[test]
fn registered_bpf_congestion_controls_apply_by_kernel_name_and_read_back_by_profile_name() {
    if !midway_testkit::host::is_root() {
        eprintln!("skipped: registering BPF congestion controls needs root");
        return;
    }
    let _registration = midway_bpf::register(&Algorithm::ALL).unwrap();
    let netns = Netns::unique("mwtcp-bpf");
    for algorithm in Algorithm::ALL {
        let p = profile(algorithm.profile_name());
        p.check_supported().unwrap();
        let (kernel_name, mismatches) = netns.enter(|| read_back(&p, &p));
        assert_eq!(kernel_name, algorithm.kernel_name());
        assert_eq!(mismatches, [], "{algorithm}");
    }
    // A socket under highspeed read against a gentle-highspeed profile: reported by profile name.
    let (_, mismatches) =
        netns.enter(|| read_back(&profile("highspeed"), &profile("gentle-highspeed")));
    let expected = ("gentle-highspeed".to_owned(), "highspeed".to_owned());
    assert_eq!(mismatches, [expected.clone(), expected]);
}

#[test]
fn a_failed_registration_names_the_profile_and_the_knob() {
    let error = KnobError::BpfCongestionControl {
        profile: "chain".to_owned(),
        name: "gentle-highspeed".to_owned(),
        kernel_name: Algorithm::GentleHighSpeed.kernel_name(),
        source: midway_bpf::RegisterError::NoBtf {
            algorithm: Algorithm::GentleHighSpeed,
        },
    };
    // As `midway` prints it: the error and its sources.
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    for part in ["\"chain\"", "congestion_control", "mw_gentle_hs", "BTF"] {
        assert!(text.contains(part), "{part} missing from: {text}");
    }
}
