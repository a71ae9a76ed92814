//! `tracer attach --pid PID` (or a service: `--children`, `--exe`, `--comm`, `--cgroup`):
//! GC and other latencies from the targets' USDT probes, their runtime tasks, and the
//! wall-clock profile of their threads (on-CPU samples and off-CPU time, as `tracer
//! profile` takes it), until the duration ends, Ctrl-C, or the targets exit.

use std::{
    collections::HashMap,
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Result, bail};
use tracer_common::{TaskKey, TaskTotal, counter, site_flags};

use crate::{
    cli::{AttachConfig, Format},
    histogram::LatencyHistogram,
    late_sites::{self, LateSites, Members},
    loader::{Features, Loader, RecordRing, Settings},
    privileges,
    probe_plan::{ProbePlan, SiteInput, SiteMode},
    processes::Processes,
    procfs,
    render::{
        self,
        export::ExportInfo,
        flamegraph::{Palette, SvgOptions},
        timeline::{self, Timeline, TimelineNames},
        views::write_profile_files,
    },
    report::{
        AttachReport, LatencyReport, Losses, OffCpuProfile, ProbeReport, ProcessLatency,
        TaskReport, TimelineReport, TracedProcess,
    },
    runtimes::{self, LatencyDef, TaskProbeDef},
    sampling::{self, Collected, ViewOptions, WallClockSampler},
    stop::{self, ProcessWatch, StopReason},
    symbolize::StackSymbolizer,
    targets::{self, TargetTracker},
    tasks,
    text::escape_text,
    usdt::{self, ProbePattern},
    wallclock,
};

pub fn run(config: AttachConfig) -> Result<()> {
    privileges::check()?;
    // At once: the first uprobe waits for an RCU grace period, the longest step of a launch.
    let warm_up = Loader::warm_up_uprobes();
    Loader::start_keeper();
    // The eBPF object and the kernel types are read on threads of their own while the
    // targets are scanned.
    Loader::prepare(true);
    let spec = &config.targets;
    let single = spec.single_pid();
    let watch = single.map(ProcessWatch::target).transpose()?;
    let targets = spec.find()?;
    let pids: Vec<u32> = targets.members.iter().map(|m| m.pid).collect();
    // From here on the targets are known to have existed: wherever one is missing, it
    // exited (or /proc hides it).
    let on_target = |e: anyhow::Error| match single {
        Some(pid) => procfs::target_error(pid, e),
        None => e,
    };
    let what = match single {
        Some(pid) => {
            let comm = format!("/proc/{pid}/comm");
            let name = procfs::read_name(Path::new(&comm)).map_err(|e| {
                on_target(anyhow::Error::new(e).context(format!("cannot read {comm}")))
            })?;
            Subject {
                pid: Some(pid),
                name,
            }
        }
        None => Subject {
            pid: None,
            name: spec.to_string(),
        },
    };

    // Any failure to read the target's files while it vanishes means it exited.
    let scan = match single {
        Some(pid) => usdt::scan_process(pid, &ProbePattern::any()),
        None => usdt::scan_processes(&pids, spec.exe.as_deref(), &ProbePattern::any()),
    }
    .map_err(|e| on_target(e.of_target().into()))?;
    // What was searched, marked now: a library mapped from here on (while the programs
    // load) is one to search later.
    let searched = usdt::Searched::of_resolved(&scan.sites, &pids);
    for (object, error) in &scan.skipped {
        log::debug!("skipped {}: {error}", object.path.display());
    }
    // Every probe is wanted here only if it is a known runtime's: a malformed site is
    // left out with a warning, never attached.
    let mut sites: Vec<SiteInput> = Vec::new();
    for site in &scan.sites {
        match SiteInput::try_from(site) {
            Ok(input) => sites.push(input),
            Err(problem) => log::warn!("skipped a probe site: {problem}"),
        }
    }
    // Every known runtime's latencies and task probes: its probes may be in a library
    // loaded later (a JVM's libjvm.so), or a process started later; those without sites
    // are left out of the report.
    let latencies = latencies_for(&sites, &config);
    let task_probes: Vec<TaskProbeDef> = runtimes::RUNTIMES
        .iter()
        .flat_map(|r| r.task_probe_defs())
        .collect();
    // One process's sites are attached for it alone; a set's for every process mapping
    // the files, the kernel keeping the hits of the targets.
    let mut plan = ProbePlan::build(
        &sites,
        &latencies,
        &task_probes,
        SiteMode::LatenciesOnly,
        single,
    )?;

    // Before anything is attached: a trace whose files cannot be written fails now.
    render::prepare_output_dir(&config.output_dir)?;
    if let Some(timeline) = &config.timeline {
        render::prepare_output_file(&timeline.path)?;
    }

    let mut processes = Processes::default();
    for &pid in &pids {
        if let Err(e) = processes.observe_target(pid) {
            let context = format!("cannot read /proc/{pid} (its name and memory maps)");
            let error = procfs::target_error(pid, anyhow::Error::new(e).context(context));
            // One of a set may exit at any time; the one target may not.
            match single {
                Some(_) => return Err(error),
                None => log::debug!("{error:#}"),
            }
        }
    }

    let sampling = config.sampling;
    let mut loader = Loader::load(&Settings {
        targets: Some(targets.clone()),
        min_block: config.min_block,
        features: Features {
            latencies: true,
            tasks: true,
            ..WallClockSampler::features(&sampling)
        },
        unwind_ring_bytes: WallClockSampler::unwind_ring_bytes(&sampling),
        map_sizes: config.map_sizes,
        // Sites found later get cookies after these: room for them.
        plan_sizes: Some(plan.room_to_grow()),
        timeline_min_block: config.timeline.as_ref().map(|t| t.min_block),
        ..Settings::default()
    })
    .map_err(|e| on_target(e.into()))?;
    let mut timeline = match config.timeline {
        Some(_) => Some(TimelineReader {
            ring: loader.take_timeline()?,
            timeline: Timeline::default(),
        }),
        None => None,
    };
    let mut tracker = TargetTracker::for_set(spec, &loader)?;
    loader
        .attach_usdt_sites(&plan.usdt_sites(), warm_up)
        .map_err(|e| on_target(e.into()))?;
    late_sites::hold_at_dlopen(
        &mut loader,
        late_sites::executables_of(&pids, spec.exe.as_deref()),
        single,
    )
    .map_err(on_target)?;
    let mut later = LateSites::new(
        later_specs(&config),
        searched,
        SiteMode::LatenciesOnly,
        task_probes,
        single,
        match single {
            Some(pid) => Members::One(pid),
            None => Members::Set,
        },
    );
    let mut sampler = WallClockSampler::attach(&mut loader, Some(&targets), sampling, &processes)
        .map_err(on_target)?;
    let probe_names: Vec<String> = plan.probes.iter().map(|p| p.specifier()).collect();
    let _diagnostics = loader.start_diagnostics(&probe_names);
    let started = sampler.started_ns;
    if let Some(reader) = timeline.as_mut() {
        reader.timeline.origin_ns = started;
    }
    let start_unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();

    // Ctrl-C from the moment the line below is printed must stop the trace, not kill us.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let signals = stop::StopSignals::catch(&runtime)?;
    let runtime_names = runtime_names(&plan);
    crate::status!(
        "Attached to {}: {} probe sites{}, on-CPU sampling at {} Hz{}, sched_switch. {}",
        escape_text(&what.describe(pids.len(), spec.can_grow())),
        loader.usdt_site_count(),
        if runtime_names.is_empty() {
            " (no known runtime probes yet: looking in what is loaded later)".into()
        } else {
            format!(" of {}", runtime_names.join(", "))
        },
        sampling.frequency_hz,
        match sampling.unwind {
            crate::cli::UnwindMethod::Dwarf => " (DWARF unwinding)",
            crate::cli::UnwindMethod::Fp => " (frame pointers)",
        },
        match config.duration {
            Some(d) => format!("Tracing for {d:?}; Ctrl-C to stop early."),
            None => "Ctrl-C to stop.".into(),
        }
    );

    // What naming the stacks takes is parsed while they are taken, not at the stop.
    let mut symbolizer = StackSymbolizer::new();
    symbolizer.prepare(
        pids.iter()
            .filter_map(|&pid| processes.get(pid)?.maps.as_ref()),
    );
    let reason = runtime.block_on(stop::run_until_stopped_with(
        signals,
        watch,
        config.duration,
        stop::either(
            run_attached(
                &mut sampler,
                &mut loader,
                &mut processes,
                &mut plan,
                &mut later,
                timeline.as_mut(),
            ),
            targets::track(tracker.as_mut()),
        ),
    ))?;

    // What was measured up to now is what is reported; the targets keep running untouched
    // from here on.
    let now = stop::monotonic_ns();
    loader.stop_recording()?;
    later.release_all(&mut loader);
    loader.detach_usdt()?;
    sampler.detach(&mut processes);
    if let Some(reader) = timeline.as_mut() {
        reader.drain();
    }
    stop::restore_default_signals();
    let traced: Vec<u32> = match &tracker {
        Some(tracker) => {
            let named = tracker.named();
            // A process that exited before it was looked at keeps the kernel's name.
            for (pid, name) in &named {
                processes.observe_named(*pid, Some(name));
            }
            named.into_iter().map(|(pid, _)| pid).collect()
        }
        None => pids.clone(),
    };
    drop(tracker);
    loader.detach_targets();
    crate::status!(
        "Stopped: {reason}. Detached from {}.",
        match single {
            Some(pid) => format!("process {pid}"),
            None => format!("{} processes", traced.len()),
        }
    );

    let tasks = TaskInput::read(&loader, &plan, reason, now, &processes)?;
    let collected = sampler.finish(
        &loader,
        &mut processes,
        &mut symbolizer,
        reason,
        now,
        ViewOptions {
            per_thread: config.per_thread,
            min_block: config.min_block,
            task_names: tasks
                .as_ref()
                .map(|t| t.names.frames.clone())
                .unwrap_or_default(),
        },
    )?;
    if let Some(pid) = single
        && processes.get(pid).and_then(|p| p.maps.as_ref()).is_none()
    {
        bail!("process {pid} exited");
    }
    let export = ExportInfo {
        name: &what.name,
        frequency_hz: sampling.frequency_hz,
        start_unix_ns,
        duration_ns: now - started,
    };
    let traced: Vec<TracedProcess> = traced
        .into_iter()
        .map(|pid| {
            let info = processes.get(pid);
            TracedProcess {
                pid,
                name: info.map_or_else(|| "?".into(), |p| p.name.clone()),
                namespace_pid: info.and_then(|p| p.namespace_pid),
            }
        })
        .collect();
    let (report, output_error) = collect(
        &loader,
        &plan,
        &config,
        &what,
        traced,
        &processes,
        &mut symbolizer,
        collected,
        tasks,
        timeline.map(|t| t.timeline),
        &export,
        reason,
    )?;
    let text = match config.format {
        Format::Text => report.to_text(),
        Format::Json => serde_json::to_string_pretty(&report.to_json())? + "\n",
    };
    if let Err(e) = crate::console::print(text) {
        return Err(match output_error {
            Some(file_error) => anyhow::Error::new(e).context(format!("{file_error:#}")),
            None => e.into(),
        });
    }
    match output_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What the report is about: one process (its PID and name), or a set (its description).
struct Subject {
    pid: Option<u32>,
    name: String,
}

impl Subject {
    /// For the status line: `process 42 (name)`, or the set and how many it has now.
    fn describe(&self, processes: usize, can_grow: bool) -> String {
        match self.pid {
            Some(pid) => format!("process {pid} ({})", self.name),
            None => format!(
                "{} ({processes} now{})",
                self.name,
                if can_grow {
                    ", and those that join"
                } else {
                    ""
                }
            ),
        }
    }
}

/// The latencies to measure: every known runtime's, plus those asked for with --latency
/// (whose probes may only come in a library loaded later).
fn latencies_for(sites: &[SiteInput], config: &AttachConfig) -> Vec<LatencyDef> {
    let mut defs: Vec<LatencyDef> = runtimes::RUNTIMES
        .iter()
        .flat_map(|r| r.latency_defs())
        .collect();
    for request in &config.latencies {
        for name in [&request.begin, &request.end] {
            if !sites
                .iter()
                .any(|s| s.provider == request.provider && &s.name == name)
            {
                crate::status!(
                    "No probe {}:{name} in {} yet: looking for it in what is loaded later.",
                    request.provider,
                    config.targets
                );
            }
        }
        defs.push(LatencyDef {
            name: format!("{}_to_{}", request.begin, request.end),
            provider: request.provider.clone(),
            begin: request.begin.clone(),
            end: request.end.clone(),
        });
    }
    defs
}

/// What is looked for in objects mapped later: every known runtime's probes, and those of
/// the providers asked for with --latency.
fn later_specs(config: &AttachConfig) -> Vec<usdt::UsdtSpecifier> {
    let mut providers: Vec<&str> = runtimes::RUNTIMES.iter().map(|r| r.provider).collect();
    providers.extend(config.latencies.iter().map(|l| l.provider.as_str()));
    providers.sort_unstable();
    providers.dedup();
    providers
        .into_iter()
        .filter_map(|provider| usdt::parse_specifier(&format!("usdt:*:{provider}:*")).ok())
        .collect()
}

/// Looks for (and attaches) the probes of what the targets map later, every
/// [`late_sites::LOOK_PERIOD`], between the sampler's own chores. Never finishes on its
/// own.
async fn run_attached(
    sampler: &mut WallClockSampler,
    loader: &mut Loader,
    processes: &mut Processes,
    plan: &mut ProbePlan,
    later: &mut LateSites,
    mut timeline: Option<&mut TimelineReader>,
) -> std::io::Result<StopReason> {
    let mut chores = sampling::SamplerChores::default();
    let mut ticker = tokio::time::interval(late_sites::LOOK_PERIOD);
    loop {
        ticker.tick().await;
        if let Some(reader) = timeline.as_deref_mut() {
            reader.drain();
        }
        let added = later.look(loader, plan);
        // Before the snapshots are unwound: a library just mapped (libjvm.so) has the
        // frames of what the process runs next.
        for &pid in &added.held {
            processes.refresh_maps(pid);
        }
        if !added.is_empty() {
            crate::status!(
                "Attached {} more probe sites{}.",
                added.sites.len(),
                match runtime_names(plan) {
                    names if names.is_empty() => String::new(),
                    names => format!(" (now of {})", names.join(", ")),
                }
            );
        }
        chores.run(sampler, loader, processes);
    }
}

fn runtime_names(plan: &ProbePlan) -> Vec<&'static str> {
    let mut names: Vec<_> = plan
        .probes
        .iter()
        .filter_map(|p| runtimes::by_provider(&p.provider))
        .map(|r| r.name)
        .collect();
    names.dedup();
    names
}

#[allow(clippy::too_many_arguments)]
fn collect(
    loader: &Loader,
    plan: &ProbePlan,
    config: &AttachConfig,
    target: &Subject,
    traced: Vec<TracedProcess>,
    processes: &Processes,
    symbolizer: &mut StackSymbolizer,
    collected: Collected,
    tasks: Option<TaskInput>,
    timeline: Option<Timeline>,
    export: &ExportInfo<'_>,
    reason: StopReason,
) -> Result<(AttachReport, Option<anyhow::Error>)> {
    let elapsed_ns = export.duration_ns;
    let by_process = loader.latency_by_process()?;
    let name_of = |pid: u32| {
        traced
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| p.name.clone())
            .or_else(|| processes.get(pid).map(|p| p.name.clone()))
            .unwrap_or_else(|| "?".into())
    };
    let mut latencies = Vec::new();
    for (id, def) in plan.latencies.iter().enumerate() {
        // A known runtime's latency whose probes were never found is not this target's.
        let has_sites = |name: &str| {
            plan.probes
                .iter()
                .any(|p| p.provider == def.provider && p.name == name && p.site_count > 0)
        };
        if !has_sites(&def.begin) || !has_sites(&def.end) {
            continue;
        }
        let data = loader.latency(id as u32)?;
        let mut hist = LatencyHistogram::new();
        for (bucket, &count) in data.buckets.iter().enumerate() {
            if count > 0 {
                hist.merge_bucket(bucket as u32, count);
            }
        }
        hist.merge_stats(&data.stats);
        let per_process = by_process
            .iter()
            .filter(|(key, _)| key.latency_id == id as u32)
            .map(|(key, stats)| ProcessLatency {
                pid: key.tgid,
                name: name_of(key.tgid),
                stats: *stats,
            })
            .collect();
        latencies.push(LatencyReport {
            def: def.clone(),
            hist,
            per_process,
        });
    }
    let mut probes = Vec::new();
    for (id, info) in plan.probes.iter().enumerate() {
        probes.push(ProbeReport {
            info: info.clone(),
            hits: loader.probe_hits(id as u32)?,
        });
    }

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
    let unnamed = wallclock::unnamed_line(&wall, || {
        // The hint is the same for every process of one runtime: the first one's.
        let Some((pid, maps)) = traced
            .iter()
            .find_map(|p| Some((p.pid, processes.get(p.pid)?.maps.as_ref()?)))
        else {
            return String::new();
        };
        runtimes::jit_naming_hint(pid, maps.mapped_files().map(|f| f.path))
    });
    let profile = OffCpuProfile {
        stacks: wall.offcpu.len(),
        total_ns: wall.offcpu_ns,
        intervals: wall.offcpu_intervals,
        missing_stacks: wall.missing_stacks,
    };

    let tasks = match tasks {
        Some(input) => {
            let profile = tasks::build_profile(
                &input.times,
                &input.names,
                &wall.tasks,
                &wall.task_time,
                // As the wall-clock views name their roots: by pid with several processes.
                wall.processes > 1 || several_processes(&input.times),
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
            Some(TaskReport { profile, files })
        }
        None => None,
    };

    let counters = loader.counters()?;
    let timeline = match (timeline, &config.timeline) {
        (Some(timeline), Some(wanted)) => {
            let latencies: Vec<String> = plan.latencies.iter().map(|l| l.name.clone()).collect();
            let task_names = tasks.as_ref().map(|t| {
                t.profile
                    .tasks
                    .iter()
                    .map(|s| ((s.tgid, s.task), s.name.clone()))
                    .collect::<HashMap<_, _>>()
            });
            let names = TimelineNames {
                latencies: &latencies,
                process: &|pid| name_of(pid),
                thread: &|tid| processes.thread_name(tid).map(str::to_string),
                task: &|tgid, task| {
                    task_names
                        .as_ref()
                        .and_then(|names| names.get(&(tgid, task)).cloned())
                        .unwrap_or_else(|| format!("task #{task}"))
                },
            };
            let written = render::write_output(&wanted.path, |out| {
                timeline::write_chrome_trace(&timeline, &names, out)
            });
            match written {
                Ok(()) => Some(TimelineReport {
                    path: wanted.path.clone(),
                    intervals: timeline.events.len(),
                    lost: counters[counter::TIMELINE_LOST as usize],
                }),
                Err(e) => {
                    output_error.get_or_insert(anyhow::Error::new(e).context(format!(
                        "cannot write the timeline {}",
                        wanted.path.display()
                    )));
                    None
                }
            }
        }
        _ => None,
    };
    let report = AttachReport {
        pid: target.pid.or(traced.first().map(|p| p.pid)).unwrap_or(0),
        process_name: target.name.clone(),
        processes: traced,
        stopped_by: reason,
        elapsed_ns,
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
        losses: Losses {
            events_lost: counters[counter::EVENTS_LOST as usize],
            map_full: counters[counter::MAP_FULL as usize],
            stack_errors: counters[counter::STACK_ERRORS as usize],
            unmatched_ends: counters[counter::UNMATCHED_ENDS as usize],
            arg_read_errors: counters[counter::ARG_READ_ERRORS as usize],
            program_misses: loader.program_misses(),
            switch_ins_missed: counters[counter::SWITCH_INS_MISSED as usize],
        },
    };
    Ok((report, output_error))
}

/// Whether task times come from more than one process.
fn several_processes(times: &[(TaskKey, TaskTotal)]) -> bool {
    times.windows(2).any(|w| w[0].0.tgid != w[1].0.tgid)
}

/// The timeline's ring buffer and what was read from it.
struct TimelineReader {
    ring: RecordRing,
    timeline: Timeline,
}

impl TimelineReader {
    fn drain(&mut self) {
        let timeline = &mut self.timeline;
        self.ring.drain(|record| timeline.add_record(record));
    }
}

/// What the task probes recorded, read before the profile is built (which names tasks
/// after it).
struct TaskInput {
    /// Running and parked time by task, with the intervals still open.
    times: Vec<(TaskKey, TaskTotal)>,
    /// Each task's frame, and the names the runtimes gave.
    names: tasks::TaskNames,
}

impl TaskInput {
    /// `None` when no task probe is attached.
    fn read(
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
fn write_view(
    stacks: &crate::stacks::StackProfile,
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

/// Only a valid site becomes something to attach: the offsets come from
/// [`usdt::validate`], and a malformed note is its error.
impl TryFrom<&usdt::ProbeSite> for SiteInput {
    type Error = usdt::UsdtError;

    fn try_from(site: &usdt::ProbeSite) -> Result<Self, usdt::UsdtError> {
        let offsets = site.offsets()?;
        Ok(SiteInput {
            path: site.binary.path.clone(),
            attach_path: site.binary.host_path.clone(),
            provider: site.note.provider.clone(),
            name: site.note.name.clone(),
            file_offset: offsets.probe,
            semaphore_offset: offsets.semaphore,
            args: site.args.clone(),
        })
    }
}
