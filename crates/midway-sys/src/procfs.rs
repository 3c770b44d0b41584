//! What the kernel says about a process and the machine: CPU time (per process and machine-wide)
//! and resident memory.

use std::io;

/// An `InvalidData` error naming the file whose text did not parse.
fn unexpected(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Reads a /proc file, naming it in the error (a process's files vanish when it exits).
fn read(path: &str) -> io::Result<String> {
    std::fs::read_to_string(path).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
}

/// User + system CPU time of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> io::Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = read(&path)?;
    parse_cpu_ticks(&stat)
        .map(|ticks| ticks as f64 / clock_ticks_per_second())
        .ok_or_else(|| unexpected(format!("unexpected format of {path}")))
}

/// utime + stime of a /proc/PID/stat line. The command name (field 2) may contain spaces and
/// parentheses, so the fields are counted from the last ')'.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')' come: state(3) ppid(4) ... utime(14) stime(15) -> indices 11 and 12 here.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU time the whole machine spent busy (every CPU, user + system + interrupts, not idle or
/// waiting for I/O), in seconds, from /proc/stat.
pub fn machine_busy_seconds() -> io::Result<f64> {
    let stat = read("/proc/stat")?;
    let ticks = parse_busy_ticks(&stat)
        .ok_or_else(|| unexpected("unexpected format of /proc/stat".into()))?;
    Ok(ticks as f64 / clock_ticks_per_second())
}

/// Busy ticks of the aggregate `cpu` line: all fields but idle (4th) and iowait (5th); guest
/// time is already inside user time, so only the first eight fields count.
fn parse_busy_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if fields.len() < 8 {
        return None;
    }
    Some(fields.iter().sum::<u64>() - fields[3] - fields[4])
}

/// Clock ticks per second, the unit of /proc/PID/stat's CPU times.
fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// Resident set size of a process in bytes (VmRSS).
pub fn rss_bytes(pid: u32) -> io::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = read(&path)?;
    parse_vm_rss_bytes(&status).ok_or_else(|| unexpected(format!("no VmRSS in {path}")))
}

fn parse_vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_ticks_leave_out_idle_and_iowait() {
        let stat = "cpu  100 2 30 5000 7 1 4 0 0 0\ncpu0 50 1 15 2500 3 0 2 0 0 0\n";
        assert_eq!(parse_busy_ticks(stat), Some(100 + 2 + 30 + 1 + 4));
        assert_eq!(parse_busy_ticks("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(parse_busy_ticks("cpu  1 2 3\n"), None);
        assert!(machine_busy_seconds().unwrap() > 0.0);
    }

    #[test]
    fn cpu_ticks_count_from_the_last_parenthesis() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 5 0 0\n";
        assert_eq!(parse_cpu_ticks(stat), Some(10));
        assert_eq!(parse_cpu_ticks("42 (x) S 1"), None);
        assert!(cpu_seconds(std::process::id()).is_ok());
    }

    #[test]
    fn resident_memory_is_read_in_bytes() {
        assert_eq!(
            parse_vm_rss_bytes("Name:\tx\nVmRSS:\t    1234 kB\n"),
            Some(1234 * 1024)
        );
        assert_eq!(parse_vm_rss_bytes("Name:\tx\n"), None);
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
    }
}
