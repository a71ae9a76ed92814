//! The tasks view: the threads' time while they ran runtime tasks, under the task that
//! ran. Each stack sits under its process's frame and its task's frame. Its leaf says on
//! CPU, blocked or runnable. Each task's own time is summed with it, and where it blocked
//! longest.

use std::collections::HashMap;

use tracer_common::{StackKey, offcpu_state};

use super::build::{TaskOffCpuWeights, oncpu_weight, sized};
use super::namer::Namer;
use super::{
    TASK_BLOCKED_FRAME, TASK_ON_CPU_FRAME, TASK_RUNNABLE_FRAME, TaskEntries, TaskWallTime,
};
use crate::stack::naming::{FrameTable, InternedStacks, Weight, add_interned};

/// The frames of the tasks view that stacks do not give: each task's, and the leaves.
pub(super) struct TaskFrames {
    tasks: foldhash::HashMap<(u32, u64), u32>,
    on_cpu: u32,
    blocked: u32,
    runnable: u32,
}

impl TaskFrames {
    pub(super) fn new(
        table: &mut FrameTable,
        entries: &TaskEntries,
        offcpu: &foldhash::HashMap<(u64, StackKey), Weight>,
    ) -> Self {
        let mut tasks = foldhash::HashMap::default();
        let ids = entries
            .oncpu
            .iter()
            .map(|(task, key, _)| (key.tgid, *task))
            .chain(offcpu.keys().map(|(task, key)| (key.tgid, *task)));
        for id in ids {
            tasks
                .entry(id)
                .or_insert_with(|| match entries.names.get(&id) {
                    Some(name) => table.intern(name),
                    None => table.intern(&format!("task #{}", id.1)),
                });
        }
        Self {
            tasks,
            on_cpu: table.intern(TASK_ON_CPU_FRAME),
            blocked: table.intern(TASK_BLOCKED_FRAME),
            runnable: table.intern(TASK_RUNNABLE_FRAME),
        }
    }

    /// `key`'s stack under its process and `task`, ending in `leaf`, into `frames`.
    fn frames(&self, namer: &Namer, task: u64, key: &StackKey, leaf: u32, frames: &mut Vec<u32>) {
        namer.frames(key, frames);
        frames.insert(1, self.tasks[&(key.tgid, task)]);
        frames.push(leaf);
    }
}

/// The tasks view, and each task's time by (tgid, task): on CPU, blocked (and where
/// longest), runnable.
pub(super) fn build_task_view(
    entries: &TaskEntries,
    task_offcpu: &TaskOffCpuWeights,
    namer: &Namer,
    task_frames: &TaskFrames,
    period_ns: u64,
    per_thread: bool,
) -> (InternedStacks, HashMap<(u32, u64), TaskWallTime>) {
    let mut tasks = sized(entries.oncpu.len() + task_offcpu.len());
    let mut times: HashMap<(u32, u64), TaskWallTime> = HashMap::new();
    let mut blocked_at: HashMap<(u32, u64), HashMap<Vec<u32>, u64>> = HashMap::new();
    let mut frames = Vec::new();
    for &(task, key, samples) in &entries.oncpu {
        task_frames.frames(namer, task, &key, task_frames.on_cpu, &mut frames);
        let weight = oncpu_weight(samples, period_ns);
        add_interned(&mut tasks, &frames, weight);
        let time = times.entry((key.tgid, task)).or_default();
        time.oncpu_samples += weight.events;
        time.oncpu_ns += weight.ns;
    }
    for (&(task, key), &weight) in task_offcpu {
        let runnable = key.state == offcpu_state::RUNNABLE;
        let leaf = match runnable {
            true => task_frames.runnable,
            false => task_frames.blocked,
        };
        task_frames.frames(namer, task, &key, leaf, &mut frames);
        add_interned(&mut tasks, &frames, weight);
        let time = times.entry((key.tgid, task)).or_default();
        if runnable {
            time.runnable_ns += weight.ns;
        } else {
            time.blocked_ns += weight.ns;
            time.blocked_intervals += weight.events;
            // Below the process, task (and thread) frames, without the leaf.
            let below = 2 + usize::from(per_thread);
            let place = frames[below..frames.len() - 1].to_vec();
            *blocked_at
                .entry((key.tgid, task))
                .or_default()
                .entry(place)
                .or_default() += weight.ns;
        }
    }
    for (id, places) in blocked_at {
        let longest = places
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)));
        if let (Some(time), Some((place, ns))) = (times.get_mut(&id), longest) {
            let names = namer.table.names();
            let place = place.iter().map(|&f| names[f as usize].clone()).collect();
            time.longest_block = Some((place, ns));
        }
    }
    (tasks, times)
}

#[cfg(test)]
mod tests {
    use super::*;

    use tracer_common::{KERNEL_STACK_NOT_SAMPLED, NO_STACK, OffCpuKey, OffCpuStart, OffCpuTotal};

    use super::super::GroupBy;
    use super::super::{BuildOptions, RawProfile, build_profile};
    use crate::stack::naming::StackSource;
    use crate::stack::processes::Processes;
    use crate::stack::symbolize::StackSymbolizer;
    use tracer_common::StackId;

    struct Stacks(HashMap<i32, Vec<u64>>);

    impl StackSource for Stacks {
        fn stack(&self, id: StackId) -> Vec<u64> {
            self.0.get(&id.raw()).cloned().unwrap_or_default()
        }
    }

    /// A thread's time while it ran a task goes under the task too: its samples on CPU,
    /// its blocked and runnable intervals (short ones' time spread over the kernel stacks
    /// sampled), and its interval still open at the stop; each with its leaf frame.
    #[test]
    fn splits_the_time_of_each_task() {
        let stacks = Stacks(HashMap::from([
            (1, vec![0x10]),
            (2, vec![0x20]),
            (3, vec![0x30]),
        ]));
        let key = |user, kernel, state| {
            StackKey::from(OffCpuKey {
                tgid: 7,
                tid: 8,
                user_stack_id: user,
                kernel_stack_id: kernel,
                state,
            })
        };
        let total = |total_ns, count| OffCpuTotal { total_ns, count };
        let blocked = offcpu_state::BLOCKED;
        let raw = RawProfile {
            oncpu: vec![(key(1, NO_STACK, 0), 5)],
            offcpu: vec![(key(1, 2, blocked), total(4_000_000, 1))],
            pending: vec![(
                8,
                OffCpuStart {
                    ts_ns: 0,
                    tgid: 7,
                    user_stack_id: 1,
                    kernel_stack_id: 3,
                    state: blocked,
                    task: 101,
                    ..OffCpuStart::default()
                },
            )],
            now_ns: 2_000_000,
            min_block_ns: 0,
            tasks: TaskEntries {
                oncpu: vec![(100, key(1, NO_STACK, 0), 3)],
                offcpu: vec![
                    (100, key(1, 2, blocked), total(3_000_000, 1)),
                    // Ten short intervals, one of them sampled at kernel stack 2.
                    (
                        100,
                        key(1, KERNEL_STACK_NOT_SAMPLED, blocked),
                        total(1_000_000, 10),
                    ),
                    (
                        100,
                        key(1, 2, blocked | offcpu_state::SAMPLED),
                        total(10_000_000, 1),
                    ),
                    (100, key(1, 2, offcpu_state::RUNNABLE), total(500_000, 2)),
                    (101, key(1, 2, blocked), total(1_000_000, 1)),
                ],
                names: HashMap::from([((7, 100), "task demo (#100)".to_string())]),
            },
        };
        let profile = build_profile(
            &raw,
            BuildOptions {
                frequency_hz: 100,
                per_thread: false,
                group_by: GroupBy::Process,
            },
            &stacks,
            &mut StackSymbolizer::new(),
            &Processes::default(),
        );
        let demo = &profile.task_time[&(7, 100)];
        assert_eq!(
            (demo.oncpu_samples, demo.oncpu_ns, demo.blocked_ns),
            (3, 30_000_000, 4_000_000)
        );
        assert_eq!((demo.blocked_intervals, demo.runnable_ns), (11, 500_000));
        let (place, ns) = demo.longest_block.as_ref().unwrap();
        assert_eq!((place.len(), *ns), (2, 4_000_000), "{place:?}");
        // The other task: a finished interval, and the one open at the stop.
        let other = &profile.task_time[&(7, 101)];
        assert_eq!((other.blocked_ns, other.blocked_intervals), (3_000_000, 2));
        let view =
            crate::output::render::flamegraph::FoldedStacks::from(&profile.tasks).to_string();
        let line = |task: &str, leaf: &str| {
            view.lines()
                .filter(|l| l.contains(&format!(";{task};")) && l.contains(&format!(";{leaf} ")))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
                .sum::<u64>()
        };
        assert_eq!(
            line("task demo (#100)", TASK_ON_CPU_FRAME),
            30_000,
            "{view}"
        );
        assert_eq!(
            line("task demo (#100)", TASK_BLOCKED_FRAME),
            4_000,
            "{view}"
        );
        assert_eq!(line("task demo (#100)", TASK_RUNNABLE_FRAME), 500, "{view}");
        assert_eq!(line("task #101", TASK_BLOCKED_FRAME), 3_000, "{view}");
        // The threads' own views are as without tasks.
        assert_eq!(profile.wall.total_us(), 50_000 + 4_000 + 2_000);
    }
}
