//! Target programs for the tracer's end-to-end tests, and the few helpers they share.
//!
//! The targets live in `src/bin/`:
//! - `gc-demo`: a tiny runtime with a simulated stop-the-world GC, worker threads that sleep
//!   and contend on a lock, and the `probes` crate's USDT probes; it prints its own ground
//!   truth (pauses, stop-the-world latencies, time spent sleeping and blocked) as JSON.
//! - `wallclock-demo`: three threads spending the same wall time spinning, sleeping and
//!   blocked on a lock, with their own clocks' account of it, for `tracer profile`.
//! - `jit-demo`: runs code it generated at run time and names it in a perf map
//!   (`/tmp/perf-PID.map`), as JIT compilers do.
//! - `usdt-args`: USDT probes under provider `tracer_test` whose argument specs cover every
//!   x86-64 form, with known values, to check decoded arguments one by one.
//! - `blocked-threads`: named threads blocked for good in futex, clock_nanosleep and read,
//!   and one spinning, for `tracer stacks` (it prints its thread ids once they block and
//!   exits after a while rather than at the end of a workload).
//! - `forking-server`: a parent that forks N children, each firing K probe pairs of a known
//!   length and blocking for a known time in a named function, as pre-fork servers do; it
//!   prints every child's pid and its own account of each, for tracing services of many
//!   processes.
//!
//! They follow the same protocol so a tracer can attach before the workload starts: they
//! print `ready pid=<PID>` on stdout (flushed), then, with `--wait-for-signal`, wait for
//! SIGUSR1; at the end they print one JSON line on stdout and exit 0.

use std::io::{self, Write};
use std::str::FromStr;

use anyhow::{Context, Result, bail};

/// Prints `ready pid=<PID>` on stdout and, if `wait_for_signal`, blocks until SIGUSR1 arrives.
///
/// SIGUSR1 is blocked in the calling thread first, whether or not the program waits, so a
/// signal sent as soon as the line is read can neither be lost nor kill the process, and
/// threads spawned afterwards inherit the mask: later SIGUSR1s are harmless. Call it before
/// spawning any thread.
pub fn announce_ready(wait_for_signal: bool) -> Result<()> {
    // SAFETY: `set` is a plain sigset_t initialised by sigemptyset before any other use.
    let set = unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&raw mut set);
        libc::sigaddset(&raw mut set, libc::SIGUSR1);
        set
    };
    // SAFETY: `set` is a valid signal set; the old mask is not wanted.
    let rc =
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc)).context("blocking SIGUSR1");
    }

    let mut stdout = io::stdout().lock();
    writeln!(stdout, "ready pid={}", std::process::id())?;
    stdout.flush()?;
    drop(stdout);

    if wait_for_signal {
        loop {
            let mut sig = 0;
            // SAFETY: `set` is a valid signal set and `sig` a valid out-pointer.
            let rc = unsafe { libc::sigwait(&raw const set, &raw mut sig) };
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc)).context("waiting for SIGUSR1");
            }
            if sig == libc::SIGUSR1 {
                break;
            }
        }
    }
    Ok(())
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of eBPF's `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), ns.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// The time of `clock` in nanoseconds.
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    unsafe { libc::clock_gettime(clock, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The kernel thread id of the calling thread.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

/// The calling thread's involuntary context switches so far (preemptions).
pub fn preemptions() -> u64 {
    // SAFETY: rusage is plain data; getrusage fills it for the calling thread.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &raw mut usage);
        usage.ru_nivcsw as u64
    }
}

/// A hand-rolled parser for `--flag`, `--flag VALUE` and `--flag=VALUE` arguments.
pub struct Args {
    args: std::vec::IntoIter<String>,
    pending_value: Option<String>,
    wait_for_signal: bool,
}

const WAIT_FOR_SIGNAL: &str = "--wait-for-signal";

impl Args {
    /// The arguments of this process, without the program name.
    pub fn from_env() -> Self {
        Self::new(std::env::args().skip(1).collect())
    }

    /// Parses the given arguments (without the program name).
    pub fn new(args: Vec<String>) -> Self {
        Self {
            args: args.into_iter(),
            pending_value: None,
            wait_for_signal: false,
        }
    }

    /// The next flag, with any `=VALUE` part kept for [`Args::value`]; `None` at the end.
    /// `--wait-for-signal`, which every target takes, is taken here: see
    /// [`Args::wait_for_signal`].
    pub fn next_flag(&mut self) -> Result<Option<String>> {
        loop {
            if let Some(value) = self.pending_value.take() {
                bail!("unexpected value {value:?}");
            }
            let Some(arg) = self.args.next() else {
                return Ok(None);
            };
            if !arg.starts_with("--") {
                bail!("unexpected argument {arg:?}");
            }
            let flag = match arg.split_once('=') {
                Some((flag, value)) => {
                    self.pending_value = Some(value.to_owned());
                    flag.to_owned()
                }
                None => arg,
            };
            if flag != WAIT_FOR_SIGNAL {
                return Ok(Some(flag));
            }
            self.no_value(WAIT_FOR_SIGNAL)?;
            self.wait_for_signal = true;
        }
    }

    /// Whether `--wait-for-signal` was among the flags read so far.
    pub fn wait_for_signal(&self) -> bool {
        self.wait_for_signal
    }

    /// The value of `flag`, the flag just returned by [`Args::next_flag`].
    pub fn value<T>(&mut self, flag: &str) -> Result<T>
    where
        T: FromStr,
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        let value = match self.pending_value.take() {
            Some(value) => value,
            None => self
                .args
                .next()
                .with_context(|| format!("{flag} needs a value"))?,
        };
        value
            .parse()
            .with_context(|| format!("invalid value {value:?} for {flag}"))
    }

    /// Fails if the flag just returned by [`Args::next_flag`] was given a `=VALUE`.
    pub fn no_value(&mut self, flag: &str) -> Result<()> {
        match self.pending_value.take() {
            Some(value) => bail!("{flag} takes no value, got {value:?}"),
            None => Ok(()),
        }
    }
}

/// Formats numbers as a JSON array: `[1,2,3]`.
pub fn json_array<T: std::fmt::Display>(values: &[T]) -> String {
    let items: Vec<String> = values.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(","))
}

/// Writes one line to stdout and flushes it.
pub fn print_line(line: &str) -> Result<()> {
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Args {
        Args::new(list.iter().map(std::string::ToString::to_string).collect())
    }

    #[test]
    fn parses_separate_and_inline_values() {
        let mut a = args(&["--gcs", "3", "--pause-ms=7", "--wait-for-signal"]);
        assert_eq!(a.next_flag().unwrap().as_deref(), Some("--gcs"));
        assert_eq!(a.value::<u64>("--gcs").unwrap(), 3);
        assert_eq!(a.next_flag().unwrap().as_deref(), Some("--pause-ms"));
        assert_eq!(a.value::<u64>("--pause-ms").unwrap(), 7);
        assert!(!a.wait_for_signal());
        assert_eq!(a.next_flag().unwrap(), None);
        assert!(a.wait_for_signal());
    }

    #[test]
    fn rejects_bad_input() {
        let mut a = args(&["--gcs"]);
        a.next_flag().unwrap();
        assert!(a.value::<u64>("--gcs").is_err());
        let mut a = args(&["--gcs", "x"]);
        a.next_flag().unwrap();
        assert!(a.value::<u64>("--gcs").is_err());
        assert!(args(&["gcs"]).next_flag().is_err());
        assert!(args(&["--wait-for-signal=1"]).next_flag().is_err());
    }

    #[test]
    fn formats_arrays() {
        assert_eq!(json_array::<u64>(&[]), "[]");
        assert_eq!(json_array(&[1u64, 2, 3]), "[1,2,3]");
    }
}
