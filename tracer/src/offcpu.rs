//! Off-CPU profile: the kernel's per-(thread, stacks) blocked time, plus threads still
//! blocked when tracing stops, turned into symbolized folded stacks.

use std::borrow::Cow;

use foldhash::HashMap;

use tracer_common::{OffCpuKey, OffCpuStart, OffCpuTotal};

use crate::{
    render::flamegraph::{FoldedStacks, FrameId, StackFolder},
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
            if let Ok(comm) = std::fs::read_to_string(task.path().join("comm")) {
                self.names.insert(tid, comm.trim_end().to_string());
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

/// Builds the profile. `pending` are threads still off CPU at `now_ns`; their time so
/// far counts (they are blocked right now), like any finished interval.
#[allow(clippy::too_many_arguments)]
pub fn build_profile(
    totals: &[(OffCpuKey, OffCpuTotal)],
    pending: &[(u32, OffCpuStart)],
    now_ns: u64,
    stacks: &impl StackSource,
    symbolizer: &mut StackSymbolizer,
    maps: &ProcessMaps,
    process_name: &str,
    threads: Option<&ThreadNames>,
) -> OffCpuProfile {
    let mut profile = OffCpuProfile::default();
    let mut merged: HashMap<OffCpuKey, u64> = HashMap::default();
    for (key, total) in totals {
        *merged.entry(*key).or_default() += total.total_ns;
        profile.intervals += total.count;
    }
    for (tid, start) in pending {
        if start.tgid != maps.pid() {
            continue;
        }
        let key = OffCpuKey {
            tgid: start.tgid,
            tid: *tid,
            user_stack_id: start.user_stack_id,
            kernel_stack_id: start.kernel_stack_id,
        };
        *merged.entry(key).or_default() += now_ns.saturating_sub(start.ts_ns);
        profile.intervals += 1;
    }

    // Name every distinct stack once, in one batch per kind, interning its frames; then
    // fold by frame ids, so a folded stack's text is built once, not once per key.
    let mut folder = StackFolder::new();
    let root = folder.frame(process_name);
    let user = user_stack_frames(
        merged.keys().map(|k| k.user_stack_id),
        stacks,
        symbolizer,
        Some(maps),
        |name| folder.frame(name),
    );
    let kernel = kernel_stack_frames(
        merged.keys().map(|k| k.kernel_stack_id),
        stacks,
        symbolizer,
        |name| folder.frame(name),
    );
    let mut thread_frames: HashMap<u32, FrameId> = HashMap::default();
    let mut frames = Vec::new();
    for (key, ns) in merged {
        if key.user_stack_id < 0 || key.kernel_stack_id < 0 {
            profile.missing_stacks += 1;
        }
        frames.clear();
        frames.push(root);
        if let Some(threads) = threads {
            let thread = *thread_frames.entry(key.tid).or_insert_with(|| {
                let name = threads.get(key.tid).unwrap_or("?");
                folder.frame(&format!("{name} [{}]", key.tid))
            });
            frames.push(thread);
        }
        frames.extend_from_slice(&user[&key.user_stack_id]);
        frames.extend_from_slice(&kernel[&key.kernel_stack_id]);
        // Sum in nanoseconds per folded stack, convert once, so rounding loses nothing.
        folder.add(&frames, ns);
        profile.total_ns += ns;
    }
    profile.folded = folder.finish(|ns| ns.div_ceil(1000));
    profile
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

    struct Stacks(HashMap<i32, Vec<u64>>);

    impl StackSource for Stacks {
        fn stack(&self, id: i32) -> Vec<u64> {
            self.0.get(&id).cloned().unwrap_or_default()
        }
    }

    /// Code addresses of this process: its own functions, libc's, and a few kernel ones
    /// when /proc/kallsyms shows them.
    fn code_addresses() -> (Vec<u64>, Vec<u64>) {
        let user = vec![
            strips_the_tracers_own_kernel_frames as fn() as usize as u64,
            without_bpf_frames::<String> as fn(Vec<String>) -> Vec<String> as usize as u64,
            code_addresses as fn() -> (Vec<u64>, Vec<u64>) as usize as u64,
            libc::getpid as unsafe extern "C" fn() -> libc::pid_t as usize as u64,
            libc::read as unsafe extern "C" fn(i32, *mut libc::c_void, usize) -> isize as usize
                as u64,
            0x10, // unmapped
        ];
        let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        let kernel = kallsyms
            .lines()
            .filter_map(|line| u64::from_str_radix(line.split(' ').next()?, 16).ok())
            .filter(|&addr| addr != 0)
            .step_by(997)
            .take(6)
            .collect();
        (user, kernel)
    }

    /// Batch naming and folding by frame ids give exactly what naming each key's stacks
    /// one by one and folding their texts gives.
    #[test]
    fn folds_like_naming_stack_by_stack() {
        let (user, kernel) = code_addresses();
        let mut stacks = HashMap::default();
        // Shared prefixes and suffixes, the same address at different depths, duplicates.
        for id in 0..12 {
            let stack: Vec<u64> = (0..(id % 5 + 1))
                .map(|depth| user[(id * 7 + depth * 3) as usize % user.len()] + depth as u64)
                .collect();
            stacks.insert(id, stack);
        }
        for id in 0..4 {
            let stack = (0..(id + 1) as usize)
                .map(|depth| {
                    kernel
                        .get(depth + id as usize)
                        .copied()
                        .unwrap_or(0xffff_0000)
                })
                .collect();
            stacks.insert(100 + id, stack);
        }
        let stacks = Stacks(stacks);
        let pid = std::process::id();
        let mut totals = Vec::new();
        for n in 0..60u32 {
            let user_stack_id = if n % 11 == 0 { -14 } else { (n % 13) as i32 };
            let kernel_stack_id = if n % 17 == 0 {
                -2
            } else {
                100 + (n % 4) as i32
            };
            let key = OffCpuKey {
                tgid: pid,
                tid: pid + n % 3,
                user_stack_id,
                kernel_stack_id,
            };
            let total = OffCpuTotal {
                total_ns: 1_234 * u64::from(n) + 999,
                count: 1,
            };
            totals.push((key, total));
        }
        let maps = ProcessMaps::capture(pid).unwrap();
        let mut threads = ThreadNames::default();
        threads.names.insert(pid, "main; thread".to_string());
        for per_thread in [None, Some(&threads)] {
            let profile = build_profile(
                &totals,
                &[],
                0,
                &stacks,
                &mut StackSymbolizer::new(),
                &maps,
                "app",
                per_thread,
            );
            // The reference: every key named on its own, stack by stack.
            let mut symbolizer = StackSymbolizer::new();
            let mut by_stack: std::collections::HashMap<Vec<String>, u64> = Default::default();
            for (key, total) in &totals {
                let mut frames = vec!["app".to_string()];
                if let Some(threads) = per_thread {
                    let name = threads.get(key.tid).unwrap_or("?");
                    frames.push(format!("{name} [{}]", key.tid));
                }
                let user = stacks.stack(key.user_stack_id);
                if key.user_stack_id < 0 || user.is_empty() {
                    frames.push("[missing user stack]".to_string());
                } else {
                    let named = symbolizer.user_frames(&maps, &user);
                    frames.extend(named.into_iter().rev().map(|f| f.name));
                }
                let kernel = stacks.stack(key.kernel_stack_id);
                if key.kernel_stack_id < 0 || kernel.is_empty() {
                    frames.push("[missing kernel stack]".to_string());
                } else {
                    let names = symbolizer
                        .kernel_frames(&kernel)
                        .into_iter()
                        .map(|f| f.name);
                    let names = without_bpf_frames(names.collect());
                    frames.extend(names.into_iter().rev().map(|n| format!("{n}_[k]")));
                }
                *by_stack.entry(frames).or_default() += total.total_ns;
            }
            let mut expected = FoldedStacks::new();
            for (frames, ns) in by_stack {
                expected.add(&frames, ns.div_ceil(1000));
            }
            assert_eq!(profile.folded.to_string(), expected.to_string());
            assert!(profile.folded.len() > 20, "{}", profile.folded);
        }
    }
}
