//! Naming stacks: the one place that turns recorded stacks (instruction pointers from
//! the kernel, unwound user stacks, or names /proc gave) into folded-stack frames: user
//! and kernel frames by id, in batches, with the marks every output shares (`_[k]`,
//! ` [fp]`), the process frame at the root; and the weighted stacks every view is
//! made of ([`StackProfile`]).

use std::{borrow::Cow, collections::BTreeMap};

use foldhash::HashMap;

use crate::{
    loader::Loader,
    processes::Processes,
    symbolize::{Frame, ProcessMaps, StackSymbolizer, UNKNOWN},
};

/// Marks kernel frames the way inferno's palettes and flamegraph.pl recognise them.
pub const KERNEL_SUFFIX: &str = "_[k]";

/// Appended to the name of a frame found by following frame pointers in a profile
/// otherwise unwound with call frame information.
pub const FRAME_POINTER_SUFFIX: &str = " [fp]";

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

/// Stacks (root first) and their weights. Every export (folded, pprof, speedscope)
/// derives its microseconds from here with [`Weight::us`], so their totals agree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackProfile {
    stacks: BTreeMap<Vec<String>, Weight>,
}

impl StackProfile {
    pub fn add(&mut self, frames: Vec<String>, weight: Weight) {
        self.stacks.entry(frames).or_default().add(weight);
    }

    /// Stacks and weights, sorted by stack.
    pub fn iter(&self) -> impl Iterator<Item = (&[String], Weight)> {
        self.stacks.iter().map(|(f, w)| (f.as_slice(), *w))
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
    fn stack(&self, id: i32) -> Vec<u64>;

    /// For user stack `id`, whether each frame was found by following frame pointers,
    /// when the profile tells unwinding methods apart (DWARF unwinding); empty otherwise.
    fn user_frames_by_frame_pointer(&self, _id: i32) -> Vec<bool> {
        Vec::new()
    }

    /// Stack `id` already named, innermost first, where its frames come as names rather
    /// than addresses (the kernel stacks /proc gives of threads blocked since before
    /// tracing started); `None` for stacks named from their addresses.
    fn named(&self, _id: i32) -> Option<Vec<String>> {
        None
    }
}

impl StackSource for Loader {
    fn stack(&self, id: i32) -> Vec<u64> {
        Loader::stack(self, id).unwrap_or_default()
    }
}

/// The root frame of process `tgid`'s stacks: its name, and its PID when the profile has
/// `several` processes.
pub fn process_frame(processes: &Processes, tgid: u32, several: bool) -> String {
    let name = processes.get(tgid).map(|p| p.name.as_str());
    match (name, several) {
        (Some(name), false) => name.to_string(),
        (Some(name), true) => format!("{name} [{tgid}]"),
        (None, _) => format!("[pid {tgid}]"),
    }
}

/// Frames of each distinct user stack in `ids` of the process `maps` was captured from,
/// root first, each made by `frame` from its name. Without `maps` (the process exited
/// before they were read) a recorded stack is one unknown frame.
pub(crate) fn user_stack_frames<T>(
    ids: impl IntoIterator<Item = i32>,
    stacks: &impl StackSource,
    symbolizer: &mut StackSymbolizer,
    maps: Option<&ProcessMaps>,
    frame: impl FnMut(&str) -> T,
) -> HashMap<i32, Vec<T>> {
    stack_frames(
        ids,
        stacks,
        "[missing user stack]",
        frame,
        move |ids, addrs| {
            let Some(maps) = maps else {
                return vec![vec![Cow::Borrowed(UNKNOWN)]; addrs.len()];
            };
            let symbolizer = symbolizer;
            symbolizer
                .user_stacks(maps, addrs)
                .into_iter()
                .zip(ids)
                .map(|(frames, &id)| {
                    user_frame_names(frames, &stacks.user_frames_by_frame_pointer(id))
                })
                .collect()
        },
    )
}

/// Frames of each distinct kernel stack in `ids`, root first, marked as kernel frames,
/// without the tracer's own BPF frames, each made by `frame` from its name.
pub(crate) fn kernel_stack_frames<T>(
    ids: impl IntoIterator<Item = i32>,
    stacks: &impl StackSource,
    symbolizer: &mut StackSymbolizer,
    frame: impl FnMut(&str) -> T,
) -> HashMap<i32, Vec<T>> {
    stack_frames(
        ids,
        stacks,
        "[missing kernel stack]",
        frame,
        move |_, addrs| {
            let symbolizer = symbolizer;
            symbolizer
                .kernel_stacks(addrs)
                .into_iter()
                .map(|frames| {
                    let names = frames.into_iter().map(|f| f.name.as_str()).collect();
                    without_bpf_frames(names)
                        .into_iter()
                        .map(|name| Cow::Owned(format!("{name}{KERNEL_SUFFIX}")))
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
/// the single frame `missing` for those the kernel could not record. `symbolize` names
/// all the recorded ones at once (given their ids and addresses), innermost first as they
/// were recorded.
fn stack_frames<'s, T>(
    ids: impl IntoIterator<Item = i32>,
    stacks: &impl StackSource,
    missing: &str,
    mut frame: impl FnMut(&str) -> T,
    symbolize: impl FnOnce(&[i32], &[&[u64]]) -> Vec<Vec<Cow<'s, str>>>,
) -> HashMap<i32, Vec<T>> {
    let mut ids: Vec<i32> = ids.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    let mut frames = HashMap::with_capacity_and_hasher(ids.len(), Default::default());
    let mut recorded = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(names) = stacks.named(id) {
            frames.insert(id, names.iter().rev().map(|name| frame(name)).collect());
            continue;
        }
        let addrs = if id < 0 { Vec::new() } else { stacks.stack(id) };
        if addrs.is_empty() {
            frames.insert(id, vec![frame(missing)]);
        } else {
            recorded.push((id, addrs));
        }
    }
    let ids: Vec<i32> = recorded.iter().map(|(id, _)| *id).collect();
    let addrs: Vec<&[u64]> = recorded.iter().map(|(_, addrs)| addrs.as_slice()).collect();
    for ((id, _), names) in recorded.iter().zip(symbolize(&ids, &addrs)) {
        frames.insert(*id, names.iter().rev().map(|name| frame(name)).collect());
    }
    frames
}

/// Names of the user frames of one stack, suffixed with [`FRAME_POINTER_SUFFIX`] where
/// found by frame pointers: `frames` as the symbolizer gives them for the stack's
/// addresses (inlined functions first, then the function of each address),
/// `by_frame_pointer` per address (empty: no suffixes).
pub fn user_frame_names<'f>(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_the_tracers_own_kernel_frames() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let stack = names(&["bpf_prog_x", "bpf_trace_run4", "__schedule", "schedule"]);
        assert_eq!(
            without_bpf_frames(stack),
            names(&["__schedule", "schedule"])
        );
        let untouched = names(&["__schedule", "schedule", "do_nanosleep"]);
        assert_eq!(without_bpf_frames(untouched.clone()), untouched);
    }

    #[test]
    fn marks_frames_found_by_frame_pointers() {
        let frame = |name: &str, inlined| Frame {
            name: name.to_string(),
            module: None,
            inlined,
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
