//! The loader: the only module that talks to aya and the kernel's BPF interfaces. It
//! loads the embedded eBPF object with this run's settings, attaches programs, and reads
//! the kernel-side aggregates back as plain `tracer_common` values.

pub mod btf;
mod diagnostics;
pub mod keeper;
mod object;
pub mod pins;
mod restored;
mod rings;
mod sys;
mod targets;
mod thread_sample;

use std::{
    collections::HashMap as StdHashMap,
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    time::Duration,
};

use aya::maps::{Array, HashMap, Map, MapData, PerCpuArray, PerCpuHashMap, RingBuf, StackTraceMap};
use thiserror::Error;
use tracer_common::{
    FIRST_SWITCH_IN_STACK_ID, HitStackKey, KernelStack, LatencyProcessKey, LatencyStats, OffCpuKey,
    OffCpuStart, OffCpuTotal, OnCpuKey, ProbeHits, SWITCH_IN_STACK_IDS, TaskId, TaskKey, TaskName,
    TaskState, TaskTotal, TaskWallKey, ThreadRegs, UsdtSite, control, counter, global_names,
    histogram, map_names, program_names, python::PythonProcess, site_flags, target_filter,
    target_match,
};

pub use diagnostics::{DiagnosticsReader, enable as enable_bpf_diagnostics};
pub use rings::{RecordRing, SnapshotChecks};
pub use sys::supports_ref_ctr_offset;
pub use targets::{COMM_LEN, FileId, KernelTargets, Member, TargetsMap};
pub use thread_sample::{RunningSample, sample_running_thread};

use self::btf::Btf;
use crate::{
    system::oserror::{self, OpenFileLimit},
    system::procfs::ProcessError,
};

/// The eBPF object built from `tracer-ebpf` by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));

const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, Error)]
pub enum LoaderError {
    #[error("kernel feature missing: {0}")]
    KernelFeature(String),
    /// EMFILE or ENFILE: every map, program, link and perf event is a file descriptor.
    #[error("{what}: {limit}")]
    TooManyOpenFiles { what: String, limit: OpenFileLimit },
    /// EPERM or EACCES from a BPF or perf syscall, once the capabilities were checked.
    #[error(
        "{what}: permission denied: tracer needs root, or CAP_BPF and CAP_PERFMON, and a \
         security module (SELinux, AppArmor) or kernel lockdown may refuse it still"
    )]
    NotPermitted {
        what: String,
        source: std::io::Error,
    },
    /// The target exited, or /proc hides it.
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error(transparent)]
    Btf(#[from] btf::BtfError),
    #[error("loading the eBPF programs failed")]
    Load(#[source] aya::EbpfError),
    #[error("eBPF map {name}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error("eBPF object has no map or program named {0}")]
    Missing(&'static str),
    /// uprobe_multi links need CAP_BPF and CAP_PERFMON (checked up front), so a refusal
    /// here comes from elsewhere, a security module say.
    #[error(
        "the kernel refused uprobes on {path} (permission denied): tracer needs CAP_BPF and \
         CAP_PERFMON, or root, and a security module may refuse them still"
    )]
    UprobeNotPermitted { path: PathBuf },
    #[error("the link keeper (the process that holds tracer's uprobes) failed")]
    Keeper(#[source] std::io::Error),
    #[error("attaching a uprobe to {path} at offset {offset:#x}{}",
        pid.map(|p| format!(" in process {p}")).unwrap_or_default())]
    AttachUprobe {
        path: PathBuf,
        offset: u64,
        pid: Option<u32>,
        source: std::io::Error,
    },
}

type Result<T, E = LoaderError> = std::result::Result<T, E>;

/// Settings fixed before load (the eBPF side reads them as constants).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The processes traced (off-CPU, on-CPU and USDT hits); every process when `None`.
    pub targets: Option<KernelTargets>,
    /// Off-CPU intervals shorter than this are dropped in the kernel.
    pub min_block: Duration,
    /// Size of the event ring buffer (a power of two, multiple of the page size).
    pub ring_buffer_bytes: u32,
    /// What this run uses: the maps of everything else are created with one entry, and
    /// kernel BTF is read only for off-CPU accounting, so a run starts fast.
    pub features: Features,
    /// Size of the ring buffer of user stack snapshots (`profile --unwind dwarf`; a power
    /// of two, multiple of the page size); one page when unused.
    pub unwind_ring_bytes: u32,
    /// How many USDT sites, probes and latencies the plan has, when known: the arrays
    /// indexed by them are created (and zeroed by the kernel) at that size only.
    pub plan_sizes: Option<PlanSizes>,
    /// Sizes of the kernel's aggregation maps.
    pub map_sizes: MapSizes,
    /// With `attach --timeline`: the shortest off-CPU interval the timeline shows; the
    /// programs then send intervals to the timeline's ring buffer
    /// ([`Loader::take_timeline`], [`TIMELINE_RING_BYTES`]).
    pub timeline_min_block: Option<Duration>,
}

/// The size of the timeline's ring buffer: about 350k intervals (48 bytes with the
/// record header), drained every millisecond.
pub const TIMELINE_RING_BYTES: u32 = 16 << 20;

/// How many USDT sites, probes and latencies a run attaches (see [`Settings::plan_sizes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanSizes {
    pub sites: u32,
    pub probes: u32,
    pub latencies: u32,
}

/// Entries of the kernel maps that can fill up; `None` keeps the eBPF object's default
/// ([`MapSizes::DEFAULT_STACKS`], [`MapSizes::DEFAULT_ENTRIES`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapSizes {
    /// Distinct stacks (`STACKS`, and `KERNEL_STACKS` apart).
    pub stacks: Option<u32>,
    /// Entries of every hash map: threads off CPU or in a latency, and the distinct keys
    /// aggregated (thread and stacks, task and phase).
    pub entries: Option<u32>,
}

impl MapSizes {
    pub const DEFAULT_STACKS: u32 = 32768;
    pub const DEFAULT_ENTRIES: u32 = 65536;

    const HASH_MAPS: [&str; 10] = [
        map_names::LATENCY_STARTS,
        map_names::OFFCPU_STARTS,
        map_names::OFFCPU_TIME,
        map_names::ONCPU_SAMPLES,
        map_names::TASK_STATES,
        map_names::TASK_TIME,
        map_names::THREAD_TASKS,
        map_names::TASK_WALL,
        map_names::TASK_NAMES,
        map_names::OFFCPU_SNAPSHOTS,
    ];
}

/// The kernel-side features a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// USDT hits sent through the ring buffer (`trace`).
    pub events: bool,
    /// Per-thread latencies between probes (`attach`).
    pub latencies: bool,
    /// Off-CPU time from sched_switch.
    pub offcpu: bool,
    /// On-CPU stack samples.
    pub oncpu: bool,
    /// Runtime task running/parked time.
    pub tasks: bool,
    /// Off-CPU user stacks as snapshots for DWARF unwinding (`sched_switch_dwarf`).
    pub offcpu_snapshots: bool,
    /// Threads' saved user registers from a task iterator (`tracer stacks`).
    pub thread_regs: bool,
    /// Stacks at USDT hits, in events or counted by stack (`trace --stack`).
    pub hit_stacks: bool,
    /// CPython frames walked with user stack snapshots (the FS base that finds a thread's
    /// Python state is read at its kernel BTF offset).
    pub python_frames: bool,
}

impl Features {
    pub const ALL: Features = Features {
        events: true,
        latencies: true,
        offcpu: true,
        oncpu: true,
        tasks: true,
        offcpu_snapshots: true,
        thread_regs: true,
        hit_stacks: true,
        python_frames: true,
    };
    pub const NONE: Features = Features {
        events: false,
        latencies: false,
        offcpu: false,
        oncpu: false,
        tasks: false,
        offcpu_snapshots: false,
        thread_regs: false,
        hit_stacks: false,
        python_frames: false,
    };

    /// The maps only needed by features this run does not use.
    fn unused_maps(&self) -> Vec<&'static str> {
        let stacks = self.offcpu || self.oncpu || self.tasks || self.hit_stacks;
        [
            (
                self.latencies,
                &[
                    map_names::LATENCY_STARTS,
                    map_names::LATENCY_HIST,
                    map_names::LATENCY_STATS,
                    map_names::LATENCY_BY_PROCESS,
                ][..],
            ),
            (
                self.offcpu,
                &[
                    map_names::OFFCPU_STARTS,
                    map_names::OFFCPU_TIME,
                    map_names::KERNEL_STACKS,
                    map_names::LAST_USER_STACKS,
                ][..],
            ),
            (self.oncpu, &[map_names::ONCPU_SAMPLES][..]),
            (
                self.offcpu_snapshots,
                &[map_names::OFFCPU_SNAPSHOTS, map_names::SNAPSHOT_CHECKS][..],
            ),
            (
                self.tasks,
                &[
                    map_names::TASK_STATES,
                    map_names::TASK_TIME,
                    map_names::THREAD_TASKS,
                    map_names::TASK_WALL,
                    map_names::TASK_NAMES,
                ][..],
            ),
            (stacks, &[map_names::STACKS][..]),
            (
                self.python_frames,
                &[
                    map_names::PYTHON_PROCESSES,
                    map_names::PYTHON_THREADS,
                    map_names::PYTHON_SCRATCH,
                ][..],
            ),
            (self.hit_stacks, &[map_names::HIT_STACKS][..]),
        ]
        .into_iter()
        .filter(|(used, _)| !used)
        .flat_map(|(_, names)| names.iter().copied())
        .collect()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            targets: None,
            min_block: Duration::ZERO,
            ring_buffer_bytes: 1 << 22,
            features: Features::ALL,
            unwind_ring_bytes: MIN_RING_BUFFER_BYTES,
            map_sizes: MapSizes::default(),
            plan_sizes: None,
            timeline_min_block: None,
        }
    }
}

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

/// The link keeper started by [`Loader::start_keeper`], for the next load to take.
static EARLY_KEEPER: std::sync::Mutex<
    Option<std::thread::JoinHandle<std::io::Result<keeper::LinkKeeper>>>,
> = std::sync::Mutex::new(None);

/// Kernel BTF read by [`Loader::prepare`], for the next load to take.
static EARLY_KERNEL_BTF: std::sync::Mutex<
    Option<std::thread::JoinHandle<std::result::Result<Btf, btf::BtfError>>>,
> = std::sync::Mutex::new(None);

/// Every kernel struct, typedef and function [`Loader::load`] may look up.
const KERNEL_STRUCTS_USED: [&str; 11] = [
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
const KERNEL_TYPEDEFS_USED: [&str; 3] = [
    "btf_trace_sched_switch",
    "btf_trace_sched_process_fork",
    "btf_trace_sched_process_exec",
];
const KERNEL_FUNCTIONS_USED: [&str; 1] = ["bpf_iter_task"];

/// The smallest ring buffer the kernel accepts (one page).
const MIN_RING_BUFFER_BYTES: u32 = 4096;

/// What `error`, returned by the system while doing `what`, means: too many open files,
/// permission denied, or (otherwise) a kernel feature missing.
pub(crate) fn os_error(what: impl Into<String>, error: std::io::Error) -> LoaderError {
    let what = what.into();
    match oserror::cause(&error) {
        Some(oserror::Cause::TooManyOpenFiles { system }) => LoaderError::TooManyOpenFiles {
            what,
            limit: OpenFileLimit::now(system),
        },
        Some(oserror::Cause::NotPermitted) => LoaderError::NotPermitted {
            what,
            source: error,
        },
        None => LoaderError::KernelFeature(format!("{what}: {error}")),
    }
}

/// When process `pid` started, in clock ticks since boot (field 22 of /proc/PID/stat).
/// A target that exited (a zombie's start time is still there) or that /proc hides is
/// reported as such.
fn process_start_ticks(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat =
        std::fs::read_to_string(&path).map_err(|e| match ProcessError::check_target(pid) {
            Some(gone) => gone.into(),
            None => os_error(format!("reading {path}"), e),
        })?;
    if let Some(gone) = ProcessError::check_target(pid) {
        return Err(gone.into());
    }
    crate::system::procfs::stat_field(&stat, 22)
        .and_then(|ticks| ticks.parse().ok())
        .ok_or_else(|| LoaderError::KernelFeature(format!("no start time in {path}: {stat:?}")))
}

/// The kernel's inode number of the initial PID namespace (`PROC_PID_INIT_INO`).
const INIT_PID_NAMESPACE_INODE: u64 = 0xEFFF_FFFC;

/// Whether `pid_ns_inode` (of /proc/self/ns/pid) is a namespace below the host's.
fn is_nested_pid_namespace(pid_ns_inode: u64) -> bool {
    pid_ns_inode != INIT_PID_NAMESPACE_INODE
}

/// One uprobe at a USDT site.
#[derive(Debug, Clone)]
pub struct UsdtAttachment {
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

/// A program attached: dropping it detaches the program and closes the perf event it runs
/// on, if any.
struct Link {
    _link: OwnedFd,
    _perf_event: Option<OwnedFd>,
}

/// A program attached to the scheduler, to CPU clocks or to a process tracepoint: it runs
/// until this is dropped (or [`Attachment::detach`]ed); the maps stay readable after.
#[must_use = "dropping an Attachment detaches its program at once"]
pub struct Attachment {
    links: Vec<Link>,
}

impl Attachment {
    /// Where the program is attached: one per CPU for samplers, else one.
    pub fn points(&self) -> usize {
        self.links.len()
    }

    /// Detaches the program now.
    pub fn detach(self) {}
}

/// How the kernel takes user stacks where a program captures them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserStacks {
    /// Walked by frame pointers in the kernel (a stack id in `STACKS`).
    FramePointers,
    /// Registers and stack bytes sent as snapshots for DWARF unwinding in user space, to
    /// be read from [`Loader::take_unwind_samples`]; load with `Settings::unwind_ring_bytes`
    /// set (and `Features::offcpu_snapshots` for off-CPU accounting).
    Snapshots,
}

/// A probe's hits, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeHitTotals {
    pub count: u64,
    /// When it first fired (CLOCK_MONOTONIC ns); `None` when it never did.
    pub first_ns: Option<u64>,
}

/// Kernel-side aggregates of one latency, summed over CPUs.
#[derive(Debug, Clone, Default)]
pub struct LatencyData {
    /// Counts per `tracer_common::histogram` bucket.
    pub buckets: Vec<u64>,
    pub stats: LatencyStats,
}

/// The loaded programs and their maps.
pub struct Loader {
    maps: StdHashMap<String, Map>,
    programs: object::Programs,
    /// The kernel's BTF type id of `btf_trace_sched_switch` (off-CPU runs only).
    sched_switch_btf_id: Option<u32>,
    /// The kernel's BTF type id of function `bpf_iter_task` (`Features::thread_regs`).
    iter_task_btf_id: Option<u32>,
    /// Holds the uprobe_multi links (one per program and file, at most
    /// [`keeper::MAX_UPROBES_PER_LINK`] sites each) out of this process's reach: see
    /// [`keeper`]. Started with the first USDT attach.
    keeper: Option<keeper::LinkKeeper>,
    /// The sites attached in one process each (process, file, file offset): the detach
    /// waits for their instructions to be back.
    sites_in_one_process: Vec<(u32, PathBuf, u64)>,
    /// The sites attached in every process that maps their file (file, file offset): the
    /// detach waits for them in each target still running.
    sites_in_any_process: Vec<(PathBuf, u64)>,
    usdt_sites_attached: usize,
    /// The programs that add processes forking from targets or executing `--exe`.
    target_tracking: Vec<Attachment>,
}

impl Loader {
    /// Loads the eBPF object with `settings`. Programs are verified when first attached.
    pub fn load(settings: &Settings) -> Result<Self> {
        let features = settings.features;
        repair_what_killed_tracers_left();
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
        let nested = pid_ns_ino != 0;
        let targets = settings.targets.as_ref();
        let follow_forks = targets.is_some_and(|t| t.follow_forks);
        let follow_execs = targets.is_some_and(|t| t.exe.is_some() || t.comm.is_some());
        let exe = targets.and_then(|t| t.exe);
        // One target that nothing can join is a constant to compare with: its PID *and*
        // its start time, so a process reusing the PID after it exited is not taken for it.
        let single = targets.and_then(|t| t.single);
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
        let clock_tick_ns = 1_000_000_000 / ticks_per_second;
        let min_block_ns = settings.min_block.as_nanos().min(u64::MAX as u128) as u64;
        let ring_buffer_bytes = if features.events {
            settings.ring_buffer_bytes
        } else {
            MIN_RING_BUFFER_BYTES
        };
        let u32s = |name: &'static str, value: u32| (name, value.to_ne_bytes().to_vec());
        let u64s = |name: &'static str, value: u64| (name, value.to_ne_bytes().to_vec());
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
        if targets.is_none_or(|t| t.single.is_some()) {
            max_entries.insert(map_names::TARGETS, 1);
        }
        if let Some(plan) = settings.plan_sizes {
            let latencies = plan.latencies.max(1);
            max_entries.insert(map_names::USDT_SPECS, plan.sites.max(1));
            max_entries.insert(map_names::PROBE_HITS, plan.probes.max(1));
            max_entries.insert(map_names::LATENCY_STATS, latencies);
            max_entries.insert(map_names::LATENCY_HIST, latencies * histogram::BUCKETS);
        }
        // A run with USDT sites takes its keeper now (started early, or now: it starts
        // while the object loads); one started early for nothing goes.
        let keeper = match settings.plan_sizes {
            Some(plan) if plan.sites > 0 => Some(spawn_keeper()?),
            _ => {
                if let Some(unused) = take_early_keeper() {
                    // Its end waits for the process to exit: not on this thread.
                    std::thread::spawn(move || drop(unused.join()));
                }
                None
            }
        };
        // Kernel types (read on a thread since the launch began) are waited for only once
        // the maps that do not need them are created: the load does both at once.
        let mut kernel_ids = KernelTypeIds::default();
        let globals = || -> Result<Vec<(&'static str, Vec<u8>)>> {
            // Only the off-CPU programs, the process trackers, the thread iterator and the
            // target checks that compare a process's start time (the targets of a set, or
            // the one target of the sampling programs) read kernel structures, and only
            // the first three are verified against kernel types; reading kernel BTF costs
            // milliseconds.
            let checks_start_times = filter & target_filter::USDT != 0
                || (filter != 0 && (features.offcpu || features.oncpu));
            let kernel = (features.offcpu
                || features.thread_regs
                || features.python_frames
                || follow_forks
                || follow_execs
                || nested
                || checks_start_times)
                .then(|| {
                    let early = EARLY_KERNEL_BTF
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .take();
                    let read = match early {
                        Some(reading) => reading
                            .join()
                            .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                        None => Btf::read(Path::new(KERNEL_BTF)),
                    };
                    read.map_err(|e| match e {
                        btf::BtfError::Read { path, source }
                            if oserror::cause(&source).is_some() =>
                        {
                            os_error(format!("reading kernel BTF at {path}"), source)
                        }
                        e => e.into(),
                    })
                })
                .transpose()?;
            // After the kernel types: a target that exits while they are read is found
            // gone here, before anything is attached (its start time is a constant below).
            let single_start_ticks = match single {
                Some(pid) => process_start_ticks(pid)?,
                None => 0,
            };
            let offsets = |wanted: bool, structure: &str, members: &[&str]| match (&kernel, wanted)
            {
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
            // `struct upid` is an int and a pointer: the pointer's offset and its size.
            let upid_ns_offset = pid_numbers[2][0];
            let kernel_type_id =
                |wanted: bool, id: &dyn Fn(&Btf) -> Result<u32, btf::BtfError>| match (
                    &kernel, wanted,
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
            kernel_ids = KernelTypeIds {
                sched_switch: sched_switch_btf_id,
                fork: fork_btf_id,
                exec: exec_btf_id,
                iter_task: iter_task_btf_id,
            };
            Ok(vec![
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
                    global_names::TIMELINE_ON,
                    u32::from(settings.timeline_min_block.is_some()),
                ),
                u64s(
                    global_names::TIMELINE_MIN_BLOCK_NS,
                    settings
                        .timeline_min_block
                        .map_or(0, |d| d.as_nanos().min(u64::MAX as u128) as u64),
                ),
            ])
        };
        // With USDT sites to attach first, the deferred maps wait for them.
        let (maps, programs) = object::load(
            EBPF_OBJECT,
            globals,
            &max_entries,
            &DEFERRED_MAPS,
            keeper.is_some(),
        )?;
        let KernelTypeIds {
            sched_switch: sched_switch_btf_id,
            fork: fork_btf_id,
            exec: exec_btf_id,
            iter_task: iter_task_btf_id,
        } = kernel_ids;
        let mut loader = Self {
            maps,
            programs,
            sched_switch_btf_id,
            iter_task_btf_id,
            keeper,
            sites_in_one_process: Vec::new(),
            sites_in_any_process: Vec::new(),
            usdt_sites_attached: 0,
            target_tracking: Vec::new(),
        };
        // However the tracer ends, the keeper switches the programs off before it
        // releases their links.
        if let (Some(keeper), Some(Map::Array(control))) =
            (loader.keeper.as_mut(), loader.maps.get(map_names::CONTROL))
        {
            keeper
                .watch_control(control.fd().as_fd())
                .map_err(LoaderError::Keeper)?;
        }
        if let Some(targets) = targets.filter(|t| t.single.is_none()) {
            loader.targets_map()?.add_members(&targets.members)?;
            // From here on the kernel adds the processes that join.
            if let Some(id) = fork_btf_id {
                let tracking = loader.attach_btf_tracepoint(
                    program_names::PROCESS_FORK,
                    "sched_process_fork",
                    id,
                )?;
                loader.target_tracking.push(tracking);
            }
            if let Some(id) = exec_btf_id {
                let tracking = loader.attach_btf_tracepoint(
                    program_names::PROCESS_EXEC,
                    "sched_process_exec",
                    id,
                )?;
                loader.target_tracking.push(tracking);
            }
        }
        Ok(loader)
    }

    /// A handle on the set of target processes, to add to it and read it while the
    /// programs run (a set of processes: see [`KernelTargets`]).
    pub fn targets_map(&self) -> Result<TargetsMap> {
        let name = map_names::TARGETS;
        match self.maps.get(name) {
            Some(Map::HashMap(data)) => TargetsMap::from_map(data),
            _ => Err(LoaderError::Missing(name)),
        }
    }

    /// Stops adding the processes that fork from targets or start the `--exe` file.
    pub fn detach_targets(&mut self) {
        self.target_tracking.clear();
    }

    /// Attaches BTF tracepoint program `name` to `tracepoint` (BTF type id `btf_id`).
    fn attach_btf_tracepoint(
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
    pub fn attach_usdt_sites(
        &mut self,
        sites: &[(u32, &UsdtSite, &UsdtAttachment)],
        warm_up: UprobeWarmUp,
    ) -> Result<()> {
        self.attach_more_usdt_sites(sites)?;
        if let Some(keeper) = self.keeper.as_mut() {
            warm_up.release(keeper);
        }
        // Events flow; now the maps the other programs and the readers need.
        self.finish_maps()
    }

    /// Attaches sites found after [`Loader::attach_usdt_sites`] (a library mapped later, a
    /// new process's files), with cookies after those attached already: the arrays must
    /// have been sized for them (see `ProbePlan::room_to_grow`).
    pub fn attach_more_usdt_sites(
        &mut self,
        sites: &[(u32, &UsdtSite, &UsdtAttachment)],
    ) -> Result<()> {
        let mut groups: Vec<(&'static str, &UsdtAttachment, Vec<sys::MultiUprobe>)> = Vec::new();
        for (cookie, site, target) in sites {
            self.set_usdt_site(*cookie, site)?;
            match target.pid {
                Some(pid) => {
                    self.sites_in_one_process
                        .push((pid, target.path.clone(), target.offset))
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
    pub fn hold_at_dlopen(&mut self, path: &Path, offset: u64, pid: Option<u32>) -> Result<()> {
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

    /// The processes whose loader mapped objects, each with what the kernel did to it
    /// (a [`tracer_common::held`] value; see [`Loader::hold_at_dlopen`]).
    pub fn held(&self) -> Vec<(u32, u32)> {
        match self.hash_map::<u32, u32>(map_names::HELD) {
            Ok(map) => map.iter().flatten().collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Has the kernel stop processes at `dlopen` until `CLOCK_MONOTONIC` second
    /// `until_s` (see [`control::HOLD_UNTIL_S`]).
    pub fn hold_until(&mut self, until_s: u32) -> Result<()> {
        self.set_control(control::HOLD_UNTIL_S, until_s)
    }

    /// Takes `pid` off the held list; the caller continues it.
    pub fn release_held(&mut self, pid: u32) {
        let name = map_names::HELD;
        if let Some(map) = self.maps.get_mut(name)
            && let Ok(mut held) = HashMap::<_, u32, u32>::try_from(map)
        {
            let _ = held.remove(&pid);
        }
    }

    /// Waits for the maps still being created (see [`DEFERRED_MAPS`]).
    fn finish_maps(&mut self) -> Result<()> {
        let finished = self.programs.finish_maps()?;
        self.maps.extend(finished);
        Ok(())
    }

    /// Program `name`, verified when first asked for (see [`object::Programs::load`]).
    fn program_fd(
        &mut self,
        name: &'static str,
        attach_btf_id: Option<u32>,
    ) -> Result<BorrowedFd<'_>> {
        let waited_for = self.programs.load(name, attach_btf_id)?;
        self.maps.extend(waited_for);
        self.programs.fd(name)
    }

    /// Starts parsing the eBPF object and, with `kernel_types` (off-CPU accounting,
    /// following processes), reading the kernel types the programs need, on threads of
    /// their own, for the next [`Loader::load`]: call it first thing, and the
    /// milliseconds they take pass while the targets are scanned.
    pub fn prepare(kernel_types: bool) {
        object::parse_early(EBPF_OBJECT);
        if !kernel_types {
            return;
        }
        let mut early = EARLY_KERNEL_BTF
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if early.is_none() {
            *early = Some(std::thread::spawn(|| {
                let btf = Btf::read(Path::new(KERNEL_BTF))?;
                // Only a head start: what fails here fails again, and is reported, where
                // the load looks the type up itself (only if it needs it).
                let _ = btf.look_up_at_once(
                    &KERNEL_STRUCTS_USED,
                    &KERNEL_TYPEDEFS_USED,
                    &KERNEL_FUNCTIONS_USED,
                );
                Ok(btf)
            }));
        }
    }

    /// Starts the link keeper (see [`keeper`]) on a thread of its own, for a launch that
    /// attaches USDT sites: spawning it waits for the exec of tracer's own binary, which
    /// takes a few milliseconds (more while the launch's other threads hold both CPUs),
    /// and they then pass while the targets are scanned, not on the way to the first
    /// event. The next [`Loader::load`] takes it; if it has no sites, the keeper exits.
    pub fn start_keeper() {
        let mut early = EARLY_KEEPER
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if early.is_none() {
            *early = Some(std::thread::spawn(keeper::LinkKeeper::spawn));
        }
    }

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

    /// Stops recording USDT hits now, in the kernel, before the slow detach: whatever
    /// fires afterwards is neither counted nor sent.
    /// Starts the wall-clock profile: the scheduler and sampling programs record from now
    /// on (see [`control::RECORDING`]).
    pub fn start_recording(&mut self) -> Result<()> {
        self.set_control(control::RECORDING, 1)
    }

    pub fn stop_recording(&mut self) -> Result<()> {
        self.set_control(control::STOPPED, 1)
    }

    /// Sets one of the `CONTROL` switches (see [`control`]).
    fn set_control(&mut self, index: u32, value: u32) -> Result<()> {
        let name = map_names::CONTROL;
        let map = self.maps.get_mut(name).ok_or(LoaderError::Missing(name))?;
        let mut control: Array<_, u32> =
            Array::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        control
            .set(index, &value, 0)
            .map_err(|source| LoaderError::Map { name, source })
    }

    /// How many USDT sites are attached.
    pub fn usdt_site_count(&self) -> usize {
        self.usdt_sites_attached
    }

    /// Detaches every USDT probe now (semaphores drop back), keeping the maps readable.
    /// The keeper does the removal, so a SIGKILL arriving meanwhile cannot interrupt it.
    pub fn detach_usdt(&mut self) -> Result<()> {
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

    /// With `--bpf-debug`, starts showing the diagnostics of the programs attached so far
    /// (call it once every program is attached), naming probe N `probe_names[N]`; `None`
    /// when off or when none logs.
    pub fn start_diagnostics(&self, probe_names: &[String]) -> Option<DiagnosticsReader> {
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
    pub fn program_misses(&self) -> Vec<(&'static str, u64)> {
        let mut misses: Vec<(&'static str, u64)> = self
            .programs
            .loaded_by_name()
            .filter_map(|(name, prog)| Some((name, sys::program_misses(prog).ok()?)))
            .filter(|(_, misses)| *misses > 0)
            .collect();
        misses.sort();
        misses
    }

    /// The process holding the USDT links, once started.
    pub fn keeper_pid(&self) -> Option<u32> {
        self.keeper.as_ref().map(keeper::LinkKeeper::pid)
    }

    /// Attaches off-CPU accounting to the scheduler's `sched_switch` BTF tracepoint, the
    /// user stacks where threads block taken as `stacks` says (with snapshots, their ids
    /// stand in for stack ids).
    pub fn attach_offcpu(&mut self, stacks: UserStacks) -> Result<Attachment> {
        let name = match stacks {
            UserStacks::FramePointers => program_names::SCHED_SWITCH,
            UserStacks::Snapshots => program_names::SCHED_SWITCH_DWARF,
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
    pub fn thread_registers(&mut self, tgid: u32) -> Result<Vec<ThreadRegs>> {
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
    pub fn attach_oncpu_sampling(
        &mut self,
        stacks: UserStacks,
        frequency_hz: u64,
    ) -> Result<Attachment> {
        let name = match stacks {
            UserStacks::FramePointers => program_names::ONCPU_SAMPLE,
            UserStacks::Snapshots => program_names::ONCPU_SAMPLE_DWARF,
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

    /// Takes the timeline's ring buffer ([`tracer_common::TimelineEvent`]).
    pub fn take_timeline(&mut self) -> Result<RecordRing> {
        self.finish_maps()?;
        self.take_ring(map_names::TIMELINE)
    }

    /// Takes the ring buffer of user stack snapshots ([`tracer_common::UnwindSample`]).
    pub fn take_unwind_samples(&mut self) -> Result<RecordRing> {
        self.finish_maps()?;
        self.take_ring(map_names::UNWIND_SAMPLES)
    }

    /// Takes the map through which user space tells the kernel how to check that an
    /// off-CPU snapshot can be reused ([`tracer_common::SnapshotCheck`] by snapshot id).
    pub fn take_snapshot_checks(&mut self) -> Result<SnapshotChecks> {
        self.finish_maps()?;
        let name = map_names::SNAPSHOT_CHECKS;
        let map = self.maps.remove(name).ok_or(LoaderError::Missing(name))?;
        HashMap::try_from(map)
            .map(SnapshotChecks)
            .map_err(|source| LoaderError::Map { name, source })
    }

    /// Marks threads as off CPU since `start.ts_ns`, for those already blocked when
    /// profiling starts; a thread's next switch out replaces its mark (so marking a thread
    /// that is running is harmless), and its next switch in accounts the time since.
    /// Entries the kernel already recorded are kept.
    pub fn seed_offcpu_starts(&mut self, starts: &[(u32, OffCpuStart)]) -> Result<()> {
        self.finish_maps()?;
        const BPF_NOEXIST: u64 = 1;
        let name = map_names::OFFCPU_STARTS;
        let map = self.maps.get_mut(name).ok_or(LoaderError::Missing(name))?;
        let mut map: HashMap<&mut MapData, u32, OffCpuStart> =
            HashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        for (tid, start) in starts {
            match map.insert(tid, start, BPF_NOEXIST) {
                Ok(()) => {}
                // Already recorded by the kernel, which knows better.
                Err(aya::maps::MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
                Err(source) => return Err(LoaderError::Map { name, source }),
            }
        }
        Ok(())
    }

    /// Tells the programs that process `tgid` runs a CPython interpreter laid out as
    /// `process` says: its snapshots carry its threads' Python frames from now on.
    pub fn add_python_process(&mut self, tgid: u32, process: &PythonProcess) -> Result<()> {
        self.finish_maps()?;
        let name = map_names::PYTHON_PROCESSES;
        let map = self.maps.get_mut(name).ok_or(LoaderError::Missing(name))?;
        let mut map: HashMap<&mut MapData, u32, PythonProcess> =
            HashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        map.insert(&tgid, process, 0)
            .map_err(|source| LoaderError::Map { name, source })?;
        self.set_control(control::PYTHON, 1)
    }

    /// On-CPU sample counts per thread and stacks.
    pub fn oncpu_samples(&self) -> Result<Vec<(OnCpuKey, u64)>> {
        let name = map_names::ONCPU_SAMPLES;
        let map = self.hash_map::<OnCpuKey, u64>(name)?;
        map.iter()
            .collect::<Result<_, _>>()
            .map_err(|source| LoaderError::Map { name, source })
    }

    fn array<T: aya::Pod>(&self, name: &'static str) -> Result<Array<&MapData, T>> {
        let map = self.maps.get(name).ok_or(LoaderError::Missing(name))?;
        Array::try_from(map).map_err(|source| LoaderError::Map { name, source })
    }

    fn per_cpu_array<T: aya::Pod>(&self, name: &'static str) -> Result<PerCpuArray<&MapData, T>> {
        let map = self.maps.get(name).ok_or(LoaderError::Missing(name))?;
        PerCpuArray::try_from(map).map_err(|source| LoaderError::Map { name, source })
    }

    fn hash_map<K: aya::Pod, V: aya::Pod>(
        &self,
        name: &'static str,
    ) -> Result<HashMap<&MapData, K, V>> {
        let map = self.maps.get(name).ok_or(LoaderError::Missing(name))?;
        HashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })
    }

    /// USDT program `name`, verified by the kernel when first used.
    fn usdt_program(&mut self, name: &'static str) -> Result<BorrowedFd<'_>> {
        self.program_fd(name, None)
    }

    /// Every entry of hash map `name`.
    fn entries<K: aya::Pod, V: aya::Pod>(&self, name: &'static str) -> Result<Vec<(K, V)>> {
        self.hash_map::<K, V>(name)?
            .iter()
            .collect::<Result<_, _>>()
            .map_err(|source| LoaderError::Map { name, source })
    }

    /// The histogram and totals of latency `latency_id`.
    pub fn latency(&self, latency_id: u32) -> Result<LatencyData> {
        let hist = self.array::<u64>(map_names::LATENCY_HIST)?;
        let stats_map = self.per_cpu_array::<LatencyStats>(map_names::LATENCY_STATS)?;
        let map_error = |name| move |source| LoaderError::Map { name, source };
        let mut data = LatencyData {
            buckets: vec![0; histogram::BUCKETS as usize],
            ..Default::default()
        };
        data.stats.min_ns = u64::MAX;
        for per_cpu in stats_map
            .get(&latency_id, 0)
            .map_err(map_error(map_names::LATENCY_STATS))?
            .iter()
        {
            if per_cpu.count == 0 {
                continue;
            }
            data.stats.count += per_cpu.count;
            data.stats.total_ns += per_cpu.total_ns;
            data.stats.min_ns = data.stats.min_ns.min(per_cpu.min_ns);
            data.stats.max_ns = data.stats.max_ns.max(per_cpu.max_ns);
        }
        if data.stats.count == 0 {
            return Ok(data);
        }
        for (bucket, slot) in data.buckets.iter_mut().enumerate() {
            let index = latency_id * histogram::BUCKETS + bucket as u32;
            *slot = hist
                .get(&index, 0)
                .map_err(map_error(map_names::LATENCY_HIST))?;
        }
        Ok(data)
    }

    /// The totals of every latency per process: `(tgid, latency_id)` and the stats,
    /// summed over CPUs.
    pub fn latency_by_process(&self) -> Result<Vec<(LatencyProcessKey, LatencyStats)>> {
        let name = map_names::LATENCY_BY_PROCESS;
        let map = self.maps.get(name).ok_or(LoaderError::Missing(name))?;
        let map: PerCpuHashMap<&MapData, LatencyProcessKey, LatencyStats> =
            PerCpuHashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        let mut out = Vec::new();
        for entry in map.iter() {
            let (key, per_cpu) = entry.map_err(|source| LoaderError::Map { name, source })?;
            let mut total = LatencyStats {
                min_ns: u64::MAX,
                ..LatencyStats::default()
            };
            for cpu in per_cpu.iter().filter(|cpu| cpu.count > 0) {
                total.count += cpu.count;
                total.total_ns += cpu.total_ns;
                total.min_ns = total.min_ns.min(cpu.min_ns);
                total.max_ns = total.max_ns.max(cpu.max_ns);
            }
            out.push((key, total));
        }
        out.sort_by_key(|(key, _)| (key.latency_id, key.tgid));
        Ok(out)
    }

    /// Hits counted by probe, process and stacks (`trace --count --stack`), summed over
    /// CPUs.
    pub fn hit_stacks(&self) -> Result<Vec<(HitStackKey, u64)>> {
        let name = map_names::HIT_STACKS;
        let map = self.maps.get(name).ok_or(LoaderError::Missing(name))?;
        let map: PerCpuHashMap<&MapData, HitStackKey, u64> =
            PerCpuHashMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        let mut out = Vec::new();
        for entry in map.iter() {
            let (key, per_cpu) = entry.map_err(|source| LoaderError::Map { name, source })?;
            out.push((key, per_cpu.iter().sum()));
        }
        Ok(out)
    }

    /// How often probe `probe_id` fired, and when it first did.
    pub fn probe_hits(&self, probe_id: u32) -> Result<ProbeHitTotals> {
        let name = map_names::PROBE_HITS;
        let hits = self.per_cpu_array::<ProbeHits>(name)?;
        let per_cpu = hits
            .get(&probe_id, 0)
            .map_err(|source| LoaderError::Map { name, source })?;
        Ok(per_cpu.iter().filter(|cpu| cpu.count > 0).fold(
            ProbeHitTotals::default(),
            |total, cpu| ProbeHitTotals {
                count: total.count + cpu.count,
                first_ns: Some(total.first_ns.map_or(cpu.first_ns, |t| t.min(cpu.first_ns))),
            },
        ))
    }

    /// The loss counters (`tracer_common::counter`), summed over CPUs.
    pub fn counters(&self) -> Result<[u64; counter::COUNT as usize]> {
        let name = map_names::COUNTERS;
        let map = self.per_cpu_array::<u64>(name)?;
        let mut out = [0; counter::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = map
                .get(&(i as u32), 0)
                .map_err(|source| LoaderError::Map { name, source })?
                .iter()
                .sum();
        }
        Ok(out)
    }

    /// Off-CPU time accumulated per thread and stacks.
    pub fn offcpu_totals(&self) -> Result<Vec<(OffCpuKey, OffCpuTotal)>> {
        self.entries(map_names::OFFCPU_TIME)
    }

    /// Threads that are off CPU right now (their interval has not ended yet).
    pub fn offcpu_pending(&self) -> Result<Vec<(u32, OffCpuStart)>> {
        let mut starts: Vec<(u32, OffCpuStart)> = self.entries(map_names::OFFCPU_STARTS)?;
        starts.retain(|(_, start)| start.ts_ns != tracer_common::OFFCPU_START_ENDED);
        Ok(starts)
    }

    /// Running and parked time per runtime task.
    pub fn task_times(&self) -> Result<Vec<(TaskKey, TaskTotal)>> {
        self.entries(map_names::TASK_TIME)
    }

    /// Tasks whose interval is still open (parked or running right now).
    pub fn task_states(&self) -> Result<Vec<(TaskId, TaskState)>> {
        self.entries(map_names::TASK_STATES)
    }

    /// Threads' time while they ran a task (on-CPU samples taken by frame pointers,
    /// off-CPU intervals), by task and stacks.
    pub fn task_wall(&self) -> Result<Vec<(TaskWallKey, OffCpuTotal)>> {
        self.entries(map_names::TASK_WALL)
    }

    /// What runtimes called their tasks.
    pub fn task_names(&self) -> Result<Vec<(TaskId, TaskName)>> {
        self.entries(map_names::TASK_NAMES)
    }

    /// The instruction pointers of stack `id`, innermost first; empty when `id` is an error.
    pub fn stack(&self, id: i32) -> Result<Vec<u64>> {
        if id < 0 {
            return Ok(Vec::new());
        }
        if (FIRST_SWITCH_IN_STACK_ID..FIRST_SWITCH_IN_STACK_ID + SWITCH_IN_STACK_IDS as i32)
            .contains(&id)
        {
            let name = map_names::KERNEL_STACKS;
            return match self.hash_map::<i32, KernelStack>(name)?.get(&id, 0) {
                Ok(stack) => Ok(stack.ips[..(stack.len as usize).min(stack.ips.len())].to_vec()),
                Err(aya::maps::MapError::KeyNotFound) => Ok(Vec::new()),
                Err(source) => Err(LoaderError::Map { name, source }),
            };
        }
        let name = map_names::STACKS;
        let map = self.maps.get(name).ok_or(LoaderError::Missing(name))?;
        let stacks =
            StackTraceMap::try_from(map).map_err(|source| LoaderError::Map { name, source })?;
        match stacks.get(&(id as u32), 0) {
            Ok(trace) => Ok(trace.frames().iter().map(|f| f.ip).collect()),
            Err(aya::maps::MapError::KeyNotFound) => Ok(Vec::new()),
            Err(source) => Err(LoaderError::Map { name, source }),
        }
    }

    /// Takes the event ring buffer (for `tracer trace`).
    pub fn take_events(&mut self) -> Result<RecordRing> {
        self.take_ring(map_names::USDT_EVENTS)
    }

    fn take_ring(&mut self, name: &'static str) -> Result<RecordRing> {
        let map = self.maps.remove(name).ok_or(LoaderError::Missing(name))?;
        RingBuf::try_from(map)
            .map(RecordRing)
            .map_err(|source| LoaderError::Map { name, source })
    }
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

/// How long a detach waits for the sites to have their instructions back.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(2);

/// The keeper [`Loader::start_keeper`] started, else a new one.
fn spawn_keeper() -> Result<keeper::LinkKeeper> {
    match take_early_keeper() {
        Some(starting) => starting
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        None => keeper::LinkKeeper::spawn(),
    }
    .map_err(LoaderError::Keeper)
}

fn take_early_keeper() -> Option<std::thread::JoinHandle<std::io::Result<keeper::LinkKeeper>>> {
    EARLY_KEEPER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .take()
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

/// The kernel type ids the programs that need them are verified against.
#[derive(Default)]
struct KernelTypeIds {
    sched_switch: Option<u32>,
    fork: Option<u32>,
    exec: Option<u32>,
    iter_task: Option<u32>,
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
    fn release(mut self, keeper: &mut keeper::LinkKeeper) {
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
    fn reads_the_start_time_from_proc_stat() {
        assert!(process_start_ticks(std::process::id()).is_ok_and(|t| t > 0));
        let err = process_start_ticks(4194304).unwrap_err();
        assert_eq!(err.to_string(), "process 4194304 exited");
    }

    #[test]
    fn os_errors_name_their_cause() {
        let error = |errno| {
            os_error(
                "creating eBPF map X",
                std::io::Error::from_raw_os_error(errno),
            )
        };
        let emfile = error(libc::EMFILE).to_string();
        assert!(
            emfile.starts_with("creating eBPF map X: too many open files: the open-file limit"),
            "{emfile}"
        );
        assert!(emfile.contains("ulimit -n is "), "{emfile}");
        assert!(!emfile.contains("kernel feature"), "{emfile}");
        assert!(error(libc::ENFILE).to_string().contains("fs.file-max"));
        let eperm = error(libc::EPERM).to_string();
        assert!(
            eperm.contains("permission denied: tracer needs root"),
            "{eperm}"
        );
        assert!(matches!(
            error(libc::EACCES),
            LoaderError::NotPermitted { .. }
        ));
        assert_eq!(
            error(libc::EINVAL).to_string(),
            format!(
                "kernel feature missing: creating eBPF map X: {}",
                std::io::Error::from_raw_os_error(libc::EINVAL)
            )
        );
    }

    #[test]
    fn detects_a_nested_pid_namespace() {
        assert!(!is_nested_pid_namespace(4026531836));
        assert!(is_nested_pid_namespace(4026532500));
    }
}
