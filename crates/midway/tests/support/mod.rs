//! What the end-to-end tests of the real binary share: running it, root and program checks, a
//! self-removing temp folder, and finding the namespaces a lab process left behind.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `midway` binary cargo built for these tests.
pub fn midway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_midway"))
}

/// The workspace root (scenarios/, examples/).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// /proc/self belongs to the effective user of the process reading it.
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Whether `program` is an executable file in one of PATH's folders.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// A fresh folder under the system temp dir, removed on drop (also when the test fails). Mode
/// 0755, so programs the lab runs as another user (Squid drops to `proxy`) can enter it.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("midway-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `n` in base 36, as labnet writes process ids into namespace tags.
pub fn base36(mut n: u32) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(digits[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap()
}

/// Namespaces made by process `pid` (labnet tags are the pid in base 36 plus a counter; the
/// tests make few enough topologies for the counter to be one character).
pub fn namespaces_of_pid(pid: u32) -> Vec<String> {
    let prefix = format!("mw{}", base36(pid));
    std::fs::read_dir("/run/netns")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| {
                    name.strip_prefix(&prefix).is_some_and(|rest| {
                        let rest = rest.as_bytes();
                        rest.len() > 2 && (rest[1] == b'-' || rest[1] == b'.')
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}
