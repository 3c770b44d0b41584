//! Where a run's numbers come from: the commit of the source tree that ran it and whether that
//! tree had uncommitted changes (with a hash of them), recorded in every record, and the rule
//! that the published reports (under `docs/results`) come only from clean commits unless the
//! operator says otherwise (`--allow-dirty`, which the report then states at its top).
//!
//! The tree is read with git itself (`git describe`, `git status`, `git diff`, `git
//! hash-object`): no git library is needed for four read-only questions.

use std::io::Write as _;
use std::path::{Component, Path};
use std::process::{Command, Stdio};

use midway_report::{TREE_CLEAN, TREE_DIRTY_PREFIX};

/// The source tree a run comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SourceTree {
    /// `git describe --always --dirty`, or "unknown" outside a git tree.
    pub commit: String,
    /// "clean", "dirty:<hash>", or `None` outside a git tree.
    pub state: Option<String>,
}

impl SourceTree {
    /// Reads the tree that holds `dir`.
    pub(crate) fn of(dir: &Path) -> SourceTree {
        let commit = git(dir, &["describe", "--always", "--dirty"])
            .map(|out| String::from_utf8_lossy(&out).trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "unknown".into());
        SourceTree {
            commit,
            state: tree_state(dir),
        }
    }

    /// Whether the tree has uncommitted changes.
    pub(crate) fn is_dirty(&self) -> bool {
        self.state
            .as_deref()
            .is_some_and(|s| s.starts_with(TREE_DIRTY_PREFIX))
    }
}

/// "clean", or "dirty:" and the git object hash of the uncommitted changes: the diff of tracked
/// files against HEAD plus the name and content hash of every untracked, not ignored file.
fn tree_state(dir: &Path) -> Option<String> {
    let status = git(dir, &["status", "--porcelain", "--untracked-files=all"])?;
    if status.is_empty() {
        return Some(TREE_CLEAN.to_string());
    }
    let mut changes = git(dir, &["diff", "HEAD", "--binary"])?;
    let untracked = git(dir, &["ls-files", "-z", "--others", "--exclude-standard"])?;
    for name in untracked.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        let hash = git(dir, &["hash-object", "--", &name]).unwrap_or_default();
        changes.extend_from_slice(format!("untracked {name} ").as_bytes());
        changes.extend_from_slice(&hash);
    }
    let hash = hash_object(dir, &changes)?;
    let hash = String::from_utf8_lossy(&hash).trim().to_string();
    Some(format!(
        "{TREE_DIRTY_PREFIX}{}",
        &hash[..hash.len().min(12)]
    ))
}

/// Whether `out` lies in a `docs/results` folder, where the published reports live.
pub(crate) fn is_published_results(out: &Path) -> bool {
    let names: Vec<&std::ffi::OsStr> = out
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    names
        .windows(2)
        .any(|w| w[0] == "docs" && w[1] == "results")
}

/// Stdout of a successful `git ARGS` in `dir`.
pub(crate) fn git(dir: &Path, args: &[&str]) -> Option<Vec<u8>> {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| o.stdout)
}

/// `git hash-object --stdin` of `bytes`.
fn hash_object(dir: &Path, bytes: &[u8]) -> Option<Vec<u8>> {
    let mut child = Command::new("git")
        .args(["hash-object", "--stdin"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // Written whole before reading: hash-object prints one line only after its input ends.
    child.stdin.take()?.write_all(bytes).ok()?;
    let out = child.wait_with_output().ok()?;
    out.status.success().then_some(out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_results_are_recognised_by_their_folder() {
        assert!(is_published_results(Path::new("docs/results/overlay")));
        assert!(is_published_results(Path::new(
            "/work/main/docs/results/hfc-proxy/"
        )));
        assert!(!is_published_results(Path::new("lab-results/overlay")));
        assert!(!is_published_results(Path::new("/tmp/docs/other/results")));
    }

    #[test]
    fn a_tree_is_clean_until_a_file_changes_or_appears() {
        let dir = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let ok = Command::new("git")
                .args(args)
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .status()
                .unwrap()
                .success();
            assert!(ok, "git {args:?}");
        };
        run(&["init", "-q"]);
        std::fs::write(dir.path().join("a.txt"), "one\n").unwrap();
        run(&["add", "a.txt"]);
        run(&[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "a",
        ]);
        let clean = SourceTree::of(dir.path());
        assert_eq!(clean.state.as_deref(), Some(TREE_CLEAN));
        assert!(!clean.is_dirty());

        std::fs::write(dir.path().join("a.txt"), "two\n").unwrap();
        let edited = SourceTree::of(dir.path());
        assert!(edited.is_dirty(), "{edited:?}");
        assert!(edited.commit.ends_with("-dirty"), "{edited:?}");
        // The same changes give the same hash; another change another hash.
        assert_eq!(SourceTree::of(dir.path()), edited);
        std::fs::write(dir.path().join("a.txt"), "three\n").unwrap();
        let other = SourceTree::of(dir.path());
        assert!(other.is_dirty() && other.state != edited.state);

        // An untracked file is a change too (git describe --dirty does not see it).
        std::fs::write(dir.path().join("a.txt"), "one\n").unwrap();
        std::fs::write(dir.path().join("new.rs"), "fn main() {}\n").unwrap();
        let untracked = SourceTree::of(dir.path());
        assert!(untracked.is_dirty(), "{untracked:?}");

        let outside = tempfile::tempdir().unwrap();
        let none = SourceTree::of(outside.path());
        assert_eq!(none.state, None);
        assert!(!none.is_dirty());
    }
}
