//! Naming stacks: the one place that turns recorded stacks (instruction pointers from
//! the kernel, unwound user stacks, or names /proc gave) into folded-stack frames: user
//! and kernel frames by id, in batches, with the marks every output shares (`_[k]`,
//! ` [fp]`), the process frame at the root; and the weighted stacks every view is
//! made of ([`StackProfile`]).

use std::borrow::Cow;

use foldhash::HashMap;
use tracer_common::StackId;

use crate::{
    kernel::Loader,
    stack::processes::Processes,
    stack::symbolize::{Frame, ProcessMaps, StackSymbolizer, UNKNOWN},
};

/// Marks kernel frames the way inferno's palettes and flamegraph.pl recognise them.
pub(crate) const KERNEL_SUFFIX: &str = "_[k]";

/// Appended to the name of a frame found by following frame pointers in a profile
/// otherwise unwound with call frame information.
pub(crate) const FRAME_POINTER_SUFFIX: &str = " [fp]";

/// Weight of one stack: how many events made it up and how long they lasted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Weight {
    /// On-CPU samples, or off-CPU intervals.
    pub events: u64,
    pub ns: u64,
}

impl Weight {
    pub fn add(&mut self, other: Weight) {
        self.events += other.events;
        self.ns += other.ns;
    }

    /// Microseconds, rounded up so no stack that took time shows 0.
    pub fn us(&self) -> u64 {
        self.ns.div_ceil(1000)
    }
}

/// Frame names interned to small ids: a profile is many stacks over few distinct names,
/// and summing stacks by their frames' ids costs far less than by their names.
#[derive(Clone, Debug, Default)]
pub struct FrameTable {
    /// Names by id, each once.
    names: Vec<String>,
    ids: HashMap<String, u32>,
}

impl FrameTable {
    /// The id of `name`, interned on first sight.
    pub fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = u32::try_from(self.names.len()).expect("fewer than 2^32 frame names");
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }

    /// Names by id.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// Stacks (root first) and their weights. Every export (folded, pprof, speedscope)
/// derives its microseconds from here with [`Weight::us`], so their totals agree.
///
/// Frames are interned in a [`FrameTable`]; views built together can be built with one
/// ([`StackProfile::from_interned`], each with a copy) so each frame is named and hashed
/// once.
#[derive(Clone, Debug, Default)]
pub struct StackProfile {
    table: FrameTable,
    stacks: HashMap<Vec<u32>, Weight>,
}

impl PartialEq for StackProfile {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for StackProfile {}

/// Stacks of frame ids of one [`FrameTable`], summed as they are added.
pub(crate) type InternedStacks = HashMap<Vec<u32>, Weight>;

/// Adds `weight` to the stack `ids` of `stacks`.
pub(crate) fn add_interned(stacks: &mut InternedStacks, ids: &[u32], weight: Weight) {
    match stacks.get_mut(ids) {
        Some(total) => total.add(weight),
        None => {
            stacks.insert(ids.to_vec(), weight);
        }
    }
}

impl StackProfile {
    /// A profile of `stacks`, whose ids are those of `table`.
    pub fn from_interned(table: FrameTable, stacks: InternedStacks) -> Self {
        debug_assert!(
            stacks
                .keys()
                .flatten()
                .all(|&id| (id as usize) < table.names.len())
        );
        Self { table, stacks }
    }

    pub fn add(&mut self, frames: Vec<String>, weight: Weight) {
        self.add_names(frames.iter().map(String::as_str), weight);
    }

    /// [`StackProfile::add`] from borrowed names.
    pub fn add_names<'a>(&mut self, frames: impl IntoIterator<Item = &'a str>, weight: Weight) {
        let ids: Vec<u32> = frames
            .into_iter()
            .map(|name| self.table.intern(name))
            .collect();
        add_interned(&mut self.stacks, &ids, weight);
    }

    /// Adds every stack of `other`.
    pub fn absorb(&mut self, other: &StackProfile) {
        let ids: Vec<u32> = other
            .table
            .names
            .iter()
            .map(|name| self.table.intern(name))
            .collect();
        let mut mapped = Vec::new();
        for (stack, weight) in &other.stacks {
            mapped.clear();
            mapped.extend(stack.iter().map(|&id| ids[id as usize]));
            add_interned(&mut self.stacks, &mapped, *weight);
        }
    }

    /// Frame names by id, as [`StackProfile::interned`] gives the stacks.
    pub fn names(&self) -> &[String] {
        self.table.names()
    }

    /// Stacks as frame ids (see [`StackProfile::names`]) and their weights, unordered.
    pub fn interned(&self) -> impl Iterator<Item = (&[u32], &Weight)> + '_ {
        self.stacks
            .iter()
            .map(|(ids, weight)| (ids.as_slice(), weight))
    }

    /// Stacks and weights, sorted by stack (frame by frame, by name).
    pub fn iter(&self) -> impl Iterator<Item = (Vec<&str>, Weight)> + '_ {
        let names = &self.table.names;
        // Each name's rank in name order: comparing ranks orders stacks as comparing
        // their names would, at the cost of integers.
        let mut by_name: Vec<u32> = (0..names.len() as u32).collect();
        by_name.sort_unstable_by(|&a, &b| names[a as usize].cmp(&names[b as usize]));
        let mut rank = vec![0u32; names.len()];
        for (position, &id) in by_name.iter().enumerate() {
            rank[id as usize] = position as u32;
        }
        let mut sorted: Vec<(Vec<u32>, &Vec<u32>, Weight)> = self
            .stacks
            .iter()
            .map(|(ids, weight)| {
                (
                    ids.iter().map(|&id| rank[id as usize]).collect(),
                    ids,
                    *weight,
                )
            })
            .collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        sorted.into_iter().map(move |(_, ids, weight)| {
            let frames = ids.iter().map(|&id| names[id as usize].as_str()).collect();
            (frames, weight)
        })
    }

    /// How many distinct stacks.
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Sum of the stacks' microseconds.
    pub fn total_us(&self) -> u64 {
        self.stacks.values().map(Weight::us).sum()
    }

    /// Sum of the stacks' events.
    pub fn total_events(&self) -> u64 {
        self.stacks.values().map(|w| w.events).sum()
    }
}

/// Raw stacks as the kernel stored them: instruction pointers, innermost first.
pub trait StackSource {
    fn stack(&self, id: StackId) -> Vec<u64>;

    /// For user stack `id`, whether each frame was found by following frame pointers,
    /// when the profile tells unwinding methods apart (DWARF unwinding); empty otherwise.
    fn user_frames_by_frame_pointer(&self, _id: StackId) -> Vec<bool> {
        Vec::new()
    }

    /// Stack `id` already named, innermost first, where its frames come as names rather
    /// than addresses (the kernel stacks /proc gives of threads blocked since before
    /// tracing started); `None` for stacks named from their addresses.
    fn named(&self, _id: StackId) -> Option<Vec<String>> {
        None
    }
}

/// Stacks of `ids` read from `inner` once, so their addresses can be handed to a
/// naming thread and then named from here without reading the kernel's map again.
pub(crate) struct PrefetchedStacks<'s, S> {
    inner: &'s S,
    addrs: HashMap<StackId, Vec<u64>>,
}

impl<'s, S: StackSource> PrefetchedStacks<'s, S> {
    pub(crate) fn new(inner: &'s S, ids: impl IntoIterator<Item = StackId>) -> Self {
        let addrs = ids
            .into_iter()
            .filter(|&id| id.has_frames() && inner.named(id).is_none())
            .map(|id| (id, inner.stack(id)))
            .collect();
        Self { inner, addrs }
    }

    /// The addresses read, a stack at a time.
    pub(crate) fn addresses(&self) -> impl Iterator<Item = &[u64]> {
        self.addrs.values().map(Vec::as_slice)
    }
}

impl<S: StackSource> StackSource for PrefetchedStacks<'_, S> {
    fn stack(&self, id: StackId) -> Vec<u64> {
        match self.addrs.get(&id) {
            Some(addrs) => addrs.clone(),
            None => self.inner.stack(id),
        }
    }

    fn user_frames_by_frame_pointer(&self, id: StackId) -> Vec<bool> {
        self.inner.user_frames_by_frame_pointer(id)
    }

    fn named(&self, id: StackId) -> Option<Vec<String>> {
        self.inner.named(id)
    }
}

impl StackSource for Loader {
    fn stack(&self, id: StackId) -> Vec<u64> {
        Loader::stack(self, id).unwrap_or_default()
    }
}

/// How the root frame of a stack names its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessRoot {
    /// Its name alone: the only process.
    Name,
    /// `name [pid]`: one process among several.
    NameAndPid,
    /// The program's name (`postgres`), shared by every process running it.
    Program,
}

/// The root frame of process `tgid`'s stacks, as `root` says.
pub(crate) fn process_frame(processes: &Processes, tgid: u32, root: ProcessRoot) -> String {
    let Some(process) = processes.get(tgid) else {
        return format!("[pid {tgid}]");
    };
    match root {
        ProcessRoot::Name => process.name.clone(),
        ProcessRoot::NameAndPid => format!("{} [{tgid}]", process.name),
        ProcessRoot::Program => process.program.clone(),
    }
}

/// The name and PID of a [`ProcessRoot::NameAndPid`] frame (`postgres [4242]`).
pub(crate) fn parse_process_frame(frame: &str) -> Option<(&str, u32)> {
    let (name, pid) = frame.strip_suffix(']')?.rsplit_once(" [")?;
    Some((name, pid.parse().ok()?))
}

/// Frames of each distinct user stack in `ids` of the process `maps` was captured from,
/// root first, each made by `frame` from its name. Without `maps` (the process exited
/// before they were read) a recorded stack is one unknown frame. Each distinct address
/// (with or without the frame-pointer suffix) is made into frames once: stacks repeat
/// the same addresses over and over.
pub(crate) fn user_stack_frames<T: Clone>(
    ids: impl IntoIterator<Item = StackId>,
    stacks: &impl StackSource,
    symbolizer: &mut StackSymbolizer,
    maps: Option<&ProcessMaps>,
    frame: impl FnMut(&str) -> T,
) -> HashMap<StackId, Vec<T>> {
    stack_frames(
        ids,
        stacks,
        "[missing user stack]",
        frame,
        move |ids, addrs, frame| {
            let Some(maps) = maps else {
                return vec![vec![frame(UNKNOWN)]; addrs.len()];
            };
            let named = symbolizer.user_addresses(maps, addrs);
            // Each address's frames, made once, in one array: (start, end) by address.
            let mut made: HashMap<(u64, bool), (usize, usize)> = HashMap::default();
            let mut all_made: Vec<T> = Vec::new();
            addrs
                .iter()
                .zip(ids)
                .map(|(addrs, &id)| {
                    let by_frame_pointer = stacks.user_frames_by_frame_pointer(id);
                    let mut frames = Vec::with_capacity(addrs.len());
                    for (index, lookup) in
                        crate::stack::symbolize::lookup_addresses(addrs).enumerate()
                    {
                        let fp = by_frame_pointer.get(index).copied().unwrap_or(false);
                        let (start, end) = *made.entry((lookup, fp)).or_insert_with(|| {
                            let start = all_made.len();
                            let names = user_frame_names(named.frames(lookup), &[fp]);
                            all_made.extend(names.iter().map(|name| frame(name)));
                            (start, all_made.len())
                        });
                        frames.extend_from_slice(&all_made[start..end]);
                    }
                    frames
                })
                .collect()
        },
    )
}

/// Frames of each distinct kernel stack in `ids`, root first, marked as kernel frames,
/// without the tracer's own BPF frames, each made by `frame` from its name.
pub(crate) fn kernel_stack_frames<T>(
    ids: impl IntoIterator<Item = StackId>,
    stacks: &impl StackSource,
    symbolizer: &mut StackSymbolizer,
    frame: impl FnMut(&str) -> T,
) -> HashMap<StackId, Vec<T>> {
    stack_frames(
        ids,
        stacks,
        "[missing kernel stack]",
        frame,
        move |_, addrs, frame| {
            let symbolizer = symbolizer;
            symbolizer
                .kernel_stacks(addrs)
                .into_iter()
                .map(|frames| {
                    let names = frames.into_iter().map(|f| f.name.as_str()).collect();
                    without_bpf_frames(names)
                        .into_iter()
                        .map(|name| frame(&format!("{name}{KERNEL_SUFFIX}")))
                        .collect()
                })
                .collect()
        },
    )
}

/// Drops the innermost kernel frames that belong to the tracer itself: the BPF program
/// and the tracepoint's `bpf_trace_run*` trampoline that called it. `names` is innermost
/// first; only the first few frames are looked at, so a real frame is never dropped.
fn without_bpf_frames<S: AsRef<str>>(mut names: Vec<S>) -> Vec<S> {
    const LOOKAHEAD: usize = 4;
    if let Some(pos) = names
        .iter()
        .take(LOOKAHEAD)
        .position(|n| n.as_ref().starts_with("bpf_trace_run"))
    {
        names.drain(..=pos);
    }
    names
}

/// Frames of each distinct stack in `ids`, root first, made by `frame` from their names;
/// the single frame `missing` for those the kernel could not record. `symbolize` makes
/// the frames of all the recorded ones at once (given their ids and addresses, and
/// `frame`), innermost first as they were recorded.
fn stack_frames<T>(
    ids: impl IntoIterator<Item = StackId>,
    stacks: &impl StackSource,
    missing: &str,
    mut frame: impl FnMut(&str) -> T,
    symbolize: impl FnOnce(&[StackId], &[&[u64]], &mut dyn FnMut(&str) -> T) -> Vec<Vec<T>>,
) -> HashMap<StackId, Vec<T>> {
    let mut ids: Vec<StackId> = ids.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    let mut frames = HashMap::with_capacity_and_hasher(ids.len(), Default::default());
    let mut recorded = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(names) = stacks.named(id) {
            frames.insert(id, names.iter().rev().map(|name| frame(name)).collect());
            continue;
        }
        let addrs = match id.has_frames() {
            true => stacks.stack(id),
            false => Vec::new(),
        };
        if addrs.is_empty() {
            frames.insert(id, vec![frame(missing)]);
        } else {
            recorded.push((id, addrs));
        }
    }
    let ids: Vec<StackId> = recorded.iter().map(|(id, _)| *id).collect();
    let addrs: Vec<&[u64]> = recorded.iter().map(|(_, addrs)| addrs.as_slice()).collect();
    for (id, mut made) in ids.iter().zip(symbolize(&ids, &addrs, &mut frame)) {
        made.reverse();
        frames.insert(*id, made);
    }
    frames
}

/// Names of the user frames of one stack, suffixed with [`FRAME_POINTER_SUFFIX`] where
/// found by frame pointers: `frames` as the symbolizer gives them for the stack's
/// addresses (inlined functions first, then the function of each address),
/// `by_frame_pointer` per address (empty: no suffixes).
pub(crate) fn user_frame_names<'f>(
    frames: impl IntoIterator<Item = &'f Frame>,
    by_frame_pointer: &[bool],
) -> Vec<Cow<'f, str>> {
    let mut address = 0;
    frames
        .into_iter()
        .map(|frame| {
            let fp = by_frame_pointer.get(address).copied().unwrap_or(false);
            if !frame.inlined {
                address += 1;
            }
            if fp {
                Cow::Owned(format!("{}{FRAME_POINTER_SUFFIX}", frame.name))
            } else {
                Cow::Borrowed(frame.name.as_str())
            }
        })
        .collect()
}

/// One frame of a stack printed a frame a line, as bpftrace prints `ustack` and
/// `kstack`: `name+OFFSET (module)`, the offset in decimal as bpftrace has it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FrameLine {
    pub name: String,
    /// How far into the function the address is (a return address for every frame but
    /// the innermost), when a symbol named it.
    pub offset: Option<u64>,
    /// The object's file name; `None` for kernel and unknown frames.
    pub module: Option<String>,
    pub kernel: bool,
    /// Inlined into the frame that follows it (same address).
    pub inlined: bool,
    /// Found by following a frame pointer in a stack otherwise unwound with call frame
    /// information (`--unwind dwarf`), marked as the profiles mark it.
    pub by_frame_pointer: bool,
}

impl FrameLine {
    /// `name+OFFSET (module)`, `[inlined]` after functions inlined into the next frame.
    pub(crate) fn text(&self) -> String {
        let mut text = self.name.clone();
        if let Some(offset) = self.offset {
            text += &format!("+{offset}");
        }
        match (&self.module, self.kernel) {
            (Some(module), _) => text += &format!(" ({module})"),
            (None, true) => text += " ([kernel])",
            (None, false) => {}
        }
        if self.inlined {
            text += " [inlined]";
        }
        if self.by_frame_pointer {
            text += FRAME_POINTER_SUFFIX;
        }
        text
    }

    /// The frame's name in folded stacks and flame graphs (kernel frames marked).
    pub(crate) fn folded_name(&self) -> String {
        match (self.kernel, self.by_frame_pointer) {
            (true, _) => format!("{}{KERNEL_SUFFIX}", self.name),
            (false, true) => format!("{}{FRAME_POINTER_SUFFIX}", self.name),
            (false, false) => self.name.clone(),
        }
    }
}

/// The stacks of one probe hit named for printing: innermost first, the kernel frames
/// (if the hit was in the kernel) before the user frames, as the hit's thread ran them;
/// and what is missing from them, said rather than left out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct HitStack {
    pub frames: Vec<FrameLine>,
    pub problems: Vec<String>,
}

/// Where every complete user stack starts: a thread's first function, in glibc or musl.
/// A frame-pointer stack that ends elsewhere lost its outer frames (a function without
/// frame pointers broke the chain).
const THREAD_ROOTS: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
    "__libc_start_main_impl",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
];

/// Why a stack id that names no frames has none.
fn stack_error(kind: &str, id: StackId) -> String {
    match id {
        StackId::Lost(libc::EEXIST) => {
            format!("{kind} stack not recorded: the stack map had a hash collision")
        }
        StackId::Lost(libc::ENOMEM) => format!("{kind} stack not recorded: the stack map is full"),
        StackId::Lost(errno) => format!("{kind} stack not recorded (error {errno})"),
        StackId::Unreadable => format!("{kind} stack not recorded: the kernel could not walk it"),
        _ => format!("no {kind} stack"),
    }
}

/// Names the stacks of one hit of process `maps` (`None`: it exited before its mappings
/// were read): `user` and `kernel` as the kernel gave them (stacks in `STACKS`, lost
/// ones, [`StackId::NotTaken`] when not asked for). A kernel
/// stack that is not there is not a problem: USDT probes fire in user mode. `short_why`
/// says why a user stack that ends before a thread's start likely does (how it was
/// walked).
pub(crate) fn hit_stack(
    user: StackId,
    kernel: StackId,
    stacks: &(impl StackSource + ?Sized),
    symbolizer: &mut StackSymbolizer,
    maps: Option<&ProcessMaps>,
    short_why: &str,
) -> HitStack {
    let mut hit = HitStack::default();
    if kernel.has_frames() {
        let addrs = stacks.stack(kernel);
        let frames = symbolizer.kernel_stacks(&[&addrs]).remove(0);
        let names: Vec<&str> = frames.iter().map(|f| f.name.as_str()).collect();
        let ours = names.len() - without_bpf_frames(names).len();
        hit.frames
            .extend(lines(frames.into_iter().skip(ours), true, ours > 0, &[]));
    } else if !matches!(kernel, StackId::None | StackId::NotTaken) {
        hit.problems.push(stack_error("kernel", kernel));
    }
    match user {
        StackId::NotTaken => return hit,
        user if !user.has_frames() => {
            hit.problems.push(stack_error("user", user));
            return hit;
        }
        _ => {}
    }
    let addrs = stacks.stack(user);
    if addrs.is_empty() {
        hit.problems
            .push("user stack missing from the stack map".to_string());
        return hit;
    }
    let user_lines = if let Some(maps) = maps {
        let frames = symbolizer.user_stacks(maps, &[&addrs]).remove(0);
        lines(
            frames,
            false,
            false,
            &stacks.user_frames_by_frame_pointer(user),
        )
    } else {
        hit.problems.push(
            "the process exited before its mappings were read: user frames unnamed".to_string(),
        );
        addrs
            .iter()
            .take_while(|&&a| a != 0)
            .map(|&addr| FrameLine {
                name: format!("{addr:#x}"),
                offset: None,
                module: None,
                kernel: false,
                inlined: false,
                by_frame_pointer: false,
            })
            .collect()
    };
    let reaches_root = user_lines
        .last()
        .is_some_and(|f| THREAD_ROOTS.contains(&f.name.as_str()));
    if maps.is_some() && !reaches_root {
        let depth = addrs.iter().take_while(|&&a| a != 0).count();
        hit.problems
            .push(if depth >= tracer_common::MAX_STACK_DEPTH {
                format!(
                    "user stack cut at {} frames",
                    tracer_common::MAX_STACK_DEPTH
                )
            } else {
                format!(
                    "user stack incomplete: it stops at {} rather than at a thread's start \
                 ({short_why})",
                    user_lines.last().map_or(UNKNOWN, |f| f.name.as_str())
                )
            });
    }
    hit.frames.extend(user_lines);
    hit
}

/// Lines of one stack's frames (innermost first, as the symbolizer gives them). Every
/// address but the first is a return address, looked up one byte earlier: its offset
/// is shown as the return address's, as bpftrace shows it. `after_ours`: the first
/// frame is a return address too (the frames before it, the tracer's, were dropped).
/// `by_frame_pointer`: per address, whether it was found by a frame pointer (empty: no
/// marks).
fn lines<'f>(
    frames: impl IntoIterator<Item = &'f Frame>,
    kernel: bool,
    after_ours: bool,
    by_frame_pointer: &[bool],
) -> Vec<FrameLine> {
    let mut address = 0;
    frames
        .into_iter()
        .map(|frame| {
            let returns = address > 0 || after_ours;
            let fp = by_frame_pointer.get(address).copied().unwrap_or(false);
            if !frame.inlined {
                address += 1;
            }
            FrameLine {
                name: frame.name.clone(),
                offset: frame.offset.map(|o| o + u64::from(returns)),
                module: frame.module.clone(),
                kernel,
                inlined: frame.inlined,
                by_frame_pointer: fp,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_the_tracers_own_kernel_frames() {
        let names = |v: &[&str]| {
            v.iter()
                .map(std::string::ToString::to_string)
                .collect::<Vec<_>>()
        };
        let stack = names(&["bpf_prog_x", "bpf_trace_run4", "__schedule", "schedule"]);
        assert_eq!(
            without_bpf_frames(stack),
            names(&["__schedule", "schedule"])
        );
        let untouched = names(&["__schedule", "schedule", "do_nanosleep"]);
        assert_eq!(without_bpf_frames(untouched.clone()), untouched);
    }

    /// Stacks by id, as the kernel's map would hold them.
    struct FakeStacks(Vec<Vec<u64>>);

    impl StackSource for FakeStacks {
        fn stack(&self, id: StackId) -> Vec<u64> {
            self.0.get(id.raw() as usize).cloned().unwrap_or_default()
        }
    }

    /// A stack that cannot be shown whole says why, and shows what it has; a missing
    /// kernel stack (a uprobe fires in user mode) is no problem, not asked-for stacks
    /// neither.
    #[test]
    fn hit_stacks_say_what_is_missing() {
        let stacks = FakeStacks(vec![vec![0x1000, 0x2000, 0]]);
        let mut symbolizer = StackSymbolizer::new();
        let no_stack = StackId::None;
        let not_taken = StackId::NotTaken;
        let mut hit =
            |user, kernel, maps| hit_stack(user, kernel, &stacks, &mut symbolizer, maps, "why");
        assert_eq!(hit(not_taken, not_taken, None), HitStack::default());
        assert_eq!(hit(no_stack, no_stack, None).problems, ["no user stack"]);
        assert_eq!(
            hit(StackId::Lost(libc::EEXIST), no_stack, None).problems,
            ["user stack not recorded: the stack map had a hash collision"]
        );
        assert_eq!(
            hit(not_taken, StackId::Lost(libc::ENOMEM), None).problems,
            ["kernel stack not recorded: the stack map is full"]
        );
        assert_eq!(
            hit(StackId::StackMap(5), no_stack, None).problems,
            ["user stack missing from the stack map"]
        );
        // The process is gone: its addresses, unnamed, and why.
        let gone = hit(StackId::StackMap(0), no_stack, None);
        let names: Vec<&str> = gone.frames.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["0x1000", "0x2000"]);
        assert_eq!(
            gone.problems,
            ["the process exited before its mappings were read: user frames unnamed"]
        );
    }

    /// The innermost frame's offset is its address's; every other's is its return
    /// address's, one past the byte looked up.
    #[test]
    fn frame_lines_show_return_address_offsets() {
        let frame = |name: &str, inlined, offset| Frame {
            name: name.to_string(),
            module: Some("app".to_string()),
            inlined,
            offset,
        };
        let frames = [
            frame("leaf", false, Some(4)),
            frame("helper", true, None),
            frame("caller", false, Some(9)),
        ];
        let lines = lines(&frames, false, false, &[]);
        let texts: Vec<String> = lines.iter().map(FrameLine::text).collect();
        assert_eq!(
            texts,
            ["leaf+4 (app)", "helper (app) [inlined]", "caller+10 (app)"]
        );
        // The second address found by its frame pointer: it and what was inlined there.
        let marked = super::lines(&frames, false, false, &[false, true]);
        let texts: Vec<String> = marked.iter().map(FrameLine::text).collect();
        assert_eq!(
            texts,
            [
                "leaf+4 (app)",
                "helper (app) [inlined] [fp]",
                "caller+10 (app) [fp]"
            ]
        );
        assert_eq!(marked[2].folded_name(), "caller [fp]");
        let kernel = lines_of_kernel();
        assert_eq!(kernel.text(), "do_syscall_64+8 ([kernel])");
        assert_eq!(kernel.folded_name(), "do_syscall_64_[k]");
    }

    fn lines_of_kernel() -> FrameLine {
        let frame = Frame {
            name: "do_syscall_64".to_string(),
            module: None,
            inlined: false,
            offset: Some(7),
        };
        lines([&frame], true, true, &[]).remove(0)
    }

    #[test]
    fn marks_frames_found_by_frame_pointers() {
        let frame = |name: &str, inlined| Frame {
            name: name.to_string(),
            module: None,
            inlined,
            offset: None,
        };
        // Three addresses: `leaf`; `helper` inlined into `middle`; `main`.
        let frames = vec![
            frame("leaf", false),
            frame("helper", true),
            frame("middle", false),
            frame("main", false),
        ];
        assert_eq!(
            user_frame_names(&frames, &[false, true, true]),
            ["leaf", "helper [fp]", "middle [fp]", "main [fp]"]
        );
        assert_eq!(
            user_frame_names(&frames, &[false, false, true]),
            ["leaf", "helper", "middle", "main [fp]"]
        );
        assert_eq!(
            user_frame_names(&frames, &[]),
            ["leaf", "helper", "middle", "main"]
        );
    }
}
