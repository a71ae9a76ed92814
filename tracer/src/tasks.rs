//! Runtime tasks from their task-switch probes: how long each ran and waited, and where
//! it parked — the all-tasks wall-time view, from outside the process.

use std::collections::HashMap;

use tracer_common::{OffCpuTotal, TaskId, TaskKey, TaskState, task_phase};

use crate::{
    processes::Processes,
    stacks::{StackProfile, StackSource, Weight, process_frame, user_stack_frames},
    symbolize::StackSymbolizer,
};

/// One task's totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskSummary {
    pub task: u64,
    /// The process it belongs to.
    pub tgid: u32,
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
    /// Parked time (and parks): process;task #N (decimal);stack where it parked.
    pub parked: StackProfile,
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

/// Builds the task profile; the parked stacks of each process are named with its mappings
/// in `processes`, under a `name` frame (`name [pid]` when there are several processes).
pub fn build_profile(
    times: &[(TaskKey, OffCpuTotal)],
    stacks: &impl StackSource,
    symbolizer: &mut StackSymbolizer,
    processes: &Processes,
) -> TaskProfile {
    let mut summaries: HashMap<(u32, u64), TaskSummary> = HashMap::new();
    let mut parked_ids: HashMap<u32, Vec<i32>> = HashMap::new();
    for (key, _) in times
        .iter()
        .filter(|(key, _)| key.phase != task_phase::RUNNING)
    {
        parked_ids.entry(key.tgid).or_default().push(key.stack_id);
    }
    let several = times
        .iter()
        .map(|(key, _)| key.tgid)
        .collect::<std::collections::HashSet<_>>()
        .len()
        > 1;
    let mut names: HashMap<(u32, i32), Vec<String>> = HashMap::new();
    for (tgid, ids) in parked_ids {
        let maps = processes.get(tgid).and_then(|p| p.maps.as_ref());
        let named = user_stack_frames(ids, stacks, symbolizer, maps, str::to_string);
        names.extend(named.into_iter().map(|(id, frames)| ((tgid, id), frames)));
    }
    let mut parked = StackProfile::default();
    for (key, total) in times {
        let summary = summaries
            .entry((key.tgid, key.task))
            .or_insert_with(|| TaskSummary {
                task: key.task,
                tgid: key.tgid,
                ..Default::default()
            });
        if key.phase == task_phase::RUNNING {
            summary.running_ns += total.total_ns;
            summary.runs += total.count;
            continue;
        }
        summary.parked_ns += total.total_ns;
        summary.parks += total.count;
        let mut frames = vec![
            process_frame(processes, key.tgid, several),
            format!("task #{}", key.task),
        ];
        frames.extend(names[&(key.tgid, key.stack_id)].iter().cloned());
        parked.add(
            frames,
            Weight {
                events: total.count,
                ns: total.total_ns,
            },
        );
    }
    let mut profile = TaskProfile {
        tasks: summaries.into_values().collect(),
        parked,
    };
    profile
        .tasks
        .sort_by(|a, b| b.parked_ns.cmp(&a.parked_ns).then(a.task.cmp(&b.task)));
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
        let me = std::process::id();
        let key = |task, phase, stack_id| TaskKey {
            task,
            tgid: me,
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
        let mut processes = Processes::default();
        processes.observe_target(me).unwrap();
        let profile = build_profile(&times, &NoStacks, &mut StackSymbolizer::new(), &processes);
        assert_eq!(
            profile.tasks[0],
            TaskSummary {
                task: 3,
                tgid: me,
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
                tgid: me,
                running_ns: 1_000,
                parked_ns: 10_000,
                runs: 3,
                parks: 3
            }
        );
        assert_eq!(profile.parked.total_us(), 60);
        assert_eq!(profile.parked.total_events(), 4);
    }
}
