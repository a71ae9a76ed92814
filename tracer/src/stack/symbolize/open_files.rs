//! The files the snapshots map, each opened once for the whole run.
//!
//! A file that many processes map is opened once, and its descriptor is shared by device
//! and inode. A file is closed when no snapshot holds it any more. The files kept open
//! are bounded by the open-file limit.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use crate::system::procfs::MapsEntry;

/// The mapped files open now, by (device, inode as the maps file shows them): one
/// descriptor of each file, however many processes map it. A file is closed when the
/// last snapshot holding it is dropped.
#[derive(Debug, Default)]
pub(super) struct OpenFiles {
    by_file: HashMap<(String, u64), Weak<File>>,
    /// Whether the warning that the budget is spent was given (once per run).
    warned: bool,
}

/// Every snapshot's mapped files, one registry for the whole run (snapshots are taken
/// by several commands and threads).
static OPEN_FILES: LazyLock<Mutex<OpenFiles>> = LazyLock::new(Default::default);

impl OpenFiles {
    /// The file behind an executable mapping of `pid`: the descriptor already open for
    /// the same file if there is one, else a new one unless the budget is spent (see
    /// [`mapped_file_budget`]). `None` leaves its frames named `module+0xOFFSET`.
    pub(super) fn open(pid: u32, entry: &MapsEntry) -> Option<Arc<File>> {
        let key = (entry.dev.clone(), entry.inode);
        let mut open = OPEN_FILES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(file) = open.by_file.get(&key).and_then(Weak::upgrade) {
            return Some(file);
        }
        // Files no snapshot holds any more are closed already: forget them.
        open.by_file.retain(|_, file| file.strong_count() > 0);
        let budget = mapped_file_budget();
        if open.by_file.len() >= budget {
            if !open.warned {
                open.warned = true;
                log::warn!(
                    "{budget} mapped files open, half the open-file limit: the frames of \
                     files mapped from now on are named by offset (raise `ulimit -n` to \
                     name them)"
                );
            }
            return None;
        }
        let file = Arc::new(open_mapped_file(pid, entry)?);
        open.by_file.insert(key, Arc::downgrade(&file));
        Some(file)
    }
}

/// How many mapped files the snapshots may keep open: half the open-file limit, so that
/// the rest (BPF maps, programs and links, perf events, /proc reads, the report's files)
/// always has room.
fn mapped_file_budget() -> usize {
    let limit = crate::system::oserror::OpenFileLimit::now(false);
    limit.soft.map_or(usize::MAX, |soft| {
        usize::try_from(soft / 2).unwrap_or(usize::MAX)
    })
}

/// Opens the file behind an executable mapping of `pid`.
fn open_mapped_file(pid: u32, entry: &MapsEntry) -> Option<File> {
    // Exactly the mapped file, in any mount namespace, even deleted; needs
    // CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE), which the tracer has as root.
    let map_file = format!("/proc/{pid}/map_files/{:x}-{:x}", entry.start, entry.end);
    if let Some(file) = open_regular(Path::new(&map_file)) {
        return Some(file);
    }
    let path = entry.path.as_deref()?;
    if entry.deleted {
        return None;
    }
    // The path as the process sees it, in its mount namespace.
    if let Some(file) = open_regular(Path::new(&format!("/proc/{pid}/root{path}"))) {
        return Some(file);
    }
    // Our own view of the path: only trustworthy if it is the same file.
    let file = open_regular(Path::new(path))?;
    (file.metadata().ok()?.ino() == entry.inode).then_some(file)
}

/// Opens a regular file for reading. `O_NONBLOCK` so a FIFO swapped in cannot hang us;
/// anything but a regular file is refused, since blazesym reopens it without that flag.
fn open_regular(path: &Path) -> Option<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    file.metadata().ok()?.is_file().then_some(file)
}

#[cfg(test)]
mod tests {
    use super::super::ProcessMaps;
    use super::*;

    #[test]
    fn snapshots_share_one_descriptor_per_file() {
        let first = ProcessMaps::capture(std::process::id()).unwrap();
        let second = ProcessMaps::capture(std::process::id()).unwrap();
        let mut shared = 0;
        for object in &second.objects {
            let Some(file) = &object.file else {
                continue;
            };
            let same = first
                .objects
                .iter()
                .find(|o| o.dev == object.dev && o.inode == object.inode)
                .and_then(|o| o.file.as_ref());
            assert!(
                same.is_some_and(|same| Arc::ptr_eq(same, file)),
                "{} opened twice",
                object.path
            );
            shared += 1;
        }
        assert!(shared > 0, "no file opened: {:?}", second.objects);
    }
}
