//! The text that sums a wall-clock profile up in the reports. [`thread_table`] lists the
//! busiest threads and [`python_thread_table`] the Python threads. [`truncated_line`] says
//! how much time is in stacks cut short. [`unnamed_line`] says how much is in frames that
//! could not be named.

use super::{PythonThreadTime, TRUNCATED_FRAME, ThreadTime, WallClockProfile};

/// The busiest threads of `profile` (on CPU or waiting for one the longest), as a table: id (decimal), name, and
/// their time on CPU, blocked and runnable. At most `shown` rows.
pub(crate) fn thread_table(profile: &WallClockProfile, shown: usize) -> String {
    use std::fmt::Write as _;
    let seconds = |ns: u64| format!("{:.3}s", ns as f64 / 1e9);
    let mut out = format!(
        "{:>8} {:<20} {:>10} {:>10} {:>10} {:>10}\n",
        "TID", "THREAD", "WALL", "ON-CPU", "BLOCKED", "RUNNABLE"
    );
    for t in profile.per_thread.iter().take(shown) {
        let name = t.name.as_deref().unwrap_or("?");
        let _ = writeln!(
            out,
            "{:>8} {:<20} {:>10} {:>10} {:>10} {:>10}",
            t.tid,
            crate::system::text::escape_text(name),
            seconds(t.wall_ns()),
            seconds(t.oncpu_ns),
            seconds(t.blocked_ns),
            seconds(t.runnable_ns)
        );
    }
    out
}

/// The Python threads of `profile` (those with Python frames), as a table: id, name, and
/// their time running, waiting for the GIL, collecting garbage, blocked and runnable.
/// At most `shown` rows, busiest first; `None` without Python threads.
pub(crate) fn python_thread_table(profile: &WallClockProfile, shown: usize) -> Option<String> {
    use std::fmt::Write as _;
    let seconds = |ns: u64| format!("{:.3}s", ns as f64 / 1e9);
    let threads: Vec<(&ThreadTime, &PythonThreadTime)> = profile
        .per_thread
        .iter()
        .filter_map(|t| Some((t, t.python.as_ref()?)))
        .collect();
    if threads.is_empty() {
        return None;
    }
    let mut out = format!(
        "Python threads: {}; their time in Python's terms (running, waiting for the GIL, \
         collecting garbage, blocked elsewhere, runnable):\n\
         {:>8} {:<20} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
        threads.len(),
        "TID",
        "THREAD",
        "RUNNING",
        "GIL",
        "GC",
        "BLOCKED",
        "RUNNABLE"
    );
    for (t, python) in threads.into_iter().take(shown) {
        let _ = writeln!(
            out,
            "{:>8} {:<20} {:>10} {:>10} {:>10} {:>10} {:>10}",
            t.tid,
            crate::system::text::escape_text(t.name.as_deref().unwrap_or("?")),
            seconds(python.running_ns),
            seconds(python.gil_ns),
            seconds(python.gc_ns),
            seconds(python.blocked_ns),
            seconds(python.runnable_ns)
        );
    }
    Some(out)
}

/// The line saying how much of `profile`'s wall time is in stacks cut short; `None`
/// when less than a thousandth is.
pub(crate) fn truncated_line(profile: &WallClockProfile) -> Option<String> {
    let wall = profile.oncpu_ns + profile.offcpu_ns + profile.runnable_ns;
    // Below a thousandth the share rounds to nothing; the JSON keeps the exact time.
    (profile.truncated_ns.saturating_mul(1000) >= wall.max(1)).then(|| {
        format!(
            "Truncated: {:.1}% of the wall time is in stacks cut short (their root frame is \
             {TRUNCATED_FRAME}): deeper than the {} KiB of stack copied or {} frames.",
            profile.truncated_ns as f64 * 100.0 / wall.max(1) as f64,
            tracer_common::UNWIND_STACK_BYTES / 1024,
            tracer_common::MAX_STACK_DEPTH
        )
    })
}

/// The share of a profile's wall time above which the reports say how to name what
/// could not be named.
pub(crate) const UNNAMED_HINT_SHARE: f64 = 0.1;

/// When more than [`UNNAMED_HINT_SHARE`] of `profile`'s wall time has unnamed frames,
/// the line saying so and how to get names (see [`crate::probe::runtimes::jit_naming_hint`]).
pub(crate) fn unnamed_line(
    profile: &WallClockProfile,
    hint: impl FnOnce() -> String,
) -> Option<String> {
    let wall = profile.oncpu_ns + profile.offcpu_ns + profile.runnable_ns;
    let share = profile.unnamed_ns as f64 / wall.max(1) as f64;
    (share > UNNAMED_HINT_SHARE).then(|| {
        format!(
            "Unnamed: {:.0}% of the wall time is in stacks with frames that could not be \
             named ({}): {}.",
            share * 100.0,
            crate::stack::symbolize::UNKNOWN,
            hint()
        )
    })
}
