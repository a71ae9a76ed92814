//! `bench-usdt-loop`: the USDT workloads of `cargo xtask bench` (figures 1, 2 and 4).
//!
//! ```text
//! bench-usdt-loop --compare-disabled [--iters N] [--rounds R]
//! bench-usdt-loop [--iters N] [--wait-for-signal]
//! bench-usdt-loop --calls [--iters N] [--wait-for-signal]
//! bench-usdt-loop --forever [--interval-us U]
//! ```
//! - `--compare-disabled` (figure 1, nothing attached): R rounds (default 11), each timing
//!   a loop of N iterations (default 100 000 000) that calls `probes::gc_begin(i)` and an
//!   identical loop without the probe, alternating which loop runs first. Prints one JSON
//!   line `{"iters":N,"with_probe_ns":[..],"without_probe_ns":[..]}`.
//! - default (figure 2): prints `ready pid=<PID>`, waits for SIGUSR1 with
//!   `--wait-for-signal`, then times N iterations (default 1 000 000) of the probe loop
//!   with `clock_gettime(CLOCK_MONOTONIC)` around it and prints `{"iters":N,"ns":T}`. Run
//!   untraced, the probe is disabled (semaphore 0); traced, every iteration is one event
//!   of `tracer:gc__begin`.
//! - `--calls` (figure 9): as the default, each iteration a call of the function
//!   `bench_collect` (never inlined), which holds the probe site: a function probe on it
//!   and the USDT probe within it fire once per iteration.
//! - `--forever` (figure 4): prints `ready pid=<PID>`, then fires `tracer:gc__begin(i)`
//!   every U µs (default 100; 0 = back to back) until killed.
//!
//! Both loops go through [`std::hint::black_box`] with the counter, so the compiler keeps
//! every iteration (it stores the counter to the stack; black_box also clobbers memory, so
//! the semaphore is re-read every iteration, as it must be). The only difference between
//! them is the probe site: with nothing attached, one `cmpw $0,(reg)` on the semaphore and
//! its branch (the counter's address comes from the GOT, loaded once before the loop).
//!
//! Each loop starts on a 64-byte boundary ([`align_loop`]). Without that the figure measured
//! code layout, not the probe: the probe makes the loop 6 bytes longer, and where the
//! linker happened to put it across a 64-byte boundary the loop ran at about half speed
//! (+0.3 to +0.8 ns/iteration on the bench VM, the same with a C `sys/sdt.h` probe placed
//! across a boundary); within one 64-byte block it runs at the speed of the empty loop.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::Result;
use tests::{Args, announce_ready, json_array, print_line};

enum Mode {
    CompareDisabled,
    Loop,
    Calls,
    Forever,
}

struct Config {
    mode: Mode,
    iters: Option<u64>,
    rounds: usize,
    interval_us: u64,
}

impl Config {
    fn from_args(args: &mut Args) -> Result<Self> {
        let mut config = Config {
            mode: Mode::Loop,
            iters: None,
            rounds: 11,
            interval_us: 100,
        };
        while let Some(flag) = args.next_flag()? {
            match flag.as_str() {
                "--compare-disabled" => {
                    args.no_value(&flag)?;
                    config.mode = Mode::CompareDisabled;
                }
                "--forever" => {
                    args.no_value(&flag)?;
                    config.mode = Mode::Forever;
                }
                "--calls" => {
                    args.no_value(&flag)?;
                    config.mode = Mode::Calls;
                }
                "--iters" => config.iters = Some(args.value(&flag)?),
                "--rounds" => config.rounds = args.value(&flag)?,
                "--interval-us" => config.interval_us = args.value(&flag)?,
                _ => anyhow::bail!("unknown flag {flag}"),
            }
        }
        Ok(config)
    }
}

/// Starts the code that follows on a 64-byte boundary, so that each timed loop (the few
/// set-up instructions before it, then the loop, 16-byte aligned by the compiler) lies in
/// one 64-byte block whatever the linker does with the functions around it; check with
/// `objdump -d`. The padding runs once, before the loop.
#[inline(always)]
fn align_loop() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: only padding (nops, executed once); no register, memory or flag is touched.
    unsafe {
        std::arch::asm!(".p2align 6", options(nomem, nostack, preserves_flags));
    }
}

/// N iterations with a `probes` probe site.
#[inline(never)]
fn with_probe(n: u64) -> Duration {
    let start = Instant::now();
    align_loop();
    for i in 0..n {
        probes::gc_begin(i);
        black_box(i);
    }
    start.elapsed()
}

/// A function standing in for a runtime's collection: what function probes attach to.
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn bench_collect(i: u64) -> u64 {
    probes::gc_begin(i);
    black_box(i)
}

/// N calls of [`bench_collect`].
#[inline(never)]
fn with_calls(n: u64) -> Duration {
    let start = Instant::now();
    align_loop();
    for i in 0..n {
        black_box(bench_collect(i));
    }
    start.elapsed()
}

/// The same loop without the probe site.
#[inline(never)]
fn without_probe(n: u64) -> Duration {
    let start = Instant::now();
    align_loop();
    for i in 0..n {
        black_box(i);
    }
    start.elapsed()
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let config = Config::from_args(&mut args)?;
    match config.mode {
        Mode::CompareDisabled => {
            let n = config.iters.unwrap_or(100_000_000);
            // One untimed warm-up of each, then alternate the order round by round.
            with_probe(n / 10);
            without_probe(n / 10);
            let mut with = Vec::with_capacity(config.rounds);
            let mut without = Vec::with_capacity(config.rounds);
            for round in 0..config.rounds {
                if round % 2 == 0 {
                    with.push(with_probe(n).as_nanos());
                    without.push(without_probe(n).as_nanos());
                } else {
                    without.push(without_probe(n).as_nanos());
                    with.push(with_probe(n).as_nanos());
                }
            }
            print_line(&format!(
                r#"{{"iters":{n},"with_probe_ns":{},"without_probe_ns":{}}}"#,
                json_array(&with),
                json_array(&without)
            ))
        }
        Mode::Loop => {
            let n = config.iters.unwrap_or(1_000_000);
            announce_ready(args.wait_for_signal())?;
            let elapsed = with_probe(n);
            print_line(&format!(r#"{{"iters":{n},"ns":{}}}"#, elapsed.as_nanos()))
        }
        Mode::Calls => {
            let n = config.iters.unwrap_or(1_000_000);
            announce_ready(args.wait_for_signal())?;
            let elapsed = with_calls(n);
            print_line(&format!(r#"{{"iters":{n},"ns":{}}}"#, elapsed.as_nanos()))
        }
        Mode::Forever => {
            announce_ready(false)?;
            let interval = Duration::from_micros(config.interval_us);
            let mut i = 0u64;
            loop {
                probes::gc_begin(i);
                i = i.wrapping_add(1);
                if !interval.is_zero() {
                    std::thread::sleep(interval);
                }
            }
        }
    }
}
