//! The kernel side of a wall-clock profile, driven from user space, shared by `profile`
//! and `attach`: on-CPU sampling and off-CPU accounting (`sched_switch`) attached with one
//! unwinding method, threads blocked since before the start marked off CPU from the
//! start under the stacks they are blocked in (read from /proc and unwound: see
//! [`crate::profile::threads`]), DWARF stack snapshots drained and unwound while the targets run,
//! and at the end the profile built from what the kernel collected.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Duration,
};

use anyhow::{Context as _, Result};
use tracer_common::{
    KERNEL_STACK_AT_SWITCH_IN, NO_STACK, OffCpuStart, STACK_BEFORE_START, StackId, StackKey,
    offcpu_state, stack_id::FIRST_SEEDED_ID, task_wall,
};

use crate::{
    kernel::{Attachment, Features, Loader, RingWakeups, Settings, TargetsMap, UserStacks},
    profile::dwarf_snapshots::{DRAIN_PERIODS, Unwinding, auto_unwind_ring_bytes},
    profile::threads::{self, SnapshotOptions, ThreadState},
    profile::wallclock::{self, BuildOptions, GroupBy, RawProfile, TaskEntries, WallClockProfile},
    profile::windows::WindowBase,
    stack::jit::JvmPerfMaps,
    stack::naming::{KERNEL_SUFFIX, StackSource},
    stack::processes::Processes,
    stack::python::Interpreters,
    stack::symbolize::StackSymbolizer,
    stack::unwind::{
        DwarfUnwinder, SampleKey, UnwindStats, UnwoundStack, UnwoundStacks, WithUnwound,
    },
    system::procfs,
    system::stop::{self, StopReason},
    target::KernelTargets,
};

/// How stacks are sampled and walked (`SamplingArgs` in the command line, validated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sampling {
    pub frequency_hz: u64,
    pub unwind: UnwindMethod,
    /// The stack-copy ring's size (`--unwind-buffer`); `None`: sized from the CPUs (see
    /// [`WallClockSampler::unwind_ring_bytes`]).
    pub unwind_buffer_bytes: Option<u32>,
    /// CPython processes' stacks carry Python frames (with DWARF unwinding).
    pub python_frames: bool,
    /// HotSpot JVMs are asked for their perf maps.
    pub jit_symbols: bool,
}

/// How user stacks are walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum UnwindMethod {
    /// Frame pointers, walked in the kernel.
    Fp,
    /// DWARF call frame information, unwound in user space from a copy of the stack.
    Dwarf,
}

/// How often the processes that joined a set of targets are looked at: a process that
/// lives longer than this gets named stacks.
pub(crate) const OBSERVE_PERIOD: Duration = Duration::from_millis(100);

/// On-CPU sampling and off-CPU accounting, attached.
pub(crate) struct WallClockSampler {
    sampling: Sampling,
    /// The processes sampled, when a set that can change (`None`: one process, or every
    /// process).
    targets: Option<TargetsMap>,
    /// Every process is sampled.
    system_wide: bool,
    unwinding: Option<Unwinding>,
    /// The CPython interpreters of the processes sampled, whose frames the kernel walks.
    interpreters: Interpreters,
    /// The perf maps asked of the JVMs among the targets.
    jvm_perf_maps: JvmPerfMaps,
    /// The stacks of the threads blocked when sampling started.
    seeds: Seeds,
    /// CLOCK_MONOTONIC when sampling started.
    pub started_ns: u64,
    /// How many CPUs are sampled.
    pub cpus: usize,
    /// Off-CPU accounting and on-CPU sampling, while attached.
    attached: Option<[Attachment; 2]>,
    /// How the attached programs take user stacks.
    stacks: UserStacks,
}

/// What the next rolling window subtracts ([`WallClockSampler::window`]).
#[derive(Default)]
pub(crate) struct Window {
    totals: WindowBase,
    unwound: HashMap<SampleKey, u64>,
}

impl Window {
    /// The first window, from `start_ns`.
    pub(crate) fn starting_at(start_ns: u64) -> Self {
        Self {
            totals: WindowBase::starting_at(start_ns),
            unwound: HashMap::new(),
        }
    }

    /// Drops what the windows gave processes `tgids`, let go.
    pub(crate) fn forget(&mut self, tgids: &HashSet<u32>) {
        self.totals.forget(tgids);
        self.unwound.retain(|key, _| !tgids.contains(&key.0));
    }

    /// When the window now open started (CLOCK_MONOTONIC ns).
    pub(crate) fn start_ns(&self) -> u64 {
        self.totals.end_ns
    }
}

/// What [`WallClockSampler::retire`] took out.
pub(crate) struct Retired {
    /// Their profile, each process's stacks under its program's name.
    pub profile: WallClockProfile,
    /// On-CPU samples by process.
    pub oncpu_by_process: BTreeMap<u32, u64>,
    /// Their threads.
    pub tids: HashSet<u32>,
}

/// How the profile is built from what was collected.
#[derive(Debug, Clone)]
pub(crate) struct ViewOptions {
    /// A `name [tid]` frame for each thread, under its process.
    pub per_thread: bool,
    /// Which processes share a root frame (`--group-by`).
    pub group_by: GroupBy,
    /// Off-CPU intervals shorter than this are left out (`--min-block`).
    pub min_block: Duration,
    /// The runtime tasks whose time the threads spent, named (see
    /// [`TaskEntries::names`]); empty without task probes.
    pub task_names: HashMap<(u32, u64), String>,
}

/// What the profile is made of, once the sampler stopped.
pub(crate) struct Collected {
    pub profile: WallClockProfile,
    /// With `--unwind dwarf`: how the unwinding went.
    pub unwind_stats: Option<UnwindStats>,
}

impl WallClockSampler {
    /// The kernel features a sampler needs, for [`Settings::features`].
    pub(crate) fn features(sampling: &Sampling) -> Features {
        Features {
            offcpu: true,
            oncpu: true,
            offcpu_snapshots: sampling.unwind == UnwindMethod::Dwarf,
            // The saved frame pointers of the threads blocked at the start.
            thread_regs: true,
            python_frames: sampling.unwind == UnwindMethod::Dwarf && sampling.python_frames,
            ..Features::NONE
        }
    }

    /// The size of the snapshot ring buffer, for [`Settings::unwind_ring_bytes`]: as
    /// asked, or sized from the CPUs (a system-wide profile's bursts come from every
    /// process on them).
    pub(crate) fn unwind_ring_bytes(sampling: &Sampling, system_wide: bool) -> u32 {
        match sampling.unwind {
            UnwindMethod::Dwarf => sampling.unwind_buffer_bytes.unwrap_or_else(|| {
                let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
                auto_unwind_ring_bytes(cpus, system_wide)
            }),
            UnwindMethod::Fp => Settings::default().unwind_ring_bytes,
        }
    }

    /// Attaches off-CPU accounting and on-CPU sampling, of the `targets` the loader was
    /// given or (`None`) of every process. Every thread of the targets is marked off CPU
    /// from now: threads blocked since before would otherwise be missed until they wake
    /// (or entirely); running ones replace the mark at their next switch. A blocked
    /// thread's mark carries the stacks it is blocked in, read from /proc without stopping
    /// it ([`threads`]); `processes` must know the targets' mappings to unwind them.
    pub(crate) fn attach(
        loader: &mut Loader,
        targets: Option<&KernelTargets>,
        sampling: Sampling,
        processes: &Processes,
    ) -> Result<Self> {
        let dwarf = sampling.unwind == UnwindMethod::Dwarf;
        let mut interpreters = match dwarf && sampling.python_frames {
            true => Interpreters::default(),
            false => Interpreters::disabled(),
        };
        let pythons = register_python_processes(loader, processes, &mut interpreters);
        let stacks = match sampling.unwind {
            UnwindMethod::Dwarf if pythons > 0 => UserStacks::PythonSnapshots,
            UnwindMethod::Dwarf => UserStacks::Snapshots,
            UnwindMethod::Fp => UserStacks::FramePointers,
        };
        let offcpu = loader.attach_offcpu(stacks)?;
        let oncpu = loader
            .attach_oncpu_sampling(stacks, sampling.frequency_hz)
            .with_context(|| {
                format!(
                    "cannot sample at {} Hz (see kernel.perf_event_max_sample_rate)",
                    sampling.frequency_hz
                )
            })?;
        let cpus = oncpu.points();
        let unwinding = match dwarf {
            true => Some(Unwinding {
                ring: loader.take_unwind_samples()?,
                checks: loader.take_snapshot_checks()?,
                unwinder: DwarfUnwinder::new(),
                ring_bytes: Self::unwind_ring_bytes(&sampling, targets.is_none()).into(),
                drained_at: None,
                period: *DRAIN_PERIODS.start(),
            }),
            false => None,
        };
        // Both programs record from one instant: an interval begun after it is counted
        // from its own start, a thread blocked then from here (the seeds below), however
        // long attaching took on a busy machine.
        loader.start_recording()?;
        let started_ns = stop::monotonic_ns();
        let mut seeds = Seeds::default();
        for member in targets.iter().flat_map(|t| &t.members) {
            let marks =
                seeds.mark_threads(loader, member.pid, started_ns, processes, &mut interpreters);
            loader.seed_offcpu_starts(&marks)?;
        }
        let set = targets.filter(|t| t.single.is_none());
        let mut jvm_perf_maps = JvmPerfMaps::new(sampling.jit_symbols && targets.is_some());
        jvm_perf_maps.request_at_start(targets.iter().flat_map(|t| &t.members).map(|m| m.pid));
        Ok(Self {
            sampling,
            targets: set.map(|_| loader.targets_map()).transpose()?,
            system_wide: targets.is_none(),
            unwinding,
            interpreters,
            jvm_perf_maps,
            seeds,
            started_ns,
            cpus,
            attached: Some([offcpu, oncpu]),
            stacks,
        })
    }

    /// Once the first Python process is registered: replaces the programs attached by
    /// those that walk Python frames. The new ones are attached before the old ones go, so
    /// no switch is missed; for that moment a switch may send two snapshots and a CPU
    /// take two samples.
    fn walk_python_frames(&mut self, loader: &mut Loader) -> Result<()> {
        if self.stacks != UserStacks::Snapshots || self.attached.is_none() {
            return Ok(());
        }
        let stacks = UserStacks::PythonSnapshots;
        let offcpu = loader.attach_offcpu(stacks)?;
        let oncpu = loader.attach_oncpu_sampling(stacks, self.sampling.frequency_hz)?;
        self.attached = Some([offcpu, oncpu]);
        self.stacks = stacks;
        Ok(())
    }

    /// On-CPU samples so far by process (walked in the kernel, and unwound here), and
    /// the sampling frequency: each weighs `1 / frequency_hz` seconds.
    pub(crate) fn oncpu_samples_by_process(&self, loader: &Loader) -> (BTreeMap<u32, u64>, u64) {
        let mut by_process = BTreeMap::new();
        for (key, count) in loader.oncpu_samples().unwrap_or_default() {
            *by_process.entry(key.tgid).or_default() += count;
        }
        if let Some(unwinding) = &self.unwinding {
            unwinding.unwinder.add_samples_by_process(&mut by_process);
        }
        (by_process, self.sampling.frequency_hz)
    }

    /// How many processes of a set of targets run now; `None` for one process (traced
    /// while it runs) or every process.
    pub(crate) fn processes_running(&self) -> Option<usize> {
        self.targets.as_ref().map(|t| t.running_pids().len())
    }

    /// The wall-clock profile of the window from `base.end_ns` to `now_ns` (see
    /// [`crate::profile::windows`]); `base` then starts the next window.
    pub(crate) fn window(
        &mut self,
        base: &mut Window,
        loader: &Loader,
        processes: &mut Processes,
        symbolizer: &mut StackSymbolizer,
        now_ns: u64,
        options: BuildOptions,
    ) -> Result<WallClockProfile> {
        self.drain(processes);
        let (offcpu, pending) =
            base.totals
                .offcpu_window(loader.offcpu_totals()?, loader.offcpu_pending()?, now_ns);
        let mut oncpu = base.totals.oncpu_window(loader.oncpu_samples()?);
        let (unwound, window_stacks) = match &self.unwinding {
            Some(unwinding) => {
                let (samples, stacks) = unwinding.unwinder.samples_since(&mut base.unwound);
                oncpu.extend(samples);
                (Some(unwinding.unwinder.snapshots()), stacks)
            }
            None => (None, Default::default()),
        };
        base.totals.end_ns = now_ns;
        let raw = RawProfile {
            oncpu,
            offcpu,
            pending,
            now_ns,
            // The kernel left out the short intervals; a long one's part in a window is
            // kept however short.
            min_block_ns: 0,
            tasks: TaskEntries::default(),
        };
        let profile = match unwound {
            Some(snapshots) => wallclock::build_profile(
                &raw,
                options,
                &WithSeeds {
                    inner: &WithUnwound {
                        kernel: &WithUnwound {
                            kernel: loader,
                            unwound: snapshots,
                        },
                        unwound: &window_stacks,
                    },
                    seeds: &self.seeds,
                },
                symbolizer,
                processes,
            ),
            None => wallclock::build_profile(
                &raw,
                options,
                &WithSeeds {
                    inner: loader,
                    seeds: &self.seeds,
                },
                symbolizer,
                processes,
            ),
        };
        Ok(profile)
    }

    /// The processes that left something here or in the kernel's maps: on-CPU samples
    /// or off-CPU time.
    pub(crate) fn processes_with_samples(&self, loader: &Loader) -> Result<HashSet<u32>> {
        let mut seen: HashSet<u32> = loader
            .oncpu_samples()?
            .iter()
            .map(|(k, _)| k.tgid)
            .collect();
        seen.extend(loader.offcpu_totals()?.iter().map(|(k, _)| k.tgid));
        if let Some(unwinding) = &self.unwinding {
            seen.extend(unwinding.unwinder.sample_tgids());
        }
        Ok(seen)
    }

    /// The processes of a set of targets that left it (they exited, or ran another
    /// program) and left something (see [`Self::processes_with_samples`]) or were seen
    /// (in `processes`). None for one process, or every process.
    pub(crate) fn departed_processes(
        &self,
        loader: &Loader,
        processes: &Processes,
    ) -> Result<HashSet<u32>> {
        let Some(targets) = &self.targets else {
            return Ok(HashSet::new());
        };
        let mut seen = self.processes_with_samples(loader)?;
        // A process that exited before a sample or a block of its own is known there alone.
        seen.extend(processes.iter().map(|(tgid, _)| tgid));
        // Read after what they left: a process that joined since is in the set.
        for tgid in targets.pids() {
            seen.remove(&tgid);
        }
        Ok(seen)
    }

    /// Takes what processes `tgids` left out of the kernel's maps and out of here, into
    /// a profile of their own, each process's stacks under its program's name (not its
    /// PID, nor its threads'): see [`crate::profile::retire`]. Their part of the rolling
    /// `window` goes too (it must have been written).
    pub(crate) fn retire(
        &mut self,
        loader: &mut Loader,
        processes: &mut Processes,
        symbolizer: &mut StackSymbolizer,
        tgids: &HashSet<u32>,
        frequency_hz: u64,
        window: Option<&mut Window>,
    ) -> Result<Retired> {
        self.drain(processes);
        let offcpu: Vec<_> = loader
            .offcpu_totals()?
            .into_iter()
            .filter(|(key, _)| tgids.contains(&key.tgid))
            .collect();
        let oncpu_in_kernel: Vec<_> = loader
            .oncpu_samples()?
            .into_iter()
            .filter(|(key, _)| tgids.contains(&key.tgid))
            .collect();
        let mut oncpu = oncpu_in_kernel.clone();
        let unwound = match self.unwinding.as_mut() {
            Some(unwinding) => {
                let snapshot_ids: HashSet<StackId> = offcpu
                    .iter()
                    .map(|(key, _)| key.user)
                    .filter(|user| matches!(user, StackId::Snapshot(_)))
                    .collect();
                let taken = unwinding.unwinder.take_processes(tgids, &snapshot_ids);
                // A thread that takes a retired one's id must not reuse its snapshots.
                unwinding.checks.remove(&snapshot_ids);
                oncpu.extend(taken.oncpu);
                Some(taken.stacks)
            }
            None => None,
        };
        let mut oncpu_by_process = BTreeMap::new();
        for (key, count) in &oncpu {
            *oncpu_by_process.entry(key.tgid).or_default() += count;
        }
        let tids: HashSet<u32> = oncpu
            .iter()
            .map(|(key, _)| key.tid)
            .chain(offcpu.iter().map(|(key, _)| key.tid))
            .collect();
        let offcpu_keys: Vec<StackKey> = offcpu.iter().map(|(key, _)| *key).collect();
        let raw = RawProfile {
            oncpu,
            offcpu,
            ..RawProfile::default()
        };
        let options = BuildOptions {
            frequency_hz,
            per_thread: false,
            group_by: GroupBy::Name,
        };
        let profile = build(
            &raw,
            options,
            loader,
            unwound.as_ref(),
            &self.seeds,
            symbolizer,
            processes,
        );
        let oncpu_keys: Vec<StackKey> = oncpu_in_kernel.iter().map(|(key, _)| *key).collect();
        loader.remove_offcpu_totals(&offcpu_keys)?;
        loader.remove_oncpu_samples(&oncpu_keys)?;
        if let Some(window) = window {
            window.forget(tgids);
        }
        self.interpreters.forget(tgids);
        Ok(Retired {
            profile,
            oncpu_by_process,
            tids,
        })
    }

    /// Reads the mappings of process `pid` again, after the kernel told of code it
    /// mapped or a program it started.
    pub(crate) fn remapped(&mut self, pid: u32, processes: &mut Processes) {
        processes.refresh_maps(pid);
        self.interpreters.remapped(pid);
    }

    /// How often snapshots are to be drained (see [`DRAIN_PERIODS`]); `None` without
    /// `--unwind dwarf`.
    pub(crate) fn drain_period(&self) -> Option<Duration> {
        self.unwinding.as_ref().map(|u| u.period)
    }

    /// What tells a loop that the stack-copy ring is filling faster than its period
    /// drains it (see [`ring_filling`]); `None` without `--unwind dwarf`, or when the ring
    /// cannot be waited on (the period alone then drains it).
    pub(crate) fn ring_wakeups(&self) -> Option<RingWakeups> {
        let unwinding = self.unwinding.as_ref()?;
        unwinding
            .ring
            .wakeups()
            .inspect_err(|e| log::warn!("{}", cannot_wait_on_ring(e)))
            .ok()
    }

    /// Unwinds the snapshots waiting (with `--unwind dwarf`); call every
    /// [`WallClockSampler::drain_period`].
    pub(crate) fn drain(&mut self, processes: &mut Processes) {
        if let Some(unwinding) = self.unwinding.as_mut() {
            unwinding.drain(processes, &mut self.interpreters, self.targets.as_ref());
        }
    }

    /// Captures the processes that joined a set of targets (their names and mappings,
    /// while they run) and names the targets' new threads; call every [`OBSERVE_PERIOD`].
    pub(crate) fn observe_targets(&self, processes: &mut Processes) {
        if let Some(targets) = &self.targets {
            for (pid, name) in targets.named() {
                processes.observe_named(pid, Some(&name));
            }
            // Those seen first once gone are named from their parents' mappings.
            for (pid, parent) in targets.forks() {
                processes.observe_fork(pid, parent);
            }
        }
        // System-wide, every process is known: names are read once a second.
        if !self.system_wide {
            processes.name_new_threads();
        }
    }

    /// Captures what a system-wide profile has seen so far; call about once a second.
    pub(crate) fn refresh(&self, loader: &Loader, processes: &mut Processes) {
        if self.system_wide {
            observe_seen(loader, processes);
        }
        processes.refresh();
    }

    /// Detaches sampling and accounting (the maps stay readable) and unwinds what is left.
    pub(crate) fn detach(&mut self, processes: &mut Processes) {
        if let Some([offcpu, oncpu]) = self.attached.take() {
            oncpu.detach();
            offcpu.detach();
        }
        self.drain(processes);
    }

    /// Builds the profile from what the kernel collected, up to `now_ns` (when it was
    /// detached); `reason` says whether threads still blocked are blocked right now.
    pub(crate) fn finish(
        self,
        loader: &Loader,
        processes: &mut Processes,
        symbolizer: &mut StackSymbolizer,
        reason: StopReason,
        now_ns: u64,
        view: ViewOptions,
    ) -> Result<Collected> {
        if self.system_wide {
            observe_seen(loader, processes);
        }
        self.observe_targets(processes);
        // A perf map is a snapshot: what the JVMs compiled since the start is named too.
        let mut jvm_perf_maps = self.jvm_perf_maps;
        if reason == StopReason::TargetExited {
            jvm_perf_maps.request_before_naming([]);
        } else {
            jvm_perf_maps.request_before_naming(processes.iter().map(|(tgid, _)| tgid));
        }
        if let Some(summary) = jvm_perf_maps.summary() {
            crate::status!("{summary}");
        }
        if reason != StopReason::TargetExited {
            processes.refresh();
        }
        // Threads still blocked are blocked right now, unless they are gone: a target that
        // exited, or (system-wide) a thread that exited while switched out, never wakes up.
        let mut seeds = self.seeds;
        let pending = if reason == StopReason::TargetExited {
            Vec::new()
        } else {
            seeds.name_blocked_kernel_stacks(still_alive(loader.offcpu_pending()?))
        };
        let mut oncpu = loader.oncpu_samples()?;
        let mut tasks = TaskEntries {
            names: view.task_names,
            ..TaskEntries::default()
        };
        for (key, total) in loader.task_wall()? {
            match key.kind {
                task_wall::ON_CPU => tasks.oncpu.push((key.task, key.key.into(), total.count)),
                _ => tasks.offcpu.push((key.task, key.key.into(), total)),
            }
        }
        let (unwind_stats, unwound) = match self.unwinding {
            Some(Unwinding { unwinder, .. }) => {
                let stats = unwinder.stats;
                let unwound = unwinder.finish();
                oncpu.extend(unwound.oncpu);
                tasks.oncpu.extend(unwound.task_oncpu);
                (Some(stats), Some(unwound.stacks))
            }
            None => (None, None),
        };
        let seeds = &seeds;
        let raw = RawProfile {
            oncpu,
            offcpu: loader.offcpu_totals()?,
            pending,
            now_ns,
            min_block_ns: u64::try_from(view.min_block.as_nanos()).unwrap_or(u64::MAX),
            tasks,
        };
        let options = BuildOptions {
            frequency_hz: self.sampling.frequency_hz,
            per_thread: view.per_thread,
            group_by: view.group_by,
        };
        let profile = build(
            &raw,
            options,
            loader,
            unwound.as_ref(),
            seeds,
            symbolizer,
            processes,
        );
        Ok(Collected {
            profile,
            unwind_stats,
        })
    }
}

/// Builds the profile of `raw`, its stacks from `loader`, the `unwound` ones (with
/// `--unwind dwarf`) and the `seeds`.
fn build(
    raw: &RawProfile,
    options: BuildOptions,
    loader: &Loader,
    unwound: Option<&UnwoundStacks>,
    seeds: &Seeds,
    symbolizer: &mut StackSymbolizer,
    processes: &Processes,
) -> WallClockProfile {
    // Only a DWARF-unwound profile tells frames found by frame pointers apart.
    match unwound {
        Some(unwound) => wallclock::build_profile(
            raw,
            options,
            &WithSeeds {
                inner: &WithUnwound {
                    kernel: loader,
                    unwound,
                },
                seeds,
            },
            symbolizer,
            processes,
        ),
        None => wallclock::build_profile(
            raw,
            options,
            &WithSeeds {
                inner: loader,
                seeds,
            },
            symbolizer,
            processes,
        ),
    }
}

/// Waits until the kernel says the stack-copy ring is a quarter full; never returns
/// without `wakeups` (see [`WallClockSampler::ring_wakeups`]).
pub(crate) async fn ring_filling(wakeups: &mut Option<RingWakeups>) {
    let Some(ring) = wakeups.as_mut() else {
        return std::future::pending().await;
    };
    if let Err(e) = ring.wait().await {
        log::warn!("{}", cannot_wait_on_ring(&e));
        *wakeups = None;
    }
}

/// The warning when the stack-copy ring cannot be waited on.
fn cannot_wait_on_ring(e: &std::io::Error) -> String {
    format!("cannot wait on the stack-copy ring ({e}): draining it by period alone")
}

/// Has `ticker` tick every `period` from now on, if it does not already.
pub(crate) fn keep_pace(ticker: &mut tokio::time::Interval, period: Duration) {
    if ticker.period() != period {
        *ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    }
}

/// The sampler's periodic work, for a loop that also does other things (`attach` looking
/// for libraries loaded later): call [`SamplerChores::run`] at least every
/// [`SamplerChores::period`]; it does what is due.
#[derive(Debug, Default)]
pub(crate) struct SamplerChores {
    drained: Option<std::time::Instant>,
    refreshed: Option<std::time::Instant>,
    observed: Option<std::time::Instant>,
}

impl SamplerChores {
    /// [`SamplerChores::run`], after re-reading the mappings of the processes the kernel
    /// said mapped code (a loop that does not look for probe sites itself).
    pub(crate) fn run_with_mappings(
        &mut self,
        sampler: &mut WallClockSampler,
        loader: &mut Loader,
        processes: &mut Processes,
    ) {
        if processes.maps_told() {
            for pid in loader.take_mapped() {
                sampler.remapped(pid, processes);
            }
        }
        self.run(sampler, loader, processes);
    }

    /// How often the sampler has work to do.
    pub(crate) fn period(sampler: &WallClockSampler) -> Duration {
        match (sampler.drain_period(), sampler.system_wide) {
            (Some(period), _) => period.min(OBSERVE_PERIOD),
            (None, false) => OBSERVE_PERIOD,
            (None, true) => Duration::from_secs(1),
        }
    }

    /// Has the next [`SamplerChores::run`] drain the snapshots whatever the period: the
    /// kernel said the ring is filling (see [`ring_filling`]).
    pub(crate) fn drain_due(&mut self) {
        self.drained = None;
    }

    /// Does the work that is due.
    pub(crate) fn run(
        &mut self,
        sampler: &mut WallClockSampler,
        loader: &mut Loader,
        processes: &mut Processes,
    ) {
        let due = |at: Option<std::time::Instant>, every: Duration| {
            at.is_none_or(|at| at.elapsed() >= every)
        };
        if let Some(period) = sampler.drain_period()
            && due(self.drained, period)
        {
            sampler.drain(processes);
            self.drained = Some(std::time::Instant::now());
        }
        if due(self.observed, OBSERVE_PERIOD) {
            sampler.observe_targets(processes);
            if register_python_processes(loader, processes, &mut sampler.interpreters) > 0
                && let Err(e) = sampler.walk_python_frames(loader)
            {
                log::warn!("no Python frames: {e:#}");
            }
            self.observed = Some(std::time::Instant::now());
        }
        if due(self.refreshed, Duration::from_secs(1)) {
            sampler.refresh(loader, processes);
            self.refreshed = Some(std::time::Instant::now());
        }
    }
}

/// Tells the kernel of the Python interpreters found ready since the last call, so
/// their threads' snapshots carry Python frames; returns how many it was told of.
pub(crate) fn register_python_processes(
    loader: &mut Loader,
    processes: &Processes,
    interpreters: &mut Interpreters,
) -> usize {
    for (tgid, info) in processes.iter() {
        interpreters.find(tgid, info.maps.as_ref());
    }
    interpreters.close_idle();
    let mut registered = 0;
    for (tgid, process) in interpreters.ready_for_kernel() {
        match loader.add_python_process(tgid, &process) {
            Ok(()) => registered += 1,
            Err(e) => log::warn!("process {tgid}: no Python frames: {e}"),
        }
    }
    registered
}

/// The stacks of the threads found blocked when sampling started, by the ids their marks
/// carry (from [`FIRST_SEEDED_ID`]): user stacks unwound from the registers and stack
/// bytes /proc gives, kernel stacks as /proc names them.
#[derive(Debug, Default)]
struct Seeds {
    user: HashMap<StackId, UnwoundStack>,
    kernel: HashMap<StackId, Vec<String>>,
    /// Ids given out so far (from [`FIRST_SEEDED_ID`]).
    issued: i32,
}

impl Seeds {
    fn next_id(&mut self) -> StackId {
        self.issued += 1;
        StackId::decode(FIRST_SEEDED_ID + self.issued - 1)
    }

    /// `pending` with the kernel stack of each thread still blocked where the kernel was
    /// to take it at its switch in, as /proc shows it now ([`NO_STACK`] if it cannot).
    fn name_blocked_kernel_stacks(
        &mut self,
        mut pending: Vec<(u32, OffCpuStart)>,
    ) -> Vec<(u32, OffCpuStart)> {
        for (tid, start) in &mut pending {
            if start.kernel_stack_id != KERNEL_STACK_AT_SWITCH_IN {
                continue;
            }
            let path = format!("/proc/{}/task/{tid}/stack", start.tgid);
            let names = std::fs::read_to_string(&path)
                .map(|text| threads::parse_kernel_stack(&text))
                .unwrap_or_default();
            start.kernel_stack_id = if names.is_empty() {
                NO_STACK
            } else {
                let id = self.next_id();
                let named = names.iter().map(|n| format!("{n}{KERNEL_SUFFIX}"));
                self.kernel.insert(id, named.collect());
                id.raw()
            };
        }
        pending
    }

    /// Marks for every thread of `pid`, from `started_ns`: a blocked thread's under the
    /// stacks it is blocked in, any other's (and one whose stacks cannot be read) under
    /// [`STACK_BEFORE_START`].
    fn mark_threads(
        &mut self,
        loader: &mut Loader,
        pid: u32,
        started_ns: u64,
        processes: &Processes,
        interpreters: &mut Interpreters,
    ) -> Vec<(u32, OffCpuStart)> {
        // The frame pointers /proc does not give, read first, so that they are those of
        // the registers /proc then shows (the snapshot checks they agree).
        let registers = match loader.thread_registers(pid) {
            Ok(regs) => regs.into_iter().map(|r| (r.tid, r)).collect(),
            Err(e) => {
                log::debug!("no frame pointers for the threads of {pid}: {e}");
                HashMap::new()
            }
        };
        let options = SnapshotOptions {
            registers,
            ..SnapshotOptions::default()
        };
        let snapshots = threads::snapshot_threads_with(pid, &options).unwrap_or_default();
        let maps = processes.get(pid).and_then(|p| p.maps.as_ref());
        let mut python = interpreters.find(pid, maps);
        let mut unwinder = DwarfUnwinder::new();
        let id_for = |stacks: &mut Self, user: Option<UnwoundStack>, kernel: Vec<String>| {
            let mut ids = [NO_STACK, NO_STACK];
            if let Some(user) = user.filter(|u| !u.addrs.is_empty()) {
                let id = stacks.next_id();
                stacks.user.insert(id, user);
                ids[0] = id.raw();
            }
            if !kernel.is_empty() {
                let id = stacks.next_id();
                stacks.kernel.insert(id, kernel);
                ids[1] = id.raw();
            }
            ids
        };
        procfs::thread_ids(pid)
            .into_iter()
            .map(|tid| {
                let blocked = snapshots.iter().find(|t| {
                    t.tid == tid && !matches!(t.state, ThreadState::Running | ThreadState::Runnable)
                });
                // Running or waiting for a CPU: should it have been preempted before the
                // recording began, its wait until it runs is runnable time, not a block.
                let could_run = snapshots.iter().any(|t| {
                    t.tid == tid && matches!(t.state, ThreadState::Running | ThreadState::Runnable)
                });
                let ids = match blocked {
                    Some(thread) => {
                        let user = maps
                            .zip(thread.unwind_snapshot(pid))
                            .map(|(maps, snapshot)| unwinder.unwind_one(&snapshot, maps).0)
                            .map(|stack| match (python.as_deref_mut(), thread.fsbase()) {
                                (Some(python), Some(fsbase)) => python.merge_thread(stack, fsbase),
                                _ => stack,
                            });
                        id_for(self, user, thread.kernel_frame_names())
                    }
                    None => [NO_STACK, NO_STACK],
                };
                let ids = match ids {
                    [NO_STACK, NO_STACK] if !could_run => [STACK_BEFORE_START, STACK_BEFORE_START],
                    ids => ids,
                };
                let start = OffCpuStart {
                    ts_ns: started_ns,
                    // Maybe running: its next switch out just replaces the mark.
                    exec_ns: tracer_common::EXEC_NS_UNKNOWN,
                    tgid: pid,
                    user_stack_id: ids[0],
                    kernel_stack_id: ids[1],
                    state: match could_run {
                        true => offcpu_state::RUNNABLE,
                        false => offcpu_state::BLOCKED,
                    },
                    // Blocked since before any task probe was attached.
                    task: 0,
                };
                (tid, start)
            })
            .collect()
    }
}

/// `inner`'s stacks, and the [`Seeds`].
struct WithSeeds<'a, S> {
    inner: &'a S,
    seeds: &'a Seeds,
}

impl<S: StackSource> StackSource for WithSeeds<'_, S> {
    fn stack(&self, id: StackId) -> Vec<u64> {
        match self.seeds.user.get(&id) {
            Some(stack) => stack.addrs.clone(),
            None => self.inner.stack(id),
        }
    }

    fn user_frames_by_frame_pointer(&self, id: StackId) -> Vec<bool> {
        match self.seeds.user.get(&id) {
            Some(stack) => stack.by_frame_pointer.clone(),
            None => self.inner.user_frames_by_frame_pointer(id),
        }
    }

    fn named(&self, id: StackId) -> Option<Vec<String>> {
        match self.seeds.kernel.get(&id) {
            Some(names) => Some(names.clone()),
            None => self.inner.named(id),
        }
    }
}

/// Captures the processes that have samples or blocked time so far, so their stacks can be
/// named even if they exit before the end.
fn observe_seen(loader: &Loader, processes: &mut Processes) {
    let oncpu = loader.oncpu_samples().unwrap_or_default();
    let offcpu = loader.offcpu_totals().unwrap_or_default();
    let pending = loader.offcpu_pending().unwrap_or_default();
    let tgids = oncpu
        .iter()
        .map(|(k, _)| k.tgid)
        .chain(offcpu.iter().map(|(k, _)| k.tgid))
        .chain(pending.iter().map(|(_, s)| s.tgid));
    for tgid in tgids {
        processes.observe(tgid);
    }
}

fn still_alive(pending: Vec<(u32, OffCpuStart)>) -> Vec<(u32, OffCpuStart)> {
    pending
        .into_iter()
        .filter(|(tid, start)| procfs::thread_exists(start.tgid, *tid))
        .collect()
}
