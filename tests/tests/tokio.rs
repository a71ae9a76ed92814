//! `tracer attach` on a tokio program with the probes of the `tokio-dtrace` crate:
//! provider `tokio`, a task's id and spawn location (file, line, column) at every task
//! probe, and the worker threads' start, park, unpark and stop, through the `usdt` crate.
//!
//! tokio-dtrace 0.1.1 builds its probes with usdt 0.5, which emits no probe on Linux
//! (SystemTap notes came with usdt 0.6), so the program defines the same provider with
//! usdt 0.6 and registers the same hooks; once tokio-dtrace moves to usdt 0.6 the crate
//! itself gives these notes.

mod common;

use common::*;

/// A tokio program emitting tokio-dtrace's probes. On a two-worker runtime: `blocker`
/// polls ROUNDS + 1 times, sleeping in `std::thread::sleep` for SLEEP_MS inside the async
/// fn at each of the first ROUNDS polls (blocking its worker: the mistake to find);
/// `ticker` waits on a tokio timer TICKS times (parked). Every task's future counts its
/// own polls. Its truth, one JSON line: each task's id, spawn location, polls, and the
/// time it slept blocking its worker.
const TOKIO_DTRACE_MAIN: &str = r##"
use std::{
    future::Future,
    io::BufRead as _,
    panic::Location,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use tokio::runtime::TaskMeta;

const ROUNDS: u64 = 12;
const SLEEP_MS: u64 = 15;
const TICKS: u64 = 20;

// tokio-dtrace's provider: the same probes, the same arguments.
#[usdt::provider(provider = "tokio")]
mod probes {
    fn task__spawn(task_id: u64, file: String, line: u32, col: u32) {}
    fn task__poll__start(task_id: u64, file: String, line: u32, col: u32) {}
    fn task__poll__end(task_id: u64, file: String, line: u32, col: u32) {}
    fn task__terminate(task_id: u64, file: String, line: u32, col: u32) {}
    fn worker__thread__start() {}
    fn worker__thread__stop() {}
    fn worker__thread__park() {}
    fn worker__thread__unpark() {}
}

fn meta_args(meta: &TaskMeta<'_>) -> (u64, String, u32, u32) {
    let at = meta.spawned_at();
    let id = meta.id().to_string().parse().unwrap();
    (id, at.file().to_string(), at.line(), at.column())
}

/// A future that counts its polls.
struct Counted<F> {
    inner: Pin<Box<F>>,
    polls: Arc<AtomicU64>,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.as_mut().poll(cx)
    }
}

/// Spawns `future` counting its polls; tokio sees the caller as the spawn location.
#[track_caller]
fn spawn_counted<F>(future: F) -> (tokio::task::JoinHandle<F::Output>, Arc<AtomicU64>, String)
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let at = Location::caller();
    let polls = Arc::new(AtomicU64::new(0));
    let handle = tokio::spawn(Counted {
        inner: Box::pin(future),
        polls: polls.clone(),
    });
    (handle, polls, format!("{}:{}:{}", at.file(), at.line(), at.column()))
}

/// Blocks its worker thread in a system call, as a handler calling blocking code does.
#[inline(never)]
async fn blocking_handler() -> u64 {
    let mut slept = 0;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(SLEEP_MS));
        slept += start.elapsed().as_nanos() as u64;
        tokio::task::yield_now().await;
    }
    slept
}

#[inline(never)]
async fn ticker() -> u64 {
    for _ in 0..TICKS {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    0
}

fn main() {
    usdt::register_probes().unwrap();
    println!("ready pid={}", std::process::id());
    std::io::stdin().lock().read_line(&mut String::new()).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .on_task_spawn(|meta| probes::task__spawn!(|| meta_args(meta)))
        .on_before_task_poll(|meta| probes::task__poll__start!(|| meta_args(meta)))
        .on_after_task_poll(|meta| probes::task__poll__end!(|| meta_args(meta)))
        .on_task_terminate(|meta| probes::task__terminate!(|| meta_args(meta)))
        .on_thread_start(|| probes::worker__thread__start!(|| ()))
        .on_thread_stop(|| probes::worker__thread__stop!(|| ()))
        .on_thread_park(|| probes::worker__thread__park!(|| ()))
        .on_thread_unpark(|| probes::worker__thread__unpark!(|| ()))
        .build()
        .unwrap();
    let tasks = runtime.block_on(async {
        let spawned = [
            ("blocker", spawn_counted(blocking_handler())),
            ("ticker", spawn_counted(ticker())),
        ];
        let mut tasks = Vec::new();
        for (name, (handle, polls, location)) in spawned {
            let id = handle.id();
            let slept = handle.await.unwrap();
            tasks.push(format!(
                r#"{{"name":"{name}","id":{id},"location":"{location}","polls":{},"slept_ns":{slept}}}"#,
                polls.load(Ordering::Relaxed)
            ));
        }
        tasks
    });
    drop(runtime);
    println!(r#"{{"tasks":[{}]}}"#, tasks.join(","));
}
"##;

/// Builds the program (see [`build_side_project`]).
fn build_tokio_dtrace_target() -> std::path::PathBuf {
    build_side_project(
        "tokio-dtrace-probes",
        r#"tokio = { version = "1.54", default-features = false, features = ["rt", "rt-multi-thread", "time"] }
usdt = "0.6"
"#,
        TOKIO_DTRACE_MAIN,
    )
}

/// Each task of a tokio program with tokio-dtrace's probes is named by its spawn
/// location, with as many runs and parks as its future counted polls; the one calling
/// `std::thread::sleep` in an async fn blocked its worker for the time it slept (within
/// 10%), under that sleep; the timer task was parked meanwhile; every poll is in the
/// `task_poll` latency, and the workers' parks in `worker_park`.
#[test]
#[ignore = "needs root and BPF: run as root with --include-ignored (cargo xtask test does)"]
fn tokio_tasks_are_named_by_spawn_location_with_their_blocking_stack() {
    require_privileged();
    let binary = build_tokio_dtrace_target();
    let target = StdinTarget::start(&mut std::process::Command::new(&binary));
    let pid = target.pid.to_string();
    let dir = out_dir("tokio-dtrace");
    let tracer = Tracer::start(&[
        "attach",
        "--pid",
        &pid,
        "--format",
        "json",
        "-o",
        dir.to_str().unwrap(),
    ]);
    let out = target.release_and_finish();
    let (ok, report, err) = tracer.finish();
    assert!(ok, "{err}");
    assert!(err.contains("of tokio"), "{err}");
    let report: serde_json::Value =
        serde_json::from_str(&report).unwrap_or_else(|e| panic!("{e}: {report}"));
    let truth: serde_json::Value = out
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no truth line: {out}"));
    let tasks = report["tasks"]["list"]
        .as_array()
        .unwrap_or_else(|| panic!("{report:#}"));
    let mut total_polls = 0;
    for truth in truth["tasks"].as_array().unwrap() {
        let id = truth["id"].as_u64().unwrap();
        let location = truth["location"].as_str().unwrap();
        let polls = truth["polls"].as_u64().unwrap();
        total_polls += polls;
        let task = tasks
            .iter()
            .find(|t| t["task"] == id)
            .unwrap_or_else(|| panic!("task {id} missing: {report:#}"));
        assert_eq!(task["given_name"], location, "{task}");
        assert_eq!(task["name"], format!("task {location} (#{id})"), "{task}");
        assert_eq!(task["runs"], polls, "task {location}: polls {task}");
        // Parked between polls; the last poll ends it.
        assert_eq!(task["parks"].as_u64().unwrap(), polls - 1, "{task}");
        eprintln!(
            "tokio task {location} (#{id}): {polls} polls; running {} ns, blocked {} ns (slept {} ns), parked {} ns",
            task["running_ns"], task["blocked_ns"], truth["slept_ns"], task["parked_ns"]
        );
        if truth["name"] == "blocker" {
            let (blocked, slept) = (
                task["blocked_ns"].as_u64().unwrap(),
                truth["slept_ns"].as_u64().unwrap(),
            );
            assert!(
                blocked.abs_diff(slept) as f64 <= 0.1 * slept as f64,
                "blocked {blocked} ns, slept {slept} ns"
            );
            // Its longest poll holds one whole sleep.
            let longest = task["longest_run_ns"].as_u64().unwrap();
            assert!(
                longest >= 15_000_000 && longest < slept,
                "longest poll {longest} ns"
            );
            let stack = task["longest_block"]["stack"].to_string();
            assert!(
                stack.contains("std::thread::functions::sleep")
                    && stack.contains("blocking_handler"),
                "{stack}"
            );
        } else {
            // Ten-millisecond timers: parked nearly all of the time.
            assert!(task["parked_ns"].as_u64().unwrap() >= 150_000_000, "{task}");
        }
    }
    assert_eq!(
        report["latencies"]["task_poll"]["count"], total_polls,
        "{report:#}"
    );
    assert!(
        report["latencies"]["worker_park"]["count"]
            .as_u64()
            .unwrap()
            > 0,
        "{report:#}"
    );
    let folded = std::fs::read_to_string(report["tasks"]["folded"].as_str().unwrap()).unwrap();
    assert!(
        folded.lines().any(|l| l.contains(";task src/main.rs:")
            && l.contains("std::thread::functions::sleep")
            && l.contains(";[blocked while running] ")),
        "{folded}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
