//! `tracer attach` against the demo runtime, whose GCs and blocking are known exactly.

use crate::common::*;

/// Attaches to a gc-demo run and returns (tracer's JSON report, target's truth, folded).
fn trace_gc_demo(
    name: &str,
    target_args: &[&str],
) -> (serde_json::Value, serde_json::Value, String) {
    let run = attach_json(GC_DEMO, target_args, name, &[]);
    assert!(run.stderr.contains("target exited"), "{}", run.stderr);
    let folded = std::fs::read_to_string(run.dir.join("offcpu.folded")).unwrap();
    assert!(
        std::fs::read_to_string(run.dir.join("offcpu.svg"))
            .unwrap()
            .contains("<svg")
    );
    (run.report, run.truth, folded)
}

#[privileged_test]
fn counts_every_gc_and_buckets_the_known_pause() {
    require_privileged();
    let (report, truth, _) = trace_gc_demo(
        "gc",
        &["--gcs", "12", "--pause-ms", "20", "--interval-ms", "20"],
    );
    assert_eq!(report["gc"]["count"], 12, "{report:#}");
    let pause = &report["latencies"]["gc_pause"];
    assert_eq!(pause["count"], 12);
    assert_eq!(report["latencies"]["gc_stop_the_world"]["count"], 12);
    assert_eq!(report["latencies"]["gc_mark"]["count"], 12);
    assert_eq!(report["latencies"]["gc_sweep"]["count"], 12);

    // Each probe-to-probe interval lies inside the target's own timestamps around it, and
    // outside those just inside the probes; so do the shortest and the longest.
    let list = |key: &str| -> Vec<u64> {
        truth[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    };
    let (outer, inner) = (list("pause_ns"), list("pause_inner_ns"));
    let (min, max) = (
        pause["min_ns"].as_u64().unwrap(),
        pause["max_ns"].as_u64().unwrap(),
    );
    let (outer_min, inner_min) = (*outer.iter().min().unwrap(), *inner.iter().min().unwrap());
    let (outer_max, inner_max) = (*outer.iter().max().unwrap(), *inner.iter().max().unwrap());
    assert!(
        inside_target_span(min, outer_min, inner_min, 0),
        "min {min} vs {inner_min} to {outer_min}: {pause:#}"
    );
    assert!(
        inside_target_span(max, outer_max, inner_max, 0),
        "max {max} vs {inner_max} to {outer_max}: {pause:#}"
    );

    // Every pause counted in the bucket that holds its true length.
    for bucket in pause["buckets"].as_array().unwrap() {
        let (lo, hi, n) = (
            bucket["min_ns"].as_u64().unwrap(),
            bucket["max_ns"].as_u64().unwrap(),
            bucket["count"].as_u64().unwrap(),
        );
        let truly_inside = outer.iter().filter(|&&p| p >= lo && p <= hi).count() as u64;
        assert!(
            n.abs_diff(truly_inside) <= 1,
            "bucket [{lo}, {hi}] has {n}, truth {truly_inside}: {outer:?}"
        );
    }
    // The median within one log-linear bucket (12.5%) of the target's own median.
    let mut sorted = outer.clone();
    sorted.sort_unstable();
    let true_median = sorted[sorted.len() / 2] as f64;
    let p50 = pause["p50_ns"].as_u64().unwrap() as f64;
    assert!(
        (p50 - true_median).abs() <= 0.125 * true_median,
        "p50 {p50} vs median {true_median}"
    );
    let hits = report["probes"].as_array().unwrap();
    let begin = hits
        .iter()
        .find(|p| p["probe"].as_str().unwrap().ends_with(":tracer:gc__begin"))
        .unwrap();
    assert_eq!(begin["hits"], 12);
    // The first hit is the first collection's: the kernel's clock reads just after the
    // target's own, before the target does anything else.
    let first_hit = begin["first_hit_monotonic_ns"].as_u64().unwrap();
    let first_gc = truth["first_gc_begin_monotonic_ns"].as_u64().unwrap();
    assert!(
        first_hit >= first_gc && first_hit - first_gc < 5_000_000,
        "first gc__begin hit at {first_hit} ns, the target fired it at {first_gc} ns"
    );
    for probe in hits {
        assert_eq!(
            probe["hits"] == 0,
            probe["first_hit_monotonic_ns"].is_null(),
            "{probe}"
        );
    }
}

#[privileged_test]
fn off_cpu_time_lands_under_the_blocking_functions() {
    require_privileged();
    let (report, truth, folded) = trace_gc_demo(
        "offcpu",
        &["--gcs", "10", "--pause-ms", "10", "--interval-ms", "40"],
    );
    for (frame, field) in [
        ("gc_demo::sleep_in_demo_io", "sleep_in_demo_io_ns"),
        ("gc_demo::wait_for_demo_lock", "wait_for_demo_lock_ns"),
    ] {
        let measured_us = folded_weight(&folded, frame);
        let true_us = truth[field].as_u64().unwrap() / 1000;
        let error = (measured_us as f64 - true_us as f64).abs() / true_us as f64;
        assert!(
            error <= 0.2,
            "{frame}: tracer {measured_us} us, target {true_us} us\n{folded}"
        );
    }
    // Blocked stacks go down into the kernel, to where it put the thread to sleep.
    assert!(
        folded
            .lines()
            .any(|l| l.contains("gc_demo::sleep_in_demo_io")
                && l.contains("do_syscall_64_[k]")
                && l.contains("nanosleep_[k]")),
        "{folded}"
    );
    assert!(report["offcpu"]["total_ns"].as_u64().unwrap() > 0);
}

#[privileged_test]
fn no_such_process_is_a_clear_error() {
    require_privileged();
    let out = run_tracer(&["attach", "--pid", "4194304"]);
    assert!(!out.status.success());
    let err = out.stderr.as_str();
    assert!(err.contains("no such process: 4194304"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn without_privileges_it_names_what_is_missing() {
    // Run as an unprivileged user: as root, drop to nobody; otherwise we already are one.
    let tracer = tracer_bin();
    // SAFETY: geteuid has no preconditions.
    let out = if unsafe { libc::geteuid() } == 0 {
        std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
            ])
            .arg(&tracer)
            .args(["attach", "--pid", "1"])
            .output()
            .expect("setpriv (util-linux) is needed to drop privileges")
    } else {
        std::process::Command::new(&tracer)
            .args(["attach", "--pid", "1"])
            .output()
            .expect("cannot run tracer")
    };
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CAP_BPF") && err.contains("CAP_PERFMON") && err.contains("root"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[privileged_test]
fn tasks_running_and_parked_time_match_the_targets_own_accounting() {
    require_privileged();
    let (report, truth, _) = trace_gc_demo(
        "tasks",
        &["--gcs", "10", "--pause-ms", "10", "--interval-ms", "40"],
    );
    let tasks = report["tasks"]["list"]
        .as_array()
        .unwrap_or_else(|| panic!("{report:#}"));
    let task = |id: u64| {
        tasks
            .iter()
            .find(|t| t["task"] == id)
            .unwrap_or_else(|| panic!("task {id} missing: {tasks:?}"))
    };
    for worker in truth["tasks"].as_array().unwrap() {
        let id = worker["id"].as_u64().unwrap();
        assert_eq!(
            task(id)["runs"],
            worker["runs"],
            "task {id}: rt__run__task count"
        );
        assert_eq!(
            task(id)["parks"],
            worker["runs"],
            "task {id}: one park per run"
        );
    }
    // The sleeper parks once per iteration, right before sleeping.
    let slept = truth["sleep_in_demo_io_ns"].as_u64().unwrap() as f64;
    let parked = task(2)["parked_ns"].as_u64().unwrap() as f64;
    assert!(
        (parked - slept).abs() <= 0.2 * slept,
        "sleeper parked {parked} ns, slept {slept} ns"
    );
    let waited = truth["wait_for_demo_lock_ns"].as_u64().unwrap() as f64;
    assert!(
        task(4)["parked_ns"].as_u64().unwrap() as f64 >= 0.8 * waited,
        "the lock waiter parks at least while it waits"
    );
    let folded = std::fs::read_to_string(report["tasks"]["folded"].as_str().unwrap()).unwrap();
    assert!(
        folded
            .lines()
            .any(|l| l.contains(";task #2 on ") && l.contains("gc_demo::sleeper_thread")),
        "{folded}"
    );
    assert!(
        folded
            .lines()
            .any(|l| l.contains(";task #4 on ") && l.contains("gc_demo::lock_waiter_thread")),
        "{folded}"
    );
}

#[privileged_test]
fn a_tracer_in_its_own_pid_namespace_works_with_the_namespaces_pids() {
    require_privileged();
    // Inside the new namespace the tracer is PID 1, and traces itself: its kernel side
    // must follow it by that number (not the host's), and every output print it.
    let out = std::process::Command::new("unshare")
        .args(["-p", "-f", "--mount-proc"])
        .arg(tracer_bin())
        .args([
            "attach",
            "--pid",
            "1",
            "--duration",
            "1s",
            "--format",
            "json",
            "-o",
        ])
        .arg(out_dir("pidns"))
        .output()
        .expect("unshare (util-linux)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{err}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(report["pid"], 1, "{report:#}");
    let threads = report["threads"].as_array().expect("threads[]");
    assert!(!threads.is_empty(), "{report:#}");
    assert!(threads.iter().all(|t| t["pid"] == 1), "{report:#}");
    // Its main thread waits in the run loop most of the second: blocked time is seen.
    let blocked = report["offcpu"]["total_ns"].as_u64().unwrap_or(0);
    assert!(blocked > 500_000_000, "{blocked} ns blocked\n{report:#}");
}

/// A `--latency` pair whose probes no target has is reported, with 0 and why, not left
/// out.
#[privileged_test]
fn a_latency_whose_probes_never_appeared_is_listed_with_zero_and_why() {
    require_privileged();
    let run = attach_json(
        GC_DEMO,
        &["--gcs", "2", "--pause-ms", "5", "--interval-ms", "5"],
        "latency-never-found",
        &["--latency", "nosuch:start,tracer:gc__end"],
    );
    let latency = &run.report["latencies"]["start_to_gc__end"];
    assert_eq!(latency["count"], 0, "{:#}", run.report["latencies"]);
    assert_eq!(latency["never_found"], serde_json::json!(["nosuch:start"]));
    // The runtime's own latencies are there as ever.
    assert_eq!(run.report["latencies"]["gc_pause"]["count"], 2);
    assert!(
        run.stderr.contains("No probe nosuch:start in"),
        "the attach says it looks for it: {}",
        run.stderr
    );
}
