//! Runtime tasks from their task-switch probes: how long each ran and waited, and where
//! it parked — the all-tasks wall-time view, from outside the process.

use std::collections::HashMap;

use tracer_common::{OffCpuTotal, TaskId, TaskKey, TaskState, task_phase};

use crate::{
    offcpu::{StackSource, user_stack_frames},
    render::flamegraph::FoldedStacks,
    symbolize::{ProcessMaps, StackSymbolizer},
};

/// One task's totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskSummary {
    pub task: u64,
    pub running_ns: u64,
    pub parked_ns: u64,
    /// Finished running intervals.
    pub runs: u64,
    /// Finished parked intervals.
    pub parks: u64,
}

/// Every task's totals, longest-waiting first, and parked time by park stack.
#[derive(Debug, Default)]
pub struct TaskProfile {
    pub tasks: Vec<TaskSummary>,
    /// Parked time in microseconds: process;task #N (decimal);stack where it parked.
    pub parked: FoldedStacks,
}

/// Adds the intervals still open at `now` (tasks parked or running right now) to
/// `times`, so a task blocked when tracing stops shows its wait so far.
pub fn with_open_intervals(
    mut times: Vec<(TaskKey, OffCpuTotal)>,
    open: &[(TaskId, TaskState)],
    now: u64,
) -> Vec<(TaskKey, OffCpuTotal)> {
    for (id, state) in open {
        let (phase, stack_id, start) = if state.park_start_ns != 0 {
            (task_phase::PARKED, state.park_stack_id, state.park_start_ns)
        } else {
            (task_phase::RUNNING, -1, state.run_start_ns)
        };
        let key = TaskKey {
            task: id.task,
            tgid: id.tgid,
            phase,
            stack_id,
            _pad: 0,
        };
        times.push((
            key,
            OffCpuTotal {
                total_ns: now.saturating_sub(start),
                count: 1,
            },
        ));
    }
    times
}

pub fn build_profile(
    times: &[(TaskKey, OffCpuTotal)],
    stacks: &impl StackSource,
    symbolizer: &mut StackSymbolizer,
    maps: &ProcessMaps,
    process_name: &str,
) -> TaskProfile {
    let mut summaries: HashMap<u64, TaskSummary> = HashMap::new();
    let parked_stacks = times
        .iter()
        .filter(|(key, _)| key.phase != task_phase::RUNNING)
        .map(|(key, _)| key.stack_id);
    let names = user_stack_frames(
        parked_stacks,
        stacks,
        symbolizer,
        Some(maps),
        str::to_string,
    );
    let mut parked_ns: HashMap<Vec<String>, u64> = HashMap::new();
    for (key, total) in times {
        let summary = summaries.entry(key.task).or_insert_with(|| TaskSummary {
            task: key.task,
            ..Default::default()
        });
        if key.phase == task_phase::RUNNING {
            summary.running_ns += total.total_ns;
            summary.runs += total.count;
            continue;
        }
        summary.parked_ns += total.total_ns;
        summary.parks += total.count;
        let mut frames = vec![process_name.to_string(), format!("task #{}", key.task)];
        frames.extend(names[&key.stack_id].iter().cloned());
        *parked_ns.entry(frames).or_default() += total.total_ns;
    }
    let mut profile = TaskProfile {
        tasks: summaries.into_values().collect(),
        ..Default::default()
    };
    profile
        .tasks
        .sort_by(|a, b| b.parked_ns.cmp(&a.parked_ns).then(a.task.cmp(&b.task)));
    for (frames, ns) in parked_ns {
        profile.parked.add(&frames, ns.div_ceil(1000));
    }
    profile
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoStacks;
    impl StackSource for NoStacks {
        fn stack(&self, _: i32) -> Vec<u64> {
            Vec::new()
        }
    }

    #[test]
    fn sums_running_and_parked_time_per_task() {
        let key = |task, phase, stack_id| TaskKey {
            task,
            tgid: 1,
            phase,
            stack_id,
            _pad: 0,
        };
        let total = |ns, count| OffCpuTotal {
            total_ns: ns,
            count,
        };
        let times = [
            (key(2, task_phase::RUNNING, -1), total(1_000, 3)),
            (key(2, task_phase::PARKED, 5), total(9_000, 2)),
            (key(2, task_phase::PARKED, 6), total(1_000, 1)),
            (key(3, task_phase::PARKED, 5), total(50_000, 1)),
        ];
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let profile = build_profile(&times, &NoStacks, &mut StackSymbolizer::new(), &maps, "app");
        assert_eq!(
            profile.tasks[0],
            TaskSummary {
                task: 3,
                running_ns: 0,
                parked_ns: 50_000,
                runs: 0,
                parks: 1
            }
        );
        assert_eq!(
            profile.tasks[1],
            TaskSummary {
                task: 2,
                running_ns: 1_000,
                parked_ns: 10_000,
                runs: 3,
                parks: 3
            }
        );
        assert_eq!(profile.parked.total(), 60);
    }
}
