//! Wall-clock profile: on-CPU samples and off-CPU (blocked) time of the same threads, in
//! one view where a thread's every microsecond is somewhere, plus the two halves apart.
//!
//! Weights are microseconds throughout. An on-CPU sample stands for one sampling period
//! (1/frequency s) of running; an off-CPU interval for the time the thread was blocked.
//!
//! Frames, root first: the process name (`comm`), then with `--per-thread` the thread
//! (`name [tid]`), the user frames, the kernel frames (suffixed `_[k]`), and for time off
//! CPU a last frame: [`OFF_CPU_FRAME`] for blocked time, [`RUNNABLE_FRAME`] for time a
//! thread was preempted and waited for a CPU. So in the wall-clock flame graph a
//! function's box is all the wall time spent in it, and the `[off-cpu]` boxes on top show
//! which part of that was spent blocked (and, under them, the kernel path that blocked).
//! The off-CPU view holds blocked time only.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use tracer_common::{
    EXEC_NS_UNKNOWN, KERNEL_STACK_AT_SWITCH_IN, KERNEL_STACK_NOT_SAMPLED, NO_STACK, OffCpuKey,
    OffCpuStart, OffCpuTotal, OnCpuKey, STACK_BEFORE_START, offcpu_state,
};

use crate::{
    stack::naming::{
        FrameTable, InternedStacks, PrefetchedStacks, StackProfile, StackSource, Weight,
        add_interned, kernel_stack_frames, process_frame, user_stack_frames,
    },
    stack::processes::Processes,
    stack::symbolize::StackSymbolizer,
};

/// The leaf frame added to blocked time in the wall-clock view.
pub const OFF_CPU_FRAME: &str = "[off-cpu]";

/// The leaf frame added to time a thread was runnable but not running (preempted,
/// waiting for a CPU) in the wall-clock view.
pub const RUNNABLE_FRAME: &str = "[runnable]";

/// The leaf frames of the tasks view (see [`TaskEntries`]): which kind of a task's time
/// a stack is.
pub const TASK_ON_CPU_FRAME: &str = "[running]";
pub const TASK_BLOCKED_FRAME: &str = "[blocked while running]";
pub const TASK_RUNNABLE_FRAME: &str = "[runnable while running]";
pub const TASK_PARKED_FRAME: &str = "[parked]";

/// The frame standing for the stacks of threads that were already off CPU when profiling
/// started (see [`tracer_common::STACK_BEFORE_START`]): where they blocked is not known.
pub const BEFORE_START_FRAME: &str = "[blocked since before profiling started]";

/// The kernel frame of short blocked intervals whose kernel stack was not sampled, where
/// no sample of the same user stack says where they blocked (see
/// [`tracer_common::KERNEL_STACK_ALWAYS_NS`]).
pub const NOT_SAMPLED_FRAME: &str = "[kernel stack not sampled]_[k]";

/// Stack ids from here to [`tracer_common::FIRST_SNAPSHOT_ID`] are the stacks user space
/// read from /proc for threads already blocked when profiling started (above the
/// kernel's stack map ids and the unwound on-CPU ids, which start at 1 << 24).
pub const FIRST_SEEDED_ID: i32 = 1 << 29;

/// The three views and what went into them.
#[derive(Debug, Default)]
pub struct WallClockProfile {
    /// On-CPU and off-CPU together; off-CPU stacks end in [`OFF_CPU_FRAME`].
    pub wall: StackProfile,
    pub oncpu: StackProfile,
    pub offcpu: StackProfile,
    pub oncpu_samples: u64,
    pub oncpu_ns: u64,
    /// Blocked time (waiting for an event: a lock, IO, a timer).
    pub offcpu_intervals: u64,
    pub offcpu_ns: u64,
    /// Time runnable but not on a CPU (preempted), in the wall-clock view only.
    pub runnable_intervals: u64,
    pub runnable_ns: u64,
    /// Distinct (thread, stacks) entries whose user or kernel stack could not be taken.
    pub missing_stacks: u64,
    /// Threads seen on or off CPU.
    pub threads: usize,
    /// Each thread's time on CPU, blocked and runnable, busiest (on CPU or runnable) first.
    pub per_thread: Vec<ThreadTime>,
    /// Wall time whose user stack has a frame that could not be named (JIT-compiled code
    /// without a perf map, code without symbols).
    pub unnamed_ns: u64,
    /// Wall time whose stack was cut short: its root frame is [`TRUNCATED_FRAME`].
    pub truncated_ns: u64,
    /// Processes seen on or off CPU.
    pub processes: usize,
    /// The threads' time while they ran runtime tasks, under the task that ran: process,
    /// task frame, stack, and a leaf frame saying on CPU, blocked or runnable
    /// ([`TASK_ON_CPU_FRAME`], ...). Empty without task probes.
    pub tasks: StackProfile,
    /// Each task's part of it, by (tgid, task).
    pub task_time: HashMap<(u32, u64), TaskWallTime>,
}

/// A runtime task's time while it was the running task of a thread: on CPU (samples),
/// blocked in the kernel, runnable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskWallTime {
    pub oncpu_samples: u64,
    pub oncpu_ns: u64,
    pub blocked_ns: u64,
    pub blocked_intervals: u64,
    pub runnable_ns: u64,
    /// The stack where it blocked its thread longest (frames root first, the process's
    /// and the task's left out), and how long it blocked there in all.
    pub longest_block: Option<(Vec<String>, u64)>,
}

/// One thread's wall time, split.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadTime {
    pub tgid: u32,
    pub tid: u32,
    /// Its name (`comm`) as last seen; `None` when it was never seen.
    pub name: Option<String>,
    pub oncpu_ns: u64,
    /// Blocked: waiting for an event.
    pub blocked_ns: u64,
    /// Preempted: runnable, waiting for a CPU.
    pub runnable_ns: u64,
    /// For a thread that ran Python code: its time in Python's terms.
    pub python: Option<PythonThreadTime>,
}

/// A Python thread's wall time in Python's terms. Time in stacks without Python frames
/// (before the thread's first Python function, or in a native thread) is not in it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PythonThreadTime {
    /// On CPU running Python code or what it called, not collecting garbage.
    pub running_ns: u64,
    /// Blocked taking (or handing over) the GIL.
    pub gil_ns: u64,
    /// Collecting garbage, on or off CPU.
    pub gc_ns: u64,
    /// Blocked elsewhere in the kernel (IO, sleep, a lock).
    pub blocked_ns: u64,
    /// Runnable, waiting for a CPU.
    pub runnable_ns: u64,
}

impl PythonThreadTime {
    fn add(&mut self, state: PythonState, ns: u64) {
        match state {
            PythonState::NotPython => {}
            PythonState::Running => self.running_ns += ns,
            PythonState::Gil => self.gil_ns += ns,
            PythonState::Collecting => self.gc_ns += ns,
            PythonState::Blocked => self.blocked_ns += ns,
            PythonState::Runnable => self.runnable_ns += ns,
        }
    }

    pub fn total_ns(&self) -> u64 {
        self.running_ns + self.gil_ns + self.gc_ns + self.blocked_ns + self.runnable_ns
    }
}

impl ThreadTime {
    pub fn wall_ns(&self) -> u64 {
        self.oncpu_ns + self.blocked_ns + self.runnable_ns
    }
}

/// What the kernel collected, as read back from the maps.
#[derive(Debug, Default)]
pub struct RawProfile {
    pub oncpu: Vec<(OnCpuKey, u64)>,
    pub offcpu: Vec<(OffCpuKey, OffCpuTotal)>,
    /// Threads still off CPU when tracing stopped: their time so far counts. Marks put
    /// by user space at the start ([`STACK_BEFORE_START`]) of threads that have on-CPU
    /// samples are dropped: those threads were running, not blocked, and never switched
    /// out.
    pub pending: Vec<(u32, OffCpuStart)>,
    pub now_ns: u64,
    /// `--min-block`: pending intervals shorter than this are left out, as the kernel
    /// leaves out finished ones.
    pub min_block_ns: u64,
    /// What of it was spent running runtime tasks.
    pub tasks: TaskEntries,
}

/// The part of a profile the threads spent running runtime tasks (between a task's run
/// and pause probes), as the kernel recorded it by task.
#[derive(Debug, Default)]
pub struct TaskEntries {
    /// On-CPU samples: (task, key, samples).
    pub oncpu: Vec<(u64, OnCpuKey, u64)>,
    /// Off-CPU intervals, and the kernel-stack samples of short ones: (task, key, total).
    pub offcpu: Vec<(u64, OffCpuKey, OffCpuTotal)>,
    /// The frame that stands for each task, by (tgid, task); a task missing here is
    /// `task #N`.
    pub names: HashMap<(u32, u64), String>,
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

/// How to build the views.
#[derive(Debug, Clone, Copy)]
pub struct BuildOptions {
    pub frequency_hz: u64,
    pub per_thread: bool,
}

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
        let marked_at_start = start.exec_ns == EXEC_NS_UNKNOWN
            || start.user_stack_id == STACK_BEFORE_START
            || start.kernel_stack_id == STACK_BEFORE_START;
        if marked_at_start && sampled.contains(&tid) {
            continue;
        }
        let key = OffCpuKey {
            tgid: start.tgid,
            tid,
            user_stack_id: start.user_stack_id,
            kernel_stack_id: start.kernel_stack_id,
            state: start.state,
        };
        offcpu.entry(key).or_default().add(Weight { events: 1, ns });
        if start.task != 0 {
            task_offcpu
                .entry((start.task, key))
                .or_default()
                .add(Weight { events: 1, ns });
        }
    }

    let keys: Vec<OffCpuKey> = raw
        .oncpu
        .iter()
        .map(|(k, _)| *k)
        .chain(offcpu.keys().copied())
        .chain(raw.tasks.oncpu.iter().map(|(_, k, _)| *k))
        .chain(task_offcpu.keys().map(|(_, k)| *k))
        .collect();
    let mut namer = Namer::new(&keys, stacks, symbolizer, processes, options.per_thread);
    let task_frames = TaskFrames::new(&mut namer.table, &raw.tasks, &task_offcpu);
    let oncpu_weight = |samples: u64| Weight {
        events: samples,
        ns: samples * period_ns,
    };
    // The wall view is built on a thread of its own meanwhile: each key's stack takes a
    // map insert in two views, and the loop over hundreds of thousands of keys is time a
    // stopping tracer makes its user wait.
    let sized = |len: usize| InternedStacks::with_capacity_and_hasher(len, Default::default());
    let (wall, oncpu, blocked, per_thread, tasks) = std::thread::scope(|scope| {
        let tasks = scope.spawn(|| {
            let mut tasks = sized(raw.tasks.oncpu.len() + task_offcpu.len());
            let mut times: HashMap<(u32, u64), TaskWallTime> = HashMap::new();
            let mut blocked_at: HashMap<(u32, u64), HashMap<Vec<u32>, u64>> = HashMap::new();
            let mut frames = Vec::new();
            for &(task, key, samples) in &raw.tasks.oncpu {
                task_frames.frames(&namer, task, &key, task_frames.on_cpu, &mut frames);
                let weight = oncpu_weight(samples);
                add_interned(&mut tasks, &frames, weight);
                let time = times.entry((key.tgid, task)).or_default();
                time.oncpu_samples += weight.events;
                time.oncpu_ns += weight.ns;
            }
            for (&(task, key), &weight) in &task_offcpu {
                let runnable = key.state == offcpu_state::RUNNABLE;
                let leaf = match runnable {
                    true => task_frames.runnable,
                    false => task_frames.blocked,
                };
                task_frames.frames(&namer, task, &key, leaf, &mut frames);
                add_interned(&mut tasks, &frames, weight);
                let time = times.entry((key.tgid, task)).or_default();
                if runnable {
                    time.runnable_ns += weight.ns;
                } else {
                    time.blocked_ns += weight.ns;
                    time.blocked_intervals += weight.events;
                    // Below the process, task (and thread) frames, without the leaf.
                    let below = 2 + usize::from(options.per_thread);
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
        });
        let wall = scope.spawn(|| {
            let mut wall = sized(raw.oncpu.len() + offcpu.len());
            let mut frames = Vec::new();
            for &(key, samples) in &raw.oncpu {
                namer.frames(&key, &mut frames);
                add_interned(&mut wall, &frames, oncpu_weight(samples));
            }
            for (key, &weight) in &offcpu {
                namer.frames(key, &mut frames);
                frames.push(match key.state {
                    offcpu_state::RUNNABLE => namer.runnable,
                    _ => namer.off_cpu,
                });
                add_interned(&mut wall, &frames, weight);
            }
            wall
        });
        let mut per_thread: foldhash::HashMap<(u32, u32), ThreadTime> = Default::default();
        fn thread<'t>(
            per_thread: &'t mut foldhash::HashMap<(u32, u32), ThreadTime>,
            processes: &Processes,
            key: &OffCpuKey,
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
        let (mut oncpu, mut blocked) = (sized(raw.oncpu.len()), sized(offcpu.len()));
        let mut frames = Vec::new();
        for &(key, samples) in &raw.oncpu {
            let weight = oncpu_weight(samples);
            profile.missing_stacks += u64::from(is_missing(&key));
            namer.frames(&key, &mut frames);
            profile.unnamed_ns += weight.ns * u64::from(namer.has_unnamed(&frames));
            profile.truncated_ns += weight.ns * u64::from(namer.is_truncated(&frames));
            profile.oncpu_samples += weight.events;
            profile.oncpu_ns += weight.ns;
            let time = thread(&mut per_thread, processes, &key);
            time.oncpu_ns += weight.ns;
            add_python_time(time, namer.python_state(&frames, None), weight.ns);
            add_interned(&mut oncpu, &frames, weight);
        }
        for (key, &weight) in &offcpu {
            profile.missing_stacks += u64::from(is_missing(key));
            namer.frames(key, &mut frames);
            profile.unnamed_ns += weight.ns * u64::from(namer.has_unnamed(&frames));
            profile.truncated_ns += weight.ns * u64::from(namer.is_truncated(&frames));
            let python_state = namer.python_state(&frames, Some(key.state));
            add_python_time(
                thread(&mut per_thread, processes, key),
                python_state,
                weight.ns,
            );
            if key.state == offcpu_state::RUNNABLE {
                profile.runnable_intervals += weight.events;
                profile.runnable_ns += weight.ns;
                thread(&mut per_thread, processes, key).runnable_ns += weight.ns;
            } else {
                profile.offcpu_intervals += weight.events;
                profile.offcpu_ns += weight.ns;
                thread(&mut per_thread, processes, key).blocked_ns += weight.ns;
                add_interned(&mut blocked, &frames, weight);
            }
        }
        fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
            handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        }
        (join(wall), oncpu, blocked, per_thread, join(tasks))
    });
    let table = namer.table;
    let (tasks, task_time) = tasks;
    profile.tasks = StackProfile::from_interned(table.clone(), tasks);
    profile.task_time = task_time;
    profile.wall = StackProfile::from_interned(table.clone(), wall);
    profile.oncpu = StackProfile::from_interned(table.clone(), oncpu);
    profile.offcpu = StackProfile::from_interned(table, blocked);
    let ids = || {
        raw.oncpu
            .iter()
            .map(|(k, _)| (k.tgid, k.tid))
            .chain(raw.offcpu.iter().map(|(k, _)| (k.tgid, k.tid)))
            .chain(raw.pending.iter().map(|(tid, s)| (s.tgid, *tid)))
    };
    profile.threads = ids().map(|(_, tid)| tid).collect::<HashSet<_>>().len();
    profile.processes = ids().map(|(tgid, _)| tgid).collect::<HashSet<_>>().len();
    profile.per_thread = per_thread.into_values().collect();
    profile
        .per_thread
        // Busiest first: every thread of a process has about the same wall time, and the
        // idle ones (a server's auxiliary threads) would otherwise top the table.
        .sort_by_key(|t| {
            (
                std::cmp::Reverse(t.oncpu_ns + t.runnable_ns),
                std::cmp::Reverse(t.wall_ns()),
                t.tid,
            )
        });
    profile
}

/// The busiest threads of `profile` (on CPU or waiting for one the longest), as a table: id (decimal), name, and
/// their time on CPU, blocked and runnable. At most `shown` rows.
pub fn thread_table(profile: &WallClockProfile, shown: usize) -> String {
    use std::fmt::Write as _;
    let seconds = |ns: u64| format!("{:.3}s", ns as f64 / 1e9);
    let mut out = format!(
        "{:>8} {:<20} {:>10} {:>10} {:>10} {:>10}\n",
        "TID", "THREAD", "WALL", "ON-CPU", "BLOCKED", "RUNNABLE"
    );
    for t in profile.per_thread.iter().take(shown) {
        let name = t.name.as_deref().unwrap_or("?");
        let _ = writeln!(
            out,
            "{:>8} {:<20} {:>10} {:>10} {:>10} {:>10}",
            t.tid,
            crate::system::text::escape_text(name),
            seconds(t.wall_ns()),
            seconds(t.oncpu_ns),
            seconds(t.blocked_ns),
            seconds(t.runnable_ns)
        );
    }
    out
}

/// Adds `ns` in `state` to a thread's Python time (which it has from its first stack
/// with Python frames).
fn add_python_time(time: &mut ThreadTime, state: PythonState, ns: u64) {
    if state != PythonState::NotPython {
        time.python.get_or_insert_default().add(state, ns);
    }
}

/// The Python threads of `profile` (those with Python frames), as a table: id, name, and
/// their time running, waiting for the GIL, collecting garbage, blocked and runnable.
/// At most `shown` rows, busiest first; `None` without Python threads.
pub fn python_thread_table(profile: &WallClockProfile, shown: usize) -> Option<String> {
    use std::fmt::Write as _;
    let seconds = |ns: u64| format!("{:.3}s", ns as f64 / 1e9);
    let threads: Vec<(&ThreadTime, &PythonThreadTime)> = profile
        .per_thread
        .iter()
        .filter_map(|t| Some((t, t.python.as_ref()?)))
        .collect();
    if threads.is_empty() {
        return None;
    }
    let mut out = format!(
        "Python threads: {}; their time in Python's terms (running, waiting for the GIL, \
         collecting garbage, blocked elsewhere, runnable):\n\
         {:>8} {:<20} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
        threads.len(),
        "TID",
        "THREAD",
        "RUNNING",
        "GIL",
        "GC",
        "BLOCKED",
        "RUNNABLE"
    );
    for (t, python) in threads.into_iter().take(shown) {
        let _ = writeln!(
            out,
            "{:>8} {:<20} {:>10} {:>10} {:>10} {:>10} {:>10}",
            t.tid,
            crate::system::text::escape_text(t.name.as_deref().unwrap_or("?")),
            seconds(python.running_ns),
            seconds(python.gil_ns),
            seconds(python.gc_ns),
            seconds(python.blocked_ns),
            seconds(python.runnable_ns)
        );
    }
    Some(out)
}

/// Whether a frame could not be named.
fn is_unnamed(frame: &str) -> bool {
    frame.starts_with(crate::stack::symbolize::UNKNOWN)
}

/// The outermost frame of a stack cut short: deeper than the stack bytes copied or
/// [`tracer_common::MAX_STACK_DEPTH`] frames.
pub const TRUNCATED_FRAME: &str = crate::stack::unwind::TRUNCATED_FRAME;

/// The line saying how much of `profile`'s wall time is in stacks cut short; `None`
/// when less than a thousandth is.
pub fn truncated_line(profile: &WallClockProfile) -> Option<String> {
    let wall = profile.oncpu_ns + profile.offcpu_ns + profile.runnable_ns;
    // Below a thousandth the share rounds to nothing; the JSON keeps the exact time.
    (profile.truncated_ns.saturating_mul(1000) >= wall.max(1)).then(|| {
        format!(
            "Truncated: {:.1}% of the wall time is in stacks cut short (their root frame is \
             {TRUNCATED_FRAME}): deeper than the {} KiB of stack copied or {} frames.",
            profile.truncated_ns as f64 * 100.0 / wall.max(1) as f64,
            tracer_common::UNWIND_STACK_BYTES / 1024,
            tracer_common::MAX_STACK_DEPTH
        )
    })
}

/// The share of a profile's wall time above which the reports say how to name what
/// could not be named.
pub const UNNAMED_HINT_SHARE: f64 = 0.1;

/// When more than [`UNNAMED_HINT_SHARE`] of `profile`'s wall time has unnamed frames,
/// the line saying so and how to get names (see [`crate::probe::runtimes::jit_naming_hint`]).
pub fn unnamed_line(profile: &WallClockProfile, hint: impl FnOnce() -> String) -> Option<String> {
    let wall = profile.oncpu_ns + profile.offcpu_ns + profile.runnable_ns;
    let share = profile.unnamed_ns as f64 / wall.max(1) as f64;
    (share > UNNAMED_HINT_SHARE).then(|| {
        format!(
            "Unnamed: {:.0}% of the wall time is in stacks with frames that could not be \
             named ({}): {}.",
            share * 100.0,
            crate::stack::symbolize::UNKNOWN,
            hint()
        )
    })
}

/// The off-CPU totals by key, with the time of short intervals whose kernel stack was not
/// sampled ([`KERNEL_STACK_NOT_SAMPLED`]) spread over the kernel stacks sampled at the
/// same user stack and state, in proportion to their samples: those of the same thread,
/// else (none there) those of the process's other threads. Samples themselves
/// ([`offcpu_state::SAMPLED`]) are not time and are not kept. Time with no sample to go
/// by stays under [`KERNEL_STACK_NOT_SAMPLED`]. Per thread, user stack and state the
/// time and the intervals are exactly the kernel's.
fn spread_unsampled(totals: &[(OffCpuKey, OffCpuTotal)]) -> foldhash::HashMap<OffCpuKey, Weight> {
    type Place = (u32, i32, u32);
    let mut by_thread: HashMap<(u32, Place), BTreeMap<i32, u64>> = HashMap::new();
    let mut by_process: HashMap<Place, BTreeMap<i32, u64>> = HashMap::new();
    // A profile has up to millions of keys: a fast hash, sized once.
    let mut spread = foldhash::HashMap::with_capacity_and_hasher(totals.len(), Default::default());
    let mut unsampled = Vec::new();
    for (key, total) in totals {
        let weight = Weight {
            events: total.count,
            ns: total.total_ns,
        };
        if key.state & offcpu_state::SAMPLED != 0 {
            let state = key.state & !offcpu_state::SAMPLED;
            let place = (key.tgid, key.user_stack_id, state);
            *by_thread
                .entry((key.tid, place))
                .or_default()
                .entry(key.kernel_stack_id)
                .or_default() += total.count;
            *by_process
                .entry(place)
                .or_default()
                .entry(key.kernel_stack_id)
                .or_default() += total.count;
        } else if key.kernel_stack_id == KERNEL_STACK_NOT_SAMPLED {
            unsampled.push((*key, weight));
        } else {
            spread
                .entry(*key)
                .or_insert_with(Weight::default)
                .add(weight);
        }
    }
    for (key, weight) in unsampled {
        let place = (key.tgid, key.user_stack_id, key.state);
        let samples = by_thread
            .get(&(key.tid, place))
            .or_else(|| by_process.get(&place));
        let Some(samples) = samples else {
            spread
                .entry(key)
                .or_insert_with(Weight::default)
                .add(weight);
            continue;
        };
        for (kernel_stack_id, share) in proportional_shares(weight, samples) {
            let key = OffCpuKey {
                kernel_stack_id,
                ..key
            };
            spread.entry(key).or_insert_with(Weight::default).add(share);
        }
    }
    spread
}

/// [`spread_unsampled`] for each task's entries apart.
fn spread_task_unsampled(
    entries: &[(u64, OffCpuKey, OffCpuTotal)],
) -> foldhash::HashMap<(u64, OffCpuKey), Weight> {
    let mut by_task: BTreeMap<u64, Vec<(OffCpuKey, OffCpuTotal)>> = BTreeMap::new();
    for &(task, key, total) in entries {
        by_task.entry(task).or_default().push((key, total));
    }
    let mut spread = foldhash::HashMap::default();
    for (task, totals) in by_task {
        spread.extend(
            spread_unsampled(&totals)
                .into_iter()
                .map(|(key, weight)| ((task, key), weight)),
        );
    }
    spread
}

/// The frames of the tasks view that stacks do not give: each task's, and the leaves.
struct TaskFrames {
    tasks: foldhash::HashMap<(u32, u64), u32>,
    on_cpu: u32,
    blocked: u32,
    runnable: u32,
}

impl TaskFrames {
    fn new(
        table: &mut FrameTable,
        entries: &TaskEntries,
        offcpu: &foldhash::HashMap<(u64, OffCpuKey), Weight>,
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
    fn frames(&self, namer: &Namer, task: u64, key: &OffCpuKey, leaf: u32, frames: &mut Vec<u32>) {
        namer.frames(key, frames);
        frames.insert(1, self.tasks[&(key.tgid, task)]);
        frames.push(leaf);
    }
}

/// `weight` split in proportion to `samples` (by kernel stack id), exactly: what rounding
/// leaves over goes to the stack with the most samples.
fn proportional_shares(weight: Weight, samples: &BTreeMap<i32, u64>) -> Vec<(i32, Weight)> {
    let total: u64 = samples.values().sum();
    let part = |of: u64, n: u64| (u128::from(of) * u128::from(n) / u128::from(total)) as u64;
    let mut shares: Vec<(i32, Weight)> = samples
        .iter()
        .map(|(&id, &n)| {
            let share = Weight {
                events: part(weight.events, n),
                ns: part(weight.ns, n),
            };
            (id, share)
        })
        .collect();
    let given = shares.iter().fold(Weight::default(), |mut sum, (_, w)| {
        sum.add(*w);
        sum
    });
    let most = samples
        .iter()
        .max_by_key(|&(&id, &n)| (n, std::cmp::Reverse(id)))
        .map(|(&id, _)| id);
    if let Some((_, share)) = shares.iter_mut().find(|(id, _)| Some(*id) == most) {
        share.events += weight.events - given.events;
        share.ns += weight.ns - given.ns;
    }
    shares
}

/// A stack that should be there and is not (not the legitimately absent kind).
fn is_missing(key: &OffCpuKey) -> bool {
    let missing = |id: i32| {
        id < 0
            && ![
                NO_STACK,
                STACK_BEFORE_START,
                KERNEL_STACK_NOT_SAMPLED,
                KERNEL_STACK_AT_SWITCH_IN,
            ]
            .contains(&id)
    };
    missing(key.user_stack_id) || missing(key.kernel_stack_id)
}

/// Names the stacks of a profile: every distinct stack was named up front, in one batch
/// per process and one for the kernel, into frame ids of one [`FrameTable`] that all
/// three views are built with (each keeps a copy of it).
struct Namer {
    per_thread: bool,
    table: FrameTable,
    user: foldhash::HashMap<(u32, i32), Vec<u32>>,
    kernel: foldhash::HashMap<i32, Vec<u32>>,
    /// The root frame of each process, and with `per_thread` the frame of each thread.
    process_frames: foldhash::HashMap<u32, u32>,
    thread_frames: foldhash::HashMap<u32, u32>,
    /// The frames that stand for no stack, or for a part left out.
    before_start: u32,
    not_sampled: u32,
    runnable: u32,
    off_cpu: u32,
    /// By frame id: could not be named.
    unnamed: Vec<bool>,
    /// By frame id: what the frame says of a Python thread's state.
    python: Vec<PythonFrameKind>,
}

/// What a frame says of the state of the Python thread that has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PythonFrameKind {
    /// A Python function.
    Function,
    /// Part of CPython's garbage collector.
    Collector,
    /// Where CPython takes or hands over the GIL.
    Gil,
    Other,
}

impl PythonFrameKind {
    fn of(name: &str) -> Self {
        // Python frames read `function (file.py:LINE)` (see `crate::stack::python`).
        let is_python = name.ends_with(')')
            && name
                .rsplit_once(" (")
                .is_some_and(|(_, place)| place.contains(".py") || place.starts_with('<'));
        if is_python {
            Self::Function
        } else if PYTHON_GC_FUNCTIONS.contains(&name) {
            Self::Collector
        } else if PYTHON_GIL_FUNCTIONS.contains(&name) {
            Self::Gil
        } else {
            Self::Other
        }
    }
}

/// CPython's collector functions (3.9 to 3.13), as builds with a symbol table name them.
const PYTHON_GC_FUNCTIONS: [&str; 7] = [
    "gc_collect_main",
    "gc_collect_with_callback",
    "collect_with_callback",
    "gc_collect_impl",
    "gc_collect_generations",
    "_PyGC_Collect",
    "_PyGC_CollectNoFail",
];

/// CPython's functions that wait to take the GIL or to hand it over.
const PYTHON_GIL_FUNCTIONS: [&str; 6] = [
    "take_gil",
    "drop_gil",
    "PyEval_RestoreThread",
    "PyEval_AcquireThread",
    "PyEval_AcquireLock",
    "_PyThreadState_Attach",
];

/// How a Python thread spent one stack's time (see [`PythonThreadTime`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PythonState {
    NotPython,
    Running,
    Gil,
    Collecting,
    Blocked,
    Runnable,
}

impl Namer {
    fn new(
        keys: &[OffCpuKey],
        stacks: &impl StackSource,
        symbolizer: &mut StackSymbolizer,
        processes: &Processes,
        per_thread: bool,
    ) -> Self {
        let named = |id: i32| id != NO_STACK && id != STACK_BEFORE_START;
        let mut user_ids: BTreeMap<u32, Vec<i32>> = BTreeMap::new();
        for key in keys.iter().filter(|k| named(k.user_stack_id)) {
            user_ids
                .entry(key.tgid)
                .or_default()
                .push(key.user_stack_id);
        }
        let kernel_ids: Vec<i32> = keys
            .iter()
            .map(|k| k.kernel_stack_id)
            .filter(|&id| !NOT_KERNEL_STACKS.contains(&id))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let kernel_stacks = PrefetchedStacks::new(stacks, kernel_ids.iter().copied());
        let unnamed_kernel = symbolizer.unnamed_kernel_addresses(kernel_stacks.addresses());
        let mut table = FrameTable::default();
        let mut user = foldhash::HashMap::default();
        // Kernel addresses are named on another thread meanwhile: the two take about as
        // long, and this is the time a stopping tracer makes its user wait.
        let kernel_naming =
            (!unnamed_kernel.is_empty()).then(|| symbolizer.name_kernel_apart(unnamed_kernel));
        for (tgid, ids) in user_ids {
            let maps = processes.get(tgid).and_then(|p| p.maps.as_ref());
            let names = user_stack_frames(ids, stacks, symbolizer, maps, |name| table.intern(name));
            user.extend(names.into_iter().map(|(id, names)| ((tgid, id), names)));
        }
        if let Some(naming) = kernel_naming {
            symbolizer.add_kernel_names(naming.wait());
        }
        let kernel = kernel_stack_frames(kernel_ids, &kernel_stacks, symbolizer, |name| {
            table.intern(name)
        });
        // Every frame a stack can have is interned here, so that naming a stack only
        // reads, and the views can be built on two threads. With more than one process,
        // each root frame says which (`name [pid]`).
        let mut tgids = keys.iter().map(|k| k.tgid);
        let first = tgids.next();
        let several = tgids.any(|t| Some(t) != first);
        let mut process_frames = foldhash::HashMap::default();
        let mut thread_frames = foldhash::HashMap::default();
        for key in keys {
            process_frames
                .entry(key.tgid)
                .or_insert_with(|| table.intern(&process_frame(processes, key.tgid, several)));
            if per_thread {
                thread_frames.entry(key.tid).or_insert_with(|| {
                    let name = processes.thread_name(key.tid).unwrap_or("?");
                    table.intern(&format!("{name} [{}]", key.tid))
                });
            }
        }
        let before_start = table.intern(BEFORE_START_FRAME);
        let not_sampled = table.intern(NOT_SAMPLED_FRAME);
        let runnable = table.intern(RUNNABLE_FRAME);
        let off_cpu = table.intern(OFF_CPU_FRAME);
        let unnamed = table.names().iter().map(|name| is_unnamed(name)).collect();
        let python = table
            .names()
            .iter()
            .map(|name| PythonFrameKind::of(name))
            .collect();
        Self {
            per_thread,
            table,
            user,
            kernel,
            process_frames,
            thread_frames,
            before_start,
            not_sampled,
            runnable,
            off_cpu,
            unnamed,
            python,
        }
    }

    /// The frame ids of `key`'s stack, root first, into `frames`.
    fn frames(&self, key: &OffCpuKey, frames: &mut Vec<u32>) {
        frames.clear();
        frames.push(self.process_frames[&key.tgid]);
        if self.per_thread {
            frames.push(self.thread_frames[&key.tid]);
        }
        if key.user_stack_id == STACK_BEFORE_START {
            frames.push(self.before_start);
            return;
        }
        if key.user_stack_id != NO_STACK {
            frames.extend_from_slice(&self.user[&(key.tgid, key.user_stack_id)]);
        }
        match key.kernel_stack_id {
            KERNEL_STACK_NOT_SAMPLED => frames.push(self.not_sampled),
            id if NOT_KERNEL_STACKS.contains(&id) => {}
            id => frames.extend_from_slice(&self.kernel[&id]),
        }
    }

    /// Whether any of `frames` could not be named.
    /// What a stack with `frames`, in `state` (on CPU: `None`), says a Python thread did.
    fn python_state(&self, frames: &[u32], state: Option<u32>) -> PythonState {
        let kinds = || frames.iter().map(|&id| self.python[id as usize]);
        if !kinds().any(|k| k == PythonFrameKind::Function) {
            return PythonState::NotPython;
        }
        if kinds().any(|k| k == PythonFrameKind::Collector) {
            return PythonState::Collecting;
        }
        match state {
            None => PythonState::Running,
            Some(offcpu_state::RUNNABLE) => PythonState::Runnable,
            Some(_) if kinds().any(|k| k == PythonFrameKind::Gil) => PythonState::Gil,
            Some(_) => PythonState::Blocked,
        }
    }

    /// Whether the stack of `frames` was cut short.
    fn is_truncated(&self, frames: &[u32]) -> bool {
        frames
            .iter()
            .any(|&id| self.table.names()[id as usize] == TRUNCATED_FRAME)
    }

    fn has_unnamed(&self, frames: &[u32]) -> bool {
        frames.iter().any(|&id| self.unnamed[id as usize])
    }
}

/// Kernel stack ids that stand for no stack to name.
const NOT_KERNEL_STACKS: [i32; 3] = [
    NO_STACK,
    KERNEL_STACK_NOT_SAMPLED,
    KERNEL_STACK_AT_SWITCH_IN,
];

#[cfg(test)]
mod tests {
    use super::*;

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
            ..OffCpuStart::default()
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

    struct Stacks(HashMap<i32, Vec<u64>>);

    impl StackSource for Stacks {
        fn stack(&self, id: i32) -> Vec<u64> {
            self.0.get(&id).cloned().unwrap_or_default()
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
        let key = |user, kernel| OffCpuKey {
            tgid: 7,
            tid: 8,
            user_stack_id: user,
            kernel_stack_id: kernel,
            state: offcpu_state::BLOCKED,
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
                    OffCpuKey {
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
        let key = |user, kernel, state| OffCpuKey {
            tgid: 7,
            tid: 8,
            user_stack_id: user,
            kernel_stack_id: kernel,
            state,
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

    /// Short intervals' time, kept under "not sampled", goes to the kernel stacks sampled
    /// at the same user stack and state: the thread's own samples first, else its
    /// process's; exactly, per thread and user stack; samples are not time.
    #[test]
    fn unsampled_time_is_spread_over_the_kernel_stacks_sampled_there() {
        let entry = |tid, user, kernel, state, ns, count| {
            let key = OffCpuKey {
                tgid: 7,
                tid,
                user_stack_id: user,
                kernel_stack_id: kernel,
                state,
            };
            (
                key,
                OffCpuTotal {
                    total_ns: ns,
                    count,
                },
            )
        };
        let sampled = offcpu_state::BLOCKED | offcpu_state::SAMPLED;
        let totals = [
            // Thread 8 at user stack 1: 1001 ns in 10 short intervals, sampled 3 times
            // at kernel stack 20 and once at 21, plus a long interval at 21.
            entry(
                8,
                1,
                KERNEL_STACK_NOT_SAMPLED,
                offcpu_state::BLOCKED,
                1001,
                10,
            ),
            entry(8, 1, 20, sampled, 3_000_000, 3),
            entry(8, 1, 21, sampled, 1_000_000, 1),
            entry(8, 1, 21, offcpu_state::BLOCKED, 5_000_000, 1),
            // Thread 9 at user stack 1, never sampled: its process's samples say where.
            entry(
                9,
                1,
                KERNEL_STACK_NOT_SAMPLED,
                offcpu_state::BLOCKED,
                400,
                4,
            ),
            // Runnable at user stack 1: no runnable sample anywhere, so it stays.
            entry(
                9,
                1,
                KERNEL_STACK_NOT_SAMPLED,
                offcpu_state::RUNNABLE,
                50,
                1,
            ),
        ];
        let spread = spread_unsampled(&totals);
        let get = |tid, kernel, state| {
            let key = OffCpuKey {
                tgid: 7,
                tid,
                user_stack_id: 1,
                kernel_stack_id: kernel,
                state,
            };
            spread.get(&key).map(|w| (w.ns, w.events))
        };
        let blocked = offcpu_state::BLOCKED;
        // 3/4 of 1001 ns rounds down to 750; the rest goes to the most sampled stack.
        assert_eq!(get(8, 20, blocked), Some((751, 8)));
        assert_eq!(get(8, 21, blocked), Some((5_000_250, 3)));
        assert_eq!(get(9, 20, blocked), Some((300, 3)));
        assert_eq!(get(9, 21, blocked), Some((100, 1)));
        let runnable = offcpu_state::RUNNABLE;
        assert_eq!(get(9, KERNEL_STACK_NOT_SAMPLED, runnable), Some((50, 1)));
        assert_eq!(spread.len(), 5, "{spread:?}");
        let total: u64 = spread.values().map(|w| w.ns).sum();
        assert_eq!(total, 1001 + 5_000_000 + 400 + 50);
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
