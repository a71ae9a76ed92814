//! Starting targets and tools, waiting until they are ready, stopping and reaping them
//! (with their peak RSS), and reading what they print.

use std::{
    io::{BufRead as _, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::{self, Receiver, RecvTimeoutError},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::release_dir;

/// How to start a tool against a process and know it attached.
pub(super) struct ToolSpec {
    /// "tracer", "bpftrace" or another tool name (for the memory figure).
    pub(super) tool: &'static str,
    /// What it does, as shown in the tables.
    pub(super) label: &'static str,
    pub(super) program: PathBuf,
    /// `{pid}` is replaced by the target's PID.
    pub(super) args: Vec<String>,
    /// The stream and line prefix that say the tool is attached.
    pub(super) ready: (Stream, &'static str),
    /// Whether it exits by itself once the target exits; otherwise it gets SIGINT.
    pub(super) stops_with_target: bool,
}

/// What bpftrace's BEGIN probe prints. "Attaching N probes..." is printed before the probes
/// are attached; BEGIN fires once they all are.
pub(super) const BPFTRACE_ATTACHED: &str = "bench: attached";

/// A bpftrace program running `action` at `probe`, announcing when it is attached.
pub(super) fn bpftrace_program(probe: &str, action: &str) -> String {
    format!("BEGIN {{ printf(\"{BPFTRACE_ATTACHED}\\n\"); }} {probe} {{ {action} }}")
}

/// A target and, optionally, a tool attached to it for the whole run.
pub(super) struct Run {
    /// The target's stdout (its ready line and its JSON result).
    pub(super) target: String,
    pub(super) tool: Option<Finished>,
    /// The tool's eBPF programs' run counts and times while the target ran (with
    /// `kernel.bpf_stats_enabled` on; zeros otherwise).
    pub(super) programs: Vec<ProgramStats>,
}

/// One eBPF program's totals, from `/proc/PID/fdinfo` of its loader.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ProgramStats {
    pub(super) id: u32,
    pub(super) run_cnt: u64,
    pub(super) run_time_ns: u64,
}

/// The eBPF programs process `pid` holds, with their run counts and times so far.
pub(super) fn program_stats(pid: u32) -> Vec<ProgramStats> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return Vec::new();
    };
    let mut programs: Vec<ProgramStats> = fds
        .flatten()
        .filter_map(|fd| {
            let text = std::fs::read_to_string(fd.path()).ok()?;
            let field = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
            };
            Some(ProgramStats {
                id: field("prog_id:")? as u32,
                run_cnt: field("run_cnt:")?,
                run_time_ns: field("run_time_ns:")?,
            })
        })
        .collect();
    programs.sort_by_key(|p| p.id);
    programs.dedup_by_key(|p| p.id);
    programs
}

/// Turns `kernel.bpf_stats_enabled` on while it lives (the kernel then times every eBPF
/// program run), and back to what it was.
pub(super) struct BpfStats {
    before: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    pub(super) fn enable() -> Result<Self> {
        let before = std::fs::read_to_string(BPF_STATS).with_context(|| BPF_STATS.to_string())?;
        std::fs::write(BPF_STATS, "1").with_context(|| BPF_STATS.to_string())?;
        Ok(Self { before })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, self.before.trim());
    }
}

/// Starts `target` (which waits for SIGUSR1), attaches `tool` if any, releases the target,
/// waits for both.
pub(super) fn traced_run(
    target: &Path,
    target_args: &[String],
    tool: Option<&ToolSpec>,
) -> Result<Run> {
    let mut target = Tool::spawn(Command::new(target).args(target_args), "target")?;
    let pid = ready_pid(&mut target)?;
    let mut attached = match tool {
        Some(spec) => {
            let args: Vec<String> = spec
                .args
                .iter()
                .map(|a| a.replace("{pid}", &pid.to_string()))
                .collect();
            let mut running = Tool::spawn(Command::new(&spec.program).args(&args), spec.label)?;
            let (stream, prefix) = spec.ready;
            if let Err(err) =
                running.wait_line(stream, Duration::from_secs(60), |l| l.starts_with(prefix))
            {
                target.kill();
                running.interrupt();
                let out = running.finish(Duration::from_secs(5));
                let detail = out
                    .map(|o| error_lines(&format!("{}{}", o.stderr, o.stdout), 4))
                    .unwrap_or_default();
                bail!("{} did not attach: {err:#}; {detail}", spec.label);
            }
            Some((spec, running))
        }
        None => None,
    };
    target.signal(libc::SIGUSR1);
    // The tool's programs, read while the target runs: a tool that stops with its target
    // takes them along.
    let tool_pid = attached.as_ref().map(|(_, running)| running.pid() as u32);
    let target_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = tool_pid.map(|tool_pid| {
        let target_done = target_done.clone();
        std::thread::spawn(move || {
            let mut last = Vec::new();
            while !target_done.load(std::sync::atomic::Ordering::Relaxed) {
                let now = program_stats(tool_pid);
                if !now.is_empty() {
                    last = now;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            last
        })
    });
    let target_out = target.finish(Duration::from_secs(600));
    target_done.store(true, std::sync::atomic::Ordering::Relaxed);
    let target_out = target_out?;
    let programs = watcher
        .map(|w| w.join().unwrap_or_default())
        .unwrap_or_default();
    if !target_out.success {
        bail!("the target failed: {}", target_out.stderr);
    }
    let tool = match attached.take() {
        Some((spec, running)) => {
            if !spec.stops_with_target {
                running.interrupt();
            }
            let out = running.finish(Duration::from_secs(60))?;
            if !out.success {
                bail!(
                    "{} failed: {}",
                    spec.label,
                    error_lines(&format!("{}{}", out.stderr, out.stdout), 4)
                );
            }
            Some(out)
        }
        None => None,
    };
    Ok(Run {
        target: target_out.stdout,
        tool,
        programs,
    })
}

pub(super) fn ready_pid(target: &mut Tool) -> Result<u32> {
    let line = target.wait_line(Stream::Stdout, Duration::from_secs(10), |l| {
        l.starts_with("ready pid=")
    })?;
    Ok(line["ready pid=".len()..].trim().parse()?)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stream {
    Stdout,
    Stderr,
}

/// A child process whose output is read line by line by two threads, so it never blocks
/// on a full pipe, and which is reaped with wait4 to learn its peak RSS.
pub(super) struct Tool {
    name: String,
    child: Child,
    lines: [Receiver<String>; 2],
    seen: [String; 2],
    readers: Vec<JoinHandle<()>>,
    reaped: bool,
}

/// How a child ended and everything it printed.
pub(super) struct Finished {
    pub(super) success: bool,
    pub(super) stdout: String,
    pub(super) stderr: String,
    pub(super) max_rss_kib: u64,
}

impl Tool {
    pub(super) fn spawn(cmd: &mut Command, name: &str) -> Result<Tool> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {name} ({:?})", cmd.get_program()))?;
        let (out_tx, out_rx) = mpsc::channel();
        let (err_tx, err_rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let readers = vec![forward_lines(stdout, out_tx), forward_lines(stderr, err_tx)];
        Ok(Tool {
            name: name.to_string(),
            child,
            lines: [out_rx, err_rx],
            seen: [String::new(), String::new()],
            readers,
            reaped: false,
        })
    }

    pub(super) fn pid(&self) -> libc::pid_t {
        self.child.id() as libc::pid_t
    }

    /// Reads `stream` until a line matches; fails at its end or after `timeout`.
    pub(super) fn wait_line(
        &mut self,
        stream: Stream,
        timeout: Duration,
        matches: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let index = stream as usize;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines[index].recv_timeout(left) {
                Ok(line) => {
                    self.seen[index].push_str(&line);
                    self.seen[index].push('\n');
                    if matches(&line) {
                        return Ok(line);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    bail!("{} printed no expected line within {timeout:?}", self.name)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    bail!(
                        "{} ended its {stream:?} before the expected line",
                        self.name
                    )
                }
            }
        }
    }

    pub(super) fn signal(&self, signal: libc::c_int) {
        if !self.reaped {
            // SAFETY: kill has no memory preconditions; the pid is our unreaped child's.
            unsafe { libc::kill(self.pid(), signal) };
        }
    }

    pub(super) fn interrupt(&self) {
        self.signal(libc::SIGINT);
    }

    pub(super) fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.reap(Some(Duration::from_secs(5)));
    }

    /// Waits for the child; after `timeout` it gets SIGINT, then SIGKILL.
    pub(super) fn finish(mut self, timeout: Duration) -> Result<Finished> {
        let (status, max_rss_kib) = if let Ok(done) = self.reap(Some(timeout)) {
            done
        } else {
            self.interrupt();
            if let Ok(done) = self.reap(Some(Duration::from_secs(5))) {
                done
            } else {
                self.signal(libc::SIGKILL);
                self.reap(None)?
            }
        };
        for handle in self.readers.drain(..) {
            let _ = handle.join();
        }
        for index in 0..2 {
            while let Ok(line) = self.lines[index].try_recv() {
                self.seen[index].push_str(&line);
                self.seen[index].push('\n');
            }
        }
        Ok(Finished {
            success: status == 0,
            stdout: std::mem::take(&mut self.seen[0]),
            stderr: std::mem::take(&mut self.seen[1]),
            max_rss_kib,
        })
    }

    /// wait4 with a deadline (None: block): (raw wait status, ru_maxrss in KiB).
    fn reap(&mut self, timeout: Option<Duration>) -> Result<(i32, u64)> {
        if self.reaped {
            bail!("{} was already reaped", self.name);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let flags = if deadline.is_some() { libc::WNOHANG } else { 0 };
            let mut status = 0;
            // SAFETY: struct rusage is plain integers, for which all zeroes is a value.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: valid out-pointers; the pid is our child's.
            let rc = unsafe { libc::wait4(self.pid(), &raw mut status, flags, &raw mut usage) };
            if rc == self.pid() {
                self.reaped = true;
                return Ok((status, usage.ru_maxrss.max(0) as u64));
            }
            if rc < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err).with_context(|| format!("waiting for {}", self.name));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                bail!("{} still runs after {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Tool {
    fn drop(&mut self) {
        if !self.reaped {
            self.signal(libc::SIGKILL);
            let _ = self.reap(Some(Duration::from_secs(5)));
        }
    }
}

pub(super) fn forward_lines(
    stream: impl Read + Send + 'static,
    tx: mpsc::Sender<String>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    })
}

/// Mounts tracefs for bpftrace's tracepoints if needed, and unmounts it when dropped if
/// it mounted it.
pub(super) struct TracefsMount {
    mounted_here: bool,
}

impl TracefsMount {
    const PATH: &str = "/sys/kernel/tracing";

    pub(super) fn ensure() -> Result<Self> {
        let mounts = std::fs::read_to_string("/proc/self/mounts")?;
        let mounted = mounts
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(Self::PATH));
        if mounted {
            return Ok(Self {
                mounted_here: false,
            });
        }
        let status = Command::new("mount")
            .args(["-t", "tracefs", "tracefs", Self::PATH])
            .status()
            .context("cannot run mount")?;
        if !status.success() {
            bail!("mounting tracefs on {} failed ({status})", Self::PATH);
        }
        eprintln!(
            "xtask bench: mounted tracefs on {} for bpftrace",
            Self::PATH
        );
        Ok(Self { mounted_here: true })
    }
}

impl Drop for TracefsMount {
    fn drop(&mut self) {
        if self.mounted_here {
            let _ = Command::new("umount").arg(Self::PATH).status();
        }
    }
}

/// The first three fields of /proc/loadavg.
pub(super) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").map_or_else(
        |_| "?".into(),
        |l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    )
}

pub(super) fn bin(name: &str) -> PathBuf {
    release_dir().join(name)
}

pub(super) fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(std::string::ToString::to_string).collect()
}

pub(super) fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

pub(super) fn first_lines(text: &str, n: usize) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(n)
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Up to `n` lines of a tool's output, those that look like errors first.
pub(super) fn error_lines(text: &str, n: usize) -> String {
    let looks_bad = |l: &&str| {
        let lower = l.to_ascii_lowercase();
        ["error", "unable", "fail", "cannot", "not found"]
            .iter()
            .any(|w| lower.contains(w))
    };
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let (bad, rest): (Vec<&str>, Vec<&str>) = lines.into_iter().partition(looks_bad);
    bad.into_iter()
        .chain(rest)
        .take(n)
        .collect::<Vec<_>>()
        .join(" / ")
}

/// Every line of `text` that is a JSON object: the targets print one after their
/// `ready pid=N` line, `tracer trace --format json` one per event.
pub(super) fn json_lines(text: &str) -> impl Iterator<Item = Value> + '_ {
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(Value::is_object)
}

/// The last JSON object line of `text` (a target's or tool's result).
pub(super) fn last_json_line(text: &str) -> Result<Value> {
    json_lines(text)
        .last()
        .with_context(|| format!("no JSON object line in {text:?}"))
}

/// `object[key]`, a whole number.
pub(super) fn json_u64(object: &Value, key: &str) -> Result<u64> {
    object[key]
        .as_u64()
        .with_context(|| format!("no whole number {key:?} in {object}"))
}

/// `object[key]`, an array of numbers.
pub(super) fn json_numbers(object: &Value, key: &str) -> Result<Vec<f64>> {
    let array = object[key]
        .as_array()
        .with_context(|| format!("no {key:?} array in {object}"))?;
    array
        .iter()
        .map(|v| {
            v.as_f64()
                .with_context(|| format!("{key:?}: {v} is not a number"))
        })
        .collect()
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of bpf_ktime_get_ns and bpftrace's nsecs.
pub(super) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_targets_result_is_its_last_json_line() {
        let stdout =
            "ready pid=42\n{\"iters\":3,\"with_probe_ns\":[389,388],\"without_probe_ns\":[376]}\n";
        let result = last_json_line(stdout).unwrap();
        assert_eq!(json_u64(&result, "iters").unwrap(), 3);
        assert_eq!(
            json_numbers(&result, "with_probe_ns").unwrap(),
            [389.0, 388.0]
        );
        assert!(json_u64(&result, "ns").is_err());
        assert!(last_json_line("ready pid=42\n").is_err());
    }

    #[test]
    fn json_lines_skip_what_is_not_an_object() {
        let stdout = "Attaching 1 probe...\n[1]\n{\"time_ns\":5}\n{\"time_ns\":7}\n";
        let times: Vec<u64> = json_lines(stdout)
            .filter_map(|event| event["time_ns"].as_u64())
            .collect();
        assert_eq!(times, [5, 7]);
    }
}
