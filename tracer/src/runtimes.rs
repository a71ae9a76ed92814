//! The runtimes `tracer attach` recognises by the USDT providers they carry, and what it
//! measures for each: latencies as pairs of probes matched per thread.

/// A latency measured from one probe to another on the same thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyDef {
    /// Name in reports, e.g. `gc_pause`.
    pub name: String,
    pub provider: String,
    pub begin: String,
    pub end: String,
}

/// What a task-switch probe says about a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskRole {
    Run,
    Pause,
    Finish,
}

/// A probe that marks a task switch, and where it finds the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskProbeDef {
    pub provider: String,
    pub name: String,
    pub role: TaskRole,
    /// The argument holding the task id; `None`: the task is the thread that hit it.
    pub task_arg: Option<u8>,
}

/// A runtime known by its provider name.
#[derive(Debug)]
pub struct Runtime {
    pub name: &'static str,
    pub provider: &'static str,
    /// (latency name, begin probe, end probe)
    pub latencies: &'static [(&'static str, &'static str, &'static str)],
    /// (probe, role, task argument)
    pub task_probes: &'static [(&'static str, TaskRole, Option<u8>)],
}

/// The `probes` crate's provider (see `probes::PROVIDER`) and Julia's share probe names.
const JULIA_STYLE_GC: &[(&str, &str, &str)] = &[
    ("gc_pause", "gc__begin", "gc__end"),
    ("gc_stop_the_world", "gc__begin", "gc__stop_the_world"),
    ("gc_mark", "gc__mark__begin", "gc__mark__end"),
    ("gc_sweep", "gc__sweep__begin", "gc__sweep__end"),
];

/// Julia's task probes (and ours): the task is the first argument.
const JULIA_STYLE_TASKS: &[(&str, TaskRole, Option<u8>)] = &[
    ("rt__run__task", TaskRole::Run, Some(0)),
    ("rt__pause__task", TaskRole::Pause, Some(0)),
    ("rt__finish__task", TaskRole::Finish, Some(0)),
];

pub const RUNTIMES: &[Runtime] = &[
    Runtime {
        name: "tracer probes",
        provider: "tracer",
        latencies: JULIA_STYLE_GC,
        task_probes: JULIA_STYLE_TASKS,
    },
    Runtime {
        name: "Julia",
        provider: "julia",
        latencies: JULIA_STYLE_GC,
        task_probes: JULIA_STYLE_TASKS,
    },
    Runtime {
        name: "JVM (HotSpot)",
        provider: "hotspot",
        latencies: &[("gc_pause", "gc__begin", "gc__end")],
        // A Java thread parks (LockSupport.park) and unparks: the thread is the task.
        task_probes: &[
            ("thread__park__begin", TaskRole::Pause, None),
            ("thread__park__end", TaskRole::Run, None),
        ],
    },
    Runtime {
        name: "CPython",
        provider: "python",
        latencies: &[("gc_pause", "gc__start", "gc__done")],
        task_probes: &[],
    },
];

impl Runtime {
    pub fn latency_defs(&self) -> impl Iterator<Item = LatencyDef> + '_ {
        self.latencies.iter().map(|&(name, begin, end)| LatencyDef {
            name: name.into(),
            provider: self.provider.into(),
            begin: begin.into(),
            end: end.into(),
        })
    }
}

impl Runtime {
    pub fn task_probe_defs(&self) -> impl Iterator<Item = TaskProbeDef> + '_ {
        self.task_probes
            .iter()
            .map(|&(name, role, task_arg)| TaskProbeDef {
                provider: self.provider.into(),
                name: name.into(),
                role,
                task_arg,
            })
    }
}

/// The runtime whose provider is `provider`, if we know it.
pub fn by_provider(provider: &str) -> Option<&'static Runtime> {
    RUNTIMES.iter().find(|r| r.provider == provider)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_the_seed_runtimes() {
        for provider in ["tracer", "julia", "hotspot", "python"] {
            let runtime = by_provider(provider).unwrap();
            assert!(
                runtime.latency_defs().any(|l| l.name == "gc_pause"),
                "{provider}"
            );
        }
        assert!(by_provider("nodejs").is_none());
    }
}
