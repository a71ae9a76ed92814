//! The programs that run outside USDT sites: on the scheduler's tracepoints, on CPU
//! clocks, and as a task iterator.
//! Each attachment is an [`Attachment`] that detaches its program when dropped.
//! What the kernel reports about the programs loaded is read here too.

use std::os::fd::{AsFd as _, OwnedFd};

use tracer_common::{ThreadRegs, program_names};

use super::{DiagnosticsReader, Loader, LoaderError, Result, diagnostics, os_error, sys};

/// A program attached: dropping it detaches the program and closes the perf event it runs
/// on, if any.
struct Link {
    _link: OwnedFd,
    _perf_event: Option<OwnedFd>,
}

/// A program attached to the scheduler, to CPU clocks or to a process tracepoint: it runs
/// until this is dropped (or [`Attachment::detach`]ed); the maps stay readable after.
#[must_use = "dropping an Attachment detaches its program at once"]
pub(crate) struct Attachment {
    links: Vec<Link>,
}

impl Attachment {
    /// Where the program is attached: one per CPU for samplers, else one.
    pub(crate) fn points(&self) -> usize {
        self.links.len()
    }

    /// Detaches the program now.
    pub(crate) fn detach(self) {}
}

/// How the kernel takes user stacks where a program captures them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UserStacks {
    /// Walked by frame pointers in the kernel (a stack id in `STACKS`).
    FramePointers,
    /// Registers and stack bytes sent as snapshots for DWARF unwinding in user space, to
    /// be read from [`Loader::take_unwind_samples`]; load with `Settings::unwind_ring_bytes`
    /// set (and `Features::offcpu_snapshots` for off-CPU accounting).
    Snapshots,
    /// Snapshots that also carry the Python frames of the threads of the Python
    /// processes registered ([`Loader::add_python_process`]). The kernel takes longer to
    /// verify these programs, so they are loaded only once there is such a process.
    PythonSnapshots,
}

impl<Maps> Loader<Maps> {
    /// Stops adding the processes that fork from targets or start the `--exe` file.
    pub(crate) fn detach_targets(&mut self) {
        self.target_tracking.clear();
    }

    /// Has the kernel record in `HELD` (see [`Loader::held`]) each traced process that
    /// maps part of a file executable or starts a program: what tells of objects mapped
    /// since the start without reading every process's maps. An error when the kernel's
    /// tracepoints cannot be reached (no tracefs, none could be mounted).
    pub(crate) fn watch_code_mappings(&mut self) -> Result<()> {
        for (name, category, tracepoint) in [
            (program_names::CODE_MAPPED, "syscalls", "sys_exit_mmap"),
            (
                program_names::PROGRAM_STARTED,
                "sched",
                "sched_process_exec",
            ),
        ] {
            let attachment = self.attach_tracepoint(name, category, tracepoint)?;
            self.mapping_watch.push(attachment);
        }
        Ok(())
    }

    /// Attaches tracepoint program `name` to `category:tracepoint`.
    fn attach_tracepoint(
        &mut self,
        name: &'static str,
        category: &str,
        tracepoint: &str,
    ) -> Result<Attachment> {
        let what = || format!("attaching {name} to {category}:{tracepoint}");
        let id =
            super::tracefs::tracepoint_id(category, tracepoint).map_err(|e| os_error(what(), e))?;
        let perf_event = sys::open_tracepoint(id).map_err(|e| os_error(what(), e))?;
        let program = self.program_fd(name, None)?;
        let link = sys::link_perf_event(program, perf_event.as_fd(), 0)
            .map_err(|e| os_error(what(), e))?;
        Ok(Attachment {
            links: vec![Link {
                _link: link,
                _perf_event: Some(perf_event),
            }],
        })
    }

    /// Attaches BTF tracepoint program `name` to `tracepoint` (BTF type id `btf_id`).
    pub(super) fn attach_btf_tracepoint(
        &mut self,
        name: &'static str,
        tracepoint: &str,
        btf_id: u32,
    ) -> Result<Attachment> {
        let program = self.program_fd(name, Some(btf_id))?;
        let link = sys::attach_btf_tracepoint(program)
            .map_err(|e| os_error(format!("attaching {name} to {tracepoint}"), e))?;
        Ok(Attachment {
            links: vec![Link {
                _link: link,
                _perf_event: None,
            }],
        })
    }

    /// With `--bpf-debug`, starts showing the diagnostics of the programs attached so far
    /// (call it once every program is attached), naming probe N `probe_names[N]`; `None`
    /// when off or when none logs.
    pub(crate) fn start_diagnostics(&self, probe_names: &[String]) -> Option<DiagnosticsReader> {
        if diagnostics::level() == 0 {
            return None;
        }
        self.programs
            .loaded()
            .filter_map(|prog| sys::program_id(prog).ok())
            .find_map(|id| DiagnosticsReader::start(id, probe_names))
    }

    /// The programs the kernel skipped at least once because they were already running on
    /// that CPU, with how many times: every skip is an event not seen.
    pub(crate) fn program_misses(&self) -> Vec<(&'static str, u64)> {
        let mut misses: Vec<(&'static str, u64)> = self
            .programs
            .loaded_by_name()
            .filter_map(|(name, prog)| Some((name, sys::program_misses(prog).ok()?)))
            .filter(|(_, misses)| *misses > 0)
            .collect();
        misses.sort_unstable();
        misses
    }

    /// Attaches off-CPU accounting to the scheduler's `sched_switch` BTF tracepoint, the
    /// user stacks where threads block taken as `stacks` says (with snapshots, their ids
    /// stand in for stack ids).
    pub(crate) fn attach_offcpu(&mut self, stacks: UserStacks) -> Result<Attachment> {
        let name = match stacks {
            UserStacks::FramePointers => program_names::SCHED_SWITCH,
            UserStacks::Snapshots => program_names::SCHED_SWITCH_DWARF,
            UserStacks::PythonSnapshots => program_names::SCHED_SWITCH_DWARF_PYTHON,
        };
        self.finish_maps()?;
        let btf_id = self
            .sched_switch_btf_id
            .ok_or(LoaderError::Missing("btf_trace_sched_switch"))?;
        self.attach_btf_tracepoint(name, "sched_switch", btf_id)
    }

    /// The user registers every thread of process `tgid` last entered the kernel with,
    /// as saved at the top of its kernel stack (the frame pointer included, which /proc
    /// does not give), from a task iterator; load with `Features::thread_regs`. Reading
    /// them does not stop the threads; those running now give stale values (or none).
    pub(crate) fn thread_registers(&mut self, tgid: u32) -> Result<Vec<ThreadRegs>> {
        let name = program_names::THREAD_REGS;
        let program = self.program_fd(name, self.iter_task_btf_id)?;
        let error = |e: std::io::Error| {
            LoaderError::KernelFeature(format!("reading threads with task iterator {name}: {e}"))
        };
        // Only the process's threads (Linux 6.1); before that, every task, sorted out here.
        let link = sys::link_task_iterator(program, Some(tgid))
            .or_else(|_| sys::link_task_iterator(program, None))
            .map_err(error)?;
        let iterator = sys::create_iterator(link.as_fd()).map_err(error)?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::fs::File::from(iterator), &mut bytes)
            .map_err(error)?;
        let tids: std::collections::HashSet<u32> = crate::system::procfs::thread_ids(tgid)
            .into_iter()
            .collect();
        const RECORD: usize = std::mem::size_of::<ThreadRegs>();
        Ok(bytes
            .as_chunks::<RECORD>()
            .0
            .iter()
            .map(|record| {
                let u64_at =
                    |at: usize| u64::from_ne_bytes(record[at..at + 8].try_into().expect("8 bytes"));
                ThreadRegs {
                    tid: u32::from_ne_bytes(record[0..4].try_into().expect("4 bytes")),
                    _pad: 0,
                    ip: u64_at(8),
                    sp: u64_at(16),
                    bp: u64_at(24),
                    fsbase: u64_at(32),
                }
            })
            .filter(|regs| tids.contains(&regs.tid))
            .collect())
    }

    /// Samples on-CPU stacks at `frequency_hz` on every online CPU, user stacks taken as
    /// `stacks` says.
    pub(crate) fn attach_oncpu_sampling(
        &mut self,
        stacks: UserStacks,
        frequency_hz: u64,
    ) -> Result<Attachment> {
        let name = match stacks {
            UserStacks::FramePointers => program_names::ONCPU_SAMPLE,
            UserStacks::Snapshots => program_names::ONCPU_SAMPLE_DWARF,
            UserStacks::PythonSnapshots => program_names::ONCPU_SAMPLE_DWARF_PYTHON,
        };
        let cpus = aya::util::online_cpus()
            .map_err(|(what, e)| os_error(format!("cannot list the online CPUs ({what})"), e))?;
        self.finish_maps()?;
        let program = self.program_fd(name, None)?;
        let links = cpus
            .iter()
            .map(|&cpu| {
                let sampling =
                    |e: std::io::Error| os_error(format!("CPU_CLOCK sampling on CPU {cpu}"), e);
                let perf_event = sys::open_cpu_clock(cpu, frequency_hz).map_err(sampling)?;
                let link =
                    sys::link_perf_event(program, perf_event.as_fd(), 0).map_err(sampling)?;
                Ok(Link {
                    _link: link,
                    _perf_event: Some(perf_event),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Attachment { links })
    }
}
