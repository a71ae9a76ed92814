//! `blocked-threads`: named threads blocked for good in three different system calls, and
//! one spinning, for `tracer stacks`.
//!
//! ```text
//! blocked-threads [--seconds S] [--wait-for-signal]
//! ```
//! Default S = 60: the process exits (code 0) after S seconds.
//!
//! # Protocol
//! As every target here (see the `tests` crate docs): stdout gets `ready pid=<PID>`, then
//! with `--wait-for-signal` the program blocks until SIGUSR1. Threads are spawned only
//! after the signal; once each is about to block, one JSON line: `{"pid":P,"tids":{NAME:
//! TID,...}}`. Then the main thread sleeps S seconds and the process exits.
//!
//! # Threads
//! Each blocks (or spins) in its own `#[inline(never)]` function:
//! - `lock-holder`: `hold_lock`, takes the lock and keeps it, waiting on a channel
//!   nobody sends to;
//! - `futex-waiter`: `block_in_futex`, `Mutex::lock` on that lock (futex);
//! - `sleeper`: `block_in_nanosleep`, `std::thread::sleep` for an hour (clock_nanosleep);
//! - `pipe-reader`: `block_in_read`, `read` on a pipe whose write end is open but never
//!   written;
//! - `spinner`: `spin_forever`, adds to a counter on the CPU, for ever.

use std::fs::File;
use std::hint::black_box;
use std::io::Read;
use std::os::fd::FromRawFd as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tests::{Args, announce_ready, gettid, print_line};

const USAGE: &str = "usage: blocked-threads [--seconds S] [--wait-for-signal]";

#[inline(never)]
fn hold_lock(lock: &Mutex<u64>, held: mpsc::Sender<()>, never: mpsc::Receiver<()>) {
    let guard = lock.lock().unwrap();
    held.send(()).unwrap();
    // Nobody sends: blocked (holding the lock) until the process exits.
    let _ = black_box(never.recv());
    drop(guard);
}

#[inline(never)]
fn block_in_futex(lock: &Mutex<u64>) -> u64 {
    *black_box(lock.lock().unwrap())
}

#[inline(never)]
fn block_in_nanosleep() {
    thread::sleep(black_box(Duration::from_secs(3600)));
}

#[inline(never)]
fn block_in_read(mut pipe: File) -> usize {
    let mut buf = [0u8; 64];
    black_box(pipe.read(&mut buf).unwrap_or(0))
}

#[inline(never)]
fn spin_forever(counter: &AtomicU64) -> ! {
    loop {
        counter.fetch_add(1, Ordering::Relaxed);
        black_box(counter);
    }
}

/// Spawns thread `name`, which reports its thread id to `tids` and then runs `body`.
fn spawn(
    name: &'static str,
    tids: &mpsc::Sender<(&'static str, i32)>,
    body: impl FnOnce() + Send + 'static,
) -> Result<()> {
    let tids = tids.clone();
    thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _ = tids.send((name, gettid()));
            drop(tids);
            body();
        })
        .with_context(|| format!("spawning {name}"))?;
    Ok(())
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let mut seconds: u64 = 60;
    while let Some(flag) = args.next_flag()? {
        match flag.as_str() {
            "--seconds" => seconds = args.value(&flag)?,
            "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ => bail!("unknown option {flag}\n{USAGE}"),
        }
    }
    announce_ready(args.wait_for_signal())?;

    let (tids_tx, tids_rx) = mpsc::channel();
    let lock = Arc::new(Mutex::new(0u64));
    let (held_tx, held_rx) = mpsc::channel();
    let (_never_tx, never_rx) = mpsc::channel();
    let holder_lock = Arc::clone(&lock);
    spawn("lock-holder", &tids_tx, move || {
        hold_lock(&holder_lock, held_tx, never_rx);
    })?;
    held_rx.recv().context("the lock holder died")?;
    spawn("futex-waiter", &tids_tx, move || {
        block_in_futex(&lock);
    })?;
    spawn("sleeper", &tids_tx, block_in_nanosleep)?;
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe writes.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: the read end is ours alone from here on; the write end stays open (unused)
    // until the process exits, so the read blocks.
    let reader = unsafe { File::from_raw_fd(fds[0]) };
    spawn("pipe-reader", &tids_tx, move || {
        block_in_read(reader);
    })?;
    let counter: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
    spawn("spinner", &tids_tx, move || spin_forever(counter))?;
    drop(tids_tx);

    let tids: Vec<String> = tids_rx
        .iter()
        .map(|(name, tid)| format!("\"{name}\":{tid}"))
        .collect();
    print_line(&format!(
        r#"{{"pid":{},"tids":{{{}}}}}"#,
        std::process::id(),
        tids.join(",")
    ))?;
    thread::sleep(Duration::from_secs(seconds));
    // The blocked threads never return: end the process with them.
    std::process::exit(0);
}
