//! `tracer attach --pid PID`: GC and other latencies from the target's USDT probes, and an
//! off-CPU profile of its threads, until the duration ends, Ctrl-C, or the target exits.

use std::path::Path;

use anyhow::{Context as _, Result, bail};
use tracer_common::{counter, site_flags};

use crate::{
    cli::{AttachConfig, Format},
    histogram::LatencyHistogram,
    loader::{Features, Loader, Settings},
    offcpu::{self, StackSource, ThreadNames},
    privileges,
    probe_plan::{ProbePlan, SiteInput, SiteMode},
    procfs,
    render::{
        escape_text,
        flamegraph::{FoldedStacks, Palette, SvgOptions, write_flamegraph_svg, write_folded},
    },
    report::{AttachReport, LatencyReport, Losses, ProbeReport, TaskReport},
    runtimes::{self, LatencyDef, Runtime, TaskProbeDef},
    stop::{self, ProcessWatch, StopReason},
    symbolize::{ProcessMaps, StackSymbolizer},
    tasks,
    usdt::{self, ProbePattern, UsdtError},
};

impl StackSource for Loader {
    fn stack(&self, id: i32) -> Vec<u64> {
        Loader::stack(self, id).unwrap_or_default()
    }
}

pub fn run(config: AttachConfig) -> Result<()> {
    privileges::check()?;
    // At once: the first uprobe waits for an RCU grace period, the longest step of a launch.
    let warm_up = Loader::warm_up_uprobes();
    let pid = config.pid.get();
    let watch = ProcessWatch::target(pid)?;
    // From here on the target is known to have existed: wherever it is missing, it
    // exited (or /proc hides it).
    let comm = format!("/proc/{pid}/comm");
    let process_name = procfs::read_name(Path::new(&comm)).map_err(|e| {
        procfs::target_error(
            pid,
            anyhow::Error::new(e).context(format!("cannot read {comm}")),
        )
    })?;

    let scan = usdt::scan_process(pid, &ProbePattern::any()).map_err(UsdtError::of_target)?;
    for (object, error) in &scan.skipped {
        log::debug!("skipped {}: {error}", object.path.display());
    }
    let sites: Vec<SiteInput> = scan.sites.iter().map(SiteInput::from).collect();
    let latencies = latencies_for(&sites, &config)?;
    let task_probes: Vec<TaskProbeDef> = known_runtimes(&sites)
        .flat_map(|r| r.task_probe_defs())
        .collect();
    let plan = ProbePlan::build(
        &sites,
        &latencies,
        &task_probes,
        SiteMode::LatenciesOnly,
        Some(pid),
    )?;

    let mut maps = ProcessMaps::capture(pid).map_err(|e| {
        let context = format!("cannot read the memory maps of process {pid}");
        procfs::target_error(pid, anyhow::Error::new(e).context(context))
    })?;
    let mut threads = ThreadNames::default();
    threads.refresh(pid);

    let mut loader = Loader::load(&Settings {
        target_tgid: Some(pid),
        min_block: config.min_block,
        features: Features {
            latencies: true,
            offcpu: true,
            tasks: true,
            ..Features::NONE
        },
        map_sizes: config.map_sizes,
        plan_sizes: Some(plan.sizes()),
        ..Settings::default()
    })?;
    loader
        .attach_usdt_sites(&plan.usdt_sites(), warm_up)
        .map_err(|e| procfs::target_error(pid, e))?;
    loader.attach_sched_switch()?;
    let started = stop::monotonic_ns();

    // Ctrl-C from the moment the line below is printed must stop the trace, not kill us.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let signals = stop::StopSignals::catch(&runtime)?;
    let runtime_names = runtime_names(&plan);
    eprintln!(
        "Attached to process {pid} ({}): {} probe sites{}, sched_switch. {}",
        escape_text(&process_name),
        loader.usdt_site_count(),
        if runtime_names.is_empty() {
            " (no known runtime probes found)".into()
        } else {
            format!(" of {}", runtime_names.join(", "))
        },
        match config.duration {
            Some(d) => format!("Tracing for {d:?}; Ctrl-C to stop early."),
            None => "Ctrl-C to stop.".into(),
        }
    );

    let reason = runtime.block_on(stop::run_until_stopped_with(
        signals,
        Some(watch),
        config.duration,
        stop::every_second(|| {
            let _ = maps.refresh();
            threads.refresh(pid);
        }),
    ))?;

    // Collect first, detach next, so what was measured up to now is what is reported; the
    // target keeps running untouched from here on.
    let now = stop::monotonic_ns();
    if reason != StopReason::TargetExited {
        let _ = maps.refresh();
        threads.refresh(pid);
    }
    loader.stop_recording()?;
    loader.detach_usdt();
    loader.detach_sched_switch()?;
    eprintln!("Stopped: {reason}. Detached from process {pid}.");

    let (report, output_error) = collect(
        &loader,
        &plan,
        &config,
        &maps,
        &threads,
        &process_name,
        reason,
        now,
        now - started,
    )?;
    match config.format {
        Format::Text => print!("{}", report.to_text()),
        Format::Json => println!("{}", serde_json::to_string_pretty(&report.to_json())?),
    }
    match output_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The latencies to measure: every known runtime whose provider the target carries, plus
/// those asked for with --latency (whose probes must exist).
fn latencies_for(sites: &[SiteInput], config: &AttachConfig) -> Result<Vec<LatencyDef>> {
    let mut defs: Vec<LatencyDef> = known_runtimes(sites)
        .flat_map(|r| r.latency_defs())
        .collect();
    for request in &config.latencies {
        for name in [&request.begin, &request.end] {
            if !sites
                .iter()
                .any(|s| s.provider == request.provider && &s.name == name)
            {
                bail!(
                    "no probe {}:{name} in process {}",
                    request.provider,
                    config.pid
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
    Ok(defs)
}

/// The runtimes whose providers appear among `sites`, each once.
fn known_runtimes(sites: &[SiteInput]) -> impl Iterator<Item = &'static Runtime> {
    let mut providers: Vec<&str> = sites.iter().map(|s| s.provider.as_str()).collect();
    providers.sort_unstable();
    providers.dedup();
    let runtimes: Vec<&'static Runtime> = providers
        .into_iter()
        .filter_map(runtimes::by_provider)
        .collect();
    runtimes.into_iter()
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
    maps: &ProcessMaps,
    threads: &ThreadNames,
    process_name: &str,
    reason: StopReason,
    now: u64,
    elapsed_ns: u64,
) -> Result<(AttachReport, Option<anyhow::Error>)> {
    let mut latencies = Vec::new();
    for (id, def) in plan.latencies.iter().enumerate() {
        let data = loader.latency(id as u32)?;
        let mut hist = LatencyHistogram::new();
        for (bucket, &count) in data.buckets.iter().enumerate() {
            if count > 0 {
                hist.merge_bucket(bucket as u32, count);
            }
        }
        hist.merge_stats(&data.stats);
        latencies.push(LatencyReport {
            def: def.clone(),
            hist,
        });
    }
    let mut probes = Vec::new();
    for (id, info) in plan.probes.iter().enumerate() {
        probes.push(ProbeReport {
            info: info.clone(),
            hits: loader.probe_hits(id as u32)?,
        });
    }

    let totals = loader.offcpu_totals()?;
    // Threads still blocked when the target exited will never be woken; only a live
    // target's pending intervals are real blocked time.
    let pending = if reason == StopReason::TargetExited {
        Vec::new()
    } else {
        loader.offcpu_pending()?
    };
    let mut symbolizer = StackSymbolizer::new();
    let threads = config.per_thread.then_some(threads);
    let open = offcpu::OpenIntervals {
        starts: &pending,
        now_ns: now,
        min_block_ns: duration_ns(config.min_block),
    };
    let profile = offcpu::build_profile(
        &totals,
        open,
        loader,
        &mut symbolizer,
        maps,
        process_name,
        threads,
    );

    // The report is printed even when a file cannot be written; the error comes after.
    let mut output_error = None;
    let folded_path = config.output_dir.join("offcpu.folded");
    let svg_path = config.output_dir.join("offcpu.svg");
    let title = format!("Off-CPU time of {process_name} (pid {})", config.pid);
    let subtitle = format!(
        "{:.1} s traced, {} blocked intervals, {:.3} s blocked in all",
        elapsed_ns as f64 / 1e9,
        profile.intervals,
        profile.total_ns as f64 / 1e9
    );
    if let Err(e) = write_view(&profile.folded, &folded_path, &svg_path, &title, &subtitle) {
        output_error.get_or_insert(e);
    }

    let has_task_probes = plan
        .sites
        .iter()
        .any(|s| s.site.flags & (site_flags::TASK_RUN | site_flags::TASK_PAUSE) != 0);
    let tasks = if has_task_probes {
        // Open intervals of a live target are real time; a target that exited closed its
        // tasks or never will.
        let open = if reason == StopReason::TargetExited {
            Vec::new()
        } else {
            loader.task_states()?
        };
        let times = tasks::with_open_intervals(loader.task_times()?, &open, now);
        let profile = tasks::build_profile(&times, loader, &mut symbolizer, maps, process_name);
        let folded_path = config.output_dir.join("tasks.folded");
        let svg_path = config.output_dir.join("tasks.svg");
        let title = format!(
            "Where the tasks of {process_name} (pid {}) waited",
            config.pid
        );
        let subtitle = format!(
            "{} tasks; parked time by the stack where each parked",
            profile.tasks.len()
        );
        if let Err(e) = write_view(&profile.parked, &folded_path, &svg_path, &title, &subtitle) {
            output_error.get_or_insert(e);
        }
        Some(TaskReport {
            profile,
            folded_path,
            svg_path,
        })
    } else {
        None
    };

    let counters = loader.counters()?;
    let report = AttachReport {
        pid: config.pid.get(),
        process_name: process_name.to_string(),
        stopped_by: reason,
        elapsed_ns,
        probes,
        latencies,
        offcpu: profile,
        folded_path,
        svg_path,
        tasks,
        losses: Losses {
            events_lost: counters[counter::EVENTS_LOST as usize],
            map_full: counters[counter::MAP_FULL as usize],
            stack_errors: counters[counter::STACK_ERRORS as usize],
            unmatched_ends: counters[counter::UNMATCHED_ENDS as usize],
            arg_read_errors: counters[counter::ARG_READ_ERRORS as usize],
        },
    };
    Ok((report, output_error))
}

fn duration_ns(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Writes one flame graph view: its folded stacks and its SVG (creating the directory).
fn write_view(
    folded: &FoldedStacks,
    folded_path: &Path,
    svg_path: &Path,
    title: &str,
    subtitle: &str,
) -> Result<()> {
    if let Some(dir) = folded_path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create output directory {}", dir.display()))?;
    }
    write_folded(folded, folded_path)
        .with_context(|| format!("writing {}", folded_path.display()))?;
    let options = SvgOptions {
        title,
        subtitle: Some(subtitle),
        count_name: "us",
        palette: Palette::OffCpu,
    };
    write_flamegraph_svg(folded, svg_path, &options)
        .with_context(|| format!("writing {}", svg_path.display()))
}

impl From<&usdt::ProbeSite> for SiteInput {
    fn from(site: &usdt::ProbeSite) -> Self {
        SiteInput {
            path: site.binary.path.clone(),
            attach_path: site.binary.host_path.clone(),
            provider: site.note.provider.clone(),
            name: site.note.name.clone(),
            file_offset: site.note.file_offset,
            semaphore_offset: site.note.semaphore_file_offset,
            args: site.args.clone(),
        }
    }
}
