//! `tracer stacks --pid PID [--format json]`: what every thread of a process is doing
//! now, like `py-spy dump`, `jstack` or `eu-stack`, without stopping it: each thread's
//! state, the system call it is blocked in and how long since it last ran, its kernel
//! stack and its user stack (unwound with call frame information, symbolized and
//! demangled). Everything comes from `/proc` (see [`crate::profile::threads`]) but the threads'
//! frame pointers, which a task iterator reads from the kernel: without them (no BPF),
//! user stacks through code built with frame pointers stop early.

use std::{borrow::Cow, collections::HashMap, fmt::Write as _, path::Path, time::Duration};

use anyhow::Result;
use serde_json::Value;
use tracer_common::{ThreadRegs, UNWIND_STACK_BYTES};

use crate::{
    cli::{Format, StacksConfig},
    kernel::{Features, Loader, Settings, sample_running_thread},
    output::render::hist::format_ns,
    profile::threads::{
        self, SnapshotError, SnapshotOptions, ThreadSnapshot, ThreadState, UserStack, UserState,
    },
    stack::jit::JvmPerfMaps,
    stack::python::Interpreter,
    stack::symbolize::{ProcessMaps, StackSymbolizer},
    stack::unwind::{DwarfUnwinder, UnwindEnd},
    system::privileges,
    system::procfs,
    system::stop::ProcessWatch,
};

pub(crate) fn run(config: StacksConfig) -> Result<()> {
    let pid = process_of(config.pid.get())?;
    // Held from the start: it tells whether this process (not another given its PID
    // later) exited at any point of the reading.
    let watch = ProcessWatch::target(pid)?;
    if watch.has_exited() {
        return Err(SnapshotError::Exited(pid).into());
    }
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|comm| comm.trim_end_matches('\n').to_string())
        .map_err(|_| SnapshotError::Exited(pid))?;
    // Read first, so that the threads' registers are those /proc then shows.
    let registers = frame_pointers(pid);
    let options = SnapshotOptions {
        registers: registers.as_ref().cloned().unwrap_or_default(),
        ..SnapshotOptions::default()
    };
    let mut threads = match threads::snapshot_threads_with(pid, &options) {
        Ok(threads) => threads,
        // Whatever failed, a process gone is why.
        Err(_) if watch.has_exited() => return Err(ExitedWhileRead::Nothing { pid }.into()),
        Err(e) => return Err(e.into()),
    };
    sample_running_threads(&mut threads, &options);
    // Before the mappings are captured, which opens the perf map the JVM writes.
    let mut jvm_perf_maps = JvmPerfMaps::new(config.jit_symbols);
    jvm_perf_maps.request_before_naming([pid]);
    if let Some(summary) = jvm_perf_maps.summary() {
        crate::status!("{summary}");
    }
    if let Err(e) = &registers
        && !watch.has_exited()
    {
        crate::status!(
            "tracer: cannot read the threads' frame pointers ({e:#}): user stacks through \
             code built with frame pointers stop early"
        );
    }
    let stacks = match ProcessMaps::capture(pid) {
        Ok(maps) => {
            let mut python = Interpreter::find(&maps).unwrap_or_else(|why| {
                crate::status!("tracer: no Python frames: {why}");
                None
            });
            threads::user_stacks(
                pid,
                &threads,
                &maps,
                &mut DwarfUnwinder::new(),
                &mut StackSymbolizer::new(),
                python.as_mut(),
            )
        }
        Err(e) => {
            // An exit is said once, at the end.
            if !watch.has_exited() {
                crate::status!(
                    "tracer: cannot read the mappings of process {pid} ({e:#}): no user stacks"
                );
            }
            vec![None; threads.len()]
        }
    };
    // Checked after the last read: anything read until then may lack what the exit took
    // (threads, their stacks, the files that name frames).
    let partial = exited_while_read(&watch, pid, &threads);
    let dump = Dump {
        pid,
        name,
        threads,
        stacks,
        partial,
    };
    let out = match config.format {
        Format::Text => dump.to_text(),
        Format::Json => format!("{}\n", dump.to_json()),
    };
    crate::system::console::print(out)?;
    if partial {
        return Err(ExitedWhileRead::Partial {
            pid,
            threads: dump.threads.len(),
            user_stacks: dump.stacks.iter().flatten().count(),
        }
        .into());
    }
    Ok(())
}

/// How long a process that looks to be exiting may take to finish: a killed process
/// exits thread by thread.
const EXIT_GRACE: Duration = Duration::from_millis(250);

/// `PF_EXITING` of `include/linux/sched.h`, in the flags of /proc/PID/stat (field 9): the
/// thread has begun to exit.
const PF_EXITING: u64 = 0x4;

/// Whether process `pid` exited while `threads` were read from it. A process being killed
/// may not have exited yet when the reading ends: when its main thread has begun to exit
/// or some of the threads read are gone, its exit is waited for a little. (A process
/// whose main thread ended alone, or whose threads come and go, lives on: it is waited
/// for in vain, and only then.)
fn exited_while_read(watch: &ProcessWatch, pid: u32, threads: &[ThreadSnapshot]) -> bool {
    if watch.has_exited() {
        return true;
    }
    let main_thread_exiting = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = procfs::stat_field(&stat, 3)?;
            let flags: u64 = procfs::stat_field(&stat, 9)?.parse().ok()?;
            Some(matches!(state, "Z" | "X") || flags & PF_EXITING != 0)
        })
        .unwrap_or(true);
    let task = format!("/proc/{pid}/task");
    let some_gone = || {
        threads
            .iter()
            .any(|thread| !Path::new(&format!("{task}/{}", thread.tid)).exists())
    };
    (main_thread_exiting || some_gone()) && watch.exits_within(EXIT_GRACE)
}

/// The process exited while `tracer stacks` read it.
#[derive(Debug, thiserror::Error)]
enum ExitedWhileRead {
    #[error("process {pid} exited while being read, before any of its threads was read")]
    Nothing { pid: u32 },
    #[error(
        "process {pid} exited while being read: the dump printed is partial ({threads} \
         thread{} read, {user_stacks} of them with a user stack); threads and frames it \
         took with it are missing",
        plural(*.threads)
    )]
    Partial {
        pid: u32,
        threads: usize,
        user_stacks: usize,
    },
}

fn plural(count: usize) -> &'static str {
    if count == 1 { "" } else { "s" }
}

/// How long a thread on a CPU (or waiting for one) may take to run a little, for its
/// one sample.
const RUNNING_SAMPLE_WAIT: Duration = Duration::from_millis(200);

/// Gives each thread on a CPU (or waiting for one) the user registers and stack of one
/// sample of it (see [`sample_running_thread`]): /proc has none for it.
fn sample_running_threads(threads: &mut [ThreadSnapshot], options: &SnapshotOptions) {
    for thread in threads.iter_mut() {
        let running = matches!(thread.state, ThreadState::Running | ThreadState::Runnable);
        if !running || thread.user.is_some() {
            continue;
        }
        match sample_running_thread(thread.tid, UNWIND_STACK_BYTES as u32, RUNNING_SAMPLE_WAIT) {
            Ok(Some(sample)) => {
                thread.user = Some(UserState {
                    pc: sample.ip,
                    sp: sample.sp,
                    bp: Some(sample.bp),
                    fsbase: options
                        .registers
                        .get(&thread.tid)
                        .map(|r| r.fsbase)
                        .filter(|&f| f != 0),
                    stack: sample.stack,
                });
            }
            Ok(None) => {}
            Err(e) => log::debug!("cannot sample thread {}: {e}", thread.tid),
        }
    }
}

/// The saved user registers of every thread of `pid`, by thread id, from the kernel.
fn frame_pointers(pid: u32) -> Result<HashMap<u32, ThreadRegs>> {
    privileges::check()?;
    let mut loader = Loader::load(&Settings {
        features: Features {
            thread_regs: true,
            ..Features::NONE
        },
        ..Settings::default()
    })?;
    Ok(loader
        .thread_registers(pid)?
        .into_iter()
        .map(|regs| (regs.tid, regs))
        .collect())
}

/// The process `pid` belongs to (itself, unless it is a thread of another).
fn process_of(pid: u32) -> Result<u32, SnapshotError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|_| SnapshotError::NoSuchProcess(pid))?;
    let tgid = status
        .lines()
        .find_map(|line| line.strip_prefix("Tgid:"))
        .and_then(|tgid| tgid.trim().parse().ok())
        .unwrap_or(pid);
    if tgid != pid {
        crate::status!("tracer: {pid} is a thread of process {tgid}: showing every thread of it");
    }
    Ok(tgid)
}

/// Every thread of one process, with its user stack.
struct Dump {
    pid: u32,
    name: String,
    threads: Vec<ThreadSnapshot>,
    /// Per thread.
    stacks: Vec<Option<UserStack>>,
    /// The process exited while being read: threads and frames may be missing.
    partial: bool,
}

impl Dump {
    fn to_text(&self) -> String {
        let mut out = String::new();
        let count = self.threads.len();
        let _ = writeln!(
            out,
            "Process {} \"{}\": {count} thread{}{}",
            self.pid,
            escape(&self.name, true),
            plural(count),
            match self.partial {
                true => " (partial: the process exited while being read)",
                false => "",
            }
        );
        for (thread, stack) in self.threads.iter().zip(&self.stacks) {
            let _ = writeln!(
                out,
                "\nThread {} \"{}\": {}",
                thread.tid,
                escape(&thread.name, true),
                describe(thread)
            );
            for frame in thread.kernel_frame_names() {
                let _ = writeln!(out, "    {}", escape(&frame, false));
            }
            match stack {
                Some(stack) => {
                    for frame in &stack.frames {
                        let _ = writeln!(out, "    {}", escape(frame, false));
                    }
                    if stack.end == UnwindEnd::OutOfStack {
                        let _ = writeln!(
                            out,
                            "    ... (the stack goes deeper than the {} KiB read)",
                            UNWIND_STACK_BYTES / 1024
                        );
                    }
                }
                None if matches!(thread.state, ThreadState::Running | ThreadState::Runnable) => {
                    let _ = writeln!(
                        out,
                        "    (user stack unknown: the thread did not run within {} ms of \
                         being sampled)",
                        RUNNING_SAMPLE_WAIT.as_millis()
                    );
                }
                None => {}
            }
        }
        out
    }

    fn to_json(&self) -> Value {
        let threads = self
            .threads
            .iter()
            .zip(&self.stacks)
            .map(|(thread, stack)| ThreadJson {
                cpu: thread.cpu,
                kernel_stack: thread.kernel_frame_names(),
                name: &thread.name,
                since_last_ran_ns: thread.since_last_ran_ns,
                state: thread.state.name(),
                syscall: thread.syscall.map(|s| s.name()),
                syscall_nr: thread.syscall.map(|s| s.nr),
                tid: thread.tid,
                user_stack: stack.as_ref().map_or(&[][..], |s| s.frames.as_slice()),
                user_stack_truncated: stack
                    .as_ref()
                    .is_some_and(|s| s.end == UnwindEnd::OutOfStack),
            });
        let dump = DumpJson {
            partial: self.partial,
            pid: self.pid,
            process: &self.name,
            threads: threads.collect(),
        };
        serde_json::to_value(dump).expect("the dump's JSON has string keys only")
    }
}

/// `stacks --format json`: the process and each thread (see docs/stacks.md).
#[derive(serde::Serialize)]
struct DumpJson<'a> {
    partial: bool,
    pid: u32,
    process: &'a str,
    threads: Vec<ThreadJson<'a>>,
}

#[derive(serde::Serialize)]
struct ThreadJson<'a> {
    cpu: Option<u32>,
    /// Innermost first, each with the `_[k]` suffix.
    kernel_stack: Vec<String>,
    name: &'a str,
    since_last_ran_ns: Option<u64>,
    state: &'static str,
    syscall: Option<String>,
    syscall_nr: Option<u64>,
    tid: u32,
    /// Innermost first.
    user_stack: &'a [String],
    user_stack_truncated: bool,
}

/// `sleeping in futex for 3.20s`, `running on CPU 1`, `runnable for 2.10ms`.
fn describe(thread: &ThreadSnapshot) -> String {
    if thread.state == ThreadState::Running {
        return match thread.cpu {
            Some(cpu) => format!("running on CPU {cpu}"),
            None => "running".to_string(),
        };
    }
    let mut text = match thread.state {
        ThreadState::Runnable => "runnable (waiting for a CPU)".to_string(),
        ThreadState::Other(letter) => format!("state {}", escape(&letter.to_string(), false)),
        state => state.name().to_string(),
    };
    if let Some(syscall) = thread.syscall {
        let _ = write!(text, " in {}", syscall.name());
    }
    match thread.since_last_ran_ns {
        Some(ns) => {
            let _ = write!(text, " for {}", format_ns(ns));
        }
        None => text.push_str(" (since when: unknown)"),
    }
    text
}

/// `text` with control characters escaped (`\n`, `\u{1b}`), and within quotes `"` and
/// `\` too: a thread may name itself anything.
fn escape(text: &str, quoted: bool) -> Cow<'_, str> {
    let special = |c: char| c.is_control() || (quoted && (c == '"' || c == '\\'));
    if !text.chars().any(special) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if special(c) {
            escaped.extend(c.escape_debug());
        } else {
            escaped.push(c);
        }
    }
    Cow::Owned(escaped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::threads::{Syscall, UserState};
    use crate::stack::unwind::UnwoundStack;
    use serde_json::json;

    fn thread(state: ThreadState, syscall: Option<u64>, since: Option<u64>) -> ThreadSnapshot {
        ThreadSnapshot {
            tid: 4243,
            name: "worker-1".to_string(),
            state,
            syscall: syscall.map(|nr| Syscall { nr, args: [0; 6] }),
            cpu: Some(1),
            since_last_ran_ns: since,
            kernel_stack: vec!["futex_do_wait".to_string(), "do_syscall_64".to_string()],
            user: Some(UserState {
                pc: 0x1000,
                sp: 0x2000,
                bp: None,
                fsbase: None,
                stack: Vec::new(),
            }),
        }
    }

    #[test]
    fn describes_threads() {
        let sleeping = thread(ThreadState::Sleeping, Some(202), Some(3_200_000_000));
        assert_eq!(describe(&sleeping), "sleeping in futex for 3.20s");
        let disk = thread(ThreadState::DiskSleep, Some(0), None);
        assert_eq!(describe(&disk), "disk sleep in read (since when: unknown)");
        let fault = thread(ThreadState::Sleeping, None, Some(1_500_000));
        assert_eq!(describe(&fault), "sleeping for 1.50ms");
        let odd = thread(ThreadState::Sleeping, Some(999), Some(1000));
        assert_eq!(describe(&odd), "sleeping in syscall 999 for 1.00us");
        assert_eq!(
            describe(&thread(ThreadState::Running, None, Some(0))),
            "running on CPU 1"
        );
        assert_eq!(
            describe(&thread(ThreadState::Runnable, None, Some(2_000_000))),
            "runnable (waiting for a CPU) for 2.00ms"
        );
    }

    #[test]
    fn escapes_control_characters() {
        assert_eq!(escape("worker-1", true), "worker-1");
        assert_eq!(escape("a\nb\x1b[31m", false), "a\\nb\\u{1b}[31m");
        assert_eq!(escape("say \"hi\" \\", true), "say \\\"hi\\\" \\\\");
        assert_eq!(escape("say \"hi\"", false), "say \"hi\"");
    }

    fn dump() -> Dump {
        let mut evil = thread(ThreadState::Sleeping, Some(230), Some(5_000_000_000));
        evil.tid = 4244;
        evil.name = "evil\n\"x\"".to_string();
        let mut running = thread(ThreadState::Running, None, Some(0));
        running.tid = 4245;
        running.user = None;
        running.kernel_stack.clear();
        Dump {
            pid: 4242,
            name: "app".to_string(),
            threads: vec![
                thread(ThreadState::Sleeping, Some(202), Some(3_200_000_000)),
                evil,
                running,
            ],
            stacks: vec![
                Some(UserStack {
                    unwound: UnwoundStack::default(),
                    frames: vec!["syscall".into(), "app::block".into(), "main".into()],
                    end: UnwindEnd::Complete,
                }),
                Some(UserStack {
                    unwound: UnwoundStack::default(),
                    frames: vec!["clock_nanosleep".into()],
                    end: UnwindEnd::OutOfStack,
                }),
                None,
            ],
            partial: false,
        }
    }

    #[test]
    fn renders_text() {
        assert_eq!(
            dump().to_text(),
            "Process 4242 \"app\": 3 threads\n\
             \n\
             Thread 4243 \"worker-1\": sleeping in futex for 3.20s\n\
             \x20   futex_do_wait_[k]\n\
             \x20   do_syscall_64_[k]\n\
             \x20   syscall\n\
             \x20   app::block\n\
             \x20   main\n\
             \n\
             Thread 4244 \"evil\\n\\\"x\\\"\": sleeping in clock_nanosleep for 5.00s\n\
             \x20   futex_do_wait_[k]\n\
             \x20   do_syscall_64_[k]\n\
             \x20   clock_nanosleep\n\
             \x20   ... (the stack goes deeper than the 16 KiB read)\n\
             \n\
             Thread 4245 \"worker-1\": running on CPU 1\n\
             \x20   (user stack unknown: the thread did not run within 200 ms of being \
             sampled)\n"
        );
    }

    #[test]
    fn renders_json() {
        let json = dump().to_json();
        assert_eq!(json["pid"], 4242);
        assert_eq!(json["process"], "app");
        assert_eq!(json["partial"], false);
        let threads = json["threads"].as_array().unwrap();
        assert_eq!(threads.len(), 3);
        assert_eq!(
            threads[0],
            json!({
                "tid": 4243,
                "name": "worker-1",
                "state": "sleeping",
                "syscall": "futex",
                "syscall_nr": 202,
                "cpu": 1,
                "since_last_ran_ns": 3_200_000_000u64,
                "kernel_stack": ["futex_do_wait_[k]", "do_syscall_64_[k]"],
                "user_stack": ["syscall", "app::block", "main"],
                "user_stack_truncated": false,
            })
        );
        assert_eq!(threads[1]["name"], "evil\n\"x\"");
        assert_eq!(threads[1]["user_stack_truncated"], true);
        assert_eq!(threads[2]["syscall"], Value::Null);
        assert_eq!(threads[2]["user_stack"], json!([]));
    }

    #[test]
    fn a_dump_of_a_process_that_exited_while_read_says_it_is_partial() {
        let partial = Dump {
            partial: true,
            ..dump()
        };
        let text = partial.to_text();
        assert_eq!(
            text.lines().next().unwrap(),
            "Process 4242 \"app\": 3 threads (partial: the process exited while being read)"
        );
        assert_eq!(
            text.lines().skip(1).collect::<Vec<_>>(),
            dump().to_text().lines().skip(1).collect::<Vec<_>>()
        );
        assert_eq!(partial.to_json()["partial"], true);
        let error = ExitedWhileRead::Partial {
            pid: 4242,
            threads: 1,
            user_stacks: 0,
        };
        assert_eq!(
            error.to_string(),
            "process 4242 exited while being read: the dump printed is partial (1 thread \
             read, 0 of them with a user stack); threads and frames it took with it are \
             missing"
        );
    }
}
