//! The stacks of hits: unwound (DWARF) or read from the kernel's stack map, named with
//! their Python frames, printed after a hit's line or counted.

use std::collections::HashMap;

use tracer_common::StackId;

use crate::{
    kernel::RecordRing,
    stack::naming::{self, HitStack, StackSource},
    stack::python::Interpreters,
    stack::symbolize::{ProcessMaps, StackSymbolizer},
    stack::unwind::{DwarfUnwinder, Snapshot, StackMerger, UnwindEnd, UnwoundStack},
    system::text::escape_text,
};

/// A stack a frame a line, innermost first, each line after `indent`, then its
/// problems in brackets.
pub(super) fn stack_text(stack: &HitStack, indent: &str) -> String {
    let mut text = String::new();
    for frame in &stack.frames {
        text += &format!("{indent}{}\n", escape_text(&frame.text()));
    }
    for problem in &stack.problems {
        text += &format!("{indent}[{}]\n", escape_text(problem));
    }
    text
}

/// A frame of a hit's stack in the JSON. Fields in name order, as the document was first
/// written (serde_json's maps sort their keys).
#[derive(serde::Serialize)]
pub(super) struct FrameJson<'a> {
    function: &'a str,
    inlined: bool,
    kernel: bool,
    module: Option<&'a str>,
    offset: Option<u64>,
}

/// The frames of `stack`, innermost first, for the JSON.
pub(super) fn stack_json(stack: &HitStack) -> Vec<FrameJson<'_>> {
    stack
        .frames
        .iter()
        .map(|f| FrameJson {
            function: &f.name,
            inlined: f.inlined,
            kernel: f.kernel,
            module: f.module.as_deref(),
            offset: f.offset,
        })
        .collect()
}

/// Names the stacks of hits, each distinct one once, in the mappings of its process as
/// they were when it was first seen (read then: a process that exits is still named).
pub(super) struct StackNamer {
    pub(super) symbolizer: StackSymbolizer,
    /// `None`: could not be read (the process exited).
    pub(super) maps: HashMap<u32, Option<ProcessMaps>>,
    pub(super) named: HashMap<(u32, StackId, StackId), HitStack>,
    /// `--unwind dwarf`: the snapshot ring, and the stacks unwound from it by snapshot
    /// id until their events take them.
    pub(super) snapshots: Option<RecordRing>,
    pub(super) unwinder: DwarfUnwinder,
    /// The CPython interpreters whose frames snapshots carry.
    pub(super) interpreters: Interpreters,
    pub(super) unwound: HashMap<StackId, (UnwoundStack, UnwindEnd)>,
    /// Unwound stacks named, by process, addresses and kernel stack: hits repeat stacks.
    pub(super) named_unwound: HashMap<(u32, UnwoundStack, StackId), HitStack>,
}

/// One unwound user stack as a stack source, for [`naming::hit_stack`].
pub(super) struct OneStack<'a> {
    pub(super) id: StackId,
    pub(super) unwound: &'a UnwoundStack,
    pub(super) others: &'a dyn StackSource,
}

impl StackSource for OneStack<'_> {
    fn stack(&self, id: StackId) -> Vec<u64> {
        match id == self.id {
            true => self.unwound.addrs.clone(),
            false => self.others.stack(id),
        }
    }

    fn user_frames_by_frame_pointer(&self, id: StackId) -> Vec<bool> {
        match id == self.id {
            true => self.unwound.by_frame_pointer.clone(),
            false => Vec::new(),
        }
    }
}

impl StackNamer {
    pub(super) fn new(snapshots: Option<RecordRing>, interpreters: Interpreters) -> Self {
        Self {
            symbolizer: StackSymbolizer::new(),
            maps: HashMap::new(),
            named: HashMap::new(),
            snapshots,
            unwinder: DwarfUnwinder::new(),
            interpreters,
            unwound: HashMap::new(),
            named_unwound: HashMap::new(),
        }
    }

    /// Reads the mappings of process `tgid` unless already read.
    pub(super) fn observe(&mut self, tgid: u32) {
        self.maps.entry(tgid).or_insert_with(|| {
            // An exited process not yet reaped still has a maps file, empty.
            ProcessMaps::capture(tgid)
                .ok()
                .filter(|maps| maps.mapped_files().next().is_some())
        });
    }

    /// Unwinds the snapshots waiting: each is sent before its event, so an event finds
    /// its snapshot unwound here.
    pub(super) fn unwind_snapshots(&mut self) {
        let Some(mut ring) = self.snapshots.take() else {
            return;
        };
        ring.drain(|record| {
            let Some(snapshot) = Snapshot::parse(record) else {
                return;
            };
            self.observe(snapshot.tgid);
            let unwound = match self.maps.get(&snapshot.tgid).and_then(Option::as_ref) {
                Some(maps) => {
                    let (stack, end) = self.unwinder.unwind_one(&snapshot, maps);
                    let merger = self.interpreters.find(snapshot.tgid, Some(maps));
                    match (merger, &snapshot.python) {
                        (Some(merger), Some(python)) => (merger.merge_python(stack, python), end),
                        _ => (stack, end),
                    }
                }
                // Named later as the address of a process gone, and said so.
                None => (
                    UnwoundStack {
                        addrs: vec![snapshot.ip],
                        by_frame_pointer: vec![false],
                    },
                    UnwindEnd::Complete,
                ),
            };
            // Every snapshot a hit sends has an id: its event names it.
            if let Some(id) = snapshot.snapshot {
                self.unwound.insert(id, unwound);
            }
        });
        self.snapshots = Some(ring);
    }

    /// The stacks of a hit of process `tgid`, ids in `stacks` (or a snapshot's).
    pub(super) fn name(
        &mut self,
        stacks: &dyn StackSource,
        tgid: u32,
        user: StackId,
        kernel: StackId,
    ) -> HitStack {
        if let StackId::Snapshot(_) = user {
            return self.name_unwound(stacks, tgid, user, kernel);
        }
        if let Some(stack) = self.named.get(&(tgid, user, kernel)) {
            return stack.clone();
        }
        self.observe(tgid);
        let mut stack = naming::hit_stack(
            user,
            kernel,
            stacks,
            &mut self.symbolizer,
            self.maps.get(&tgid).and_then(Option::as_ref),
            "a caller without frame pointers?",
        );
        if self.snapshots.is_some() && user.has_frames() {
            stack
                .problems
                .push("walked by frame pointers: the snapshot ring buffer was full".into());
        }
        self.named.insert((tgid, user, kernel), stack.clone());
        stack
    }

    /// The stacks of a hit whose user stack is snapshot `id`, unwound. Not kept: each
    /// snapshot is one hit's.
    pub(super) fn name_unwound(
        &mut self,
        stacks: &dyn StackSource,
        tgid: u32,
        id: StackId,
        kernel: StackId,
    ) -> HitStack {
        if !self.unwound.contains_key(&id) {
            // Sent after the ring was last drained, before its event was read.
            self.unwind_snapshots();
        }
        let Some((unwound, end)) = self.unwound.remove(&id) else {
            let mut stack = self.name(stacks, tgid, StackId::NotTaken, kernel);
            stack
                .problems
                .push("user stack snapshot lost before it was unwound".into());
            return stack;
        };
        let key = (tgid, unwound, kernel);
        if let Some(stack) = self.named_unwound.get(&key) {
            return stack.clone();
        }
        let one = OneStack {
            id,
            unwound: &key.1,
            others: stacks,
        };
        self.observe(tgid);
        let mut stack = naming::hit_stack(
            id,
            kernel,
            &one,
            &mut self.symbolizer,
            self.maps.get(&tgid).and_then(Option::as_ref),
            "no unwind information or frame pointer there",
        );
        if end == UnwindEnd::OutOfStack {
            stack.problems.push(format!(
                "user stack deeper than the {} KiB copied",
                tracer_common::UNWIND_STACK_BYTES / 1024
            ));
        }
        self.named_unwound.insert(key, stack.clone());
        stack
    }
}
