//! `tracer attach` on a tokio program using the `tokio-dtrace` crate
//! (`tokio_dtrace::register_hooks`): provider `tokio`, a task's id and spawn location
//! (file, line, column) at every task probe, and the worker threads' start, park, unpark
//! and stop, through the `usdt` crate.
//!
//! tokio-dtrace 0.1.1 depends on usdt 0.5, which emits no probe on Linux (SystemTap notes
//! came with usdt 0.6, whose API it uses unchanged). So the program is built with usdt
//! 0.6 in its place: vendored by cargo at test time and renumbered 0.5.600 so that
//! cargo's `[patch]` takes it for tokio-dtrace's `^0.5`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// A tokio program using tokio-dtrace's hooks. On a two-worker runtime: `blocker`
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

const ROUNDS: u64 = 12;
const SLEEP_MS: u64 = 15;
const TICKS: u64 = 20;

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
    println!("ready pid={}", std::process::id());
    std::io::stdin().lock().read_line(&mut String::new()).unwrap();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(2).enable_time();
    let runtime = tokio_dtrace::register_hooks(&mut builder)
        .expect("tokio-dtrace's hooks")
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

/// usdt 0.6's source, vendored by cargo under `target/`, as version 0.5.600.
fn usdt_06_renumbered() -> PathBuf {
    let base = workspace_dir().join("target/usdt-0.6-as-0.5");
    let crate_dir = base.join("vendor/usdt-0.6.0");
    if !crate_dir.join("Cargo.toml").is_file() {
        std::fs::create_dir_all(base.join("src")).unwrap();
        std::fs::write(
            base.join("Cargo.toml"),
            "[package]\nname = \"vendor-usdt\"\nversion = \"0.0.0\"\nedition = \"2024\"\n\
             [workspace]\n[dependencies]\nusdt = \"=0.6.0\"\n",
        )
        .unwrap();
        std::fs::write(base.join("src/main.rs"), "fn main() {}\n").unwrap();
        let out = Command::new(option_env!("CARGO").unwrap_or("cargo"))
            .args(["vendor", "--versioned-dirs", "vendor"])
            .current_dir(&base)
            .output()
            .expect("cargo");
        assert!(
            out.status.success(),
            "cargo vendor: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let manifest = crate_dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    // The package's own version line (its dependencies say "=0.6.0").
    let renumbered = text.replacen("\nversion = \"0.6.0\"\n", "\nversion = \"0.5.600\"\n", 1);
    assert!(
        renumbered.contains("version = \"0.5.600\"") || text.contains("version = \"0.5.600\""),
        "no package version in {}",
        manifest.display()
    );
    std::fs::write(&manifest, renumbered).unwrap();
    crate_dir
}

/// Builds the program (see [`build_side_project`]) with tokio-dtrace 0.1.1 and usdt 0.6
/// in place of its usdt 0.5.
fn build_tokio_dtrace_target() -> PathBuf {
    let usdt: &Path = &usdt_06_renumbered();
    build_side_project(
        "tokio-dtrace-probes",
        &format!(
            r#"tokio = {{ version = "1.54", default-features = false, features = ["rt", "rt-multi-thread", "time"] }}
tokio-dtrace = "=0.1.1"

[patch.crates-io]
usdt = {{ path = "{}" }}
"#,
            usdt.display()
        ),
        TOKIO_DTRACE_MAIN,
    )
}

/// Each task of a tokio program with tokio-dtrace's probes is named by its spawn
/// location, with as many runs and parks as its future counted polls; the one calling
/// `std::thread::sleep` in an async fn blocked its worker for the time it slept (within
/// 10%), under that sleep; the timer task was parked meanwhile; every poll is in the
/// `task_poll` latency, and the workers' parks in `worker_park`.
#[privileged_test]
fn tokio_tasks_are_named_by_spawn_location_with_their_blocking_stack() {
    require_privileged();
    let binary = build_tokio_dtrace_target();
    let target = StdinTarget::start(&mut std::process::Command::new(&binary));
    let dir = out_dir("tokio-dtrace");
    let tracer = TracerRun::attach().pid(target.pid).json().out(&dir).start();
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
    let mut total_polls = 0;
    for truth in truth["tasks"].as_array().unwrap() {
        let id = truth["id"].as_u64().unwrap();
        let location = truth["location"].as_str().unwrap();
        let polls = truth["polls"].as_u64().unwrap();
        total_polls += polls;
        let task = report_task(&report, id);
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
