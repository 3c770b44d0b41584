//! The summaries of the published reports (README.md, docs/results/README.md and the other
//! hand-written pages) held to the reports they summarise.
//!
//! - Tables such as the verdict counts are generated blocks, rewritten from the reports
//!   ([`generated`]).
//! - Every other number a summary quotes from a report carries a reference to the report row it
//!   comes from ([`refs`]); a quote that differs from its row fails, and so does a verdict the
//!   prose relies on that the row no longer has.
//! - No page dates its history by the project's numbered sessions or rounds ([`history`]).
//!
//! [`check`] reports every problem and writes nothing (the test suite runs it); [`sync`]
//! rewrites the generated blocks and the quoted numbers from the reports and returns what it
//! cannot fix (a changed verdict needs its sentence rewritten by hand). After reports are
//! rebuilt: `MIDWAY_SYNC_SUMMARIES=1 cargo test --locked -p midway-report --test summaries`.

mod generated;
mod history;
mod published;
mod refs;

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub use published::{Check, PublishedReport, Row, Table};

/// Folder of the published reproductions, from the repository's top.
pub const RESULTS_DIR: &str = "docs/results";

/// One place where a summary and the reports disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The page, relative to the repository's top.
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.message)
    }
}

/// What a [`check`] or [`sync`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Problems left (after a sync: those it cannot fix).
    pub problems: Vec<Problem>,
    /// References to report rows resolved, over every page.
    pub references: usize,
    /// Pages read.
    pub pages: usize,
    /// Pages a sync rewrote.
    pub rewritten: Vec<PathBuf>,
}

/// The hand-written pages: the top-level markdown files and every markdown file under docs/
/// except the reports, which the lab writes from their records.
pub fn summary_pages(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut pages = Vec::new();
    for entry in fs::read_dir(root)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut folders = vec![root.join("docs")];
    while let Some(folder) = folders.pop() {
        for entry in fs::read_dir(&folder)? {
            let path = entry?.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "md")
                && path.file_name().is_some_and(|n| n != crate::REPORT_FILE)
            {
                pages.push(path);
            }
        }
    }
    pages.sort();
    Ok(pages)
}

/// Every docs/results/PAPER/report.md, by PAPER.
pub fn published_reports(root: &Path) -> io::Result<BTreeMap<String, PublishedReport>> {
    let mut reports = BTreeMap::new();
    for entry in fs::read_dir(root.join(RESULTS_DIR))? {
        let folder = entry?.path();
        let Ok(text) = fs::read_to_string(folder.join(crate::REPORT_FILE)) else {
            continue;
        };
        let name = folder
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        reports.insert(name, PublishedReport::parse(&text));
    }
    Ok(reports)
}

/// The path from `page`'s folder to docs/results, for links in generated blocks.
fn path_to_results(root: &Path, page: &Path) -> String {
    let folder = page
        .parent()
        .and_then(|p| p.strip_prefix(root).ok())
        .unwrap_or(Path::new(""));
    let from: Vec<_> = folder.components().collect();
    let to: Vec<_> = Path::new(RESULTS_DIR).components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = "../".repeat(from.len() - common);
    for part in &to[common..] {
        path.push_str(&part.as_os_str().to_string_lossy());
        path.push('/');
    }
    path
}

/// Checks (`write = false`) or rewrites (`write = true`) every page against the reports.
fn run(root: &Path, write: bool) -> io::Result<Outcome> {
    let reports = published_reports(root)?;
    let mut outcome = Outcome::default();
    for page in summary_pages(root)? {
        let file = page.strip_prefix(root).unwrap_or(&page).to_path_buf();
        let text = fs::read_to_string(&page)?;
        outcome.pages += 1;
        let mut problems = Vec::new();
        let (regenerated, block_problems) =
            generated::regenerate(&text, &reports, &path_to_results(root, &page));
        problems.extend(block_problems);
        let (synced, ref_problems, count) = refs::check_references(&regenerated, &reports, write);
        outcome.references += count;
        problems.extend(ref_problems);
        if synced != text {
            if write {
                fs::write(&page, &synced)?;
                outcome.rewritten.push(file.clone());
            } else if regenerated != text {
                let line = first_difference(&text, &regenerated);
                problems.push(refs::LineProblem {
                    line,
                    message: "a generated block is not what the reports give".into(),
                });
            }
        }
        for (index, line) in synced.lines().enumerate() {
            for reference in history::history_references(line) {
                problems.push(refs::LineProblem {
                    line: index + 1,
                    message: format!(
                        "\"{reference}\" dates history by the project's own sessions or rounds: \
                         give the date and commit (git log --format='%h %ad' --date=short)"
                    ),
                });
            }
        }
        outcome
            .problems
            .extend(problems.into_iter().map(|p| Problem {
                file: file.clone(),
                line: p.line,
                message: p.message,
            }));
    }
    Ok(outcome)
}

fn first_difference(a: &str, b: &str) -> usize {
    a.lines()
        .zip(b.lines())
        .position(|(x, y)| x != y)
        .map_or_else(|| a.lines().count().min(b.lines().count()) + 1, |i| i + 1)
}

/// Every problem of every page; writes nothing.
pub fn check(root: &Path) -> io::Result<Outcome> {
    run(root, false)
}

/// Rewrites the generated blocks and the quoted numbers from the reports; returns what is left.
pub fn sync(root: &Path) -> io::Result<Outcome> {
    run(root, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_from_each_page_reach_the_results() {
        let root = Path::new("/repo");
        let to = |page: &str| path_to_results(root, &root.join(page));
        assert_eq!(to("README.md"), "docs/results/");
        assert_eq!(to("docs/ecmp.md"), "results/");
        assert_eq!(to("docs/results/README.md"), "");
        assert_eq!(to("docs/results/overlay/README.md"), "../");
    }
}
