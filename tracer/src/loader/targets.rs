//! The `TARGETS` map from user space: the processes traced when there can be more than
//! one (see `tracer::targets` and the eBPF `targets` module, which adds the processes
//! they fork or that start the `--exe` file).

use std::os::fd::AsFd as _;

use aya::maps::{HashMap, MapData};
use tracer_common::{TargetProcess, map_names};

use super::{LoaderError, Result, process_start_ticks};
use crate::targets::Member;

/// A handle on the kernel's set of target processes.
pub struct TargetsMap {
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
    pub fn add_members(&mut self, members: &[Member]) -> Result<()> {
        let name = map_names::TARGETS;
        for member in members {
            let Ok(start_ticks) = process_start_ticks(member.pid) else {
                continue;
            };
            let mut comm = [0; 16];
            let path = format!("/proc/{}/comm", member.pid);
            if let Ok(name) = crate::procfs::read_name(std::path::Path::new(&path)) {
                let len = name.len().min(15);
                comm[..len].copy_from_slice(&name.as_bytes()[..len]);
            }
            let target = TargetProcess {
                start_ticks,
                flags: member.flags,
                _pad: 0,
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
    pub fn add(&mut self, pids: &[u32], flags: u32) {
        let members: Vec<Member> = pids.iter().map(|&pid| Member { pid, flags }).collect();
        if let Err(e) = self.add_members(&members) {
            log::warn!("cannot add processes to the targets: {e}");
        }
    }

    /// The processes traced now (as the kernel knows them: some may have exited).
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.map.keys().flatten().collect();
        pids.sort_unstable();
        pids
    }

    /// Every process traced now or before, with the name it had when it joined.
    pub fn named(&self) -> Vec<(u32, String)> {
        let mut named: Vec<(u32, String)> = self
            .map
            .iter()
            .flatten()
            .map(|(pid, target)| {
                let len = target.comm.iter().position(|&b| b == 0).unwrap_or(16);
                (
                    pid,
                    String::from_utf8_lossy(&target.comm[..len]).into_owned(),
                )
            })
            .collect();
        named.sort();
        named
    }

    /// Whether any target is still running: the same PID, started at the same time.
    pub fn any_alive(&self) -> bool {
        self.map.iter().flatten().any(|(pid, target)| {
            process_start_ticks(pid)
                .is_ok_and(|t| target.start_ticks == 0 || t == target.start_ticks)
        })
    }
}
