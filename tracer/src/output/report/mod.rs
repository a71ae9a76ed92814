//! What `tracer attach` found, printed as text (bpftrace-style histograms) or as one JSON
//! document with every figure.
//!
//! The report's types are in `types`. The text is printed in `text`, the JSON in `json`.
//! The summary `tracer profile` prints is in `summary`. The lines and limits both text
//! reports share are in `lines`.

mod json;
mod lines;
mod summary;
mod text;
mod types;

pub(crate) use lines::program_misses_line;
pub(crate) use summary::profile_summary;
pub(crate) use types::{
    AttachReport, LatencyReport, Losses, OffCpuProfile, ProbeHits, ProbeReport, ProcessLatency,
    StackLosses, TaskReport, TimelineReport, TracedProcess,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        output::render::views::ProfileFiles, profile::wallclock::WallClockProfile,
        system::stop::StopReason,
    };

    /// A report of process 42 traced for 1 s, with nothing but `wall` and `tasks`.
    pub(super) fn report_of(
        name: &str,
        wall: WallClockProfile,
        tasks: Option<TaskReport>,
    ) -> AttachReport {
        AttachReport {
            pid: 42,
            process_name: name.into(),
            processes: vec![TracedProcess {
                pid: 42,
                name: name.into(),
                namespace_pid: None,
            }],
            processes_folded: Default::default(),
            stopped_by: StopReason::DurationElapsed,
            elapsed_ns: 1_000_000_000,
            probes: Vec::new(),
            latencies: Vec::new(),
            offcpu: OffCpuProfile::default(),
            offcpu_files: None,
            wall,
            files: ProfileFiles::default(),
            unwind_stats: None,
            unnamed: None,
            tasks,
            timeline: None,
            losses: Losses::default(),
        }
    }

    /// Tasks of one task, 7, of process 42, with no time.
    pub(super) fn one_task() -> TaskReport {
        TaskReport {
            profile: crate::profile::tasks::TaskProfile {
                tasks: vec![crate::profile::tasks::TaskSummary {
                    task: 7,
                    tgid: 42,
                    name: "task #7 on worker [43]".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            files: None,
        }
    }

    /// A process name is the target's to choose: control characters in it reach the
    /// terminal escaped in the text report, and as JSON escapes them in the JSON one.
    #[test]
    fn names_from_the_target_are_escaped_in_text() {
        let report = report_of(
            "evil\x1b[2J\nGC: 0 collections",
            WallClockProfile::default(),
            None,
        );
        let text = report.to_text();
        assert!(
            text.starts_with(
                "Traced process 42 (evil\\x1b[2J\\x0aGC: 0 collections) for 1.00 s; \
                 stopped: duration elapsed.\n"
            ),
            "{text}"
        );
        assert!(!text.contains('\x1b'), "{text}");
        let json = serde_json::to_string(&report.to_json()).unwrap();
        assert!(
            json.contains(r#""process":"evil\u001b[2J\nGC: 0 collections""#),
            "{json}"
        );
    }

    /// Tasks carry their names, every id is decimal, and the tasks that blocked their
    /// threads are named with where they blocked, innermost first.
    #[test]
    fn tasks_carry_their_names_and_where_they_blocked() {
        use crate::{
            profile::tasks::{TaskProfile, TaskSummary},
            profile::wallclock::TaskWallTime,
        };
        let task = |task, name: &str, blocked_ns| TaskSummary {
            task,
            tgid: 42,
            name: name.into(),
            running_ns: 5_000_000,
            wall: TaskWallTime {
                blocked_ns,
                blocked_intervals: 2,
                longest_block: Some((
                    vec![
                        "main".into(),
                        "app::handler".into(),
                        "std::thread::sleep".into(),
                        "do_syscall_64_[k]".into(),
                        "hrtimer_nanosleep_[k]".into(),
                    ],
                    blocked_ns,
                )),
                ..TaskWallTime::default()
            },
            ..Default::default()
        };
        let tasks = TaskReport {
            profile: TaskProfile {
                tasks: vec![
                    task(4711, "thread parker-0 [4711]", 0),
                    task(0x7f00_1234, "task src/api.rs:41:5 (#2130710068)", 3_000_000),
                ],
                ..Default::default()
            },
            files: None,
        };
        let report = report_of("java", WallClockProfile::default(), Some(tasks));
        let text = report.to_text();
        assert!(
            text.contains("                4711 thread parker-0 [4711] "),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "{:>20} src/api.rs:41:5 (#2130710068) ",
                0x7f00_1234u64
            )),
            "{text}"
        );
        assert!(!text.contains("0x7f"), "{text}");
        assert!(
            text.contains(
                "  task src/api.rs:41:5 (#2130710068) blocked its thread 3.00ms in 2 intervals, \
                 3.00ms of it in hrtimer_nanosleep_[k] <- std::thread::sleep <- app::handler\n"
            ),
            "{text}"
        );
        let json = report.to_json();
        assert_eq!(json["tasks"]["list"][0]["name"], "thread parker-0 [4711]");
        assert_eq!(json["tasks"]["list"][1]["blocked_ns"], 3_000_000);
        assert_eq!(json["tasks"]["list"][1]["oncpu_ns"], 2_000_000);
        assert_eq!(
            json["tasks"]["list"][1]["longest_block"]["stack"][4],
            "hrtimer_nanosleep_[k]"
        );
    }

    /// Three CPython collections of process 42, by generation.
    fn classified_gc_pauses() -> LatencyReport {
        use crate::probe::runtimes::{LatencyClass, LatencyDef, Mechanism, ProbeRef};
        use crate::profile::histogram::LatencyHistogram;
        use tracer_common::LatencyStats;
        let mut hist = LatencyHistogram::new();
        for ns in [120_000, 450_000, 2_000_000] {
            hist.record(ns);
        }
        let stats = |count, total_ns, min_ns, max_ns| LatencyStats {
            count,
            total_ns,
            min_ns,
            max_ns,
        };
        LatencyReport {
            def: LatencyDef {
                name: "gc_pause".into(),
                begin: ProbeRef::usdt("python", "gc__start"),
                end: ProbeRef::usdt("python", "gc__done"),
                frame_keyed: false,
                class: Some(LatencyClass {
                    begin_arg: Some(0),
                    probes: Vec::new(),
                    unclassified: "unknown",
                    what: "generation",
                    labels: &[],
                }),
                runtime: Some("CPython"),
                mechanism: Mechanism::Usdt,
            },
            hist,
            per_process: vec![ProcessLatency {
                pid: 42,
                name: "gc-demo".into(),
                stats: stats(3, 2_570_000, 120_000, 2_000_000),
            }],
            by_class: vec![
                ("0".into(), stats(2, 570_000, 120_000, 450_000)),
                ("2".into(), stats(1, 2_000_000, 2_000_000, 2_000_000)),
            ],
            never_found: Vec::new(),
        }
    }

    /// The text and JSON of a fixed report, byte for byte (tracer/tests/data; regenerate
    /// with TRACER_BLESS=1).
    #[test]
    fn report_text_and_json_match_the_golden_files() {
        let mut wall = WallClockProfile {
            oncpu_samples: 19,
            oncpu_ns: 192_000_000,
            offcpu_intervals: 119,
            offcpu_ns: 3_100_000_000,
            runnable_intervals: 58,
            runnable_ns: 168_000_000,
            threads: 2,
            processes: 1,
            ..Default::default()
        };
        for (tid, name, oncpu_ms, blocked_ms) in
            [(42, "gc-demo", 150, 2_900), (43, "worker", 42, 200)]
        {
            wall.per_thread.push(crate::profile::wallclock::ThreadTime {
                tgid: 42,
                tid,
                name: Some(name.into()),
                oncpu_ns: oncpu_ms * 1_000_000,
                blocked_ns: blocked_ms * 1_000_000,
                ..Default::default()
            });
        }
        let tasks = one_task();
        let mut report = report_of("gc-demo", wall, Some(tasks));
        report.latencies.push(classified_gc_pauses());
        report.losses.program_misses = vec![("sched_switch", 3)];
        report.timeline = Some(TimelineReport {
            path: "/tmp/timeline.json".into(),
            intervals: 5,
            lost: 0,
        });
        crate::output::golden::assert_golden("attach-report.txt", &report.to_text());
        let json = serde_json::to_string_pretty(&report.to_json()).unwrap() + "\n";
        crate::output::golden::assert_golden("attach-report.json", &json);
    }
}
