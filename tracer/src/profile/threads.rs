//! What every thread of a process is doing right now, read from `/proc` without stopping
//! it (`tracer stacks`; also the real stacks of threads blocked since before tracing
//! started).
//!
//! Per thread, from `/proc/PID/task/TID/`:
//! - `stat`: the state letter and the CPU it last ran on;
//! - `syscall`: the system call it is in (number, six arguments) and the user stack and
//!   instruction pointers saved when it entered the kernel; `running` for a runnable
//!   thread (on a CPU or waiting for one), `-1 SP PC` in the kernel outside a system call
//!   (a page fault). The kernel reads them once the thread is off CPU; it never stops it;
//! - `stack`: its kernel stack, one `function+0xOFF/0xSIZE` per line (needs CAP_SYS_ADMIN);
//! - `sched`: `se.exec_start`, the scheduler's clock on its CPU when it last ran. The same
//!   field of our own thread, just brought up to date and read on that CPU, is "now" on
//!   that clock, so the difference is how long since the thread last ran. The clock is the
//!   run queue's task clock: it leaves out time the hypervisor stole from that CPU, so on a
//!   virtual machine the figure is short by the share stolen (0.3% on the one this was
//!   written on);
//! - `schedstat`: its CPU time so far, read twice to tell a thread on a CPU (whose time
//!   grows) from one waiting for a CPU;
//! - and `/proc/PID/mem`: the top of its user stack, from the saved stack pointer up.
//!
//! The reads are parsed here ([`ThreadSnapshot`], by [`snapshot_threads`]); the user stack
//! is unwound with [`DwarfUnwinder`] and named with [`StackSymbolizer`] by [`user_stacks`].
//!
//! `/proc` does not give the frame pointer, and the call frame information of code built
//! with frame pointers is relative to it: without it, unwinding stops at the first such
//! frame above the system call's wrapper. [`SnapshotOptions::registers`] brings it from
//! the kernel (a task iterator, [`crate::kernel::Loader::thread_registers`]), used where
//! the instruction and stack pointers are those `/proc` gave (the thread did not run in
//! between).

pub mod syscalls;

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt as _;

use thiserror::Error;
use tracer_common::{ThreadRegs, UNWIND_STACK_BYTES};

use crate::stack::naming::{KERNEL_SUFFIX, user_frame_names};
use crate::stack::symbolize::{ProcessMaps, StackSymbolizer};
use crate::stack::unwind::{DwarfUnwinder, Snapshot, UnwindEnd, UnwoundStack};
use crate::system::procfs::parse_maps_line;

/// What a thread is doing, from its state letter in `/proc/PID/task/TID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadState {
    /// On a CPU (`R`, its CPU time growing).
    Running,
    /// Waiting for a CPU (`R`, its CPU time not growing).
    Runnable,
    /// `S`: interruptible sleep (waiting for an event).
    Sleeping,
    /// `D`: uninterruptible sleep (usually I/O).
    DiskSleep,
    /// `T`: stopped by a signal.
    Stopped,
    /// `t`: stopped by a debugger.
    TracingStop,
    /// `Z`: exited, not yet reaped.
    Zombie,
    /// `X`: being removed.
    Dead,
    /// `I`: an idle kernel thread.
    Idle,
    /// `P`: a parked kernel thread.
    Parked,
    /// Any other letter.
    Other(char),
}

impl ThreadState {
    /// The state of letter `c` (`R` is taken as [`ThreadState::Running`]).
    pub fn from_letter(c: char) -> Self {
        match c {
            'R' => Self::Running,
            'S' => Self::Sleeping,
            'D' => Self::DiskSleep,
            'T' => Self::Stopped,
            't' => Self::TracingStop,
            'Z' => Self::Zombie,
            'X' | 'x' => Self::Dead,
            'I' => Self::Idle,
            'P' => Self::Parked,
            c => Self::Other(c),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Runnable => "runnable",
            Self::Sleeping => "sleeping",
            Self::DiskSleep => "disk sleep",
            Self::Stopped => "stopped",
            Self::TracingStop => "tracing stop",
            Self::Zombie => "zombie",
            Self::Dead => "dead",
            Self::Idle => "idle",
            Self::Parked => "parked",
            Self::Other(_) => "unknown",
        }
    }
}

/// A system call a thread is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Syscall {
    pub nr: u64,
    pub args: [u64; 6],
}

impl Syscall {
    /// Its x86-64 name (`futex`), or `syscall N`. (A 32-bit process's numbers are the
    /// i386 ones, which this does not tell apart.)
    pub fn name(&self) -> String {
        match syscalls::name(self.nr) {
            Some(name) => name.to_string(),
            None => format!("syscall {}", self.nr),
        }
    }
}

/// One line of `/proc/PID/task/TID/syscall`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyscallLine {
    /// `running`: the thread was runnable, so its registers could not be read.
    Running,
    /// In the kernel but not in a system call (`-1 SP PC`).
    NotInSyscall {
        sp: u64,
        pc: u64,
    },
    InSyscall {
        syscall: Syscall,
        sp: u64,
        pc: u64,
    },
}

/// Parses `/proc/PID/task/TID/syscall`; `None` if malformed.
pub fn parse_syscall_line(text: &str) -> Option<SyscallLine> {
    let text = text.trim();
    if text == "running" {
        return Some(SyscallLine::Running);
    }
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    match fields.as_slice() {
        ["-1", sp, pc] => Some(SyscallLine::NotInSyscall {
            sp: hex(sp)?,
            pc: hex(pc)?,
        }),
        [nr, a0, a1, a2, a3, a4, a5, sp, pc] => Some(SyscallLine::InSyscall {
            syscall: Syscall {
                nr: nr.parse().ok()?,
                args: [hex(a0)?, hex(a1)?, hex(a2)?, hex(a3)?, hex(a4)?, hex(a5)?],
            },
            sp: hex(sp)?,
            pc: hex(pc)?,
        }),
        _ => None,
    }
}

/// The fields of `/proc/PID/task/TID/stat` used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// The name between the parentheses (it may hold anything, parentheses included).
    pub comm: String,
    pub state: char,
    /// A kernel thread (`PF_KTHREAD` in the flags, field 9): no user space.
    pub kernel_thread: bool,
    /// The CPU it last ran on (field 39).
    pub cpu: Option<u32>,
}

/// `PF_KTHREAD` of `include/linux/sched.h`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Parses `/proc/PID/task/TID/stat`; `None` if malformed.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    // From field 3, the state.
    let fields: Vec<&str> = text.get(close + 1..)?.split_ascii_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied();
    let state = field(3)?.chars().next()?;
    let flags: u64 = field(9).and_then(|f| f.parse().ok()).unwrap_or(0);
    Some(Stat {
        comm,
        state,
        kernel_thread: flags & PF_KTHREAD != 0,
        cpu: field(39).and_then(|f| f.parse().ok()),
    })
}

/// `se.exec_start` of `/proc/PID/task/TID/sched` (milliseconds with six decimals) in
/// nanoseconds; `None` when absent or 0 (a thread just moved to another CPU).
pub fn parse_sched_exec_start(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("se.exec_start"))?;
    let value = line.split_once(':')?.1.trim();
    let (ms, frac) = value.split_once('.').unwrap_or((value, "0"));
    if frac.is_empty() || frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac: u64 = format!("{frac:0<6}").parse().ok()?;
    let ns = ms
        .parse::<u64>()
        .ok()?
        .checked_mul(1_000_000)?
        .checked_add(frac)?;
    (ns > 0).then_some(ns)
}

/// The CPU time (ns) of `/proc/PID/task/TID/schedstat`: its first field.
pub fn parse_schedstat_runtime(text: &str) -> Option<u64> {
    text.split_ascii_whitespace().next()?.parse().ok()
}

/// The function names of `/proc/PID/task/TID/stack`, innermost first: `[<0>]
/// futex_do_wait+0x46/0x90` gives `futex_do_wait` (a ` [module]` after it is dropped).
pub fn parse_kernel_stack(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = match line.strip_prefix("[<") {
                Some(rest) => rest.split_once(">]")?.1.trim_start(),
                None => line,
            };
            let symbol = rest.split_ascii_whitespace().next()?;
            let name = match symbol.rsplit_once('+') {
                Some((name, offset)) if offset.starts_with("0x") => name,
                _ => symbol,
            };
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

/// A thread's user registers and the top of its user stack, as saved when it entered
/// the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserState {
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
pub struct ThreadSnapshot {
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
    /// The thread's user stack as a snapshot for [`DwarfUnwinder::unwind_one`] (no frame
    /// pointer: `/proc` does not give it).
    pub fn unwind_snapshot(&self, tgid: u32) -> Option<Snapshot<'_>> {
        let user = self.user.as_ref()?;
        Some(Snapshot {
            tgid,
            tid: self.tid,
            ip: user.pc,
            sp: user.sp,
            bp: user.bp.unwrap_or(0),
            kernel_stack_id: tracer_common::NO_STACK,
            snapshot_id: 0,
            task: 0,
            python: None,
            stack: &user.stack,
        })
    }

    /// Its FS base, when read (see [`UserState::fsbase`]).
    pub fn fsbase(&self) -> Option<u64> {
        self.user.as_ref()?.fsbase
    }

    /// The kernel frames named as every tracer output names them (`futex_do_wait_[k]`).
    pub fn kernel_frame_names(&self) -> Vec<String> {
        self.kernel_stack
            .iter()
            .map(|name| format!("{name}{KERNEL_SUFFIX}"))
            .collect()
    }
}

/// Why a process's threads could not be read.
#[derive(Debug, Error)]
pub enum SnapshotError {
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
pub struct SnapshotOptions {
    /// Bytes of each user stack read, from its stack pointer up.
    pub stack_bytes: usize,
    /// Saved user registers by thread id, read just before (see the module's docs).
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

/// Reads every thread of process `pid` (main thread first, then by thread id), with up
/// to [`UNWIND_STACK_BYTES`] of each user stack and without frame pointers. Threads that
/// exit meanwhile are left out.
pub fn snapshot_threads(pid: u32) -> Result<Vec<ThreadSnapshot>, SnapshotError> {
    snapshot_threads_with(pid, &SnapshotOptions::default())
}

/// [`snapshot_threads`] with `options`.
pub fn snapshot_threads_with(
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

/// "Now" on the scheduler's clock of each CPU, read once per CPU.
#[derive(Default)]
struct SchedClock {
    now: HashMap<Option<u32>, Option<u64>>,
}

impl SchedClock {
    /// The clock of `cpu` (of the CPU we run on if `None` or if we may not run there).
    fn now_on(&mut self, cpu: Option<u32>) -> Option<u64> {
        *self.now.entry(cpu).or_insert_with(|| sched_now(cpu))
    }
}

/// `se.exec_start` of this thread on `cpu`, brought up to date: reading our own CPU time
/// makes the kernel account our run up to now, which sets it to the CPU's clock now.
fn sched_now(cpu: Option<u32>) -> Option<u64> {
    let restore = cpu.and_then(pin_to_cpu);
    let mut cpu_time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut cpu_time) };
    let now = fs::read_to_string("/proc/thread-self/sched")
        .ok()
        .and_then(|text| parse_sched_exec_start(&text));
    if let Some(mask) = restore {
        // SAFETY: `mask` is the affinity mask read from this very thread.
        unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &mask) };
    }
    now
}

/// Moves this thread to `cpu`; returns its previous affinity mask, or `None` (staying
/// where it is) if it may not run there.
fn pin_to_cpu(cpu: u32) -> Option<libc::cpu_set_t> {
    let cpu = usize::try_from(cpu).ok()?;
    if cpu >= libc::CPU_SETSIZE as usize {
        return None;
    }
    // SAFETY: cpu_set_t is plain data, all zeroes is the empty set; the calls get its
    // size and valid pointers; `cpu` is below CPU_SETSIZE.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut old) != 0 {
            return None;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        (libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &one) == 0).then_some(old)
    }
}

/// A thread's user stack, unwound and named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserStack {
    /// The instruction pointers found, innermost first.
    pub unwound: UnwoundStack,
    /// Their names, innermost first (inlined functions as frames of their own, ` [fp]`
    /// where found by frame pointer).
    pub frames: Vec<String>,
    /// How unwinding ended ([`UnwindEnd::OutOfStack`]: deeper than the bytes read).
    pub end: UnwindEnd,
}

/// Unwinds and names the user stack of each of `threads` of process `pid` (whose
/// mappings `maps` holds); `None` for threads without one.
pub fn user_stacks(
    pid: u32,
    threads: &[ThreadSnapshot],
    maps: &ProcessMaps,
    unwinder: &mut DwarfUnwinder,
    symbolizer: &mut StackSymbolizer,
    mut python: Option<&mut crate::stack::python::Interpreter>,
) -> Vec<Option<UserStack>> {
    let unwound: Vec<Option<(UnwoundStack, UnwindEnd)>> = threads
        .iter()
        .map(|thread| {
            let snapshot = thread.unwind_snapshot(pid)?;
            let (stack, end) = unwinder.unwind_one(&snapshot, maps);
            let stack = match (python.as_deref_mut(), thread.fsbase()) {
                (Some(python), Some(fsbase)) => python.merge_thread(stack, fsbase),
                _ => stack,
            };
            Some((stack, end))
        })
        .collect();
    let addrs: Vec<&[u64]> = unwound
        .iter()
        .flatten()
        .map(|(stack, _)| stack.addrs.as_slice())
        .collect();
    let mut named = symbolizer.user_stacks(maps, &addrs).into_iter();
    unwound
        .into_iter()
        .map(|stack| {
            let (unwound, end) = stack?;
            let frames = user_frame_names(named.next()?, &unwound.by_frame_pointer)
                .into_iter()
                .map(|name| name.into_owned())
                .collect();
            Some(UserStack {
                unwound,
                frames,
                end,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_syscall_lines() {
        let futex = "202 0x5647f4321080 0x80 0x0 0x0 0x0 0x0 0x7fce3b463e88 0x7fce3c4f012b\n";
        assert_eq!(
            parse_syscall_line(futex),
            Some(SyscallLine::InSyscall {
                syscall: Syscall {
                    nr: 202,
                    args: [0x5647f4321080, 0x80, 0, 0, 0, 0]
                },
                sp: 0x7fce3b463e88,
                pc: 0x7fce3c4f012b,
            })
        );
        assert_eq!(
            parse_syscall_line("-1 0x7ffd1000 0x401000\n"),
            Some(SyscallLine::NotInSyscall {
                sp: 0x7ffd1000,
                pc: 0x401000
            })
        );
        assert_eq!(parse_syscall_line("running\n"), Some(SyscallLine::Running));
        for bad in [
            "",
            "202 0x1",
            "x 0x0 0x0 0x0 0x0 0x0 0x0 0x0 0x0",
            "-1 12 0x1",
        ] {
            assert_eq!(parse_syscall_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn names_syscalls() {
        let name = |nr: i64| {
            Syscall {
                nr: nr as u64,
                args: [0; 6],
            }
            .name()
        };
        for (nr, expected) in [
            (libc::SYS_read, "read"),
            (libc::SYS_write, "write"),
            (libc::SYS_futex, "futex"),
            (libc::SYS_nanosleep, "nanosleep"),
            (libc::SYS_clock_nanosleep, "clock_nanosleep"),
            (libc::SYS_poll, "poll"),
            (libc::SYS_ppoll, "ppoll"),
            (libc::SYS_select, "select"),
            (libc::SYS_pselect6, "pselect6"),
            (libc::SYS_epoll_wait, "epoll_wait"),
            (libc::SYS_epoll_pwait, "epoll_pwait"),
            (libc::SYS_epoll_pwait2, "epoll_pwait2"),
            (libc::SYS_accept, "accept"),
            (libc::SYS_accept4, "accept4"),
            (libc::SYS_recvfrom, "recvfrom"),
            (libc::SYS_recvmsg, "recvmsg"),
            (libc::SYS_connect, "connect"),
            (libc::SYS_wait4, "wait4"),
            (libc::SYS_waitid, "waitid"),
            (libc::SYS_pause, "pause"),
            (libc::SYS_rt_sigsuspend, "rt_sigsuspend"),
            (libc::SYS_rt_sigtimedwait, "rt_sigtimedwait"),
            (libc::SYS_msgrcv, "msgrcv"),
            (libc::SYS_semop, "semop"),
            (libc::SYS_io_getevents, "io_getevents"),
            (libc::SYS_io_uring_enter, "io_uring_enter"),
            (libc::SYS_sched_yield, "sched_yield"),
            (libc::SYS_futex_waitv, "futex_waitv"),
            (libc::SYS_mseal, "mseal"),
        ] {
            assert_eq!(name(nr), expected, "{nr}");
        }
        assert_eq!(name(455), "futex_wait");
        assert_eq!(name(1000), "syscall 1000");
        assert_eq!(name(-1), format!("syscall {}", u64::MAX));
    }

    #[test]
    fn every_number_in_the_table_has_a_plain_name() {
        let mut checked = 0;
        for nr in 0..500 {
            if let Some(name) = syscalls::name(nr) {
                assert!(!name.is_empty() && !name.contains(' '), "{nr}: {name:?}");
                checked += 1;
            }
        }
        assert!(checked > 360, "{checked}");
    }

    #[test]
    fn parses_stat() {
        let stat = "4243 (worker) 1) S 4242 4242 1 0 -1 4194368 100 0 0 0 5 3 0 0 20 0 5 0 \
                    1000 10000000 200 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 -1 1 0 0 \
                    0 0 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(
            parse_stat(stat),
            Some(Stat {
                comm: "worker) 1".to_string(),
                state: 'S',
                kernel_thread: false,
                cpu: Some(1),
            })
        );
        let kthreadd = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 9";
        assert!(parse_stat(kthreadd).unwrap().kernel_thread);
        let short = parse_stat("1 (x) R 0").unwrap();
        assert_eq!(
            (short.state, short.cpu, short.kernel_thread),
            ('R', None, false)
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x)"), None);
    }

    #[test]
    fn parses_our_own_stat() {
        let stat = fs::read_to_string("/proc/thread-self/stat").unwrap();
        let stat = parse_stat(&stat).unwrap();
        assert_eq!(stat.state, 'R');
        // SAFETY: sched_getcpu has no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        assert!(stat.cpu.is_some(), "{stat:?}");
        assert!(cpu >= 0);
    }

    #[test]
    fn states() {
        let names: Vec<&str> = "RSDTtZXIPW"
            .chars()
            .map(|c| ThreadState::from_letter(c).name())
            .collect();
        assert_eq!(
            names,
            [
                "running",
                "sleeping",
                "disk sleep",
                "stopped",
                "tracing stop",
                "zombie",
                "dead",
                "idle",
                "parked",
                "unknown"
            ]
        );
        assert_eq!(ThreadState::Runnable.name(), "runnable");
    }

    #[test]
    fn parses_sched() {
        let sched = "sleep (8538, #threads: 1)\n\
                     -------------------------------------------------------------------\n\
                     se.exec_start                                :       1597054.930687\n\
                     se.vruntime                                  :            99.390350\n";
        assert_eq!(parse_sched_exec_start(sched), Some(1_597_054_930_687));
        assert_eq!(
            parse_sched_exec_start("se.exec_start : 12.5\n"),
            Some(12_500_000)
        );
        assert_eq!(
            parse_sched_exec_start("se.exec_start : 7\n"),
            Some(7_000_000)
        );
        assert_eq!(
            parse_sched_exec_start("se.exec_start :    0.000000\n"),
            None
        );
        assert_eq!(parse_sched_exec_start("se.vruntime : 1.0\n"), None);
        assert_eq!(parse_sched_exec_start("se.exec_start : 1.x\n"), None);
        assert_eq!(parse_schedstat_runtime("123456 789 10\n"), Some(123456));
        assert_eq!(parse_schedstat_runtime(""), None);
    }

    #[test]
    fn parses_kernel_stacks() {
        let stack = "[<0>] futex_do_wait+0x46/0x90\n\
                     [<0>] __futex_wait+0x92/0x120\n\
                     [<0>] nfs_wait_bit_killable+0x1e/0x90 [nfs]\n\
                     [<0>] entry_SYSCALL_64_after_hwframe+0x76/0x7e\n\
                     \n";
        assert_eq!(
            parse_kernel_stack(stack),
            [
                "futex_do_wait",
                "__futex_wait",
                "nfs_wait_bit_killable",
                "entry_SYSCALL_64_after_hwframe"
            ]
        );
        assert!(parse_kernel_stack("").is_empty());
        assert_eq!(
            parse_kernel_stack("[<0>] 0xffffffffc0001234\n"),
            ["0xffffffffc0001234"]
        );
    }

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
    fn the_scheduler_clock_of_this_cpu_moves_with_time() {
        // Both readings on CPU 0: each CPU has a clock of its own, and the thread may
        // wake up on the other one.
        let Some(first) = sched_now(Some(0)) else {
            eprintln!("skipped: no /proc/thread-self/sched (CONFIG_SCHED_DEBUG)");
            return;
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        let second = sched_now(Some(0)).unwrap();
        let elapsed = second.wrapping_sub(first);
        // The run queue's clock is only brought up to date when the CPU schedules, so
        // either reading may be a few ms behind (43 ms seen for the 50 ms, in CI).
        assert!((25_000_000..1_000_000_000).contains(&elapsed), "{elapsed}");
    }

    #[test]
    fn snapshots_a_sleeping_thread_of_our_own() {
        let (ready, ready_rx) = std::sync::mpsc::channel();
        let (_done, done_rx) = std::sync::mpsc::channel::<()>();
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
                drop(_done);
                sleeper.join().unwrap();
                return;
            }
            Err(e) => panic!("{e}"),
        };
        drop(_done);
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
