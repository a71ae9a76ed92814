//! Starting a command paused, so probes are attached before its first instruction: the
//! child is forked and waits on a pipe; `resume` lets it exec.

use std::{
    ffi::{CString, OsStr},
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

/// A forked child waiting to exec its command.
pub(crate) struct PausedChild {
    pub pid: u32,
    /// The absolute path of the program it will run.
    pub exe: PathBuf,
    go: Option<OwnedFd>,
    /// How it ended, once reaped (its PID may be reused from then on: never signal it).
    ended: std::cell::Cell<Option<CommandEnd>>,
}

impl PausedChild {
    /// Forks a child that will run `argv` once resumed. Call before starting any thread
    /// that could hold a lock the child would need (the child only calls read, execve and
    /// _exit, which are async-signal-safe).
    pub(crate) fn spawn(argv: &[String]) -> Result<Self> {
        let program = argv.first().context("no command given after --")?;
        let exe = find_program(program)?;
        let c_exe = cstring(exe.as_os_str())?;
        let c_args: Vec<CString> = argv
            .iter()
            .map(|a| cstring(OsStr::new(a)))
            .collect::<Result<_>>()?;
        let mut arg_ptrs: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
        arg_ptrs.push(std::ptr::null());
        let c_env: Vec<CString> = std::env::vars_os()
            .filter_map(|(k, v)| {
                let mut entry = k.as_bytes().to_vec();
                entry.push(b'=');
                entry.extend_from_slice(v.as_bytes());
                CString::new(entry).ok()
            })
            .collect();
        let mut env_ptrs: Vec<*const libc::c_char> = c_env.iter().map(|e| e.as_ptr()).collect();
        env_ptrs.push(std::ptr::null());

        let mut fds = [0; 2];
        // SAFETY: fds is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error()).context("pipe2");
        }
        // SAFETY: both fds were just created and are owned here only.
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: after fork the child only uses async-signal-safe calls (close, read,
        // execve, _exit) on memory prepared before the fork.
        match unsafe { libc::fork() } {
            -1 => Err(io::Error::last_os_error()).context("fork"),
            // SAFETY: the child of the fork, as said above: only async-signal-safe calls.
            0 => unsafe {
                libc::close(write_end.as_raw_fd());
                let mut byte = 0u8;
                let n = libc::read(read_end.as_raw_fd(), (&raw mut byte).cast(), 1);
                if n == 1 {
                    libc::close(read_end.as_raw_fd());
                    libc::execve(c_exe.as_ptr(), arg_ptrs.as_ptr(), env_ptrs.as_ptr());
                    libc::_exit(127);
                }
                // The tracer gave up before attaching: do not run the command untraced.
                libc::_exit(126)
            },
            pid => {
                drop(read_end);
                Ok(Self {
                    pid: pid as u32,
                    exe,
                    go: Some(write_end),
                    ended: std::cell::Cell::new(None),
                })
            }
        }
    }

    /// Lets the child exec its command.
    pub(crate) fn resume(&mut self) -> Result<()> {
        if let Some(go) = self.go.take() {
            // SAFETY: writing one byte from a valid buffer to an fd we own.
            let n = unsafe { libc::write(go.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
            if n != 1 {
                bail!("cannot start the command: {}", io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Reaps the child once it has exited; returns its exit code (128+signal if killed).
    pub(crate) fn wait(&self) -> Option<i32> {
        self.wait_with(0).map(CommandEnd::code)
    }

    /// Ends the command once tracing has ended, as bpftrace's `-c` does: a command still
    /// running gets SIGTERM, then SIGKILL after [`TERMINATE_GRACE`]. Returns how it ended
    /// (`None` if it was never started or already reaped).
    pub(crate) fn finish(&self) -> Option<CommandEnd> {
        if let Some(end) = self.ended.get() {
            return Some(end);
        }
        if let Some(end) = self.wait_with(libc::WNOHANG) {
            return Some(end);
        }
        // SAFETY: kill has no memory preconditions; the pid is our unreaped child.
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + TERMINATE_GRACE;
        while std::time::Instant::now() < deadline {
            if let Some(end) = self.wait_with(libc::WNOHANG) {
                self.ended.set(Some(end.terminated_by_us()));
                return self.ended.get();
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // SAFETY: as above.
        unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        let end = self.wait_with(0).map(CommandEnd::terminated_by_us);
        self.ended.set(end);
        end
    }

    /// waitpid with `flags`: how the child ended, or `None` (still running with WNOHANG,
    /// or not our child any more).
    fn wait_with(&self, flags: i32) -> Option<CommandEnd> {
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(self.pid as i32, &raw mut status, flags) };
        if r != self.pid as i32 {
            return None;
        }
        let end = if libc::WIFEXITED(status) {
            CommandEnd::Exited(libc::WEXITSTATUS(status))
        } else {
            CommandEnd::Signaled {
                signal: libc::WTERMSIG(status),
                by_tracer: false,
            }
        };
        self.ended.set(Some(end));
        Some(end)
    }
}

/// How long a command may take to exit after SIGTERM before it gets SIGKILL.
pub(crate) const TERMINATE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// How a traced command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommandEnd {
    /// It exited with this status.
    Exited(i32),
    /// A signal ended it; `by_tracer` when the tracer sent it because tracing ended.
    Signaled { signal: i32, by_tracer: bool },
}

impl CommandEnd {
    /// The shell's view: the exit status, or 128 + the signal.
    pub(crate) fn code(self) -> i32 {
        match self {
            Self::Exited(code) => code,
            Self::Signaled { signal, .. } => 128 + signal,
        }
    }

    fn terminated_by_us(self) -> Self {
        match self {
            Self::Signaled { signal, .. } => Self::Signaled {
                signal,
                by_tracer: true,
            },
            exited @ Self::Exited(_) => exited,
        }
    }
}

impl std::fmt::Display for CommandEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |signal: i32| match signal {
            libc::SIGTERM => "SIGTERM".to_string(),
            libc::SIGKILL => "SIGKILL".to_string(),
            libc::SIGINT => "SIGINT".to_string(),
            other => format!("signal {other}"),
        };
        match self {
            Self::Exited(code) => write!(f, "command exited with {code}"),
            Self::Signaled {
                signal,
                by_tracer: true,
            } => write!(
                f,
                "command terminated with {} as tracing ended",
                name(*signal)
            ),
            Self::Signaled { signal, .. } => write!(f, "command killed by {}", name(*signal)),
        }
    }
}

impl Drop for PausedChild {
    fn drop(&mut self) {
        // Never resumed: closing the pipe makes the child exit without running anything.
        if self.go.take().is_some() {
            let _ = self.wait();
        } else if self.ended.get().is_none() {
            // A trace that failed after the command started: it does not outlive it.
            let _ = self.finish();
        }
    }
}

fn cstring(s: &OsStr) -> Result<CString> {
    CString::new(s.as_bytes()).with_context(|| format!("{s:?} contains a NUL byte"))
}

/// Resolves a program name like a shell does: a path if it has a slash, else via $PATH.
fn find_program(program: &str) -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = if program.contains('/') {
        vec![PathBuf::from(program)]
    } else {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|dir| dir.join(program))
            .collect()
    };
    for candidate in candidates {
        if is_executable(&candidate) {
            return std::fs::canonicalize(&candidate)
                .with_context(|| format!("{}", candidate.display()));
        }
    }
    bail!("command not found: {program}")
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
