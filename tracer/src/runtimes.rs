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

/// A runtime known by its provider name.
#[derive(Debug)]
pub struct Runtime {
    pub name: &'static str,
    pub provider: &'static str,
    /// (latency name, begin probe, end probe)
    pub latencies: &'static [(&'static str, &'static str, &'static str)],
}

/// The `probes` crate's provider (see `probes::PROVIDER`) and Julia's share probe names.
const JULIA_STYLE_GC: &[(&str, &str, &str)] = &[
    ("gc_pause", "gc__begin", "gc__end"),
    ("gc_stop_the_world", "gc__begin", "gc__stop_the_world"),
    ("gc_mark", "gc__mark__begin", "gc__mark__end"),
    ("gc_sweep", "gc__sweep__begin", "gc__sweep__end"),
];

pub const RUNTIMES: &[Runtime] = &[
    Runtime {
        name: "tracer probes",
        provider: "tracer",
        latencies: JULIA_STYLE_GC,
    },
    Runtime {
        name: "Julia",
        provider: "julia",
        latencies: JULIA_STYLE_GC,
    },
    Runtime {
        name: "JVM (HotSpot)",
        provider: "hotspot",
        latencies: &[("gc_pause", "gc__begin", "gc__end")],
    },
    Runtime {
        name: "CPython",
        provider: "python",
        latencies: &[("gc_pause", "gc__start", "gc__done")],
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
