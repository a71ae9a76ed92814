//! `tracer attach --pid PID` (or a service: `--children`, `--exe`, `--comm`, `--cgroup`):
//! GC and other latencies from the targets' USDT probes, their runtime tasks, and the
//! wall-clock profile of their threads (on-CPU samples and off-CPU time, as `tracer
//! profile` takes it), until the duration ends, Ctrl-C, or the targets exit.

use std::{
    collections::HashMap,
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};
use tracer_common::{LatencyProcessKey, LatencyStats, TaskKey, TaskTotal, counter, site_flags};

use crate::{
    cli::{AttachConfig, Format, LatencyProbe},
    kernel::{Features, Launch, LaunchNeeds, Loader, RecordRing, Settings, keeper},
    output::render::{
        self,
        export::ExportInfo,
        flamegraph::{Palette, SvgOptions},
        timeline::{self, Timeline, TimelineNames},
        views::write_profile_files,
    },
    output::report::{
        AttachReport, LatencyReport, Losses, OffCpuProfile, ProbeHits, ProbeReport, ProcessLatency,
        TaskReport, TimelineReport, TracedProcess,
    },
    probe::late_sites::{self, LateSites, Members},
    probe::plan::{ProbePlan, SiteInput, SiteMode},
    probe::runtimes::{self, LatencyDef, ProbeRef, TaskProbeDef, functions::UsdtElsewhere},
    probe::usdt::{self, ProbePattern},
    profile::histogram::LatencyHistogram,
    profile::sampling::{self, Collected, ViewOptions, WallClockSampler},
    profile::tasks,
    profile::wallclock,
    stack::processes::Processes,
    stack::symbolize::StackSymbolizer,
    system::privileges,
    system::procfs,
    system::stop::{self, ProcessWatch, StopReason},
    system::text::escape_text,
    target::{self, TargetSpec, TargetTracker},
};

pub fn run(config: AttachConfig) -> Result<()> {
    privileges::check()?;
    // At once: what the load needs is made ready while the targets are scanned.
    let launch = Launch::start(LaunchNeeds {
        usdt_sites: true,
        kernel_types: true,
    });
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
    let what = Subject::of(spec, single).map_err(on_target)?;

    let FoundSites {
        sites,
        searched,
        requested,
        usdt_elsewhere,
    } = find_sites(&config, single, &pids).map_err(on_target)?;
    // Every known runtime's latencies and task probes: its probes may be in a library
    // loaded later (a JVM's libjvm.so), or a process started later; those without sites
    // are left out of the report.
    let latencies = latencies_for(&sites, &config, &requested.names);
    let task_probes: Vec<TaskProbeDef> = runtimes::RUNTIMES
        .iter()
        .flat_map(|r| r.task_probe_defs())
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

    // Before anything is attached: a trace whose files cannot be written fails now.
    render::prepare_output_dir(&config.output_dir)?;
    if let Some(timeline) = &config.timeline {
        render::prepare_output_file(&timeline.path)?;
    }

    let processes = observe_targets(&pids, single)?;

    let sampling = config.sampling;
    let mut loader = launch
        .load(&Settings {
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
        .attach_usdt_sites(&plan.usdt_sites())
        .map_err(|e| on_target(e.into()))?;
    late_sites::hold_at_dlopen(
        &mut loader,
        late_sites::executables_of(&pids, spec.exe.as_deref()),
        single,
        config.hold_at_dlopen,
    )
    .map_err(on_target)?;
    let later = LateSites::new(
        later_specs(&config, &requested.names),
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
    let sampler = WallClockSampler::attach(&mut loader, Some(&targets), sampling, &processes)
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
    announce(
        &what.describe(pids.len(), spec.can_grow()),
        loader.usdt_site_count(),
        &plan,
        &config,
    );

    // What naming the stacks takes is parsed while they are taken, not at the stop.
    let mut symbolizer = StackSymbolizer::new();
    symbolizer.prepare(
        pids.iter()
            .filter_map(|&pid| processes.get(pid)?.maps.as_ref()),
    );
    let keeper_pid = loader.keeper_pid();
    let mut run = Run {
        loader,
        plan,
        later,
        sampler,
        processes,
        timeline,
        symbolizer,
    };
    let reason = runtime.block_on(stop::run_until_stopped_with(
        signals,
        watch,
        config.duration,
        stop::either(
            run_attached(
                &mut run.sampler,
                &mut run.loader,
                &mut run.processes,
                &mut run.plan,
                &mut run.later,
                run.timeline.as_mut(),
            ),
            stop::either(target::track(tracker.as_mut()), keeper::watch(keeper_pid)),
        ),
    ))?;

    // What was measured up to now is what is reported; the targets keep running untouched
    // from here on.
    let now = stop::monotonic_ns();
    let traced = run.detach(tracker, &pids)?;
    crate::status!(
        "Stopped: {reason}. Detached from {}.",
        match single {
            Some(pid) => format!("process {pid}"),
            None => format!("{} processes", traced.len()),
        }
    );
    let span = Span {
        reason,
        started,
        start_unix_ns,
        now,
    };
    run.report(&config, &what, traced, span)
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
    /// Detaches everything from the targets, in the order that leaves them as they were,
    /// keeping what the kernel collected readable. Returns the processes traced: those of
    /// `tracker`'s set, or `pids`.
    fn detach(&mut self, tracker: Option<TargetTracker>, pids: &[u32]) -> Result<Vec<u32>> {
        let loader = &mut self.loader;
        loader.stop_recording()?;
        // A second Ctrl-C ends the tracer at once: the keeper releases what is left.
        stop::restore_default_signals();
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
        drop(tracker);
        loader.detach_targets();
        Ok(traced)
    }

    /// Builds the report of what was collected over `span`, writes its files and prints
    /// it. Fails when the one target exited before it could be named, or a file or
    /// standard output could not be written (after printing what it could).
    fn report(
        mut self,
        config: &AttachConfig,
        what: &Subject,
        traced: Vec<u32>,
        span: Span,
    ) -> Result<()> {
        let Span {
            reason,
            started,
            start_unix_ns,
            now,
        } = span;
        let tasks = TaskInput::read(&self.loader, &self.plan, reason, now, &self.processes)?;
        let collected = self.sampler.finish(
            &self.loader,
            &mut self.processes,
            &mut self.symbolizer,
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
        let (report, output_error) = collect(
            &self.loader,
            &self.plan,
            config,
            what,
            traced,
            &self.processes,
            &mut self.symbolizer,
            collected,
            tasks,
            self.timeline.map(|t| t.timeline),
            &export,
            reason,
        )?;
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

/// The probe sites of the targets: every USDT probe of their files (a known runtime's is
/// measured), the functions `--latency` names, and the GC functions of runtimes whose
/// builds have no USDT probes (pyenv's CPython, Node).
struct FoundSites {
    sites: Vec<SiteInput>,
    /// The files searched, marked before the programs load: a library mapped from then on
    /// is one to search later.
    searched: usdt::Searched,
    requested: RequestedFunctions,
    usdt_elsewhere: UsdtElsewhere,
}

/// Finds the sites of [`FoundSites`] in process `single`, or in the set of `pids`.
fn find_sites(config: &AttachConfig, single: Option<u32>, pids: &[u32]) -> Result<FoundSites> {
    let spec = &config.targets;
    // Any failure to read the target's files while it vanishes means it exited.
    let scan = match single {
        Some(pid) => usdt::scan_process(pid, &ProbePattern::any()),
        None => usdt::scan_processes(pids, spec.exe.as_deref(), &ProbePattern::any()),
    }
    .map_err(|e| e.of_target())?;
    // What was searched, marked now: a library mapped from here on (while the programs
    // load) is one to search later.
    let searched = usdt::Searched::of_resolved(&scan.sites, pids);
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
    // Functions: those --latency names, and the GC functions of runtimes whose builds
    // have no USDT probes (pyenv's CPython, Node).
    let scope = match single {
        Some(pid) => usdt::Scope::Process(pid),
        None => usdt::Scope::Processes {
            pids,
            exe: spec.exe.as_deref(),
        },
    };
    let requested = resolve_requested_functions(config, scope)?;
    let mut usdt_elsewhere = UsdtElsewhere::default();
    let catalogue = match usdt::find(&runtimes::functions::specifiers(pids), scope) {
        Ok(found) => found.sites,
        Err(e) => {
            log::warn!("cannot look for the functions of runtimes without USDT probes: {e}");
            Vec::new()
        }
    };
    for site in catalogue
        .iter()
        .filter(|site| usdt_elsewhere.keep(site))
        .chain(&requested.sites)
    {
        match SiteInput::try_from(site) {
            Ok(input) => sites.push(input),
            Err(problem) => log::warn!("skipped a function probe: {problem}"),
        }
    }
    Ok(FoundSites {
        sites,
        searched,
        requested,
        usdt_elsewhere,
    })
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

/// The functions the --latency requests name, found in the targets: the sites, and the
/// symbol each function end names (by the request's index and end), which the latency
/// matches its sites by.
#[derive(Default)]
struct RequestedFunctions {
    sites: Vec<usdt::ProbeSite>,
    names: HashMap<(usize, bool), ProbeRef>,
}

/// Finds the functions of --latency requests. A function end names one function: a
/// pattern matching several is refused; one matching none now is looked for in what is
/// loaded later when it names a symbol literally, and refused otherwise.
fn resolve_requested_functions(
    config: &AttachConfig,
    scope: usdt::Scope<'_>,
) -> Result<RequestedFunctions> {
    let mut requested = RequestedFunctions::default();
    for (index, request) in config.latencies.iter().enumerate() {
        for (is_end, probe) in [(false, &request.begin), (true, &request.end)] {
            let LatencyProbe::Function(spec) = probe else {
                continue;
            };
            let found = usdt::find(std::slice::from_ref(spec), scope)?;
            let mut names: Vec<&str> = found.sites.iter().map(|s| s.note.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            let name = match names.as_slice() {
                [one] => one.to_string(),
                [] if spec.pattern.name.is_literal() => {
                    crate::status!(
                        "No function {} in {} yet: looking for it in what is loaded later.",
                        spec.describe(),
                        config.targets
                    );
                    spec.pattern.name.to_string()
                }
                [] => bail!("--latency: {} matches no function", spec.describe()),
                several => bail!(
                    "--latency: {} matches {} functions ({}): a latency needs one",
                    spec.describe(),
                    several.len(),
                    several
                        .iter()
                        .take(5)
                        .map(|n| crate::stack::symbolize::demangle(n))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            requested
                .names
                .insert((index, is_end), ProbeRef::function(spec.kind, &name));
            requested.sites.extend(found.sites);
        }
    }
    Ok(requested)
}

/// The probe a --latency end names: a USDT probe, or the function found for it.
fn requested_probe(
    requested: &HashMap<(usize, bool), ProbeRef>,
    index: usize,
    is_end: bool,
    probe: &LatencyProbe,
) -> ProbeRef {
    match probe {
        LatencyProbe::Usdt { provider, name } => ProbeRef::usdt(provider, name),
        LatencyProbe::Function(spec) => requested
            .get(&(index, is_end))
            .cloned()
            .unwrap_or_else(|| ProbeRef::function(spec.kind, spec.pattern.name.as_str())),
    }
}

/// The latencies to measure: every known runtime's (from USDT probes, or from functions
/// where its build has none), plus those asked for with --latency (whose probes may only
/// come in a library loaded later).
fn latencies_for(
    sites: &[SiteInput],
    config: &AttachConfig,
    requested: &HashMap<(usize, bool), ProbeRef>,
) -> Vec<LatencyDef> {
    let mut defs: Vec<LatencyDef> = runtimes::RUNTIMES
        .iter()
        .flat_map(|r| r.latency_defs())
        .chain(runtimes::functions::latency_defs())
        .collect();
    for (index, request) in config.latencies.iter().enumerate() {
        let begin = requested_probe(requested, index, false, &request.begin);
        let end = requested_probe(requested, index, true, &request.end);
        for (probe, asked) in [(&begin, &request.begin), (&end, &request.end)] {
            if matches!(asked, LatencyProbe::Usdt { .. })
                && !sites.iter().any(|s| probe.is(s.kind, &s.provider, &s.name))
            {
                crate::status!(
                    "No probe {probe} in {} yet: looking for it in what is loaded later.",
                    config.targets
                );
            }
        }
        let short = |probe: &ProbeRef| match probe.kind {
            usdt::ProbeKind::Usdt => probe.name.clone(),
            kind => format!("{}_{kind}", crate::stack::symbolize::demangle(&probe.name)),
        };
        // A function's entry to its return is the function's own time, named after it.
        let name = match begin.kind == usdt::ProbeKind::Uprobe
            && end.kind == usdt::ProbeKind::Uretprobe
            && begin.name == end.name
        {
            true => crate::stack::symbolize::demangle(&begin.name),
            false => format!("{}_to_{}", short(&begin), short(&end)),
        };
        defs.push(LatencyDef::between(name, begin, end));
    }
    defs
}

/// What is looked for in objects mapped later: every known runtime's probes (or its
/// functions, where its build has no USDT probes), and the probes and functions asked for
/// with --latency.
fn later_specs(
    config: &AttachConfig,
    requested: &HashMap<(usize, bool), ProbeRef>,
) -> Vec<usdt::UsdtSpecifier> {
    let mut providers: Vec<&str> = runtimes::RUNTIMES.iter().map(|r| r.provider).collect();
    let mut specs = runtimes::functions::specifiers(&[]);
    for (index, request) in config.latencies.iter().enumerate() {
        for (is_end, probe) in [(false, &request.begin), (true, &request.end)] {
            match probe {
                LatencyProbe::Usdt { provider, .. } => providers.push(provider),
                LatencyProbe::Function(spec) => {
                    // The function found, by its symbol, in whatever file the spec names.
                    let mut spec = spec.clone();
                    if let Some(found) = requested.get(&(index, is_end)) {
                        spec.pattern = ProbePattern::new("", &usdt::escape_glob(&found.name));
                    }
                    specs.push(spec);
                }
            }
        }
    }
    providers.sort_unstable();
    providers.dedup();
    providers
        .into_iter()
        .filter_map(|provider| usdt::parse_specifier(&format!("usdt:*:{provider}:*")).ok())
        .chain(specs)
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

/// The runtimes whose probes are attached, each once, those measured through their
/// functions saying so.
fn runtime_names(plan: &ProbePlan) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for probe in &plan.probes {
        let name = match runtimes::by_provider(&probe.provider) {
            Some(runtime) if probe.kind == usdt::ProbeKind::Usdt => runtime.name.to_string(),
            _ => match runtimes::functions::runtime_of(probe.kind, &probe.path, &probe.name) {
                Some(runtime) => format!(
                    "{} (GC from function probes: no USDT in this build)",
                    runtime.name
                ),
                None => continue,
            },
        };
        if !names.contains(&name) {
            names.push(name);
        }
    }
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
    let latencies = latency_reports(loader, plan, &by_process, &name_of)?;
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

/// The report of each latency of `plan`: its histogram, by process and by class. A
/// known runtime's latency whose probes were never found is left out; one asked for with
/// --latency says which were not found.
fn latency_reports(
    loader: &Loader,
    plan: &ProbePlan,
    by_process: &[(LatencyProcessKey, LatencyStats)],
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
        let (hist, per_process, by_class) = measured(loader, def, id as u32, by_process, name_of)?;
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
                        .find(|p| p.pid == process.pid)
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
    by_process: &[(LatencyProcessKey, LatencyStats)],
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

/// Adds `more` to the totals `into`.
fn add_stats(into: &mut LatencyStats, more: &LatencyStats) {
    into.count += more.count;
    into.total_ns += more.total_ns;
    into.min_ns = into.min_ns.min(more.min_ns);
    into.max_ns = into.max_ns.max(more.max_ns);
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

/// Only a valid site becomes something to attach: the offsets come from
/// [`usdt::validate`], and a malformed note is its error.
impl TryFrom<&usdt::ProbeSite> for SiteInput {
    type Error = usdt::UsdtError;

    fn try_from(site: &usdt::ProbeSite) -> Result<Self, usdt::UsdtError> {
        let offsets = site.offsets()?;
        Ok(SiteInput {
            path: site.binary.path.clone(),
            attach_path: site.binary.host_path.clone(),
            kind: site.kind,
            provider: site.note.provider.clone(),
            name: site.note.name.clone(),
            file_offset: offsets.probe,
            semaphore_offset: offsets.semaphore,
            args: site.args.clone(),
        })
    }
}
