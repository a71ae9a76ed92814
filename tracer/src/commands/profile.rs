//! `tracer profile [--pid PID]`: a wall-clock profile. On-CPU stacks sampled at a fixed
//! frequency on every CPU and off-CPU (blocked) time from `sched_switch`, of one process
//! or of every process, until the duration ends, Ctrl-C, or the target exits.
//!
//! With `--pid`, every thread of the target is marked off CPU when profiling starts
//! (running threads replace the mark at their next switch), so threads blocked since
//! before are accounted, under a `[blocked since before profiling started]` frame.
//!
//! Outputs in the output directory: `wallclock.{svg,folded}` (both together; blocked
//! stacks end in an `[off-cpu]` frame), `oncpu.{svg,folded}`, `offcpu.{svg,folded}`,
//! `wallclock.pb.gz` (pprof) and `wallclock.speedscope.json` (the three views). Weights
//! are microseconds.

use std::{
    num::NonZeroU32,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use tracer_common::{OffCpuStart, STACK_BEFORE_START, counter};

use crate::{
    cli::ProfileConfig,
    loader::{Loader, Settings},
    privileges,
    render::flamegraph::{FoldedStacks, Palette, SvgOptions, write_flamegraph_svg, write_folded},
    stop::{self, ProcessWatch, StopReason},
    symbolize::StackSymbolizer,
    wallclock::{
        self, BuildOptions, ExportInfo, OFF_CPU_FRAME, Processes, RawProfile, StackProfile,
        WallClockProfile,
    },
};

pub fn run(config: ProfileConfig) -> Result<()> {
    privileges::check()?;
    let pid = config.pid.map(NonZeroU32::get);
    let watch = pid
        .map(|pid| {
            ProcessWatch::new(pid).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => anyhow::anyhow!("no such process: {pid}"),
                _ => anyhow::Error::new(e).context(format!("cannot watch process {pid}")),
            })
        })
        .transpose()?;
    let mut processes = Processes::default();
    let what = match pid {
        Some(pid) => {
            processes.observe(pid);
            match processes.get(pid) {
                Some(info) if info.maps.is_some() => format!("{} (pid {pid})", info.name),
                _ => anyhow::bail!("process {pid} exited"),
            }
        }
        None => "all processes".to_string(),
    };

    let mut loader = Loader::load(&Settings {
        target_tgid: pid,
        min_block: config.min_block,
        ..Settings::default()
    })?;
    loader.attach_sched_switch()?;
    let cpus = loader
        .attach_oncpu_sampling(config.frequency_hz)
        .with_context(|| {
            format!(
                "cannot sample at {} Hz (see kernel.perf_event_max_sample_rate)",
                config.frequency_hz
            )
        })?;
    let started = stop::monotonic_ns();
    if let Some(pid) = pid {
        // Threads blocked since before now would otherwise be missed until they wake (or
        // entirely): mark them all off CPU from now; running ones replace the mark.
        let marks: Vec<(u32, OffCpuStart)> = thread_ids(pid)
            .into_iter()
            .map(|tid| {
                let start = OffCpuStart {
                    ts_ns: started,
                    tgid: pid,
                    user_stack_id: STACK_BEFORE_START,
                    kernel_stack_id: STACK_BEFORE_START,
                    _pad: 0,
                };
                (tid, start)
            })
            .collect();
        loader.seed_offcpu_starts(&marks)?;
    }
    let start_unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    // Ctrl-C from the moment the line below is printed must stop the profile, not kill us.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let signals = stop::StopSignals::catch(&runtime)?;
    eprintln!(
        "Attached to {what}: on-CPU sampling at {} Hz on {cpus} CPUs, sched_switch. {}",
        config.frequency_hz,
        match config.duration {
            Some(d) => format!("Profiling for {d:?}; Ctrl-C to stop early."),
            None => "Ctrl-C to stop.".into(),
        }
    );

    let reason = runtime.block_on(stop::run_until_stopped_with(
        signals,
        watch,
        config.duration,
        stop::every_second(|| {
            if pid.is_none() {
                observe_seen(&loader, &mut processes);
            }
            processes.refresh();
        }),
    ))?;

    let now = stop::monotonic_ns();
    loader.detach_oncpu_sampling()?;
    loader.detach_sched_switch()?;
    eprintln!("Stopped: {reason}. Detached.");
    if pid.is_none() {
        observe_seen(&loader, &mut processes);
    }
    if reason != StopReason::TargetExited {
        processes.refresh();
    }

    // Threads still blocked are blocked right now, unless they are gone: a target that
    // exited, or (system-wide) a thread that exited while switched out, never wakes up.
    let pending = if reason == StopReason::TargetExited {
        Vec::new()
    } else {
        still_alive(loader.offcpu_pending()?)
    };
    let raw = RawProfile {
        oncpu: loader.oncpu_samples()?,
        offcpu: loader.offcpu_totals()?,
        pending,
        now_ns: now,
    };
    let mut symbolizer = StackSymbolizer::new();
    let profile = wallclock::build_profile(
        &raw,
        BuildOptions {
            frequency_hz: config.frequency_hz,
            per_thread: config.per_thread,
        },
        &loader,
        &mut symbolizer,
        &processes,
    );
    let elapsed_ns = now - started;
    let outputs = write_outputs(
        &profile,
        &config,
        &what,
        &ExportInfo {
            name: &what,
            frequency_hz: config.frequency_hz,
            start_unix_ns,
            duration_ns: elapsed_ns,
        },
    )?;
    let counters = loader.counters()?;
    print!(
        "{}",
        summary(
            &profile,
            &what,
            config.frequency_hz,
            elapsed_ns,
            &outputs,
            counters[counter::STACK_ERRORS as usize],
            counters[counter::MAP_FULL as usize],
        )
    );
    Ok(())
}

/// Captures the processes that have samples or blocked time so far, so their stacks can be
/// named even if they exit before the end.
fn observe_seen(loader: &Loader, processes: &mut Processes) {
    let oncpu = loader.oncpu_samples().unwrap_or_default();
    let offcpu = loader.offcpu_totals().unwrap_or_default();
    let pending = loader.offcpu_pending().unwrap_or_default();
    let tgids = oncpu
        .iter()
        .map(|(k, _)| k.tgid)
        .chain(offcpu.iter().map(|(k, _)| k.tgid))
        .chain(pending.iter().map(|(_, s)| s.tgid));
    for tgid in tgids {
        processes.observe(tgid);
    }
}

/// The threads of process `pid` now.
fn thread_ids(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| task.file_name().to_str()?.parse().ok())
        .collect()
}

fn still_alive(pending: Vec<(u32, OffCpuStart)>) -> Vec<(u32, OffCpuStart)> {
    pending
        .into_iter()
        .filter(|(tid, start)| Path::new(&format!("/proc/{}/task/{tid}", start.tgid)).exists())
        .collect()
}

/// Where each output went.
struct Outputs {
    wall_svg: PathBuf,
    oncpu_svg: PathBuf,
    offcpu_svg: PathBuf,
    pprof: PathBuf,
    speedscope: PathBuf,
}

fn write_outputs(
    profile: &WallClockProfile,
    config: &ProfileConfig,
    what: &str,
    info: &ExportInfo<'_>,
) -> Result<Outputs> {
    let dir = &config.output_dir;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create output directory {}", dir.display()))?;
    let seconds = |ns: u64| ns as f64 / 1e9;
    let traced = format!("{:.1} s profiled", seconds(info.duration_ns));
    let oncpu_text = format!(
        "{} on-CPU samples at {} Hz ({:.3} s)",
        profile.oncpu_samples,
        config.frequency_hz,
        seconds(profile.oncpu_ns)
    );
    let offcpu_text = format!(
        "{} off-CPU intervals ({:.3} s)",
        profile.offcpu_intervals,
        seconds(profile.offcpu_ns)
    );
    let views: [(&str, &StackProfile, String, String, Palette); 3] = [
        (
            "wallclock",
            &profile.wall,
            format!("Wall-clock time of {what}"),
            format!("{traced}; {oncpu_text} + {offcpu_text}; blocked time ends in {OFF_CPU_FRAME}"),
            Palette::OnCpu,
        ),
        (
            "oncpu",
            &profile.oncpu,
            format!("On-CPU time of {what}"),
            format!("{traced}; {oncpu_text}"),
            Palette::OnCpu,
        ),
        (
            "offcpu",
            &profile.offcpu,
            format!("Off-CPU time of {what}"),
            format!("{traced}; {offcpu_text}"),
            Palette::OffCpu,
        ),
    ];
    for (name, stacks, title, subtitle, palette) in &views {
        let folded: FoldedStacks = stacks.folded();
        let folded_path = dir.join(format!("{name}.folded"));
        write_folded(&folded, &folded_path)
            .with_context(|| format!("writing {}", folded_path.display()))?;
        let svg_path = dir.join(format!("{name}.svg"));
        let options = SvgOptions {
            title,
            subtitle: Some(subtitle),
            count_name: "us",
            palette: *palette,
        };
        write_flamegraph_svg(&folded, &svg_path, &options)
            .with_context(|| format!("writing {}", svg_path.display()))?;
    }
    let pprof = dir.join("wallclock.pb.gz");
    wallclock::write_pprof(&profile.wall, info, &pprof)
        .with_context(|| format!("writing {}", pprof.display()))?;
    let speedscope = dir.join("wallclock.speedscope.json");
    wallclock::write_speedscope(
        &[
            ("wall-clock", &profile.wall),
            ("on-CPU", &profile.oncpu),
            ("off-CPU", &profile.offcpu),
        ],
        info,
        &speedscope,
    )
    .with_context(|| format!("writing {}", speedscope.display()))?;
    Ok(Outputs {
        wall_svg: dir.join("wallclock.svg"),
        oncpu_svg: dir.join("oncpu.svg"),
        offcpu_svg: dir.join("offcpu.svg"),
        pprof,
        speedscope,
    })
}

fn summary(
    profile: &WallClockProfile,
    what: &str,
    frequency_hz: u64,
    elapsed_ns: u64,
    outputs: &Outputs,
    stack_errors: u64,
    map_full: u64,
) -> String {
    let seconds = |ns: u64| ns as f64 / 1e9;
    let mut out = format!(
        "Wall-clock profile of {what}: {:.1} s, {} thread{} in {} process{}.\n",
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
        outputs.oncpu_svg.display()
    );
    out += &format!(
        "Off-CPU: {:.3} s blocked in {} intervals; flamegraph {}\n",
        seconds(profile.offcpu_ns),
        profile.offcpu_intervals,
        outputs.offcpu_svg.display()
    );
    out += &format!(
        "Wall-clock: {:.3} s on and off CPU; flamegraph {} (blocked time under {OFF_CPU_FRAME} \
         leaf frames), pprof {}, speedscope {}\n",
        seconds(profile.oncpu_ns + profile.offcpu_ns),
        outputs.wall_svg.display(),
        outputs.pprof.display(),
        outputs.speedscope.display()
    );
    if stack_errors + map_full + profile.missing_stacks == 0 {
        out += "Nothing lost: every sample and interval was recorded with its stacks.\n";
    } else {
        out += &format!(
            "Lost: {stack_errors} stacks not captured (stack map full or collision, or a \
             fault), {map_full} samples or intervals dropped (map full); {} stack entries \
             shown as [missing ... stack].\n",
            profile.missing_stacks
        );
    }
    out
}
