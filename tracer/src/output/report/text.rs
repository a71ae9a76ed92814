//! The report of `tracer attach` as text, with bpftrace-style histograms.
//! Each section of the text is written by a step of its own.

use std::fmt::Write as _;

use crate::{
    output::render::hist::{MICROSECONDS, format_ns, render_latency},
    probe::runtimes::Mechanism,
    profile::dwarf_snapshots::reused_unchecked_line,
    profile::wallclock::{
        OFF_CPU_FRAME, RUNNABLE_FRAME, python_thread_table, thread_table, truncated_line,
    },
    system::text::{binary_size, escape_text},
};

use super::{
    lines::{THREADS_SHOWN, program_misses_line, shown},
    types::{AttachReport, LatencyReport, ProcessLatency, TaskReport},
};

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
}

/// How many processes the text report lists per latency.
const PROCESSES_SHOWN: usize = 10;

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

/// The tasks section: how many were seen and the table of those that waited longest.
fn write_task_table(tasks: &TaskReport, out: &mut String) {
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
}

/// The tasks that blocked their threads longest, each with where it blocked; nothing
/// when none did.
fn write_task_blockers(tasks: &TaskReport, out: &mut String) {
    let mut blockers: Vec<_> = tasks
        .profile
        .tasks
        .iter()
        .filter(|t| t.wall.blocked_ns > 0)
        .collect();
    blockers.sort_by_key(|t| (std::cmp::Reverse(t.wall.blocked_ns), t.task));
    if blockers.is_empty() {
        return;
    }
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

impl AttachReport {
    pub(crate) fn to_text(&self) -> String {
        let mut out = String::new();
        self.write_header(&mut out);
        self.write_gc_lines(&mut out);
        self.write_latencies(&mut out);
        self.write_profile_lines(&mut out);
        self.write_threads(&mut out);
        if let Some(tasks) = &self.tasks {
            write_task_table(tasks, &mut out);
            write_task_blockers(tasks, &mut out);
        }
        self.write_timeline(&mut out);
        // What went unrecorded is a paragraph of its own, after the last table.
        let footnotes = self.loss_footnotes();
        if !footnotes.is_empty() {
            out.push('\n');
            out += &footnotes;
        }
        out
    }

    /// The first line: what was traced, for how long, and what stopped it.
    fn write_header(&self, out: &mut String) {
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
                    processes.len() as u64 + self.processes_folded.values().sum::<u64>(),
                    self.stopped_by
                );
            }
        }
    }

    /// A `GC:` line for each runtime's GC pauses.
    fn write_gc_lines(&self, out: &mut String) {
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
    }

    /// Each latency's histogram, with its table by process when there are several; a
    /// line for a latency no target had.
    fn write_latencies(&self, out: &mut String) {
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
            out.push_str(&render_latency(
                &escape_text(&self.latency_title(latency)),
                &latency.hist,
                MICROSECONDS,
            ));
            if latency.per_process.len() > 1 {
                out.push_str(&process_latency_table(&latency.per_process));
            }
        }
    }

    /// A latency histogram's title: `gc_pause_us`, with its runtime when another
    /// runtime's latency has the same name.
    fn latency_title(&self, latency: &LatencyReport) -> String {
        match latency.def.runtime {
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
        }
    }

    /// The off-CPU, on-CPU, runnable and wall-clock totals with their files, and what
    /// could not be named or was cut short.
    fn write_profile_lines(&self, out: &mut String) {
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
    }

    /// The busiest threads, and their Python states when there are any.
    fn write_threads(&self, out: &mut String) {
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
    }

    /// Where the timeline went (`--timeline`); nothing without one.
    fn write_timeline(&self, out: &mut String) {
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
    }

    /// What went unrecorded, a line for each kind; empty when nothing was lost.
    fn loss_footnotes(&self) -> String {
        let l = &self.losses;
        let mut footnotes = String::new();
        if l.events_lost
            + l.map_full
            + l.stacks.errors
            + l.arg_read_errors
            + self.offcpu.missing_stacks
            > 0
        {
            let _ = writeln!(
                footnotes,
                "Not recorded: {} events lost, {} map-full drops, {} stack capture errors, {} argument read errors.{}",
                l.events_lost,
                l.map_full,
                l.stacks.errors,
                l.arg_read_errors,
                match l.stacks.explained() {
                    why if why.is_empty() => why,
                    why => format!(" {why}."),
                }
            );
        }
        if l.unwind_ring_full > 0 {
            let _ = writeln!(
                footnotes,
                "Walked with frame pointers instead of DWARF: {} stacks, the stack-copy buffer \
                 full (--unwind-buffer above its {} keeps them).",
                l.unwind_ring_full,
                binary_size(l.unwind_ring_bytes.into())
            );
        }
        if l.snapshots_reused_unchecked > 0 {
            let _ = writeln!(
                footnotes,
                "{}",
                reused_unchecked_line(l.snapshots_reused_unchecked, l.unwind_ring_bytes)
            );
        }
        footnotes += &program_misses_line(&l.program_misses);
        footnotes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        output::report::tests::{one_task, report_of},
        profile::wallclock::WallClockProfile,
    };

    /// What went unrecorded follows the last table after a blank line: whoever reads the
    /// table's rows (the container smoke test) stops at the blank line, not at a row
    /// that is not a task.
    use crate::output::report::StackLosses;

    #[test]
    fn losses_are_a_paragraph_after_the_tables() {
        let mut report: AttachReport =
            report_of("gc-demo", WallClockProfile::default(), Some(one_task()));
        report.losses.stacks = StackLosses {
            errors: 6,
            collisions: 5,
            map_full: 0,
            slots: 32768,
        };
        report.losses.program_misses = vec![("on_switch", 2)];
        let text = report.to_text();
        let tail: Vec<&str> = text.lines().rev().take(4).collect();
        assert!(tail[0].starts_with("Not seen: "), "{text}");
        assert!(tail[1].starts_with("Not recorded: "), "{text}");
        assert_eq!(tail[2], "", "{text}");
        assert!(tail[3].trim_start().starts_with("7 "), "{text}");
    }
}
