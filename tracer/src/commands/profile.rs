//! `tracer profile [--pid PID ...]`: a wall-clock profile. On-CPU stacks sampled at a
//! fixed frequency on every CPU and off-CPU (blocked) time from `sched_switch`, of the
//! selected processes (see [`crate::target`]) or of every process, until the duration
//! ends, Ctrl-C, or the targets exit.
//!
//! Every thread of the processes selected at the start is marked off CPU when profiling
//! starts, under the stacks it is blocked in (running threads replace the mark at their
//! next switch), so threads blocked since before are accounted.
//!
//! Outputs in the output directory: `wallclock.{svg,folded}` (both together; blocked
//! stacks end in an `[off-cpu]` frame), `oncpu.{svg,folded}`, `offcpu.{svg,folded}`,
//! `wallclock.pb.gz` (pprof) and `wallclock.speedscope.json` (the three views). Weights
//! are microseconds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use tracer_common::counter;

use crate::{
    cli::ProfileConfig,
    commands::metrics::{self, MetricSources, Metrics},
    kernel::{Features, KernelTargets, LaunchNeeds, Loader, Settings},
    output::render::{self, export::ExportInfo, views::write_profile_files},
    output::report::{StackLosses, profile_summary},
    probe::runtimes,
    profile::dwarf_snapshots::unwind_summary,
    profile::sampling::{self, Collected, Sampling, UnwindMethod, ViewOptions, WallClockSampler},
    profile::wallclock::{self, WallClockProfile},
    session::Session,
    stack::processes::Processes,
    stack::symbolize::StackSymbolizer,
    system::privileges,
    system::procfs,
    system::stop::{self, StopReason},
    system::text::escape_text,
    target::{self, TargetTracker},
};

pub(crate) fn run(config: ProfileConfig) -> Result<()> {
    privileges::check()?;
    let spec = &config.targets;
    // At once: what the load needs is made ready while the targets are scanned.
    let session = Session::start(
        LaunchNeeds {
            usdt_sites: false,
            kernel_types: true,
        },
        spec.single_pid(),
        config.duration,
    )?;
    let targets = match spec.is_everything() {
        true => None,
        false => Some(spec.find()?),
    };
    let mut processes = Processes::default();
    let what = observe_targets(&mut processes, spec, targets.as_ref())?;
    // Before anything is attached: a profile whose files cannot be written fails now, and
    // so does an address that cannot be listened on.
    render::prepare_output_dir(&config.output_dir)?;
    let endpoint = metrics::bind(config.metrics.as_ref())?;
    let sampling = config.sampling;
    let unwind_ring_bytes = WallClockSampler::unwind_ring_bytes(&sampling, targets.is_none());

    let (attaching, mut loader) = session.load(&Settings {
        targets: targets.clone(),
        min_block: config.min_block,
        features: Features {
            process_metrics: config.metrics.is_some(),
            ..WallClockSampler::features(&sampling)
        },
        unwind_ring_bytes,
        map_sizes: config.map_sizes,
        ..Settings::default()
    })?;
    let mut tracker = TargetTracker::for_set(spec, &loader)?;
    // The kernel tells of code mapped later: no process's maps are read to find it.
    match loader.watch_code_mappings() {
        Ok(()) => processes.maps_told_by_kernel(),
        Err(e) => {
            log::warn!("cannot watch for code mapped later ({e}): maps are read every second");
        }
    }
    let mut loader = loader.maps_ready()?;
    let mut sampler =
        WallClockSampler::attach(&mut loader, targets.as_ref(), sampling, &processes)?;
    let _diagnostics = loader.start_diagnostics(&[]);
    let start_unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    // Ctrl-C from the moment the line below is printed must stop the profile, not kill us.
    let running = attaching.go()?;
    let metrics = metrics::serve(endpoint, running.runtime())?;
    announce(&what, &sampling, sampler.cpus, config.duration);

    // What naming the stacks takes is parsed while they are taken, not at the stop.
    let mut symbolizer = StackSymbolizer::new();
    symbolizer.prepare(
        targets
            .iter()
            .flat_map(|t| &t.members)
            .filter_map(|m| processes.get(m.pid)?.maps.as_ref()),
    );
    let keeper_pid = loader.keeper_pid();
    let (reason, stopped) = running.until_stopped(
        run_profile(&mut sampler, &mut loader, &mut processes, metrics),
        tracker.as_mut(),
        keeper_pid,
    )?;

    let now = stop::monotonic_ns();
    sampler.detach(&mut processes);
    loader.detach_targets();
    stopped.let_signals_kill();
    crate::status!("Stopped: {reason}. Detached.");
    let started = sampler.started_ns;
    let Collected {
        profile,
        unwind_stats,
    } = sampler.finish(
        &loader,
        &mut processes,
        &mut symbolizer,
        reason,
        now,
        ViewOptions {
            per_thread: config.per_thread,
            group_by: config.group_by,
            min_block: config.min_block,
            // No task probes are attached.
            task_names: Default::default(),
        },
    )?;
    let elapsed_ns = now - started;
    let (outputs, output_error) = write_profile_files(
        &profile,
        &config.output_dir,
        &what,
        &ExportInfo {
            name: &what,
            frequency_hz: sampling.frequency_hz,
            start_unix_ns,
            duration_ns: elapsed_ns,
            process_labels: false,
            only_pid: None,
        },
    );
    let counters = loader.counters()?;
    let mut text = profile_summary(
        &profile,
        &what,
        sampling.frequency_hz,
        elapsed_ns,
        &outputs,
        &StackLosses::from_counters(&counters, config.map_sizes.stack_slots()),
        counters[counter::MAP_FULL as usize],
    );
    if let Some(stats) = unwind_stats {
        text += &unwind_summary(&stats, &counters, unwind_ring_bytes);
    }
    text += &crate::output::report::program_misses_line(&loader.program_misses());
    if let Some(line) = unnamed_hint(&profile, targets.as_ref(), &processes) {
        text += &line;
        text.push('\n');
    }
    crate::system::console::print(text)?;
    // The summary is printed even when a file could not be written; the error comes after.
    match output_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Reads the name and maps of each process of `targets` (a missing single target is an
/// error; a set member that left meanwhile is skipped) and says what is profiled.
fn observe_targets(
    processes: &mut Processes,
    spec: &target::TargetSpec,
    targets: Option<&KernelTargets>,
) -> Result<String> {
    if let Some(pid) = spec.single_pid() {
        let info = processes.observe_target(pid).map_err(|e| {
            let context = format!("cannot read /proc/{pid} (its name and memory maps)");
            procfs::target_error(pid, anyhow::Error::new(e).context(context))
        })?;
        return Ok(format!("{} (pid {pid})", info.name));
    }
    for member in targets.iter().flat_map(|t| &t.members) {
        if let Err(e) = processes.observe_target(member.pid) {
            log::debug!("cannot read process {}: {e}", member.pid);
        }
    }
    Ok(match targets {
        Some(_) => spec.to_string(),
        None => "all processes".to_string(),
    })
}

/// Samples, and answers the scrapes of `metrics` meanwhile. Never finishes on its own.
async fn run_profile(
    sampler: &mut WallClockSampler,
    loader: &mut Loader,
    processes: &mut Processes,
    mut metrics: Option<Metrics>,
) -> std::io::Result<StopReason> {
    let mut chores = sampling::SamplerChores::default();
    let mut ticker = tokio::time::interval(sampling::SamplerChores::period(sampler));
    let mut filling = sampler.ring_wakeups();
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                chores.run_with_mappings(sampler, loader, processes);
                sampling::keep_pace(&mut ticker, sampling::SamplerChores::period(sampler));
            }
            () = sampling::ring_filling(&mut filling) => {
                chores.drain_due();
                chores.run_with_mappings(sampler, loader, processes);
            }
            scrape = metrics::next_scrape(&mut metrics) => {
                if let Some(metrics) = metrics.as_mut() {
                    metrics.answer(scrape, MetricSources {
                        loader,
                        plan: None,
                        processes,
                        sampler,
                        retired_oncpu: None,
                    });
                }
            }
        }
    }
}

/// Says what is profiled, at which frequency, for how long, and how to stop.
fn announce(what: &str, sampling: &Sampling, cpus: usize, duration: Option<Duration>) {
    crate::status!(
        "Attached to {}: on-CPU sampling at {} Hz{} on {} CPUs, sched_switch. {}",
        escape_text(what),
        sampling.frequency_hz,
        match sampling.unwind {
            UnwindMethod::Dwarf => " (DWARF unwinding)",
            UnwindMethod::Fp => " (frame pointers)",
        },
        cpus,
        match duration {
            Some(d) => format!("Profiling for {d:?}; Ctrl-C to stop early."),
            None => "Ctrl-C to stop.".into(),
        }
    );
}

/// The line that says how much of `profile` is unnamed, with how the first target's
/// runtime would name its JIT code; none when nearly all of it is named.
fn unnamed_hint(
    profile: &WallClockProfile,
    targets: Option<&KernelTargets>,
    processes: &Processes,
) -> Option<String> {
    let pid = targets.iter().flat_map(|t| &t.members).next()?.pid;
    let maps = processes.get(pid).and_then(|p| p.maps.as_ref());
    let files = maps
        .into_iter()
        .flat_map(|m| m.mapped_files().map(|f| f.path));
    wallclock::unnamed_line(profile, || runtimes::jit_naming_hint(pid, files))
}
