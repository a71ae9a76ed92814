//! When a trace ends: after its duration, on Ctrl-C or SIGTERM, or when the target exits.

use std::{
    fmt, io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::Duration,
};

use tokio::{
    io::unix::AsyncFd,
    runtime::Runtime,
    signal::unix::{Signal, SignalKind, signal},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    DurationElapsed,
    Interrupted,
    Terminated,
    TargetExited,
    /// Standard output went away or failed (`trace`): nobody is left to read the events.
    OutputClosed,
    /// The link keeper, which holds the uprobes, was killed.
    KeeperKilled,
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::DurationElapsed => "duration elapsed",
            Self::Interrupted => "interrupted (SIGINT)",
            Self::Terminated => "terminated (SIGTERM)",
            Self::TargetExited => "target exited",
            Self::OutputClosed => "cannot write to standard output",
            Self::KeeperKilled => "the link keeper was killed",
        })
    }
}

/// A handle that becomes readable when a process exits (a pidfd), so exit is noticed at
/// once without polling /proc.
pub(crate) struct ProcessWatch {
    fd: OwnedFd,
}

impl ProcessWatch {
    /// Watches `pid`; fails with `NotFound` when there is no such process.
    pub(crate) fn new(pid: u32) -> io::Result<Self> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ESRCH) {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no such process: {pid}"),
                ));
            }
            return Err(err);
        }
        // SAFETY: the syscall returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Self { fd })
    }

    /// Watches target `pid` of a command: "no such process" when there is none, and
    /// other failures (out of file descriptors, say) as what they are.
    pub(crate) fn target(pid: u32) -> anyhow::Result<Self> {
        Self::new(pid).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => crate::system::procfs::ProcessError::NoSuch(pid).into(),
            _ => anyhow::Error::new(e).context(format!("cannot watch process {pid}")),
        })
    }

    /// Whether the process has exited by now (a zombie has), without waiting.
    pub(crate) fn has_exited(&self) -> bool {
        self.exits_within(Duration::ZERO)
    }

    /// Whether the process has exited, or does within `wait` (the thread waits).
    pub(crate) fn exits_within(&self, wait: Duration) -> bool {
        let mut poll = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let timeout_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd, a pidfd this owns.
        let ready = unsafe { libc::poll(&raw mut poll, 1, timeout_ms) };
        ready > 0 && poll.revents & libc::POLLIN != 0
    }

    /// Resolves when the process has exited. Must run inside the tokio runtime.
    pub(crate) async fn exited(self) {
        // SAFETY: the pidfd is owned by the AsyncFd from here on and stays open until it
        // is dropped.
        match unsafe { AsyncFd::register(self.fd) } {
            Ok(fd) => {
                let _ = fd.readable().await;
            }
            // Without the reactor, never report an exit we did not see.
            Err(_) => std::future::pending().await,
        }
    }
}

/// Ctrl-C (SIGINT) and SIGTERM, caught from the moment this exists. Until then their
/// default action kills the tracer without a report, so catch them before telling the
/// user the trace has started (or starting a traced command).
pub(crate) struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
}

impl StopSignals {
    /// Starts catching the signals for a trace that will run on `runtime`.
    pub(crate) fn catch(runtime: &Runtime) -> io::Result<Self> {
        let _context = runtime.enter();
        Self::catch_here()
    }

    /// Starts catching the signals; must run inside the tokio runtime.
    fn catch_here() -> io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }
}

/// Runs `work` until the first reason to stop: a signal caught beforehand by
/// [`StopSignals::catch`], the exit of `target`, the end of `duration`, or `work`'s own
/// (its reason to stop, or its error).
pub(crate) async fn run_until_stopped_with(
    mut signals: StopSignals,
    target: Option<ProcessWatch>,
    duration: Option<Duration>,
    work: impl Future<Output = io::Result<StopReason>>,
) -> io::Result<StopReason> {
    let deadline = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let target_exit = async {
        match target {
            Some(watch) => watch.exited().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = deadline => Ok(StopReason::DurationElapsed),
        _ = signals.interrupt.recv() => Ok(StopReason::Interrupted),
        _ = signals.terminate.recv() => Ok(StopReason::Terminated),
        () = target_exit => Ok(StopReason::TargetExited),
        result = work => result,
    }
}

/// Runs `work` and `watch` until either finishes (with its reason to stop, or error).
pub(crate) async fn either(
    work: impl Future<Output = io::Result<StopReason>>,
    watch: impl Future<Output = io::Result<StopReason>>,
) -> io::Result<StopReason> {
    tokio::select! {
        result = work => result,
        result = watch => result,
    }
}

/// Gives SIGINT and SIGTERM their default action back once a run has stopped and
/// detached: a second Ctrl-C then ends a tracer that waits on its output at once.
pub(crate) fn restore_default_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: signal has no memory preconditions; SIG_DFL is always valid.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The time of `clock` in nanoseconds.
pub(crate) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    unsafe { libc::clock_gettime(clock, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
