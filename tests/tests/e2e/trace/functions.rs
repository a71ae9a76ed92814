//! Function probes (`uprobe:PATH:FUNC`, `uretprobe:PATH:FUNC`): counts and values against
//! the program's own and bpftrace's, entry-to-return latencies of a recursive function,
//! listing, and the refusals (an offset inside an instruction, a return probe on Go code).
//! Then the runtimes whose builds carry no USDT probes, measured through their GC
//! functions: pyenv's CPython against `gc.callbacks`, Node against `perf_hooks`.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};

use crate::common::*;

/// The C target, built as `name` (one per test: tests run at once).
fn functions_target(name: &str) -> String {
    compile_target("gcc", "src/functions/functions.c", name, &["-O2", "-g"])
        .to_str()
        .unwrap()
        .to_owned()
}

#[privileged_test]
fn entries_and_returns_are_counted_as_the_program_and_bpftrace_count_them() {
    require_privileged();
    let bin = functions_target("functions-count");
    let out = run_tracer(&[
        "trace",
        "--count",
        "--format",
        "json",
        &format!("uprobe:{bin}:descend"),
        &format!("uretprobe:{bin}:descend"),
        "--",
        &bin,
        "40",
        "6",
    ]);
    let stdout = out.stdout.as_str();
    assert!(out.status.success(), "{stdout}{}", out.stderr.as_str());
    let truth: serde_json::Value = stdout
        .lines()
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(|v| v.get("calls").is_some())
        })
        .unwrap_or_else(|| panic!("no ground truth in {stdout}"));
    let calls = truth["calls"].as_u64().unwrap();
    assert_eq!(calls, 40 * 6);
    let counts = trace_counts(stdout);
    assert_eq!(counts["uprobe:descend"], calls, "{stdout}");
    assert_eq!(counts["uretprobe:descend"], calls, "{stdout}");

    let maps = Bpftrace::start(&[
        "-e",
        &format!(
            "BEGIN {{ printf(\"Tracing\\n\"); }} uprobe:{bin}:descend {{ @entries = count(); }} \
             uretprobe:{bin}:descend {{ @returns = count(); }}"
        ),
        "-c",
        &format!("{bin} 40 6"),
    ])
    .finish();
    assert_eq!(maps.int("entries"), calls);
    assert_eq!(maps.int("returns"), calls);
}

#[privileged_test]
fn arguments_and_return_values_are_the_registers_of_the_call() {
    require_privileged();
    let bin = functions_target("functions-args");
    let run = trace_json(&[
        &format!("uprobe:{bin}:combine"),
        &format!("uretprobe:{bin}:combine"),
        "--",
        &bin,
        "5",
        "1",
    ]);
    let lines: Vec<serde_json::Value> = run
        .printed
        .events
        .iter()
        .map(|e| serde_json::json!({"probe": e.probe, "args": e.args}))
        .collect();
    let entries: Vec<&TraceEvent> = run
        .printed
        .events
        .iter()
        .filter(|e| e.probe.starts_with("uprobe:"))
        .collect();
    assert_eq!(entries.len(), 5, "{lines:?}");
    for (i, entry) in entries.iter().enumerate() {
        let i = i as i64;
        assert_eq!(
            entry.int_args(),
            [i, i + 1, i + 2, i + 3, i + 4, i + 5],
            "{lines:?}"
        );
    }
    // Each return's value, from the raw JSON lines (a return's event has `retval`).
    let stdout = run_tracer(&[
        "trace",
        "--format",
        "json",
        &format!("uretprobe:{bin}:combine"),
        "--",
        &bin,
        "5",
        "1",
    ]);
    let retvals: Vec<u64> = stdout
        .stdout
        .as_str()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("retval").and_then(serde_json::Value::as_u64))
        .collect();
    let expected: Vec<u64> = (0..5u64)
        .map(|i| i + 2 * (i + 1) + 3 * (i + 2) + 4 * (i + 3) + 5 * (i + 4) + 6 * (i + 5))
        .collect();
    assert_eq!(retvals, expected);
}

#[privileged_test]
fn a_recursive_function_is_timed_per_call_from_its_entry_to_its_return() {
    require_privileged();
    let bin = functions_target("functions-latency");
    let dir = out_dir("functions-latency");
    let target = Target::start(&bin, &["30", "5"]);
    let latency = format!("uprobe:{bin}:descend,uretprobe:{bin}:descend");
    // bpftrace keyed the same way: the stack pointer at the entry is the one at the
    // return less the return address popped.
    let bpftrace = Bpftrace::for_pid(
        target.pid,
        &[
            "-e",
            &format!(
                "BEGIN {{ printf(\"Tracing\\n\"); }} \
                 uprobe:{bin}:descend {{ @start[tid, reg(\"sp\")] = nsecs; }} \
                 uretprobe:{bin}:descend /@start[tid, reg(\"sp\") - 8]/ {{ \
                 @calls = stats(nsecs - @start[tid, reg(\"sp\") - 8]); \
                 delete(@start[tid, reg(\"sp\") - 8]); }}"
            ),
        ],
    );
    let tracer = TracerRun::attach()
        .pid(target.pid)
        .json()
        .out(&dir)
        .args(["--latency", &latency])
        .start();
    target.release();
    let truth = target.finish();
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    let maps = bpftrace.stop();
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let descend = &report["latencies"]["descend"];
    let calls = truth["calls"].as_u64().unwrap();
    assert_eq!(calls, 150);
    // Every call, the nested ones too, matched to its own return.
    assert_eq!(descend["count"], calls, "{descend}");
    assert_eq!(descend["mechanism"], "function probes");
    let (bpftrace_calls, bpftrace_ns) = maps.stats("calls");
    assert_eq!(bpftrace_calls, calls);
    let total = descend["total_ns"].as_u64().unwrap();
    assert!(
        near(total, bpftrace_ns, 0.05, 2_000_000),
        "tracer {total} ns, bpftrace {bpftrace_ns} ns"
    );
    // The innermost call sleeps 1 ms: every level lasts at least that.
    assert!(
        descend["min_ns"].as_u64().unwrap() >= 1_000_000,
        "{descend}"
    );
}

#[test]
fn functions_are_listed_as_bpftrace_lists_them() {
    let bin = functions_target("functions-list");
    let out = run_tracer(&["list", &format!("uprobe:{bin}:*e*")]);
    let text = out.stdout.as_str();
    assert!(out.status.success(), "{text}");
    let listed: Vec<&str> = text.lines().collect();
    assert!(
        listed.contains(&format!("uprobe:{bin}:descend").as_str()),
        "{text}"
    );
    assert!(
        listed.contains(&format!("uprobe:{bin}:combine").as_str()),
        "{text}"
    );
    assert!(
        !listed.contains(&format!("uprobe:{bin}:main").as_str()),
        "{text}"
    );
    let verbose = run_tracer(&["list", "-v", &format!("uprobe:{bin}:combine")]);
    let verbose = verbose.stdout.as_str();
    assert!(verbose.contains("function combine at 0x"), "{verbose}");

    // bpftrace lists the same functions of the program's own code.
    let bpftrace = Command::new("bpftrace")
        .args(["-l", &format!("uprobe:{bin}:*")])
        .output()
        .expect("bpftrace is installed by `cargo xtask setup`");
    let theirs: std::collections::BTreeSet<String> = String::from_utf8_lossy(&bpftrace.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let ours_out = run_tracer(&["list", &format!("uprobe:{bin}:*")]);
    let ours: std::collections::BTreeSet<String> = ours_out
        .stdout
        .as_str()
        .lines()
        .map(str::to_string)
        .collect();
    for name in ["descend", "combine", "main"] {
        let probe = format!("uprobe:{bin}:{name}");
        assert!(theirs.contains(&probe), "bpftrace: {theirs:?}");
        assert!(ours.contains(&probe), "tracer: {ours:?}");
    }
    let missing: Vec<&String> = theirs.difference(&ours).collect();
    assert!(
        missing.is_empty(),
        "bpftrace lists, tracer does not: {missing:?}"
    );
}

#[test]
fn probes_that_would_harm_the_target_are_refused() {
    let bin = functions_target("functions-refused");
    // An offset inside the first instruction (`endbr64` or `push`, more than a byte).
    let out = run_tracer(&["list", &format!("uprobe:{bin}:combine+1")]);
    let err = out.stderr.as_str();
    assert!(!out.status.success());
    assert!(err.contains("inside an instruction"), "{err}");
    let out = run_tracer(&[
        "trace",
        &format!("uretprobe:{bin}:combine+4"),
        "--",
        &bin,
        "1",
        "1",
    ]);
    assert!(!out.status.success());
    assert!(
        out.stderr
            .as_str()
            .contains("a return probe goes on a function"),
        "{}",
        out.stderr.as_str()
    );
    // A Go program (by its `.go.buildinfo` section): no return probe, ever.
    let go = compile_target("gcc", "src/functions/go_like.c", "functions-go-like", &[]);
    let go = go.to_str().unwrap();
    let out = run_tracer(&["list", &format!("uretprobe:{go}:main")]);
    let err = out.stderr.as_str();
    assert!(!out.status.success());
    assert!(
        err.contains("is a Go program") && err.contains("uprobe:"),
        "{err}"
    );
    let out = run_tracer(&["list", &format!("uprobe:{go}:main")]);
    assert!(out.status.success(), "{}", out.stderr.as_str());
}

/// A program started with its standard output read line by line.
struct LineTarget {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    pid: u32,
}

impl LineTarget {
    /// Starts `program ARGS` and waits for its `ready pid=` line.
    fn start(program: &str, args: &[&str]) -> LineTarget {
        let mut child = Command::new(program)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let pid = loop {
            let line = lines.next().expect("the target said nothing").unwrap();
            if let Some(pid) = line.strip_prefix("ready pid=") {
                break pid.parse().unwrap();
            }
        };
        LineTarget { child, lines, pid }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(self.pid as i32, signal) };
    }

    /// The next line that is JSON.
    fn json(&mut self) -> serde_json::Value {
        loop {
            let line = self.lines.next().expect("the target ended").unwrap();
            if let Ok(value) = serde_json::from_str(&line) {
                return value;
            }
        }
    }
}

impl Drop for LineTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Attaches to `target`, lets it run its workload, and stops the tracer once it printed
/// its own record (before it exits, so collections at exit are in neither): the report,
/// the record and the tracer's standard error.
fn attach_to_workload(
    target: &mut LineTarget,
    name: &str,
) -> (serde_json::Value, serde_json::Value, String) {
    let dir = out_dir(name);
    let tracer = TracerRun::attach().pid(target.pid).json().out(&dir).start();
    target.signal(libc::SIGUSR1);
    let truth = target.json();
    // SAFETY: as above, the tracer's pid.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGINT) };
    let (ok, out, err) = tracer.finish();
    assert!(ok, "{err}");
    let report = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    (report, truth, err)
}

/// [`attach_to_workload`] for a runtime measured through its functions: the attach line
/// says so.
fn attach_to_workload_by_functions(
    target: &mut LineTarget,
    name: &str,
) -> (serde_json::Value, serde_json::Value) {
    let (report, truth, err) = attach_to_workload(target, name);
    assert!(
        err.contains("GC from function probes: no USDT in this build"),
        "the attach line says how GC is measured: {err}"
    );
    (report, truth)
}

/// pyenv's builds (no USDT probes): the interpreters installed here.
fn pyenv_pythons() -> Vec<std::path::PathBuf> {
    let root = std::env::var("PYENV_ROOT").unwrap_or_else(|_| "/root/.pyenv".into());
    ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"]
        .iter()
        .filter_map(|minor| {
            let versions = std::fs::read_dir(format!("{root}/versions")).ok()?;
            versions
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{minor}.")))
                })
                .map(|p| p.join(format!("bin/python{minor}")))
                .find(|p| p.exists())
        })
        .collect()
}

#[privileged_test]
fn cpython_without_usdt_probes_has_its_collections_counted_by_generation() {
    require_privileged_alone();
    let pythons = pyenv_pythons();
    if pythons.is_empty() {
        assert!(
            std::env::var_os("CI").is_none(),
            "no pyenv CPython installed (machines of this kind have 3.9 to 3.13 in /root/.pyenv)"
        );
        eprintln!("skipped: no pyenv CPython installed");
        return;
    }
    let script = workspace_dir().join("tests/python/gc_workload.py");
    for python in pythons {
        let python = python.to_str().unwrap();
        let mut target = LineTarget::start(
            python,
            &[script.to_str().unwrap(), "2", "--wait-for-signal"],
        );
        let name = format!("functions-{}", python.rsplit('/').next().unwrap());
        let (report, truth) = attach_to_workload_by_functions(&mut target, &name);
        let gc = &report["gc"];
        assert_eq!(gc["runtime"], "CPython", "{python}: {gc}");
        assert_eq!(gc["mechanism"], "function probes", "{python}");
        assert_eq!(
            gc["count"], truth["collections"],
            "{python}: {gc} vs {truth}"
        );
        for (generation, count) in truth["by_generation"].as_object().unwrap() {
            assert_eq!(
                gc["classes"][format!("gen{generation}")]["count"],
                *count,
                "{python}: {gc} vs {truth}"
            );
        }
        let ours = gc["total_pause_ns"].as_u64().unwrap();
        let theirs = truth["total_ns"].as_u64().unwrap();
        assert!(
            near(ours, theirs, 0.10, 0),
            "{python}: {ours} ns paused, gc.callbacks timed {theirs} ns"
        );
        assert_eq!(report["gc_by_runtime"].as_array().unwrap().len(), 1);
    }
}

#[privileged_test]
fn a_python_with_usdt_probes_is_measured_by_them_alone() {
    require_privileged();
    let python = "/usr/bin/python3.11";
    let script = workspace_dir().join("tests/python/gc_workload.py");
    let mut target = LineTarget::start(
        python,
        &[script.to_str().unwrap(), "1", "--wait-for-signal"],
    );
    let (report, truth, _) = attach_to_workload(&mut target, "functions-debian-python");
    assert_eq!(report["gc"]["mechanism"], "usdt", "{}", report["gc"]);
    assert_eq!(report["gc"]["count"], truth["collections"]);
    assert_eq!(report["gc_by_runtime"].as_array().unwrap().len(), 1);
}

#[privileged_test]
fn node_collections_are_counted_minor_and_major_as_perf_hooks_counts_them() {
    require_privileged_alone();
    let script = workspace_dir().join("tests/src/functions/gc_workload.js");
    let mut target = LineTarget::start("node", &[script.to_str().unwrap(), "2"]);
    let (report, truth) = attach_to_workload_by_functions(&mut target, "functions-node");
    let gc = &report["gc"];
    assert_eq!(gc["runtime"], "Node.js (V8)", "{gc}");
    // perf_hooks: kind 1 minor, 4 major, 8 incremental marking steps (not collections).
    let kinds = &truth["kinds"];
    let minor = kinds["1"].as_u64().unwrap_or(0);
    let major = kinds["4"].as_u64().unwrap_or(0);
    assert!(minor > 10 && major > 0, "{truth}");
    assert_eq!(gc["classes"]["minor"]["count"], minor, "{gc} vs {truth}");
    assert_eq!(gc["classes"]["major"]["count"], major, "{gc} vs {truth}");
    assert_eq!(gc["count"], minor + major, "{gc} vs {truth}");
    let ours = gc["total_pause_ns"].as_u64().unwrap();
    let theirs = truth["minor_major_ns"].as_u64().unwrap();
    assert!(
        near(ours, theirs, 0.10, 0),
        "{ours} ns paused, perf_hooks timed {theirs} ns"
    );
}

/// The venv `cargo xtask setup` makes with the Julia 1.13 bundle.
fn julia_venv_python() -> std::path::PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    std::path::PathBuf::from(home).join(".cache/tracer/julia/bin/python")
}

#[privileged_test]
fn python_calling_julia_has_each_runtimes_collections_apart() {
    require_privileged_alone();
    let python = julia_venv_python();
    assert!(
        python.exists(),
        "{} is missing: `cargo xtask setup` installs the Julia bundle",
        python.display()
    );
    let script = workspace_dir().join("tests/python/julia_gc.py");
    let mut target = LineTarget::start(
        python.to_str().unwrap(),
        &[script.to_str().unwrap(), "3", "100"],
    );
    let (report, truth) = attach_to_workload_by_functions(&mut target, "functions-julia");
    let runtimes = report["gc_by_runtime"].as_array().unwrap();
    let of = |name: &str| {
        runtimes
            .iter()
            .find(|gc| gc["runtime"] == name)
            .unwrap_or_else(|| panic!("no {name} in {runtimes:?}"))
    };
    // Julia's collections, from its functions; Python's, from its USDT probes.
    let julia = of("Julia");
    assert_eq!(julia["mechanism"], "function probes");
    assert_eq!(
        julia["count"], truth["julia_collections"],
        "{julia} vs {truth}"
    );
    let python = of("CPython");
    assert_eq!(python["mechanism"], "usdt");
    assert_eq!(
        python["count"], truth["python_collections"],
        "{python} vs {truth}"
    );
    // Marking and sweeping is the span Julia itself times.
    let latencies = &report["latencies"];
    let mark_sweep = latencies["gc_mark_sweep"]["total_ns"].as_u64().unwrap();
    let theirs = truth["julia_gc_ns"].as_u64().unwrap();
    assert!(
        near(mark_sweep, theirs, 0.10, 0),
        "{mark_sweep} ns marking and sweeping, jl_gc_total_hrtime {theirs} ns"
    );
    // Each runtime's pause under its own key.
    assert!(latencies["gc_pause:Julia"].is_object(), "{latencies}");
    assert!(latencies["gc_pause:CPython"].is_object(), "{latencies}");
    assert!(julia["total_pause_ns"].as_u64().unwrap() >= mark_sweep);
}

/// The Go workload, built with Debian's Go (which `cargo xtask setup` installs).
fn go_workload() -> std::path::PathBuf {
    let out = workspace_dir().join("target/tmp/go-gc-workload");
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let source = workspace_dir().join("tests/src/functions/gc_workload.go");
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(&source)
        .output()
        .expect("go is installed by `cargo xtask setup`");
    assert!(
        built.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    out
}

#[privileged_test]
fn go_stops_of_the_world_are_counted_by_phase_from_entry_probes() {
    require_privileged();
    let program = go_workload();
    let mut target = LineTarget::start(program.to_str().unwrap(), &["2"]);
    let (report, truth) = attach_to_workload_by_functions(&mut target, "functions-go");
    let gc = &report["gc"];
    assert_eq!(gc["runtime"], "Go", "{gc}");
    let collections = truth["collections"].as_u64().unwrap();
    assert!(collections > 10, "{truth}");
    // Each collection stops the world twice; ReadMemStats stops it too, outside any.
    assert_eq!(
        gc["classes"]["mark termination"]["count"], collections,
        "{gc} vs {truth}"
    );
    assert_eq!(
        gc["classes"]["sweep termination"]["count"], collections,
        "{gc} vs {truth}"
    );
    // Only entry probes: no return probe on Go code, ever.
    let probes = report["probes"].as_array().unwrap();
    assert!(
        probes
            .iter()
            .all(|p| p["probe"].as_str().unwrap().starts_with("uprobe:")),
        "{probes:?}"
    );
    // Go times each pause a little past where the world is started again (the start
    // probe's entry), so the two totals are near, not equal.
    let ours = gc["classes"]["mark termination"]["total_ns"]
        .as_u64()
        .unwrap()
        + gc["classes"]["sweep termination"]["total_ns"]
            .as_u64()
            .unwrap();
    let theirs = truth["pause_total_ns"].as_u64().unwrap();
    assert!(
        ours <= theirs && ours * 2 >= theirs,
        "{ours} ns stopped, Go's PauseTotalNs {theirs} ns"
    );
}

#[test]
fn functions_of_a_stripped_program_are_found_in_its_separate_debug_file() {
    let bin = compile_target(
        "gcc",
        "src/functions/functions.c",
        "functions-stripped",
        &["-O2", "-g"],
    );
    let debug = bin.with_extension("debug");
    let run = |program: &str, args: &[&std::ffi::OsStr]| {
        let status = Command::new(program).args(args).status().unwrap();
        assert!(status.success(), "{program} {args:?}");
    };
    run(
        "objcopy",
        &[
            "--only-keep-debug".as_ref(),
            bin.as_os_str(),
            debug.as_os_str(),
        ],
    );
    run("strip", &["--strip-all".as_ref(), bin.as_os_str()]);
    let link = format!("--add-gnu-debuglink={}", debug.display());
    run("objcopy", &[link.as_ref(), bin.as_os_str()]);
    let probe = format!("uprobe:{}:descend", bin.display());
    let out = run_tracer(&["list", &probe]);
    assert!(out.status.success(), "{}", out.stderr.as_str());
    assert_eq!(out.stdout.as_str().trim(), probe);
    // Without the debug file, the static function is nowhere.
    std::fs::remove_file(&debug).unwrap();
    let out = run_tracer(&["list", &probe]);
    assert!(!out.status.success());
    assert!(
        out.stderr.as_str().contains("no probes match"),
        "{}",
        out.stderr.as_str()
    );
}
