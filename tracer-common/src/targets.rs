//! Which processes are traced: the `TARGETS` map and the filters of each program, and the
//! metrics kept per process.

/// Bits of the `TARGET_FILTER` global: which programs look processes up in `TARGETS`.
pub mod target_filter {
    /// Off-CPU accounting and on-CPU sampling.
    pub const SCHED: u32 = 1;
    /// USDT probes (when their uprobes are not already limited to one process).
    pub const USDT: u32 = 2;
}

/// Bits of the `TARGET_MATCH` global.
pub mod target_match {
    /// A process that executes the `--exe` file.
    pub const EXE: u32 = 1;
    /// A process whose name becomes the `--comm` name when it executes.
    pub const COMM: u32 = 2;
}

/// Bits of [`TargetProcess::flags`].
pub mod target_flags {
    /// The processes it forks become targets too (`--children`, and processes found by
    /// file or name: their forks run the same file under the same name).
    pub const FOLLOW_FORKS: u32 = 1;
    /// A target because of what it runs (`--exe`, `--comm`): it stops being one when it
    /// executes something else.
    pub const BY_MATCH: u32 = 2;
}

/// Value of `TARGETS` (keyed by tgid): a process traced.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetProcess {
    /// When it started, in clock ticks since boot (as /proc/PID/stat gives it), so a
    /// process that reuses the PID is not taken for it; 0: not checked.
    pub start_ticks: u64,
    /// Bits of [`target_flags`].
    pub flags: u32,
    /// The process it forked from while it has not executed another program since
    /// (its memory and mappings are a copy of that one's); 0 otherwise.
    pub forked_from: u32,
    /// Its name when it joined (the kernel's `comm`, zero-padded): a process that exits
    /// before user space looks at it is still named.
    pub comm: [u8; 16],
}

/// Key of `PROCESS_METRICS`: one figure of one process, a [`process_metric`] and its
/// index.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessMetricKey {
    pub tgid: u32,
    pub metric: u32,
    pub index: u32,
}

/// What a [`ProcessMetricKey`] counts.
pub mod process_metric {
    /// Latencies in one bucket of [`crate::histogram`]: index `latency_id * BUCKETS +
    /// bucket`.
    pub const LATENCY_COUNT: u32 = 0;
    /// Nanoseconds of latencies: index `latency_id`.
    pub const LATENCY_NS: u32 = 1;
    /// Nanoseconds off CPU: index an [`crate::offcpu_state`].
    pub const OFFCPU_NS: u32 = 2;
}
