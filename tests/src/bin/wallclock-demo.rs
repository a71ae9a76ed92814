//! `wallclock-demo`: three threads that spend the same wall time in three different ways,
//! so a wall-clock profiler can be checked against known shares.
//!
//! ```text
//! wallclock-demo [--ms D] [--wait-for-signal]
//! ```
//! Default D = 1500.
//!
//! # Protocol
//! As gc-demo: `ready pid=<PID>` on stdout (flushed), then with `--wait-for-signal` wait
//! for SIGUSR1; at the end one JSON line (see below) and exit 0. Threads are spawned only
//! after the signal.
//!
//! # Threads
//! After the signal a `holder` thread takes the demo lock and keeps it, sleeping in
//! `hold_lock`, until the deadline (D ms after the lock was taken). Then three threads
//! start, each in its own `#[inline(never)]` function until the deadline:
//! - `spinner`: `spin_on_cpu`, arithmetic on the CPU, reading the clock only every ~50 µs
//!   (so samples land in the function itself, not in the vDSO);
//! - `sleeper`: `sleep_off_cpu`, `std::thread::sleep` in 10 ms steps;
//! - `waiter`: `wait_on_lock`, blocked in `Mutex::lock` until the holder lets go.
//!
//! # Ground truth
//! One JSON line: `pid`, `ms` (D), `spin_on_cpu_ns`, `sleep_off_cpu_ns`,
//! `wait_on_lock_ns` (time spent inside each function, by its own clock reads),
//! `spin_cpu_ns` (CPU time the spinner got in `spin_on_cpu`: less than its wall time when
//! the machine is busy and it waits preempted), and the
//! `tid`s `spinner_tid`, `sleeper_tid`, `waiter_tid`.
//!
//! Stacks: the workspace builds with frame pointers, so eBPF can walk these stacks.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use tests::{Args, announce_ready, gettid, print_line, thread_cpu_ns};

const USAGE: &str = "usage: wallclock-demo [--ms D] [--wait-for-signal]";

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let mut ms: u64 = 1500;
    while let Some(flag) = args.next_flag()? {
        match flag.as_str() {
            "--ms" => ms = args.value(&flag)?,
            "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ => bail!("unknown option {flag}\n{USAGE}"),
        }
    }
    announce_ready(args.wait_for_signal())?;

    let lock = Arc::new(Mutex::new(0u64));
    let (held_tx, held_rx) = mpsc::channel();
    let holder = {
        let lock = Arc::clone(&lock);
        thread::Builder::new()
            .name("holder".into())
            .spawn(move || {
                let mut guard = lock.lock().unwrap();
                let deadline = Instant::now() + Duration::from_millis(ms);
                held_tx.send(deadline).unwrap();
                hold_lock(deadline);
                *guard += 1;
            })?
    };
    let deadline: Instant = held_rx.recv()?;

    let spawn = |name: &str, work: Box<dyn FnOnce() -> u64 + Send>| {
        thread::Builder::new()
            .name(name.into())
            .spawn(move || (gettid(), work()))
    };
    let spinner = spawn("spinner", Box::new(move || spin_on_cpu(deadline)))?;
    let sleeper = spawn("sleeper", Box::new(move || sleep_off_cpu(deadline)))?;
    let waiter = {
        let lock = Arc::clone(&lock);
        spawn("waiter", Box::new(move || wait_on_lock(&lock)))?
    };
    let (spinner_tid, spin_ns) = spinner.join().unwrap();
    let (sleeper_tid, sleep_ns) = sleeper.join().unwrap();
    let (waiter_tid, wait_ns) = waiter.join().unwrap();
    holder.join().unwrap();
    print_line(&format!(
        "{{\"pid\":{},\"ms\":{ms},\"spin_on_cpu_ns\":{spin_ns},\"sleep_off_cpu_ns\":{sleep_ns},\
         \"wait_on_lock_ns\":{wait_ns},\"spin_cpu_ns\":{},\"spinner_tid\":{spinner_tid},\
         \"sleeper_tid\":{sleeper_tid},\"waiter_tid\":{waiter_tid}}}",
        std::process::id(),
        SPIN_CPU_NS.load(Ordering::Relaxed)
    ))
}

/// CPU time the spinner got inside `spin_on_cpu` (it may be preempted on a busy machine).
static SPIN_CPU_NS: AtomicU64 = AtomicU64::new(0);

/// Runs on the CPU until `deadline`; returns the time spent here.
#[inline(never)]
fn spin_on_cpu(deadline: Instant) -> u64 {
    let start = Instant::now();
    let cpu_start = thread_cpu_ns();
    let mut x: u64 = 1;
    while Instant::now() < deadline {
        // ~50 µs of arithmetic between clock reads.
        for i in 0..50_000u64 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    black_box(x);
    SPIN_CPU_NS.store(thread_cpu_ns() - cpu_start, Ordering::Relaxed);
    start.elapsed().as_nanos() as u64
}

/// Sleeps in 10 ms steps until `deadline`; returns the time spent here.
#[inline(never)]
fn sleep_off_cpu(deadline: Instant) -> u64 {
    let start = Instant::now();
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        thread::sleep((deadline - now).min(Duration::from_millis(10)));
    }
    start.elapsed().as_nanos() as u64
}

/// Blocks on `lock` until its holder lets go; returns the time spent here.
#[inline(never)]
fn wait_on_lock(lock: &Mutex<u64>) -> u64 {
    let start = Instant::now();
    let mut guard = lock.lock().unwrap();
    *guard += 1;
    drop(guard);
    start.elapsed().as_nanos() as u64
}

/// Holds the lock (the caller does) by sleeping until `deadline`.
#[inline(never)]
fn hold_lock(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        thread::sleep(deadline - now);
    }
    black_box(());
}
