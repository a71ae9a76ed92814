//! The user stacks of read threads, unwound with DWARF and named.

use super::snapshot::ThreadSnapshot;
use crate::stack::naming::user_frame_names;
use crate::stack::symbolize::{ProcessMaps, StackSymbolizer};
use crate::stack::unwind::{DwarfUnwinder, UnwindEnd, UnwoundStack};

/// A thread's user stack, unwound and named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserStack {
    /// The instruction pointers found, innermost first.
    pub unwound: UnwoundStack,
    /// Their names, innermost first (inlined functions as frames of their own, ` [fp]`
    /// where found by frame pointer).
    pub frames: Vec<String>,
    /// How unwinding ended ([`UnwindEnd::OutOfStack`]: deeper than the bytes read).
    pub end: UnwindEnd,
}

/// Unwinds and names the user stack of each of `threads` of process `pid` (whose
/// mappings `maps` holds); `None` for threads without one.
pub(crate) fn user_stacks(
    pid: u32,
    threads: &[ThreadSnapshot],
    maps: &ProcessMaps,
    unwinder: &mut DwarfUnwinder,
    symbolizer: &mut StackSymbolizer,
    mut python: Option<&mut crate::stack::python::Interpreter>,
) -> Vec<Option<UserStack>> {
    let unwound: Vec<Option<(UnwoundStack, UnwindEnd)>> = threads
        .iter()
        .map(|thread| {
            let snapshot = thread.unwind_snapshot(pid)?;
            let (stack, end) = unwinder.unwind_one(&snapshot, maps);
            let stack = match (python.as_deref_mut(), thread.fsbase()) {
                (Some(python), Some(fsbase)) => python.merge_thread(stack, fsbase),
                _ => stack,
            };
            Some((stack, end))
        })
        .collect();
    let addrs: Vec<&[u64]> = unwound
        .iter()
        .flatten()
        .map(|(stack, _)| stack.addrs.as_slice())
        .collect();
    let mut named = symbolizer.user_stacks(maps, &addrs).into_iter();
    unwound
        .into_iter()
        .map(|stack| {
            let (unwound, end) = stack?;
            let frames = user_frame_names(named.next()?, &unwound.by_frame_pointer)
                .into_iter()
                .map(std::borrow::Cow::into_owned)
                .collect();
            Some(UserStack {
                unwound,
                frames,
                end,
            })
        })
        .collect()
}
