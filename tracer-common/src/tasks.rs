//! Runtime tasks (a task probe's running and parked phases), their time, and their names.

use crate::OffCpuKey;

/// Key of `TASK_STATES`: a runtime's task id within its process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TaskId {
    pub task: u64,
    pub tgid: u32,
    pub _pad: u32,
}

/// Value of `TASK_STATES`: what a task is doing since when.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskState {
    /// When it started running; 0 while parked.
    pub run_start_ns: u64,
    /// When it parked; 0 while running.
    pub park_start_ns: u64,
    /// User stack where it parked (id in `STACKS`, or a negative errno).
    pub park_stack_id: i32,
    /// The thread it runs on (or parked on).
    pub tid: u32,
}

/// Whether a `TaskKey` accounts running or parked time.
pub mod task_phase {
    pub const RUNNING: u32 = 0;
    pub const PARKED: u32 = 1;
}

/// Key of `TASK_TIME`: a task, a phase, and for parked time the stack where it parked.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TaskKey {
    pub task: u64,
    pub tgid: u32,
    /// One of [`task_phase`].
    pub phase: u32,
    /// User stack id for parked time; -1 for running time.
    pub stack_id: i32,
    /// The thread it ran on (for parked time: the one it parked on).
    pub tid: u32,
}

/// Value of `TASK_TIME`: a task's time in one phase (and park stack), how many intervals
/// made it up, and the longest of them (its longest poll, for tokio).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskTotal {
    pub total_ns: u64,
    pub count: u64,
    pub max_ns: u64,
}

/// Value of `THREAD_TASKS`: the task a thread runs, from the task's run probe to its
/// pause probe; with [`FINISHED_IN_RUN`] set, a task that finished in that run (its
/// time is no longer the task's, and its pause ends nothing).
pub type ThreadTask = u64;

/// The bit of a [`ThreadTask`] that marks a task finished inside its run (task ids —
/// addresses, counters, thread ids — never have it).
pub const FINISHED_IN_RUN: u64 = 1 << 63;

/// Key of `TASK_WALL`: a thread's time while it ran `task` (what a [`OffCpuKey`] is for
/// the thread's own time), so each task's running time splits into on CPU (samples,
/// value `OffCpuTotal::count`), blocked in the kernel and runnable.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TaskWallKey {
    pub task: u64,
    pub key: OffCpuKey,
    /// One of [`task_wall`].
    pub kind: u32,
}

/// What a [`TaskWallKey`] holds.
pub mod task_wall {
    /// Off CPU while running the task: `key.state` says blocked or runnable.
    pub const OFF_CPU: u32 = 0;
    /// On-CPU samples (frame-pointer stacks; unwound ones are aggregated in user space).
    pub const ON_CPU: u32 = 1;
}

/// Bytes of a task's name kept (the rest is cut).
pub const TASK_NAME_BYTES: usize = 120;

/// Value of `TASK_NAMES`: what a runtime called a task (a name, or the file of its spawn
/// location), NUL-terminated, and the line and column that go with a file (0 if none).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskName {
    pub text: [u8; TASK_NAME_BYTES],
    pub line: u32,
    pub column: u32,
}

impl Default for TaskName {
    fn default() -> Self {
        Self {
            text: [0; TASK_NAME_BYTES],
            line: 0,
            column: 0,
        }
    }
}
