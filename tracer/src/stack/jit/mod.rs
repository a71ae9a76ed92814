//! JIT-compiled code named without the user's help: the perf maps HotSpot JVMs write
//! when asked ([`hotspot`]), requested when tracing starts and again before stacks are
//! named, since a perf map is a snapshot of what was compiled by then; the jitdump
//! files other runtimes write ([`jitdump`]); and the in-memory objects JITs register
//! through the GDB JIT interface ([`gdb`]).

pub(crate) mod gdb;
pub(crate) mod hotspot;
pub(crate) mod jitdump;

use std::{
    collections::HashMap,
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// The least time between two requests to one JVM: each takes a JVM lock.
pub(crate) const MIN_REQUEST_INTERVAL: Duration = Duration::from_secs(3);

/// What asking each JVM did: its pid and the outcome.
type Outcomes = Vec<(u32, Result<(), String>)>;

/// The perf maps asked of the JVMs of a run.
#[derive(Debug, Default)]
pub(crate) struct JvmPerfMaps {
    /// Requests are made (`--no-jit-symbols` turns them off).
    enabled: bool,
    /// When each JVM was last asked.
    asked: HashMap<u32, Instant>,
    /// Requests made on a thread of their own when tracing started.
    at_start: Option<JoinHandle<Outcomes>>,
    /// What each request did, for the report: (pid, when, outcome).
    pub outcomes: Vec<(u32, &'static str, Result<(), String>)>,
}

impl JvmPerfMaps {
    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            ..Self::default()
        }
    }

    /// Asks the JVMs among `pids` for their perf maps, on a thread of its own so that
    /// tracing starts at once.
    pub(crate) fn request_at_start(&mut self, pids: impl IntoIterator<Item = u32>) {
        if !self.enabled {
            return;
        }
        let jvms: Vec<u32> = pids
            .into_iter()
            .filter(|&p| hotspot::is_hotspot(p))
            .collect();
        if jvms.is_empty() {
            return;
        }
        let now = Instant::now();
        for &pid in &jvms {
            self.asked.insert(pid, now);
        }
        self.at_start = Some(std::thread::spawn(move || {
            jvms.into_iter().map(|pid| (pid, ask(pid))).collect()
        }));
    }

    /// Asks the JVMs among `pids` that are still running (and were not asked within
    /// [`MIN_REQUEST_INTERVAL`]) for their perf maps again, before stacks are named.
    pub(crate) fn request_before_naming(&mut self, pids: impl IntoIterator<Item = u32>) {
        if let Some(started) = self.at_start.take() {
            for (pid, outcome) in started.join().unwrap_or_default() {
                self.outcomes.push((pid, "at the start", outcome));
            }
        }
        if !self.enabled {
            return;
        }
        for pid in pids {
            let recent = self
                .asked
                .get(&pid)
                .is_some_and(|at| at.elapsed() < MIN_REQUEST_INTERVAL);
            if recent || !hotspot::is_hotspot(pid) {
                continue;
            }
            self.asked.insert(pid, Instant::now());
            self.outcomes
                .push((pid, "before naming the stacks", ask(pid)));
        }
    }

    /// One line per JVM asked, for the report; `None` when none was.
    pub(crate) fn summary(&self) -> Option<String> {
        if self.outcomes.is_empty() {
            return None;
        }
        let mut lines = Vec::new();
        for (pid, when, outcome) in &self.outcomes {
            lines.push(match outcome {
                Ok(()) => format!(
                    "JIT symbols: asked the JVM {pid} for its perf map {when} \
                     (Compiler.perfmap; --no-jit-symbols to leave it alone)."
                ),
                Err(why) => format!(
                    "JIT symbols: could not ask the JVM {pid} for its perf map {when}: {why}."
                ),
            });
        }
        Some(lines.join("\n"))
    }
}

fn ask(pid: u32) -> Result<(), String> {
    hotspot::request_perf_map(pid)
        .map(|_| ())
        .map_err(|e| e.to_string())
}
