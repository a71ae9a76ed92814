//! bpftrace beside the tracer: starting it, knowing when it is attached, stopping it and
//! reading the maps it prints at exit.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Read as _},
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Once, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// How long bpftrace may take to attach (libjvm's hundreds of sites take seconds).
const ATTACH_DEADLINE: Duration = Duration::from_secs(90);
/// How long bpftrace may take to exit once it should have: detaching and printing.
const EXIT_DEADLINE: Duration = Duration::from_secs(60);
/// How long after SIGINT before bpftrace is nudged out of its wait (see [`wake`]).
const NUDGE_AFTER: Duration = Duration::from_secs(3);

/// A running `bpftrace` whose script prints a line starting with `Tracing` in BEGIN, which
/// bpftrace runs once every probe is attached.
///
/// Its output is read on threads of their own, so that every wait has a deadline: a
/// bpftrace that never attaches or never exits fails the test, with what it printed and
/// where it waits, instead of holding the whole run.
pub struct Bpftrace {
    child: Child,
    args: String,
    /// Standard output after the `Tracing` line, a line at a time; closed at its end.
    lines: mpsc::Receiver<String>,
    stderr: Option<JoinHandle<String>>,
    early: String,
}

impl Bpftrace {
    /// Starts `bpftrace -p PID ARGS` and returns once it is attached.
    pub fn for_pid(pid: u32, args: &[&str]) -> Bpftrace {
        let pid = pid.to_string();
        let mut all = vec!["-p", &pid];
        all.extend_from_slice(args);
        Bpftrace::start(&all)
    }

    /// Starts `bpftrace ARGS` and returns once it is attached. tracefs is mounted first if
    /// it is not (bpftrace needs it for some probe types; it stays mounted).
    pub fn start(args: &[&str]) -> Bpftrace {
        Bpftrace::start_in(Path::new("."), args)
    }

    /// [`Bpftrace::start`] in directory `dir`: its `usdt:*` is a file pattern there.
    pub fn start_in(dir: &Path, args: &[&str]) -> Bpftrace {
        mount_tracefs();
        let mut child = Command::new("bpftrace")
            .current_dir(dir)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("bpftrace is installed by `cargo xtask setup`");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            // Bytes, not UTF-8 lines: a string argument may be anything, and stopping at
            // it would look like the end of the output.
            let mut line = Vec::new();
            while stdout.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                let text = String::from_utf8_lossy(&line);
                if send.send(text.trim_end_matches('\n').to_string()).is_err() {
                    break;
                }
                line.clear();
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut err = String::new();
            let _ = stderr.read_to_string(&mut err);
            err
        });
        let mut bpftrace = Bpftrace {
            child,
            args: format!("{args:?}"),
            lines,
            stderr: Some(stderr),
            early: String::new(),
        };
        let deadline = Instant::now() + ATTACH_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match bpftrace.lines.recv_timeout(left) {
                Ok(line) => {
                    bpftrace.early.push_str(&line);
                    bpftrace.early.push('\n');
                    if line.starts_with("Tracing") {
                        return bpftrace;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = bpftrace.wait_by(Instant::now() + EXIT_DEADLINE);
                    let err = bpftrace.take_stderr();
                    panic!(
                        "bpftrace {} exited before attaching ({status}): {}{err}",
                        bpftrace.args, bpftrace.early
                    );
                }
                Err(mpsc::RecvTimeoutError::Timeout) => bpftrace.fail(&format!(
                    "did not attach within {} s",
                    ATTACH_DEADLINE.as_secs()
                )),
            }
        }
    }

    /// Waits for bpftrace to exit (with `-p`, it does when the traced process exits) and
    /// parses the maps it printed.
    pub fn finish(self) -> BpftraceMaps {
        self.finish_by(Instant::now() + EXIT_DEADLINE, None)
    }

    /// Stops bpftrace (SIGINT: it detaches and prints its maps) and parses those maps.
    pub fn stop(self) -> BpftraceMaps {
        // SAFETY: kill has no memory preconditions; the pid is our child's, not reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let now = Instant::now();
        self.finish_by(now + EXIT_DEADLINE, Some(now + NUDGE_AFTER))
    }

    /// Reads the rest of standard output until it closes, by `deadline`; past `nudge`,
    /// bpftrace is woken from its wait once.
    fn finish_by(mut self, deadline: Instant, mut nudge: Option<Instant>) -> BpftraceMaps {
        let mut out = String::new();
        loop {
            let now = Instant::now();
            if now >= deadline {
                self.fail(&format!(
                    "did not exit within {} s; it printed:\n{out}",
                    EXIT_DEADLINE.as_secs()
                ));
            }
            let wait_until = nudge.map_or(deadline, |n| n.min(deadline));
            match self
                .lines
                .recv_timeout(wait_until.saturating_duration_since(now))
            {
                Ok(line) => {
                    out.push_str(&line);
                    out.push('\n');
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if nudge.is_some_and(|n| Instant::now() >= n) {
                        nudge = None;
                        eprintln!(
                            "bpftrace {}: still running {} s after SIGINT ({}); waking it",
                            self.args,
                            NUDGE_AFTER.as_secs(),
                            wait_channel(self.child.id())
                        );
                        wake(self.child.id());
                    }
                }
            }
        }
        let status = self.wait_by(deadline);
        let err = self.take_stderr();
        assert!(status.success(), "bpftrace failed ({status}): {err}\n{out}");
        BpftraceMaps::parse(&out)
    }

    fn wait_by(&mut self, deadline: Instant) -> ExitStatus {
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= deadline {
                self.fail("closed its output but did not exit");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn take_stderr(&mut self) -> String {
        self.stderr
            .take()
            .map(|reader| reader.join().unwrap_or_default())
            .unwrap_or_default()
    }

    /// Fails the test with where bpftrace waits; dropping it then kills it.
    fn fail(&mut self, what: &str) -> ! {
        let pid = self.child.id();
        let waits = wait_channel(pid);
        let _ = self.child.kill();
        let _ = self.child.wait();
        let err = self.take_stderr();
        panic!(
            "bpftrace {} (pid {pid}, waiting in {waits}) {what}\nbefore attaching it printed:\n{}\nstandard error:\n{err}",
            self.args, self.early
        );
    }
}

/// The kernel function process `pid` sleeps in.
fn wait_channel(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_else(|e| e.to_string())
}

/// Interrupts the system call process `pid` sleeps in, without a signal: seized, stopped
/// and let go by ptrace, as strace's attaching does.
///
/// bpftrace 0.17 can miss a SIGINT: its handler sets a flag that its output loop checks
/// only when `epoll_wait` returns, and it was seen sleeping there with the flag set for
/// over an hour of CI while its run was quiet. An interrupted `epoll_wait` returns EINTR,
/// the loop sees the flag and bpftrace exits as on SIGINT. A second SIGINT is not safe:
/// once bpftrace has restored the default action it would kill it before it prints.
fn wake(pid: u32) {
    let pid = pid as libc::pid_t;
    // SAFETY: ptrace and waitpid on our own child, with no pointers passed in but the
    // status, which outlives the call.
    unsafe {
        if libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) != 0 {
            return;
        }
        if libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0) == 0 {
            // The stop, or the exit if bpftrace ended meanwhile: WNOWAIT leaves an exit
            // for `Child::wait`, and only a stop is then taken.
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let any = libc::WSTOPPED | libc::WEXITED | libc::__WALL;
            if libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &raw mut info,
                any | libc::WNOWAIT,
            ) == 0
                && info.si_code == libc::CLD_TRAPPED
            {
                libc::waitid(libc::P_PID, pid as libc::id_t, &raw mut info, any);
            }
        }
        libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0);
    }
}

/// Mounts tracefs on /sys/kernel/tracing unless something is mounted there.
fn mount_tracefs() {
    static MOUNT: Once = Once::new();
    MOUNT.call_once(|| {
        let mounted = Command::new("mountpoint")
            .args(["-q", "/sys/kernel/tracing"])
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            let status = Command::new("mount")
                .args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"])
                .status()
                .expect("mount (util-linux)");
            assert!(status.success(), "mounting tracefs failed: {status}");
        }
    });
}

impl Drop for Bpftrace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The maps bpftrace prints at exit, by name with the key (`count`, `runs[2]`): the text
/// after `: `, and for histograms the sum of their bucket counts.
pub struct BpftraceMaps {
    values: BTreeMap<String, String>,
    hist_totals: BTreeMap<String, u64>,
    pub text: String,
}

impl BpftraceMaps {
    pub fn parse(text: &str) -> BpftraceMaps {
        let mut values = BTreeMap::new();
        let mut hist_totals = BTreeMap::new();
        let mut current_hist: Option<String> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix('@') {
                let (name, value) = rest
                    .split_once(": ")
                    .or_else(|| rest.strip_suffix(':').map(|n| (n, "")))
                    .unwrap_or_else(|| panic!("unexpected map line {line:?}"));
                let value = value.trim();
                current_hist = value.is_empty().then(|| name.to_string());
                if value.is_empty() {
                    hist_totals.insert(name.to_string(), 0);
                } else {
                    values.insert(name.to_string(), value.to_string());
                }
            } else if let (Some(hist), Some(bucket)) = (&current_hist, line.strip_prefix('[')) {
                // `[8K, 16K)     12 |@@@@|`, or `[0]     1 |@|` for the smallest buckets.
                let count = bucket
                    .split_once([')', ']'])
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("unexpected bucket line {line:?}"));
                *hist_totals.get_mut(hist).unwrap() += count;
            } else if line.trim().is_empty() {
                current_hist = None;
            }
        }
        BpftraceMaps {
            values,
            hist_totals,
            text: text.to_string(),
        }
    }

    /// A map holding one integer (`count()`, `sum()`, `min()`, `max()`).
    pub fn int(&self, name: &str) -> u64 {
        let value = self
            .values
            .get(name)
            .unwrap_or_else(|| panic!("bpftrace printed no @{name}:\n{}", self.text));
        value
            .parse()
            .unwrap_or_else(|e| panic!("@{name}: {value:?}: {e}"))
    }

    /// A `stats()` map, `count N, average A, total T`: (count, total).
    pub fn stats(&self, name: &str) -> (u64, u64) {
        let value = self
            .values
            .get(name)
            .unwrap_or_else(|| panic!("bpftrace printed no @{name}:\n{}", self.text));
        let field = |field: &str| -> u64 {
            value
                .split(", ")
                .find_map(|part| part.strip_prefix(field))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("@{name}: no {field} in {value:?}"))
        };
        (field("count "), field("total "))
    }

    /// The sum of the bucket counts of histogram `name`.
    pub fn hist_total(&self, name: &str) -> u64 {
        *self
            .hist_totals
            .get(name)
            .unwrap_or_else(|| panic!("bpftrace printed no histogram @{name}:\n{}", self.text))
    }

    /// The keys of the maps `name[KEY]`, with their integer values.
    pub fn keyed(&self, name: &str) -> BTreeMap<String, u64> {
        self.values
            .iter()
            .filter_map(|(k, v)| {
                let key = k.strip_prefix(name)?.strip_prefix('[')?.strip_suffix(']')?;
                Some((key.to_string(), v.parse().ok()?))
            })
            .collect()
    }
}
