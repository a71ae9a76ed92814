//! Runtime tasks from their task-switch probes: how long each ran and waited, where it
//! parked, and — from the threads' samples and off-CPU intervals while it ran — how its
//! running time splits into on CPU, blocked in the kernel (a task blocking its thread:
//! the blocking-in-async mistake) and runnable: the all-tasks wall-time view, from outside
//! the process.

use std::collections::{HashMap, HashSet};

use tracer_common::{StackId, TaskId, TaskKey, TaskName, TaskState, TaskTotal, task_phase};

use crate::{
    profile::wallclock::{TASK_PARKED_FRAME, TaskWallTime},
    stack::naming::{
        ProcessRoot, StackProfile, StackSource, Weight, process_frame, user_stack_frames,
    },
    stack::processes::Processes,
    stack::symbolize::StackSymbolizer,
};

/// One task's totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TaskSummary {
    pub task: u64,
    /// The process it belongs to.
    pub tgid: u32,
    /// What it is called in reports and as its frame in `tasks.svg` (see [`task_names`]).
    pub name: String,
    /// What the runtime called it, if it did: a name, or where it was spawned.
    pub given_name: Option<String>,
    /// From its run probes to its pause probes.
    pub running_ns: u64,
    pub parked_ns: u64,
    /// Finished running intervals.
    pub runs: u64,
    /// Finished parked intervals.
    pub parks: u64,
    /// Its longest run (for tokio, its longest poll) and longest park.
    pub longest_run_ns: u64,
    pub longest_park_ns: u64,
    /// Its threads' time while it ran: on CPU (sampled), blocked, runnable.
    pub wall: TaskWallTime,
}

impl TaskSummary {
    /// Running time not spent blocked or runnable: on a CPU.
    pub(crate) fn oncpu_ns(&self) -> u64 {
        self.running_ns
            .saturating_sub(self.wall.blocked_ns)
            .saturating_sub(self.wall.runnable_ns)
    }
}

/// Every task's totals, longest-waiting first, and the tasks view.
#[derive(Debug, Default)]
pub(crate) struct TaskProfile {
    pub tasks: Vec<TaskSummary>,
    /// Process; task; stack; and a leaf frame for the kind of time: on CPU, blocked or
    /// runnable while running (from the wall-clock profile), parked (by the stack where
    /// it parked).
    pub view: StackProfile,
}

/// Adds the intervals still open at `now` (tasks parked or running right now) to
/// `times`, so a task blocked when tracing stops shows its wait so far.
pub(crate) fn with_open_intervals(
    mut times: Vec<(TaskKey, TaskTotal)>,
    open: &[(TaskId, TaskState)],
    now: u64,
) -> Vec<(TaskKey, TaskTotal)> {
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
            tid: state.tid,
        };
        let ns = now.saturating_sub(start);
        times.push((
            key,
            TaskTotal {
                total_ns: ns,
                count: 1,
                max_ns: ns,
            },
        ));
    }
    times
}

/// What a runtime called a task: its text, with `:line:column` when it gave a line.
pub(crate) fn given_name(name: &TaskName) -> Option<String> {
    let end = name
        .text
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(name.text.len());
    let text = String::from_utf8_lossy(&name.text[..end]);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    Some(match (name.line, name.column) {
        (0, _) => text.to_string(),
        (line, 0) => format!("{text}:{line}"),
        (line, column) => format!("{text}:{line}:{column}"),
    })
}

/// The frame that stands for each task, by (tgid, task): `task NAME (#id)` with the name
/// the runtime gave, else `task #id on THREAD [tid]` after the thread it ran on longest
/// (a runtime's ids are often addresses: never that number alone), or `thread THREAD
/// [tid]` where the tasks are the threads.
pub(crate) fn task_names(
    named: &[(TaskId, TaskName)],
    times: &[(TaskKey, TaskTotal)],
    processes: &Processes,
) -> TaskNames {
    let mut threads: HashMap<(u32, u64), HashMap<u32, u64>> = HashMap::new();
    for (key, total) in times {
        // Running time decides; a thread it only parked on is one to fall back on.
        let ran = match key.phase {
            task_phase::RUNNING => total.total_ns + 1,
            _ => 0,
        };
        *threads
            .entry((key.tgid, key.task))
            .or_default()
            .entry(key.tid)
            .or_default() += ran;
    }
    let given: HashMap<(u32, u64), String> = named
        .iter()
        .filter_map(|(id, name)| Some(((id.tgid, id.task), given_name(name)?)))
        .collect();
    let ids: HashSet<(u32, u64)> = threads.keys().chain(given.keys()).copied().collect();
    let frames = ids
        .into_iter()
        .map(|id| {
            let name = if let Some(name) = given.get(&id) {
                format!("task {name} (#{})", id.1)
            } else {
                let tid = threads.get(&id).and_then(|by_thread| {
                    by_thread
                        .iter()
                        .max_by_key(|&(tid, ns)| (*ns, std::cmp::Reverse(*tid)))
                        .map(|(&tid, _)| tid)
                });
                match tid.filter(|&tid| tid != 0) {
                    // The runtime's tasks are its threads (the JVM's parks).
                    Some(tid) if u64::from(tid) == id.1 => match processes.thread_name(tid) {
                        Some(thread) => format!("thread {thread} [{tid}]"),
                        None => format!("thread {tid}"),
                    },
                    Some(tid) => match processes.thread_name(tid) {
                        Some(thread) => format!("task #{} on {thread} [{tid}]", id.1),
                        None => format!("task #{} on thread {tid}", id.1),
                    },
                    None => format!("task #{}", id.1),
                }
            };
            (id, name)
        })
        .collect();
    TaskNames { frames, given }
}

/// What tasks are called, by (tgid, task).
#[derive(Debug, Default, Clone)]
pub(crate) struct TaskNames {
    /// The frame of each (see [`task_names`]).
    pub frames: HashMap<(u32, u64), String>,
    /// What the runtime called it, where it did (see [`given_name`]).
    pub given: HashMap<(u32, u64), String>,
}

/// Builds the task profile: totals from the task probes' `times`, the running time's
/// split from `wall` (the wall-clock profile's part under tasks: its view and times),
/// and the parked stacks of each process named with its mappings in `processes`, under
/// its root frame (see [`ProcessRoot`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn build_profile(
    times: &[(TaskKey, TaskTotal)],
    names: &TaskNames,
    wall_view: &StackProfile,
    wall_times: &HashMap<(u32, u64), TaskWallTime>,
    root: ProcessRoot,
    stacks: &impl StackSource,
    symbolizer: &mut StackSymbolizer,
    processes: &Processes,
) -> TaskProfile {
    let mut summaries: HashMap<(u32, u64), TaskSummary> = HashMap::new();
    let mut parked_ids: HashMap<u32, Vec<StackId>> = HashMap::new();
    for (key, _) in times
        .iter()
        .filter(|(key, _)| key.phase != task_phase::RUNNING)
    {
        parked_ids
            .entry(key.tgid)
            .or_default()
            .push(StackId::decode(key.stack_id));
    }
    let mut stack_names: HashMap<(u32, StackId), Vec<String>> = HashMap::new();
    for (tgid, ids) in parked_ids {
        let maps = processes.get(tgid).and_then(|p| p.maps.as_ref());
        let named = user_stack_frames(ids, stacks, symbolizer, maps, str::to_string);
        stack_names.extend(named.into_iter().map(|(id, frames)| ((tgid, id), frames)));
    }
    let name_of = |id: (u32, u64)| {
        names
            .frames
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("task #{}", id.1))
    };
    let mut view = wall_view.clone();
    let new_summary = |tgid: u32, task: u64| TaskSummary {
        task,
        tgid,
        name: name_of((tgid, task)),
        given_name: names.given.get(&(tgid, task)).cloned(),
        wall: wall_times.get(&(tgid, task)).cloned().unwrap_or_default(),
        ..Default::default()
    };
    for (key, total) in times {
        let summary = summaries
            .entry((key.tgid, key.task))
            .or_insert_with(|| new_summary(key.tgid, key.task));
        if key.phase == task_phase::RUNNING {
            summary.running_ns += total.total_ns;
            summary.runs += total.count;
            summary.longest_run_ns = summary.longest_run_ns.max(total.max_ns);
            continue;
        }
        summary.parked_ns += total.total_ns;
        summary.parks += total.count;
        summary.longest_park_ns = summary.longest_park_ns.max(total.max_ns);
        let mut frames = vec![
            process_frame(processes, key.tgid, root),
            summary.name.clone(),
        ];
        frames.extend(
            stack_names[&(key.tgid, StackId::decode(key.stack_id))]
                .iter()
                .cloned(),
        );
        frames.push(TASK_PARKED_FRAME.to_string());
        view.add(
            frames,
            Weight {
                events: total.count,
                ns: total.total_ns,
            },
        );
    }
    // A task seen only while its thread blocked (its probes gone before the stop).
    for &(tgid, task) in wall_times.keys() {
        summaries
            .entry((tgid, task))
            .or_insert_with(|| new_summary(tgid, task));
    }
    let mut profile = TaskProfile {
        tasks: summaries.into_values().collect(),
        view,
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
        fn stack(&self, _: StackId) -> Vec<u64> {
            Vec::new()
        }
    }

    fn key(task: u64, phase: u32, stack_id: i32, tid: u32) -> TaskKey {
        TaskKey {
            task,
            tgid: std::process::id(),
            phase,
            stack_id,
            tid,
        }
    }

    fn total(ns: u64, count: u64) -> TaskTotal {
        TaskTotal {
            total_ns: ns,
            count,
            max_ns: ns / count,
        }
    }

    #[test]
    fn sums_running_and_parked_time_per_task() {
        let me = std::process::id();
        let times = [
            (key(2, task_phase::RUNNING, -1, 0), total(1_000, 3)),
            (key(2, task_phase::PARKED, 5, 0), total(9_000, 2)),
            (key(2, task_phase::PARKED, 6, 0), total(1_000, 1)),
            (key(3, task_phase::PARKED, 5, 0), total(50_000, 1)),
        ];
        let mut processes = Processes::default();
        processes.observe_target(me).unwrap();
        let names = TaskNames {
            frames: HashMap::from([((me, 2), "task two (#2)".to_string())]),
            ..TaskNames::default()
        };
        let wall_times = HashMap::from([(
            (me, 2),
            TaskWallTime {
                blocked_ns: 300,
                runnable_ns: 200,
                ..TaskWallTime::default()
            },
        )]);
        let profile = build_profile(
            &times,
            &names,
            &StackProfile::default(),
            &wall_times,
            ProcessRoot::Name,
            &NoStacks,
            &mut StackSymbolizer::new(),
            &processes,
        );
        let summary = |i: usize| &profile.tasks[i];
        assert_eq!(
            (summary(0).task, summary(0).parked_ns, summary(0).parks),
            (3, 50_000, 1)
        );
        assert_eq!(summary(0).name, "task #3");
        let two = summary(1);
        assert_eq!((two.task, two.name.as_str()), (2, "task two (#2)"));
        assert_eq!(
            (two.running_ns, two.runs, two.parked_ns, two.parks),
            (1_000, 3, 10_000, 3)
        );
        // Of its running time, 300 ns blocked and 200 ns runnable: 500 ns on CPU.
        assert_eq!(two.oncpu_ns(), 500);
        assert_eq!(profile.view.total_us(), 60);
        assert_eq!(profile.view.total_events(), 4);
        let folded =
            crate::output::render::flamegraph::FoldedStacks::from(&profile.view).to_string();
        assert!(
            folded
                .lines()
                .all(|l| l.contains(";task ") && l.contains(&format!(";{TASK_PARKED_FRAME} "))),
            "{folded}"
        );
    }

    /// A task is called what the runtime called it (a spawn location with its line and
    /// column), else after the thread it ran on longest; a thread that is the task is
    /// called a thread; never by its number alone when a thread is known.
    #[test]
    fn tasks_are_named_by_the_runtime_or_by_their_thread() {
        let me = std::process::id();
        let main_tid = me;
        let mut text = [0u8; tracer_common::TASK_NAME_BYTES];
        text[..11].copy_from_slice(b"src/api.rs\0");
        let location = TaskName {
            text,
            line: 41,
            column: 5,
        };
        assert_eq!(given_name(&location).as_deref(), Some("src/api.rs:41:5"));
        assert_eq!(given_name(&TaskName::default()), None);
        let named = [(
            TaskId {
                task: 12,
                tgid: me,
                _pad: 0,
            },
            location,
        )];
        let times = [
            (key(12, task_phase::RUNNING, -1, main_tid), total(5, 1)),
            // Task 13 ran on two threads, longest on this one.
            (key(13, task_phase::RUNNING, -1, main_tid), total(900, 1)),
            (key(13, task_phase::RUNNING, -1, 1), total(100, 1)),
            (key(13, task_phase::PARKED, 4, 1), total(10_000, 1)),
            // The JVM's: the task is the thread.
            (
                key(u64::from(main_tid), task_phase::PARKED, 4, main_tid),
                total(1, 1),
            ),
            (key(14, task_phase::RUNNING, -1, 0), total(1, 1)),
        ];
        let mut processes = Processes::default();
        processes.observe_target(me).unwrap();
        let thread = processes.thread_name(main_tid).unwrap().to_string();
        let names = task_names(&named, &times, &processes);
        assert_eq!(names.given[&(me, 12)], "src/api.rs:41:5");
        let names = names.frames;
        assert_eq!(names[&(me, 12)], "task src/api.rs:41:5 (#12)");
        assert_eq!(
            names[&(me, 13)],
            format!("task #13 on {thread} [{main_tid}]")
        );
        assert_eq!(
            names[&(me, u64::from(main_tid))],
            format!("thread {thread} [{main_tid}]")
        );
        assert_eq!(names[&(me, 14)], "task #14");
    }
}
