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

mod children;
mod postgres;
mod started_later;

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

/// The children of process `pid`.
fn children_of(pid: u32) -> BTreeSet<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}
