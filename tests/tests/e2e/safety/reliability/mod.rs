//! Reliability end to end (issue 6): a target that exits or dies mid-trace, a tracer that
//! is interrupted, terminated or killed, a thousand threads, a hundred thousand tasks,
//! 100k events a second for a minute, two tracers on one target, a PID reused while a
//! tracer still watches it, and the smoke script of the privileged container.
//!
//! What "nothing stays attached" means here is checked on the kernel's side, for the
//! tracer's own objects only (other tests run tracers at the same time): the ids of the
//! BPF programs and links the tracer holds (from its /proc/PID/fdinfo) must be gone from
//! `bpftool prog show` and `bpftool link show`, and in the target's memory (read through
//! /proc/PID/mem) every USDT site must hold its instruction from the file again, not the
//! uprobe's breakpoint, and every semaphore must be back to 0.

use std::{
    collections::{BTreeSet, HashMap},
    io::{BufRead as _, BufReader, Read as _},
    os::unix::process::ExitStatusExt as _,
    path::Path,
    process::{Child, ChildStdout, Command, ExitStatus, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use crate::common::*;

mod keeper;
mod pid_reuse;
mod scale;
mod sets;
mod stops;

const EVENT_STORM: &str = env!("CARGO_BIN_EXE_event-storm");

/// The five probes `event-storm` fires per task, in order.
const TASK_PROBES: [&str; 5] = [
    "rt__new__task",
    "rt__start__task",
    "rt__run__task",
    "rt__pause__task",
    "rt__finish__task",
];
/// Every task probe of `event-storm`, in whatever process `--pid` names.
const TASK_SPEC: &str = "usdt:*:tracer:rt__*";

/// The signals a running tracer gets in the signal tests: each with how long after the
/// target started to send it (0: the instant the tracer said it attached, which must
/// already be a clean stop) and the stop reason the tracer then reports.
const SIGNALS: [(i32, u64, &str); 4] = [
    (libc::SIGINT, 0, "interrupted (SIGINT)"),
    (libc::SIGINT, 500, "interrupted (SIGINT)"),
    (libc::SIGTERM, 500, "terminated (SIGTERM)"),
    (libc::SIGKILL, 500, ""),
];

fn send(pid: u32, signal: i32) {
    // SAFETY: kill has no memory preconditions.
    let rc = unsafe { libc::kill(pid as i32, signal) };
    assert_eq!(rc, 0, "kill({pid}, {signal})");
}

/// Whether `pid` is still running (not gone, not a zombie waiting to be reaped).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the parenthesised command name.
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
        !matches!(state, None | Some(None | Some('Z' | 'X')))
    })
}

/// The per-probe counts `trace --count --format json` prints, keyed by probe name (the
/// part after the last colon).
fn counts(stdout: &str) -> HashMap<String, u64> {
    let object = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| {
            v.as_object()
                .is_some_and(|o| o.keys().any(|k| k.starts_with("usdt:")))
        })
        .unwrap_or_else(|| panic!("no counts in {stdout:?}"));
    object
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                k.rsplit(':').next().unwrap().to_string(),
                v.as_u64().unwrap(),
            )
        })
        .collect()
}

/// Asserts that a count run saw exactly `n` hits of every task probe.
fn assert_every_task_probe(counts: &HashMap<String, u64>, n: u64, who: &str) {
    for probe in TASK_PROBES {
        assert_eq!(counts.get(probe), Some(&n), "{who}: {probe} in {counts:?}");
    }
}

/// Ids of the BPF programs and links that process `pid` and its children (the link
/// keeper, which holds the uprobe links) hold open.
fn bpf_objects(pid: u32) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let (mut progs, mut links) = (BTreeSet::new(), BTreeSet::new());
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let processes = std::iter::once(pid).chain(
        children
            .split_whitespace()
            .filter_map(|child| child.parse().ok()),
    );
    for process in processes {
        let Ok(entries) = std::fs::read_dir(format!("/proc/{process}/fdinfo")) else {
            continue;
        };
        for entry in entries {
            let Ok(info) = std::fs::read_to_string(entry.unwrap().path()) else {
                continue;
            };
            for line in info.lines() {
                if let Some(id) = line.strip_prefix("prog_id:") {
                    progs.insert(id.trim().parse().unwrap());
                }
                if let Some(id) = line.strip_prefix("link_id:") {
                    links.insert(id.trim().parse().unwrap());
                }
            }
        }
    }
    (progs, links)
}

/// Ids of every BPF object of a kind (`prog` or `link`) the kernel has now.
fn kernel_ids(kind: &str) -> BTreeSet<u32> {
    let out = Command::new("bpftool")
        .args(["--json", kind, "show"])
        .output()
        .expect("bpftool is installed by `cargo xtask setup`");
    assert!(out.status.success(), "bpftool {kind} show: {out:?}");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_u64().unwrap() as u32)
        .collect()
}

/// The BPF programs and links of a tracer, recorded while it runs.
struct TracerObjects {
    progs: BTreeSet<u32>,
    links: BTreeSet<u32>,
}

impl TracerObjects {
    /// Records what tracer `pid` holds (from /proc only: quick).
    fn of(pid: u32) -> Self {
        let (progs, links) = bpf_objects(pid);
        assert!(
            !progs.is_empty() && !links.is_empty(),
            "an attached tracer holds programs and links: {progs:?} {links:?}"
        );
        Self { progs, links }
    }

    /// Checks the kernel lists them now, so that their absence later means something.
    fn assert_listed(&self) {
        assert!(
            self.progs.is_subset(&kernel_ids("prog")),
            "{:?}",
            self.progs
        );
        assert!(
            self.links.is_subset(&kernel_ids("link")),
            "{:?}",
            self.links
        );
    }

    /// Waits (up to 5 s: the kernel frees programs after an RCU grace period) until the
    /// kernel has none of them any more.
    fn assert_released(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let progs: Vec<u32> = self
                .progs
                .intersection(&kernel_ids("prog"))
                .copied()
                .collect();
            let links: Vec<u32> = self
                .links
                .intersection(&kernel_ids("link"))
                .copied()
                .collect();
            if progs.is_empty() && links.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "still in the kernel after the tracer left: programs {progs:?}, links {links:?}"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The `Stopped:` line's figures of `tracer trace`: (events printed, events lost).
fn stopped_line(stderr: &str) -> (u64, u64) {
    let line = stderr
        .lines()
        .find(|l| l.starts_with("Stopped:"))
        .unwrap_or_else(|| panic!("no Stopped line in {stderr}"));
    let number_before = |word: &str| -> u64 {
        let head = &line[..line
            .find(word)
            .unwrap_or_else(|| panic!("{word:?} not in {line:?}"))];
        head.trim_end()
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("no number before {word:?} in {line:?}"))
    };
    let printed = number_before(" events");
    let lost = if line.contains("none lost") {
        0
    } else {
        number_before(" LOST")
    };
    (printed, lost)
}

/// A tracer whose standard output and error are read as they come, so that a large output
/// never blocks it and its `Stopped:` line can be waited for while it still runs.
struct LiveTracer<T> {
    child: Child,
    stderr_lines: mpsc::Receiver<String>,
    stderr: String,
    stdout: thread::JoinHandle<T>,
}

impl<T: Send + 'static> LiveTracer<T> {
    /// Starts `tracer ARGS`, hands its stdout to `consume` on a thread of its own, and
    /// returns once the tracer said it attached.
    fn start(
        args: &[&str],
        consume: impl FnOnce(BufReader<ChildStdout>) -> T + Send + 'static,
    ) -> Self {
        let mut child = Command::new(tracer_bin())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start tracer");
        let out = BufReader::with_capacity(1 << 20, child.stdout.take().unwrap());
        let stdout = thread::spawn(move || consume(out));
        let err = BufReader::new(child.stderr.take().unwrap());
        let (send, stderr_lines) = mpsc::channel();
        thread::spawn(move || {
            for line in err.lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut tracer = Self {
            child,
            stderr_lines,
            stderr: String::new(),
            stdout,
        };
        assert!(
            tracer.wait_for_line("Attached"),
            "tracer exited before attaching: {}",
            tracer.stderr
        );
        tracer
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads standard error up to a line starting with `prefix`; false if it ended first.
    fn wait_for_line(&mut self, prefix: &str) -> bool {
        while let Ok(line) = self.stderr_lines.recv() {
            self.stderr.push_str(&line);
            self.stderr.push('\n');
            if line.starts_with(prefix) {
                return true;
            }
        }
        false
    }

    /// Reads standard error up to a line holding `text`; false if it ended first.
    fn wait_for_text(&mut self, text: &str) -> bool {
        while let Ok(line) = self.stderr_lines.recv() {
            self.stderr.push_str(&line);
            self.stderr.push('\n');
            if line.contains(text) {
                return true;
            }
        }
        false
    }

    /// Waits for the tracer to exit: its status, what `consume` returned, all of stderr.
    fn finish(mut self) -> (ExitStatus, T, String) {
        while self.wait_for_line("") {}
        let status = self.child.wait().unwrap();
        (status, self.stdout.join().unwrap(), self.stderr)
    }
}

fn read_all(mut out: BufReader<ChildStdout>) -> String {
    let mut text = String::new();
    out.read_to_string(&mut text).unwrap();
    text
}

/// `trace --format json` of the task probes of `target`, its output read by `consume`.
fn trace_json<T: Send + 'static>(
    target: &Target,
    extra_args: &[&str],
    consume: impl FnOnce(BufReader<ChildStdout>) -> T + Send + 'static,
) -> LiveTracer<T> {
    let pid = target.pid.to_string();
    let mut args = vec!["trace", "--format", "json", "--pid", &pid];
    args.extend_from_slice(extra_args);
    args.push(TASK_SPEC);
    LiveTracer::start(&args, consume)
}

/// Counts the event lines of `trace --format json`.
fn count_events(out: BufReader<ChildStdout>) -> u64 {
    out.lines()
        .map_while(Result::ok)
        .filter(|l| l.contains("\"probe\""))
        .count() as u64
}

/// How many semaphore-guarded probes (one site each) `many-sites` carries.
const MANY_SITES: usize = 1000;

/// A C program built with sys/sdt.h, as real C programs carry probes: `MANY_SITES`
/// probes `many:pN`, each behind a semaphore of its own. It prints `ready pid=N`, waits
/// for SIGUSR1 when given `--wait-for-signal`, fires every enabled probe once per round,
/// a round a millisecond, for `--seconds S` or until SIGTERM, then prints its round count
/// as JSON.
fn many_sites() -> &'static Path {
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let mut c = String::from(
            "#define _SDT_HAS_SEMAPHORES 1\n#include <sys/sdt.h>\n#include <signal.h>\n\
             #include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <time.h>\n\
             #include <unistd.h>\n",
        );
        for i in 0..MANY_SITES {
            c += &format!(
                "unsigned short many_p{i}_semaphore __attribute__((section(\".probes\")));\n"
            );
        }
        c += "static volatile sig_atomic_t go, stop;\n\
              static void on_usr1(int s) { (void)s; go = 1; }\n\
              static void on_term(int s) { (void)s; stop = 1; }\n\
              static void fire(long round) {\n";
        for i in 0..MANY_SITES {
            c += &format!("  if (many_p{i}_semaphore) DTRACE_PROBE1(many, p{i}, round);\n");
        }
        c += "}\nint main(int argc, char **argv) {\n  double seconds = 3;\n  int wait = 0;\n\
              for (int i = 1; i < argc; i++) {\n\
                if (!strcmp(argv[i], \"--wait-for-signal\")) wait = 1;\n\
                else if (!strcmp(argv[i], \"--seconds\") && i + 1 < argc) seconds = atof(argv[++i]);\n\
                else if (!strcmp(argv[i], \"--help\")) return 0;\n  }\n\
              signal(SIGUSR1, on_usr1);\n  signal(SIGTERM, on_term);\n  printf(\"ready pid=%d\\n\", getpid());\n  fflush(stdout);\n\
              while (wait && !go) pause();\n\
              struct timespec start, now, nap = {0, 1000000};\n\
              clock_gettime(CLOCK_MONOTONIC, &start);\n  long rounds = 0;\n\
              do {\n    fire(rounds++);\n    nanosleep(&nap, 0);\n\
                clock_gettime(CLOCK_MONOTONIC, &now);\n\
              } while (!stop && (now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);\n\
              printf(\"{\\\"rounds\\\": %ld}\\n\", rounds);\n  return 0;\n}\n";
        let source = dir.join("many-sites.c");
        std::fs::write(&source, c).unwrap();
        let bin = dir.join("many-sites");
        let status = Command::new("gcc")
            .args(["-O1", "-o"])
            .arg(&bin)
            .arg(&source)
            .status()
            .expect("gcc is installed by `cargo xtask setup`");
        assert!(status.success(), "gcc failed on {}", source.display());
        bin
    })
}
