//! The report of `tracer attach` as one JSON document with every figure.
//! Each block of the document is built by a step of its own.

use serde_json::{Value, json};

use crate::{output::render::hist::summary_json, probe::runtimes::Mechanism};

use super::types::{AttachReport, LatencyReport, ProcessLatency, TaskReport};

/// How a latency is measured, in the JSON.
fn mechanism_name(mechanism: Mechanism) -> &'static str {
    match mechanism {
        Mechanism::Usdt => "usdt",
        Mechanism::FunctionProbes => "function probes",
    }
}

impl LatencyReport {
    fn classes_json(&self) -> Value {
        match &self.def.class {
            None => Value::Null,
            Some(class) => {
                let mut out = serde_json::Map::new();
                out.insert("by".into(), json!(class.what));
                for (label, stats) in &self.by_class {
                    out.insert(
                        label.clone(),
                        json!({"count": stats.count, "total_ns": stats.total_ns, "max_ns": stats.max_ns}),
                    );
                }
                Value::Object(out)
            }
        }
    }

    /// Its histogram's summary, with where it comes from, its classes and its processes.
    fn latency_json(&self) -> Value {
        let mut summary = summary_json(&self.hist);
        summary["begin"] = json!(self.def.begin.to_string());
        summary["end"] = json!(self.def.end.to_string());
        summary["runtime"] = json!(self.def.runtime);
        summary["mechanism"] = json!(mechanism_name(self.def.mechanism));
        summary["classes"] = self.classes_json();
        summary["never_found"] = json!(self.never_found);
        summary["per_process"] = self.per_process.iter().map(process_latency_json).collect();
        summary
    }
}

/// One process's totals of one latency.
fn process_latency_json(p: &ProcessLatency) -> Value {
    json!({
        "pid": p.pid,
        "name": p.name,
        "count": p.stats.count,
        "total_ns": p.stats.total_ns,
        "min_ns": p.stats.min_ns,
        "max_ns": p.stats.max_ns,
    })
}

/// The `tasks` block: the tasks seen, their flamegraph's files and each task's times.
fn tasks_json(t: &TaskReport) -> Value {
    json!({
        "count": t.profile.tasks.len(),
        "folded": t.files.as_ref().map(|f| &f.folded),
        "svg": t.files.as_ref().map(|f| &f.svg),
        "list": t.profile.tasks.iter().map(|task| json!({
            "task": task.task,
            "pid": task.tgid,
            "name": task.name,
            "given_name": task.given_name,
            "running_ns": task.running_ns,
            "oncpu_ns": task.oncpu_ns(),
            "oncpu_samples": task.wall.oncpu_samples,
            "blocked_ns": task.wall.blocked_ns,
            "blocked_intervals": task.wall.blocked_intervals,
            "runnable_ns": task.wall.runnable_ns,
            "parked_ns": task.parked_ns,
            "runs": task.runs,
            "parks": task.parks,
            "longest_run_ns": task.longest_run_ns,
            "longest_park_ns": task.longest_park_ns,
            "longest_block": task.wall.longest_block.as_ref().map(|(place, ns)| json!({
                "stack": place,
                "ns": ns,
            })),
        })).collect::<Vec<_>>(),
    })
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

    pub fn to_json(&self) -> Value {
        json!({
            "pid": self.pid,
            "process": self.process_name,
            "processes": self.processes_json(),
            "processes_folded": self.processes_folded,
            "stopped_by": self.stopped_by.to_string(),
            "duration_ns": self.elapsed_ns,
            "probes": self.probes_json(),
            "latencies": self.latencies_json(),
            "gc": self.gc_pause().map(|gc| self.gc_json(gc)),
            "gc_by_runtime": self.gc_pauses().map(|gc| self.gc_json(gc)).collect::<Vec<_>>(),
            "offcpu": self.offcpu_json(),
            "oncpu": self.oncpu_json(),
            "wallclock": self.wallclock_json(),
            "threads": self.threads_json(),
            "unwind": self.unwind_json(),
            "tasks": self.tasks.as_ref().map(tasks_json),
            "timeline": self.timeline_json(),
            "lost": self.losses_json(),
        })
    }

    /// The `processes` block: every process traced.
    fn processes_json(&self) -> Vec<Value> {
        self.processes
            .iter()
            .map(|p| {
                json!({
                    "pid": p.pid,
                    "name": p.name,
                    "namespace_pid": p.namespace_pid,
                })
            })
            .collect()
    }

    /// The `probes` block: each probe's sites and hits.
    fn probes_json(&self) -> Vec<Value> {
        self.probes
            .iter()
            .map(|p| {
                json!({
                    "probe": p.info.specifier(),
                    "sites": p.info.site_count,
                    "hits": p.hits.count,
                    "first_hit_monotonic_ns": p.hits.first_ns,
                })
            })
            .collect()
    }

    /// The `latencies` block: each latency's summary under its key.
    fn latencies_json(&self) -> serde_json::Map<String, Value> {
        self.latencies
            .iter()
            .map(|l| (self.latency_key(l), l.latency_json()))
            .collect()
    }

    /// One runtime's GC pauses, for the `gc` and `gc_by_runtime` blocks.
    fn gc_json(&self, gc: &LatencyReport) -> Value {
        json!({
            "runtime": gc.def.runtime,
            "mechanism": mechanism_name(gc.def.mechanism),
            "count": gc.hist.count(),
            "total_pause_ns": gc.hist.total_ns(),
            "wall_share": gc.hist.total_ns() as f64 / self.elapsed_ns.max(1) as f64,
            "classes": gc.classes_json(),
        })
    }

    /// The `offcpu` block: blocked and runnable time, and the off-CPU flamegraph's files.
    fn offcpu_json(&self) -> Value {
        json!({
            "total_ns": self.offcpu.total_ns,
            "intervals": self.offcpu.intervals,
            "stacks": self.offcpu.stacks,
            "missing_stacks": self.offcpu.missing_stacks,
            "runnable_ns": self.wall.runnable_ns,
            "runnable_intervals": self.wall.runnable_intervals,
            "folded": self.offcpu_files.as_ref().map(|f| &f.folded),
            "svg": self.offcpu_files.as_ref().map(|f| &f.svg),
        })
    }

    /// The `oncpu` block: the samples and the on-CPU flamegraph's files.
    fn oncpu_json(&self) -> Value {
        json!({
            "samples": self.wall.oncpu_samples,
            "total_ns": self.wall.oncpu_ns,
            "folded": self.files.oncpu.as_ref().map(|f| &f.folded),
            "svg": self.files.oncpu.as_ref().map(|f| &f.svg),
        })
    }

    /// The `wallclock` block: the whole profile's totals and files.
    fn wallclock_json(&self) -> Value {
        json!({
            "total_ns": self.wall.oncpu_ns + self.wall.offcpu_ns + self.wall.runnable_ns,
            "threads": self.wall.threads,
            "folded": self.files.wall.as_ref().map(|f| &f.folded),
            "svg": self.files.wall.as_ref().map(|f| &f.svg),
            "pprof": self.files.pprof,
            "speedscope": self.files.speedscope,
            "unnamed_ns": self.wall.unnamed_ns,
            "truncated_ns": self.wall.truncated_ns,
            "unnamed_hint": self.unnamed,
        })
    }

    /// The `threads` block: each thread's times, with its Python states.
    fn threads_json(&self) -> Vec<Value> {
        self.wall
            .per_thread
            .iter()
            .map(|t| {
                json!({
                    "tid": t.tid,
                    "pid": t.tgid,
                    "name": t.name,
                    "oncpu_ns": t.oncpu_ns,
                    "blocked_ns": t.blocked_ns,
                    "runnable_ns": t.runnable_ns,
                    "python": t.python.as_ref().map(|p| json!({
                        "running_ns": p.running_ns,
                        "gil_ns": p.gil_ns,
                        "gc_ns": p.gc_ns,
                        "blocked_ns": p.blocked_ns,
                        "runnable_ns": p.runnable_ns,
                    })),
                })
            })
            .collect()
    }

    /// The `unwind` block: how the user stacks were unwound (`--unwind dwarf`).
    fn unwind_json(&self) -> Option<Value> {
        self.unwind_stats.as_ref().map(|u| {
            json!({
                "method": "dwarf",
                "samples": u.samples,
                "offcpu_snapshots": u.offcpu_snapshots,
                "frames": u.frames,
                "frame_pointer_frames": u.frame_pointer_frames,
                "max_depth": u.max_depth,
            })
        })
    }

    /// The `timeline` block: the file written and its intervals (`--timeline`).
    fn timeline_json(&self) -> Option<Value> {
        self.timeline.as_ref().map(|t| {
            json!({
                "path": t.path,
                "intervals": t.intervals,
                "lost": t.lost,
            })
        })
    }

    /// The `lost` block: everything the eBPF side could not record.
    fn losses_json(&self) -> Value {
        json!({
            "events_lost": self.losses.events_lost,
            "map_full": self.losses.map_full,
            "stack_errors": self.losses.stacks.errors,
            "stack_collisions": self.losses.stacks.collisions,
            "stack_map_full": self.losses.stacks.map_full,
            "unmatched_ends": self.losses.unmatched_ends,
            "arg_read_errors": self.losses.arg_read_errors,
            "program_misses": self.losses.program_misses.iter()
                .map(|(program, runs)| json!({"program": program, "runs": runs}))
                .collect::<Vec<_>>(),
            "switch_ins_recovered": self.losses.switch_ins_missed,
            "unwind_ring_full": self.losses.unwind_ring_full,
        })
    }
}
