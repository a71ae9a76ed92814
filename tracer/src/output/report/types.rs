//! The report of `tracer attach`: what it traced, the probes and latencies it measured,
//! the profiles it wrote and what it could not record.
//! The text and JSON printers of the report are in `text` and `json`.

use tracer_common::LatencyStats;

use crate::{
    output::render::{ViewFiles, views::ProfileFiles},
    probe::plan::ProbeInfo,
    probe::runtimes::LatencyDef,
    profile::histogram::LatencyHistogram,
    profile::tasks::TaskProfile,
    profile::wallclock::WallClockProfile,
    stack::unwind::UnwindStats,
    system::stop::StopReason,
};

/// What the off-CPU profile holds and what could not be recorded.
#[derive(Debug, Default)]
pub(crate) struct OffCpuProfile {
    /// Distinct stacks.
    pub stacks: usize,
    pub total_ns: u64,
    pub intervals: u64,
    /// Intervals whose user or kernel stack could not be captured.
    pub missing_stacks: u64,
}

/// Runtime tasks: the profile and where its flamegraph went (`None`: not written).
pub(crate) struct TaskReport {
    pub profile: TaskProfile,
    pub files: Option<ViewFiles>,
}

pub(crate) struct ProbeReport {
    pub info: ProbeInfo,
    pub hits: ProbeHits,
}

/// A probe's hits, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ProbeHits {
    pub count: u64,
    /// When it first fired (CLOCK_MONOTONIC ns); `None` when it never did.
    pub first_ns: Option<u64>,
}

pub(crate) struct LatencyReport {
    pub def: LatencyDef,
    pub hist: LatencyHistogram,
    /// The same latency split by process.
    pub per_process: Vec<ProcessLatency>,
    /// Split by class (a collection's generation), labelled; empty for a latency without
    /// classes.
    pub by_class: Vec<(String, LatencyStats)>,
    /// Its probes no target ever had (a `--latency` pair measured nothing then).
    pub never_found: Vec<String>,
}

/// A process traced: its PID (as the tracer sees it), name, and its PID in its own PID
/// namespace when that is below the tracer's (a container's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TracedProcess {
    pub pid: u32,
    pub name: String,
    pub namespace_pid: Option<u32>,
}

/// One latency's totals in one process.
#[derive(Debug, Clone)]
pub(crate) struct ProcessLatency {
    pub pid: u32,
    pub name: String,
    pub stats: LatencyStats,
}

/// The stacks the kernel could not capture into its stack map, by why.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StackLosses {
    /// Every stack not captured.
    pub errors: u64,
    /// Another stack held the slot the stack's hash chose: the stack map is a hash table
    /// that keeps the first stack of each slot.
    pub collisions: u64,
    /// The stack map had no room left.
    pub map_full: u64,
    /// The stack map's slots (`--stack-map-size`).
    pub slots: u32,
}

impl StackLosses {
    /// From the kernel's counters (`tracer_common::counter`), for a stack map of `slots`.
    pub(crate) fn from_counters(counters: &[u64], slots: u32) -> Self {
        use tracer_common::counter;
        StackLosses {
            errors: counters[counter::STACK_ERRORS as usize],
            collisions: counters[counter::STACK_COLLISIONS as usize],
            map_full: counters[counter::STACK_MAP_FULL as usize],
            slots,
        }
    }

    /// How many stacks were not captured and why, with what to raise; empty when none.
    pub(crate) fn explained(&self) -> String {
        if self.errors == 0 {
            return String::new();
        }
        let other = self.errors.saturating_sub(self.collisions + self.map_full);
        let mut why = Vec::new();
        if self.collisions > 0 {
            why.push(format!(
                "{} found their slot taken by another stack",
                self.collisions
            ));
        }
        if self.map_full > 0 {
            why.push(format!("{} found the map full", self.map_full));
        }
        if other > 0 {
            why.push(format!("{other} could not be read"));
        }
        format!(
            "{} stacks not captured in the {}-slot stack map ({}; a larger --stack-map-size \
             makes collisions rarer and leaves room for more)",
            self.errors,
            self.slots,
            why.join(", ")
        )
    }
}

/// Everything the eBPF side could not record, reported rather than hidden.
#[derive(Debug, Default)]
pub(crate) struct Losses {
    pub events_lost: u64,
    pub map_full: u64,
    pub stacks: StackLosses,
    pub unmatched_ends: u64,
    pub arg_read_errors: u64,
    /// Runs of a program the kernel skipped (it was already running on that CPU): events
    /// never seen, with the program's name.
    pub program_misses: Vec<(&'static str, u64)>,
    /// Off-CPU intervals whose end went unseen, closed later from the thread's CPU time
    /// (recovered, not lost).
    pub switch_ins_missed: u64,
    /// Stacks walked with frame pointers instead of DWARF: the stack-copy ring was full.
    pub unwind_ring_full: u64,
    /// Off-CPU stacks that reused a snapshot of the same place not yet unwound, the
    /// stack-copy ring half full (reused, not lost).
    pub snapshots_reused_unchecked: u64,
    /// The stack-copy ring's size (`--unwind-buffer`).
    pub unwind_ring_bytes: u32,
}

pub(crate) struct AttachReport {
    /// The one process traced (or the first of a set).
    pub pid: u32,
    /// Its name, or what the set is (`every process running /usr/bin/x`).
    pub process_name: String,
    /// Every process traced, but those folded.
    pub processes: Vec<TracedProcess>,
    /// Processes that exited long before the stop (beyond `--keep-exited`), counted by
    /// name.
    pub processes_folded: std::collections::BTreeMap<String, u64>,
    pub stopped_by: StopReason,
    pub elapsed_ns: u64,
    pub probes: Vec<ProbeReport>,
    pub latencies: Vec<LatencyReport>,
    pub offcpu: OffCpuProfile,
    /// The off-CPU flame graph's files; `None` when they could not be written.
    pub offcpu_files: Option<ViewFiles>,
    /// The whole wall-clock profile (on and off CPU) and its files.
    pub wall: WallClockProfile,
    pub files: ProfileFiles,
    /// With `--unwind dwarf`: how the user stacks were unwound.
    pub unwind_stats: Option<UnwindStats>,
    /// How to get names for the code that could not be named, when much could not.
    pub unnamed: Option<String>,
    pub tasks: Option<TaskReport>,
    /// With `--timeline`: the file and how many intervals it holds (`None` if it could
    /// not be written).
    pub timeline: Option<TimelineReport>,
    pub losses: Losses,
}

/// The timeline written (`attach --timeline`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TimelineReport {
    pub path: std::path::PathBuf,
    pub intervals: usize,
    /// Intervals the full ring buffer lost.
    pub lost: u64,
}

impl AttachReport {
    /// Every runtime's GC pauses.
    pub(super) fn gc_pauses(&self) -> impl Iterator<Item = &LatencyReport> {
        self.latencies.iter().filter(|l| l.def.name == "gc_pause")
    }
}
