//! `many-threads`: a thousand threads (by default) that all block in one known function,
//! to check that off-CPU profiling keeps up with many threads and accounts for each.
//!
//! ```text
//! many-threads [--threads N] [--sleeps K] [--sleep-ms S] [--wait-for-signal]
//! ```
//! Defaults: N = 1000, K = 10, S = 100. The run takes about K * S ms plus the time to
//! spawn N threads.
//!
//! # Protocol
//! As every target here (see the `tests` crate docs): stdout gets `ready pid=<PID>`, then
//! with `--wait-for-signal` the program blocks until SIGUSR1; at the end one JSON line
//! (see [Ground truth](#ground-truth)) and exit code 0. Threads are spawned only after the
//! signal.
//!
//! # What it does
//! The main thread spawns N threads named `worker-<i>` (i = 0..N; 64 KiB stacks). Each
//! waits until all N exist (a barrier), then calls `block_in_worker(S ms)` K times
//! (`worker_thread` → `block_in_worker` → `std::thread::sleep`), then waits until all N
//! are done (a second barrier), so all N threads live through the whole blocking phase.
//! The main thread joins them.
//!
//! # Ground truth
//! One JSON line: `{"pid":P,"threads":N,"sleeps":K,"sleep_ms":S,"tids":[...],
//! "blocked_ns":[...],"total_blocked_ns":T,"wall_ns":W}`: `tids[i]` is the thread id of
//! `worker-<i>`, `blocked_ns[i]` the time it spent inside `block_in_worker` (clock read at
//! its start and end), T their sum, W the time from the signal to all threads joined.

use std::hint::black_box;
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use tests::{Args, announce_ready, gettid, json_array, print_line};

const USAGE: &str =
    "usage: many-threads [--threads N] [--sleeps K] [--sleep-ms S] [--wait-for-signal]";

struct Config {
    threads: usize,
    sleeps: u64,
    sleep: Duration,
}

impl Config {
    fn from_args(args: &mut Args) -> Result<Self> {
        let mut config = Config {
            threads: 1000,
            sleeps: 10,
            sleep: Duration::from_millis(100),
        };
        while let Some(flag) = args.next_flag()? {
            match flag.as_str() {
                "--threads" => config.threads = args.value(&flag)?,
                "--sleeps" => config.sleeps = args.value(&flag)?,
                "--sleep-ms" => config.sleep = Duration::from_millis(args.value(&flag)?),
                "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                _ => bail!("unknown option {flag}\n{USAGE}"),
            }
        }
        Ok(config)
    }
}

/// Where every worker blocks: sleeps `duration`; returns the time spent inside.
#[inline(never)]
fn block_in_worker(duration: Duration) -> Duration {
    let start = Instant::now();
    thread::sleep(black_box(duration));
    start.elapsed()
}

#[inline(never)]
fn worker_thread(config: &Config, all_started: &Barrier, all_done: &Barrier) -> (i32, Duration) {
    let tid = gettid();
    all_started.wait();
    let mut blocked = Duration::ZERO;
    for _ in 0..config.sleeps {
        blocked += block_in_worker(config.sleep);
    }
    all_done.wait();
    (tid, blocked)
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let config = Config::from_args(&mut args)?;
    announce_ready(args.wait_for_signal())?;
    let start = Instant::now();
    let all_started = Barrier::new(config.threads);
    let all_done = Barrier::new(config.threads);
    let results: Vec<(i32, Duration)> = thread::scope(|s| {
        let mut handles = Vec::with_capacity(config.threads);
        for i in 0..config.threads {
            let (config, all_started, all_done) = (&config, &all_started, &all_done);
            let handle = thread::Builder::new()
                .name(format!("worker-{i}"))
                .stack_size(64 * 1024)
                .spawn_scoped(s, move || worker_thread(config, all_started, all_done));
            match handle {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    // The threads already spawned would wait at the barrier for ever.
                    eprintln!("many-threads: cannot spawn thread {i}: {e}");
                    std::process::exit(1);
                }
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    let wall = start.elapsed();
    let tids: Vec<i32> = results.iter().map(|r| r.0).collect();
    let blocked: Vec<u64> = results.iter().map(|r| r.1.as_nanos() as u64).collect();
    print_line(&format!(
        r#"{{"pid":{},"threads":{},"sleeps":{},"sleep_ms":{},"tids":{},"blocked_ns":{},"total_blocked_ns":{},"wall_ns":{}}}"#,
        std::process::id(),
        config.threads,
        config.sleeps,
        config.sleep.as_millis(),
        json_array(&tids),
        json_array(&blocked),
        blocked.iter().sum::<u64>(),
        wall.as_nanos(),
    ))
}
