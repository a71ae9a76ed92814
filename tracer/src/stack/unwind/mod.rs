//! DWARF unwinding of user stacks without frame pointers (`tracer profile --unwind dwarf`).
//!
//! The kernel sends snapshots ([`tracer_common::UnwindSample`]): the user instruction,
//! stack and frame pointers of a thread and a copy of the top of its stack, for each
//! on-CPU sample of a user thread (with its kernel stack id when it was in the kernel),
//! and where a thread blocks (off-CPU snapshots, whose ids the kernel's off-CPU keys
//! carry as user stack ids). Here each is unwound with `framehop`, using the
//! `.eh_frame`/`.eh_frame_hdr` (and `.debug_frame`) of every file the process maps, read
//! from the descriptors [`ProcessMaps`] keeps open, so processes that exited still
//! unwind. Where no call frame information covers an address framehop falls back to
//! frame pointers; the frames found that way are told apart ([`UnwoundStack`]). On-CPU
//! stacks (instruction pointers, innermost first, as the kernel's stack map stores them)
//! are counted per thread and given ids of their own, so the rest of the profile names
//! them like the kernel's stacks ([`WithUnwound`]).
//!
//! The snapshots are parsed in `snapshot`, and unwound by [`DwarfUnwinder`] in `unwinder`.
//! The unwind tables of files and processes are read in `tables`. What the kernel checks
//! before reusing an off-CPU snapshot is found in `check`. What unwinding gives is in
//! `stacks`.
//!
//! [`ProcessMaps`]: crate::stack::symbolize::ProcessMaps

mod check;
mod snapshot;
mod stacks;
mod tables;
mod unwinder;

pub(crate) use snapshot::Snapshot;
pub(crate) use stacks::{
    StackMerger, TRUNCATED_FRAME, UnwindEnd, UnwindStats, UnwoundStack, UnwoundStacks, WithUnwound,
};
pub(crate) use unwinder::{DwarfUnwinder, SampleKey};
