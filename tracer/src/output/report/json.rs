//! The report of `tracer attach` as one JSON document with every figure.
//! [`AttachJson`] is the document's shape, one typed struct per block, borrowed from
//! the report; `docs/json.md` describes each field. The document's keys come out in name
//! order, as serde_json's maps keep them.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::{
    output::render::{ViewFiles, hist::HistogramSummary},
    probe::runtimes::Mechanism,
};

use super::types::{AttachReport, LatencyReport, ProcessLatency, TaskReport};

/// The whole document.
#[derive(Serialize)]
struct AttachJson<'a> {
    pid: u32,
    process: &'a str,
    processes: Vec<ProcessJson<'a>>,
    processes_folded: &'a BTreeMap<String, u64>,
    /// Why tracing stopped, as the text report says it.
    stopped_by: String,
    duration_ns: u64,
    probes: Vec<ProbeJson>,
    /// Each latency under its key (see [`AttachReport::latency_key`]).
    latencies: BTreeMap<String, LatencyJson<'a>>,
    /// The GC of the runtime with the most collections.
    gc: Option<GcJson<'a>>,
    gc_by_runtime: Vec<GcJson<'a>>,
    offcpu: OffCpuJson<'a>,
    oncpu: OnCpuJson<'a>,
    wallclock: WallClockJson<'a>,
    threads: Vec<ThreadJson<'a>>,
    unwind: Option<UnwindJson>,
    tasks: Option<TasksJson<'a>>,
    timeline: Option<TimelineJson<'a>>,
    lost: LostJson,
}

#[derive(Serialize)]
struct ProcessJson<'a> {
    pid: u32,
    name: &'a str,
    namespace_pid: Option<u32>,
}

#[derive(Serialize)]
struct ProbeJson {
    /// `usdt:PATH:PROVIDER:NAME`.
    probe: String,
    sites: usize,
    hits: u64,
    first_hit_monotonic_ns: Option<u64>,
}

/// A latency: its histogram's summary, where it comes from, its classes and processes.
#[derive(Serialize)]
struct LatencyJson<'a> {
    #[serde(flatten)]
    summary: HistogramSummary,
    begin: String,
    end: String,
    runtime: Option<&'static str>,
    mechanism: &'static str,
    classes: Option<ClassesJson<'a>>,
    never_found: &'a [String],
    per_process: Vec<ProcessLatencyJson<'a>>,
}

/// A latency split by class: what the classes are (`by`), and each class's totals.
#[derive(Serialize)]
struct ClassesJson<'a> {
    by: &'static str,
    #[serde(flatten)]
    classes: BTreeMap<&'a str, ClassJson>,
}

#[derive(Serialize)]
struct ClassJson {
    count: u64,
    total_ns: u64,
    max_ns: u64,
}

#[derive(Serialize)]
struct ProcessLatencyJson<'a> {
    pid: u32,
    name: &'a str,
    count: u64,
    total_ns: u64,
    min_ns: u64,
    max_ns: u64,
}

/// One runtime's GC pauses.
#[derive(Serialize)]
struct GcJson<'a> {
    runtime: Option<&'static str>,
    mechanism: &'static str,
    count: u64,
    total_pause_ns: u64,
    /// Paused time over traced time.
    wall_share: f64,
    classes: Option<ClassesJson<'a>>,
}

#[derive(Serialize)]
struct OffCpuJson<'a> {
    total_ns: u64,
    intervals: u64,
    stacks: usize,
    missing_stacks: u64,
    runnable_ns: u64,
    runnable_intervals: u64,
    folded: Option<&'a Path>,
    svg: Option<&'a Path>,
}

#[derive(Serialize)]
struct OnCpuJson<'a> {
    samples: u64,
    total_ns: u64,
    folded: Option<&'a Path>,
    svg: Option<&'a Path>,
}

#[derive(Serialize)]
struct WallClockJson<'a> {
    total_ns: u64,
    threads: usize,
    folded: Option<&'a Path>,
    svg: Option<&'a Path>,
    pprof: Option<&'a Path>,
    speedscope: Option<&'a Path>,
    unnamed_ns: u64,
    truncated_ns: u64,
    unnamed_hint: Option<&'a str>,
}

#[derive(Serialize)]
struct ThreadJson<'a> {
    tid: u32,
    pid: u32,
    name: Option<&'a str>,
    oncpu_ns: u64,
    blocked_ns: u64,
    runnable_ns: u64,
    python: Option<PythonJson>,
}

/// A Python thread's wall time in Python's terms.
#[derive(Serialize)]
struct PythonJson {
    running_ns: u64,
    gil_ns: u64,
    gc_ns: u64,
    blocked_ns: u64,
    runnable_ns: u64,
}

#[derive(Serialize)]
struct UnwindJson {
    method: &'static str,
    samples: u64,
    offcpu_snapshots: u64,
    frames: u64,
    frame_pointer_frames: u64,
    max_depth: u64,
}

#[derive(Serialize)]
struct TasksJson<'a> {
    count: usize,
    folded: Option<&'a Path>,
    svg: Option<&'a Path>,
    list: Vec<TaskJson<'a>>,
}

#[derive(Serialize)]
struct TaskJson<'a> {
    task: u64,
    pid: u32,
    name: &'a str,
    given_name: Option<&'a str>,
    running_ns: u64,
    oncpu_ns: u64,
    oncpu_samples: u64,
    blocked_ns: u64,
    blocked_intervals: u64,
    runnable_ns: u64,
    parked_ns: u64,
    runs: u64,
    parks: u64,
    longest_run_ns: u64,
    longest_park_ns: u64,
    longest_block: Option<LongestBlockJson<'a>>,
}

/// Where a task blocked its thread longest: the stack, root first, and for how long.
#[derive(Serialize)]
struct LongestBlockJson<'a> {
    stack: &'a [String],
    ns: u64,
}

#[derive(Serialize)]
struct TimelineJson<'a> {
    path: &'a Path,
    intervals: usize,
    lost: u64,
}

/// Everything the eBPF side could not record.
#[derive(Serialize)]
struct LostJson {
    events_lost: u64,
    map_full: u64,
    stack_errors: u64,
    stack_collisions: u64,
    stack_map_full: u64,
    unmatched_ends: u64,
    arg_read_errors: u64,
    program_misses: Vec<ProgramMissesJson>,
    switch_ins_recovered: u64,
    unwind_ring_full: u64,
    snapshots_reused_unchecked: u64,
}

#[derive(Serialize)]
struct ProgramMissesJson {
    program: &'static str,
    runs: u64,
}

/// How a latency is measured, in the JSON.
fn mechanism_name(mechanism: Mechanism) -> &'static str {
    match mechanism {
        Mechanism::Usdt => "usdt",
        Mechanism::FunctionProbes => "function probes",
    }
}

fn folded(files: Option<&ViewFiles>) -> Option<&Path> {
    files.map(|f| f.folded.as_path())
}

fn svg(files: Option<&ViewFiles>) -> Option<&Path> {
    files.map(|f| f.svg.as_path())
}

impl LatencyReport {
    fn classes_json(&self) -> Option<ClassesJson<'_>> {
        let class = self.def.class.as_ref()?;
        let classes = self.by_class.iter().map(|(label, stats)| {
            let totals = ClassJson {
                count: stats.count,
                total_ns: stats.total_ns,
                max_ns: stats.max_ns,
            };
            (label.as_str(), totals)
        });
        Some(ClassesJson {
            by: class.what,
            classes: classes.collect(),
        })
    }

    fn latency_json(&self) -> LatencyJson<'_> {
        LatencyJson {
            summary: HistogramSummary::of(&self.hist),
            begin: self.def.begin.to_string(),
            end: self.def.end.to_string(),
            runtime: self.def.runtime,
            mechanism: mechanism_name(self.def.mechanism),
            classes: self.classes_json(),
            never_found: &self.never_found,
            per_process: self.per_process.iter().map(process_latency_json).collect(),
        }
    }
}

fn process_latency_json(p: &ProcessLatency) -> ProcessLatencyJson<'_> {
    ProcessLatencyJson {
        pid: p.pid,
        name: &p.name,
        count: p.stats.count,
        total_ns: p.stats.total_ns,
        min_ns: p.stats.min_ns,
        max_ns: p.stats.max_ns,
    }
}

fn tasks_json(t: &TaskReport) -> TasksJson<'_> {
    let list = t.profile.tasks.iter().map(|task| TaskJson {
        task: task.task,
        pid: task.tgid,
        name: &task.name,
        given_name: task.given_name.as_deref(),
        running_ns: task.running_ns,
        oncpu_ns: task.oncpu_ns(),
        oncpu_samples: task.wall.oncpu_samples,
        blocked_ns: task.wall.blocked_ns,
        blocked_intervals: task.wall.blocked_intervals,
        runnable_ns: task.wall.runnable_ns,
        parked_ns: task.parked_ns,
        runs: task.runs,
        parks: task.parks,
        longest_run_ns: task.longest_run_ns,
        longest_park_ns: task.longest_park_ns,
        longest_block: task
            .wall
            .longest_block
            .as_ref()
            .map(|(stack, ns)| LongestBlockJson { stack, ns: *ns }),
    });
    TasksJson {
        count: t.profile.tasks.len(),
        folded: folded(t.files.as_ref()),
        svg: svg(t.files.as_ref()),
        list: list.collect(),
    }
}

impl AttachReport {
    /// The GC the `gc` block describes: one runtime's, the one with the most
    /// collections when a process hosts two.
    fn gc_pause(&self) -> Option<&LatencyReport> {
        self.gc_pauses()
            .max_by_key(|l| (l.hist.count(), std::cmp::Reverse(l.def.runtime)))
    }

    /// The key of latency `l` in the JSON: its name, with its runtime when another
    /// runtime's latency has the same name.
    fn latency_key(&self, l: &LatencyReport) -> String {
        let same = self
            .latencies
            .iter()
            .filter(|other| other.def.name == l.def.name)
            .count();
        match (same, l.def.runtime) {
            (2.., Some(runtime)) => format!("{}:{runtime}", l.def.name),
            _ => l.def.name.clone(),
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        serde_json::to_value(self.document()).expect("the report's JSON has string keys only")
    }

    fn document(&self) -> AttachJson<'_> {
        AttachJson {
            pid: self.pid,
            process: &self.process_name,
            processes: self
                .processes
                .iter()
                .map(|p| ProcessJson {
                    pid: p.pid,
                    name: &p.name,
                    namespace_pid: p.namespace_pid,
                })
                .collect(),
            processes_folded: &self.processes_folded,
            stopped_by: self.stopped_by.to_string(),
            duration_ns: self.elapsed_ns,
            probes: self
                .probes
                .iter()
                .map(|p| ProbeJson {
                    probe: p.info.specifier(),
                    sites: p.info.site_count,
                    hits: p.hits.count,
                    first_hit_monotonic_ns: p.hits.first_ns,
                })
                .collect(),
            latencies: self
                .latencies
                .iter()
                .map(|l| (self.latency_key(l), l.latency_json()))
                .collect(),
            gc: self.gc_pause().map(|gc| self.gc_json(gc)),
            gc_by_runtime: self.gc_pauses().map(|gc| self.gc_json(gc)).collect(),
            offcpu: OffCpuJson {
                total_ns: self.offcpu.total_ns,
                intervals: self.offcpu.intervals,
                stacks: self.offcpu.stacks,
                missing_stacks: self.offcpu.missing_stacks,
                runnable_ns: self.wall.runnable_ns,
                runnable_intervals: self.wall.runnable_intervals,
                folded: folded(self.offcpu_files.as_ref()),
                svg: svg(self.offcpu_files.as_ref()),
            },
            oncpu: OnCpuJson {
                samples: self.wall.oncpu_samples,
                total_ns: self.wall.oncpu_ns,
                folded: folded(self.files.oncpu.as_ref()),
                svg: svg(self.files.oncpu.as_ref()),
            },
            wallclock: self.wallclock_json(),
            threads: self
                .wall
                .per_thread
                .iter()
                .map(|t| ThreadJson {
                    tid: t.tid,
                    pid: t.tgid,
                    name: t.name.as_deref(),
                    oncpu_ns: t.oncpu_ns,
                    blocked_ns: t.blocked_ns,
                    runnable_ns: t.runnable_ns,
                    python: t.python.as_ref().map(|p| PythonJson {
                        running_ns: p.running_ns,
                        gil_ns: p.gil_ns,
                        gc_ns: p.gc_ns,
                        blocked_ns: p.blocked_ns,
                        runnable_ns: p.runnable_ns,
                    }),
                })
                .collect(),
            unwind: self.unwind_stats.as_ref().map(|u| UnwindJson {
                method: "dwarf",
                samples: u.samples,
                offcpu_snapshots: u.offcpu_snapshots,
                frames: u.frames,
                frame_pointer_frames: u.frame_pointer_frames,
                max_depth: u.max_depth,
            }),
            tasks: self.tasks.as_ref().map(tasks_json),
            timeline: self.timeline.as_ref().map(|t| TimelineJson {
                path: &t.path,
                intervals: t.intervals,
                lost: t.lost,
            }),
            lost: self.losses_json(),
        }
    }

    /// One runtime's GC pauses, for the `gc` and `gc_by_runtime` blocks.
    fn gc_json<'a>(&self, gc: &'a LatencyReport) -> GcJson<'a> {
        GcJson {
            runtime: gc.def.runtime,
            mechanism: mechanism_name(gc.def.mechanism),
            count: gc.hist.count(),
            total_pause_ns: gc.hist.total_ns(),
            wall_share: gc.hist.total_ns() as f64 / self.elapsed_ns.max(1) as f64,
            classes: gc.classes_json(),
        }
    }

    fn wallclock_json(&self) -> WallClockJson<'_> {
        WallClockJson {
            total_ns: self.wall.oncpu_ns + self.wall.offcpu_ns + self.wall.runnable_ns,
            threads: self.wall.threads,
            folded: folded(self.files.wall.as_ref()),
            svg: svg(self.files.wall.as_ref()),
            pprof: self.files.pprof.as_deref(),
            speedscope: self.files.speedscope.as_deref(),
            unnamed_ns: self.wall.unnamed_ns,
            truncated_ns: self.wall.truncated_ns,
            unnamed_hint: self.unnamed.as_deref(),
        }
    }

    fn losses_json(&self) -> LostJson {
        let l = &self.losses;
        LostJson {
            events_lost: l.events_lost,
            map_full: l.map_full,
            stack_errors: l.stacks.errors,
            stack_collisions: l.stacks.collisions,
            stack_map_full: l.stacks.map_full,
            unmatched_ends: l.unmatched_ends,
            arg_read_errors: l.arg_read_errors,
            program_misses: l
                .program_misses
                .iter()
                .map(|&(program, runs)| ProgramMissesJson { program, runs })
                .collect(),
            switch_ins_recovered: l.switch_ins_missed,
            unwind_ring_full: l.unwind_ring_full,
            snapshots_reused_unchecked: l.snapshots_reused_unchecked,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    /// Keys whose children are named by the data (latency names, program names, class
    /// labels), not by the document's shape.
    const NAMED_BY_DATA: [&str; 3] = ["latencies", "processes_folded", "classes"];

    fn keys(value: &Value, into: &mut BTreeSet<String>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    into.insert(key.clone());
                    if NAMED_BY_DATA.contains(&key.as_str()) {
                        for grandchild in child.as_object().into_iter().flat_map(|m| m.values()) {
                            keys(grandchild, into);
                        }
                    } else {
                        keys(child, into);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| keys(item, into)),
            _ => {}
        }
    }

    /// Every key of the attach report (its golden file holds every block) is described in
    /// `docs/json.md`.
    #[test]
    fn every_key_of_the_document_is_documented() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let golden = std::fs::read_to_string(root.join("tests/data/attach-report.json")).unwrap();
        let docs = std::fs::read_to_string(root.join("../docs/json.md")).unwrap();
        let attach = docs
            .split("## `tracer trace --format json`")
            .next()
            .unwrap();
        let mut all = BTreeSet::new();
        keys(&serde_json::from_str(&golden).unwrap(), &mut all);
        let undocumented: Vec<&String> = all
            .iter()
            .filter(|key| {
                // As `key`, an array as `key[]`, a map of named entries as `key.NAME`.
                !["`", "[]`", "."]
                    .iter()
                    .any(|end| attach.contains(&format!("`{key}{end}")))
            })
            .collect();
        assert!(
            undocumented.is_empty(),
            "docs/json.md does not describe {undocumented:?}"
        );
    }
}
