//! What unwinding gives: unwound stacks, how unwinding one ended and the counts of what
//! it did. A stack merger puts a runtime's own frames into an unwound stack. The kernel's
//! stacks and the unwound ones are named alike through [`WithUnwound`].

use std::collections::HashMap;

use tracer_common::{StackId, python::PythonStack};

use crate::stack::naming::StackSource;

/// One unwound user stack.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct UnwoundStack {
    /// Instruction pointers, innermost first.
    pub addrs: Vec<u64>,
    /// For each, whether it was found by following the frame pointer (no call frame
    /// information covered the frame below it); the innermost comes from the registers.
    pub by_frame_pointer: Vec<bool>,
}

/// The outermost frame of a stack cut short (deeper than the bytes copied, or than
/// [`MAX_STACK_DEPTH`](tracer_common::MAX_STACK_DEPTH) frames, or its Python frames more
/// than the kernel sends).
pub(crate) const TRUNCATED_FRAME: &str = "[truncated]";

/// The token standing for [`TRUNCATED_FRAME`].
pub(super) fn truncated_token() -> u64 {
    crate::stack::frame_tokens::token(TRUNCATED_FRAME.to_string(), "[tracer]")
}

/// Unwound user stacks by their ids.
pub(crate) type UnwoundStacks = HashMap<StackId, UnwoundStack>;

/// What puts a runtime's own frames into an unwound native stack (the Python frames a
/// snapshot carries, in place of the interpreter's frames).
pub(crate) trait StackMerger {
    fn merge_python(&mut self, stack: UnwoundStack, python: &PythonStack) -> UnwoundStack;
}

/// How unwinding one stack ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnwindEnd {
    /// At the outermost frame (its unwind rules say there is no caller).
    Complete,
    /// The stack goes on beyond the bytes copied (or
    /// [`MAX_STACK_DEPTH`](tracer_common::MAX_STACK_DEPTH)).
    OutOfStack,
    /// Before the stack's end otherwise: an address had no unwind information and no
    /// usable frame pointer (often the outermost frame of code without CFI).
    Truncated,
}

/// What unwinding did, for the summary.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UnwindStats {
    /// On-CPU samples unwound here.
    pub samples: u64,
    /// Off-CPU snapshots (where a thread blocked) unwound here.
    pub offcpu_snapshots: u64,
    /// Of those, samples taken in kernel mode (unwound from the user registers saved
    /// when the thread entered the kernel).
    pub in_kernel: u64,
    /// Frames they gave (the instruction pointer included).
    pub frames: u64,
    /// Of those, frames found by following frame pointers.
    pub frame_pointer_frames: u64,
    /// The deepest stack.
    pub max_depth: u64,
    /// Stacks (samples or snapshots) whose stack goes on beyond the bytes copied (or
    /// [`MAX_STACK_DEPTH`](tracer_common::MAX_STACK_DEPTH)).
    pub out_of_stack: u64,
    /// Stacks whose unwinding stopped before the stack's end otherwise: an address had
    /// no unwind information and no usable frame pointer (often the outermost frame of
    /// code without CFI, so not necessarily a loss).
    pub truncated: u64,
    /// Stacks of processes whose mappings could not be read (only their instruction
    /// pointer is kept).
    pub no_maps: u64,
}

/// The kernel's stacks plus the unwound ones, for a profile unwound with DWARF: user
/// frames the kernel walked (samples that could not be sent) were found with frame
/// pointers.
pub(crate) struct WithUnwound<'a, S> {
    pub kernel: &'a S,
    pub unwound: &'a UnwoundStacks,
}

impl<S: StackSource> StackSource for WithUnwound<'_, S> {
    fn stack(&self, id: StackId) -> Vec<u64> {
        match self.unwound.get(&id) {
            Some(stack) => stack.addrs.clone(),
            None => self.kernel.stack(id),
        }
    }

    fn user_frames_by_frame_pointer(&self, id: StackId) -> Vec<bool> {
        if let Some(stack) = self.unwound.get(&id) {
            stack.by_frame_pointer.clone()
        } else {
            let depth = self.kernel.stack(id).len();
            (0..depth).map(|i| i > 0).collect()
        }
    }

    fn named(&self, id: StackId) -> Option<Vec<String>> {
        self.kernel.named(id)
    }
}
