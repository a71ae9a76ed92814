//! Figure 6: peak RSS (wait4's ru_maxrss) of every tracer run of figures 2-4, against
//! bpftrace's.

use super::{Row, yes_no};

/// Peak RSS of the tools' runs, for figure 6.
#[derive(Default)]
pub(super) struct PeakMemory {
    /// (what ran, peak RSS in KiB)
    tracer: Vec<(String, u64)>,
    bpftrace: Vec<(String, u64)>,
}

impl PeakMemory {
    pub(super) fn note(&mut self, tool: &str, what: &str, rss_kib: u64) {
        let list = if tool == "tracer" {
            &mut self.tracer
        } else if tool == "bpftrace" {
            &mut self.bpftrace
        } else {
            return;
        };
        match list.iter_mut().find(|(w, _)| w == what) {
            Some((_, peak)) => *peak = (*peak).max(rss_kib),
            None => list.push((what.to_string(), rss_kib)),
        }
    }
}

pub(super) fn measure(memory: &PeakMemory) -> Row {
    let mb = |kib: u64| kib as f64 / 1024.0;
    if memory.tracer.is_empty() {
        println!("no tracer run to measure: run figures 2, 3 or 4 with it");
        return Row {
            figure: "6. tracer peak RSS".into(),
            tracer: "not measured".into(),
            baselines: "-".into(),
            ratio: "-".into(),
            goal: "<= 64 MB".into(),
            met: "?".into(),
        };
    }
    println!("peak RSS (wait4 ru_maxrss), highest over the runs of each kind:");
    for (what, kib) in &memory.tracer {
        println!("  tracer   {what:<26} {:>7.1} MB", mb(*kib));
    }
    for (what, kib) in &memory.bpftrace {
        println!("  bpftrace {what:<26} {:>7.1} MB", mb(*kib));
    }
    let tracer = memory.tracer.iter().map(|(_, k)| *k).max().unwrap_or(0);
    let bpftrace = memory.bpftrace.iter().map(|(_, k)| *k).max();
    Row {
        figure: "6. tracer peak RSS".into(),
        tracer: format!("{:.1} MB", mb(tracer)),
        baselines: bpftrace.map_or_else(|| "-".into(), |b| format!("bpftrace {:.1} MB", mb(b))),
        ratio: bpftrace.map_or_else(
            || "-".into(),
            |b| format!("{:.2}x", tracer as f64 / b as f64),
        ),
        goal: "<= 64 MB".into(),
        met: yes_no(mb(tracer) <= 64.0),
    }
}
