//! What the kernel says about a process and the machine: CPU time (per process and machine-wide)
//! and resident memory. TCP memory comes from `midway_proxy::sockmem`, the same readers the
//! proxy's socket memory guard uses.

use anyhow::{bail, Context};

/// User + system CPU time of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("process {pid} is gone"))?;
    // The command name (field 2) may contain spaces; the fields after it start past the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("unexpected /proc/PID/stat format")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')' come: state(3) ppid(4) ... utime(14) stime(15) -> indices 11 and 12 here.
    if fields.len() < 13 {
        bail!("short /proc/{pid}/stat");
    }
    let utime: f64 = fields[11].parse()?;
    let stime: f64 = fields[12].parse()?;
    let ticks = clock_ticks_per_second();
    Ok((utime + stime) / ticks)
}

/// CPU time the whole machine spent busy (every CPU, user + system + interrupts, not idle or
/// waiting for I/O), in seconds, from /proc/stat.
pub fn machine_busy_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    let ticks = parse_busy_ticks(&stat).context("unexpected /proc/stat format")?;
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
pub fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("process {pid} is gone"))?;
    for line in status.lines() {
        if let Some(rest) = line.strip_prefix("VmRSS:") {
            let kib: u64 = rest
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .context("VmRSS")?;
            return Ok(kib * 1024);
        }
    }
    bail!("no VmRSS for process {pid}")
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
}
