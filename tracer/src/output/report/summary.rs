//! The summary `tracer profile` prints after a wall-clock profile.

use crate::{
    output::render::views::ProfileFiles,
    profile::wallclock::{
        OFF_CPU_FRAME, RUNNABLE_FRAME, WallClockProfile, python_thread_table, thread_table,
        truncated_line,
    },
    system::text::escape_text,
};

use super::{
    lines::{THREADS_SHOWN, shown},
    types::StackLosses,
};

/// The summary `tracer profile` prints: what was profiled, the on-CPU, off-CPU,
/// runnable and wall-clock totals with their files, the busiest threads, and losses.
pub(crate) fn profile_summary(
    profile: &WallClockProfile,
    what: &str,
    frequency_hz: u64,
    elapsed_ns: u64,
    outputs: &ProfileFiles,
    stacks: &StackLosses,
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
        shown(outputs.oncpu.as_ref().map(|f| f.svg.as_path()))
    );
    out += &format!(
        "Off-CPU: {:.3} s blocked in {} intervals; flamegraph {}\n",
        seconds(profile.offcpu_ns),
        profile.offcpu_intervals,
        shown(outputs.offcpu.as_ref().map(|f| f.svg.as_path()))
    );
    out += &format!(
        "Runnable: {:.3} s preempted and waiting for a CPU, in {} intervals (under \
         {RUNNABLE_FRAME} leaf frames in the wall-clock view)\n",
        seconds(profile.runnable_ns),
        profile.runnable_intervals,
    );
    out += &format!(
        "Wall-clock: {:.3} s on and off CPU; flamegraph {} (blocked time under {OFF_CPU_FRAME} \
         leaf frames), pprof {}, speedscope {}\n",
        seconds(profile.oncpu_ns + profile.offcpu_ns + profile.runnable_ns),
        shown(outputs.wall.as_ref().map(|f| f.svg.as_path())),
        shown(outputs.pprof.as_deref()),
        shown(outputs.speedscope.as_deref())
    );
    out += &format!(
        "Threads: {}; the {} busiest (most time on a CPU or waiting for one):\n",
        profile.per_thread.len(),
        THREADS_SHOWN.min(profile.per_thread.len())
    );
    if let Some(line) = truncated_line(profile) {
        out += &line;
        out.push('\n');
    }
    out += &thread_table(profile, THREADS_SHOWN);
    if let Some(table) = python_thread_table(profile, THREADS_SHOWN) {
        out += &table;
    }
    if stacks.errors + map_full + profile.missing_stacks == 0 {
        out += "Nothing lost: every sample and interval was recorded with its stacks.\n";
    } else {
        let mut lost = Vec::new();
        if stacks.errors > 0 {
            lost.push(stacks.explained());
        }
        if map_full > 0 {
            lost.push(format!(
                "{map_full} samples or intervals dropped (map full; see --map-size)"
            ));
        }
        if profile.missing_stacks > 0 {
            lost.push(format!(
                "{} stack entries shown as [missing ... stack]",
                profile.missing_stacks
            ));
        }
        out += &format!("Lost: {}.\n", lost.join("; "));
    }
    if profile.switch_ins_missed > 0 {
        out += &format!(
            "Unseen: {} off-CPU intervals ended without the kernel reporting the thread's \
             switch back in; their time is counted, their kernel frames show as {}.\n",
            profile.switch_ins_missed,
            crate::profile::wallclock::MISSED_FRAME
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The summary of a fixed profile, byte for byte (tracer/tests/data; regenerate with
    /// TRACER_BLESS=1). No file was written, so each is shown as not written.
    #[test]
    fn summary_matches_the_golden_file() {
        let mut profile = WallClockProfile {
            oncpu_samples: 99,
            oncpu_ns: 1_000_000_000,
            offcpu_intervals: 12,
            offcpu_ns: 2_500_000_000,
            runnable_intervals: 3,
            runnable_ns: 4_000_000,
            missing_stacks: 1,
            threads: 2,
            processes: 1,
            ..Default::default()
        };
        profile.per_thread = vec![
            crate::profile::wallclock::ThreadTime {
                tgid: 42,
                tid: 42,
                name: Some("main".into()),
                oncpu_ns: 900_000_000,
                blocked_ns: 100_000_000,
                ..Default::default()
            },
            crate::profile::wallclock::ThreadTime {
                tgid: 42,
                tid: 44,
                name: Some("io\x1b".into()),
                oncpu_ns: 100_000_000,
                blocked_ns: 2_400_000_000,
                runnable_ns: 4_000_000,
                python: Some(crate::profile::wallclock::PythonThreadTime {
                    running_ns: 80_000_000,
                    gil_ns: 300_000_000,
                    gc_ns: 20_000_000,
                    blocked_ns: 2_100_000_000,
                    runnable_ns: 4_000_000,
                }),
            },
        ];
        let text = profile_summary(
            &profile,
            "process 42 (demo)",
            99,
            3_000_000_000,
            &ProfileFiles::default(),
            &StackLosses {
                errors: 2,
                collisions: 2,
                map_full: 0,
                slots: 32768,
            },
            0,
        );
        crate::output::golden::assert_golden("profile-summary.txt", &text);
    }
}
