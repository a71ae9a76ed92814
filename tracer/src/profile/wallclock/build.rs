//! Building a [`WallClockProfile`] from a [`RawProfile`]: its views, its counts and each
//! thread's time. The off-CPU totals take in the intervals still open at the stop. Every
//! stack is named once before any view is built. The wall view and the tasks view are
//! built on threads of their own while the caller's thread builds the on-CPU and off-CPU
//! views. The tasks view itself is built in `task_view`.

use std::collections::HashSet;

use tracer_common::{EXEC_NS_UNKNOWN, StackId, StackKey, offcpu_state};

use super::namer::{Namer, is_missing, switch_in_missed};
use super::python::add_python_time;
use super::spread::{spread_task_unsampled, spread_unsampled};
use super::task_view::{TaskFrames, build_task_view};
use super::{BuildOptions, OpenIntervals, RawProfile, ThreadTime, WallClockProfile};
use crate::{
    stack::naming::{InternedStacks, StackProfile, StackSource, Weight, add_interned},
    stack::processes::Processes,
    stack::symbolize::StackSymbolizer,
};

/// Off-CPU time by key.
type OffCpuWeights = foldhash::HashMap<StackKey, Weight>;

/// Off-CPU time by task and key.
pub(super) type TaskOffCpuWeights = foldhash::HashMap<(u64, StackKey), Weight>;

/// Each thread's time, by (tgid, tid).
type PerThread = foldhash::HashMap<(u32, u32), ThreadTime>;

/// Builds the three views, naming stacks with each process's mappings in `processes`.
pub fn build_profile(
    raw: &RawProfile,
    options: BuildOptions,
    stacks: &impl StackSource,
    symbolizer: &mut StackSymbolizer,
    processes: &Processes,
) -> WallClockProfile {
    let mut profile = WallClockProfile::default();
    let period_ns = 1_000_000_000 / options.frequency_hz.max(1);

    let (offcpu, task_offcpu) = offcpu_totals(raw);
    let mut namer = name_stacks(
        raw,
        &offcpu,
        &task_offcpu,
        stacks,
        symbolizer,
        processes,
        options,
    );
    let task_frames = TaskFrames::new(&mut namer.table, &raw.tasks, &task_offcpu);
    // The wall view is built on a thread of its own meanwhile: each key's stack takes a
    // map insert in two views, and the loop over hundreds of thousands of keys is time a
    // stopping tracer makes its user wait.
    let (wall, thread_views, tasks) = std::thread::scope(|scope| {
        let tasks = scope.spawn(|| {
            build_task_view(
                &raw.tasks,
                &task_offcpu,
                &namer,
                &task_frames,
                period_ns,
                options.per_thread,
            )
        });
        let wall = scope.spawn(|| build_wall_view(&raw.oncpu, &offcpu, &namer, period_ns));
        let thread_views = build_thread_views(
            &raw.oncpu,
            &offcpu,
            &namer,
            processes,
            period_ns,
            &mut profile,
        );
        (join(wall), thread_views, join(tasks))
    });
    let table = namer.table;
    let (tasks, task_time) = tasks;
    profile.tasks = StackProfile::from_interned(table.clone(), tasks);
    profile.task_time = task_time;
    profile.wall = StackProfile::from_interned(table.clone(), wall);
    profile.oncpu = StackProfile::from_interned(table.clone(), thread_views.oncpu);
    profile.offcpu = StackProfile::from_interned(table, thread_views.blocked);
    (profile.threads, profile.processes) = count_threads_and_processes(raw);
    profile.per_thread = busiest_first(thread_views.per_thread);
    profile
}

/// The off-CPU time of the threads, and of the tasks they ran: the kernel's totals, with
/// the time of short intervals spread over the kernel stacks sampled (see
/// [`spread_unsampled`]), and the intervals still open when tracing stopped.
fn offcpu_totals(raw: &RawProfile) -> (OffCpuWeights, TaskOffCpuWeights) {
    let mut offcpu = spread_unsampled(&raw.offcpu);
    let mut task_offcpu = spread_task_unsampled(&raw.tasks.offcpu);
    let sampled: HashSet<u32> = raw.oncpu.iter().map(|(k, _)| k.tid).collect();
    let open = OpenIntervals {
        starts: &raw.pending,
        now_ns: raw.now_ns,
        min_block_ns: raw.min_block_ns,
    };
    for (tid, start, ns) in open.iter() {
        // Marked at the start but sampled on CPU: it was running, not blocked, and never
        // switched out since. (A start the kernel recorded has the thread's CPU time, and
        // may carry ids user space gave when tracing stopped: kept.)
        let key = start.stack_key(tid);
        let marked_at_start = start.exec_ns == EXEC_NS_UNKNOWN
            || key.user == StackId::BeforeStart
            || key.kernel == StackId::BeforeStart;
        if marked_at_start && sampled.contains(&tid) {
            continue;
        }
        offcpu.entry(key).or_default().add(Weight { events: 1, ns });
        if start.task != 0 {
            task_offcpu
                .entry((start.task, key))
                .or_default()
                .add(Weight { events: 1, ns });
        }
    }
    (offcpu, task_offcpu)
}

/// Names the stacks of every key, the threads' and the tasks', on CPU and off.
fn name_stacks(
    raw: &RawProfile,
    offcpu: &OffCpuWeights,
    task_offcpu: &TaskOffCpuWeights,
    stacks: &impl StackSource,
    symbolizer: &mut StackSymbolizer,
    processes: &Processes,
    options: BuildOptions,
) -> Namer {
    let keys: Vec<StackKey> = raw
        .oncpu
        .iter()
        .map(|(k, _)| *k)
        .chain(offcpu.keys().copied())
        .chain(raw.tasks.oncpu.iter().map(|(_, k, _)| *k))
        .chain(task_offcpu.keys().map(|(_, k)| *k))
        .collect();
    Namer::new(
        &keys,
        stacks,
        symbolizer,
        processes,
        options.per_thread,
        options.group_by,
    )
}

/// The weight of `samples` on-CPU samples: each stands for one sampling period.
pub(super) fn oncpu_weight(samples: u64, period_ns: u64) -> Weight {
    Weight {
        events: samples,
        ns: samples * period_ns,
    }
}

/// An empty view with room for `len` stacks.
pub(super) fn sized(len: usize) -> InternedStacks {
    InternedStacks::with_capacity_and_hasher(len, Default::default())
}

/// What a scoped thread returned; its panic goes on in the caller.
fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// The wall view: the on-CPU samples, and the off-CPU time under a leaf saying blocked or
/// runnable.
fn build_wall_view(
    oncpu: &[(StackKey, u64)],
    offcpu: &OffCpuWeights,
    namer: &Namer,
    period_ns: u64,
) -> InternedStacks {
    let mut wall = sized(oncpu.len() + offcpu.len());
    let mut frames = Vec::new();
    for &(key, samples) in oncpu {
        namer.frames(&key, &mut frames);
        add_interned(&mut wall, &frames, oncpu_weight(samples, period_ns));
    }
    for (key, &weight) in offcpu {
        namer.frames(key, &mut frames);
        frames.push(match key.state {
            offcpu_state::RUNNABLE => namer.runnable,
            _ => namer.off_cpu,
        });
        add_interned(&mut wall, &frames, weight);
    }
    wall
}

/// The views of the threads' time apart, and each thread's time.
struct ThreadViews {
    oncpu: InternedStacks,
    /// Blocked time only.
    blocked: InternedStacks,
    per_thread: PerThread,
}

/// The on-CPU and off-CPU views and each thread's time; the totals and the missing,
/// unnamed and truncated counts go into `profile`.
fn build_thread_views(
    oncpu_samples: &[(StackKey, u64)],
    offcpu: &OffCpuWeights,
    namer: &Namer,
    processes: &Processes,
    period_ns: u64,
    profile: &mut WallClockProfile,
) -> ThreadViews {
    let mut per_thread: PerThread = Default::default();
    let (mut oncpu, mut blocked) = (sized(oncpu_samples.len()), sized(offcpu.len()));
    let mut frames = Vec::new();
    for &(key, samples) in oncpu_samples {
        let weight = oncpu_weight(samples, period_ns);
        profile.missing_stacks += u64::from(is_missing(&key));
        namer.frames(&key, &mut frames);
        profile.unnamed_ns += weight.ns * u64::from(namer.has_unnamed(&frames));
        profile.truncated_ns += weight.ns * u64::from(namer.is_truncated(&frames));
        profile.oncpu_samples += weight.events;
        profile.oncpu_ns += weight.ns;
        let time = thread_time(&mut per_thread, processes, &key);
        time.oncpu_ns += weight.ns;
        add_python_time(time, namer.python_state(&frames, None), weight.ns);
        add_interned(&mut oncpu, &frames, weight);
    }
    for (key, &weight) in offcpu {
        profile.missing_stacks += u64::from(is_missing(key));
        profile.switch_ins_missed += weight.events * u64::from(switch_in_missed(key));
        namer.frames(key, &mut frames);
        profile.unnamed_ns += weight.ns * u64::from(namer.has_unnamed(&frames));
        profile.truncated_ns += weight.ns * u64::from(namer.is_truncated(&frames));
        let python_state = namer.python_state(&frames, Some(key.state));
        add_python_time(
            thread_time(&mut per_thread, processes, key),
            python_state,
            weight.ns,
        );
        if key.state == offcpu_state::RUNNABLE {
            profile.runnable_intervals += weight.events;
            profile.runnable_ns += weight.ns;
            thread_time(&mut per_thread, processes, key).runnable_ns += weight.ns;
        } else {
            profile.offcpu_intervals += weight.events;
            profile.offcpu_ns += weight.ns;
            thread_time(&mut per_thread, processes, key).blocked_ns += weight.ns;
            add_interned(&mut blocked, &frames, weight);
        }
    }
    ThreadViews {
        oncpu,
        blocked,
        per_thread,
    }
}

/// The time of `key`'s thread, added (with its name as last seen) when new.
fn thread_time<'t>(
    per_thread: &'t mut PerThread,
    processes: &Processes,
    key: &StackKey,
) -> &'t mut ThreadTime {
    per_thread
        .entry((key.tgid, key.tid))
        .or_insert_with(|| ThreadTime {
            tgid: key.tgid,
            tid: key.tid,
            name: processes.thread_name(key.tid).map(str::to_string),
            ..ThreadTime::default()
        })
}

/// How many threads and how many processes were seen on or off CPU.
fn count_threads_and_processes(raw: &RawProfile) -> (usize, usize) {
    let ids = || {
        raw.oncpu
            .iter()
            .map(|(k, _)| (k.tgid, k.tid))
            .chain(raw.offcpu.iter().map(|(k, _)| (k.tgid, k.tid)))
            .chain(raw.pending.iter().map(|(tid, s)| (s.tgid, *tid)))
    };
    let threads = ids().map(|(_, tid)| tid).collect::<HashSet<_>>().len();
    let processes = ids().map(|(tgid, _)| tgid).collect::<HashSet<_>>().len();
    (threads, processes)
}

/// Each thread's time, busiest (on CPU or runnable) first.
fn busiest_first(per_thread: PerThread) -> Vec<ThreadTime> {
    let mut threads: Vec<ThreadTime> = per_thread.into_values().collect();
    threads
        // Busiest first: every thread of a process has about the same wall time, and the
        // idle ones (a server's auxiliary threads) would otherwise top the table.
        .sort_by_key(|t| {
            (
                std::cmp::Reverse(t.oncpu_ns + t.runnable_ns),
                std::cmp::Reverse(t.wall_ns()),
                t.tid,
            )
        });
    threads
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::HashMap;

    use tracer_common::{NO_STACK, OffCpuKey, OffCpuStart, OffCpuTotal, STACK_BEFORE_START};

    use crate::profile::wallclock::GroupBy;

    use super::super::{
        BEFORE_START_FRAME, OFF_CPU_FRAME, RUNNABLE_FRAME, TaskEntries, thread_table,
    };

    struct Stacks(HashMap<i32, Vec<u64>>);

    impl StackSource for Stacks {
        fn stack(&self, id: StackId) -> Vec<u64> {
            self.0.get(&id.raw()).cloned().unwrap_or_default()
        }
    }

    fn before_start(ts_ns: u64) -> OffCpuStart {
        OffCpuStart {
            ts_ns,
            tgid: 7,
            user_stack_id: STACK_BEFORE_START,
            kernel_stack_id: STACK_BEFORE_START,
            state: offcpu_state::BLOCKED,
            ..OffCpuStart::default()
        }
    }

    #[test]
    fn builds_the_three_views() {
        let stacks = Stacks(HashMap::from([(1, vec![0x10]), (2, vec![0x20])]));
        let key = |user, kernel| {
            StackKey::from(OffCpuKey {
                tgid: 7,
                tid: 8,
                user_stack_id: user,
                kernel_stack_id: kernel,
                state: offcpu_state::BLOCKED,
            })
        };
        let raw = RawProfile {
            // One sample in user mode, one whose user stack collided in the stack map.
            oncpu: vec![(key(1, NO_STACK), 4), (key(-17, NO_STACK), 1)],
            offcpu: vec![
                (
                    key(1, 2),
                    OffCpuTotal {
                        total_ns: 5_000_000,
                        count: 2,
                    },
                ),
                // Preempted there: runnable, not blocked.
                (
                    StackKey {
                        state: offcpu_state::RUNNABLE,
                        ..key(1, 2)
                    },
                    OffCpuTotal {
                        total_ns: 3_000_000,
                        count: 3,
                    },
                ),
            ],
            pending: vec![
                (
                    8,
                    OffCpuStart {
                        ts_ns: 100,
                        tgid: 7,
                        user_stack_id: 1,
                        kernel_stack_id: 2,
                        state: offcpu_state::BLOCKED,
                        ..OffCpuStart::default()
                    },
                ),
                // Marked at the start and never switched out: it ran (it has samples).
                (8, before_start(0)),
                // Marked at the start, blocked throughout: it counts, stack unknown.
                (9, before_start(1_000_000)),
            ],
            now_ns: 1_000_100,
            min_block_ns: 0,
            tasks: TaskEntries::default(),
        };
        let mut symbolizer = StackSymbolizer::new();
        let processes = Processes::default();
        let profile = build_profile(
            &raw,
            BuildOptions {
                frequency_hz: 100,
                per_thread: true,
                group_by: GroupBy::Process,
            },
            &stacks,
            &mut symbolizer,
            &processes,
        );
        assert_eq!(profile.oncpu_samples, 5);
        assert_eq!(profile.oncpu_ns, 50_000_000);
        assert_eq!(profile.offcpu_intervals, 4);
        assert_eq!(profile.offcpu_ns, 6_000_100);
        assert_eq!(
            (profile.runnable_intervals, profile.runnable_ns),
            (3, 3_000_000)
        );
        assert_eq!(profile.missing_stacks, 1);
        assert_eq!((profile.threads, profile.processes), (2, 1));
        // Per thread: 8 ran 50 ms, was blocked 5 ms + 1 ms still open, preempted 3 ms; 9
        // was blocked from its mark at the start on (100 ns), busiest first.
        let split: Vec<_> = profile
            .per_thread
            .iter()
            .map(|t| (t.tid, t.oncpu_ns, t.blocked_ns, t.runnable_ns))
            .collect();
        assert_eq!(
            split,
            [(8, 50_000_000, 6_000_000, 3_000_000), (9, 0, 100, 0)]
        );
        let table = thread_table(&profile, 10);
        assert!(
            table.contains(
                "       8 ?                        0.059s     0.050s     0.006s     0.003s"
            ),
            "{table}"
        );
        assert_eq!(profile.wall.total_us(), 59_001);
        assert_eq!(profile.oncpu.total_us() + profile.offcpu.total_us(), 56_001);
        let wall = crate::output::render::flamegraph::FoldedStacks::from(&profile.wall).to_string();
        // The process exited unseen: its user frames are unknown, its root says its pid.
        assert!(wall.contains("[pid 7];? [8];[unknown] 40000"), "{wall}");
        assert!(wall.contains("[missing user stack] 10000"), "{wall}");
        assert!(wall.contains(&format!(";{OFF_CPU_FRAME} 6000")), "{wall}");
        assert!(wall.contains(&format!(";{RUNNABLE_FRAME} 3000")), "{wall}");
        assert!(
            !crate::output::render::flamegraph::FoldedStacks::from(&profile.offcpu)
                .to_string()
                .contains(OFF_CPU_FRAME)
        );
        assert!(
            !crate::output::render::flamegraph::FoldedStacks::from(&profile.offcpu)
                .to_string()
                .contains(RUNNABLE_FRAME)
        );
        assert!(
            wall.contains(&format!(
                "[pid 7];? [9];{BEFORE_START_FRAME};{OFF_CPU_FRAME} 1"
            )),
            "{wall}"
        );
    }

    /// An interval whose kernel stack the kernel could not walk, or whose end went unseen,
    /// says so in its kernel frames; the first counts as a missing stack, the second apart.
    #[test]
    fn kernel_stacks_lost_at_switch_in_say_why() {
        let stacks = Stacks(HashMap::from([(1, vec![0x10])]));
        let interval = |kernel_stack_id| {
            (
                StackKey::from(OffCpuKey {
                    tgid: 7,
                    tid: 8,
                    user_stack_id: 1,
                    kernel_stack_id,
                    state: offcpu_state::BLOCKED,
                }),
                OffCpuTotal {
                    total_ns: 2_000_000,
                    count: 1,
                },
            )
        };
        let raw = RawProfile {
            offcpu: vec![
                interval(tracer_common::KERNEL_STACK_UNREADABLE),
                interval(tracer_common::KERNEL_STACK_MISSED),
            ],
            now_ns: 1,
            ..RawProfile::default()
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
        assert_eq!(profile.missing_stacks, 1);
        assert_eq!(profile.switch_ins_missed, 1);
        let wall = crate::output::render::flamegraph::FoldedStacks::from(&profile.wall).to_string();
        for frame in [super::super::UNREADABLE_FRAME, super::super::MISSED_FRAME] {
            assert!(
                wall.contains(&format!(";{frame};{OFF_CPU_FRAME} 2000")),
                "{frame}: {wall}"
            );
        }
    }

    /// `--min-block` leaves out intervals still open at the end that are shorter, as the
    /// kernel leaves out finished ones; one exactly as long counts.
    #[test]
    fn open_intervals_shorter_than_min_block_are_left_out() {
        let stacks = Stacks(HashMap::from([(1, vec![0x10]), (2, vec![0x20])]));
        let blocked_at = |tid, ts_ns| {
            (
                tid,
                OffCpuStart {
                    ts_ns,
                    tgid: 7,
                    user_stack_id: 1,
                    kernel_stack_id: 2,
                    state: offcpu_state::BLOCKED,
                    ..OffCpuStart::default()
                },
            )
        };
        let build = |min_block_ns| {
            let raw = RawProfile {
                // Open for 10 ms, 2 ms, 50 µs, and since before profiling started (5 ms).
                pending: vec![
                    blocked_at(8, 0),
                    blocked_at(9, 8_000_000),
                    blocked_at(10, 9_950_000),
                    (11, before_start(5_000_000)),
                ],
                now_ns: 10_000_000,
                min_block_ns,
                ..RawProfile::default()
            };
            let options = BuildOptions {
                frequency_hz: 99,
                per_thread: false,
                group_by: GroupBy::Process,
            };
            build_profile(
                &raw,
                options,
                &stacks,
                &mut StackSymbolizer::new(),
                &Processes::default(),
            )
        };
        let all = build(0);
        assert_eq!((all.offcpu_intervals, all.offcpu_ns), (4, 17_050_000));
        let some = build(2_000_000);
        assert_eq!((some.offcpu_intervals, some.offcpu_ns), (3, 17_000_000));
        assert_eq!(some.wall.total_us(), 17_000);
        let none = build(10_000_001);
        assert_eq!((none.offcpu_intervals, none.offcpu_ns), (0, 0));
        assert!(none.wall.is_empty() && none.offcpu.is_empty());
    }
}
