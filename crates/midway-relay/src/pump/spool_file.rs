//! The spool file of one connection: created anonymous, its disk bytes reserved from and
//! released to the global budget, regions punched out once read back. Kept apart from the spool
//! relay so the file's life and accounting are in one place.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::resources::RelayResources;

/// The spool file of one connection: anonymous (O_TMPFILE), so nothing survives a crash, and
/// its disk bytes are released from the global budget when it closes.
pub(super) struct SpoolFile {
    pub(super) file: std::fs::File,
    reserved: AtomicU64,
    resources: Arc<RelayResources>,
}

impl SpoolFile {
    pub(super) fn create(resources: &Arc<RelayResources>) -> io::Result<SpoolFile> {
        let file = create_anonymous_file(resources.spool_dir())?;
        resources.spool_file_opened();
        Ok(SpoolFile {
            file,
            reserved: AtomicU64::new(0),
            resources: Arc::clone(resources),
        })
    }

    pub(super) fn reserve(&self, bytes: u64) -> bool {
        let ok = self.resources.try_reserve_spool(bytes);
        if ok {
            self.reserved.fetch_add(bytes, Ordering::Relaxed);
        }
        ok
    }

    pub(super) fn release(&self, bytes: u64) {
        self.reserved.fetch_sub(bytes, Ordering::Relaxed);
        self.resources.release_spool(bytes);
    }

    /// Frees the disk blocks of a region already read back (best effort: on file systems
    /// without hole punching the blocks are freed when the file next drains and is truncated).
    pub(super) fn punch(&self, offset: u64, len: u64) {
        // SAFETY: fallocate on a regular file we own, with in-range arguments.
        unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            );
        }
    }
}

/// O_TMPFILE: the file has no name, so a crash cannot leave it behind. File systems without
/// O_TMPFILE get a `midway-spool-` file that is unlinked at once; only a crash in between can
/// leave it, and [`crate::clean_spool_dir`] removes it at the next start.
fn create_anonymous_file(dir: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let anonymous = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir);
    match anonymous {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            let named = tempfile::Builder::new()
                .prefix(crate::SPOOL_FILE_PREFIX)
                .tempfile_in(dir)?;
            // into_file() unlinks the path and keeps the open file.
            Ok(named.into_file())
        }
        other => other,
    }
}

impl Drop for SpoolFile {
    fn drop(&mut self) {
        self.resources
            .release_spool(self.reserved.load(Ordering::Relaxed));
        self.resources.spool_file_closed();
    }
}
