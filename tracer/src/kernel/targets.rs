//! The `TARGETS` map from user space: the processes traced when there can be more than
//! one (see `tracer::targets` and the eBPF `targets` module, which adds the processes
//! they fork or that start the `--exe` file).

use std::{
    io,
    os::{fd::AsFd as _, unix::fs::MetadataExt as _},
    path::Path,
};

use aya::maps::{HashMap, MapData};
use tracer_common::{TargetProcess, map_names};

use super::{LoaderError, Result, process_start_ticks};

/// Whether target `pid` still runs: the same PID, started at the same time. One whose
/// start time cannot be read for a reason of the tracer's own (out of file descriptors,
/// say) counts as running: only /proc saying it is gone ends it.
fn is_running(pid: u32, target: &TargetProcess) -> bool {
    match process_start_ticks(pid) {
        Ok(ticks) => target.start_ticks == 0 || ticks == target.start_ticks,
        Err(LoaderError::Process(_)) => false,
        Err(_) => true,
    }
}

/// The name a target had when it joined.
fn name_of(target: &TargetProcess) -> String {
    let len = target.comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&target.comm[..len]).into_owned()
}

/// The kernel's process name length, terminating zero included (`TASK_COMM_LEN`).
pub(crate) const COMM_LEN: usize = 16;

/// A file by identity: the device (as the kernel numbers it, `MKDEV`) and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    pub(crate) fn of(path: &Path) -> io::Result<Self> {
        let meta = std::fs::metadata(path)?;
        Ok(Self {
            dev: kernel_dev(meta.dev()),
            ino: meta.ino(),
        })
    }
}

/// The kernel's internal device number (`MKDEV(major, minor)`: 12 bits of major above
/// 20 of minor) of a device number as `stat` gives it.
fn kernel_dev(dev: u64) -> u64 {
    let major = u64::from(libc::major(dev));
    let minor = u64::from(libc::minor(dev));
    (major << 20) | minor
}

/// A process found to match, and how the kernel treats it (bits of
/// [`tracer_common::target_flags`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Member {
    pub pid: u32,
    pub flags: u32,
}

/// What the kernel needs to follow a set of targets (`crate::target::TargetSpec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KernelTargets {
    /// The processes traced from the start.
    pub members: Vec<Member>,
    /// Set when the processes the targets fork join them.
    pub follow_forks: bool,
    /// A process that executes this file joins (`--exe`).
    pub exe: Option<FileId>,
    /// A process that executes under this name joins (`--comm`).
    pub comm: Option<[u8; COMM_LEN]>,
    /// The one process, when nothing can join it: compared, not looked up.
    pub single: Option<u32>,
}

/// A handle on the kernel's set of target processes.
pub(crate) struct TargetsMap {
    map: HashMap<MapData, u32, TargetProcess>,
}

impl TargetsMap {
    /// A handle on the same kernel map as `map` (its own file descriptor).
    pub(super) fn from_map(map: &MapData) -> Result<Self> {
        let name = map_names::TARGETS;
        let fd = map
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| super::os_error("duplicating the TARGETS map", e))?;
        let data = MapData::from_fd(fd).map_err(|source| LoaderError::Map { name, source })?;
        let map = HashMap::try_from(aya::maps::Map::HashMap(data))
            .map_err(|source| LoaderError::Map { name, source })?;
        Ok(Self { map })
    }

    /// Adds processes with `flags`, each with its start time; one that exited meanwhile
    /// is left out (there is nothing left of it to trace).
    pub(crate) fn add_members(&mut self, members: &[Member]) -> Result<()> {
        let name = map_names::TARGETS;
        for member in members {
            let Ok(start_ticks) = process_start_ticks(member.pid) else {
                continue;
            };
            let mut comm = [0; 16];
            let path = format!("/proc/{}/comm", member.pid);
            if let Ok(name) = crate::system::procfs::read_name(std::path::Path::new(&path)) {
                let len = name.len().min(15);
                comm[..len].copy_from_slice(&name.as_bytes()[..len]);
            }
            let target = TargetProcess {
                start_ticks,
                flags: member.flags,
                forked_from: 0,
                comm,
            };
            self.map
                .insert(&member.pid, &target, 0)
                .map_err(|source| LoaderError::Map { name, source })?;
        }
        Ok(())
    }

    /// [`TargetsMap::add_members`] with the same flags for each; errors are logged (the
    /// processes are then not traced, which the caller cannot mend either).
    pub(crate) fn add(&mut self, pids: &[u32], flags: u32) {
        let members: Vec<Member> = pids.iter().map(|&pid| Member { pid, flags }).collect();
        if let Err(e) = self.add_members(&members) {
            log::warn!("cannot add processes to the targets: {e}");
        }
    }

    /// The process `pid` forked from, while it runs a copy of that one's program (see
    /// `TargetProcess::forked_from`).
    pub(crate) fn forked_from(&self, pid: u32) -> Option<u32> {
        self.map
            .get(&pid, 0)
            .ok()
            .map(|target| target.forked_from)
            .filter(|&parent| parent != 0)
    }

    /// Every entry of the map: in batches where the kernel can, else key by key.
    fn all(&self) -> Vec<(u32, TargetProcess)> {
        use aya::maps::IterableMap as _;
        super::sys::hash_entries(self.map.map().fd().as_fd())
            .unwrap_or_else(|_| self.map.iter().flatten().collect())
    }

    /// Every process in the set as the kernel keeps it (some may have exited).
    pub(crate) fn entries(&self) -> Vec<(u32, TargetProcess)> {
        self.all()
    }

    /// The processes traced now (as the kernel knows them: some may have exited).
    pub(crate) fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.all().into_iter().map(|(pid, _)| pid).collect();
        pids.sort_unstable();
        pids
    }

    /// The processes in the set forked from a target that have not executed another
    /// program since, each with that parent.
    pub(crate) fn forks(&self) -> Vec<(u32, u32)> {
        self.all()
            .into_iter()
            .filter(|(_, target)| target.forked_from != 0)
            .map(|(pid, target)| (pid, target.forked_from))
            .collect()
    }

    /// Every process in the set, with the name it had when it joined.
    pub(crate) fn named(&self) -> Vec<(u32, String)> {
        let mut named: Vec<(u32, String)> = self
            .all()
            .into_iter()
            .map(|(pid, target)| (pid, name_of(&target)))
            .collect();
        named.sort();
        named
    }

    /// The processes in the set that still run (not those gone, nor another process that
    /// took the PID of one).
    pub(crate) fn running_pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .all()
            .into_iter()
            .filter(|(pid, target)| is_running(*pid, target))
            .map(|(pid, _)| pid)
            .collect();
        pids.sort_unstable();
        pids
    }

    /// Whether any target is still running.
    pub(crate) fn any_alive(&self) -> bool {
        self.all()
            .into_iter()
            .any(|(pid, target)| is_running(pid, &target))
    }

    /// The processes of the set that no longer run, each with the name it had.
    pub(crate) fn exited(&self) -> Vec<(u32, String)> {
        self.all()
            .into_iter()
            .filter(|(pid, target)| !is_running(*pid, target))
            .map(|(pid, target)| (pid, name_of(&target)))
            .collect()
    }

    /// Takes `pids` out of the set: the kernel traces them no more.
    pub(crate) fn remove(&mut self, pids: &[u32]) {
        for pid in pids {
            let _ = self.map.remove(pid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_device_number_is_major_above_minor() {
        let dev = libc::makedev(8, 3);
        assert_eq!(kernel_dev(dev), (8 << 20) | 3);
        let big = libc::makedev(259, 300);
        assert_eq!(kernel_dev(big), (259 << 20) + 300);
    }
}
