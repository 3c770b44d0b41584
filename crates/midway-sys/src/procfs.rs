//! What the kernel says about a process and the machine: CPU time (per process and machine-wide),
//! resident memory, and the open-file and memory headroom.

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

/// The kernel's limits on TCP memory: what midway-proxy's socket memory guard works against
/// and the benchmark reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelMemoryLimits {
    /// `tcp_mem[1]` in bytes: above it the kernel is under TCP memory pressure.
    pub pressure_bytes: u64,
    /// `tcp_rmem[2]`: the most receive-buffer autotuning gives one socket.
    pub autotune_max_recv: u32,
    /// `tcp_wmem[2]`: the most send-buffer autotuning gives one socket.
    pub autotune_max_send: u32,
}

impl KernelMemoryLimits {
    /// Reads `net.ipv4.tcp_rmem` and `tcp_wmem` of the current network namespace and the
    /// machine's `tcp_mem`. `tcp_mem` is one value for the whole machine and Linux shows it only
    /// in the initial network namespace; elsewhere (a proxy run in a namespace, as in the lab)
    /// the pressure value is estimated as the kernel sets it at boot, 1/16 of memory.
    pub fn read() -> io::Result<KernelMemoryLimits> {
        let pressure_bytes = match third_fields("net.ipv4.tcp_mem") {
            Ok(pages) => pages[1].saturating_mul(page_size()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                let meminfo = std::fs::read_to_string("/proc/meminfo")?;
                let total = parse_meminfo_total_bytes(&meminfo).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "/proc/meminfo has no MemTotal")
                })?;
                boot_default_pressure_bytes(total)
            }
            Err(err) => return Err(err),
        };
        let rmem = third_fields("net.ipv4.tcp_rmem")?;
        let wmem = third_fields("net.ipv4.tcp_wmem")?;
        Ok(KernelMemoryLimits {
            pressure_bytes,
            autotune_max_recv: clamp_u32(rmem[2]),
            autotune_max_send: clamp_u32(wmem[2]),
        })
    }
}

/// `tcp_mem[1]` as the kernel computes it at boot (`tcp_init_mem`: free buffer pages / 16),
/// approximated with the machine's total memory.
fn boot_default_pressure_bytes(mem_total_bytes: u64) -> u64 {
    mem_total_bytes / 16
}

fn parse_meminfo_total_bytes(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(value.saturating_mul(1024)),
        _ => None,
    }
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no memory effects; it returns -1 on error, handled below.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// The three numbers of a `tcp_mem`-style sysctl.
fn third_fields(key: &str) -> io::Result<[u64; 3]> {
    let text = crate::sysctl::read(key)?;
    parse_three(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{key}: expected three numbers, found {text:?}"),
        )
    })
}

fn parse_three(text: &str) -> Option<[u64; 3]> {
    let mut numbers = text.split_whitespace().map(|w| w.parse::<u64>().ok());
    let three = [numbers.next()??, numbers.next()??, numbers.next()??];
    numbers.next().is_none().then_some(three)
}

/// Bytes of TCP memory the whole machine uses now (`/proc/net/sockstat`, "TCP: ... mem N" in
/// pages; the count is machine-wide whatever the network namespace).
pub fn machine_tcp_memory_bytes() -> io::Result<u64> {
    let text = std::fs::read_to_string("/proc/net/sockstat")?;
    parse_sockstat_tcp_pages(&text)
        .map(|pages| pages.saturating_mul(page_size()))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "/proc/net/sockstat has no \"TCP: ... mem N\" line",
            )
        })
}

fn parse_sockstat_tcp_pages(text: &str) -> Option<u64> {
    parse_sockstat_tcp_field(text, "mem")
}

/// The number after `field` on the "TCP:" line of a sockstat file.
fn parse_sockstat_tcp_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("TCP:"))?;
    let mut words = line.split_whitespace();
    while let Some(word) = words.next() {
        if word == field {
            return words.next()?.parse().ok();
        }
    }
    None
}

/// Memory the kernel estimates is available for new work without swapping (`MemAvailable` of
/// /proc/meminfo), bytes: the headroom a machine holding many connections has left.
pub fn mem_available_bytes() -> io::Result<u64> {
    let text = read("/proc/meminfo")?;
    parse_meminfo_field_bytes(&text, "MemAvailable:")
        .ok_or_else(|| unexpected("no MemAvailable in /proc/meminfo".into()))
}

fn parse_meminfo_field_bytes(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let mut words = line.split_whitespace().skip(1);
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => Some(value.saturating_mul(1024)),
        _ => None,
    }
}

/// A process's open-file limit (`RLIMIT_NOFILE`, "Max open files" of /proc/PID/limits) as
/// (soft, hard); `u64::MAX` stands for "unlimited".
pub fn open_file_limit(pid: u32) -> io::Result<(u64, u64)> {
    let path = format!("/proc/{pid}/limits");
    let text = read(&path)?;
    parse_open_file_limit(&text).ok_or_else(|| unexpected(format!("no Max open files in {path}")))
}

fn parse_open_file_limit(text: &str) -> Option<(u64, u64)> {
    let rest = text
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    let mut words = rest.split_whitespace();
    let mut limit = || match words.next()? {
        "unlimited" => Some(u64::MAX),
        word => word.parse().ok(),
    };
    Some((limit()?, limit()?))
}

/// How many descriptors a process has open (the entries of /proc/PID/fd).
pub fn open_fd_count(pid: u32) -> io::Result<u64> {
    let path = format!("/proc/{pid}/fd");
    let entries =
        std::fs::read_dir(&path).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    Ok(entries.count() as u64)
}

/// TCP sockets in use in a process's network namespace ("TCP: inuse N" of /proc/PID/net/sockstat,
/// which, unlike the line's `mem`, counts per namespace): listening and connected sockets, not
/// those in TIME-WAIT.
pub fn tcp_sockets_in_use(pid: u32) -> io::Result<u64> {
    let path = format!("/proc/{pid}/net/sockstat");
    let text = read(&path)?;
    parse_sockstat_tcp_field(&text, "inuse")
        .ok_or_else(|| unexpected(format!("no \"TCP: inuse N\" line in {path}")))
}

/// The state letter of a process (field 3 of /proc/PID/stat: `R`, `S`, `Z` for one that exited
/// and waits for its parent, ...); `None` once it is gone.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat); with the pid
/// it identifies a process even after pid reuse.
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: parse after the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The kernel's slab caches by name: objects in use and their size (`/proc/slabinfo`, readable
/// by root only). A socket's structures live there, not in the TCP memory that
/// [`machine_tcp_memory_bytes`] counts (its buffers): a `TCP` socket, its inode
/// (`sock_inode_cache`), its open file (`filp`, `dentry`) and each epoll registration
/// (`eventpoll_epi`), allocated whether or not a byte moves.
pub fn slab_in_use() -> io::Result<SlabUsage> {
    let text = read("/proc/slabinfo")?;
    parse_slabinfo(&text).ok_or_else(|| unexpected("unexpected format of /proc/slabinfo".into()))
}

/// Objects in use per slab cache, from [`slab_in_use`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlabUsage {
    /// By cache name: objects in use, bytes per object.
    caches: std::collections::BTreeMap<String, (u64, u64)>,
}

impl SlabUsage {
    /// All caches together, bytes.
    pub fn total(&self) -> u64 {
        self.caches
            .values()
            .map(|(objects, size)| objects * size)
            .sum()
    }

    /// [`SlabUsage::total`] without what looking into /proc made: each `proc_inode_cache`
    /// object and as many dentries (every /proc inode a lookup makes comes with its dentry).
    /// Listing a process's /proc/PID/fd makes one of each per descriptor, so a monitor that
    /// lists every process's descriptors (some machines run one) would otherwise be counted
    /// as a cost of the connections whose descriptors it lists.
    pub fn without_proc_lookups(&self) -> u64 {
        let (proc_inodes, proc_inode_size) = self
            .caches
            .get("proc_inode_cache")
            .copied()
            .unwrap_or_default();
        let dentry_size = self.caches.get("dentry").map_or(0, |(_, size)| *size);
        self.total()
            .saturating_sub(proc_inodes * (proc_inode_size + dentry_size))
    }

    /// Each cache's growth in bytes since `before` (negative if it shrank), largest growth
    /// first.
    pub fn growth_since(&self, before: &SlabUsage) -> Vec<(String, i64)> {
        let bytes = |usage: &SlabUsage, name: &str| {
            usage
                .caches
                .get(name)
                .map_or(0, |(objects, size)| (objects * size) as i64)
        };
        let names: std::collections::BTreeSet<&String> =
            self.caches.keys().chain(before.caches.keys()).collect();
        let mut growth: Vec<(String, i64)> = names
            .into_iter()
            .map(|name| (name.clone(), bytes(self, name) - bytes(before, name)))
            .filter(|(_, grew)| *grew != 0)
            .collect();
        growth.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        growth
    }
}

/// `/proc/slabinfo` version 2.1: after two header lines, `name active_objs num_objs objsize
/// ...` per cache. SLUB counts the objects of the slabs a CPU holds as active, so the figure
/// is exact to within a few slabs per cache and CPU.
fn parse_slabinfo(text: &str) -> Option<SlabUsage> {
    let mut lines = text.lines();
    if !lines.next()?.starts_with("slabinfo - version: 2.") {
        return None;
    }
    let mut caches = std::collections::BTreeMap::new();
    for line in lines.filter(|l| !l.starts_with('#')) {
        let mut fields = line.split_whitespace();
        let name = fields.next()?;
        let active: u64 = fields.next()?.parse().ok()?;
        let _total: u64 = fields.next()?.parse().ok()?;
        let size: u64 = fields.next()?.parse().ok()?;
        caches.insert(name.to_string(), (active, size));
    }
    Some(SlabUsage { caches })
}

#[cfg(test)]
mod tests {
    #[test]
    fn slabinfo_counts_objects_in_use_per_cache() {
        let text = "slabinfo - version: 2.1\n\
# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>\n\
TCP                  130    143   2368   13    8 : tunables    0    0    0 : slabdata     11     11      0\n\
filp                 441    441    192   21    1 : tunables    0    0    0 : slabdata     21     21      0\n\
proc_inode_cache      10     10    720   22    4 : tunables    0    0    0 : slabdata      1      1      0\n\
dentry               100    105    192   21    1 : tunables    0    0    0 : slabdata      5      5      0\n";
        let before = parse_slabinfo(text).unwrap();
        let total = 130 * 2368 + 441 * 192 + 10 * 720 + 100 * 192;
        assert_eq!(before.total(), total);
        // Each /proc inode and one dentry apiece are left out.
        assert_eq!(before.without_proc_lookups(), total - 10 * (720 + 192));
        let after = parse_slabinfo(
            &text
                .replace("TCP                  130", "TCP                  140")
                .replace("proc_inode_cache      10", "proc_inode_cache      30")
                .replace("dentry               100", "dentry               120"),
        )
        .unwrap();
        assert_eq!(
            after.growth_since(&before),
            vec![
                ("TCP".to_string(), 10 * 2368),
                ("proc_inode_cache".to_string(), 20 * 720),
                ("dentry".to_string(), 20 * 192),
            ]
        );
        // The /proc lookups between the two readings do not count; the sockets do.
        assert_eq!(
            after.without_proc_lookups() - before.without_proc_lookups(),
            10 * 2368
        );
        assert_eq!(parse_slabinfo("something else\n"), None);
        assert_eq!(parse_slabinfo("slabinfo - version: 2.1\nTCP x\n"), None);
    }

    use super::*;

    #[test]
    fn a_running_process_has_a_state() {
        let state = process_state(std::process::id()).unwrap();
        assert!(matches!(state, 'R' | 'S'), "{state}");
        assert_eq!(process_state(u32::MAX), None);
    }

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

    #[test]
    fn proc_files_parse_and_garbage_does_not() {
        assert_eq!(
            parse_three("287898\t383867\t575796\n"),
            Some([287898, 383867, 575796])
        );
        assert_eq!(parse_three("1 2"), None);
        assert_eq!(parse_three("1 2 x"), None);
        assert_eq!(parse_three("1 2 3 4"), None);
        let sockstat =
            "sockets: used 11\nTCP: inuse 1 orphan 0 tw 0 alloc 1 mem 166\nUDP: inuse 0 mem 0\n";
        assert_eq!(parse_sockstat_tcp_pages(sockstat), Some(166));
        assert_eq!(parse_sockstat_tcp_pages("UDP: inuse 0 mem 3\n"), None);
        assert_eq!(parse_sockstat_tcp_pages("TCP: inuse 1 mem\n"), None);
        assert_eq!(parse_sockstat_tcp_field(sockstat, "inuse"), Some(1));
    }

    #[test]
    fn outside_the_initial_namespace_pressure_is_estimated_from_memory() {
        let meminfo = "MemTotal:       24684084 kB\nMemFree:         1 kB\n";
        let total = parse_meminfo_total_bytes(meminfo).unwrap();
        assert_eq!(total, 24_684_084 * 1024);
        // This machine: tcp_mem[1] = 383867 pages = 1499 MiB; the estimate is within 3 %.
        let estimate = boot_default_pressure_bytes(total) as f64;
        let actual = 383_867.0 * 4096.0;
        assert!(
            (estimate / actual - 1.0).abs() < 0.03,
            "{estimate} vs {actual}"
        );
        assert_eq!(parse_meminfo_total_bytes("MemTotal: 12 MB\n"), None);
        assert_eq!(parse_meminfo_total_bytes("MemFree: 12 kB\n"), None);
    }

    #[test]
    fn headroom_figures_parse_and_read() {
        let meminfo = "MemTotal:       24000000 kB\nMemAvailable:   22000000 kB\n";
        assert_eq!(
            parse_meminfo_field_bytes(meminfo, "MemAvailable:"),
            Some(22_000_000 * 1024)
        );
        assert_eq!(
            parse_meminfo_field_bytes("MemAvailable: 5\n", "MemAvailable:"),
            None
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            20000                unlimited            files     \n";
        assert_eq!(parse_open_file_limit(limits), Some((20000, u64::MAX)));
        assert_eq!(parse_open_file_limit("Max processes 5 5 processes\n"), None);
        let me = std::process::id();
        assert!(mem_available_bytes().unwrap() > 0);
        assert!(open_file_limit(me).unwrap().0 > 0);
        assert!(open_fd_count(me).unwrap() >= 3);
        assert!(tcp_sockets_in_use(me).is_ok());
    }
}
