//! Naming the stacks the kernel recorded: user and kernel stacks by id, in batches, as
//! folded-stack frames; thread names; the off-CPU totals a report gives.

use std::borrow::Cow;

use foldhash::HashMap;
use tracer_common::OffCpuStart;

use crate::{
    render::flamegraph::FoldedStacks,
    symbolize::{ProcessMaps, StackSymbolizer, UNKNOWN},
    unwind::user_frame_names,
};

/// Marks kernel frames the way inferno's palettes and flamegraph.pl recognise them.
pub const KERNEL_SUFFIX: &str = "_[k]";

/// Names of a process's threads, remembered while it runs.
#[derive(Debug, Default)]
pub struct ThreadNames {
    names: HashMap<u32, String>,
}

impl ThreadNames {
    /// Reads the names of every current thread of `pid` (threads seen before are kept).
    pub fn refresh(&mut self, pid: u32) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if let Ok(comm) = crate::procfs::read_name(&task.path().join("comm")) {
                self.names.insert(tid, comm);
            }
        }
    }

    /// Reads the names of the threads of `pid` not seen before: one directory listing
    /// when there are none, so it can run often (short-lived threads are named too).
    pub fn add_new(&mut self, pid: u32) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        for task in tasks.flatten() {
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                continue;
            };
            if self.names.contains_key(&tid) {
                continue;
            }
            if let Ok(comm) = crate::procfs::read_name(&task.path().join("comm")) {
                self.names.insert(tid, comm);
            }
        }
    }

    pub fn get(&self, tid: u32) -> Option<&str> {
        self.names.get(&tid).map(String::as_str)
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

/// What the off-CPU profile holds and what could not be recorded.
#[derive(Debug, Default)]
pub struct OffCpuProfile {
    /// Weights in microseconds.
    pub folded: FoldedStacks,
    pub total_ns: u64,
    pub intervals: u64,
    /// Intervals whose user or kernel stack could not be captured.
    pub missing_stacks: u64,
}

/// Threads still off CPU when tracing stopped (from the kernel's map of interval starts):
/// their time so far counts, as a finished interval's would (they are blocked right
/// now), unless it is shorter than `--min-block`, which the kernel applies to finished
/// intervals only.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenIntervals<'a> {
    /// Thread id and when (and where) it blocked.
    pub starts: &'a [(u32, OffCpuStart)],
    /// When tracing stopped (CLOCK_MONOTONIC ns).
    pub now_ns: u64,
    /// `--min-block`: shorter intervals are left out.
    pub min_block_ns: u64,
}

impl<'a> OpenIntervals<'a> {
    /// Each interval long enough to count: its thread, its start, and how long it has
    /// lasted. Like the kernel, keeps intervals of exactly `min_block_ns`.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &'a OffCpuStart, u64)> + use<'a> {
        let (now_ns, min_block_ns) = (self.now_ns, self.min_block_ns);
        self.starts.iter().filter_map(move |(tid, start)| {
            let ns = now_ns.saturating_sub(start.ts_ns);
            (ns >= min_block_ns).then_some((*tid, start, ns))
        })
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
    /// Intervals still open when tracing stops count with their time so far, unless
    /// shorter than `--min-block` (one exactly as long counts, as in the kernel).
    #[test]
    fn min_block_applies_to_intervals_still_open() {
        let pid = std::process::id();
        let start = |ts_ns, tgid| OffCpuStart {
            ts_ns,
            tgid,
            user_stack_id: -14,
            kernel_stack_id: -14,
            state: 0,
        };
        // Open for 10 ms, 2 ms and 50 µs; and one of another process.
        let starts = [
            (pid, start(0, pid)),
            (pid + 1, start(8_000_000, pid)),
            (pid + 2, start(9_950_000, pid)),
            (1, start(0, 1)),
        ];
        let open = |min_block_ns| OpenIntervals {
            starts: &starts,
            now_ns: 10_000_000,
            min_block_ns,
        };
        let lasted = |min_block_ns| -> Vec<(u32, u64)> {
            open(min_block_ns)
                .iter()
                .map(|(tid, _, ns)| (tid, ns))
                .collect()
        };
        assert_eq!(lasted(0).len(), 4);
        assert_eq!(
            lasted(2_000_000),
            [(pid, 10_000_000), (pid + 1, 2_000_000), (1, 10_000_000)]
        );
        assert_eq!(lasted(10_000_001), []);
    }
}
