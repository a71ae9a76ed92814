//! Off-CPU profile: the kernel's per-(thread, stacks) blocked time, plus threads still
//! blocked when tracing stops, turned into symbolized folded stacks.

use std::collections::HashMap;

use tracer_common::{OffCpuKey, OffCpuStart, OffCpuTotal};

use crate::{
    render::flamegraph::FoldedStacks,
    symbolize::{ProcessMaps, StackSymbolizer},
};

/// Marks kernel frames the way inferno's palettes and flamegraph.pl recognise them.
const KERNEL_SUFFIX: &str = "_[k]";

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
    let mut merged: HashMap<OffCpuKey, u64> = HashMap::new();
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

    let mut user_cache: HashMap<i32, Vec<String>> = HashMap::new();
    let mut kernel_cache: HashMap<i32, Vec<String>> = HashMap::new();
    // Sum in nanoseconds per folded stack, convert once, so rounding loses nothing.
    let mut by_stack: HashMap<Vec<String>, u64> = HashMap::new();
    for (key, ns) in merged {
        if key.user_stack_id < 0 || key.kernel_stack_id < 0 {
            profile.missing_stacks += 1;
        }
        let mut frames = vec![process_name.to_string()];
        if let Some(threads) = threads {
            let name = threads.get(key.tid).unwrap_or("?");
            frames.push(format!("{name} [{}]", key.tid));
        }
        let user = user_cache.entry(key.user_stack_id).or_insert_with(|| {
            named_frames(key.user_stack_id, stacks, "[missing user stack]", |addrs| {
                symbolizer
                    .user_frames(maps, addrs)
                    .into_iter()
                    .map(|f| f.name)
                    .collect()
            })
        });
        frames.extend(user.iter().cloned());
        let kernel = kernel_cache
            .entry(key.kernel_stack_id)
            .or_insert_with(|| kernel_frame_names(key.kernel_stack_id, stacks, symbolizer));
        frames.extend(kernel.iter().cloned());
        *by_stack.entry(frames).or_default() += ns;
        profile.total_ns += ns;
    }
    for (frames, ns) in by_stack {
        profile.folded.add(&frames, ns.div_ceil(1000));
    }
    profile
}

/// Frames of kernel stack `id`, root first, marked as kernel frames, without the
/// tracer's own BPF frames.
pub(crate) fn kernel_frame_names(
    id: i32,
    stacks: &impl StackSource,
    symbolizer: &mut StackSymbolizer,
) -> Vec<String> {
    named_frames(id, stacks, "[missing kernel stack]", |addrs| {
        let names = symbolizer
            .kernel_frames(addrs)
            .into_iter()
            .map(|f| f.name)
            .collect();
        without_bpf_frames(names)
            .into_iter()
            .map(|name| format!("{name}{KERNEL_SUFFIX}"))
            .collect()
    })
}

/// Drops the innermost kernel frames that belong to the tracer itself: the BPF program
/// and the tracepoint's `bpf_trace_run*` trampoline that called it. `names` is innermost
/// first; only the first few frames are looked at, so a real frame is never dropped.
fn without_bpf_frames(mut names: Vec<String>) -> Vec<String> {
    const LOOKAHEAD: usize = 4;
    if let Some(pos) = names
        .iter()
        .take(LOOKAHEAD)
        .position(|n| n.starts_with("bpf_trace_run"))
    {
        names.drain(..=pos);
    }
    names
}

/// Frames of stack `id`, root first; `missing` when the kernel could not record it.
pub(crate) fn named_frames(
    id: i32,
    stacks: &impl StackSource,
    missing: &str,
    symbolize: impl FnOnce(&[u64]) -> Vec<String>,
) -> Vec<String> {
    let addrs = stacks.stack(id);
    if id < 0 || addrs.is_empty() {
        return vec![missing.to_string()];
    }
    let mut names = symbolize(&addrs);
    names.reverse();
    names
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
}
