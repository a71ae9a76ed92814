//! USDT sites attached as uprobes, whose links the link keeper holds.
//! The dynamic loader's `_dl_debug_state` is probed the same way, to hold processes as
//! they map objects.
//! Detaching waits for the sites to have their instructions back.

use std::{
    os::fd::{AsFd as _, BorrowedFd},
    path::{Path, PathBuf},
    time::Duration,
};

use aya::maps::{Array, HashMap, Map};
use tracer_common::{UsdtSite, control, map_names, program_names, site_flags};

use super::{Loader, LoaderError, Result, keeper, load::spawn_keeper, os_error, restored, sys};
use crate::system::{oserror, procfs::ProcessError};

/// One uprobe at a USDT site.
#[derive(Debug, Clone)]
pub(crate) struct UsdtAttachment {
    /// The ELF file as this process can open it (via /proc/PID/root for containers).
    pub path: PathBuf,
    /// File offset of the probe instruction.
    pub offset: u64,
    /// File offset of the semaphore, when the probe has one.
    pub semaphore_offset: Option<u64>,
    /// Only this process, or every process mapping the file.
    pub pid: Option<u32>,
    /// A return probe: fires when the function at `offset` returns.
    pub ret: bool,
}

/// How long a detach waits for the sites to have their instructions back.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(2);

impl<Maps> Loader<Maps> {
    /// Describes what a USDT site at BPF cookie `cookie` does when hit.
    fn set_usdt_site(&mut self, cookie: u32, site: &UsdtSite) -> Result<()> {
        let name = map_names::USDT_SPECS;
        let map = self.maps.get_mut(name).ok_or(LoaderError::Missing(name))?;
        let mut specs: Array<_, UsdtSite> =
            Array::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        specs
            .set(cookie, site, 0)
            .map_err(|source| LoaderError::Map { name, source })
    }

    /// Attaches USDT sites: each `(cookie, site, target)` says what the kernel does at
    /// each hit of `target` (`site`, found through `cookie`). Sites that send events get
    /// the program with the argument decoder; the others a lean one. The sites of one
    /// program in one file share a uprobe_multi link: detaching them waits for the
    /// kernel's grace period once, where a perf event per site waits once per site.
    pub(crate) fn attach_usdt_sites(
        &mut self,
        sites: &[(u32, &UsdtSite, &UsdtAttachment)],
    ) -> Result<()> {
        self.attach_more_usdt_sites(sites)?;
        // The warm-up has done its work: the sites are registered.
        if let (Some(warm_up), Some(keeper)) = (self.warm_up.take(), self.keeper.as_mut()) {
            warm_up.release(keeper);
        }
        // Events flow; now the maps the other programs and the readers need.
        self.finish_maps()
    }

    /// Attaches sites found after [`Loader::attach_usdt_sites`] (a library mapped later, a
    /// new process's files), with cookies after those attached already: the arrays must
    /// have been sized for them (see `ProbePlan::room_to_grow`).
    pub(crate) fn attach_more_usdt_sites(
        &mut self,
        sites: &[(u32, &UsdtSite, &UsdtAttachment)],
    ) -> Result<()> {
        let mut groups: Vec<(&'static str, &UsdtAttachment, Vec<sys::MultiUprobe>)> = Vec::new();
        for (cookie, site, target) in sites {
            self.set_usdt_site(*cookie, site)?;
            match target.pid {
                Some(pid) => {
                    self.sites_in_one_process
                        .push((pid, target.path.clone(), target.offset));
                }
                None => self
                    .sites_in_any_process
                    .push((target.path.clone(), target.offset)),
            }
            let program = usdt_program_name(site);
            let uprobe = sys::MultiUprobe {
                offset: target.offset,
                ref_ctr_offset: target.semaphore_offset.unwrap_or(0),
                cookie: u64::from(*cookie),
            };
            match groups.iter_mut().find(|(p, first, _)| {
                *p == program
                    && first.path == target.path
                    && first.pid == target.pid
                    && first.ret == target.ret
            }) {
                Some((_, _, uprobes)) => uprobes.push(uprobe),
                None => groups.push((program, target, vec![uprobe])),
            }
        }
        if self.keeper.is_none() {
            self.keeper = Some(spawn_keeper()?);
        }
        for (program, first, uprobes) in &groups {
            self.usdt_program(program)?;
            // Disjoint fields: the program's fd stays borrowed while the keeper is asked.
            let prog_fd = self.programs.fd(program)?;
            let keeper = self.keeper.as_mut().expect("started above");
            let path = crate::system::procfs::lasting_path(&first.path);
            for chunk in uprobes.chunks(keeper::MAX_UPROBES_PER_LINK) {
                match keeper.link_uprobe_multi(prog_fd, &path, chunk, first.pid, first.ret) {
                    Ok(()) => self.usdt_sites_attached += chunk.len(),
                    // One of a set that exited meanwhile, whose files only it showed us (a
                    // container's): the others are traced still.
                    Err(e) if first.pid.is_none() && gone_with_its_process(&path) => {
                        log::warn!("{}: not attached, its process exited: {e}", path.display());
                    }
                    Err(e) => return Err(attach_error(first, e)),
                }
            }
        }
        Ok(())
    }

    /// Holds the traced processes that run the dynamic loader at `path` each time it has
    /// mapped objects (a uprobe at `_dl_debug_state`, file offset `offset`): the kernel
    /// stops the process and lists it in [`Loader::held`] until [`Loader::release_held`].
    /// For process `pid` only, or every process running that loader (the kernel keeps
    /// the targets').
    pub(crate) fn hold_at_dlopen(
        &mut self,
        path: &Path,
        offset: u64,
        pid: Option<u32>,
    ) -> Result<()> {
        if self.keeper.is_none() {
            self.keeper = Some(spawn_keeper()?);
        }
        let name = program_names::DL_DEBUG_STATE;
        self.usdt_program(name)?;
        let prog_fd = self.programs.fd(name)?;
        let uprobe = sys::MultiUprobe {
            offset,
            ref_ctr_offset: 0,
            cookie: 0,
        };
        let target = UsdtAttachment {
            path: path.to_path_buf(),
            offset,
            semaphore_offset: None,
            pid,
            ret: false,
        };
        match pid {
            Some(pid) => self
                .sites_in_one_process
                .push((pid, path.to_path_buf(), offset)),
            None => self.sites_in_any_process.push((path.to_path_buf(), offset)),
        }
        let keeper = self.keeper.as_mut().expect("started above");
        // Before the first hold can happen: whatever ends the tracer, the keeper
        // continues the processes held.
        if let Some(Map::HashMap(held)) = self.maps.get(map_names::HELD) {
            keeper
                .watch_held(held.fd().as_fd())
                .map_err(LoaderError::Keeper)?;
        }
        keeper
            .link_uprobe_multi(prog_fd, path, &[uprobe], pid, false)
            .map_err(|e| attach_error(&target, e))
    }

    /// The processes whose maps are to be looked at, each with what the kernel did to it
    /// (a [`tracer_common::held`] value): those it stopped at `dlopen` (see
    /// [`Loader::hold_at_dlopen`]), then those it saw map code or start a program (see
    /// [`Loader::watch_code_mappings`]). A process may be listed both ways.
    pub(crate) fn held(&self) -> Vec<(u32, u32)> {
        let mut held = self.held_in(map_names::HELD);
        held.extend(self.held_in(map_names::MAPPED_CODE));
        held
    }

    fn held_in(&self, name: &'static str) -> Vec<(u32, u32)> {
        self.entries::<u32, u32>(name).unwrap_or_default()
    }

    /// Takes the processes the kernel recorded mapping code or starting a program (see
    /// [`Loader::watch_code_mappings`]) off their list: those it stopped stay held.
    pub(crate) fn take_mapped(&mut self) -> Vec<u32> {
        let mapped: Vec<u32> = self
            .held_in(map_names::MAPPED_CODE)
            .into_iter()
            .map(|(pid, _)| pid)
            .collect();
        for &pid in &mapped {
            self.release_held(pid, tracer_common::held::LOOK);
        }
        mapped
    }

    /// Has the kernel stop processes at `dlopen` until `CLOCK_MONOTONIC` second
    /// `until_s` (see [`control::HOLD_UNTIL_S`]).
    pub(crate) fn hold_until(&mut self, until_s: u32) -> Result<()> {
        self.set_control(control::HOLD_UNTIL_S, until_s)
    }

    /// Takes `pid`, listed by [`Loader::held`] with `what`, off that list; the caller
    /// continues a process the kernel stopped.
    pub(crate) fn release_held(&mut self, pid: u32, what: u32) {
        let name = match what {
            tracer_common::held::STOPPED => map_names::HELD,
            _ => map_names::MAPPED_CODE,
        };
        if let Some(map) = self.maps.get_mut(name)
            && let Ok(mut held) = HashMap::<_, u32, u32>::try_from(map)
        {
            let _ = held.remove(&pid);
        }
    }

    /// USDT program `name`, verified by the kernel when first used.
    fn usdt_program(&mut self, name: &'static str) -> Result<BorrowedFd<'_>> {
        self.program_fd(name, None)
    }

    /// How many USDT sites are attached.
    pub(crate) fn usdt_site_count(&self) -> usize {
        self.usdt_sites_attached
    }

    /// Detaches every USDT probe now (semaphores drop back), keeping the maps readable.
    /// The keeper does the removal, so a SIGKILL arriving meanwhile cannot interrupt it.
    pub(crate) fn detach_usdt(&mut self) -> Result<()> {
        self.usdt_sites_attached = 0;
        if let Some(keeper) = self.keeper.as_mut() {
            keeper.release_all().map_err(LoaderError::Keeper)?;
        }
        // The kernel's workers remove the uprobes within a grace period or so: the
        // detach is over once the target has its instructions back.
        let mut sites = std::mem::take(&mut self.sites_in_one_process);
        let set_wide = std::mem::take(&mut self.sites_in_any_process);
        if !set_wide.is_empty() {
            // Every process mapping the file had the breakpoints: the targets are those
            // whose instructions matter.
            let members = self.targets_map().map(|t| t.running_pids());
            for pid in members.unwrap_or_default() {
                sites.extend(
                    set_wide
                        .iter()
                        .map(|(path, offset)| (pid, path.clone(), *offset)),
                );
            }
        }
        let waiting = std::time::Instant::now();
        restored::wait(&sites, RESTORE_TIMEOUT);
        log::debug!("the sites were restored after {:?}", waiting.elapsed());
        Ok(())
    }

    /// The process holding the USDT links, once started.
    pub(crate) fn keeper_pid(&self) -> Option<u32> {
        self.keeper.as_ref().map(keeper::LinkKeeper::pid)
    }
}

/// The program for USDT site `site`.
fn usdt_program_name(site: &UsdtSite) -> &'static str {
    let task_switch = site_flags::TASK_RUN
        | site_flags::TASK_PAUSE
        | site_flags::TASK_FINISH
        | site_flags::TASK_NAME;
    let stacks = site.flags & (site_flags::STACKS | site_flags::STACK_SNAPSHOT) != 0;
    if site.flags & site_flags::EMIT_EVENT == 0 {
        if site.flags & task_switch != 0 {
            program_names::USDT_TASK
        } else if stacks {
            program_names::USDT_STACKS
        } else if site.latency_begin_count as usize <= tracer_common::FEW_LATENCIES_PER_PROBE
            && site.latency_end_count as usize <= tracer_common::FEW_LATENCIES_PER_PROBE
        {
            program_names::USDT_FEW
        } else {
            program_names::USDT
        }
    } else if site.str_count > 0 {
        program_names::USDT_EVENT_STR
    } else if stacks {
        program_names::USDT_EVENT_STACKS
    } else if site.arg_count as usize <= tracer_common::FEW_USDT_ARGS {
        program_names::USDT_EVENT_FEW
    } else {
        program_names::USDT_EVENT
    }
}

/// What a failure to attach to `target` means for the user.
fn attach_error(target: &UsdtAttachment, source: std::io::Error) -> LoaderError {
    if let Some(gone) = target.pid.and_then(ProcessError::check_target) {
        return gone.into();
    }
    match oserror::cause(&source) {
        Some(oserror::Cause::NotPermitted) => LoaderError::UprobeNotPermitted {
            path: target.path.clone(),
        },
        Some(oserror::Cause::TooManyOpenFiles { .. }) => os_error(
            format!("attaching uprobes to {}", target.path.display()),
            source,
        ),
        None => LoaderError::AttachUprobe {
            path: target.path.clone(),
            offset: target.offset,
            pid: target.pid,
            source,
        },
    }
}

/// Whether `path` goes through `/proc/PID/` of a process that no longer exists.
fn gone_with_its_process(path: &Path) -> bool {
    let mut parts = path.components().skip(1);
    let pid = match (parts.next(), parts.next()) {
        (Some(proc), Some(pid)) if proc.as_os_str() == "proc" => pid.as_os_str().to_str(),
        _ => None,
    };
    pid.and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|pid| ProcessError::check(pid).is_some())
}
