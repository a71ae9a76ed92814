//! The uprobe warm-up: uprobes registered in a file of no process before the programs load.
//! They make the first USDT attach find the kernel's wait for a grace period over or
//! under way.
//! The link keeper closes them once the sites are attached.

use std::{os::fd::OwnedFd, path::PathBuf};

use super::{Loader, keeper, sys};

impl<Maps> Loader<Maps> {
    /// Registers a uprobe on a thread of its own, before the programs are loaded: the
    /// first uprobe registered waits for an RCU grace period, and uprobes registered
    /// within a grace period of another do not, so [`Loader::attach_usdt_sites`] finds that
    /// wait over or under way instead of starting it. A [`super::Launch`] starts it.
    /// Its failure only loses the head start.
    ///
    /// It is opened for every process, on one CPU, not for this process: the first perf
    /// event bound to a task (after a second with none in the system) waits for another
    /// grace period before its uprobe is even registered, while the kernel switches its
    /// scheduler hooks on (`perf_sched_events`).
    pub(super) fn warm_up_uprobes() -> UprobeWarmUp {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let opened = std::thread::spawn(move || {
            let site = UnmappedSite::create()?;
            let pmu_type = sys::uprobe_pmu_type().ok()?;
            let path = site.path();
            let target = sys::UprobeTarget {
                path: &path,
                offset: 0,
                ref_ctr_offset: None,
                pid: None,
            };
            let open = || sys::open_uprobe(pmu_type, &target).ok();
            let mut opened = vec![open()?];
            // The kernel skips the wait for registrations until a grace period passes
            // with none (the lock's `rcu_sync`): one more every few milliseconds keeps
            // that from happening before the launch registers its own, however long the
            // programs take to verify.
            while opened.len() < WARM_UP_MAX_UPROBES {
                match released.recv_timeout(WARM_UP_PERIOD) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => opened.extend(open()),
                    _ => break,
                }
            }
            Some(opened)
        });
        UprobeWarmUp {
            opening: Some((opened, release)),
        }
    }
}

/// A file no process maps, for the warm-up uprobes: an anonymous memory file.
///
/// Removing a uprobe restores the instruction in every process that maps its file, and
/// the kernel gives up on that when the task removing it has a fatal signal pending: a
/// tracer killed with its uprobes open would leave them registered for good ("failed to
/// unregister, leaking uprobe") in every other process running its file. Nothing maps
/// this one, so its uprobes are removed whoever closes them and however they die.
struct UnmappedSite {
    file: std::fs::File,
}

impl UnmappedSite {
    /// The file, holding a few no-op instructions (a uprobe's offset must be within it).
    fn create() -> Option<Self> {
        use std::io::Write as _;
        // SAFETY: the name is a NUL-terminated string; the call has no other input.
        let fd = unsafe { libc::memfd_create(c"tracer-warm-up".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        file.write_all(&[NOP; 16]).ok()?;
        Some(Self { file })
    }

    /// The path the kernel resolves to the file, in this process.
    fn path(&self) -> PathBuf {
        use std::os::fd::AsRawFd as _;
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// x86's one-byte no-op.
const NOP: u8 = 0x90;

/// The uprobes opened by [`Loader::warm_up_uprobes`].
pub(super) struct UprobeWarmUp {
    /// The thread opening them, and what stops it when dropped.
    opening: Option<(WarmUpThread, std::sync::mpsc::Sender<()>)>,
}

/// The thread that opens the warm-up uprobes, and returns them.
type WarmUpThread = std::thread::JoinHandle<Option<Vec<OwnedFd>>>;

/// How often, and at most how many times, [`Loader::warm_up_uprobes`] registers one more
/// uprobe: well within a grace period (4 ms ticks here; one takes two or more), for about
/// 20 ms after the first, which covers a launch whose programs verify slowly. Not longer:
/// each uprobe costs a removal that waits for grace periods, one after another (a third of
/// a second each under load, seen on a busy PostgreSQL), and a tracer stopped before they
/// are all removed waits for them on its way out. A launch slower than that pays one
/// grace period more at its attach.
const WARM_UP_PERIOD: std::time::Duration = std::time::Duration::from_millis(3);
const WARM_UP_MAX_UPROBES: usize = 8;

impl UprobeWarmUp {
    /// Stops opening more, and the uprobes opened (waits a warm-up period at most).
    fn take(&mut self) -> Vec<OwnedFd> {
        let Some((opened, stop)) = self.opening.take() else {
            return Vec::new();
        };
        drop(stop);
        opened.join().ok().flatten().unwrap_or_default()
    }

    /// Hands the warm-up uprobes to the keeper, which closes them on threads of its own:
    /// removing a uprobe waits for grace periods (RCU tasks trace, then SRCU), which
    /// nothing should wait for. One the keeper could not take is closed here.
    pub(super) fn release(mut self, keeper: &mut keeper::LinkKeeper) {
        keeper::close_side_by_side(keeper.close_for_us(self.take()));
    }
}

impl Drop for UprobeWarmUp {
    /// A launch that ended before attaching closes them here, side by side, so that their
    /// grace periods pass together.
    fn drop(&mut self) {
        keeper::close_side_by_side(self.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_up_site_is_a_file_no_process_maps() {
        let site = UnmappedSite::create().unwrap();
        let path = site.path();
        let metadata = std::fs::metadata(&path).unwrap();
        assert!(metadata.is_file() && metadata.len() > 0, "{metadata:?}");
        // Not even this process, which created it.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(!maps.contains("tracer-warm-up"), "{maps}");
    }
}
