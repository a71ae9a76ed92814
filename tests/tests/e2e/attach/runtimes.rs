//! The bpftrace scripts of `probes/scripts/` and `tracer attach` side by side on the same
//! process, and `tracer attach` on real runtimes.
//!
//! - gc-demo, whose GCs and task runs are known exactly: each script, run unchanged with
//!   `bpftrace -p PID script.bt`, counts what `tracer attach` counts and what gc-demo says
//!   it did, and times it alike.
//! - A real JVM (HotSpot, `System.gc()` N times): N collections, checked against the JVM's
//!   own GC log, `tracer trace --count` and bpftrace (which also shows the thread firing
//!   `hotspot:gc__begin` and `hotspot:gc__end`: both on the "VM Thread").
//! - CPython 3.11 (`gc.collect()` N times): N GC pauses.
//! - A `--latency` pair measures exactly what the built-in pair with the same probes does.
//! - A tokio program instrumented with `probes::tokio` (built on the fly with
//!   `--cfg tokio_unstable`): every task's spawn, polls and end, by `tracer trace` and by
//!   `task_run_park.bt`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use crate::common::*;

/// A script of `probes/scripts/`.
fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../probes/scripts")
        .join(name)
}

/// One gc-demo run with `tracer attach` (JSON report) and `bpftrace -p PID SCRIPT` on it:
/// returns (tracer's report, gc-demo's truth, bpftrace's maps).
fn gc_demo_with_script(
    name: &str,
    demo_args: &[&str],
    script_name: &str,
    tracer_args: &[&str],
) -> (serde_json::Value, serde_json::Value, BpftraceMaps) {
    let dir = out_dir(name);
    let target = Target::start(GC_DEMO, demo_args);
    let pid = target.pid.to_string();
    let mut args = vec![
        "attach",
        "--pid",
        &pid,
        "--format",
        "json",
        "-o",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(tracer_args);
    let tracer = Tracer::start(&args);
    let bpftrace = Bpftrace::for_pid(target.pid, &[script(script_name).to_str().unwrap()]);
    target.release();
    let truth = target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "tracer failed: {err}");
    let maps = bpftrace.finish();
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let _ = std::fs::remove_dir_all(dir);
    eprintln!("{script_name}: bpftrace printed\n{}", maps.text);
    (report, truth, maps)
}

/// A latency of the report as (count, total_ns, min_ns, max_ns).
fn latency(report: &serde_json::Value, name: &str) -> (u64, u64, u64, u64) {
    let l = &report["latencies"][name];
    let field = |f: &str| {
        l[f].as_u64()
            .unwrap_or_else(|| panic!("no latencies.{name}.{f} in {report:#}"))
    };
    (
        field("count"),
        field("total_ns"),
        field("min_ns"),
        field("max_ns"),
    )
}

fn truth_list(truth: &serde_json::Value, field: &str) -> Vec<u64> {
    truth[field]
        .as_array()
        .unwrap_or_else(|| panic!("no {field} in {truth}"))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[privileged_test]
fn gc_pause_bt_and_tracer_count_and_time_every_pause_alike() {
    require_privileged();
    let (report, truth, bt) = gc_demo_with_script(
        "bt-pause",
        &["--gcs", "12", "--pause-ms", "20", "--interval-ms", "20"],
        "gc_pause.bt",
        &[],
    );
    let pauses = truth_list(&truth, "pause_ns");
    let (count, total, min, max) = latency(&report, "gc_pause");
    assert_eq!(pauses.len(), 12);
    assert_eq!(report["gc"]["count"], 12, "{report:#}");
    assert_eq!(count, 12);
    assert_eq!(bt.int("count"), 12);
    assert_eq!(bt.hist_total("pause_us"), 12);

    // Both measure between the same two traps.
    let preempted = truth["gc_preemptions"].as_u64().unwrap();
    assert!(
        tracers_agree(bt.int("total_ns"), total, 12, preempted),
        "{total}"
    );
    assert!(tracers_agree(bt.int("min_ns"), min, 1, preempted), "{min}");
    assert!(tracers_agree(bt.int("max_ns"), max, 1, preempted), "{max}");
    // gc-demo reads its clock just before gc__begin and just after gc__end: each pause
    // bpftrace measures lies inside the one gc-demo measures, and is most of it (the rest is
    // the traps and, on a busy machine, a preemption next to them).
    let true_total: u64 = pauses.iter().sum();
    assert!(bt.int("total_ns") <= true_total, "{pauses:?}");
    assert!(
        bt.int("min_ns") <= *pauses.iter().min().unwrap(),
        "{pauses:?}"
    );
    assert!(
        bt.int("max_ns") <= *pauses.iter().max().unwrap(),
        "{pauses:?}"
    );
    assert!(bt.int("total_ns") >= true_total / 10 * 9, "{pauses:?}");
    eprintln!(
        "gc_pause: truth total {true_total} min {} max {}; tracer {total} {min} {max}; bpftrace {} {} {}",
        pauses.iter().min().unwrap(),
        pauses.iter().max().unwrap(),
        bt.int("total_ns"),
        bt.int("min_ns"),
        bt.int("max_ns"),
    );
}

#[privileged_test]
fn stop_the_world_bt_and_tracer_agree() {
    require_privileged();
    let (report, truth, bt) = gc_demo_with_script(
        "bt-stw",
        &["--gcs", "10", "--pause-ms", "5", "--interval-ms", "20"],
        "gc_stop_the_world_latency.bt",
        &[],
    );
    let stws = truth_list(&truth, "stw_ns");
    let (count, total, _, _) = latency(&report, "gc_stop_the_world");
    assert_eq!(stws.len(), 10);
    assert_eq!(count, 10, "{report:#}");
    assert_eq!(bt.int("count"), 10);
    assert_eq!(bt.hist_total("stw_us"), 10);
    // Latencies of microseconds: the two tracers' handlers run in the same traps; gc-demo
    // reads its clock just outside the traps, and its first gc__begin includes the
    // process's first uprobe hit, which sets up the kernel's out-of-line execution area.
    // A preemption inside a trap may fall between any two of them.
    let preempted = truth["gc_preemptions"].as_u64().unwrap();
    assert!(
        tracers_agree(bt.int("total_ns"), total, 10, preempted),
        "{total}"
    );
    let true_total: u64 = stws.iter().sum();
    assert!(
        near(
            bt.int("total_ns"),
            true_total,
            0.0,
            10 * 100_000 + preempted * ONE_PREEMPTION_NS
        ),
        "bpftrace total {}, gc-demo's {stws:?}, {preempted} preemptions in probes",
        bt.int("total_ns")
    );
    eprintln!(
        "stop the world: truth total {true_total} ns {stws:?}; tracer total {total}; bpftrace total {} (min {}, max {})",
        bt.int("total_ns"),
        bt.int("min_ns"),
        bt.int("max_ns"),
    );
}

#[privileged_test]
fn gc_all_bt_counts_every_phase_like_tracer_and_the_truth() {
    require_privileged();
    let gcs = 12u64;
    let (report, truth, bt) = gc_demo_with_script(
        "bt-all",
        &["--gcs", "12", "--pause-ms", "10", "--interval-ms", "20"],
        "gc_all.bt",
        &[],
    );
    assert_eq!(truth["gcs"], gcs);
    assert_eq!(report["gc"]["count"], gcs, "{report:#}");
    let preempted = truth["gc_preemptions"].as_u64().unwrap();
    for (map, latency_name) in [
        ("pause_ns", "gc_pause"),
        ("stw_ns", "gc_stop_the_world"),
        ("mark_ns", "gc_mark"),
        ("sweep_ns", "gc_sweep"),
    ] {
        let (bt_count, bt_total) = bt.stats(map);
        let (count, total, _, _) = latency(&report, latency_name);
        assert_eq!((bt_count, count), (gcs, gcs), "@{map} and {latency_name}");
        let hist = map.replace("_ns", "_us");
        assert_eq!(bt.hist_total(&hist), gcs, "@{hist}");
        assert!(
            tracers_agree(bt_total, total, gcs, preempted),
            "@{map} total {bt_total}, tracer {latency_name} total {total}"
        );
        eprintln!(
            "gc_all @{map}: bpftrace total {bt_total} ns, tracer {total} ns ({preempted} \
             preemptions in probes)"
        );
    }
    let (mark, sweep, pause) = (
        bt.stats("mark_ns").1,
        bt.stats("sweep_ns").1,
        bt.stats("pause_ns").1,
    );
    assert!(mark + sweep <= pause, "phases inside the pauses");
    // Inside gc-demo's own measurement, and most of it (see the gc_pause.bt test).
    let true_total: u64 = truth_list(&truth, "pause_ns").iter().sum();
    assert!(
        pause <= true_total && pause >= true_total / 10 * 9,
        "{pause} vs {true_total}"
    );

    assert_eq!(
        bt.int("full_sweeps"),
        truth["full_sweeps"].as_u64().unwrap()
    );
    assert_eq!(bt.int("full_sweeps"), 3, "i = 0, 4, 8");
    assert_eq!(bt.int("finalizers"), gcs);
    assert_eq!(bt.stats("finalizer_delay_ns").0, gcs);
    // gc__mark__end((i + 1) * 1 MiB, i * 4096) for i in 0..12.
    assert_eq!(bt.int("scanned_bytes"), (1..=gcs).sum::<u64>() * 1_048_576);
    assert_eq!(bt.int("perm_scanned_bytes"), (0..gcs).sum::<u64>() * 4096);
}

#[privileged_test]
fn task_run_park_bt_counts_every_run_and_park_of_every_task() {
    require_privileged();
    let (report, truth, bt) = gc_demo_with_script(
        "bt-tasks",
        &[
            "--gcs",
            "10",
            "--pause-ms",
            "5",
            "--interval-ms",
            "20",
            "--sleep-ms",
            "10",
        ],
        "task_run_park.bt",
        &[
            "--latency",
            "tracer:rt__run__task,tracer:rt__pause__task",
            "--latency",
            "tracer:rt__pause__task,tracer:rt__run__task",
        ],
    );
    let tasks = truth["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3);
    let (runs, pauses, parks) = (bt.keyed("runs"), bt.keyed("pauses"), bt.keyed("parks"));
    let mut true_runs = 0;
    for task in tasks {
        let id = task["id"].to_string();
        let n = task["runs"].as_u64().unwrap();
        assert!(n >= 2, "{truth}");
        assert_eq!(runs.get(&id), Some(&n), "@runs of task {id}:\n{}", bt.text);
        assert_eq!(pauses.get(&id), Some(&n), "@pauses of task {id}");
        assert_eq!(parks.get(&id), Some(&(n - 1)), "@parks of task {id}");
        true_runs += n;
    }
    assert_eq!(runs.len(), 3, "only gc-demo's three tasks run: {runs:?}");
    assert_eq!(bt.hist_total("running_us"), true_runs);
    assert_eq!(bt.hist_total("parked_us"), true_runs - 3);

    // tracer attach matches the same pairs per thread; each gc-demo task is one thread.
    let (running, running_total, _, _) = latency(&report, "rt__run__task_to_rt__pause__task");
    let (parked, parked_total, _, _) = latency(&report, "rt__pause__task_to_rt__run__task");
    assert_eq!(running, true_runs, "{report:#}");
    assert_eq!(
        parked,
        true_runs - 3,
        "the first run of a task ends no park"
    );
    let bt_running: u64 = bt.keyed("running_ns").values().sum();
    let bt_parked: u64 = bt.keyed("parked_ns").values().sum();
    // The workers do not count their preemptions.
    assert!(tracers_agree(bt_running, running_total, true_runs, 1));
    assert!(tracers_agree(bt_parked, parked_total, true_runs, 1));
    eprintln!(
        "tasks: {true_runs} runs; running tracer {running_total} ns, bpftrace {bt_running} ns; parked tracer {parked_total} ns, bpftrace {bt_parked} ns"
    );
}

#[privileged_test]
fn a_latency_pair_given_with_the_flag_measures_what_the_builtin_pair_does() {
    require_privileged();
    let AttachRun { report, dir, .. } = attach_json(
        GC_DEMO,
        &["--gcs", "8", "--pause-ms", "10", "--interval-ms", "10"],
        "latency-flag",
        &["--latency", "tracer:gc__mark__begin,tracer:gc__mark__end"],
    );
    let latencies = report["latencies"].as_object().unwrap();
    let requested: Vec<&String> = latencies
        .iter()
        .filter(|(name, l)| {
            name.as_str() != "gc_mark"
                && l["begin"] == "tracer:gc__mark__begin"
                && l["end"] == "tracer:gc__mark__end"
        })
        .map(|(name, _)| name)
        .collect();
    assert_eq!(requested.len(), 1, "{report:#}");
    let builtin = latency(&report, "gc_mark");
    assert_eq!(builtin.0, 8);
    // Same probe hits, same timestamps: the same figures, not just the same count.
    assert_eq!(latency(&report, requested[0]), builtin);
    let _ = std::fs::remove_dir_all(dir);
}

/// A probe that begins four latencies (the most one can) is counted by the program for
/// many latencies, not the smaller one for at most two (`usdt_probe_few`): each of the
/// four gets every GC, and the one given again as a flag the builtin's figures exactly.
#[privileged_test]
fn a_probe_that_begins_four_latencies_measures_each() {
    require_privileged();
    let AttachRun { report, dir, .. } = attach_json(
        GC_DEMO,
        &["--gcs", "8", "--pause-ms", "10", "--interval-ms", "10"],
        "four-latencies",
        &[
            "--latency",
            "tracer:gc__begin,tracer:gc__end",
            "--latency",
            "tracer:gc__begin,tracer:gc__mark__begin",
        ],
    );
    let latencies = report["latencies"].as_object().unwrap();
    let requested = |end: &str| -> String {
        let names: Vec<&String> = latencies
            .iter()
            .filter(|(name, l)| {
                !name.starts_with("gc_pause") && l["begin"] == "tracer:gc__begin" && l["end"] == end
            })
            .map(|(name, _)| name)
            .collect();
        assert_eq!(names.len(), 1, "{end}: {report:#}");
        names[0].clone()
    };
    let (to_end, to_mark) = (
        requested("tracer:gc__end"),
        requested("tracer:gc__mark__begin"),
    );
    for name in ["gc_pause", "gc_stop_the_world", &to_end, &to_mark] {
        assert_eq!(latency(&report, name).0, 8, "{name}: {report:#}");
    }
    assert_eq!(latency(&report, &to_end), latency(&report, "gc_pause"));
    let _ = std::fs::remove_dir_all(dir);
}

/// A Java program that prints `ready pid=PID`, waits for a line on stdin, calls
/// `System.gc()` N times and halts (no shutdown work that could collect again).
/// Compiles Java class `class` from `source` in `dir` and starts it with `jvm_args` and
/// `args`; it prints `ready pid=` from main, after libjvm.so (and its probes) is mapped.
fn start_java(
    dir: &Path,
    class: &str,
    source: &str,
    jvm_args: &[String],
    args: &[String],
) -> StdinTarget {
    let file = dir.join(format!("{class}.java"));
    std::fs::write(&file, source).unwrap();
    let javac = Command::new("javac")
        .arg("-d")
        .arg(dir)
        .arg(&file)
        .output()
        .expect("javac (JDK 17) is needed for the JVM tests");
    assert!(javac.status.success(), "{javac:?}");
    StdinTarget::start(
        Command::new("java")
            .args(jvm_args)
            .arg("-cp")
            .arg(dir)
            .arg(class)
            .args(args),
    )
}

const JAVA_GC: &str = r#"
public class TracerGc {
    public static void main(String[] args) throws Exception {
        int n = Integer.parseInt(args[0]);
        System.out.println("ready pid=" + ProcessHandle.current().pid());
        System.out.flush();
        new java.io.BufferedReader(new java.io.InputStreamReader(System.in)).readLine();
        for (int i = 0; i < n; i++) {
            System.gc();
        }
        System.out.println("{\"gcs\":" + n + "}");
        System.out.flush();
        Runtime.getRuntime().halt(0);
    }
}
"#;

/// Where HotSpot fires its GC probes, by bpftrace: counts per thread name, and the pauses
/// matched per thread.
const JVM_BT: &str = r#"
BEGIN { printf("Tracing hotspot:gc__begin and hotspot:gc__end\n"); }
usdt:*:hotspot:gc__begin { @begin[comm] = count(); @start[tid] = nsecs; }
usdt:*:hotspot:gc__end {
    @end[comm] = count();
    if (@start[tid] != 0) {
        @pause_ns = stats(nsecs - @start[tid]);
        delete(@start[tid]);
    }
}
END { clear(@start); }
"#;

#[privileged_test]
fn a_jvm_reports_one_gc_per_system_gc() {
    // Before the watchdog starts: waiting for another JVM test is no hang.
    let _jvm = jvm_alone();
    require_privileged();
    const N: u64 = 5;
    let dir = out_dir("jvm");
    let gc_log = dir.join("gc.log");
    let java = start_java(
        &dir,
        "TracerGc",
        JAVA_GC,
        &[format!("-Xlog:gc:file={}", gc_log.display())],
        &[N.to_string()],
    );
    let pid = java.pid;
    let attach = TracerRun::attach()
        .pid(pid)
        .json()
        .out(&dir.join("attach"))
        .start();
    let count = TracerRun::trace()
        .arg("--count")
        .json()
        .pid(pid)
        .arg("usdt:*:hotspot:gc__*")
        .start();
    let bpftrace = Bpftrace::for_pid(pid, &["-e", JVM_BT]);

    let rest = java.release_and_finish();
    assert!(rest.contains(&format!("{{\"gcs\":{N}}}")), "{rest}");

    let (ok, out, err) = attach.finish();
    assert!(ok, "{err}");
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let (ok, count_out, err) = count.finish();
    assert!(ok, "{err}");
    let bt = bpftrace.finish();
    let log = std::fs::read_to_string(&gc_log).unwrap();
    eprintln!("JVM GC log:\n{log}\nbpftrace:\n{}", bt.text);

    // The JVM's own account: one pause per System.gc() (a full collection), no other.
    let log_pauses: Vec<f64> = log
        .lines()
        .filter(|l| l.contains(" Pause "))
        .map(|l| {
            l.trim_end()
                .strip_suffix("ms")
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|ms| ms.parse().ok())
                .unwrap_or_else(|| panic!("unexpected GC log line {l:?}"))
        })
        .collect();
    assert_eq!(log_pauses.len() as u64, N, "{log}");

    // Every probe hit, counted in the kernel: one gc__begin and one gc__end per collection.
    let hits = trace_counts(&count_out);
    assert_eq!(hits.get("hotspot:gc__begin"), Some(&N), "{count_out}");
    assert_eq!(hits.get("hotspot:gc__end"), Some(&N), "{count_out}");

    // Both fire on the same thread, HotSpot's VM Thread (inside the GC's VM operation,
    // SvcGCMarker), so matching them per thread pairs every collection.
    let threads = |m: &str| bt.keyed(m).into_iter().collect::<Vec<_>>();
    assert_eq!(
        threads("begin"),
        [("VM Thread".to_string(), N)],
        "{}",
        bt.text
    );
    assert_eq!(
        threads("end"),
        [("VM Thread".to_string(), N)],
        "{}",
        bt.text
    );
    let (bt_count, bt_total) = bt.stats("pause_ns");
    assert_eq!(bt_count, N);

    assert_eq!(report["gc"]["count"], N, "{report:#}");
    let (count, total, _, _) = latency(&report, "gc_pause");
    assert_eq!(count, N);
    assert_eq!(report["lost"]["unmatched_ends"], 0, "{report:#}");
    assert!(
        tracers_agree(total, bt_total, N, 1),
        "{total} vs {bt_total}"
    );
    // The JVM times its pauses inside the probes' span, in milliseconds with 3 decimals.
    let log_total = (log_pauses.iter().sum::<f64>() * 1e6) as u64;
    assert!(
        near(total, log_total, 0.25, 0),
        "tracer {total} ns, JVM log {log_total} ns"
    );
    eprintln!(
        "JVM: {N} collections; pauses total tracer {total} ns, bpftrace {bt_total} ns, GC log {log_total} ns"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A JVM started after `attach` (by `--exe`, the java launcher's file): its probes are in
/// libjvm.so, which the launcher dlopens only then. A set has no `dlopen` hold, so the
/// JVM collects once the tracer says it found them; each collection is then counted and
/// timed as when the JVM is attached to by PID, as its GC log says.
#[privileged_test]
fn a_jvm_started_after_attach_is_traced_through_the_libjvm_it_loads_then() {
    // Before the watchdog starts: waiting for another JVM test is no hang.
    let _jvm = jvm_alone();
    require_privileged();
    const N: u64 = 4;
    let dir = out_dir("jvm-later");
    let java = std::fs::canonicalize(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join("java"))
            .find(|p| p.is_file())
            .expect("java (JDK 17) is needed for the JVM tests"),
    )
    .unwrap();
    let mut attach = TracerRun::attach()
        .args(["--exe", java.to_str().unwrap()])
        .json()
        .duration("120s")
        .out(&dir.join("attach"))
        .start();
    assert!(
        attach.early_stderr.contains("no known runtime probes yet"),
        "{}",
        attach.early_stderr
    );
    let gc_log = dir.join("gc.log");
    let target = start_java(
        &dir,
        "TracerGc",
        JAVA_GC,
        &[format!("-Xlog:gc:file={}", gc_log.display())],
        &[N.to_string()],
    );
    attach.wait_for_stderr("more probe sites");
    let rest = target.release_and_finish();
    assert!(rest.contains(&format!("{{\"gcs\":{N}}}")), "{rest}");
    // SAFETY: kill has no memory preconditions; the tracer is our child.
    unsafe { libc::kill(attach.pid() as i32, libc::SIGINT) };
    let (ok, out, err) = attach.finish();
    assert!(ok, "{err}");
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let log = std::fs::read_to_string(&gc_log).unwrap();
    let log_pauses = log.lines().filter(|l| l.contains(" Pause ")).count() as u64;
    assert_eq!(log_pauses, N, "{log}");
    assert_eq!(report["gc"]["count"], N, "{report:#}\n{err}");
    let (count, total, min, _) = latency(&report, "gc_pause");
    assert_eq!(count, N);
    assert!(min > 0 && total > 0, "{report:#}");
    // Only the JVM's latencies: no other runtime's probes were found.
    let names: Vec<&String> = report["latencies"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["gc_pause"], "{report:#}");
    // The JVM's threads are unwound through the libjvm.so mapped after it joined: its
    // frames are named, not walked blind by frame pointers.
    let wall = std::fs::read_to_string(dir.join("attach/wallclock.folded")).unwrap();
    let in_jvm_threads = folded_weight(&wall, "Thread::call_run()");
    assert!(in_jvm_threads > 0, "no libjvm frames named:\n{wall}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Two Java threads park (`LockSupport.parkNanos`) a known number of times for a known
/// time each, timing every park themselves with `System.nanoTime`.
const JAVA_PARK: &str = r#"
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.concurrent.locks.LockSupport;

public class TracerPark {
    public static void main(String[] args) throws Exception {
        int parks = Integer.parseInt(args[0]);
        long parkNs = Long.parseLong(args[1]) * 1_000_000L;
        System.out.println("ready pid=" + ProcessHandle.current().pid());
        System.out.flush();
        new java.io.BufferedReader(new java.io.InputStreamReader(System.in)).readLine();
        int threads = 2;
        long[] tids = new long[threads];
        long[] parkedNs = new long[threads];
        Thread[] workers = new Thread[threads];
        for (int i = 0; i < threads; i++) {
            final int k = i;
            workers[i] = new Thread(() -> {
                try {
                    // "PID/task/TID": the kernel's id of this thread.
                    String self = Files.readSymbolicLink(Paths.get("/proc/thread-self")).toString();
                    tids[k] = Long.parseLong(self.substring(self.lastIndexOf('/') + 1));
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
                for (int j = 0; j < parks; j++) {
                    long start = System.nanoTime();
                    LockSupport.parkNanos(parkNs);
                    parkedNs[k] += System.nanoTime() - start;
                }
            });
            workers[i].start();
        }
        StringBuilder out = new StringBuilder("{\"threads\":[");
        for (int i = 0; i < threads; i++) {
            workers[i].join();
            out.append(i == 0 ? "" : ",").append("{\"tid\":").append(tids[i])
                .append(",\"parks\":").append(parks)
                .append(",\"parked_ns\":").append(parkedNs[i]).append("}");
        }
        System.out.println(out.append("]}"));
        System.out.flush();
        Runtime.getRuntime().halt(0);
    }
}
"#;

/// HotSpot's `thread__park__begin`/`thread__park__end` probes as task switches (the thread
/// is the task): each worker's parks and parked time, against the threads' own clocks.
#[privileged_test]
fn a_jvm_reports_each_threads_parks_and_parked_time() {
    // Before the watchdog starts: waiting for another JVM test is no hang.
    let _jvm = jvm_alone();
    require_privileged();
    const PARKS: u64 = 20;
    const PARK_MS: u64 = 10;
    let dir = out_dir("jvm-park");
    let java = start_java(
        &dir,
        "TracerPark",
        JAVA_PARK,
        &[],
        &[PARKS.to_string(), PARK_MS.to_string()],
    );
    let attach = TracerRun::attach()
        .pid(java.pid)
        .json()
        .out(&dir.join("attach"))
        .start();
    let rest = java.release_and_finish();
    let (ok, out, err) = attach.finish();
    assert!(ok, "{err}");
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let truth: serde_json::Value = rest
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON line from the JVM: {rest}"));
    let tasks = report["tasks"]["list"]
        .as_array()
        .unwrap_or_else(|| panic!("{report:#}"));
    for thread in truth["threads"].as_array().unwrap() {
        let tid = thread["tid"].as_u64().unwrap();
        let task = tasks
            .iter()
            .find(|t| t["task"] == tid)
            .unwrap_or_else(|| panic!("no task for thread {tid}: {report:#}"));
        assert_eq!(task["parks"], PARKS, "thread {tid}: {task}");
        let parked = task["parked_ns"].as_u64().unwrap();
        let true_parked = thread["parked_ns"].as_u64().unwrap();
        // The probes sit inside the Java call the thread times: a little less, never more.
        assert!(
            parked <= true_parked && near(parked, true_parked, 0.05, 0),
            "thread {tid}: tracer {parked} ns parked, the thread timed {true_parked} ns"
        );
        eprintln!(
            "JVM thread {tid}: {} parks, parked {parked} ns (thread's own clock {true_parked} ns)",
            task["parks"]
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn cpython_reports_one_gc_pause_per_collect() {
    require_privileged();
    let python = "/usr/bin/python3.11";
    // Automatic collections off and no interpreter shutdown: exactly N collections run,
    // each timed from outside by the script itself.
    let script = "import gc, json, os, signal, time\n\
        gc.disable()\n\
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n\
        print(f'ready pid={os.getpid()}', flush=True)\n\
        signal.sigwait({signal.SIGUSR1})\n\
        ns = []\n\
        for _ in range(9):\n    \
            t = time.perf_counter_ns(); gc.collect(); ns.append(time.perf_counter_ns() - t)\n\
        print(json.dumps({'collections': 9, 'collect_ns': ns}), flush=True)\n\
        os._exit(0)\n";
    let dir = out_dir("cpython");
    let target = Target::start(python, &["-c", script]);
    let attach = TracerRun::attach().pid(target.pid).json().out(&dir).start();
    let count = TracerRun::trace()
        .arg("--count")
        .json()
        .pid(target.pid)
        .args(["usdt:*:python:gc__start", "usdt:*:python:gc__done"])
        .start();
    target.release();
    let truth = target.finish();
    let (ok, out, err) = attach.finish();
    assert!(ok, "{err}");
    let (ok, count_out, err) = count.finish();
    assert!(ok, "{err}");
    let report: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let hits = trace_counts(&count_out);
    assert_eq!(hits.get("python:gc__start"), Some(&9), "{count_out}");
    assert_eq!(hits.get("python:gc__done"), Some(&9), "{count_out}");
    assert_eq!(report["gc"]["count"], 9, "{report:#}");
    let (count, total, _, max) = latency(&report, "gc_pause");
    assert_eq!(count, 9);
    // gc.collect() wraps the probes: each pause is shorter than its call.
    let calls = truth_list(&truth, "collect_ns");
    assert!(max <= *calls.iter().max().unwrap(), "{max} vs {calls:?}");
    assert!(total <= calls.iter().sum::<u64>(), "{total} vs {calls:?}");
    eprintln!(
        "CPython: 9 collections; pauses total tracer {total} ns, gc.collect() calls {calls:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A tokio program set up with one line, `probes::tokio::instrument`: on a two-worker
/// runtime, TASKS tasks, task i yielding i + 1 times (so polled i + 2 times), the first one
/// also spawning a child that yields once. Its truth, one JSON line: each task's id (as
/// tokio displays it), its parent's (0 for `block_on`) and its number of polls.
const TOKIO_MAIN: &str = r##"
use std::io::BufRead as _;

const TASKS: u64 = 4;

fn main() {
    println!("ready pid={}", std::process::id());
    std::io::stdin().lock().read_line(&mut String::new()).unwrap();
    let runtime = probes::tokio::instrument(
        tokio::runtime::Builder::new_multi_thread().worker_threads(2),
    )
    .build()
    .unwrap();
    let tasks = runtime.block_on(async {
        let mut tasks = Vec::new();
        let mut handles = Vec::new();
        for i in 0..TASKS {
            let yields = i + 1;
            let handle = tokio::spawn(async move {
                let child = (i == 0).then(|| tokio::spawn(tokio::task::yield_now()));
                for _ in 0..yields {
                    tokio::task::yield_now().await;
                }
                child
            });
            tasks.push(format!(r#"{{"id":{},"parent":0,"polls":{}}}"#, handle.id(), yields + 1));
            handles.push(handle);
        }
        for handle in handles {
            let parent = handle.id();
            if let Some(child) = handle.await.unwrap() {
                tasks.push(format!(r#"{{"id":{},"parent":{parent},"polls":2}}"#, child.id()));
                child.await.unwrap();
            }
        }
        tasks
    });
    drop(runtime);
    println!(r#"{{"tasks":[{}]}}"#, tasks.join(","));
}
"##;

/// Builds the tokio program against this workspace's `probes`, with `--cfg
/// tokio_unstable` (see [`build_side_project`]).
fn build_tokio_target() -> PathBuf {
    let probes = workspace_dir().join("probes");
    let dependencies = format!(
        r#"probes = {{ path = "{}", features = ["tokio"] }}
tokio = {{ version = "1.54", default-features = false, features = ["rt", "rt-multi-thread"] }}
"#,
        probes.display()
    );
    build_side_project("tokio-task-probes", &dependencies, TOKIO_MAIN)
}

#[privileged_test]
fn every_tokio_task_fires_the_task_probes_through_the_hooks() {
    require_privileged();
    let binary = build_tokio_target();
    let target = StdinTarget::start(&mut Command::new(&binary));
    let trace = TracerRun::trace()
        .json()
        .pid(target.pid)
        .arg("usdt:*:tracer:rt__*")
        .start();
    let bpftrace = Bpftrace::for_pid(target.pid, &[script("task_run_park.bt").to_str().unwrap()]);
    let out = target.release_and_finish();
    let (ok, events_out, err) = trace.finish();
    assert!(ok, "{err}");
    assert!(err.contains("none lost"), "{err}");
    let bt = bpftrace.finish();
    let truth: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("target printed {out:?}: {e}"));

    // Each task's events in time order: (probe, args).
    let mut events: Vec<(u64, String, Vec<u64>)> = events_out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("probe").is_some())
        .map(|v| {
            let probe = v["probe"].as_str().unwrap();
            (
                v["time_ns"].as_u64().unwrap(),
                probe.rsplit(':').next().unwrap().to_string(),
                v["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_u64().unwrap())
                    .collect(),
            )
        })
        .collect();
    events.sort();
    let mut by_task: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    let mut parents: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (_, name, args) in &events {
        // rt__task__name(task, name): the task first; the others end with it.
        let task = match name.as_str() {
            "rt__task__name" => args[0],
            _ => *args.last().unwrap(),
        };
        by_task.entry(task).or_default().push(name.as_str());
        if name == "rt__new__task" {
            parents.entry(task).or_default().push(args[0]);
        }
    }

    let tasks = truth["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 5, "{truth}");
    let (runs, pauses, parks) = (bt.keyed("runs"), bt.keyed("pauses"), bt.keyed("parks"));
    for task in tasks {
        let id = task["id"].as_u64().unwrap();
        let polls = task["polls"].as_u64().unwrap();
        // Spawned once by its parent; each poll a run and a pause; tokio's termination hook
        // runs inside the last poll, so: new, name, (run, pause) * (polls - 1), run, finish,
        // pause.
        assert_eq!(
            parents.get(&id),
            Some(&vec![task["parent"].as_u64().unwrap()])
        );
        let mut expected = vec!["rt__new__task", "rt__task__name"];
        for _ in 1..polls {
            expected.extend(["rt__run__task", "rt__pause__task"]);
        }
        expected.extend(["rt__run__task", "rt__finish__task", "rt__pause__task"]);
        assert_eq!(by_task.get(&id), Some(&expected), "task {id}: {events:?}");
        // The script follows tasks by id: every run and pause, and a park between runs.
        let key = id.to_string();
        assert_eq!(runs.get(&key), Some(&polls), "@runs[{id}]:\n{}", bt.text);
        assert_eq!(pauses.get(&key), Some(&polls), "@pauses[{id}]");
        assert_eq!(parks.get(&key), Some(&(polls - 1)), "@parks[{id}]");
    }
    // Any other id is one of tokio's own blocking tasks, the runtime's two worker threads:
    // tokio calls only their termination hook, at shutdown.
    let others: Vec<(&u64, &Vec<&str>)> = by_task
        .iter()
        .filter(|(id, _)| !tasks.iter().any(|t| t["id"] == **id))
        .collect();
    assert!(others.len() <= 2, "{others:?}");
    assert!(
        others.iter().all(|(_, e)| *e == &vec!["rt__finish__task"]),
        "{others:?}"
    );
    eprintln!("tokio: {truth}\nbpftrace:\n{}", bt.text);
}
