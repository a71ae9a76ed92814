//! `gc-demo`: a tiny "runtime" with a simulated stop-the-world garbage collector, whose
//! behaviour is known exactly so that end-to-end tests can check a tracer against it.
//!
//! ```text
//! gc-demo [--gcs N] [--pause-ms P] [--interval-ms I] [--sleep-ms S] [--wait-for-signal]
//! ```
//! Defaults: N = 20, P = 20, I = 30, S = 50. The run takes about N * (P + I) ms, plus up to
//! S ms for the workers to notice the end.
//!
//! # Protocol
//! stdout gets exactly two lines: `ready pid=<PID>` (flushed before anything else happens;
//! with `--wait-for-signal` the program then blocks until SIGUSR1, so a tracer can attach
//! first), and at the end one JSON object (see [Ground truth](#ground-truth)). Exit code 0.
//! SIGUSR1 stays blocked for the whole run, so extra SIGUSR1s are harmless. Threads are
//! spawned only after the signal, so every probe below fires after the tracer attached.
//!
//! # Threads and what they do
//! - The main thread (comm `gc-demo`) is the collector. For collection `i` in `0..N`:
//!   `gc__begin(i)`; stop the world (ask the workers to reach a safepoint, wait until they
//!   have); `gc__stop_the_world`; `gc__mark__begin`; spin in `gc_mark` until 60% of P has
//!   passed since gc__begin; `gc__mark__end((i + 1) * 1048576, i * 4096)`;
//!   `gc__sweep__begin(i % 4 == 0)` (full sweeps at i = 0, 4, 8, ...); spin in `gc_sweep`
//!   until P has passed; `gc__sweep__end`; `gc__end`; restart the world; `gc__finalizer`;
//!   sleep I ms. The pause is spun on the clock, so it is P ms to within microseconds unless
//!   the thread is preempted.
//! - `sleeper` (task 2): each iteration `rt__run__task(2)`, ~200 µs of work in `demo_work`,
//!   `rt__pause__task(2)`, then `sleep_in_demo_io(S ms)` (`sleeper_thread` →
//!   `sleep_in_demo_io` → `std::thread::sleep`).
//! - `lock-holder` (task 3): each iteration run/work/pause as above, then takes the demo
//!   mutex, tells the waiter, and sleeps S ms in `hold_demo_lock` while holding it; after
//!   unlocking it waits until the waiter has had the lock.
//! - `lock-waiter` (task 4): each iteration run/work/pause as above, waits for the holder's
//!   go, then blocks in `wait_for_demo_lock` (`lock_waiter_thread` → `wait_for_demo_lock` →
//!   `Mutex::lock`) for about S ms, until the holder unlocks.
//!
//! Task probes: `rt__new__task(1, k)` from the main thread for k = 2, 3, 4 before spawning,
//! `rt__start__task(k)` first thing and `rt__finish__task(k)` last thing in each worker;
//! `rt__run__task(k)` and `rt__pause__task(k)` once per iteration, as many of each.
//!
//! Safepoints follow Julia's model: a worker running managed code (here `demo_work`) polls
//! for a pending collection; a worker in a blocking call (sleep, lock, channel) is in a
//! GC-safe region and does not delay the collector, but on leaving it waits in
//! `wait_for_gc_end` while the world is stopped. So stop-the-world latencies are short
//! (typically microseconds) and never include a worker's sleep.
//!
//! # Ground truth
//! One JSON line, fields in this order:
//! - `pid`, `gcs` (N), `pause_ns`: per collection, `Instant` read just before `gc__begin`
//!   to just after `gc__end`; `pause_inner_ns`: from just after `gc__begin` returned to
//!   just before `gc__end` (a tracer's span between the two probes lies between the two
//!   figures, however long a preemption around a probe); `stw_ns`: from the same start to just before
//!   `gc__stop_the_world`;
//! - `sleep_in_demo_io_ns`, `wait_for_demo_lock_ns`: total time spent inside those
//!   functions (each reads the clock at its start and end); `wall_ns`: from the signal (or
//!   the ready line) to all threads joined;
//! - `pause_ms`, `interval_ms`, `sleep_ms`, `work_us`: the settings;
//! - `full_sweeps`: collections with `gc__sweep__begin(1)`;
//! - `sleep_in_demo_io_calls`, `wait_for_demo_lock_calls`: number of calls;
//! - `wait_for_gc_end_ns`: total time workers spent blocked in `wait_for_gc_end` (all
//!   workers added up; only calls that found the world stopped count);
//! - `first_gc_begin_monotonic_ns`: CLOCK_MONOTONIC just before the first `gc__begin`;
//! - `gc_preemptions`: how often the collecting thread was preempted (involuntary context
//!   switches) inside the probes from `gc__begin` to `gc__end` (each a trap in which every
//!   attached tracer's program runs), all collections added up;
//! - `tasks`: one object per worker: `name`, task `id`, thread `tid`, `runs` (the number of
//!   rt__run__task events, equal to the number of rt__pause__task events; the waiter's is
//!   one more than its lock waits, as its last run ends when the holder hangs up).
//!
//! Stacks: every function named above is `#[inline(never)]` and has a body of its own, so
//! it shows in stacks under its name. eBPF can only walk these stacks if the binary has
//! frame pointers (`-C force-frame-pointers=yes`, which the workspace's build sets); nothing
//! here depends on it.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use tests::{Args, announce_ready, gettid, json_array, monotonic_ns, preemptions, print_line};

/// Share of the pause spent marking; the rest is sweeping.
const MARK_PERCENT: u32 = 60;
/// On-CPU work of a worker per iteration, between rt__run__task and rt__pause__task.
const WORK: Duration = Duration::from_micros(200);

const MAIN_TASK: u64 = 1;
const SLEEPER_TASK: u64 = 2;
const HOLDER_TASK: u64 = 3;
const WAITER_TASK: u64 = 4;

const USAGE: &str = "usage: gc-demo [--gcs N] [--pause-ms P] [--interval-ms I] [--sleep-ms S] \
                     [--wait-for-signal]";

struct Config {
    gcs: u64,
    pause: Duration,
    interval: Duration,
    sleep: Duration,
}

impl Config {
    fn from_args(args: &mut Args) -> Result<Self> {
        let mut config = Config {
            gcs: 20,
            pause: Duration::from_millis(20),
            interval: Duration::from_millis(30),
            sleep: Duration::from_millis(50),
        };
        while let Some(flag) = args.next_flag()? {
            match flag.as_str() {
                "--gcs" => config.gcs = args.value(&flag)?,
                "--pause-ms" => config.pause = Duration::from_millis(args.value(&flag)?),
                "--interval-ms" => config.interval = Duration::from_millis(args.value(&flag)?),
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

/// The stop-the-world machinery: which workers run managed code, and whether the world is
/// stopped.
struct World {
    /// Set while a collection wants the world stopped; polled by [`World::safepoint`].
    gc_pending: AtomicBool,
    state: Mutex<WorldState>,
    changed: Condvar,
    /// Total time workers spent blocked in [`wait_for_gc_end`], in nanoseconds.
    gc_wait_ns: AtomicU64,
}

struct WorldState {
    stopped: bool,
    /// Workers running managed code, i.e. not at a safepoint nor in a GC-safe region.
    running: usize,
}

impl World {
    fn new() -> Self {
        World {
            gc_pending: AtomicBool::new(false),
            state: Mutex::new(WorldState {
                stopped: false,
                running: 0,
            }),
            changed: Condvar::new(),
            gc_wait_ns: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, WorldState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The calling worker starts running managed code, once the world is not stopped.
    fn enter_managed(&self) {
        let mut state = wait_for_gc_end(self, self.lock());
        state.running += 1;
    }

    /// The calling worker stops running managed code (safepoint or GC-safe region).
    fn leave_managed(&self) {
        let mut state = self.lock();
        state.running -= 1;
        if state.stopped && state.running == 0 {
            self.changed.notify_all();
        }
    }

    /// Lets a pending collection proceed, waiting for it to finish.
    fn safepoint(&self) {
        if self.gc_pending.load(Ordering::Acquire) {
            self.leave_managed();
            self.enter_managed();
        }
    }

    /// Runs a blocking call in a GC-safe region.
    fn blocking<R>(&self, call: impl FnOnce() -> R) -> R {
        self.leave_managed();
        let result = call();
        self.enter_managed();
        result
    }

    /// Stops the world: returns once no worker runs managed code.
    fn stop(&self) {
        let mut state = self.lock();
        state.stopped = true;
        self.gc_pending.store(true, Ordering::Release);
        while state.running > 0 {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Restarts the world.
    fn restart(&self) {
        let mut state = self.lock();
        state.stopped = false;
        self.gc_pending.store(false, Ordering::Release);
        self.changed.notify_all();
    }
}

/// Where a worker blocks while the world is stopped.
#[inline(never)]
fn wait_for_gc_end<'a>(
    world: &'a World,
    mut state: MutexGuard<'a, WorldState>,
) -> MutexGuard<'a, WorldState> {
    if !state.stopped {
        return state;
    }
    let start = Instant::now();
    while state.stopped {
        state = world
            .changed
            .wait(state)
            .unwrap_or_else(PoisonError::into_inner);
    }
    let waited = start.elapsed().as_nanos() as u64;
    world.gc_wait_ns.fetch_add(waited, Ordering::Relaxed);
    state
}

/// A few hundred nanoseconds of arithmetic the optimiser cannot remove.
#[inline(always)]
fn churn(mut x: u64) -> u64 {
    for _ in 0..64 {
        x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
    }
    x
}

/// Spins until `deadline`; returns a value so the loop is not optimised away.
///
/// Each named function below must have a body of its own: rustc runs LLVM's function
/// merging, which would otherwise fold two identical functions into one symbol and show
/// the wrong name in stacks.
#[inline(always)]
fn spin_until(deadline: Instant, seed: u64) -> u64 {
    let mut x = seed;
    while Instant::now() < deadline {
        x = churn(x);
    }
    x
}

/// The mark phase: busy until `deadline`.
#[inline(never)]
fn gc_mark(deadline: Instant) -> u64 {
    spin_until(deadline, 0x6d61_726b)
}

/// The sweep phase: busy until `deadline`.
#[inline(never)]
fn gc_sweep(deadline: Instant) -> u64 {
    spin_until(deadline, 0x0073_7765_6570)
}

/// The measured durations of one collection.
struct Collection {
    /// CLOCK_MONOTONIC just before `gc__begin` fired.
    began_ns: u64,
    pause: Duration,
    /// From just after `gc__begin` returned to just before `gc__end` fired: a tracer's
    /// span between the two lies between this and `pause`.
    pause_inner: Duration,
    stw: Duration,
    full: bool,
    /// Times the collecting thread was preempted inside the probes from `gc__begin` to
    /// `gc__end`.
    preempted: u64,
}

/// Runs `config.gcs` collections on the calling thread.
#[inline(never)]
fn run_collections(world: &World, config: &Config) -> Vec<Collection> {
    let mark = config.pause * MARK_PERCENT / 100;
    let mut collections = Vec::with_capacity(config.gcs as usize);
    for i in 0..config.gcs {
        let full = i % 4 == 0;
        // Each probe is a trap in which every attached tracer's program runs, one after
        // the other: a preemption inside one may split them. (A macro, not a closure: the
        // probes stay in this function's frame.)
        let mut preempted = 0;
        macro_rules! fire {
            ($probe:expr) => {{
                let before = preemptions();
                $probe;
                preempted += preemptions() - before;
            }};
        }
        let start = Instant::now();
        let began_ns = monotonic_ns();
        fire!(probes::gc_begin(i));
        let after_begin = Instant::now();
        world.stop();
        let stw = start.elapsed();
        fire!(probes::gc_stop_the_world());
        fire!(probes::gc_mark_begin());
        black_box(gc_mark(start + mark));
        fire!(probes::gc_mark_end(
            (i as i64 + 1) * 1_048_576,
            i as i64 * 4096
        ));
        fire!(probes::gc_sweep_begin(full));
        black_box(gc_sweep(start + config.pause));
        fire!(probes::gc_sweep_end());
        let pause_inner = after_begin.elapsed();
        fire!(probes::gc_end());
        let pause = start.elapsed();
        world.restart();
        probes::gc_finalizer();
        collections.push(Collection {
            began_ns,
            pause,
            pause_inner,
            stw,
            full,
            preempted,
        });
        thread::sleep(config.interval);
    }
    collections
}

/// What one worker reports when it ends.
#[derive(Default)]
struct WorkerStats {
    tid: i32,
    runs: u64,
    /// Time in the worker's characteristic blocking function, and how many calls.
    blocked: Duration,
    calls: u64,
}

/// The managed work of one iteration: busy for [`WORK`], polling for safepoints.
#[inline(never)]
fn demo_work(world: &World) -> u64 {
    let deadline = Instant::now() + WORK;
    let mut x = 1u64;
    while Instant::now() < deadline {
        x = churn(x);
        world.safepoint();
    }
    x
}

/// One task run: rt__run__task, the work, rt__pause__task before the task blocks.
fn run_task(world: &World, task: u64, stats: &mut WorkerStats) {
    probes::rt_run_task(task);
    stats.runs += 1;
    black_box(demo_work(world));
    probes::rt_pause_task(task);
}

/// Simulated blocking I/O: sleeps `duration`; returns the time spent inside.
#[inline(never)]
fn sleep_in_demo_io(duration: Duration) -> Duration {
    let start = Instant::now();
    thread::sleep(black_box(duration));
    start.elapsed()
}

#[inline(never)]
fn sleeper_thread(world: &World, stop: &AtomicBool, sleep: Duration) -> WorkerStats {
    let mut stats = WorkerStats {
        tid: gettid(),
        ..WorkerStats::default()
    };
    probes::rt_start_task(SLEEPER_TASK);
    world.enter_managed();
    while !stop.load(Ordering::Acquire) {
        run_task(world, SLEEPER_TASK, &mut stats);
        stats.blocked += world.blocking(|| sleep_in_demo_io(sleep));
        stats.calls += 1;
    }
    world.leave_managed();
    probes::rt_finish_task(SLEEPER_TASK);
    stats
}

/// Holds the demo lock for `duration`: sleeps with the guard held.
#[inline(never)]
fn hold_demo_lock(guard: &mut MutexGuard<'_, u64>, duration: Duration) {
    **guard += 1;
    thread::sleep(black_box(duration));
}

#[inline(never)]
fn lock_holder_thread(
    world: &World,
    stop: &AtomicBool,
    lock: &Mutex<u64>,
    hold: Duration,
    go: Sender<()>,
    done: Receiver<()>,
) -> WorkerStats {
    let mut stats = WorkerStats {
        tid: gettid(),
        ..WorkerStats::default()
    };
    probes::rt_start_task(HOLDER_TASK);
    world.enter_managed();
    while !stop.load(Ordering::Acquire) {
        run_task(world, HOLDER_TASK, &mut stats);
        let waiter_alive = world.blocking(|| {
            let mut guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
            if go.send(()).is_err() {
                return false;
            }
            hold_demo_lock(&mut guard, hold);
            drop(guard);
            done.recv().is_ok()
        });
        stats.calls += 1;
        if !waiter_alive {
            break;
        }
    }
    world.leave_managed();
    probes::rt_finish_task(HOLDER_TASK);
    stats
}

/// Blocks until the demo lock is free; returns the guard and the time spent inside.
#[inline(never)]
fn wait_for_demo_lock(lock: &Mutex<u64>) -> (MutexGuard<'_, u64>, Duration) {
    let start = Instant::now();
    let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
    (guard, start.elapsed())
}

#[inline(never)]
fn lock_waiter_thread(
    world: &World,
    lock: &Mutex<u64>,
    go: Receiver<()>,
    done: Sender<()>,
) -> WorkerStats {
    let mut stats = WorkerStats {
        tid: gettid(),
        ..WorkerStats::default()
    };
    probes::rt_start_task(WAITER_TASK);
    world.enter_managed();
    loop {
        run_task(world, WAITER_TASK, &mut stats);
        // The holder ends the run by hanging up.
        let waited = world.blocking(|| {
            go.recv().ok()?;
            let (guard, waited) = wait_for_demo_lock(lock);
            black_box(*guard);
            drop(guard);
            // The holder may already have stopped; its hanging up is seen on the next recv.
            let _ = done.send(());
            Some(waited)
        });
        let Some(waited) = waited else { break };
        stats.blocked += waited;
        stats.calls += 1;
    }
    world.leave_managed();
    probes::rt_finish_task(WAITER_TASK);
    stats
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let config = Config::from_args(&mut args)?;
    announce_ready(args.wait_for_signal())?;
    let start = Instant::now();

    let world = World::new();
    let stop = AtomicBool::new(false);
    let lock = Mutex::new(0u64);
    let (go_tx, go_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();

    let (collections, sleeper, holder, waiter) = thread::scope(|s| -> Result<_> {
        let spawn_workers = || -> std::io::Result<_> {
            probes::rt_new_task(MAIN_TASK, SLEEPER_TASK);
            let sleeper = thread::Builder::new()
                .name("sleeper".into())
                .spawn_scoped(s, || sleeper_thread(&world, &stop, config.sleep))?;
            probes::rt_new_task(MAIN_TASK, HOLDER_TASK);
            let holder = thread::Builder::new()
                .name("lock-holder".into())
                .spawn_scoped(s, || {
                    lock_holder_thread(&world, &stop, &lock, config.sleep, go_tx, done_rx)
                })?;
            probes::rt_new_task(MAIN_TASK, WAITER_TASK);
            let waiter = thread::Builder::new()
                .name("lock-waiter".into())
                .spawn_scoped(s, || lock_waiter_thread(&world, &lock, go_rx, done_tx))?;
            Ok((sleeper, holder, waiter))
        };
        let (sleeper, holder, waiter) = match spawn_workers() {
            Ok(handles) => handles,
            Err(e) => {
                // The scope joins the workers already running: let them end.
                stop.store(true, Ordering::Release);
                return Err(e.into());
            }
        };

        let collections = run_collections(&world, &config);
        stop.store(true, Ordering::Release);

        let join = |h: thread::ScopedJoinHandle<'_, WorkerStats>| {
            h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
        };
        Ok((collections, join(sleeper), join(holder), join(waiter)))
    })?;
    let wall = start.elapsed();

    let ns = |d: Duration| d.as_nanos() as u64;
    let pauses: Vec<u64> = collections.iter().map(|c| ns(c.pause)).collect();
    let inner_pauses: Vec<u64> = collections.iter().map(|c| ns(c.pause_inner)).collect();
    let stws: Vec<u64> = collections.iter().map(|c| ns(c.stw)).collect();
    let full_sweeps = collections.iter().filter(|c| c.full).count();
    let task = |name: &str, id: u64, stats: &WorkerStats| {
        format!(
            r#"{{"name":"{name}","id":{id},"tid":{},"runs":{}}}"#,
            stats.tid, stats.runs
        )
    };
    let tasks = [
        task("sleeper", SLEEPER_TASK, &sleeper),
        task("lock_holder", HOLDER_TASK, &holder),
        task("lock_waiter", WAITER_TASK, &waiter),
    ];
    print_line(&format!(
        concat!(
            r#"{{"pid":{},"gcs":{},"pause_ns":{},"pause_inner_ns":{},"stw_ns":{},"#,
            r#""sleep_in_demo_io_ns":{},"wait_for_demo_lock_ns":{},"wall_ns":{},"#,
            r#""pause_ms":{},"interval_ms":{},"sleep_ms":{},"work_us":{},"full_sweeps":{},"#,
            r#""sleep_in_demo_io_calls":{},"wait_for_demo_lock_calls":{},"wait_for_gc_end_ns":{},"#,
            r#""first_gc_begin_monotonic_ns":{},"gc_preemptions":{},"tasks":[{}]}}"#
        ),
        std::process::id(),
        config.gcs,
        json_array(&pauses),
        json_array(&inner_pauses),
        json_array(&stws),
        ns(sleeper.blocked),
        ns(waiter.blocked),
        ns(wall),
        config.pause.as_millis(),
        config.interval.as_millis(),
        config.sleep.as_millis(),
        WORK.as_micros(),
        full_sweeps,
        sleeper.calls,
        waiter.calls,
        world.gc_wait_ns.load(Ordering::Relaxed),
        // null when no collection ran.
        collections
            .first()
            .map_or("null".to_string(), |c| c.began_ns.to_string()),
        collections.iter().map(|c| c.preempted).sum::<u64>(),
        tasks.join(","),
    ))
}
