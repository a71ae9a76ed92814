//! `pingpong`: the context-switch-heavy workload of `cargo xtask bench` (figure 3).
//!
//! ```text
//! pingpong [--round-trips N] [--wait-for-signal]
//! ```
//! Prints `ready pid=<PID>`, waits for SIGUSR1 with `--wait-for-signal`, then starts a
//! second thread (`pong`) and bounces one byte between the two threads through two pipes
//! N times (default 200 000): the main thread writes to the first pipe and blocks
//! reading the second, `pong` does the opposite. Every round trip blocks each thread once,
//! so it is at least two context switches (four on two CPUs, where each side switches to
//! and from the idle task). The N round trips are timed with `clock_gettime(CLOCK_MONOTONIC)`
//! (thread start included) and the program prints one JSON line `{"round_trips":N,"ns":T}`.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::FromRawFd as _;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use tests::{Args, announce_ready, print_line};

/// A pipe as (read end, write end).
fn pipe() -> Result<(File, File)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe2");
    }
    // SAFETY: both descriptors are new and owned by nothing else.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

#[inline(never)]
fn ping(n: u64, to_pong: &mut File, from_pong: &mut File) -> Result<()> {
    let mut byte = [0u8; 1];
    for i in 0..n {
        byte[0] = i as u8;
        to_pong.write_all(&byte)?;
        from_pong.read_exact(&mut byte)?;
    }
    Ok(())
}

#[inline(never)]
fn pong(n: u64, from_ping: &mut File, to_ping: &mut File) -> Result<()> {
    let mut byte = [0u8; 1];
    for _ in 0..n {
        from_ping.read_exact(&mut byte)?;
        to_ping.write_all(&byte)?;
    }
    Ok(())
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let mut n: u64 = 200_000;
    while let Some(flag) = args.next_flag()? {
        match flag.as_str() {
            "--round-trips" => n = args.value(&flag)?,
            _ => bail!("unknown flag {flag}"),
        }
    }
    announce_ready(args.wait_for_signal())?;

    let (mut a_read, mut a_write) = pipe()?;
    let (mut b_read, mut b_write) = pipe()?;
    let start = Instant::now();
    let pong_thread = std::thread::Builder::new()
        .name("pong".into())
        .spawn(move || pong(n, &mut a_read, &mut b_write))?;
    ping(n, &mut a_write, &mut b_read)?;
    pong_thread
        .join()
        .map_err(|_| anyhow::anyhow!("pong thread panicked"))??;
    let elapsed = start.elapsed();
    print_line(&format!(
        r#"{{"round_trips":{n},"ns":{}}}"#,
        elapsed.as_nanos()
    ))
}
