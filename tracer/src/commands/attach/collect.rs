//! What `attach` collected, read from the kernel and the sampler into its report, and
//! the report's files written.

use std::{collections::HashMap, path::Path};

use anyhow::{Context as _, Result};
use tracer_common::{LatencyProcessKey, LatencyStats, TaskKey, TaskTotal, counter, site_flags};

use crate::{
    cli::AttachConfig,
    kernel::Loader,
    output::render::{
        self,
        export::ExportInfo,
        flamegraph::{Palette, SvgOptions},
        timeline::{self, Timeline, TimelineNames},
        views::write_profile_files,
    },
    output::report::{
        AttachReport, LatencyReport, Losses, OffCpuProfile, ProbeHits, ProbeReport, ProcessLatency,
        StackLosses, TaskReport, TimelineReport, TracedProcess,
    },
    probe::plan::ProbePlan,
    probe::runtimes::{self, LatencyDef, ProbeRef},
    profile::histogram::LatencyHistogram,
    profile::retire::{RetiredLatencies, add_stats},
    profile::sampling::{Collected, WallClockSampler},
    profile::tasks,
    profile::wallclock,
    stack::processes::Processes,
    stack::symbolize::StackSymbolizer,
    system::stop::StopReason,
};

use super::Subject;

/// What a run collected, read from the kernel and the sampler, for [`collect`].
pub(super) struct Collection<'a> {
    pub loader: &'a Loader,
    pub plan: &'a ProbePlan,
    pub processes: &'a Processes,
    pub symbolizer: &'a mut StackSymbolizer,
    pub collected: Collected,
    pub tasks: Option<TaskInput>,
    pub timeline: Option<Timeline>,
    /// The latency totals of the processes let go, by program.
    pub retired_latencies: RetiredLatencies,
}

/// Builds the report of `target` (its processes `traced`) from what was collected, and
/// writes its files. The report names only the files that were written; the first error
/// writing one comes with it.
pub(super) fn collect(
    from: Collection<'_>,
    config: &AttachConfig,
    target: &Subject,
    traced: Vec<TracedProcess>,
    export: &ExportInfo<'_>,
    reason: StopReason,
) -> Result<(AttachReport, Option<anyhow::Error>)> {
    let Collection {
        loader,
        plan,
        processes,
        symbolizer,
        collected,
        tasks,
        timeline,
        retired_latencies,
    } = from;
    let name_of = |pid: u32| {
        traced
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| p.name.clone())
            .or_else(|| processes.get(pid).map(|p| p.name.clone()))
            .unwrap_or_else(|| "?".into())
    };
    let by_process = loader.latency_by_process()?;
    let latencies = latency_reports(loader, plan, &by_process, &retired_latencies, &name_of)?;
    let probes = probe_reports(loader, plan)?;

    // The report is printed even when a file cannot be written (and names only the files
    // that were); the error comes after.
    let what = match target.pid {
        Some(pid) => format!("{} (pid {pid})", target.name),
        None => target.name.clone(),
    };
    let Collected {
        profile: wall,
        unwind_stats,
    } = collected;
    let (files, mut output_error) = write_profile_files(&wall, &config.output_dir, &what, export);
    let unnamed = wallclock::unnamed_line(&wall, || jit_hint(&traced, processes));
    let profile = OffCpuProfile {
        stacks: wall.offcpu.len(),
        total_ns: wall.offcpu_ns,
        intervals: wall.offcpu_intervals,
        missing_stacks: wall.missing_stacks,
    };
    let tasks = tasks.map(|input| {
        let profile = tasks::build_profile(
            &input.times,
            &input.names,
            &wall.tasks,
            &wall.task_time,
            // As the wall-clock views name their roots.
            config
                .group_by
                .root(wall.processes > 1 || several_processes(&input.times)),
            loader,
            symbolizer,
            processes,
        );
        let title = format!("Where the tasks of {what} spent their time");
        let subtitle = format!(
            "{} tasks; running (on CPU, blocked, runnable) by stack, parked by the stack \
             where each parked",
            profile.tasks.len()
        );
        let files = write_view(&profile.view, config, "tasks", &title, &subtitle)
            .map_err(|e| output_error.get_or_insert(e.into()))
            .ok();
        TaskReport { profile, files }
    });

    let counters = loader.counters()?;
    let timeline = match (timeline, &config.timeline) {
        (Some(timeline), Some(wanted)) => {
            let names = TimelineNaming {
                latencies: plan.latencies.iter().map(|l| l.name.clone()).collect(),
                tasks: tasks.as_ref().map(|t| {
                    t.profile
                        .tasks
                        .iter()
                        .map(|s| ((s.tgid, s.task), s.name.clone()))
                        .collect()
                }),
            };
            let lost = counters[counter::TIMELINE_LOST as usize];
            write_timeline(&timeline, &names, &name_of, processes, &wanted.path, lost)
                .map_err(|e| output_error.get_or_insert(e))
                .ok()
        }
        _ => None,
    };
    let report = AttachReport {
        pid: target.pid.or(traced.first().map(|p| p.pid)).unwrap_or(0),
        process_name: target.name.clone(),
        processes: traced,
        processes_folded: Default::default(),
        stopped_by: reason,
        elapsed_ns: export.duration_ns,
        probes,
        latencies,
        offcpu: profile,
        offcpu_files: files.offcpu.clone(),
        wall,
        files,
        unwind_stats,
        unnamed,
        tasks,
        timeline,
        losses: losses(loader, &counters, config),
    };
    Ok((report, output_error))
}

/// Each planned probe with its hits.
fn probe_reports(loader: &Loader, plan: &ProbePlan) -> Result<Vec<ProbeReport>> {
    let mut probes = Vec::new();
    for (id, info) in plan.probes.iter().enumerate() {
        probes.push(ProbeReport {
            info: info.clone(),
            hits: loader.probe_hits(id as u32).map(|hits| ProbeHits {
                count: hits.count,
                first_ns: hits.first_ns,
            })?,
        });
    }
    Ok(probes)
}

/// How to name JIT-compiled frames left unnamed: the same for every process of one
/// runtime, so the first traced process's.
fn jit_hint(traced: &[TracedProcess], processes: &Processes) -> String {
    let Some((pid, maps)) = traced
        .iter()
        .find_map(|p| Some((p.pid, processes.get(p.pid)?.maps.as_ref()?)))
    else {
        return String::new();
    };
    runtimes::jit_naming_hint(pid, maps.mapped_files().map(|f| f.path))
}

/// The names a timeline's latencies and tasks have in the report.
struct TimelineNaming {
    latencies: Vec<String>,
    tasks: Option<HashMap<(u32, u64), String>>,
}

/// Writes the timeline to `path` (Chrome's trace event format), `lost` of its intervals
/// lost.
fn write_timeline(
    timeline: &Timeline,
    naming: &TimelineNaming,
    name_of: &dyn Fn(u32) -> String,
    processes: &Processes,
    path: &Path,
    lost: u64,
) -> Result<TimelineReport> {
    let names = TimelineNames {
        latencies: &naming.latencies,
        process: name_of,
        thread: &|tid| processes.thread_name(tid).map(str::to_string),
        task: &|tgid, task| {
            naming
                .tasks
                .as_ref()
                .and_then(|names| names.get(&(tgid, task)).cloned())
                .unwrap_or_else(|| format!("task #{task}"))
        },
    };
    render::write_output(path, |out| {
        timeline::write_chrome_trace(timeline, &names, out)
    })
    .with_context(|| format!("cannot write the timeline {}", path.display()))?;
    Ok(TimelineReport {
        path: path.to_path_buf(),
        intervals: timeline.events.len(),
        lost,
    })
}

/// What was lost, by the kernel's counters.
fn losses(loader: &Loader, counters: &[u64], config: &AttachConfig) -> Losses {
    Losses {
        events_lost: counters[counter::EVENTS_LOST as usize],
        map_full: counters[counter::MAP_FULL as usize],
        stacks: StackLosses::from_counters(counters, config.map_sizes.stack_slots()),
        unmatched_ends: counters[counter::UNMATCHED_ENDS as usize],
        arg_read_errors: counters[counter::ARG_READ_ERRORS as usize],
        program_misses: loader.program_misses(),
        switch_ins_missed: counters[counter::SWITCH_INS_MISSED as usize],
        unwind_ring_full: counters[counter::UNWIND_RING_FULL as usize],
        snapshots_reused_unchecked: counters[counter::SNAPSHOTS_REUSED_UNCHECKED as usize],
        unwind_ring_bytes: WallClockSampler::unwind_ring_bytes(&config.sampling, false),
    }
}

/// The report of each latency of `plan`: its histogram, by process and by class. A
/// known runtime's latency whose probes were never found is left out; one asked for with
/// --latency says which were not found.
fn latency_reports(
    loader: &Loader,
    plan: &ProbePlan,
    by_process: &[(LatencyProcessKey, LatencyStats)],
    retired: &RetiredLatencies,
    name_of: &dyn Fn(u32) -> String,
) -> Result<Vec<LatencyReport>> {
    let mut latencies: Vec<LatencyReport> = Vec::new();
    for (id, def) in plan.latencies.iter().enumerate() {
        // A known runtime's latency whose probes were never found is not this target's.
        let has_sites = |probe: &ProbeRef| {
            plan.probes
                .iter()
                .any(|p| probe.is(p.kind, &p.provider, &p.name) && p.site_count > 0)
        };
        let never_found: Vec<String> = [&def.begin, &def.end]
            .into_iter()
            .filter(|probe| !has_sites(probe))
            .map(ProbeRef::to_string)
            .collect();
        if !never_found.is_empty() {
            // A latency asked for with --latency is reported, with why it is empty.
            if def.runtime.is_none() {
                latencies.push(LatencyReport {
                    def: def.clone(),
                    hist: LatencyHistogram::new(),
                    per_process: Vec::new(),
                    by_class: Vec::new(),
                    never_found,
                });
            }
            continue;
        }
        let (hist, per_process, by_class) =
            measured(loader, def, id as u32, (by_process, retired), name_of)?;
        // One runtime's latency found through several functions (CPython 3.8's two
        // clones of `collect`) is one latency.
        let same = latencies.iter_mut().find(|l: &&mut LatencyReport| {
            l.def.name == def.name
                && l.def.runtime.is_some()
                && l.def.runtime == def.runtime
                && l.def.mechanism == def.mechanism
        });
        match same {
            Some(existing) => {
                existing.hist.merge(&hist);
                for process in per_process {
                    match existing
                        .per_process
                        .iter_mut()
                        .find(|p| p.pid == process.pid && p.name == process.name)
                    {
                        Some(p) => add_stats(&mut p.stats, &process.stats),
                        None => existing.per_process.push(process),
                    }
                }
                for (label, stats) in by_class {
                    match existing.by_class.iter_mut().find(|(l, _)| *l == label) {
                        Some((_, total)) => add_stats(total, &stats),
                        None => existing.by_class.push((label, stats)),
                    }
                }
            }
            None => latencies.push(LatencyReport {
                def: def.clone(),
                hist,
                per_process,
                by_class,
                never_found: Vec::new(),
            }),
        }
    }
    Ok(latencies)
}

/// A latency's histogram, its totals by process, and by class label.
type Measured = (
    LatencyHistogram,
    Vec<ProcessLatency>,
    Vec<(String, LatencyStats)>,
);

/// What the kernel measured of latency `id` (`def`): its histogram, its totals by process
/// and by class (labelled as `def`'s class names them).
fn measured(
    loader: &Loader,
    def: &LatencyDef,
    id: u32,
    (by_process, retired): (&[(LatencyProcessKey, LatencyStats)], &RetiredLatencies),
    name_of: &dyn Fn(u32) -> String,
) -> Result<Measured> {
    let data = loader.latency(id)?;
    let mut hist = LatencyHistogram::new();
    for (bucket, &count) in data.buckets.iter().enumerate() {
        if count > 0 {
            hist.merge_bucket(bucket as u32, count);
        }
    }
    hist.merge_stats(&data.stats);
    let mut per_process: Vec<ProcessLatency> = Vec::new();
    let mut by_class: Vec<(u32, LatencyStats)> = Vec::new();
    for (key, stats) in by_process.iter().filter(|(key, _)| key.latency_id == id) {
        match per_process.iter_mut().find(|p| p.pid == key.tgid) {
            Some(process) => add_stats(&mut process.stats, stats),
            None => per_process.push(ProcessLatency {
                pid: key.tgid,
                name: name_of(key.tgid),
                stats: *stats,
            }),
        }
        if def.class.is_some() {
            match by_class.iter_mut().find(|(class, _)| *class == key.class) {
                Some((_, total)) => add_stats(total, stats),
                None => by_class.push((key.class, *stats)),
            }
        }
    }
    // The processes let go: one row per program, with PID 0.
    for ((program, (_, class)), stats) in retired.iter().filter(|((_, (l, _)), _)| *l == id) {
        match per_process
            .iter_mut()
            .find(|p| p.pid == 0 && p.name == *program)
        {
            Some(row) => add_stats(&mut row.stats, stats),
            None => per_process.push(ProcessLatency {
                pid: 0,
                name: program.clone(),
                stats: *stats,
            }),
        }
        if def.class.is_some() {
            match by_class.iter_mut().find(|(c, _)| c == class) {
                Some((_, total)) => add_stats(total, stats),
                None => by_class.push((*class, *stats)),
            }
        }
    }
    by_class.sort_by_key(|(class, _)| *class);
    // Values with one label (V8's two young-generation collectors) are one class.
    let mut labelled: Vec<(String, LatencyStats)> = Vec::new();
    if let Some(class) = &def.class {
        for (value, stats) in by_class {
            let label = class.label(value);
            match labelled.iter_mut().find(|(l, _)| *l == label) {
                Some((_, total)) => add_stats(total, &stats),
                None => labelled.push((label, stats)),
            }
        }
    }
    Ok((hist, per_process, labelled))
}

/// Whether task times come from more than one process.
fn several_processes(times: &[(TaskKey, TaskTotal)]) -> bool {
    times.windows(2).any(|w| w[0].0.tgid != w[1].0.tgid)
}

/// What the task probes recorded, read before the profile is built (which names tasks
/// after it).
pub(super) struct TaskInput {
    /// Running and parked time by task, with the intervals still open.
    pub times: Vec<(TaskKey, TaskTotal)>,
    /// Each task's frame, and the names the runtimes gave.
    pub names: tasks::TaskNames,
}

impl TaskInput {
    /// `None` when no task probe is attached.
    pub(super) fn read(
        loader: &Loader,
        plan: &ProbePlan,
        reason: StopReason,
        now: u64,
        processes: &Processes,
    ) -> Result<Option<Self>> {
        let task_flags = site_flags::TASK_RUN | site_flags::TASK_PAUSE;
        if !plan.sites.iter().any(|s| s.site.flags & task_flags != 0) {
            return Ok(None);
        }
        // Open intervals of a live target are real time; a target that exited closed its
        // tasks or never will.
        let open = if reason == StopReason::TargetExited {
            Vec::new()
        } else {
            loader.task_states()?
        };
        let times = tasks::with_open_intervals(loader.task_times()?, &open, now);
        let named = loader.task_names()?;
        let names = tasks::task_names(&named, &times, processes);
        Ok(Some(Self { times, names }))
    }
}

/// Writes one off-CPU flame graph view (`NAME.folded`, `NAME.svg`) into the output
/// directory.
pub(super) fn write_view(
    stacks: &crate::stack::naming::StackProfile,
    config: &AttachConfig,
    name: &str,
    title: &str,
    subtitle: &str,
) -> std::io::Result<render::ViewFiles> {
    let options = SvgOptions {
        title,
        subtitle: Some(subtitle),
        count_name: "us",
        palette: Palette::OffCpu,
    };
    render::write_view(stacks, &config.output_dir, name, &options)
}
