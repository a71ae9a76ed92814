//! Services of many processes: `attach`, `profile` and `trace` follow the processes a
//! target forks (`--children`), every process of an executable (`--exe`), of a command
//! name (`--comm`) or of a cgroup (`--cgroup`), also those started while tracing.
//!
//! - `forking-server`, whose children each fire a known number of probe pairs of a known
//!   length and block for a known time in a named function: exact counts in total and per
//!   process, every process listed, each child's stacks under its own process frame; the
//!   same counts from `trace --count` and from bpftrace; none of the children's without
//!   `--children`; a server started after the tracer, found by executable, command name
//!   or cgroup.
//! - PostgreSQL 15 and pgbench, the real thing: backends forked by the postmaster after the
//!   tracer attached, every transaction counted, as bpftrace counts them and as pgbench
//!   says it ran them; the query texts `query__start` carries (`trace --str`), as psql
//!   sent them and as bpftrace's `str()` reads them.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::common::*;
use serde_json::Value;

const SERVER: &str = env!("CARGO_BIN_EXE_forking-server");
/// The server's probe pair, as `--latency` takes it.
const PAIR: &str = "tracer:gc__begin,tracer:gc__end";
const BEGIN: &str = "tracer:gc__begin";
const END: &str = "tracer:gc__end";
/// A bound on every tracer run: the tests stop them (or they stop by themselves) long
/// before; this only keeps a tracer that does not stop from hanging the test.
const SAFETY_DURATION: &str = "25s";

// ---------------------------------------------------------------------------------------
// The server's ground truth

/// What `forking-server` says it did (see its docs).
struct Truth {
    json: Value,
    pid: u32,
    parent_pairs: u64,
    total_pairs: u64,
    pair_ns_min: u64,
    children: Vec<ChildTruth>,
}

struct ChildTruth {
    pid: u32,
    pairs: u64,
    /// Total, shortest and longest pair, each timed just outside its two probes.
    pair_ns: u64,
    min_pair_ns: u64,
    max_pair_ns: u64,
    /// Time inside `child_blocks_in_read`.
    blocked_ns: u64,
}

impl Truth {
    fn parse(json: Value) -> Truth {
        let int = |v: &Value, field: &str| {
            v[field]
                .as_u64()
                .unwrap_or_else(|| panic!("no {field} in the server's truth {json}"))
        };
        let children = json["child_list"]
            .as_array()
            .unwrap_or_else(|| panic!("no child_list in {json}"))
            .iter()
            .map(|c| ChildTruth {
                pid: int(c, "pid") as u32,
                pairs: int(c, "pairs"),
                pair_ns: int(c, "pair_ns"),
                min_pair_ns: int(c, "min_pair_ns"),
                max_pair_ns: int(c, "max_pair_ns"),
                blocked_ns: int(c, "blocked_ns"),
            })
            .collect();
        Truth {
            pid: int(&json, "pid") as u32,
            parent_pairs: int(&json, "parent_pairs"),
            total_pairs: int(&json, "total_pairs"),
            pair_ns_min: int(&json, "pair_ms") * 1_000_000,
            children,
            json,
        }
    }

    fn child_pids(&self) -> BTreeSet<u32> {
        self.children.iter().map(|c| c.pid).collect()
    }

    /// The server and all its children.
    fn all_pids(&self) -> BTreeSet<u32> {
        let mut pids = self.child_pids();
        pids.insert(self.pid);
        pids
    }
}

/// The server's arguments: N children of K pairs of `pair_ms`, each then blocked
/// `block_ms`; M pairs in the parent.
fn server_args(n: u64, k: u64, m: u64, pair_ms: u64, block_ms: u64) -> Vec<String> {
    [
        ("--children", n),
        ("--pairs", k),
        ("--parent-pairs", m),
        ("--pair-ms", pair_ms),
        ("--block-ms", block_ms),
    ]
    .iter()
    .flat_map(|(flag, v)| [flag.to_string(), v.to_string()])
    .collect()
}

fn start_server(program: &str, args: &[String]) -> Target {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Target::start(program, &args)
}

// ---------------------------------------------------------------------------------------
// Running the tracer

/// A running tracer that is interrupted (SIGINT: it detaches and reports) if the test
/// fails before it is finished.
struct Running(Option<Tracer>);

impl Running {
    fn start(run: TracerRun) -> Running {
        Running(Some(run.start()))
    }

    fn pid(&self) -> u32 {
        self.0.as_ref().unwrap().pid()
    }

    /// Whether the tracer is still running (not exited, not a zombie).
    fn is_running(&self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()));
        stat.is_ok_and(|stat| {
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            !matches!(state, None | Some('Z' | 'X'))
        })
    }

    fn interrupt(&self) {
        // SAFETY: kill has no memory preconditions; the tracer is our child, not reaped.
        unsafe { libc::kill(self.pid() as i32, libc::SIGINT) };
    }

    /// Waits for the tracer to exit; returns (success, stdout, all of stderr).
    fn finish(mut self) -> (bool, String, String) {
        self.0.take().unwrap().finish()
    }

    /// Waits for `attach --format json` to exit and returns its report; the report is also
    /// written to `dir/report.json` for a look after a failure.
    fn finish_json(self, dir: &Path) -> Report {
        let (ok, out, stderr) = self.finish();
        assert!(ok, "tracer failed:\n{stderr}\nstdout:\n{out}");
        let json: Value = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("{e}: stdout {out:?}\nstderr:\n{stderr}"));
        let _ = std::fs::write(dir.join("report.json"), format!("{json:#}"));
        Report {
            json,
            stderr,
            dir: dir.to_path_buf(),
        }
    }

    /// Waits for `trace --count --format json` to exit and returns its counts.
    fn finish_counts(self) -> (BTreeMap<String, u64>, String) {
        let (ok, out, stderr) = self.finish();
        assert!(ok, "tracer trace failed:\n{stderr}\nstdout:\n{out}");
        let counts = trace_counts(&out).into_iter().collect();
        (counts, format!("stdout:\n{out}\nstderr:\n{stderr}"))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.is_some() {
            self.interrupt();
        }
    }
}

/// One latency's figures for one process.
#[derive(Debug, Clone, PartialEq)]
struct PerProcess {
    name: String,
    count: u64,
    total_ns: u64,
    min_ns: u64,
    max_ns: u64,
}

/// `tracer attach --format json`'s report, with what a failure message needs.
struct Report {
    json: Value,
    stderr: String,
    dir: PathBuf,
}

impl Report {
    /// The tracer's standard error and the parts of the report these tests read (the
    /// whole report is in `dir/report.json`).
    fn context(&self) -> String {
        format!(
            "tracer stderr:\n{}\nprocesses: {}\nlatencies: {:#}\nprobes: {:#}\nstopped_by: {}\n\
             (the whole report: {})",
            self.stderr,
            self.json["processes"],
            self.json["latencies"],
            self.json["probes"],
            self.json["stopped_by"],
            self.dir.join("report.json").display(),
        )
    }

    /// `processes`: pid → name.
    fn processes(&self) -> BTreeMap<u32, String> {
        self.json["processes"]
            .as_array()
            .unwrap_or_else(|| panic!("no processes[] in the report\n{}", self.context()))
            .iter()
            .map(|p| {
                (
                    p["pid"].as_u64().unwrap_or_else(|| panic!("{p}")) as u32,
                    p["name"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{p}"))
                        .to_string(),
                )
            })
            .collect()
    }

    /// The latencies measured between `begin` and `end` (`PROVIDER:NAME`): the one asked
    /// for with `--latency`, and a built-in one on the same pair (`gc_pause` for the
    /// server's). `latencies` is an object keyed by name; an array of objects with a
    /// `name` is read too.
    fn latencies(&self, begin: &str, end: &str) -> Vec<(String, &Value)> {
        let all: Vec<(String, &Value)> = match &self.json["latencies"] {
            Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), v)).collect(),
            Value::Array(list) => list
                .iter()
                .map(|v| (v["name"].as_str().unwrap_or("?").to_string(), v))
                .collect(),
            other => panic!("latencies is {other}\n{}", self.context()),
        };
        let found: Vec<(String, &Value)> = all
            .into_iter()
            .filter(|(_, l)| l["begin"] == begin && l["end"] == end)
            .collect();
        assert!(
            !found.is_empty(),
            "no latency from {begin} to {end}\n{}",
            self.context()
        );
        found
    }

    /// `per_process` of one latency: pid → figures.
    fn per_process(&self, name: &str, latency: &Value) -> BTreeMap<u32, PerProcess> {
        latency["per_process"]
            .as_array()
            .unwrap_or_else(|| panic!("no per_process[] in latency {name}\n{}", self.context()))
            .iter()
            .map(|p| {
                let int = |f: &str| p[f].as_u64().unwrap_or(0);
                (
                    p["pid"].as_u64().unwrap_or_else(|| panic!("{p}")) as u32,
                    PerProcess {
                        name: p["name"].as_str().unwrap_or("").to_string(),
                        count: int("count"),
                        total_ns: int("total_ns"),
                        min_ns: int("min_ns"),
                        max_ns: int("max_ns"),
                    },
                )
            })
            .collect()
    }

    /// Hits of probe `PROVIDER:NAME`, summed over the probes[] entries that end with it
    /// (one per object carrying it).
    fn hits(&self, probe: &str) -> u64 {
        let suffix = format!(":{probe}");
        let entries: Vec<&Value> = self.json["probes"]
            .as_array()
            .unwrap_or_else(|| panic!("no probes[]\n{}", self.context()))
            .iter()
            .filter(|p| p["probe"].as_str().is_some_and(|s| s.ends_with(&suffix)))
            .collect();
        assert!(
            !entries.is_empty(),
            "probe {probe} not attached\n{}",
            self.context()
        );
        entries.iter().map(|p| p["hits"].as_u64().unwrap()).sum()
    }

    fn folded(&self, file: &str) -> String {
        let path = self.dir.join(file);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), self.context()))
    }
}

// ---------------------------------------------------------------------------------------
// What every run of the server must show

/// Checks every latency on the server's pair: `expected` pairs in all, one `per_process`
/// entry with pairs for each process in `counted` (the others fired none, or were not
/// traced), each pair at least the server's sleep and inside the server's own timing.
fn assert_pairs(report: &Report, truth: &Truth, counted: &BTreeSet<u32>, names: &str) {
    let expected: u64 = truth
        .children
        .iter()
        .filter(|c| counted.contains(&c.pid))
        .map(|c| c.pairs)
        .sum::<u64>()
        + if counted.contains(&truth.pid) {
            truth.parent_pairs
        } else {
            0
        };
    let ctx = || format!("server's truth: {}\n{}", truth.json, report.context());
    assert_eq!(report.hits(BEGIN), expected, "{BEGIN} hits\n{}", ctx());
    assert_eq!(report.hits(END), expected, "{END} hits\n{}", ctx());
    assert_eq!(
        report.json["lost"]["unmatched_ends"],
        0,
        "every end has its begin on its thread\n{}",
        ctx()
    );
    for (name, latency) in report.latencies(BEGIN, END) {
        assert_eq!(
            latency["count"],
            expected,
            "latency {name}: every pair of every traced process\n{}",
            ctx()
        );
        let per = report.per_process(&name, latency);
        let with_pairs: BTreeSet<u32> = per
            .iter()
            .filter(|(_, p)| p.count > 0)
            .map(|(pid, _)| *pid)
            .collect();
        // The traced processes that fired pairs: the children, and the server if it did.
        let want: BTreeSet<u32> = counted
            .iter()
            .copied()
            .filter(|&pid| {
                truth.child_pids().contains(&pid) || (pid == truth.pid && truth.parent_pairs > 0)
            })
            .collect();
        assert_eq!(
            with_pairs,
            want,
            "latency {name}: per_process lists exactly the processes that fired pairs\n{}",
            ctx()
        );
        assert_eq!(
            per.values().map(|p| p.count).sum::<u64>(),
            expected,
            "latency {name}: per_process adds up to the count\n{}",
            ctx()
        );
        for child in truth.children.iter().filter(|c| counted.contains(&c.pid)) {
            let p = &per[&child.pid];
            assert_eq!(p.count, child.pairs, "child {}\n{}", child.pid, ctx());
            assert_eq!(p.name, names, "child {}\n{}", child.pid, ctx());
            // The probes fire inside the child's own timing of each pair, around a sleep of
            // at least pair_ms: each latency is at least that, and at most the child's.
            assert!(
                p.min_ns >= truth.pair_ns_min && p.min_ns <= child.min_pair_ns,
                "child {}: shortest pair {} ns; it slept {} ns in each, timed its shortest {} ns\n{}",
                child.pid,
                p.min_ns,
                truth.pair_ns_min,
                child.min_pair_ns,
                ctx()
            );
            assert!(
                p.max_ns <= child.max_pair_ns,
                "child {}: longest pair {} ns, it timed {} ns\n{}",
                child.pid,
                p.max_ns,
                child.max_pair_ns,
                ctx()
            );
            assert!(
                p.total_ns >= child.pairs * truth.pair_ns_min && p.total_ns <= child.pair_ns,
                "child {}: pairs total {} ns, it timed {} ns\n{}",
                child.pid,
                p.total_ns,
                child.pair_ns,
                ctx()
            );
        }
    }
}

/// The first frame of a folded line.
fn root_frame(line: &str) -> &str {
    let stack = line.rsplit_once(' ').map_or(line, |(stack, _)| stack);
    stack.split(';').next().unwrap_or("")
}

/// Whether a folded stack holds `frame` (a frame may carry a suffix after a space).
fn has_frame(stack: &str, frame: &str) -> bool {
    stack
        .split(';')
        .any(|f| f == frame || f.split(' ').next() == Some(frame))
}

/// Microseconds of `folded` under process frame `NAME [PID]` that pass through `frame`.
fn process_weight(folded: &str, name: &str, pid: u32, frame: &str) -> u64 {
    let root = format!("{name} [{pid}]");
    folded_weight_where(folded, |stack| {
        stack.split(';').next() == Some(root.as_str()) && has_frame(stack, frame)
    })
}

/// The folded files of a profile of the server and its children, named `name`: every
/// stack starts with the frame `NAME [PID]` of a traced process, each child's blocked time
/// in `child_blocks_in_read` and its pairs' sleeps under its own process frame, and the
/// server's wait for them under its own.
fn assert_folded_per_process(report: &Report, truth: &Truth, name: &str) {
    let traced = truth.all_pids();
    let roots: BTreeSet<String> = traced.iter().map(|p| format!("{name} [{p}]")).collect();
    for file in ["wallclock.folded", "offcpu.folded", "oncpu.folded"] {
        // No on-CPU sample at all may leave no oncpu.folded; the other two always have
        // the children's blocked time.
        if file == "oncpu.folded" && !report.dir.join(file).exists() {
            continue;
        }
        let folded = report.folded(file);
        for line in folded.lines().filter(|l| !l.is_empty()) {
            assert!(
                roots.contains(root_frame(line)),
                "{file}: a stack that does not start with one of {roots:?}: {line:?}\n{}",
                report.context()
            );
        }
    }
    let wall = report.folded("wallclock.folded");
    let offcpu = report.folded("offcpu.folded");
    let within = |measured_us: u64, true_ns: u64, low: f64, high: f64| {
        let true_us = true_ns as f64 / 1000.0;
        measured_us as f64 >= low * true_us && measured_us as f64 <= high * true_us
    };
    for child in &truth.children {
        for (file, folded) in [("offcpu.folded", &offcpu), ("wallclock.folded", &wall)] {
            let blocked = process_weight(
                folded,
                name,
                child.pid,
                "forking_server::child_blocks_in_read",
            );
            assert!(
                within(blocked, child.blocked_ns, 0.8, 1.2),
                "{file}: child {} {name} [{}] blocked {blocked} us in child_blocks_in_read, \
                 its own clock says {} us\n{folded}",
                child.pid,
                child.pid,
                child.blocked_ns / 1000
            );
            // Its pairs are sleeps of a few ms, in serve_request. An on-CPU sample weighs a
            // whole period (10.1 ms at 99 Hz, as long as all the pairs): one that lands
            // there (the probes' own trap, say) may add that much.
            let serving = process_weight(folded, name, child.pid, "forking_server::serve_request");
            let one_sample_us = 1_000_000 / 99 + 1;
            assert!(
                within(
                    serving.saturating_sub(one_sample_us),
                    child.pair_ns,
                    0.0,
                    1.5
                ) && within(serving, child.pair_ns, 0.5, f64::INFINITY),
                "{file}: child {} spent {serving} us in serve_request, its own clock says {} us\n{folded}",
                child.pid,
                child.pair_ns / 1000
            );
        }
        // An interval whose switch back in the scheduler tracepoint did not show is closed
        // at the thread's next switch out (or death), when where it blocked in the kernel
        // is no longer on its stack: under its user stack alone, and counted.
        let recovered = report.json["lost"]["switch_ins_recovered"]
            .as_u64()
            .unwrap_or(0);
        assert!(
            offcpu.lines().any(|l| {
                root_frame(l) == format!("{name} [{}]", child.pid)
                    && has_frame(l, "forking_server::child_blocks_in_read")
                    && (l.contains("ksys_read_[k]") || (recovered > 0 && !l.contains("_[k]")))
            }),
            "child {}'s blocked stack goes down into the kernel's read\n{offcpu}",
            child.pid
        );
    }
    // The server waits in waitpid for as long as its last child lives.
    let longest = truth
        .children
        .iter()
        .map(|c| c.blocked_ns)
        .max()
        .unwrap_or(0);
    let waited = process_weight(&wall, name, truth.pid, "forking_server::wait_for_children");
    assert!(
        waited as f64 >= 0.8 * longest as f64 / 1000.0,
        "server {} waited {waited} us for its children, the longest blocked {} us\n{wall}",
        truth.pid,
        longest / 1000
    );
}

/// Each child has its thread in `threads[]`, with its blocked time.
fn assert_threads(report: &Report, truth: &Truth) {
    let threads = report.json["threads"]
        .as_array()
        .unwrap_or_else(|| panic!("no threads[]\n{}", report.context()));
    for child in &truth.children {
        let thread = threads
            .iter()
            .find(|t| t["pid"] == child.pid && t["tid"] == child.pid)
            .unwrap_or_else(|| {
                panic!(
                    "child {} has no thread in threads[]: {threads:?}\n{}",
                    child.pid,
                    report.context()
                )
            });
        let blocked = thread["blocked_ns"].as_u64().unwrap_or(0);
        assert!(
            blocked as f64 >= 0.8 * child.blocked_ns as f64,
            "child {}: {blocked} ns blocked, it blocked {} ns in read alone: {thread}",
            child.pid,
            child.blocked_ns
        );
    }
}

/// Asserts `processes` is exactly `pids`, each named `name`.
fn assert_processes(report: &Report, pids: &BTreeSet<u32>, name: &str, truth: &Truth) {
    let processes = report.processes();
    let want: BTreeMap<u32, String> = pids.iter().map(|&p| (p, name.to_string())).collect();
    assert_eq!(
        processes,
        want,
        "processes[]: the server {} and children {:?}\n{}",
        truth.pid,
        truth.child_pids(),
        report.context()
    );
}

/// A bpftrace script over `program`'s path (every process that runs it, system-wide)
/// counting the server's pair, in all and by process.
fn server_bpftrace(program: &Path) -> Bpftrace {
    let p = program.display();
    let script = format!(
        "BEGIN {{ printf(\"Tracing the server's pairs\\n\"); }}
         usdt:{p}:tracer:gc__begin {{ @begin = count(); @begin_by_pid[pid] = count(); }}
         usdt:{p}:tracer:gc__end {{ @end = count(); }}"
    );
    Bpftrace::start(&["-e", &script])
}

/// Checks bpftrace's counts of a server run: every pair of every process.
fn assert_bpftrace_saw_everything(bt: &BpftraceMaps, truth: &Truth) {
    assert_eq!(
        bt.int("begin"),
        truth.total_pairs,
        "{}\n{}",
        bt.text,
        truth.json
    );
    assert_eq!(
        bt.int("end"),
        truth.total_pairs,
        "{}\n{}",
        bt.text,
        truth.json
    );
    let by_pid = bt.keyed("begin_by_pid");
    for child in &truth.children {
        assert_eq!(
            by_pid.get(&child.pid.to_string()),
            Some(&child.pairs),
            "bpftrace: child {}\n{}",
            child.pid,
            bt.text
        );
    }
}

// ---------------------------------------------------------------------------------------
// --pid --children

#[privileged_test]
fn attach_follows_forked_children_latencies_processes_and_stacks() {
    require_privileged();
    let (n, k) = (3, 5);
    let dir = out_dir("services-children");
    let server = start_server(SERVER, &server_args(n, k, 0, 2, 300));
    let tracer = Running::start(
        TracerRun::attach()
            .pid(server.pid)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .json()
            .out(&dir)
            .args(["--latency", PAIR]),
    );
    server.release();
    let truth = Truth::parse(server.finish());
    let report = tracer.finish_json(&dir);
    assert_eq!(truth.total_pairs, n * k);
    assert_eq!(truth.children.len() as u64, n);

    // With only --pid and --children it stops once the server and its children all exited.
    let stopped_by = report.json["stopped_by"].as_str().unwrap_or("");
    assert!(
        stopped_by.contains("exited"),
        "stopped by {stopped_by:?}, not by the processes' exit\n{}",
        report.context()
    );
    assert_processes(&report, &truth.all_pids(), "forking-server", &truth);
    assert_pairs(&report, &truth, &truth.all_pids(), "forking-server");
    assert_folded_per_process(&report, &truth, "forking-server");
    assert_threads(&report, &truth);
    let _ = std::fs::remove_dir_all(dir);
}

/// A tracer whose own process stalls (stopped here; on a loaded machine, descheduled)
/// from the server's first fork until its children have exited and been reaped reads
/// their stack snapshots only then: their stacks are named from the parent's mappings, of
/// which theirs were a copy.
#[privileged_test]
fn children_gone_before_the_tracer_looked_are_named_from_their_parent() {
    require_privileged();
    let (n, k, block_ms) = (3, 4, 200);
    let dir = out_dir("services-stalled");
    let server = start_server(SERVER, &server_args(n, k, 0, 2, block_ms));
    let tracer = Running::start(
        TracerRun::attach()
            .pid(server.pid)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .json()
            .out(&dir)
            .args(["--latency", PAIR]),
    );
    let tracer_pid = tracer.pid() as i32;
    // SAFETY: kill has no memory preconditions; the tracer is our child, not reaped.
    unsafe { libc::kill(tracer_pid, libc::SIGSTOP) };
    server.release();
    std::thread::sleep(std::time::Duration::from_millis(block_ms + 300));
    // SAFETY: as above.
    unsafe { libc::kill(tracer_pid, libc::SIGCONT) };
    let truth = Truth::parse(server.finish());
    let report = tracer.finish_json(&dir);
    assert_pairs(&report, &truth, &truth.all_pids(), "forking-server");
    assert_folded_per_process(&report, &truth, "forking-server");
    let _ = std::fs::remove_dir_all(dir);
}

/// The forking server and the tracer both in a new PID namespace (as in a container
/// without `--pid=host`): the tracer takes and prints the namespace's PIDs, follows the
/// forks by them, and counts every pair, by process, as the server numbers them.
#[privileged_test]
fn in_a_pid_namespace_of_its_own_a_service_is_traced_by_the_namespaces_pids() {
    require_privileged();
    let dir = out_dir("services-pidns");
    let args = server_args(3, 4, 1, 2, 200).join(" ");
    let script = format!(
        r"set -u
        d={dir}
        {SERVER} {args} --wait-for-signal > $d/server.out &
        s=$!
        until grep -q '^ready' $d/server.out; do sleep 0.02; done
        {tracer} attach --pid $s --children --format json -o $d/attach --latency {PAIR} \
            -d {SAFETY_DURATION} > $d/report.json 2> $d/tracer.err &
        t=$!
        until grep -q '^Attached' $d/tracer.err; do kill -0 $t || exit 1; sleep 0.02; done
        kill -USR1 $s
        wait $s
        wait $t",
        dir = dir.display(),
        tracer = tracer_bin().display(),
    );
    let status = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sh", "-c", &script])
        .status()
        .expect("cannot run unshare");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
    assert!(
        status.success(),
        "the run in a new PID namespace failed ({status})
tracer stderr:
{}",
        read("tracer.err")
    );
    let server_out = read("server.out");
    let truth_line = server_out.lines().last().unwrap_or_default();
    let truth = Truth::parse(
        serde_json::from_str(truth_line).unwrap_or_else(|e| panic!("{e}: {server_out}")),
    );
    let report = Report {
        json: serde_json::from_str(&read("report.json"))
            .unwrap_or_else(|e| panic!("{e}: {}\n{}", read("report.json"), read("tracer.err"))),
        stderr: read("tracer.err"),
        dir: dir.join("attach"),
    };
    // The server is the first process of the namespace after the shell: a small number,
    // not a host PID.
    assert!(
        truth.pid < 100,
        "the server's pid in its namespace: {}",
        truth.pid
    );
    assert_eq!(report.json["pid"], truth.pid, "{}", report.context());
    assert_processes(&report, &truth.all_pids(), "forking-server", &truth);
    assert_pairs(&report, &truth, &truth.all_pids(), "forking-server");
    assert_folded_per_process(&report, &truth, "forking-server");
    assert_threads(&report, &truth);
    let _ = std::fs::remove_dir_all(dir);
}

/// From the host, a server in a PID namespace below (a container's) is traced by its
/// host PIDs, and the report gives each process's PID in its own namespace beside them.
#[privileged_test]
fn from_the_host_processes_in_a_pid_namespace_show_their_namespace_pids() {
    require_privileged();
    let dir = out_dir("services-host-into-ns");
    let mut args = vec!["--pid", "--fork", "--kill-child", SERVER];
    let server_args = server_args(2, 3, 0, 2, 100);
    args.extend(server_args.iter().map(String::as_str));
    args.push("--wait-for-signal");
    let mut unshare = std::process::Command::new("unshare")
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("cannot run unshare");
    let mut stdout = std::io::BufReader::new(unshare.stdout.take().unwrap());
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut ready).unwrap();
    assert_eq!(
        ready.trim(),
        "ready pid=1",
        "the server is its namespace's first process"
    );
    let host_pid = *children_of(unshare.id())
        .iter()
        .next()
        .expect("unshare's child, the server");
    let out = dir.join("attach");
    let tracer = Running::start(
        TracerRun::attach()
            .pid(host_pid)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .json()
            .out(&out),
    );
    // SAFETY: kill has no memory preconditions.
    assert_eq!(unsafe { libc::kill(host_pid as i32, libc::SIGUSR1) }, 0);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let _ = unshare.wait();
    let truth =
        Truth::parse(serde_json::from_str(rest.trim()).unwrap_or_else(|e| panic!("{e}: {rest}")));
    let report = tracer.finish_json(&out);
    let processes = report.json["processes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let server = processes
        .iter()
        .find(|p| p["pid"] == host_pid)
        .unwrap_or_else(|| panic!("the server {host_pid} is not traced\n{}", report.context()));
    assert_eq!(server["namespace_pid"], 1, "{}", report.context());
    // The children, by the PIDs the server saw them with.
    let inner: BTreeSet<u32> = processes
        .iter()
        .filter(|p| p["pid"] != host_pid)
        .filter_map(|p| p["namespace_pid"].as_u64().map(|n| n as u32))
        .collect();
    assert_eq!(inner, truth.child_pids(), "{}", report.context());
    let _ = std::fs::remove_dir_all(dir);
}

/// `tracer profile --pid SERVER --children EXTRA -o DIR` over a run of the server with
/// `server_args`: the server's truth, and the tracer's standard output and error.
fn profile_server(dir: &Path, server_args: &[String], extra: &[&str]) -> (Truth, String, String) {
    let server = start_server(SERVER, server_args);
    let tracer = Running::start(
        TracerRun::profile()
            .pid(server.pid)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .out(dir)
            .args(extra),
    );
    server.release();
    let truth = Truth::parse(server.finish());
    let (ok, out, stderr) = tracer.finish();
    assert!(ok, "tracer profile failed:\n{stderr}\n{out}");
    (truth, out, stderr)
}

#[privileged_test]
fn profile_follows_forked_children() {
    require_privileged();
    let dir = out_dir("services-profile");
    let (truth, out, stderr) = profile_server(&dir, &server_args(2, 3, 0, 2, 300), &[]);
    let report = Report {
        json: Value::Null,
        stderr: format!("{stderr}\nstdout:\n{out}"),
        dir: dir.clone(),
    };
    assert_folded_per_process(&report, &truth, "forking-server");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--group-by name`: the server and its forked children run one program, so every
/// stack is under one root frame, the program's name, and the children's blocked time
/// adds up there.
#[privileged_test]
fn profile_grouped_by_name_puts_a_server_and_its_children_in_one_tower() {
    require_privileged();
    let dir = out_dir("services-profile-by-name");
    let server_args = server_args(3, 2, 0, 2, 300);
    let (truth, _, _) = profile_server(&dir, &server_args, &["--group-by", "name"]);
    let wall = std::fs::read_to_string(dir.join("wallclock.folded")).unwrap();
    let roots: BTreeSet<&str> = wall
        .lines()
        .filter(|l| !l.is_empty())
        .map(root_frame)
        .collect();
    assert_eq!(
        roots,
        BTreeSet::from(["forking-server"]),
        "one tower for the server and its children:\n{wall}"
    );
    let blocked = folded_weight_where(&wall, |stack| {
        has_frame(stack, "forking_server::child_blocks_in_read")
    }) as f64;
    let true_us = truth.children.iter().map(|c| c.blocked_ns).sum::<u64>() as f64 / 1000.0;
    assert!(
        blocked >= 0.8 * true_us && blocked <= 1.2 * true_us,
        "the children blocked {blocked} us in child_blocks_in_read, their clocks say {true_us} us\n{wall}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn trace_count_with_children_counts_what_bpftrace_and_the_server_count() {
    require_privileged();
    // A copy of its own: bpftrace counts by path, every process that runs the file, and
    // other tests run the original at the same time.
    let dir = out_dir("services-count");
    let program = executable_copy(SERVER, &dir);
    let server = start_server(program.to_str().unwrap(), &server_args(4, 6, 3, 1, 50));
    let tracer = Running::start(
        TracerRun::trace()
            .arg("--count")
            .json()
            .pid(server.pid)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .args(["usdt:*:tracer:gc__begin", "usdt:*:tracer:gc__end"]),
    );
    let bpftrace = server_bpftrace(&program);
    server.release();
    let truth = Truth::parse(server.finish());
    let (counts, output) = tracer.finish_counts();
    let bt = bpftrace.stop();
    eprintln!("bpftrace:\n{}\nserver: {}", bt.text, truth.json);

    assert_eq!(truth.total_pairs, 4 * 6 + 3);
    assert_bpftrace_saw_everything(&bt, &truth);
    for probe in [BEGIN, END] {
        assert_eq!(
            counts.get(probe),
            Some(&truth.total_pairs),
            "{probe}: tracer {counts:?}, bpftrace @begin {} @end {}, server {}\n{output}",
            bt.int("begin"),
            bt.int("end"),
            truth.json
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn without_children_only_the_parents_hits_count() {
    require_privileged();
    let dir = out_dir("services-no-children");
    let program = executable_copy(SERVER, &dir);
    let parent_pairs = 3;
    let server = start_server(
        program.to_str().unwrap(),
        &server_args(3, 4, parent_pairs, 1, 100),
    );
    let out = dir.join("attach");
    let attach = Running::start(
        TracerRun::attach()
            .pid(server.pid)
            .duration(SAFETY_DURATION)
            .json()
            .out(&out)
            .args(["--latency", PAIR]),
    );
    let count = Running::start(
        TracerRun::trace()
            .arg("--count")
            .json()
            .pid(server.pid)
            .duration(SAFETY_DURATION)
            .args(["usdt:*:tracer:gc__begin", "usdt:*:tracer:gc__end"]),
    );
    // bpftrace, by path, sees the children fire while the tracers are attached.
    let bpftrace = server_bpftrace(&program);
    server.release();
    let truth = Truth::parse(server.finish());
    let report = attach.finish_json(&out);
    let (counts, output) = count.finish_counts();
    let bt = bpftrace.stop();

    assert_bpftrace_saw_everything(&bt, &truth);
    let server_only = BTreeSet::from([truth.pid]);
    let name = program.file_name().unwrap().to_str().unwrap();
    assert_processes(&report, &server_only, name, &truth);
    assert_pairs(&report, &truth, &server_only, name);
    for probe in [BEGIN, END] {
        assert_eq!(
            counts.get(probe),
            Some(&parent_pairs),
            "{probe}: only the server's own {parent_pairs} pairs, not its children's \
             (bpftrace counted {} in all)\n{output}",
            bt.int("begin")
        );
    }
    for file in ["wallclock.folded", "offcpu.folded"] {
        let folded = report.folded(file);
        assert!(
            !folded.contains("forking_server::child_blocks_in_read"),
            "{file}: a child's stack, without --children\n{folded}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

// ---------------------------------------------------------------------------------------
// Processes started while tracing: --exe, --comm, --cgroup

/// Waits until the tracer has put its probes into process `pid` (breakpoints at the
/// sites, semaphores raised), so the process can be let go without losing a hit.
fn wait_until_traced(pid: u32, tracer: &Running) {
    let sites = ProbeSites::of(pid);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let breakpoints = sites.breakpoints();
        let semaphores = sites.semaphore_values();
        if breakpoints > 0 && semaphores.iter().all(|&v| v > 0) {
            return;
        }
        assert!(
            tracer.is_running(),
            "the tracer exited before it traced process {pid}"
        );
        assert!(
            Instant::now() < deadline,
            "10 s after process {pid} started the tracer has not traced it: {breakpoints} \
             breakpoints, semaphores {semaphores:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `attach SELECT --latency PAIR --format json -o DIR`, then `program` (which no
/// process ran when the tracer attached), calls `place(pid)` (e.g. to move it into a
/// cgroup), waits until it is traced and lets it run; interrupts the tracer once the server
/// exited (these tracers run until interrupted) and returns the report and the truth.
///
/// With `early`, one server is started (and placed) before the tracer and never released:
/// selections by name or cgroup find the probes in the processes that match at the
/// start, so one must. It is in the report's processes, with no pairs; its PID is
/// returned.
fn attach_then_start(
    select: &[&str],
    program: &Path,
    dir: &Path,
    early: bool,
    place: impl Fn(u32),
) -> (Report, Truth, Option<u32>) {
    let early = early.then(|| {
        let server = start_server(program.to_str().unwrap(), &server_args(1, 1, 1, 1, 1));
        place(server.pid);
        server
    });
    let out = dir.join("attach");
    let tracer = Running::start(
        TracerRun::attach()
            .args(select)
            .duration(SAFETY_DURATION)
            .json()
            .out(&out)
            .args(["--latency", PAIR]),
    );
    let server = start_server(program.to_str().unwrap(), &server_args(3, 4, 2, 2, 200));
    place(server.pid);
    wait_until_traced(server.pid, &tracer);
    server.release();
    let truth = Truth::parse(server.finish());
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        tracer.is_running(),
        "with {select:?} the tracer runs until interrupted, also after every process exited"
    );
    tracer.interrupt();
    let report = tracer.finish_json(&out);
    let early_pid = early.map(|server| server.pid);
    (report, truth, early_pid)
}

/// A server started after the tracer, and its children (they run the same executable),
/// are all traced.
fn assert_started_later_traced(report: &Report, truth: &Truth, name: &str, early: Option<u32>) {
    let mut pids = truth.all_pids();
    pids.extend(early);
    assert_processes(report, &pids, name, truth);
    assert_pairs(report, truth, &truth.all_pids(), name);
    assert_threads(report, truth);
}

#[privileged_test]
fn exe_traces_a_server_started_after_the_tracer() {
    require_privileged();
    let dir = out_dir("services-exe");
    let program = executable_copy(SERVER, &dir);
    let (report, truth, early) = attach_then_start(
        &["--exe", program.to_str().unwrap()],
        &program,
        &dir,
        false,
        |_| {},
    );
    assert_started_later_traced(&report, &truth, "forking-server", early);
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn comm_traces_a_server_started_after_the_tracer() {
    require_privileged();
    // A command name of its own (at most 15 bytes, the kernel's comm).
    let dir = out_dir("services-comm");
    let program = executable_copy_as(SERVER, &dir, "fsrv-comm-test");
    let (report, truth, early) =
        attach_then_start(&["--comm", "fsrv-comm-test"], &program, &dir, true, |_| {});
    assert_started_later_traced(&report, &truth, "fsrv-comm-test", early);
    let _ = std::fs::remove_dir_all(dir);
}

fn cgroup_test(hierarchy: &str, name: &str) {
    let dir = out_dir(name);
    let program = executable_copy(SERVER, &dir);
    let cgroup = TestCgroup::create(hierarchy, name);
    let (report, truth, early) = attach_then_start(
        &["--cgroup", cgroup.0.to_str().unwrap()],
        &program,
        &dir,
        true,
        |pid| {
            cgroup.add(pid);
            // A process moved into a cgroup (neither forked nor executed there) joins
            // the targets at the tracer's next look, within 200 ms.
            std::thread::sleep(Duration::from_millis(600));
        },
    );
    assert_started_later_traced(&report, &truth, "forking-server", early);
    drop(cgroup);
    let _ = std::fs::remove_dir_all(dir);
}

#[privileged_test]
fn cgroup_v2_traces_a_server_moved_in_after_the_tracer_started() {
    require_privileged();
    let root = cgroup_v2_root();
    assert!(
        Path::new(root).join("cgroup.procs").exists(),
        "no cgroup v2 hierarchy at {root}"
    );
    cgroup_test(root, "services-cgroup2");
}

#[privileged_test]
fn cgroup_v1_traces_a_server_moved_in_after_the_tracer_started() {
    require_privileged();
    // The pids controller's hierarchy: mounted on every cgroup v1 (and hybrid) system.
    let root = "/sys/fs/cgroup/pids";
    if !Path::new(root).join("cgroup.procs").exists() {
        // A pure cgroup v2 system has no v1 hierarchy: nothing to test.
        eprintln!("skipped: no cgroup v1 hierarchy at {root}");
        return;
    }
    cgroup_test(root, "services-cgroup1");
}

// ---------------------------------------------------------------------------------------
// PostgreSQL 15 and pgbench

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
const POSTGRES: &str = "/usr/lib/postgresql/15/bin/postgres";

/// A throwaway PostgreSQL cluster run by the `postgres` user in a directory of its own
/// (also its socket directory; no TCP), autovacuum off, initialized for pgbench (scale
/// 2). Stopped and removed when dropped, whatever the test did.
struct PgCluster {
    dir: PathBuf,
    started: bool,
}

impl PgCluster {
    fn start(name: &str) -> PgCluster {
        let dir = out_dir(name);
        // SAFETY: getpwnam's argument is a NUL-terminated string; the result is read at
        // once, before any other call that could reuse its buffer.
        let (uid, gid) = unsafe {
            let pw = libc::getpwnam(c"postgres".as_ptr());
            assert!(
                !pw.is_null(),
                "no postgres user: PostgreSQL 15 is not installed"
            );
            ((*pw).pw_uid, (*pw).pw_gid)
        };
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut cluster = PgCluster {
            dir,
            started: false,
        };
        let data = cluster.data();
        cluster.run(
            "initdb",
            &["-D", &data, "-A", "trust", "--no-sync", "-U", "postgres"],
        );
        let options = format!(
            "-k {} -c listen_addresses='' -c autovacuum=off -c fsync=off",
            cluster.dir.display()
        );
        let log = cluster.dir.join("server.log");
        cluster.started = true;
        cluster.run(
            "pg_ctl",
            &[
                "-D",
                &data,
                "-l",
                log.to_str().unwrap(),
                "-o",
                &options,
                "-w",
                "start",
            ],
        );
        cluster.pgbench(&["-i", "-s", "2", "-q"]);
        cluster
    }

    fn data(&self) -> String {
        self.dir.join("data").to_str().unwrap().to_string()
    }

    /// Runs PG_BIN/`program` `args` as the postgres user; returns its stdout.
    fn run(&self, program: &str, args: &[&str]) -> String {
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(Path::new(PG_BIN).join(program))
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program} as postgres: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed ({}):\n{}\n{}\nserver log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn pgbench(&self, args: &[&str]) -> String {
        let dir = self.dir.to_str().unwrap().to_string();
        let mut all = vec!["-h", &dir];
        all.extend_from_slice(args);
        all.push("postgres");
        self.run("pgbench", &all)
    }

    /// The postmaster's pid (the first line of postmaster.pid).
    fn postmaster(&self) -> u32 {
        let file = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).unwrap();
        file.lines().next().unwrap().trim().parse().unwrap()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.started {
            let _ = Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(Path::new(PG_BIN).join("pg_ctl"))
                .args(["-D", &self.data(), "-m", "immediate", "-w", "stop"])
                .current_dir(&self.dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The children of process `pid`.
fn children_of(pid: u32) -> BTreeSet<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[privileged_test]
fn postgresql_backends_forked_after_attach_are_traced_like_bpftrace_and_pgbench_count() {
    require_privileged();
    const CLIENTS: u64 = 4;
    let cluster = PgCluster::start("services-pg");
    let postmaster = cluster.postmaster();
    // The checkpointer, background writer, walwriter, ...: none of them start transactions.
    let background = children_of(postmaster);
    let dir = cluster.dir.join("attach");
    std::fs::create_dir(&dir).unwrap();
    let tracer = Running::start(
        TracerRun::attach()
            .pid(postmaster)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .json()
            .out(&dir)
            .args([
                "--latency",
                "postgresql:transaction__start,postgresql:transaction__commit",
            ]),
    );
    let count = Running::start(
        TracerRun::trace()
            .arg("--count")
            .json()
            .pid(postmaster)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .arg("usdt:*:postgresql:transaction__start"),
    );
    // bpftrace over the binary, counting only this cluster's processes (the postmaster's
    // children: every backend is one); `@all` counts every postgres on the machine.
    let script = format!(
        "BEGIN {{ printf(\"Tracing transactions\\n\"); }}
         usdt:{POSTGRES}:postgresql:transaction__start {{
             @all = count();
             if (curtask->real_parent->tgid == {postmaster}) {{
                 @start = count(); @start_by_pid[pid] = count();
             }}
         }}
         usdt:{POSTGRES}:postgresql:transaction__commit /curtask->real_parent->tgid == {postmaster}/ {{
             @commit = count(); @commit_by_pid[pid] = count();
         }}
         usdt:{POSTGRES}:postgresql:transaction__abort /curtask->real_parent->tgid == {postmaster}/ {{
             @abort = count();
         }}"
    );
    let bpftrace = Bpftrace::start(&["-e", &script]);

    // The backends are forked now, after both attached: one per client, and one for
    // pgbench's own first connection.
    let clients = CLIENTS.to_string();
    let pgbench = cluster.pgbench(&["-n", "-c", &clients, "-j", "2", "-T", "3"]);
    let processed: u64 = pgbench
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|n| n.split('/').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no processed count from pgbench:\n{pgbench}"));
    // The backends exit after pgbench disconnects: wait for them, then stop both.
    let deadline = Instant::now() + Duration::from_secs(5);
    while children_of(postmaster) != background && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    tracer.interrupt();
    count.interrupt();
    let report = tracer.finish_json(&dir);
    // Its counts are read after bpftrace's and pgbench's are checked.
    let (count_ok, count_out, count_err) = count.finish();
    let bt = bpftrace.stop();
    eprintln!(
        "pgbench: {processed} transactions processed with {CLIENTS} clients\nbpftrace:\n{}",
        bt.text
    );
    let ctx = || {
        format!(
            "pgbench:\n{pgbench}\nbpftrace:\n{}\n{}",
            bt.text,
            report.context()
        )
    };

    // What bpftrace saw: every backend starts one transaction as it starts (InitPostgres
    // reads the catalogs in one), then pgbench's: so each client's backend starts its
    // share of `processed` plus one, and pgbench's first connection (its startup, and the
    // two queries pgbench asks before the run: the scale and the partitioning of
    // pgbench_accounts) starts 3. All of them commit.
    let starts = bt.int("start");
    assert_eq!(
        starts,
        processed + CLIENTS + 3,
        "transaction__start by bpftrace = pgbench's processed {processed} + {CLIENTS} \
         clients + 3\n{}",
        ctx()
    );
    assert_eq!(bt.int("commit"), starts, "{}", ctx());
    let backends = bt.keyed("start_by_pid");
    assert_eq!(
        backends.len() as u64,
        CLIENTS + 1,
        "one backend per client and pgbench's first\n{}",
        ctx()
    );
    assert_eq!(
        backends.values().filter(|&&n| n == 3).count(),
        1,
        "pgbench's first connection\n{}",
        ctx()
    );

    // The tracer saw the same, in the same processes.
    assert_eq!(
        report.hits("postgresql:transaction__start"),
        starts,
        "tracer's transaction__start hits, bpftrace's count\n{}",
        ctx()
    );
    let count_output = format!("trace --count stdout:\n{count_out}\nstderr:\n{count_err}");
    assert!(count_ok, "tracer trace failed\n{count_output}");
    let counts = trace_counts(&count_out);
    assert_eq!(
        counts.get("postgresql:transaction__start"),
        Some(&starts),
        "trace --count --children, bpftrace's count\n{count_output}\n{}",
        ctx()
    );
    assert_eq!(
        report.hits("postgresql:transaction__commit"),
        bt.int("commit"),
        "{}",
        ctx()
    );
    let processes = report.processes();
    assert!(
        processes.contains_key(&postmaster),
        "the postmaster {postmaster}\n{}",
        ctx()
    );
    // Each client's backend is named by the title it gives itself, as ps shows it.
    // pgbench's first connection lives a few milliseconds: the tracer may first see it
    // after it has exited, and then names it by the kernel's name for it.
    for (pid, &transactions) in &backends {
        let pid: u32 = pid.parse().unwrap();
        let name = processes.get(&pid);
        let titled = name.is_some_and(|name| name.starts_with("postgres: "));
        let short_lived = transactions == 3 && name.is_some_and(|name| name == "postgres");
        assert!(
            titled || short_lived,
            "backend {pid} is among the processes, by its title: {name:?}\n{}",
            ctx()
        );
    }
    let commits_by_pid = bt.keyed("commit_by_pid");
    for (name, latency) in report.latencies(
        "postgresql:transaction__start",
        "postgresql:transaction__commit",
    ) {
        // Every transaction begins and commits on its backend's one thread.
        assert_eq!(latency["count"], starts, "latency {name}\n{}", ctx());
        let per = report.per_process(&name, latency);
        for (pid, commits) in &commits_by_pid {
            let pid: u32 = pid.parse().unwrap();
            assert_eq!(
                per.get(&pid).map(|p| p.count),
                Some(*commits),
                "latency {name}: backend {pid}\n{}",
                ctx()
            );
        }
        assert_eq!(
            per.values().map(|p| p.count).sum::<u64>(),
            starts,
            "latency {name}: per_process adds up\n{}",
            ctx()
        );
    }
    assert_eq!(report.json["lost"]["unmatched_ends"], 0, "{}", ctx());
}

#[privileged_test]
fn postgresql_query_texts_are_what_psql_sent_and_what_bpftrace_reads() {
    require_privileged();
    let cluster = PgCluster::start("services-pg-str");
    let postmaster = cluster.postmaster();
    // Each shorter than bpftrace's 63 bytes but the last, which both cut.
    let long = format!("SELECT '{}' AS long_text", "x".repeat(80));
    let queries = [
        "SELECT 1 AS one",
        "CREATE TABLE str_test (t text)",
        "INSERT INTO str_test VALUES ('it''s', E'tab\\there')",
        "SELECT count(*) FROM str_test WHERE t LIKE '%s'",
        "SELECT 'naïve' AS \"quoted\"",
        &long,
    ];
    let tracer = Running::start(
        TracerRun::trace()
            .json()
            .pid(postmaster)
            .arg("--children")
            .duration(SAFETY_DURATION)
            .args([
                "--str",
                "query__start:arg0",
                "usdt:*:postgresql:query__start",
            ]),
    );
    // Only this cluster's backends: the postmaster's children.
    let script = format!(
        "BEGIN {{ printf(\"Tracing\\n\"); }}
         usdt:{POSTGRES}:postgresql:query__start /curtask->real_parent->tgid == {postmaster}/ {{
             printf(\"Q:%s\\n\", str(arg0));
         }}"
    );
    let bpftrace = Bpftrace::start(&["-e", &script]);
    let dir = cluster.dir.to_str().unwrap().to_string();
    let mut psql = vec!["-h", &dir, "-X", "-q", "-d", "postgres"];
    for query in &queries {
        psql.extend_from_slice(&["-c", query]);
    }
    cluster.run("psql", &psql);
    // bpftrace prints as it goes; the tracer too, but both are read at their end.
    std::thread::sleep(Duration::from_millis(500));
    let bt = bpftrace.stop();
    tracer.interrupt();
    let (ok, out, stderr) = tracer.finish();
    assert!(ok, "{stderr}\n{out}");
    let ours: Vec<(String, bool)> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .map(|event| {
            let s = &event["strings"]["arg0"];
            assert!(s["hex"].is_null(), "valid UTF-8: {event}");
            (
                s["text"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{event}"))
                    .to_string(),
                s["truncated"].as_bool().unwrap(),
            )
        })
        .collect();
    // 64 bytes at most (the default), the long one cut and marked.
    let expected: Vec<(String, bool)> = queries
        .iter()
        .map(|q| (q[..q.len().min(64)].to_string(), q.len() > 64))
        .collect();
    assert_eq!(ours, expected, "{stderr}");
    // bpftrace's 64 bytes include the NUL: 63 of text.
    let theirs: Vec<&str> = bt
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("Q:"))
        .collect();
    let ours_63: Vec<&str> = ours
        .iter()
        .map(|(text, _)| &text[..text.len().min(63)])
        .collect();
    assert_eq!(theirs, ours_63, "bpftrace:\n{}", bt.text);
}
