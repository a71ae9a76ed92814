//! Naming the stacks of a wall-clock profile ([`Namer`]): every distinct stack is named
//! once, up front, into frame ids of one frame table. The frames the views add (process,
//! thread, leaves) are interned there too, so naming a stack only reads. Which stack ids
//! stand for a missing stack is told here too ([`is_missing`]).

use std::collections::{BTreeMap, BTreeSet};

use tracer_common::{StackId, StackKey, offcpu_state};

use super::GroupBy;
use super::python::{PythonFrameKind, PythonState};
use super::{
    BEFORE_START_FRAME, MISSED_FRAME, NOT_SAMPLED_FRAME, OFF_CPU_FRAME, RUNNABLE_FRAME,
    TRUNCATED_FRAME, UNREADABLE_FRAME,
};
use crate::{
    stack::naming::{
        FrameTable, PrefetchedStacks, StackSource, kernel_stack_frames, process_frame,
        user_stack_frames,
    },
    stack::processes::Processes,
    stack::symbolize::StackSymbolizer,
};

/// Names the stacks of a profile: every distinct stack was named up front, in one batch
/// per process and one for the kernel, into frame ids of one [`FrameTable`] that all
/// three views are built with (each keeps a copy of it).
pub(super) struct Namer {
    per_thread: bool,
    pub(super) table: FrameTable,
    user: foldhash::HashMap<(u32, StackId), Vec<u32>>,
    kernel: foldhash::HashMap<StackId, Vec<u32>>,
    /// The root frame of each process, and with `per_thread` the frame of each thread.
    process_frames: foldhash::HashMap<u32, u32>,
    thread_frames: foldhash::HashMap<u32, u32>,
    /// The frames that stand for no stack, or for a part left out.
    before_start: u32,
    not_sampled: u32,
    unreadable: u32,
    missed: u32,
    pub(super) runnable: u32,
    pub(super) off_cpu: u32,
    /// By frame id: could not be named.
    unnamed: Vec<bool>,
    /// By frame id: what the frame says of a Python thread's state.
    python: Vec<PythonFrameKind>,
}

impl Namer {
    pub(super) fn new(
        keys: &[StackKey],
        stacks: &impl StackSource,
        symbolizer: &mut StackSymbolizer,
        processes: &Processes,
        per_thread: bool,
        group_by: GroupBy,
    ) -> Self {
        let mut user_ids: BTreeMap<u32, Vec<StackId>> = BTreeMap::new();
        for key in keys.iter().filter(|k| names_frames(k.user)) {
            user_ids.entry(key.tgid).or_default().push(key.user);
        }
        let kernel_ids: Vec<StackId> = keys
            .iter()
            .map(|k| k.kernel)
            .filter(|&id| names_frames(id))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let kernel_stacks = PrefetchedStacks::new(stacks, kernel_ids.iter().copied());
        let unnamed_kernel = symbolizer.unnamed_kernel_addresses(kernel_stacks.addresses());
        let mut table = FrameTable::default();
        let mut user = foldhash::HashMap::default();
        // Kernel addresses are named on another thread meanwhile: the two take about as
        // long, and this is the time a stopping tracer makes its user wait.
        let kernel_naming =
            (!unnamed_kernel.is_empty()).then(|| symbolizer.name_kernel_apart(unnamed_kernel));
        for (tgid, ids) in user_ids {
            let maps = processes.get(tgid).and_then(|p| p.maps.as_ref());
            let names = user_stack_frames(ids, stacks, symbolizer, maps, |name| table.intern(name));
            user.extend(names.into_iter().map(|(id, names)| ((tgid, id), names)));
        }
        if let Some(naming) = kernel_naming {
            symbolizer.add_kernel_names(naming.wait());
        }
        let kernel = kernel_stack_frames(kernel_ids, &kernel_stacks, symbolizer, |name| {
            table.intern(name)
        });
        // Every frame a stack can have is interned here, so that naming a stack only
        // reads, and the views can be built on two threads. With more than one process,
        // each root frame says which (`name [pid]`), unless grouped by name.
        let mut tgids = keys.iter().map(|k| k.tgid);
        let first = tgids.next();
        let root = group_by.root(tgids.any(|t| Some(t) != first));
        let mut process_frames = foldhash::HashMap::default();
        let mut thread_frames = foldhash::HashMap::default();
        for key in keys {
            process_frames
                .entry(key.tgid)
                .or_insert_with(|| table.intern(&process_frame(processes, key.tgid, root)));
            if per_thread {
                thread_frames.entry(key.tid).or_insert_with(|| {
                    let name = processes.thread_name(key.tid).unwrap_or("?");
                    table.intern(&format!("{name} [{}]", key.tid))
                });
            }
        }
        let before_start = table.intern(BEFORE_START_FRAME);
        let not_sampled = table.intern(NOT_SAMPLED_FRAME);
        let unreadable = table.intern(UNREADABLE_FRAME);
        let missed = table.intern(MISSED_FRAME);
        let runnable = table.intern(RUNNABLE_FRAME);
        let off_cpu = table.intern(OFF_CPU_FRAME);
        let unnamed = table.names().iter().map(|name| is_unnamed(name)).collect();
        let python = table
            .names()
            .iter()
            .map(|name| PythonFrameKind::of(name))
            .collect();
        Self {
            per_thread,
            table,
            user,
            kernel,
            process_frames,
            thread_frames,
            before_start,
            not_sampled,
            unreadable,
            missed,
            runnable,
            off_cpu,
            unnamed,
            python,
        }
    }

    /// The frame ids of `key`'s stack, root first, into `frames`.
    pub(super) fn frames(&self, key: &StackKey, frames: &mut Vec<u32>) {
        frames.clear();
        frames.push(self.process_frames[&key.tgid]);
        if self.per_thread {
            frames.push(self.thread_frames[&key.tid]);
        }
        match key.user {
            StackId::BeforeStart => {
                frames.push(self.before_start);
                return;
            }
            id if names_frames(id) => {
                frames.extend_from_slice(&self.user[&(key.tgid, id)]);
            }
            _ => {}
        }
        match key.kernel {
            StackId::NotSampled => frames.push(self.not_sampled),
            StackId::Unreadable => frames.push(self.unreadable),
            StackId::Missed => frames.push(self.missed),
            id if !names_frames(id) => {}
            id => frames.extend_from_slice(&self.kernel[&id]),
        }
    }

    /// Whether any of `frames` could not be named.
    /// What a stack with `frames`, in `state` (on CPU: `None`), says a Python thread did.
    pub(super) fn python_state(&self, frames: &[u32], state: Option<u32>) -> PythonState {
        let kinds = || frames.iter().map(|&id| self.python[id as usize]);
        if !kinds().any(|k| k == PythonFrameKind::Function) {
            return PythonState::NotPython;
        }
        if kinds().any(|k| k == PythonFrameKind::Collector) {
            return PythonState::Collecting;
        }
        match state {
            None => PythonState::Running,
            Some(offcpu_state::RUNNABLE) => PythonState::Runnable,
            Some(_) if kinds().any(|k| k == PythonFrameKind::Gil) => PythonState::Gil,
            Some(_) => PythonState::Blocked,
        }
    }

    /// Whether the stack of `frames` was cut short.
    pub(super) fn is_truncated(&self, frames: &[u32]) -> bool {
        frames
            .iter()
            .any(|&id| self.table.names()[id as usize] == TRUNCATED_FRAME)
    }

    pub(super) fn has_unnamed(&self, frames: &[u32]) -> bool {
        frames.iter().any(|&id| self.unnamed[id as usize])
    }
}

/// Whether stack id `id` is named by the symbolizer: a stored stack, or one the kernel
/// failed to record (named as missing). The other sentinels have frames of their own or
/// none.
fn names_frames(id: StackId) -> bool {
    id.has_frames() || matches!(id, StackId::Lost(_))
}

/// Whether a frame could not be named.
fn is_unnamed(frame: &str) -> bool {
    frame.starts_with(crate::stack::symbolize::UNKNOWN)
}

/// A stack that should be there and is not (not the legitimately absent kind).
/// A return to the CPU that went unseen is not counted: the kernel did not report the
/// switch (bpftrace misses the same ones), and [`switch_in_missed`] counts those.
pub(super) fn is_missing(key: &StackKey) -> bool {
    let lost = |id: StackId| id.is_lost() && id != StackId::Missed;
    lost(key.user) || lost(key.kernel)
}

/// Whether `key` is the time of intervals whose thread's return to the CPU went unseen.
pub(super) fn switch_in_missed(key: &StackKey) -> bool {
    key.kernel == StackId::Missed
}
