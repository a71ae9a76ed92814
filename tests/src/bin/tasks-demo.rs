//! A runtime of three named tasks on two threads, each spending its time differently, with
//! its own clocks' account of each task's time.
//!
//! ```text
//! tasks-demo [--rounds N] [--spin-ms S] [--sleep-ms L] [--wait-for-signal]
//! ```
//! Defaults: N = 40, S = 15, L = 10. The run takes about N * (S + L) ms.
//!
//! # Tasks
//! Each is named with `rt__task__name` before it first runs, and switched with the
//! `probes` crate's task probes (`rt__run__task` / `rt__pause__task`, `rt__finish__task`
//! at the end, while parked: that last park counts up to the finish):
//! - `spinner` (task 1), on thread `worker-a`: each round it runs S ms on the CPU in
//!   `spin_while_running`, then pauses.
//! - `sleeper` (task 2), on thread `worker-a` after the spinner: each round it runs and,
//!   while it is the running task, sleeps L ms in a system call (`sleep_while_running`:
//!   the task blocks its thread), then pauses. Then `worker-a` ends the round.
//! - `waiter` (task 3), on thread `worker-b`: each round a little work (`short_work`),
//!   then it waits for the round's end on a runtime-level lock (`wait_for_runtime_lock`),
//!   parked: it pauses in there and runs again once the lock lets it through.
//!
//! # Ground truth
//! At the end one JSON line: `{"pid":..,"tasks":[{"id":1,"name":"spinner","tid":..,
//! "runs":..,"running_ns":..,"running_with_probes_ns":..,"oncpu_ns":..,"blocked_ns":..,
//! "blocked_oncpu_ns":..,"parked_ns":..},..]}`: per task, its runs, the time from each
//! run probe to the next pause (running: from just after the one to just before the other;
//! and with probes: from just before to just after, so with the traps in which tracers
//! run), the thread's CPU time in there (on CPU), the time inside its blocking system call
//! while running (blocked) and the thread's CPU time inside it (the call's entry and exit,
//! and what the kernel did for it on CPU), and from each pause to the next run (parked),
//! all on the task's own thread and clocks (CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID).

use std::{
    hint::black_box,
    sync::{Condvar, Mutex},
    thread,
    time::Duration,
};

use anyhow::{Result, bail};
use tests::{Args, announce_ready, gettid, monotonic_ns, print_line, thread_cpu_ns};

const SPINNER: u64 = 1;
const SLEEPER: u64 = 2;
const WAITER: u64 = 3;

struct Config {
    rounds: u64,
    spin: Duration,
    sleep: Duration,
}

impl Config {
    fn from_args(args: &mut Args) -> Result<Self> {
        let mut config = Config {
            rounds: 40,
            spin: Duration::from_millis(15),
            sleep: Duration::from_millis(10),
        };
        while let Some(flag) = args.next_flag()? {
            match flag.as_str() {
                "--rounds" => config.rounds = args.value(&flag)?,
                "--spin-ms" => config.spin = Duration::from_millis(args.value(&flag)?),
                "--sleep-ms" => config.sleep = Duration::from_millis(args.value(&flag)?),
                _ => bail!(
                    "unknown flag {flag}\nusage: tasks-demo [--rounds N] [--spin-ms S] \
                     [--sleep-ms L] [--wait-for-signal]"
                ),
            }
        }
        Ok(config)
    }
}

/// One task's account of its time, by its own clocks.
#[derive(Default)]
struct TaskClock {
    tid: i32,
    runs: u64,
    running_ns: u64,
    running_with_probes_ns: u64,
    oncpu_ns: u64,
    blocked_ns: u64,
    blocked_oncpu_ns: u64,
    parked_ns: u64,
    /// When it last ran or paused (monotonic, thread CPU), while running / parked.
    run_since: Option<(u64, u64)>,
    /// When it was about to run (monotonic), while running.
    run_probe_since: Option<u64>,
    parked_since: Option<u64>,
}

impl TaskClock {
    fn new() -> Self {
        Self {
            tid: gettid(),
            ..Self::default()
        }
    }

    /// The task is switched to: `rt__run__task`, then its clocks start.
    fn run(&mut self, task: u64) {
        self.run_probe_since = Some(monotonic_ns());
        probes::rt_run_task(task);
        let now = monotonic_ns();
        if let Some(since) = self.parked_since.take() {
            self.parked_ns += now - since;
        }
        self.runs += 1;
        self.run_since = Some((now, thread_cpu_ns()));
    }

    /// The task is switched away from: its clocks stop, then `rt__pause__task`.
    fn pause(&mut self, task: u64) {
        let (now, cpu) = (monotonic_ns(), thread_cpu_ns());
        if let Some((since, cpu_since)) = self.run_since.take() {
            self.running_ns += now - since;
            self.oncpu_ns += cpu - cpu_since;
        }
        self.parked_since = Some(monotonic_ns());
        probes::rt_pause_task(task);
        if let Some(since) = self.run_probe_since.take() {
            self.running_with_probes_ns += monotonic_ns() - since;
        }
    }

    /// The task is done (outside a run: parked until now): `rt__finish__task`.
    fn finish(&mut self, task: u64) {
        if let Some(since) = self.parked_since.take() {
            self.parked_ns += monotonic_ns() - since;
        }
        probes::rt_finish_task(task);
    }

    fn json(&self, id: u64, name: &str) -> String {
        format!(
            r#"{{"id":{id},"name":"{name}","tid":{},"runs":{},"running_ns":{},"running_with_probes_ns":{},"oncpu_ns":{},"blocked_ns":{},"blocked_oncpu_ns":{},"parked_ns":{}}}"#,
            self.tid,
            self.runs,
            self.running_ns,
            self.running_with_probes_ns,
            self.oncpu_ns,
            self.blocked_ns,
            self.blocked_oncpu_ns,
            self.parked_ns
        )
    }
}

/// Busy on the CPU for `duration`.
#[inline(never)]
fn spin_while_running(duration: Duration) -> u64 {
    let deadline = monotonic_ns() + duration.as_nanos() as u64;
    let mut x = 1u64;
    while monotonic_ns() < deadline {
        for _ in 0..1000 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

/// Sleeps `duration` in a system call while the task runs; returns the time inside, and
/// the thread's CPU time inside.
#[inline(never)]
fn sleep_while_running(duration: Duration) -> (u64, u64) {
    let (start, cpu_start) = (monotonic_ns(), thread_cpu_ns());
    thread::sleep(black_box(duration));
    let cpu = thread_cpu_ns() - cpu_start;
    (monotonic_ns() - start, cpu)
}

/// About 100 µs of work.
#[inline(never)]
fn short_work() -> u64 {
    spin_while_running(Duration::from_micros(100))
}

/// Rounds finished by `worker-a`, and whether it is done.
struct RuntimeLock {
    state: Mutex<(u64, bool)>,
    changed: Condvar,
}

/// Parks the waiter until round `round` has ended (or the run has): it pauses in here
/// and runs again once through.
#[inline(never)]
fn wait_for_runtime_lock(lock: &RuntimeLock, round: u64, clock: &mut TaskClock) -> bool {
    clock.pause(WAITER);
    let mut state = lock.state.lock().unwrap();
    while state.0 < round && !state.1 {
        state = lock.changed.wait(state).unwrap();
    }
    let through = state.0 >= round;
    drop(state);
    clock.run(WAITER);
    through
}

#[inline(never)]
fn worker_a(config: &Config, lock: &RuntimeLock) -> (TaskClock, TaskClock) {
    let (mut spinner, mut sleeper) = (TaskClock::new(), TaskClock::new());
    probes::rt_task_name(SPINNER, c"spinner");
    probes::rt_task_name(SLEEPER, c"sleeper");
    for round in 1..=config.rounds {
        spinner.run(SPINNER);
        black_box(spin_while_running(config.spin));
        spinner.pause(SPINNER);
        sleeper.run(SLEEPER);
        let (blocked, blocked_oncpu) = sleep_while_running(config.sleep);
        sleeper.blocked_ns += blocked;
        sleeper.blocked_oncpu_ns += blocked_oncpu;
        sleeper.pause(SLEEPER);
        let mut state = lock.state.lock().unwrap();
        state.0 = round;
        lock.changed.notify_all();
    }
    lock.state.lock().unwrap().1 = true;
    lock.changed.notify_all();
    for (task, clock) in [(SPINNER, &mut spinner), (SLEEPER, &mut sleeper)] {
        clock.finish(task);
    }
    (spinner, sleeper)
}

#[inline(never)]
fn worker_b(lock: &RuntimeLock) -> TaskClock {
    let mut waiter = TaskClock::new();
    probes::rt_task_name(WAITER, c"waiter");
    waiter.run(WAITER);
    let mut round = 1;
    loop {
        black_box(short_work());
        if !wait_for_runtime_lock(lock, round, &mut waiter) {
            break;
        }
        round += 1;
    }
    waiter.pause(WAITER);
    waiter.finish(WAITER);
    waiter
}

fn join<T>(handle: thread::ScopedJoinHandle<'_, T>) -> Result<T> {
    handle
        .join()
        .map_err(|_| anyhow::anyhow!("a worker panicked"))
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let config = Config::from_args(&mut args)?;
    announce_ready(args.wait_for_signal())?;
    let lock = RuntimeLock {
        state: Mutex::new((0, false)),
        changed: Condvar::new(),
    };
    let ((spinner, sleeper), waiter) = thread::scope(|scope| {
        let a = thread::Builder::new()
            .name("worker-a".into())
            .spawn_scoped(scope, || worker_a(&config, &lock))?;
        let b = thread::Builder::new()
            .name("worker-b".into())
            .spawn_scoped(scope, || worker_b(&lock))?;
        anyhow::Ok((join(a)?, join(b)?))
    })?;
    print_line(&format!(
        r#"{{"pid":{},"tasks":[{},{},{}]}}"#,
        std::process::id(),
        spinner.json(SPINNER, "spinner"),
        sleeper.json(SLEEPER, "sleeper"),
        waiter.json(WAITER, "waiter")
    ))
}
