//! `--metrics ADDR` of `attach` and `profile`: what a scrape answers, read when it comes.
//! The kernel adds each process's latencies and time off CPU to its figures
//! (`PROCESS_METRICS`); a scrape reads them, and those of processes that exited it folds
//! into totals by name kept here and removes from the kernel's map. So a scrape's work
//! follows the processes running, not those that came and went, and counters never go
//! backwards. With `--metrics-labels pid` an exited process's series end with it instead.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::Result;
use tracer_common::{ProcessMetricKey, counter, histogram, offcpu_state, process_metric};

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
pub(crate) struct MetricSources<'a> {
    pub loader: &'a mut Loader,
    /// The probes attached, whose latencies are histograms (`attach`).
    pub plan: Option<&'a ProbePlan>,
    pub processes: &'a Processes,
    pub sampler: &'a WallClockSampler,
    /// The on-CPU samples of the processes let go, by program (see
    /// [`crate::profile::retire`]).
    pub retired_oncpu: Option<&'a BTreeMap<String, u64>>,
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

/// The program of process `tgid` when the processes seen name it (not `[pid N]`, the
/// placeholder of one seen only once gone).
fn known_program(processes: &Processes, tgid: u32) -> Option<String> {
    processes
        .get(tgid)
        .map(|p| p.program.clone())
        .filter(|program| !program.starts_with("[pid "))
}

/// `labels` as the exposition takes them.
fn borrowed<'a>(labels: &'a [(&'static str, String)]) -> Vec<Label<'a>> {
    labels.iter().map(|(n, v)| (*n, v.as_str())).collect()
}

/// A latency's histogram in one series: its buckets, and the total of its values.
#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: LatencyHistogram,
    sum_ns: u64,
}

/// Each series's figures from `PROCESS_METRICS`.
#[derive(Debug, Default)]
struct Figures {
    /// By family (its name and help), then series.
    latencies: BTreeMap<(String, String), BTreeMap<SeriesKey, Histogram>>,
    /// Nanoseconds off CPU by state, then series.
    offcpu: BTreeMap<u32, BTreeMap<SeriesKey, u64>>,
}

impl Figures {
    /// Adds `value` of `key`, counted for process `series` (its name and PID).
    fn add(
        &mut self,
        key: &ProcessMetricKey,
        value: u64,
        series: SeriesKey,
        plan: Option<&ProbePlan>,
    ) {
        match key.metric {
            process_metric::OFFCPU_NS => {
                *self
                    .offcpu
                    .entry(key.index)
                    .or_default()
                    .entry(series)
                    .or_default() += value;
            }
            metric => {
                let latency_id = match metric {
                    process_metric::LATENCY_COUNT => key.index / histogram::BUCKETS,
                    _ => key.index,
                };
                let Some(def) = plan.and_then(|p| p.latencies.get(latency_id as usize)) else {
                    return;
                };
                let (family, extra) = match def.runtime {
                    Some(runtime) => (
                        (
                            metric_name("tracer_", &def.name, "_seconds"),
                            format!(
                                "The runtimes' {}: from {} to {}, per process.",
                                def.name, def.begin, def.end
                            ),
                        ),
                        ("runtime", runtime.to_string()),
                    ),
                    None => (
                        (
                            "tracer_latency_seconds".to_string(),
                            "Latencies between the probes of --latency, per process.".to_string(),
                        ),
                        ("latency", def.name.clone()),
                    ),
                };
                let series = SeriesKey {
                    extra: Some(extra),
                    ..series
                };
                let hist = self
                    .latencies
                    .entry(family)
                    .or_default()
                    .entry(series)
                    .or_default();
                match metric {
                    process_metric::LATENCY_COUNT => hist
                        .buckets
                        .merge_bucket(key.index % histogram::BUCKETS, value),
                    _ => hist.sum_ns += value,
                }
            }
        }
    }

    /// Adds every figure of `other`.
    fn merge(&mut self, other: &Figures) {
        for (family, series) in &other.latencies {
            let into = self.latencies.entry(family.clone()).or_default();
            for (key, hist) in series {
                let total = into.entry(key.clone()).or_default();
                total.buckets.merge(&hist.buckets);
                total.sum_ns += hist.sum_ns;
            }
        }
        for (state, series) in &other.offcpu {
            let into = self.offcpu.entry(*state).or_default();
            for (key, ns) in series {
                *into.entry(key.clone()).or_default() += ns;
            }
        }
    }
}

/// `--metrics`, served: the scrapes to answer, the labels asked for, and the figures of
/// processes gone.
pub(crate) struct Metrics {
    scrapes: Scrapes,
    labels: MetricLabels,
    gone: Figures,
    /// The program of each process with figures in the kernel's map, kept until they
    /// are folded: a process let go (see [`crate::profile::retire`]) while it still had
    /// figures there keeps its name.
    programs: HashMap<u32, String>,
}

/// Binds `--metrics ADDR`'s endpoint; call before attaching, so that an address that
/// cannot be listened on fails first.
pub(crate) fn bind(config: Option<&MetricsConfig>) -> Result<Option<(Endpoint, MetricLabels)>> {
    config
        .map(|m| Ok((Endpoint::bind(&m.addr)?, m.labels)))
        .transpose()
}

/// Starts serving on `runtime`, saying where.
pub(crate) fn serve(
    bound: Option<(Endpoint, MetricLabels)>,
    runtime: &tokio::runtime::Runtime,
) -> Result<Option<Metrics>> {
    let Some((endpoint, labels)) = bound else {
        return Ok(None);
    };
    let addr = endpoint.local_addr()?;
    let _entered = runtime.enter();
    crate::status!("Serving metrics at http://{addr}/metrics.");
    Ok(Some(Metrics {
        scrapes: endpoint.serve()?,
        labels,
        gone: Figures::default(),
        programs: HashMap::new(),
    }))
}

/// The next scrape of `metrics`; pending for ever without.
pub(crate) async fn next_scrape(metrics: &mut Option<Metrics>) -> Scrape {
    match metrics.as_mut() {
        Some(metrics) => metrics.scrapes.next().await,
        None => std::future::pending().await,
    }
}

impl Metrics {
    /// Answers `scrape` with every family, read from `sources` now.
    pub(crate) fn answer(&mut self, scrape: Scrape, sources: MetricSources<'_>) {
        let figures = self.read_figures(sources.loader, sources.plan, sources.processes);
        let mut out = Exposition::new();
        for ((name, help), series) in &figures.latencies {
            out.family(name, Kind::Histogram, help);
            for (key, hist) in series {
                out.histogram(name, &borrowed(&key.labels()), &hist.buckets, hist.sum_ns);
            }
        }
        self.scheduler_time(&figures, &sources, &mut out);
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
        scrape.answer(out.finish());
    }

    /// Folds the figures of the processes gone into those kept by name, while their
    /// names are still known: before they are let go (see [`crate::profile::retire`]).
    pub(crate) fn fold_gone(
        &mut self,
        loader: &mut Loader,
        plan: Option<&ProbePlan>,
        processes: &Processes,
    ) {
        let _running = self.read_figures(loader, plan, processes);
    }

    /// The series key of process `tgid`: its program's name (as the kernel names it) and
    /// its PID when asked for.
    fn series(&self, processes: &Processes, tgid: u32) -> SeriesKey {
        let process = known_program(processes, tgid)
            .or_else(|| self.programs.get(&tgid).cloned())
            .unwrap_or_else(|| format!("[pid {tgid}]"));
        SeriesKey {
            extra: None,
            process,
            pid: self.labels.pid.then_some(tgid),
        }
    }

    /// The figures of every series: those of the processes running, read from the
    /// kernel, and those of the processes gone. The figures of processes that exited
    /// since the last scrape move from the kernel's map to those gone (without a `pid`
    /// label: with one, their series end).
    fn read_figures(
        &mut self,
        loader: &mut Loader,
        plan: Option<&ProbePlan>,
        processes: &Processes,
    ) -> Figures {
        let entries = loader.process_metrics().unwrap_or_default();
        let tgids: BTreeSet<u32> = entries.iter().map(|(key, _)| key.tgid).collect();
        self.remember_programs(loader, processes, &tgids);
        let gone: BTreeSet<u32> = tgids
            .into_iter()
            .filter(|tgid| !std::path::Path::new(&format!("/proc/{tgid}")).exists())
            .collect();
        let mut running = Figures::default();
        for (key, value) in entries {
            let series = self.series(processes, key.tgid);
            // Removed first: a figure is folded once, or stays in the kernel's map.
            if gone.contains(&key.tgid) && loader.remove_process_metric(&key).is_ok() {
                if !self.labels.pid {
                    self.gone.add(&key, value, series, plan);
                }
                continue;
            }
            running.add(&key, value, series, plan);
        }
        running.merge(&self.gone);
        running
    }

    /// Notes the program of each process `tgids` (those with figures in the kernel's
    /// map) while something knows it: the processes seen, or else the name the kernel
    /// gave a member of a set when it joined. Forgets the others.
    fn remember_programs(&mut self, loader: &Loader, processes: &Processes, tgids: &BTreeSet<u32>) {
        self.programs.retain(|tgid, _| tgids.contains(tgid));
        self.learn_programs(loader, processes, tgids);
    }

    /// Notes the programs of processes `tgids`, as [`Self::remember_programs`] does,
    /// forgetting none.
    fn learn_programs(&mut self, loader: &Loader, processes: &Processes, tgids: &BTreeSet<u32>) {
        for &tgid in tgids {
            if let Some(program) = known_program(processes, tgid) {
                self.programs.insert(tgid, program);
            }
        }
        if tgids.iter().all(|tgid| self.programs.contains_key(tgid)) {
            return;
        }
        // A member that came and went between two looks at the set was never seen.
        if let Ok(targets) = loader.targets_map() {
            for (tgid, name) in targets.named() {
                if tgids.contains(&tgid) && !name.is_empty() {
                    self.programs.entry(tgid).or_insert(name);
                }
            }
        }
    }

    /// Each process's time off CPU (blocked, and runnable: waiting for a CPU) and on CPU.
    fn scheduler_time(
        &mut self,
        figures: &Figures,
        sources: &MetricSources<'_>,
        out: &mut Exposition,
    ) {
        let (samples, frequency_hz) = sources.sampler.oncpu_samples_by_process(sources.loader);
        let sampled: BTreeSet<u32> = samples.keys().copied().collect();
        self.learn_programs(sources.loader, sources.processes, &sampled);
        let mut oncpu: BTreeMap<SeriesKey, u64> = BTreeMap::new();
        for (tgid, count) in samples {
            *oncpu
                .entry(self.series(sources.processes, tgid))
                .or_default() += count;
        }
        // Without a `pid` label a process's series is its program's: what the processes
        // let go had stays in it.
        if !self.labels.pid {
            for (program, count) in sources.retired_oncpu.into_iter().flatten() {
                let key = SeriesKey {
                    extra: None,
                    process: program.clone(),
                    pid: None,
                };
                *oncpu.entry(key).or_default() += count;
            }
        }
        let empty = BTreeMap::new();
        let state = |state: u32| figures.offcpu.get(&state).unwrap_or(&empty);
        let families = [
            (
                "tracer_offcpu_seconds_total",
                "Time the threads of each process spent blocked (off CPU, not runnable).",
                state(offcpu_state::BLOCKED),
                1e-9,
            ),
            (
                "tracer_runnable_seconds_total",
                "Time the threads of each process spent runnable, waiting for a CPU.",
                state(offcpu_state::RUNNABLE),
                1e-9,
            ),
            (
                "tracer_oncpu_seconds_total",
                "Time the threads of each process spent on CPU, from samples.",
                &oncpu,
                1.0 / frequency_hz.max(1) as f64,
            ),
        ];
        for (name, help, totals, unit) in families {
            out.family(name, Kind::Counter, help);
            for (key, total) in totals {
                out.sample(name, &borrowed(&key.labels()), *total as f64 * unit);
            }
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
