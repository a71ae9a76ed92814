//! Reading every thread of a process from `/proc` into [`ThreadSnapshot`]s. A thread that
//! ran while being read is read again. The top of each user stack is read from
//! `/proc/PID/mem`, no further than the mapping holding its stack pointer.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt as _;

use thiserror::Error;
use tracer_common::{ThreadRegs, UNWIND_STACK_BYTES};

use super::clock::SchedClock;
use super::parse::{
    Syscall, SyscallLine, ThreadState, parse_kernel_stack, parse_sched_exec_start,
    parse_schedstat_runtime, parse_stat, parse_syscall_line,
};
use crate::stack::naming::KERNEL_SUFFIX;
use crate::stack::unwind::Snapshot;
use crate::system::procfs::parse_maps_line;

/// A thread's user registers and the top of its user stack, as saved when it entered
/// the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserState {
    pub pc: u64,
    pub sp: u64,
    /// The frame pointer, when known (see [`SnapshotOptions::registers`]).
    pub bp: Option<u64>,
    /// The FS base (`pthread_self()`), when known likewise: it finds the thread's Python
    /// thread state.
    pub fsbase: Option<u64>,
    /// The stack bytes from `sp` up (at most [`UNWIND_STACK_BYTES`], fewer where the
    /// stack's mapping ends sooner; empty if unreadable).
    pub stack: Vec<u8>,
}

/// What one thread was doing when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ThreadSnapshot {
    pub tid: u32,
    pub name: String,
    pub state: ThreadState,
    /// The system call it is blocked in.
    pub syscall: Option<Syscall>,
    /// The CPU it last ran on.
    pub cpu: Option<u32>,
    /// How long since it last ran (0 while on a CPU); `None` when the kernel does not tell.
    pub since_last_ran_ns: Option<u64>,
    /// Kernel function names, innermost first (without [`KERNEL_SUFFIX`]).
    pub kernel_stack: Vec<String>,
    /// `None` for a runnable thread (its registers cannot be read without stopping it)
    /// and threads without user registers.
    pub user: Option<UserState>,
}

impl ThreadSnapshot {
    /// The thread's user stack as a snapshot for
    /// [`DwarfUnwinder::unwind_one`](crate::stack::unwind::DwarfUnwinder::unwind_one) (no frame
    /// pointer: `/proc` does not give it).
    pub(crate) fn unwind_snapshot(&self, tgid: u32) -> Option<Snapshot<'_>> {
        let user = self.user.as_ref()?;
        Some(Snapshot {
            tgid,
            tid: self.tid,
            ip: user.pc,
            sp: user.sp,
            bp: user.bp.unwrap_or(0),
            kernel_stack: tracer_common::StackId::None,
            snapshot: None,
            task: 0,
            python: None,
            stack: &user.stack,
        })
    }

    /// Its FS base, when read (see [`UserState::fsbase`]).
    pub(crate) fn fsbase(&self) -> Option<u64> {
        self.user.as_ref()?.fsbase
    }

    /// The kernel frames named as every tracer output names them (`futex_do_wait_[k]`).
    pub(crate) fn kernel_frame_names(&self) -> Vec<String> {
        self.kernel_stack
            .iter()
            .map(|name| format!("{name}{KERNEL_SUFFIX}"))
            .collect()
    }
}

/// Why a process's threads could not be read.
#[derive(Debug, Error)]
pub(crate) enum SnapshotError {
    #[error("no such process: {0}")]
    NoSuchProcess(u32),
    #[error("process {0} exited")]
    Exited(u32),
    #[error(
        "permission denied reading {path}: reading another process's registers, memory and \
         kernel stacks needs root (CAP_SYS_PTRACE and CAP_SYS_ADMIN); run it with sudo"
    )]
    PermissionDenied { path: String },
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: io::Error },
}

/// What reading one file of a thread gave.
enum Read<T> {
    Ok(T),
    /// The thread (or process) is gone.
    Gone,
}

fn read_proc(path: &str) -> Result<Read<String>, SnapshotError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Read::Ok(text)),
        Err(e) => match e.raw_os_error() {
            Some(libc::ENOENT | libc::ESRCH) => Ok(Read::Gone),
            Some(libc::EACCES | libc::EPERM) => Err(SnapshotError::PermissionDenied {
                path: path.to_string(),
            }),
            _ => Err(SnapshotError::Io {
                path: path.to_string(),
                source: e,
            }),
        },
    }
}

/// What [`snapshot_threads_with`] reads, and what it is given besides `/proc`.
#[derive(Debug, Clone)]
pub(crate) struct SnapshotOptions {
    /// Bytes of each user stack read, from its stack pointer up.
    pub stack_bytes: usize,
    /// Saved user registers by thread id, read just before (see the docs of
    /// [`crate::profile::threads`]).
    pub registers: HashMap<u32, ThreadRegs>,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        Self {
            stack_bytes: UNWIND_STACK_BYTES,
            registers: HashMap::new(),
        }
    }
}

/// Reads every thread of process `pid` (main thread first, then by thread id), with as
/// much of each user stack and such registers as `options` say (by default
/// [`UNWIND_STACK_BYTES`], no frame pointers). Threads that exit meanwhile are left out.
pub(crate) fn snapshot_threads_with(
    pid: u32,
    options: &SnapshotOptions,
) -> Result<Vec<ThreadSnapshot>, SnapshotError> {
    let tids = thread_ids(pid)?;
    let maps = match read_proc(&format!("/proc/{pid}/maps"))? {
        Read::Ok(text) => text,
        Read::Gone => return Err(SnapshotError::Exited(pid)),
    };
    // (start, end) of every mapping, to read a stack no further than its mapping goes.
    let regions: Vec<(u64, u64)> = maps
        .lines()
        .filter_map(parse_maps_line)
        .map(|m| (m.start, m.end))
        .collect();
    let mem_path = format!("/proc/{pid}/mem");
    let mem = match File::open(&mem_path) {
        Ok(file) => Some(file),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            return Err(SnapshotError::PermissionDenied { path: mem_path });
        }
        // A kernel thread has no memory to read; a process that exited is noticed below.
        Err(_) => None,
    };
    let mut threads = Vec::with_capacity(tids.len());
    // CPU time of each runnable thread when read: on a CPU if it grows.
    let mut runnable: Vec<(usize, u64)> = Vec::new();
    for tid in tids {
        let reader = ThreadReader {
            task: format!("/proc/{pid}/task/{tid}"),
            mem: mem.as_ref(),
            regions: &regions,
            stack_bytes: options.stack_bytes,
            registers: options.registers.get(&tid),
        };
        let Read::Ok(read) = reader.read(tid)? else {
            continue;
        };
        if let Some(runtime) = read.runtime {
            runnable.push((threads.len(), runtime));
        }
        threads.push((read.thread, read.exec_start));
    }
    if threads.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Err(SnapshotError::Exited(pid));
    }
    for (index, before) in runnable {
        let tid = threads[index].0.tid;
        let after = fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
            .ok()
            .and_then(|text| parse_schedstat_runtime(&text));
        if after.is_some_and(|after| after == before) {
            threads[index].0.state = ThreadState::Runnable;
        }
    }
    // "Now" on each CPU's scheduler clock, read after every thread's last run.
    let mut clock = SchedClock::default();
    Ok(threads
        .into_iter()
        .map(|(mut thread, exec_start)| {
            thread.since_last_ran_ns = match thread.state {
                ThreadState::Running => Some(0),
                _ => exec_start.and_then(|start| {
                    let now = clock.now_on(thread.cpu)?;
                    Some(now.saturating_sub(start))
                }),
            };
            thread
        })
        .collect())
}

/// The thread ids of process `pid`, main thread first.
fn thread_ids(pid: u32) -> Result<Vec<u32>, SnapshotError> {
    let dir = format!("/proc/{pid}/task");
    let entries = fs::read_dir(&dir).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT | libc::ESRCH) => SnapshotError::NoSuchProcess(pid),
        Some(libc::EACCES | libc::EPERM) => SnapshotError::PermissionDenied { path: dir.clone() },
        _ => SnapshotError::Io {
            path: dir.clone(),
            source: e,
        },
    })?;
    let mut tids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable_by_key(|&tid| (tid != pid, tid));
    Ok(tids)
}

/// How often a thread is read again when it ran while being read.
const READ_ATTEMPTS: usize = 3;

/// Reads the files of one thread.
struct ThreadReader<'a> {
    task: String,
    mem: Option<&'a File>,
    regions: &'a [(u64, u64)],
    stack_bytes: usize,
    registers: Option<&'a ThreadRegs>,
}

/// One thread as read, before "now" is known.
struct ThreadRead {
    thread: ThreadSnapshot,
    /// `se.exec_start`, ns.
    exec_start: Option<u64>,
    /// For a runnable thread, its CPU time then.
    runtime: Option<u64>,
}

impl ThreadReader<'_> {
    fn file(&self, name: &str) -> Result<Read<String>, SnapshotError> {
        read_proc(&format!("{}/{name}", self.task))
    }

    /// `se.exec_start`; absent without CONFIG_SCHED_DEBUG (the figure is then unknown).
    fn exec_start(&self) -> Option<u64> {
        let text = fs::read_to_string(format!("{}/sched", self.task)).ok()?;
        parse_sched_exec_start(&text)
    }

    /// Reads the thread. The scheduler's clock of its last run is read before and after:
    /// if it changed, the thread ran meanwhile, so its stack may not be that of its
    /// registers: it is read again.
    fn read(&self, tid: u32) -> Result<Read<ThreadRead>, SnapshotError> {
        macro_rules! read {
            ($file:literal) => {
                match self.file($file)? {
                    Read::Ok(text) => text,
                    Read::Gone => return Ok(Read::Gone),
                }
            };
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            let exec_start = self.exec_start();
            let stat = read!("stat");
            let comm = read!("comm");
            let line = parse_syscall_line(&read!("syscall"));
            let kernel_stack = parse_kernel_stack(&read!("stack"));
            let Some(stat) = parse_stat(&stat) else {
                return Ok(Read::Gone);
            };
            let (syscall, regs) = match line {
                // A kernel thread's "system call" is whatever its zeroed registers say.
                _ if stat.kernel_thread => (None, None),
                Some(SyscallLine::InSyscall { syscall, sp, pc }) => (Some(syscall), Some((sp, pc))),
                Some(SyscallLine::NotInSyscall { sp, pc }) => (None, Some((sp, pc))),
                Some(SyscallLine::Running) | None => (None, None),
            };
            let mut state = ThreadState::from_letter(stat.state);
            if line == Some(SyscallLine::Running) {
                // Woken up between the two reads, if the letter said otherwise.
                state = ThreadState::Running;
            }
            let running = state == ThreadState::Running;
            let user = regs
                .filter(|&(sp, pc)| !running && sp != 0 && pc != 0)
                .map(|(sp, pc)| UserState {
                    pc,
                    sp,
                    bp: self
                        .registers
                        .filter(|r| (r.ip, r.sp) == (pc, sp))
                        .map(|r| r.bp),
                    fsbase: self.registers.map(|r| r.fsbase).filter(|&f| f != 0),
                    stack: read_stack(self.mem, self.regions, sp, self.stack_bytes),
                });
            let ran_meanwhile = user.is_some() && self.exec_start() != exec_start;
            if ran_meanwhile && attempt < READ_ATTEMPTS {
                continue;
            }
            let runtime = running
                .then(|| fs::read_to_string(format!("{}/schedstat", self.task)).ok())
                .flatten()
                .and_then(|text| parse_schedstat_runtime(&text));
            let name = match comm.strip_suffix('\n') {
                Some(name) => name.to_string(),
                None => stat.comm.clone(),
            };
            return Ok(Read::Ok(ThreadRead {
                thread: ThreadSnapshot {
                    tid,
                    name,
                    state,
                    // A runnable thread is not in a system call, whatever it last made.
                    syscall: syscall.filter(|_| !running),
                    cpu: stat.cpu,
                    since_last_ran_ns: None,
                    kernel_stack,
                    user,
                },
                exec_start,
                runtime,
            }));
        }
    }
}

/// Up to `max` bytes from `sp` up, not past the end of the mapping holding `sp`.
fn read_stack(mem: Option<&File>, regions: &[(u64, u64)], sp: u64, max: usize) -> Vec<u8> {
    let Some(mem) = mem else {
        return Vec::new();
    };
    let Some(&(_, end)) = regions
        .iter()
        .find(|(start, end)| (*start..*end).contains(&sp))
    else {
        return Vec::new();
    };
    let len = usize::try_from(end - sp).map_or(max, |len| len.min(max));
    let mut stack = vec![0; len];
    let mut read = 0;
    while read < len {
        match mem.read_at(&mut stack[read..], sp + read as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => read += n,
        }
    }
    stack.truncate(read);
    stack
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::threads::user_stacks;
    use crate::stack::symbolize::{ProcessMaps, StackSymbolizer};
    use crate::stack::unwind::DwarfUnwinder;

    #[test]
    fn reads_a_stack_no_further_than_its_mapping() {
        let data: Vec<u8> = (0..=255).collect();
        let file = tempfile_with(&data);
        // A "mapping" 100..200 of the file: reading from 150 stops at 200.
        assert_eq!(
            read_stack(Some(&file), &[(100, 200)], 150, 1000),
            data[150..200]
        );
        assert_eq!(
            read_stack(Some(&file), &[(100, 200)], 150, 10),
            data[150..160]
        );
        assert!(read_stack(Some(&file), &[(100, 200)], 250, 10).is_empty());
        // The file ends before the mapping: what could be read.
        assert_eq!(read_stack(Some(&file), &[(0, 1000)], 250, 100), data[250..]);
        assert!(read_stack(None, &[(0, 1000)], 0, 100).is_empty());
    }

    fn tempfile_with(data: &[u8]) -> File {
        let path = std::env::temp_dir().join(format!("tracer-threads-{}", std::process::id()));
        fs::write(&path, data).unwrap();
        let file = File::open(&path).unwrap();
        fs::remove_file(&path).unwrap();
        file
    }

    #[test]
    fn snapshots_a_sleeping_thread_of_our_own() {
        let (ready, ready_rx) = std::sync::mpsc::channel();
        let (done, done_rx) = std::sync::mpsc::channel::<()>();
        let sleeper = std::thread::Builder::new()
            .name("snap-sleeper".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                ready.send(unsafe { libc::gettid() } as u32).unwrap();
                let _ = done_rx.recv();
            })
            .unwrap();
        let tid = ready_rx.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        // The frame pointers from the kernel, when we may load eBPF: this test binary is
        // built with them, and without them its stacks stop at its first function.
        let registers: HashMap<u32, ThreadRegs> =
            crate::kernel::Loader::load(&crate::kernel::Settings {
                features: crate::kernel::Features {
                    thread_regs: true,
                    ..crate::kernel::Features::NONE
                },
                ..Default::default()
            })
            .and_then(|mut loader| loader.thread_registers(std::process::id()))
            .map(|regs| regs.into_iter().map(|r| (r.tid, r)).collect())
            .unwrap_or_default();
        let options = SnapshotOptions {
            registers,
            ..SnapshotOptions::default()
        };
        let threads = match snapshot_threads_with(std::process::id(), &options) {
            Ok(threads) => threads,
            Err(SnapshotError::PermissionDenied { path }) => {
                eprintln!("skipped: {path} needs root");
                drop(done);
                sleeper.join().unwrap();
                return;
            }
            Err(e) => panic!("{e}"),
        };
        drop(done);
        sleeper.join().unwrap();
        let thread = threads.iter().find(|t| t.tid == tid).unwrap();
        assert_eq!(thread.name, "snap-sleeper");
        assert_eq!(thread.state, ThreadState::Sleeping, "{thread:?}");
        assert_eq!(thread.syscall.map(|s| s.name()).as_deref(), Some("futex"));
        assert!(!thread.kernel_stack.is_empty(), "{thread:?}");
        let user = thread.user.as_ref().unwrap();
        assert!(!user.stack.is_empty());
        assert_eq!(threads[0].tid, std::process::id(), "main thread first");
        if let Some(since) = thread.since_last_ran_ns {
            assert!((50_000_000..10_000_000_000).contains(&since), "{since}");
        }
        let maps = ProcessMaps::capture(std::process::id()).unwrap();
        let stacks = user_stacks(
            std::process::id(),
            std::slice::from_ref(thread),
            &maps,
            &mut DwarfUnwinder::new(),
            &mut StackSymbolizer::new(),
            None,
        );
        let stack = stacks[0].as_ref().unwrap();
        assert!(stack.frames.len() >= 2, "{:?}", stack.frames);
        if user.bp.is_some() {
            assert!(
                stack.frames.iter().any(|f| f.contains("start_thread")),
                "{:?}",
                stack.frames
            );
        } else {
            eprintln!("frame pointers unknown (no eBPF): not unwound to the end");
        }
    }
}
