//! The runtimes `tracer attach` recognises by the USDT providers they carry, and what it
//! measures for each: latencies as pairs of probes matched per thread.

pub(crate) mod functions;

use crate::probe::usdt::ProbeKind;

/// A probe as latencies and task roles name it: a USDT probe (provider and name), or a
/// function's entry or return (no provider; the function's symbol).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ProbeRef {
    pub kind: ProbeKind,
    pub provider: String,
    pub name: String,
}

impl ProbeRef {
    pub(crate) fn usdt(provider: &str, name: &str) -> Self {
        ProbeRef {
            kind: ProbeKind::Usdt,
            provider: provider.into(),
            name: name.into(),
        }
    }

    pub(crate) fn function(kind: ProbeKind, symbol: &str) -> Self {
        ProbeRef {
            kind,
            provider: String::new(),
            name: symbol.into(),
        }
    }

    /// Whether a site of this kind, provider and name is this probe.
    pub(crate) fn is(&self, kind: ProbeKind, provider: &str, name: &str) -> bool {
        self.kind == kind && self.provider == provider && self.name == name
    }
}

impl std::fmt::Display for ProbeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            ProbeKind::Usdt => write!(f, "{}:{}", self.provider, self.name),
            kind => write!(f, "{kind}:{}", self.name),
        }
    }
}

/// How a latency's occurrences are told apart in reports: by an argument of the probe
/// that begins it (a collection's generation), then by an argument of a probe hit while
/// it is open on the same thread (the collector V8 picks once it collects; the
/// generation CPython 3.13 picks inside the collection), which wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LatencyClass {
    pub begin_arg: Option<u8>,
    /// Probes that classify it while it is open, each with the class it gives.
    pub probes: Vec<(ProbeRef, ClassValue)>,
    /// The label of occurrences nothing classified.
    pub unclassified: &'static str,
    /// What the class is, for reports: `generation`, `collector`.
    pub what: &'static str,
    /// The names of known values; others are shown as numbers.
    pub labels: &'static [(u32, &'static str)],
}

/// The class a classifying probe gives: the value of one of its arguments, or its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClassValue {
    Arg(u8),
    Const(u32),
}

impl LatencyClass {
    /// The label of class `value`.
    pub(crate) fn label(&self, value: u32) -> String {
        if value == tracer_common::NO_CLASS {
            return self.unclassified.to_string();
        }
        match self.labels.iter().find(|(v, _)| *v == value) {
            Some((_, label)) => label.to_string(),
            None => format!("{} {value}", self.what),
        }
    }
}

/// A latency measured from one probe to another on the same thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LatencyDef {
    /// Name in reports, e.g. `gc_pause`.
    pub name: String,
    pub begin: ProbeRef,
    pub end: ProbeRef,
    /// Each begin is matched to the end at its own stack frame (a function's entry and
    /// return), so a recursive function's calls are each timed; otherwise to the next
    /// end on the thread.
    pub frame_keyed: bool,
    pub class: Option<LatencyClass>,
    /// The runtime it measures, when a known runtime's (`CPython`).
    pub runtime: Option<&'static str>,
    /// How it is measured, for reports: `usdt`, or `function probes` for a runtime
    /// without USDT probes.
    pub mechanism: Mechanism,
}

/// Where a runtime's latencies come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mechanism {
    Usdt,
    FunctionProbes,
}

impl LatencyDef {
    /// A latency between two probes, named by the user: frame-keyed when it is a
    /// function's entry to its return.
    pub(crate) fn between(name: String, begin: ProbeRef, end: ProbeRef) -> Self {
        let frame_keyed = begin.kind == ProbeKind::Uprobe
            && end.kind == ProbeKind::Uretprobe
            && begin.name == end.name;
        let mechanism = match begin.kind.is_function() || end.kind.is_function() {
            true => Mechanism::FunctionProbes,
            false => Mechanism::Usdt,
        };
        LatencyDef {
            name,
            begin,
            end,
            frame_keyed,
            class: None,
            runtime: None,
            mechanism,
        }
    }
}

/// What a task-switch probe says about a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskRole {
    Run,
    Pause,
    Finish,
    /// The probe names the task: argument `name_arg` points to a NUL-terminated name (or
    /// a spawn location's file, then followed by its line and column).
    Name {
        name_arg: u8,
    },
}

/// A probe that marks a task switch, and where it finds the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskProbeDef {
    pub provider: String,
    pub name: String,
    pub role: TaskRole,
    /// The argument holding the task id; `None`: the task is the thread that hit it.
    pub task_arg: Option<u8>,
}

/// A runtime known by its provider name.
#[derive(Debug)]
pub(crate) struct Runtime {
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

/// Ours: Julia's, and a task's name (`probes::rt_task_name`).
const TRACER_TASKS: &[(&str, TaskRole, Option<u8>)] = &[
    ("rt__run__task", TaskRole::Run, Some(0)),
    ("rt__pause__task", TaskRole::Pause, Some(0)),
    ("rt__finish__task", TaskRole::Finish, Some(0)),
    ("rt__task__name", TaskRole::Name { name_arg: 1 }, Some(0)),
];

pub(crate) const RUNTIMES: &[Runtime] = &[
    Runtime {
        name: "tracer probes",
        provider: "tracer",
        latencies: JULIA_STYLE_GC,
        task_probes: TRACER_TASKS,
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
        // The probes of the tokio-dtrace crate, through the usdt crate: a task's id and
        // spawn location at every task probe; `__` in usdt's names is `-` in the notes.
        name: "tokio",
        provider: "tokio",
        latencies: &[
            ("task_poll", "task-poll-start", "task-poll-end"),
            ("worker_park", "worker-thread-park", "worker-thread-unpark"),
        ],
        task_probes: &[
            ("task-spawn", TaskRole::Name { name_arg: 1 }, Some(0)),
            ("task-poll-start", TaskRole::Run, Some(0)),
            ("task-poll-end", TaskRole::Pause, Some(0)),
            ("task-terminate", TaskRole::Finish, Some(0)),
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
    pub(crate) fn latency_defs(&self) -> impl Iterator<Item = LatencyDef> + '_ {
        self.latencies.iter().map(|&(name, begin, end)| LatencyDef {
            name: name.into(),
            begin: ProbeRef::usdt(self.provider, begin),
            end: ProbeRef::usdt(self.provider, end),
            frame_keyed: false,
            class: None,
            runtime: Some(self.name),
            mechanism: Mechanism::Usdt,
        })
    }
}

impl Runtime {
    pub(crate) fn task_probe_defs(&self) -> impl Iterator<Item = TaskProbeDef> + '_ {
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
pub(crate) fn by_provider(provider: &str) -> Option<&'static Runtime> {
    RUNTIMES.iter().find(|r| r.provider == provider)
}

/// How to get names for the JIT-compiled code of a process that maps `files`: what the
/// runtime recognised by its files can be asked to write (a perf map tracer reads, frame
/// pointers for the callers), or a generic word when none is recognised.
pub(crate) fn jit_naming_hint<'a>(pid: u32, files: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = files
        .into_iter()
        .filter_map(|path| path.rsplit('/').next())
        .collect();
    let maps = |prefix: &str| names.iter().any(|name| name.starts_with(prefix));
    if maps("libjvm.so") {
        format!(
            "this is a JVM: tracer asks it for its perf map (what `jcmd {pid} \
             Compiler.perfmap` does, JDK 17 and later) unless --no-jit-symbols is given or \
             its attach mechanism is off; starting it with -XX:+PreserveFramePointer lets \
             the callers of JIT-compiled methods be found too"
        )
    } else if maps("libjulia") {
        "this is Julia: start it with ENABLE_JITPROFILING=1 to have it write a perf map \
         tracer reads"
            .to_string()
    } else if maps("node") || maps("libnode") {
        "this is Node.js: start it with --perf-prof (a jitdump) or --perf-basic-prof (a \
         perf map) to have it name its JIT-compiled code for tracer"
            .to_string()
    } else if maps("python3.1") || maps("libpython3.1") {
        "this is CPython: from 3.12, `-X perf` (or PYTHONPERFSUPPORT=1) writes a perf map \
         tracer reads"
            .to_string()
    } else {
        format!(
            "code without symbols is named from /tmp/perf-{pid}.map when the runtime writes \
             one (most JITs can)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hint_names_the_runtime_by_its_files() {
        let jvm = jit_naming_hint(
            42,
            [
                "/usr/bin/java",
                "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so",
            ],
        );
        assert!(jvm.contains("jcmd 42 Compiler.perfmap") && jvm.contains("PreserveFramePointer"));
        assert!(
            jit_naming_hint(1, ["/opt/julia/lib/julia/libjulia-internal.so.1"])
                .contains("ENABLE_JITPROFILING=1")
        );
        assert!(jit_naming_hint(1, ["/usr/bin/node"]).contains("--perf-basic-prof"));
        assert!(jit_naming_hint(7, ["/usr/bin/app"]).contains("/tmp/perf-7.map"));
    }

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
        let tokio = by_provider("tokio").unwrap();
        assert!(tokio.latency_defs().any(|l| l.name == "task_poll"));
        assert!(
            tokio
                .task_probe_defs()
                .any(|t| t.name == "task-spawn" && t.role == TaskRole::Name { name_arg: 1 })
        );
    }
}
