//! Letting go of exited processes, so a run of a set of targets (`--comm`, `--exe`,
//! `--cgroup`, `--children`) can last for weeks in bounded memory however many processes
//! come and go.
//!
//! The most recent exited processes (`--keep-exited`) keep everything, and their own
//! `name [pid]` tower in the final profile. Older ones are retired: what they left in the
//! kernel's maps and here (their stacks, samples, mappings, thread names, interpreters,
//! latency totals) is folded into totals by program name, then deleted. Their stacks join
//! the final profile under their program's name, their threads its table as one row per
//! thread name, their latencies the per-process table as one row per program.
//!
//! A process is retired only once found departed at an earlier look: by then the
//! snapshots it sent before it exited have been unwound. With `--profile-every`, the
//! looks follow the windows: a window holds everything up to its end, so nothing of a
//! retired process is missing from the windows either.

use std::{
    collections::{BTreeMap, HashSet, VecDeque},
    time::Duration,
};

use anyhow::Result;
use tracer_common::{LatencyProcessKey, LatencyStats};

use crate::{
    kernel::Loader,
    profile::sampling::{WallClockSampler, Window},
    profile::wallclock::WallClockProfile,
    stack::{processes::Processes, symbolize::StackSymbolizer},
};

/// Exited processes kept whole by default.
pub(crate) const DEFAULT_KEEP_EXITED: usize = 1000;

/// How often a run without rolling windows looks for processes to retire.
pub(crate) const LOOK_PERIOD: Duration = Duration::from_secs(10);

/// The processes let go so far, and what they had.
#[derive(Default)]
pub(crate) struct Retirement {
    keep_exited: usize,
    /// Processes found departed and not retired yet, oldest first, each with the look
    /// that found it.
    departed: VecDeque<(u32, u64)>,
    known: HashSet<u32>,
    /// Looks so far.
    looks: u64,
    /// When the last look was (CLOCK_MONOTONIC ns).
    last_look_ns: u64,
    /// The retired processes' profile, by program.
    pub profile: WallClockProfile,
    /// Their on-CPU samples by program.
    pub oncpu_by_program: BTreeMap<String, u64>,
    /// Their latency totals by program (the key's tgid is 0).
    pub latency_by_program: RetiredLatencies,
    /// How many were retired.
    pub retired: u64,
}

/// A latency and class, as [`LatencyProcessKey`] has them without the process.
pub(crate) type LatencyKey = (u32, u32);

/// Latency totals by program and latency.
pub(crate) type RetiredLatencies = BTreeMap<(String, LatencyKey), LatencyStats>;

impl Retirement {
    /// Keeps the last `keep_exited` exited processes whole.
    pub(crate) fn new(keep_exited: usize, now_ns: u64) -> Self {
        Self {
            keep_exited,
            last_look_ns: now_ns,
            ..Self::default()
        }
    }

    /// Whether a run without rolling windows is due to look again at `now_ns`.
    pub(crate) fn due(&self, now_ns: u64) -> bool {
        now_ns.saturating_sub(self.last_look_ns) >= LOOK_PERIOD.as_nanos() as u64
    }

    /// Notes the processes departed since the last look, and retires the oldest beyond
    /// those kept (found at an earlier look). `window` is the rolling window, just
    /// written.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn look(
        &mut self,
        sampler: &mut WallClockSampler,
        loader: &mut Loader,
        processes: &mut Processes,
        symbolizer: &mut StackSymbolizer,
        frequency_hz: u64,
        window: Option<&mut Window>,
        now_ns: u64,
    ) -> Result<()> {
        self.last_look_ns = now_ns;
        self.looks += 1;
        for tgid in sampler.departed_processes(loader, processes)? {
            if self.known.insert(tgid) {
                self.departed.push_back((tgid, self.looks));
            }
        }
        let mut tgids = HashSet::new();
        while self.departed.len() > self.keep_exited
            && let Some(&(tgid, look)) = self.departed.front()
            && look < self.looks
        {
            self.departed.pop_front();
            self.known.remove(&tgid);
            tgids.insert(tgid);
        }
        let taken = (sampler, loader, processes, symbolizer);
        self.retire(taken, &tgids, frequency_hz, window, now_ns)?;
        if !tgids.is_empty() {
            give_back_freed_memory();
        }
        Ok(())
    }

    /// The look once the trace stopped and its last window is written: every snapshot is
    /// in, so every process with data that the report does not list (`listed`: the
    /// targets alive and the last exited) is retired. The final profile then names by PID
    /// exactly the processes the report lists.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn last_look(
        &mut self,
        sampler: &mut WallClockSampler,
        loader: &mut Loader,
        processes: &mut Processes,
        symbolizer: &mut StackSymbolizer,
        frequency_hz: u64,
        listed: &HashSet<u32>,
        now_ns: u64,
    ) -> Result<()> {
        let mut tgids = sampler.processes_with_samples(loader)?;
        tgids.extend(self.departed.drain(..).map(|(tgid, _)| tgid));
        tgids.retain(|tgid| !listed.contains(tgid));
        self.known.clear();
        let taken = (sampler, loader, processes, symbolizer);
        self.retire(taken, &tgids, frequency_hz, None, now_ns)
    }

    /// Folds what processes `tgids` left into the totals by program, and deletes it.
    fn retire(
        &mut self,
        (sampler, loader, processes, symbolizer): (
            &mut WallClockSampler,
            &mut Loader,
            &mut Processes,
            &mut StackSymbolizer,
        ),
        tgids: &HashSet<u32>,
        frequency_hz: u64,
        window: Option<&mut Window>,
        now_ns: u64,
    ) -> Result<()> {
        if tgids.is_empty() {
            return Ok(());
        }
        let retired = sampler.retire(loader, processes, symbolizer, tgids, frequency_hz, window)?;
        let program = |tgid: u32| {
            processes
                .get(tgid)
                .map_or_else(|| format!("[pid {tgid}]"), |p| p.program.clone())
        };
        for (tgid, samples) in retired.oncpu_by_process {
            *self.oncpu_by_program.entry(program(tgid)).or_default() += samples;
        }
        let latencies: Vec<(LatencyProcessKey, LatencyStats)> = loader
            .latency_by_process()?
            .into_iter()
            .filter(|(key, _)| tgids.contains(&key.tgid))
            .collect();
        for (key, stats) in &latencies {
            let total = self
                .latency_by_program
                .entry((program(key.tgid), (key.latency_id, key.class)))
                .or_default();
            add_stats(total, stats);
        }
        let keys: Vec<LatencyProcessKey> = latencies.iter().map(|(key, _)| *key).collect();
        loader.remove_latency_by_process(&keys)?;
        loader.forget_processes(tgids, &retired.tids, now_ns)?;
        processes.forget(tgids, &retired.tids);
        symbolizer.forget_processes(tgids);
        self.profile.absorb_retired(retired.profile);
        self.retired += tgids.len() as u64;
        log::debug!("retired {} processes", tgids.len());
        Ok(())
    }
}

/// Adds `more` to the totals `into`.
pub(crate) fn add_stats(into: &mut LatencyStats, more: &LatencyStats) {
    if into.count == 0 {
        *into = *more;
        return;
    }
    if more.count == 0 {
        return;
    }
    into.count += more.count;
    into.total_ns += more.total_ns;
    into.min_ns = into.min_ns.min(more.min_ns);
    into.max_ns = into.max_ns.max(more.max_ns);
}

/// Returns the heap's free pages to the system: what the processes let go held is freed
/// in the middle of the heap, which glibc keeps resident otherwise.
fn give_back_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator's own.
    unsafe {
        libc::malloc_trim(0);
    }
}
