//! `--metrics ADDR` of `attach` and `profile`: what a scrape answers, read from the
//! kernel's maps and the sampler when it comes. Every figure is a total since the start,
//! kept by the kernel for processes that exited too: counters never go backwards.

use std::collections::BTreeMap;

use tracer_common::{LatencyStats, counter, offcpu_state};

use anyhow::Result;

use crate::{
    cli::{MetricLabels, MetricsConfig},
    kernel::Loader,
    output::endpoint::{Endpoint, Scrape, Scrapes},
    output::render::prometheus::{Exposition, Kind, Label, metric_name},
    probe::plan::ProbePlan,
    profile::{histogram::LatencyHistogram, sampling::WallClockSampler},
    stack::processes::Processes,
    system::procfs,
};

/// What a scrape reads.
pub struct MetricSources<'a> {
    pub loader: &'a Loader,
    /// The probes attached, whose latencies are histograms (`attach`).
    pub plan: Option<&'a ProbePlan>,
    pub processes: &'a Processes,
    pub sampler: &'a WallClockSampler,
    pub labels: MetricLabels,
}

/// A series's labels before they are written: the process's name, its PID on request,
/// and the runtime (or the latency's name) where the family has one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct SeriesKey {
    extra: Option<(&'static str, String)>,
    process: String,
    pid: Option<u32>,
}

impl SeriesKey {
    /// Its labels: the family's own first, `process`, then `pid` when asked for.
    fn labels(&self) -> Vec<(&'static str, String)> {
        let mut labels = Vec::with_capacity(3);
        if let Some((name, value)) = &self.extra {
            labels.push((*name, value.clone()));
        }
        labels.push(("process", self.process.clone()));
        if let Some(pid) = self.pid {
            labels.push(("pid", pid.to_string()));
        }
        labels
    }
}

/// `labels` as the exposition takes them.
fn borrowed<'a>(labels: &'a [(&'static str, String)]) -> Vec<Label<'a>> {
    labels.iter().map(|(n, v)| (*n, v.as_str())).collect()
}

/// Binds `--metrics ADDR`'s endpoint; call before attaching, so that an address that
/// cannot be listened on fails first.
pub fn bind(config: Option<&MetricsConfig>) -> Result<Option<(Endpoint, MetricLabels)>> {
    config
        .map(|m| Ok((Endpoint::bind(&m.addr)?, m.labels)))
        .transpose()
}

/// Starts serving on `runtime`, saying where.
pub fn serve(
    bound: Option<(Endpoint, MetricLabels)>,
    runtime: &tokio::runtime::Runtime,
) -> Result<Option<(Scrapes, MetricLabels)>> {
    let Some((endpoint, labels)) = bound else {
        return Ok(None);
    };
    let addr = endpoint.local_addr()?;
    let _entered = runtime.enter();
    crate::status!("Serving metrics at http://{addr}/metrics.");
    Ok(Some((endpoint.serve()?, labels)))
}

/// The next scrape of `metrics`; pending for ever without.
pub async fn next_scrape(metrics: &mut Option<(Scrapes, MetricLabels)>) -> Scrape {
    match metrics.as_mut() {
        Some((scrapes, _)) => scrapes.next().await,
        None => std::future::pending().await,
    }
}

/// Writes every family into one exposition.
pub fn scrape(sources: &MetricSources<'_>) -> String {
    let mut out = Exposition::new();
    if let Some(plan) = sources.plan {
        latencies(sources, plan, &mut out);
    }
    scheduler_time(sources, &mut out);
    losses(sources.loader, &mut out);
    if let Some(running) = sources.sampler.processes_running() {
        out.family(
            "tracer_processes",
            Kind::Gauge,
            "Processes of the set of targets running now.",
        );
        out.sample("tracer_processes", &[], running as f64);
    }
    let (cpu_seconds, resident_bytes) = procfs::own_usage();
    out.family(
        "process_cpu_seconds_total",
        Kind::Counter,
        "CPU time the tracer itself has spent (user and system).",
    );
    out.sample("process_cpu_seconds_total", &[], cpu_seconds);
    out.family(
        "process_resident_memory_bytes",
        Kind::Gauge,
        "The tracer's own resident memory.",
    );
    out.sample("process_resident_memory_bytes", &[], resident_bytes as f64);
    out.finish()
}

impl MetricSources<'_> {
    /// The series key of process `tgid`: its program's name (as the kernel names it) and
    /// its PID when asked for.
    fn key(&self, tgid: u32, extra: Option<(&'static str, String)>) -> SeriesKey {
        let process = self
            .processes
            .get(tgid)
            .map(|p| p.program.clone())
            .unwrap_or_else(|| format!("[pid {tgid}]"));
        SeriesKey {
            extra,
            process,
            pid: self.labels.pid.then_some(tgid),
        }
    }
}

/// A histogram per latency and process: a runtime's as `tracer_NAME_seconds` with its
/// `runtime`, those of `--latency` as `tracer_latency_seconds` by `latency`.
fn latencies(sources: &MetricSources<'_>, plan: &ProbePlan, out: &mut Exposition) {
    let loader = sources.loader;
    let (Ok(buckets), Ok(totals)) = (
        loader.latency_buckets_by_process(),
        loader.latency_by_process(),
    ) else {
        return;
    };
    // By family, then by series.
    let mut families: BTreeMap<String, (String, BTreeMap<SeriesKey, LatencyHistogram>)> =
        BTreeMap::new();
    let series = |latency_id: u32, tgid: u32| {
        let def = plan.latencies.get(latency_id as usize)?;
        let (name, help, extra) = match def.runtime {
            Some(runtime) => (
                metric_name("tracer_", &def.name, "_seconds"),
                format!(
                    "The runtimes' {}: from {} to {}, per process.",
                    def.name, def.begin, def.end
                ),
                ("runtime", runtime.to_string()),
            ),
            None => (
                "tracer_latency_seconds".to_string(),
                "Latencies between the probes of --latency, per process.".to_string(),
                ("latency", def.name.clone()),
            ),
        };
        Some((name, help, sources.key(tgid, Some(extra))))
    };
    let updates = buckets
        .into_iter()
        .map(|(key, count)| (key.latency_id, key.tgid, Update::Bucket(key.bucket, count)))
        .chain(
            totals
                .into_iter()
                .map(|(key, stats)| (key.latency_id, key.tgid, Update::Stats(stats))),
        );
    for (latency_id, tgid, update) in updates {
        let Some((name, help, key)) = series(latency_id, tgid) else {
            continue;
        };
        let family = families
            .entry(name)
            .or_insert_with(|| (help, BTreeMap::new()));
        let hist = family.1.entry(key).or_default();
        match update {
            Update::Bucket(bucket, count) => hist.merge_bucket(bucket, count),
            Update::Stats(stats) => hist.merge_stats(&stats),
        }
    }
    for (name, (help, by_series)) in families {
        out.family(&name, Kind::Histogram, &help);
        for (key, hist) in by_series {
            out.histogram(&name, &borrowed(&key.labels()), &hist);
        }
    }
}

/// What the kernel counted of one latency in one process.
enum Update {
    /// A histogram bucket's count.
    Bucket(u32, u64),
    /// The exact count, total, min and max.
    Stats(LatencyStats),
}

/// Each process's time off CPU (blocked, and runnable: waiting for a CPU) and on CPU.
fn scheduler_time(sources: &MetricSources<'_>, out: &mut Exposition) {
    let mut blocked: BTreeMap<SeriesKey, u64> = BTreeMap::new();
    let mut runnable: BTreeMap<SeriesKey, u64> = BTreeMap::new();
    for (key, total) in sources.loader.offcpu_totals().unwrap_or_default() {
        let into = match key.state {
            offcpu_state::RUNNABLE => &mut runnable,
            _ => &mut blocked,
        };
        *into.entry(sources.key(key.tgid, None)).or_default() += total.total_ns;
    }
    let (samples, frequency_hz) = sources.sampler.oncpu_samples_by_process(sources.loader);
    let mut oncpu: BTreeMap<SeriesKey, u64> = BTreeMap::new();
    for (tgid, count) in samples {
        *oncpu.entry(sources.key(tgid, None)).or_default() += count;
    }
    let families = [
        (
            "tracer_offcpu_seconds_total",
            "Time the threads of each process spent blocked (off CPU, not runnable).",
            blocked,
            1e-9,
        ),
        (
            "tracer_runnable_seconds_total",
            "Time the threads of each process spent runnable, waiting for a CPU.",
            runnable,
            1e-9,
        ),
        (
            "tracer_oncpu_seconds_total",
            "Time the threads of each process spent on CPU, from samples.",
            oncpu,
            1.0 / frequency_hz.max(1) as f64,
        ),
    ];
    for (name, help, totals, unit) in families {
        out.family(name, Kind::Counter, help);
        for (key, total) in totals {
            out.sample(name, &borrowed(&key.labels()), total as f64 * unit);
        }
    }
}

/// What could not be recorded, by reason.
fn losses(loader: &Loader, out: &mut Exposition) {
    let Ok(counters) = loader.counters() else {
        return;
    };
    let reasons = [
        ("event_ring_full", counter::EVENTS_LOST),
        ("map_full", counter::MAP_FULL),
        ("stack_collision", counter::STACK_COLLISIONS),
        ("stack_map_full", counter::STACK_MAP_FULL),
        ("unwind_ring_full", counter::UNWIND_RING_FULL),
        ("timeline_ring_full", counter::TIMELINE_LOST),
        ("argument_unreadable", counter::ARG_READ_ERRORS),
        ("unmatched_end", counter::UNMATCHED_ENDS),
    ];
    out.family(
        "tracer_events_lost_total",
        Kind::Counter,
        "Events the kernel could not record, by reason.",
    );
    for (reason, index) in reasons {
        out.sample(
            "tracer_events_lost_total",
            &[("reason", reason)],
            counters[index as usize] as f64,
        );
    }
}
