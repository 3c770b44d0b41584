//! Reading and writing sysctls through `/proc/sys`, the one place midway does. The `net.*` ones
//! belong to the network namespace of the thread that opens the file, so a caller that wants a
//! namespace's value reads it from a thread inside it ([`read_in`], [`write_in`]); no `sysctl`
//! program is needed.

use std::io;
use std::path::{Path, PathBuf};

/// Where a sysctl's file is: `net.ipv4.tcp_rmem` is `/proc/sys/net/ipv4/tcp_rmem`. A key that
/// contains a `/` is taken as a path below `/proc/sys` as it is, for names with dots in them
/// (`net/ipv6/conf/eth0.10/forwarding`), as `sysctl` takes them.
pub fn path(key: &str) -> PathBuf {
    let relative = if key.contains('/') {
        key.trim_start_matches('/').to_owned()
    } else {
        key.replace('.', "/")
    };
    PathBuf::from("/proc/sys").join(relative)
}

/// The value of `key`, its fields separated by single spaces (the kernel separates a
/// `tcp_rmem`'s three numbers with tabs) and without the trailing newline. The error names the
/// file.
pub fn read(key: &str) -> io::Result<String> {
    let path = path(key);
    std::fs::read_to_string(&path)
        .map(|text| normalise(&text))
        .map_err(|e| named(e, "cannot read", &path))
}

/// `key`'s value as one number.
pub fn read_u64(key: &str) -> io::Result<u64> {
    let text = read(key)?;
    text.parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: expected a number, found {text:?}", path(key).display()),
        )
    })
}

/// `key`'s value as numbers (`tcp_rmem`: min, default, max).
pub fn read_numbers(key: &str) -> io::Result<Vec<u64>> {
    let text = read(key)?;
    text.split_whitespace()
        .map(|word| word.parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: expected numbers, found {text:?}", path(key).display()),
            )
        })
}

/// Sets `key` to `value` (several fields separated by spaces, as `sysctl -w` takes them).
pub fn write(key: &str, value: &str) -> io::Result<()> {
    let path = path(key);
    std::fs::write(&path, value).map_err(|e| named(e, &format!("cannot write {value:?} to"), &path))
}

/// [`read`] in the network namespace whose handle is `netns` (`/run/netns/NAME`), from a
/// short-lived thread that joined it; the calling thread stays where it is.
pub fn read_in(netns: &Path, key: &str) -> io::Result<String> {
    let key = key.to_owned();
    crate::netns::run_in(netns, move || read(&key))?
}

/// [`write`] in the network namespace whose handle is `netns`, from a short-lived thread that
/// joined it.
pub fn write_in(netns: &Path, key: &str, value: &str) -> io::Result<()> {
    let (key, value) = (key.to_owned(), value.to_owned());
    crate::netns::run_in(netns, move || write(&key, &value))?
}

/// The sysctl that lists every congestion control registered on the kernel (host-wide, whatever
/// the network namespace of the reader).
pub const AVAILABLE_CONGESTION_CONTROL: &str = "net.ipv4.tcp_available_congestion_control";

/// The congestion controls registered on this kernel ([`AVAILABLE_CONGESTION_CONTROL`]).
pub fn available_congestion_controls() -> io::Result<Vec<String>> {
    Ok(read(AVAILABLE_CONGESTION_CONTROL)?
        .split_whitespace()
        .map(str::to_owned)
        .collect())
}

fn normalise(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn named(error: io::Error, what: &str, path: &std::path::Path) -> io::Error {
    io::Error::new(error.kind(), format!("{what} {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_proc_sys_paths() {
        assert_eq!(
            path("net.ipv4.tcp_rmem"),
            PathBuf::from("/proc/sys/net/ipv4/tcp_rmem")
        );
        assert_eq!(
            path("net/ipv6/conf/eth0.10/forwarding"),
            PathBuf::from("/proc/sys/net/ipv6/conf/eth0.10/forwarding")
        );
    }

    #[test]
    fn values_are_read_with_single_spaces() {
        assert_eq!(normalise("4096\t131072\t6291456\n"), "4096 131072 6291456");
        assert_eq!(read_numbers("net.ipv4.tcp_rmem").unwrap().len(), 3);
        assert!(read_u64("net.core.somaxconn").unwrap() > 0);
        assert!(!read("kernel.osrelease").unwrap().is_empty());
        assert!(available_congestion_controls()
            .unwrap()
            .contains(&"reno".to_owned()));
    }

    #[test]
    fn a_missing_key_is_named_in_the_error() {
        let error = read("net.ipv4.midway_no_such_key").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        assert!(error
            .to_string()
            .contains("/proc/sys/net/ipv4/midway_no_such_key"));
        assert!(read_u64("kernel.osrelease").is_err());
    }
}
