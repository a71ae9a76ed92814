//! Runtimes measured through their functions when their build has no USDT probes (pyenv's
//! CPython, Node): the functions that bracket a collection, and which argument or probe
//! says what kind of collection it was. Each entry names the symbols of the builds it was
//! checked against; a process mapping none of them gets none of its latencies.

use std::collections::HashMap;
use std::path::PathBuf;

use super::{LatencyClass, LatencyDef, Mechanism, ProbeRef};
use crate::usdt::{self, ProbeKind, UsdtSpecifier};

/// A runtime whose collections are timed from function probes.
pub struct FunctionRuntime {
    pub name: &'static str,
    /// Its USDT provider: a file carrying these probes is measured by them instead.
    pub provider: Option<&'static str>,
    /// The files that hold its functions, by file name (wildcards allowed).
    pub files: &'static [&'static str],
    pub latencies: &'static [FunctionLatency],
}

/// One latency of a [`FunctionRuntime`], between two function probes.
pub struct FunctionLatency {
    pub name: &'static str,
    pub begin: (ProbeKind, &'static str),
    pub end: (ProbeKind, &'static str),
    /// Entry and return of one function, matched per call (see
    /// [`LatencyDef::frame_keyed`]).
    pub frame_keyed: bool,
    pub class: Option<FunctionClass>,
}

/// Where a [`FunctionLatency`]'s class comes from, as in [`LatencyClass`].
pub struct FunctionClass {
    pub begin_arg: Option<u8>,
    pub probe: Option<((ProbeKind, &'static str), u8)>,
    pub what: &'static str,
    pub labels: &'static [(u32, &'static str)],
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
            probe: None,
            what: "generation",
            labels: GENERATIONS,
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
const fn cpython_collect_main(callback: &'static str) -> FunctionLatency {
    FunctionLatency {
        name: "gc_pause",
        begin: (ProbeKind::Uprobe, "gc_collect_main"),
        end: (ProbeKind::Uretprobe, "gc_collect_main"),
        frame_keyed: true,
        class: Some(FunctionClass {
            begin_arg: Some(1),
            probe: Some(((ProbeKind::Uprobe, callback), 2)),
            what: "generation",
            labels: GENERATIONS,
        }),
    }
}

const V8_COLLECT_GARBAGE: &str = "_ZN2v88internal4Heap14CollectGarbageENS0_15AllocationSpaceENS0_23GarbageCollectionReasonENS_15GCCallbackFlagsE";
const V8_PERFORM_GARBAGE_COLLECTION: &str = "_ZN2v88internal4Heap24PerformGarbageCollectionENS0_16GarbageCollectorENS0_23GarbageCollectionReasonEPKc";

pub const FUNCTION_RUNTIMES: &[FunctionRuntime] = &[
    FunctionRuntime {
        name: "CPython",
        provider: Some("python"),
        files: &["libpython3.*.so*", "python3.*"],
        latencies: &[
            // 3.10 to 3.13.
            cpython_collect_main("invoke_gc_callback.isra.0"),
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
                    probe: None,
                    what: "generation",
                    labels: GENERATIONS,
                }),
            },
        ],
    },
    FunctionRuntime {
        name: "Node.js (V8)",
        provider: None,
        files: &["node", "libnode.so*"],
        latencies: &[FunctionLatency {
            name: "gc_pause",
            begin: (ProbeKind::Uprobe, V8_COLLECT_GARBAGE),
            end: (ProbeKind::Uretprobe, V8_COLLECT_GARBAGE),
            frame_keyed: false,
            class: Some(FunctionClass {
                begin_arg: None,
                probe: Some(((ProbeKind::Uprobe, V8_PERFORM_GARBAGE_COLLECTION), 1)),
                what: "collector",
                labels: V8_COLLECTORS,
            }),
        }],
    },
];

impl FunctionRuntime {
    /// Its latencies, as the plan takes them.
    pub fn latency_defs(&self) -> impl Iterator<Item = LatencyDef> + '_ {
        self.latencies.iter().map(|latency| {
            let probe = |(kind, symbol): (ProbeKind, &str)| ProbeRef::function(kind, symbol);
            LatencyDef {
                name: latency.name.into(),
                begin: probe(latency.begin),
                end: probe(latency.end),
                frame_keyed: latency.frame_keyed,
                class: latency.class.as_ref().map(|class| LatencyClass {
                    begin_arg: class.begin_arg,
                    probe: class.probe.map(|(p, arg)| (probe(p), arg)),
                    what: class.what,
                    labels: class.labels,
                }),
                runtime: Some(self.name),
                mechanism: Mechanism::FunctionProbes,
            }
        })
    }

    /// The function specifiers that find its probes, in any file it names.
    pub fn specifiers(&self) -> Vec<UsdtSpecifier> {
        let mut probes: Vec<(ProbeKind, &str)> = Vec::new();
        for latency in self.latencies {
            probes.extend([latency.begin, latency.end]);
            if let Some((probe, _)) = latency.class.as_ref().and_then(|c| c.probe) {
                probes.push(probe);
            }
        }
        probes.sort();
        probes.dedup();
        let mut specs = Vec::new();
        for file in self.files {
            for (kind, symbol) in &probes {
                if let Ok(spec) = usdt::parse_specifier(&format!("{kind}:{file}:{symbol}")) {
                    specs.push(spec);
                }
            }
        }
        specs
    }
}

/// Every catalogued runtime's latencies.
pub fn latency_defs() -> Vec<LatencyDef> {
    FUNCTION_RUNTIMES
        .iter()
        .flat_map(FunctionRuntime::latency_defs)
        .collect()
}

/// Every catalogued runtime's specifiers.
pub fn specifiers() -> Vec<UsdtSpecifier> {
    FUNCTION_RUNTIMES
        .iter()
        .flat_map(FunctionRuntime::specifiers)
        .collect()
}

/// Tells which function sites of the catalogue to keep: those in files without the
/// runtime's USDT probes (which measure the same collections). Remembers each file's
/// answer.
#[derive(Default)]
pub struct UsdtElsewhere {
    has_provider: HashMap<(PathBuf, &'static str), bool>,
}

impl UsdtElsewhere {
    /// Whether `site`, a function site a catalogue specifier found, is to be attached.
    pub fn keep(&mut self, site: &usdt::ProbeSite) -> bool {
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
                    .map(|notes| notes.iter().any(|n| n.provider == provider))
                    .unwrap_or(false)
            });
        !has
    }
}

/// The catalogued runtime whose files and functions a probe (of `kind`, in the file at
/// `path`, named `name`) is of.
pub fn runtime_of(
    kind: ProbeKind,
    path: &std::path::Path,
    name: &str,
) -> Option<&'static FunctionRuntime> {
    if !kind.is_function() {
        return None;
    }
    let file = path.file_name()?.to_string_lossy().into_owned();
    FUNCTION_RUNTIMES.iter().find(|runtime| {
        runtime
            .files
            .iter()
            .any(|glob| usdt::Glob::new(glob).matches(&file))
            && runtime.latencies.iter().any(|l| {
                [l.begin.1, l.end.1].contains(&name)
                    || l.class
                        .as_ref()
                        .and_then(|c| c.probe)
                        .is_some_and(|(p, _)| p.1 == name)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_parses_and_names_its_files() {
        for runtime in FUNCTION_RUNTIMES {
            let specs = runtime.specifiers();
            assert!(!specs.is_empty(), "{}", runtime.name);
            assert!(specs.iter().all(|s| s.kind.is_function()));
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
    }
}
