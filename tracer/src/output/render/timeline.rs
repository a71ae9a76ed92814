//! `attach --timeline FILE`: the intervals the programs saw end, as a Chrome trace-event
//! JSON file (the format Perfetto, speedscope and chrome://tracing open).
//!
//! Each process is a `pid`; each of its threads a track (`tid`) holding its latencies
//! (GC pauses and their phases: `gc_pause`, `gc_stop_the_world`, ...), the runs of the
//! runtime tasks it ran (`task NAME`) and its off-CPU intervals of at least the threshold
//! (`blocked`, `runnable`); each runtime task a track of its own (`task NAME`, `running`
//! and `parked`). Every interval is a complete event (`"ph":"X"`) with its start and
//! length in microseconds, the format's unit, from the start of tracing, to the
//! nanosecond (three decimals). Intervals still open when tracing stopped are not in it.

use std::{
    collections::{BTreeSet, HashMap},
    io::{self, Write},
};

use tracer_common::{TimelineEvent, offcpu_state, timeline_kind};

/// Track ids of task tracks start here, above any thread id (at most 2^22).
const FIRST_TASK_TRACK: u64 = 1 << 30;

/// The intervals read from the timeline's ring buffer.
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    pub events: Vec<TimelineEvent>,
    /// When tracing started (CLOCK_MONOTONIC ns): time 0 in the file.
    pub origin_ns: u64,
}

impl Timeline {
    /// Adds one ring buffer record; a record of another size is ignored.
    pub(crate) fn add_record(&mut self, record: &[u8]) {
        if record.len() < std::mem::size_of::<TimelineEvent>() {
            return;
        }
        // SAFETY: the record holds a whole TimelineEvent, plain old data written by the
        // eBPF side; read unaligned, as ring buffer records are 8-byte aligned only.
        let event = unsafe { std::ptr::read_unaligned(record.as_ptr().cast::<TimelineEvent>()) };
        self.events.push(event);
    }
}

/// What the events' ids are called.
pub(crate) struct TimelineNames<'a> {
    /// Latencies by id.
    pub latencies: &'a [String],
    pub process: &'a dyn Fn(u32) -> String,
    pub thread: &'a dyn Fn(u32) -> Option<String>,
    /// A task's frame name, by (tgid, task).
    pub task: &'a dyn Fn(u32, u64) -> String,
}

/// Writes `timeline` as Chrome trace-event JSON.
pub(crate) fn write_chrome_trace(
    timeline: &Timeline,
    names: &TimelineNames<'_>,
    out: &mut dyn Write,
) -> io::Result<()> {
    let origin_ns = timeline.origin_ns;
    // Whole nanoseconds as microseconds: three decimals. An interval that began before
    // tracing did (a latency whose begin probe was attached first) starts at 0.
    let start = |e: &TimelineEvent| e.start_ns.max(origin_ns);
    let us = |ns: u64| ns.saturating_sub(origin_ns) as f64 / 1e3;
    let dur = |e: &TimelineEvent| e.end_ns.saturating_sub(start(e)) as f64 / 1e3;
    // Written as it goes, one event at a time: a busy runtime's timeline has millions.
    out.write_all(br#"{"displayTimeUnit":"ms","traceEvents":["#)?;
    let mut first = true;
    let mut emit = |out: &mut dyn Write, event: &dyn erased::Event| -> io::Result<()> {
        if !std::mem::take(&mut first) {
            out.write_all(b",")?;
        }
        event.write(out)
    };
    let mut threads: BTreeSet<(u32, u32)> = BTreeSet::new();
    let mut task_tracks: HashMap<(u32, u64), u64> = HashMap::new();
    let mut tracks: Vec<(u32, u64, String)> = Vec::new();
    let mut sorted: Vec<&TimelineEvent> = timeline.events.iter().collect();
    // Outer intervals before the ones they hold, as viewers want them.
    sorted.sort_by_key(|e| (start(e), std::cmp::Reverse(e.end_ns)));
    let mut task_track = |tgid: u32, task: u64, tracks: &mut Vec<(u32, u64, String)>| {
        let next = FIRST_TASK_TRACK + task_tracks.len() as u64;
        *task_tracks.entry((tgid, task)).or_insert_with(|| {
            tracks.push((tgid, next, (names.task)(tgid, task)));
            next
        })
    };
    for e in sorted {
        let (pid, tid) = (e.tgid, e.tid);
        let (ts, dur) = (us(start(e)), dur(e));
        match e.kind {
            timeline_kind::LATENCY => {
                threads.insert((pid, tid));
                let name = names
                    .latencies
                    .get(e.detail as usize)
                    .map_or("latency", String::as_str);
                emit(out, &span(name, "latency", pid, u64::from(tid), ts, dur))?;
            }
            timeline_kind::TASK_RUN => {
                threads.insert((pid, tid));
                let track = task_track(pid, e.task, &mut tracks);
                emit(
                    out,
                    &span(
                        &(names.task)(pid, e.task),
                        "task",
                        pid,
                        u64::from(tid),
                        ts,
                        dur,
                    ),
                )?;
                emit(out, &span("running", "task", pid, track, ts, dur))?;
            }
            timeline_kind::TASK_PARKED => {
                let track = task_track(pid, e.task, &mut tracks);
                emit(out, &span("parked", "task", pid, track, ts, dur))?;
            }
            timeline_kind::OFF_CPU => {
                threads.insert((pid, tid));
                let name = match e.detail & !offcpu_state::SAMPLED {
                    offcpu_state::RUNNABLE => "runnable",
                    _ => "blocked",
                };
                emit(out, &span(name, "off-cpu", pid, u64::from(tid), ts, dur))?;
            }
            _ => {}
        }
    }
    let mut processes: Vec<u32> = threads.iter().map(|&(pid, _)| pid).collect();
    processes.extend(tracks.iter().map(|&(pid, _, _)| pid));
    processes.sort_unstable();
    processes.dedup();
    for &pid in &processes {
        emit(
            out,
            &Metadata {
                args: NameArgs {
                    name: format!("{} [{pid}]", (names.process)(pid)),
                },
                name: "process_name",
                ph: "M",
                pid,
                tid: None,
            },
        )?;
    }
    // Each track's name, and its place: threads by id, then tasks as first seen.
    let thread_tracks = threads.iter().map(|&(pid, tid)| {
        let name = (names.thread)(tid).unwrap_or_else(|| "?".into());
        (pid, u64::from(tid), format!("{name} [{tid}]"))
    });
    for (pid, track, name) in thread_tracks.chain(tracks) {
        emit(
            out,
            &Metadata {
                args: NameArgs { name },
                name: "thread_name",
                ph: "M",
                pid,
                tid: Some(track),
            },
        )?;
        emit(
            out,
            &Metadata {
                args: SortIndexArgs { sort_index: track },
                name: "thread_sort_index",
                ph: "M",
                pid,
                tid: Some(track),
            },
        )?;
    }
    out.write_all(b"]}\n")
}

/// A Chrome trace event of a span (`ph` `X`): times in microseconds. Fields of every
/// event in name order, as they were first written (serde_json's maps sort their keys).
#[derive(serde::Serialize)]
struct Complete<'a> {
    cat: &'a str,
    dur: f64,
    name: &'a str,
    ph: &'static str,
    pid: u32,
    tid: u64,
    ts: f64,
}

/// A span of thread or task track `track` of process `pid`.
fn span<'a>(name: &'a str, cat: &'a str, pid: u32, track: u64, ts: f64, dur: f64) -> Complete<'a> {
    Complete {
        cat,
        dur,
        name,
        ph: "X",
        pid,
        tid: track,
        ts,
    }
}

/// A Chrome trace metadata event (`ph` `M`): a process's or track's name or place.
#[derive(serde::Serialize)]
struct Metadata<A> {
    args: A,
    name: &'static str,
    ph: &'static str,
    pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    tid: Option<u64>,
}

#[derive(serde::Serialize)]
struct NameArgs {
    name: String,
}

#[derive(serde::Serialize)]
struct SortIndexArgs {
    sort_index: u64,
}

/// Events of different types written by one function.
mod erased {
    use std::io::{self, Write};

    pub(super) trait Event {
        fn write(&self, out: &mut dyn Write) -> io::Result<()>;
    }

    impl<T: serde::Serialize> Event for T {
        fn write(&self, out: &mut dyn Write) -> io::Result<()> {
            serde_json::to_writer(out, self).map_err(io::Error::from)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: u32, tid: u32, start_ns: u64, end_ns: u64, detail: u32) -> TimelineEvent {
        TimelineEvent {
            start_ns,
            end_ns,
            task: 7,
            tgid: 42,
            tid,
            kind,
            detail,
        }
    }

    /// Microseconds, as the format wants (not nanoseconds), from the origin, to the
    /// nanosecond; one track per thread and per task, named; latencies named by id.
    #[test]
    fn writes_complete_events_in_microseconds_on_named_tracks() {
        let timeline = Timeline {
            events: vec![
                event(timeline_kind::LATENCY, 43, 1_000_000, 21_000_500, 1),
                event(timeline_kind::LATENCY, 43, 500_000, 21_500_000, 0),
                event(timeline_kind::TASK_RUN, 44, 2_000_000, 3_000_000, 0),
                event(timeline_kind::TASK_PARKED, 44, 3_000_000, 9_000_000, 0),
                event(
                    timeline_kind::OFF_CPU,
                    44,
                    2_100_000,
                    2_900_000,
                    offcpu_state::BLOCKED,
                ),
            ],
            origin_ns: 500_000,
        };
        let latencies = ["gc_pause".to_string(), "gc_mark".to_string()];
        let names = TimelineNames {
            latencies: &latencies,
            process: &|_| "demo".into(),
            thread: &|tid| (tid == 43).then(|| "collector".into()),
            task: &|_, task| format!("task worker (#{task})"),
        };
        let mut out = Vec::new();
        write_chrome_trace(&timeline, &names, &mut out).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let events = json["traceEvents"].as_array().unwrap();
        let find = |name: &str| {
            events
                .iter()
                .find(|e| e["name"] == name && e["ph"] == "X")
                .unwrap_or_else(|| panic!("no {name}: {json:#}"))
        };
        let pause = find("gc_pause");
        assert_eq!(
            (pause["ts"].as_f64(), pause["dur"].as_f64()),
            (Some(0.0), Some(21_000.0))
        );
        assert_eq!(pause["tid"], 43);
        let mark = find("gc_mark");
        assert_eq!(
            (mark["ts"].as_f64(), mark["dur"].as_f64()),
            (Some(500.0), Some(20_000.5))
        );
        // The pause comes before the mark it holds.
        let at = |name: &str| events.iter().position(|e| e["name"] == name).unwrap();
        assert!(at("gc_pause") < at("gc_mark"));
        // The task's run on its thread, and on its own track with its park.
        let run = find("task worker (#7)");
        assert_eq!(run["tid"], 44);
        let (running, parked) = (find("running"), find("parked"));
        assert_eq!(running["tid"], FIRST_TASK_TRACK);
        assert_eq!(parked["tid"], FIRST_TASK_TRACK);
        assert_eq!(parked["dur"].as_f64(), Some(6_000.0));
        assert_eq!(find("blocked")["tid"], 44);
        let track_name = |tid: u64| {
            events
                .iter()
                .find(|e| e["name"] == "thread_name" && e["tid"] == tid)
                .map(|e| e["args"]["name"].as_str().unwrap().to_string())
        };
        assert_eq!(track_name(43).as_deref(), Some("collector [43]"));
        assert_eq!(track_name(44).as_deref(), Some("? [44]"));
        assert_eq!(
            track_name(FIRST_TASK_TRACK).as_deref(),
            Some("task worker (#7)")
        );
        assert!(
            events
                .iter()
                .any(|e| e["name"] == "process_name" && e["args"]["name"] == "demo [42]")
        );
    }

    #[test]
    fn a_record_is_read_whole_or_not_at_all() {
        let mut timeline = Timeline::default();
        let event = event(timeline_kind::LATENCY, 1, 2, 3, 4);
        // SAFETY: a plain old data struct viewed as its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&raw const event).cast::<u8>(),
                std::mem::size_of::<TimelineEvent>(),
            )
        };
        timeline.add_record(&bytes[..10]);
        timeline.add_record(bytes);
        assert_eq!(timeline.events, [event]);
    }
}
