//! `forking-server`: a server of many processes, as pre-fork and fork-per-connection
//! servers are (PostgreSQL, Apache's prefork, a gunicorn): a parent that forks workers which
//! do the work, each firing USDT probe pairs of a known duration and blocking for a known
//! time in a named function. It checks that a tracer follows the processes a target forks.
//!
//! ```text
//! forking-server [--children N] [--pairs K] [--pair-ms P] [--block-ms B]
//!                [--parent-pairs M] [--wait-for-signal]
//! ```
//! Defaults: N = 3, K = 5, P = 2, B = 200, M = 0.
//!
//! # Protocol
//! As the other targets (see the crate docs): `ready pid=<PID>` on stdout, then with
//! `--wait-for-signal` it waits for SIGUSR1. Nothing below happens before that, so every
//! probe fires, and every child is forked, after a tracer attached to the parent. At the end
//! the parent prints one JSON line (see [Ground truth](#ground-truth)) and exits 0.
//!
//! # What it does
//! 1. The parent (single-threaded) does M probe pairs itself (`serve_request` below).
//! 2. It forks N children, one after the other, and then waits for them in
//!    `wait_for_children` (blocked in `waitpid`).
//! 3. Each child, at once: K probe pairs, each `serve_request(i)`: `gc__begin(i)`, sleep P ms
//!    (`std::thread::sleep`), `gc__end` (provider `tracer`, the `probes` crate's; the same
//!    pair as gc-demo's collections, so `tracer attach` also reports them as `gc_pause`).
//!    Then it blocks in `child_blocks_in_read` for B ms: a `read(2)` on a socket nothing is
//!    ever written to, with `SO_RCVTIMEO` B ms, as a worker waiting for its next request.
//!    It sends its own account of both to the parent on a pipe and leaves with `_exit(0)`.
//! 4. The parent reaps every child (in fork order), checks each exited 0, prints the truth.
//!
//! Every probe pair sleeps at least P ms between its two probes, so each latency a tracer
//! measures between them is at least P ms.
//!
//! # Ground truth
//! One JSON line: `pid` (the parent's), `children` (N), `pairs_per_child` (K),
//! `parent_pairs` (M), `total_pairs` (N * K + M: every `gc__begin`, and every `gc__end`,
//! fired by the parent and all its children), `pair_ms`, `block_ms`, `parent_pair_ns`
//! (the parent's pairs' total time, read just outside the probes), and `child_list`: one
//! object per child in fork order: `pid`, `pairs` (K), `pair_ns` (the total time of its
//! pairs, each read just before `gc__begin` and just after `gc__end`), `min_pair_ns`,
//! `max_pair_ns`, `blocked_ns` (its time inside `child_blocks_in_read`).
//!
//! Stacks: the functions named above are `#[inline(never)]`, so they show in stacks under
//! their names (`forking_server::child_blocks_in_read`, ...).

use std::hint::black_box;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use tests::{Args, announce_ready, print_line};

const USAGE: &str = "usage: forking-server [--children N] [--pairs K] [--pair-ms P] \
                     [--block-ms B] [--parent-pairs M] [--wait-for-signal]";

struct Config {
    children: u64,
    pairs: u64,
    pair: Duration,
    block: Duration,
    parent_pairs: u64,
}

impl Config {
    fn from_args(args: &mut Args) -> Result<Self> {
        let mut config = Config {
            children: 3,
            pairs: 5,
            pair: Duration::from_millis(2),
            block: Duration::from_millis(200),
            parent_pairs: 0,
        };
        while let Some(flag) = args.next_flag()? {
            match flag.as_str() {
                "--children" => config.children = args.value(&flag)?,
                "--pairs" => config.pairs = args.value(&flag)?,
                "--pair-ms" => config.pair = Duration::from_millis(args.value(&flag)?),
                "--block-ms" => config.block = Duration::from_millis(args.value(&flag)?),
                "--parent-pairs" => config.parent_pairs = args.value(&flag)?,
                "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                _ => bail!("unknown option {flag}\n{USAGE}"),
            }
        }
        ensure!(config.block > Duration::ZERO, "--block-ms must be positive");
        Ok(config)
    }
}

/// The time of K pairs: (total, min, max) in nanoseconds.
struct PairTimes {
    total_ns: u64,
    min_ns: u64,
    max_ns: u64,
}

/// One request: `gc__begin(i)`, `pair` of sleep, `gc__end`; returns its time, read just
/// outside the two probes.
#[inline(never)]
fn serve_request(i: u64, pair: Duration) -> u64 {
    let start = Instant::now();
    probes::gc_begin(i);
    std::thread::sleep(pair);
    probes::gc_end();
    start.elapsed().as_nanos() as u64
}

#[inline(never)]
fn serve_requests(n: u64, pair: Duration) -> PairTimes {
    let mut times = PairTimes {
        total_ns: 0,
        min_ns: if n == 0 { 0 } else { u64::MAX },
        max_ns: 0,
    };
    for i in 0..n {
        let ns = serve_request(black_box(i), pair);
        times.total_ns += ns;
        times.min_ns = times.min_ns.min(ns);
        times.max_ns = times.max_ns.max(ns);
    }
    times
}

/// Blocks in `read(2)` on a socket nothing is written to, for `block` (its receive
/// timeout); returns the time spent here.
#[inline(never)]
fn child_blocks_in_read(block: Duration) -> Result<u64> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    let rc = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) };
    ensure!(rc == 0, "socketpair: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created and are owned here only.
    let (ours, _peer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let timeout = libc::timeval {
        tv_sec: block.as_secs() as libc::time_t,
        tv_usec: libc::suseconds_t::from(block.subsec_micros()),
    };
    // SAFETY: `timeout` is a valid timeval of the size given.
    let rc = unsafe {
        libc::setsockopt(
            ours.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    ensure!(rc == 0, "SO_RCVTIMEO: {}", std::io::Error::last_os_error());
    let start = Instant::now();
    let deadline = start + block;
    let mut socket = std::fs::File::from(ours);
    let mut buf = [0u8; 64];
    // A signal could end a read early (none is expected): read again until the deadline.
    while Instant::now() < deadline {
        match socket.read(&mut buf) {
            Ok(n) => bail!("read {n} bytes from a socket nobody writes to"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("read"),
        }
    }
    Ok(start.elapsed().as_nanos() as u64)
}

/// A child's whole life; returns its report line for the parent.
fn child_main(config: &Config) -> Result<String> {
    let times = serve_requests(config.pairs, config.pair);
    let blocked_ns = child_blocks_in_read(config.block)?;
    Ok(format!(
        "{{\"pid\":{},\"pairs\":{},\"pair_ns\":{},\"min_pair_ns\":{},\"max_pair_ns\":{},\
         \"blocked_ns\":{blocked_ns}}}\n",
        std::process::id(),
        config.pairs,
        times.total_ns,
        times.min_ns,
        times.max_ns,
    ))
}

/// Forks one child that runs [`child_main`] and writes its report to `report`; returns its
/// pid. The child never returns.
fn fork_child(config: &Config, report: &std::fs::File) -> Result<libc::pid_t> {
    // SAFETY: the parent is single-threaded, so the child may do anything the parent could.
    let pid = unsafe { libc::fork() };
    ensure!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid > 0 {
        return Ok(pid);
    }
    let code = match child_main(config) {
        Ok(line) => {
            // One write of less than PIPE_BUF bytes: atomic, whatever the other children do.
            let mut report = report;
            match report.write_all(line.as_bytes()) {
                Ok(()) => 0,
                Err(_) => 2,
            }
        }
        Err(e) => {
            eprintln!("forking-server child {}: {e:#}", std::process::id());
            1
        }
    };
    // SAFETY: _exit ends the child at once, without running the parent's exit handlers or
    // flushing buffers it inherited.
    unsafe { libc::_exit(code) }
}

/// Reaps `children` in order; fails unless each exited 0.
#[inline(never)]
fn wait_for_children(children: &[libc::pid_t]) -> Result<()> {
    for &child in children {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; `child` is our child.
        let rc = unsafe { libc::waitpid(child, &raw mut status, 0) };
        ensure!(
            rc == child,
            "waitpid {child}: {}",
            std::io::Error::last_os_error()
        );
        ensure!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child {child} failed: wait status {status:#x}"
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let mut args = Args::from_env();
    let config = Config::from_args(&mut args)?;
    announce_ready(args.wait_for_signal())?;

    let parent = serve_requests(config.parent_pairs, config.pair);

    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    ensure!(rc == 0, "pipe: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just created and are owned here only.
    let (mut reports, writer) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    let mut children = Vec::new();
    for _ in 0..config.children {
        children.push(fork_child(&config, &writer)?);
    }
    drop(writer);
    wait_for_children(&children)?;
    let mut text = String::new();
    reports.read_to_string(&mut text)?;

    // The reports in fork order.
    let lines: Vec<&str> = text.lines().collect();
    ensure!(
        lines.len() == children.len(),
        "{} children, {} reports: {text}",
        children.len(),
        lines.len()
    );
    let mut ordered = Vec::new();
    for child in &children {
        let key = format!("{{\"pid\":{child},");
        let line = lines
            .iter()
            .find(|l| l.starts_with(&key))
            .with_context(|| format!("no report from child {child}: {text}"))?;
        ordered.push(*line);
    }
    print_line(&format!(
        "{{\"pid\":{},\"children\":{},\"pairs_per_child\":{},\"parent_pairs\":{},\
         \"total_pairs\":{},\"pair_ms\":{},\"block_ms\":{},\"parent_pair_ns\":{},\
         \"child_list\":[{}]}}",
        std::process::id(),
        config.children,
        config.pairs,
        config.parent_pairs,
        config.children * config.pairs + config.parent_pairs,
        config.pair.as_millis(),
        config.block.as_millis(),
        parent.total_ns,
        ordered.join(","),
    ))
}
