//! `tracer attach` on a program carrying Julia's probes (provider `julia`, tasks by
//! `jl_task_t *` address), as a Julia process would: its GCs, each task's wall time split
//! and by stack, and the timeline. Julia itself is not installable here.

use crate::common::*;

#[privileged_test]
fn julia_tasks_and_gcs_are_split_named_and_on_the_timeline() {
    require_privileged();
    let bin = compile_target(
        "gcc",
        "src/julia/julia-probes.c",
        "julia-probes",
        // No tail calls, so each function stays on the stack; frame pointers, as park
        // stacks are taken by frame pointers (README).
        &[
            "-pthread",
            "-fno-optimize-sibling-calls",
            "-fno-omit-frame-pointer",
        ],
    );
    let timeline = out_dir("julia-timeline").with_extension("json");
    let run = attach_json(
        bin.to_str().unwrap(),
        &["10", "10", "40"],
        "julia",
        &["--timeline", timeline.to_str().unwrap()],
    );
    assert!(run.stderr.contains("of Julia"), "{}", run.stderr);
    let report = &run.report;
    assert_eq!(report["gc"]["count"], 10, "{report:#}");
    for phase in ["gc_stop_the_world", "gc_mark", "gc_sweep"] {
        assert_eq!(report["latencies"][phase]["count"], 10, "{phase}");
    }
    let folded = std::fs::read_to_string(report["tasks"]["folded"].as_str().unwrap()).unwrap();
    for truth in run.truth["tasks"].as_array().unwrap() {
        let id = truth["id"].as_u64().unwrap();
        let name = truth["name"].as_str().unwrap();
        let task = report_task(report, id);
        // An address, so named after its thread too.
        let thread = if name == "waiter" {
            "worker-b"
        } else {
            "worker-a"
        };
        assert!(
            task["name"]
                .as_str()
                .unwrap()
                .starts_with(&format!("task #{id} on {thread} [")),
            "{task}"
        );
        assert_eq!(task["runs"], truth["runs"], "{name}");
        for (seen, truth_key) in [
            ("running_ns", "running_ns"),
            ("blocked_ns", "blocked_ns"),
            ("parked_ns", "parked_ns"),
        ] {
            let (s, t) = (
                task[seen].as_u64().unwrap(),
                truth[truth_key].as_u64().unwrap(),
            );
            assert!(
                // Within 10%, or 1 ms (scheduling around the probes).
                near(s, t, 0.1, 1_000_000),
                "task {name}: {seen} {s} ns, its own clock {t} ns"
            );
        }
        eprintln!(
            "Julia task {name}: running {} ns (truth {}), blocked {} (truth {}), parked {} (truth {})",
            task["running_ns"],
            truth["running_ns"],
            task["blocked_ns"],
            truth["blocked_ns"],
            task["parked_ns"],
            truth["parked_ns"]
        );
        let frame = task["name"].as_str().unwrap();
        let (leaf, function) = match name {
            "compute" => ("[running]", "compute_kernel"),
            "io" => ("[blocked while running]", "blocking_read"),
            _ => ("[parked]", "wait_for_channel"),
        };
        assert!(
            folded.lines().any(|l| l.contains(&format!(";{frame};"))
                && l.contains(function)
                && l.contains(&format!(";{leaf} "))),
            "{name}: no {leaf} under {function}:\n{folded}"
        );
    }
    let io = report_task(report, run.truth["tasks"][1]["id"].as_u64().unwrap());
    let place = io["longest_block"]["stack"].to_string();
    assert!(
        place.contains("blocking_read") && place.contains("nanosleep"),
        "{place}"
    );

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&timeline).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let count = |name: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["name"] == name)
            .count()
    };
    for phase in ["gc_pause", "gc_stop_the_world", "gc_mark", "gc_sweep"] {
        assert_eq!(count(phase), 10, "{phase} on the timeline");
    }
    let _ = std::fs::remove_file(timeline);
    let _ = std::fs::remove_dir_all(&run.dir);
}
