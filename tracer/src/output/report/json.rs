//! The report of `tracer attach` as one JSON document with every figure.
//! [`AttachJson`] is the document's shape, one typed struct per block, borrowed from
//! the report. The keys come out in name order, as serde_json's maps keep them.
//! The fields' doc comments are written for users: `docs/json.md` is generated from
//! them (see `docs`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::{
    output::render::{ViewFiles, hist::HistogramSummary},
    probe::runtimes::Mechanism,
};

use super::types::{AttachReport, LatencyReport, ProcessLatency, TaskReport};

#[cfg(test)]
mod docs;

/// One document on standard output, its keys in name order; times are nanoseconds.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct AttachJson<'a> {
    /// The target's PID; for a set of targets, the first one's.
    pid: u32,
    /// The target's program name; for a set, what the set is.
    process: &'a str,
    /// Every process traced: the targets at the start and those that joined; of the
    /// processes that exited, the last `--keep-exited`.
    processes: Vec<ProcessJson<'a>>,
    /// The other exited processes, counted by program name ([Running for
    /// weeks](metrics.md#running-for-weeks-processes-that-come-and-go---keep-exited-n)).
    processes_folded: &'a BTreeMap<String, u64>,
    /// Why tracing stopped, as the text report says it: `duration elapsed`,
    /// `interrupted (SIGINT)`, `terminated (SIGTERM)`, `target exited`, `the link keeper
    /// was killed`.
    stopped_by: String,
    /// How long it was traced.
    duration_ns: u64,
    /// Each attached probe.
    probes: Vec<ProbeJson>,
    /// One per latency, under its name: `gc_pause`, `gc_stop_the_world`, `gc_mark`,
    /// `gc_sweep`, `BEGIN_to_END` from `--latency`, or a function's name for its entry to
    /// its return. The name is `NAME:RUNTIME` when two runtimes of the target have one so
    /// named.
    latencies: BTreeMap<String, LatencyJson<'a>>,
    /// One runtime's collections: the one with the most, when a process hosts two; null
    /// without GC probes.
    gc: Option<GcJson<'a>>,
    /// The same for each runtime the target hosts.
    gc_by_runtime: Vec<GcJson<'a>>,
    /// Time blocked off the CPU.
    offcpu: OffCpuJson<'a>,
    /// Time sampled on the CPU.
    oncpu: OnCpuJson<'a>,
    /// Wall time, on and off the CPU.
    wallclock: WallClockJson<'a>,
    /// Each thread's wall time.
    threads: Vec<ThreadJson<'a>>,
    /// With `--unwind dwarf` (the default): what was unwound; null with `--unwind fp`.
    unwind: Option<UnwindJson>,
    /// With task probes: each task's wall time; null otherwise.
    tasks: Option<TasksJson<'a>>,
    /// With `--timeline`: what was written; null otherwise.
    timeline: Option<TimelineJson<'a>>,
    /// What the kernel side could not record.
    lost: LostJson,
}

/// A process traced.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct ProcessJson<'a> {
    /// Its PID, as the tracer sees it.
    pid: u32,
    /// Its program name.
    name: &'a str,
    /// Its PID in its own PID namespace when that is below the tracer's (a container's);
    /// else null.
    namespace_pid: Option<u32>,
}

/// An attached probe.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct ProbeJson {
    /// `usdt:PATH:PROVIDER:NAME`.
    probe: String,
    /// The addresses it is attached at.
    sites: usize,
    /// How many times it fired.
    hits: u64,
    /// When it first fired, on CLOCK_MONOTONIC (bpftrace's `nsecs` clock); null if never.
    first_hit_monotonic_ns: Option<u64>,
}

/// A latency: its histogram's summary, where it comes from, its classes and processes.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct LatencyJson<'a> {
    #[serde(flatten)]
    summary: HistogramSummary,
    /// The probe it starts at.
    begin: String,
    /// The probe it ends at.
    end: String,
    /// The runtime it belongs to, or null.
    runtime: Option<&'static str>,
    /// How it is measured: `usdt`, or `function probes` for a build without USDT probes.
    mechanism: &'static str,
    /// As in `gc`.
    classes: Option<ClassesJson<'a>>,
    /// The probes of a `--latency` pair that no target ever had; the latency is then
    /// listed with a count of 0.
    never_found: &'a [String],
    /// Each process's share.
    per_process: Vec<ProcessLatencyJson<'a>>,
}

/// A latency split by class: what the classes are, and each class's totals under its
/// label.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct ClassesJson<'a> {
    /// What the classes are: `generation` for CPython, `collector` for V8 (`minor`,
    /// `major`), `collection` for Julia, `phase` for Go.
    by: &'static str,
    #[serde(flatten)]
    classes: BTreeMap<&'a str, ClassJson>,
}

/// One class's totals.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct ClassJson {
    /// How many.
    count: u64,
    /// Their total.
    total_ns: u64,
    /// The longest.
    max_ns: u64,
}

/// One process's share of a latency.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct ProcessLatencyJson<'a> {
    /// The process's PID.
    pid: u32,
    /// Its program name.
    name: &'a str,
    /// How many.
    count: u64,
    /// Their total.
    total_ns: u64,
    /// The shortest.
    min_ns: u64,
    /// The longest.
    max_ns: u64,
}

/// One runtime's GC pauses.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct GcJson<'a> {
    /// The runtime, or null for probes of no known runtime.
    runtime: Option<&'static str>,
    /// How its pauses are measured: `usdt`, or `function probes` for a build without USDT
    /// probes.
    mechanism: &'static str,
    /// How many collections.
    count: u64,
    /// Their total pause.
    total_pause_ns: u64,
    /// Paused time over traced time.
    wall_share: f64,
    /// The pauses by class, for a runtime that tells them apart; else null.
    classes: Option<ClassesJson<'a>>,
}

/// Time blocked off the CPU.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct OffCpuJson<'a> {
    /// Time blocked.
    total_ns: u64,
    /// How many times a thread blocked.
    intervals: u64,
    /// Distinct stacks it blocked in.
    stacks: usize,
    /// Blocked intervals whose stack could not be taken.
    missing_stacks: u64,
    /// Time preempted, waiting for a CPU; not in `total_ns`.
    runnable_ns: u64,
    /// How many times a thread was preempted.
    runnable_intervals: u64,
    /// The folded stacks' file; null when not written.
    folded: Option<&'a Path>,
    /// The flamegraph's file; null when not written.
    svg: Option<&'a Path>,
}

/// Time sampled on the CPU.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct OnCpuJson<'a> {
    /// How many samples.
    samples: u64,
    /// Time on the CPU the samples stand for.
    total_ns: u64,
    /// The folded stacks' file; null when not written.
    folded: Option<&'a Path>,
    /// The flamegraph's file; null when not written.
    svg: Option<&'a Path>,
}

/// Wall time, on and off the CPU.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct WallClockJson<'a> {
    /// Wall time on the CPU, blocked and runnable.
    total_ns: u64,
    /// How many threads.
    threads: usize,
    /// The folded stacks' file; null when not written.
    folded: Option<&'a Path>,
    /// The flamegraph's file; null when not written.
    svg: Option<&'a Path>,
    /// The pprof profile's file; null when not written.
    pprof: Option<&'a Path>,
    /// The speedscope profile's file; null when not written.
    speedscope: Option<&'a Path>,
    /// Wall time in stacks with an unnamed frame.
    unnamed_ns: u64,
    /// Wall time in stacks cut short.
    truncated_ns: u64,
    /// How to get names for the runtime at hand when more than a tenth of the wall time
    /// is unnamed; else null.
    unnamed_hint: Option<&'a str>,
}

/// A thread's wall time.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct ThreadJson<'a> {
    /// The thread's ID.
    tid: u32,
    /// Its process's PID.
    pid: u32,
    /// Its name (`comm`) as last seen; null when it was never seen.
    name: Option<&'a str>,
    /// Time on the CPU.
    oncpu_ns: u64,
    /// Time blocked.
    blocked_ns: u64,
    /// Time preempted, waiting for a CPU.
    runnable_ns: u64,
    /// For a thread that ran Python code, its time in Python's terms; else null.
    python: Option<PythonJson>,
}

/// A Python thread's wall time in Python's terms.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct PythonJson {
    /// Running Python code, holding the GIL.
    running_ns: u64,
    /// Waiting for the GIL.
    gil_ns: u64,
    /// Collecting garbage.
    gc_ns: u64,
    /// Blocked.
    blocked_ns: u64,
    /// Preempted, waiting for a CPU.
    runnable_ns: u64,
}

/// What the DWARF unwinder did.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct UnwindJson {
    /// `dwarf`.
    method: &'static str,
    /// On-CPU samples unwound.
    samples: u64,
    /// Off-CPU stacks unwound.
    offcpu_snapshots: u64,
    /// Frames found.
    frames: u64,
    /// Of those, frames found by frame pointers.
    frame_pointer_frames: u64,
    /// The deepest stack.
    max_depth: u64,
}

/// The tasks of a runtime's task probes.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct TasksJson<'a> {
    /// How many tasks.
    count: usize,
    /// The folded stacks' file; null when not written.
    folded: Option<&'a Path>,
    /// The flamegraph's file; null when not written.
    svg: Option<&'a Path>,
    /// Each task, the longest parked first.
    list: Vec<TaskJson<'a>>,
}

/// A task's wall time.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct TaskJson<'a> {
    /// The task's ID, in decimal.
    task: u64,
    /// Its process's PID.
    pid: u32,
    /// Its frame in `tasks.svg`.
    name: &'a str,
    /// What the runtime called it, or null.
    given_name: Option<&'a str>,
    /// Time from each run to the next pause.
    running_ns: u64,
    /// The part of `running_ns` on the CPU.
    oncpu_ns: u64,
    /// On-CPU samples.
    oncpu_samples: u64,
    /// The part of `running_ns` that blocked its thread.
    blocked_ns: u64,
    /// How many times it blocked its thread.
    blocked_intervals: u64,
    /// The part of `running_ns` preempted, waiting for a CPU.
    runnable_ns: u64,
    /// Time parked.
    parked_ns: u64,
    /// How many runs.
    runs: u64,
    /// How many parks.
    parks: u64,
    /// The longest run (for tokio: its longest poll).
    longest_run_ns: u64,
    /// The longest park.
    longest_park_ns: u64,
    /// Where it blocked its thread longest, or null.
    longest_block: Option<LongestBlockJson<'a>>,
}

/// Where a task blocked its thread longest.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct LongestBlockJson<'a> {
    /// The stack, root first.
    stack: &'a [String],
    /// For how long.
    ns: u64,
}

/// The timeline file.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct TimelineJson<'a> {
    /// Its path.
    path: &'a Path,
    /// Intervals written.
    intervals: usize,
    /// Intervals lost to a full ring buffer.
    lost: u64,
}

/// Everything the eBPF side could not record.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct LostJson {
    /// Events lost.
    events_lost: u64,
    /// Entries a full map could not take.
    map_full: u64,
    /// Stacks that could not be stored: `stack_collisions` and `stack_map_full`.
    stack_errors: u64,
    /// Stacks whose slot in the stack map, chosen by their hash, held another stack;
    /// `--stack-map-size` makes them rarer.
    stack_collisions: u64,
    /// Stacks the full stack map could not take; `--stack-map-size` makes them rarer.
    stack_map_full: u64,
    /// End probes without their begin on that thread.
    unmatched_ends: u64,
    /// Probe arguments that could not be read.
    arg_read_errors: u64,
    /// Each program the kernel skipped.
    program_misses: Vec<ProgramMissesJson>,
    /// Off-CPU intervals whose end the scheduler tracepoint did not show, closed at the
    /// thread's next switch out or its death from the CPU time it had had since. They
    /// are under their user stack and the kernel frame `[kernel stack missed]_[k]`: where
    /// the thread blocked in the kernel is no longer on its stack by then. bpftrace's
    /// `sched_switch` misses the same returns.
    switch_ins_recovered: u64,
    /// Stacks walked with frame pointers because the stack-copy ring was full
    /// (`--unwind-buffer`).
    unwind_ring_full: u64,
    /// Off-CPU stacks that took the snapshot their thread had just sent from the same
    /// place (instruction, stack and frame pointers), before user space had unwound it,
    /// because the stack-copy ring was half full. They are reused, not lost: the same
    /// frames, but for a caller chain that differs at the same stack depth.
    snapshots_reused_unchecked: u64,
}

/// A program the kernel skipped.
#[derive(Serialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
struct ProgramMissesJson {
    /// The eBPF program.
    program: &'static str,
    /// Runs the kernel skipped because the program was already running on that CPU.
    runs: u64,
}

/// How a latency is measured, in the JSON.
fn mechanism_name(mechanism: Mechanism) -> &'static str {
    match mechanism {
        Mechanism::Usdt => "usdt",
        Mechanism::FunctionProbes => "function probes",
    }
}

fn folded(files: Option<&ViewFiles>) -> Option<&Path> {
    files.map(|f| f.folded.as_path())
}

fn svg(files: Option<&ViewFiles>) -> Option<&Path> {
    files.map(|f| f.svg.as_path())
}

impl LatencyReport {
    fn classes_json(&self) -> Option<ClassesJson<'_>> {
        let class = self.def.class.as_ref()?;
        let classes = self.by_class.iter().map(|(label, stats)| {
            let totals = ClassJson {
                count: stats.count,
                total_ns: stats.total_ns,
                max_ns: stats.max_ns,
            };
            (label.as_str(), totals)
        });
        Some(ClassesJson {
            by: class.what,
            classes: classes.collect(),
        })
    }

    fn latency_json(&self) -> LatencyJson<'_> {
        LatencyJson {
            summary: HistogramSummary::of(&self.hist),
            begin: self.def.begin.to_string(),
            end: self.def.end.to_string(),
            runtime: self.def.runtime,
            mechanism: mechanism_name(self.def.mechanism),
            classes: self.classes_json(),
            never_found: &self.never_found,
            per_process: self.per_process.iter().map(process_latency_json).collect(),
        }
    }
}

fn process_latency_json(p: &ProcessLatency) -> ProcessLatencyJson<'_> {
    ProcessLatencyJson {
        pid: p.pid,
        name: &p.name,
        count: p.stats.count,
        total_ns: p.stats.total_ns,
        min_ns: p.stats.min_ns,
        max_ns: p.stats.max_ns,
    }
}

fn tasks_json(t: &TaskReport) -> TasksJson<'_> {
    let list = t.profile.tasks.iter().map(|task| TaskJson {
        task: task.task,
        pid: task.tgid,
        name: &task.name,
        given_name: task.given_name.as_deref(),
        running_ns: task.running_ns,
        oncpu_ns: task.oncpu_ns(),
        oncpu_samples: task.wall.oncpu_samples,
        blocked_ns: task.wall.blocked_ns,
        blocked_intervals: task.wall.blocked_intervals,
        runnable_ns: task.wall.runnable_ns,
        parked_ns: task.parked_ns,
        runs: task.runs,
        parks: task.parks,
        longest_run_ns: task.longest_run_ns,
        longest_park_ns: task.longest_park_ns,
        longest_block: task
            .wall
            .longest_block
            .as_ref()
            .map(|(stack, ns)| LongestBlockJson { stack, ns: *ns }),
    });
    TasksJson {
        count: t.profile.tasks.len(),
        folded: folded(t.files.as_ref()),
        svg: svg(t.files.as_ref()),
        list: list.collect(),
    }
}

impl AttachReport {
    /// The GC the `gc` block describes: one runtime's, the one with the most
    /// collections when a process hosts two.
    fn gc_pause(&self) -> Option<&LatencyReport> {
        self.gc_pauses()
            .max_by_key(|l| (l.hist.count(), std::cmp::Reverse(l.def.runtime)))
    }

    /// The key of latency `l` in the JSON: its name, with its runtime when another
    /// runtime's latency has the same name.
    fn latency_key(&self, l: &LatencyReport) -> String {
        let same = self
            .latencies
            .iter()
            .filter(|other| other.def.name == l.def.name)
            .count();
        match (same, l.def.runtime) {
            (2.., Some(runtime)) => format!("{}:{runtime}", l.def.name),
            _ => l.def.name.clone(),
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        serde_json::to_value(self.document()).expect("the report's JSON has string keys only")
    }

    fn document(&self) -> AttachJson<'_> {
        AttachJson {
            pid: self.pid,
            process: &self.process_name,
            processes: self
                .processes
                .iter()
                .map(|p| ProcessJson {
                    pid: p.pid,
                    name: &p.name,
                    namespace_pid: p.namespace_pid,
                })
                .collect(),
            processes_folded: &self.processes_folded,
            stopped_by: self.stopped_by.to_string(),
            duration_ns: self.elapsed_ns,
            probes: self
                .probes
                .iter()
                .map(|p| ProbeJson {
                    probe: p.info.specifier(),
                    sites: p.info.site_count,
                    hits: p.hits.count,
                    first_hit_monotonic_ns: p.hits.first_ns,
                })
                .collect(),
            latencies: self
                .latencies
                .iter()
                .map(|l| (self.latency_key(l), l.latency_json()))
                .collect(),
            gc: self.gc_pause().map(|gc| self.gc_json(gc)),
            gc_by_runtime: self.gc_pauses().map(|gc| self.gc_json(gc)).collect(),
            offcpu: OffCpuJson {
                total_ns: self.offcpu.total_ns,
                intervals: self.offcpu.intervals,
                stacks: self.offcpu.stacks,
                missing_stacks: self.offcpu.missing_stacks,
                runnable_ns: self.wall.runnable_ns,
                runnable_intervals: self.wall.runnable_intervals,
                folded: folded(self.offcpu_files.as_ref()),
                svg: svg(self.offcpu_files.as_ref()),
            },
            oncpu: OnCpuJson {
                samples: self.wall.oncpu_samples,
                total_ns: self.wall.oncpu_ns,
                folded: folded(self.files.oncpu.as_ref()),
                svg: svg(self.files.oncpu.as_ref()),
            },
            wallclock: self.wallclock_json(),
            threads: self
                .wall
                .per_thread
                .iter()
                .map(|t| ThreadJson {
                    tid: t.tid,
                    pid: t.tgid,
                    name: t.name.as_deref(),
                    oncpu_ns: t.oncpu_ns,
                    blocked_ns: t.blocked_ns,
                    runnable_ns: t.runnable_ns,
                    python: t.python.as_ref().map(|p| PythonJson {
                        running_ns: p.running_ns,
                        gil_ns: p.gil_ns,
                        gc_ns: p.gc_ns,
                        blocked_ns: p.blocked_ns,
                        runnable_ns: p.runnable_ns,
                    }),
                })
                .collect(),
            unwind: self.unwind_stats.as_ref().map(|u| UnwindJson {
                method: "dwarf",
                samples: u.samples,
                offcpu_snapshots: u.offcpu_snapshots,
                frames: u.frames,
                frame_pointer_frames: u.frame_pointer_frames,
                max_depth: u.max_depth,
            }),
            tasks: self.tasks.as_ref().map(tasks_json),
            timeline: self.timeline.as_ref().map(|t| TimelineJson {
                path: &t.path,
                intervals: t.intervals,
                lost: t.lost,
            }),
            lost: self.losses_json(),
        }
    }

    /// One runtime's GC pauses, for the `gc` and `gc_by_runtime` blocks.
    fn gc_json<'a>(&self, gc: &'a LatencyReport) -> GcJson<'a> {
        GcJson {
            runtime: gc.def.runtime,
            mechanism: mechanism_name(gc.def.mechanism),
            count: gc.hist.count(),
            total_pause_ns: gc.hist.total_ns(),
            wall_share: gc.hist.total_ns() as f64 / self.elapsed_ns.max(1) as f64,
            classes: gc.classes_json(),
        }
    }

    fn wallclock_json(&self) -> WallClockJson<'_> {
        WallClockJson {
            total_ns: self.wall.oncpu_ns + self.wall.offcpu_ns + self.wall.runnable_ns,
            threads: self.wall.threads,
            folded: folded(self.files.wall.as_ref()),
            svg: svg(self.files.wall.as_ref()),
            pprof: self.files.pprof.as_deref(),
            speedscope: self.files.speedscope.as_deref(),
            unnamed_ns: self.wall.unnamed_ns,
            truncated_ns: self.wall.truncated_ns,
            unnamed_hint: self.unnamed.as_deref(),
        }
    }

    fn losses_json(&self) -> LostJson {
        let l = &self.losses;
        LostJson {
            events_lost: l.events_lost,
            map_full: l.map_full,
            stack_errors: l.stacks.errors,
            stack_collisions: l.stacks.collisions,
            stack_map_full: l.stacks.map_full,
            unmatched_ends: l.unmatched_ends,
            arg_read_errors: l.arg_read_errors,
            program_misses: l
                .program_misses
                .iter()
                .map(|&(program, runs)| ProgramMissesJson { program, runs })
                .collect(),
            switch_ins_recovered: l.switch_ins_missed,
            unwind_ring_full: l.unwind_ring_full,
            snapshots_reused_unchecked: l.snapshots_reused_unchecked,
        }
    }
}
