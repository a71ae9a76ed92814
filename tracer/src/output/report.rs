//! What `tracer attach` found, printed as text (bpftrace-style histograms) or as one JSON
//! document with every figure.

use std::{fmt::Write as _, path::Path};

use serde_json::{Value, json};
use tracer_common::LatencyStats;

use crate::{
    output::render::{
        ViewFiles,
        hist::{MICROSECONDS, format_ns, render_latency, summary_json},
        views::ProfileFiles,
    },
    probe::plan::ProbeInfo,
    probe::runtimes::{LatencyDef, Mechanism},
    profile::histogram::LatencyHistogram,
    profile::tasks::TaskProfile,
    profile::wallclock::{
        OFF_CPU_FRAME, RUNNABLE_FRAME, WallClockProfile, python_thread_table, thread_table,
        truncated_line,
    },
    stack::unwind::UnwindStats,
    system::stop::StopReason,
    system::text::escape_text,
};

/// What the off-CPU profile holds and what could not be recorded.
#[derive(Debug, Default)]
pub struct OffCpuProfile {
    /// Distinct stacks.
    pub stacks: usize,
    pub total_ns: u64,
    pub intervals: u64,
    /// Intervals whose user or kernel stack could not be captured.
    pub missing_stacks: u64,
}

/// Runtime tasks: the profile and where its flamegraph went (`None`: not written).
pub struct TaskReport {
    pub profile: TaskProfile,
    pub files: Option<ViewFiles>,
}

/// How many tasks the text report names as having blocked their threads.
const BLOCKERS_SHOWN: usize = 5;

/// A task's name for the table, without the `task ` its frame starts with.
fn short_task_name(task: &crate::profile::tasks::TaskSummary) -> &str {
    task.name.strip_prefix("task ").unwrap_or(&task.name)
}

/// Where a task blocked, for one line: the kernel function it slept in, then its user
/// frames innermost first up to the first of the program's own (a Rust frame outside the
/// standard library), at most a few: `hrtimer_nanosleep_[k] <- std::thread::sleep <-
/// app::handler`.
fn blocking_place(frames: &[String]) -> String {
    const SHOWN: usize = 6;
    let library = |frame: &str| {
        let frame = frame.trim_start_matches('<');
        ["std::", "core::", "alloc::"]
            .iter()
            .any(|prefix| frame.starts_with(prefix))
            || !frame.contains("::")
    };
    let kernel = frames
        .iter()
        .rev()
        .find(|f| f.ends_with(crate::stack::naming::KERNEL_SUFFIX));
    let mut place: Vec<&str> = kernel.into_iter().map(String::as_str).collect();
    for frame in frames
        .iter()
        .rev()
        .filter(|f| !f.ends_with(crate::stack::naming::KERNEL_SUFFIX))
        .take(SHOWN)
    {
        place.push(frame);
        if !library(frame) {
            break;
        }
    }
    place.join(" <- ")
}

/// How many tasks the text report lists.
const TASKS_SHOWN: usize = 10;

/// How many threads the text report lists.
pub const THREADS_SHOWN: usize = 10;

pub struct ProbeReport {
    pub info: ProbeInfo,
    pub hits: ProbeHits,
}

/// A probe's hits, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProbeHits {
    pub count: u64,
    /// When it first fired (CLOCK_MONOTONIC ns); `None` when it never did.
    pub first_ns: Option<u64>,
}

pub struct LatencyReport {
    pub def: LatencyDef,
    pub hist: LatencyHistogram,
    /// The same latency split by process.
    pub per_process: Vec<ProcessLatency>,
    /// Split by class (a collection's generation), labelled; empty for a latency without
    /// classes.
    pub by_class: Vec<(String, LatencyStats)>,
    /// Its probes no target ever had (a `--latency` pair measured nothing then).
    pub never_found: Vec<String>,
}

impl LatencyReport {
    /// What a reader needs to know of where it comes from: `CPython, from function
    /// probes: no USDT in this build`.
    fn origin(&self) -> Option<String> {
        let function = self.def.mechanism == Mechanism::FunctionProbes;
        match (self.def.runtime, function) {
            (Some(runtime), true) => Some(format!(
                "{runtime}, from function probes: no USDT in this build"
            )),
            (Some(runtime), false) => Some(runtime.to_string()),
            (None, _) => None,
        }
    }

    /// `gen0 37 (5.00 ms), gen2 1 (3.10 ms)`.
    fn classes_line(&self) -> Option<String> {
        if self.by_class.is_empty() {
            return None;
        }
        Some(
            self.by_class
                .iter()
                .map(|(label, stats)| {
                    format!("{label} {} ({})", stats.count, format_ns(stats.total_ns))
                })
                .collect::<Vec<_>>()
                .join(", "),
        )
    }

    fn classes_json(&self) -> Value {
        match &self.def.class {
            None => Value::Null,
            Some(class) => {
                let mut out = serde_json::Map::new();
                out.insert("by".into(), json!(class.what));
                for (label, stats) in &self.by_class {
                    out.insert(
                        label.clone(),
                        json!({"count": stats.count, "total_ns": stats.total_ns, "max_ns": stats.max_ns}),
                    );
                }
                Value::Object(out)
            }
        }
    }
}

/// A process traced: its PID (as the tracer sees it), name, and its PID in its own PID
/// namespace when that is below the tracer's (a container's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracedProcess {
    pub pid: u32,
    pub name: String,
    pub namespace_pid: Option<u32>,
}

/// One latency's totals in one process.
#[derive(Debug, Clone)]
pub struct ProcessLatency {
    pub pid: u32,
    pub name: String,
    pub stats: LatencyStats,
}

/// How many processes the text report lists per latency.
const PROCESSES_SHOWN: usize = 10;

/// Everything the eBPF side could not record, reported rather than hidden.
#[derive(Debug, Default)]
pub struct Losses {
    pub events_lost: u64,
    pub map_full: u64,
    pub stack_errors: u64,
    pub unmatched_ends: u64,
    pub arg_read_errors: u64,
    /// Runs of a program the kernel skipped (it was already running on that CPU): events
    /// never seen, with the program's name.
    pub program_misses: Vec<(&'static str, u64)>,
    /// Off-CPU intervals whose end went unseen, closed later from the thread's CPU time
    /// (recovered, not lost).
    pub switch_ins_missed: u64,
}

pub struct AttachReport {
    /// The one process traced (or the first of a set).
    pub pid: u32,
    /// Its name, or what the set is (`every process running /usr/bin/x`).
    pub process_name: String,
    /// Every process traced.
    pub processes: Vec<TracedProcess>,
    pub stopped_by: StopReason,
    pub elapsed_ns: u64,
    pub probes: Vec<ProbeReport>,
    pub latencies: Vec<LatencyReport>,
    pub offcpu: OffCpuProfile,
    /// The off-CPU flame graph's files; `None` when they could not be written.
    pub offcpu_files: Option<ViewFiles>,
    /// The whole wall-clock profile (on and off CPU) and its files.
    pub wall: WallClockProfile,
    pub files: ProfileFiles,
    /// With `--unwind dwarf`: how the user stacks were unwound.
    pub unwind_stats: Option<UnwindStats>,
    /// How to get names for the code that could not be named, when much could not.
    pub unnamed: Option<String>,
    pub tasks: Option<TaskReport>,
    /// With `--timeline`: the file and how many intervals it holds (`None` if it could
    /// not be written).
    pub timeline: Option<TimelineReport>,
    pub losses: Losses,
}

/// The timeline written (`attach --timeline`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineReport {
    pub path: std::path::PathBuf,
    pub intervals: usize,
    /// Intervals the full ring buffer lost.
    pub lost: u64,
}

/// How a latency is measured, in the JSON.
fn mechanism_name(mechanism: Mechanism) -> &'static str {
    match mechanism {
        Mechanism::Usdt => "usdt",
        Mechanism::FunctionProbes => "function probes",
    }
}

/// The processes with the most time in one latency: PID, name, count, mean, max, total.
fn process_latency_table(per_process: &[ProcessLatency]) -> String {
    let mut rows: Vec<&ProcessLatency> = per_process.iter().collect();
    rows.sort_by_key(|p| (std::cmp::Reverse(p.stats.total_ns), p.pid));
    let mut out = format!(
        "By process ({} processes; the {} with the most time):\n{:>8} {:<16} {:>8} {:>10} {:>10} {:>10}\n",
        rows.len(),
        PROCESSES_SHOWN.min(rows.len()),
        "PID",
        "NAME",
        "COUNT",
        "MEAN",
        "MAX",
        "TOTAL"
    );
    for p in rows.iter().take(PROCESSES_SHOWN) {
        let _ = writeln!(
            out,
            "{:>8} {:<16} {:>8} {:>10} {:>10} {:>10}",
            p.pid,
            escape_text(&p.name),
            p.stats.count,
            format_ns(p.stats.total_ns / p.stats.count.max(1)),
            format_ns(p.stats.max_ns),
            format_ns(p.stats.total_ns)
        );
    }
    out
}

impl AttachReport {
    /// Every runtime's GC pauses.
    fn gc_pauses(&self) -> impl Iterator<Item = &LatencyReport> {
        self.latencies.iter().filter(|l| l.def.name == "gc_pause")
    }

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

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let secs = self.elapsed_ns as f64 / 1e9;
        match self.processes.as_slice() {
            [one] if one.pid == self.pid => {
                let _ = writeln!(
                    out,
                    "Traced process {} ({}{}) for {secs:.2} s; stopped: {}.",
                    self.pid,
                    escape_text(&self.process_name),
                    match one.namespace_pid {
                        Some(inner) => format!("; pid {inner} in its PID namespace"),
                        None => String::new(),
                    },
                    self.stopped_by
                );
            }
            processes => {
                let _ = writeln!(
                    out,
                    "Traced {}: {} processes, for {secs:.2} s; stopped: {}.",
                    escape_text(&self.process_name),
                    processes.len(),
                    self.stopped_by
                );
            }
        }
        // One runtime measured by its own probes keeps the plain `GC:` line scripts grep;
        // the runtime is named where there are two, or where its functions stand in.
        let several = self.gc_pauses().count() > 1;
        for gc in self.gc_pauses() {
            let share = gc.hist.total_ns() as f64 / self.elapsed_ns.max(1) as f64 * 100.0;
            let named = several || gc.def.mechanism == Mechanism::FunctionProbes;
            let _ = writeln!(
                out,
                "GC{}: {} collections, {} paused in all ({share:.1}% of wall time){}.",
                match gc.origin().filter(|_| named) {
                    Some(origin) => format!(" ({origin})"),
                    None => String::new(),
                },
                gc.hist.count(),
                format_ns(gc.hist.total_ns()),
                match gc.classes_line() {
                    Some(line) => format!("; {line}"),
                    None => String::new(),
                }
            );
        }
        for latency in &self.latencies {
            if !latency.never_found.is_empty() {
                let _ = writeln!(
                    out,
                    "\n@{}_us: 0 (no target had {})",
                    escape_text(&latency.def.name),
                    escape_text(&latency.never_found.join(" or "))
                );
                continue;
            }
            if latency.hist.is_empty() {
                continue;
            }
            let _ = writeln!(out);
            let title = match latency.def.runtime {
                Some(runtime)
                    if self
                        .latencies
                        .iter()
                        .filter(|l| l.def.name == latency.def.name)
                        .count()
                        > 1 =>
                {
                    format!("{}_us ({runtime})", latency.def.name)
                }
                _ => format!("{}_us", latency.def.name),
            };
            out.push_str(&render_latency(
                &escape_text(&title),
                &latency.hist,
                MICROSECONDS,
            ));
            if latency.per_process.len() > 1 {
                out.push_str(&process_latency_table(&latency.per_process));
            }
        }
        let _ = writeln!(
            out,
            "\nOff-CPU: {} blocked in {} intervals; {}.",
            format_ns(self.offcpu.total_ns),
            self.offcpu.intervals,
            match &self.offcpu_files {
                Some(files) => format!(
                    "flamegraph {} (folded stacks {})",
                    files.svg.display(),
                    files.folded.display()
                ),
                None => "flamegraph not written (see the error below)".into(),
            }
        );
        let _ = writeln!(
            out,
            "On-CPU: {} samples, {}; flamegraph {}.",
            self.wall.oncpu_samples,
            format_ns(self.wall.oncpu_ns),
            shown(self.files.oncpu.as_ref().map(|f| f.svg.as_path())),
        );
        let _ = writeln!(
            out,
            "Runnable: {} preempted and waiting for a CPU, in {} intervals.",
            format_ns(self.wall.runnable_ns),
            self.wall.runnable_intervals,
        );
        let _ = writeln!(
            out,
            "Wall-clock: {} on and off CPU; flamegraph {} (blocked time under {OFF_CPU_FRAME} \
             and preempted time under {RUNNABLE_FRAME} leaf frames), pprof {}, speedscope {}.",
            format_ns(self.wall.oncpu_ns + self.wall.offcpu_ns + self.wall.runnable_ns),
            shown(self.files.wall.as_ref().map(|f| f.svg.as_path())),
            shown(self.files.pprof.as_deref()),
            shown(self.files.speedscope.as_deref()),
        );
        if let Some(line) = &self.unnamed {
            let _ = writeln!(out, "{line}");
        }
        if let Some(line) = truncated_line(&self.wall) {
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(
            out,
            "\nThreads: {}; the {} busiest (most time on a CPU or waiting for one):",
            self.wall.per_thread.len(),
            THREADS_SHOWN.min(self.wall.per_thread.len())
        );
        out.push_str(&thread_table(&self.wall, THREADS_SHOWN));
        if let Some(table) = python_thread_table(&self.wall, THREADS_SHOWN) {
            out.push('\n');
            out.push_str(&table);
        }
        if let Some(tasks) = &self.tasks {
            let _ = writeln!(
                out,
                "\nTasks: {} seen; the {} that waited longest ({}):",
                tasks.profile.tasks.len(),
                TASKS_SHOWN.min(tasks.profile.tasks.len()),
                match &tasks.files {
                    Some(files) => format!("flamegraph {}", files.svg.display()),
                    None => "flamegraph not written".into(),
                }
            );
            // Running: from a run probe to the next pause (LONGEST: the longest such run, a
            // tokio task's longest poll); of that, on CPU, blocked in the kernel (the task
            // blocked its thread) and runnable.
            let _ = writeln!(
                out,
                "{:>20} {:<32} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7} {:>7}",
                "TASK",
                "NAME",
                "RUNNING",
                "LONGEST",
                "ON-CPU",
                "BLOCKED",
                "RUNNABLE",
                "PARKED",
                "PARKS",
                "RUNS"
            );
            for task in tasks.profile.tasks.iter().take(TASKS_SHOWN) {
                let _ = writeln!(
                    out,
                    "{:>20} {:<32} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7} {:>7}",
                    task.task,
                    escape_text(short_task_name(task)),
                    format_ns(task.running_ns),
                    format_ns(task.longest_run_ns),
                    format_ns(task.oncpu_ns()),
                    format_ns(task.wall.blocked_ns),
                    format_ns(task.wall.runnable_ns),
                    format_ns(task.parked_ns),
                    task.parks,
                    task.runs
                );
            }
            let mut blockers: Vec<_> = tasks
                .profile
                .tasks
                .iter()
                .filter(|t| t.wall.blocked_ns > 0)
                .collect();
            blockers.sort_by_key(|t| (std::cmp::Reverse(t.wall.blocked_ns), t.task));
            if !blockers.is_empty() {
                let _ = writeln!(
                    out,
                    "\nTasks that blocked their thread longest (in the kernel while running):"
                );
                for task in blockers.iter().take(BLOCKERS_SHOWN) {
                    let _ = writeln!(
                        out,
                        "  {} blocked its thread {} in {} intervals{}",
                        escape_text(&task.name),
                        format_ns(task.wall.blocked_ns),
                        task.wall.blocked_intervals,
                        match &task.wall.longest_block {
                            Some((place, ns)) => format!(
                                ", {} of it in {}",
                                format_ns(*ns),
                                escape_text(&blocking_place(place))
                            ),
                            None => String::new(),
                        }
                    );
                }
            }
        }
        if let Some(timeline) = &self.timeline {
            let _ = writeln!(
                out,
                "\nTimeline: {} intervals in {} (Chrome trace-event JSON: Perfetto, speedscope){}.",
                timeline.intervals,
                timeline.path.display(),
                match timeline.lost {
                    0 => String::new(),
                    lost => format!("; {lost} lost to a full ring buffer"),
                }
            );
        }
        // What went unrecorded is a paragraph of its own, after the last table.
        let l = &self.losses;
        let mut footnotes = String::new();
        if l.events_lost
            + l.map_full
            + l.stack_errors
            + l.arg_read_errors
            + self.offcpu.missing_stacks
            > 0
        {
            let _ = writeln!(
                footnotes,
                "Not recorded: {} events lost, {} map-full drops, {} stack capture errors, {} argument read errors.",
                l.events_lost, l.map_full, l.stack_errors, l.arg_read_errors
            );
        }
        footnotes += &program_misses_line(&l.program_misses);
        if !footnotes.is_empty() {
            out.push('\n');
            out += &footnotes;
        }
        out
    }

    pub fn to_json(&self) -> Value {
        let latencies: serde_json::Map<String, Value> = self
            .latencies
            .iter()
            .map(|l| {
                let mut summary = summary_json(&l.hist);
                summary["begin"] = json!(l.def.begin.to_string());
                summary["end"] = json!(l.def.end.to_string());
                summary["runtime"] = json!(l.def.runtime);
                summary["mechanism"] = json!(mechanism_name(l.def.mechanism));
                summary["classes"] = l.classes_json();
                summary["never_found"] = json!(l.never_found);
                summary["per_process"] = l
                    .per_process
                    .iter()
                    .map(|p| {
                        json!({
                            "pid": p.pid,
                            "name": p.name,
                            "count": p.stats.count,
                            "total_ns": p.stats.total_ns,
                            "min_ns": p.stats.min_ns,
                            "max_ns": p.stats.max_ns,
                        })
                    })
                    .collect();
                (self.latency_key(l), summary)
            })
            .collect();
        let gc_json = |gc: &LatencyReport| {
            json!({
                "runtime": gc.def.runtime,
                "mechanism": mechanism_name(gc.def.mechanism),
                "count": gc.hist.count(),
                "total_pause_ns": gc.hist.total_ns(),
                "wall_share": gc.hist.total_ns() as f64 / self.elapsed_ns.max(1) as f64,
                "classes": gc.classes_json(),
            })
        };
        json!({
            "pid": self.pid,
            "process": self.process_name,
            "processes": self.processes.iter().map(|p| json!({
                "pid": p.pid,
                "name": p.name,
                "namespace_pid": p.namespace_pid,
            })).collect::<Vec<_>>(),
            "stopped_by": self.stopped_by.to_string(),
            "duration_ns": self.elapsed_ns,
            "probes": self.probes.iter().map(|p| json!({
                "probe": p.info.specifier(),
                "sites": p.info.site_count,
                "hits": p.hits.count,
                "first_hit_monotonic_ns": p.hits.first_ns,
            })).collect::<Vec<_>>(),
            "latencies": latencies,
            "gc": self.gc_pause().map(gc_json),
            "gc_by_runtime": self.gc_pauses().map(gc_json).collect::<Vec<_>>(),
            "offcpu": {
                "total_ns": self.offcpu.total_ns,
                "intervals": self.offcpu.intervals,
                "stacks": self.offcpu.stacks,
                "missing_stacks": self.offcpu.missing_stacks,
                "runnable_ns": self.wall.runnable_ns,
                "runnable_intervals": self.wall.runnable_intervals,
                "folded": self.offcpu_files.as_ref().map(|f| &f.folded),
                "svg": self.offcpu_files.as_ref().map(|f| &f.svg),
            },
            "oncpu": {
                "samples": self.wall.oncpu_samples,
                "total_ns": self.wall.oncpu_ns,
                "folded": self.files.oncpu.as_ref().map(|f| &f.folded),
                "svg": self.files.oncpu.as_ref().map(|f| &f.svg),
            },
            "wallclock": {
                "total_ns": self.wall.oncpu_ns + self.wall.offcpu_ns + self.wall.runnable_ns,
                "threads": self.wall.threads,
                "folded": self.files.wall.as_ref().map(|f| &f.folded),
                "svg": self.files.wall.as_ref().map(|f| &f.svg),
                "pprof": self.files.pprof,
                "speedscope": self.files.speedscope,
                "unnamed_ns": self.wall.unnamed_ns,
                "truncated_ns": self.wall.truncated_ns,
                "unnamed_hint": self.unnamed,
            },
            "threads": self.wall.per_thread.iter().map(|t| json!({
                "tid": t.tid,
                "pid": t.tgid,
                "name": t.name,
                "oncpu_ns": t.oncpu_ns,
                "blocked_ns": t.blocked_ns,
                "runnable_ns": t.runnable_ns,
                "python": t.python.as_ref().map(|p| json!({
                    "running_ns": p.running_ns,
                    "gil_ns": p.gil_ns,
                    "gc_ns": p.gc_ns,
                    "blocked_ns": p.blocked_ns,
                    "runnable_ns": p.runnable_ns,
                })),
            })).collect::<Vec<_>>(),
            "unwind": self.unwind_stats.as_ref().map(|u| json!({
                "method": "dwarf",
                "samples": u.samples,
                "offcpu_snapshots": u.offcpu_snapshots,
                "frames": u.frames,
                "frame_pointer_frames": u.frame_pointer_frames,
                "max_depth": u.max_depth,
            })),
            "tasks": self.tasks.as_ref().map(|t| json!({
                "count": t.profile.tasks.len(),
                "folded": t.files.as_ref().map(|f| &f.folded),
                "svg": t.files.as_ref().map(|f| &f.svg),
                "list": t.profile.tasks.iter().map(|task| json!({
                    "task": task.task,
                    "pid": task.tgid,
                    "name": task.name,
                    "given_name": task.given_name,
                    "running_ns": task.running_ns,
                    "oncpu_ns": task.oncpu_ns(),
                    "oncpu_samples": task.wall.oncpu_samples,
                    "blocked_ns": task.wall.blocked_ns,
                    "blocked_intervals": task.wall.blocked_intervals,
                    "runnable_ns": task.wall.runnable_ns,
                    "parked_ns": task.parked_ns,
                    "runs": task.runs,
                    "parks": task.parks,
                    "longest_run_ns": task.longest_run_ns,
                    "longest_park_ns": task.longest_park_ns,
                    "longest_block": task.wall.longest_block.as_ref().map(|(place, ns)| json!({
                        "stack": place,
                        "ns": ns,
                    })),
                })).collect::<Vec<_>>(),
            })),
            "timeline": self.timeline.as_ref().map(|t| json!({
                "path": t.path,
                "intervals": t.intervals,
                "lost": t.lost,
            })),
            "lost": {
                "events_lost": self.losses.events_lost,
                "map_full": self.losses.map_full,
                "stack_errors": self.losses.stack_errors,
                "unmatched_ends": self.losses.unmatched_ends,
                "arg_read_errors": self.losses.arg_read_errors,
                "program_misses": self.losses.program_misses.iter()
                    .map(|(program, runs)| json!({"program": program, "runs": runs}))
                    .collect::<Vec<_>>(),
                "switch_ins_recovered": self.losses.switch_ins_missed,
            },
        })
    }
}

/// What the report says of programs the kernel skipped: nothing when none was.
pub fn program_misses_line(misses: &[(&'static str, u64)]) -> String {
    if misses.is_empty() {
        return String::new();
    }
    let each: Vec<String> = misses
        .iter()
        .map(|(program, runs)| format!("{program} {runs} times"))
        .collect();
    format!(
        "Not seen: the kernel skipped programs already running on their CPU: {}.\n",
        each.join(", ")
    )
}

/// A written file's path, or what the summary says of one that could not be written.
pub fn shown(path: Option<&Path>) -> String {
    match path {
        Some(path) => path.display().to_string(),
        None => "(not written, see the error below)".into(),
    }
}

/// The summary `tracer profile` prints: what was profiled, the on-CPU, off-CPU,
/// runnable and wall-clock totals with their files, the busiest threads, and losses.
pub fn profile_summary(
    profile: &WallClockProfile,
    what: &str,
    frequency_hz: u64,
    elapsed_ns: u64,
    outputs: &ProfileFiles,
    stack_errors: u64,
    map_full: u64,
) -> String {
    let seconds = |ns: u64| ns as f64 / 1e9;
    let mut out = format!(
        "Wall-clock profile of {}: {:.1} s, {} thread{} in {} process{}.\n",
        escape_text(what),
        seconds(elapsed_ns),
        profile.threads,
        if profile.threads == 1 { "" } else { "s" },
        profile.processes,
        if profile.processes == 1 { "" } else { "es" },
    );
    out += &format!(
        "On-CPU: {} samples at {frequency_hz} Hz, {:.3} s; flamegraph {}\n",
        profile.oncpu_samples,
        seconds(profile.oncpu_ns),
        shown(outputs.oncpu.as_ref().map(|f| f.svg.as_path()))
    );
    out += &format!(
        "Off-CPU: {:.3} s blocked in {} intervals; flamegraph {}\n",
        seconds(profile.offcpu_ns),
        profile.offcpu_intervals,
        shown(outputs.offcpu.as_ref().map(|f| f.svg.as_path()))
    );
    out += &format!(
        "Runnable: {:.3} s preempted and waiting for a CPU, in {} intervals (under \
         {RUNNABLE_FRAME} leaf frames in the wall-clock view)\n",
        seconds(profile.runnable_ns),
        profile.runnable_intervals,
    );
    out += &format!(
        "Wall-clock: {:.3} s on and off CPU; flamegraph {} (blocked time under {OFF_CPU_FRAME} \
         leaf frames), pprof {}, speedscope {}\n",
        seconds(profile.oncpu_ns + profile.offcpu_ns + profile.runnable_ns),
        shown(outputs.wall.as_ref().map(|f| f.svg.as_path())),
        shown(outputs.pprof.as_deref()),
        shown(outputs.speedscope.as_deref())
    );
    out += &format!(
        "Threads: {}; the {} busiest (most time on a CPU or waiting for one):\n",
        profile.per_thread.len(),
        THREADS_SHOWN.min(profile.per_thread.len())
    );
    if let Some(line) = truncated_line(profile) {
        out += &line;
        out.push('\n');
    }
    out += &thread_table(profile, THREADS_SHOWN);
    if let Some(table) = python_thread_table(profile, THREADS_SHOWN) {
        out += &table;
    }
    if stack_errors + map_full + profile.missing_stacks == 0 {
        out += "Nothing lost: every sample and interval was recorded with its stacks.\n";
    } else {
        out += &format!(
            "Lost: {stack_errors} stacks not captured (stack map full or collision, or a \
             fault; see --stack-map-size), {map_full} samples or intervals dropped (map \
             full; see --map-size); {} stack entries shown as [missing ... stack].\n",
            profile.missing_stacks
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of process 42 traced for 1 s, with nothing but `wall` and `tasks`.
    fn report_of(name: &str, wall: WallClockProfile, tasks: Option<TaskReport>) -> AttachReport {
        AttachReport {
            pid: 42,
            process_name: name.into(),
            processes: vec![TracedProcess {
                pid: 42,
                name: name.into(),
                namespace_pid: None,
            }],
            stopped_by: StopReason::DurationElapsed,
            elapsed_ns: 1_000_000_000,
            probes: Vec::new(),
            latencies: Vec::new(),
            offcpu: OffCpuProfile::default(),
            offcpu_files: None,
            wall,
            files: ProfileFiles::default(),
            unwind_stats: None,
            unnamed: None,
            tasks,
            timeline: None,
            losses: Losses::default(),
        }
    }

    /// Tasks of one task, 7, of process 42, with no time.
    fn one_task() -> TaskReport {
        TaskReport {
            profile: crate::profile::tasks::TaskProfile {
                tasks: vec![crate::profile::tasks::TaskSummary {
                    task: 7,
                    tgid: 42,
                    name: "task #7 on worker [43]".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            files: None,
        }
    }

    /// A process name is the target's to choose: control characters in it reach the
    /// terminal escaped in the text report, and as JSON escapes them in the JSON one.
    #[test]
    fn names_from_the_target_are_escaped_in_text() {
        let report = report_of(
            "evil\x1b[2J\nGC: 0 collections",
            WallClockProfile::default(),
            None,
        );
        let text = report.to_text();
        assert!(
            text.starts_with(
                "Traced process 42 (evil\\x1b[2J\\x0aGC: 0 collections) for 1.00 s; \
                 stopped: duration elapsed.\n"
            ),
            "{text}"
        );
        assert!(!text.contains('\x1b'), "{text}");
        let json = serde_json::to_string(&report.to_json()).unwrap();
        assert!(
            json.contains(r#""process":"evil\u001b[2J\nGC: 0 collections""#),
            "{json}"
        );
    }

    /// What went unrecorded follows the last table after a blank line: whoever reads the
    /// table's rows (the container smoke test) stops at the blank line, not at a row
    /// that is not a task.
    #[test]
    fn losses_are_a_paragraph_after_the_tables() {
        let mut report = report_of("gc-demo", WallClockProfile::default(), Some(one_task()));
        report.losses.stack_errors = 6;
        report.losses.program_misses = vec![("on_switch", 2)];
        let text = report.to_text();
        let tail: Vec<&str> = text.lines().rev().take(4).collect();
        assert!(tail[0].starts_with("Not seen: "), "{text}");
        assert!(tail[1].starts_with("Not recorded: "), "{text}");
        assert_eq!(tail[2], "", "{text}");
        assert!(tail[3].trim_start().starts_with("7 "), "{text}");
    }

    /// Tasks carry their names, every id is decimal, and the tasks that blocked their
    /// threads are named with where they blocked, innermost first.
    #[test]
    fn tasks_carry_their_names_and_where_they_blocked() {
        use crate::{
            profile::tasks::{TaskProfile, TaskSummary},
            profile::wallclock::TaskWallTime,
        };
        let task = |task, name: &str, blocked_ns| TaskSummary {
            task,
            tgid: 42,
            name: name.into(),
            running_ns: 5_000_000,
            wall: TaskWallTime {
                blocked_ns,
                blocked_intervals: 2,
                longest_block: Some((
                    vec![
                        "main".into(),
                        "app::handler".into(),
                        "std::thread::sleep".into(),
                        "do_syscall_64_[k]".into(),
                        "hrtimer_nanosleep_[k]".into(),
                    ],
                    blocked_ns,
                )),
                ..TaskWallTime::default()
            },
            ..Default::default()
        };
        let tasks = TaskReport {
            profile: TaskProfile {
                tasks: vec![
                    task(4711, "thread parker-0 [4711]", 0),
                    task(0x7f00_1234, "task src/api.rs:41:5 (#2130710068)", 3_000_000),
                ],
                ..Default::default()
            },
            files: None,
        };
        let report = report_of("java", WallClockProfile::default(), Some(tasks));
        let text = report.to_text();
        assert!(
            text.contains("                4711 thread parker-0 [4711] "),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "{:>20} src/api.rs:41:5 (#2130710068) ",
                0x7f00_1234u64
            )),
            "{text}"
        );
        assert!(!text.contains("0x7f"), "{text}");
        assert!(
            text.contains(
                "  task src/api.rs:41:5 (#2130710068) blocked its thread 3.00ms in 2 intervals, \
                 3.00ms of it in hrtimer_nanosleep_[k] <- std::thread::sleep <- app::handler\n"
            ),
            "{text}"
        );
        let json = report.to_json();
        assert_eq!(json["tasks"]["list"][0]["name"], "thread parker-0 [4711]");
        assert_eq!(json["tasks"]["list"][1]["blocked_ns"], 3_000_000);
        assert_eq!(json["tasks"]["list"][1]["oncpu_ns"], 2_000_000);
        assert_eq!(
            json["tasks"]["list"][1]["longest_block"]["stack"][4],
            "hrtimer_nanosleep_[k]"
        );
    }

    /// The text and JSON of a fixed report, byte for byte (tracer/tests/data; regenerate
    /// with TRACER_BLESS=1).
    #[test]
    fn report_text_and_json_match_the_golden_files() {
        let mut wall = WallClockProfile {
            oncpu_samples: 19,
            oncpu_ns: 192_000_000,
            offcpu_intervals: 119,
            offcpu_ns: 3_100_000_000,
            runnable_intervals: 58,
            runnable_ns: 168_000_000,
            threads: 2,
            processes: 1,
            ..Default::default()
        };
        for (tid, name, oncpu_ms, blocked_ms) in
            [(42, "gc-demo", 150, 2_900), (43, "worker", 42, 200)]
        {
            wall.per_thread.push(crate::profile::wallclock::ThreadTime {
                tgid: 42,
                tid,
                name: Some(name.into()),
                oncpu_ns: oncpu_ms * 1_000_000,
                blocked_ns: blocked_ms * 1_000_000,
                ..Default::default()
            });
        }
        let tasks = one_task();
        let report = report_of("gc-demo", wall, Some(tasks));
        crate::output::golden::assert_golden("attach-report.txt", &report.to_text());
        let json = serde_json::to_string_pretty(&report.to_json()).unwrap() + "\n";
        crate::output::golden::assert_golden("attach-report.json", &json);
    }

    /// The summary of a fixed profile, byte for byte (tracer/tests/data; regenerate with
    /// TRACER_BLESS=1). No file was written, so each is shown as not written.
    #[test]
    fn summary_matches_the_golden_file() {
        let mut profile = WallClockProfile {
            oncpu_samples: 99,
            oncpu_ns: 1_000_000_000,
            offcpu_intervals: 12,
            offcpu_ns: 2_500_000_000,
            runnable_intervals: 3,
            runnable_ns: 4_000_000,
            missing_stacks: 1,
            threads: 2,
            processes: 1,
            ..Default::default()
        };
        profile.per_thread = vec![
            crate::profile::wallclock::ThreadTime {
                tgid: 42,
                tid: 42,
                name: Some("main".into()),
                oncpu_ns: 900_000_000,
                blocked_ns: 100_000_000,
                ..Default::default()
            },
            crate::profile::wallclock::ThreadTime {
                tgid: 42,
                tid: 44,
                name: Some("io\x1b".into()),
                oncpu_ns: 100_000_000,
                blocked_ns: 2_400_000_000,
                runnable_ns: 4_000_000,
                python: Some(crate::profile::wallclock::PythonThreadTime {
                    running_ns: 80_000_000,
                    gil_ns: 300_000_000,
                    gc_ns: 20_000_000,
                    blocked_ns: 2_100_000_000,
                    runnable_ns: 4_000_000,
                }),
            },
        ];
        let text = profile_summary(
            &profile,
            "process 42 (demo)",
            99,
            3_000_000_000,
            &ProfileFiles::default(),
            2,
            0,
        );
        crate::output::golden::assert_golden("profile-summary.txt", &text);
    }
}
