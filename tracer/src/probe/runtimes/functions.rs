//! Runtimes measured through their functions when their build has no USDT probes (pyenv's
//! CPython, Node): the functions that bracket a collection, and which argument or probe
//! says what kind of collection it was. Each entry names the symbols of the builds it was
//! checked against; a process mapping none of them gets none of its latencies.

use std::collections::HashMap;
use std::path::PathBuf;

use super::{ClassValue, LatencyClass, LatencyDef, Mechanism, ProbeRef};
use crate::probe::usdt::{self, ProbeKind, UsdtSpecifier};

/// A runtime whose collections are timed from function probes.
pub(crate) struct FunctionRuntime {
    pub name: &'static str,
    /// Its USDT provider: a file carrying these probes is measured by them instead.
    pub provider: Option<&'static str>,
    /// The files that hold its functions.
    pub files: Files,
    pub latencies: &'static [FunctionLatency],
}

/// Which files hold a runtime's functions.
pub(crate) enum Files {
    /// By file name, wildcards allowed.
    Named(&'static [&'static str]),
    /// A target's executable when it is a Go program.
    GoPrograms,
}

/// One latency of a [`FunctionRuntime`], between two function probes.
pub(crate) struct FunctionLatency {
    pub name: &'static str,
    pub begin: (ProbeKind, &'static str),
    pub end: (ProbeKind, &'static str),
    /// Entry and return of one function, matched per call (see
    /// [`LatencyDef::frame_keyed`]).
    pub frame_keyed: bool,
    pub class: Option<FunctionClass>,
}

/// Where a [`FunctionLatency`]'s class comes from, as in [`LatencyClass`].
pub(crate) struct FunctionClass {
    pub begin_arg: Option<u8>,
    pub probes: &'static [((ProbeKind, &'static str), ClassValue)],
    pub what: &'static str,
    pub labels: &'static [(u32, &'static str)],
    pub unclassified: &'static str,
}

const GENERATIONS: &[(u32, &str)] = &[(0, "gen0"), (1, "gen1"), (2, "gen2")];

/// V8's `GarbageCollector` enum (`src/common/globals.h` of V8 11.3, Node 20): scavenges
/// and minor mark-compacts are young-generation (minor) collections, as Node's
/// `perf_hooks` counts them.
const V8_COLLECTORS: &[(u32, &str)] = &[(0, "minor"), (1, "major"), (2, "minor")];

/// CPython's collection of one generation before 3.10, timed from the function's entry
/// to its return, the generation its second argument (after the GC state).
const fn cpython_collect(symbol: &'static str, generation_arg: u8) -> FunctionLatency {
    FunctionLatency {
        name: "gc_pause",
        begin: (ProbeKind::Uprobe, symbol),
        end: (ProbeKind::Uretprobe, symbol),
        frame_keyed: true,
        class: Some(FunctionClass {
            begin_arg: Some(generation_arg),
            probes: &[],
            what: "generation",
            labels: GENERATIONS,
            unclassified: "unclassified",
        }),
    }
}

/// CPython's collection from 3.10 on: `gc_collect_main(tstate, generation, ...)`. 3.13
/// passes -1 for automatic collections and picks the generation inside, then invokes the
/// collection's callbacks with it (`invoke_gc_callback`'s third argument, which its
/// compiler-made clone keeps; called whether or not callbacks are registered); before
/// 3.13 the callbacks run outside the function, so no collection is open then.
/// Frame-keyed: 3.13 re-enters the function from a finalizer run by a collection (and
/// returns at once), and each call is matched to its own return; the callback classifies
/// the innermost call open.
const fn cpython_collect_main() -> FunctionLatency {
    FunctionLatency {
        name: "gc_pause",
        begin: (ProbeKind::Uprobe, "gc_collect_main"),
        end: (ProbeKind::Uretprobe, "gc_collect_main"),
        frame_keyed: true,
        class: Some(FunctionClass {
            begin_arg: Some(1),
            probes: &[(
                (ProbeKind::Uprobe, "invoke_gc_callback.isra.0"),
                ClassValue::Arg(2),
            )],
            what: "generation",
            labels: GENERATIONS,
            unclassified: "unclassified",
        }),
    }
}

/// The stops of the world of a Go collection.
const GO_PHASES: &[(u32, &str)] = &[(0, "sweep termination"), (1, "mark termination")];

/// What `ijl_gc_collect` is asked for (`jl_gc_collection_t`).
const JULIA_COLLECTIONS: &[(u32, &str)] = &[(0, "auto"), (1, "full"), (2, "incremental")];

const V8_COLLECT_GARBAGE: &str = "_ZN2v88internal4Heap14CollectGarbageENS0_15AllocationSpaceENS0_23GarbageCollectionReasonENS_15GCCallbackFlagsE";
const V8_PERFORM_GARBAGE_COLLECTION: &str = "_ZN2v88internal4Heap24PerformGarbageCollectionENS0_16GarbageCollectorENS0_23GarbageCollectionReasonEPKc";

pub(crate) const FUNCTION_RUNTIMES: &[FunctionRuntime] = &[
    FunctionRuntime {
        name: "CPython",
        provider: Some("python"),
        files: Files::Named(&["libpython3.*.so*", "python3.*"]),
        latencies: &[
            // 3.10 to 3.13.
            cpython_collect_main(),
            // 3.9 (and 3.6, 3.7).
            cpython_collect("collect", 1),
            // 3.8: GCC's clones of `collect`, one without its state argument (the
            // generation first), one for the C API's and the exit's full collections.
            cpython_collect("collect.constprop.1", 0),
            FunctionLatency {
                name: "gc_pause",
                begin: (ProbeKind::Uprobe, "collect.constprop.0"),
                end: (ProbeKind::Uretprobe, "collect.constprop.0"),
                frame_keyed: true,
                // Always the oldest generation, which the clone is not told.
                class: Some(FunctionClass {
                    begin_arg: None,
                    probes: &[],
                    what: "generation",
                    labels: GENERATIONS,
                    unclassified: "unclassified",
                }),
            },
        ],
    },
    FunctionRuntime {
        // Julia 1.13 as official releases build it (no WITH_DTRACE), checked on the
        // runtime bundled by the ace-jax-coupling wheel.
        name: "Julia",
        provider: Some("julia"),
        files: Files::Named(&["*libjulia-internal.so*"]),
        latencies: &[
            // The whole pause of the collecting thread: stopping the world, marking and
            // sweeping (twice when the first pass asks for a full one), finalizers.
            // Classified by what the first mark and sweep was asked for; a thread that
            // only waited for another thread's collection stays unclassified.
            FunctionLatency {
                name: "gc_pause",
                begin: (ProbeKind::Uprobe, "ijl_gc_collect"),
                end: (ProbeKind::Uretprobe, "ijl_gc_collect"),
                frame_keyed: true,
                class: Some(FunctionClass {
                    begin_arg: None,
                    probes: &[((ProbeKind::Uprobe, "_jl_gc_collect"), ClassValue::Arg(1))],
                    what: "collection",
                    labels: JULIA_COLLECTIONS,
                    unclassified: "waited for another thread's collection",
                }),
            },
            // Marking and sweeping: the span `jl_gc_total_hrtime` sums.
            FunctionLatency {
                name: "gc_mark_sweep",
                begin: (ProbeKind::Uprobe, "_jl_gc_collect"),
                end: (ProbeKind::Uretprobe, "_jl_gc_collect"),
                frame_keyed: true,
                class: None,
            },
            // Stopping the world: from asking the other threads to stop to all of them
            // having stopped.
            FunctionLatency {
                name: "gc_stop_the_world",
                begin: (ProbeKind::Uprobe, "jl_safepoint_start_gc"),
                end: (ProbeKind::Uretprobe, "jl_gc_wait_for_the_world"),
                frame_keyed: false,
                class: None,
            },
        ],
    },
    FunctionRuntime {
        // Go 1.19 (Debian's golang-go): entry probes only, as a return probe corrupts the
        // stacks Go moves. Every stop of the world, from stopping to starting it again;
        // the collection's phase is the function that runs while it is stopped.
        name: "Go",
        provider: None,
        files: Files::GoPrograms,
        latencies: &[FunctionLatency {
            name: "gc_pause",
            begin: (ProbeKind::Uprobe, "runtime.stopTheWorldWithSema"),
            end: (ProbeKind::Uprobe, "runtime.startTheWorldWithSema"),
            frame_keyed: false,
            class: Some(FunctionClass {
                begin_arg: None,
                probes: &[
                    (
                        (ProbeKind::Uprobe, "runtime.finishsweep_m"),
                        ClassValue::Const(0),
                    ),
                    (
                        (ProbeKind::Uprobe, "runtime.gcMarkTermination"),
                        ClassValue::Const(1),
                    ),
                ],
                what: "phase",
                labels: GO_PHASES,
                unclassified: "not a collection (ReadMemStats, GOMAXPROCS...)",
            }),
        }],
    },
    FunctionRuntime {
        name: "Node.js (V8)",
        provider: None,
        files: Files::Named(&["node", "libnode.so*"]),
        latencies: &[FunctionLatency {
            name: "gc_pause",
            begin: (ProbeKind::Uprobe, V8_COLLECT_GARBAGE),
            end: (ProbeKind::Uretprobe, V8_COLLECT_GARBAGE),
            frame_keyed: false,
            class: Some(FunctionClass {
                begin_arg: None,
                probes: &[(
                    (ProbeKind::Uprobe, V8_PERFORM_GARBAGE_COLLECTION),
                    ClassValue::Arg(1),
                )],
                what: "collector",
                labels: V8_COLLECTORS,
                unclassified: "unclassified",
            }),
        }],
    },
];

impl FunctionRuntime {
    /// Its latencies, as the plan takes them.
    pub(crate) fn latency_defs(&self) -> impl Iterator<Item = LatencyDef> + '_ {
        self.latencies.iter().map(|latency| {
            let probe = |(kind, symbol): (ProbeKind, &str)| ProbeRef::function(kind, symbol);
            LatencyDef {
                name: latency.name.into(),
                begin: probe(latency.begin),
                end: probe(latency.end),
                frame_keyed: latency.frame_keyed,
                class: latency.class.as_ref().map(|class| LatencyClass {
                    begin_arg: class.begin_arg,
                    probes: class
                        .probes
                        .iter()
                        .map(|&(p, value)| (probe(p), value))
                        .collect(),
                    what: class.what,
                    labels: class.labels,
                    unclassified: class.unclassified,
                }),
                runtime: Some(self.name),
                mechanism: Mechanism::FunctionProbes,
            }
        })
    }

    /// Its probes: of its latencies and of what classifies them.
    fn probes(&self) -> Vec<(ProbeKind, &'static str)> {
        let mut probes: Vec<(ProbeKind, &str)> = Vec::new();
        for latency in self.latencies {
            probes.extend([latency.begin, latency.end]);
            if let Some(class) = &latency.class {
                probes.extend(class.probes.iter().map(|(probe, _)| *probe));
            }
        }
        probes.sort();
        probes.dedup();
        probes
    }

    /// The function specifiers that find its probes in the files at `paths`.
    fn specifiers_in<'a>(&self, paths: impl IntoIterator<Item = &'a str>) -> Vec<UsdtSpecifier> {
        let probes = self.probes();
        let mut specs = Vec::new();
        for path in paths {
            for (kind, symbol) in &probes {
                if let Ok(spec) = usdt::parse_specifier(&format!("{kind}:{path}:{symbol}")) {
                    specs.push(spec);
                }
            }
        }
        specs
    }

    /// The function specifiers that find its probes, in any file it names.
    pub(crate) fn specifiers(&self) -> Vec<UsdtSpecifier> {
        match self.files {
            Files::Named(files) => self.specifiers_in(files.iter().copied()),
            Files::GoPrograms => Vec::new(),
        }
    }
}

/// Every catalogued runtime's latencies.
pub(crate) fn latency_defs() -> Vec<LatencyDef> {
    FUNCTION_RUNTIMES
        .iter()
        .flat_map(FunctionRuntime::latency_defs)
        .collect()
}

/// Every catalogued runtime's specifiers: in the files they name, and, for a runtime of
/// Go programs, in the executables of `pids` that are Go programs.
pub(crate) fn specifiers(pids: &[u32]) -> Vec<UsdtSpecifier> {
    let go_programs: Vec<String> = pids
        .iter()
        .filter_map(|&pid| usdt::executable(pid).ok())
        .filter(|exe| usdt::is_go_program(&exe.host_path))
        .map(|exe| exe.path.to_string_lossy().into_owned())
        .collect();
    FUNCTION_RUNTIMES
        .iter()
        .flat_map(|runtime| match runtime.files {
            Files::Named(_) => runtime.specifiers(),
            Files::GoPrograms => runtime.specifiers_in(go_programs.iter().map(String::as_str)),
        })
        .collect()
}

/// Tells which function sites of the catalogue to keep: those in files without the
/// runtime's USDT probes (which measure the same collections). Remembers each file's
/// answer.
#[derive(Default)]
pub(crate) struct UsdtElsewhere {
    has_provider: HashMap<(PathBuf, &'static str), bool>,
}

impl UsdtElsewhere {
    /// Whether `site`, a function site a catalogue specifier found, is to be attached.
    pub(crate) fn keep(&mut self, site: &usdt::ProbeSite) -> bool {
        let Some(runtime) = runtime_of(site.kind, &site.binary.path, &site.note.name) else {
            return true;
        };
        let Some(provider) = runtime.provider else {
            return true;
        };
        let path = site.binary.host_path.clone();
        let has = *self
            .has_provider
            .entry((path.clone(), provider))
            .or_insert_with(|| {
                usdt::read_notes(&path)
                    .is_ok_and(|notes| notes.iter().any(|n| n.provider == provider))
            });
        !has
    }
}

/// The catalogued runtime whose files and functions a probe (of `kind`, in the file at
/// `path`, named `name`) is of.
pub(crate) fn runtime_of(
    kind: ProbeKind,
    path: &std::path::Path,
    name: &str,
) -> Option<&'static FunctionRuntime> {
    if !kind.is_function() {
        return None;
    }
    let file = path.file_name()?.to_string_lossy().into_owned();
    FUNCTION_RUNTIMES.iter().find(|runtime| {
        let in_its_files = match runtime.files {
            Files::Named(files) => files
                .iter()
                .any(|glob| usdt::Glob::new(glob).matches(&file)),
            Files::GoPrograms => true,
        };
        in_its_files && runtime.probes().iter().any(|(_, symbol)| *symbol == name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_parses_and_names_its_files() {
        for runtime in FUNCTION_RUNTIMES {
            // A Go program's specifiers name its executable, none beforehand.
            let specs = runtime.specifiers_in(["/bin/x"]);
            assert!(!specs.is_empty(), "{}", runtime.name);
            assert!(specs.iter().all(|s| s.kind.is_function()));
            assert_eq!(
                runtime.specifiers().is_empty(),
                matches!(runtime.files, Files::GoPrograms)
            );
            for def in runtime.latency_defs() {
                assert_eq!(def.mechanism, Mechanism::FunctionProbes);
                assert_eq!(def.runtime, Some(runtime.name));
            }
        }
        let python = &FUNCTION_RUNTIMES[0];
        let def = python.latency_defs().next().unwrap();
        assert!(def.frame_keyed, "{def:?}");
        assert_eq!(def.class.as_ref().unwrap().label(2), "gen2");
        assert_eq!(def.class.as_ref().unwrap().label(7), "generation 7");
        // Go: only entry probes.
        let go = FUNCTION_RUNTIMES.iter().find(|r| r.name == "Go").unwrap();
        assert!(
            go.probes()
                .iter()
                .all(|(kind, _)| *kind == ProbeKind::Uprobe)
        );
    }
}
