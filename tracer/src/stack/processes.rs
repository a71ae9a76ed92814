//! The processes a profile has seen: their names and mappings, captured while they run so
//! their stacks can be named after they exit, and their threads' names.

use std::{collections::HashMap, io, path::Path};

use crate::{
    stack::symbolize::ProcessMaps,
    system::procfs::{self, ThreadNames},
};

fn read_name(path: &str) -> io::Result<String> {
    procfs::read_name(Path::new(path))
}

/// What we know of one profiled process: its name and its mappings (`None` once it
/// exited before we could read them: its user stacks stay unnamed).
#[derive(Debug)]
pub struct ProcessInfo {
    /// Its title if it gave itself one (`postgres: walwriter`), else its program's name.
    pub name: String,
    /// The name of the program it runs (its `comm`: `postgres`).
    pub program: String,
    pub maps: Option<ProcessMaps>,
    /// Its PID in its own PID namespace, when that is below ours (a container's).
    pub namespace_pid: Option<u32>,
    /// Refreshes left in which to look for a title it gives itself (see
    /// [`procfs::process_title`]): a server's worker sets it just after its fork.
    title_tries: u8,
}

/// How many refreshes (about a second apart) look for a process's title.
const TITLE_TRIES: u8 = 5;

/// A process's name: its title if it gave itself one, else its `comm`.
fn name_of(tgid: u32, comm: String) -> (String, u8) {
    match procfs::process_title(tgid, &comm) {
        Some(title) => (title, 0),
        None => (comm, TITLE_TRIES),
    }
}

/// The processes seen in the profile, captured while they run so their stacks can be
/// named after they exit.
#[derive(Debug, Default)]
pub struct Processes {
    processes: HashMap<u32, ProcessInfo>,
    threads: ThreadNames,
    /// The kernel tells of the mappings made since the start ([`Processes::refresh_maps`]
    /// follows it): [`Processes::refresh`] reads no maps.
    maps_told: bool,
}

impl Processes {
    /// From now on the caller refreshes a process's mappings when the kernel tells it
    /// mapped code ([`Processes::refresh_maps`]), and [`Processes::refresh`] reads none.
    pub fn maps_told_by_kernel(&mut self) {
        self.maps_told = true;
    }

    /// Whether the caller refreshes mappings as the kernel tells of them.
    pub fn maps_told(&self) -> bool {
        self.maps_told
    }

    /// Captures `tgid`'s name, mappings and thread names unless already known.
    pub fn observe(&mut self, tgid: u32) {
        self.observe_named(tgid, None);
    }

    /// [`Processes::observe`], with the name to give it if it already exited (as the
    /// kernel recorded it).
    pub fn observe_named(&mut self, tgid: u32, known_name: Option<&str>) {
        if let Some(info) = self.processes.get_mut(&tgid) {
            // Seen first after it exited (through a late stack snapshot, or as a fork
            // given its parent's mappings): now it has a name.
            if let Some(name) = known_name.filter(|n| !n.is_empty())
                && info.name.starts_with("[pid ")
            {
                info.name = name.to_string();
                info.program = name.to_string();
            }
            return;
        }
        let (program, (name, title_tries)) = match read_name(&format!("/proc/{tgid}/comm")) {
            Ok(comm) => (comm.clone(), name_of(tgid, comm)),
            Err(_) => match known_name {
                Some(name) if !name.is_empty() => (name.to_string(), (name.to_string(), 0)),
                _ => (format!("[pid {tgid}]"), (format!("[pid {tgid}]"), 0)),
            },
        };
        let maps = ProcessMaps::capture(tgid).ok();
        self.threads.refresh(tgid);
        let namespace_pid = procfs::namespace_pid(tgid);
        self.processes.insert(
            tgid,
            ProcessInfo {
                name,
                program,
                maps,
                namespace_pid,
                title_tries,
            },
        );
    }

    /// [`Processes::observe`] for a process forked from `parent` that has not executed
    /// another program since: gone already (a short-lived worker), or seen first once
    /// gone, its stacks are named from its parent's mappings, of which its own were a
    /// copy.
    pub fn observe_fork(&mut self, tgid: u32, parent: u32) {
        if !self.lacks_maps(tgid) {
            return;
        }
        self.observe(tgid);
        let parent_names = self
            .processes
            .get(&parent)
            .map(|p| (p.name.clone(), p.program.clone()));
        let parent_maps = match self.processes.get(&parent).and_then(|p| p.maps.as_ref()) {
            Some(maps) => Some(maps.inherited_by(tgid)),
            None => ProcessMaps::capture(parent).ok(),
        };
        if let Some(info) = self.processes.get_mut(&tgid)
            && info.maps.is_none()
        {
            info.maps = parent_maps;
            if let Some((name, program)) = parent_names.filter(|_| info.name.starts_with("[pid ")) {
                info.name = name;
                info.program = program;
            }
        }
    }

    /// Whether `tgid` is unknown, or known without mappings to name its stacks by.
    pub fn lacks_maps(&self, tgid: u32) -> bool {
        self.processes.get(&tgid).is_none_or(|p| p.maps.is_none())
    }

    /// Captures the target `tgid` (its name, mappings and thread names), failing with
    /// what kept them from being read.
    pub fn observe_target(&mut self, tgid: u32) -> io::Result<&ProcessInfo> {
        let maps = ProcessMaps::capture(tgid)?;
        let program = read_name(&format!("/proc/{tgid}/comm"))?;
        let (name, title_tries) = name_of(tgid, program.clone());
        self.threads.refresh(tgid);
        let info = ProcessInfo {
            name,
            program,
            maps: Some(maps),
            namespace_pid: procfs::namespace_pid(tgid),
            title_tries,
        };
        Ok(self.processes.entry(tgid).insert_entry(info).into_mut())
    }

    /// Re-reads the mappings of process `tgid`, if known and still running: it has just
    /// mapped a library, whose frames its samples from now on need.
    pub fn refresh_maps(&mut self, tgid: u32) {
        if let Some(maps) = self.processes.get_mut(&tgid).and_then(|p| p.maps.as_mut()) {
            let _ = maps.refresh();
        }
    }

    /// Re-reads the mappings (unless the kernel tells of new ones) and thread names of
    /// every known process still running, and the title of those young enough to be
    /// still giving themselves one. A process found
    /// gone is marked so by its mappings ([`ProcessMaps::has_exited`]): it is not read
    /// again, and keeps only what naming its stacks needs.
    pub fn refresh(&mut self) {
        for (&tgid, info) in &mut self.processes {
            if let Some(maps) = &mut info.maps
                && match self.maps_told {
                    true => maps.refresh_jit(),
                    false => maps.refresh(),
                }
                .is_ok()
            {
                self.threads.refresh(tgid);
                if info.title_tries > 0 {
                    info.title_tries -= 1;
                    if let Some(title) = procfs::process_title(tgid, &info.name) {
                        info.name = title;
                        info.title_tries = 0;
                    }
                }
            }
        }
    }

    /// Names the threads started since the last look, in every known process still
    /// running (a thread that lives less than a second would otherwise go unnamed).
    pub fn name_new_threads(&mut self) {
        for (&tgid, info) in &self.processes {
            if info.maps.as_ref().is_some_and(|maps| !maps.has_exited()) {
                self.threads.add_new(tgid);
            }
        }
    }

    /// Forgets processes `tgids` and their threads `tids`: let go (see
    /// [`crate::profile::retire`]), nothing names their stacks any more.
    pub fn forget(
        &mut self,
        tgids: &std::collections::HashSet<u32>,
        tids: &std::collections::HashSet<u32>,
    ) {
        self.processes.retain(|tgid, _| !tgids.contains(tgid));
        self.threads.forget(tids);
        // A process's main thread has its PID, sampled or not.
        self.threads.forget(tgids);
    }

    pub fn get(&self, tgid: u32) -> Option<&ProcessInfo> {
        self.processes.get(&tgid)
    }

    /// Every process seen, by tgid.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &ProcessInfo)> {
        self.processes.iter().map(|(&tgid, info)| (tgid, info))
    }

    pub fn len(&self) -> usize {
        self.processes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
    }

    pub fn thread_name(&self, tid: u32) -> Option<&str> {
        self.threads.get(tid)
    }
}
