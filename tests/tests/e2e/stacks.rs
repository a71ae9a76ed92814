//! `tracer stacks --pid`: what each thread of `blocked-threads` is doing, without stopping
//! it: threads blocked in futex (a lock held for good), clock_nanosleep and read (a pipe
//! nobody writes), each named with its state and system call, its kernel stack, and its
//! user stack from the function it blocks in down to the thread's start; as text and as
//! JSON. The target is never stopped (its spinning thread keeps running), and a missing
//! process or privilege is an error, not a panic.

use std::{
    collections::HashMap,
    os::unix::process::CommandExt as _,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::common::*;
use serde_json::Value;

const BLOCKED_THREADS: &str = env!("CARGO_BIN_EXE_blocked-threads");

/// (thread name, state, system call names accepted, function it blocks in).
const BLOCKED: [(&str, &str, &[&str], &str); 3] = [
    ("futex-waiter", "sleeping", &["futex"], "block_in_futex"),
    (
        "sleeper",
        "sleeping",
        &["clock_nanosleep", "nanosleep"],
        "block_in_nanosleep",
    ),
    ("pipe-reader", "sleeping", &["read"], "block_in_read"),
];

/// System call numbers (x86-64) of each blocked thread's call, to wait for.
fn syscall_nrs(name: &str) -> &'static [&'static str] {
    match name {
        "futex-waiter" => &["202"],
        "sleeper" => &["230", "35"],
        "pipe-reader" => &["0"],
        _ => &[],
    }
}

/// A running `blocked-threads` whose threads are all blocked, and their ids by name.
struct Blocked {
    target: Target,
    tids: HashMap<String, u32>,
    /// When the threads were all in their system calls.
    blocked_at: Instant,
    /// Each CPU's time not on the scheduler's task clock then.
    off_task_clock_at: Vec<Duration>,
}

/// Each CPU's time that the scheduler's task clock leaves out so far (`se.exec_start`
/// runs on it): what the hypervisor stole (steal) and what interrupts took (irq, softirq),
/// from /proc/stat, in USER_HZ ticks.
fn off_task_clock() -> Vec<Duration> {
    // SAFETY: sysconf has no preconditions.
    let tick_ns = 1_000_000_000 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    std::fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|line| {
            let ticks: Vec<u64> = line
                .split_whitespace()
                .skip(1)
                .map(|n| n.parse().unwrap())
                .collect();
            // user nice system idle iowait irq softirq steal
            Duration::from_nanos((ticks[5] + ticks[6] + ticks[7]) * tick_ns)
        })
        .collect()
}

impl Blocked {
    /// The least time since a blocked thread last ran that `tracer stacks` may report now,
    /// `waited` after [`start_blocked`] returned. The figure is on the scheduler's task
    /// clock: short of the wall clock by what that left out meanwhile (steal, interrupts;
    /// a CI run on a disturbed machine saw 0.40 s where 0.5 s had passed), less 10 ms for
    /// /proc/stat's tick and 50 ms to spare.
    fn least_reported(&self, waited: Duration) -> Duration {
        let left_out = off_task_clock()
            .iter()
            .zip(&self.off_task_clock_at)
            .map(|(now, then)| now.saturating_sub(*then))
            .max()
            .unwrap();
        waited.saturating_sub(left_out + Duration::from_millis(60))
    }
}

fn start_blocked() -> Blocked {
    let mut target = Target::start(BLOCKED_THREADS, &["--seconds", "120"]);
    target.release();
    let line = target.read_line();
    let info: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    let tids: HashMap<String, u32> = info["tids"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, tid)| (name.clone(), tid.as_u64().unwrap() as u32))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    for (name, ..) in BLOCKED {
        let path = format!("/proc/{}/task/{}/syscall", target.pid, tids[name]);
        loop {
            let line = std::fs::read_to_string(&path).unwrap_or_default();
            let nr = line.split(' ').next().unwrap_or("");
            if syscall_nrs(name).contains(&nr) {
                break;
            }
            assert!(Instant::now() < deadline, "{name} never blocked: {line:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Blocked {
        target,
        tids,
        blocked_at: Instant::now(),
        off_task_clock_at: off_task_clock(),
    }
}

fn stacks(pid: u32, extra: &[&str]) -> (String, String) {
    let pid = pid.to_string();
    let out = run_tracer(&[&["stacks", "--pid", &pid], extra].concat());
    let stdout = out.stdout.clone();
    let stderr = out.stderr.clone();
    assert!(
        out.status.success(),
        "tracer stacks failed: {stderr}\n{stdout}"
    );
    (stdout, stderr)
}

/// The text output's section of thread `tid`: its line and its frames.
fn text_section(text: &str, tid: u32) -> (String, Vec<String>) {
    let head = format!("Thread {tid} ");
    let mut lines = text.lines().skip_while(|l| !l.starts_with(&head));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no {head:?} in {text}"))
        .to_string();
    let frames = lines
        .take_while(|l| l.starts_with("    "))
        .map(|l| l.trim().to_string())
        .collect();
    (first, frames)
}

/// Asserts what a blocked thread's frames must hold: kernel frames first, then user
/// frames with `function` in them, down to the start of a thread.
fn assert_frames(name: &str, kernel: &[String], user: &[String], function: &str) {
    assert!(!kernel.is_empty(), "{name}: no kernel stack");
    assert!(
        kernel.iter().all(|f| f.ends_with("_[k]")),
        "{name}: {kernel:?}"
    );
    let at = user
        .iter()
        .position(|f| f.ends_with(&format!("::{function}")))
        .unwrap_or_else(|| panic!("{name}: no {function} in {user:#?}"));
    assert!(
        at > 0,
        "{name}: {function} is the innermost frame: {user:?}"
    );
    let outer = &user[at..];
    assert!(
        outer
            .iter()
            .any(|f| f == "start_thread" || f.starts_with("clone")),
        "{name}: does not reach start_thread/clone: {user:#?}"
    );
}

#[privileged_test]
fn text_names_each_thread_its_state_syscall_and_stacks() {
    require_privileged();
    let blocked = start_blocked();
    std::thread::sleep(Duration::from_millis(500));
    let (text, stderr) = stacks(blocked.target.pid, &[]);
    let elapsed = blocked.blocked_at.elapsed();
    let at_least = blocked.least_reported(Duration::from_millis(500));
    assert!(
        !stderr.contains("frame pointers"),
        "frame pointers were not read: {stderr}"
    );
    assert!(
        text.starts_with(&format!(
            "Process {} \"blocked-threads\": 6 threads\n",
            blocked.target.pid
        )),
        "{text}"
    );
    for (name, state, syscalls, function) in BLOCKED {
        let (line, frames) = text_section(&text, blocked.tids[name]);
        let prefix = format!("Thread {} \"{name}\": {state} in ", blocked.tids[name]);
        let rest = line
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{line:?} is not {prefix:?}..."));
        let (syscall, since) = rest.split_once(" for ").unwrap();
        assert!(syscalls.contains(&syscall), "{line}");
        // Blocked since before `blocked_at`, and at most since the JSON line was read.
        let seconds = parse_seconds(since);
        assert!(
            seconds >= at_least.as_secs_f64() && seconds < elapsed.as_secs_f64() + 2.0,
            "{line}: blocked {since}, expected {at_least:?} to {elapsed:?}"
        );
        let kernel: Vec<String> = frames
            .iter()
            .take_while(|f| f.ends_with("_[k]"))
            .cloned()
            .collect();
        assert_frames(name, &kernel, &frames[kernel.len()..], function);
    }
    // The main thread sleeps in main.
    let (line, frames) = text_section(&text, blocked.target.pid);
    assert!(
        line.contains("\"blocked-threads\": sleeping in clock_nanosleep for "),
        "{line}"
    );
    assert!(
        frames.iter().any(|f| f == "blocked_threads::main"),
        "{frames:#?}"
    );
    assert!(frames.iter().any(|f| f == "main"), "{frames:#?}");
    // The spinner is on a CPU or waiting for one.
    let (line, _) = text_section(&text, blocked.tids["spinner"]);
    assert!(
        line.contains("\"spinner\": running") || line.contains("\"spinner\": runnable"),
        "{line}"
    );
}

/// `3.20s`, `850ms`, `12.5us` in seconds.
fn parse_seconds(text: &str) -> f64 {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().unwrap_or_else(|_| panic!("{text:?}"));
    number
        * match unit {
            "s" => 1.0,
            "ms" => 1e-3,
            "us" => 1e-6,
            "ns" => 1e-9,
            _ => panic!("unit of {text:?}"),
        }
}

#[privileged_test]
fn json_names_each_thread_its_state_syscall_and_stacks() {
    require_privileged();
    let blocked = start_blocked();
    std::thread::sleep(Duration::from_millis(500));
    let (out, _) = stacks(blocked.target.pid, &["--format", "json"]);
    let elapsed = blocked.blocked_at.elapsed();
    let at_least = blocked.least_reported(Duration::from_millis(500));
    let json: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
    assert_eq!(json["pid"], blocked.target.pid);
    assert_eq!(json["process"], "blocked-threads");
    let threads = json["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 6, "{json:#}");
    assert_eq!(threads[0]["tid"], blocked.target.pid, "main thread first");
    let by_name = |name: &str| {
        threads
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no thread {name} in {json:#}"))
    };
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_string())
            .collect()
    };
    for (name, state, syscalls, function) in BLOCKED {
        let thread = by_name(name);
        assert_eq!(thread["tid"], blocked.tids[name]);
        assert_eq!(thread["state"], state, "{thread:#}");
        let syscall = thread["syscall"].as_str().unwrap();
        assert!(syscalls.contains(&syscall), "{thread:#}");
        let since = thread["since_last_ran_ns"].as_u64().unwrap();
        assert!(
            since >= at_least.as_nanos() as u64
                && since < (elapsed.as_nanos() as u64 + 2_000_000_000),
            "{name}: blocked {since} ns, expected {at_least:?} to {elapsed:?}"
        );
        assert_eq!(thread["user_stack_truncated"], false);
        assert_frames(
            name,
            &strings(&thread["kernel_stack"]),
            &strings(&thread["user_stack"]),
            function,
        );
    }
    let spinner = by_name("spinner");
    assert!(
        spinner["state"] == "running" || spinner["state"] == "runnable",
        "{spinner:#}"
    );
    assert_eq!(spinner["syscall"], Value::Null);
}

/// CPU time of a thread so far, in ns.
fn cpu_time_ns(pid: u32, tid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).unwrap();
    text.split(' ').next().unwrap().parse().unwrap()
}

#[privileged_test]
fn never_stops_the_target() {
    require_privileged();
    let blocked = start_blocked();
    let pid = blocked.target.pid;
    let tids: Vec<u32> = blocked.tids.values().copied().chain([pid]).collect();
    // Every thread's state, read over and over while the tracer runs: never stopped
    // (`T`) nor in a tracing stop (`t`), as a debugger's or ptrace-based tool's would be.
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let done = Arc::clone(&done);
        let tids = tids.clone();
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !done.load(Ordering::Relaxed) {
                for tid in &tids {
                    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
                        .unwrap_or_default();
                    let state = stat.rsplit_once(") ").map(|(_, rest)| &rest[..1]);
                    assert!(
                        !matches!(state, Some("t" | "T")),
                        "thread {tid} stopped: {stat}"
                    );
                    reads += 1;
                }
            }
            reads
        })
    };
    let spinner = blocked.tids["spinner"];
    let (cpu_before, wall) = (cpu_time_ns(pid, spinner), Instant::now());
    for _ in 0..5 {
        stacks(pid, &[]);
    }
    let (cpu, wall) = (cpu_time_ns(pid, spinner) - cpu_before, wall.elapsed());
    done.store(true, Ordering::Relaxed);
    let reads = watcher
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    assert!(
        reads > 100,
        "the watcher read the states {reads} times only"
    );
    // Two CPUs, shared with the tracer and this test: the spinner still got a good part
    // of the wall time.
    assert!(
        cpu as f64 > wall.as_nanos() as f64 * 0.2,
        "the spinner ran {cpu} ns in {wall:?}"
    );
    // And its threads are still where they were.
    for (name, ..) in BLOCKED {
        let line =
            std::fs::read_to_string(format!("/proc/{pid}/task/{}/syscall", blocked.tids[name]))
                .unwrap();
        let nr = line.split(' ').next().unwrap();
        assert!(syscall_nrs(name).contains(&nr), "{name}: {line}");
    }
}

#[privileged_test]
fn a_missing_process_or_privilege_is_an_error() {
    require_privileged();
    // No such process (a child that exited and was reaped).
    let mut child = Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let out = run_tracer(&["stacks", "--pid", &child.id().to_string()]);
    let stderr = out.stderr.as_str();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no such process"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // Not root: the registers, memory and kernel stacks of another user's process.
    let blocked = start_blocked();
    let out = Command::new(tracer_bin())
        .args(["stacks", "--pid", &blocked.target.pid.to_string()])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("permission denied"), "{stderr}");
    assert!(stderr.contains("root"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // PID 0 is refused by the command line.
    let out = run_tracer(&["stacks", "--pid", "0"]);
    assert_eq!(out.status.code(), Some(1));
}

/// Threads blocked before tracing starts and still blocked at its end (a mutex waiter, a
/// sleeper, a reader of a pipe nobody writes) never run while traced: `profile` and
/// `attach` alike put their whole time under the function each is blocked in, with its
/// stack down to the thread's start, as read from /proc at the start; the spinner's time
/// is on CPU; and both commands give the same totals for the same process.
#[privileged_test]
fn threads_blocked_throughout_are_profiled_under_their_real_stacks() {
    require_privileged();
    let blocked = start_blocked();
    let pid = blocked.target.pid.to_string();
    let mut totals = Vec::new();
    for command in ["profile", "attach"] {
        let dir = out_dir(&format!("blocked-throughout-{command}"));
        let mut args = vec![
            command,
            "--pid",
            &pid,
            "-d",
            "2s",
            "-o",
            dir.to_str().unwrap(),
        ];
        if command == "attach" {
            args.extend(["--format", "json"]);
        }
        let out = run_tracer(&args);
        let err = out.stderr.as_str();
        let stdout = out.stdout.as_str();
        assert!(out.status.success(), "{command}: {err}");
        // Each thread's time, split, by its name and decimal id.
        let split: Vec<(String, u64, u64, u64)> = if command == "attach" {
            let report: Value = serde_json::from_str(stdout).unwrap();
            report["threads"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    let ns = |f: &str| t[f].as_u64().unwrap();
                    let name = t["name"].as_str().unwrap_or("?").to_string();
                    (name, ns("oncpu_ns"), ns("blocked_ns"), ns("runnable_ns"))
                })
                .collect()
        } else {
            let table = stdout
                .split_once("busiest (most time on a CPU or waiting for one):\n")
                .unwrap()
                .1;
            table
                .lines()
                .skip(1)
                .take_while(|l| !l.starts_with("Nothing lost") && !l.starts_with("Lost"))
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let ns = |s: &str| {
                        s.trim_end_matches('s')
                            .parse::<f64>()
                            .ok()
                            .map(|secs| (secs * 1e9) as u64)
                    };
                    Some((f[1].to_string(), ns(f[3])?, ns(f[4])?, ns(f[5])?))
                })
                .collect()
        };
        let thread = |name: &str| {
            split
                .iter()
                .find(|t| t.0 == name)
                .unwrap_or_else(|| panic!("{command}: no thread {name} in {split:?}\n{stdout}"))
        };
        for name in ["futex-waiter", "sleeper", "pipe-reader"] {
            let (_, oncpu, blocked, _) = thread(name);
            assert!(
                *oncpu == 0 && *blocked > 1_800_000_000,
                "{command}: {name} {split:?}"
            );
        }
        // The spinner never blocks: on CPU, or preempted on a busy machine.
        let (_, oncpu, blocked, runnable) = thread("spinner");
        assert!(
            oncpu + runnable > 1_800_000_000 && *oncpu > 500_000_000 && *blocked == 0,
            "{command}: spinner {split:?}"
        );
        let wall = std::fs::read_to_string(dir.join("wallclock.folded")).unwrap();
        let traced_us = 2_000_000.0;
        for function in [
            "blocked_threads::block_in_futex",
            "blocked_threads::block_in_nanosleep",
            "blocked_threads::block_in_read",
            "blocked_threads::spin_forever",
        ] {
            let weight = folded_weight_where(&wall, |stack| stack.contains(function));
            let from_start = folded_weight_where(&wall, |stack| {
                stack.contains(function) && stack.contains("start_thread")
            });
            assert!(
                (weight as f64 - traced_us).abs() <= 0.1 * traced_us,
                "{command}: {function} has {weight} us of {traced_us} us\n{wall}"
            );
            assert!(
                from_start as f64 >= 0.95 * weight as f64,
                "{command}: {function}: {from_start} of {weight} us reach start_thread\n{wall}"
            );
        }
        // The blocked ones under the kernel path they block in, ending in [off-cpu].
        let futex = folded_weight_where(&wall, |stack| {
            stack.contains("block_in_futex")
                && stack.contains("futex_wait")
                && stack.ends_with(";[off-cpu]")
        });
        assert!(
            futex as f64 >= 0.9 * traced_us,
            "{command}: {futex} us\n{wall}"
        );
        let unknown = folded_weight_where(&wall, |stack| {
            stack.contains("[blocked since before profiling started]")
        });
        let total = folded_weight_where(&wall, |_| true);
        assert!(
            unknown * 20 <= total,
            "{command}: {unknown} of {total} us unknown\n{wall}"
        );
        totals.push(total);
    }
    let (profile, attach) = (totals[0] as f64, totals[1] as f64);
    assert!(
        (profile - attach).abs() <= 0.05 * profile,
        "profile {profile} us, attach {attach} us"
    );
}
