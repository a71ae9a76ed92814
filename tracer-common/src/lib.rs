//! Types shared by the tracer (user space) and its eBPF programs.
//!
//! Everything here is `#[repr(C)]` plain data: the eBPF side writes it into maps and the
//! ring buffer, user space reads it back byte for byte. Map, program and global names are
//! constants here so neither side repeats a string.
//!
//! The modules follow the areas of `tracer-ebpf`: `usdt` (probe sites and their events),
//! `latency`, `offcpu`, `tasks`, `timeline`, `unwind` (stack copies), `targets`,
//! `switches` (control and counters), `names`, `stack_id` and `python`. Their items are
//! re-exported here, so both sides name them from the crate's root.
#![no_std]

pub mod histogram;
pub mod python;
pub mod stack_id;

pub use stack_id::{
    FIRST_SNAPSHOT_ID, FIRST_SWITCH_IN_STACK_ID, KERNEL_STACK_AT_SWITCH_IN, KERNEL_STACK_MISSED,
    KERNEL_STACK_NOT_SAMPLED, KERNEL_STACK_UNREADABLE, NO_STACK, STACK_BEFORE_START,
    STACK_NOT_TAKEN, SWITCH_IN_STACK_IDS, StackId,
};

mod latency;
mod names;
mod offcpu;
mod switches;
mod targets;
mod tasks;
mod timeline;
mod unwind;
mod usdt;

pub use latency::*;
pub use names::*;
pub use offcpu::*;
pub use switches::*;
pub use targets::*;
pub use tasks::*;
pub use timeline::*;
pub use unwind::*;
pub use usdt::*;

#[cfg(feature = "user")]
mod pod {
    use super::{
        BlockPlace, HitStackKey, KernelStack, LastSnapshot, LastUserStack, LatencyProcessKey,
        LatencyStart, LatencyStartKey, LatencyStats, OffCpuKey, OffCpuStart, OffCpuTotal,
        ProbeHits, ProcessMetricKey, SnapshotCheck, StackWords, TargetProcess, TaskId, TaskKey,
        TaskName, TaskState, TaskTotal, TaskWallKey, ThreadRegs, TimelineEvent, UnwindSample,
        UsdtArg, UsdtEvent, UsdtSite, UsdtStrHeader, python,
    };
    /// `unsafe impl aya::Pod` for each type.
    macro_rules! pod {
        ($($t:ty),* $(,)?) => {
            $(
                // SAFETY: all of these are #[repr(C)] structs of integers with explicit
                // padding fields, so every bit pattern is valid and there are no implicit
                // padding bytes.
                unsafe impl aya::Pod for $t {}
            )*
        };
    }
    pod!(
        UsdtArg,
        UsdtSite,
        UsdtEvent,
        UsdtStrHeader,
        HitStackKey,
        LatencyStartKey,
        LatencyStart,
        LatencyStats,
        TargetProcess,
        LatencyProcessKey,
        ProcessMetricKey,
        ProbeHits,
        OffCpuStart,
        OffCpuKey,
        OffCpuTotal,
        TaskState,
        TaskId,
        TaskKey,
        TaskWallKey,
        TaskTotal,
        TaskName,
        TimelineEvent,
        UnwindSample,
        BlockPlace,
        LastSnapshot,
        SnapshotCheck,
        StackWords,
        LastUserStack,
        KernelStack,
        ThreadRegs,
        python::PythonProcess,
        python::PythonThread,
    );
}
