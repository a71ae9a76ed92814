//! `event-storm`: runtime task events in large numbers, at a known rate if asked, so that
//! tests can check a tracer accounts for every single one.
//!
//! ```text
//! event-storm [--tasks N] [--rate R] [--workers W] [--wait-for-signal]
//! ```
//! Defaults: N = 100000, R = 0 (as fast as possible), W = 2.
//!
//! # Protocol
//! As every target here (see the `tests` crate docs): stdout gets `ready pid=<PID>`, then
//! with `--wait-for-signal` the program blocks until SIGUSR1; at the end one JSON line
//! (see [Ground truth](#ground-truth)) and exit code 0. Worker threads are spawned only
//! after the signal.
//!
//! # What it does
//! W worker threads (comm `storm-1` .. `storm-W`) share the N tasks, numbered 1..=N: task
//! k belongs to worker w = (k - 1) % W + 1, and each worker handles its tasks in increasing
//! order. For each task k the worker fires, in this order:
//! `rt__new__task(w, k)`, `rt__start__task(k)`, `rt__run__task(k)`, `rt__pause__task(k)`,
//! `rt__finish__task(k)`: five events per task, 5N in all, each carrying the task id.
//!
//! With `--rate R` (tasks per second, all workers together, so 5R events per second) every
//! worker paces itself on the clock: t seconds after the start it has finished at most
//! t * R / W of its tasks, and it sleeps 1 ms whenever it is ahead. A worker that falls
//! behind (e.g. because tracing slows it down) catches up at full speed, so the run takes
//! N / R seconds unless the events cannot be produced that fast; `elapsed_ns` tells.
//!
//! The probes are the `probes` crate's, guarded by semaphores: a call fires its probe only
//! while a tracer is attached. The counts below are calls, which equal the events a tracer
//! sees when it stays attached from before the signal to the end.
//!
//! # Ground truth
//! One JSON line: `{"pid":P,"tasks":N,"workers":W,"rate":R,"fired":{"rt__new__task":N,
//! "rt__start__task":N,"rt__run__task":N,"rt__pause__task":N,"rt__finish__task":N},
//! "events":5N,"elapsed_ns":E,"tids":[...]}` where E is the time from the signal (or the
//! ready line) until every worker finished and `tids` the workers' thread ids.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use tests::{Args, announce_ready, gettid, json_array, print_line};

const USAGE: &str = "usage: event-storm [--tasks N] [--rate R] [--workers W] [--wait-for-signal]";

struct Config {
    tasks: u64,
    rate: u64,
    workers: u64,
}

impl Config {
    fn from_args(args: &mut Args) -> Result<Self> {
        let mut config = Config {
            tasks: 100_000,
            rate: 0,
            workers: 2,
        };
        while let Some(flag) = args.next_flag()? {
            match flag.as_str() {
                "--tasks" => config.tasks = args.value(&flag)?,
                "--rate" => config.rate = args.value(&flag)?,
                "--workers" => config.workers = args.value(&flag)?,
                "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                _ => bail!("unknown option {flag}\n{USAGE}"),
            }
        }
        if config.workers == 0 {
            bail!("--workers must be at least 1");
        }
        Ok(config)
    }
}

/// The five events of task `task`, created by worker `worker`.
#[inline(never)]
fn run_one_task(worker: u64, task: u64) {
    probes::rt_new_task(worker, task);
    probes::rt_start_task(task);
    probes::rt_run_task(task);
    probes::rt_pause_task(task);
    probes::rt_finish_task(task);
}

/// Worker `worker` (1-based): tasks worker, worker + W, ... up to N, paced if `rate` > 0.
fn worker_loop(worker: u64, config: &Config, start: Instant) -> i32 {
    let mine = if worker > config.tasks {
        0
    } else {
        (config.tasks - worker) / config.workers + 1
    };
    let mut done = 0u64;
    while done < mine {
        let due = if config.rate == 0 {
            mine
        } else {
            // Tasks this worker should have finished by now: elapsed * R / W.
            let elapsed = start.elapsed().as_nanos();
            let due =
                elapsed * u128::from(config.rate) / (1_000_000_000 * u128::from(config.workers));
            due.min(u128::from(mine)) as u64
        };
        while done < due {
            run_one_task(worker, worker + done * config.workers);
            done += 1;
        }
        if done < mine {
            thread::sleep(Duration::from_millis(1));
        }
    }
    gettid()
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let config = Config::from_args(&mut args)?;
    announce_ready(args.wait_for_signal())?;
    let start = Instant::now();
    let tids = thread::scope(|s| -> Result<Vec<i32>> {
        let mut handles = Vec::new();
        for worker in 1..=config.workers {
            let config = &config;
            handles.push(
                thread::Builder::new()
                    .name(format!("storm-{worker}"))
                    .spawn_scoped(s, move || worker_loop(worker, config, start))?,
            );
        }
        Ok(handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect())
    })?;
    let elapsed = start.elapsed();
    let n = config.tasks;
    let fired = [
        "rt__new__task",
        "rt__start__task",
        "rt__run__task",
        "rt__pause__task",
        "rt__finish__task",
    ]
    .map(|name| format!(r#""{name}":{n}"#))
    .join(",");
    print_line(&format!(
        r#"{{"pid":{},"tasks":{n},"workers":{},"rate":{},"fired":{{{fired}}},"events":{},"elapsed_ns":{},"tids":{}}}"#,
        std::process::id(),
        config.workers,
        config.rate,
        5 * n,
        elapsed.as_nanos(),
        json_array(&tids),
    ))
}
