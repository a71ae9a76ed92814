//! Loading the embedded eBPF object: [`Loader::load`] and its steps.
//! A [`Launch`] gives a load a head start.
//! A program is verified when first asked for.
//! The maps still being created are waited for here.

use std::{
    collections::HashMap as StdHashMap,
    marker::PhantomData,
    os::fd::{AsFd as _, BorrowedFd},
    path::Path,
    thread::JoinHandle,
};

use aya::maps::Map;
use tracer_common::{
    global_names, histogram, map_names, program_names, target_filter, target_match,
};

use super::{
    FileId, KernelTargets, Loader, LoaderError, MIN_RING_BUFFER_BYTES, MapSizes, MapsPending,
    MapsReady, Result, Settings, TIMELINE_RING_BYTES,
    btf::{self, Btf},
    diagnostics, keeper,
    launch::{KernelBtfReading, Launch, joined},
    object, os_error, pins, process_start_ticks,
};
use crate::system::oserror;

/// The eBPF object built from `tracer-ebpf` by build.rs.
pub(super) static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));

pub(super) const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Maps the USDT latency and event programs never use, created on another thread while
/// those are loaded and attached, so the first events are not kept waiting for them (the
/// stack map alone is tens of megabytes the kernel allocates up front).
const DEFERRED_MAPS: [&str; 15] = [
    map_names::STACKS,
    map_names::KERNEL_STACKS,
    map_names::LAST_USER_STACKS,
    map_names::OFFCPU_STARTS,
    map_names::OFFCPU_TIME,
    map_names::ONCPU_SAMPLES,
    map_names::TASK_STATES,
    map_names::TASK_TIME,
    map_names::THREAD_TASKS,
    map_names::TASK_WALL,
    map_names::TASK_NAMES,
    map_names::UNWIND_SAMPLES,
    map_names::OFFCPU_SNAPSHOTS,
    map_names::SNAPSHOT_CHECKS,
    map_names::SNAPSHOT_SEQ,
];

/// Every kernel struct, typedef and function [`Loader::load`] may look up.
pub(super) const KERNEL_STRUCTS_USED: [&str; 11] = [
    "task_struct",
    "thread_struct",
    "sched_entity",
    "linux_binprm",
    "file",
    "inode",
    "super_block",
    "pid",
    "upid",
    "pid_namespace",
    "ns_common",
];
pub(super) const KERNEL_TYPEDEFS_USED: [&str; 3] = [
    "btf_trace_sched_switch",
    "btf_trace_sched_process_fork",
    "btf_trace_sched_process_exec",
];
pub(super) const KERNEL_FUNCTIONS_USED: [&str; 1] = ["bpf_iter_task"];

/// The kernel's inode number of the initial PID namespace (`PROC_PID_INIT_INO`).
const INIT_PID_NAMESPACE_INODE: u64 = 0xEFFF_FFFC;

/// Whether `pid_ns_inode` (of /proc/self/ns/pid) is a namespace below the host's.
fn is_nested_pid_namespace(pid_ns_inode: u64) -> bool {
    pid_ns_inode != INIT_PID_NAMESPACE_INODE
}

/// The kernel type ids the programs that need them are verified against.
#[derive(Default)]
struct KernelTypeIds {
    sched_switch: Option<u32>,
    fork: Option<u32>,
    exec: Option<u32>,
    iter_task: Option<u32>,
}

/// The values of the object's globals, by name.
type Globals = Vec<(&'static str, Vec<u8>)>;

/// What a load derives from its settings' targets and from this process's PID namespace.
struct LoadInputs<'a> {
    settings: &'a Settings,
    targets: Option<&'a KernelTargets>,
    /// The inode of this process's PID namespace when it is below the host's, else 0.
    pid_ns_ino: u64,
    nested: bool,
    follow_forks: bool,
    follow_execs: bool,
    exe: Option<FileId>,
    /// The one target that nothing can join.
    single: Option<u32>,
    /// Which programs check the targets ([`target_filter`] bits).
    filter: u32,
    /// How processes join the targets ([`target_match`] bits).
    matching: u32,
    clock_tick_ns: u64,
    min_block_ns: u64,
}

/// The offsets of the kernel structure members the programs read (zeros for those this
/// run does not read).
struct KernelOffsets {
    /// `task_struct`: pid, group_leader, start_boottime, tgid, comm, se, thread.
    task: Vec<u32>,
    /// `thread_struct`: fsbase.
    thread_struct: Vec<u32>,
    /// `sched_entity`: sum_exec_runtime.
    sched_entity: Vec<u32>,
    /// From a `linux_binprm` to the device and inode of its file.
    file_offsets: [Vec<u32>; 4],
    /// From a task to its number in a PID namespace.
    pid_numbers: [Vec<u32>; 5],
}

impl Loader<MapsPending> {
    /// Loads the eBPF object with `settings`, with no head start (see [`Launch`]).
    /// Programs are verified when first attached.
    pub(crate) fn load(settings: &Settings) -> Result<Self> {
        Launch::default().load(settings)
    }

    /// Waits for the maps still being created: from here on every map is there.
    pub(crate) fn maps_ready(mut self) -> Result<Loader<MapsReady>> {
        self.finish_maps()?;
        // Every field but the marker moves over: the loader has no Drop of its own.
        Ok(Loader {
            maps: self.maps,
            programs: self.programs,
            sched_switch_btf_id: self.sched_switch_btf_id,
            iter_task_btf_id: self.iter_task_btf_id,
            keeper: self.keeper,
            warm_up: self.warm_up,
            sites_in_one_process: self.sites_in_one_process,
            sites_in_any_process: self.sites_in_any_process,
            usdt_sites_attached: self.usdt_sites_attached,
            target_tracking: self.target_tracking,
            mapping_watch: self.mapping_watch,
            maps_state: PhantomData,
        })
    }

    /// [`Loader::load`], taking what `launch` started.
    pub(super) fn load_launched(settings: &Settings, mut launch: Launch) -> Result<Self> {
        repair_what_killed_tracers_left();
        let inputs = LoadInputs::new(settings);
        let max_entries = inputs.max_entries();
        let keeper = take_keeper(settings, launch.keeper.take())?;
        // Kernel types (read on a thread since the launch began) are waited for only once
        // the maps that do not need them are created: the load does both at once.
        let mut kernel_ids = KernelTypeIds::default();
        let early_btf = launch.kernel_btf.take();
        let globals = || -> Result<Globals> {
            let (globals, ids) = inputs.globals(early_btf)?;
            kernel_ids = ids;
            Ok(globals)
        };
        let object = match launch.object.take() {
            Some(parsing) => joined(parsing),
            None => aya_obj::Object::parse(EBPF_OBJECT),
        }
        .map_err(|e| LoaderError::Load(e.into()))?;
        // With USDT sites to attach first, the deferred maps wait for them.
        let (maps, programs) = object::load(
            object,
            globals,
            &max_entries,
            &DEFERRED_MAPS,
            keeper.is_some(),
        )?;
        let mut loader = Self {
            maps,
            programs,
            sched_switch_btf_id: kernel_ids.sched_switch,
            iter_task_btf_id: kernel_ids.iter_task,
            keeper,
            warm_up: launch.warm_up.take(),
            sites_in_one_process: Vec::new(),
            sites_in_any_process: Vec::new(),
            usdt_sites_attached: 0,
            target_tracking: Vec::new(),
            mapping_watch: Vec::new(),
            maps_state: PhantomData,
        };
        loader.watch_control()?;
        if let Some(targets) = inputs.targets.filter(|t| t.single.is_none()) {
            loader.track_targets(targets, &kernel_ids)?;
        }
        Ok(loader)
    }
}

impl<Maps> Loader<Maps> {
    /// Hands the `CONTROL` map to the keeper, when there is one.
    fn watch_control(&mut self) -> Result<()> {
        // However the tracer ends, the keeper switches the programs off before it
        // releases their links.
        if let (Some(keeper), Some(Map::Array(control))) =
            (self.keeper.as_mut(), self.maps.get(map_names::CONTROL))
        {
            keeper
                .watch_control(control.fd().as_fd())
                .map_err(LoaderError::Keeper)?;
        }
        Ok(())
    }

    /// Puts the members of a set of targets in the `TARGETS` map, and attaches the
    /// programs that add the processes forking from them or executing `--exe` (those
    /// whose kernel type id `ids` holds).
    fn track_targets(&mut self, targets: &KernelTargets, ids: &KernelTypeIds) -> Result<()> {
        self.targets_map()?.add_members(&targets.members)?;
        // From here on the kernel adds the processes that join.
        if let Some(id) = ids.fork {
            let tracking =
                self.attach_btf_tracepoint(program_names::PROCESS_FORK, "sched_process_fork", id)?;
            self.target_tracking.push(tracking);
        }
        if let Some(id) = ids.exec {
            let tracking =
                self.attach_btf_tracepoint(program_names::PROCESS_EXEC, "sched_process_exec", id)?;
            self.target_tracking.push(tracking);
        }
        Ok(())
    }

    /// Waits for the maps still being created (see [`DEFERRED_MAPS`]).
    pub(super) fn finish_maps(&mut self) -> Result<()> {
        let finished = self.programs.finish_maps()?;
        self.maps.extend(finished);
        Ok(())
    }

    /// Program `name`, verified when first asked for (see [`object::Programs::load`]).
    pub(super) fn program_fd(
        &mut self,
        name: &'static str,
        attach_btf_id: Option<u32>,
    ) -> Result<BorrowedFd<'_>> {
        let waited_for = self.programs.load(name, attach_btf_id)?;
        self.maps.extend(waited_for);
        self.programs.fd(name)
    }
}

impl<'a> LoadInputs<'a> {
    fn new(settings: &'a Settings) -> Self {
        // In a container's PID namespace, PIDs given and shown are the namespace's: the
        // programs then read each task's number in it (0: the host's namespace).
        let pid_ns_ino = {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::metadata("/proc/self/ns/pid")
                .map(|ns| ns.ino())
                .ok()
                .filter(|&ino| is_nested_pid_namespace(ino))
                .unwrap_or(0)
        };
        let targets = settings.targets.as_ref();
        let filter = match targets {
            None => 0,
            // One process's USDT sites are attached for it alone.
            Some(t) if t.single.is_some() => target_filter::SCHED,
            Some(_) => target_filter::SCHED | target_filter::USDT,
        };
        let matching = targets.map_or(0, |t| {
            let mut bits = 0;
            if t.exe.is_some() {
                bits |= target_match::EXE;
            }
            if t.comm.is_some() {
                bits |= target_match::COMM;
            }
            bits
        });
        // SAFETY: sysconf has no memory preconditions.
        let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Self {
            settings,
            targets,
            pid_ns_ino,
            nested: pid_ns_ino != 0,
            follow_forks: targets.is_some_and(|t| t.follow_forks),
            follow_execs: targets.is_some_and(|t| t.exe.is_some() || t.comm.is_some()),
            exe: targets.and_then(|t| t.exe),
            // One target that nothing can join is a constant to compare with: its PID *and*
            // its start time, so a process reusing the PID after it exited is not taken for it.
            single: targets.and_then(|t| t.single),
            filter,
            matching,
            clock_tick_ns: 1_000_000_000 / ticks_per_second,
            min_block_ns: settings.min_block.as_nanos().min(u128::from(u64::MAX)) as u64,
        }
    }

    /// The sizes of the maps that this run does not leave at the object's defaults.
    fn max_entries(&self) -> StdHashMap<&'static str, u32> {
        let settings = self.settings;
        let features = settings.features;
        let ring_buffer_bytes = if features.events {
            settings.ring_buffer_bytes
        } else {
            MIN_RING_BUFFER_BYTES
        };
        let mut max_entries = StdHashMap::from([
            (map_names::USDT_EVENTS, ring_buffer_bytes),
            (map_names::UNWIND_SAMPLES, settings.unwind_ring_bytes),
            (
                map_names::TIMELINE,
                match settings.timeline_min_block {
                    Some(_) => TIMELINE_RING_BYTES,
                    None => MIN_RING_BUFFER_BYTES,
                },
            ),
        ]);
        if let Some(stacks) = settings.map_sizes.stacks {
            max_entries.insert(map_names::STACKS, stacks);
            max_entries.insert(map_names::KERNEL_STACKS, stacks);
        }
        if let Some(entries) = settings.map_sizes.entries {
            for name in MapSizes::HASH_MAPS {
                max_entries.insert(name, entries);
            }
        }
        for name in features.unused_maps() {
            max_entries.insert(name, 1);
        }
        if self.targets.is_none_or(|t| t.single.is_some()) {
            max_entries.insert(map_names::TARGETS, 1);
        }
        if let Some(plan) = settings.plan_sizes {
            let latencies = plan.latencies.max(1);
            max_entries.insert(map_names::USDT_SPECS, plan.sites.max(1));
            max_entries.insert(map_names::PROBE_HITS, plan.probes.max(1));
            max_entries.insert(map_names::LATENCY_STATS, latencies);
            max_entries.insert(map_names::LATENCY_HIST, latencies * histogram::BUCKETS);
        }
        max_entries
    }

    /// Whether the load reads kernel BTF.
    fn needs_kernel_btf(&self) -> bool {
        let features = self.settings.features;
        let filter = self.filter;
        // Only the off-CPU programs, the process trackers, the thread iterator and the
        // target checks that compare a process's start time (the targets of a set, or
        // the one target of the sampling programs) read kernel structures, and only
        // the first three are verified against kernel types; reading kernel BTF costs
        // milliseconds.
        let checks_start_times = filter & target_filter::USDT != 0
            || (filter != 0 && (features.offcpu || features.oncpu));
        features.offcpu
            || features.thread_regs
            || features.python_frames
            || self.follow_forks
            || self.follow_execs
            || self.nested
            || checks_start_times
    }

    /// The values of the object's globals, and the kernel type ids the programs that
    /// need them are verified against: what [`object::load`] asks for once the maps that
    /// need neither are created.
    fn globals(&self, early_btf: Option<KernelBtfReading>) -> Result<(Globals, KernelTypeIds)> {
        let kernel = match self.needs_kernel_btf() {
            true => Some(read_kernel_btf(early_btf)?),
            false => None,
        };
        // After the kernel types: a target that exits while they are read is found
        // gone here, before anything is attached (its start time is a constant below).
        let single_start_ticks = match self.single {
            Some(pid) => process_start_ticks(pid)?,
            None => 0,
        };
        let offsets = self.kernel_offsets(kernel.as_ref())?;
        let ids = self.kernel_type_ids(kernel.as_ref())?;
        Ok((self.global_values(single_start_ticks, &offsets), ids))
    }

    /// The offsets of the kernel structure members the programs read, from `kernel`.
    fn kernel_offsets(&self, kernel: Option<&Btf>) -> Result<KernelOffsets> {
        let features = self.settings.features;
        let (exe, nested) = (self.exe, self.nested);
        let offsets = |wanted: bool, structure: &str, members: &[&str]| match (kernel, wanted) {
            (Some(kernel), true) => kernel.member_offsets(structure, members),
            _ => Ok(vec![0; members.len()]),
        };
        let task = offsets(
            true,
            "task_struct",
            &[
                "pid",
                "group_leader",
                "start_boottime",
                "tgid",
                "comm",
                "se",
                "thread",
            ],
        )?;
        let thread_struct = offsets(true, "thread_struct", &["fsbase"])?;
        let sched_entity = offsets(features.offcpu, "sched_entity", &["sum_exec_runtime"])?;
        let file_offsets = [
            offsets(exe.is_some(), "linux_binprm", &["file"])?,
            offsets(exe.is_some(), "file", &["f_inode"])?,
            offsets(exe.is_some(), "inode", &["i_ino", "i_sb"])?,
            offsets(exe.is_some(), "super_block", &["s_dev"])?,
        ];
        let pid_numbers = [
            offsets(nested, "task_struct", &["thread_pid"])?,
            offsets(nested, "pid", &["level", "numbers"])?,
            offsets(nested, "upid", &["ns"])?,
            offsets(nested, "pid_namespace", &["ns"])?,
            offsets(nested, "ns_common", &["inum"])?,
        ];
        Ok(KernelOffsets {
            task,
            thread_struct,
            sched_entity,
            file_offsets,
            pid_numbers,
        })
    }

    /// The kernel type ids of the tracepoints and the task iterator the programs this run
    /// uses are verified against, from `kernel`.
    fn kernel_type_ids(&self, kernel: Option<&Btf>) -> Result<KernelTypeIds> {
        let features = self.settings.features;
        let (follow_forks, follow_execs) = (self.follow_forks, self.follow_execs);
        let kernel_type_id = |wanted: bool, id: &dyn Fn(&Btf) -> Result<u32, btf::BtfError>| match (
            kernel, wanted,
        ) {
            (Some(kernel), true) => id(kernel).map(Some),
            _ => Ok(None),
        };
        let sched_switch_btf_id =
            kernel_type_id(features.offcpu, &|k| k.typedef_id("btf_trace_sched_switch"))?;
        let fork_btf_id = kernel_type_id(follow_forks, &|k| {
            k.typedef_id("btf_trace_sched_process_fork")
        })?;
        let exec_btf_id = kernel_type_id(follow_execs, &|k| {
            k.typedef_id("btf_trace_sched_process_exec")
        })?;
        let iter_task_btf_id =
            kernel_type_id(features.thread_regs, &|k| k.function_id("bpf_iter_task"))?;
        Ok(KernelTypeIds {
            sched_switch: sched_switch_btf_id,
            fork: fork_btf_id,
            exec: exec_btf_id,
            iter_task: iter_task_btf_id,
        })
    }

    /// The values of the object's globals (`tracer_common::global_names`), with
    /// `single_start_ticks` the start time of the one target and `offsets` the kernel's.
    fn global_values(&self, single_start_ticks: u64, offsets: &KernelOffsets) -> Globals {
        let Self {
            settings,
            targets,
            pid_ns_ino,
            exe,
            single,
            filter,
            matching,
            clock_tick_ns,
            min_block_ns,
            ..
        } = *self;
        let features = settings.features;
        let KernelOffsets {
            task,
            thread_struct,
            sched_entity,
            file_offsets,
            pid_numbers,
        } = offsets;
        // `struct upid` is an int and a pointer: the pointer's offset and its size.
        let upid_ns_offset = pid_numbers[2][0];
        let u32s = |name: &'static str, value: u32| (name, value.to_ne_bytes().to_vec());
        let u64s = |name: &'static str, value: u64| (name, value.to_ne_bytes().to_vec());
        vec![
            u32s(global_names::TARGET_TGID, single.unwrap_or(0)),
            u64s(global_names::TARGET_START_TICKS, single_start_ticks),
            u32s(global_names::TARGET_FILTER, filter),
            u64s(global_names::MIN_BLOCK_NS, min_block_ns),
            u32s(global_names::TASK_PID_OFFSET, task[0]),
            u32s(global_names::TASK_GROUP_LEADER_OFFSET, task[1]),
            u32s(global_names::TASK_START_BOOTTIME_OFFSET, task[2]),
            u32s(global_names::TASK_TGID_OFFSET, task[3]),
            u32s(global_names::TASK_COMM_OFFSET, task[4]),
            u32s(
                global_names::TASK_EXEC_RUNTIME_OFFSET,
                task[5] + sched_entity[0],
            ),
            u32s(global_names::BPRM_FILE_OFFSET, file_offsets[0][0]),
            u32s(global_names::FILE_INODE_OFFSET, file_offsets[1][0]),
            u32s(global_names::INODE_INO_OFFSET, file_offsets[2][0]),
            u32s(global_names::INODE_SB_OFFSET, file_offsets[2][1]),
            u32s(global_names::SB_DEV_OFFSET, file_offsets[3][0]),
            u32s(global_names::TARGET_MATCH, matching),
            u64s(global_names::MATCH_EXE_DEV, exe.map_or(0, |e| e.dev)),
            u64s(global_names::MATCH_EXE_INO, exe.map_or(0, |e| e.ino)),
            (
                global_names::MATCH_COMM,
                targets.and_then(|t| t.comm).unwrap_or_default().to_vec(),
            ),
            u64s(global_names::CLOCK_TICK_NS, clock_tick_ns),
            (diagnostics::LEVEL_GLOBAL, vec![diagnostics::level()]),
            u32s(global_names::PID_NS_INO, pid_ns_ino as u32),
            u32s(global_names::TASK_THREAD_PID_OFFSET, pid_numbers[0][0]),
            u32s(global_names::PID_LEVEL_OFFSET, pid_numbers[1][0]),
            u32s(global_names::PID_NUMBERS_OFFSET, pid_numbers[1][1]),
            u32s(global_names::UPID_NS_OFFSET, upid_ns_offset),
            u32s(global_names::UPID_SIZE, upid_ns_offset + 8),
            u32s(
                global_names::PID_NS_INUM_OFFSET,
                pid_numbers[3][0] + pid_numbers[4][0],
            ),
            u32s(global_names::TASKS_TRACED, u32::from(features.tasks)),
            u32s(global_names::TASK_FSBASE_OFFSET, task[6] + thread_struct[0]),
            u32s(
                global_names::PROCESS_METRICS_ON,
                u32::from(features.process_metrics),
            ),
            u32s(
                global_names::TIMELINE_ON,
                u32::from(settings.timeline_min_block.is_some()),
            ),
            u64s(
                global_names::TIMELINE_MIN_BLOCK_NS,
                settings
                    .timeline_min_block
                    .map_or(0, |d| d.as_nanos().min(u128::from(u64::MAX)) as u64),
            ),
        ]
    }
}

/// The link keeper of a run with USDT sites: the one `early` spawns, else a new one. One
/// spawned for a run without sites goes.
fn take_keeper(
    settings: &Settings,
    early: Option<JoinHandle<std::io::Result<keeper::LinkKeeper>>>,
) -> Result<Option<keeper::LinkKeeper>> {
    Ok(match settings.plan_sizes {
        Some(plan) if plan.sites > 0 => Some(match early {
            Some(starting) => joined(starting).map_err(LoaderError::Keeper)?,
            None => spawn_keeper()?,
        }),
        _ => {
            if let Some(unused) = early {
                // Its end waits for the process to exit: not on this thread.
                std::thread::spawn(move || drop(unused.join()));
            }
            None
        }
    })
}

/// A new link keeper.
pub(super) fn spawn_keeper() -> Result<keeper::LinkKeeper> {
    keeper::LinkKeeper::spawn().map_err(LoaderError::Keeper)
}

/// Kernel BTF, read by the thread `early` or else now.
fn read_kernel_btf(early: Option<KernelBtfReading>) -> Result<Btf> {
    let read = match early {
        Some(reading) => joined(reading),
        None => Btf::read(Path::new(KERNEL_BTF)),
    };
    read.map_err(|e| match e {
        btf::BtfError::Read { path, source } if oserror::cause(&source).is_some() => {
            os_error(format!("reading kernel BTF at {path}"), source)
        }
        e => e.into(),
    })
}

/// Releases the probes of tracers killed together with their keepers (see [`pins`]), and
/// says so: until now those probes stayed attached.
fn repair_what_killed_tracers_left() {
    for repaired in pins::repair() {
        if !repaired.released.is_empty() {
            log::warn!(
                "a tracer killed earlier with its link keeper (process {}) left its probes \
                 attached: released {}",
                repaired.keeper,
                repaired.released
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name in `tracer-common` that the eBPF object lacks would only fail at run time
    /// (a map not found), or silently (a global whose setting is never applied).
    #[test]
    fn every_shared_name_is_in_the_embedded_object() {
        use ::object::{Object as _, ObjectSymbol as _};
        let parsed = aya_obj::Object::parse(EBPF_OBJECT).expect("the embedded object parses");
        for name in map_names::ALL {
            assert!(parsed.maps.contains_key(*name), "no map {name}");
        }
        for name in program_names::ALL {
            assert!(parsed.programs.contains_key(*name), "no program {name}");
        }
        let elf = ::object::File::parse(EBPF_OBJECT).expect("the embedded object is ELF");
        let symbols: std::collections::HashSet<&str> =
            elf.symbols().filter_map(|s| s.name().ok()).collect();
        for name in global_names::ALL {
            assert!(symbols.contains(name), "no global {name}");
        }
    }

    #[test]
    fn detects_a_nested_pid_namespace() {
        assert!(!is_nested_pid_namespace(4026531836));
        assert!(is_nested_pid_namespace(4026532500));
    }
}
