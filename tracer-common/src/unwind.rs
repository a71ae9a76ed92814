//! Stack copies for user space to unwind with DWARF: on-CPU samples, off-CPU snapshots,
//! and the checks that let a thread's unchanged stack be reused.

use crate::python;

/// Maximum frames in a captured stack (the kernel's default perf_event_max_stack).
pub const MAX_STACK_DEPTH: usize = 127;

/// Bytes of user stack copied (from the user stack pointer up) for DWARF unwinding.
pub const UNWIND_STACK_BYTES: usize = 16384;

/// An on-CPU sample for DWARF unwinding in user space, through the `UNWIND_SAMPLES` ring
/// buffer: the thread, its user registers (those interrupted, or for a sample in kernel
/// mode those saved when it entered the kernel), the bytes of its user stack from `sp` up
/// (`stack_len` of them; fewer than [`UNWIND_STACK_BYTES`] near the top of the stack), and
/// its kernel stack when it was in kernel mode.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwindSample {
    pub tgid: u32,
    pub tid: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub stack_len: u32,
    /// Id in `STACKS` (or a negative errno); [`NO_STACK`](crate::NO_STACK) for a sample in
    /// user mode.
    pub kernel_stack_id: i32,
    /// 0 for an on-CPU sample. Otherwise the snapshot of where a thread blocked, taken
    /// at `sched_switch`: off-CPU keys carry this id (from
    /// [`FIRST_SNAPSHOT_ID`](crate::FIRST_SNAPSHOT_ID)) as
    /// their user stack id.
    pub snapshot_id: u32,
    pub _pad: u32,
    /// For an on-CPU sample: the runtime task the thread was running (0: none known).
    pub task: u64,
    /// The thread's Python frames, when its process is a CPython interpreter.
    pub python: python::PythonStack,
    pub stack: [u8; UNWIND_STACK_BYTES],
}

/// One thread's user registers as saved when it last entered the kernel, written by the
/// `thread_regs` task iterator: `/proc/PID/task/TID/syscall` gives the instruction and
/// stack pointers of a blocked thread but not its frame pointer, which unwinding code built
/// with frame pointers needs (their call frame information is relative to it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadRegs {
    /// The thread id (the kernel's `pid`).
    pub tid: u32,
    pub _pad: u32,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Its FS base (`pthread_self()`), which finds its Python thread state.
    pub fsbase: u64,
}

/// Key of `OFFCPU_SNAPSHOTS` and `LAST_USER_STACKS`: a thread and the user instruction
/// and stack pointers where it blocked. A thread blocks at a few places in turn (a write
/// preempted, then a read; one system call's wrapper reached by different paths), each
/// remembered on its own.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlockPlace {
    pub tid: u32,
    pub _pad: u32,
    pub ip: u64,
    pub sp: u64,
}

/// Value of `OFFCPU_SNAPSHOTS` (keyed by [`BlockPlace`]): the last snapshot of the thread's
/// user stack sent at a `sched_switch`. A thread blocking again with the same user
/// instruction and stack pointers (and frame pointer, when unwinding used it) reuses it
/// if the stack words its unwinding read are still the same ([`SnapshotCheck`]):
/// unwinding would give the same frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LastSnapshot {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// When it was sent (CLOCK_MONOTONIC ns).
    pub sent_ns: u64,
    pub snapshot_id: i32,
    pub _pad: u32,
    /// [`python::PythonStack::hash`] of the Python frames sent with it (0: none).
    pub python_hash: u64,
}

/// Stack words a [`StackWords`] holds at most: a stack whose walk depends on more is
/// only checked on its first ones (the innermost frames).
pub const MAX_SNAPSHOT_CHECKS: usize = 64;

/// Bytes from the stack pointer up that the kernel reads at once to check
/// [`StackWords`]; words further up are not checked that way (the stack is walked again).
pub const STACK_WORDS_SPAN: usize = 8192;

/// Words of a user stack that a walk of it depended on, as offsets from the stack pointer
/// (multiples of 8, below `span`) and the values found there: while they are unchanged,
/// walking the stack again from the same registers gives the same frames.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackWords {
    pub count: u32,
    /// One past the highest byte the words cover (the largest offset + 8).
    pub span: u32,
    pub offsets: [u32; MAX_SNAPSHOT_CHECKS],
    pub values: [u64; MAX_SNAPSHOT_CHECKS],
}

impl StackWords {
    pub const EMPTY: StackWords = StackWords {
        count: 0,
        span: 0,
        offsets: [0; MAX_SNAPSHOT_CHECKS],
        values: [0; MAX_SNAPSHOT_CHECKS],
    };
}

/// Value of `SNAPSHOT_CHECKS` (keyed by snapshot id), written by user space once it
/// unwound the snapshot: the stack words unwinding depended on, and whether it used the
/// frame pointer register (then that must be the same too).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotCheck {
    pub uses_bp: u32,
    pub _pad: u32,
    pub words: StackWords,
}

/// Value of `LAST_USER_STACKS` (keyed by [`BlockPlace`]), with frame-pointer unwinding: the
/// user stack id last taken where the thread blocked, with the registers and the frame
/// chain words (saved frame pointers and return addresses) the kernel's walk followed.
/// A thread blocking again with the same registers and words gets the same id without
/// a walk.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastUserStack {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub stack_id: i32,
    pub _pad: u32,
    pub words: StackWords,
}

/// Off-CPU: a kernel stack taken when its thread comes back (`bpf_get_task_stack`), in
/// `KERNEL_STACKS` under an id from
/// [`FIRST_SWITCH_IN_STACK_ID`](crate::FIRST_SWITCH_IN_STACK_ID).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelStack {
    /// Frames in `ips` (the rest are 0).
    pub len: u32,
    pub _pad: u32,
    /// FNV-1a of all of `ips`: stacks of the same length and hash are taken to be the same.
    pub hash: u64,
    pub ips: [u64; MAX_STACK_DEPTH],
}
