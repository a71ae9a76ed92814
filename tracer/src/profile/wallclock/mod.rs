//! Wall-clock profile: on-CPU samples and off-CPU (blocked) time of the same threads, in
//! one view where a thread's every microsecond is somewhere, plus the two halves apart.
//!
//! Weights are microseconds throughout. An on-CPU sample stands for one sampling period
//! (1/frequency s) of running; an off-CPU interval for the time the thread was blocked.
//!
//! Frames, root first: the process name (`comm`), then with `--per-thread` the thread
//! (`name [tid]`), the user frames, the kernel frames (suffixed `_[k]`), and for time off
//! CPU a last frame: [`OFF_CPU_FRAME`] for blocked time, [`RUNNABLE_FRAME`] for time a
//! thread was preempted and waited for a CPU. So in the wall-clock flame graph a
//! function's box is all the wall time spent in it, and the `[off-cpu]` boxes on top show
//! which part of that was spent blocked (and, under them, the kernel path that blocked).
//! The off-CPU view holds blocked time only.
//!
//! The views are built in `build`, the tasks view in `task_view`. The stacks are named up
//! front in `namer`. The time of short off-CPU intervals is spread over the kernel stacks
//! sampled in `spread`. What a stack says of a Python thread's state is told in `python`.
//! The tables and lines the reports print are made in `summary`.

use std::collections::HashMap;

use tracer_common::{OffCpuStart, OffCpuTotal, StackKey};

use crate::stack::naming::{ProcessRoot, StackProfile};

mod build;
mod namer;
mod python;
mod spread;
mod summary;
mod task_view;

pub use build::build_profile;
pub(crate) use summary::{python_thread_table, thread_table, truncated_line, unnamed_line};

use python::PythonState;

/// The leaf frame added to blocked time in the wall-clock view.
pub(crate) const OFF_CPU_FRAME: &str = "[off-cpu]";

/// The leaf frame added to time a thread was runnable but not running (preempted,
/// waiting for a CPU) in the wall-clock view.
pub(crate) const RUNNABLE_FRAME: &str = "[runnable]";

/// The leaf frames of the tasks view (see [`TaskEntries`]): which kind of a task's time
/// a stack is.
pub(crate) const TASK_ON_CPU_FRAME: &str = "[running]";
pub(crate) const TASK_BLOCKED_FRAME: &str = "[blocked while running]";
pub(crate) const TASK_RUNNABLE_FRAME: &str = "[runnable while running]";
pub(crate) const TASK_PARKED_FRAME: &str = "[parked]";

/// The frame standing for the stacks of threads that were already off CPU when profiling
/// started (see [`tracer_common::STACK_BEFORE_START`]): where they blocked is not known.
pub(crate) const BEFORE_START_FRAME: &str = "[blocked since before profiling started]";

/// The kernel frame of short blocked intervals whose kernel stack was not sampled, where
/// no sample of the same user stack says where they blocked (see
/// [`tracer_common::KERNEL_STACK_ALWAYS_NS`]).
pub(crate) const NOT_SAMPLED_FRAME: &str = "[kernel stack not sampled]_[k]";

/// The kernel frames of an off-CPU interval whose thread came back with a kernel stack
/// the kernel could not walk.
pub(crate) const UNREADABLE_FRAME: &str = "[kernel stack unreadable]_[k]";

/// The kernel frames of an off-CPU interval whose thread's return to the CPU went
/// unseen, so that where it blocked was gone.
pub(crate) const MISSED_FRAME: &str = "[kernel stack missed]_[k]";

/// The outermost frame of a stack cut short: deeper than the stack bytes copied or
/// [`tracer_common::MAX_STACK_DEPTH`] frames.
pub(crate) const TRUNCATED_FRAME: &str = crate::stack::unwind::TRUNCATED_FRAME;

/// The three views and what went into them.
#[derive(Debug, Default)]
pub struct WallClockProfile {
    /// On-CPU and off-CPU together; off-CPU stacks end in [`OFF_CPU_FRAME`].
    pub wall: StackProfile,
    pub oncpu: StackProfile,
    pub offcpu: StackProfile,
    pub oncpu_samples: u64,
    pub oncpu_ns: u64,
    /// Blocked time (waiting for an event: a lock, IO, a timer).
    pub offcpu_intervals: u64,
    pub offcpu_ns: u64,
    /// Time runnable but not on a CPU (preempted), in the wall-clock view only.
    pub runnable_intervals: u64,
    pub runnable_ns: u64,
    /// Distinct (thread, stacks) entries whose user or kernel stack could not be taken.
    pub missing_stacks: u64,
    /// Off-CPU intervals whose thread's return to the CPU the kernel did not report: their
    /// time is known from the thread's CPU time, their kernel stack is not.
    pub switch_ins_missed: u64,
    /// Threads seen on or off CPU.
    pub threads: usize,
    /// Each thread's time on CPU, blocked and runnable, busiest (on CPU or runnable) first.
    pub per_thread: Vec<ThreadTime>,
    /// Wall time whose user stack has a frame that could not be named (JIT-compiled code
    /// without a perf map, code without symbols).
    pub unnamed_ns: u64,
    /// Wall time whose stack was cut short: its root frame is [`TRUNCATED_FRAME`].
    pub truncated_ns: u64,
    /// Processes seen on or off CPU.
    pub processes: usize,
    /// The threads' time while they ran runtime tasks, under the task that ran: process,
    /// task frame, stack, and a leaf frame saying on CPU, blocked or runnable
    /// ([`TASK_ON_CPU_FRAME`], ...). Empty without task probes.
    pub tasks: StackProfile,
    /// Each task's part of it, by (tgid, task).
    pub task_time: HashMap<(u32, u64), TaskWallTime>,
}

impl WallClockProfile {
    /// Adds `retired`, the profile of processes that exited and were let go (see
    /// [`crate::profile::retire`]): its stacks and totals, and its threads folded into one
    /// row per thread name (PID and TID 0), as the per-thread detail of processes long
    /// gone would grow without bound.
    pub fn absorb_retired(&mut self, retired: WallClockProfile) {
        self.wall.absorb(&retired.wall);
        self.oncpu.absorb(&retired.oncpu);
        self.offcpu.absorb(&retired.offcpu);
        self.tasks.absorb(&retired.tasks);
        self.oncpu_samples += retired.oncpu_samples;
        self.oncpu_ns += retired.oncpu_ns;
        self.offcpu_intervals += retired.offcpu_intervals;
        self.offcpu_ns += retired.offcpu_ns;
        self.runnable_intervals += retired.runnable_intervals;
        self.runnable_ns += retired.runnable_ns;
        self.missing_stacks += retired.missing_stacks;
        self.switch_ins_missed += retired.switch_ins_missed;
        self.threads += retired.threads;
        self.processes += retired.processes;
        self.unnamed_ns += retired.unnamed_ns;
        self.truncated_ns += retired.truncated_ns;
        for thread in retired.per_thread {
            let row = if let Some(row) = self
                .per_thread
                .iter_mut()
                .find(|t| t.tid == 0 && t.name == thread.name)
            {
                row
            } else {
                self.per_thread.push(ThreadTime {
                    name: thread.name.clone(),
                    ..ThreadTime::default()
                });
                self.per_thread.last_mut().expect("just pushed")
            };
            row.oncpu_ns += thread.oncpu_ns;
            row.blocked_ns += thread.blocked_ns;
            row.runnable_ns += thread.runnable_ns;
            if let Some(python) = thread.python {
                let mine = row.python.get_or_insert_with(PythonThreadTime::default);
                mine.running_ns += python.running_ns;
                mine.gil_ns += python.gil_ns;
                mine.gc_ns += python.gc_ns;
                mine.blocked_ns += python.blocked_ns;
                mine.runnable_ns += python.runnable_ns;
            }
        }
        self.per_thread.sort_by_key(|t| {
            (
                std::cmp::Reverse(t.oncpu_ns + t.runnable_ns),
                std::cmp::Reverse(t.wall_ns()),
                t.tid,
            )
        });
    }
}

/// A runtime task's time while it was the running task of a thread: on CPU (samples),
/// blocked in the kernel, runnable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskWallTime {
    pub oncpu_samples: u64,
    pub oncpu_ns: u64,
    pub blocked_ns: u64,
    pub blocked_intervals: u64,
    pub runnable_ns: u64,
    /// The stack where it blocked its thread longest (frames root first, the process's
    /// and the task's left out), and how long it blocked there in all.
    pub longest_block: Option<(Vec<String>, u64)>,
}

/// One thread's wall time, split.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadTime {
    pub tgid: u32,
    pub tid: u32,
    /// Its name (`comm`) as last seen; `None` when it was never seen.
    pub name: Option<String>,
    pub oncpu_ns: u64,
    /// Blocked: waiting for an event.
    pub blocked_ns: u64,
    /// Preempted: runnable, waiting for a CPU.
    pub runnable_ns: u64,
    /// For a thread that ran Python code: its time in Python's terms.
    pub python: Option<PythonThreadTime>,
}

/// A Python thread's wall time in Python's terms. Time in stacks without Python frames
/// (before the thread's first Python function, or in a native thread) is not in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PythonThreadTime {
    /// On CPU running Python code or what it called, not collecting garbage.
    pub running_ns: u64,
    /// Blocked taking (or handing over) the GIL.
    pub gil_ns: u64,
    /// Collecting garbage, on or off CPU.
    pub gc_ns: u64,
    /// Blocked elsewhere in the kernel (IO, sleep, a lock).
    pub blocked_ns: u64,
    /// Runnable, waiting for a CPU.
    pub runnable_ns: u64,
}

impl PythonThreadTime {
    fn add(&mut self, state: PythonState, ns: u64) {
        match state {
            PythonState::NotPython => {}
            PythonState::Running => self.running_ns += ns,
            PythonState::Gil => self.gil_ns += ns,
            PythonState::Collecting => self.gc_ns += ns,
            PythonState::Blocked => self.blocked_ns += ns,
            PythonState::Runnable => self.runnable_ns += ns,
        }
    }

    pub fn total_ns(&self) -> u64 {
        self.running_ns + self.gil_ns + self.gc_ns + self.blocked_ns + self.runnable_ns
    }
}

impl ThreadTime {
    pub fn wall_ns(&self) -> u64 {
        self.oncpu_ns + self.blocked_ns + self.runnable_ns
    }
}

/// What the kernel collected, as read back from the maps.
#[derive(Debug, Default)]
pub struct RawProfile {
    pub oncpu: Vec<(StackKey, u64)>,
    pub offcpu: Vec<(StackKey, OffCpuTotal)>,
    /// Threads still off CPU when tracing stopped: their time so far counts. Marks put
    /// by user space at the start
    /// ([`STACK_BEFORE_START`](tracer_common::STACK_BEFORE_START)) of threads that have
    /// on-CPU samples are dropped: those threads were running, not blocked, and never
    /// switched out.
    pub pending: Vec<(u32, OffCpuStart)>,
    pub now_ns: u64,
    /// `--min-block`: pending intervals shorter than this are left out, as the kernel
    /// leaves out finished ones.
    pub min_block_ns: u64,
    /// What of it was spent running runtime tasks.
    pub tasks: TaskEntries,
}

/// The part of a profile the threads spent running runtime tasks (between a task's run
/// and pause probes), as the kernel recorded it by task.
#[derive(Debug, Default)]
pub struct TaskEntries {
    /// On-CPU samples: (task, key, samples).
    pub oncpu: Vec<(u64, StackKey, u64)>,
    /// Off-CPU intervals, and the kernel-stack samples of short ones: (task, key, total).
    pub offcpu: Vec<(u64, StackKey, OffCpuTotal)>,
    /// The frame that stands for each task, by (tgid, task); a task missing here is
    /// `task #N`.
    pub names: HashMap<(u32, u64), String>,
}

/// Threads still off CPU when tracing stopped (from the kernel's map of interval starts):
/// their time so far counts, as a finished interval's would (they are blocked right
/// now), unless it is shorter than `--min-block`, which the kernel applies to finished
/// intervals only.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OpenIntervals<'a> {
    /// Thread id and when (and where) it blocked.
    pub starts: &'a [(u32, OffCpuStart)],
    /// When tracing stopped (CLOCK_MONOTONIC ns).
    pub now_ns: u64,
    /// `--min-block`: shorter intervals are left out.
    pub min_block_ns: u64,
}

impl<'a> OpenIntervals<'a> {
    /// Each interval long enough to count: its thread, its start, and how long it has
    /// lasted. Like the kernel, keeps intervals of exactly `min_block_ns`.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &'a OffCpuStart, u64)> + use<'a> {
        let (now_ns, min_block_ns) = (self.now_ns, self.min_block_ns);
        self.starts.iter().filter_map(move |(tid, start)| {
            let ns = now_ns.saturating_sub(start.ts_ns);
            (ns >= min_block_ns).then_some((*tid, start, ns))
        })
    }
}

/// Which processes share a tower of the flame graphs (`--group-by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum GroupBy {
    /// One tower per process, its root `name [pid]` when there are several.
    #[default]
    Process,
    /// One tower per program: every process running it (eight PostgreSQL backends),
    /// under the program's name, whatever title each gave itself.
    Name,
}

impl GroupBy {
    /// How the root frames name the processes of a profile of `several` or one.
    pub fn root(self, several: bool) -> ProcessRoot {
        match (self, several) {
            (GroupBy::Name, _) => ProcessRoot::Program,
            (GroupBy::Process, true) => ProcessRoot::NameAndPid,
            (GroupBy::Process, false) => ProcessRoot::Name,
        }
    }
}

/// How to build the views.
#[derive(Debug, Clone, Copy)]
pub struct BuildOptions {
    pub frequency_hz: u64,
    pub per_thread: bool,
    /// Which processes share a root frame (`--group-by`).
    pub group_by: GroupBy,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Intervals still open when tracing stops count with their time so far, unless
    /// shorter than `--min-block` (one exactly as long counts, as in the kernel).
    #[test]
    fn min_block_applies_to_intervals_still_open() {
        let pid = std::process::id();
        let start = |ts_ns, tgid| OffCpuStart {
            ts_ns,
            tgid,
            user_stack_id: -14,
            kernel_stack_id: -14,
            ..OffCpuStart::default()
        };
        // Open for 10 ms, 2 ms and 50 µs; and one of another process.
        let starts = [
            (pid, start(0, pid)),
            (pid + 1, start(8_000_000, pid)),
            (pid + 2, start(9_950_000, pid)),
            (1, start(0, 1)),
        ];
        let open = |min_block_ns| OpenIntervals {
            starts: &starts,
            now_ns: 10_000_000,
            min_block_ns,
        };
        let lasted = |min_block_ns| -> Vec<(u32, u64)> {
            open(min_block_ns)
                .iter()
                .map(|(tid, _, ns)| (tid, ns))
                .collect()
        };
        assert_eq!(lasted(0).len(), 4);
        assert_eq!(
            lasted(2_000_000),
            [(pid, 10_000_000), (pid + 1, 2_000_000), (1, 10_000_000)]
        );
        assert_eq!(lasted(10_000_001), []);
    }
}
