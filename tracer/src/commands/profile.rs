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
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use tracer_common::{OffCpuStart, STACK_BEFORE_START, SnapshotCheck, UNWIND_STACK_BYTES, counter};

use crate::{
    cli::{ProfileConfig, UnwindMethod},
    loader::{Features, Loader, Settings},
    privileges, procfs,
    render::{
        escape_text,
        flamegraph::{FoldedStacks, Palette, SvgOptions, write_flamegraph_svg, write_folded},
    },
    stop::{self, ProcessWatch, StopReason},
    symbolize::StackSymbolizer,
    unwind::{DwarfUnwinder, FRAME_POINTER_SUFFIX, Snapshot, UnwindStats, WithUnwound},
    wallclock::{
        self, BuildOptions, ExportInfo, OFF_CPU_FRAME, Processes, RawProfile, StackProfile,
        WallClockProfile,
    },
};

/// How often the ring buffer of stack snapshots is drained with `--unwind dwarf` (the
/// default 32 MiB hold about 2000 snapshots of 16 KiB).
const UNWIND_DRAIN_PERIOD: Duration = Duration::from_millis(10);

pub fn run(config: ProfileConfig) -> Result<()> {
    let dwarf = config.unwind == UnwindMethod::Dwarf;
    privileges::check()?;
    let pid = config.pid.map(NonZeroU32::get);
    let watch = pid.map(ProcessWatch::target).transpose()?;
    let mut processes = Processes::default();
    let what = match pid {
        Some(pid) => {
            let info = processes.observe_target(pid).map_err(|e| {
                let context = format!("cannot read /proc/{pid} (its name and memory maps)");
                procfs::target_error(pid, anyhow::Error::new(e).context(context))
            })?;
            format!("{} (pid {pid})", info.name)
        }
        None => "all processes".to_string(),
    };

    let mut loader = Loader::load(&Settings {
        target_tgid: pid,
        min_block: config.min_block,
        features: Features {
            offcpu: true,
            oncpu: true,
            offcpu_snapshots: dwarf,
            ..Features::NONE
        },
        unwind_ring_bytes: if dwarf {
            config.unwind_buffer_bytes
        } else {
            Settings::default().unwind_ring_bytes
        },
        map_sizes: config.map_sizes,
        ..Settings::default()
    })?;
    if dwarf {
        loader.attach_sched_switch_dwarf()?;
    } else {
        loader.attach_sched_switch()?;
    }
    let attached = if dwarf {
        loader.attach_oncpu_sampling_dwarf(config.frequency_hz)
    } else {
        loader.attach_oncpu_sampling(config.frequency_hz)
    };
    let cpus = attached.with_context(|| {
        format!(
            "cannot sample at {} Hz (see kernel.perf_event_max_sample_rate)",
            config.frequency_hz
        )
    })?;
    // With DWARF unwinding, user-mode samples come as stack snapshots through a ring
    // buffer, unwound as they arrive (the process's mappings are needed, so while it runs).
    let mut unwinding = match dwarf {
        true => Some(Unwinding {
            ring: loader.take_unwind_samples()?,
            checks: loader.take_snapshot_checks()?,
            unwinder: DwarfUnwinder::new(),
        }),
        false => None,
    };
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
        "Attached to {}: on-CPU sampling at {} Hz{} on {cpus} CPUs, sched_switch. {}",
        escape_text(&what),
        config.frequency_hz,
        if dwarf { " (DWARF unwinding)" } else { "" },
        match config.duration {
            Some(d) => format!("Profiling for {d:?}; Ctrl-C to stop early."),
            None => "Ctrl-C to stop.".into(),
        }
    );

    let work = async {
        let Some(unwinding) = unwinding.as_mut() else {
            return stop::every_second(|| refresh(&loader, &mut processes, pid)).await;
        };
        let mut ticker = tokio::time::interval(UNWIND_DRAIN_PERIOD);
        let mut refreshed: Option<Instant> = None;
        loop {
            ticker.tick().await;
            unwinding.drain(&mut processes);
            if refreshed.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                refresh(&loader, &mut processes, pid);
                refreshed = Some(Instant::now());
            }
        }
    };
    let reason = runtime.block_on(stop::run_until_stopped_with(
        signals,
        watch,
        config.duration,
        work,
    ))?;

    let now = stop::monotonic_ns();
    if dwarf {
        loader.detach_oncpu_sampling_dwarf()?;
        loader.detach_sched_switch_dwarf()?;
    } else {
        loader.detach_oncpu_sampling()?;
        loader.detach_sched_switch()?;
    }
    if let Some(unwinding) = unwinding.as_mut() {
        unwinding.drain(&mut processes);
    }
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
    let mut oncpu = loader.oncpu_samples()?;
    let (unwind_stats, unwound) = match unwinding {
        Some(Unwinding { unwinder, .. }) => {
            let stats = unwinder.stats;
            let (entries, stacks) = unwinder.finish();
            oncpu.extend(entries);
            (Some(stats), Some(stacks))
        }
        None => (None, None),
    };
    let raw = RawProfile {
        oncpu,
        offcpu: loader.offcpu_totals()?,
        pending,
        now_ns: now,
        min_block_ns: u64::try_from(config.min_block.as_nanos()).unwrap_or(u64::MAX),
    };
    let mut symbolizer = StackSymbolizer::new();
    let options = BuildOptions {
        frequency_hz: config.frequency_hz,
        per_thread: config.per_thread,
    };
    // Only a DWARF-unwound profile tells frames found by frame pointers apart.
    let profile = match &unwound {
        Some(unwound) => wallclock::build_profile(
            &raw,
            options,
            &WithUnwound {
                kernel: &loader,
                unwound,
            },
            &mut symbolizer,
            &processes,
        ),
        None => wallclock::build_profile(&raw, options, &loader, &mut symbolizer, &processes),
    };
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
    if let Some(stats) = unwind_stats {
        print!("{}", unwind_summary(&stats, &counters));
    }
    Ok(())
}

/// What is captured about the processes once a second while profiling.
fn refresh(loader: &Loader, processes: &mut Processes, pid: Option<u32>) {
    if pid.is_none() {
        observe_seen(loader, processes);
    }
    processes.refresh();
}

/// `--unwind dwarf`: the snapshots from the kernel, and what user space tells it back.
struct Unwinding {
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    checks: aya::maps::HashMap<aya::maps::MapData, i32, SnapshotCheck>,
    unwinder: DwarfUnwinder,
}

impl Unwinding {
    /// Unwinds every stack snapshot waiting in the ring buffer, capturing the mappings
    /// of processes seen for the first time, and lets the kernel reuse the off-CPU ones.
    fn drain(&mut self, processes: &mut Processes) {
        while let Some(record) = self.ring.next() {
            let Some(snapshot) = Snapshot::parse(&record) else {
                continue;
            };
            processes.observe(snapshot.tgid);
            let maps = processes
                .get(snapshot.tgid)
                .and_then(|info| info.maps.as_ref());
            if let Some(check) = self.unwinder.add(&snapshot, maps)
                && let Err(e) = self.checks.insert(snapshot.snapshot_id as i32, check, 0)
            {
                // The kernel then sends a new snapshot each time: slower, not wrong.
                log::debug!(
                    "cannot publish the check of snapshot {}: {e}",
                    snapshot.snapshot_id
                );
            }
        }
    }
}

/// The `--unwind dwarf` line: how many stacks were unwound, how deep, with which method,
/// and how many were walked with frame pointers instead.
fn unwind_summary(stats: &UnwindStats, counters: &[u64]) -> String {
    let no_regs = counters[counter::UNWIND_NO_USER_REGS as usize];
    let ring_full = counters[counter::UNWIND_RING_FULL as usize];
    let unreadable = counters[counter::UNWIND_STACK_UNREADABLE as usize];
    let stacks = stats.samples + stats.offcpu_snapshots;
    let mean = stats.frames as f64 / stacks.max(1) as f64;
    format!(
        "Unwinding: {} on-CPU samples ({} of them in kernel mode) and {} off-CPU snapshots \
         unwound with DWARF: {} user frames, {mean:.1} per stack, deepest {}; {} frames \
         found by frame pointers where no call frame information covered the callee \
         (marked{FRAME_POINTER_SUFFIX}); {} stacks deeper than the {} KiB copied, {} \
         stopped early where unwind information ended, {} without mappings, \
         {unreadable} with an unreadable stack. {} stacks walked with frame pointers in \
         the kernel instead (marked{FRAME_POINTER_SUFFIX}; {no_regs} without user \
         registers, {ring_full} with the snapshot ring buffer full).\n",
        stats.samples,
        stats.in_kernel,
        stats.offcpu_snapshots,
        stats.frames,
        stats.max_depth,
        stats.frame_pointer_frames,
        stats.out_of_stack,
        UNWIND_STACK_BYTES / 1024,
        stats.truncated,
        stats.no_maps,
        no_regs + ring_full,
    )
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
             fault; see --stack-map-size), {map_full} samples or intervals dropped (map \
             full; see --map-size); {} stack entries shown as [missing ... stack].\n",
            profile.missing_stacks
        );
    }
    out
}
