//! `tracer attach --pid PID` (or a service: `--children`, `--exe`, `--comm`, `--cgroup`):
//! GC and other latencies from the targets' USDT probes, their runtime tasks, and the
//! wall-clock profile of their threads (on-CPU samples and off-CPU time, as `tracer
//! profile` takes it), until the duration ends, Ctrl-C, or the targets exit.

mod collect;
mod rolling;
mod sites;

use std::{
    collections::BTreeMap,
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    cli::{AttachConfig, Format},
    commands::metrics::{self, MetricSources, Metrics},
    kernel::{
        DiagnosticsReader, Features, KernelTargets, LaunchNeeds, Loader, RecordRing, Settings,
    },
    output::render::{self, export::ExportInfo, timeline::Timeline},
    output::report::TracedProcess,
    probe::late_sites::{self, LateSites, Members},
    probe::plan::{ProbePlan, SiteMode},
    probe::runtimes::{self, TaskProbeDef},
    profile::retire::Retirement,
    profile::sampling::{self, ViewOptions, WallClockSampler},
    session::{Attaching, Running, Session, Stopped},
    stack::processes::Processes,
    stack::symbolize::StackSymbolizer,
    system::privileges,
    system::procfs,
    system::stop::{self, StopReason},
    system::text::escape_text,
    target::{TargetSpec, TargetTracker},
};
use collect::{Collection, TaskInput, collect};
use sites::{FoundSites, find_sites, latencies_for, later_specs, runtime_names};

pub(crate) fn run(config: AttachConfig) -> Result<()> {
    privileges::check()?;
    let spec = &config.targets;
    let single = spec.single_pid();
    // At once: what the load needs is made ready while the targets are scanned.
    let session = Session::start(
        LaunchNeeds {
            usdt_sites: true,
            kernel_types: true,
        },
        single,
        config.duration,
    )?;
    let targets = spec.find()?;
    let pids: Vec<u32> = targets.members.iter().map(|m| m.pid).collect();
    // From here on the targets are known to have existed: wherever one is missing, it
    // exited (or /proc hides it).
    let on_target = |e: anyhow::Error| match single {
        Some(pid) => procfs::target_error(pid, e),
        None => e,
    };
    let what = Subject::of(spec, single).map_err(on_target)?;
    let planned = plan_probes(&config, single, &pids).map_err(on_target)?;

    // Before anything is attached: a trace whose files cannot be written fails now.
    render::prepare_output_dir(&config.output_dir)?;
    if let Some(timeline) = &config.timeline {
        render::prepare_output_file(&timeline.path)?;
    }
    let endpoint = metrics::bind(config.metrics.as_ref())?;
    let processes = observe_targets(&pids, single)?;
    let (mut run, attaching, mut tracker) = Run::attach(
        session, &config, targets, planned, processes, &pids, &on_target,
    )?;
    let (started, start_unix_ns) = run.clocks_at_start();
    run.rolling = rolling::Rolling::new(&config, started, start_unix_ns, what.name.clone());
    if tracker.is_some() {
        run.retirement = Some(Retirement::new(config.keep_exited, started));
    }

    // Ctrl-C from the moment the line below is printed must stop the trace, not kill us.
    let running = attaching.go()?;
    let metrics = metrics::serve(endpoint, running.runtime())?;
    announce(
        &what.describe(pids.len(), spec.can_grow()),
        run.loader.usdt_site_count(),
        &run.plan,
        &config,
    );
    let (reason, stopped) = run.trace(running, tracker.as_mut(), metrics)?;

    // What was measured up to now is what is reported; the targets keep running untouched
    // from here on.
    let now = stop::monotonic_ns();
    let (traced, folded) = run.detach(&stopped, tracker, &pids)?;
    // The last window, cut short by the stop.
    if let Some(rolling) = run.rolling.as_mut() {
        rolling.write(
            &mut run.sampler,
            &run.loader,
            &mut run.processes,
            &mut run.symbolizer,
            now,
        );
    }
    if let Some(retirement) = run.retirement.as_mut()
        && let Err(e) = retirement.last_look(
            &mut run.sampler,
            &mut run.loader,
            &mut run.processes,
            &mut run.symbolizer,
            run.frequency_hz,
            &traced.iter().copied().collect(),
            now,
        )
    {
        crate::status!("Cannot let go of the processes that exited: {e:#}.");
    }
    crate::status!(
        "Stopped: {reason}. Detached from {}.",
        match single {
            Some(pid) => format!("process {pid}"),
            None => format!(
                "{} processes",
                traced.len() as u64 + folded.values().sum::<u64>()
            ),
        }
    );
    let span = Span {
        reason,
        started,
        start_unix_ns,
        now,
    };
    run.report(&config, &what, (traced, folded), span)
}

/// The probes to attach to the targets, and what to look for in what they load later.
struct Planned {
    plan: ProbePlan,
    later: LateSites,
}

/// Finds the targets' probe sites and plans them: every known runtime's latencies and
/// task probes (their probes may be in a library loaded later, a JVM's libjvm.so, or a
/// process started later; those without sites are left out of the report), and those
/// `--latency` asks for.
fn plan_probes(config: &AttachConfig, single: Option<u32>, pids: &[u32]) -> Result<Planned> {
    let FoundSites {
        sites,
        searched,
        requested,
        usdt_elsewhere,
    } = find_sites(config, single, pids)?;
    let latencies = latencies_for(&sites, config, &requested.names);
    let task_probes: Vec<TaskProbeDef> = runtimes::RUNTIMES
        .iter()
        .flat_map(super::super::probe::runtimes::Runtime::task_probe_defs)
        .collect();
    // One process's sites are attached for it alone; a set's for every process mapping
    // the files, the kernel keeping the hits of the targets.
    let plan = ProbePlan::build(
        &sites,
        &latencies,
        &task_probes,
        SiteMode::LatenciesOnly,
        single,
    )?;
    let later = LateSites::new(
        later_specs(config, &requested.names),
        searched,
        SiteMode::LatenciesOnly,
        task_probes,
        single,
        match single {
            Some(pid) => Members::One(pid),
            None => Members::Set,
        },
    )
    .keeping(usdt_elsewhere)
    .holding(config.hold_at_dlopen);
    Ok(Planned { plan, later })
}

/// What a run holds from the attach to the report.
struct Run {
    loader: Loader,
    plan: ProbePlan,
    later: LateSites,
    sampler: WallClockSampler,
    processes: Processes,
    timeline: Option<TimelineReader>,
    symbolizer: StackSymbolizer,
    /// `--profile-every`: the window open.
    rolling: Option<rolling::Rolling>,
    /// Of a set of processes: those exited long ago, let go.
    retirement: Option<Retirement>,
    /// `--metrics`' `tracer_oncpu_seconds_total` of the processes let go.
    frequency_hz: u64,
    /// Keeps the kernel's diagnostics printed while the run lasts.
    _diagnostics: Option<DiagnosticsReader>,
}

/// When and why a run stopped.
struct Span {
    reason: StopReason,
    /// When sampling started (CLOCK_MONOTONIC ns).
    started: u64,
    /// The same moment on the wall clock (ns since the Unix epoch).
    start_unix_ns: u64,
    /// When it stopped (CLOCK_MONOTONIC ns).
    now: u64,
}

impl Run {
    /// Loads the programs for `targets` and attaches the `planned` probes, the holds at
    /// `dlopen` and the sampler. `on_target` says what a failure means for the one target.
    fn attach(
        session: Session,
        config: &AttachConfig,
        targets: KernelTargets,
        planned: Planned,
        processes: Processes,
        pids: &[u32],
        on_target: &dyn Fn(anyhow::Error) -> anyhow::Error,
    ) -> Result<(Self, Attaching, Option<TargetTracker>)> {
        let Planned { plan, mut later } = planned;
        let spec = &config.targets;
        let sampling = config.sampling;
        let (attaching, mut loader) = session
            .load(&Settings {
                targets: Some(targets.clone()),
                min_block: config.min_block,
                features: Features {
                    latencies: true,
                    tasks: true,
                    process_metrics: config.metrics.is_some(),
                    ..WallClockSampler::features(&sampling)
                },
                unwind_ring_bytes: WallClockSampler::unwind_ring_bytes(&sampling, false),
                map_sizes: config.map_sizes,
                // Sites found later get cookies after these: room for them.
                plan_sizes: Some(plan.room_to_grow()),
                timeline_min_block: config.timeline.as_ref().map(|t| t.min_block),
                ..Settings::default()
            })
            .map_err(|e| on_target(e.into()))?;
        let timeline = match config.timeline {
            Some(_) => Some(TimelineReader {
                ring: loader.take_timeline()?,
                timeline: Timeline::default(),
            }),
            None => None,
        };
        let tracker = TargetTracker::for_set(spec, &loader)?
            .map(|tracker| tracker.keeping_exited(config.keep_exited));
        loader
            .attach_usdt_sites(&plan.usdt_sites())
            .map_err(|e| on_target(e.into()))?;
        later
            .watch(
                &mut loader,
                late_sites::executables_of(pids, spec.exe.as_deref()),
                pids,
            )
            .map_err(on_target)?;
        let mut processes = processes;
        if later.sees_mappings() {
            processes.maps_told_by_kernel();
        }
        let mut loader = loader.maps_ready().map_err(|e| on_target(e.into()))?;
        let sampler = WallClockSampler::attach(&mut loader, Some(&targets), sampling, &processes)
            .map_err(on_target)?;
        let probe_names = plan.specifiers();
        let diagnostics = loader.start_diagnostics(&probe_names);
        let run = Run {
            loader,
            plan,
            later,
            sampler,
            processes,
            timeline,
            symbolizer: StackSymbolizer::new(),
            rolling: None,
            retirement: None,
            frequency_hz: sampling.frequency_hz,
            _diagnostics: diagnostics,
        };
        Ok((run, attaching, tracker))
    }

    /// When sampling started, on the monotonic clock and on the wall clock (ns since the
    /// Unix epoch); the timeline counts from then.
    fn clocks_at_start(&mut self) -> (u64, u64) {
        let started = self.sampler.started_ns;
        if let Some(reader) = self.timeline.as_mut() {
            reader.timeline.origin_ns = started;
        }
        let start_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
        (started, start_unix_ns)
    }

    /// Traces until the first reason to stop (see [`Running::until_stopped`]); says
    /// which. Serves the `metrics` scrapes meanwhile.
    fn trace(
        &mut self,
        running: Running,
        tracker: Option<&mut TargetTracker>,
        metrics: Option<Metrics>,
    ) -> Result<(StopReason, Stopped)> {
        // What naming the stacks takes is parsed while they are taken, not at the stop.
        let processes = &self.processes;
        self.symbolizer
            .prepare(processes.iter().filter_map(|(_, info)| info.maps.as_ref()));
        let keeper_pid = self.loader.keeper_pid();
        Ok(running.until_stopped(run_attached(self, metrics), tracker, keeper_pid)?)
    }

    /// Detaches everything from the targets, in the order that leaves them as they were,
    /// keeping what the kernel collected readable. Returns the processes traced: those of
    /// `tracker`'s set, or `pids`.
    fn detach(
        &mut self,
        stopped: &Stopped,
        tracker: Option<TargetTracker>,
        pids: &[u32],
    ) -> Result<(Vec<u32>, BTreeMap<String, u64>)> {
        let loader = &mut self.loader;
        loader.stop_recording()?;
        stopped.let_signals_kill();
        self.later.release_all(loader);
        loader.detach_usdt()?;
        self.sampler.detach(&mut self.processes);
        if let Some(reader) = self.timeline.as_mut() {
            reader.drain();
        }
        let traced: Vec<u32> = match &tracker {
            Some(tracker) => {
                let named = tracker.named();
                // A process that exited before it was looked at keeps the kernel's name.
                for (pid, name) in &named {
                    self.processes.observe_named(*pid, Some(name));
                }
                named.into_iter().map(|(pid, _)| pid).collect()
            }
            None => pids.to_vec(),
        };
        let folded = tracker.map(|t| t.folded().clone()).unwrap_or_default();
        loader.detach_targets();
        Ok((traced, folded))
    }

    /// Builds the report of what was collected over `span`, writes its files and prints
    /// it. Fails when the one target exited before it could be named, or a file or
    /// standard output could not be written (after printing what it could).
    fn report(
        mut self,
        config: &AttachConfig,
        what: &Subject,
        (traced, folded): (Vec<u32>, BTreeMap<String, u64>),
        span: Span,
    ) -> Result<()> {
        let Span {
            reason,
            started,
            start_unix_ns,
            now,
        } = span;
        let tasks = TaskInput::read(&self.loader, &self.plan, reason, now, &self.processes)?;
        let mut collected = self.sampler.finish(
            &self.loader,
            &mut self.processes,
            &mut self.symbolizer,
            reason,
            now,
            ViewOptions {
                per_thread: config.per_thread,
                group_by: config.group_by,
                min_block: config.min_block,
                task_names: tasks
                    .as_ref()
                    .map(|t| t.names.frames.clone())
                    .unwrap_or_default(),
            },
        )?;
        let retired = self.retirement.take().unwrap_or_default();
        collected.profile.absorb_retired(retired.profile);
        if let Some(pid) = what.pid
            && self
                .processes
                .get(pid)
                .and_then(|p| p.maps.as_ref())
                .is_none()
        {
            bail!("process {pid} exited");
        }
        let export = ExportInfo {
            name: &what.name,
            frequency_hz: config.sampling.frequency_hz,
            start_unix_ns,
            duration_ns: now - started,
            process_labels: false,
            only_pid: None,
        };
        let traced: Vec<TracedProcess> = traced
            .into_iter()
            .map(|pid| {
                let info = self.processes.get(pid);
                TracedProcess {
                    pid,
                    name: info.map_or_else(|| "?".into(), |p| p.name.clone()),
                    namespace_pid: info.and_then(|p| p.namespace_pid),
                }
            })
            .collect();
        let from = Collection {
            loader: &self.loader,
            plan: &self.plan,
            processes: &self.processes,
            symbolizer: &mut self.symbolizer,
            collected,
            tasks,
            timeline: self.timeline.map(|t| t.timeline),
            retired_latencies: retired.latency_by_program,
        };
        let (mut report, output_error) = collect(from, config, what, traced, &export, reason)?;
        report.processes_folded = folded;
        let text = match config.format {
            Format::Text => report.to_text(),
            Format::Json => serde_json::to_string_pretty(&report.to_json())? + "\n",
        };
        if let Err(e) = crate::system::console::print(text) {
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
}

/// Says what is traced, at which frequency, for how long, and how to stop.
fn announce(what: &str, sites: usize, plan: &ProbePlan, config: &AttachConfig) {
    let runtime_names = runtime_names(plan);
    let sampling = &config.sampling;
    crate::status!(
        "Attached to {}: {} probe sites{}, on-CPU sampling at {} Hz{}, sched_switch. {}",
        escape_text(what),
        sites,
        if runtime_names.is_empty() {
            " (no known runtime probes yet: looking in what is loaded later)".into()
        } else {
            format!(" of {}", runtime_names.join(", "))
        },
        sampling.frequency_hz,
        match sampling.unwind {
            crate::profile::sampling::UnwindMethod::Dwarf => " (DWARF unwinding)",
            crate::profile::sampling::UnwindMethod::Fp => " (frame pointers)",
        },
        match config.duration {
            Some(d) => format!("Tracing for {d:?}; Ctrl-C to stop early."),
            None => "Ctrl-C to stop.".into(),
        }
    );
}

/// The targets' names and memory maps, read now so that their stacks are named even if
/// they exit. One of a set may exit at any time; the one target may not.
fn observe_targets(pids: &[u32], single: Option<u32>) -> Result<Processes> {
    let mut processes = Processes::default();
    for &pid in pids {
        if let Err(e) = processes.observe_target(pid) {
            let context = format!("cannot read /proc/{pid} (its name and memory maps)");
            let error = procfs::target_error(pid, anyhow::Error::new(e).context(context));
            match single {
                Some(_) => return Err(error),
                None => log::debug!("{error:#}"),
            }
        }
    }
    Ok(processes)
}

/// What the report is about: one process (its PID and name), or a set (its description).
struct Subject {
    pid: Option<u32>,
    name: String,
}

impl Subject {
    /// Process `single` with the name it has now, or the set `spec` describes.
    fn of(spec: &TargetSpec, single: Option<u32>) -> Result<Self> {
        Ok(match single {
            Some(pid) => {
                let comm = format!("/proc/{pid}/comm");
                let name = procfs::read_name(Path::new(&comm))
                    .with_context(|| format!("cannot read {comm}"))?;
                Subject {
                    pid: Some(pid),
                    name,
                }
            }
            None => Subject {
                pid: None,
                name: spec.to_string(),
            },
        })
    }

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

/// Looks for (and attaches) the probes of what the targets map later when the kernel
/// tells of it (and every [`late_sites::look_period`]), between the sampler's own chores.
/// Never finishes on its own.
async fn run_attached(run: &mut Run, mut metrics: Option<Metrics>) -> std::io::Result<StopReason> {
    let Run {
        loader,
        plan,
        later,
        sampler,
        processes,
        timeline,
        symbolizer,
        rolling,
        retirement,
        frequency_hz,
        ..
    } = run;
    let mut chores = sampling::SamplerChores::default();
    let mut notices = later.take_notices();
    let mut filling = sampler.ring_wakeups();
    // The timeline's ring is drained at every tick.
    let with_timeline = timeline.is_some();
    let period = |notices: &Option<_>, sampler: &WallClockSampler| match with_timeline {
        true => late_sites::LOOK_PERIOD,
        false => {
            late_sites::look_period(notices.as_ref()).min(sampling::SamplerChores::period(sampler))
        }
    };
    let mut ticker = tokio::time::interval(period(&notices, sampler));
    loop {
        sampling::keep_pace(&mut ticker, period(&notices, sampler));
        let told = tokio::select! {
            _ = ticker.tick() => notices.is_none(),
            () = late_sites::held_notice(&mut notices) => true,
            () = sampling::ring_filling(&mut filling) => {
                chores.drain_due();
                notices.is_none()
            }
            scrape = metrics::next_scrape(&mut metrics) => {
                if let Some(metrics) = metrics.as_mut() {
                    metrics.answer(scrape, MetricSources {
                        loader,
                        plan: Some(plan),
                        processes,
                        sampler,
                        retired_oncpu: retirement.as_ref().map(|r| &r.oncpu_by_program),
                    });
                }
                continue;
            }
        };
        if let Some(reader) = timeline.as_mut() {
            reader.drain();
        }
        let added = later.look(loader, plan, told);
        // Before the snapshots are unwound: a library just mapped (libjvm.so) has the
        // frames of what the process runs next.
        for &pid in &added.remapped {
            sampler.remapped(pid, processes);
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
        let now = stop::monotonic_ns();
        // With windows, processes are let go just after a window is written: it holds
        // all they left.
        let window = match rolling.as_mut() {
            Some(rolling) if rolling.due(now) => {
                rolling.write(sampler, loader, processes, symbolizer, now);
                Some(rolling.window_mut())
            }
            Some(_) => continue,
            None => None,
        };
        let Some(retirement) = retirement
            .as_mut()
            .filter(|r| window.is_some() || r.due(now))
        else {
            continue;
        };
        if let Some(metrics) = metrics.as_mut() {
            metrics.fold_gone(loader, Some(plan), processes);
        }
        if let Err(e) = retirement.look(
            sampler,
            loader,
            processes,
            symbolizer,
            *frequency_hz,
            window,
            now,
        ) {
            crate::status!("Cannot let go of the processes that exited: {e:#}.");
        }
    }
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
