//! Where a launched process's output goes, and reading it back: a file (the lab's and the
//! bench's, kept with their results) or a pipe read line by line (the tests', which assert on
//! the lines).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};

/// Lines of a piped log kept for the waits and for error messages (its receiver, if any, gets
/// every line).
const KEPT_LINES: usize = 2000;
/// Lines quoted from a piped log when a launch fails.
const TAIL_LINES: usize = 40;
/// Bytes quoted from a log file when a launch fails.
const TAIL_BYTES: usize = 4096;

/// Where the output goes, chosen before the start.
#[derive(Debug)]
pub(crate) enum LogTo {
    /// stdout and stderr into this file (created or truncated).
    File(PathBuf),
    /// stderr piped and read line by line; each line also to the sender, if any. stdout is
    /// discarded.
    Pipe(Option<Sender<String>>),
}

/// A running process's log, as the waits read it.
#[derive(Debug)]
pub(crate) enum Log {
    /// Read from the file again at each look (the process appends to it).
    File(PathBuf),
    /// The latest lines, filled by a reader thread.
    Pipe(Arc<Mutex<VecDeque<String>>>),
}

impl Log {
    /// Starts the thread that reads `stderr` into a piped log, forwarding to `forward`.
    pub(crate) fn pipe(stderr: impl Read + Send + 'static, forward: Option<Sender<String>>) -> Log {
        let kept: Arc<Mutex<VecDeque<String>>> = Arc::default();
        let writer = kept.clone();
        // Ends when the process's stderr closes (it exited, or its descendants did too).
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                {
                    let mut kept = writer.lock().unwrap_or_else(PoisonError::into_inner);
                    if kept.len() == KEPT_LINES {
                        kept.pop_front();
                    }
                    kept.push_back(line.clone());
                }
                if let Some(forward) = &forward {
                    // A receiver that was dropped only means nobody wants the lines any more.
                    let _ = forward.send(line);
                }
            }
        });
        Log::Pipe(kept)
    }

    /// The first line (of those kept) that `matches` accepts.
    pub(crate) fn find(&self, matches: &mut impl FnMut(&str) -> bool) -> Option<String> {
        match self {
            Log::File(path) => {
                // A file the process has not written yet reads as empty.
                let text = std::fs::read(path).unwrap_or_default();
                String::from_utf8_lossy(&text)
                    .lines()
                    .find(|line| matches(line))
                    .map(str::to_string)
            }
            Log::Pipe(kept) => kept
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .find(|line| matches(line))
                .cloned(),
        }
    }

    /// The end of the log, for an error message.
    pub(crate) fn tail(&self) -> String {
        match self {
            Log::File(path) => {
                let text = std::fs::read(path).unwrap_or_default();
                let start = text.len().saturating_sub(TAIL_BYTES);
                String::from_utf8_lossy(&text[start..]).trim().to_string()
            }
            Log::Pipe(kept) => {
                let kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
                let skip = kept.len().saturating_sub(TAIL_LINES);
                kept.iter()
                    .skip(skip)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n")
            }
        }
    }
}
