//! midway-bpf: HighSpeed TCP (RFC 3649) and gentle HighSpeed TCP as BPF `struct_ops`
//! congestion controls, registered with the kernel for as long as a midway runs.
//!
//! # What is registered
//!
//! Two `tcp_congestion_ops`, written in C in this crate's `bpf/` folder and compiled once to the
//! committed objects `bpf/mw_highspeed.bpf.o` and `bpf/mw_gentle_hs.bpf.o`, which are embedded
//! with `include_bytes!` (a normal build needs no clang; `scripts/build-bpf` rebuilds them and
//! `bpf/SOURCES.sha256`, and a unit test fails when a source no longer matches that list):
//!
//! | [`Algorithm`] | profile name | kernel name |
//! |---|---|---|
//! | [`Algorithm::HighSpeed`] | `highspeed` | `mw_highspeed` |
//! | [`Algorithm::GentleHighSpeed`] | `gentle-highspeed` | `mw_gentle_hs` |
//!
//! The kernel names differ from the profile names because a kernel name has at most 15
//! characters (`gentle-highspeed` has 16) and because the kernel's own HighSpeed module registers
//! as `highspeed`: ours must not clash with it when that module is loaded.
//!
//! Their window arithmetic is the C form of the reference model in `midway-cc` (same table, same
//! fixed-step lookup, same integer shapes, same thresholds and mode switch; shared header
//! `bpf/mw_cc.h`), and `tests/arithmetic.rs` runs that C with `BPF_PROG_TEST_RUN` on table
//! boundaries, window sweeps and event traces and compares every result with `midway-cc`.
//!
//! # What the kernel programs add around that arithmetic
//!
//! The model is fed events; the `struct_ops` callbacks are where the kernel delivers them, and
//! they do what any Linux congestion control does there, which the model leaves out:
//!
//! * `cong_avoid` grows the window only while the sender fills it (the kernel's
//!   `tcp_is_cwnd_limited()`), and caps the result at the socket's `snd_cwnd_clamp`, as
//!   `tcp_cong_avoid_ai()` does;
//! * `ssthresh` returns the model's loss threshold; the kernel stores it and runs fast recovery
//!   (PRR) itself, ending at `cwnd = ssthresh`; on a timeout it sets the window to the packets in
//!   flight plus one (the model's loss window of one segment in the usual case);
//! * `undo_cwnd` is Reno's (`max(cwnd, prior_cwnd)`) after a spurious reduction;
//! * gentle HighSpeed's `pkts_acked` skips ACKs without an RTT sample (`rtt_us < 0`) and its
//!   `set_state` forgets the RTT state and returns to HighSpeed mode on `TCP_CA_Loss` (a
//!   timeout).
//!
//! # When, and how it goes away
//!
//! [`register`] loads the objects and attaches each `struct_ops` map through a BPF link
//! (section `.struct_ops.link`): the congestion control is in the kernel's list while the
//! [`Registration`] lives. Dropping it, or the process exiting in any way, closes the links and
//! the kernel unregisters the names (the maps themselves are freed after an RCU grace period;
//! connections still using one keep it until they close).
//!
//! Registration is kernel-wide, while midways of the lab run in network namespaces of one
//! kernel: a name that another process has already registered (`EEXIST`) is not an error. It is
//! reported as [`Ownership::Shared`] after checking that the name is listed in
//! `/proc/sys/net/ipv4/tcp_available_congestion_control`; its lifetime is then that other
//! process's.
//!
//! # Never a default
//!
//! These names are only ever selected per socket (`TCP_CONGESTION`) or per route (`congctl`),
//! never as a namespace's default `net.ipv4.tcp_congestion_control`: on this kernel, setting a
//! default to a name that is not in `tcp_allowed_congestion_control` fails with `EPERM` and leaks
//! a reference, after which the `struct_ops` map can never be freed and the name never goes away.

#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;

use libbpf_rs::{ErrorKind, Link, MapCore, Object, ObjectBuilder, PrintLevel};

/// Where the kernel lists every congestion control registered on it (host-wide, whatever the
/// network namespace of the reader), for messages; read through
/// [`midway_sys::sysctl::available_congestion_controls`].
pub const AVAILABLE_CONGESTION_CONTROL: &str =
    "/proc/sys/net/ipv4/tcp_available_congestion_control";

/// The kernel's BTF, without which neither `struct_ops` nor CO-RE can work.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// A congestion control this crate can register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// HighSpeed TCP, RFC 3649 (`midway_cc::highspeed`).
    HighSpeed,
    /// Gentle HighSpeed TCP (`midway_cc::gentle_highspeed`).
    GentleHighSpeed,
}

impl Algorithm {
    /// Every algorithm, in a fixed order.
    pub const ALL: [Algorithm; 2] = [Algorithm::HighSpeed, Algorithm::GentleHighSpeed];

    /// The name a profile's `congestion_control` uses: `highspeed`, `gentle-highspeed`.
    pub const fn profile_name(self) -> &'static str {
        match self {
            Algorithm::HighSpeed => "highspeed",
            Algorithm::GentleHighSpeed => "gentle-highspeed",
        }
    }

    /// The name the kernel knows it by (`TCP_CONGESTION`, `congctl`, the available list):
    /// `mw_highspeed`, `mw_gentle_hs`.
    pub const fn kernel_name(self) -> &'static str {
        match self {
            Algorithm::HighSpeed => "mw_highspeed",
            Algorithm::GentleHighSpeed => "mw_gentle_hs",
        }
    }

    /// The algorithm with this profile name or kernel name.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|algorithm| algorithm.profile_name() == name || algorithm.kernel_name() == name)
    }

    /// The embedded, prebuilt BPF object that defines this algorithm's `struct_ops` map (named
    /// like the kernel name).
    fn object(self) -> &'static [u8] {
        match self {
            Algorithm::HighSpeed => &HIGHSPEED_OBJECT.0,
            Algorithm::GentleHighSpeed => &GENTLE_HIGHSPEED_OBJECT.0,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.profile_name(), self.kernel_name())
    }
}

/// Bytes aligned for libelf, which reads ELF headers in place.
#[repr(C, align(8))]
struct Aligned<B: ?Sized>(B);

static HIGHSPEED_OBJECT: &Aligned<[u8]> = &Aligned(*include_bytes!("../bpf/mw_highspeed.bpf.o"));
static GENTLE_HIGHSPEED_OBJECT: &Aligned<[u8]> =
    &Aligned(*include_bytes!("../bpf/mw_gentle_hs.bpf.o"));

/// Whether a [`Registration`] holds an algorithm's registration itself or found it registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// Registered by this process; unregistered when the [`Registration`] is dropped.
    Owned,
    /// Already registered on this kernel by another process (`EEXIST`) and listed as available:
    /// shared, and gone when that process unregisters it.
    Shared,
}

impl fmt::Display for Ownership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ownership::Owned => "registered by this process",
            Ownership::Shared => "already registered on this kernel (shared)",
        })
    }
}

/// One algorithm held by a [`Registration`]. The link is declared first so that it is dropped
/// (and the congestion control unregistered) before its object is closed.
struct Held {
    algorithm: Algorithm,
    link: Option<LinkHold>,
    _object: Option<Object>,
}

/// How this process keeps a registration alive: the kernel unregisters a `struct_ops` link's
/// congestion control when the last file descriptor of the link is closed, whichever process
/// holds it.
enum LinkHold {
    /// Attached here by libbpf.
    Attached(Link),
    /// Received from the midway this process took over from ([`Registration::adopt`]).
    Adopted(OwnedFd),
}

impl LinkHold {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            LinkHold::Attached(link) => link.as_fd(),
            LinkHold::Adopted(fd) => fd.as_fd(),
        }
    }
}

/// Congestion controls registered by [`register`]; dropping it unregisters those it owns.
pub struct Registration {
    held: Vec<Held>,
}

impl Registration {
    /// Each algorithm asked for and how it is held.
    pub fn algorithms(&self) -> impl Iterator<Item = (Algorithm, Ownership)> + '_ {
        self.held.iter().map(|held| {
            let ownership = if held.link.is_some() {
                Ownership::Owned
            } else {
                Ownership::Shared
            };
            (held.algorithm, ownership)
        })
    }

    /// How `algorithm` is held, if it was asked for.
    pub fn ownership(&self, algorithm: Algorithm) -> Option<Ownership> {
        self.algorithms()
            .find(|(held, _)| *held == algorithm)
            .map(|(_, ownership)| ownership)
    }

    /// The link of every algorithm this registration owns, to hand to a process that takes
    /// over (a binary upgrade): a copy of the descriptor keeps the registration alive there
    /// after this process exits. Dropping this registration afterwards only closes this
    /// process's copies: the objects declare `.struct_ops.link` maps, whose libbpf detach is a
    /// `close`, not an unregistration.
    pub fn owned_links(&self) -> impl Iterator<Item = (Algorithm, BorrowedFd<'_>)> + '_ {
        self.held
            .iter()
            .filter_map(|held| held.link.as_ref().map(|link| (held.algorithm, link.fd())))
    }

    /// Registrations handed over by the midway this process takes over from: each descriptor
    /// is a `struct_ops` link, and holding it keeps its congestion control registered.
    pub fn adopt(links: Vec<(Algorithm, OwnedFd)>) -> Registration {
        let held = links
            .into_iter()
            .map(|(algorithm, fd)| Held {
                algorithm,
                link: Some(LinkHold::Adopted(fd)),
                _object: None,
            })
            .collect();
        Registration { held }
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.algorithms()).finish()
    }
}

/// Why [`register`] failed. Each message names what the kernel or the process lacks; libbpf's
/// error is the [`std::error::Error::source`], and libbpf's log tail (the verifier's verdict)
/// ends the message where there is one.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The kernel exposes no BTF.
    #[error(
        "cannot register {algorithm}: the kernel has no BTF ({KERNEL_BTF} is missing); BPF \
         congestion controls need a kernel built with CONFIG_DEBUG_INFO_BTF"
    )]
    NoBtf {
        /// The first algorithm asked for.
        algorithm: Algorithm,
    },
    /// The process may not load BPF programs.
    #[error(
        "cannot register {algorithm}: not permitted to load BPF programs (run as root, or with \
         CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    )]
    PermissionDenied {
        /// The algorithm being registered.
        algorithm: Algorithm,
        /// libbpf's error.
        source: libbpf_rs::Error,
    },
    /// The kernel cannot register a `tcp_congestion_ops` from BPF.
    #[error(
        "cannot register {algorithm}: this kernel does not support BPF struct_ops congestion \
         controls (needs CONFIG_BPF_SYSCALL, CONFIG_BPF_JIT and tcp_congestion_ops in its \
         BTF){log}"
    )]
    StructOpsUnsupported {
        /// The algorithm being registered.
        algorithm: Algorithm,
        /// libbpf's error.
        source: libbpf_rs::Error,
        /// The tail of libbpf's log, with a leading newline, or empty.
        log: String,
    },
    /// The embedded object could not be opened (a corrupt build).
    #[error("cannot open the embedded BPF object of {algorithm}")]
    Open {
        /// The algorithm being registered.
        algorithm: Algorithm,
        /// libbpf's error.
        source: libbpf_rs::Error,
    },
    /// The kernel refused to load the programs; the verifier's log tail says why.
    #[error("the kernel refused to load the BPF programs of {algorithm}{log}")]
    Load {
        /// The algorithm being registered.
        algorithm: Algorithm,
        /// libbpf's error.
        source: libbpf_rs::Error,
        /// The tail of libbpf's log (the verifier's verdict), with a leading newline, or empty.
        log: String,
    },
    /// The object has no `struct_ops` map of the expected name (a build mistake).
    #[error("the embedded BPF object of {algorithm} has no struct_ops map named {map}")]
    MissingMap {
        /// The algorithm being registered.
        algorithm: Algorithm,
        /// The map looked for.
        map: &'static str,
    },
    /// The kernel refused the registration itself.
    #[error("the kernel refused to register {algorithm}{log}")]
    Attach {
        /// The algorithm being registered.
        algorithm: Algorithm,
        /// libbpf's error.
        source: libbpf_rs::Error,
        /// The tail of libbpf's log, with a leading newline, or empty.
        log: String,
    },
    /// `EEXIST`, yet the name is not listed as available: something else holds the name.
    #[error(
        "cannot register {algorithm}: the kernel says the name exists, but it is not listed in \
         {AVAILABLE_CONGESTION_CONTROL} ({listed})"
    )]
    NameTakenButUnavailable {
        /// The algorithm being registered.
        algorithm: Algorithm,
        /// What the available list said, or why it could not be read.
        listed: String,
    },
}

impl RegisterError {
    /// The algorithm whose registration failed.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            RegisterError::NoBtf { algorithm }
            | RegisterError::PermissionDenied { algorithm, .. }
            | RegisterError::StructOpsUnsupported { algorithm, .. }
            | RegisterError::Open { algorithm, .. }
            | RegisterError::Load { algorithm, .. }
            | RegisterError::MissingMap { algorithm, .. }
            | RegisterError::Attach { algorithm, .. }
            | RegisterError::NameTakenButUnavailable { algorithm, .. } => *algorithm,
        }
    }
}

/// The congestion controls registered on this kernel, as listed in
/// [`AVAILABLE_CONGESTION_CONTROL`].
pub fn available_congestion_controls() -> std::io::Result<Vec<String>> {
    midway_sys::sysctl::available_congestion_controls()
}

/// Whether the kernel lists `kernel_name` as an available congestion control.
pub fn is_available(kernel_name: &str) -> bool {
    available_congestion_controls()
        .map(|names| names.iter().any(|name| name == kernel_name))
        .unwrap_or(false)
}

/// Registers `algorithms` with the kernel (each at most once; an empty list registers nothing)
/// and returns the [`Registration`] that keeps them registered.
///
/// A name already registered on this kernel by another process is shared
/// ([`Ownership::Shared`]) when it is listed as available. On an error, whatever this call had
/// registered already is unregistered again.
pub fn register(algorithms: &[Algorithm]) -> Result<Registration, RegisterError> {
    let mut wanted: Vec<Algorithm> = Vec::new();
    for algorithm in algorithms {
        if !wanted.contains(algorithm) {
            wanted.push(*algorithm);
        }
    }
    let Some(first) = wanted.first() else {
        return Ok(Registration { held: Vec::new() });
    };
    if !Path::new(KERNEL_BTF).exists() {
        return Err(RegisterError::NoBtf { algorithm: *first });
    }
    // libbpf's log goes to one global callback: collect it for error messages, one call at a
    // time, and give the previous callback back afterwards.
    let _serial = REGISTER_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let previous = libbpf_rs::set_print(Some((PrintLevel::Info, collect_libbpf_log)));
    let mut held = Vec::new();
    let mut result = Ok(());
    for algorithm in wanted {
        // A holder that unregistered between our EEXIST and our look at the list: try once more.
        let outcome = match register_one(algorithm) {
            Err(RegisterError::NameTakenButUnavailable { .. }) => register_one(algorithm),
            outcome => outcome,
        };
        match outcome {
            Ok(one) => held.push(one),
            Err(error) => {
                result = Err(error);
                break;
            }
        }
    }
    libbpf_rs::set_print(previous);
    // On an error, `held` is dropped here: what was registered is unregistered again.
    result.map(|()| Registration { held })
}

fn register_one(algorithm: Algorithm) -> Result<Held, RegisterError> {
    clear_libbpf_log();
    let open = ObjectBuilder::default()
        .open_memory(algorithm.object())
        .map_err(|source| RegisterError::Open { algorithm, source })?;
    let mut object = open.load().map_err(|source| {
        let log = libbpf_log_tail();
        match source.kind() {
            ErrorKind::PermissionDenied => RegisterError::PermissionDenied { algorithm, source },
            ErrorKind::Unsupported | ErrorKind::NotFound => RegisterError::StructOpsUnsupported {
                algorithm,
                source,
                log,
            },
            _ => RegisterError::Load {
                algorithm,
                source,
                log,
            },
        }
    })?;
    let map_name = algorithm.kernel_name();
    let attached = object
        .maps_mut()
        .find(|map| map.name() == map_name)
        .ok_or(RegisterError::MissingMap {
            algorithm,
            map: map_name,
        })?
        .attach_struct_ops();
    match attached {
        Ok(link) => Ok(Held {
            algorithm,
            link: Some(LinkHold::Attached(link)),
            _object: Some(object),
        }),
        Err(source) if source.kind() == ErrorKind::AlreadyExists => {
            drop(object);
            match available_congestion_controls() {
                Ok(names) if names.iter().any(|name| name == map_name) => Ok(Held {
                    algorithm,
                    link: None,
                    _object: None,
                }),
                Ok(names) => Err(RegisterError::NameTakenButUnavailable {
                    algorithm,
                    listed: names.join(" "),
                }),
                Err(error) => Err(RegisterError::NameTakenButUnavailable {
                    algorithm,
                    listed: format!("unreadable: {error}"),
                }),
            }
        }
        Err(source) if source.kind() == ErrorKind::PermissionDenied => {
            Err(RegisterError::PermissionDenied { algorithm, source })
        }
        Err(source) => Err(RegisterError::Attach {
            algorithm,
            source,
            log: libbpf_log_tail(),
        }),
    }
}

/// One [`register`] at a time: libbpf's print callback is process-wide.
static REGISTER_LOCK: Mutex<()> = Mutex::new(());

/// The last lines libbpf printed during the current [`register`] call.
static LIBBPF_LOG: Mutex<VecDeque<String>> = Mutex::new(VecDeque::new());

/// How many of libbpf's lines an error keeps (the verifier's verdict is at the end).
const LOG_TAIL_LINES: usize = 40;

fn collect_libbpf_log(_level: PrintLevel, message: String) {
    let mut log = LIBBPF_LOG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for line in message.lines() {
        if log.len() == LOG_TAIL_LINES {
            log.pop_front();
        }
        log.push_back(line.to_owned());
    }
}

fn clear_libbpf_log() {
    LIBBPF_LOG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
}

/// The collected log as a suffix for an error message: a newline and the lines, or nothing.
fn libbpf_log_tail() -> String {
    let log = LIBBPF_LOG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if log.is_empty() {
        return String::new();
    }
    let mut text = String::from("\nlibbpf log (tail):");
    for line in log.iter() {
        text.push_str("\n  ");
        text.push_str(line);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn names_map_both_ways() {
        for algorithm in Algorithm::ALL {
            assert_eq!(
                Algorithm::from_name(algorithm.profile_name()),
                Some(algorithm)
            );
            assert_eq!(
                Algorithm::from_name(algorithm.kernel_name()),
                Some(algorithm)
            );
            // The kernel's TCP_CA_NAME_MAX is 16 with the terminating NUL.
            assert!(algorithm.kernel_name().len() <= 15);
        }
        assert_eq!(
            Algorithm::from_name("highspeed"),
            Some(Algorithm::HighSpeed)
        );
        assert_eq!(
            Algorithm::from_name("mw_gentle_hs"),
            Some(Algorithm::GentleHighSpeed)
        );
        assert_eq!(Algorithm::from_name("cubic"), None);
        assert_eq!(Algorithm::from_name("mw_highspeed "), None);
    }

    #[test]
    fn embedded_objects_are_bpf_elf() {
        for algorithm in Algorithm::ALL {
            let object = algorithm.object();
            assert_eq!(&object[..4], b"\x7fELF", "{algorithm}");
            // e_machine (offset 18, little-endian) is EM_BPF, 247.
            assert_eq!(u16::from_le_bytes([object[18], object[19]]), 247);
            assert_eq!(object.as_ptr() as usize % 8, 0);
        }
    }

    /// The committed objects were built from the committed sources: `scripts/build-bpf` writes
    /// `bpf/SOURCES.sha256`, and an edited source without a rebuild no longer matches it.
    #[test]
    fn committed_objects_match_their_sources() {
        use sha2::{Digest, Sha256};
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("bpf");
        let listed = std::fs::read_to_string(dir.join("SOURCES.sha256")).unwrap();
        let listed: BTreeMap<String, String> = listed
            .lines()
            .map(|line| {
                let (hash, name) = line.split_once("  ").unwrap();
                (name.to_owned(), hash.to_owned())
            })
            .collect();
        let mut actual = BTreeMap::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let name = entry.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".bpf.c") || name.ends_with(".h") {
                let hash = Sha256::digest(std::fs::read(dir.join(&name)).unwrap());
                let hex: String = hash.iter().map(|byte| format!("{byte:02x}")).collect();
                actual.insert(name, hex);
            }
        }
        assert_eq!(
            actual, listed,
            "crates/midway-bpf/bpf: the C sources differ from SOURCES.sha256; run scripts/build-bpf \
             and commit the rebuilt .bpf.o files with it"
        );
        for name in ["mw_highspeed.bpf.o", "mw_gentle_hs.bpf.o", "mw_check.bpf.o"] {
            assert!(dir.join(name).exists(), "{name} is not committed");
        }
    }

    #[test]
    fn registering_nothing_is_an_empty_registration() {
        let registration = register(&[]).unwrap();
        assert_eq!(registration.algorithms().count(), 0);
    }
}
