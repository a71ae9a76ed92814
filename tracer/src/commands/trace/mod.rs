//! `tracer trace PROBE... [-- CMD]`: one line per probe hit with its decoded arguments,
//! or counts per probe; with `--stack`, each hit's stack after its line, or counts per
//! stack written as a flame graph.

mod counts;
mod events;
mod hit_stacks;

use std::{num::NonZeroU32, path::PathBuf};

use anyhow::{Result, bail};
use tokio::io::unix::AsyncFd;
use tracer_common::counter;

use counts::{count_text, kernel_stack_counts, stack_counts};
use events::{ArgType, EventPrinter, probe_arg_types};
use hit_stacks::StackNamer;

use crate::{
    cli::{Format, TraceConfig},
    kernel::{Features, KernelTargets, LaunchNeeds, Loader, RecordRing, Settings},
    output::render,
    probe::late_sites::{self, LateSites, Members, searches_processes},
    probe::plan::{ProbePlan, SiteInput, SiteMode},
    probe::usdt::{self, Scope},
    profile::sampling::UnwindMethod,
    session::{Running, Session, Stopped},
    stack::python::Interpreters,
    stack::symbolize::ProcessMaps,
    system::console::{OutputError, OutputStream},
    system::privileges,
    system::procfs,
    system::stop::StopReason,
    system::text::escape_text,
    target::launch::PausedChild,
    target::{TargetSpec, TargetTracker},
};

pub(crate) fn run(config: TraceConfig) -> Result<()> {
    privileges::check()?;
    if config.count && config.stack {
        // Now rather than after the trace: a directory we cannot write fails the run
        // before the target runs.
        render::prepare_output_dir(&config.output_dir)?;
    }
    let specs = config
        .probes
        .iter()
        .map(|p| usdt::parse_specifier(p))
        .collect::<Result<Vec<_>, _>>()?;
    // Fork before any other thread exists; the child waits until the probes are attached.
    let mut child = match &config.command {
        Some(argv) => Some(PausedChild::spawn(argv)?),
        None => None,
    };
    // Whose hits: the command (and with --children its forks), the targets, or every
    // process running the probes' files.
    let spec = match &child {
        Some(child) => TargetSpec {
            pids: NonZeroU32::new(child.pid).into_iter().collect(),
            ..config.targets.clone()
        },
        None => config.targets.clone(),
    };
    let single = spec.single_pid();
    // Kernel types only for a set of processes (each hit's process is checked against
    // the set, start time included) or a PID namespace of its own.
    // And to find a thread's Python frames.
    let python_frames = config.stack && config.unwind == UnwindMethod::Dwarf;
    let session = Session::start(
        LaunchNeeds {
            usdt_sites: true,
            kernel_types: (!spec.is_everything() && single.is_none()) || python_frames,
        },
        single,
        config.duration,
    )?;
    let targets = match spec.is_everything() {
        true => None,
        false => Some(spec.find()?),
    };
    let pids: Vec<u32> = targets
        .iter()
        .flat_map(|t| &t.members)
        .map(|m| m.pid)
        .collect();
    let scope = search_scope(child.as_ref(), &spec, targets.is_some(), &pids, &specs);
    // A target watched is known to have existed: missing, it exited.
    let on_target = |e: anyhow::Error| match single {
        Some(pid) => procfs::target_error(pid, e),
        None => e,
    };
    let Planned {
        mut plan,
        later_specs,
        searched,
        types,
        mode,
    } = plan_probes(&config, &specs, scope, single, &pids)?;
    let dwarf = config.stack && config.unwind == UnwindMethod::Dwarf;
    let (attaching, mut loader) = session.load(&load_settings(
        &config,
        targets.clone(),
        &plan,
        !later_specs.is_empty(),
    ))?;
    let mut tracker = TargetTracker::for_set(&spec, &loader)?;
    loader
        .attach_usdt_sites(&plan.usdt_sites())
        .map_err(|e| on_target(e.into()))?;
    // The maps a trace without stacks does not use were created with one entry each.
    let mut loader = loader.maps_ready().map_err(|e| on_target(e.into()))?;
    let probe_names = plan.specifiers();
    let _diagnostics = loader.start_diagnostics(&probe_names);
    let events = loader.take_events()?;
    let snapshots = match dwarf {
        true => Some(loader.take_unwind_samples()?),
        false => None,
    };
    let child_pid = child.as_ref().map(|c| c.pid);
    let interpreters = python_interpreters(&mut loader, python_frames, &pids, child_pid)?;
    let later = Later {
        specs: later_specs,
        searched,
        mode,
    };
    let mut later =
        look_later(later, &mut loader, &config, &spec, child.as_ref(), &pids).map_err(on_target)?;
    // Ctrl-C from the moment the line below is printed (and the command runs) must stop
    // the trace, not kill us.
    let running = attaching.go()?;
    crate::status!(
        "Attached {} probes ({} sites){}. Ctrl-C to stop.",
        plan.probes.len(),
        loader.usdt_site_count(),
        whose_text(single, targets.is_some(), &spec)
    );
    if let Some(child) = child.as_mut() {
        child.resume()?;
    }

    let stacks = config
        .stack
        .then(|| StackNamer::new(snapshots, interpreters));
    let mut printer = EventPrinter::new(&config, &plan, probe_names, types, stacks);
    // Standard output has a writer thread of its own: a reader that stalls never keeps
    // the tracer from stopping (and detaching) when asked.
    let out = OutputStream::stdout();
    if config.format == Format::Text && !config.count {
        let header = format!("{:>12} {:>7} {:>7} PROBE ARGS\n", "TIME(s)", "PID", "TID");
        out.send_blocking(header.into_bytes(), 0);
    }
    let (reason, stopped, mut events) = stream_until_stopped(
        running,
        events,
        &mut printer,
        &mut Pumped {
            loader: &mut loader,
            later: later.as_mut(),
            plan: &mut plan,
            format: config.format,
        },
        tracker.as_mut(),
        &out,
    )?;
    detach(&mut loader, &stopped, later.as_mut(), tracker)?;
    // The target is as it was; now what is left for standard output, for as long as its
    // reader takes it.
    if reason != StopReason::OutputClosed {
        let (bytes, count) = printer.format(&mut events, &loader);
        if count > 0 {
            out.send_blocking(bytes, count);
        }
    }
    if config.count {
        let text = counts_of_the_run(&loader, &plan, &mut printer, &config, dwarf)?;
        out.send_blocking(text.into_bytes(), 0);
    }
    // Tracing has ended: so does the command.
    let exit = child
        .as_ref()
        .and_then(super::super::target::launch::PausedChild::finish);
    report_the_end(&loader, out, &printer, &config, reason, exit)
}

/// Whose hits the trace shows, for the line that says the probes are attached.
fn whose_text(single: Option<u32>, has_targets: bool, spec: &TargetSpec) -> String {
    match (single, has_targets) {
        (Some(pid), _) => format!(" in process {pid}"),
        (None, true) => format!(" in {spec}"),
        (None, false) => " in every process running them".into(),
    }
}

/// Prints events as they come until the trace stops (see [`Running::until_stopped`]);
/// gives back the ring buffer with what is left in it.
fn stream_until_stopped(
    running: Running,
    events: RecordRing,
    printer: &mut EventPrinter,
    pumped: &mut Pumped<'_>,
    tracker: Option<&mut TargetTracker>,
    out: &OutputStream,
) -> std::io::Result<(StopReason, Stopped, RecordRing)> {
    let keeper_pid = pumped.loader.keeper_pid();
    let mut events = {
        let _registering = running.runtime().enter();
        events.into_async()?
    };
    let (reason, stopped) =
        running.until_stopped(pump(&mut events, printer, pumped, out), tracker, keeper_pid)?;
    Ok((reason, stopped, events.into_inner()))
}

/// Where the probes are searched for: the command's executable, the targets, every
/// process (`usdt:*` or no path with no process named, which also looks at those that
/// start later), or the files named.
fn search_scope<'a>(
    child: Option<&'a PausedChild>,
    spec: &'a TargetSpec,
    has_targets: bool,
    pids: &'a [u32],
    specs: &[usdt::UsdtSpecifier],
) -> Scope<'a> {
    match (child, spec.single_pid()) {
        (Some(child), _) => Scope::Files {
            exe: Some(&child.exe),
        },
        (None, Some(pid)) => Scope::Process(pid),
        (None, None) if has_targets => Scope::Processes {
            pids,
            exe: spec.exe.as_deref(),
        },
        (None, None) if specs.iter().any(searches_processes) => Scope::Everything,
        (None, None) => Scope::Files { exe: None },
    }
}

/// What to look for in objects mapped later, as [`plan_probes`] found it.
struct Later {
    specs: Vec<usdt::UsdtSpecifier>,
    searched: usdt::Searched,
    mode: SiteMode,
}

/// The look for objects mapped later, when there is something to look for, with the
/// kernel telling of the targets (or the command) mapping code (see [`LateSites::watch`]).
fn look_later(
    later: Later,
    loader: &mut Loader,
    config: &TraceConfig,
    spec: &TargetSpec,
    child: Option<&PausedChild>,
    pids: &[u32],
) -> Result<Option<LateSites>> {
    if later.specs.is_empty() {
        return Ok(None);
    }
    let single = spec.single_pid();
    let exes = match (child, spec.is_everything()) {
        (_, true) => Vec::new(),
        (Some(child), false) => vec![(child.exe.clone(), PathBuf::from("/"))],
        (None, false) => late_sites::executables_of(pids, spec.exe.as_deref()),
    };
    let members = match (child.map(|c| c.pid), spec.is_everything()) {
        (Some(pid), _) if single.is_some() => Members::One(pid),
        (_, true) => Members::Every,
        _ => match single {
            Some(pid) => Members::One(pid),
            None => Members::Set,
        },
    };
    let Later {
        specs,
        searched,
        mode,
    } = later;
    let mut later = LateSites::new(specs, searched, mode, Vec::new(), single, members)
        .holding(config.hold_at_dlopen);
    later.watch(loader, exes, pids)?;
    Ok(Some(later))
}

/// Detaches everything from the targets, in the order that leaves them as they were,
/// keeping what the kernel collected readable.
fn detach(
    loader: &mut Loader,
    stopped: &Stopped,
    later: Option<&mut LateSites>,
    tracker: Option<TargetTracker>,
) -> Result<()> {
    loader.stop_recording()?;
    stopped.let_signals_kill();
    if let Some(later) = later {
        later.release_all(loader);
    }
    loader.detach_usdt()?;
    drop(tracker);
    loader.detach_targets();
    Ok(())
}

/// What the load of a trace sets up: the rings, room for the sites found later when
/// `grows`, and the programs events and stacks need.
fn load_settings(
    config: &TraceConfig,
    targets: Option<KernelTargets>,
    plan: &ProbePlan,
    grows: bool,
) -> Settings {
    let dwarf = config.stack && config.unwind == UnwindMethod::Dwarf;
    Settings {
        targets,
        ring_buffer_bytes: config.ring_buffer_bytes,
        unwind_ring_bytes: match dwarf {
            true => UNWIND_RING_BYTES,
            false => Settings::default().unwind_ring_bytes,
        },
        // Sites found later get cookies after these: room for them.
        plan_sizes: Some(match grows {
            true => plan.room_to_grow(),
            false => plan.sizes(),
        }),
        features: Features {
            // Counting by stack announces each new stack through the event ring.
            events: !config.count || config.stack,
            hit_stacks: config.stack,
            python_frames: dwarf,
            ..Features::NONE
        },
        ..Settings::default()
    }
}

/// What [`plan_probes`] found to attach.
struct Planned {
    plan: ProbePlan,
    /// What may match objects not mapped yet: specifiers that search a process's objects
    /// (no path, `*`, a file name), looked for again in what the processes map later.
    later_specs: Vec<usdt::UsdtSpecifier>,
    /// The files searched already.
    searched: usdt::Searched,
    /// The type of each argument of each probe, as events show it.
    types: Vec<Vec<ArgType>>,
    mode: SiteMode,
}

/// The sites `specs` match in `scope`, and the plan of what the kernel does at each.
fn plan_probes(
    config: &TraceConfig,
    specs: &[usdt::UsdtSpecifier],
    scope: Scope<'_>,
    single: Option<u32>,
    pids: &[u32],
) -> Result<Planned> {
    let later_specs: Vec<_> = specs
        .iter()
        .filter(|spec| {
            searches_processes(spec) || spec.path.as_deref().is_some_and(|p| !p.contains('/'))
        })
        .cloned()
        .collect();
    let resolved = match usdt::resolve(specs, scope) {
        // None yet: they may be in a library loaded later.
        Err(usdt::UsdtError::NoProbes { wanted, .. }) if !later_specs.is_empty() => {
            crate::status!(
                "No probes match {wanted} yet: looking for them in what is loaded later."
            );
            usdt::Resolved::default()
        }
        result => result.map_err(|e| match single {
            Some(pid) => procfs::target_error(pid, e.of_target()),
            None => e.into(),
        })?,
    };
    for skipped in &resolved.skipped {
        log::warn!("skipped a probe site: {skipped}");
    }
    let inputs = resolved
        .sites
        .iter()
        .map(SiteInput::try_from)
        .collect::<Result<Vec<_>, _>>()?;
    let dwarf = config.stack && config.unwind == UnwindMethod::Dwarf;
    // Stacks unwound here come one per hit, so DWARF counts are made from events.
    let mode = if config.count && !dwarf {
        SiteMode::Count
    } else {
        SiteMode::Events
    };
    // One process's sites are attached for it alone; a set's for every process mapping
    // the files, the kernel keeping the targets' hits.
    let mut plan = ProbePlan::build(&inputs, &[], &[], mode, single)?;
    plan.show_strings(&config.strings)?;
    if dwarf {
        plan.take_stack_snapshots();
    } else if config.stack {
        plan.take_stacks();
    }
    warn_unavailable(&plan.unavailable_args, &plan, config.format);
    let types = probe_arg_types(&plan);
    let searched = usdt::Searched::of_resolved(
        &resolved.sites,
        &match scope {
            Scope::Everything => procfs::all_processes(),
            Scope::Process(pid) => vec![pid],
            _ => pids.to_vec(),
        },
    );
    Ok(Planned {
        plan,
        later_specs,
        searched,
        types,
        mode,
    })
}

/// The CPython interpreters of the processes running when the trace starts (not the
/// command, which has not run yet), told to the kernel: the stacks of their hits carry
/// Python frames. None unless `python_frames`.
fn python_interpreters(
    loader: &mut Loader,
    python_frames: bool,
    pids: &[u32],
    command: Option<u32>,
) -> Result<Interpreters> {
    let mut interpreters = match python_frames {
        true => Interpreters::default(),
        false => Interpreters::disabled(),
    };
    for &pid in pids.iter().filter(|&&pid| Some(pid) != command) {
        interpreters.find(pid, ProcessMaps::capture(pid).ok().as_ref());
    }
    for (tgid, process) in interpreters.ready_for_kernel() {
        loader.add_python_process(tgid, &process)?;
    }
    Ok(interpreters)
}

/// `--count`'s output: the hits per probe, and with `--stack` the most frequent stacks.
fn counts_of_the_run(
    loader: &Loader,
    plan: &ProbePlan,
    printer: &mut EventPrinter,
    config: &TraceConfig,
    dwarf: bool,
) -> Result<String> {
    let by_stack = match printer.stacks.as_mut() {
        Some(namer) => {
            let counts = match dwarf {
                true => std::mem::take(&mut printer.counted).into_iter().collect(),
                false => kernel_stack_counts(loader, namer)?,
            };
            Some(stack_counts(loader, plan, counts, config)?)
        }
        None => None,
    };
    count_text(loader, plan, config.format, by_stack.as_ref())
}

/// Waits for standard output to take what is left, and says how the trace ended: why,
/// how many events, how many lost or not written, how the command ended. Fails when
/// events were lost or standard output failed.
fn report_the_end(
    loader: &Loader,
    out: OutputStream,
    printer: &EventPrinter,
    config: &TraceConfig,
    reason: StopReason,
    exit: Option<impl std::fmt::Display>,
) -> Result<()> {
    let (written, output) = out.finish();
    // The events of a count (stack announcements, or hits to unwind) are not printed.
    let (written, printed) = match config.count {
        true => (0, 0),
        false => (written, printer.count),
    };
    let not_written = printed.saturating_sub(written);
    let lost = loader.counters()?[counter::EVENTS_LOST as usize];
    crate::status!(
        "Stopped: {reason}. {written} events{}{}{}.",
        if lost > 0 {
            format!(", {lost} LOST (ring buffer full; raise --ring-buffer)")
        } else {
            ", none lost".into()
        },
        if not_written > 0 {
            format!(", {not_written} collected but not written to standard output")
        } else {
            String::new()
        },
        exit.map(|end| format!("; {end}")).unwrap_or_default()
    );
    match output {
        // The reader went away: it wanted no more (like `| head`).
        Ok(()) | Err(OutputError::Closed) => {}
        Err(e) => return Err(e.into()),
    }
    if lost > 0 {
        bail!("{lost} events were lost");
    }
    Ok(())
}

/// Size of the ring of stack snapshots (16 KiB each) with `--unwind dwarf`.
const UNWIND_RING_BYTES: u32 = 32 << 20;

/// Hands the events to standard output's writer as they arrive, until that fails. While
/// the writer's queue is full (a reader that stalls), the ring buffer is not drained: its
/// overflow is counted by the kernel, and stop signals are still seen meanwhile.
async fn pump(
    events: &mut AsyncFd<RecordRing>,
    printer: &mut EventPrinter,
    pumped: &mut Pumped<'_>,
    out: &OutputStream,
) -> std::io::Result<StopReason> {
    let mut notices = pumped
        .later
        .as_deref_mut()
        .and_then(LateSites::take_notices);
    let mut ticker = tokio::time::interval(late_sites::look_period(notices.as_ref()));
    loop {
        tokio::select! {
            _ = ticker.tick() => pumped.look(printer, notices.is_none()),
            () = late_sites::held_notice(&mut notices) => pumped.look(printer, true),
            guard = events.readable_mut() => {
                let mut guard = guard?;
                // Clear before draining: the kernel only wakes a reader that has caught
                // up, so a wakeup arriving during the drain must not be cleared afterwards.
                guard.clear_ready();
                // The events are taken off the ring only once the queue has room: a stop
                // arriving meanwhile finds them there, to write them out itself.
                let ring = guard.get_inner_mut();
                let loader = &*pumped.loader;
                if !out.send_made(|| printer.format(ring, loader)).await {
                    return Ok(StopReason::OutputClosed);
                }
            }
            () = out.failed() => return Ok(StopReason::OutputClosed),
        }
    }
}

/// What [`pump`] works with besides the events: the loader (whose stacks events name)
/// and the look for objects mapped since the start.
struct Pumped<'a> {
    loader: &'a mut Loader,
    later: Option<&'a mut LateSites>,
    plan: &'a mut ProbePlan,
    format: Format,
}

impl Pumped<'_> {
    /// `told`: see [`LateSites::look`].
    fn look(&mut self, printer: &mut EventPrinter, told: bool) {
        let Some(later) = self.later.as_deref_mut() else {
            return;
        };
        let added = later.look(self.loader, self.plan, told);
        // Mappings read before the new objects were mapped would not name their frames.
        if (!added.is_empty() || !added.remapped.is_empty())
            && let Some(namer) = printer.stacks.as_mut()
        {
            namer.maps.clear();
        }
        if added.is_empty() {
            return;
        }
        warn_unavailable(
            &self.plan.unavailable_args[added.unavailable_args],
            self.plan,
            self.format,
        );
        printer.names = self.plan.specifiers();
        printer.kinds = self.plan.probes.iter().map(|p| p.kind).collect();
        printer.types = probe_arg_types(self.plan);
    }
}

/// One warning per argument events cannot show.
fn warn_unavailable(args: &[crate::probe::plan::UnavailableArg], plan: &ProbePlan, format: Format) {
    for arg in args {
        log::warn!(
            "{}: arg{} {}: unavailable, shown as {}",
            escape_text(&plan.probes[arg.probe_id as usize].specifier()),
            arg.index,
            escape_text(&arg.reason),
            match format {
                Format::Text => "?",
                Format::Json => "null",
            }
        );
    }
}
