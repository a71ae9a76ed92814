//! The loader: the only module that talks to aya and the kernel's BPF interfaces. It
//! loads the embedded eBPF object with this run's settings, attaches programs, and reads
//! the kernel-side aggregates back as plain `tracer_common` values.

pub(crate) mod btf;
mod diagnostics;
pub(crate) mod keeper;
mod launch;
mod load;
mod maps;
mod object;
pub(crate) mod pins;
mod programs;
mod restored;
mod rings;
mod sys;
mod targets;
mod thread_sample;
mod tracefs;
mod usdt;
mod warm_up;

use std::{collections::HashMap as StdHashMap, marker::PhantomData, path::PathBuf, time::Duration};

use aya::maps::Map;
use thiserror::Error;
use tracer_common::map_names;

pub(crate) use diagnostics::{DiagnosticsReader, enable as enable_bpf_diagnostics};
pub(crate) use launch::{Launch, LaunchNeeds};

pub(crate) use programs::{Attachment, UserStacks};
pub(crate) use rings::{RecordRing, RingWakeups, SnapshotChecks};
pub(crate) use targets::{COMM_LEN, FileId, KernelTargets, Member, TargetsMap};
pub(crate) use thread_sample::sample_running_thread;
pub(crate) use usdt::UsdtAttachment;

use crate::{
    system::oserror::{self, OpenFileLimit},
    system::procfs::ProcessError,
};

#[derive(Debug, Error)]
pub(crate) enum LoaderError {
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
pub(crate) struct Settings {
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
pub(crate) const TIMELINE_RING_BYTES: u32 = 16 << 20;

/// How many USDT sites, probes and latencies a run attaches (see [`Settings::plan_sizes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlanSizes {
    pub sites: u32,
    pub probes: u32,
    pub latencies: u32,
}

/// Entries of the kernel maps that can fill up; `None` keeps the eBPF object's default
/// ([`MapSizes::DEFAULT_STACKS`] stacks, 65,536 entries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct MapSizes {
    /// Distinct stacks (`STACKS`, and `KERNEL_STACKS` apart).
    pub stacks: Option<u32>,
    /// Entries of every hash map: threads off CPU or in a latency, and the distinct keys
    /// aggregated (thread and stacks, task and phase).
    pub entries: Option<u32>,
}

impl MapSizes {
    pub(crate) const DEFAULT_STACKS: u32 = 32768;

    /// The slots of the stack maps.
    pub(crate) fn stack_slots(&self) -> u32 {
        self.stacks.unwrap_or(Self::DEFAULT_STACKS)
    }

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
pub(crate) struct Features {
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
    /// Latency histograms by process as well (`attach --metrics`).
    pub process_metrics: bool,
}

impl Features {
    pub(crate) const ALL: Features = Features {
        events: true,
        latencies: true,
        offcpu: true,
        oncpu: true,
        tasks: true,
        offcpu_snapshots: true,
        thread_regs: true,
        hit_stacks: true,
        python_frames: true,
        process_metrics: true,
    };
    pub(crate) const NONE: Features = Features {
        events: false,
        latencies: false,
        offcpu: false,
        oncpu: false,
        tasks: false,
        offcpu_snapshots: false,
        thread_regs: false,
        hit_stacks: false,
        python_frames: false,
        process_metrics: false,
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
            (self.process_metrics, &[map_names::PROCESS_METRICS][..]),
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

/// The loaded programs and their maps. `Maps` says whether the maps the kernel
/// allocates whole (`DEFERRED_MAPS`) may still be being created on a thread of their own
/// ([`MapsPending`], as [`Loader::load`] returns it: programs can be attached already) or
/// are all there ([`MapsReady`], from [`Loader::maps_ready`]). Only a loader with every
/// map reads the maps or takes them.
pub(crate) struct Loader<Maps = MapsReady> {
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
    /// The warm-up uprobes of the launch, until the first sites are attached.
    warm_up: Option<warm_up::UprobeWarmUp>,
    /// The sites attached in one process each (process, file, file offset): the detach
    /// waits for their instructions to be back.
    sites_in_one_process: Vec<(u32, PathBuf, u64)>,
    /// The sites attached in every process that maps their file (file, file offset): the
    /// detach waits for them in each target still running.
    sites_in_any_process: Vec<(PathBuf, u64)>,
    usdt_sites_attached: usize,
    /// The programs that add processes forking from targets or executing `--exe`.
    target_tracking: Vec<Attachment>,
    /// The programs that tell of traced processes mapping code or starting programs
    /// ([`Loader::watch_code_mappings`]).
    mapping_watch: Vec<Attachment>,
    maps_state: PhantomData<Maps>,
}

/// A [`Loader`] whose deferred maps may still be being created.
pub(crate) struct MapsPending;

/// A [`Loader`] with every map created.
pub(crate) struct MapsReady;

#[cfg(test)]
mod tests {
    use super::*;

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
}
