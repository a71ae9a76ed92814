//! The intervals of `attach --timeline`, as the programs send them.

/// One interval of `attach --timeline`, as the programs saw it end.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimelineEvent {
    /// CLOCK_MONOTONIC (ns).
    pub start_ns: u64,
    pub end_ns: u64,
    /// For task intervals: the runtime's task id.
    pub task: u64,
    pub tgid: u32,
    /// The thread it happened on (a parked task's: the one it parked on).
    pub tid: u32,
    /// One of [`timeline_kind`].
    pub kind: u32,
    /// For a latency, its id; for time off CPU, an [`offcpu_state`](crate::offcpu_state).
    pub detail: u32,
}

/// What a [`TimelineEvent`] is.
pub mod timeline_kind {
    /// A latency between two probes (a GC pause, a phase of it).
    pub const LATENCY: u32 = 0;
    /// A task ran (from its run probe to its pause).
    pub const TASK_RUN: u32 = 1;
    /// A task was parked (from its pause to its next run).
    pub const TASK_PARKED: u32 = 2;
    /// A thread was off CPU (blocked or runnable) for at least the threshold.
    pub const OFF_CPU: u32 = 3;
}
