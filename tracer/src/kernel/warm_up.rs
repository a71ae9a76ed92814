//! The uprobe warm-up: uprobes registered in tracer's own code before the programs load.
//! They make the first USDT attach find the kernel's wait for a grace period over or
//! under way.
//! The link keeper closes them once the sites are attached.

use std::{os::fd::OwnedFd, path::PathBuf};

use super::{Loader, keeper, sys};

impl Loader {
    /// Registers a uprobe in tracer's own code on a thread of its own, before the programs
    /// are loaded: the first uprobe registered waits for an RCU grace period (8-16 ms
    /// here), and uprobes registered within a grace period of another do not, so
    /// [`Loader::attach_usdt_sites`] finds that wait over or under way instead of starting
    /// it. Start it before [`Loader::load`]. The target never sees this uprobe (it is in a
    /// function of ours that is never called); its failure only loses the head start.
    ///
    /// It is opened for every process, on one CPU, not for this process: the first perf
    /// event bound to a task (after a second with none in the system) waits for another
    /// grace period before its uprobe is even registered, while the kernel switches its
    /// scheduler hooks on (`perf_sched_events`): 25-50 ms to the first event instead of
    /// 6-18 ms.
    pub fn warm_up_uprobes() -> UprobeWarmUp {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let opened = std::thread::spawn(move || {
            let site = own_code_site(warm_up_site as *const () as usize as u64)?;
            let pmu_type = sys::uprobe_pmu_type().ok()?;
            let target = sys::UprobeTarget {
                path: &site.0,
                offset: site.1,
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

/// Where [`Loader::warm_up_uprobes`] places its uprobe; never called.
#[inline(never)]
extern "C" fn warm_up_site() {
    std::hint::black_box(());
}

/// The file and file offset of `address` in this executable's own code, from its program
/// headers as loaded: no file is read (/proc/self/maps takes the memory map lock that the
/// launch's other threads take as they allocate), as this is the first thing a launch
/// does and the one it waits for.
fn own_code_site(address: u64) -> Option<(PathBuf, u64)> {
    struct Search {
        address: u64,
        offset: Option<u64>,
    }
    /// Called for each loaded object, the executable first: searches that one only.
    unsafe extern "C" fn search_executable(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `Search` passed below, and `info` the loader's record of a
        // loaded object, valid during this call, with `dlpi_phnum` program headers.
        let (search, info) = unsafe { (&mut *data.cast::<Search>(), &*info) };
        let headers = match info.dlpi_phdr.is_null() {
            true => &[][..],
            // SAFETY: as above.
            false => unsafe {
                std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum))
            },
        };
        let relative = search.address.wrapping_sub(info.dlpi_addr);
        search.offset = headers
            .iter()
            .find(|h| {
                h.p_type == libc::PT_LOAD
                    && h.p_flags & libc::PF_X != 0
                    && (h.p_vaddr..h.p_vaddr + h.p_memsz).contains(&relative)
            })
            .map(|h| relative - h.p_vaddr + h.p_offset);
        1
    }
    let mut search = Search {
        address,
        offset: None,
    };
    // SAFETY: the callback only reads the records it is given and writes `search`, which
    // outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(search_executable), (&mut search as *mut Search).cast()) };
    // The kernel resolves this path in the calling thread's context: our executable.
    Some((PathBuf::from("/proc/self/exe"), search.offset?))
}

/// The uprobes opened by [`Loader::warm_up_uprobes`].
pub struct UprobeWarmUp {
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
    /// nothing should wait for, and a SIGKILL reaching the tracer while it removes one
    /// would leave it registered for good. One the keeper could not take is closed here.
    pub(super) fn release(mut self, keeper: &mut keeper::LinkKeeper) {
        keeper::close_side_by_side(keeper.close_for_us(self.take()));
    }
}

impl Drop for UprobeWarmUp {
    /// A launch that ended before attaching closes them here, side by side, before the
    /// tracer exits: a thread still removing one when the process exits is killed
    /// mid-removal, and the uprobe stays registered.
    fn drop(&mut self) {
        keeper::close_side_by_side(self.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_code_site_is_where_the_memory_maps_place_it() {
        let address = warm_up_site as *const () as usize as u64;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let (path, offset) = crate::system::procfs::parse_maps(&maps)
            .into_iter()
            .find(|e| e.start <= address && address < e.end && e.is_executable())
            .map(|e| (e.path.unwrap(), address - e.start + e.offset))
            .unwrap();
        let (site, site_offset) = own_code_site(address).unwrap();
        assert_eq!(site_offset, offset);
        assert_eq!(std::fs::canonicalize(site).unwrap(), PathBuf::from(path));
    }
}
